"""The segmentation half of the engine: hook events and epoch batches of many nodes in,
operator metrics out, plus what the job's localizer needs to know besides them.

One :class:`~pulse.segmentation.NodeSegmenter` per node. A chunk's hook events are taken
first, grouped per node (one re-association per node and chunk instead of one per event;
descriptors precede their traffic anyway), then its batches in arrival order, then each
touched node's segmenter runs once (the same metrics as running after each batch, for one
kernel pass per node).

Besides the metrics, a chunk yields what the localizer of each job is *forwarded*, keyed
by (job, node) and in this order:

* comm and flow events (membership, NICs, who sends to whom);
* each rank's latest posted receive per communicator (who waits for a send, and which
  receives a hung rank never posted; the localizer keeps only the latest, so only that one
  is forwarded, not every Send/Recv: they are most of a job's hook events);
* how far each node's data reaches (:class:`~pulse.records.DataEnd`), so that a stalled
  operator is told from one cut off by the end of the input in the stream as offline.

What cannot be true is not used, and is counted per node (:attr:`SegmentStage.damage`,
forwarded with each data end as ``gaps`` so that verdicts can say what their evidence
lacks): a batch whose epochs start before 0 or far (``MAX_SKEW_NS``) from the data of
the job's other nodes, bytes beyond what the fastest link carries in one epoch (clamped),
an op event bigger than any GPU's memory. Batch_seq gaps and batches given up as late are
the segmenters' own counts; a duplicate batch is dropped by its NIC's order and changes
nothing.

Where the two halves run in one process (``pulse diagnose``) the forwarded items go to the
localize stage directly; in the pipeline they travel on the op-metrics topic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np
from pulse.segmentation import NodeSegmenter, SegmentParams

from pulse.errors import PulseError
from pulse.events import CommEvent, FlowEvent, HookEvent, OpEvent
from pulse.records import DataEnd, OpMetrics
from pulse.samples import EpochBatch

Forward = HookEvent | DataEnd

MAX_SKEW_NS = 3600 * 1_000_000_000
"""A batch starting further than this from the job's other nodes' data is not of this job
(node clocks are PTP-synchronised to well under a millisecond)."""
MAX_LINK_BYTES_PER_NS = 400
"""3.2 Tb/s, beyond any NIC port: more bytes than this in an epoch were never sent."""
MAX_OP_BYTES = 1 << 40
"""An operator's buffer larger than 1 TiB is beyond any GPU's memory."""
GAP_KEYS = ("lost_batches", "late_batches")


@dataclasses.dataclass
class SegmentOutput:
    """What one chunk produced."""

    metrics: list[OpMetrics] = dataclasses.field(default_factory=list)
    forwards: dict[tuple[str, str], list[Forward]] = dataclasses.field(default_factory=dict)
    """(job, node) -> events and data ends for the job's localizer, in order."""
    refused: list[tuple[EpochBatch, PulseError]] = dataclasses.field(default_factory=list)
    """Batches a segmenter refused (wrong epoch grid, ...), with why."""

    def forward(self, job: str, node: str, item: Forward) -> None:
        self.forwards.setdefault((job, node), []).append(item)

    def extend(self, other: SegmentOutput) -> None:
        self.metrics += other.metrics
        for k, v in other.forwards.items():
            self.forwards.setdefault(k, []).extend(v)
        self.refused += other.refused


