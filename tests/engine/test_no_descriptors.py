"""A trace Pulse cannot judge says precisely why, never "no anomaly" (issue #21's first
complaint: a capture of a real job without descriptors answered "no anomaly").

The traces are the real lab capture kept as a fixture (tests/engine/traces/lab-rate: a
4-rank Gloo job, rank 2 rate-limited), with part of its hook events removed the way a
cluster without each descriptor source would have produced it."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from pulse.engine import diagnose

from pulse.cli import main
from pulse.errors import TraceError

LAB = Path(__file__).parent / "traces" / "lab-rate"


def _keep_events(tmp_path: Path, keep: object) -> Path:
    t = tmp_path / "trace"
    shutil.copytree(LAB, t)
    lines = (LAB / "hook-events.jsonl").read_bytes().splitlines()
    kept = [ln for ln in lines if keep(orjson.loads(ln))]  # type: ignore[operator]
    (t / "hook-events.jsonl").write_bytes(b"".join(ln + b"\n" for ln in kept))
    return t


def test_capture_alone_names_the_missing_descriptors(tmp_path: Path) -> None:
    t = _keep_events(tmp_path, lambda e: e["type"] == "flow" and e.get("comm_id") is None)
    with pytest.raises(TraceError, match="no operator descriptors: 0 op events") as err:
        diagnose(t)
    assert "flow events" in str(err.value)
    r = CliRunner().invoke(main, ["diagnose", str(t)])
    assert r.exit_code == 1
    assert "no operator descriptors" in r.output and "no anomaly" not in r.output and "no incident" not in r.output


def test_ops_without_bound_flows_say_the_traffic_is_not_tied(tmp_path: Path) -> None:
    t = _keep_events(tmp_path, lambda e: e["type"] != "flow")
    with pytest.raises(TraceError, match="no flow is bound to a communicator rank"):
        diagnose(t)


def test_no_traffic_says_so(tmp_path: Path) -> None:
    t = _keep_events(tmp_path, lambda e: True)
    shutil.rmtree(t / "samples")
    (t / "samples").mkdir()
    with pytest.raises(TraceError, match="no traffic"):
        diagnose(t)


def test_the_whole_trace_is_still_diagnosed() -> None:
    res = diagnose(LAB)
    assert res.metrics and res.anomalies
    assert not {"op_events", "flow_events", "comm_events", "bound_flow_events"} & set(res.damage)


def test_no_node_with_traffic_is_never_a_stop(tmp_path: Path) -> None:
    """Before: a trace whose samples were all missing gave "node-00: network fail-stop, its
    traffic stopped after 0 % of an operator's bytes" - a blame made of absent input. The
    engine feeds data ends, so a node that never sent a batch is unseen even when no node
    sent one."""
    from pulse.engine import JobEngine
    from pulse.engine.diagnose import run_engine

    from pulse.trace import TraceReader

    t = _keep_events(tmp_path, lambda e: True)
    shutil.rmtree(t / "samples")
    (t / "samples").mkdir()
    engine = JobEngine()
    run_engine(TraceReader(t), engine)
    assert engine.metrics  # the ops were segmented (as never started)...
    assert not [v for v in engine.verdicts if v.status == "anomaly"]  # ...and nobody is blamed
    assert {n for v in engine.verdicts if v.status == "insufficient-data" for n in v.nodes}
