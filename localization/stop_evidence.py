"""What the stop rules read: stalled records, members absent from operators their peers are
stuck in, and the point-to-point state (posted receives, grants)."""

from __future__ import annotations

from pulse.events import P2P, OpEvent
from pulse.records import OpMetrics

from .finding import Finding


class StopEvidence:
    """Stalled records, members absent from operators their peers are stuck in, and the
    point-to-point state: the receiver's side of a send has no record of its own (it sends
    no data), so its posted receives (hook events) say who waits for what."""

    def __init__(self) -> None:
        self.stalls: list[Finding] = []
        self.absent: list[Finding] = []
        self.last_recv: dict[tuple[str, str], tuple[int, int, int]] = {}
        """(comm, node) -> (seq, rank, t_host_ns) of the last receive it posted with a time."""
        self.p2p_issued: dict[tuple[str, str], int] = {}
        """(comm, node) -> the last receive that node's rank posted there (its seq)."""
        self.p2p_seen: dict[str, int] = {}
        """comm -> the last point-to-point seq with a record."""
        self.p2p_done: dict[str, int] = {}
        """comm -> the last point-to-point seq with a complete record."""
        self.granting: set[tuple[str, int]] = set()
        """(comm, rank) of sends whose receiver's credit grants show on the wire."""
        self.ungranted: set[tuple[str, int, int]] = set()
        """(comm, seq, rank) of incomplete sends on such flows that no grant reached: the
        sender was not yet allowed to send, so its empty record says nothing of its NIC."""
        self.last_issue: dict[str, int] = {}
        """node -> the latest host issue time among its records and forwarded receives (its
        clock)."""
        self.awaiting: set[str] = set()
        """Nodes whose sends of a grouped operator (all-to-all) completed while another
        member's stalled: the operator is done for a rank only once every peer's bytes have
        arrived, so they wait in it, whatever their own record says."""
        self.unjudged: dict[str, set[tuple[str, int]]] = {}
        """node -> (comm, seq) of its incomplete records whose operators are not judged yet:
        the node is in them, and whether it stalled there is not known yet."""
        self.deferred = False
        """The stop rules waited for such records (:func:`.rules.stops.stop_hypotheses`):
        once none is left they are asked again at once, not at the next time the
        hypotheses are due (after a hang the trace time stops moving)."""
        self.lone: dict[tuple[str, int], str] = {}
        """(comm, seq) of grouped operators in which one member's record stalled while every
        other member's completed, or finished with every peer but that member -> that
        member's node."""

    def note_grouped(self, ordered: list[OpMetrics], stalled: set[str]) -> None:
        """A closed grouped operator's records and the nodes whose records in it stalled."""
        if stalled:
            self.awaiting.update(r.node for r in ordered if r.complete and r.node not in stalled)
            if len(ordered) >= max(ordered[0].nranks, 3):
                node = _lone(ordered, stalled)
                if node is not None:
                    self.lone[(ordered[0].comm_id, ordered[0].seq)] = node

    def note_issue(self, node: str, t_host_ns: int | None) -> None:
        if t_host_ns is not None and t_host_ns > self.last_issue.get(node, -(1 << 62)):
            self.last_issue[node] = t_host_ns

    def note_recv(self, e: OpEvent) -> None:
        self.note_issue(e.node, e.t_host_ns)
        key = (e.comm_id, e.node)
        self.p2p_issued[key] = max(self.p2p_issued.get(key, -1), e.seq)
        if e.t_host_ns is not None and e.rank is not None:
            self.last_recv[key] = (e.seq, e.rank, e.t_host_ns)

    def counts(self) -> tuple[int, int]:
        """How many stalls and absences are held (the stop rules' evidence)."""
        return len(self.stalls), len(self.absent)

    def settled(self) -> bool:
        """Whether the stop rules waited and nothing is in flight any more."""
        return self.deferred and not self.in_flight()

    def in_flight(self) -> bool:
        """Whether some node has an incomplete record of an operator not judged yet."""
        return any(self.unjudged.values())

    def note_judged(self, comm: str, seq: int, nodes: list[str]) -> None:
        for n in nodes:
            ops = self.unjudged.get(n)
            if ops:
                ops.discard((comm, seq))

    def note_record(self, m: OpMetrics) -> None:
        self.note_issue(m.node, m.t_host_ns)
        if not m.complete:
            self.unjudged.setdefault(m.node, set()).add((m.comm_id, m.seq))
        if m.kind in P2P:
            self.p2p_seen[m.comm_id] = max(self.p2p_seen.get(m.comm_id, -1), m.seq)
            if m.complete:
                self.p2p_done[m.comm_id] = max(self.p2p_done.get(m.comm_id, -1), m.seq)
            if m.granted_ns is not None:
                self.granting.add((m.comm_id, m.rank))
            elif not m.complete and (m.comm_id, m.rank) in self.granting:
                self.ungranted.add((m.comm_id, m.seq, m.rank))


def _lone(ordered: list[OpMetrics], stalled: set[str]) -> str | None:
    """The stalled member of a grouped operator that every other incomplete record waits
    for alone: those records finished with every other peer (their per-peer bytes), so their
    NICs worked with third parties in this very operator while the traffic to and from that
    member stopped (sweep 271 #1: a NIC dead mid all-to-all on node-03 at 73 % sent, node-01's
    record at 99 %, short only of its bytes for node-03; every member was on as many stalled
    links as the next and the hung job got no verdict)."""
    incomplete = [r for r in ordered if not r.complete]
    # two records each short only of the other's bytes: a link between them broke, and
    # nothing here says at which end
    lone = {x.node for x in incomplete
            if x.node in stalled and all(r is x or _waits_only_for(r, x.rank) for r in incomplete)}
    return lone.pop() if len(lone) == 1 else None


def _waits_only_for(r: OpMetrics, rank: int) -> bool:
    """Whether ``r`` has every byte it declared for each peer but ``rank`` (per-peer figures
    known)."""
    if r.peer_ranks is None or r.peer_bytes is None or r.peer_expected_bytes is None:
        return False
    return all(pr == rank or got >= want
               for pr, got, want in zip(r.peer_ranks, r.peer_bytes, r.peer_expected_bytes, strict=True))
