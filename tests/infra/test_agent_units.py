"""The agent's deployment examples (systemd unit, Kubernetes DaemonSet, the compose service):
their command lines are ones `pulse agent` accepts, and they give it what it needs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml
from infra_compose import load_compose, read_env_file
from pulse.streams.agent_cli import agent

AGENT = Path(__file__).resolve().parents[2] / "infra" / "agent"


def _parse(args: list[str]) -> dict:
    """The options `pulse agent ARGS` would run with (click raises on anything unknown)."""
    ctx = agent.make_context("agent", list(args))
    return dict(ctx.params)


def _unit() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (AGENT / "pulse-agent.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def test_systemd_unit_runs_the_agent_and_stops_it_with_time_to_flush() -> None:
    u = _unit()
    env = dict(e.split("=", 1) for e in u["Environment"])
    argv = shlex.split(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], u["ExecStart"][0]))
    assert argv[0].endswith("/pulse") and argv[1] == "agent"
    params = _parse(argv[2:])
    assert params["iface"] == "eth0" and str(params["hook_dir"]) == "/run/pulse/hooks"
    assert u["KillSignal"] == ["SIGTERM"] and int(u["TimeoutStopSec"][0]) > 30  # the publisher drains 30 s
    caps = set(u["AmbientCapabilities"][0].split())
    assert {"CAP_NET_RAW", "CAP_SYS_PTRACE"} <= caps
    assert "PULSE_SPOOL_DIR" in env and u["MemoryMax"]


def test_daemonset_runs_one_agent_per_node_with_the_host_network_and_pids() -> None:
    ds = yaml.safe_load((AGENT / "daemonset.yaml").read_text())
    assert ds["kind"] == "DaemonSet"
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["hostPID"] is True
    assert spec["terminationGracePeriodSeconds"] > 30
    (c,) = spec["containers"]
    env = {e["name"]: e["value"] for e in c["env"]}
    argv = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["command"]]
    assert argv[:2] == ["pulse", "agent"]
    params = _parse(argv[2:])
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert str(params["hook_dir"]).startswith(tuple(mounts)) and str(params["plugin_socket"]).startswith("/run/pulse")
    assert "NET_RAW" in c["securityContext"]["capabilities"]["add"]
    assert c["resources"]["limits"]["memory"]
    assert env["PULSE_SPOOL_DIR"].startswith(tuple(mounts))


def test_compose_agent_service_is_an_opt_in_profile_on_the_host_network() -> None:
    env = read_env_file()
    env.update({"PULSE_INFLUX_TOKEN": "t", "INFLUX_ADMIN_PASSWORD": "pw-test-123", "GRAFANA_ADMIN_PASSWORD": "pw"})
    svc = load_compose(env)["services"]["agent"]
    assert svc["profiles"] == ["agent"] and svc["network_mode"] == "host" and svc["pid"] == "host"
    assert svc["command"][:2] == ["pulse", "agent"]
    params = _parse(svc["command"][2:])
    assert params["broker"].startswith("localhost:")  # host network: Kafka's EXTERNAL listener
    assert int(svc["stop_grace_period"].rstrip("s")) > 30
