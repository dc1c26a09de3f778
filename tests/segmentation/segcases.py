"""The simulator cases of the segmentation accuracy tests (a module of its own: several test
folders have a conftest.py, so ``from conftest import`` is ambiguous when they run together)."""

from __future__ import annotations

SCENARIOS = ("healthy", "nic-slow", "nic-down", "nic-flap", "packet-loss", "pcie-slow", "congestion",
             "gpu-slow", "gpu-hang", "cpu-contention", "moe-slow-nic", "path-slow", "switch-congestion")
SEEDS = (1, 2, 3)
# Every scenario with its own workload (moe-slow-nic is MoE), plus MoE runs of a healthy job,
# a slow NIC and a hang, so both workloads are covered under faults.
CASES = [(s, seed, None) for s in SCENARIOS for seed in SEEDS] + [
    (s, seed, "moe") for s in ("healthy", "nic-slow", "gpu-hang", "packet-loss") for seed in SEEDS]
SIM_SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "steps": 2}
