"""What the hook events say about a job: which node holds each rank, its NICs, and whom
each rank sends to (the links its traffic crosses)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pulse.events import CommEvent, FlowEvent, HookEvent


class Topology:
    """Membership and links, learnt incrementally from comm / flow events (op events and
    unbound flows are ignored here)."""

    def __init__(self) -> None:
        self.rank_node: dict[tuple[str, int], str] = {}
        self._by_comm: dict[str, dict[int, str]] = {}
        """rank_node per communicator: members() is asked per operator, and a scan of
        every rank of the job made it cost O(GPUs) per record."""
        self.nranks: dict[str, int] = {}
        self.rank_nics: dict[tuple[str, int], set[str]] = defaultdict(set)
        self.send_peers: dict[tuple[str, int], set[int]] = defaultdict(set)
        self.rank_pid: dict[tuple[str, int], int] = {}
        self.rings: dict[str, list[list[int]]] = {}
        self.tree_parent: dict[str, dict[int, dict[int, int]]] = {}
        """comm -> channel -> rank -> its parent in that channel's tree (-1: the root), from
        the comm events' trees (NCCL logs them at init, whatever the operators then run)."""
        self.job: str | None = None
        self.version = 0
        """Bumped whenever what a rank's endpoints or peers derive from changes (callers
        cache them per version)."""

    def add(self, events: Iterable[HookEvent]) -> None:
        for e in events:
            if isinstance(e, CommEvent) and e.rank is not None:  # rank None: not known yet
                self.version += 1
                self._set_node(e.comm_id, e.rank, e.node, replace=True)
                self.nranks[e.comm_id] = e.nranks
                if e.pid is not None:
                    self.rank_pid[(e.comm_id, e.rank)] = e.pid
                if e.rings:
                    self.rings.setdefault(e.comm_id, e.rings)
                if e.trees:
                    chans = self.tree_parent.setdefault(e.comm_id, {})
                    for ch, row in enumerate(e.trees):
                        if len(row) >= 2:
                            chans.setdefault(ch, {})[row[0]] = row[1]
                if self.job is None:
                    self.job = e.job
            elif isinstance(e, FlowEvent) and e.bound:
                key = (e.comm_id, e.rank)  # type: ignore[arg-type]
                self.version += 1
                self._set_node(e.comm_id, e.rank, e.node)  # type: ignore[arg-type]
                self.rank_nics[key].add(f"{e.node}/{e.nic}")  # type: ignore[index]
                if e.direction == "send":
                    self.send_peers[key].add(e.peer)  # type: ignore[index, arg-type]

    def learn_rank(self, comm_id: str, rank: int, node: str, nranks: int, nics: Iterable[str] | None) -> None:
        """Fill gaps from operator metrics (a job without comm events still has a membership)."""
        self._set_node(comm_id, rank, node)
        if comm_id not in self.nranks:
            self.nranks[comm_id] = nranks
            self.version += 1
        if nics:
            have = self.rank_nics[(comm_id, rank)]
            for n in nics:
                ep = n if "/" in n else f"{node}/{n}"
                if ep not in have:
                    have.add(ep)
                    self.version += 1

    def _set_node(self, comm_id: str, rank: int, node: str, *, replace: bool = False) -> None:
        if replace or (comm_id, rank) not in self.rank_node:
            self.version += 1
            self.rank_node[(comm_id, rank)] = node
            self._by_comm.setdefault(comm_id, {})[rank] = node

    def members(self, comm_id: str) -> dict[int, str]:
        """rank -> node for every rank of a communicator that is known."""
        return dict(self._by_comm.get(comm_id, ()))

    def nodes(self) -> set[str]:
        return set(self.rank_node.values())

    def peers_of(self, comm_id: str, rank: int) -> set[int]:
        """The ranks this rank sends to: from send-flow bindings, else the ring order."""
        peers = self.send_peers.get((comm_id, rank))
        if peers:
            return set(peers)
        out: set[int] = set()
        for ring in self.rings.get(comm_id, []):
            if rank in ring and len(ring) > 1:
                out.add(ring[(ring.index(rank) + 1) % len(ring)])
        return out

    def ring_predecessors(self, comm_id: str, rank: int) -> set[int]:
        """The ranks whose ring sends reach this rank (one per ring it is in): the last data
        a ring collective waits for comes from them."""
        out: set[int] = set()
        for ring in self.rings.get(comm_id, []):
            if rank in ring and len(ring) > 1:
                out.add(ring[ring.index(rank) - 1])
        return out

    def proc(self, comm_id: str, rank: int) -> tuple[str, str]:
        """The GPU process behind a rank, to order one process's operators across its
        communicators: (node, pid) when known, else (node, its rail NIC)."""
        node = self.rank_node.get((comm_id, rank), "?")
        pid = self.rank_pid.get((comm_id, rank))
        if pid is not None:
            return node, f"pid{pid}"
        nics = self.rank_nics.get((comm_id, rank))
        return node, min(nics) if nics else f"{comm_id}:{rank}"
