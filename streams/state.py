"""Per-worker state of the two agents: Kafka messages in, Kafka records out, around the
job engine (:mod:`pulse.engine`), free of Faust so it can be driven and tested directly.

Nothing here decides anything: :class:`SegmentState` decodes samples and hook events and
hands them to a :class:`~pulse.engine.SegmentStage`, then encodes what it emits (operator
metrics, and what the job's localizer is forwarded: comm/flow events, posted receives,
data ends) as op-metrics records keyed by job, packed; :class:`LocalizeState` decodes
those and hands them to :class:`~pulse.engine.Localizers` (one aligner and localizer per
job). ``pulse diagnose`` drives the very same objects, joined in one process.

A message that does not decode becomes a :class:`DeadLetter` instead of an exception, so
one bad message never stops a partition.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import orjson
from aiokafka.partitioner import murmur2
from pulse.engine import Judged, Localizers, SegmentOutput, SegmentStage
from pulse.engine.localize_stage import FORGET_S

from pulse import events as _events
from pulse import samples as _samples
from pulse._schema import loads
from pulse.bounds import InputBounds
from pulse.errors import DecodeError, PulseError
from pulse.records import (
    DataEnd,
    Incident,
    OpMetrics,
    Verdict,
    encode_op_metrics_packed_json,
    op_metrics_from_dict,
)
from pulse.settings import Topics

DEAD_LETTER_VALUE_LIMIT = 1 << 20
# Bound of a packed op-metrics message (the segment agent packs what one chunk emits for a
# job: every Kafka message costs its consumer far more than its bytes), well under the
# producer's 1 MiB request size.
PACK_BYTES = 256 << 10


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
    incidents: list[Incident] = dataclasses.field(default_factory=list)
    """Incident state changes (open, updated, resolved) the verdicts caused."""
    dead: list[DeadLetter] = dataclasses.field(default_factory=list)

    def extend(self, other: Output) -> None:
        self.op_metrics += other.op_metrics
        self.metrics += other.metrics
        self.verdicts += other.verdicts
        self.incidents += other.incidents
        self.dead += other.dead

    @classmethod
    def judged(cls, j: Judged) -> Output:
        return cls(verdicts=j.verdicts, incidents=j.incidents)


@dataclasses.dataclass
class Message:
    topic: str
    key: bytes | None
    value: bytes | None
    partition: int | None = None
    offset: int | None = None
    timestamp: int | None = None


def partition_of(key: bytes, partitions: int) -> int:
    """The default partitioner's partition of ``key`` (murmur2, as the producers use)."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


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




def _pack(metrics: list[OpMetrics], forwards: dict[tuple[str, str], list[Any]]) -> list[tuple[bytes, bytes]]:
    """A chunk's op-metrics records, packed into messages of at most ``PACK_BYTES``:
    forwarded hook events per (job, node) first (then that node's data end), then the
    metrics per job, each in order."""
    packed: list[tuple[bytes, bytes]] = []
    for (job, _node), items in forwards.items():
        key = job.encode()
        evs = [e for e in items if not isinstance(e, DataEnd)]
        for part in _by_size(evs, [e.to_json() for e in evs]):
            packed.append((key, _events.encode_packed(part)))
        packed += [(key, e.to_json()) for e in items if isinstance(e, DataEnd)]
    per_job: dict[bytes, list[bytes]] = {}
    for m in metrics:
        per_job.setdefault(m.job.encode(), []).append(m.to_json())
    for key, values in per_job.items():
        for part in _by_size(values, values):
            packed.append((key, encode_op_metrics_packed_json(part)))
    return packed


class SegmentState:
    """The segment agent's state on one worker: decoding around a :class:`SegmentStage`."""

    def __init__(self, topics: Topics, params: Any = None, bounds: InputBounds | None = None) -> None:
        self.stage = SegmentStage(params)
        self.bounds = bounds if bounds is not None else InputBounds()
        self.params = self.stage.params
        self.topics = topics
        self.dead = 0

    @property
    def nodes(self) -> dict[str, Any]:
        return self.stage.nodes

    def handle(self, messages: Iterable[Message]) -> Output:
        """Decode a chunk and hand it to the segmentation stage."""
        out = Output()
        events: list[_events.HookEvent] = []
        batches: list[_samples.EpochBatch] = []
        for m in messages:
            where = f"{m.topic}[{m.partition}]@{m.offset}"
            try:
                if m.topic == self.topics.samples:
                    b = self.bounds.admit_batch(_samples.decode(m.value or b"", where=where,
                                                                max_bytes=self.bounds.max_bytes))
                    if b is not None:
                        batches.append(b)
                elif m.topic == self.topics.hook_events:  # single or packed
                    events += self.bounds.admit_events(_events.decode_many(m.value or b"", where=where,
                                                                           max_bytes=self.bounds.max_bytes,
                                                                           max_events=self.bounds.max_events))
                else:
                    raise DecodeError(f"message from unexpected topic {m.topic!r}")
            except PulseError as exc:
                self.dead += 1
                out.dead.append(DeadLetter(m.topic, m.partition, m.offset, m.key, m.value, str(exc), "segment"))
        now = time.monotonic()
        res = self.stage.add(events, batches, now=now)
        self.stage.forget(now, FORGET_S)  # nodes of jobs that ended long ago
        return self._encode(res, out)

    def finish(self) -> Output:
        return self._encode(self.stage.finish(), Output())

    def adopt(self, partitions: set[int], count: int, messages: list[Message]) -> None:
        """Rebuild the nodes of ``partitions`` (of ``count``) from ``messages`` (their
        replay up to the committed offsets) in a fresh stage, outputs dropped, and take
        them over in place of what this state held for them (see takeover.py)."""
        fresh = SegmentState(self.topics, self.params, self.bounds)
        for i in range(0, len(messages), 1024):
            fresh.handle(messages[i:i + 1024])
        stale = [n for n in self.stage.nodes if partition_of(n.encode(), count) in partitions]
        self.stage.adopt(fresh.stage, stale)


    def _encode(self, res: SegmentOutput, out: Output) -> Output:
        for batch, exc in res.refused:
            self.dead += 1
            out.dead.append(DeadLetter(self.topics.samples, None, None, batch.node.encode(), None, str(exc),
                                       "segment"))
        out.metrics += res.metrics
        out.op_metrics = _pack(res.metrics, res.forwards)
        return out

    @property
    def stats(self) -> dict[str, Any]:
        return {**self.stage.stats, "dead_letters": self.dead, **self.bounds.stats}


