"""The streaming segmenter's step bookkeeping around the segmentation kernel, in numba:
which operator slots the run segments (and in what order), and what the run consumed
(each flow's next operator, floor and buffered rows).

Both were a few dozen numpy calls per step on arrays of a few hundred entries: at one
step per node and 50 ms chunk, their fixed cost was more than the kernel's work.
Layers: ``_select_kernel`` / ``_trim_kernel`` (numba, arrays and scalars only) ->
``select_slots`` / ``trim_rows`` (drivers). tests/segmentation/test_seg_stepkern.py
compares them with numpy references.
"""

from __future__ import annotations

import numba
import numpy as np
from pulse.segmentation.kernel import TX_MASK


@numba.njit(cache=True, nogil=True)
def _candidate(i, s_fid, s_live, s_closed, s_seq, runpos, f_next, f_cr, front):  # pragma: no cover - numba
    if not s_live[i] or s_closed[i]:
        return -1
    f = s_fid[i]
    r = runpos[f]
    if r < 0 or s_seq[i] < f_next[f] or front.size == 0:
        return -1
    if s_seq[i] >= front[max(f_cr[f], 0)]:
        return -1
    return r


@numba.njit(cache=True, nogil=True)
def _select_kernel(s_fid, s_live, s_closed, s_seq, runpos, f_next, f_cr, front, n_run):  # pragma: no cover
    n = s_fid.size
    op_ptr = np.zeros(n_run + 1, np.int64)
    cand = np.empty(n, np.int64)
    for i in range(n):
        r = _candidate(i, s_fid, s_live, s_closed, s_seq, runpos, f_next, f_cr, front)
        cand[i] = r
        if r >= 0:
            op_ptr[r + 1] += 1
    for r in range(n_run):
        op_ptr[r + 1] += op_ptr[r]
    pos = op_ptr[:-1].copy()
    sidx = np.empty(op_ptr[n_run], np.int64)
    for i in range(n):
        r = cand[i]
        if r >= 0:
            sidx[pos[r]] = i
            pos[r] += 1
    # by seq within a flow: insertion sort (a flow's open slots are few and mostly in order)
    for r in range(n_run):
        a = op_ptr[r]
        for j in range(a + 1, op_ptr[r + 1]):
            x = sidx[j]
            k = j - 1
            while k >= a and s_seq[sidx[k]] > s_seq[x]:
                sidx[k + 1] = sidx[k]
                k -= 1
            sidx[k + 1] = x
    return sidx, op_ptr


