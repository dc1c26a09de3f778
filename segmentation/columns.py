"""Named numpy columns that grow by doubling: the streaming segmenter's per-flow state
and its (operator, send flow) slot table are tables of this kind, so that a batch costs
array passes over the rows it concerns, not Python work per flow."""

from __future__ import annotations

import numpy as np


class Columns:
    """Named int64/bool columns with amortised growth (capacity doubling)."""

    def __init__(self, spec: dict[str, tuple[type, int]]) -> None:
        self.spec = spec
        self.n = 0
        self._cap = 0
        for name, (dt, fill) in spec.items():
            setattr(self, name, np.full(0, fill, dt))

    def grow(self, k: int) -> slice:
        """Room for ``k`` more rows (filled with defaults); returns their slice."""
        need = self.n + k
        if need > self._cap:
            cap = max(64, need, 2 * self._cap)
            for name, (dt, fill) in self.spec.items():
                old = getattr(self, name)
                new: np.ndarray = np.full(cap, fill, dt)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
            self._cap = cap
        s = slice(self.n, need)
        self.n = need
        return s

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the rows where ``mask`` (length n) is True, in order."""
        m = int(mask.sum())
        for name, (_dt, fill) in self.spec.items():
            col = getattr(self, name)
            col[:m] = col[: self.n][mask]
            col[m: self.n] = fill
        self.n = m

    def col(self, name: str) -> np.ndarray:
        return getattr(self, name)[: self.n]

    def __getattr__(self, name: str) -> np.ndarray:
        # only reached for a name that is not a column: tells type checkers the columns
        # set in __init__/grow are arrays
        raise AttributeError(name)
