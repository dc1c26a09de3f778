"""Per-worker state of the two agents, free of Faust so it can be driven and tested directly.

:class:`SegmentState` holds one :class:`~pulse.segmentation.NodeSegmenter` per node whose
partitions this worker owns. Messages of ``samples`` and ``hook-events`` arrive through
one agent (Faust has no stream-stream join): batches go to ``update``, hook events to
``add_events``. Comm events reach every node's segmenter (ring orders are per
communicator, not per node). What a segmenter emits becomes ``op-metrics`` records keyed
by job; comm and flow events (and each rank's latest posted receive) are forwarded on the
same topic so the localizer of the job (possibly on another worker) learns membership, NICs
and who waits for whom. Both directions use the packed
forms (``pulse.events`` / ``pulse.records``): a hook-events message may hold a node's events,
and what one chunk emits for a job goes out as one op-metrics message.

:class:`LocalizeState` holds one :class:`~pulse.localization.Localizer` per job.

A message that does not decode becomes a :class:`DeadLetter` instead of an exception, so
one bad message never stops a partition.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import orjson

from pulse import events as _events
from pulse import samples as _samples
from pulse._schema import loads
from pulse.bounds import InputBounds
from pulse.errors import DecodeError, PulseError
from pulse.records import OpMetrics, Verdict, encode_op_metrics_packed_json, op_metrics_from_dict
from pulse.settings import Topics

DEAD_LETTER_VALUE_LIMIT = 1 << 20
# Bound of a packed op-metrics message (the segment agent packs what one chunk emits for a
# job: every Kafka message costs its consumer far more than its bytes), well under the
# producer's 1 MiB request size.
PACK_BYTES = 256 << 10
# Records per localizer call when a time budget applies (about 30 ms at 64 GPUs).
JUDGE_STEP = 64


def _segmentation() -> tuple[Any, Any]:
    try:
        from pulse.segmentation import NodeSegmenter, SegmentParams
    except ImportError:  # older layout: the classes only in their modules
        from pulse.segmentation.params import SegmentParams
        from pulse.segmentation.streaming import NodeSegmenter
    return NodeSegmenter, SegmentParams


def _localization() -> tuple[Any, Any]:
    try:
        from pulse.localization import LocalizeParams, Localizer
    except ImportError:
        from pulse.localization.localizer import Localizer
        from pulse.localization.params import LocalizeParams
    return Localizer, LocalizeParams


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A message that failed: where it came from, why, and its bytes (base64, capped)."""

    topic: str
    partition: int | None
    offset: int | None
    key: bytes | None
    value: bytes | None
    error: str
    stage: str

    def to_json(self) -> bytes:
        v = self.value or b""
        return orjson.dumps({
            "type": "dead-letter", "v": 1, "topic": self.topic, "partition": self.partition,
            "offset": self.offset, "stage": self.stage, "error": self.error,
            "key": None if self.key is None else self.key.decode(errors="replace"),
            "value_b64": base64.b64encode(v[:DEAD_LETTER_VALUE_LIMIT]).decode(),
            "value_bytes": len(v), "at_ns": time.time_ns(),
        })


@dataclasses.dataclass
class Output:
    """What handling some messages produced, for the agent to send."""

    op_metrics: list[tuple[bytes, bytes]] = dataclasses.field(default_factory=list)
    """(key = job, value) records for the op-metrics topic (metrics and forwarded events)."""
    metrics: list[OpMetrics] = dataclasses.field(default_factory=list)
    verdicts: list[Verdict] = dataclasses.field(default_factory=list)
    dead: list[DeadLetter] = dataclasses.field(default_factory=list)

    def extend(self, other: Output) -> None:
        self.op_metrics += other.op_metrics
        self.metrics += other.metrics
        self.verdicts += other.verdicts
        self.dead += other.dead


@dataclasses.dataclass
class Message:
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    offset: int | None = None
    timestamp: int | None = None


