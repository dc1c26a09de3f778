"""A NIC's epoch batches into its row store in one numba pass (the streaming fast path).

What :func:`pulse.segmentation.rows.nic_rows` + :meth:`FlowTable.ingest` do with a dozen
numpy calls per batch and per NIC (keep the rows with data, put them on the grid, map flow
numbers to flow ids, drop recv flows' rows and rows older than the flow's floor, sort by
(flow id, epoch), merge into the store, recount rows per flow), done in one kernel call:
at 50 ms chunks the numpy calls' fixed cost, not the rows, was most of the segmentation.

It covers the common case only and says so (``SLOW``) *before* changing anything: a flow
it does not know yet or that has no binding, ranges that do not fit its sort key. The
caller then takes the general path, which gives the same store.
Layers: ``_ingest_kernel`` (numba) -> ``ingest_batches`` (driver).
"""

from __future__ import annotations

import numba
import numpy as np
from pulse.segmentation.kernel import RX_CAP, RX_SHIFT
from pulse.segmentation.rowstore import _merge_kernel

from pulse.samples import EpochBatch

OK, SLOW = 0, 1
UNBOUND, SEND = 0, 1  # flows.py's binding states


@numba.njit(cache=True, nogil=True)
def _ingest_kernel(flow, epoch, tx, rx, has_rx, bounds, base, burst_rx,  # pragma: no cover - numba
                   nums, ids, state, floor, has, dirty, nrows, sf, se, sb):
    n = flow.size
    rf = np.empty(n, np.int64)
    re = np.empty(n, np.int64)
    rb = np.empty(n, np.int64)
    k = 0
    emin = np.int64(1) << 62
    emax = -(np.int64(1) << 62)
    for b in range(bounds.size - 1):
        for i in range(bounds[b], bounds[b + 1]):
            t = np.int64(tx[i])
            r = np.int64(rx[i]) if has_rx else np.int64(0)
            if t <= 0 and not (burst_rx > 0 and r >= burst_rx):
                continue
            num = np.int64(flow[i])
            p = np.searchsorted(nums, num)
            if p >= nums.size or nums[p] != num:
                return SLOW, rf[:0], re[:0], rb[:0], 0, 0, 0, emax
            fid = ids[p]
            if state[fid] == UNBOUND:
                return SLOW, rf[:0], re[:0], rb[:0], 0, 0, 0, emax
            e = np.int64(epoch[i]) + base[b]
            rf[k] = fid
            re[k] = e
            rb[k] = t | (min(r, RX_CAP) << RX_SHIFT) if burst_rx > 0 else t
            emin = min(emin, e)
            emax = max(emax, e)
            k += 1
    if k and (emax - emin >= (np.int64(1) << 31) or ids.size >= (np.int64(1) << 31)):
        return SLOW, rf[:0], re[:0], rb[:0], 0, 0, 0, emax
    # from here on the store and the flow state change
    kept = k
    late = 0
    m = 0
    ordered = True
    for j in range(k):
        fid = rf[j]
        if state[fid] != SEND:
            continue  # recv flows only corroborate: their rows are not kept
        has[fid] = True
        dirty[fid] = True
        if re[j] < floor[fid]:
            late += 1
            continue
        if m and (fid < rf[m - 1] or (fid == rf[m - 1] and re[j] <= re[m - 1])):
            ordered = False
        rf[m] = fid
        re[m] = re[j]
        rb[m] = rb[j]
        m += 1
    if m == 0:
        return OK, sf, se, sb, kept, late, -1, emax
    af, ae, ab = rf[:m], re[:m], rb[:m]
    if not ordered:
        # each batch is sorted by (flow number, epoch), not by flow id; a stable sort of
        # one key keeps duplicates (overlapping windows) adjacent, then they add up
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
    return OK, of, oe, ob, kept, late, most, emax


def ingest_batches(batches: list[EpochBatch], burst_rx: int, nums: np.ndarray, ids: np.ndarray,
                   state: np.ndarray, floor: np.ndarray, has: np.ndarray, dirty: np.ndarray, nrows: np.ndarray,
                   store: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[int, tuple[np.ndarray, ...], int, int, int, int]:
    """(OK | SLOW, new store, rows kept, late rows dropped, most rows of one flow (-1 when
    the store is unchanged), last grid epoch) for a NIC's consecutive batches."""
    if len(batches) == 1:
        b = batches[0]
        flow, epoch, tx, rx = b.flow, b.epoch, b.tx_bytes, b.rx_bytes
        bounds = np.array([0, flow.size], np.int64)
    else:
        flow = np.concatenate([b.flow for b in batches])
        epoch = np.concatenate([b.epoch for b in batches])
        tx = np.concatenate([b.tx_bytes for b in batches])
        rx = None if any(b.rx_bytes is None for b in batches) else np.concatenate([b.rx_bytes for b in batches])
        bounds = np.zeros(len(batches) + 1, np.int64)
        np.cumsum([b.n_rows for b in batches], out=bounds[1:])
    base = np.array([b.t0_ns // b.epoch_ns for b in batches], np.int64)
    has_rx = rx is not None and burst_rx > 0
    status, of, oe, ob, kept, late, most, emax = _ingest_kernel(
        flow, epoch, tx, rx if rx is not None else tx, has_rx, bounds, base, burst_rx if has_rx else 0,
        nums, ids, state, floor, has, dirty, nrows, *store)
    return status, (of, oe, ob), int(kept), int(late), int(most), int(emax)
