"""Binning: (packet flow, ts, bytes) entries -> per-window epoch rows of stream-flows.

Epochs are aligned to multiples of ``epoch_ns`` on the capture clock (epoch k covers
[k*epoch_ns, (k+1)*epoch_ns)), and windows (one batch each) to multiples of
``window_epochs`` epochs, so two captures on the same clock bin identically.

Entries are grouped by a counting sort on the dense packet-flow id (O(n), stable, so time
order survives inside a flow) and summed per epoch; each row then goes to the tx side and
the rx side stream-flow, and the rows are ordered by (stream, window) with a stable
counting sort. Stream-flow ids grow with packet-flow ids inside a stream, so rows come out
sorted by (stream, window, flow, epoch) as batches need.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np

U32_MAX = 0xFFFFFFFF


@numba.njit(cache=True)
def _is_sorted(ts):
    for i in range(1, ts.shape[0]):  # noqa: SIM110 - a numba loop, no generator
        if ts[i] < ts[i - 1]:
            return False
    return True


@numba.njit(cache=True)
def _group_sum_kernel(pf, ts, nbytes, npf, epoch_ns, o_pf, o_epoch, o_bytes):
    """Counting sort by packet flow (stable: time order survives), then sum bytes per
    (flow, epoch). ts must be sorted. Returns the row count."""
    n = pf.shape[0]
    start = np.zeros(npf + 1, np.int64)
    for i in range(n):
        start[pf[i] + 1] += 1
    for s in range(npf):
        start[s + 1] += start[s]
    k = -1
    order = np.empty(n, np.int64)
    for i in range(n):
        f = pf[i]
        order[start[f]] = i
        start[f] += 1
    for j in range(n):
        i = order[j]
        e = ts[i] // epoch_ns  # floor, also before 1970
        if k < 0 or pf[i] != o_pf[k] or e != o_epoch[k]:
            k += 1
            o_pf[k] = pf[i]
            o_epoch[k] = e
            o_bytes[k] = 0
        o_bytes[k] += nbytes[i]
    return k + 1


@numba.njit(cache=True)
def _expand_kernel(r_pf, r_epoch, r_bytes, pf_txsf, pf_rxsf, sf_stream,
                   o_stream, o_sf, o_epoch, o_tx, o_rx):
    """Each packet-flow row becomes a tx row on its source side's stream-flow and an rx row
    on its destination side's (one row with both when they are the same flow). Sums
    saturate at uint32. Returns (rows, saturated cells)."""
    k = 0
    sat = 0
    for i in range(r_pf.shape[0]):
        b = r_bytes[i]
        if b > U32_MAX:
            b = U32_MAX
            sat += 1
        t = pf_txsf[r_pf[i]]
        r = pf_rxsf[r_pf[i]]
        if t >= 0:
            o_stream[k] = sf_stream[t]
            o_sf[k] = t
            o_epoch[k] = r_epoch[i]
            o_tx[k] = b
            o_rx[k] = b if r == t else 0
            k += 1
        if r >= 0 and r != t:
            o_stream[k] = sf_stream[r]
            o_sf[k] = r
            o_epoch[k] = r_epoch[i]
            o_tx[k] = 0
            o_rx[k] = b
            k += 1
    return k, sat


@numba.njit(cache=True)
def _expand_sorted_kernel(r_pf, r_epoch, r_bytes, pf_txsf, pf_rxsf, sf_stream, window_epochs, w0, nw,
                          o_stream, o_win, o_sf, o_epoch, o_tx, o_rx):
    """_expand_kernel fused with a stable counting sort by (stream, window): rows are
    written straight to their sorted place. Returns (rows, saturated cells)."""
    nb = sf_stream.shape[0] and (np.max(sf_stream) + 1) * nw
    start = np.zeros(nb + 1, np.int64)
    for i in range(r_pf.shape[0]):
        t = pf_txsf[r_pf[i]]
        r = pf_rxsf[r_pf[i]]
        w = r_epoch[i] // window_epochs - w0
        if t >= 0:
            start[sf_stream[t] * nw + w + 1] += 1
        if r >= 0 and r != t:
            start[sf_stream[r] * nw + w + 1] += 1
    for b in range(nb):
        start[b + 1] += start[b]
    total = start[nb]
    sat = 0
    for i in range(r_pf.shape[0]):
        b = r_bytes[i]
        if b > U32_MAX:
            b = U32_MAX
            sat += 1
        t = pf_txsf[r_pf[i]]
        r = pf_rxsf[r_pf[i]]
        win = r_epoch[i] // window_epochs
        e = r_epoch[i] - win * window_epochs
        if t >= 0:
            s = sf_stream[t]
            j = start[s * nw + win - w0]
            start[s * nw + win - w0] += 1
            o_stream[j] = s
            o_win[j] = win
            o_sf[j] = t
            o_epoch[j] = e
            o_tx[j] = b
            o_rx[j] = b if r == t else 0
        if r >= 0 and r != t:
            s = sf_stream[r]
            j = start[s * nw + win - w0]
            start[s * nw + win - w0] += 1
            o_stream[j] = s
            o_win[j] = win
            o_sf[j] = r
            o_epoch[j] = e
            o_tx[j] = 0
            o_rx[j] = b
    return total, sat


@numba.njit(cache=True)
def _counting_order(key, nbuckets):
    """Stable order of ``key`` (ints in [0, nbuckets))."""
    start = np.zeros(nbuckets + 1, np.int64)
    for i in range(key.shape[0]):
        start[key[i] + 1] += 1
    for b in range(nbuckets):
        start[b + 1] += start[b]
    order = np.empty(key.shape[0], np.int64)
    for i in range(key.shape[0]):
        b = key[i]
        order[start[b]] = i
        start[b] += 1
    return order


@dataclasses.dataclass
class Rows:
    """Epoch rows sorted by (stream, window, flow, epoch); epoch is relative to the window."""

    stream: np.ndarray
    window: np.ndarray
    sf: np.ndarray
    epoch: np.ndarray
    tx: np.ndarray
    rx: np.ndarray
    saturated: int

    def groups(self) -> list[tuple[int, int, int, int]]:
        """(stream, window, start, stop) of each batch's row range."""
        n = self.stream.shape[0]
        if n == 0:
            return []
        change = np.flatnonzero((np.diff(self.stream) != 0) | (np.diff(self.window) != 0)) + 1
        starts = np.concatenate([[0], change]).tolist()
        stops = np.concatenate([change, [n]]).tolist()
        return [(int(self.stream[a]), int(self.window[a]), a, b) for a, b in zip(starts, stops, strict=True)]


