"""A NIC that flaps under MoE, end to end on simulated traffic: its rail's all-to-alls stall
(silent, not busy) while the same all-to-alls on its node's other NICs end together, and
the rail rule names that node and NIC (rules/rail.py: all-to-alls as rail siblings)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pulse.engine import diagnose
from pulse.localization import score
from pulse.localization.lifecycle import summary
from pulse.sim import SimConfig, simulate

from pulse.trace import read_truth

SIZE = {"nodes": 4, "gpus_per_node": 4, "nics_per_node": 4, "pp": 1, "steps": 12, "workload": "moe"}


@pytest.mark.parametrize("seed", [1, 3])
def test_a_nic_flapping_under_moe_is_named_on_its_node_and_nic(tmp_path: Path, seed: int) -> None:
    trace = tmp_path / "flap"
    simulate(SimConfig(scenario="nic-flap", seed=seed, severity=30.0, **SIZE), trace)  # type: ignore[arg-type]
    truth = read_truth(trace)
    res = diagnose(trace)
    s = score(res.verdicts, truth, method="pulse")
    assert (s.outcome, s.outcome_all) == ("node", "node"), s.named
    first = next(v for v in res.verdicts if v.status == "anomaly")
    assert (first.kind, first.nodes, first.nics) == ("network-slow", truth["culprit"]["nodes"],
                                                   truth["culprit"]["nics"])
    assert "all-to-alls on that NIC" in summary(first, 1)


def test_a_healthy_moe_job_has_no_silent_all_to_all(tmp_path: Path) -> None:
    trace = tmp_path / "healthy"
    simulate(SimConfig(scenario="healthy", seed=1, **SIZE), trace)  # type: ignore[arg-type]
    assert [v for v in diagnose(trace).verdicts if v.status == "anomaly"] == []
