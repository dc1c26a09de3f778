"""Per operator per rank metrics (``pulse.records.OpMetrics``) from its send flows' segments."""

from __future__ import annotations

import numpy as np
from pulse.segmentation.association import OpInfo
from pulse.segmentation.kernel import COMPLETE
from pulse.segmentation.rows import NicClock

from pulse.records import OpMetrics


def union_count(rank_op: np.ndarray, epochs: np.ndarray, n_ops: int) -> np.ndarray:
    """Per rank-op id, the number of distinct active epochs among (id, epoch) pairs."""
    if rank_op.size == 0:
        return np.zeros(n_ops, np.int64)
    lo = int(epochs.min())
    if int(epochs.max()) - lo < (1 << 40) and n_ops < (1 << 22):
        # one int64 key (id << 40 | epoch offset): a plain sort instead of a two-key lexsort
        key = np.sort((rank_op.astype(np.int64) << 40) | (epochs - lo))
        new = np.ones(key.size, bool)
        new[1:] = key[1:] != key[:-1]
        return np.bincount(key[new] >> 40, minlength=n_ops).astype(np.int64)
    order = np.lexsort((epochs, rank_op))
    r, e = rank_op[order], epochs[order]
    new = np.ones(r.size, bool)
    new[1:] = (r[1:] != r[:-1]) | (e[1:] != e[:-1])
    return np.bincount(r[new], minlength=n_ops).astype(np.int64)


def epoch_peaks(rank_op: np.ndarray, epochs: np.ndarray, tx: np.ndarray, n_ops: int) -> np.ndarray:
    """Per rank-op id, the most bytes its (id, epoch, tx bytes) rows moved in one epoch,
    summed over the rows of that epoch (its flows)."""
    peak = np.zeros(n_ops, np.int64)
    if rank_op.size == 0:
        return peak
    order = np.lexsort((epochs, rank_op))
    r, e, b = rank_op[order], epochs[order], tx[order].astype(np.int64)
    new = np.ones(r.size, bool)
    new[1:] = (r[1:] != r[:-1]) | (e[1:] != e[:-1])
    first = np.flatnonzero(new)
    np.maximum.at(peak, r[first], np.add.reduceat(b, first))
    return peak


def build(info: OpInfo, clock: NicClock, start: np.ndarray, end: np.ndarray, vol: np.ndarray,
          status: np.ndarray, act_epochs: int, grant: np.ndarray, peak: int = 0) -> OpMetrics:
    """``start``/``end`` (grid epochs, -1 = never started), ``vol``, ``status``, ``grant``
    (-1 = none) per flow of ``info.flows``; ``act_epochs`` = union of their active epochs,
    ``peak`` the most bytes they moved in one of them."""
    began = start >= 0
    first = int(start[began].min()) if began.any() else -1
    last = int(end[began].max()) if began.any() else -1
    granted = grant[grant >= 0]
    complete = bool(np.all(status == COMPLETE))
    return build_many([info], clock, [first], [last], [int(vol.sum())], [complete], [int(act_epochs)],
                      [int(granted.min()) if granted.size else -1],
                      [peer_figures(info, first, start, end, vol, int(clock.epoch_ns))],
                      [int(peak)])[0]


PeerFigures = tuple[list[int], list[int], list[int], list[int], list[int]]
"""(peer ranks, ns from the record's start to its last byte to each, bytes to each, bytes
declared for each, ns from the record's start to the start of its first byte's epoch to each)."""


