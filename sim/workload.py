"""The training job: communicators, operators, per-node programs and NCCL-like chunk graphs.

Everything here is static (known before the run): which operator moves which chunks over
which connection, and in which order each node computes, issues and waits. *When* things
happen is decided by the engine.

Chunk graph, per (operator, connection) *segment*:
- ring collectives (AllReduce: 2(n-1) ring steps per loop, AllGather/ReduceScatter: n-1):
  one ring step moves a 1 MiB chunk: CHUNK_STEPS network steps of 512 KiB, which the GPU
  processes as slices of SLICE_STEPS steps (collectives synchronise at slice granularity).
  Message w of ring step k on rank r's out-edge needs the whole matching slice of ring step
  k-1 to have arrived on its in-edge (the received data is reduced/forwarded), except at the
  first ring step of a loop; the in-edge message is *consumed* (its slot freed) when the
  message forwarding it is posted, or on arrival at the last ring step of a loop.
  (NCCL's SIMPLE ring uses chunkSteps 4 / sliceSteps 2; one slice per chunk keeps the 1 MiB
  slice and avoids modelling the intra-chunk slice pipelining.)
- tree AllReduce (NCCL's double binary tree, docs/sim.md): per channel, every tree edge
  carries the channel's share of the data in messages of one NCCL step (512 KiB, halved
  for small operators as NCCL's tree chunking does). Message j up to the parent needs
  message j of every child to have arrived (reduce); message j down to a child needs
  message j from the parent (at the root: from every child) to have arrived (broadcast).
  A received message is consumed when every message forwarding it has been posted (at a
  leaf, on arrival).
- P2P (Send/Recv, grouped): 128 KiB chunks, consumed on arrival.
- flow control: chunk j of a segment needs the slot freed by the consumption of chunk j-8
  (NCCL_STEPS = 8); the first 8 need the receiver to have started the operator.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from pulse.sim.config import ResolvedConfig
from pulse.sim.trees import Tree, channel_tree, choose_algo, double_tree, tree_load

SLOTS = 8
NET_STEP_BYTES = 512 * 1024
CHUNK_STEPS = 2
SLICE_STEPS = 2
RING_STEP_BYTES = CHUNK_STEPS * NET_STEP_BYTES
P2P_CHUNK_BYTES = 128 * 1024
ALIGN = 128

COMPUTE, ISSUE, WAIT = 0, 1, 2


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
class Comm:
    comm_id: str
    kind: str  # dp | pp | ep
    members: list[tuple[int, int]]  # (node, gpu) per rank
    nchannels: int
    rings: list[list[int]] | None = None
    nseq: int = 0
    trees: tuple[Tree, Tree] | None = None
    """NCCL's double binary tree, set once an operator of the comm runs as a tree."""


@dataclasses.dataclass
class Op:
    comm: int
    seq: int
    kind: str  # AllReduce | SendRecv | GroupP2P
    nbytes: int
    parts: dict[int, int]  # rank -> part id
    src: int = -1  # SendRecv
    dst: int = -1
    matrix: np.ndarray | None = None  # GroupP2P bytes[r, q]
    algo: str = "ring"


