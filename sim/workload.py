"""The training job: its workload parameters and the per-node programs of every step, built
with :class:`pulse.sim.builder.Builder`; the messages of each step are laid out by
:mod:`pulse.sim.messages` only when the run reaches them."""

from __future__ import annotations

import dataclasses

import numpy as np
from pulse.sim.builder import COMPUTE, SLOTS, Builder, Comm, Op, StepSegs
from pulse.sim.config import ResolvedConfig
from pulse.sim.trees import Tree, choose_algo, tree_load


@dataclasses.dataclass(frozen=True)
class WorkloadParams:
    micro_batches: int
    fwd_ms: float
    bwd_ms: float
    opt_ms: float
    act_bytes: int
    buckets: int
    bucket_bytes: int
    dp_channels: int = 2
    pp_channels: int = 2
    ep_channels: int = 2
    moe_layers: int = 0
    attn_fwd_ms: float = 0.0
    expert_fwd_ms: float = 0.0
    a2a_peer_bytes: int = 0
    imbalance_sigma: float = 0.35


DENSE = WorkloadParams(micro_batches=8, fwd_ms=6.0, bwd_ms=12.0, opt_ms=4.0, act_bytes=8 << 20,
                       buckets=4, bucket_bytes=64 << 20)
MOE = WorkloadParams(micro_batches=4, fwd_ms=0.0, bwd_ms=0.0, opt_ms=4.0, act_bytes=8 << 20,
                     buckets=2, bucket_bytes=32 << 20, moe_layers=2, attn_fwd_ms=1.5,
                     expert_fwd_ms=2.0, a2a_peer_bytes=3 << 20)

@dataclasses.dataclass
class Job:
    """The static job, as arrays for the engine and lists for the writers. Its messages are
    not laid out here: ``steps`` holds each step's segments, from which
    :class:`pulse.sim.messages.Window` lays out the steps the run reaches."""

    rc: ResolvedConfig
    params: WorkloadParams
    comms: list[Comm]
    ops: list[Op]
    conns: np.ndarray  # [C, 4] comm, channel, src rank, dst rank
    conn_src_node: np.ndarray
    conn_dst_node: np.ndarray
    conn_src_nic: np.ndarray  # global NIC index node * nics + k
    conn_dst_nic: np.ndarray
    part_op: np.ndarray
    part_rank: np.ndarray
    part_node: np.ndarray
    part_gpu: np.ndarray
    part_prev: np.ndarray
    part_kind: list[str]
    part_pending: np.ndarray
    cts_lo: np.ndarray
    ps_lo: np.ndarray
    """Connections on which a part sends: ps_conn[ps_lo[p]:ps_hi[p]]."""
    ps_hi: np.ndarray
    ps_conn: np.ndarray
    cts_hi: np.ndarray
    cts_conn: np.ndarray
    cts_count: np.ndarray
    group_lo: np.ndarray
    group_hi: np.ndarray
    group_parts: np.ndarray
    prog_lo: np.ndarray
    prog_hi: np.ndarray
    instr_type: np.ndarray
    instr_arg: np.ndarray
    instr_jit: np.ndarray
    steps: list[StepSegs]
    step_parts: np.ndarray
    """Parts created up to the end of each step (parts are numbered in step order)."""
    step_last: np.ndarray
    """[steps, nodes]: each node's last instruction of each step but the last (-1: none;
    all -1 when the job must be laid out at once)."""
    seg_conn: np.ndarray
    seg_op: np.ndarray
    seg_sp: np.ndarray
    seg_nchunks: np.ndarray
    seg_bytes: np.ndarray
    est_step_ns: float
    dp_algo: str = "ring"

    @property
    def n_parts(self) -> int:
        return len(self.part_op)


def rail(rc: ResolvedConfig, gpu: int) -> int:
    return gpu * rc.cfg.nics_per_node // rc.cfg.gpus_per_node


