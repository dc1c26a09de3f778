"""A hostile stream into the segment agent's state (huge messages, deep JSON, two million
distinct flow ids, a million communicators, thousands of node names): rejected and counted,
with the process's peak RSS held under a bound relative to a legitimate stream's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LIMITS = {"PULSE_MAX_FLOWS_PER_NODE": "65536", "PULSE_MAX_COMMS_PER_JOB": "1024", "PULSE_MAX_NODES_PER_WORKER": "1024"}
# Above the legitimate run's peak: the 64 MiB hostile buffer the feeder itself holds, the
# admitted state (65,536 flows, 1,024 communicators on 1,024 nodes) and one packed message
# decoding at a time. Without the bounds the same stream passed 1 GiB and kept growing (docs/security.md).
BOUND_MIB = 320

pytestmark = pytest.mark.slow


def feed(mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")} | LIMITS
    res = subprocess.run([sys.executable, str(HERE / "hostile_feed.py"), mode], env=env, capture_output=True,
                         text=True, timeout=900, cwd=HERE)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_hostile_stream_is_rejected_counted_and_memory_stays_bounded() -> None:
    base = feed("baseline")
    hostile = feed("hostile")
    grew_mib = (hostile["peak_rss_kib"] - base["peak_rss_kib"]) / 1024
    assert grew_mib < BOUND_MIB, f"peak RSS grew {grew_mib:.0f} MiB over the legitimate run ({hostile})"
    # 8 huge samples + 8 huge hook-events messages + 2 deep JSON documents
    assert hostile["dead_letters"] == base["dead_letters"] + 18
    assert hostile["rejected_flow_rows"] == 2_000_000 - 65_536  # flow ids 0..65535 fit, n0's 64 among them
    assert hostile["rejected_comm_events"] == 1_000_000 - (1024 - 1)
    assert hostile["nodes"] == 1024 and hostile["rejected_node_messages"] == 5_000 - (1024 - 2)
    assert hostile["batches"] > base["batches"]  # what stayed within the bounds was taken in
