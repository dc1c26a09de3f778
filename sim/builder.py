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
from pulse.sim.trees import Tree, channel_tree, double_tree

from pulse.nccl_chunks import NET_STEP_BYTES, tree_chunk_bytes

SLOTS = 8
CHUNK_STEPS = 2
SLICE_STEPS = 2
RING_STEP_BYTES = CHUNK_STEPS * NET_STEP_BYTES
P2P_CHUNK_BYTES = 128 * 1024
ALIGN = 128

COMPUTE, ISSUE, WAIT = 0, 1, 2



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


@dataclasses.dataclass
class StepSegs:
    """The segments of one step (global ids ``s0`` on), as compact arrays: the message layout
    of the step is derived from them when the run reaches it. Segment references (``dep``,
    ``tree``) are global ids of segments of the same step."""

    s0: int
    conn: np.ndarray
    op: np.ndarray
    n: np.ndarray
    """Messages per segment."""
    sp: np.ndarray
    rp: np.ndarray
    dep: np.ndarray
    """Ring segments: the in-edge segment (-1: none)."""
    steps: np.ndarray
    """Ring steps per loop (0: not a ring)."""
    explicit: np.ndarray
    """The segment's message sizes are in ``sizes`` (ring, tree); else P2P_CHUNK_BYTES
    messages of ``p2p_bytes``, the last one shorter."""
    p2p_bytes: np.ndarray
    nbytes: np.ndarray
    sizes: dict[int, np.ndarray]
    tree: list[tuple[int, list[int]]]
    """Tree segments with messages: (segment, the segments whose message j its message j
    waits for and forwards)."""

    def __len__(self) -> int:
        return len(self.conn)


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
        # closed steps (end_step): segment ids run on across steps
        self.seg_base = 0
        self.step_segs: list[StepSegs] = []
        self.step_parts: list[int] = []
        """Per closed step, the parts created up to its end (parts are numbered in step order)."""
        self.step_prog_end: list[list[int]] = []
        """Per closed step, each node's program length at its end."""

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
        return self.seg_base + len(self.seg_conn) - 1

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
                self.seg_dep_seg[segs[i] - self.seg_base] = segs[(i - 1) % n]
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
                    self.seg_tree[up[r] - self.seg_base] = reduced
                    self.tree_segs.append(up[r])
                for k in t.children[r]:
                    # the root turns the reduced data around; others pass the parent's down
                    self.seg_tree[down[k] - self.seg_base] = reduced if t.parent[r] < 0 else [down[r]]
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

    def end_step(self) -> None:
        """Close a training step: its segments become one compact table, from which its
        messages are laid out only when the run reaches the step (pulse.sim.messages)."""
        seg_n = np.array(self.seg_n, dtype=np.int64).reshape(-1)
        S = len(seg_n)
        explicit = np.array([not isinstance(v, int) for v in self.seg_sizes], dtype=np.bool_).reshape(-1)
        p2p_bytes = np.array([v if isinstance(v, int) else 0 for v in self.seg_sizes], dtype=np.int64).reshape(-1)
        sizes = {x: v for x, v in enumerate(self.seg_sizes) if not isinstance(v, int)}
        nbytes = np.maximum(p2p_bytes, 0)
        for x, v in sizes.items():
            nbytes[x] = int(v.sum())
        i32 = np.int32
        self.step_segs.append(StepSegs(
            s0=self.seg_base, conn=np.array(self.seg_conn, dtype=i32).reshape(-1),
            op=np.array(self.seg_op, dtype=i32).reshape(-1), n=seg_n.astype(i32),
            sp=np.array(self.seg_sp, dtype=i32).reshape(-1), rp=np.array(self.seg_rp, dtype=i32).reshape(-1),
            dep=np.array(self.seg_dep_seg, dtype=i32).reshape(-1),
            steps=np.array(self.seg_steps, dtype=i32).reshape(-1), explicit=explicit, p2p_bytes=p2p_bytes,
            nbytes=nbytes, sizes=sizes,
            tree=[(x, list(self.seg_tree[x - self.seg_base] or [])) for x in self.tree_segs
                  if self.seg_n[x - self.seg_base]]))
        self.seg_base += S
        for lst in (self.seg_conn, self.seg_op, self.seg_sizes, self.seg_dep_seg, self.seg_steps,
                    self.seg_tree, self.seg_n, self.seg_sp, self.seg_rp, self.tree_segs):
            lst.clear()
        self.step_parts.append(len(self.part_op))
        self.step_prog_end.append([len(p) for p in self.programs])


def _tree_sizes(nbytes: int, nchannels: int, depth: int) -> np.ndarray:
    per_ch = -(-nbytes // nchannels)
    chunk = tree_chunk_bytes(nbytes, nchannels, depth)
    k = max(1, -(-per_ch // chunk))
    sizes = np.full(k, chunk, dtype=np.int64)
    sizes[-1] = _align(per_ch - chunk * (k - 1))
    return sizes
