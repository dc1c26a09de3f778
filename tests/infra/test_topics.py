"""The topic-creation script creates exactly the topics the Faust app declares."""

from __future__ import annotations

import os
import subprocess

import pytest
from infra_compose import TOPICS_SCRIPT, load_compose, read_env_file, service_env

from pulse.settings import Settings


def script_topics(env: dict[str, str]) -> dict[str, int]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    r = subprocess.run(["bash", str(TOPICS_SCRIPT), "--print"], env={**clean, **env},
                       capture_output=True, text=True, check=True)
    out = {}
    for line in r.stdout.splitlines():
        name, n = line.split()
        assert name not in out, f"{name} listed twice"
        out[name] = int(n)
    return out


def faust_topics(settings: Settings) -> dict[str, int]:
    """Every topic the Faust app declares (agents' input channels and the topics it sends
    to), with its partition count, read from the app object itself."""
    from pulse.streams.app import Pipeline

    pipe = Pipeline(settings, bootstrap="127.0.0.1:1")  # builds the app; connects nowhere
    out: dict[str, int] = {}
    try:
        for channel in [a.channel for a in pipe.agents] + list(pipe.topic_objects.values()):
            for name in channel.topics:
                assert out.get(name, channel.partitions) == channel.partitions, name
                out[name] = channel.partitions
    finally:
        pipe.close()
    return out


@pytest.mark.parametrize("env", [
    {},
    {"PULSE_TOPIC_PREFIX": "acme.pulse", "PULSE_PARTITIONS": "24"},
    {"PULSE_PARTITIONS": "3"},
])
def test_script_topics_equal_the_faust_declarations(env: dict[str, str]) -> None:
    settings = Settings.from_env(env)
    declared = faust_topics(settings)
    assert script_topics(env) == declared
    t = settings.topics
    # co-partitioned: same count for the two node-keyed inputs
    assert declared[t.samples] == declared[t.hook_events] == settings.partitions


def test_compose_passes_the_workers_settings_to_the_script() -> None:
    env = read_env_file()
    env.update(PULSE_INFLUX_TOKEN="t", INFLUX_ADMIN_PASSWORD="p", GRAFANA_ADMIN_PASSWORD="g", PULSE_PARTITIONS="12")
    compose = load_compose(env)
    topics_env = service_env(compose["services"]["kafka-topics"])
    worker_env = service_env(compose["services"]["worker-1"])
    for k in ("PULSE_TOPIC_PREFIX", "PULSE_PARTITIONS"):
        assert topics_env[k] == worker_env[k]
    script_env = {k: v for k, v in topics_env.items() if k.startswith("PULSE_")}
    # (the Kafka security settings point at /run/secrets files: not needed for topic names)
    topic_env = {k: v for k, v in worker_env.items() if not k.startswith("PULSE_KAFKA_")}
    assert script_topics(script_env) == faust_topics(Settings.from_env(topic_env))
    assert max(script_topics(script_env).values()) == 12


def test_script_rejects_a_bad_partition_count() -> None:
    for bad in ("0", "x", "-1"):
        r = subprocess.run(["bash", str(TOPICS_SCRIPT), "--print"], env={"PULSE_PARTITIONS": bad, "PATH": os.environ["PATH"]},
                           capture_output=True, text=True)
        assert r.returncode == 2 and "PULSE_PARTITIONS" in r.stderr
