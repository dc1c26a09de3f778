"""Segment and localize a trace directory in one process (what ``pulse diagnose`` runs).

The trace is fed to the :class:`~.job.JobEngine` in the order a live source would have
published it (:meth:`pulse.trace.TraceReader.timeline`), in chunks, exactly as the agents
are fed from Kafka: the same segmenters, the same forwarded events and data ends, the same
aligner and localizer. The only offline choice is ``chunk_s`` (how much trace time one
engine call covers; the agents' chunks are what one Kafka fetch returns).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pulse.localization import LocalizeParams, baseline_localize
from pulse.segmentation import SegmentParams

from pulse.errors import TraceError
from pulse.events import HookEvent
from pulse.records import Incident, OpMetrics, Verdict
from pulse.samples import EpochBatch
from pulse.trace import TraceReader

from .job import JobEngine

CHUNK_NS = 50_000_000
"""Trace time per engine call: the agents take what 50 ms of fetching brings."""


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
    incidents: list[Incident] = dataclasses.field(default_factory=list)
    """Every incident state change (open, updated, resolved), in order."""
    damage: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What of the input could not be used: ``incomplete`` (the writer did not finish, with
    its ``error`` if it recorded one), ``truncated_records`` / ``truncated_bytes`` cut at the
    end of files; empty for a whole trace."""

    @property
    def anomalies(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == "anomaly"]

    def to_dict(self) -> dict[str, Any]:
        return {"trace": self.trace, "job": self.job, "operators": len(self.metrics), "events": self.n_events,
                "verdicts": [v.to_dict() for v in self.verdicts],
                "baseline": None if self.baseline is None else [v.to_dict() for v in self.baseline],
                "incidents": [i.to_dict() for i in self.incidents], "damage": self.damage}


def run_engine(reader: TraceReader, engine: JobEngine, *, chunk_ns: int = CHUNK_NS,
               stats: dict[str, int] | None = None) -> int:
    """Feed a trace to ``engine`` in publishing order, ``chunk_ns`` of trace time per call,
    then finish it; returns the number of hook events fed. A record cut short at the end of
    a file (a writer that was killed) ends that file: ``stats`` counts what was cut."""
    setup, timed = reader.timeline(tolerate_truncation=True, stats=stats)
    engine.feed(setup)
    n_events = len(setup)
    events: list[HookEvent] = []
    batches: list[EpochBatch] = []
    cut: int | None = None
    for t, item in timed:
        if cut is None:
            cut = t + chunk_ns
        elif t >= cut:
            engine.feed(events, batches)
            events, batches = [], []
            cut = t + chunk_ns
        if isinstance(item, EpochBatch):
            batches.append(item)
        else:
            events.append(item)
            n_events += 1
    engine.feed(events, batches)
    engine.finish()
    return n_events


def diagnose(trace_dir: str | Path, params: LocalizeParams | None = None, *, baseline: bool = False,
             segment_params: SegmentParams | None = None, chunk_ns: int = CHUNK_NS,
             shards: int = 1) -> DiagnoseResult:
    """Run the job engine on a trace directory; with ``baseline`` also the operator-level
    baseline on its oplevel.jsonl."""
    reader = TraceReader(trace_dir)
    if baseline and not (reader.path / "oplevel.jsonl").is_file():
        raise TraceError(f"{trace_dir}: no oplevel.jsonl, which the operator-level baseline reads")
    engine = JobEngine(segment_params, params, shards=shards)
    stats: dict[str, int] = {}
    n_events = run_engine(reader, engine, chunk_ns=chunk_ns, stats=stats)
    damage: dict[str, Any] = {k: v for k, v in stats.items() if k != "batches" and v}
    nodes = {node: g for node in sorted(engine.segment.nodes) if (g := engine.segment.gaps(node))}
    nodes.update({n: g for n, g in engine.segment.damage.items() if n not in nodes and g})
    if nodes:
        damage["nodes"] = nodes
    if not reader.complete:
        damage["incomplete"] = True
        if reader.meta.get("error"):
            damage["error"] = str(reader.meta["error"])
    if not engine.metrics:
        # Nothing segmented is not "no anomaly": the trace says nothing about the job.
        why = "its writer did not finish" + (f" ({damage['error']})" if "error" in damage else "") \
            if "incomplete" in damage else "no operator could be segmented"
        raise TraceError(f"{trace_dir}: nothing to diagnose ({stats.get('batches', 0)} epoch batches, "
                         f"{n_events} hook events; {why})")
    job = str(reader.meta.get("job") or next(iter(engine.localize.jobs), ""))
    base = None
    if baseline:
        base = baseline_localize(reader.oplevel(), params, job=job)
    return DiagnoseResult(str(trace_dir), job, engine.verdicts, base, engine.metrics, n_events, engine.incidents,
                          damage)
