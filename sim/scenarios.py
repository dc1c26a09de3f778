"""The scenario battery: names, physical knobs, severity ranges and the right answer.

A scenario only says *which physical quantity* changes and by how much; the traffic
signature that Pulse must find emerges from the engine (never painted here).
"""

from __future__ import annotations

import dataclasses

from pulse.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    cause: str
    kind: str | None
    """Verdict kind of the right answer (None: no alarm)."""
    level: str | None
    severity_range: tuple[float, float] | None
    """Valid ``--severity`` values (inclusive); None: the scenario takes no severity."""
    severity_meaning: str = ""
    workload: str = "dense"
    """Default workload; ``moe-slow-nic`` needs the MoE all-to-all."""
    workloads: tuple[str, ...] = ("dense", "moe")

    @property
    def default_severity(self) -> float | None:
        if self.severity_range is None:
            return None
        lo, hi = self.severity_range
        return round((lo + hi) / 2, 6)


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy", "none (jitter only)", None, None, None),
    Scenario("nic-slow", "one NIC's capacity scaled down", "network-slow", "node", (0.25, 0.5),
             "remaining fraction of the NIC's capacity"),
    Scenario("nic-down", "one NIC stops carrying anything from onset", "network-stop", "node", None),
    Scenario("nic-flap", "one NIC drops to zero periodically", "network-slow", "node", (5.0, 50.0),
             "milliseconds down per flap (one flap every max(100, 4 x down) ms)"),
    Scenario("packet-loss", "packet loss on one NIC's link, go-back-N recovery", "network-slow", "node",
             (0.005, 0.02), "packet loss probability"),
    Scenario("pcie-slow", "GPU<->NIC PCIe bandwidth of one node reduced (all its NICs)", "network-slow",
             "node", (0.2, 0.6), "remaining fraction of the NICs' usable bandwidth"),
    Scenario("congestion", "background bursts into one node's downlinks", "network-slow", "node",
             (0.5, 0.9), "fraction of 20 us blocks with a background incast burst on the downlinks"),
    Scenario("gpu-slow", "one GPU's compute slower", "compute-slow", "node", (1.2, 1.5),
             "compute time multiplier"),
    Scenario("gpu-hang", "one rank stops issuing operators", "compute-stop", "node", None),
    Scenario("cpu-contention", "one node's proxy and launch threads starved of CPU", "host-contention",
             "node", (0.3, 0.8), "fraction of CPU time the proxy thread loses"),
    Scenario("moe-slow-nic", "one NIC's capacity scaled down during MoE all-to-all", "network-slow",
             "node", (0.25, 0.5), "remaining fraction of the NIC's capacity", workload="moe",
             workloads=("moe",)),
    Scenario("path-slow", "one inter-node path (A<->B only) congested", "path", "group", (0.2, 0.5),
             "remaining fraction of the path's capacity, in NIC line rates per rail and direction, shared by "
             "all of A<->B's connections"),
    Scenario("switch-congestion", "background incast through one leaf switch into its two nodes' downlinks", "path", "group",
             (0.5, 0.9), "fraction of 20 us blocks with a background incast burst on both nodes' downlinks"),
)}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ConfigError(
            f"unknown scenario {name!r}; valid scenarios: {', '.join(SCENARIOS)}") from None


def resolve_severity(scenario: Scenario, severity: float | None) -> float | None:
    """The validated severity (the middle of the range when not given)."""
    if scenario.severity_range is None:
        if severity is not None:
            raise ConfigError(f"scenario {scenario.name!r} takes no --severity")
        return None
    if severity is None:
        return scenario.default_severity
    lo, hi = scenario.severity_range
    if not lo <= severity <= hi:
        raise ConfigError(
            f"--severity {severity} out of range for {scenario.name!r}: valid [{lo}, {hi}] "
            f"({scenario.severity_meaning})")
    return float(severity)
