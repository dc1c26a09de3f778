"""Fixtures of the nic tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REAL = Path("/work/shared/data/real-captures")


@pytest.fixture(scope="session")
def real_captures() -> Path:
    if not REAL.is_dir():
        pytest.skip(f"real capture fixtures missing at {REAL}")
    return REAL


@pytest.fixture(scope="session")
def tshark() -> str:
    path = shutil.which("tshark") or "/usr/bin/tshark"
    if not Path(path).exists():
        pytest.skip("tshark is not installed: the independent cross-check needs it")
    return path


@pytest.fixture(scope="session")
def tcpdump() -> str:
    path = shutil.which("tcpdump") or "/usr/bin/tcpdump"
    if not Path(path).exists():
        pytest.skip("tcpdump is not installed")
    return path
