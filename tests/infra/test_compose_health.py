"""What compose's healthchecks, volumes and Kafka identity mean (issue 23): the worker's
healthcheck is `pulse worker --health` (a probe that can fail; tests/streams run it), the
demo producer waits for it, volumes hold what their services keep, the KRaft cluster id is
set by us."""

from __future__ import annotations

import re

import click
import pytest
from infra_compose import load_compose, read_env_file, service_env, uses_pulse_image

from pulse.cli import main
from pulse.settings import Settings

SECRETS = {"PULSE_INFLUX_TOKEN": "t", "INFLUX_ADMIN_PASSWORD": "p", "GRAFANA_ADMIN_PASSWORD": "g"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return load_compose({**read_env_file(), **SECRETS})


def _workers(compose: dict) -> dict[str, dict]:
    return {n: s for n, s in compose["services"].items() if s.get("command", [None, None])[:2] == ["pulse", "worker"]}


def test_worker_healthcheck_is_the_health_probe_and_click_accepts_it(compose: dict) -> None:
    for name, svc in _workers(compose).items():
        test = svc["healthcheck"]["test"]
        assert test[:4] == ["CMD", "pulse", "worker", "--health"], (name, test)
        ctx = main.make_context("pulse", ["worker"])
        worker = main.get_command(ctx, "worker")
        assert isinstance(worker, click.Command)
        sub = worker.make_context("worker", list(test[3:]), parent=ctx)
        assert sub.params["health"] is True
        # Room for the probe (a Python start, a Metadata round trip, an offsets read).
        assert int(svc["healthcheck"]["timeout"].rstrip("s")) >= 10


def test_demo_producer_waits_for_a_healthy_worker(compose: dict) -> None:
    deps = compose["services"]["demo-producer"]["depends_on"]
    healthy = [d for d, spec in deps.items() if spec["condition"] == "service_healthy"]
    assert healthy and all(d in _workers(compose) for d in healthy)


def test_kafka_cluster_id_is_set_explicitly(compose: dict) -> None:
    env = service_env(compose["services"]["kafka"])
    # What kafka-storage.sh random-uuid prints: 16 bytes, base64url without padding.
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", env["CLUSTER_ID"])
    assert env["CLUSTER_ID"] == read_env_file()["KAFKA_CLUSTER_ID"]


def test_pulse_volumes_hold_what_their_service_keeps(compose: dict) -> None:
    declared = set(compose["volumes"])
    for name, svc in compose["services"].items():
        if not uses_pulse_image(svc):
            continue
        named = [v for v in svc.get("volumes", []) if not v.startswith((".", "/"))]
        if name in _workers(compose):
            # Worker state is in memory and rebuilt from Kafka: nothing to keep.
            assert not named, f"{name}: a volume for a worker that keeps nothing on disk"
            continue
        # only the spool's place matters here (the Kafka secret files exist in a deployment only)
        s = Settings.from_env({k: v for k, v in service_env(svc).items() if not k.startswith("PULSE_KAFKA_")})
        for v in named:
            src, target = v.split(":")[:2]
            assert src in declared
            # A producer's or an agent's volume is where its spool is; an agent's other one is
            # where the training processes leave hook records and find the plugin socket.
            assert svc["command"][:2] in (["pulse", "produce"], ["pulse", "agent"]), name
            spool = str(s.spool_dir).startswith(target.rstrip("/") + "/") or str(s.spool_dir) == target
            hooks = svc["command"][:2] == ["pulse", "agent"] and any(
                str(arg).startswith(target.rstrip("/") + "/") for arg in svc["command"])
            assert spool or hooks, (name, v)
    assert not [v for v in declared if v.startswith("worker-")]


def test_dockerfile_declares_no_anonymous_volume() -> None:
    from infra_compose import INFRA

    assert not re.search(r"^VOLUME\b", (INFRA / "Dockerfile").read_text(), re.M)
