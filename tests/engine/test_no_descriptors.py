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


def test_capture_alone_names_the_missing_descriptors_without_network_only(tmp_path: Path) -> None:
    t = _keep_events(tmp_path, lambda e: e["type"] == "flow" and e.get("comm_id") is None)
    with pytest.raises(TraceError, match="no operator descriptors: 0 op events") as err:
        diagnose(t, network_only=False)
    assert "flow events" in str(err.value)


def test_capture_alone_switches_to_network_only_and_names_the_rate_limited_node(tmp_path: Path) -> None:
    """The issue's case: a real Gloo job, rank 2's link at 200 Mbit/s, captured, no
    descriptor: the answer is node-02 (its sends at ~5 % of its peers' rate), said to come
    from the traffic alone."""
    t = _keep_events(tmp_path, lambda e: e["type"] == "flow")
    res = diagnose(t)
    assert res.network_only and "0 op events" in res.network_only_reason
    named = {tuple(i.nodes) for i in res.incidents}
    assert named == {("node-02",)}
    assert all(i.kind == "network-slow" for i in res.incidents)
    r = CliRunner().invoke(main, ["diagnose", str(t)])
    assert r.exit_code == 0 and "network-only mode" in r.stderr and "node-02" in r.output
    assert "no incident" not in r.output


def test_no_hooks_ignores_the_descriptors_of_a_whole_trace() -> None:
    res = diagnose(LAB, network_only=True)
    assert res.network_only and {tuple(i.nodes) for i in res.incidents} == {("node-02",)}
    assert all(m.comm_id.startswith("inferred:") and m.kind == "GroupP2P" for m in res.metrics)


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
