"""A live job that goes silent (it died, or was stopped) has its open incidents resolved
after ``job_idle_s`` of wall time, once; offline runs never idle."""

from __future__ import annotations

from pathlib import Path

import pytest
from pulse.engine import Localizers, SegmentStage

from pulse.events import HookEvent
from pulse.records import Incident
from pulse.samples import EpochBatch
from pulse.trace import TraceReader


@pytest.fixture(scope="module")
def nic_slow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    out = tmp_path_factory.mktemp("idle") / "nic-slow"
    simulate(SimConfig(scenario="nic-slow", seed=2, job="job-idle", nodes=4, gpus_per_node=2, nics_per_node=2,
                       steps=8), out)
    return out


def _feed(trace: Path, loc: Localizers, now: float) -> list[Incident]:
    """The whole trace through the segmentation stage, its output to ``loc`` at ``now``."""
    seg = SegmentStage()
    setup, timed = TraceReader(trace).timeline()
    events: list[HookEvent] = list(setup)
    batches: list[EpochBatch] = []
    for _t, item in timed:
        (batches if isinstance(item, EpochBatch) else events).append(item)  # type: ignore[arg-type]
    changes: list[Incident] = []
    for out in (seg.add(events, batches), seg.finish()):
        for (job, _node), items in out.forwards.items():
            loc.add_forwarded(job, items)
        loc.add_metrics(out.metrics, now)
        changes += loc.tick(now, budget_s=None).incidents
    return changes


def test_a_silent_job_resolves_its_open_incidents_once(nic_slow: Path) -> None:
    loc = Localizers(job_idle_s=60.0)
    t0 = 1000.0
    opened = _feed(nic_slow, loc, t0)
    assert opened and opened[0].state == "open" and {i.id for i in opened} == {opened[0].id}
    assert "resolved" not in {i.state for i in opened}  # the fault lasts to the end of the data
    assert loc.tick(t0 + 59.0).incidents == []  # not silent long enough
    ended = loc.tick(t0 + 61.0).incidents
    assert [(i.id, i.state, i.resolution) for i in ended] == [(opened[0].id, "resolved", "job-ended")]
    assert ended[0].resolved_at_ns is not None and ended[0].resolved_at_ns >= ended[0].last_seen_ns
    assert loc.tick(t0 + 200.0).incidents == []  # once


def test_offline_runs_never_idle(nic_slow: Path) -> None:
    from pulse.engine import diagnose

    states = [i.state for i in diagnose(nic_slow).incidents]
    assert states[0] == "open" and states.count("resolved") == 1 and states[-1] == "resolved"
