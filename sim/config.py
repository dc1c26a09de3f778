"""What to simulate: cluster size, workload, scenario, and the validation of all of it."""

from __future__ import annotations

import dataclasses

from pulse.sim.scenarios import SCENARIOS, Scenario, get_scenario, resolve_severity
from pulse.sim.trees import ALGOS

from pulse.errors import ConfigError
from pulse.samples import check_name

WORKLOADS = ("dense", "moe")


@dataclasses.dataclass(frozen=True)
class SimConfig:
    scenario: str = "healthy"
    seed: int = 0
    nodes: int = 8
    gpus_per_node: int = 8
    nics_per_node: int = 8
    pp: int = 2
    steps: int = 20
    epoch_us: int = 32
    workload: str | None = None
    """None: the scenario's default workload."""
    severity: float | None = None
    onset_ms: float | None = None
    """None: about a third into the run (estimated from the healthy step time)."""
    fault_duration_ms: float | None = None
    """How long the fault acts from its onset (None: to the end of the run): the cause is
    removed then, so a monitor's incident can be seen to resolve."""
    job: str = "sim"
    nic_gbps: float = 400.0
    clock_offset_us: float = 100.0
    """Per-node clock offsets are uniform in +- this (random per run)."""
    batch_ms: float = 10.0
    """Time window of one epoch batch."""
    algo: str = "auto"
    """AllReduce algorithm: ring, tree, or auto (NCCL-like cost model per bucket size)."""
    bucket_mb: float | None = None
    """DP gradient bucket size in MiB; None: the workload's (dense 64, MoE 32)."""

    def resolved(self) -> ResolvedConfig:
        """Validate everything and fill the scenario-dependent defaults."""
        sc = get_scenario(self.scenario)
        for name, value, lo, hi in (
            ("--nodes", self.nodes, 2, 256), ("--gpus-per-node", self.gpus_per_node, 1, 16),
            ("--nics-per-node", self.nics_per_node, 1, 16), ("--pp", self.pp, 1, 16),
            ("--steps", self.steps, 1, 10_000), ("--epoch-us", self.epoch_us, 1, 1000),
        ):
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ConfigError(f"{name}={value!r}: must be an integer in [{lo}, {hi}]")
        if self.nodes % self.pp:
            raise ConfigError(f"--pp {self.pp} does not divide --nodes {self.nodes}: valid pp values for "
                              f"{self.nodes} nodes: {', '.join(str(p) for p in _divisors(self.nodes))}")
        if self.nodes // self.pp < 2:
            raise ConfigError(f"--nodes {self.nodes} with pp {self.pp} leaves DP={self.nodes // self.pp}: "
                              "data parallelism needs at least 2 nodes per pipeline stage")
        if self.gpus_per_node % self.nics_per_node:
            raise ConfigError(f"--nics-per-node {self.nics_per_node} must divide --gpus-per-node "
                              f"{self.gpus_per_node} (rail-optimized: GPU g uses NIC g*nics/gpus)")
        workload = self.workload or sc.workload
        if workload not in WORKLOADS:
            raise ConfigError(f"--workload {workload!r}: valid workloads: {', '.join(WORKLOADS)}")
        if workload not in sc.workloads:
            raise ConfigError(f"scenario {sc.name!r} needs --workload {' or '.join(sc.workloads)}")
        if self.scenario == "switch-congestion" and self.nodes < 4:
            raise ConfigError("switch-congestion needs at least 4 nodes (two leaves)")
        if self.onset_ms is not None and not 0 <= self.onset_ms <= 1e9:
            raise ConfigError(f"--onset-ms {self.onset_ms}: must be in [0, 1e9]")
        if self.fault_duration_ms is not None and not 0 < self.fault_duration_ms <= 1e9:
            raise ConfigError(f"--fault-duration-ms {self.fault_duration_ms}: must be in (0, 1e9]")
        if not 1.0 <= self.nic_gbps <= 3200.0:
            raise ConfigError(f"nic_gbps={self.nic_gbps}: must be in [1, 3200]")
        if not 0.0 <= self.clock_offset_us <= 10_000.0:
            raise ConfigError(f"--clock-skew-us {self.clock_offset_us}: must be in [0, 10000]")
        if not 0 <= self.seed < 2**32:  # the run's hashes mix the seed into 64-bit arithmetic
            raise ConfigError(f"--seed {self.seed}: must be in [0, 2**32)")
        if not 0.1 <= self.batch_ms <= 1000.0:
            raise ConfigError(f"batch_ms={self.batch_ms}: must be in [0.1, 1000]")
        if self.algo not in ALGOS:
            raise ConfigError(f"--algo {self.algo!r}: valid algorithms: {', '.join(ALGOS)}")
        if self.bucket_mb is not None and not 0.001 <= self.bucket_mb <= 4096.0:
            raise ConfigError(f"--bucket-mb {self.bucket_mb}: must be in [0.001, 4096]")
        check_name("job", self.job)
        severity = resolve_severity(sc, self.severity)
        return ResolvedConfig(cfg=self, sc=sc, workload=workload, severity=severity)


def _divisors(n: int) -> list[int]:
    return [p for p in range(1, n + 1) if n % p == 0 and n // p >= 2]


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    cfg: SimConfig
    sc: Scenario
    workload: str
    severity: float | None

    @property
    def dp(self) -> int:
        return self.cfg.nodes // self.cfg.pp

    @property
    def epoch_ns(self) -> int:
        return self.cfg.epoch_us * 1000


def scenario_names() -> list[str]:
    return list(SCENARIOS)


__all__ = ["ALGOS", "WORKLOADS", "ResolvedConfig", "Scenario", "SimConfig", "scenario_names"]
