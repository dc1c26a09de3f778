"""Simulator traces for the segmentation accuracy tests: each (scenario, seed, workload)
is simulated once per session (small cluster, few steps), all of them the first time one
is asked for (in-process through pulse.sim's ``simulate``; the ``pulse sim`` CLI when
that API is not importable)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from segcases import CASES, SIM_SIZE

SIM_ARGS = [x for k, v in SIM_SIZE.items() for x in (f"--{k.replace('_', '-')}", str(v))]


def _pulse() -> str:
    return str(Path(sys.executable).with_name("pulse"))


class SimTraces:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.done: dict[tuple, Path] = {}
        self.errors: dict[tuple, str] = {}

    def _run(self, case: tuple) -> None:
        scenario, seed, workload = case
        out = self.root / f"{scenario}-{seed}-{workload or 'default'}"
        try:
            # In-process saves the CLI's start-up (imports, numba cache loads) per trace.
            from pulse.sim.config import SimConfig
            from pulse.sim.run import simulate
        except ImportError:
            simulate = None
        if simulate is not None:
            try:
                simulate(SimConfig(scenario=scenario, seed=seed, nodes=SIM_SIZE["nodes"],
                                   gpus_per_node=SIM_SIZE["gpus_per_node"],
                                   nics_per_node=SIM_SIZE["nics_per_node"], steps=SIM_SIZE["steps"],
                                   workload=workload), out)
                self.done[case] = out
            except Exception as exc:  # reported by the test that needs this trace
                self.errors[case] = f"{type(exc).__name__}: {exc}"
            return
        cmd = [_pulse(), "sim", "--scenario", scenario, "--seed", str(seed), *SIM_ARGS, "--out", str(out)]
        if workload:
            cmd += ["--workload", workload]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            self.errors[case] = r.stderr[-2000:]
        else:
            self.done[case] = out

    def prepare(self, cases: list[tuple]) -> None:
        for c in cases:
            if c not in self.done and c not in self.errors:
                self._run(c)

    def get(self, case: tuple) -> Path:
        if case not in self.done and case not in self.errors:
            self.prepare(CASES if case in CASES else [case])
        if case in self.errors:
            pytest.fail(f"pulse sim failed for {case}: {self.errors[case]}")
        return self.done[case]


@pytest.fixture(scope="session")
def sim_traces(tmp_path_factory: pytest.TempPathFactory) -> SimTraces:
    return SimTraces(tmp_path_factory.mktemp("seg-sim"))
