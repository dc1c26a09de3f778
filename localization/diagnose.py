"""Segment and localize a trace directory in one process (what ``pulse diagnose`` runs)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pulse.events import HookEvent
from pulse.records import OpMetrics, Verdict
from pulse.trace import TraceReader

from .baseline import baseline_localize
from .localizer import Localizer
from .params import LocalizeParams


@dataclasses.dataclass
class DiagnoseResult:
    trace: str
    job: str
    verdicts: list[Verdict]
    """Pulse's verdicts, in emission order."""
    baseline: list[Verdict] | None
    """The operator-level baseline's verdicts (None unless asked for)."""
    metrics: list[OpMetrics]
    n_events: int

    @property
    def anomalies(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == "anomaly"]

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "job": self.job, "operators": len(self.metrics), "events": self.n_events,
                "verdicts": [v.to_dict() for v in self.verdicts],
                "baseline": None if self.baseline is None else [v.to_dict() for v in self.baseline]}


def diagnose(trace_dir: str | Path, params: LocalizeParams | None = None, *, baseline: bool = False,
             segment_params: Any = None) -> DiagnoseResult:
    """Run segmentation (pulse.segmentation.segment_trace) and the localizer on a trace
    directory; with ``baseline`` also the operator-level baseline on its oplevel.jsonl."""
    from pulse.segmentation import SegmentParams, segment_trace

    reader = TraceReader(trace_dir)
    events: list[HookEvent] = list(reader.events())
    data_end: dict[str, int] = {}

    def batches() -> Any:
        # Note how far each node's data goes (empty batches included): an operator that
        # stopped long before its node's data ends is stalled, not cut off.
        for b in reader.batches():
            if b.end_ns() > data_end.get(b.node, -(1 << 62)):
                data_end[b.node] = b.end_ns()
            yield b

    metrics = segment_trace(batches(), events, segment_params or SegmentParams())
    job = str(reader.meta.get("job") or (events[0].job if events else ""))
    loc = Localizer(params, job=job)
    loc.add_events(events)
    for node, end in data_end.items():
        loc.observe_data_end(node, end)
    verdicts = loc.update(sorted(metrics, key=lambda m: (m.end_ns, m.comm_id, m.seq, m.rank)))
    verdicts += loc.finish()
    base = None
    if baseline:
        base = baseline_localize(reader.oplevel(), params, job=job)
    return DiagnoseResult(str(trace_dir), job, verdicts, base, metrics, len(events))
