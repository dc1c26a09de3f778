"""Epoch batches -> per-flow active rows on an absolute epoch grid (numpy only).

A row (flow, epoch) of a batch covers [t0 + epoch x epoch_ns, +epoch_ns). Rows of all
batches of one NIC are put on the grid ``abs = floor(t0 / epoch_ns) + epoch``; the NIC's
phase ``t0 mod epoch_ns`` turns grid epochs back into node-clock ns. Only epochs with data
bytes on the wire (``tx_bytes > 0``) are active for a send flow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
from pulse.segmentation.kernel import pack_rows
from pulse.segmentation.params import SegmentationError

from pulse.samples import EpochBatch


@dataclasses.dataclass
class NicClock:
    epoch_ns: int
    phase_ns: int

    def to_ns(self, abs_epoch: np.ndarray | int) -> np.ndarray | int:
        return abs_epoch * self.epoch_ns + self.phase_ns

    def earliest_epoch(self, issue_ns: np.ndarray) -> np.ndarray:
        """Grid epoch before which an operator issued at ``issue_ns`` cannot have data on
        the wire (one epoch of margin for timestamping skew); very small when unknown."""
        issue_ns = np.asarray(issue_ns, np.int64)
        known = issue_ns != np.iinfo(np.int64).min
        out = np.full(issue_ns.shape, -(1 << 62), np.int64)
        out[known] = (issue_ns[known] - self.phase_ns) // self.epoch_ns - 1
        return out


def check_epoch(batch: EpochBatch, clock: NicClock) -> None:
    """Every NIC of a node must use the epoch length of the node's first batch."""
    if batch.epoch_ns != clock.epoch_ns:
        raise SegmentationError(
            f"{batch.node}/{batch.nic} batch {batch.batch_seq}: epoch_ns {batch.epoch_ns} differs "
            f"from the {clock.epoch_ns} of the node's earlier batches")


def batch_rows(batch: EpochBatch, clock: NicClock, burst_rx: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(flow int64, abs epoch int64, packed bytes int64) of a batch's rows with tx > 0, and
    with ``burst_rx`` > 0 also its rx-only rows of >= burst_rx bytes (possible CTS bursts).
    Packed = tx bytes | rx bytes << RX_SHIFT (kernel.pack_rows)."""
    check_epoch(batch, clock)
    rx = batch.rx_bytes if burst_rx > 0 else None
    keep = batch.tx_bytes > 0
    if rx is not None:
        keep |= rx >= burst_rx
    base = batch.t0_ns // batch.epoch_ns
    return (batch.flow[keep].astype(np.int64), batch.epoch[keep].astype(np.int64) + base,
            pack_rows(batch.tx_bytes[keep], None if rx is None else rx[keep]))


def merge_sorted(flow: np.ndarray, ep: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort rows by (flow, epoch) and sum duplicates (overlapping batch windows)."""
    if flow.size == 0:
        return flow, ep, nbytes
    order = np.lexsort((ep, flow))
    flow, ep, nbytes = flow[order], ep[order], nbytes[order]
    new = np.ones(flow.size, bool)
    new[1:] = (flow[1:] != flow[:-1]) | (ep[1:] != ep[:-1])
    if new.all():
        return flow, ep, nbytes
    idx = np.flatnonzero(new)
    return flow[idx], ep[idx], np.add.reduceat(nbytes, idx)


def collect(batches: Iterable[EpochBatch], burst_rx: int = 0
            ) -> tuple[dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]], dict[str, NicClock]]:
    """All batches -> per (node, nic) merged rows (``batch_rows``), and one clock per node
    (batches in batch_seq order per NIC; every NIC of a node must use the node's epoch
    length)."""
    per_nic: dict[tuple[str, str], list[EpochBatch]] = {}
    for b in batches:
        if not isinstance(b, EpochBatch):
            raise SegmentationError(f"expected EpochBatch objects, got {type(b).__name__}")
        per_nic.setdefault((b.node, b.nic), []).append(b)
    clocks: dict[str, NicClock] = {}
    out = {}
    for key in sorted(per_nic):
        lst = sorted(per_nic[key], key=lambda b: b.batch_seq)
        node = key[0]
        clock = clocks.setdefault(node, NicClock(lst[0].epoch_ns, lst[0].t0_ns % lst[0].epoch_ns))
        parts = [batch_rows(b, clock, burst_rx) for b in lst]
        f = np.concatenate([p[0] for p in parts])
        e = np.concatenate([p[1] for p in parts])
        t = np.concatenate([p[2] for p in parts])
        out[key] = merge_sorted(f, e, t)
    return out, clocks
