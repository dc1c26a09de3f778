"""Which nodes a slow record can blame, and which slow links a collective's pace explains.

A record is slow because of one of its own links: its node's, or one of the peers it sent
to. A collective's ranks are paced by its slowest link, wherever it is: a ring rank
forwards what its predecessor hands it, a tree relay what its parent sends, so a rank's
ACT stretches with a slow link anywhere in the collective, not only at its own ends.
"""

from __future__ import annotations

from collections.abc import Callable

from ..evidence import Link, node_of
from ..finding import PEER_RATE_IN, Finding
from .capacity import bursting


def record_suspects(hits: list[Finding]) -> set[str]:
    """Nodes present in every slow record's {its node} + {the nodes it sends to}."""
    return set(frozenset.intersection(*map(record_nodes, hits))) if hits else set()


_RECORD_NODES: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {}


def record_nodes(f: Finding) -> frozenset[str]:
    """{f.node} + the nodes of f.peer_eps (memoised: asked of every slow finding of the
    window at each evaluation); the receiver alone for a link into a receiver starved
    inward (:data:`.finding.PEER_RATE_IN`: every sender into it was slow alike)."""
    key = (f.node if f.metric != PEER_RATE_IN else "", f.peer_eps)
    nodes = _RECORD_NODES.get(key)
    if nodes is None:
        nodes = frozenset(({f.node} if key[0] else set()) | {node_of(e) for e in f.peer_eps})
        if len(_RECORD_NODES) < 1 << 18:
            _RECORD_NODES[key] = nodes
    return nodes


def paced_by_one(slow: dict[Link, list[Finding]], members: Callable[[str], frozenset[str]],
                 named: frozenset[str] = frozenset()) -> dict[Link, list[Finding]] | None:
    """The slow links without those a collective's pace explains, when one node explains
    every slow record that is not slow by timing alone (bytes resent, a rate below the
    operator's, a receiver starved inward) - or, with every slow record slow by timing
    alone, when one node already ``named`` in an open network incident is on a slow link: a
    slow link between two other nodes that is slow only by the ACT of records of
    collectives that node is a member of says that its collective waited, not where. None
    when no such node is found or nothing is set aside.

    Sweep 281 #7 (incast into node-12's downlinks, 4 pipeline stages under MoE): node-12
    named network-slow by every all-to-all link into it starved; then its stage's
    data-parallel ring, paced by its link into node-12, slow by ACT on node-12 -> node-13
    and node-13 -> node-14 as well; no node on every slow link, and node-12 was named a
    path with node-13, then with node-14."""
    firm = [f for fs in slow.values() for f in fs if not f.timing_only()]
    if firm:
        suspects = record_suspects(firm)
    else:
        ends = {node_of(e) for k in slow for e in k}
        suspects = set(named & ends)
    if len(suspects) != 1:
        return None
    x = next(iter(suspects))
    kept = {k: fs for k, fs in slow.items()
            if x in (node_of(k[0]), node_of(k[1])) or not all(f.timing_only() and x in members(f.comm_id) for f in fs)}
    return kept if len(kept) < len(slow) else None


def bursting_relays(own: list[Finding], ratio: float) -> bool:
    """Whether a node's own slow records are all tree relays slow by timing alone whose
    NIC moved in bursts, not held to a rate: their busiest epoch, median over those whose
    figure is known (most of them), beyond ``1 / ratio`` of what one rate held throughout
    shows (:attr:`.finding.Finding.burst`; the margin the ceilings take, a capped NIC's
    rate varying a few percent from epoch to epoch). A NIC capped at a rate keeps its
    relays' epochs flat; a relay fed at the pace of a cap elsewhere forwards each chunk
    at line rate as it comes. Sweep 283 #16 (a NIC at 30 % on node-01, a 7-node tree):
    every relay of the rail went slow, node-05's relay - to node-01 among three others -
    and node-06's first; node-05 was the one node in every slow record, its own among
    them, and was named. Its relays' busiest epochs were 1.25-1.55 of the flat bound
    (node-06's 1.7-2.4), node-01's own 0.97-1.24."""
    if not own or not all(f.timing_only() and len(f.peer_eps) > 1 and f.flows > 1 for f in own):
        return False
    return bursting(own, ratio)
