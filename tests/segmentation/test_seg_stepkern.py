"""The step bookkeeping kernels (segmentation/stepkern.py) against numpy references (the
array passes they replaced), on random slot tables, flows and kernel outcomes."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.segmentation.gather import gather
from pulse.segmentation.kernel import TX_MASK
from pulse.segmentation.metrics import epoch_peaks, union_count
from pulse.segmentation.stepkern import reduce_slots, select_slots, trim_rows


def select_ref(s_fid, s_live, s_closed, s_seq, runpos, f_next, f_cr, front, n_run):
    rp = runpos[s_fid]
    cand = s_live & ~s_closed & (rp >= 0)
    cand &= s_seq >= f_next[s_fid]
    cand &= s_seq < front[np.maximum(f_cr[s_fid], 0)]
    sidx = np.flatnonzero(cand)
    sidx = sidx[np.lexsort((s_seq[sidx], rp[sidx]))]
    op_ptr = np.zeros(n_run + 1, np.int64)
    np.cumsum(np.bincount(rp[sidx], minlength=n_run), out=op_ptr[1:])
    return sidx, op_ptr


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_select_slots_equals_reference(data):
    n_flows = data.draw(st.integers(1, 8))
    n_slots = data.draw(st.integers(0, 30))
    run = np.array(data.draw(st.lists(st.booleans(), min_size=n_flows, max_size=n_flows)))
    runpos = np.full(n_flows, -1, np.int64)
    runpos[run] = np.arange(int(run.sum()))
    ints = st.lists(st.integers(0, 9), min_size=n_slots, max_size=n_slots)
    s_fid = np.array(data.draw(st.lists(st.integers(0, n_flows - 1), min_size=n_slots, max_size=n_slots)), np.int64)
    s_seq = np.array(data.draw(ints), np.int64)
    s_live = np.array(data.draw(st.lists(st.booleans(), min_size=n_slots, max_size=n_slots)), bool)
    s_closed = np.array(data.draw(st.lists(st.booleans(), min_size=n_slots, max_size=n_slots)), bool)
    f_next = np.array(data.draw(st.lists(st.integers(0, 5), min_size=n_flows, max_size=n_flows)), np.int64)
    f_cr = np.array(data.draw(st.lists(st.integers(-1, 2), min_size=n_flows, max_size=n_flows)), np.int64)
    front = np.array(data.draw(st.lists(st.integers(0, 12), min_size=3, max_size=3)), np.int64)
    want = select_ref(s_fid, s_live, s_closed, s_seq, runpos, f_next, f_cr, front, int(run.sum()))
    got = select_slots(s_fid, s_live, s_closed, s_seq, runpos, f_next, f_cr, front, int(run.sum()))
    assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def trim_ref(fids, row_ptr, lo, consumed, carry, next_op, op_ptr, seqs, ep, store, floor, nxt, nrows):
    """The numpy passes streaming._step did before (store trimmed with set_store's recount)."""
    k0, k1 = op_ptr[:-1], op_ptr[1:]
    has_open = next_op < k1
    if seqs.size:
        nseq = np.where(has_open, seqs[np.minimum(next_op, seqs.size - 1)], seqs[np.maximum(k1 - 1, 0)] + 1)
        upd = has_open | (k1 > k0)
        nxt[fids[upd]] = nseq[upd]
    sf, se, sb = store
    counts = np.diff(row_ptr)
    cc = consumed - row_ptr[:-1]
    ch = cc > 0
    rest = cc < counts
    cy = (carry >= 0) & rest
    if ch.any() or cy.any():
        floor[fids[ch & rest]] = ep[row_ptr[:-1][ch & rest] + cc[ch & rest]]
        alld = ch & ~rest
        floor[fids[alld]] = ep[row_ptr[:-1][alld] + counts[alld] - 1] + 1
        if cy.any():
            sb = sb.copy()
            at = lo[cy] + cc[cy]
            sb[at] = carry[cy] | (sb[at] & ~TX_MASK)
            floor[fids[cy]] = se[at]
        if ch.any():
            drop = np.zeros(sf.size, bool)
            drop[gather(lo[ch], cc[ch])] = True
            sf, se, sb = sf[~drop], se[~drop], sb[~drop]
        nrows[fids[ch | cy]] = 0
        if sf.size:
            u, c = np.unique(sf, return_counts=True)
            nrows[u] = c
    return sf, se, sb


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_trim_rows_equals_reference(data):
    n_flows = data.draw(st.integers(1, 7))
    rows = data.draw(st.lists(st.integers(0, 5), min_size=n_flows, max_size=n_flows))  # rows per flow
    sf = np.repeat(np.arange(n_flows, dtype=np.int64), rows)
    se = np.concatenate([np.cumsum(1 + np.arange(r, dtype=np.int64)) for r in rows] or [np.zeros(0, np.int64)])
    sb = np.array(data.draw(st.lists(st.integers(1, 1 << 45), min_size=sf.size, max_size=sf.size)), np.int64)
    run = data.draw(st.lists(st.booleans(), min_size=n_flows, max_size=n_flows))
    fids = np.flatnonzero(run).astype(np.int64)
    counts = np.array(rows, np.int64)[fids]
    row_ptr = np.zeros(fids.size + 1, np.int64)
    np.cumsum(counts, out=row_ptr[1:])
    lo = np.searchsorted(sf, fids)
    ep = se[gather(lo, counts)]
    consumed = row_ptr[:-1] + np.array([data.draw(st.integers(0, int(c))) for c in counts], np.int64)
    carry = np.array([data.draw(st.sampled_from([-1, 0, 77, 1 << 30])) for _ in fids], np.int64)
    carry[consumed - row_ptr[:-1] >= counts] = -1  # the kernel carries only into a row kept
    slots = [data.draw(st.integers(0, 3)) for _ in fids]
    op_ptr = np.zeros(fids.size + 1, np.int64)
    np.cumsum(slots, out=op_ptr[1:])
    seqs = np.concatenate([np.sort(np.array(data.draw(st.lists(st.integers(0, 50), min_size=k, max_size=k,
                                                               unique=True)), np.int64)) for k in slots]
                          or [np.zeros(0, np.int64)]).astype(np.int64)
    next_op = np.array([op_ptr[i] + data.draw(st.integers(0, slots[i])) for i in range(fids.size)], np.int64)
    state = [np.full(n_flows, -9, np.int64), np.full(n_flows, -9, np.int64), np.array(rows, np.int64)]
    want_state = [a.copy() for a in state]
    want = trim_ref(fids, row_ptr, lo, consumed, carry, next_op, op_ptr, seqs, ep, (sf, se, sb), *want_state)
    got = trim_rows(fids, row_ptr, lo, consumed, carry, next_op, op_ptr, seqs, ep, (sf, se, sb), *state)
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
    assert [a.tolist() for a in state] == [a.tolist() for a in want_state]


def peaks_ref(ids, epochs, tx, n):
    """Per id, the largest byte sum over its rows of one epoch (a dict, one row at a time)."""
    sums: dict[tuple[int, int], int] = {}
    for i, e, b in zip(ids.tolist(), epochs.tolist(), tx.tolist(), strict=True):
        sums[(i, e)] = sums.get((i, e), 0) + b
    out = [0] * n
    for (i, _e), b in sums.items():
        out[i] = max(out[i], b)
    return np.array(out, np.int64)


def reduce_ref(ix, s_uid, s_live, s_closed, s_start, s_end, s_vol, s_grant, s_status, pu, pe, pb, n, complete):
    """The numpy passes slots.emit made before (np.*.at and union_count), and the peaks."""
    mine = s_live & s_closed
    mine &= ix[np.minimum(s_uid, ix.size - 1)] >= 0
    mine &= s_uid < ix.size
    rows = np.flatnonzero(mine)
    g = ix[s_uid[rows]]
    began = s_start[rows] >= 0
    big = np.int64(1) << 62
    start = np.full(n, big, np.int64)
    np.minimum.at(start, g[began], s_start[rows][began])
    end = np.full(n, -big, np.int64)
    np.maximum.at(end, g[began], s_end[rows][began])
    vol = np.zeros(n, np.int64)
    np.add.at(vol, g, s_vol[rows])
    grant = np.full(n, big, np.int64)
    granted = s_grant[rows] >= 0
    np.minimum.at(grant, g[granted], s_grant[rows][granted])
    bad = np.zeros(n, np.int64)
    np.add.at(bad, g, (s_status[rows] != complete).astype(np.int64))
    inp = np.zeros(pu.size, bool)
    inp[pu < ix.size] = ix[pu[pu < ix.size]] >= 0
    act = union_count(ix[pu[inp]], pe[inp], n)
    return start, end, vol, grant, bad, act, peaks_ref(ix[pu[inp]], pe[inp], pb[inp], n)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_reduce_slots_equals_reference(data):
    n_uid = data.draw(st.integers(1, 8))
    chosen = data.draw(st.lists(st.integers(0, n_uid - 1), min_size=1, max_size=n_uid, unique=True))
    ix = np.full(max(chosen) + 1, -1, np.int64)
    ix[chosen] = np.arange(len(chosen))
    k = data.draw(st.integers(0, 25))

    def col(strat):
        return data.draw(st.lists(strat, min_size=k, max_size=k))

    s_uid = np.array(col(st.integers(0, n_uid + 1)), np.int64)  # some beyond ix
    s_live, s_closed = np.array(col(st.booleans()), bool), np.array(col(st.booleans()), bool)
    s_start = np.array(col(st.integers(-1, 30)), np.int64)
    s_end = s_start + np.array(col(st.integers(0, 9)), np.int64)
    s_vol, s_grant = np.array(col(st.integers(0, 1000)), np.int64), np.array(col(st.integers(-1, 30)), np.int64)
    s_status = np.array(col(st.integers(0, 2)), np.int8)
    p = data.draw(st.integers(0, 30))
    pu = np.array(data.draw(st.lists(st.integers(0, n_uid + 1), min_size=p, max_size=p)), np.int64)
    far = data.draw(st.booleans())  # epochs spanning 2^41: the caller's union_count fallback
    pe = np.array(data.draw(st.lists(st.sampled_from([0, 1, 5, 9, (1 << 41) if far else 3]), min_size=p,
                                     max_size=p)), np.int64)
    pb = np.array(data.draw(st.lists(st.integers(1, 1 << 40), min_size=p, max_size=p)), np.int64)
    args = (ix, s_uid, s_live, s_closed, s_start, s_end, s_vol, s_grant, s_status, pu, pe, pb, len(chosen), 1)
    want = reduce_ref(*args)
    got = list(reduce_slots(*args))
    if got[5] is None:
        assert got[6] is None
        inp = (pu < ix.size) & (ix[np.minimum(pu, ix.size - 1)] >= 0)
        got[5] = union_count(ix[pu[inp]], pe[inp], len(chosen))
        got[6] = epoch_peaks(ix[pu[inp]], pe[inp], pb[inp], len(chosen))
    assert [a.tolist() for a in got] == [a.tolist() for a in want]
