"""Streaming form: one small state object per node, fed hook events and epoch batches in
any interleaving, emitting an operator's metrics as soon as all its send flows closed it.

It runs the same resumable kernel as the batch form on each flow's buffered rows (rows
since the first operator not yet closed on that flow), so on the same input it produces
the same metrics (tests check it), provided reordering stays within the bounds of
:class:`SegmentParams` (``late_batches`` for batches, ``max_pending_ops`` for op events).
Memory is bounded: rows per flow, pending op descriptors, unbound flows and reorder
buffers all have caps, and what is evicted is counted in :attr:`NodeSegmenter.stats`.

State is columnar so that a batch costs array passes over its rows and over the flows it
concerns, not Python work per flow: flows get integer ids with per-flow state arrays and
each NIC's buffered rows live in one (flow id, epoch)-sorted store
(:mod:`pulse.segmentation.flows`), and every (operator, send flow) pair is a row of a
slot table that also keeps the pair's result once a flow closed it
(:mod:`pulse.segmentation.slots`); batches are put in order per NIC by
:mod:`pulse.segmentation.batchorder`. Only flows whose inputs changed (new rows, new
operators or a moved op frontier, their NIC's watermark) are re-run; re-running the
resumable kernel on unchanged inputs closes nothing new, so skipping them changes no
result. Hook events update the association incrementally (only a comm/flow binding
change recomputes it).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from pulse.segmentation.association import FlowKey, OpInfo, OpKey, RankFiller, _op_info, associate
from pulse.segmentation.batchorder import LOW, NicOrder
from pulse.segmentation.flows import RECV, SEND, UNBOUND, FlowTable
from pulse.segmentation.frontier import Frontiers
from pulse.segmentation.gather import active_epochs, gather
from pulse.segmentation.ingest import _ingest_kernel
from pulse.segmentation.kernel import FAR, OPEN, TX_MASK, run_kernel, volume_bounds
from pulse.segmentation.params import SegmentationError, SegmentParams, check_params
from pulse.segmentation.rows import NicClock, batch_rows, check_epoch, nic_rows
from pulse.segmentation.rowstore import merge_rows
from pulse.segmentation.slots import SlotTable
from pulse.segmentation.stepkern import reduce_slots, select_slots, trim_rows
from pulse.segmentation.streamstats import StreamStats

from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.records import OpMetrics
from pulse.samples import EpochBatch
from pulse.settings import DEFAULT_EPOCH_NS

__all__ = ["NodeSegmenter", "StreamStats", "warm_up"]

_EMPTY = np.zeros(0, np.int64)


class NodeSegmenter:
    """Incremental segmentation for one node (all its NICs and ranks)."""

    def __init__(self, node: str, params: SegmentParams | None = None) -> None:
        self.node = node
        self.params = check_params(params)
        self.stats = StreamStats()
        self._comms: list[CommEvent] = []
        self._rank_filler = RankFiller(limit=self.params.max_pending_ops)
        """Holds ops without a rank until a comm event names it (sources joined mid-run)."""
        self._flow_events: dict[FlowKey, FlowEvent] = {}
        self._ops: dict[OpKey, OpEvent] = {}
        self._front = Frontiers(self.params.late_batches, self.params.op_hole_ns, self.stats)
        self._new_ops: list[OpEvent] = []
        self._nics: dict[str, NicOrder] = {}
        self._clock: NicClock | None = None
        self._ctx: tuple[dict, dict] | None = None
        """(ranks, comms) of the association for the current comm/flow bindings; None
        when a binding changed and it must be recomputed."""
        self._senders: set[tuple[str, int]] = set()
        self._flows = FlowTable(node, self.params, self.stats, self._flow_state)
        self._slots = SlotTable()
        self._wm_run: dict[str, int] = {}
        self._shapes: dict[tuple, tuple[OpInfo, ...] | tuple[None]] = {}
        """Association of an operator *shape* under the current bindings: a job repeats the
        same few shapes every step, and associating each op event alone cost ~10 µs."""

    # ---- ids ------------------------------------------------------------------------------
    def _flow_state(self, key: FlowKey) -> tuple[int, int]:
        fe = self._flow_events.get(key)
        if fe is None or not fe.bound or fe.direction is None:
            return UNBOUND, -1
        cr = self._front.index((fe.comm_id or "", fe.rank or 0))
        return (SEND if fe.direction == "send" else RECV), cr

    # ---- hook events -------------------------------------------------------------------
    def add_events(self, events: Iterable[CommEvent | FlowEvent | OpEvent], *, run: bool = True) -> list[OpMetrics]:
        """Take hook events (other nodes' events are ignored); returns metrics of
        operators that the new descriptors allowed to close.

        ``run=False`` only takes them in (the flows they concern are marked to run): a
        caller that also has batches at hand runs once after both, as with ``update``."""
        changed = topology = False
        moved: set[tuple[str, int]] = set()
        # Another node's comm events name ranks this node's flows and ops never have (a
        # rank's flows and ops are on its own node): keeping them cost every node's
        # segmenter the whole job's membership, O(nodes x communicators) (1,024 nodes of a
        # 1,023-communicator job held 400 MiB, tests/streams/test_hostile_input.py)
        mine = [ev for ev in events if not (isinstance(ev, CommEvent) and ev.node != self.node)]
        for ev in self._rank_filler.feed(mine):
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
                changed |= self._add_op(ev, moved)
            else:
                raise SegmentationError(f"not a hook event: {type(ev).__name__}")
        if not changed:
            return []
        if topology:
            self._ctx = None
            if len(self._comms) > 4 * self.params.max_pending_ops:
                self._compact_comms()
        if self._ctx is None:
            self._rebuild()
        else:
            self._add_new_ops()
            if moved:
                ix = self._front.ix
                crs = np.array([ix[cr] for cr in moved if cr in ix], np.int64)
                if crs.size:
                    f = self._flows.f
                    f.dirty[: f.n] |= np.isin(f.col("cr"), crs)
        return self._step(final=False) if run else []

    def _compact_comms(self) -> None:
        keep: dict[tuple[str, int], CommEvent] = {}
        for c in self._comms:
            if c.rank is None:
                continue  # pointer-only comms matter to the rank filler, not to association
            prev = keep.get((c.comm_id, c.rank))
            if prev is None or c.rings or c.trees:
                keep[(c.comm_id, c.rank)] = c
        self._comms = list(keep.values())

    def _add_op(self, ev: OpEvent, moved: set[tuple[str, int]]) -> bool:
        if ev.rank is None:
            return False  # the rank filler releases it once its rank is named
        cr = (ev.comm_id, ev.rank)
        front = self._front.front.get(cr)
        if front is None:
            # A stream that starts near seq 0 may start out of order: wait for seq 0.
            front = 0 if ev.seq <= self.params.late_batches else ev.seq
            self._front.set(cr, front)
        key = (ev.comm_id, ev.rank, ev.seq)
        if key in self._ops:
            return False
        if ev.seq < front:
            self.stats.late_ops += 1
            return False
        self._ops[key] = ev
        self._new_ops.append(ev)
        if self._front.advance(cr, ev.seq, ev.t_host_ns):
            moved.add(cr)
        if len(self._ops) > self.params.max_pending_ops:
            oldest = min(self._ops, key=lambda k: (self._ops[k].t_host_ns or 0, k))
            del self._ops[oldest]
            uid = self._slots.uid.get(oldest)
            if uid is not None:
                self._flows.f.dirty[self._slots.drop(np.array([uid], np.int64))] = True
            self.stats.evicted_ops += 1
        return True

    def _add_new_ops(self) -> None:
        assert self._ctx is not None
        keys, found = [], []
        ops, known = self._ops, self._slots.uid
        for op in sorted(self._new_ops, key=lambda o: (o.comm_id, o.rank, o.seq)):
            key = (op.comm_id, op.rank, op.seq)
            if key not in ops or key in known:
                continue
            info = self._info(op)
            if info is None:
                if (op.comm_id, op.rank) in self._senders:
                    del ops[key]  # not an operator for Pulse on this rank (e.g. Recv)
                continue
            keys.append(key)
            found.append(info)
        self._new_ops = []
        uids = self._slots.new_uids(keys)
        self._slots.info.update(zip(uids, found, strict=True))
        self._flows.f.dirty[self._slots.add(list(zip(uids, found, strict=True)), self._flows.ids)] = True

    def _info(self, op: OpEvent) -> OpInfo | None:
        """``_op_info`` of ``op`` under the current bindings, memoised by everything it
        reads of the op event (the event itself is swapped in)."""
        assert self._ctx is not None
        key = (op.comm_id, op.rank, op.kind, op.bytes, op.algo, op.nchannels, op.nranks, op.root, op.peer,
               None if op.peers is None else tuple(op.peers),
               None if op.peer_send_bytes is None else tuple(op.peer_send_bytes))
        hit = self._shapes.get(key)
        if hit is None:
            info = _op_info(op, *self._ctx)
            hit = self._shapes[key] = (info,)
            if len(self._shapes) > 4 * self.params.max_pending_ops:
                self._shapes.clear()
        info = hit[0]
        if info is None:
            return None
        # the shape's info with this event: a dict copy, cheaper than the dataclass __init__
        out = object.__new__(OpInfo)
        d = out.__dict__
        d.update(info.__dict__)
        d["event"] = op
        return out

    def _rebuild(self) -> None:
        """A comm/flow binding changed: recompute the association of every pending op,
        keeping what flows already closed."""
        assoc = associate([*self._comms, *self._flow_events.values()])
        self._ctx = assoc._ctx  # type: ignore[assignment]
        self._shapes = {}
        self._senders = {(b.comm_id, b.rank) for b in assoc.bindings.values() if b.direction == "send"}
        fl = self._flows
        missing = [key for key in self._flow_events if key not in fl.fid]
        if missing:
            fl.ids(missing)
        fl.refresh_states()
        f = fl.f
        recv = np.flatnonzero(f.col("state") == RECV)
        if recv.size:
            # rows that waited for a binding that says recv: recv flows only corroborate
            fl.drop_rows(recv)
            f.has[recv] = False
        self._new_ops = []
        self._slots.rebuild(self._ops, self._info, self._senders, fl.ids)
        f.dirty[: f.n] = True

    # ---- epoch batches -----------------------------------------------------------------
    def update(self, batch: EpochBatch, *, run: bool = True) -> list[OpMetrics]:
        """Take one batch (any order within ``late_batches``); returns metrics closed by it.

        ``run=False`` only takes the batch in (checked, reordered, buffered) and returns
        nothing: a caller with several batches at hand takes them all in, then calls
        :meth:`run` once - the same metrics, one kernel pass instead of one per batch."""
        if not isinstance(batch, EpochBatch):
            raise SegmentationError(f"update() takes an EpochBatch, got {type(batch).__name__}")
        if batch.node != self.node:
            raise SegmentationError(f"batch of node {batch.node!r} given to the segmenter of {self.node!r}")
        if self._clock is not None:
            check_epoch(batch, self._clock)
        self.stats.batches += 1
        nic = self._nics.get(batch.nic)
        if nic is None:
            if self._clock is None:
                self._clock = NicClock(batch.epoch_ns, batch.t0_ns % batch.epoch_ns)
            start = 0 if batch.batch_seq <= self.params.late_batches else batch.batch_seq
            nic = self._nics[batch.nic] = NicOrder(clock=self._clock, next_seq=start)
        if not nic.offer(batch, self.stats):
            return []
        nic.release(self.params.late_batches, self.stats, force=False)
        return self._step(final=False) if run else []

    def run(self) -> list[OpMetrics]:
        """Segment what :meth:`update` took in with ``run=False``; returns the metrics closed."""
        return self._step(final=False)

    def _ingest_ready(self) -> None:
        """Buffer the rows of every batch released in order since the last run, all
        batches of all NICs in one pass (the same rows as one pass per batch)."""
        ready: list[tuple[str, NicOrder, list[EpochBatch]]] = []
        for name, nic in self._nics.items():
            if nic.ready:
                ready.append((name, nic, nic.ready))
                nic.ready = []
                for b in ready[-1][2]:
                    check_epoch(b, nic.clock)
        if not ready:
            return
        fast = self._flows.ingest_fast([(name, batches) for name, _, batches in ready], self.params.burst_rx)
        if fast is not None:
            self.stats.rows += fast[0]
            for name, nic, batches in ready:
                base = max(b.t0_ns // b.epoch_ns for b in batches)
                nic.wm = max(nic.wm, int(base), fast[1][name] + 1)
            return
        for name, nic, batches in ready:
            base = max(b.t0_ns // b.epoch_ns for b in batches)
            f, e, t, kept = nic_rows(batches, nic.clock, self.params.burst_rx)
            self.stats.rows += kept
            nic.wm = max(nic.wm, int(base), int(e.max()) + 1 if e.size else int(base))
            if len(batches) == 1:
                self._flows.ingest(name, f, e, t)
                continue
            if self._flows.ingest(name, f, e, t, bound_only=True):
                continue
            # Flows without a binding: their caps are applied batch by batch.
            for b in batches:
                self._flows.ingest(name, *batch_rows(b, nic.clock, self.params.burst_rx))

    # ---- segmentation ------------------------------------------------------------------
    def finish(self) -> list[OpMetrics]:
        """End of stream: use every held batch, close every operator (incomplete ones
        with the bytes seen) and return the remaining metrics."""
        for nic in self._nics.values():
            nic.release(self.params.late_batches, self.stats, force=True)
        self._front.release_all()
        # Descriptors not associated yet (only possible after a binding change) are;
        # otherwise the slot table already is what a full re-association would give.
        if self._ctx is not None and self._new_ops:
            self._add_new_ops()
        return self._step(final=True)

    def _moved_wm(self) -> bool:
        """Whether some NIC's watermark moved since its flows last ran."""
        seen = self._wm_run
        now = {name: nic.wm for name, nic in self._nics.items()}
        if now == seen:
            return False
        self._wm_run = now
        return True

    def buffered_rows(self) -> dict[FlowKey, int]:
        """Rows buffered per flow (flows with none left out)."""
        return self._flows.buffered_rows()

    def _step(self, *, final: bool) -> list[OpMetrics]:
        if self._ctx is None:
            self._rebuild()
        self._ingest_ready()
        fl = self._flows.f
        s = self._slots.s
        if fl.n == 0 or not (final or fl.col("dirty").any() or self._moved_wm()):
            return []
        nic_wm = np.array([self._nics[name].wm if name in self._nics else LOW for name in self._flows.nic_names],
                          np.int64)
        send = fl.col("state") == SEND
        if final:
            with_slots = np.zeros(fl.n, bool)
            with_slots[s.col("fid")[s.col("live")]] = True
            fl.has[: fl.n] |= send & with_slots
            run = send & fl.col("has")
        else:
            moved = (fl.col("nrows") > 0) & (nic_wm[fl.col("nic")] != fl.col("wm_seen"))
            run = send & fl.col("has") & (fl.col("dirty") | moved)
        fids = np.flatnonzero(run)
        if fids.size == 0:
            return []
        # flows in id order: their rows are one gather from the node's (flow id, epoch)-sorted store
        nics = fl.nic[fids]
        runpos = np.full(fl.n, -1, np.int64)
        runpos[fids] = np.arange(fids.size)
        counts = fl.nrows[fids]
        row_ptr = np.zeros(fids.size + 1, np.int64)
        np.cumsum(counts, out=row_ptr[1:])
        sf, se, sb = self._flows.store
        lo = np.searchsorted(sf, fids)
        if int(row_ptr[-1]) == sf.size:
            ep, by = se, sb
        else:
            idx = gather(lo, counts)
            ep, by = se[idx], sb[idx]
        # operator slots of the run: open, at/after the flow's next seq, below the frontier
        sidx, op_ptr = select_slots(s.col("fid"), s.col("live"), s.col("closed"), s.col("seq"), runpos, fl.next,
                                    fl.cr, self._front.array, fids.size)
        seqs = s.seq[sidx]
        need = s.need[sidx]
        thr, slack = volume_bounds(need, self.params.rel_tolerance, self.params.abs_tolerance)
        wm = np.full(fids.size, FAR, np.int64) if final else nic_wm[nics]
        clock = self._clock or NicClock(DEFAULT_EPOCH_NS, 0)
        out = run_kernel(row_ptr, ep, by, op_ptr, need, thr, slack, gap=self.params.gap_epochs,
                         stall=self.params.stall_epochs(clock.epoch_ns),
                         merge=self.params.merge_epochs(clock.epoch_ns), watermark=wm, final=final,
                         carry_in=None, earliest=clock.earliest_epoch(s.issue[sidx]),
                         burst_rx=self.params.burst_rx,
                         fills=self.params.slot_fills(need, s.steps[sidx]),
                         grant_in=fl.grant[fids])
        fl.grant[fids] = out.grant_next
        # closed slots: every slot before the flow's next open one
        slot_run = np.repeat(np.arange(fids.size), np.diff(op_ptr))
        closed = (np.arange(sidx.size) < out.next_op[slot_run]) & (out.status != OPEN)
        cpos = np.flatnonzero(closed)
        cs = sidx[cpos]
        cuid = self._slots.close(cs, out.start[cpos], out.end[cpos], out.vol[cpos], out.status[cpos],
                                 out.grant[cpos])
        started = cpos[out.start[cpos] >= 0]
        if started.size:
            sr = slot_run[started]
            rep, act_ep, act_tx = active_epochs(ep, by, counts, sr, out.start[started], out.end[started])
            # a crossing row split by an earlier run is stored with the carried share only:
            # an operator's busiest epoch counts the flow's whole epoch there, as wherever
            # the runs were cut (and as the batch form)
            rf = fids[sr][rep]
            carried = act_ep == fl.cep[rf]
            act_tx[carried] = fl.cfull[rf[carried]]
            self._slots.pool_epochs(s.uid[sidx[started]][rep], rf, act_ep, act_tx)
        split = np.flatnonzero((out.carry >= 0) & (out.consumed < row_ptr[1:]))
        if split.size:
            at = out.consumed[split]
            sf_ = fids[split]
            again = ep[at] == fl.cep[sf_]
            fl.cfull[sf_] = np.where(again, fl.cfull[sf_], by[at] & TX_MASK)
            fl.cep[sf_] = ep[at]
        # per flow: next seq, rows consumed, carry, floor
        self._flows.store = trim_rows(fids, row_ptr, lo, out.consumed, out.carry, out.next_op, op_ptr, seqs, ep,
                                      (sf, se, sb), fl.floor, fl.next, fl.nrows)
        fl.dirty[fids] = False
        fl.wm_seen[fids] = wm
        if cuid.size == 0:
            return []
        done = self._slots.complete(cuid)
        if done.size == 0:
            return []
        emitted, keys = self._slots.emit(done, clock)
        for key in keys:
            self._ops.pop(key, None)
        self.stats.emitted += len(emitted)
        return emitted

def warm_up() -> None:
    """Load the numba kernels (from the on-disk cache, else compile) before traffic
    arrives, so that the first batches of a stream do not wait for it (about 1 s)."""
    one = np.ones(1, np.int64)
    ptr = np.array([0, 1], np.int64)
    thr, slack = volume_bounds(one, 1e-3, 0)
    for final in (False, True):
        run_kernel(ptr, one, one, ptr, one, thr, slack, gap=3, stall=10, merge=5, watermark=one,
                   final=final, carry_in=None, earliest=one)
    merge_rows((one, one, one), (one, one + 1, one))
    yes = np.ones(1, bool)
    _, op_ptr = select_slots(_EMPTY, ~yes, yes, _EMPTY, one, one, one, one, 1)
    trim_rows(_EMPTY, np.zeros(2, np.int64), _EMPTY, _EMPTY, _EMPTY, _EMPTY, op_ptr, _EMPTY, _EMPTY,
              (_EMPTY, _EMPTY, _EMPTY), one.copy(), one.copy(), one.copy())
    reduce_slots(one, one, yes, yes, one, one, one, one, np.ones(1, np.int8), one, one, one, 1, 1)
    u32 = np.ones(1, np.uint32)
    for has_rx in (False, True):  # the types decoded batches bring
        _ingest_kernel(u32, u32, u32, u32, has_rx, ptr, one, np.zeros(1, np.int64), 512 if has_rx else 0, one, one, ptr,
                       np.ones(2, np.int8), np.zeros(2, np.int64), np.zeros(2, bool), np.zeros(2, bool),
                       np.zeros(2, np.int64), _EMPTY, _EMPTY, _EMPTY)
