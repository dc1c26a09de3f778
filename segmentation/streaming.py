"""Streaming form: one small state object per node, fed hook events and epoch batches in
any interleaving, emitting an operator's metrics as soon as all its send flows closed it.

It runs the same resumable kernel as the batch form on each flow's buffered rows (rows
since the first operator not yet closed on that flow), so on the same input it produces
the same metrics (tests check it), provided reordering stays within the bounds of
:class:`SegmentParams` (``late_batches`` for batches, ``max_pending_ops`` for op events).
Memory is bounded: rows per flow, pending op descriptors, unbound flows and reorder
buffers all have caps, and what is evicted is counted in :attr:`NodeSegmenter.stats`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
from pulse.segmentation import metrics as _metrics
from pulse.segmentation.association import Association, FlowKey, OpKey, associate
from pulse.segmentation.kernel import FAR, OPEN, run_kernel, volume_bounds
from pulse.segmentation.params import SegmentationError, SegmentParams
from pulse.segmentation.rows import NicClock, batch_rows, merge_sorted

from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.records import OpMetrics
from pulse.samples import EpochBatch
from pulse.settings import DEFAULT_EPOCH_NS

_EMPTY = np.zeros(0, np.int64)


@dataclasses.dataclass
class StreamStats:
    batches: int = 0
    rows: int = 0
    reordered_batches: int = 0
    """Batches that arrived ahead of a missing batch_seq and were held, then used."""
    late_batches: int = 0
    """Batches that arrived after their slot was given up (dropped)."""
    duplicate_batches: int = 0
    lost_batches: int = 0
    """batch_seq numbers never received within the reorder bound."""
    late_rows: int = 0
    """Rows for epochs of a flow that were already segmented (dropped)."""
    lost_ops: int = 0
    """Op seq numbers skipped because their descriptor did not arrive within the bound."""
    late_ops: int = 0
    """Op descriptors that arrived after their seq was skipped (dropped)."""
    evicted_ops: int = 0
    evicted_rows: int = 0
    dropped_unbound_rows: int = 0
    emitted: int = 0
    unbound_flows: set[FlowKey] = dataclasses.field(default_factory=set)
    """Flows with traffic and, so far, no (comm, rank, peer, direction) binding."""

    def as_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        d["unbound_flows"] = sorted(self.unbound_flows)
        return d


@dataclasses.dataclass
class _Nic:
    clock: NicClock
    next_seq: int
    pending: dict[int, EpochBatch] = dataclasses.field(default_factory=dict)
    wm: int = -(1 << 62)
    """Grid epoch up to which (exclusive) every epoch of this NIC has been seen."""


@dataclasses.dataclass
class _Flow:
    ep: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY)
    by: np.ndarray = dataclasses.field(default_factory=lambda: _EMPTY)
    carry: int = -1
    next_seq: int = 0
    """Smallest op seq not yet closed on this flow (all below are closed)."""
    floor: int = -(1 << 62)
    """Grid epochs below this were segmented already: later rows there are late."""
    dirty: bool = True
    wm_seen: int = -(1 << 62)


class NodeSegmenter:
    """Incremental segmentation for one node (all its NICs and ranks)."""

    def __init__(self, node: str, params: SegmentParams | None = None) -> None:
        if params is not None and not isinstance(params, SegmentParams):
            raise SegmentationError(f"params must be SegmentParams, got {type(params).__name__}")
        self.node = node
        self.params = params or SegmentParams()
        self.stats = StreamStats()
        self._comms: list[CommEvent] = []
        self._flow_events: dict[FlowKey, FlowEvent] = {}
        self._ops: dict[OpKey, OpEvent] = {}
        self._frontier: dict[tuple[str, int], int] = {}
        self._ahead: dict[tuple[str, int], set[int]] = {}
        self._assoc: Association | None = None
        self._new_ops: list[OpEvent] = []
        self._nics: dict[str, _Nic] = {}
        self._flows: dict[FlowKey, _Flow] = {}
        self._closed: dict[OpKey, dict[FlowKey, tuple[int, int, int, int, np.ndarray]]] = {}
        self._clock: NicClock | None = None

    # ---- hook events -------------------------------------------------------------------
    def add_events(self, events: Iterable[CommEvent | FlowEvent | OpEvent]) -> list[OpMetrics]:
        """Take hook events (other nodes' flow/op events are ignored); returns metrics of
        operators that the new descriptors allowed to close."""
        changed = topology = False
        for ev in events:
            if isinstance(ev, CommEvent):
                self._comms.append(ev)
                changed = topology = True
            elif isinstance(ev, FlowEvent):
                if ev.node != self.node:
                    continue
                key = (ev.node, ev.nic, ev.flow)
                if key not in self._flow_events or ev.bound:
                    self._flow_events[key] = ev
                    changed = topology = True
                    if ev.bound and ev.direction is not None:
                        self.stats.unbound_flows.discard(key)
            elif isinstance(ev, OpEvent):
                if ev.node != self.node:
                    continue
                changed |= self._add_op(ev)
            else:
                raise SegmentationError(f"not a hook event: {type(ev).__name__}")
        if changed:
            if topology:
                self._assoc = None
            for f in self._flows.values():
                f.dirty = True
            if len(self._comms) > 4 * self.params.max_pending_ops:
                self._compact_comms()
        return self._step(final=False) if changed else []

    def _compact_comms(self) -> None:
        keep: dict[tuple[str, int], CommEvent] = {}
        for c in self._comms:
            prev = keep.get((c.comm_id, c.rank))
            if prev is None or c.rings or c.trees:
                keep[(c.comm_id, c.rank)] = c
        self._comms = list(keep.values())

    def _add_op(self, ev: OpEvent) -> bool:
        cr = (ev.comm_id, ev.rank)
        front = self._frontier.get(cr)
        if front is None:
            # A stream that starts near seq 0 may start out of order: wait for seq 0.
            front = 0 if ev.seq <= self.params.late_batches else ev.seq
            self._frontier[cr] = front
        if ev.seq < front and (ev.comm_id, ev.rank, ev.seq) not in self._ops:
            self.stats.late_ops += 1
            return False
        key = (ev.comm_id, ev.rank, ev.seq)
        if key in self._ops:
            return False
        self._ops[key] = ev
        self._new_ops.append(ev)
        self._advance_frontier(cr, ev.seq)
        if len(self._ops) > self.params.max_pending_ops:
            oldest = min(self._ops, key=lambda k: (self._ops[k].t_host_ns or 0, k))
            del self._ops[oldest]
            self._closed.pop(oldest, None)
            if self._assoc is not None:
                self._assoc.drop_ops([oldest])
            self.stats.evicted_ops += 1
        return True

    def _advance_frontier(self, cr: tuple[str, int], seq: int) -> None:
        front = self._frontier[cr]
        ahead = self._ahead.setdefault(cr, set())
        if seq >= front:
            ahead.add(seq)
        while front in ahead:
            ahead.discard(front)
            front += 1
        if len(ahead) > self.params.late_batches:
            # The descriptor of seq ``front`` is not coming: skip the hole.
            nxt = min(ahead)
            self.stats.lost_ops += nxt - front
            front = nxt
            while front in ahead:
                ahead.discard(front)
                front += 1
        self._frontier[cr] = front

    def _association(self) -> Association:
        if self._assoc is None:
            self._assoc = associate([*self._comms, *self._flow_events.values(), *self._ops.values()])
            without = self._assoc.ops_without_flows
        elif self._new_ops:
            without = self._assoc.add_ops(op for op in self._new_ops if (op.comm_id, op.rank, op.seq) in self._ops)
        else:
            return self._assoc
        self._new_ops = []
        senders = {(b.comm_id, b.rank) for b in self._assoc.bindings.values() if b.direction == "send"}
        for k in without:
            if (k[0], k[1]) in senders:
                self._ops.pop(k, None)  # not an operator for Pulse on this rank (e.g. Recv)
        self._assoc.ops_without_flows = []
        return self._assoc

    # ---- epoch batches -----------------------------------------------------------------
    def update(self, batch: EpochBatch) -> list[OpMetrics]:
        """Take one batch (any order within ``late_batches``); returns metrics closed by it."""
        if not isinstance(batch, EpochBatch):
            raise SegmentationError(f"update() takes an EpochBatch, got {type(batch).__name__}")
        if batch.node != self.node:
            raise SegmentationError(f"batch of node {batch.node!r} given to the segmenter of {self.node!r}")
        self.stats.batches += 1
        nic = self._nics.get(batch.nic)
        if nic is None:
            if self._clock is None:
                self._clock = NicClock(batch.epoch_ns, batch.t0_ns % batch.epoch_ns)
            start = 0 if batch.batch_seq <= self.params.late_batches else batch.batch_seq
            nic = self._nics[batch.nic] = _Nic(clock=self._clock, next_seq=start)
        seq = batch.batch_seq
        if seq < nic.next_seq:
            self.stats.late_batches += 1
            return []
        if seq in nic.pending:
            self.stats.duplicate_batches += 1
            return []
        nic.pending[seq] = batch
        if seq != nic.next_seq:
            self.stats.reordered_batches += 1
        self._release(nic, force=False)
        return self._step(final=False)

    def _release(self, nic: _Nic, *, force: bool) -> None:
        while nic.pending:
            if nic.next_seq not in nic.pending:
                if not force and len(nic.pending) <= self.params.late_batches:
                    return
                nxt = min(nic.pending)
                self.stats.lost_batches += nxt - nic.next_seq
                nic.next_seq = nxt
            b = nic.pending.pop(nic.next_seq)
            nic.next_seq += 1
            self._ingest(b, nic)

    def _ingest(self, b: EpochBatch, nic: _Nic) -> None:
        f, e, t = batch_rows(b, nic.clock)
        self.stats.rows += int(f.size)
        base = b.t0_ns // b.epoch_ns
        nic.wm = max(nic.wm, int(base), int(e.max()) + 1 if e.size else int(base))
        if f.size == 0:
            return
        f, e, t = merge_sorted(f, e, t)
        bounds = np.flatnonzero(np.diff(f)) + 1
        starts = np.concatenate(([0], bounds))
        ends = np.concatenate((bounds, [f.size]))
        for s, x in zip(starts.tolist(), ends.tolist(), strict=True):
            key = (b.node, b.nic, int(f[s]))
            fe = self._flow_events.get(key)
            if fe is not None and fe.bound and fe.direction == "recv":
                continue  # recv flows only corroborate; metrics come from send flows
            if fe is None or not fe.bound or fe.direction is None:
                self.stats.unbound_flows.add(key)
                if key not in self._flows and len(self.stats.unbound_flows) > self.params.max_unbound_flows:
                    self.stats.dropped_unbound_rows += x - s
                    continue
            self._append(key, e[s:x], t[s:x])

    def _append(self, key: FlowKey, ep: np.ndarray, by: np.ndarray) -> None:
        fl = self._flows.get(key)
        if fl is None:
            fl = self._flows[key] = _Flow()
        late = ep < fl.floor
        if late.any():
            self.stats.late_rows += int(late.sum())
            ep, by = ep[~late], by[~late]
        if fl.ep.size and ep.size and ep[0] <= fl.ep[-1]:
            # Overlapping or out-of-order windows: re-sort and sum duplicates.
            first_carry = fl.carry
            allf = np.zeros(fl.ep.size + ep.size, np.int64)
            e2 = np.concatenate((fl.ep, ep))
            b2 = np.concatenate((fl.by, by))
            _, fl.ep, fl.by = merge_sorted(allf, e2, b2)
            fl.carry = first_carry
        else:
            fl.ep = np.concatenate((fl.ep, ep)) if fl.ep.size else ep.copy()
            fl.by = np.concatenate((fl.by, by)) if fl.by.size else by.copy()
        over = fl.ep.size - self.params.max_buffered_rows
        if over > 0:
            self.stats.evicted_rows += over
            fl.floor = int(fl.ep[over])
            fl.ep, fl.by, fl.carry = fl.ep[over:], fl.by[over:], -1
        fl.dirty = True

    # ---- segmentation ------------------------------------------------------------------
    def finish(self) -> list[OpMetrics]:
        """End of stream: use every held batch, close every operator (incomplete ones
        with the bytes seen) and return the remaining metrics."""
        for nic in self._nics.values():
            self._release(nic, force=True)
        for cr in list(self._frontier):
            self._frontier[cr] = 1 << 62
        self._assoc = None
        return self._step(final=True)

    def _ops_of_flow(self, assoc: Association, key: FlowKey, fl: _Flow) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        seqs, need = assoc.flow_op_list(key)
        issue = assoc.flow_issue_times(key)
        if seqs.size == 0:
            return seqs, need, issue
        b = assoc.bindings[key]
        front = self._frontier.get((b.comm_id or "", b.rank or 0), 0)
        sel = (seqs >= fl.next_seq) & (seqs < front)
        return seqs[sel], need[sel], issue[sel]

    def _step(self, *, final: bool) -> list[OpMetrics]:
        assoc = self._association()
        keys: list[FlowKey] = []
        for key in set(self._flows) | set(assoc.flow_ops):
            b = assoc.bindings.get(key)
            if b is None:
                continue
            if b.direction != "send":
                self._flows.pop(key, None)  # rows that waited for a binding that says recv
                continue
            fl = self._flows.get(key)
            if fl is None:
                if not final:
                    continue
                fl = self._flows[key] = _Flow()
            wm = self._nics[key[1]].wm if key[1] in self._nics else -(1 << 62)
            if final or fl.dirty or (fl.ep.size and wm != fl.wm_seen):
                keys.append(key)
        if not keys:
            return []
        keys.sort()
        flows = [self._flows[k] for k in keys]
        ops = [self._ops_of_flow(assoc, k, fl) for k, fl in zip(keys, flows, strict=True)]
        counts = np.array([fl.ep.size for fl in flows], np.int64)
        row_ptr = np.zeros(len(keys) + 1, np.int64)
        np.cumsum(counts, out=row_ptr[1:])
        op_counts = np.array([x[0].size for x in ops], np.int64)
        op_ptr = np.zeros(len(keys) + 1, np.int64)
        np.cumsum(op_counts, out=op_ptr[1:])
        ep = np.concatenate([fl.ep for fl in flows]) if counts.sum() else _EMPTY
        by = np.concatenate([fl.by for fl in flows]) if counts.sum() else _EMPTY
        seqs = np.concatenate([x[0] for x in ops]) if op_counts.sum() else _EMPTY
        need = np.concatenate([x[1] for x in ops]) if op_counts.sum() else _EMPTY
        issue = np.concatenate([x[2] for x in ops]) if op_counts.sum() else _EMPTY
        thr, slack = volume_bounds(need, self.params.rel_tolerance, self.params.abs_tolerance)
        wm = np.array([self._nics[k[1]].wm if k[1] in self._nics else -(1 << 62) for k in keys], np.int64)
        if final:
            wm[:] = FAR
        carry = np.array([fl.carry for fl in flows], np.int64)
        clock = self._clock or NicClock(DEFAULT_EPOCH_NS, 0)
        out = run_kernel(row_ptr, ep, by, op_ptr, need, thr, slack, gap=self.params.gap_epochs,
                         stall=self.params.stall_epochs(clock.epoch_ns),
                         merge=self.params.merge_epochs(clock.epoch_ns), watermark=wm, final=final,
                         carry_in=carry, earliest=clock.earliest_epoch(issue))
        touched: set[OpKey] = set()
        for j, (key, fl) in enumerate(zip(keys, flows, strict=True)):
            b = assoc.bindings[key]
            comm, rank = b.comm_id or "", b.rank or 0
            k0, k1 = int(op_ptr[j]), int(op_ptr[j + 1])
            for k in range(k0, int(out.next_op[j])):
                if out.status[k] == OPEN:
                    break
                s, e = int(out.start[k]), int(out.end[k])
                if s >= 0:
                    lo, hi = np.searchsorted(fl.ep, [s, e], side="left")[0], np.searchsorted(fl.ep, e, "right")
                    act_ep = fl.ep[lo:hi]
                else:
                    act_ep = _EMPTY
                okey = (comm, rank, int(seqs[k]))
                self._closed.setdefault(okey, {})[key] = (s, e, int(out.vol[k]), int(out.status[k]), act_ep)
                touched.add(okey)
            nxt = int(out.next_op[j])
            if nxt < k1:
                fl.next_seq = int(seqs[nxt])
            elif k1 > k0:
                fl.next_seq = int(seqs[k1 - 1]) + 1
            c = int(out.consumed[j]) - int(row_ptr[j])
            if c > 0:
                fl.floor = int(fl.ep[c]) if c < fl.ep.size else int(fl.ep[-1]) + 1
                fl.ep, fl.by = fl.ep[c:], fl.by[c:]
            fl.carry = int(out.carry[j])
            if fl.carry >= 0 and fl.ep.size:
                fl.by = fl.by.copy()
                fl.by[0] = fl.carry
                fl.floor = int(fl.ep[0])
                fl.carry = -1
            fl.dirty = False
            fl.wm_seen = int(wm[j])
        emitted = []
        for okey in sorted(touched):
            info = assoc.ops.get(okey)
            done = self._closed.get(okey, {})
            if info is None or any(f not in done for f in info.flows):
                continue
            rows = [done[f] for f in info.flows]
            act_ep = np.unique(np.concatenate([r[4] for r in rows])) if rows else _EMPTY
            emitted.append(_metrics.build(
                info, clock, np.array([r[0] for r in rows], np.int64), np.array([r[1] for r in rows], np.int64),
                np.array([r[2] for r in rows], np.int64), np.array([r[3] for r in rows], np.int8),
                int(act_ep.size)))
            del self._closed[okey]
            self._ops.pop(okey, None)
            assoc.drop_ops([okey])  # emitted descriptors leave the pending set
        self.stats.emitted += len(emitted)
        return emitted