def _by_size(items: list[Any], sizes_of: list[bytes]) -> list[list[Any]]:
    """``items`` cut, in order, into runs whose encoded sizes add up to at most PACK_BYTES."""
    parts: list[list[Any]] = []
    cur: list[Any] = []
    size = 0
    for item, raw in zip(items, sizes_of, strict=True):
        if cur and size + len(raw) > PACK_BYTES:
            parts.append(cur)
            cur, size = [], 0
        cur.append(item)
        size += len(raw) + 1
    if cur:
        parts.append(cur)
    return parts


class SegmentState:
    """The segment agent's state on one worker: per-node segmenters."""

    def __init__(self, topics: Topics, params: Any = None, bounds: InputBounds | None = None) -> None:
        node_segmenter, segment_params = _segmentation()
        self.bounds = bounds if bounds is not None else InputBounds()
        self._make = node_segmenter
        self.params = params if params is not None else segment_params()
        self.topics = topics
        self.nodes: dict[str, Any] = {}
        self._deferred = "run" in getattr(node_segmenter, "__dict__", {})
        self._comms: dict[tuple[str, str, int], _events.CommEvent] = {}
        self._jobs: dict[str, str] = {}
        self.batches = 0
        self.rows = 0
        self.events = 0
        self.emitted = 0
        self.dead = 0

    def segmenter(self, node: str) -> Any:
        seg = self.nodes.get(node)
        if seg is None:
            seg = self.nodes[node] = self._make(node, self.params)
            if self._comms:
                seg.add_events(list(self._comms.values()))
        return seg

    def handle(self, messages: Iterable[Message]) -> Output:
        """Decode a chunk; hook events first (grouped per node: one re-association per node
        and chunk instead of one per event; descriptors precede their traffic anyway), then
        the batches in arrival order."""
        out = Output()
        hooks: dict[str, list[_events.HookEvent]] = {}
        batches: list[_samples.EpochBatch] = []
        # Comm/flow events forwarded to the job's localizer, per (job, node): packed, ahead
        # of the chunk's metrics.
        fwd: dict[tuple[str, str], list[_events.HookEvent]] = {}
        for m in messages:
            where = f"{m.topic}[{m.partition}]@{m.offset}"
            try:
                if m.topic == self.topics.samples:
                    b = self.bounds.admit_batch(_samples.decode(m.value or b"", where=where,
                                                                max_bytes=self.bounds.max_bytes))
                    if b is not None:
                        batches.append(b)
                elif m.topic == self.topics.hook_events:
                    evs = self.bounds.admit_events(_events.decode_many(m.value or b"", where=where,
                                                                       max_bytes=self.bounds.max_bytes,
                                                                       max_events=self.bounds.max_events))
                    if evs:
                        hooks.setdefault(evs[0].node, []).extend(evs)
                else:
                    raise DecodeError(f"message from unexpected topic {m.topic!r}")
            except PulseError as exc:
                self.dead += 1
                out.dead.append(DeadLetter(m.topic, m.partition, m.offset, m.key, m.value, str(exc), "segment"))
        # Comm events reach every node's segmenter: all of the chunk's at once, one
        # add_events per segmenter (one per event and segmenter cost ~0.5 s of CPU at the
        # start of a 64-GPU job, while its first batches waited).
        comms = [e for evs in hooks.values() for e in evs if isinstance(e, _events.CommEvent)]
        if comms:
            self._add_comms(comms, fwd, out)
        for node, evs in hooks.items():
            self.events += len(evs)
            rest = [e for e in evs if not isinstance(e, _events.CommEvent)]
            # The localizer also needs each rank's latest posted receive (who waits for a
            # send, and which receives a hung rank never posted); it keeps only the latest
            # per communicator, so only that one is forwarded, not every Send/Recv.
            recvs: dict[str, _events.OpEvent] = {}
            for e in rest:
                self._job_of(e.node, e.job)
                if isinstance(e, _events.FlowEvent):
                    fwd.setdefault((e.job, e.node), []).append(e)
                elif isinstance(e, _events.OpEvent) and e.kind == "Recv":
                    cur = recvs.get(e.comm_id)
                    if cur is None or e.seq >= cur.seq:
                        recvs[e.comm_id] = e
            for e in recvs.values():
                fwd.setdefault((e.job, e.node), []).append(e)
            if rest:
                self._emit(self.segmenter(node).add_events(rest), out)
        # Every batch of the chunk is taken in first, then each node's segmenter runs once:
        # the same metrics as running after each batch, for one kernel pass per node.
        touched: dict[str, Any] = {}
        for batch in batches:
            self.batches += 1
            self.rows += batch.n_rows
            self._job_of(batch.node, batch.job)
            try:
                seg = self.segmenter(batch.node)
                if self._deferred:
                    seg.update(batch, run=False)
                    touched[batch.node] = seg
                else:
                    self._emit(seg.update(batch), out)
            except PulseError as exc:
                self.dead += 1
                out.dead.append(DeadLetter(self.topics.samples, None, None, batch.node.encode(), None,
                                           str(exc), "segment"))
        for seg in touched.values():
            self._emit(seg.run(), out)
        self._pack(out, fwd)
        return out

    @staticmethod
    def _pack(out: Output, fwd: dict[tuple[str, str], list[_events.HookEvent]]) -> None:
        """Turn the chunk's records into packed op-metrics messages of at most
        ``PACK_BYTES``: forwarded events per (job, node) first, then the metrics per job,
        each in order."""
        packed: list[tuple[bytes, bytes]] = []
        for (job, _node), evs in fwd.items():
            for part in _by_size(evs, [e.to_json() for e in evs]):
                packed.append((job.encode(), _events.encode_packed(part)))
        per_job: dict[bytes, list[bytes]] = {}
        for key, value in out.op_metrics:
            per_job.setdefault(key, []).append(value)
        for key, values in per_job.items():
            for part in _by_size(values, values):
                packed.append((key, encode_op_metrics_packed_json(part)))
        out.op_metrics = packed

    def finish(self) -> Output:
        out = Output()
        for seg in self.nodes.values():
            self._emit(seg.finish(), out)
        self._pack(out, {})
        return out

    def _job_of(self, node: str, job: str) -> None:
        if job:
            self._jobs[node] = job

    def _add_comms(self, comms: list[_events.CommEvent], fwd: dict[tuple[str, str], list[_events.HookEvent]],
                   out: Output) -> None:
        for c in comms:
            self._job_of(c.node, c.job)
            self._comms[(c.comm_id, c.node, c.rank)] = c
            fwd.setdefault((c.job, c.node), []).append(c)
        for seg in list(self.nodes.values()):
            self._emit(seg.add_events(comms), out)
        for c in comms:  # a new node's segmenter starts with every comm known
            if c.node not in self.nodes:
                self.segmenter(c.node)

    def _emit(self, metrics: list[OpMetrics], out: Output) -> None:
        for m in metrics:
            out.op_metrics.append((m.job.encode(), m.to_json()))
            out.metrics.append(m)
        self.emitted += len(metrics)

    @property
    def stats(self) -> dict[str, Any]:
        per_node = {}
        for node, seg in self.nodes.items():
            st = getattr(seg, "stats", None)
            per_node[node] = st.as_dict() if st is not None and hasattr(st, "as_dict") else {}
        lost = sum(int(s.get("lost_batches", 0) or 0) for s in per_node.values())
        late = sum(int(s.get("late_batches", 0) or 0) for s in per_node.values())
        return {"batches": self.batches, "rows": self.rows, "events": self.events, "op_metrics": self.emitted,
                "dead_letters": self.dead, "lost_batches": lost, "late_batches": late, "nodes": len(self.nodes),
                **self.bounds.stats}


