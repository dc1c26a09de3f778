"""``simulate``: build the job, run the engine, write the trace directory."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pulse.sim.anomalies import Culprit, build_anomaly
from pulse.sim.batches import BatchStream, nic_name, node_name
from pulse.sim.config import ResolvedConfig, SimConfig
from pulse.sim.engine import RunResult, run_engine
from pulse.sim.trees import comm_trees
from pulse.sim.workload import Job, build_job, rail

from pulse import events as ev
from pulse.records import OpLevel
from pulse.trace import TraceWriter

T_BASE_NS = 1_796_000_000 * 1_000_000_000
"""True time of the simulation's t = 0 (2026-11-30, UTC)."""


@dataclasses.dataclass(frozen=True)
class SimSummary:
    scenario: str
    seed: int
    workload: str
    severity: float | None
    nodes: int
    gpus: int
    nics: int
    steps: int
    epoch_us: int
    simulated_s: float
    wall_s: float
    batches: int
    rows: int
    events: int
    ops: int
    hung: bool
    out: str
    algo: str = "ring"
    """The DP AllReduce algorithm the run used (``--algo``, or auto's choice)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def simulate(config: SimConfig, out: str | Path,
             progress: Callable[[int, int], None] | None = None) -> SimSummary:
    """Simulate ``config`` and write a trace directory at ``out`` (must be empty or absent)."""
    wall0 = time.perf_counter()
    rc = config.resolved()
    out = Path(out)
    _check_out(out)
    cfg = rc.cfg
    rng = np.random.default_rng([cfg.seed, 0x5EED])
    job = build_job(rc, rng)
    est_total = job.est_step_ns * cfg.steps
    onset = int(cfg.onset_ms * 1e6) if cfg.onset_ms is not None else int(0.35 * est_total)
    fault_end = onset + int(cfg.fault_duration_ms * 1e6) if cfg.fault_duration_ms is not None else None
    if rc.sc.name in ("nic-down", "gpu-hang") and fault_end is None:
        t_limit = onset + int(max(0.4 * est_total, 300e6))  # the job hangs: stop simulating it
    else:
        t_limit = int(4 * est_total + 1e9) + (fault_end - onset if fault_end is not None else 0)
    an, culprit = build_anomaly(job, rng, onset, t_limit)
    if fault_end is not None:
        an.end_ns = fault_end
    span = int(cfg.clock_offset_us * 1000)
    offsets = rng.integers(-span, span + 1, size=cfg.nodes).astype(np.int64) if span else np.zeros(cfg.nodes, np.int64)
    epoch = rc.epoch_ns
    eoff = -(-1_000_000 // epoch) * epoch + epoch * (-(-2 * span // epoch))
    qpn = _assign_qpns(job, rng)
    t_grid0 = T_BASE_NS - eoff
    with TraceWriter(out, job=cfg.job, epoch_ns=epoch, meta={"source": "pulse-sim"}) as w:
        stream = BatchStream(w, job, qpn, t_grid0)
        res = run_engine(job, an, offsets, eoff, cfg.seed, progress=progress, sink=stream.add)
        last_e = (res.t_end_ns + int(offsets.max()) + eoff) // epoch
        nb, nrows = stream.finish(last_e)
        _write_events(w, job, res, qpn, offsets)
        _write_oplevel(w, job, res, offsets)
        w.write_truth_columns(*_truth(job, res, qpn, offsets, culprit, onset, t_grid0, eoff, fault_end))
        events = w.events_written
    issued = int((res.part_issue >= 0).sum())
    return SimSummary(
        scenario=rc.sc.name, seed=cfg.seed, workload=rc.workload, severity=rc.severity, nodes=cfg.nodes,
        gpus=cfg.nodes * cfg.gpus_per_node, nics=cfg.nodes * cfg.nics_per_node, steps=cfg.steps,
        epoch_us=cfg.epoch_us, simulated_s=res.t_end_ns / 1e9, wall_s=time.perf_counter() - wall0,
        batches=nb, rows=nrows, events=events, ops=issued, hung=res.hung, out=str(out), algo=job.dp_algo)


def _check_out(out: Path) -> None:
    from pulse.errors import ConfigError
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not an empty directory")


def _assign_qpns(job: Job, rng: np.random.Generator) -> np.ndarray:
    """Local QPN of every QP (send QP = 2c, recv QP = 2c+1): unique per NIC, NCCL-like gaps."""
    cfg = job.rc.cfg
    n_nic = cfg.nodes * cfg.nics_per_node
    qnic = np.empty(2 * len(job.conns), dtype=np.int64)
    qnic[0::2] = job.conn_src_nic
    qnic[1::2] = job.conn_dst_nic
    qpn = np.empty_like(qnic)
    base = rng.integers(0x100, 0x4000, size=n_nic)
    for k in range(n_nic):
        idx = np.flatnonzero(qnic == k)
        steps = rng.integers(1, 4, size=len(idx))
        qpn[idx] = base[k] + np.cumsum(steps)
    return qpn


def _pid(node: int, gpu: int) -> int:
    return 40_000 + 131 * node + 7 * gpu


def _write_events(w: TraceWriter, job: Job, res: RunResult, qpn: np.ndarray, offsets: np.ndarray) -> None:
    cfg = job.rc.cfg
    name = cfg.job
    setup = {n: T_BASE_NS + int(offsets[n]) - 2_000_000 for n in range(cfg.nodes)}
    for cm in job.comms:
        for r, (node, gpu) in enumerate(cm.members):
            # trees are published for comms that run a tree AllReduce (ring-only traces keep
            # their bytes; NCCL itself logs its trees at init whatever it runs)
            trees = comm_trees(cm.trees, r, cm.nchannels) if cm.trees else None
            w.write_event(ev.CommEvent(job=name, node=node_name(node), comm_id=cm.comm_id, rank=r,
                                       nranks=len(cm.members), pid=_pid(node, gpu), rings=cm.rings,
                                       trees=trees, t_host_ns=setup[node], source="sim"))
    for c, (ci, ch, sr, dr) in enumerate(job.conns.tolist()):
        cm = job.comms[ci]
        for q, rank, peer, direction in ((2 * c, sr, dr, "send"), (2 * c + 1, dr, sr, "recv")):
            node, gpu = cm.members[rank]
            w.write_event(ev.FlowEvent(
                job=name, node=node_name(node), nic=nic_name(rail(job.rc, gpu)), flow=int(qpn[q]),
                comm_id=cm.comm_id, rank=rank, peer=peer, channel=ch, direction=direction, transport="roce",
                qpn=int(qpn[q]), remote_qpn=int(qpn[q ^ 1]), pid=_pid(node, gpu), source="sim",
                t_host_ns=setup[node] + 1_000_000))
    issued = np.flatnonzero(res.part_issue >= 0)
    t_host = res.part_issue[issued] + T_BASE_NS + offsets[job.part_node[issued]]
    for p, th in zip(issued[np.argsort(t_host, kind="stable")].tolist(), np.sort(t_host, kind="stable").tolist(),
                     strict=True):
        w.write_event(_op_event(job, p, int(th)))


def _op_event(job: Job, p: int, t_host: int) -> ev.OpEvent:
    # trusted: every value is computed here from the validated config (per-record validation
    # was a third of the writing time); tests read every trace back through the validating
    # decoders
    op = job.ops[int(job.part_op[p])]
    cm = job.comms[op.comm]
    rank = int(job.part_rank[p])
    kind = job.part_kind[p]
    n = len(cm.members)
    common = dict(job=job.rc.cfg.job, node=node_name(int(job.part_node[p])), comm_id=cm.comm_id, rank=rank,
                  seq=op.seq, dtype="bfloat16", proto="simple", nchannels=cm.nchannels, nranks=n,
                  t_host_ns=t_host, source="sim")
    if kind == "AllReduce":
        return ev.OpEvent.trusted(kind=kind, count=op.nbytes // 2, bytes=op.nbytes, algo=op.algo, **common)
    if kind in ("Send", "Recv"):
        peer = op.dst if kind == "Send" else op.src
        return ev.OpEvent.trusted(kind=kind, count=op.nbytes // 2, bytes=op.nbytes, peer=peer, **common)
    m = op.matrix
    assert m is not None
    peers = [q for q in range(n) if q != rank]
    sent = [int(m[rank, q]) for q in peers]
    return ev.OpEvent.trusted(kind="GroupP2P", count=sum(sent) // 2, bytes=sum(sent), group=op.seq, peers=peers,
                      peer_send_bytes=sent, peer_recv_bytes=[int(m[q, rank]) for q in peers], **common)


def _write_oplevel(w: TraceWriter, job: Job, res: RunResult, offsets: np.ndarray) -> None:
    cfg = job.rc.cfg
    started = np.flatnonzero(res.part_start >= 0)
    off = offsets[job.part_node[started]]
    start = res.part_start[started] + T_BASE_NS + off
    order = np.argsort(start, kind="stable")
    for i in order.tolist():
        p = int(started[i])
        op = job.ops[int(job.part_op[p])]
        cm = job.comms[op.comm]
        end = int(res.part_end[p])
        w.write_oplevel(OpLevel.trusted(  # values computed here, as for the op events
            job=cfg.job, node=node_name(int(job.part_node[p])), comm_id=cm.comm_id, rank=int(job.part_rank[p]),
            seq=op.seq, kind=job.part_kind[p], nranks=len(cm.members), start_ns=int(start[i]),
            end_ns=end + T_BASE_NS + int(off[i]) if end >= 0 else None))


def _truth(job: Job, res: RunResult, qpn: np.ndarray, offsets: np.ndarray, culprit: Culprit, onset: int,
           t_grid0: int, eoff: int, fault_end: int | None = None
           ) -> tuple[dict[str, Any], str, dict[str, Callable[[], Any]]]:
    rc: ResolvedConfig = job.rc
    cfg = rc.cfg
    K = cfg.nics_per_node
    epoch = rc.epoch_ns
    # segments whose sender issued the operator
    keep = np.flatnonzero(res.part_issue[job.seg_sp] >= 0)
    conn = job.seg_conn[keep]
    node = job.conn_src_node[conn]
    off = offsets[node]
    first, last = res.seg_first[keep], res.seg_last[keep]
    sent = first >= 0
    e_first = (first + off + eoff) // epoch
    e_last = (last + off + eoff) // epoch
    start = np.where(sent, t_grid0 + e_first * epoch, -1)
    end = np.where(sent, t_grid0 + (e_last + 1) * epoch, -1)
    # one column at a time (pulse.trace.TraceWriter.write_truth_columns): millions of segments
    # at the largest shapes
    nodes = [node_name(n) for n in range(cfg.nodes)]
    nics = [nic_name(k) for k in range(K)]
    segs: dict[str, Callable[[], Any]] = {
        "node": lambda: [nodes[n] for n in node.tolist()],
        "nic": lambda: [nics[x % K] for x in job.conn_src_nic[conn].tolist()],
        "flow": lambda: qpn[2 * conn].tolist(),
        "comm_id": lambda: [job.comms[c].comm_id for c in job.conns[conn, 0].tolist()],
        "seq": lambda: [job.ops[o].seq for o in job.seg_op[keep].tolist()],
        "start_ns": lambda: [s if ok else None for s, ok in zip(start.tolist(), sent.tolist(), strict=True)],
        "end_ns": lambda: [s if ok else None for s, ok in zip(end.tolist(), sent.tolist(), strict=True)],
        "bytes": lambda: res.seg_tx[keep].tolist(),
        "expected_bytes": lambda: job.seg_bytes[keep].tolist(),
        "complete": lambda: (res.seg_left[keep] == 0).tolist(),
    }
    cul_gpus = set(culprit.gpus)
    ranks = sorted({(cm.comm_id, r) for cm in job.comms for r, m in enumerate(cm.members) if m in cul_gpus})
    return {
        "scenario": rc.sc.name, "seed": cfg.seed, "severity": rc.severity, "workload": rc.workload,
        "culprit": {"nodes": [node_name(n) for n in culprit.nodes], "ranks": [list(x) for x in ranks],
                    "nics": [f"{node_name(n)}/{nic_name(k)}" for n, k in culprit.nics]},
        "level": rc.sc.level, "kind": rc.sc.kind, "onset_ns": T_BASE_NS + onset,
        "fault_end_ns": None if fault_end is None else T_BASE_NS + fault_end,
        "clock_offsets_ns": {node_name(n): int(offsets[n]) for n in range(cfg.nodes)},
        "cause": rc.sc.cause, "detail": culprit.detail,
        "sim": {"nodes": cfg.nodes, "gpus_per_node": cfg.gpus_per_node, "nics_per_node": K, "pp": cfg.pp,
                "dp": rc.dp, "steps": cfg.steps, "epoch_ns": epoch, "t0_true_ns": T_BASE_NS,
                "end_true_ns": T_BASE_NS + res.t_end_ns, "hung": res.hung},
    }, "segments", segs
