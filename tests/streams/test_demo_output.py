"""``pulse demo`` reads like a page: a few lines, one per incident state change, and never a
traceback, on the trace of every battery scenario (``--trace``)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pulse.sim.scenarios import SCENARIOS
from pulse.streams.demo import first_anomalous_end_ns

from pulse.trace import read_truth

pytestmark = pytest.mark.slow
PULSE = str(Path(sys.executable).with_name("pulse"))


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    root = tmp_path_factory.mktemp("demo-battery")
    out = {}
    for name in SCENARIOS:
        simulate(SimConfig(scenario=name, seed=1, job=f"demo-{name}", nodes=4, gpus_per_node=2, nics_per_node=2,
                           steps=8), root / name)
        out[name] = root / name
    return out


def test_the_latency_reference_tolerates_operators_that_never_ended(battery: dict[str, Path]) -> None:
    ends = {name: first_anomalous_end_ns(read_truth(trace)) for name, trace in battery.items()}
    assert ends["healthy"] is None
    assert isinstance(ends["nic-slow"], int) and isinstance(ends["nic-down"], int)  # nic-down: some never end


def _demo(broker: str, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    env.update({"PULSE_BROKER": broker, "PULSE_TOPIC_PREFIX": "d" + uuid.uuid4().hex[:8],
                "PULSE_DATA_DIR": str(tmp / "data"), "PULSE_SPOOL_DIR": str(tmp / "spool")})
    return subprocess.run([PULSE, "demo", "--timeout", "30", *args], capture_output=True, text=True, env=env,
                          timeout=240)


@pytest.fixture(scope="module")
def demo_runs(broker: str, battery: dict[str, Path],
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """``pulse demo --trace`` on every scenario, three at a time: each spends most of its
    wall time waiting (its worker's start, the quiet period after the stream), not
    computing, and each has its own topics and directories."""
    root = tmp_path_factory.mktemp("demo-runs")

    def one(name: str) -> subprocess.CompletedProcess[str]:
        (root / name).mkdir()
        return _demo(broker, root / name, "--trace", str(battery[name]), "--speed", "4")

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(SCENARIOS, pool.map(one, SCENARIOS), strict=True))


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_demo_trace_runs_clean_on_every_scenario(demo_runs: dict[str, subprocess.CompletedProcess[str]],
                                                 name: str) -> None:
    r = demo_runs[name]
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines[-1].startswith(("culprit: ", "no incident")), lines[-3:]
    if name == "healthy":
        assert lines[-1].startswith("no incident") and not any(" OPEN " in x for x in lines)


def test_the_single_fault_demo_fits_on_a_page(broker: str, tmp_path: Path) -> None:
    r = _demo(broker, tmp_path, "--scenario", "nic-slow", "--nodes", "4", "--gpus-per-node", "2",
              "--nics-per-node", "2", "--steps", "12")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) < 10, "\n".join(lines)
    assert any("] OPEN " in x and "network fail-slow" in x for x in lines), lines
    assert lines[-1].startswith("culprit: ") and "diagnosed" in lines[-1]
