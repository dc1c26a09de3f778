"""Per-NIC batch order for the streaming segmenter: batches are used in ``batch_seq``
order; one that arrives early is held until the gap before it fills or more than
``late_batches`` are held (the missing ones are then lost, counted), one that arrives
after its turn was given up is dropped (counted)."""

from __future__ import annotations

import dataclasses

from pulse.segmentation.rows import NicClock
from pulse.segmentation.streamstats import StreamStats

from pulse.samples import EpochBatch

LOW = -(1 << 62)
GIVEN_UP_KEPT = 64


@dataclasses.dataclass
class NicOrder:
    clock: NicClock
    next_seq: int
    pending: dict[int, EpochBatch] = dataclasses.field(default_factory=dict)
    wm: int = LOW
    """Grid epoch up to which (exclusive) every epoch of this NIC has been seen."""
    ready: list[EpochBatch] = dataclasses.field(default_factory=list)
    """Batches released in batch_seq order, not buffered yet."""
    given_up: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    """The latest [first, end) ranges of batch_seq counted lost: a batch of one arriving
    after all is late (its data is missing from the operators already closed); any other
    batch behind the turn was used already, so it is a duplicate (a redelivery) and
    changes nothing."""

    def offer(self, batch: EpochBatch, stats: StreamStats) -> bool:
        """Hold a batch for its turn; False (counted) when it is late or a duplicate."""
        seq = batch.batch_seq
        if seq < self.next_seq:
            if any(a <= seq < b for a, b in self.given_up):
                stats.late_batches += 1
            else:
                stats.duplicate_batches += 1
            return False
        if seq in self.pending:
            stats.duplicate_batches += 1
            return False
        self.pending[seq] = batch
        if seq != self.next_seq:
            stats.reordered_batches += 1
        return True

    def release(self, late_batches: int, stats: StreamStats, *, force: bool) -> None:
        """Move the batches whose turn came to :attr:`ready` (all of them with ``force``)."""
        while self.pending:
            if self.next_seq not in self.pending:
                if not force and len(self.pending) <= late_batches:
                    return
                nxt = min(self.pending)
                stats.lost_batches += nxt - self.next_seq
                self.given_up = [*self.given_up[-(GIVEN_UP_KEPT - 1):], (self.next_seq, nxt)]
                self.next_seq = nxt
            b = self.pending.pop(self.next_seq)
            self.next_seq += 1
            self.ready.append(b)
