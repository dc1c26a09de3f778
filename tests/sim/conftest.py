"""Small simulated traces shared by the sim tests (one simulation each per session)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pulse.sim.config import SimConfig
from pulse.sim.run import simulate

# 8 nodes x 2 GPUs x 2 NICs: DP rings of 4 nodes, PP=2, two rails - small but every mechanism
SMALL = dict(nodes=8, gpus_per_node=2, nics_per_node=2, steps=4)


def _sim(factory: pytest.TempPathFactory, name: str, **kw: object) -> Path:
    out = factory.mktemp("sim") / name
    simulate(SimConfig(**{**SMALL, **kw}), out)  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="session")
def small() -> dict:
    return dict(SMALL)


@pytest.fixture(scope="session")
def healthy_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sim(tmp_path_factory, "healthy", scenario="healthy", seed=7, onset_ms=100.0)


@pytest.fixture(scope="session")
def nic_slow_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sim(tmp_path_factory, "nic-slow", scenario="nic-slow", seed=7, severity=0.25, onset_ms=100.0)


@pytest.fixture(scope="session")
def loss_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _sim(tmp_path_factory, "loss", scenario="packet-loss", seed=7, onset_ms=100.0)
