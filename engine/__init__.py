"""pulse.engine: the one job engine. Segmentation -> alignment -> localization, driven in
arrival order by ``pulse diagnose``, ``pulse eval``, the lab analysis and the Faust agents
alike (the agents only decode, route by key, call it and encode). Pure compute (no Kafka,
Faust or InfluxDB)."""

from .aligner import Aligner
from .diagnose import DiagnoseResult, diagnose, run_engine
from .job import JobEngine, Localizers
from .localize_stage import Judged, LocalizeStage
from .segment_stage import SegmentOutput, SegmentStage

__all__ = ["Aligner", "DiagnoseResult", "JobEngine", "Judged", "LocalizeStage", "Localizers", "SegmentOutput", "SegmentStage",
           "diagnose", "run_engine"]