class _Aligner:
    """Re-aligns one job's operator metrics in time before localization.

    Ranks of one operator come from different nodes, hence different partitions, which a
    worker consumes at different paces (a backlog on one partition, a slow fetch). The
    localizer's judgement depends on the order it sees operators in (it closes an operator
    once later ones show up and keeps per-process history), so it must see them as a live
    job produces them: in time order. An operator's records wait here until it has all its
    ``nranks`` ranks and every node still reporting has gone past the operator's end (a
    per-node watermark in trace time). Bounds, both in trace time so a processing backlog
    changes nothing: a node more than ``hold_ns`` behind the most advanced one no longer
    holds the watermark (it may have stopped), and an operator that ended ``hold_ns``
    before the most advanced node's latest operator goes out as it is. When no record
    arrived for ``idle_s`` of wall time (the job paused or ended), everything goes out.
    Released operators go out in end-time order, in seq order per communicator.
    """

    def __init__(self, hold_ns: int, idle_s: float) -> None:
        self.hold_ns = hold_ns
        self.idle_s = idle_s
        self.pending: dict[str, dict[int, dict[int, OpMetrics]]] = {}
        self.known: dict[str, set[int]] = {}
        self.calibrated: set[str] = set()
        self.node_end: dict[str, int] = {}
        self.last_add = 0.0

    def add(self, m: OpMetrics, now: float) -> None:
        self.pending.setdefault(m.comm_id, {}).setdefault(m.seq, {})[m.rank] = m
        self.known.setdefault(m.comm_id, set()).add(m.rank)
        self.node_end[m.node] = max(self.node_end.get(m.node, m.end_ns), m.end_ns)
        self.last_add = now

    def _complete(self, comm: str, recs: dict[int, OpMetrics]) -> bool:
        # Not "the ranks seen so far" at first: under skew those are one node's, and an
        # operator released without its late ranks would have them dropped as too late.
        # But only ranks that send data report an operator: a Send has one record (its
        # Recv none), Broadcast/Reduce one fewer than the ranks (the ring's last rank,
        # the root). Once a communicator's ranks have reported (an operator of it was
        # released), a rank that never reports for it (its ring hop inside a node) is
        # not waited for either. Without this, such operators waited for the hold bound
        # and, released in seq order, held back every later one of their communicator.
        rec = next(iter(recs.values()))
        need = rec.nranks
        if rec.kind == "Send":
            need = 1
        elif rec.kind in ("Broadcast", "Reduce"):
            need = max(1, need - 1)
        if comm in self.calibrated:
            need = min(need, len(self.known.get(comm, ())))
        return len(recs) >= need

    def ready(self, now: float) -> list[OpMetrics]:
        if not self.node_end:
            return []
        idle = now - self.last_add >= self.idle_s
        top = max(self.node_end.values())
        wm = min(end for end in self.node_end.values() if end >= top - self.hold_ns)
        chosen: list[tuple[int, str, int]] = []
        for comm, ops in self.pending.items():
            for seq in sorted(ops):
                recs = ops[seq]
                end = max(r.end_ns for r in recs.values())
                if not (idle or top - end >= self.hold_ns or (end <= wm and self._complete(comm, recs))):
                    break
                chosen.append((end, comm, seq))
        out: list[OpMetrics] = []
        for _, comm, seq in sorted(chosen):
            recs = self.pending[comm].pop(seq)
            self.calibrated.add(comm)
            out += [recs[r] for r in sorted(recs)]
        return out

    @property
    def held(self) -> int:
        return sum(len(r) for ops in self.pending.values() for r in ops.values())


