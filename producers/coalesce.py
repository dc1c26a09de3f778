"""Coalescing a NIC's consecutive epoch batches into one batch with a longer window.

The wire contract is one message per NIC batch *for a time window*; the window is the
producer's choice. Sources cut short windows (the simulator ~10 ms, so a live 16-GPU job
makes thousands of tiny messages a second), and every Kafka message costs the worker far
more than its bytes (Faust spends ~0.2 ms per message before any Pulse code runs). Merging
a NIC's consecutive batches into one message before sending cuts that cost by the merge
factor, for at most ``max_age_s`` of added delay.

A merged batch starts at its first batch's ``t0_ns``; epoch indices are shifted to it and
rows re-sorted by (flow, epoch). Only batches that can share a window merge: same job,
``epoch_ns`` and rx presence, a ``t0_ns`` on the same epoch grid, and a window starting at
or after the previous batch's last epoch (so no (flow, epoch) repeats).

``batch_seq`` of merged batches is renumbered per NIC so consumers still see a gapless
sequence (they detect loss and drop redeliveries by it): a NIC's first merged batch takes
the first source ``batch_seq`` seen, each later one the next number. The numbering
survives a publisher restart through :meth:`Coalescer.state` / ``restore`` (the publisher
keeps it next to its spool): a source that goes on where it stopped goes on with the next
number. Gaps in the source's own ``batch_seq`` are counted (``source_gaps``), since
renumbering hides them from consumers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pulse.samples import MAX_ROWS, EpochBatch

_U32 = np.dtype("<u4")


@dataclasses.dataclass
class _Group:
    batches: list[EpochBatch]
    rows: int
    end_ns: int
    started: float


def merge(batches: list[EpochBatch], batch_seq: int) -> EpochBatch:
    """One batch holding the rows of ``batches`` (a NIC's, mergeable, in time order)."""
    first = batches[0]
    if len(batches) == 1:
        b = first
        return dataclasses.replace(b, batch_seq=batch_seq) if b.batch_seq != batch_seq else b
    shifts = [(b.t0_ns - first.t0_ns) // first.epoch_ns for b in batches]
    flow = np.concatenate([b.flow for b in batches])
    epoch = np.concatenate([b.epoch.astype(np.int64) + s for b, s in zip(batches, shifts, strict=True)])
    tx = np.concatenate([b.tx_bytes for b in batches])
    rx = None if first.rx_bytes is None else np.concatenate([b.rx_bytes for b in batches])  # type: ignore[misc]
    # Each batch is sorted by (flow, epoch) and later batches hold later epochs, so a stable
    # sort by flow alone yields (flow, epoch) order.
    order = np.argsort(flow, kind="stable")
    return EpochBatch(node=first.node, nic=first.nic, t0_ns=first.t0_ns, epoch_ns=first.epoch_ns,
                      batch_seq=batch_seq, flow=flow[order].astype(_U32, copy=False),
                      epoch=epoch[order].astype(_U32), tx_bytes=tx[order].astype(_U32, copy=False),
                      rx_bytes=None if rx is None else rx[order].astype(_U32, copy=False), job=first.job)


class Coalescer:
    """Per-NIC groups of batches waiting to go out as one merged batch.

    ``add`` returns the merged batches that must go out now (a group that cannot take the
    new batch, or that reached ``max_rows``); ``due`` those older than ``max_age_s``;
    ``drain`` all of them.
    """

    def __init__(self, *, max_age_s: float = 0.02, max_rows: int = 16384) -> None:
        self.max_age_s = float(max_age_s)
        self.max_rows = int(min(max_rows, MAX_ROWS))
        self._groups: dict[tuple[str, str, str], _Group] = {}
        self._next_seq: dict[tuple[str, str, str], int] = {}
        self._last_src: dict[tuple[str, str, str], int] = {}
        self._restored: dict[tuple[str, str, str], tuple[int, int]] = {}
        self.batches_in = 0
        self.batches_out = 0
        self.source_gaps = 0

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, batch: EpochBatch, now: float) -> list[EpochBatch]:
        key = (batch.job, batch.node, batch.nic)
        self.batches_in += 1
        last = self._last_src.get(key)
        if last is not None and batch.batch_seq > last + 1:
            self.source_gaps += batch.batch_seq - last - 1
        self._last_src[key] = batch.batch_seq if last is None else max(last, batch.batch_seq)
        out: list[EpochBatch] = []
        g = self._groups.get(key)
        if g is not None and not self._fits(g, batch):
            out.append(self._close(key))
            g = None
        if g is None:
            self._groups[key] = _Group([batch], batch.n_rows, batch.end_ns(), now)
            if key not in self._next_seq:
                restored = self._restored.pop(key, None)
                # Where this NIC's numbering stopped, if the source continues its stream;
                # a source that started over starts over here too.
                cont = restored is not None and batch.batch_seq > restored[1]
                self._next_seq[key] = restored[0] if cont else batch.batch_seq  # type: ignore[index]
        else:
            g.batches.append(batch)
            g.rows += batch.n_rows
            g.end_ns = max(g.end_ns, batch.end_ns())
        if self._groups[key].rows >= self.max_rows:
            out.append(self._close(key))
        return out

    def state(self) -> dict[str, list[int]]:
        """Per NIC: the next merged ``batch_seq`` and the last source ``batch_seq`` (JSON-able)."""
        out = {"\x1f".join(k): [n, self._last_src.get(k, -1)] for k, n in self._next_seq.items()}
        for k, v in self._restored.items():
            out.setdefault("\x1f".join(k), list(v))
        return out

    def restore(self, state: dict[str, list[int]], *, margin: int = 0) -> None:
        """Continue a previous publisher's numbering; ``margin`` skips that many numbers per
        NIC when the state may be stale (a crash): a gap consumers wait out, not a reuse they
        would drop as a duplicate."""
        for k, (nxt, last) in state.items():
            parts = tuple(k.split("\x1f"))
            if len(parts) == 3:
                self._restored[parts] = (int(nxt) + margin, int(last))  # type: ignore[index]

    def due(self, now: float) -> list[EpochBatch]:
        old = [k for k, g in self._groups.items() if now - g.started >= self.max_age_s]
        return [self._close(k) for k in old]

    def drain(self) -> list[EpochBatch]:
        return [self._close(k) for k in list(self._groups)]

    def _fits(self, g: _Group, b: EpochBatch) -> bool:
        first = g.batches[0]
        return (b.epoch_ns == first.epoch_ns and (b.rx_bytes is None) == (first.rx_bytes is None)
                and b.t0_ns >= g.end_ns and (b.t0_ns - first.t0_ns) % first.epoch_ns == 0
                and g.rows + b.n_rows <= self.max_rows
                and (b.end_ns() - first.t0_ns) // first.epoch_ns < 0xFFFFFFFF)

    def _close(self, key: tuple[str, str, str]) -> EpochBatch:
        g = self._groups.pop(key)
        seq = self._next_seq[key]
        self._next_seq[key] = seq + 1
        self.batches_out += 1
        return merge(g.batches, seq)
