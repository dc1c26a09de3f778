"""The streaming segmenter's flows and their buffered rows.

Flows get integer ids with per-flow state columns (NIC, (comm, rank), binding state,
next operator, the first epoch not yet segmented, ...), and the node's buffered rows (all
its NICs: flow ids are the node's) live in one (flow id, epoch)-sorted store
(:mod:`pulse.segmentation.rowstore`): a chunk's batches are merged in with one linear
pass, and a segmentation step reads and trims it with array passes over the node's rows,
not one set per NIC. Rows wait there
for the op descriptors that explain them or for an open operator to close; every cap
(rows per flow, unbound flows) evicts the oldest and counts it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from pulse.segmentation.association import FlowKey
from pulse.segmentation.columns import Columns
from pulse.segmentation.ingest import OK, ingest_batches
from pulse.segmentation.params import SegmentParams
from pulse.segmentation.rows import merge_sorted
from pulse.segmentation.rowstore import merge_rows
from pulse.segmentation.streamstats import StreamStats

from pulse.samples import EpochBatch

_EMPTY = np.zeros(0, np.int64)
LOW = -(1 << 62)
UNBOUND, SEND, RECV = 0, 1, 2
FLOW_SPEC: dict[str, tuple[type, int]] = {
    "nic": (np.int64, -1), "cr": (np.int64, -1), "state": (np.int8, UNBOUND),
    "next": (np.int64, 0), "floor": (np.int64, LOW), "dirty": (np.bool_, True),
    "wm_seen": (np.int64, LOW), "has": (np.bool_, False), "nrows": (np.int64, 0),
    "grant": (np.int64, -1), "cep": (np.int64, LOW), "cfull": (np.int64, 0)}
"""Per flow; ``cep``/``cfull``: the grid epoch of the split crossing row the store holds
with only the carried bytes (the next operator's share), and that row's whole tx bytes."""

Rows = tuple[np.ndarray, np.ndarray, np.ndarray]
"""(flow id or number, grid epoch, packed bytes), int64."""


class FlowTable:
    def __init__(self, node: str, params: SegmentParams, stats: StreamStats,
                 state_of: Callable[[FlowKey], tuple[int, int]]) -> None:
        self.node = node
        self.params = params
        self.stats = stats
        self._state_of = state_of
        """Flow key -> (UNBOUND | SEND | RECV, (comm, rank) index or -1), from its binding."""
        self.fid: dict[FlowKey, int] = {}
        self.keys: list[FlowKey] = []
        self.f = Columns(FLOW_SPEC)
        # NICs by index: name, flow number -> flow id (sorted)
        self._nic_ix: dict[str, int] = {}
        self.nic_names: list[str] = []
        self._nic_nums: list[np.ndarray] = []
        self._nic_ids: list[np.ndarray] = []
        self._lookup: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        """Every NIC's nums and ids concatenated, with NIC offsets (the ingest kernel's form)."""
        self.store: Rows = (_EMPTY, _EMPTY, _EMPTY)
        """The node's buffered rows, sorted by (flow id, epoch)."""

    def nic_index(self, nic: str) -> int:
        ix = self._nic_ix.get(nic)
        if ix is None:
            ix = self._nic_ix[nic] = len(self.nic_names)
            self.nic_names.append(nic)
            self._nic_nums.append(_EMPTY)
            self._nic_ids.append(_EMPTY)
            self._lookup = None
        return ix

    def ids(self, keys: list[FlowKey]) -> np.ndarray:
        """Ids of flows, registering new ones."""
        out = np.empty(len(keys), np.int64)
        new_by_nic: dict[int, list[int]] = {}
        for i, key in enumerate(keys):
            fid = self.fid.get(key)
            if fid is None:
                fid = self.fid[key] = len(self.keys)
                self.keys.append(key)
                s = self.f.grow(1)
                nix = self.nic_index(key[1])
                self.f.nic[s] = nix
                self.f.state[s], self.f.cr[s] = self._state_of(key)
                new_by_nic.setdefault(nix, []).append(fid)
            out[i] = fid
        for nix, fids in new_by_nic.items():
            nums = np.concatenate((self._nic_nums[nix], [self.keys[f][2] for f in fids])).astype(np.int64)
            ids = np.concatenate((self._nic_ids[nix], fids)).astype(np.int64)
            order = np.argsort(nums, kind="stable")
            self._nic_nums[nix], self._nic_ids[nix] = nums[order], ids[order]
            self._lookup = None
        return out

    def refresh_states(self) -> None:
        """Re-read every flow's binding (after a comm/flow event changed them)."""
        f = self.f
        for key, fid in self.fid.items():
            f.state[fid], f.cr[fid] = self._state_of(key)

    def buffered_rows(self) -> dict[FlowKey, int]:
        """Rows buffered per flow (flows with none left out)."""
        n = self.f.col("nrows")
        return {self.keys[i]: int(n[i]) for i in np.flatnonzero(n).tolist()}

    def ingest_fast(self, per_nic: list[tuple[str, list[EpochBatch]]], burst_rx: int) -> tuple[int, dict[str, int]] | None:
        """Each NIC's consecutive batches, all in one kernel pass (:mod:`.ingest`); returns
        (rows kept, last grid epoch per NIC, LOW for none), or None, having changed
        nothing, when they need the general path (a flow not known or not bound yet)."""
        ixs = [(self.nic_index(name), batches) for name, batches in per_nic]
        if self._lookup is None:
            ptr = np.zeros(len(self._nic_nums) + 1, np.int64)
            np.cumsum([a.size for a in self._nic_nums], out=ptr[1:])
            self._lookup = (np.concatenate([_EMPTY, *self._nic_nums]), np.concatenate([_EMPTY, *self._nic_ids]), ptr)
        nums, ids, ptr = self._lookup
        fl = self.f
        status, store, kept, late, most, nic_emax = ingest_batches(
            ixs, burst_rx, nums, ids, ptr, fl.state, fl.floor, fl.has, fl.dirty, fl.nrows, self.store)
        if status != OK:
            return None
        self.stats.late_rows += late
        if most > self.params.max_buffered_rows:
            touched = np.unique(store[0])
            self.set_store(self._evict(*store), touched)
        elif most >= 0:
            self.store = store
        return kept, {name: int(nic_emax[nix]) for (name, _), (nix, _) in zip(per_nic, ixs, strict=True)}

    def _evict(self, sf: np.ndarray, se: np.ndarray, sb: np.ndarray) -> Rows:
        """The oldest rows of a flow over ``max_buffered_rows`` go (counted): its earlier
        epochs are final."""
        fl = self.f
        cap = self.params.max_buffered_rows
        cnt = np.bincount(sf - int(sf[0]), minlength=0) if sf.size else _EMPTY
        if not (cnt.size and cnt.max() > cap):
            return sf, se, sb
        starts = np.cumsum(cnt) - cnt
        rank = np.arange(sf.size) - np.repeat(starts, cnt)
        over = np.repeat(np.maximum(cnt - cap, 0), cnt)
        drop = rank < over
        self.stats.evicted_rows += int(drop.sum())
        full = np.flatnonzero(cnt > cap)
        fl.floor[full + int(sf[0])] = se[starts[full] + cnt[full] - cap]
        return sf[~drop], se[~drop], sb[~drop]

    def ingest(self, nic_name: str, f: np.ndarray, e: np.ndarray, t: np.ndarray, *,
               bound_only: bool = False) -> bool:
        """Buffer rows (flow number, grid epoch, bytes) of one NIC. With ``bound_only``,
        returns False without buffering anything if some flow has no binding yet."""
        nix = self.nic_index(nic_name)
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
            self.ids([(self.node, nic_name, int(x)) for x in nums[~hit].tolist()])
            known = self._nic_nums[nix]
            pos = np.searchsorted(known, nums)
        fids = self._nic_ids[nix][pos]
        fl = self.f
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
        self.set_store(self._evict(*merge_rows(self.store, (row_fid, e, t))), touched)
        return True

    def set_store(self, store: Rows, touched: np.ndarray) -> None:
        """Replace the store; ``touched``: flows whose row count may have changed."""
        self.store = store
        fl = self.f
        fl.nrows[touched] = 0
        sf = store[0]
        if sf.size:
            first = np.ones(sf.size, bool)
            first[1:] = sf[1:] != sf[:-1]
            starts = np.flatnonzero(first)
            fl.nrows[sf[starts]] = np.diff(np.append(starts, sf.size))

    def drop_rows(self, fids: np.ndarray) -> None:
        sf, se, sb = self.store
        if sf.size:
            keep = ~np.isin(sf, fids)
            self.set_store((sf[keep], se[keep], sb[keep]), fids)