def build_job(rc: ResolvedConfig, rng: np.random.Generator) -> Job:
    cfg = rc.cfg
    params = MOE if rc.workload == "moe" else DENSE
    if cfg.bucket_mb is not None:
        params = dataclasses.replace(params, bucket_bytes=bucket_bytes(cfg.bucket_mb))
    dp_algo = choose_algo(cfg.algo, params.bucket_bytes, rc.dp, params.dp_channels, cfg.nic_gbps)
    b = Builder(rc, rng)
    pp, dp, gpus = cfg.pp, rc.dp, cfg.gpus_per_node
    node_of = [[s * dp + d for d in range(dp)] for s in range(pp)]  # [stage][dp index]
    dp_comm = [[b.add_comm(f"dp-s{s}-g{g}", "dp", [(node_of[s][d], g) for d in range(dp)],
                           params.dp_channels, True) for g in range(gpus)] for s in range(pp)]
    pp_comm = [[[b.add_comm(f"pp-d{d}-g{g}" if pp == 2 else f"pp-s{s}-d{d}-g{g}", "pp",
                            [(node_of[s][d], g), (node_of[s + 1][d], g)], params.pp_channels, False)
                 for g in range(gpus)] for d in range(dp)] for s in range(pp - 1)]
    ep_comm = None
    if rc.workload == "moe":
        ep_comm = [[b.add_comm(f"ep-s{s}-g{g}", "ep", [(node_of[s][d], g) for d in range(dp)],
                               params.ep_channels, False) for g in range(gpus)] for s in range(pp)]
    M = params.micro_batches
    jit_sigma = 0.02

    for _step in range(cfg.steps):
        # operators of this step, created per comm in stream (= seq) order
        act = [[[[b.sendrecv(pp_comm[s][d][g], 0, 1, params.act_bytes) for g in range(gpus)]
                 for m in range(M)] for d in range(dp)] for s in range(pp - 1)]
        grad = [[[[b.sendrecv(pp_comm[s][d][g], 1, 0, params.act_bytes) for g in range(gpus)]
                  for m in range(M)] for d in range(dp)] for s in range(pp - 1)]
        buckets = [[[b.allreduce(dp_comm[s][g], params.bucket_bytes, dp_algo) for g in range(gpus)]
                    for _ in range(params.buckets)] for s in range(pp)]
        a2a: list[list[list[Op]]] = []
        if ep_comm is not None:
            # [stage][k] -> per gpu ops, k over (micro-batch, layer, phase) in program order
            for s in range(pp):
                seq_ops: list[list[Op]] = []
                for _phase in range(2):  # forward, backward
                    for _m in range(M):
                        for _l in range(params.moe_layers):
                            for _x in range(2):  # dispatch, combine
                                load = rng.lognormal(0.0, params.imbalance_sigma, size=dp)
                                noise = rng.lognormal(0.0, 0.1, size=(dp, dp))
                                mat = (params.a2a_peer_bytes * load[None, :] * noise).astype(np.int64)
                                mat = (mat // 2) * 2
                                np.fill_diagonal(mat, 0)
                                seq_ops.append([b.group_p2p(ep_comm[s][g], mat) for g in range(gpus)])
                a2a.append(seq_ops)

        def grp(ops: list[Op], rank: int) -> int:
            return b.group([o.parts[rank] for o in ops])

        for s in range(pp):
            for d in range(dp):
                node = node_of[s][d]
                step_sends: list[int] = []
                k = 0
                # forward
                for m in range(M):
                    if s > 0:
                        g = grp(act[s - 1][d][m], 1)
                        b.issue(node, g)
                        b.wait(node, g)
                    if ep_comm is not None:
                        for _l in range(params.moe_layers):
                            for x in range(2):
                                b.compute(node, params.attn_fwd_ms if x == 0 else params.expert_fwd_ms)
                                g = grp(a2a[s][k], d)
                                k += 1
                                b.issue(node, g)
                                b.wait(node, g)
                    else:
                        b.compute(node, params.fwd_ms)
                    if s < pp - 1:
                        g = grp(act[s][d][m], 0)
                        b.issue(node, g)
                        step_sends.append(g)
                # backward
                bucket_groups = []
                for m in range(M):
                    if s < pp - 1:
                        g = grp(grad[s][d][m], 0)
                        b.issue(node, g)
                        b.wait(node, g)
                    if ep_comm is not None:
                        for _l in range(params.moe_layers):
                            for x in range(2):
                                b.compute(node, 2 * (params.expert_fwd_ms if x == 0 else params.attn_fwd_ms))
                                g = grp(a2a[s][k], d)
                                k += 1
                                b.issue(node, g)
                                b.wait(node, g)
                    bwd = params.bwd_ms if ep_comm is None else 0.0
                    if m == M - 1:
                        for bi in range(params.buckets):
                            b.compute(node, max(bwd / params.buckets, 0.5))
                            g = grp(buckets[s][bi], d)
                            b.issue(node, g)
                            bucket_groups.append(g)
                    else:
                        if bwd > 0:
                            b.compute(node, bwd)
                    if s > 0:
                        g = grp(grad[s - 1][d][m], 1)
                        b.issue(node, g)
                        step_sends.append(g)
                for g in step_sends + bucket_groups:
                    b.wait(node, g)
                b.compute(node, params.opt_ms)
        b.end_step()

    job = finalize(b, rc, params, rng, jit_sigma)
    job.dp_algo = dp_algo
    return job


def bucket_bytes(mb: float) -> int:
    """A gradient bucket of ``mb`` MiB, in whole bfloat16 elements."""
    return max(2, int(mb * (1 << 20)) // 2 * 2)


def _estimate_step_ns(rc: ResolvedConfig, p: WorkloadParams, trees: tuple[Tree, Tree] | None) -> float:
    bw = rc.cfg.nic_gbps / 8.0  # bytes per ns
    n = rc.dp
    M, pp = p.micro_batches, rc.cfg.pp
    if rc.workload == "moe":
        per_mb = p.moe_layers * 3 * (p.attn_fwd_ms + p.expert_fwd_ms) * 1e6
        per_mb += 4 * p.moe_layers * (n - 1) * p.a2a_peer_bytes / bw
    else:
        per_mb = (p.fwd_ms + p.bwd_ms) * 1e6
    load = 2 * (n - 1) / n if trees is None else tree_load(trees, p.dp_channels)
    dp_ns = p.buckets * p.bucket_bytes * load / bw
    return (M + pp - 1) * per_mb + dp_ns + p.opt_ms * 1e6


def finalize(b: Builder, rc: ResolvedConfig, params: WorkloadParams, rng: np.random.Generator,
             jit_sigma: float) -> Job:
    if b.seg_conn or not b.step_segs:
        b.end_step()  # a job not built in steps (tests): one step
    cfg = rc.cfg
    nics = cfg.nics_per_node
    conns = np.array(b.conns, dtype=np.int64).reshape(-1, 4)
    C = len(conns)
    comm_nodes = [np.array([m[0] for m in c.members]) for c in b.comms]
    comm_gpus = [np.array([m[1] for m in c.members]) for c in b.comms]
    src_node = np.array([comm_nodes[c][s] for c, _, s, _ in b.conns], dtype=np.int64)
    dst_node = np.array([comm_nodes[c][d] for c, _, _, d in b.conns], dtype=np.int64)
    src_gpu = np.array([comm_gpus[c][s] for c, _, s, _ in b.conns], dtype=np.int64)
    dst_gpu = np.array([comm_gpus[c][d] for c, _, _, d in b.conns], dtype=np.int64)
    src_nic = src_node * nics + src_gpu * nics // cfg.gpus_per_node
    dst_nic = dst_node * nics + dst_gpu * nics // cfg.gpus_per_node

    # the job's segment arrays; each step's table keeps views of them, not copies
    steps = b.step_segs
    bounds = [(x.s0, x.s0 + len(x)) for x in steps]
    cols = {}
    for name in ("conn", "op", "n", "sp", "rp", "nbytes"):
        cols[name] = np.concatenate([getattr(x, name) for x in steps])
        for x, (lo, hi) in zip(steps, bounds, strict=True):
            setattr(x, name, cols[name][lo:hi])
    seg_conn = cols["conn"].astype(np.int64)
    seg_n = cols["n"].astype(np.int64)
    seg_sp = cols["sp"].astype(np.int64)
    seg_rp = cols["rp"].astype(np.int64)

    ops = b.ops
    P = len(b.part_op)
    nz = seg_n > 0
    part_pending = (np.bincount(seg_sp[nz], weights=seg_n[nz], minlength=P)
                    + np.bincount(seg_rp[nz], weights=seg_n[nz], minlength=P)).astype(np.int64)
    cts = np.stack([seg_rp[nz], seg_conn[nz], np.minimum(SLOTS, seg_n[nz])], axis=1).reshape(-1, 3)
    cts = cts[np.lexsort((cts[:, 2], cts[:, 1], cts[:, 0]))]
    send_key = np.unique(seg_sp[nz] * max(C, 1) + seg_conn[nz])
    del seg_conn, seg_n, seg_rp, nz
    sends = np.stack([send_key // max(C, 1), send_key % max(C, 1)], axis=1).reshape(-1, 2)
    del send_key
    cts_lo = np.searchsorted(cts[:, 0], np.arange(P), side="left").astype(np.int64)
    cts_hi = np.searchsorted(cts[:, 0], np.arange(P), side="right").astype(np.int64)
    ps_lo = np.searchsorted(sends[:, 0], np.arange(P), side="left").astype(np.int64)
    ps_hi = np.searchsorted(sends[:, 0], np.arange(P), side="right").astype(np.int64)

    part_op = np.array(b.part_op, dtype=np.int64)
    part_rank = np.array(b.part_rank, dtype=np.int64)
    part_comm = np.array([ops[o].comm for o in b.part_op], dtype=np.int64)
    part_node = np.array([comm_nodes[c][r] for c, r in zip(part_comm, part_rank, strict=True)], dtype=np.int64)
    part_gpu = np.array([comm_gpus[c][r] for c, r in zip(part_comm, part_rank, strict=True)], dtype=np.int64)

    glens = np.array([len(g) for g in b.groups], dtype=np.int64)
    group_hi = np.cumsum(glens)
    group_lo = group_hi - glens
    group_parts = np.concatenate([np.array(g, dtype=np.int64) for g in b.groups]) if b.groups else np.zeros(0, np.int64)

    plens = np.array([len(p) for p in b.programs], dtype=np.int64)
    prog_hi = np.cumsum(plens)
    prog_lo = prog_hi - plens
    flat = [ins for p in b.programs for ins in p]
    instr_type = np.array([t for t, _ in flat], dtype=np.int64)
    instr_arg = np.array([int(a) for _, a in flat], dtype=np.int64)
    instr_jit = np.exp(rng.normal(0.0, jit_sigma, size=len(flat)))
    step_last = _step_last(b, prog_lo, instr_type, instr_arg)

    return Job(
        rc=rc, params=params, comms=b.comms, ops=ops, conns=conns,
        conn_src_node=src_node, conn_dst_node=dst_node, conn_src_nic=src_nic, conn_dst_nic=dst_nic,
        part_op=part_op, part_rank=part_rank, part_node=part_node, part_gpu=part_gpu,
        part_prev=np.array(b.part_prev, dtype=np.int64), part_kind=b.part_kind, part_pending=part_pending,
        cts_lo=cts_lo, cts_hi=cts_hi, ps_lo=ps_lo, ps_hi=ps_hi, ps_conn=sends[:, 1].astype(np.int32),
        cts_conn=cts[:, 1].astype(np.int32), cts_count=cts[:, 2].astype(np.int32),
        group_lo=group_lo, group_hi=group_hi, group_parts=group_parts,
        prog_lo=prog_lo, prog_hi=prog_hi, instr_type=instr_type, instr_arg=instr_arg, instr_jit=instr_jit,
        steps=steps, step_parts=np.array(b.step_parts, dtype=np.int64), step_last=step_last,
        seg_conn=cols["conn"], seg_op=cols["op"], seg_sp=cols["sp"], seg_nchunks=cols["n"], seg_bytes=cols["nbytes"],
        est_step_ns=_estimate_step_ns(rc, params, next((c.trees for c in b.comms if c.trees), None)),
    )


def _step_last(b: Builder, prog_lo: np.ndarray, instr_type: np.ndarray, instr_arg: np.ndarray) -> np.ndarray:
    """Each node's last instruction of each step but the last, when every one of them is a
    compute of positive length: a node then cannot pass it in the tick it reaches it, so the
    run can stop there and lay out the next step before any of its operators is issued.
    Otherwise (no such bound) all -1: the whole job is laid out at once."""
    ends = np.array(b.step_prog_end, dtype=np.int64).reshape(len(b.step_prog_end), -1)
    out = np.full(ends.shape, -1, dtype=np.int64)
    if len(ends) < 2:
        return out
    starts = np.vstack([np.zeros((1, ends.shape[1]), dtype=np.int64), ends[:-1]])
    last = prog_lo[None, :] + ends - 1
    ok = bool((ends > starts)[:-1].all())
    if ok:
        ok = bool(((instr_type[last[:-1]] == COMPUTE) & (instr_arg[last[:-1]] > 0)).all())
    if ok:
        out[:-1] = last[:-1]
    return out
