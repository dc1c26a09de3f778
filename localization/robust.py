"""Robust statistics used by every rule: medians and MADs, never means."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence

import numpy as np

MAD_TO_SIGMA = 1.4826
"""MAD x 1.4826 estimates the standard deviation of a normal sample."""


def median(x: np.ndarray | Sequence[float]) -> float:
    """np.median's value; small samples (peers of one operator) sorted in Python, where
    np.median's call overhead is 20x the work."""
    n = len(x)
    if n == 0:
        return float("nan")
    if n > 32:
        return float(np.median(x))
    s = sorted(x.tolist() if isinstance(x, np.ndarray) else x)
    h = n // 2
    return float(s[h]) if n % 2 else (float(s[h - 1]) + float(s[h])) / 2.0


def _median_of(x: np.ndarray) -> float:
    """np.median's value: of a float64 array, from one partition (np.median's wrapper
    costs several times the partition on the few hundred values of a spread); else np.median."""
    n = x.size
    if x.dtype != np.float64 or n == 0:
        return float(np.median(x))
    k = n // 2
    # the last index too, as np.median does: a NaN sorts last and makes the median NaN
    part = np.partition(x, [k, n - 1] if n % 2 else [k - 1, k, n - 1])
    if np.isnan(part[-1]):
        return float("nan")
    return float(part[k]) if n % 2 else float((part[k - 1] + part[k]) / 2.0)


def mad(x: np.ndarray) -> float:
    if not x.size:
        return float("nan")
    return _median_of(np.abs(x - _median_of(x)))


def robust_z(value: float, ref: np.ndarray, floor_frac: float, abs_floor: float = 1.0) -> float:
    """How many robust sigmas ``value`` lies above the reference sample. The scale is floored
    at ``floor_frac`` of the median (identical peers have MAD 0) and at ``abs_floor``."""
    med = median(ref)
    scale = max(MAD_TO_SIGMA * mad(ref), floor_frac * abs(med), abs_floor)
    return (value - med) / scale


def leave_one_out_medians(x: np.ndarray) -> np.ndarray:
    """For each element, the median of all the others. Removing the element of sorted rank
    j shifts the ranks above j down by one, so the middle of the rest is read off the
    sorted sample directly."""
    n = x.size
    if n < 2:
        return np.full(n, np.nan)
    order = np.argsort(x, kind="stable")
    s = x[order].astype(np.float64)
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n)

    def rest(k: int) -> np.ndarray:  # element k of the others, for every left-out rank
        return np.where(k < rank, s[k], s[min(k + 1, n - 1)])
    m = (n - 1) // 2
    if (n - 1) % 2:
        return rest(m)
    return (rest(m - 1) + rest(m)) / 2.0


class RollingRef:
    """A bounded sample of recent values (per operator class), for a job-wide reference."""

    def __init__(self, size: int = 512) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self._sorted: list[float] = []

    def extend(self, xs: np.ndarray) -> None:
        for v in xs.tolist() if isinstance(xs, np.ndarray) else xs:
            v = float(v)
            if len(self.values) == self.values.maxlen:
                del self._sorted[bisect.bisect_left(self._sorted, self.values[0])]
            self.values.append(v)
            bisect.insort(self._sorted, v)

    def percentile(self, q: float) -> float:
        """np.percentile(values, q) (linear interpolation), from the sample kept sorted:
        asked once per judged operator, where np.percentile's overhead dominated."""
        s = self._sorted
        if not s:
            return float("nan")
        pos = (len(s) - 1) * (q / 100.0)  # numpy's virtual index (linear method)
        lo = int(pos)
        t = pos - lo
        if t == 0.0 or lo + 1 >= len(s):
            return s[lo]
        a, b = s[lo], s[lo + 1]
        # numpy's lerp: from the nearer end, so the result stays inside [a, b]
        return a + (b - a) * t if t < 0.5 else b - (b - a) * (1.0 - t)

    def array(self) -> np.ndarray:
        return np.fromiter(self.values, dtype=np.float64, count=len(self.values))

    def __len__(self) -> int:
        return len(self.values)