def _align(x: np.ndarray | int) -> np.ndarray | int:
    return -(-x // ALIGN) * ALIGN


class Builder:
    def __init__(self, rc: ResolvedConfig, rng: np.random.Generator) -> None:
        self.rc = rc
        self.rng = rng
        self.comms: list[Comm] = []
        self.conn_key: dict[tuple[int, int, int, int], int] = {}
        self.conns: list[tuple[int, int, int, int]] = []  # comm, channel, src rank, dst rank
        self.ops: list[Op] = []
        # parts
        self.part_op: list[int] = []
        self.part_rank: list[int] = []
        self.part_prev: list[int] = []
        self.part_kind: list[str] = []
        self._stream_last: dict[tuple[int, int], int] = {}
        # segments
        self.seg_conn: list[int] = []
        self.seg_op: list[int] = []
        self.seg_sizes: list[np.ndarray | int] = []
        """Message sizes of a segment, or for P2P its bytes (P2P_CHUNK_BYTES messages, the
        last one shorter), expanded in finalize for all segments at once."""
        self.seg_dep_seg: list[int] = []
        self.seg_steps: list[int] = []  # ring steps per loop (0: P2P)
        self.seg_tree: list[list[int] | None] = []
        """Tree segments: the segments whose message j message j waits for and forwards."""
        self.tree_segs: list[int] = []
        self.seg_n: list[int] = []
        self.seg_sp: list[int] = []  # sending part
        self.seg_rp: list[int] = []  # receiving part
        # programs
        self.groups: list[list[int]] = []
        self.programs: list[list[tuple[int, float]]] = [[] for _ in range(rc.cfg.nodes)]

    # -- topology ---------------------------------------------------------------------------
    def add_comm(self, comm_id: str, kind: str, members: list[tuple[int, int]], nch: int,
                 ring: bool) -> int:
        rings = [list(range(len(members))) for _ in range(nch)] if ring else None
        self.comms.append(Comm(comm_id, kind, members, nch, rings))
        return len(self.comms) - 1

    def conn(self, comm: int, ch: int, src: int, dst: int) -> int:
        key = (comm, ch, src, dst)
        c = self.conn_key.get(key)
        if c is None:
            c = len(self.conns)
            self.conn_key[key] = c
            self.conns.append(key)
        return c

    # -- operators --------------------------------------------------------------------------
    def _new_op(self, comm: int, kind: str, nbytes: int, ranks: list[int], part_kinds: list[str]) -> Op:
        seq = self._next_seq(comm)
        op = Op(comm=comm, seq=seq, kind=kind, nbytes=nbytes, parts={})
        oi = len(self.ops)
        self.ops.append(op)
        for r, pk in zip(ranks, part_kinds, strict=True):
            p = len(self.part_op)
            self.part_op.append(oi)
            self.part_rank.append(r)
            self.part_kind.append(pk)
            self.part_prev.append(self._stream_last.get((comm, r), -1))
            self._stream_last[(comm, r)] = p
            op.parts[r] = p
        return op

    def _next_seq(self, comm: int) -> int:
        c = self.comms[comm]
        c.nseq += 1
        return c.nseq - 1

    def _segment(self, op: int, conn: int, sizes: np.ndarray | int, dep_seg: int = -1, steps: int = 0) -> int:
        _, _, src, dst = self.conns[conn]
        parts = self.ops[op].parts
        self.seg_sp.append(parts[src])
        self.seg_rp.append(parts[dst])
        if isinstance(sizes, int):
            self.seg_n.append(-(-sizes // P2P_CHUNK_BYTES) if sizes > 0 else 0)
        else:
            self.seg_n.append(len(sizes))
        self.seg_conn.append(conn)
        self.seg_op.append(op)
        self.seg_sizes.append(sizes)
        self.seg_dep_seg.append(dep_seg)
        self.seg_steps.append(steps)
        self.seg_tree.append(None)
        return len(self.seg_conn) - 1

    def allreduce(self, comm: int, nbytes: int, algo: str = "ring") -> Op:
        if algo == "tree":
            return self.tree_allreduce(comm, nbytes)
        cm = self.comms[comm]
        n = len(cm.members)
        op = self._new_op(comm, "AllReduce", nbytes, list(range(n)), ["AllReduce"] * n)
        oi = len(self.ops) - 1
        steps = 2 * (n - 1)
        per_ch = -(-nbytes // cm.nchannels)
        loop = n * RING_STEP_BYTES
        nloops = max(1, -(-per_ch // loop))
        data = np.full(nloops, loop, dtype=np.int64)
        data[-1] = per_ch - loop * (nloops - 1)
        piece = _align(-(-data // n))
        msg = _align(-(-piece // CHUNK_STEPS))
        sizes = np.repeat(msg, steps * CHUNK_STEPS)
        for ch in range(cm.nchannels):
            ring = cm.rings[ch] if cm.rings else list(range(n))
            segs = []
            for i in range(n):
                src, dst = ring[i], ring[(i + 1) % n]
                segs.append(self._segment(oi, self.conn(comm, ch, src, dst), sizes, steps=steps))
            for i in range(n):  # out-edge of ring[i] depends on its in-edge (from ring[i-1])
                self.seg_dep_seg[segs[i]] = segs[(i - 1) % n]
        return op

    def tree_allreduce(self, comm: int, nbytes: int) -> Op:
        cm = self.comms[comm]
        n = len(cm.members)
        if cm.trees is None:
            cm.trees = double_tree(n)
        op = self._new_op(comm, "AllReduce", nbytes, list(range(n)), ["AllReduce"] * n)
        op.algo = "tree"
        oi = len(self.ops) - 1
        sizes = _tree_sizes(nbytes, cm.nchannels, max(t.depth for t in cm.trees))
        for ch in range(cm.nchannels):
            t = channel_tree(cm.trees, ch, cm.nchannels)
            up = {r: self._segment(oi, self.conn(comm, ch, r, t.parent[r]), sizes)
                  for r in range(n) if t.parent[r] >= 0}
            down = {k: self._segment(oi, self.conn(comm, ch, r, k), sizes)
                    for r in range(n) for k in t.children[r]}
            for r in range(n):
                reduced = [up[k] for k in t.children[r]]
                if t.parent[r] >= 0:
                    self.seg_tree[up[r]] = reduced
                    self.tree_segs.append(up[r])
                for k in t.children[r]:
                    # the root turns the reduced data around; others pass the parent's down
                    self.seg_tree[down[k]] = reduced if t.parent[r] < 0 else [down[r]]
                    self.tree_segs.append(down[k])
        return op

    def sendrecv(self, comm: int, src: int, dst: int, nbytes: int) -> Op:
        cm = self.comms[comm]
        op = self._new_op(comm, "SendRecv", nbytes, [src, dst], ["Send", "Recv"])
        op.src, op.dst = src, dst
        oi = len(self.ops) - 1
        for ch in range(cm.nchannels):
            self._segment(oi, self.conn(comm, ch, src, dst), -(-nbytes // cm.nchannels))
        return op

    def group_p2p(self, comm: int, matrix: np.ndarray) -> Op:
        cm = self.comms[comm]
        n = len(cm.members)
        op = self._new_op(comm, "GroupP2P", 0, list(range(n)), ["GroupP2P"] * n)
        op.matrix = matrix
        oi = len(self.ops) - 1
        rows = matrix.tolist()
        for r in range(n):
            for q in range(n):
                if q == r or rows[r][q] == 0:
                    continue
                per_ch = -(-int(rows[r][q]) // cm.nchannels)
                for ch in range(cm.nchannels):
                    self._segment(oi, self.conn(comm, ch, r, q), per_ch)
        return op

    # -- programs ---------------------------------------------------------------------------
    def group(self, parts: list[int]) -> int:
        self.groups.append(parts)
        return len(self.groups) - 1

    def compute(self, node: int, ms: float) -> None:
        self.programs[node].append((COMPUTE, ms * 1e6))

    def issue(self, node: int, g: int) -> None:
        self.programs[node].append((ISSUE, g))

    def wait(self, node: int, g: int) -> None:
        self.programs[node].append((WAIT, g))


def tree_chunk_bytes(nbytes: int, nchannels: int, depth: int) -> int:
    """NCCL's SIMPLE tree chunk: one 512 KiB step, halved while the operator would give each
    channel too few chunks to fill the tree's pipeline."""
    chunk = NET_STEP_BYTES
    for per_depth, floor in ((8, 128 * 1024), (4, 64 * 1024), (1, 32 * 1024)):
        while nbytes // (nchannels * chunk) < depth * per_depth and chunk > floor:
            chunk //= 2
    return chunk


def _tree_sizes(nbytes: int, nchannels: int, depth: int) -> np.ndarray:
    per_ch = -(-nbytes // nchannels)
    chunk = tree_chunk_bytes(nbytes, nchannels, depth)
    k = max(1, -(-per_ch // chunk))
    sizes = np.full(k, chunk, dtype=np.int64)
    sizes[-1] = _align(per_ch - chunk * (k - 1))
    return sizes


@dataclasses.dataclass
class Job:
    """The static job, as arrays for the engine and lists for the writers."""

    rc: ResolvedConfig
    params: WorkloadParams
    comms: list[Comm]
    ops: list[Op]
    conns: np.ndarray  # [C, 4] comm, channel, src rank, dst rank
    conn_src_node: np.ndarray
    conn_dst_node: np.ndarray
    conn_src_nic: np.ndarray  # global NIC index node * nics + k
    conn_dst_nic: np.ndarray
    conn_lo: np.ndarray
    conn_hi: np.ndarray
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
    ch_conn: np.ndarray
    ch_bytes: np.ndarray
    ch_sp: np.ndarray
    ch_rp: np.ndarray
    ch_dep: np.ndarray
    ch_fwd: np.ndarray
    ch_credit: np.ndarray
    ch_arrive_consume: np.ndarray
    ch_grants: np.ndarray
    ch_seg: np.ndarray
    ch_dep2: np.ndarray
    """Second message a post waits for and forwards (tree reduce: the other child)."""
    ch_fwd2: np.ndarray
    ch_fwd_need: np.ndarray
    """Posts that must forward a received message before its slot is free (0: on arrival)."""
    seg_wake: np.ndarray
    """[S, 2]: the connections whose messages wait for this segment's (-1: none)."""
    seg_conn: np.ndarray
    seg_op: np.ndarray
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

    job = finalize(b, rc, params, rng, jit_sigma)
    job.dp_algo = dp_algo
    return job


def _waiters(S: int, ch_seg: np.ndarray, ch_conn: np.ndarray, ch_dep: np.ndarray, ch_dep2: np.ndarray) -> np.ndarray:
    """Per segment, the (at most two) connections with messages that wait for its arrivals."""
    h = np.concatenate([np.flatnonzero(ch_dep >= 0), np.flatnonzero(ch_dep2 >= 0)])
    d = np.concatenate([ch_dep[ch_dep >= 0], ch_dep2[ch_dep2 >= 0]])
    span = int(ch_conn.max()) + 1 if len(ch_conn) else 1
    key = np.unique(ch_seg[d] * span + ch_conn[h])
    pairs = np.stack([key // span, key % span], axis=1).reshape(-1, 2)
    out = np.full((S, 2), -1, dtype=np.int64)
    if len(pairs):
        first = np.r_[True, pairs[1:, 0] != pairs[:-1, 0]]
        rank = np.arange(len(pairs)) - np.maximum.accumulate(np.where(first, np.arange(len(pairs)), 0))
        if rank.max() > 1:
            raise AssertionError("a segment with more than two waiting connections")
        out[pairs[:, 0], rank] = pairs[:, 1]
    return out


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

    # segments laid out contiguously per connection, in creation (= seq) order
    S = len(b.seg_conn)
    seg_conn = np.array(b.seg_conn, dtype=np.int64)
    seg_op = np.array(b.seg_op, dtype=np.int64)
    seg_n = np.array(b.seg_n, dtype=np.int64).reshape(-1)
    explicit = np.ones(S, dtype=np.bool_)
    p2p_bytes = np.zeros(S, dtype=np.int64)
    p2p_idx = [x for x, v in enumerate(b.seg_sizes) if isinstance(v, int)]
    explicit[p2p_idx] = False
    p2p_bytes[p2p_idx] = [b.seg_sizes[x] for x in p2p_idx]
    order = np.lexsort((np.arange(S), seg_conn))
    seg_base = np.empty(S, dtype=np.int64)
    seg_base[order] = np.concatenate([[0], np.cumsum(seg_n[order])[:-1]]) if S else np.zeros(0, np.int64)
    H = int(seg_n.sum())
    conn_lo = np.zeros(C, dtype=np.int64)
    conn_hi = np.zeros(C, dtype=np.int64)
    counts = np.bincount(seg_conn, weights=seg_n, minlength=C).astype(np.int64)
    conn_hi[:] = np.cumsum(counts)
    conn_lo[:] = conn_hi - counts

    ops = b.ops
    P = len(b.part_op)
    # per segment: its sending and receiving part
    seg_sp = np.array(b.seg_sp, dtype=np.int64).reshape(-1)
    seg_rp = np.array(b.seg_rp, dtype=np.int64).reshape(-1)
    # per message (position h): its segment and index j within it, all segments at once
    pos = np.arange(H, dtype=np.int64)
    ch_seg = np.repeat(order, seg_n[order]).astype(np.int64)
    j = pos - seg_base[ch_seg]
    n_of = seg_n[ch_seg]
    ch_conn = seg_conn[ch_seg]
    ch_sp = seg_sp[ch_seg]
    ch_rp = seg_rp[ch_seg]
    # P2P: full chunks but the last; ring and tree: the sizes the builder gave
    ch_bytes = np.full(H, P2P_CHUNK_BYTES, dtype=np.int64)
    p2p = np.flatnonzero(~explicit & (seg_n > 0))
    ch_bytes[seg_base[p2p] + seg_n[p2p] - 1] = p2p_bytes[p2p] - P2P_CHUNK_BYTES * (seg_n[p2p] - 1)
    for x in np.flatnonzero(explicit & (seg_n > 0)).tolist():
        ch_bytes[seg_base[x]:seg_base[x] + seg_n[x]] = b.seg_sizes[x]
    # flow control: message j needs the slot freed by message j - SLOTS of its segment
    ch_credit = np.where(j >= SLOTS, pos - SLOTS, -1)
    ch_grants = j < n_of - SLOTS
    ch_dep = np.full(H, -1, dtype=np.int64)
    ch_fwd = np.full(H, -1, dtype=np.int64)
    ch_dep2 = np.full(H, -1, dtype=np.int64)
    ch_fwd2 = np.full(H, -1, dtype=np.int64)
    ch_arrive_consume = np.ones(H, dtype=np.bool_)
    seg_steps = np.array(b.seg_steps, dtype=np.int64).reshape(-1)
    seg_dep = np.array(b.seg_dep_seg, dtype=np.int64).reshape(-1)
    ring = np.flatnonzero((seg_steps[ch_seg] > 0) & (seg_dep[ch_seg] >= 0))
    if len(ring):
        jr, nr = j[ring], n_of[ring]
        steps = seg_steps[ch_seg[ring]]
        k, w = np.divmod(jr, CHUNK_STEPS)
        has_dep = (k % steps) != 0
        dlo = seg_base[seg_dep[ch_seg[ring]]]
        last_of_slice = (w // SLICE_STEPS) * SLICE_STEPS + SLICE_STEPS - 1
        ch_dep[ring] = np.where(has_dep, dlo + (k - 1) * CHUNK_STEPS + last_of_slice, -1)
        ch_fwd[ring] = np.where(has_dep, dlo + jr - CHUNK_STEPS, -1)
        # in-edge message m is forwarded by our message m + CHUNK_STEPS unless m belongs to
        # the last ring step of a loop (then it is final data, consumed on arrival); each
        # ring segment is the in-edge of exactly one other
        consumed_later = ((k + 1) % steps != 0) & (jr + CHUNK_STEPS < nr)
        ch_arrive_consume[dlo + jr] = ~consumed_later
    tree_segs = [x for x in b.tree_segs if b.seg_n[x]]
    for sidx in tree_segs:
        lo, n = int(seg_base[sidx]), int(seg_n[sidx])
        for dep, fwd, d in zip((ch_dep, ch_dep2), (ch_fwd, ch_fwd2), b.seg_tree[sidx] or [], strict=False):
            dep[lo:lo + n] = fwd[lo:lo + n] = int(seg_base[d]) + np.arange(n)
    seg_wake = _waiters(S, ch_seg, ch_conn, ch_dep, ch_dep2)
    fwd_ref = np.concatenate([ch_fwd[ch_fwd >= 0], ch_fwd2[ch_fwd2 >= 0]])
    ch_fwd_need = np.bincount(fwd_ref, minlength=H).astype(np.int64)
    for sidx in tree_segs:
        lo, n = int(seg_base[sidx]), int(seg_n[sidx])
        ch_arrive_consume[lo:lo + n] = ch_fwd_need[lo:lo + n] == 0
    nz = seg_n > 0
    part_pending = (np.bincount(seg_sp[nz], weights=seg_n[nz], minlength=P)
                    + np.bincount(seg_rp[nz], weights=seg_n[nz], minlength=P)).astype(np.int64)
    cts = np.stack([seg_rp[nz], seg_conn[nz], np.minimum(SLOTS, seg_n[nz])], axis=1).reshape(-1, 3)
    cts = cts[np.lexsort((cts[:, 2], cts[:, 1], cts[:, 0]))]
    send_key = np.unique(seg_sp[nz] * max(C, 1) + seg_conn[nz])
    sends = np.stack([send_key // max(C, 1), send_key % max(C, 1)], axis=1).reshape(-1, 2)
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

    seg_bytes = np.where(explicit, np.bincount(ch_seg, weights=ch_bytes, minlength=S).astype(np.int64),
                         np.maximum(p2p_bytes, 0)).astype(np.int64)
    return Job(
        rc=rc, params=params, comms=b.comms, ops=ops, conns=conns,
        conn_src_node=src_node, conn_dst_node=dst_node, conn_src_nic=src_nic, conn_dst_nic=dst_nic,
        conn_lo=conn_lo, conn_hi=conn_hi,
        part_op=part_op, part_rank=part_rank, part_node=part_node, part_gpu=part_gpu,
        part_prev=np.array(b.part_prev, dtype=np.int64), part_kind=b.part_kind, part_pending=part_pending,
        cts_lo=cts_lo, cts_hi=cts_hi, ps_lo=ps_lo, ps_hi=ps_hi, ps_conn=sends[:, 1].copy(), cts_conn=cts[:, 1].copy(), cts_count=cts[:, 2].copy(),
        group_lo=group_lo, group_hi=group_hi, group_parts=group_parts,
        prog_lo=prog_lo, prog_hi=prog_hi, instr_type=instr_type, instr_arg=instr_arg, instr_jit=instr_jit,
        ch_conn=ch_conn, ch_bytes=ch_bytes, ch_sp=ch_sp, ch_rp=ch_rp, ch_dep=ch_dep, ch_fwd=ch_fwd, ch_credit=ch_credit,
        ch_arrive_consume=ch_arrive_consume, ch_grants=ch_grants, ch_seg=ch_seg,
        seg_conn=seg_conn, seg_op=seg_op, seg_nchunks=seg_n, seg_bytes=seg_bytes,
        ch_dep2=ch_dep2, ch_fwd2=ch_fwd2, ch_fwd_need=ch_fwd_need, seg_wake=seg_wake,
        est_step_ns=_estimate_step_ns(rc, params, next((c.trees for c in b.comms if c.trees), None)),
    )
