"""pulse.localization: cross-rank comparison of operator metrics, verdicts, the
operator-level baseline, and scoring against ground truth. Pure compute (no Kafka,
Faust or InfluxDB)."""

from .baseline import baseline_localize
from .localizer import Localizer, localize
from .params import LocalizeParams
from .scoring import ScenarioScore, Summary, score, summarize

__all__ = ["LocalizeParams", "Localizer", "ScenarioScore", "Summary", "baseline_localize",
           "localize", "score", "summarize"]
