"""Parameters of operator segmentation, and the error it raises."""

from __future__ import annotations

import dataclasses

import numpy as np

from pulse.errors import PulseError


class SegmentationError(PulseError):
    """Input segmentation cannot use (inconsistent batches, bad parameters)."""


@dataclasses.dataclass(frozen=True)
class SegmentParams:
    gap_epochs: int = 3
    """G: an operator that reached its volume ends at the first idle gap of >= G epochs.
    Inside a healthy chunked transfer a send flow idles at most about one epoch between
    chunks (NCCL keeps 8 slots in flight), while consecutive operators on one flow are
    separated by a kernel launch plus the ring's synchronisation, >= ~100 µs = 3 epochs
    at 32 µs. Too large a G merges operators separated by short gaps; too small splits
    only what has already reached its volume, so a small G is cheap: 3."""

    rel_tolerance: float = 1e-3
    """Volume reached at >= (1 - rel) x expected - abs (docs/semantics.md): chunk
    alignment rounding (128 B per chunk) makes a flow's bytes deviate slightly from the
    exact quotient."""

    abs_tolerance: int = 4096
    """See ``rel_tolerance``: one 4 KiB page of slack for tiny operators."""

    max_pending_ops: int = 4096
    """Streaming: op descriptors held per node that no traffic has closed yet (oldest
    evicted first, counted). A node runs a few hundred operators per step."""

    max_buffered_rows: int = 1 << 20
    """Streaming: epoch rows buffered per flow while they wait for the op descriptors
    that explain them or for an open operator to close (oldest evicted, counted).
    2^20 rows = 33 s of continuously active 32 µs epochs: far longer than any operator."""

    stall_ns: int = 1_000_000_000
    """An operator that started but has not reached its volume is closed as incomplete
    after this long without traffic on the flow (a hang). Applied identically in the
    batch and streaming forms so they agree; 1 s is far above any healthy stall
    (nic-flap outages are 5-50 ms) and matches the paper's 1 s polling."""

    merge_gap_ns: int = 20_000_000
    """Bytes that follow an idle gap (>= G) after an operator reached its volume, but come
    before the next operator on the flow was even issued on the host (op event
    ``t_host_ns``), cannot be the next operator's: they stay with the operator
    (go-back-N retransmissions after a stall) when the gap is at most this long. It also
    bounds how long the streaming form waits before closing an operator on an idle
    flow whose next operator is not issued yet: 20 ms, well above RDMA retransmission
    timeouts at NCCL's defaults and well below a training step."""

    op_hole_ns: int = 250_000_000
    """Streaming: how long (on the rank's own clock: op events' ``t_host_ns``) a missing op
    event is waited for while the rank's later ones arrive, before its hole is skipped. One
    rank's op events come from one process in order; a hole that stays while the rank goes
    on issuing is a stream that began after it (an agent attached mid-job, a cut trace) or a
    lost event, not reordering. Holding longer than the localizer waits for an operator's
    late ranks (1 s of trace time) only makes the rank's records arrive after its operators
    were judged without them (a lab rank whose stream began at seq 4 was held for 64
    operators, 20 s, reported insufficient-data, and its lateness never judged)."""

    late_batches: int = 64
    """Streaming: how many batch_seq numbers a NIC's batches may arrive out of order.
    A missing batch_seq is waited for until this many later batches arrived, then
    counted as lost. At 1 ms windows this is 64 ms of reordering."""

    max_unbound_flows: int = 4096
    """Streaming: flows with traffic but no binding, remembered per node (beyond this,
    their rows are dropped and counted)."""

    cts_bytes: int = 64
    """CTS-burst rule (docs/segmentation.md): bytes of one clear-to-send message a receiver
    sends back on the connection (rx on the send flow) per receive buffer it posts; 0
    disables the rule. 64 B: NCCL's IB transport writes one small FIFO entry per post."""

    cts_slots: int = 8
    """Receive buffers a receiver posts at once when it starts an operator on a connection
    (NCCL_STEPS = 8): its start shows as >= cts_slots x cts_bytes rx in one epoch."""

    step_bytes: int = 512 * 1024
    """Largest message one slot carries (NCCL SIMPLE: 4 MiB buffer / 8 steps). Only an
    operator that sends >= cts_slots messages on the flow - by its bytes, or by its
    algorithm's steps - surely fills every slot at its start, so only such operators are
    waited for (:meth:`slot_fills`)."""

    @property
    def burst_rx(self) -> int:
        return self.cts_bytes * self.cts_slots

    def slot_fills(self, need: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """Per operator slot, whether the operator sends ``cts_slots`` messages or more on
        its flow: at least ``steps`` (its algorithm's, :func:`.association.algo_steps`) and
        at least ``need`` / ``step_bytes`` (the most one message carries). Then its receiver
        posts every slot at its start, a CTS burst the CTS-burst rule waits for. Counted by
        bytes alone, a ring AllReduce of small buckets passed for one that leaves slots
        unposted: its 24 pieces of 80 KiB on a 13-rank ring (sweep 293 #10) never waited for
        the burst, and back to back under congestion each operator took its successor's
        first piece, from then on one piece off in every operator."""
        need = np.asarray(need, np.int64)
        msgs = np.maximum(np.asarray(steps, np.int64), -(-need // max(self.step_bytes, 1)))
        return msgs >= self.cts_slots

    def __post_init__(self) -> None:
        checks = (
            ("gap_epochs", self.gap_epochs >= 1),
            ("rel_tolerance", 0.0 <= self.rel_tolerance < 1.0),
            ("abs_tolerance", self.abs_tolerance >= 0),
            ("max_pending_ops", self.max_pending_ops >= 1),
            ("max_buffered_rows", self.max_buffered_rows >= 16),
            ("stall_ns", self.stall_ns >= 1),
            ("merge_gap_ns", self.merge_gap_ns >= 0),
            ("late_batches", self.late_batches >= 0),
            ("op_hole_ns", self.op_hole_ns >= 0),
            ("max_unbound_flows", self.max_unbound_flows >= 0),
            ("cts_bytes", self.cts_bytes >= 0),
            ("cts_slots", self.cts_slots >= 1),
            ("step_bytes", self.step_bytes >= 1),
        )
        for name, ok in checks:
            if not ok:
                raise SegmentationError(f"SegmentParams.{name}={getattr(self, name)!r} is out of range")

    def stall_epochs(self, epoch_ns: int) -> int:
        return max(self.gap_epochs, -(-self.stall_ns // epoch_ns))

    def merge_epochs(self, epoch_ns: int) -> int:
        return min(self.stall_epochs(epoch_ns), self.merge_gap_ns // epoch_ns)


def check_params(params: SegmentParams | None) -> SegmentParams:
    """``params`` or the defaults; anything else is a :class:`SegmentationError`."""
    if params is None:
        return SegmentParams()
    if not isinstance(params, SegmentParams):
        raise SegmentationError(f"params must be SegmentParams, got {type(params).__name__}")
    return params
