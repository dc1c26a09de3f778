"""The streaming segmenter's operators and their (operator, send flow) slots.

Every associated operator of the node gets a small integer id (reused once it is emitted
or dropped) and one slot per send flow that carries it. A slot keeps the flow's result
(start, end, volume, status, grant) once the kernel closed it, and the flow's active
epochs inside it wait in a pool until every slot of the operator is closed: then the
operator is emitted, aggregated over its slots exactly as the batch form does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
from pulse.segmentation import metrics as _metrics
from pulse.segmentation.association import NO_TIME, FlowKey, OpInfo, OpKey
from pulse.segmentation.columns import Columns
from pulse.segmentation.kernel import COMPLETE
from pulse.segmentation.rows import NicClock
from pulse.segmentation.stepkern import reduce_slots

from pulse.events import OpEvent
from pulse.records import OpMetrics

_EMPTY = np.zeros(0, np.int64)
SLOT_SPEC: dict[str, tuple[type, int]] = {
    "fid": (np.int64, 0), "seq": (np.int64, 0), "need": (np.int64, 0), "issue": (np.int64, NO_TIME),
    "steps": (np.int64, 1),
    "uid": (np.int64, 0), "live": (np.bool_, False), "closed": (np.bool_, False),
    "start": (np.int64, -1), "end": (np.int64, -1), "vol": (np.int64, 0), "status": (np.int8, 0),
    "grant": (np.int64, -1)}
_RESULTS = ("start", "end", "vol", "status")
"""What a closed slot keeps across a re-association."""

FlowIds = Callable[[list[FlowKey]], np.ndarray]
"""Flow keys -> flow ids (registering new flows)."""


class SlotTable:
    def __init__(self) -> None:
        self.s = Columns(SLOT_SPEC)
        self.uid: dict[OpKey, int] = {}
        self.ukey: dict[int, OpKey] = {}
        self.info: dict[int, OpInfo] = {}
        self._free: list[int] = []
        self.next_uid = 0
        self._total = np.zeros(0, np.int64)
        """Slots per operator id."""
        self._closed = np.zeros(0, np.int64)
        """Closed slots per operator id."""
        self.pool = (_EMPTY, _EMPTY, _EMPTY, _EMPTY)
        """(uid, fid, epoch, tx bytes): active epochs of closed slots whose operator is not
        emitted yet."""

    # ---- operator ids -----------------------------------------------------------------
    def new_uid(self, key: OpKey) -> int:
        return self.new_uids([key])[0]

    def new_uids(self, keys: list[OpKey]) -> list[int]:
        """Ids for new operators (freed ids first), their counts zeroed."""
        uids = []
        for key in keys:
            if self._free:
                uid = self._free.pop()
            else:
                uid = self.next_uid
                self.next_uid += 1
            self.uid[key] = uid
            self.ukey[uid] = key
            uids.append(uid)
        if self.next_uid > self._total.size:
            cap = max(64, 2 * self._total.size, self.next_uid)
            for name in ("_total", "_closed"):
                old = getattr(self, name)
                new = np.zeros(cap, np.int64)
                new[: old.size] = old
                setattr(self, name, new)
        if uids:
            ix = np.array(uids, np.int64)
            self._total[ix] = 0
            self._closed[ix] = 0
        return uids

    def forget(self, uids: Iterable[int]) -> None:
        for uid in uids:
            key = self.ukey.pop(uid)
            del self.uid[key]
            self.info.pop(uid, None)
            self._free.append(uid)

    def drop(self, uids: np.ndarray) -> np.ndarray:
        """Forget operators: their slots, pooled epochs and ids. Returns the flow ids of
        their live slots."""
        s = self.s
        mark = np.zeros(self.next_uid + 1, bool)  # uids are small reused integers
        mark[uids] = True
        gone = s.col("live") & mark[s.col("uid")]
        fids = s.col("fid")[gone]
        s.live[: s.n][gone] = False
        if self.pool[0].size:
            keep = ~mark[self.pool[0]]
            self.pool = tuple(a[keep] for a in self.pool)  # type: ignore[assignment]
        self.forget(uids.tolist())
        if s.n > 1024 and s.n > 2 * int(s.col("live").sum()):
            s.keep(s.col("live").copy())
        return fids

    # ---- slots --------------------------------------------------------------------------
    def add(self, infos: list[tuple[int, OpInfo]], flow_ids: FlowIds) -> np.ndarray:
        """Append the slots of newly associated operators; returns their flow ids."""
        if not infos:
            return _EMPTY
        # operators of one shape share their flow list (streaming._info): its ids are
        # looked up once per call, and the slots are built with array passes, not per pair
        memo: dict[int, np.ndarray] = {}
        parts = []
        for _, info in infos:
            fids = memo.get(id(info.flows))
            if fids is None:
                fids = memo[id(info.flows)] = flow_ids(info.flows)
            parts.append(fids)
        fids = np.concatenate(parts)
        if fids.size == 0:
            return _EMPTY
        per = np.array([len(info.flows) for _, info in infos], np.int64)
        s = self.s
        sl = s.grow(fids.size)
        s.fid[sl] = fids
        s.uid[sl] = np.repeat(np.array([uid for uid, _ in infos], np.int64), per)
        s.need[sl] = [e for _, info in infos for e in info.expected]
        s.seq[sl] = np.repeat(np.array([info.event.seq for _, info in infos], np.int64), per)
        s.issue[sl] = np.repeat(np.array([NO_TIME if info.event.t_host_ns is None else info.event.t_host_ns
                                          for _, info in infos], np.int64), per)
        s.steps[sl] = [info.steps_on(e) for _, info in infos for e in info.expected]
        s.live[sl] = True
        for (uid, _), n in zip(infos, per.tolist(), strict=True):
            self._total[uid] += n
        return fids

    def rebuild(self, ops: dict[OpKey, OpEvent], info_of: Callable[[OpEvent], OpInfo | None],
                senders: set[tuple[str, int]], flow_ids: FlowIds) -> None:
        """Re-associate every pending operator (a comm/flow binding changed), keeping the
        results of the slots that flows already closed. An operator that is no operator
        on its rank any more (e.g. a Recv of a rank that sends) is deleted from ``ops``."""
        old = self.s
        done = old.col("live") & old.col("closed")
        kept = {(int(u), int(fi)): i for i, (u, fi) in
                enumerate(zip(old.col("uid")[done].tolist(), old.col("fid")[done].tolist(), strict=True))}
        old_rows = {name: old.col(name)[done].copy() for name in _RESULTS}
        self.s = Columns(SLOT_SPEC)
        infos = []
        live_uids: set[int] = set()
        for key in sorted(ops):
            op = ops[key]
            info = info_of(op)
            if info is None:
                if (op.comm_id, op.rank) in senders:
                    del ops[key]
                    uid = self.uid.get(key)
                    if uid is not None:
                        self.forget([uid])
                continue
            uid = self.uid.get(key)
            if uid is None:
                uid = self.new_uid(key)
            self._total[uid] = 0
            self._closed[uid] = 0
            self.info[uid] = info
            infos.append((uid, info))
            live_uids.add(uid)
        for uid in [u for u in self.ukey if u not in live_uids]:
            self.forget([uid])
        self.add(infos, flow_ids)
        s = self.s
        if kept and s.n:
            pos = np.array([kept.get((u, fi), -1) for u, fi in
                            zip(s.col("uid").tolist(), s.col("fid").tolist(), strict=True)], np.int64)
            hit = pos >= 0
            s.closed[: s.n][hit] = True
            for name, col in old_rows.items():
                getattr(s, name)[: s.n][hit] = col[pos[hit]]
            np.add.at(self._closed, s.col("uid")[hit], 1)
        if self.pool[0].size:
            closed_keys = set(zip(s.col("uid")[s.col("closed")].tolist(), s.col("fid")[s.col("closed")].tolist(),
                                  strict=True))
            keep = np.array([(u, fi) in closed_keys for u, fi in
                             zip(self.pool[0].tolist(), self.pool[1].tolist(), strict=True)], bool)
            self.pool = tuple(a[keep] for a in self.pool)  # type: ignore[assignment]

    def close(self, cs: np.ndarray, start: np.ndarray, end: np.ndarray, vol: np.ndarray, status: np.ndarray,
              grant: np.ndarray) -> np.ndarray:
        """Keep the kernel's results of the slots ``cs`` it closed; returns their uids."""
        s = self.s
        s.closed[cs] = True
        s.start[cs] = start
        s.end[cs] = end
        s.vol[cs] = vol
        s.status[cs] = status
        s.grant[cs] = grant
        cuid = s.uid[cs]
        np.add.at(self._closed, cuid, 1)
        return cuid

    def pool_epochs(self, uids: np.ndarray, fids: np.ndarray, epochs: np.ndarray, tx: np.ndarray) -> None:
        add = (uids, fids, epochs, tx)
        self.pool = tuple(np.concatenate((p, q)) for p, q in zip(self.pool, add, strict=True))  # type: ignore[assignment]

    def complete(self, cuid: np.ndarray) -> np.ndarray:
        """Of the operators ``cuid``, those whose every slot is closed."""
        touched = np.unique(cuid)
        done = touched[self._closed[touched] >= self._total[touched]]
        return done[self._total[done] > 0]

    # ---- emitting -----------------------------------------------------------------------
    def emit(self, uids: np.ndarray, clock: NicClock) -> tuple[list[OpMetrics], list[OpKey]]:
        """Metrics of the complete operators ``uids`` (in key order), which are then
        forgotten; and their keys."""
        s = self.s
        order = sorted(uids.tolist(), key=lambda u: self.ukey[u])
        uids = np.array(order, np.int64)
        ix = np.full(int(uids.max()) + 1, -1, np.int64)
        ix[uids] = np.arange(uids.size)
        n = uids.size
        big = np.int64(1) << 62
        pu, _, pe, pb = self.pool
        start, end, vol, grant, bad, act, peak = reduce_slots(
            ix, s.col("uid"), s.col("live"), s.col("closed"), s.col("start"), s.col("end"), s.col("vol"),
            s.col("grant"), s.col("status"), pu, pe, pb, n, COMPLETE)
        if act is None or peak is None:
            inp = np.zeros(pu.size, bool)
            inp[pu < ix.size] = ix[pu[pu < ix.size]] >= 0
            act = _metrics.union_count(ix[pu[inp]], pe[inp], n)
            peak = _metrics.epoch_peaks(ix[pu[inp]], pe[inp], pb[inp], n)
        # Python ints from here: numpy scalar arithmetic per record cost more than the record
        start_l, end_l, vol_l, bad_l, act_l, grant_l, peak_l = (a.tolist() for a in (start, end, vol, bad, act,
                                                                                   grant, peak))
        infos = [self.info[uid] for uid in order]
        out = _metrics.build_many(infos, clock,
                                  [x if x != big else -1 for x in start_l], end_l, vol_l, [b == 0 for b in bad_l],
                                  act_l, [x if x != big else -1 for x in grant_l],
                                  self._peer_figures(uids, infos, start_l, int(clock.epoch_ns)), peak_l)
        ukey = self.ukey
        keys = [ukey[uid] for uid in order]
        self.drop(uids)
        return out, keys

    def _peer_figures(self, uids: np.ndarray, infos: list[OpInfo], first: list[int],
                      epoch: int) -> list[_metrics.PeerFigures | None] | None:
        """Per-peer figures of the grouped P2P operators among ``uids`` (their slots sit in
        the table in the order of their info's flows: ``add`` appends them so and compaction
        keeps the order). A stalled one's too: which peers it finished with tells a NIC that
        worked with third parties from the one that stopped."""
        want = [k for k, info in enumerate(infos) if info.flow_peers is not None]
        if not want:
            return None
        s = self.s
        mark = np.zeros(self.next_uid + 1, bool)
        mark[uids[want]] = True
        uid_col = s.col("uid")
        rows = np.flatnonzero(s.col("live") & mark[uid_col])
        rows = rows[np.argsort(uid_col[rows], kind="stable")]
        ru = uid_col[rows]
        out: list[_metrics.PeerFigures | None] = [None] * len(infos)
        start, end, vol = s.col("start"), s.col("end"), s.col("vol")
        for k in want:
            u = int(uids[k])
            a, b = np.searchsorted(ru, u), np.searchsorted(ru, u, side="right")
            got = rows[a:b]
            out[k] = _metrics.peer_figures(infos[k], first[k], start[got], end[got], vol[got], epoch)
        return out
