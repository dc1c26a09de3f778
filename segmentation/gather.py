"""Row selection shared by the batch and streaming drivers (numpy only).

Both drivers hand the kernel the rows of many flows as one concatenation (``counts[i]``
rows of run flow ``i``, in flow order, epochs sorted within a flow), and both need, for
each segmented (operator, flow) slot, the epochs in which that flow actually sent bytes
between the slot's first and last epoch: the operator's ACT is the union of those epochs
over its flows (:func:`pulse.segmentation.metrics.union_count`), and its busiest epoch the
largest of their per-epoch byte sums (:func:`pulse.segmentation.metrics.epoch_peaks`).
"""

from __future__ import annotations

import numpy as np
from pulse.segmentation.kernel import TX_MASK

_EMPTY = np.zeros(0, np.int64)
_FLOW_SHIFT = 40
"""Rows are searched on one sorted key (flow << 40 | epoch offset): epochs of one run span
far less than 2^40 grid epochs (a year at 32 µs)."""


def gather(lo: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated aranges lo[i]:lo[i]+counts[i]."""
    total = int(counts.sum())
    if total == 0:
        return _EMPTY
    starts = np.cumsum(counts) - counts
    return np.arange(total, dtype=np.int64) - np.repeat(starts - lo, counts)


def active_epochs(ep: np.ndarray, nbytes: np.ndarray, counts: np.ndarray, flow: np.ndarray,
                  start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For slots ``i`` on run flow ``flow[i]`` spanning grid epochs ``[start[i], end[i]]``:
    (i, epoch, tx bytes) of every row of that flow in the span that carries tx bytes.

    Consecutive operators of a flow share at most the epoch where one crosses its volume
    and the next starts; rx-only rows (CTS bursts) are not active epochs.
    """
    base = int(ep.min()) if ep.size else 0
    key = (np.repeat(np.arange(counts.size, dtype=np.int64), counts) << _FLOW_SHIFT) | (ep - base)
    lo = np.searchsorted(key, (flow << _FLOW_SHIFT) | (start - base), "left")
    hi = np.searchsorted(key, (flow << _FLOW_SHIFT) | (end - base), "right")
    idx = gather(lo, hi - lo)
    slot = np.repeat(np.arange(flow.size, dtype=np.int64), hi - lo)
    tx = nbytes[idx] & TX_MASK
    active = tx > 0
    return slot[active], ep[idx[active]], tx[active]
