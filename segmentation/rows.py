"""Epoch batches -> per-flow active rows on an absolute epoch grid (numpy only).

A row (flow, epoch) of a batch covers [t0 + epoch x epoch_ns, +epoch_ns). Rows of all
batches of one NIC are put on the grid ``abs = floor(t0 / epoch_ns) + epoch``; the NIC's
phase ``t0 mod epoch_ns`` turns grid epochs back into node-clock ns. Only epochs with data
bytes on the wire (``tx_bytes > 0``) are active for a send flow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numba
import numpy as np
from pulse.segmentation.kernel import RX_CAP, RX_SHIFT, pack_rows
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


@numba.njit(cache=True)
def _rows_kernel(flow, epoch, tx, rx, has_rx, bounds, base, burst_rx, rx_cap, rx_shift):  # pragma: no cover
    """Kept rows of consecutive batches (``bounds`` cut the concatenated columns, ``base``
    is each batch's grid offset) -> flow, grid epoch, packed bytes; and whether they come
    out sorted by (flow, epoch) without duplicates."""
    n = flow.size
    of = np.empty(n, np.int64)
    oe = np.empty(n, np.int64)
    ob = np.empty(n, np.int64)
    k = 0
    ordered = True
    pf = np.int64(-1)
    pe = np.int64(-1)
    for b in range(bounds.size - 1):
        for i in range(bounds[b], bounds[b + 1]):
            t = np.int64(tx[i])
            r = np.int64(rx[i]) if has_rx else np.int64(0)
            if t <= 0 and not (burst_rx > 0 and r >= burst_rx):
                continue
            f = np.int64(flow[i])
            e = np.int64(epoch[i]) + base[b]
            if k > 0 and (f < pf or (f == pf and e <= pe)):
                ordered = False
            of[k] = f
            oe[k] = e
            ob[k] = t | (min(r, rx_cap) << rx_shift) if burst_rx > 0 else t
            pf = f
            pe = e
            k += 1
    return of[:k], oe[:k], ob[:k], ordered


def concat_batches(batches: list[EpochBatch]
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """Consecutive batches' columns as one (flow, epoch, tx, rx or None when some batch has
    no rx), ``bounds`` cutting them per batch and each batch's grid offset ``base``: the
    form the row kernels (here and in :mod:`.ingest`) take, one call for many batches."""
    if len(batches) == 1:
        b = batches[0]
        return (b.flow, b.epoch, b.tx_bytes, b.rx_bytes, np.array([0, b.flow.size], np.int64),
                np.array([b.t0_ns // b.epoch_ns], np.int64))
    flow = np.concatenate([b.flow for b in batches])
    epoch = np.concatenate([b.epoch for b in batches])
    tx = np.concatenate([b.tx_bytes for b in batches])
    rx = None if any(b.rx_bytes is None for b in batches) else np.concatenate([b.rx_bytes for b in batches])
    bounds = np.zeros(len(batches) + 1, np.int64)
    np.cumsum([b.n_rows for b in batches], out=bounds[1:])
    return flow, epoch, tx, rx, bounds, np.array([b.t0_ns // b.epoch_ns for b in batches], np.int64)


def nic_rows(batches: list[EpochBatch], clock: NicClock, burst_rx: int = 0
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``batch_rows`` of a NIC's consecutive batches at once, sorted by (flow, epoch) with
    duplicates summed (``merge_sorted``), and the number of rows kept before that: one
    pass, not a dozen numpy calls per batch."""
    for b in batches:
        check_epoch(b, clock)
    flow, epoch, tx, rx, bounds, base = concat_batches(batches)
    has_rx = rx is not None and burst_rx > 0
    f, e, t, ordered = _rows_kernel(flow, epoch, tx, rx if rx is not None else tx, has_rx, bounds, base,
                                    burst_rx if has_rx else 0, RX_CAP, RX_SHIFT)
    if ordered:
        return f, e, t, int(f.size)
    return (*merge_sorted(f, e, t), int(f.size))


def merge_sorted(flow: np.ndarray, ep: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort rows by (flow, epoch) and sum duplicates (overlapping batch windows)."""
    if flow.size == 0:
        return flow, ep, nbytes
    df, de = np.diff(flow), np.diff(ep)
    if bool(((df > 0) | ((df == 0) & (de > 0))).all()):
        return flow, ep, nbytes  # one batch's rows: sorted and unique already (the decoder checks it)
    lo = int(ep.min())
    if int(ep.max()) - lo < (1 << 31) and int(flow.min()) >= 0 and int(flow.max()) < (1 << 31):
        # one int64 key; a stable sort finds the batches' sorted runs (timsort), where a
        # two-key lexsort sorted from scratch
        order = np.argsort((flow << 32) | (ep - lo), kind="stable")
    else:
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
