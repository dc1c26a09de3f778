"""`pulse worker --health`: the container healthcheck of a worker. Healthy while a real
worker runs against a real (embedded) broker; unhealthy once that broker is gone, and once
the worker itself is gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from streamkit import running_worker, unique_settings

from pulse.broker import EmbeddedBroker, free_port
from pulse.settings import Settings


def _probe(settings: Settings, *extra: str, broker: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    env.update({"PULSE_BROKER": broker or settings.broker or "", "PULSE_TOPIC_PREFIX": settings.topic_prefix,
                "PULSE_WORKER_ID": settings.worker_id, "PULSE_DATA_DIR": str(settings.data_dir)})
    return subprocess.run([sys.executable, "-m", "pulse.cli", "worker", "--health", "--json", *extra],
                          capture_output=True, text=True, timeout=120, env=env)


def _report(r: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_healthy_with_its_broker_then_unhealthy_when_the_broker_or_the_worker_is_gone(broker, tmp_path):
    private = EmbeddedBroker(free_port(), log_path=tmp_path / "tansu.log").start()
    try:
        s = unique_settings(private.bootstrap, tmp_path)
        with running_worker(s, tmp_path) as w:
            ok = _probe(s)
            assert ok.returncode == 0, ok.stderr + w.log_tail()
            rep = _report(ok)
            assert rep["healthy"] and rep["assigned"] > 0 and rep["ready"] and rep["lag"] == 0, rep
            assert "healthy" in ok.stderr

            private.stop()
            gone = _probe(s)
            assert gone.returncode == 1, gone.stderr
            assert "broker unreachable" in gone.stderr and gone.stderr.startswith("error: ")
            assert not _report(gone)["healthy"]
            # A lag bound of 0 is still met by an idle worker; the broker is what failed.
            assert [p for p in _report(gone)["problems"] if "broker" in p]
        # The worker stopped: against a live broker, its stale record is not health.
        dead = _probe(s, broker=broker)
        assert dead.returncode == 1
        assert f"worker process {_report(dead)['pid']} is not running" in dead.stderr
    finally:
        private.stop()


def test_no_health_file_is_unhealthy_and_options_need_health(broker, tmp_path):
    s = unique_settings(broker, tmp_path)
    r = _probe(s, "--health-file", str(tmp_path / "nothing.json"))
    assert r.returncode == 1 and "no health file" in r.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    r = subprocess.run([sys.executable, "-m", "pulse.cli", "worker", "--broker", broker, "--max-lag", "5"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "--health" in r.stderr
    assert not Path(tmp_path / "data").exists()


def test_an_unwritable_health_file_is_reported_not_fatal(tmp_path, caplog):
    from pulse.streams.health import write_health

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    rec = {"at_ns": 1, "assigned": 1, "ready": True}
    assert write_health(blocker / "h.json", rec) is False
    assert write_health(blocker / "h.json", rec) is False
    assert len([r for r in caplog.records if "cannot write the health file" in r.getMessage()]) == 1
    ok = tmp_path / "d" / "h.json"
    assert write_health(ok, rec) is True
    assert json.loads(ok.read_text()) == {**rec, "pid": os.getpid()}
