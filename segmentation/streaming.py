"""Streaming form: one small state object per node, fed hook events and epoch batches in
any interleaving, emitting an operator's metrics as soon as all its send flows closed it.

It runs the same resumable kernel as the batch form on each flow's buffered rows (rows
since the first operator not yet closed on that flow), so on the same input it produces
the same metrics (tests check it), provided reordering stays within the bounds of
:class:`SegmentParams` (``late_batches`` for batches, ``max_pending_ops`` for op events).
Memory is bounded: rows per flow, pending op descriptors, unbound flows and reorder
buffers all have caps, and what is evicted is counted in :attr:`NodeSegmenter.stats`.

State is columnar so that a batch costs array passes over its rows and over the flows it
concerns, not Python work per flow: flows get integer ids with per-flow state arrays,
each NIC's buffered rows live in one (flow id, epoch)-sorted store
(:mod:`pulse.segmentation.rowstore`), and every (operator, send flow) pair is a row of a
slot table that also keeps the pair's result once a flow closed it. Only flows whose
inputs changed (new rows, new operators or a moved op frontier, their NIC's watermark)
are re-run; re-running the resumable kernel on unchanged inputs closes nothing new, so
skipping them changes no result. Hook events update the association incrementally
(only a comm/flow binding change recomputes it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
from pulse.segmentation import metrics as _metrics
from pulse.segmentation.association import NO_TIME, FlowKey, OpInfo, OpKey, RankFiller, _op_info, associate
from pulse.segmentation.kernel import COMPLETE, FAR, OPEN, TX_MASK, run_kernel, volume_bounds
from pulse.segmentation.params import SegmentationError, SegmentParams
from pulse.segmentation.rows import NicClock, batch_rows, merge_sorted
from pulse.segmentation.rowstore import merge_rows

from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.records import OpMetrics
from pulse.samples import EpochBatch
from pulse.settings import DEFAULT_EPOCH_NS

_EMPTY = np.zeros(0, np.int64)
_LOW = -(1 << 62)
UNBOUND, SEND, RECV = 0, 1, 2


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
    wm: int = _LOW
    """Grid epoch up to which (exclusive) every epoch of this NIC has been seen."""
    ready: list[EpochBatch] = dataclasses.field(default_factory=list)
    """Batches released in batch_seq order, not buffered yet."""


class _Columns:
    """Named int64/bool columns with amortised growth (capacity doubling)."""

    def __init__(self, spec: dict[str, tuple[type, int]]) -> None:
        self._spec = spec
        self.n = 0
        self._cap = 0
        for name, (dt, fill) in spec.items():
            setattr(self, name, np.full(0, fill, dt))

    def grow(self, k: int) -> slice:
        """Room for ``k`` more rows (filled with defaults); returns their slice."""
        need = self.n + k
        if need > self._cap:
            cap = max(64, need, 2 * self._cap)
            for name, (dt, fill) in self._spec.items():
                old = getattr(self, name)
                new: np.ndarray = np.full(cap, fill, dt)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
            self._cap = cap
        s = slice(self.n, need)
        self.n = need
        return s

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the rows where ``mask`` (length n) is True, in order."""
        m = int(mask.sum())
        for name, (_dt, fill) in self._spec.items():
            col = getattr(self, name)
            col[:m] = col[: self.n][mask]
            col[m: self.n] = fill
        self.n = m

    def col(self, name: str) -> np.ndarray:
        return getattr(self, name)[: self.n]

    def __getattr__(self, name: str) -> np.ndarray:
        # only reached for a name that is not a column: tells type checkers the columns
        # set in __init__/grow are arrays
        raise AttributeError(name)


