"""Pulse: localize the node that slows down a training job, from per-flow µs traffic.

The public surface of the top-level package is the wire contracts; subpackages hold the
sources (``pulse.nic``, ``pulse.hooks``, ``pulse.sim``), the compute
(``pulse.segmentation``, ``pulse.localization``) and the pipeline (``pulse.producers``,
``pulse.streams``).
"""

from pulse.errors import (
    ConfigError,
    DecodeError,
    EncodeError,
    PulseError,
    ServiceError,
    TraceError,
)
from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.records import OpLevel, OpMetrics, Verdict
from pulse.samples import EpochBatch, make_batch
from pulse.settings import Settings

__version__ = "0.1.0"

__all__ = [
    "CommEvent", "ConfigError", "DecodeError", "EncodeError", "EpochBatch", "FlowEvent",
    "OpEvent", "OpLevel", "OpMetrics", "PulseError", "ServiceError", "Settings", "TraceError",
    "Verdict", "make_batch",
]