class LocalizeState:
    """The localize agent's state on one worker: decoding around :class:`Localizers`."""

    def __init__(self, params: Any = None, *, hold_ns: int = 1_000_000_000, idle_s: float = 0.5,
                 budget_s: float | None = None) -> None:
        self.stages = Localizers(params, hold_ns=hold_ns, idle_s=idle_s, budget_s=budget_s)
        self.params = self.stages.params
        self.metrics = 0
        self.dead = 0

    @property
    def verdicts(self) -> int:
        return self.stages.verdicts

    def handle(self, messages: Iterable[Message], now: float | None = None) -> Output:
        """Take op-metrics records (and forwarded events and data ends); returns verdicts of
        the operators that could be released."""
        now = time.monotonic() if now is None else now
        out = Output()
        for m in messages:
            where = f"{m.topic}[{m.partition}]@{m.offset}"
            try:
                data = loads(m.value or b"", where)
                if not isinstance(data, dict):
                    raise DecodeError(f"{where}: expected a JSON object")
                kind = data.get("type")
                if kind in ("op-metrics", "op-metrics-batch"):  # single or packed
                    recs = op_metrics_from_dict(data, where)
                    self.stages.add_metrics(recs, now)
                    self.metrics += len(recs)
                elif kind == DataEnd.TYPE:
                    end = DataEnd.from_dict(data, where)
                    self.stages.add_forwarded(end.job, [end], now)
                else:  # forwarded comm/flow events, single or packed
                    evs = _events.events_from_dict(data, where)
                    self.stages.add_forwarded(evs[0].job, evs, now)
            except (PulseError, orjson.JSONDecodeError) as exc:
                self.dead += 1
                out.dead.append(DeadLetter(m.topic, m.partition, m.offset, m.key, m.value, str(exc), "localize"))
        out.extend(self.tick(now))
        return out

    def adopt(self, partitions: set[int], count: int, messages: list[Message],
              incidents: Iterable[Incident] = ()) -> None:
        """Rebuild the jobs of op-metrics ``partitions`` (of ``count``) from ``messages``
        (their replay up to the committed offsets) in fresh stages, judged to the end of
        the replay with the outputs dropped, and take them over in place of what this
        state held for them (see takeover.py). ``incidents``: the latest state of every
        incident on the incidents topic; those of these jobs go on here with their ids
        (:meth:`~pulse.localization.lifecycle.IncidentTracker.resume`). Other jobs are not
        touched."""
        st = self.stages
        fresh = LocalizeState(self.params, hold_ns=st.hold_ns, idle_s=st.idle_s, budget_s=None)
        for i in range(0, len(messages), 1024):
            fresh.handle(messages[i:i + 1024])
        fresh.settle()
        now = time.monotonic()
        stale = [j for j in st.jobs if partition_of(j.encode(), count) in partitions]
        # what this worker announced for a partition it had, lost and got back (a broker
        # whose restart lost the topics and offsets rebuilds from nothing) it knows itself
        mine = [inc for j in stale for inc in st.jobs[j].tracker.known()]
        for inc in [*incidents, *mine]:
            if partition_of(inc.job.encode(), count) not in partitions:
                continue
            if inc.state == "resolved" and inc.job not in fresh.stages.jobs:
                continue  # nothing of that job left to judge
            stage = fresh.stages.stage(inc.job)
            if stage.last_record is None:  # no input left: it ends after the job's idle time
                stage.last_record = now
            stage.tracker.resume(inc)
        st.adopt(fresh.stages, stale)

    def tick(self, now: float | None = None, *, budget_s: float | None = -1.0) -> Output:
        """Release what the aligners held long enough and judge it (call it periodically;
        with a budget, call it again while ``backlog``)."""
        return Output.judged(self.stages.tick(now, budget_s=budget_s))

    def settle(self) -> Output:
        """Judge the whole backlog now, releasing nothing new (after a state rebuild, whose
        outputs are dropped: they were sent before the commit it replays up to)."""
        return Output.judged(self.stages.settle())

    def finish(self) -> Output:
        return Output.judged(self.stages.finish())

    @property
    def backlog(self) -> int:
        return self.stages.backlog

    @property
    def held(self) -> int:
        return self.stages.held

    @property
    def late_records(self) -> int:
        return self.stages.late_records

    @property
    def active(self) -> bool:
        return self.stages.active
