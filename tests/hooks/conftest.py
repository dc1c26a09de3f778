from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from pulse.hooks import build_plugin

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def plugin_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    return build_plugin(tmp_path_factory.mktemp("plugin"))


@pytest.fixture(scope="session")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The NCCL-like driver (tests/hooks/nccl_harness.c), compiled for this run."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = tmp_path_factory.mktemp("harness") / "nccl_harness"
    subprocess.run(["cc", "-O1", "-Wall", "-Werror", "-o", str(out), str(HERE / "nccl_harness.c"), "-ldl", "-pthread"],
                   check=True, capture_output=True, text=True)
    return out
