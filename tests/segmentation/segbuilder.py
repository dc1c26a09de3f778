"""A small hand-made trace builder: hook events + epoch batches with known truth."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.records import OpMetrics
from pulse.samples import EpochBatch, make_batch

EPOCH_NS = 32_000


@dataclasses.dataclass
class TruthSeg:
    node: str
    nic: str
    flow: int
    comm_id: str
    seq: int
    start_ns: int
    end_ns: int
    nbytes: int
    complete: bool


class TraceBuilder:
    def __init__(self, epoch_ns: int = EPOCH_NS, t0_ns: int = 1_000_000_000, job: str = "job") -> None:
        self.epoch_ns = epoch_ns
        self.t0_ns = t0_ns - t0_ns % epoch_ns
        self.job = job
        self.events: list = []
        # (node, nic) -> flow -> epoch -> [tx, rx]
        self.rows: dict[tuple[str, str], dict[int, dict[int, list[int]]]] = defaultdict(
            lambda: defaultdict(lambda: defaultdict(lambda: [0, 0])))
        self.truth: list[TruthSeg] = []

    def comm(self, comm_id: str, nranks: int, node_of: dict[int, str], rings=None, trees=None) -> None:
        for r in range(nranks):
            self.events.append(CommEvent(job=self.job, node=node_of[r], comm_id=comm_id, rank=r,
                                         nranks=nranks, rings=rings, trees=trees))

    def flow(self, node: str, nic: str, flow: int, comm_id: str | None, rank: int | None,
             peer: int | None, channel: int | None = 0, direction: str | None = "send") -> None:
        self.events.append(FlowEvent(job=self.job, node=node, nic=nic, flow=flow, comm_id=comm_id,
                                     rank=rank, peer=peer, channel=channel, direction=direction))

    def op(self, node: str, comm_id: str, rank: int, seq: int, kind: str, nbytes: int, **kw) -> OpEvent:
        ev = OpEvent(job=self.job, node=node, comm_id=comm_id, rank=rank, seq=seq, kind=kind,
                     count=nbytes, dtype="bytes", bytes=nbytes, **kw)
        self.events.append(ev)
        return ev

    def send(self, node: str, nic: str, flow: int, epoch: int, tx: int, rx: int = 0) -> None:
        cell = self.rows[(node, nic)][flow][epoch]
        cell[0] += tx
        cell[1] += rx

    def transfer(self, node: str, nic: str, flow: int, first_epoch: int, nbytes: int, per_epoch: int,
                 comm_id: str = "c", seq: int = 0, gaps: dict[int, int] | None = None,
                 stop_after: int | None = None) -> int:
        """Send nbytes from first_epoch at per_epoch bytes/epoch (idle epochs from ``gaps``:
        {after_k_epochs: idle}); record truth; returns the last epoch used."""
        left = nbytes
        e = first_epoch
        k = 0
        sent = 0
        gaps = gaps or {}
        while left > 0:
            if stop_after is not None and sent >= stop_after:
                break
            n = min(per_epoch, left) if stop_after is None else min(per_epoch, left, stop_after - sent)
            self.send(node, nic, flow, e, n)
            left -= n
            sent += n
            last = e
            k += 1
            e += 1 + gaps.get(k, 0)
        self.truth.append(TruthSeg(node, nic, flow, comm_id, seq, self.t0_ns + first_epoch * self.epoch_ns,
                                   self.t0_ns + (last + 1) * self.epoch_ns, sent, left == 0))
        return last

    def batches(self, window: int = 16, rx: bool = True) -> list[EpochBatch]:
        out = []
        for (node, nic), flows in sorted(self.rows.items()):
            cells = sorted((f, e, v[0], v[1]) for f, es in flows.items() for e, v in es.items())
            if not cells:
                continue
            arr = np.array(cells, dtype=np.int64)
            last = int(arr[:, 1].max())
            for seq, w0 in enumerate(range(0, last + 1, window)):
                sel = (arr[:, 1] >= w0) & (arr[:, 1] < w0 + window)
                sub = arr[sel]
                out.append(make_batch(node=node, nic=nic, t0_ns=self.t0_ns + w0 * self.epoch_ns,
                                      epoch_ns=self.epoch_ns, batch_seq=seq, flow=sub[:, 0],
                                      epoch=sub[:, 1] - w0, tx_bytes=sub[:, 2],
                                      rx_bytes=sub[:, 3] if rx else None, job=self.job))
        return out


def random_trace(seed: int, nranks: int = 3, nops: int = 12, nch: int = 2, epoch_ns: int = EPOCH_NS,
                 hang_after: int | None = None) -> TraceBuilder:
    """A ring AllReduce comm over ``nranks`` nodes plus a P2P comm, with random sizes,
    random idle gaps (some back-to-back), mid-operator stalls and retransmission surplus.
    ``hang_after``: rank 0 stops sending halfway through that op (and everything after)."""
    rng = np.random.default_rng(seed)
    tb = TraceBuilder(epoch_ns=epoch_ns)
    nodes = {r: f"node-{r:02d}" for r in range(nranks)}
    tb.comm("dp", nranks, nodes, rings=[list(range(nranks))] * nch)
    tb.comm("pp", 2, {0: nodes[0], 1: nodes[1]})
    fid = 1000
    flows: dict[tuple[int, int], int] = {}
    for r in range(nranks):
        for ch in range(nch):
            flows[(r, ch)] = fid
            tb.flow(nodes[r], "mlx5_0", fid, "dp", r, (r + 1) % nranks, ch, "send")
            tb.flow(nodes[r], "mlx5_0", fid + 1, "dp", r, (r - 1) % nranks, ch, "recv")
            fid += 2
    p2p = 5000
    tb.flow(nodes[0], "mlx5_1", p2p, "pp", 0, 1, 0, "send")
    tb.flow(nodes[1], "mlx5_1", p2p + 1, "pp", 1, 0, 0, "recv")
    e = 5
    hung = False
    for seq in range(nops):
        S = int(rng.choice([40_000, 300_000, 2_000_000, 6_000_000]))
        for r in range(nranks):
            tb.op(nodes[r], "dp", r, seq, "AllReduce", S, algo="ring", nchannels=nch, nranks=nranks,
                  t_host_ns=tb.t0_ns + e * epoch_ns - 10_000)
        per_flow = int(2 * (nranks - 1) / nranks * S / nch)
        last_any = e
        for r in range(nranks):
            for ch in range(nch):
                rate = int(rng.integers(60_000, 400_000))
                gaps = {}
                if rng.random() < 0.3:
                    gaps[int(rng.integers(1, 4))] = int(rng.integers(1, 40))  # peer wait mid-op
                surplus = int(rng.choice([0, 0, 0, 128, 3000]))
                stop = None
                if hang_after is not None and seq >= hang_after and r == 0:
                    stop = per_flow // 2 if seq == hang_after else 0
                if stop == 0:
                    tb.truth.append(TruthSeg(nodes[r], "mlx5_0", flows[(r, ch)], "dp", seq, 0, 0, 0, False))
                    continue
                last = tb.transfer(nodes[r], "mlx5_0", flows[(r, ch)], e, per_flow + surplus, rate,
                                   comm_id="dp", seq=seq, gaps=gaps, stop_after=stop)
                if stop is not None:
                    hung = True
                last_any = max(last_any, last)
        if hung:
            break
        gap = int(rng.choice([0, 1, 4, 10, 200]))
        e = last_any + 1 + gap
        if seq % 3 == 0:
            nb = int(rng.choice([100_000, 1_000_000]))
            tb.op(nodes[0], "pp", 0, seq // 3, "Send", nb, peer=1, nchannels=1)
            tb.op(nodes[1], "pp", 1, seq // 3, "Recv", nb, peer=0, nchannels=1)
            tb.transfer(nodes[0], "mlx5_1", p2p, e, nb, 250_000, comm_id="pp", seq=seq // 3)
    return tb


def stream_node(node: str, events: list, batches: list[EpochBatch]) -> list[OpMetrics]:
    """One node's records from the streaming form (its batches fed in order, then finish),
    in the batch form's (comm, rank, seq) order."""
    from pulse.segmentation.streaming import NodeSegmenter

    seg = NodeSegmenter(node)
    got = seg.add_events(events)
    for b in batches:
        if b.node == node:
            got += seg.update(b)
    got += seg.finish()
    return sorted(got, key=lambda m: (m.comm_id, m.rank, m.seq))
