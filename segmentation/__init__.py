"""pulse.segmentation: flow -> operator association, operator boundaries (numba kernel),
per-operator metrics; batch and streaming forms. Pure compute (no Kafka/Faust/InfluxDB)."""

from pulse.segmentation.association import Association, OpInfo, associate
from pulse.segmentation.batch import FlowSegments, segment_flows, segment_trace
from pulse.segmentation.params import SegmentationError, SegmentParams
from pulse.segmentation.streaming import NodeSegmenter, StreamStats

__all__ = [
    "Association", "FlowSegments", "NodeSegmenter", "OpInfo", "SegmentParams", "SegmentationError",
    "StreamStats", "associate", "segment_flows", "segment_trace",
]
