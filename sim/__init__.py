"""pulse.sim: the synthetic training cluster and the anomaly scenario battery.

``simulate(SimConfig(scenario=..., seed=...), out_dir)`` writes a trace directory (epoch
batches per NIC, hook events, oplevel records, truth.json); see docs/sim.md.
"""

from pulse.sim.config import SimConfig
from pulse.sim.run import SimSummary, simulate
from pulse.sim.scenarios import SCENARIOS, Scenario

__all__ = ["SCENARIOS", "Scenario", "SimConfig", "SimSummary", "simulate"]
