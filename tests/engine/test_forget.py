"""A worker forgets jobs and nodes idle for ``FORGET_S`` (their incidents resolved first), so
what it holds stays bounded by what is live, and a job seen again is judged anew."""

from __future__ import annotations

from pathlib import Path

import pytest
from pulse.engine import JobEngine
from pulse.engine.localize_stage import FORGET_S, JOB_IDLE_S
from pulse.sim import SimConfig, simulate

from pulse.samples import EpochBatch
from pulse.trace import TraceReader

SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "pp": 1, "steps": 8}


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("forget") / "nic-slow"
    simulate(SimConfig(scenario="nic-slow", seed=0, **SIZE), t)  # type: ignore[arg-type]
    return t


def _fed(trace: Path, now: float) -> JobEngine:
    """The whole fixture fed as a live source would, in 50 ms chunks of trace time, all at
    wall time ``now`` (0: offline)."""
    engine = JobEngine()
    setup, timed = TraceReader(trace).timeline()
    engine.feed(setup, now=now)
    chunk: list[object] = []
    cut = None
    for t, item in timed:
        if cut is not None and t >= cut:
            engine.feed([i for i in chunk if not isinstance(i, EpochBatch)],  # type: ignore[misc]
                        [i for i in chunk if isinstance(i, EpochBatch)], now=now)
            chunk, cut = [], None
        cut = t + 50_000_000 if cut is None else cut
        chunk.append(item)
    engine.feed([i for i in chunk if not isinstance(i, EpochBatch)],  # type: ignore[misc]
                [i for i in chunk if isinstance(i, EpochBatch)], now=now)
    assert engine.metrics
    return engine


def test_an_idle_job_and_its_nodes_are_forgotten_after_its_incidents_resolved(trace: Path) -> None:
    t0 = 1000.0
    engine = _fed(trace, t0)
    assert engine.localize.jobs and engine.segment.nodes
    opened = {i.id for i in engine.incidents if i.state == "open"}
    engine.feed(now=t0 + JOB_IDLE_S / 2)
    assert engine.localize.jobs and engine.segment.nodes  # idle, not yet forgotten
    engine.feed(now=t0 + FORGET_S + 1)
    assert not engine.localize.jobs and not engine.segment.nodes
    assert engine.localize.forgotten == 1 and engine.segment.forgotten == 4
    resolved = {i.id for i in engine.incidents if i.state == "resolved"}
    assert opened and opened <= resolved  # every open incident was resolved before the job went


def test_a_node_still_sending_is_kept(trace: Path) -> None:
    engine = _fed(trace, 1000.0)
    node = sorted(engine.segment.nodes)[0]
    engine.segment.add([], [], now=1000.0)
    engine.segment._seen[node] = 1000.0 + FORGET_S  # it sent just now
    engine.segment.forget(1000.0 + FORGET_S + 1, FORGET_S)
    assert set(engine.segment.nodes) == {node}


def test_offline_runs_forget_nothing(trace: Path) -> None:
    engine = _fed(trace, 0.0)
    engine.feed(now=0.0)
    assert engine.segment.forget(10 * FORGET_S, FORGET_S) == [] and engine.segment.nodes
