"""A small simulated nic-slow trace, shared by the report tests (simulated once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_sim import simulate


@pytest.fixture(scope="session")
def nic_slow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return simulate(tmp_path_factory.mktemp("report") / "nic-slow", "nic-slow", 1)
