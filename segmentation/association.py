"""Flow -> operator association: which operators each send flow carries, with how many bytes.

From ``comm`` (membership, rings, trees), ``flow`` (QP -> comm, rank, peer, channel,
direction) and ``op`` (kind, size, algorithm, channels, peers) hook events, compute per
(node, nic, flow) the ordered operators it carries and the bytes each one puts on it
(docs/semantics.md "Operators and expected bytes"). A connection is (comm, rank, peer,
channel, direction); several QPs of one connection split its bytes equally.

Op events may arrive without a rank (a source that joined mid-run, ``v=2``): they are held
until a comm event of the same (comm_id, node) names exactly one rank (:class:`RankFiller`),
then treated like any other; a rank is never guessed.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from pulse.events import GROUPED, CommEvent, FlowEvent, OpEvent
from pulse.nccl_chunks import tree_chunk_bytes, tree_depth_at_least

NO_TIME = np.iinfo(np.int64).min
FlowKey = tuple[str, str, int]
"""(node, nic, flow id)."""
OpKey = tuple[str, int, int]
"""(comm_id, rank, seq)."""


@dataclasses.dataclass
class OpInfo:
    event: OpEvent
    algo: str
    """The algorithm used for the byte split: ring, tree, or p2p (inferred when unknown)."""
    nranks: int
    flows: list[FlowKey]
    expected: list[int]
    """Bytes each of ``flows`` carries for this operator (the volume condition)."""
    ambiguous: bool = False
    """algo was unknown and both ring and tree patterns fit (ring was assumed)."""
    flow_peers: list[int] | None = None
    """Grouped P2P only: the peer rank each of ``flows`` sends to (per-peer figures,
    :func:`pulse.segmentation.metrics.peer_figures`)."""
    steps: int = 1
    """The fewest messages each of ``flows`` carries by the algorithm's structure (a ring
    AllReduce's 2 (n - 1) steps), however few its bytes (:func:`algo_steps`)."""
    msg_bytes: int = 0
    """The most one message carries where the algorithm cuts finer than a slot (a small
    tree AllReduce: :func:`message_bytes`); 0: a slot's size."""

    def steps_on(self, need: int) -> int:
        """The fewest messages a flow carrying ``need`` bytes of this operator sends."""
        return max(self.steps, -(-need // self.msg_bytes)) if self.msg_bytes > 0 else self.steps

    @property
    def expected_bytes(self) -> int:
        return int(sum(self.expected))


@dataclasses.dataclass
class Association:
    bindings: dict[FlowKey, FlowEvent]
    """Every bound flow (send and recv)."""
    flow_ops: dict[FlowKey, tuple[np.ndarray, np.ndarray]]
    """Per send flow: (seq int64, expected bytes int64), ascending seq. The flow's comm and
    rank are in ``bindings``."""
    flow_issue: dict[FlowKey, np.ndarray]
    """Per send flow, aligned with ``flow_ops``: each operator's host issue time
    (``t_host_ns``, node clock), or NO_TIME when the op event has none."""
    flow_steps: dict[FlowKey, np.ndarray]
    """Per send flow, aligned with ``flow_ops``: each operator's :attr:`OpInfo.steps`."""
    ops: dict[OpKey, OpInfo]
    """Every operator with at least one visible send flow on its rank."""
    unbound: list[FlowKey]
    """Flows that flow events mention without a (comm, rank, peer) binding or direction."""
    ops_without_flows: list[OpKey]
    """Operators whose rank has no visible send flow for them (all-intra-node, Recv, a
    Broadcast's last ring rank...): not operators for Pulse on that rank."""
    duplicates: int = 0
    """Conflicting duplicate op events (the first one wins)."""
    ambiguous_algo: int = 0
    """Operators with algo unknown where both ring and tree patterns were possible."""
    unranked: list[OpEvent] = dataclasses.field(default_factory=list)
    """Op events whose rank no comm event has named yet (see :meth:`add_comms`)."""

    _ctx: Any = dataclasses.field(default=None, repr=False, compare=False)
    _filler: Any = dataclasses.field(default=None, repr=False, compare=False)

    def add_comms(self, comms: Iterable[CommEvent]) -> list[OpKey]:
        """Take comm events that name ranks learned late (re-emitted by a source that joined
        mid-run): the held ops of those comms get their rank and are added; returns the keys
        of those that have no visible send flow."""
        filler = self._filler if self._filler is not None else RankFiller()
        self._filler = filler
        released = [e for e in filler.feed(list(comms)) if isinstance(e, OpEvent)]
        self.unranked = filler.held()
        return self.add_ops(released) if released else []

    def add_ops(self, ops: Iterable[OpEvent]) -> list[OpKey]:
        """Add op descriptors to an existing association (same bindings and comms);
        returns the keys of those that have no visible send flow."""
        ranks, comms = self._ctx
        filler = self._filler if self._filler is not None else RankFiller()
        self._filler = filler
        ranked = [e for e in filler.feed(list(ops)) if isinstance(e, OpEvent) and e.rank is not None]
        self.unranked = filler.held()
        without: list[OpKey] = []
        for op in sorted(ranked, key=lambda o: (o.comm_id, o.rank, o.seq)):
            assert op.rank is not None
            key = (op.comm_id, op.rank, op.seq)
            if key in self.ops:
                continue
            info = _op_info(op, ranks, comms)
            if info is None:
                without.append(key)
                self.ops_without_flows.append(key)
                continue
            self.ops[key] = info
            issued = NO_TIME if op.t_host_ns is None else op.t_host_ns
            for f, e in zip(info.flows, info.expected, strict=True):
                seqs, need = self.flow_op_list(f)
                times = self.flow_issue_times(f)
                steps = self.flow_op_steps(f)
                at = int(np.searchsorted(seqs, op.seq))
                self.flow_ops[f] = (np.insert(seqs, at, op.seq), np.insert(need, at, e))
                self.flow_issue[f] = np.insert(times, at, issued)
                self.flow_steps[f] = np.insert(steps, at, info.steps_on(e))
        return without

    def drop_ops(self, keys: Iterable[OpKey]) -> None:
        """Forget operators (e.g. once their metrics were emitted)."""
        for key in keys:
            info = self.ops.pop(key, None)
            if info is None:
                continue
            for f in info.flows:
                seqs, need = self.flow_op_list(f)
                keep = seqs != key[2]
                self.flow_ops[f] = (seqs[keep], need[keep])
                self.flow_issue[f] = self.flow_issue_times(f)[keep]
                self.flow_steps[f] = self.flow_op_steps(f)[keep]

    def flow_op_list(self, key: FlowKey) -> tuple[np.ndarray, np.ndarray]:
        empty = np.zeros(0, np.int64)
        return self.flow_ops.get(key, (empty, empty))

    def flow_issue_times(self, key: FlowKey) -> np.ndarray:
        return self.flow_issue.get(key, np.zeros(0, np.int64))

    def flow_op_steps(self, key: FlowKey) -> np.ndarray:
        return self.flow_steps.get(key, np.zeros(0, np.int64))


class RankFiller:
    """Holds op events without a rank until a comm event of the same (comm_id, node) names
    exactly one rank, then releases them with it. Sources that join a job mid-run know a
    comm by its pointer first and its rank only later (or never)."""

    def __init__(self, limit: int = 1 << 16) -> None:
        self.limit = limit
        self.dropped = 0
        """Held ops dropped because more than ``limit`` were waiting."""
        self._named: dict[tuple[str, str], set[int]] = defaultdict(set)
        self._held: dict[tuple[str, str], list[OpEvent]] = defaultdict(list)
        self._n = 0

    def rank_of(self, comm_id: str, node: str) -> int | None:
        named = self._named.get((comm_id, node))
        return next(iter(named)) if named is not None and len(named) == 1 else None

    def feed(self, events: Iterable[CommEvent | FlowEvent | OpEvent]) -> list[CommEvent | FlowEvent | OpEvent]:
        """The events to process now, in order: ops with a known rank (filled in where it
        was unknown), every comm and flow event, and the held ops a comm event released."""
        out: list[CommEvent | FlowEvent | OpEvent] = []
        for ev in events:
            if isinstance(ev, OpEvent) and ev.rank is None:
                rank = self.rank_of(ev.comm_id, ev.node)
                if rank is not None:
                    out.append(dataclasses.replace(ev, rank=rank))
                elif self._n < self.limit:
                    self._held[(ev.comm_id, ev.node)].append(ev)
                    self._n += 1
                else:
                    self.dropped += 1
                continue
            out.append(ev)
            if isinstance(ev, CommEvent) and ev.rank is not None:
                key = (ev.comm_id, ev.node)
                self._named[key].add(ev.rank)
                rank = self.rank_of(*key)
                if rank is not None and key in self._held:
                    ops = self._held.pop(key)
                    self._n -= len(ops)
                    out.extend(dataclasses.replace(op, rank=rank) for op in ops)
        return out

    def held(self) -> list[OpEvent]:
        return [op for ops in self._held.values() for op in ops]


@dataclasses.dataclass
class _Conn:
    peer: int
    channel: int
    flows: list[FlowKey]


def _ring_next(ring: list[int], rank: int) -> int | None:
    if rank not in ring:
        return None
    return ring[(ring.index(rank) + 1) % len(ring)]


def _split(total: float, conns: list[_Conn]) -> tuple[list[FlowKey], list[int]]:
    """``total`` bytes on each connection of ``conns``, split over its QPs."""
    flows: list[FlowKey] = []
    expected: list[int] = []
    for c in conns:
        share = total / len(c.flows)
        for f in c.flows:
            flows.append(f)
            expected.append(int(share))
    return flows, expected


class _Rank:
    """What one (comm, rank) knows: its send connections and its comm topology."""

    def __init__(self, conns: dict[tuple[int, int], _Conn], comm: CommEvent | None) -> None:
        self.conns = conns
        self.comm = comm
        self.channels = sorted({ch for _, ch in conns})

    def by_channel(self, channel: int) -> list[_Conn]:
        return [c for (_, ch), c in sorted(self.conns.items()) if ch == channel]

    def ring_conns(self, rank: int, nch: int | None) -> list[_Conn]:
        """The send connection to ring.next on each channel."""
        out = []
        rings = self.comm.rings if self.comm is not None else None
        for ch in self._channels(nch):
            nxt = _ring_next(rings[ch % len(rings)], rank) if rings else None
            if nxt is None:
                # No ring order known: a ring rank has exactly one send peer per channel.
                cands = self.by_channel(ch)
                if len(cands) == 1:
                    out.append(cands[0])
                continue
            c = self.conns.get((nxt, ch))
            if c is not None:
                out.append(c)
        return out

    def tree_conns(self, nch: int | None) -> list[_Conn]:
        out: list[_Conn] = []
        trees = self.comm.trees if self.comm is not None else None
        for ch in self._channels(nch):
            if trees:
                t = trees[ch % len(trees)]
                peers = [p for p in t[1:] if p >= 0]
                out.extend(self.conns[(p, ch)] for p in peers if (p, ch) in self.conns)
            else:
                out.extend(self.by_channel(ch))
        return out

    def ring_peers(self, rank: int) -> set[int]:
        return {c.peer for c in self.ring_conns(rank, None)}

    def tree_only(self, rank: int) -> bool | None:
        """True when the rank's connections fit only a tree, False only a ring, None both."""
        ring = {(c.peer, c.channel) for c in self.ring_conns(rank, None)}
        tree = {(c.peer, c.channel) for c in self.tree_conns(None)}
        have = set(self.conns)
        if have <= ring and not have <= tree:
            return False
        if ring and self.comm is not None and self.comm.rings and not self.comm.trees:
            # The comm published its rings and no trees: the only topology it runs over is
            # the ring. Connections to non-neighbours (Gloo keeps a full mesh, P2P peers)
            # are not evidence of a tree, so they must not turn the guess into one.
            return False
        if have <= tree and not have <= ring:
            return True
        if not (self.comm and self.comm.trees):
            # Without tree topology: more than one send peer on a channel is not a ring.
            multi = any(len(self.by_channel(ch)) > 1 for ch in self.channels)
            return True if multi else None
        return None

    def _channels(self, nch: int | None) -> list[int]:
        if nch is None:
            return self.channels
        # NCCL channels are numbered from 0; connections exist only where used.
        return [ch for ch in self.channels if ch < nch] or self.channels[:nch]


def _infer_algo(op: OpEvent, rk: _Rank) -> tuple[str, bool]:
    assert op.rank is not None
    if op.algo in ("ring", "tree"):
        return op.algo, False
    if op.kind != "AllReduce":
        return "ring", False
    tree = rk.tree_only(op.rank)
    if tree is None:
        return "ring", True  # NCCL's default for large (bandwidth-bound) operators
    return ("tree" if tree else "ring"), False


def _op_flows(op: OpEvent, rk: _Rank, nranks: int) -> tuple[str, list[FlowKey], list[int], bool, list[int] | None]:
    """(algo, send flows, bytes each carries, whether algo was ambiguous, and for grouped
    P2P the peer rank of each flow)."""
    assert op.rank is not None
    S = op.bytes
    kind = op.kind
    if kind in ("Send", "Recv"):
        if kind == "Recv":
            return "p2p", [], [], False, None  # data arrives on recv flows; send flows carry none
        conns = [c for (p, _), c in sorted(rk.conns.items()) if p == op.peer]
        nch = op.nchannels or len(conns)
        conns = conns[:nch]
        return ("p2p", *_split(S / nch, conns), False, None) if conns else ("p2p", [], [], False, None)
    if kind == GROUPED:
        peers = op.peers or []
        send = op.peer_send_bytes
        if send is None:
            send = [S // len(peers)] * len(peers) if peers else []
        flows: list[FlowKey] = []
        expected: list[int] = []
        flow_peers: list[int] = []
        for peer, nbytes in zip(peers, send, strict=True):
            if nbytes <= 0:
                continue
            conns = [c for (p, _), c in sorted(rk.conns.items()) if p == peer]
            nch = op.nchannels or len(conns)
            conns = conns[:nch]
            if conns:
                f, e = _split(nbytes / nch, conns)
                flows += f
                expected += e
                flow_peers += [peer] * len(f)
        return "p2p", flows, expected, False, flow_peers
    algo, ambiguous = _infer_algo(op, rk)
    nch = op.nchannels or (len(rk.channels) or 1)
    n = nranks
    if n <= 1:
        return algo, [], [], ambiguous, None
    if kind == "AllReduce" and algo == "tree":
        return algo, *_split(S / nch, rk.tree_conns(op.nchannels)), ambiguous, None
    conns = rk.ring_conns(op.rank, op.nchannels)
    if kind == "AllReduce":
        per = 2 * (n - 1) / n * S / nch
    elif kind in ("AllGather", "ReduceScatter"):
        per = (n - 1) / n * S / nch
    else:  # Broadcast / Reduce along the ring from / to the root
        root = op.root if op.root is not None else 0
        if kind == "Reduce" and op.rank == root:
            conns = []
        if kind == "Broadcast":
            conns = [c for c in conns if c.peer != root]
        per = S / nch
    return algo, *_split(per, conns), ambiguous, None


def algo_steps(kind: str, algo: str, nranks: int) -> int:
    """The fewest messages each send flow of an operator carries by its algorithm's
    structure: a ring AllReduce hands on 2 (n - 1) pieces (reduce-scatter, then all-gather),
    an AllGather or a ReduceScatter n - 1, each its own message however small; the rest
    (trees, broadcasts, point-to-point) one, their bytes cut into messages of at most a
    slot's size (:meth:`.params.SegmentParams.slot_fills`)."""
    if algo != "ring" or nranks < 2:
        return 1
    if kind == "AllReduce":
        return 2 * (nranks - 1)
    if kind in ("AllGather", "ReduceScatter"):
        return nranks - 1
    return 1


def message_bytes(op: OpEvent, algo: str, nranks: int) -> int:
    """The most one network message of ``op`` can carry when its algorithm cuts it finer
    than a slot, else 0. A tree AllReduce is cut into NCCL's tree chunks, halved for small
    operators (:func:`pulse.nccl_chunks.tree_chunk_bytes`); taken at one channel when the
    op event does not say how many, and at the shallowest tree its ranks allow, it is the
    largest chunk NCCL could have used: its message count a sure lower bound (sweep 313
    #11: a 4 MiB bucket on an 8-rank tree, 2 channels, went out in 128 KiB messages, 8 per
    flow - every slot posted at the start - where its bytes alone counted 2)."""
    if algo != "tree" or op.kind != "AllReduce" or op.bytes <= 0:
        return 0
    return tree_chunk_bytes(op.bytes, op.nchannels or 1, tree_depth_at_least(nranks))


def _op_info(op: OpEvent, ranks: dict, comms: dict) -> OpInfo | None:
    if op.rank is None:
        return None  # held by a RankFiller until its rank is named
    rk = ranks.get((op.comm_id, op.rank)) or _Rank({}, None)
    comm = comms.get((op.comm_id, op.rank))
    nranks = op.nranks or (comm.nranks if comm else 1)
    algo, flows, expected, ambiguous, flow_peers = _op_flows(op, rk, nranks)
    keep = [i for i, e in enumerate(expected) if e > 0]
    if not keep:
        return None
    return OpInfo(event=op, algo=algo, nranks=max(1, nranks), flows=[flows[i] for i in keep],
                  expected=[expected[i] for i in keep], ambiguous=ambiguous,
                  flow_peers=None if flow_peers is None else [flow_peers[i] for i in keep],
                  steps=algo_steps(op.kind, algo, nranks), msg_bytes=message_bytes(op, algo, nranks))


def associate(events: Iterable[CommEvent | FlowEvent | OpEvent]) -> Association:
    """Bind flows to operators (pure: no traffic is read)."""
    filler = RankFiller()
    events = filler.feed(events)
    comms: dict[tuple[str, int], CommEvent] = {}
    bindings: dict[FlowKey, FlowEvent] = {}
    unbound: dict[FlowKey, None] = {}
    ops: dict[OpKey, OpEvent] = {}
    duplicates = 0
    for ev in events:
        if isinstance(ev, CommEvent):
            if ev.rank is None:
                continue  # a comm known by its pointer only: its ops are held by the filler
            prev = comms.get((ev.comm_id, ev.rank))
            # Later comm events may add topology (rings/trees) learned after init.
            if prev is None or (ev.rings or ev.trees):
                comms[(ev.comm_id, ev.rank)] = ev
        elif isinstance(ev, FlowEvent):
            key = (ev.node, ev.nic, ev.flow)
            if ev.bound and ev.direction is not None:
                bindings[key] = ev
                unbound.pop(key, None)
            elif key not in bindings:
                unbound[key] = None
        elif isinstance(ev, OpEvent):
            assert ev.rank is not None  # the filler holds the others
            okey = (ev.comm_id, ev.rank, ev.seq)
            prev_op = ops.get(okey)
            if prev_op is None:
                ops[okey] = ev
            elif prev_op != ev:
                duplicates += 1
    # Send connections per (comm, rank): data volume is measured on send flows only.
    conns: dict[tuple[str, int], dict[tuple[int, int], _Conn]] = defaultdict(dict)
    for key, b in sorted(bindings.items()):
        if b.direction != "send":
            continue
        ch = b.channel if b.channel is not None else 0
        assert b.comm_id is not None and b.rank is not None and b.peer is not None
        c = conns[(b.comm_id, b.rank)].setdefault((b.peer, ch), _Conn(b.peer, ch, []))
        c.flows.append(key)
    ranks = {k: _Rank(v, comms.get(k)) for k, v in conns.items()}

    infos: dict[OpKey, OpInfo] = {}
    without: list[OpKey] = []
    per_flow: dict[FlowKey, list[tuple[int, int, int, int]]] = defaultdict(list)
    ambiguous_total = 0
    for okey in sorted(ops):
        op = ops[okey]
        info = _op_info(op, ranks, comms)
        if info is None:
            without.append(okey)
            continue
        ambiguous_total += info.ambiguous
        infos[okey] = info
        issued = NO_TIME if op.t_host_ns is None else op.t_host_ns
        for f, e in zip(info.flows, info.expected, strict=True):
            per_flow[f].append((op.seq, e, issued, info.steps_on(e)))
    flow_ops = {
        f: (np.array([x[0] for x in lst], np.int64), np.array([x[1] for x in lst], np.int64))
        for f, lst in per_flow.items()
    }
    flow_issue = {f: np.array([x[2] for x in lst], np.int64) for f, lst in per_flow.items()}
    flow_steps = {f: np.array([x[3] for x in lst], np.int64) for f, lst in per_flow.items()}
    return Association(bindings=bindings, flow_ops=flow_ops, flow_issue=flow_issue, flow_steps=flow_steps, ops=infos,
                       unbound=sorted(unbound),
                       ops_without_flows=without, duplicates=duplicates, ambiguous_algo=ambiguous_total,
                       unranked=filler.held(), _ctx=(ranks, comms), _filler=filler)