def _gather(lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated aranges lo[i]:lo[i]+counts[i]."""
    total = int(counts.sum())
    if total == 0:
        return _EMPTY
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts - lo, counts)


class NodeSegmenter:
    """Incremental segmentation for one node (all its NICs and ranks)."""

    def __init__(self, node: str, params: SegmentParams | None = None) -> None:
        if params is not None and not isinstance(params, SegmentParams):
            raise SegmentationError(f"params must be SegmentParams, got {type(params).__name__}")
        self.node = node
        self.params = params or SegmentParams()
        self.stats = StreamStats()
        self._comms: list[CommEvent] = []
        self._rank_filler = RankFiller(limit=self.params.max_pending_ops)
        """Holds ops without a rank until a comm event names it (sources joined mid-run)."""
        self._flow_events: dict[FlowKey, FlowEvent] = {}
        self._ops: dict[OpKey, OpEvent] = {}
        self._frontier: dict[tuple[str, int], int] = {}
        self._ahead: dict[tuple[str, int], set[int]] = {}
        self._new_ops: list[OpEvent] = []
        self._nics: dict[str, _Nic] = {}
        self._clock: NicClock | None = None
        self._ctx: tuple[dict, dict] | None = None
        """(ranks, comms) of the association for the current comm/flow bindings; None
        when a binding changed and it must be recomputed."""
        self._senders: set[tuple[str, int]] = set()
        # flows: FlowKey <-> id, per-id state columns
        self._fid: dict[FlowKey, int] = {}
        self._fkeys: list[FlowKey] = []
        self._f = _Columns({
            "nic": (np.int64, -1), "cr": (np.int64, -1), "state": (np.int8, UNBOUND),
            "next": (np.int64, 0), "floor": (np.int64, _LOW), "dirty": (np.bool_, True),
            "wm_seen": (np.int64, _LOW), "has": (np.bool_, False), "nrows": (np.int64, 0),
            "grant": (np.int64, -1)})
        # NICs by index: name, flow number -> flow id (sorted), buffered rows store
        self._nic_ix: dict[str, int] = {}
        self._nic_names: list[str] = []
        self._nic_nums: list[np.ndarray] = []
        self._nic_ids: list[np.ndarray] = []
        self._store: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        # (comm, rank) ids and their op frontier (ops with seq >= it are not used yet)
        self._cr_ix: dict[tuple[str, int], int] = {}
        self._cr_front = np.zeros(0, np.int64)
        # operators: key <-> uid (reused), their association info
        self._uid: dict[OpKey, int] = {}
        self._ukey: dict[int, OpKey] = {}
        self._uinfo: dict[int, OpInfo] = {}
        self._free_uids: list[int] = []
        self._next_uid = 0
        self._u_total = np.zeros(0, np.int64)
        self._u_closed = np.zeros(0, np.int64)
        # (operator, send flow) slots with the flow's result once closed
        self._s = _Columns({
            "fid": (np.int64, 0), "seq": (np.int64, 0), "need": (np.int64, 0), "issue": (np.int64, NO_TIME),
            "uid": (np.int64, 0), "live": (np.bool_, False), "closed": (np.bool_, False),
            "start": (np.int64, -1), "end": (np.int64, -1), "vol": (np.int64, 0), "status": (np.int8, 0),
            "grant": (np.int64, -1)})
        # active epochs of closed slots whose operator is not emitted yet
        self._pool = (_EMPTY, _EMPTY, _EMPTY)  # (uid, fid, epoch)
        self._wm_run: dict[str, int] = {}

    # ---- ids ------------------------------------------------------------------------------
    def _nic_index(self, nic: str) -> int:
        ix = self._nic_ix.get(nic)
        if ix is None:
            ix = self._nic_ix[nic] = len(self._nic_names)
            self._nic_names.append(nic)
            self._nic_nums.append(_EMPTY)
            self._nic_ids.append(_EMPTY)
            self._store.append((_EMPTY, _EMPTY, _EMPTY))
        return ix

    def _cr_index(self, cr: tuple[str, int]) -> int:
        ix = self._cr_ix.get(cr)
        if ix is None:
            ix = self._cr_ix[cr] = len(self._cr_ix)
            if ix >= self._cr_front.size:
                grown = np.zeros(max(64, 2 * self._cr_front.size), np.int64)
                grown[: self._cr_front.size] = self._cr_front
                self._cr_front = grown
            self._cr_front[ix] = self._frontier.get(cr, 0)
        return ix

    def _flow_state(self, key: FlowKey) -> tuple[int, int]:
        fe = self._flow_events.get(key)
        if fe is None or not fe.bound or fe.direction is None:
            return UNBOUND, -1
        cr = self._cr_index((fe.comm_id or "", fe.rank or 0))
        return (SEND if fe.direction == "send" else RECV), cr

    def _flow_ids(self, keys: list[FlowKey]) -> np.ndarray:
        """Ids of flows, registering new ones."""
        out = np.empty(len(keys), np.int64)
        new_by_nic: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            fid = self._fid.get(key)
            if fid is None:
                fid = self._fid[key] = len(self._fkeys)
                self._fkeys.append(key)
                s = self._f.grow(1)
                nix = self._nic_index(key[1])
                self._f.nic[s] = nix
                self._f.state[s], self._f.cr[s] = self._flow_state(key)
                new_by_nic.setdefault(nix, []).append(fid)
            out[i] = fid
        for nix, fids in new_by_nic.items():
            nums = np.concatenate((self._nic_nums[nix], [self._fkeys[f][2] for f in fids])).astype(np.int64)
            ids = np.concatenate((self._nic_ids[nix], fids)).astype(np.int64)
            order = np.argsort(nums, kind="stable")
            self._nic_nums[nix], self._nic_ids[nix] = nums[order], ids[order]
        return out

    def _new_uid(self, key: OpKey) -> int:
        if self._free_uids:
            uid = self._free_uids.pop()
        else:
            uid = self._next_uid
            self._next_uid += 1
            if uid >= self._u_total.size:
                cap = max(64, 2 * self._u_total.size)
                for name in ("_u_total", "_u_closed"):
                    old = getattr(self, name)
                    new = np.zeros(cap, np.int64)
                    new[: old.size] = old
                    setattr(self, name, new)
        self._uid[key] = uid
        self._ukey[uid] = key
        self._u_total[uid] = 0
        self._u_closed[uid] = 0
        return uid

    def _forget_uids(self, uids: Iterable[int]) -> None:
        for uid in uids:
            key = self._ukey.pop(uid)
            del self._uid[key]
            self._uinfo.pop(uid, None)
            self._free_uids.append(uid)

    # ---- hook events -------------------------------------------------------------------
    def add_events(self, events: Iterable[CommEvent | FlowEvent | OpEvent]) -> list[OpMetrics]:
        """Take hook events (other nodes' flow/op events are ignored); returns metrics of
        operators that the new descriptors allowed to close."""
        changed = topology = False
        moved: set[tuple[str, int]] = set()
        for ev in self._rank_filler.feed(events):
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
                crs = np.array([self._cr_ix[cr] for cr in moved if cr in self._cr_ix], np.int64)
                if crs.size:
                    f = self._f
                    f.dirty[: f.n] |= np.isin(f.col("cr"), crs)
        return self._step(final=False)

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
        front = self._frontier.get(cr)
        if front is None:
            # A stream that starts near seq 0 may start out of order: wait for seq 0.
            front = 0 if ev.seq <= self.params.late_batches else ev.seq
            self._set_front(cr, front)
        if ev.seq < front and (ev.comm_id, ev.rank, ev.seq) not in self._ops:
            self.stats.late_ops += 1
            return False
        key = (ev.comm_id, ev.rank, ev.seq)
        if key in self._ops:
            return False
        self._ops[key] = ev
        self._new_ops.append(ev)
        before = self._frontier[cr]
        self._advance_frontier(cr, ev.seq)
        if self._frontier[cr] != before:
            moved.add(cr)
        if len(self._ops) > self.params.max_pending_ops:
            oldest = min(self._ops, key=lambda k: (self._ops[k].t_host_ns or 0, k))
            del self._ops[oldest]
            uid = self._uid.get(oldest)
            if uid is not None:
                self._drop_uids(np.array([uid], np.int64), dirty=True)
            self.stats.evicted_ops += 1
        return True

    def _set_front(self, cr: tuple[str, int], front: int) -> None:
        self._frontier[cr] = front
        ix = self._cr_ix.get(cr)
        if ix is not None:
            self._cr_front[ix] = front

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
        self._set_front(cr, front)

    def _drop_uids(self, uids: np.ndarray, *, dirty: bool) -> None:
        """Forget operators: their slots, pooled epochs and ids."""
        s = self._s
        mark = np.zeros(self._next_uid + 1, bool)  # uids are small reused integers
        mark[uids] = True
        gone = s.col("live") & mark[s.col("uid")]
        if dirty:
            self._f.dirty[s.col("fid")[gone]] = True
        s.live[: s.n][gone] = False
        if self._pool[0].size:
            keep = ~mark[self._pool[0]]
            self._pool = (self._pool[0][keep], self._pool[1][keep], self._pool[2][keep])
        self._forget_uids(uids.tolist())
        if s.n > 1024 and s.n > 2 * int(s.col("live").sum()):
            s.keep(s.col("live").copy())

    def _slots_of(self, infos: list[tuple[int, OpInfo]]) -> None:
        """Append the slots of newly associated operators."""
        pairs = [(uid, f, e) for uid, info in infos for f, e in zip(info.flows, info.expected, strict=True)]
        if not pairs:
            return
        fids = self._flow_ids([p[1] for p in pairs])
        s = self._s
        sl = s.grow(len(pairs))
        s.fid[sl] = fids
        s.uid[sl] = [p[0] for p in pairs]
        s.need[sl] = [p[2] for p in pairs]
        seq_of = {uid: info.event.seq for uid, info in infos}
        issue_of = {uid: NO_TIME if info.event.t_host_ns is None else info.event.t_host_ns for uid, info in infos}
        s.seq[sl] = [seq_of[p[0]] for p in pairs]
        s.issue[sl] = [issue_of[p[0]] for p in pairs]
        s.live[sl] = True
        for uid, info in infos:
            self._u_total[uid] += len(info.flows)
        self._f.dirty[fids] = True

    def _add_new_ops(self) -> None:
        assert self._ctx is not None
        ranks, comms = self._ctx
        infos = []
        for op in sorted(self._new_ops, key=lambda o: (o.comm_id, o.rank, o.seq)):
            key = (op.comm_id, op.rank, op.seq)
            if key not in self._ops or key in self._uid:
                continue
            info = _op_info(op, ranks, comms)
            if info is None:
                if (op.comm_id, op.rank) in self._senders:
                    del self._ops[key]  # not an operator for Pulse on this rank (e.g. Recv)
                continue
            uid = self._new_uid(key)
            self._uinfo[uid] = info
            infos.append((uid, info))
        self._new_ops = []
        self._slots_of(infos)

    def _rebuild(self) -> None:
        """A comm/flow binding changed: recompute the association of every pending op,
        keeping what flows already closed."""
        assoc = associate([*self._comms, *self._flow_events.values()])
        self._ctx = assoc._ctx  # type: ignore[assignment]
        self._senders = {(b.comm_id, b.rank) for b in assoc.bindings.values() if b.direction == "send"}
        f = self._f
        missing = [key for key in self._flow_events if key not in self._fid]
        if missing:
            self._flow_ids(missing)
        for key, fid in self._fid.items():
            f.state[fid], f.cr[fid] = self._flow_state(key)
        recv = np.flatnonzero(f.col("state") == RECV)
        if recv.size:
            # rows that waited for a binding that says recv: recv flows only corroborate
            self._drop_rows(recv)
            f.has[recv] = False
        old = self._s
        done = old.col("live") & old.col("closed")
        kept = {(int(u), int(fi)): i for i, (u, fi) in
                enumerate(zip(old.col("uid")[done].tolist(), old.col("fid")[done].tolist(), strict=True))}
        old_rows = {name: old.col(name)[done].copy() for name in ("start", "end", "vol", "status")}
        self._s = _Columns(old._spec)
        self._new_ops = []
        infos = []
        live_uids: set[int] = set()
        for key in sorted(self._ops):
            op = self._ops[key]
            info = _op_info(op, *self._ctx)
            if info is None:
                if (op.comm_id, op.rank) in self._senders:
                    del self._ops[key]
                    uid = self._uid.get(key)
                    if uid is not None:
                        self._forget_uids([uid])
                continue
            uid = self._uid.get(key)
            if uid is None:
                uid = self._new_uid(key)
            self._u_total[uid] = 0
            self._u_closed[uid] = 0
            self._uinfo[uid] = info
            infos.append((uid, info))
            live_uids.add(uid)
        for uid in [u for u in self._ukey if u not in live_uids]:
            self._forget_uids([uid])
        self._slots_of(infos)
        s = self._s
        if kept and s.n:
            pos = np.array([kept.get((u, fi), -1) for u, fi in
                            zip(s.col("uid").tolist(), s.col("fid").tolist(), strict=True)], np.int64)
            hit = pos >= 0
            s.closed[: s.n][hit] = True
            for name, col in old_rows.items():
                getattr(s, name)[: s.n][hit] = col[pos[hit]]
            np.add.at(self._u_closed, s.col("uid")[hit], 1)
        if self._pool[0].size:
            closed_keys = set(zip(s.col("uid")[s.col("closed")].tolist(), s.col("fid")[s.col("closed")].tolist(),
                                  strict=True))
            keep = np.array([(u, fi) in closed_keys for u, fi in
                             zip(self._pool[0].tolist(), self._pool[1].tolist(), strict=True)], bool)
            self._pool = (self._pool[0][keep], self._pool[1][keep], self._pool[2][keep])
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
        if self._clock is not None and batch.epoch_ns != self._clock.epoch_ns:
            raise SegmentationError(
                f"{batch.node}/{batch.nic} batch {batch.batch_seq}: epoch_ns {batch.epoch_ns} differs "
                f"from the {self._clock.epoch_ns} of the node's earlier batches")
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
        return self._step(final=False) if run else []

    def run(self) -> list[OpMetrics]:
        """Segment what :meth:`update` took in with ``run=False``; returns the metrics closed."""
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
            nic.ready.append(b)

    def _ingest_ready(self) -> None:
        """Buffer the rows of every batch released in order since the last run, all
        batches of a NIC in one pass (the same rows as one pass per batch)."""
        for name, nic in self._nics.items():
            if not nic.ready:
                continue
            batches, nic.ready = nic.ready, []
            rows = []
            for b in batches:
                f, e, t = batch_rows(b, nic.clock, self.params.burst_rx)
                self.stats.rows += int(f.size)
                base = b.t0_ns // b.epoch_ns
                nic.wm = max(nic.wm, int(base), int(e.max()) + 1 if e.size else int(base))
                rows.append((f, e, t))
            if len(rows) == 1:
                self._ingest(name, *rows[0])
                continue
            cat = tuple(np.concatenate([r[k] for r in rows]) for k in range(3))
            if not self._ingest(name, *cat, bound_only=True):
                # Flows without a binding: their caps are applied batch by batch.
                for r in rows:
                    self._ingest(name, *r)

    def _ingest(self, nic_name: str, f: np.ndarray, e: np.ndarray, t: np.ndarray, *,
                bound_only: bool = False) -> bool:
        """Buffer rows (flow number, grid epoch, bytes) of one NIC. With ``bound_only``,
        returns False without buffering anything if some flow has no binding yet."""
        nix = self._nic_index(nic_name)
        if f.size == 0:
            return True
        f, e, t = merge_sorted(f, e, t)
        first = np.ones(f.size, bool)
        first[1:] = f[1:] != f[:-1]
        nums = f[first]
        known = self._nic_nums[nix]
        pos = np.searchsorted(known, nums)
        pos_c = np.minimum(pos, max(known.size - 1, 0))
        hit = (pos < known.size) & (known[pos_c] == nums) if known.size else np.zeros(nums.size, bool)
        if not hit.all():
            self._flow_ids([(self.node, nic_name, int(x)) for x in nums[~hit].tolist()])
            known = self._nic_nums[nix]
            pos = np.searchsorted(known, nums)
        fids = self._nic_ids[nix][pos]
        fl = self._f
        state = fl.state[fids]
        keep_flow = state == SEND
        if bound_only and (state == UNBOUND).any():
            return False
        if (state == UNBOUND).any():
            counts = np.diff(np.append(np.flatnonzero(first), f.size))
            for j in np.flatnonzero(state == UNBOUND).tolist():
                key = (self.node, nic_name, int(nums[j]))
                self.stats.unbound_flows.add(key)
                if not fl.has[fids[j]] and len(self.stats.unbound_flows) > self.params.max_unbound_flows:
                    self.stats.dropped_unbound_rows += int(counts[j])
                    continue
                keep_flow[j] = True
        row_fid = fids[np.cumsum(first) - 1]
        keep = np.repeat(keep_flow, np.diff(np.append(np.flatnonzero(first), f.size)))
        row_fid, e, t = row_fid[keep], e[keep], t[keep]
        if row_fid.size == 0:
            return True
        touched = fids[keep_flow]
        fl.has[touched] = True
        fl.dirty[touched] = True
        late = e < fl.floor[row_fid]
        if late.any():
            self.stats.late_rows += int(late.sum())
            row_fid, e, t = row_fid[~late], e[~late], t[~late]
        if row_fid.size and not np.all(row_fid[1:] >= row_fid[:-1]):
            # flow ids are not in flow-number order: sort (epochs stay sorted per flow)
            order = np.argsort(row_fid, kind="stable")
            row_fid, e, t = row_fid[order], e[order], t[order]
        sf, se, sb = merge_rows(self._store[nix], (row_fid, e, t))
        cap = self.params.max_buffered_rows
        cnt = np.bincount(sf - int(sf[0]), minlength=0) if sf.size else _EMPTY
        if cnt.size and cnt.max() > cap:
            # oldest rows of an overfull flow go (counted): its earlier epochs are final
            starts = np.cumsum(cnt) - cnt
            rank = np.arange(sf.size) - np.repeat(starts, cnt)
            over = np.repeat(np.maximum(cnt - cap, 0), cnt)
            drop = rank < over
            self.stats.evicted_rows += int(drop.sum())
            full = np.flatnonzero(cnt > cap)
            fl.floor[full + int(sf[0])] = se[starts[full] + cnt[full] - cap]
            sf, se, sb = sf[~drop], se[~drop], sb[~drop]
        self._set_store(nix, (sf, se, sb), touched)
        return True

    def _set_store(self, nix: int, store: tuple[np.ndarray, np.ndarray, np.ndarray], touched: np.ndarray) -> None:
        """Replace a NIC's store; ``touched``: flows whose row count may have changed."""
        self._store[nix] = store
        fl = self._f
        fl.nrows[touched] = 0
        sf = store[0]
        if sf.size:
            first = np.ones(sf.size, bool)
            first[1:] = sf[1:] != sf[:-1]
            starts = np.flatnonzero(first)
            fl.nrows[sf[starts]] = np.diff(np.append(starts, sf.size))

    def _drop_rows(self, fids: np.ndarray) -> None:
        for nix in np.unique(self._f.nic[fids]).tolist():
            sf, se, sb = self._store[nix]
            if sf.size:
                keep = ~np.isin(sf, fids)
                self._set_store(nix, (sf[keep], se[keep], sb[keep]), fids[self._f.nic[fids] == nix])

    # ---- segmentation ------------------------------------------------------------------
    def finish(self) -> list[OpMetrics]:
        """End of stream: use every held batch, close every operator (incomplete ones
        with the bytes seen) and return the remaining metrics."""
        for nic in self._nics.values():
            self._release(nic, force=True)
        for cr in list(self._frontier):
            self._set_front(cr, 1 << 62)
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
        n = self._f.col("nrows")
        return {self._fkeys[i]: int(n[i]) for i in np.flatnonzero(n).tolist()}

    def _step(self, *, final: bool) -> list[OpMetrics]:
        if self._ctx is None:
            self._rebuild()
        self._ingest_ready()
        fl = self._f
        s = self._s
        if fl.n == 0 or not (final or fl.col("dirty").any() or self._moved_wm()):
            return []
        nic_wm = np.array([self._nics[name].wm if name in self._nics else _LOW for name in self._nic_names],
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
        # flows in (nic, id) order: each NIC's rows are one contiguous gather from its store
        fids = fids[np.lexsort((fids, fl.nic[fids]))]
        nics = fl.nic[fids]
        runpos = np.full(fl.n, -1, np.int64)
        runpos[fids] = np.arange(fids.size)
        counts = fl.nrows[fids]
        row_ptr = np.zeros(fids.size + 1, np.int64)
        np.cumsum(counts, out=row_ptr[1:])
        nic_list = np.unique(nics).tolist()
        lo = np.zeros(fids.size, np.int64)
        ep_parts, by_parts = [], []
        for nix in nic_list:
            sel = np.flatnonzero(nics == nix)
            sf, se, sb = self._store[nix]
            lo[sel] = np.searchsorted(sf, fids[sel])
            if counts[sel].sum() == sf.size:
                ep_parts.append(se)
                by_parts.append(sb)
            else:
                idx = _gather(lo[sel], counts[sel])
                ep_parts.append(se[idx])
                by_parts.append(sb[idx])
        ep = np.concatenate(ep_parts) if len(ep_parts) > 1 else (ep_parts[0] if ep_parts else _EMPTY)
        by = np.concatenate(by_parts) if len(by_parts) > 1 else (by_parts[0] if by_parts else _EMPTY)
        # operator slots of the run: open, at/after the flow's next seq, below the frontier
        sfid = s.col("fid")
        rp = runpos[sfid]
        cand = s.col("live") & ~s.col("closed") & (rp >= 0)
        cand &= s.col("seq") >= fl.next[sfid]
        cand &= s.col("seq") < self._cr_front[np.maximum(fl.cr[sfid], 0)]
        sidx = np.flatnonzero(cand)
        sidx = sidx[np.lexsort((s.seq[sidx], rp[sidx]))]
        seqs = s.seq[sidx]
        need = s.need[sidx]
        op_ptr = np.zeros(fids.size + 1, np.int64)
        np.cumsum(np.bincount(rp[sidx], minlength=fids.size), out=op_ptr[1:])
        thr, slack = volume_bounds(need, self.params.rel_tolerance, self.params.abs_tolerance)
        wm = np.full(fids.size, FAR, np.int64) if final else nic_wm[nics]
        clock = self._clock or NicClock(DEFAULT_EPOCH_NS, 0)
        out = run_kernel(row_ptr, ep, by, op_ptr, need, thr, slack, gap=self.params.gap_epochs,
                         stall=self.params.stall_epochs(clock.epoch_ns),
                         merge=self.params.merge_epochs(clock.epoch_ns), watermark=wm, final=final,
                         carry_in=None, earliest=clock.earliest_epoch(s.issue[sidx]),
                         burst_rx=self.params.burst_rx, burst_need=self.params.burst_need,
                         grant_in=fl.grant[fids])
        fl.grant[fids] = out.grant_next
        # closed slots: every slot before the flow's next open one
        slot_run = np.repeat(np.arange(fids.size), np.diff(op_ptr))
        closed = (np.arange(sidx.size) < out.next_op[slot_run]) & (out.status != OPEN)
        cpos = np.flatnonzero(closed)
        cs = sidx[cpos]
        s.closed[cs] = True
        s.start[cs] = out.start[cpos]
        s.end[cs] = out.end[cpos]
        s.vol[cs] = out.vol[cpos]
        s.status[cs] = out.status[cpos]
        s.grant[cs] = out.grant[cpos]
        cuid = s.uid[cs]
        np.add.at(self._u_closed, cuid, 1)
        started = cpos[out.start[cpos] >= 0]
        if started.size:
            # the active epochs of each closed slot: its flow's rows in [start, end]
            sr = slot_run[started]
            base = int(ep.min()) if ep.size else 0
            key = (np.repeat(np.arange(fids.size, dtype=np.int64), counts) << 40) | (ep - base)
            a = np.searchsorted(key, (sr << 40) | (out.start[started] - base), "left")
            z = np.searchsorted(key, (sr << 40) | (out.end[started] - base), "right")
            idx = _gather(a, z - a)
            rep = np.repeat(np.arange(started.size), z - a)
            active = (by[idx] & TX_MASK) > 0  # rx-only rows (CTS bursts) are not active epochs
            idx, rep = idx[active], rep[active]
            add = (s.uid[sidx[started]][rep], fids[sr][rep], ep[idx])
            self._pool = tuple(np.concatenate((p, q)) for p, q in zip(self._pool, add, strict=True))  # type: ignore[assignment]
        # per flow: next seq, resume row, carry
        k0, k1 = op_ptr[:-1], op_ptr[1:]
        nxt = out.next_op
        has_open = nxt < k1
        if seqs.size:
            nseq = np.where(has_open, seqs[np.minimum(nxt, seqs.size - 1)],
                            seqs[np.maximum(k1 - 1, 0)] + 1)
            upd = has_open | (k1 > k0)
            fl.next[fids[upd]] = nseq[upd]
        c = out.consumed - row_ptr[:-1]
        carry = out.carry
        for nix in nic_list:
            sel = np.flatnonzero(nics == nix)
            cn, cc, lo_n = counts[sel], c[sel], lo[sel]
            ch = cc > 0
            if not ch.any() and not (carry[sel] >= 0).any():
                continue
            f_sel = fids[sel]
            base_rows = row_ptr[sel]
            # floor: the first row kept (or one past the last when all were consumed)
            rest = cc < cn
            fl.floor[f_sel[ch & rest]] = ep[base_rows[ch & rest] + cc[ch & rest]]
            alld = ch & ~rest
            fl.floor[f_sel[alld]] = ep[base_rows[alld] + cn[alld] - 1] + 1
            sf, se, sb = self._store[nix]
            cy = (carry[sel] >= 0) & rest
            if cy.any():
                sb = sb.copy()
                at = lo_n[cy] + cc[cy]
                sb[at] = carry[sel][cy] | (sb[at] & ~TX_MASK)  # keep the row's rx bits
                fl.floor[f_sel[cy]] = se[lo_n[cy] + cc[cy]]
            if ch.any():
                drop = np.zeros(sf.size, bool)
                drop[_gather(lo_n[ch], cc[ch])] = True
                sf, se, sb = sf[~drop], se[~drop], sb[~drop]
            self._set_store(nix, (sf, se, sb), f_sel)
        fl.dirty[fids] = False
        fl.wm_seen[fids] = wm
        if cuid.size == 0:
            return []
        touched = np.unique(cuid)
        done = touched[self._u_closed[touched] >= self._u_total[touched]]
        done = done[self._u_total[done] > 0]
        if done.size == 0:
            return []
        emitted = self._emit(done, clock)
        self.stats.emitted += len(emitted)
        return emitted

    def _emit(self, uids: np.ndarray, clock: NicClock) -> list[OpMetrics]:
        s = self._s
        order = sorted(uids.tolist(), key=lambda u: self._ukey[u])
        uids = np.array(order, np.int64)
        ix = np.full(int(uids.max()) + 1, -1, np.int64)
        ix[uids] = np.arange(uids.size)
        mine = s.col("live") & s.col("closed")
        mine &= ix[np.minimum(s.col("uid"), ix.size - 1)] >= 0
        mine &= s.col("uid") < ix.size
        rows = np.flatnonzero(mine)
        g = ix[s.uid[rows]]
        n = uids.size
        began = s.start[rows] >= 0
        big = np.int64(1) << 62
        start = np.full(n, big, np.int64)
        np.minimum.at(start, g[began], s.start[rows][began])
        end = np.full(n, -big, np.int64)
        np.maximum.at(end, g[began], s.end[rows][began])
        vol = np.zeros(n, np.int64)
        np.add.at(vol, g, s.vol[rows])
        grant = np.full(n, big, np.int64)
        granted = s.grant[rows] >= 0
        np.minimum.at(grant, g[granted], s.grant[rows][granted])
        bad = np.zeros(n, np.int64)
        np.add.at(bad, g, (s.status[rows] != COMPLETE).astype(np.int64))
        pu, _, pe = self._pool
        inp = np.zeros(pu.size, bool)
        inp[pu < ix.size] = ix[pu[pu < ix.size]] >= 0
        act = _metrics.union_count(ix[pu[inp]], pe[inp], n)
        out = []
        for i, uid in enumerate(order):
            info = self._uinfo[uid]
            out.append(_metrics.build_from(info, clock, int(start[i]) if start[i] != big else -1,
                                           int(end[i]), int(vol[i]), bad[i] == 0, int(act[i]),
                                           int(grant[i]) if grant[i] != big else -1))
            self._ops.pop(self._ukey[uid], None)
        self._drop_uids(uids, dirty=False)
        return out


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
