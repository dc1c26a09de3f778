"""NCCL's double binary tree over the nodes of a communicator, and the algorithm choice.

Tree 0 is a binary tree over ranks 0..n-1 rooted at 0 (a rank's lowest set bit says its
level: parents sit on the next bit up, children half a bit down); tree 1 mirrors it
(rank n-1-r) when n is even, or shifts it by one rank when n is odd, so that a rank that is
an interior node of one tree is a leaf of the other. Channels are split between the two
trees: the first half of a comm's channels run tree 0, the second half tree 1 (NCCL
duplicates its channels for the second tree).

The choice between ring and tree follows NCCL's tuning model in form: time = latency +
bytes / bandwidth per algorithm, the latency counting the network hops of the pattern and
the bandwidth the share of a NIC the pattern leaves to the operator's bytes.
"""

from __future__ import annotations

import dataclasses

ALGOS = ("auto", "ring", "tree")

HOP_US = 9.6
"""Latency of one network hop of a SIMPLE-protocol pattern (NCCL's NET/Simple ring figure)."""
RING_BASE_US = 8.4
TREE_BASE_US = 0.0
TREE_BW_EFFICIENCY = 0.9
"""NCCL's tree bus-bandwidth derating (measured trees reach ~90 % of the ring's link use)."""


@dataclasses.dataclass(frozen=True)
class Tree:
    parent: tuple[int, ...]
    """Per rank, its parent (-1 at the root)."""
    children: tuple[tuple[int, ...], ...]
    """Per rank, its children (at most two)."""

    @property
    def root(self) -> int:
        return self.parent.index(-1)

    @property
    def depth(self) -> int:
        """Edges from the root to the deepest leaf."""
        def d(r: int) -> int:
            return 0 if self.parent[r] < 0 else 1 + d(self.parent[r])
        return max(d(r) for r in range(len(self.parent)))


def _btree(n: int, rank: int) -> tuple[int, list[int]]:
    """(parent, children) of ``rank`` in the binary tree rooted at 0 (NCCL's ncclGetBtree)."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, ([bit >> 1] if n > 1 else [])
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    low = bit >> 1
    if low == 0:
        return up, []
    kids = [rank - low]
    while low and rank + low >= n:
        low >>= 1
    if low:
        kids.append(rank + low)
    return up, kids


def double_tree(n: int) -> tuple[Tree, Tree]:
    """NCCL's two trees over ``n`` ranks."""
    if n < 1:
        raise ValueError(f"a tree needs at least one rank, got {n}")
    t0 = [_btree(n, r) for r in range(n)]
    if n % 2:
        def src(r: int) -> int:
            return (r - 1) % n

        def dst(x: int) -> int:
            return (x + 1) % n
    else:
        def src(r: int) -> int:
            return n - 1 - r

        def dst(x: int) -> int:
            return n - 1 - x
    t1 = []
    for r in range(n):
        up, kids = _btree(n, src(r))
        t1.append((-1 if up < 0 else dst(up), [dst(k) for k in kids]))
    return tuple(Tree(tuple(p for p, _ in t), tuple(tuple(k) for _, k in t)) for t in (t0, t1))  # type: ignore[return-value]


def channel_tree(trees: tuple[Tree, Tree], ch: int, nchannels: int) -> Tree:
    """The tree channel ``ch`` runs: first half of the channels tree 0, second half tree 1."""
    return trees[0] if nchannels < 2 or 2 * ch < nchannels else trees[1]


def comm_trees(trees: tuple[Tree, Tree], rank: int, nchannels: int) -> list[list[int]]:
    """``CommEvent.trees`` of ``rank``: per channel [rank, up, down0, down1, down2]."""
    out = []
    for ch in range(nchannels):
        t = channel_tree(trees, ch, nchannels)
        kids = list(t.children[rank]) + [-1] * (3 - len(t.children[rank]))
        out.append([rank, t.parent[rank], *kids])
    return out


def tree_load(trees: tuple[Tree, Tree], nchannels: int) -> float:
    """Bytes the busiest rank sends or receives in a tree AllReduce, per byte of S."""
    n = len(trees[0].parent)
    sent = [0.0] * n
    recv = [0.0] * n
    for ch in range(nchannels):
        t = channel_tree(trees, ch, nchannels)
        for r in range(n):
            for k in t.children[r]:
                # reduce up k -> r and broadcast down r -> k, S / c each
                sent[k] += 1.0 / nchannels
                recv[r] += 1.0 / nchannels
                sent[r] += 1.0 / nchannels
                recv[k] += 1.0 / nchannels
    return max(max(sent), max(recv))


def algo_time_us(algo: str, nbytes: int, nranks: int, nchannels: int, nic_gbps: float) -> float:
    """Modelled time of an AllReduce of ``nbytes`` over ``nranks`` nodes (one rank per node)."""
    bw = nic_gbps / 8.0 * 1e3  # bytes per µs
    if nranks < 2:
        return 0.0
    if algo == "ring":
        lat = RING_BASE_US + 2 * (nranks - 1) * HOP_US
        load = 2.0 * (nranks - 1) / nranks
    elif algo == "tree":
        trees = double_tree(nranks)
        lat = TREE_BASE_US + 2 * max(t.depth for t in trees) * HOP_US
        load = tree_load(trees, nchannels) / TREE_BW_EFFICIENCY
    else:
        raise ValueError(f"unknown algorithm {algo!r}")
    return lat + nbytes * load / bw


def choose_algo(algo: str, nbytes: int, nranks: int, nchannels: int, nic_gbps: float) -> str:
    """``ring`` or ``tree`` for an AllReduce: the forced one, or the faster by the model."""
    if algo != "auto":
        return algo
    ring = algo_time_us("ring", nbytes, nranks, nchannels, nic_gbps)
    tree = algo_time_us("tree", nbytes, nranks, nchannels, nic_gbps)
    return "tree" if tree < ring else "ring"


def crossover_bytes(nranks: int, nchannels: int, nic_gbps: float) -> int:
    """The largest AllReduce size for which auto picks tree (0: never)."""
    if choose_algo("auto", 1, nranks, nchannels, nic_gbps) != "tree":
        return 0
    lo, hi = 1, 1 << 40
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if choose_algo("auto", mid, nranks, nchannels, nic_gbps) == "tree":
            lo = mid
        else:
            hi = mid - 1
    return lo


__all__ = ["ALGOS", "Tree", "algo_time_us", "channel_tree", "choose_algo", "comm_trees", "crossover_bytes",
           "double_tree", "tree_load"]
