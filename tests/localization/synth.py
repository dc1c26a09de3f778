"""Hand-built operator metric sets for the localization rule tests.

A small job: ``n`` nodes, one rank per node per communicator, one communicator per rail
(rail k = NIC mlx5_k), each a ring. Every operator is described by per-rank fields that a
test can override through ``tweak(comm, seq, rank, fields) -> fields | None`` (None drops
the record: the rank never started it, or its data is missing).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pulse.events import CommEvent, FlowEvent
from pulse.records import OpLevel, OpMetrics

EPOCH = 32_000
PERIOD = 20_000_000      # 20 ms between operators of one communicator
ACT = 3_200_000          # 100 epochs of traffic
DUR = 3_600_000
BYTES = 64 << 20


def node(i: int) -> str:
    return f"node-{i:02d}"


def rings(n: int, rails: int) -> dict[str, list[int]]:
    """One ring per rail; rail 1 uses a different order so node pairs differ per rail."""
    out = {}
    for k in range(rails):
        if k % 2 == 0:
            out[f"dp{k}"] = list(range(n))
        else:
            order = list(range(0, n, 2)) + list(range(1, n, 2))
            out[f"dp{k}"] = order
    return out


def rail(comm: str, shared: bool) -> int:
    """The NIC a communicator uses: its own rail, or (shared) two communicators per NIC."""
    k = int(comm[2:])
    return k // 2 if shared else k


def events(n: int = 4, rails: int = 2, job: str = "job", shared: bool = False) -> list:
    evs: list = []
    flow = 1
    for comm, ring in rings(n, rails).items():
        k = int(comm[2:])
        for pos, r in enumerate(ring):
            nxt = ring[(pos + 1) % n]
            evs.append(CommEvent(job=job, node=node(r), comm_id=comm, rank=r, nranks=n, pid=1000 + k, rings=[ring]))
            evs.append(FlowEvent(job=job, node=node(r), nic=f"mlx5_{rail(comm, shared)}", flow=flow, comm_id=comm, rank=r, peer=nxt,
                                 channel=0, direction="send"))
            flow += 1
    return evs


Tweak = Callable[[str, int, int, dict], "dict | None"]


def metrics(n: int = 4, rails: int = 2, ops: int = 40, tweak: Tweak | None = None, seed: int = 0,
            kind: str = "AllReduce", job: str = "job", offsets: bool = True, shared: bool = False) -> list[OpMetrics]:
    rng = np.random.default_rng(seed)
    off = rng.integers(-100_000, 100_000, n) if offsets else np.zeros(n, dtype=np.int64)
    out = []
    for comm in rings(n, rails):
        k = int(comm[2:])
        for seq in range(ops):
            for r in range(n):
                act = ACT + int(rng.integers(0, 3)) * EPOCH
                start = seq * PERIOD + k * 5_000_000 + int(off[r]) + int(rng.integers(0, 20_000))
                f = {"start_ns": start, "t_host_ns": start - 100_000, "duration_ns": DUR + int(rng.integers(0, 40_000)), "act_ns": act,
                     "volume_bytes": BYTES, "expected_bytes": BYTES, "complete": True}
                if tweak is not None:
                    f = tweak(comm, seq, r, f)
                    if f is None:
                        continue
                rate = f["volume_bytes"] / (f["act_ns"] / 1e9) if f["act_ns"] else 0.0
                out.append(OpMetrics(job=job, node=node(r), comm_id=comm, seq=seq, rank=r, kind=kind, nranks=n,
                                     start_ns=f["start_ns"], end_ns=f["start_ns"] + f["duration_ns"],
                                     duration_ns=f["duration_ns"], act_ns=f["act_ns"],
                                     volume_bytes=f["volume_bytes"], expected_bytes=f["expected_bytes"],
                                     complete=f["complete"], active_rate=rate, flows=1, epoch_ns=EPOCH,
                                     nics=[f"mlx5_{rail(comm, shared)}"], t_host_ns=f["t_host_ns"]))
    return out


def oplevel(ms: list[OpMetrics]) -> list[OpLevel]:
    return [OpLevel(job=m.job, node=m.node, comm_id=m.comm_id, rank=m.rank, seq=m.seq, kind=m.kind,
                    nranks=m.nranks, start_ns=m.start_ns, end_ns=m.end_ns if m.complete else None) for m in ms]


def comm_events(comm: str, nodes: list[int], nics: list[str], flow0: int, job: str = "job") -> list:
    """Comm and send-flow events of a communicator whose rank r is on ``nodes[r]`` and
    sends on ``nics[r]`` to the next rank (a ring; two ranks: each other)."""
    from pulse.events import CommEvent, FlowEvent
    n = len(nodes)
    out: list = []
    for rank, nd in enumerate(nodes):
        out.append(CommEvent(job=job, node=node(nd), comm_id=comm, rank=rank, nranks=n, pid=1,
                             rings=[list(range(n))]))
        out.append(FlowEvent(job=job, node=node(nd), nic=nics[rank], flow=flow0 + rank, comm_id=comm, rank=rank,
                             peer=(rank + 1) % n, channel=0, direction="send"))
    return out


def record(comm: str, seq: int, rank: int, nd: int, *, kind: str, nranks: int, start: int, end: int, t_host: int,
           nic: str, act: int = 320_000, nbytes: int = 8 << 20, job: str = "job", **extra) -> OpMetrics:
    """One complete operator record with the given timing (wire start/end, host issue)."""
    return OpMetrics(job=job, node=node(nd), comm_id=comm, seq=seq, rank=rank, kind=kind, nranks=nranks,
                     start_ns=start, end_ns=end, duration_ns=end - start, act_ns=act, volume_bytes=nbytes,
                     expected_bytes=nbytes, complete=True, active_rate=nbytes / (act * 1e-9), flows=1,
                     epoch_ns=EPOCH, nics=[nic], t_host_ns=t_host, **extra)
