"""Buffered epoch rows of many flows in one columnar store (numba merge).

The streaming form keeps, per NIC, every buffered row as (flow id, grid epoch, bytes)
sorted by (flow id, epoch): a batch is merged in with one linear pass instead of one
array operation per flow, and the kernel reads the rows of many flows at once.
Layers: ``_merge_kernel`` (numba) -> ``merge_rows`` (driver).
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _merge_kernel(af, ae, ab, bf, be, bb, of, oe, ob):  # pragma: no cover - numba
    i = 0
    j = 0
    n = 0
    na = af.shape[0]
    nb = bf.shape[0]
    while i < na or j < nb:
        if j >= nb or (i < na and (af[i] < bf[j] or (af[i] == bf[j] and ae[i] < be[j]))):
            f, e, b = af[i], ae[i], ab[i]
            i += 1
        elif i >= na or bf[j] < af[i] or be[j] < ae[i]:
            f, e, b = bf[j], be[j], bb[j]
            j += 1
        else:  # same (flow, epoch) in both: overlapping windows, bytes add up
            f, e, b = af[i], ae[i], ab[i] + bb[j]
            i += 1
            j += 1
        if n > 0 and of[n - 1] == f and oe[n - 1] == e:
            ob[n - 1] += b
        else:
            of[n] = f
            oe[n] = e
            ob[n] = b
            n += 1
    return n


def merge_rows(a: tuple[np.ndarray, np.ndarray, np.ndarray],
               b: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge two (flow, epoch, bytes) int64 column sets, each sorted by (flow, epoch) with
    unique keys; equal keys are summed."""
    if a[0].size == 0:
        return b
    if b[0].size == 0:
        return a
    n = a[0].size + b[0].size
    of = np.empty(n, np.int64)
    oe = np.empty(n, np.int64)
    ob = np.empty(n, np.int64)
    m = _merge_kernel(a[0], a[1], a[2], b[0], b[1], b[2], of, oe, ob)
    return of[:m], oe[:m], ob[:m]