class SegmentStage:
    """Per-node segmenters of the nodes one worker (or one diagnose run) sees."""

    def __init__(self, params: SegmentParams | None = None) -> None:
        self.params = params if params is not None else SegmentParams()
        self.nodes: dict[str, NodeSegmenter] = {}
        self._comms: dict[tuple[str, str, int], CommEvent] = {}
        self._jobs: dict[str, str] = {}
        self._data_end: dict[str, int] = {}
        self._nic_end: dict[str, dict[str, int]] = {}
        self._nic_tx: dict[str, dict[str, int]] = {}
        """node -> NIC -> end of the last epoch it transmitted in, not yet forwarded."""
        self._seen: dict[str, float] = {}
        """node -> wall time of its latest input (live runs only)."""
        self.forgotten = 0
        self.damage: dict[str, dict[str, int]] = {}
        """node -> counts of input not used (see the module's docstring)."""
        self._told_gaps: dict[str, dict[str, int]] = {}
        self._skew_ref: dict[str, tuple[list[int], dict[str, int]]] = {}
        self.batches = 0
        self.rows = 0
        self.events = 0
        self.emitted = 0

    def segmenter(self, node: str) -> NodeSegmenter:
        seg = self.nodes.get(node)
        if seg is None:
            seg = self.nodes[node] = NodeSegmenter(node, self.params)
            own = [e for e in self._comms.values() if e.node == node]
            if own:
                seg.add_events(own)
        return seg

    def adopt(self, other: SegmentStage, drop: Iterable[str] = ()) -> None:
        """Take over the nodes ``other`` rebuilt (a worker given their partitions in a
        rebalance replays them into a fresh stage), replacing what this stage held for the
        nodes in ``drop`` (partitions it had before, lost and got back: stale)."""
        for node in set(drop) | set(other.nodes):
            self.nodes.pop(node, None)
            self._data_end.pop(node, None)
            self._nic_end.pop(node, None)
            self._nic_tx.pop(node, None)
            self._told_gaps.pop(node, None)
            self.damage.pop(node, None)
        self.nodes.update(other.nodes)
        self._comms.update(other._comms)
        self._jobs.update(other._jobs)
        self._data_end.update(other._data_end)
        self._nic_end.update(other._nic_end)
        self._nic_tx.update(other._nic_tx)
        self._told_gaps.update(other._told_gaps)
        self.damage.update(other.damage)

    def forget(self, now: float, idle_s: float) -> list[str]:
        """Drop the nodes without input for ``idle_s`` (a job's nodes after it ended: what
        a worker holds stays bounded by the nodes live now). A node back later starts a
        fresh segmenter, as a node joining mid-run does."""
        gone = [n for n, t in self._seen.items() if now - t >= idle_s]
        for node in gone:
            for table in (self.nodes, self._data_end, self._nic_end, self._nic_tx, self._told_gaps, self.damage,
                          self._jobs, self._seen):
                table.pop(node, None)  # type: ignore[attr-defined]
        self.forgotten += len(gone)
        return gone

    def job_of(self, node: str) -> str:
        return self._jobs.get(node, "")

    def add(self, events: Iterable[HookEvent] = (), batches: Iterable[EpochBatch] = (),
            now: float = 0.0) -> SegmentOutput:
        """Take one chunk: its hook events, then its batches. ``now``: the wall clock of a
        live run (0 offline), to forget nodes that stopped sending (:meth:`forget`)."""
        out = SegmentOutput()
        hooks: dict[str, list[HookEvent]] = {}
        for e in events:
            hooks.setdefault(e.node, []).append(e)
            if now:
                self._seen[e.node] = now
        touched: dict[str, NodeSegmenter] = {}
        if hooks:
            # Taken in without a kernel pass: each touched node runs once below, after its
            # batches too (one pass per node and chunk instead of two; same metrics).
            touched.update(self._add_events(hooks, out))
        self._skew_ref = self._skew_refs()
        ends: dict[str, int] = {}
        for batch in batches:
            self.batches += 1
            self.rows += batch.n_rows
            self._note_job(batch.node, batch.job)
            end = batch.end_ns()
            if self._wild_time(batch, end):
                self._count(batch.node, "wild_time_batches")
                continue
            if now:
                self._seen[batch.node] = now
            batch = self._clamp(batch)
            try:
                seg = self.segmenter(batch.node)
                seg.update(batch, run=False)
            except PulseError as exc:
                out.refused.append((batch, exc))
                continue
            touched[batch.node] = seg
            if end > ends.get(batch.node, -(1 << 62)):
                ends[batch.node] = end
            nic_end = self._nic_end.setdefault(batch.node, {})
            if end > nic_end.get(batch.nic, -(1 << 62)):
                nic_end[batch.nic] = end
            tx_end = batch.tx_end_ns()
            if tx_end is not None:
                nic_tx = self._nic_tx.setdefault(batch.node, {})
                if tx_end > nic_tx.get(batch.nic, -(1 << 62)):
                    nic_tx[batch.nic] = tx_end
        self._forward_ends(ends, out)
        for seg in touched.values():
            self._emit(seg.run(), out)
        return out

    def _forward_ends(self, ends: dict[str, int], out: SegmentOutput) -> None:
        """A data end for each node whose data went further or whose gaps changed."""
        for node in sorted(set(ends) | {n for n in self.nodes if n in self.damage or self.gaps(n)}):
            end = max(ends.get(node, -(1 << 62)), self._data_end.get(node, -(1 << 62)))
            gaps = self.gaps(node)
            if end > self._data_end.get(node, -(1 << 62)) or gaps != self._told_gaps.get(node, {}):
                if end <= -(1 << 62):
                    continue
                self._data_end[node] = end
                self._told_gaps[node] = gaps
                nics = self._nic_end.get(node)
                # every NIC's end only when one lags: the usual message stays as small as v2's
                lagging = nics is not None and len(nics) > 1 and min(nics.values()) < end
                tx = self._nic_tx.pop(node, None)  # only what changed since the last one
                out.forward(self.job_of(node), node,
                            DataEnd(job=self.job_of(node), node=node, end_ns=end, gaps=gaps or None,
                                    nic_ends=dict(nics) if lagging and nics else None, nic_tx=tx or None))

    def finish(self) -> SegmentOutput:
        """The end of the input: every segmenter closes what it still holds."""
        out = SegmentOutput()
        metrics: list[OpMetrics] = []
        for seg in self.nodes.values():
            metrics += seg.finish()
        self._forward_ends({}, out)  # batches given up at the end are gaps too
        self._emit(metrics, out)
        return out

    def _add_events(self, hooks: dict[str, list[HookEvent]], out: SegmentOutput) -> dict[str, NodeSegmenter]:
        """Take a chunk's hook events in; returns the segmenters that must run."""
        touched: dict[str, NodeSegmenter] = {}
        # A node's comm events reach its own segmenter only: a rank's flows and ops are on
        # its node, and the association looks a rank's comm event up by (comm, rank). All
        # of the chunk's at once, one add_events per segmenter (one per event cost ~0.5 s
        # of CPU at the start of a 64-GPU job; every node's segmenter holding the whole
        # job's membership cost O(nodes x communicators) memory).
        comms = [e for evs in hooks.values() for e in evs if isinstance(e, CommEvent)]
        if comms:
            per_node: dict[str, list[HookEvent]] = {}
            for c in comms:
                self._note_job(c.node, c.job)
                if c.rank is not None:  # a comm known by pointer only (v2): its rank comes later
                    self._comms[(c.comm_id, c.node, c.rank)] = c
                out.forward(c.job, c.node, c)
                per_node.setdefault(c.node, []).append(c)
            for node, evs in per_node.items():
                if node in self.nodes:
                    seg = self.nodes[node]
                    self._emit(seg.add_events(evs, run=False), out)
                else:  # a new node's segmenter starts with its ranked comms known so far
                    seg = self.segmenter(node)
                    unranked = [e for e in evs if isinstance(e, CommEvent) and e.rank is None]
                    if unranked:
                        self._emit(seg.add_events(unranked, run=False), out)
                touched[node] = seg
        for node, evs in hooks.items():
            self.events += len(evs)
            rest = [e for e in evs if not isinstance(e, CommEvent)]
            bad = [e for e in rest if isinstance(e, OpEvent) and e.bytes > MAX_OP_BYTES]
            if bad:
                self._count(node, "impossible_ops", len(bad))
                rest = [e for e in rest if not (isinstance(e, OpEvent) and e.bytes > MAX_OP_BYTES)]
            recvs: dict[str, OpEvent] = {}
            for e in rest:
                self._note_job(e.node, e.job)
                if isinstance(e, FlowEvent):
                    out.forward(e.job, e.node, e)
                elif isinstance(e, OpEvent) and e.kind == "Recv":
                    cur = recvs.get(e.comm_id)
                    if cur is None or e.seq >= cur.seq:
                        recvs[e.comm_id] = e
            for e in recvs.values():
                out.forward(e.job, e.node, e)
            if rest:
                seg = self.segmenter(node)
                self._emit(seg.add_events(rest, run=False), out)
                touched[node] = seg
        return touched

    def gaps(self, node: str) -> dict[str, int]:
        """What of ``node``'s input was not used so far (only nonzero counts)."""
        out = dict(self.damage.get(node, {}))
        seg = self.nodes.get(node)
        if seg is not None:
            for k in GAP_KEYS:
                n = int(getattr(seg.stats, k, 0) or 0)
                if n:
                    out[k] = n
        return out

    def _count(self, node: str, what: str, n: int = 1) -> None:
        d = self.damage.setdefault(node, {})
        d[what] = d.get(what, 0) + n

    def _skew_refs(self) -> dict[str, tuple[list[int], dict[str, int]]]:
        """Per job: its nodes' data ends, sorted, and each node's position in them. Built
        once per chunk (the ends only move after a chunk's batches): sorting every node's
        end for every batch cost O(nodes) per batch, ~6 % of the segmentation at 128 GPUs."""
        per_job: dict[str, list[tuple[int, str]]] = {}
        for node, end in self._data_end.items():
            per_job.setdefault(self._jobs.get(node, ""), []).append((end, node))
        refs: dict[str, tuple[list[int], dict[str, int]]] = {}
        for job, ends in per_job.items():
            ends.sort()
            refs[job] = ([e for e, _ in ends], {n: i for i, (_, n) in enumerate(ends)})
        return refs

    def _wild_time(self, b: EpochBatch, end_ns: int) -> bool:
        if b.t0_ns < 0 or end_ns >= 1 << 62:
            return True
        ref = self._skew_ref.get(b.job)
        if ref is None:
            return False
        vals, pos = ref
        own = pos.get(b.node)
        n = len(vals) - (own is not None)
        if n <= 0:
            return False
        k = n // 2  # the median of the other nodes' ends: skip the batch's own node
        med = vals[k + 1] if own is not None and k >= own else vals[k]
        return abs(b.t0_ns - med) > MAX_SKEW_NS

    def _clamp(self, b: EpochBatch) -> EpochBatch:
        cap = min(MAX_LINK_BYTES_PER_NS * b.epoch_ns, 0xFFFFFFFF)
        if b.n_rows == 0 or (int(b.tx_bytes.max()) <= cap and (b.rx_bytes is None or int(b.rx_bytes.max()) <= cap)):
            return b  # the usual batch: one reduction per column, no mask
        over = int(np.count_nonzero(b.tx_bytes > cap))
        rx_over = 0 if b.rx_bytes is None else int(np.count_nonzero(b.rx_bytes > cap))
        if not (over or rx_over):
            return b
        self._count(b.node, "clamped_rows", max(over, rx_over))
        return dataclasses.replace(b, tx_bytes=np.minimum(b.tx_bytes, cap).astype(b.tx_bytes.dtype),
                                   rx_bytes=None if b.rx_bytes is None
                                   else np.minimum(b.rx_bytes, cap).astype(b.rx_bytes.dtype))

    def _note_job(self, node: str, job: str) -> None:
        if job:
            self._jobs[node] = job

    def _emit(self, metrics: list[OpMetrics], out: SegmentOutput) -> None:
        out.metrics += metrics
        self.emitted += len(metrics)

    @property
    def stats(self) -> dict[str, Any]:
        per_node = {node: seg.stats.as_dict() for node, seg in self.nodes.items()}
        lost = sum(int(s.get("lost_batches", 0) or 0) for s in per_node.values())  # type: ignore[call-overload]
        late = sum(int(s.get("late_batches", 0) or 0) for s in per_node.values())  # type: ignore[call-overload]
        return {"batches": self.batches, "rows": self.rows, "events": self.events, "op_metrics": self.emitted,
                "lost_batches": lost, "late_batches": late, "nodes": len(self.nodes)}
