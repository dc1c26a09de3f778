"""A node's epoch batches (all its NICs) into its row store in one numba pass (the
streaming fast path).

What :func:`pulse.segmentation.rows.nic_rows` + :meth:`FlowTable.ingest` do with a dozen
numpy calls per batch and per NIC (keep the rows with data, put them on the grid, map flow
numbers to flow ids, drop recv flows' rows and rows older than the flow's floor, sort by
(flow id, epoch), merge into the store, recount rows per flow), done in one kernel call
per node and chunk: at 50 ms chunks the calls' fixed cost, not the rows, was most of the
segmentation (one call per NIC was 8 per node).

It covers the common case only and says so (``SLOW``) *before* changing anything: a flow
it does not know yet or that has no binding, ranges that do not fit its sort key. The
caller then takes the general path, which gives the same store.
Layers: ``_ingest_kernel`` (numba) -> ``ingest_batches`` (driver).
"""

from __future__ import annotations

import numba
import numpy as np
from pulse.segmentation.kernel import RX_CAP, RX_SHIFT
from pulse.segmentation.rows import concat_batches
from pulse.segmentation.rowstore import _merge_kernel

from pulse.samples import EpochBatch

OK, SLOW = 0, 1
UNBOUND, SEND = 0, 1  # flows.py's binding states


@numba.njit(cache=True, nogil=True)
def _ingest_kernel(flow, epoch, tx, rx, has_rx, bounds, base, bnic, burst_rx,  # pragma: no cover - numba
                   nums, ids, nic_ptr, state, floor, has, dirty, nrows, sf, se, sb):
    # batch b is of NIC bnic[b]; that NIC's flow numbers -> ids are nums/ids[nic_ptr[n]:nic_ptr[n+1]]
    n = flow.size
    rf = np.empty(n, np.int64)
    re = np.empty(n, np.int64)
    rb = np.empty(n, np.int64)
    k = 0
    emin = np.int64(1) << 62
    low = -(np.int64(1) << 62)
    emax = low
    nic_emax = np.full(nic_ptr.size - 1, low, np.int64)
    for b in range(bounds.size - 1):
        nx = bnic[b]
        n0 = nic_ptr[nx]
        n1 = nic_ptr[nx + 1]
        for i in range(bounds[b], bounds[b + 1]):
            t = np.int64(tx[i])
            r = np.int64(rx[i]) if has_rx else np.int64(0)
            if t <= 0 and not (burst_rx > 0 and r >= burst_rx):
                continue
            num = np.int64(flow[i])
            p = n0 + np.searchsorted(nums[n0:n1], num)
            if p >= n1 or nums[p] != num:
                return SLOW, rf[:0], re[:0], rb[:0], 0, 0, 0, nic_emax
            fid = ids[p]
            if state[fid] == UNBOUND:
                return SLOW, rf[:0], re[:0], rb[:0], 0, 0, 0, nic_emax
            e = np.int64(epoch[i]) + base[b]
            rf[k] = fid
            re[k] = e
            rb[k] = t | (min(r, RX_CAP) << RX_SHIFT) if burst_rx > 0 else t
            emin = min(emin, e)
            emax = max(emax, e)
            nic_emax[nx] = max(nic_emax[nx], e)
            k += 1
    if k and (emax - emin >= (np.int64(1) << 31) or ids.size >= (np.int64(1) << 31)):
        return SLOW, rf[:0], re[:0], rb[:0], 0, 0, 0, nic_emax
    # from here on the store and the flow state change
    kept = k
    late = 0
    lk = np.empty(k, np.int64)
    m = 0
    ordered = True
    for j in range(k):
        fid = rf[j]
        if state[fid] != SEND:
            continue  # recv flows only corroborate: their rows are not kept
        has[fid] = True
        dirty[fid] = True
        if re[j] < floor[fid]:
            lk[late] = fid * (emax - emin + 1) + (re[j] - emin)
            late += 1
            continue
        if m and (fid < rf[m - 1] or (fid == rf[m - 1] and re[j] <= re[m - 1])):
            ordered = False
        rf[m] = fid
        re[m] = re[j]
        rb[m] = rb[j]
        m += 1
    if late > 1:
        # counted as the general path counts them: a row repeated by overlapping windows once
        late = np.unique(lk[:late]).size
    if m == 0:
        return OK, sf, se, sb, kept, late, -1, nic_emax
    af, ae, ab = rf[:m], re[:m], rb[:m]
    if not ordered:
        # each batch is sorted by (flow number, epoch), not by flow id, and a node's NICs
        # follow one another. A stable counting sort by flow id (ids are small and dense)
        # keeps each flow's rows in arrival order - its NIC's batches in turn, so by epoch
        # unless windows overlapped; then a stable sort of one key. Either way duplicates
        # (overlapping windows) end up adjacent, then they add up.
        cnt = np.zeros(state.size + 1, np.int64)
        for j in range(m):
            cnt[af[j] + 1] += 1
        for f in range(state.size):
            cnt[f + 1] += cnt[f]
        tf = np.empty(m, np.int64)
        te = np.empty(m, np.int64)
        tb = np.empty(m, np.int64)
        for j in range(m):
            p = cnt[af[j]]
            cnt[af[j]] += 1
            tf[p] = af[j]
            te[p] = ae[j]
            tb[p] = ab[j]
        by_epoch = True
        for j in range(1, m):
            if tf[j] == tf[j - 1] and te[j] < te[j - 1]:
                by_epoch = False
                break
        if by_epoch:
            af, ae, ab = tf, te, tb
        else:
            order = np.argsort(af * (emax - emin + 1) + (ae - emin), kind="mergesort")
            af, ae, ab = af[order], ae[order], ab[order]
        w = 0
        for j in range(m):
            if w and af[j] == af[w - 1] and ae[j] == ae[w - 1]:
                ab[w - 1] += ab[j]
            else:
                af[w] = af[j]
                ae[w] = ae[j]
                ab[w] = ab[j]
                w += 1
        af, ae, ab = af[:w], ae[:w], ab[:w]
    tot = sf.size + af.size
    of = np.empty(tot, np.int64)
    oe = np.empty(tot, np.int64)
    ob = np.empty(tot, np.int64)
    q = _merge_kernel(sf, se, sb, af, ae, ab, of, oe, ob)
    of, oe, ob = of[:q], oe[:q], ob[:q]
    # rows per flow: every flow in the batch first goes to 0 (all its rows may be gone)
    for j in range(af.size):
        nrows[af[j]] = 0
    most = 0
    j = 0
    while j < q:
        s = j
        while j < q and of[j] == of[s]:
            j += 1
        nrows[of[s]] = j - s
        most = max(most, j - s)
    return OK, of, oe, ob, kept, late, most, nic_emax


