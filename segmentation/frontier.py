"""Per (comm, rank) op frontier of the streaming segmenter: operators with seq below it
may be segmented (every descriptor before them arrived or was given up), the ones at or
above it wait.

A descriptor that arrives ahead of its turn is held as a hole in the sequence; the hole
is skipped (its ops counted lost) once more than ``late`` descriptors are ahead of it or
the rank's clock moved ``hole_ns`` past the first op that arrived after it. The frontier
of every (comm, rank) with flows also lives in an int64 array indexed by a small id, which
the segmentation step reads for all flows at once.
"""

from __future__ import annotations

import numpy as np
from pulse.segmentation.streamstats import StreamStats

CommRank = tuple[str, int]


class Frontiers:
    def __init__(self, late: int, hole_ns: int, stats: StreamStats) -> None:
        self.late = late
        self.hole_ns = hole_ns
        self.stats = stats
        self.front: dict[CommRank, int] = {}
        self._ahead: dict[CommRank, set[int]] = {}
        self._hole_since: dict[CommRank, int] = {}
        """Per (comm, rank) with a hole before its frontier: the issue time of the first op
        event that arrived after the hole (the rank's clock)."""
        self.ix: dict[CommRank, int] = {}
        """(comm, rank) -> its id (the position of its frontier in :attr:`array`)."""
        self.array = np.zeros(0, np.int64)

    def index(self, cr: CommRank) -> int:
        ix = self.ix.get(cr)
        if ix is None:
            ix = self.ix[cr] = len(self.ix)
            if ix >= self.array.size:
                grown = np.zeros(max(64, 2 * self.array.size), np.int64)
                grown[: self.array.size] = self.array
                self.array = grown
            self.array[ix] = self.front.get(cr, 0)
        return ix

    def set(self, cr: CommRank, front: int) -> None:
        self.front[cr] = front
        ix = self.ix.get(cr)
        if ix is not None:
            self.array[ix] = front

    def advance(self, cr: CommRank, seq: int, t_host_ns: int | None = None) -> bool:
        """Descriptor ``seq`` of ``cr`` arrived (its frontier is set); whether the frontier moved."""
        front = self.front[cr]
        ahead = self._ahead.get(cr)
        if seq == front and not ahead:
            # in order, nothing held: the usual case, without the hole bookkeeping below
            self._hole_since.pop(cr, None)
            self.set(cr, front + 1)
            return True
        before = front
        if ahead is None:
            ahead = self._ahead[cr] = set()
        if seq >= front:
            ahead.add(seq)
        while front in ahead:
            ahead.discard(front)
            front += 1
        waited = False
        if ahead and t_host_ns is not None:
            since = self._hole_since.setdefault(cr, t_host_ns)
            waited = t_host_ns - since > self.hole_ns
        if not ahead:
            self._hole_since.pop(cr, None)
        if len(ahead) > self.late or waited:
            # The descriptor of seq ``front`` is not coming: skip the hole.
            nxt = min(ahead)
            self.stats.lost_ops += nxt - front
            front = nxt
            while front in ahead:
                ahead.discard(front)
                front += 1
            self._hole_since.pop(cr, None)
        self.set(cr, front)
        return front != before

    def release_all(self) -> None:
        """End of stream: every held operator may be segmented."""
        for cr in list(self.front):
            self.set(cr, 1 << 62)
