"""A healthy tree job whose issue times drift from step to step (sweep 197 #5): one node rose
above its baseline in 9 of 16 buckets of each rail's communicator, a handful of steps, each
bucket counted as a trial of the weak lateness test; it was named compute-slow. Trials are
steps now (rules/late.py: weakly_late)."""

from __future__ import annotations

from pathlib import Path

from pulse.engine import diagnose
from pulse.localization import LocalizeParams
from pulse.sim import SimConfig, simulate


def test_a_healthy_tree_job_drifting_from_step_to_step_raises_no_alarm(tmp_path: Path) -> None:
    trace = tmp_path / "healthy-tree"
    simulate(SimConfig(scenario="healthy", seed=757696510, workload="dense", nodes=4, gpus_per_node=8,
                       nics_per_node=4, pp=1, steps=20, epoch_us=96, algo="tree", bucket_mb=16.0,
                       clock_offset_us=3656.0), trace)
    res = diagnose(trace, LocalizeParams(clock_skew_ns=10_000_000))
    assert [(v.kind, v.nodes) for v in res.anomalies] == []
