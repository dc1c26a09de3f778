"""End to end, as root: `pulse lab sweep --runs 2` runs the real lab twice (namespaces, the DDP
job, a drawn fault, the capture, Pulse) and reports both runs, scored, and tears down all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pulse.lab.netns import LabNetwork
from pulse.lab.sweep import draws

pytestmark = [pytest.mark.root, pytest.mark.slow]
pytest.importorskip("torch")
if os.geteuid() != 0:
    pytest.skip("the lab needs root", allow_module_level=True)

PULSE = [str(Path(sys.executable).with_name("pulse"))]
SEED = 1


def test_a_real_sweep_of_two_runs() -> None:
    proc = subprocess.run([*PULSE, "lab", "sweep", "--runs", "2", "--seed", str(SEED), "--json"],
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    obj = json.loads(proc.stdout)
    assert [x["draw"] for x in obj["runs"]] == [d.to_dict() for d in draws(2, SEED)]
    for x in obj["runs"]:
        assert x["outcome_all"] in ("node", "group", "misdiagnosed", "missed", "healthy-ok", "false-alarm")
        assert x["capture"]["packets"] > 10_000  # real traffic was captured and analysed
        assert x["step_ms"]["healthy_median"] is not None
    assert proc.stderr.count("lab sweep [") == 2 and "every incident scored" in proc.stderr
    for x in obj["wrong"]:
        assert x["command"] in proc.stderr
    assert LabNetwork.exists("plab") == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert "ddp_job.py" not in ps and "tcpdump -i br0" not in ps
