"""Live sources publish on the wall clock: `pulse produce sim` and `pulse demo` move the
simulated job's timestamps by one offset per run so it runs *now* (InfluxDB refuses points
older than its retention), keeping relative timing and per-node clock offsets; the trace
written with --keep keeps the simulator's own times. Read back from the embedded broker
with a plain consumer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from pulse import events as ev_codec
from pulse import samples as sample_codec
from pulse.trace import TraceReader, read_batch_file

# Items carry the time they describe, at most a batch window before they are sent; the
# simulated runs here last a few seconds of job time.
SLACK_BEFORE_NS = 5 * 10**9
SLACK_AFTER_NS = 2 * 10**9
SMALL = ["--nodes", "4", "--gpus-per-node", "2", "--nics-per-node", "1", "--steps", "4"]


def _read(broker: str, topic: str) -> list[bytes]:
    from pulse.streams.readback import read_back

    return [m.value for m in asyncio.run(read_back(broker, topic, timeout_s=30))]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    env.update({"PULSE_DATA_DIR": str(tmp / "data"), "PULSE_SPOOL_DIR": str(tmp / "spool"), **extra})
    return env


def _published(broker: str, prefix: str) -> tuple[list[sample_codec.EpochBatch], list[ev_codec.HookEvent]]:
    batches = [sample_codec.decode(v) for v in _read(broker, f"{prefix}.samples")]
    events = [e for v in _read(broker, f"{prefix}.hook-events") for e in ev_codec.decode_many(v)]
    return batches, events


def _assert_on_wall_clock(times: list[int], start_ns: int, end_ns: int) -> None:
    assert times
    early = [t for t in times if t < start_ns - SLACK_BEFORE_NS]
    late = [t for t in times if t > end_ns + SLACK_AFTER_NS]
    assert not early and not late, (f"{len(early)} before / {len(late)} after the run "
                                    f"[{start_ns}, {end_ns}]: e.g. {(early or late)[:3]}")


def test_produce_sim_streams_on_the_wall_clock_and_keeps_relative_timing(broker, tmp_path):
    prefix = "wc" + uuid.uuid4().hex[:8]
    kept = tmp_path / "kept"
    start = time.time_ns()
    r = subprocess.run(
        [sys.executable, "-m", "pulse.cli", "produce", "--broker", broker, "--topic-prefix", prefix,
         "--partitions", "2", "--coalesce-ms", "0", "--json",
         "sim", "--scenario", "nic-slow", "--seed", "2", "--job", "wall", "--keep", str(kept), *SMALL],
        capture_output=True, text=True, timeout=600, env=_env(tmp_path))
    end = time.time_ns()
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    batches, events = _published(broker, prefix)
    assert len(batches) == summary["batches"] and len(events) == summary["events"]
    _assert_on_wall_clock([b.t0_ns for b in batches], start, end)
    timed = [e.t_host_ns for e in events if e.t_host_ns is not None]
    _assert_on_wall_clock(timed, start, end)

    # One offset for the whole run, batches and events alike, against the trace kept on disk.
    offset = summary["time_offset_ns"]
    reader = TraceReader(kept)
    on_disk = {(b.node, b.nic, b.batch_seq): b.t0_ns for _, _, p in reader.nic_files() for b in read_batch_file(p)}
    assert {b.t0_ns - on_disk[(b.node, b.nic, b.batch_seq)] for b in batches} == {offset}
    disk_events = sorted((type(e).__name__, e.node, e.t_host_ns + offset)
                         for e in reader.events() if e.t_host_ns is not None)
    assert sorted((type(e).__name__, e.node, e.t_host_ns) for e in events if e.t_host_ns is not None) == disk_events
    # The kept trace is the simulator's: its own times, far from now by the offset.
    assert abs(offset) > SLACK_BEFORE_NS


def test_demo_streams_on_the_wall_clock(broker, tmp_path):
    prefix = "wd" + uuid.uuid4().hex[:8]
    start = time.time_ns()
    r = subprocess.run(
        [sys.executable, "-m", "pulse.cli", "demo", "--json", "--scenario", "nic-slow", "--seed", "2",
         "--nodes", "4", "--gpus-per-node", "2", "--nics-per-node", "2", "--steps", "8", "--timeout", "60"],
        capture_output=True, text=True, timeout=600,
        env=_env(tmp_path, PULSE_BROKER=broker, PULSE_TOPIC_PREFIX=prefix, PULSE_PARTITIONS="2"))
    end = time.time_ns()
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["type"] == "demo-summary" and summary["batches"] > 0
    batches, events = _published(broker, prefix)
    _assert_on_wall_clock([b.t0_ns for b in batches], start, end)
    _assert_on_wall_clock([e.t_host_ns for e in events if e.t_host_ns is not None], start, end)
    # What the worker derived from them is on the wall clock too.
    verdicts = [json.loads(v) for v in _read(broker, f"{prefix}.verdicts")]
    _assert_on_wall_clock([v["first_seen_ns"] for v in verdicts if v.get("first_seen_ns")] or [start], start, end)
