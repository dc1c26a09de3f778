"""The simulated epoch rows, written as per-NIC epoch batches while the run goes on.

A run of a large job produces hundreds of millions of rows; held to the end they were most of
the simulator's memory. The engine hands rows over after each slice of true time with a
frontier (no later row has an earlier epoch on its node's clock), so every batch window that
ends at or before the frontier is complete on every NIC and is written then. Each NIC's file
receives the same batches, in the same order, as if the run had been written at its end."""

from __future__ import annotations

import numpy as np
from pulse.sim.workload import Job

from pulse.errors import EncodeError
from pulse.samples import EpochBatch
from pulse.trace import TraceWriter


def node_name(i: int) -> str:
    return f"node-{i:02d}"


def nic_name(k: int) -> str:
    return f"mlx5_{k}"


def qp_nic(job: Job) -> np.ndarray:
    """Global NIC index of every QP (send QP 2c on the sender's NIC, recv QP 2c+1 on the
    receiver's)."""
    q = np.empty(2 * len(job.conns), dtype=np.int64)
    q[0::2] = job.conn_src_nic
    q[1::2] = job.conn_dst_nic
    return q


class BatchStream:
    """Collects the engine's rows (``add`` is a :data:`pulse.sim.engine.RowSink`) and writes
    every batch window once it is complete: batch ``b`` of every NIC holds the epochs
    ``[b*W, (b+1)*W)``, rows sorted by (flow, epoch), empty windows included."""

    def __init__(self, w: TraceWriter, job: Job, qpn: np.ndarray, t_grid0: int) -> None:
        cfg = job.rc.cfg
        self.w = w
        self.job = cfg.job
        self.epoch = job.rc.epoch_ns
        self.K = cfg.nics_per_node
        self.n_nic = cfg.nodes * self.K
        self.W = max(1, int(cfg.batch_ms * 1e6) // self.epoch)
        self.qnic = qp_nic(job)
        self.qpn = qpn
        self.t_grid0 = t_grid0
        self.next_b = 0
        """Batches below this are written, on every NIC."""
        self.max_b = -1
        self._held: list[tuple[np.ndarray, ...]] = []
        self.batches = 0
        self.rows = 0

    def add(self, q: np.ndarray, e: np.ndarray, tx: np.ndarray, rx: np.ndarray, frontier: int | None) -> None:
        if len(q):
            self._held.append((q, e, tx, rx))
            self.max_b = max(self.max_b, int(e.max()) // self.W)
        if frontier is not None and frontier // self.W > self.next_b:
            self._write_upto(frontier // self.W)

    def finish(self, last_epoch: int) -> tuple[int, int]:
        """Write every batch left, up to the one holding ``last_epoch`` (the end of the run on
        the latest node clock); (batches, rows) written in all."""
        self._write_upto(max(last_epoch // self.W, self.max_b) + 1)
        return self.batches, self.rows

    def _write_upto(self, upto: int) -> None:
        q, e, tx, rx = (np.concatenate(x) for x in zip(*self._held, strict=True)) if self._held else \
            (np.zeros(0, np.int64),) * 4
        batch = e // self.W
        if len(batch) and int(batch.min()) < self.next_b:
            raise EncodeError("simulated epoch rows came after their batch was written")
        now = batch < upto
        self._held = [tuple(x[~now] for x in (q, e, tx, rx))] if not now.all() else []
        q, e, tx, rx, batch = q[now], e[now], tx[now], rx[now], batch[now]
        nic, flow = self.qnic[q], self.qpn[q]
        order = np.lexsort((e, flow, batch, nic))
        nic, flow, e, batch, tx, rx = nic[order], flow[order], e[order], batch[order], tx[order], rx[order]
        span = upto - self.next_b
        key = nic * span + (batch - self.next_b)
        erel = e - batch * self.W
        _check_rows(key, flow, erel, tx, rx)
        cols = [x.astype("<u4") for x in (flow, erel, tx, rx)]
        bounds = np.searchsorted(key, np.arange(self.n_nic * span + 1)).tolist()
        for k in range(self.n_nic):
            node, nk = node_name(k // self.K), nic_name(k % self.K)
            for i in range(span):
                lo, hi = bounds[k * span + i], bounds[k * span + i + 1]
                b = self.next_b + i
                # rows checked above (make_batch's rules, vectorised over the window)
                self.w.write_batch(EpochBatch(
                    node=node, nic=nk, t0_ns=self.t_grid0 + b * self.W * self.epoch, epoch_ns=self.epoch,
                    batch_seq=b, flow=cols[0][lo:hi], epoch=cols[1][lo:hi], tx_bytes=cols[2][lo:hi],
                    rx_bytes=cols[3][lo:hi], job=self.job))
        self.batches += self.n_nic * span
        self.rows += len(order)
        self.next_b = upto


def _check_rows(key: np.ndarray, flow: np.ndarray, epoch: np.ndarray, tx: np.ndarray, rx: np.ndarray) -> None:
    """The batch rules of pulse.samples for every batch at once: uint32 values, rows strictly
    sorted by (flow, epoch) within a batch, no row without bytes."""
    for name, x in (("flow", flow), ("epoch", epoch), ("tx_bytes", tx), ("rx_bytes", rx)):
        if len(x) and (int(x.min()) < 0 or int(x.max()) > 0xFFFFFFFF):
            raise EncodeError(f"simulated {name} outside uint32")
    same = key[1:] == key[:-1]
    bad = same & ((flow[1:] < flow[:-1]) | ((flow[1:] == flow[:-1]) & (epoch[1:] <= epoch[:-1])))
    if bad.any() or ((tx == 0) & (rx == 0)).any():
        raise EncodeError("simulated epoch rows are not strictly sorted or carry no bytes")