def bin_entries(pf: np.ndarray, ts_ns: np.ndarray, nbytes: np.ndarray, pf_txsf: np.ndarray,
                pf_rxsf: np.ndarray, sf_stream: np.ndarray, *, epoch_ns: int, window_epochs: int) -> Rows:
    """Sum data bytes per (packet flow, epoch), then spread them to the stream-flows of the
    two sides: ``pf_txsf``/``pf_rxsf`` give each packet flow's tx/rx stream-flow (-1: none),
    ``sf_stream`` each stream-flow's stream. Stream-flow ids must grow with packet-flow ids
    within a stream (they are created in that order) so rows come out sorted."""
    pf = np.ascontiguousarray(pf, np.int64)
    ts = np.ascontiguousarray(ts_ns, np.int64)
    nbytes = np.ascontiguousarray(nbytes, np.int64)
    n = int(ts.shape[0])
    if n == 0:
        z = np.zeros(0, np.int64)
        return Rows(z, z, z, z, z, z, 0)
    if not _is_sorted(ts):
        o = np.argsort(ts, kind="stable")
        pf, ts, nbytes = pf[o], ts[o], nbytes[o]
    r = [np.empty(n, np.int64) for _ in range(3)]
    k = _group_sum_kernel(pf, ts, nbytes, int(pf.max()) + 1, np.int64(epoch_ns), *r)
    sf_stream = np.ascontiguousarray(sf_stream, np.int64)
    if k and sf_stream.shape[0]:
        e0 = int(r[1][:k].min()) // window_epochs
        nw = int(r[1][:k].max()) // window_epochs - e0 + 1
        if (int(sf_stream.max()) + 1) * nw <= 4 * k + 4096:
            out = [np.empty(2 * k, np.int64) for _ in range(6)]
            m, sat = _expand_sorted_kernel(r[0][:k], r[1][:k], r[2][:k], np.ascontiguousarray(pf_txsf, np.int64),
                                           np.ascontiguousarray(pf_rxsf, np.int64), sf_stream,
                                           np.int64(window_epochs), np.int64(e0), np.int64(nw), *out)
            return Rows(*(a[:m] for a in out), int(sat))  # type: ignore[call-arg, arg-type]
    out = [np.empty(2 * k, np.int64) for _ in range(5)]
    m, sat = _expand_kernel(r[0][:k], r[1][:k], r[2][:k], np.ascontiguousarray(pf_txsf, np.int64),
                            np.ascontiguousarray(pf_rxsf, np.int64), np.ascontiguousarray(sf_stream, np.int64), *out)
    r_stream, r_sf, r_ep, r_tx, r_rx = (a[:m] for a in out)
    if m == 0:
        z = np.zeros(0, np.int64)
        return Rows(z, z, z, z, z, z, int(sat))
    r_win = r_ep // window_epochs
    w0 = int(r_win.min())
    nw = int(r_win.max()) - w0 + 1
    key = r_stream * nw + (r_win - w0)
    if not _is_sorted(key):
        nb = int(key.max()) + 1
        o = _counting_order(key, nb) if nb <= 4 * m + 4096 else np.argsort(key, kind="stable")
        r_sf, r_ep, r_tx, r_rx, r_stream, r_win = (a[o] for a in (r_sf, r_ep, r_tx, r_rx, r_stream, r_win))
    return Rows(r_stream, r_win, r_sf, r_ep - r_win * window_epochs, r_tx, r_rx, int(sat))
