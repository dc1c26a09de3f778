"""Small simulated traces for the report tests (the real `pulse sim`, as a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# DP=4 rings over 4 nodes (pp 1), 2 rails: small, and the straggler has 3 peers per ring.
SIM_ARGS = ["--nodes", "4", "--pp", "1", "--gpus-per-node", "2", "--nics-per-node", "2", "--steps", "8"]


def simulate(out: Path, scenario: str, seed: int) -> Path:
    cmd = [sys.executable, "-m", "pulse.cli", "sim", "--scenario", scenario, "--seed", str(seed),
           *SIM_ARGS, "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}"
    return out
