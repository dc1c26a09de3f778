"""What a soak runs and when: its settings, the short simulated jobs it replays, and the
seeded schedule of faults (the run itself is in soak.py)."""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path
from typing import Any

__all__ = ["FAULT_KINDS", "JOBS", "SoakConfig", "say", "schedule", "simulate_jobs"]

# The simulated jobs, replayed in turn (scenario, seed offset); small enough to simulate in
# seconds, with the fault starting and ending inside the run.
JOBS = (("nic-slow", 0), ("gpu-slow", 1), ("healthy", 2))
SIM_SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "steps": 30}
ONSET_MS, FAULT_MS = 1500.0, 2000.0
FAULT_KINDS = ("broker-restart", "worker-kill", "influx-outage", "poison")
FAULT_EVERY_S = 15.0  # one fault (of the kinds above, in turn) about this often


@dataclasses.dataclass
class SoakConfig:
    minutes: float = 10.0
    seed: int = 1
    workers: int = 2
    partitions: int = 4
    burst_speed: float = 4.0
    settle_timeout_s: float = 240.0
    echo: bool = True
    storage: str = "memory"
    """memory: Tansu's memory storage (a restart loses what it held, counted); s3: Tansu on an
    S3 store (moto), which keeps the topics but stalls consumers here (docs/reliability.md)."""


def say(cfg: SoakConfig, text: str) -> None:
    if cfg.echo:
        print(f"[soak] {text}", file=sys.stderr, flush=True)


def schedule(cfg: SoakConfig) -> list[tuple[float, str]]:
    """Seeded fault times (s from the start of streaming) and kinds: each kind in turn (in a
    shuffled order), at jittered times spread over the run, none in its last 5 s."""
    rng = random.Random(cfg.seed)
    duration = cfg.minutes * 60.0
    n = max(len(FAULT_KINDS), round(duration / FAULT_EVERY_S))
    kinds = list(FAULT_KINDS)
    rng.shuffle(kinds)
    span = max(duration - 10.0, 1.0)
    slot = span / n
    return [(round(5.0 + i * slot + rng.uniform(0.1, 0.6) * slot, 2), kinds[i % len(kinds)]) for i in range(n)]


def simulate_jobs(cfg: SoakConfig, root: Path) -> list[tuple[Path, dict[str, Any]]]:
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    from pulse.trace import read_truth

    out = []
    for scenario, k in JOBS:
        trace = root / f"{scenario}-{cfg.seed + k}"
        if not (trace / "truth.json").exists():
            faulty = scenario != "healthy"
            simulate(SimConfig(scenario=scenario, seed=cfg.seed + k, job="soak",
                               onset_ms=ONSET_MS if faulty else None, fault_duration_ms=FAULT_MS if faulty else None,
                               **SIM_SIZE), trace)  # type: ignore[arg-type]
        out.append((trace, read_truth(trace)))
    return out