def _take_ops(queue: collections.deque[OpMetrics], n: int | None) -> list[OpMetrics]:
    """The first ``n`` or more records of ``queue`` up to an operator's end (all when
    ``n`` is None): an operator's ranks are judged in one call, as the aligner released them."""
    if n is None or len(queue) <= n:
        out = list(queue)
        queue.clear()
        return out
    out = [queue.popleft() for _ in range(n)]
    last = (out[-1].comm_id, out[-1].seq)
    while queue and (queue[0].comm_id, queue[0].seq) == last:
        out.append(queue.popleft())
    return out


class LocalizeState:
    """The localize agent's state on one worker: one aligner and one localizer per job."""

    def __init__(self, params: Any = None, *, hold_ns: int = 1_000_000_000, idle_s: float = 0.5,
                 budget_s: float | None = None) -> None:
        localizer, localize_params = _localization()
        self._make = localizer
        self.params = params if params is not None else localize_params()
        self.hold_ns = hold_ns
        self.idle_s = idle_s
        # With a budget, a call judges released operators for about that long and keeps the
        # rest (in order) for the next call: a localizer behind a backlog hands out its
        # verdicts as it goes rather than all at the end of one long call.
        self.budget_s = budget_s
        self.jobs: dict[str, Any] = {}
        self.aligners: dict[str, _Aligner] = {}
        self._backlog: dict[str, collections.deque[OpMetrics]] = {}
        self.metrics = 0
        self.verdicts = 0
        self.dead = 0

    def localizer(self, job: str) -> Any:
        loc = self.jobs.get(job)
        if loc is None:
            loc = self.jobs[job] = self._make(self.params, job=job or None)
            self.aligners[job] = _Aligner(self.hold_ns, self.idle_s)
        return loc

    def aligner(self, job: str) -> _Aligner:
        self.localizer(job)
        return self.aligners[job]

    def handle(self, messages: Iterable[Message], now: float | None = None) -> Output:
        """Take op-metrics records (and forwarded comm/flow events); returns verdicts of the
        operators that could be released."""
        now = time.monotonic() if now is None else now
        out = Output()
        for m in messages:
            where = f"{m.topic}[{m.partition}]@{m.offset}"
            try:
                data = loads(m.value or b"", where)
                if not isinstance(data, dict):
                    raise DecodeError(f"{where}: expected a JSON object")
                if data.get("type") in ("op-metrics", "op-metrics-batch"):  # single or packed
                    recs = op_metrics_from_dict(data, where)
                    al = self.aligner(recs[0].job)
                    for rec in recs:
                        al.add(rec, now)
                    self.metrics += len(recs)
                else:  # forwarded comm/flow events, single or packed
                    evs = _events.events_from_dict(data, where)
                    self.localizer(evs[0].job).add_events(evs)
            except (PulseError, orjson.JSONDecodeError) as exc:
                self.dead += 1
                out.dead.append(DeadLetter(m.topic, m.partition, m.offset, m.key, m.value, str(exc), "localize"))
        out.extend(self.tick(now))
        return out

    def tick(self, now: float | None = None, *, budget_s: float | None = -1.0) -> Output:
        """Release what the aligners hold long enough and judge it (call it periodically;
        with a budget, call it again while ``backlog``)."""
        now = time.monotonic() if now is None else now
        budget = self.budget_s if budget_s == -1.0 else budget_s
        out = Output()
        for job, al in self.aligners.items():
            recs = al.ready(now)
            if recs:
                self._backlog.setdefault(job, collections.deque()).extend(recs)
        deadline = None if budget is None else time.monotonic() + budget
        for job, queue in self._backlog.items():
            while queue:
                vs = self.jobs[job].update(_take_ops(queue, None if deadline is None else JUDGE_STEP))
                out.verdicts += vs
                self.verdicts += len(vs)
                if deadline is not None and time.monotonic() >= deadline:
                    return out
        return out

    def settle(self) -> Output:
        """Judge the whole backlog now, releasing nothing new (after a state rebuild, whose
        outputs are dropped: they were sent before the commit it replays up to)."""
        out = Output()
        for job, queue in self._backlog.items():
            if queue:
                vs = self.jobs[job].update(_take_ops(queue, None))
                out.verdicts += vs
                self.verdicts += len(vs)
        return out

    @property
    def backlog(self) -> int:
        """Records released by the aligners and not judged yet (a budget ran out)."""
        return sum(len(q) for q in self._backlog.values())

    def finish(self) -> Output:
        out = self.tick(float("inf"), budget_s=None)
        for loc in self.jobs.values():
            vs = loc.finish()
            out.verdicts += vs
            self.verdicts += len(vs)
        return out

    @property
    def held(self) -> int:
        return sum(a.held for a in self.aligners.values()) + self.backlog

    @property
    def active(self) -> bool:
        """Whether a job is known (then ``tick`` may release held operators)."""
        return bool(self.aligners)