def select_slots(s_fid: np.ndarray, s_live: np.ndarray, s_closed: np.ndarray, s_seq: np.ndarray,
                 runpos: np.ndarray, f_next: np.ndarray, f_cr: np.ndarray, front: np.ndarray, n_run: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The slots a run segments: live, not closed, on a run flow (``runpos`` >= 0), at or
    after the flow's next seq and below its (comm, rank)'s frontier (``front[max(cr, 0)]``).
    Returns their indices ordered by (run position, seq) and ``op_ptr`` cutting them per
    run flow."""
    return _select_kernel(s_fid, s_live, s_closed, s_seq, runpos, f_next, f_cr, front, np.int64(n_run))


@numba.njit(cache=True, nogil=True)
def _trim_kernel(fids, row_ptr, lo, consumed, carry, next_op, op_ptr, seqs, ep, sf, se, sb,
                 f_floor, f_next, f_nrows):  # pragma: no cover - numba
    n_run = fids.size
    dropped = 0
    changed = False
    for r in range(n_run):
        f = fids[r]
        k0 = op_ptr[r]
        k1 = op_ptr[r + 1]
        nx = next_op[r]
        if nx < k1:
            f_next[f] = seqs[nx]
        elif k1 > k0:
            f_next[f] = seqs[k1 - 1] + 1
        cc = consumed[r] - row_ptr[r]
        cn = row_ptr[r + 1] - row_ptr[r]
        if cc > 0:
            changed = True
            dropped += cc
            if cc < cn:
                f_floor[f] = ep[row_ptr[r] + cc]
            else:
                f_floor[f] = ep[row_ptr[r] + cn - 1] + 1
        if carry[r] >= 0 and cc < cn:
            changed = True
            f_floor[f] = se[lo[r] + cc]
    if not changed:
        return sf, se, sb
    m = sf.size - dropped
    of = np.empty(m, np.int64)
    oe = np.empty(m, np.int64)
    ob = np.empty(m, np.int64)
    # run flows are in id order, as the store: copy the rows between their consumed runs
    w = 0
    i = 0
    for r in range(n_run):
        cc = consumed[r] - row_ptr[r]
        cn = row_ptr[r + 1] - row_ptr[r]
        a = lo[r]
        while i < a:
            of[w] = sf[i]
            oe[w] = se[i]
            ob[w] = sb[i]
            w += 1
            i += 1
        if cc > 0:
            i = a + cc
            f_nrows[fids[r]] -= cc
        if carry[r] >= 0 and cc < cn:
            # the split crossing row keeps the carried tx bytes (and its rx bits)
            of[w] = sf[i]
            oe[w] = se[i]
            ob[w] = carry[r] | (sb[i] & ~TX_MASK)
            w += 1
            i += 1
    while i < sf.size:
        of[w] = sf[i]
        oe[w] = se[i]
        ob[w] = sb[i]
        w += 1
        i += 1
    return of, oe, ob


def trim_rows(fids: np.ndarray, row_ptr: np.ndarray, lo: np.ndarray, consumed: np.ndarray, carry: np.ndarray,
              next_op: np.ndarray, op_ptr: np.ndarray, seqs: np.ndarray, ep: np.ndarray,
              store: tuple[np.ndarray, np.ndarray, np.ndarray], f_floor: np.ndarray, f_next: np.ndarray,
              f_nrows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """After a kernel run over the run flows ``fids`` (ascending; flow ``r``'s rows are
    ``ep[row_ptr[r]:row_ptr[r+1]]``, at ``lo[r]`` in the store): set each flow's next seq
    (its first open slot's, else one past its last slot's), drop the rows it consumed, put
    the carried bytes on its split crossing row, move its floor to its first row kept (one
    past its last row if none), and count its rows. Returns the store (the same arrays
    when nothing changed)."""
    sf, se, sb = store
    return _trim_kernel(fids, row_ptr, lo, consumed, carry, next_op, op_ptr, seqs, ep, sf, se, sb, f_floor,
                        f_next, f_nrows)


@numba.njit(cache=True, nogil=True)
def _reduce_kernel(ix, s_uid, s_live, s_closed, s_start, s_end, s_vol, s_grant, s_status, pu, pe, pb, n,
                   complete):  # pragma: no cover - numba
    big = np.int64(1) << 62
    start = np.full(n, big, np.int64)
    end = np.full(n, -big, np.int64)
    vol = np.zeros(n, np.int64)
    grant = np.full(n, big, np.int64)
    bad = np.zeros(n, np.int64)
    for i in range(s_uid.size):
        u = s_uid[i]
        if not (s_live[i] and s_closed[i]) or u >= ix.size or ix[u] < 0:
            continue
        k = ix[u]
        if s_start[i] >= 0:
            start[k] = min(start[k], s_start[i])
            end[k] = max(end[k], s_end[i])
        vol[k] += s_vol[i]
        if s_grant[i] >= 0:
            grant[k] = min(grant[k], s_grant[i])
        if s_status[i] != complete:
            bad[k] += 1
    # ACT: distinct (operator, epoch) pairs among its closed slots' pooled active epochs
    m = 0
    emin = big
    emax = -big
    for j in range(pu.size):
        u = pu[j]
        if u < ix.size and ix[u] >= 0:
            m += 1
            emin = min(emin, pe[j])
            emax = max(emax, pe[j])
    act = np.zeros(n, np.int64)
    peak = np.zeros(n, np.int64)
    if m == 0:
        return start, end, vol, grant, bad, act, peak, True
    if emax - emin >= (np.int64(1) << 40) or n >= (np.int64(1) << 22):
        return start, end, vol, grant, bad, act, peak, False
    keys = np.empty(m, np.int64)
    tx = np.empty(m, np.int64)
    w = 0
    for j in range(pu.size):
        u = pu[j]
        if u < ix.size and ix[u] >= 0:
            keys[w] = (ix[u] << 40) | (pe[j] - emin)
            tx[w] = pb[j]
            w += 1
    order = np.argsort(keys)
    # ACT: distinct (operator, epoch) pairs; peak: the largest per-pair byte sum
    run = np.int64(0)
    for j in range(m):
        key = keys[order[j]]
        if j > 0 and key != keys[order[j - 1]]:
            k = keys[order[j - 1]] >> 40
            peak[k] = max(peak[k], run)
            run = np.int64(0)
        if j == 0 or key != keys[order[j - 1]]:
            act[key >> 40] += 1
        run += tx[order[j]]
    k = keys[order[m - 1]] >> 40
    peak[k] = max(peak[k], run)
    return start, end, vol, grant, bad, act, peak, True


def reduce_slots(ix: np.ndarray, s_uid: np.ndarray, s_live: np.ndarray, s_closed: np.ndarray, s_start: np.ndarray,
                 s_end: np.ndarray, s_vol: np.ndarray, s_grant: np.ndarray, s_status: np.ndarray, pu: np.ndarray,
                 pe: np.ndarray, pb: np.ndarray, n: int, complete: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                            np.ndarray | None]:
    """Per operator ``k`` (the live closed slots whose uid ``u`` has ``ix[u] == k``): first
    start and last end over its slots that started (2^62 / -2^62 when none), bytes, first
    grant (2^62 when none), slots not complete, the distinct pooled active epochs and the
    most bytes pooled in one of them (``pu``/``pe``/``pb``: uid, epoch, tx bytes) - or None
    for the last two when epochs span 2^40 (the caller counts them with
    ``metrics.union_count`` and ``metrics.epoch_peaks``)."""
    start, end, vol, grant, bad, act, peak, ok = _reduce_kernel(
        ix, s_uid, s_live, s_closed, s_start, s_end, s_vol, s_grant, s_status, pu, pe, pb, np.int64(n),
        np.int8(complete))
    return start, end, vol, grant, bad, (act if ok else None), (peak if ok else None)