def peer_figures(info: OpInfo, first: int, start: np.ndarray, end: np.ndarray, vol: np.ndarray,
                 epoch: int) -> PeerFigures | None:
    """Per peer of a grouped P2P record (``info.flow_peers``), from its flows' first and last
    active grid epochs ``start``/``end`` and bytes ``vol`` (aligned with ``info.flows``);
    None for other operators, or when a flow never started."""
    fp = info.flow_peers
    if (fp is None or len(fp) != end.size or first < 0 or end.size == 0 or int(end.min()) < first
            or int(start.min()) < first):
        return None
    peers, inv = np.unique(np.asarray(fp, np.int64), return_inverse=True)
    last = np.full(peers.size, first, np.int64)
    np.maximum.at(last, inv, end)
    begin = np.full(peers.size, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(begin, inv, start)
    # integer sums (float weights would round byte counts above 2^53)
    sent = np.zeros(peers.size, np.int64)
    np.add.at(sent, inv, vol.astype(np.int64))
    want = np.zeros(peers.size, np.int64)
    np.add.at(want, inv, np.asarray(info.expected, np.int64))
    return (peers.tolist(), ((last + 1 - first) * epoch).tolist(), sent.tolist(), want.tolist(),
            ((begin - first) * epoch).tolist())


def build_many(infos: list[OpInfo], clock: NicClock, first: list[int], last: list[int], volume: list[int],
               complete: list[bool], act_epochs: list[int], grant: list[int],
               peers: list[PeerFigures | None] | None = None, peak: list[int] | None = None) -> list[OpMetrics]:
    """Records of many operators from their reduced figures: first/last active grid epoch
    over the flows (``first`` -1 when none started), total bytes, whether every flow
    completed, the union of their active epochs, the earliest grant epoch (-1 none), the
    per-peer figures of grouped P2P and the most bytes moved in one active epoch (None or
    0: not measured) (Python ints and bools per argument: they go
    into the records as they are). Every
    value is computed here from validated inputs, so the records are built trusted (no
    per-field validation), and each record's fields are set as one dict (what
    ``OpMetrics.trusted`` does field by field cost a third of a record when thousands are
    emitted per second; tests check every field is set)."""
    epoch = int(clock.epoch_ns)
    phase = int(clock.phase_ns)
    # operators of one shape share their flow and byte lists (streaming._info): the
    # per-shape figures are worked out once per call
    shape: dict[tuple[int, int, int], tuple[int, int, list[str]]] = {}
    new = object.__new__
    setattr_ = object.__setattr__  # the record is frozen: its attributes are set once, here
    out = []
    for i, info in enumerate(infos):
        ev = info.event
        key = (id(info.flows), id(info.expected), info.nranks)
        st = shape.get(key)
        if st is None:
            st = shape[key] = (info.expected_bytes, len(info.flows), sorted({f[1] for f in info.flows}))
        f0 = first[i]
        if f0 >= 0:
            start_ns = f0 * epoch + phase
            end_ns = (last[i] + 1) * epoch + phase
        else:
            # Nothing sent: pin the empty interval at the host-side issue time.
            start_ns = end_ns = int(ev.t_host_ns or 0)
        act_ns = act_epochs[i] * epoch
        vol = volume[i]
        rate = vol / (act_ns * 1e-9) if act_ns > 0 else 0.0
        g = grant[i]
        pf = peers[i] if peers is not None else None
        pk = peak[i] if peak is not None and peak[i] > 0 else None
        rec = new(OpMetrics)
        setattr_(rec, "__dict__", {
            "job": ev.job, "node": ev.node, "comm_id": ev.comm_id, "seq": ev.seq, "rank": ev.rank, "kind": ev.kind,
            "nranks": info.nranks, "start_ns": start_ns, "end_ns": end_ns, "duration_ns": end_ns - start_ns,
            "act_ns": act_ns, "volume_bytes": vol, "expected_bytes": st[0], "complete": complete[i],
            "active_rate": min(rate, 1e15), "flows": st[1], "epoch_ns": epoch, "nics": list(st[2]),
            "group": ev.group, "t_host_ns": ev.t_host_ns, "granted_ns": g * epoch + phase if g >= 0 else None,
            "peer_ranks": pf[0] if pf else None, "peer_done_ns": pf[1] if pf else None,
            "peer_bytes": pf[2] if pf else None, "peer_expected_bytes": pf[3] if pf else None,
            "peer_start_ns": pf[4] if pf else None, "peak_epoch_bytes": pk})
        out.append(rec)
    return out


def sort_key(m: OpMetrics) -> tuple[str, str, int, int]:
    return (m.node, m.comm_id, m.rank, m.seq)