def ingest_batches(per_nic: list[tuple[int, list[EpochBatch]]], burst_rx: int, nums: np.ndarray, ids: np.ndarray,
                   nic_ptr: np.ndarray, state: np.ndarray, floor: np.ndarray, has: np.ndarray, dirty: np.ndarray,
                   nrows: np.ndarray, store: tuple[np.ndarray, np.ndarray, np.ndarray]
                   ) -> tuple[int, tuple[np.ndarray, ...], int, int, int, np.ndarray]:
    """(OK | SLOW, new store, rows kept, late rows dropped, most rows of one flow (-1 when
    the store is unchanged), last grid epoch per NIC index (LOW for none)) for each
    (NIC index, its consecutive batches) of ``per_nic``; ``nums``/``ids``: every NIC's
    sorted flow numbers and their flow ids, NIC ``n``'s at ``nic_ptr[n]:nic_ptr[n+1]``."""
    batches = [b for _, bs in per_nic for b in bs]
    flow, epoch, tx, rx, bounds, base = concat_batches(batches)
    bnic = np.array([nix for nix, bs in per_nic for _ in bs], np.int64)
    has_rx = rx is not None and burst_rx > 0
    status, of, oe, ob, kept, late, most, nic_emax = _ingest_kernel(
        flow, epoch, tx, rx if rx is not None else tx, has_rx, bounds, base, bnic, burst_rx if has_rx else 0,
        nums, ids, nic_ptr, state, floor, has, dirty, nrows, *store)
    return status, (of, oe, ob), int(kept), int(late), int(most), nic_emax
