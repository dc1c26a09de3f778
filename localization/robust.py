"""Robust statistics used by every rule: medians and MADs, never means."""

from __future__ import annotations

from collections import deque

import numpy as np

MAD_TO_SIGMA = 1.4826
"""MAD x 1.4826 estimates the standard deviation of a normal sample."""


def median(x: np.ndarray) -> float:
    return float(np.median(x)) if x.size else float("nan")


def mad(x: np.ndarray) -> float:
    if not x.size:
        return float("nan")
    return float(np.median(np.abs(x - np.median(x))))


def robust_z(value: float, ref: np.ndarray, floor_frac: float, abs_floor: float = 1.0) -> float:
    """How many robust sigmas ``value`` lies above the reference sample. The scale is floored
    at ``floor_frac`` of the median (identical peers have MAD 0) and at ``abs_floor``."""
    med = median(ref)
    scale = max(MAD_TO_SIGMA * mad(ref), floor_frac * abs(med), abs_floor)
    return (value - med) / scale


def leave_one_out_medians(x: np.ndarray) -> np.ndarray:
    """For each element, the median of all the others (small n: plain loop is cheapest)."""
    n = x.size
    if n < 2:
        return np.full(n, np.nan)
    out = np.empty(n)
    for i in range(n):
        out[i] = np.median(np.delete(x, i))
    return out


class RollingRef:
    """A bounded sample of recent values (per operator class), for a job-wide reference."""

    def __init__(self, size: int = 512) -> None:
        self.values: deque[float] = deque(maxlen=size)

    def extend(self, xs: np.ndarray) -> None:
        self.values.extend(float(v) for v in xs)

    def array(self) -> np.ndarray:
        return np.fromiter(self.values, dtype=np.float64, count=len(self.values))

    def __len__(self) -> int:
        return len(self.values)
