"""What the streaming segmenter counts: batches and rows taken, and everything it
reordered, dropped or evicted to keep its state bounded."""

from __future__ import annotations

import dataclasses

from pulse.segmentation.association import FlowKey


@dataclasses.dataclass
class StreamStats:
    batches: int = 0
    rows: int = 0
    reordered_batches: int = 0
    """Batches that arrived ahead of a missing batch_seq and were held, then used."""
    late_batches: int = 0
    """Batches that arrived after their slot was given up (dropped)."""
    duplicate_batches: int = 0
    lost_batches: int = 0
    """batch_seq numbers never received within the reorder bound."""
    late_rows: int = 0
    """Rows for epochs of a flow that were already segmented (dropped)."""
    lost_ops: int = 0
    """Op seq numbers skipped because their descriptor did not arrive within the bound."""
    late_ops: int = 0
    """Op descriptors that arrived after their seq was skipped (dropped)."""
    evicted_ops: int = 0
    evicted_rows: int = 0
    dropped_unbound_rows: int = 0
    emitted: int = 0
    unbound_flows: set[FlowKey] = dataclasses.field(default_factory=set)
    """Flows with traffic and, so far, no (comm, rank, peer, direction) binding."""

    def as_dict(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        d["unbound_flows"] = sorted(self.unbound_flows)
        return d
