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
    network_only: bool = False
    """Operators were inferred from the traffic alone (no descriptor was used)."""
    network_only_reason: str = ""
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
                "incidents": [i.to_dict() for i in self.incidents], "damage": self.damage,
                "network_only": self.network_only, "network_only_reason": self.network_only_reason or None}


def run_engine(reader: TraceReader, engine: JobEngine, *, chunk_ns: int = CHUNK_NS,
               stats: dict[str, int] | None = None) -> int:
    """Feed a trace to ``engine`` in publishing order, ``chunk_ns`` of trace time per call,
    then finish it; returns the number of hook events fed. A record cut short at the end of
    a file (a writer that was killed) ends that file: ``stats`` counts what was cut."""
    setup, timed = reader.timeline(tolerate_truncation=True, stats=stats)
    engine.feed(setup)
    n_events = len(setup)
    kinds = stats if stats is not None else {}
    _count_kinds(setup, kinds)
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
            _count_kinds((item,), kinds)
    engine.feed(events, batches)
    engine.finish()
    return n_events


_KIND_KEYS = {"op": "op_events", "comm": "comm_events", "flow": "flow_events"}


def _count_kinds(events: Any, stats: dict[str, int]) -> None:
    for e in events:
        key = _KIND_KEYS.get(getattr(e, "TYPE", ""))
        if key is not None:
            stats[key] = stats.get(key, 0) + 1
            if key == "flow_events" and getattr(e, "bound", False):
                stats["bound_flow_events"] = stats.get("bound_flow_events", 0) + 1


def why_nothing(stats: dict[str, int], n_events: int, network_only: bool = False) -> str:
    """Why no operator came out of a trace, from what it held: the answer an operator needs
    instead of a healthy-sounding "no anomaly"."""
    ops, comms = stats.get("op_events", 0), stats.get("comm_events", 0)
    flows, bound = stats.get("flow_events", 0), stats.get("bound_flow_events", 0)
    batches = stats.get("batches", 0)
    if batches == 0:
        return "no traffic: the trace has no epoch batch"
    if network_only:
        return (f"network-only mode (no operator descriptor used: {ops} op events) found no NIC sending: "
                "the traffic alone gives nothing to compare")
    if ops == 0:
        return (f"no operator descriptors: 0 op events ({comms} communicator, {flows} flow events) "
                "- Pulse judges operators, which it learns from the NCCL profiler plugin, NCCL logs "
                "(NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=COLL) or the torch injection; traffic alone is "
                "not judged")
    if bound == 0:
        return (f"{ops} op events but no flow is bound to a communicator rank ({flows} flow events, none "
                "bound): the traffic cannot be tied to the operators (a capture of another interface, "
                "or no comm/flow descriptors from the same source)")
    return f"{ops} op events and {bound} bound flows, but no operator's traffic was found in the samples"


def diagnose(trace_dir: str | Path, params: LocalizeParams | None = None, *, baseline: bool = False,
             segment_params: SegmentParams | None = None, chunk_ns: int = CHUNK_NS,
             network_only: bool | None = None, shards: int = 1) -> DiagnoseResult:
    """Run the job engine on a trace directory; with ``baseline`` also the operator-level
    baseline on its oplevel.jsonl. ``network_only``: True ignores the descriptors and infers
    operators from the traffic alone; None (default) does so only when the trace holds no
    op event at all (and says so in the result); False never."""
    reader = TraceReader(trace_dir)
    if baseline and not (reader.path / "oplevel.jsonl").is_file():
        raise TraceError(f"{trace_dir}: no oplevel.jsonl, which the operator-level baseline reads")
    reason = "asked for (--no-hooks)" if network_only else ""
    if network_only is None:
        network_only = not any(e.TYPE == "op" for e in reader.events(tolerate_truncation=True))
        reason = "the trace holds no operator descriptor (0 op events)" if network_only else ""
    engine = JobEngine(segment_params, params, network_only=network_only, shards=shards)
    stats: dict[str, int] = {}
    n_events = run_engine(reader, engine, chunk_ns=chunk_ns, stats=stats)
    counted = ("batches", *_KIND_KEYS.values(), "bound_flow_events")
    damage: dict[str, Any] = {k: v for k, v in stats.items() if k not in counted and v}
    nodes = {node: g for node in sorted(engine.segment.nodes) if (g := engine.segment.gaps(node))}
    nodes.update({n: g for n, g in engine.segment.damage.items() if n not in nodes and g})
    if nodes:
        damage["nodes"] = nodes
    if not reader.complete:
        damage["incomplete"] = True
        if reader.meta.get("error"):
            damage["error"] = str(reader.meta["error"])
    if not engine.metrics or not stats.get("batches"):
        # Nothing segmented is not "no anomaly": the trace says nothing about the job.
        why = "its writer did not finish" + (f" ({damage['error']})" if "error" in damage else "") \
            if "incomplete" in damage else why_nothing(stats, n_events, network_only)
        raise TraceError(f"{trace_dir}: nothing to diagnose ({stats.get('batches', 0)} epoch batches, "
                         f"{n_events} hook events; {why})")
    job = str(reader.meta.get("job") or next(iter(engine.localize.jobs), ""))
    base = None
    if baseline:
        base = baseline_localize(reader.oplevel(), params, job=job)
    return DiagnoseResult(str(trace_dir), job, engine.verdicts, base, engine.metrics, n_events, engine.incidents,
                          network_only, reason, damage)
