"""Random draws for ``pulse eval --sweep``: the job shapes, workloads and fault strengths a
user may run, beyond the battery's one default shape.

Each draw is one ``pulse sim`` command line: scenario (healthy about one in five), nodes,
GPUs and NICs per node, pipeline stages, workload, AllReduce algorithm and bucket size,
epoch length, severity anywhere in the scenario's range, onset, per-node clock offsets.
A draw is a pure function of (sweep seed, index), so a sweep is replayable and each miss
can be simulated again on its own from the printed command line.
"""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import numpy as np

from pulse.errors import ConfigError

HEALTHY_SHARE = 0.2
GPU_CHOICES = (4, 8)
EPOCH_CHOICES_US = (16, 24, 32, 48, 64, 96, 128)
BUCKET_CHOICES_MB = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
ONSET_FRACS = (0.15, 0.6)
"""Onset drawn in this fraction of the run's estimated length (the simulator's default is
0.35): late enough that the job has a healthy reference, early enough to persist."""


@dataclasses.dataclass(frozen=True)
class SweepLimits:
    min_nodes: int = 4
    max_nodes: int = 32
    max_gpus_per_node: int = 8
    """GPUs per node are drawn from 4 and 8 up to this; below 4, this value alone."""
    max_pp: int = 4
    max_skew_us: float = 5000.0
    """Per-node clock offsets are drawn in +- a value drawn in [0, this]."""
    steps: int = 20

    def check(self) -> None:
        if not 4 <= self.min_nodes <= self.max_nodes <= 256:
            raise ConfigError(f"--max-nodes {self.max_nodes}: must be in [{self.min_nodes}, 256]")
        if not 1 <= self.max_gpus_per_node <= 16:
            raise ConfigError(f"--max-gpus-per-node {self.max_gpus_per_node}: must be in [1, 16]")
        if not 1 <= self.max_pp <= 16:
            raise ConfigError(f"max_pp={self.max_pp}: must be in [1, 16]")
        if not 0 <= self.max_skew_us <= 10_000:
            raise ConfigError(f"--clock-skew-us {self.max_skew_us}: must be in [0, 10000]")
        if not 1 <= self.steps <= 10_000:
            raise ConfigError(f"--sweep-steps {self.steps}: must be in [1, 10000]")


@dataclasses.dataclass(frozen=True)
class Draw:
    """One drawn run: everything ``pulse sim`` needs, and nothing else."""

    index: int
    scenario: str
    seed: int
    nodes: int
    gpus_per_node: int
    nics_per_node: int
    pp: int
    workload: str
    algo: str
    bucket_mb: float
    epoch_us: int
    severity: float | None
    onset_ms: float | None
    clock_skew_us: float
    steps: int

    def sim_args(self) -> list[str]:
        """The drawn parameters as ``pulse sim`` options (scenario, seed, workload and
        severity apart: the evaluation harness passes those itself)."""
        args = ["--nodes", str(self.nodes), "--gpus-per-node", str(self.gpus_per_node),
                "--nics-per-node", str(self.nics_per_node), "--pp", str(self.pp), "--steps", str(self.steps),
                "--epoch-us", str(self.epoch_us), "--algo", self.algo, "--bucket-mb", repr(self.bucket_mb),
                "--clock-skew-us", repr(self.clock_skew_us)]
        if self.onset_ms is not None:
            args += ["--onset-ms", repr(self.onset_ms)]
        return args

    def command(self, extra: tuple[str, ...] = ()) -> str:
        """The replayable ``pulse sim`` command line of this run."""
        args = ["pulse", "sim", "--scenario", self.scenario, "--seed", str(self.seed), "--workload", self.workload,
                *self.sim_args(), *extra]
        if self.severity is not None:
            args += ["--severity", repr(self.severity)]
        return shlex.join([*args, "--out", f"sweep-{self.index:03d}-{self.scenario}"])

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _pipeline_choices(nodes: int, max_pp: int) -> list[int]:
    return [p for p in range(1, max_pp + 1) if nodes % p == 0 and nodes // p >= 2]


def _est_run_ms(cfg: Any) -> float:
    """The simulator's own estimate of the run's length (what its default onset uses)."""
    from pulse.sim.workload import build_job

    one = dataclasses.replace(cfg, steps=1, scenario="healthy", severity=None, onset_ms=None)
    job = build_job(one.resolved(), np.random.default_rng(0))
    return float(job.est_step_ns) * cfg.steps / 1e6


def draw(sweep_seed: int, index: int, limits: SweepLimits | None = None) -> Draw:
    """The ``index``-th run of the sweep ``sweep_seed`` (deterministic)."""
    from pulse.sim.config import SimConfig
    from pulse.sim.scenarios import SCENARIOS
    from pulse.sim.trees import ALGOS

    lim = limits or SweepLimits()
    lim.check()
    rng = np.random.default_rng([sweep_seed, index, 0x5EE9])
    faults = [n for n in SCENARIOS if n != "healthy"]
    name = "healthy" if rng.random() < HEALTHY_SHARE else faults[int(rng.integers(len(faults)))]
    sc = SCENARIOS[name]
    nodes = int(rng.integers(lim.min_nodes, lim.max_nodes + 1))
    gpu_opts = [g for g in GPU_CHOICES if g <= lim.max_gpus_per_node] or [lim.max_gpus_per_node]
    gpus = gpu_opts[int(rng.integers(len(gpu_opts)))]
    nic_opts = [n for n in GPU_CHOICES if gpus % n == 0] or [gpus]
    nics = nic_opts[int(rng.integers(len(nic_opts)))]
    pps = _pipeline_choices(nodes, lim.max_pp)
    pp = pps[int(rng.integers(len(pps)))]
    workload = sc.workloads[int(rng.integers(len(sc.workloads)))]
    algo = ALGOS[int(rng.integers(len(ALGOS)))]
    bucket = BUCKET_CHOICES_MB[int(rng.integers(len(BUCKET_CHOICES_MB)))]
    epoch = EPOCH_CHOICES_US[int(rng.integers(len(EPOCH_CHOICES_US)))]
    severity = None
    if sc.severity_range is not None:
        lo, hi = sc.severity_range
        severity = round(float(rng.uniform(lo, hi)), 4)
    skew = round(float(rng.uniform(0.0, lim.max_skew_us)), 1)
    frac = float(rng.uniform(*ONSET_FRACS))
    seed = int(rng.integers(1, 1 << 31))
    cfg = SimConfig(scenario=name, seed=seed, nodes=nodes, gpus_per_node=gpus, nics_per_node=nics, pp=pp,
                    steps=lim.steps, epoch_us=epoch, workload=workload, severity=severity, algo=algo,
                    bucket_mb=bucket, clock_offset_us=skew)
    onset = None if name == "healthy" else round(frac * _est_run_ms(cfg), 3)
    return Draw(index, name, seed, nodes, gpus, nics, pp, workload, algo, bucket, epoch, severity, onset, skew,
                lim.steps)


def draws(n: int, sweep_seed: int, limits: SweepLimits | None = None) -> list[Draw]:
    if n < 1:
        raise ConfigError(f"--sweep {n}: must be >= 1")
    return [draw(sweep_seed, i, limits) for i in range(n)]
