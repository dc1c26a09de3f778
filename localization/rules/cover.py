"""The smallest set of nodes the slow records point at, and which nodes' parts in them are
seen healthy elsewhere (:mod:`.links` names that set a group when it is the only one of its
size)."""

from __future__ import annotations

from collections.abc import Iterable

from ..evidence import Link
from ..finding import Finding
from .capacity import Rates, capable


def exonerated(pairs: set[tuple[str, str]], clean_pairs: set[tuple[str, str]], nodes: list[str],
               slow: dict[Link, list[Finding]] | None = None, clean: set[Link] | None = None,
               rates: Rates | None = None) -> set[str]:
    """Nodes whose part in the slow links is seen healthy elsewhere: a node that only sends
    on them while sending cleanly to a node outside them (its NIC, uplink and host work), or
    only receives on them while receiving cleanly from one (its downlink works). Pipeline
    sends into two congested downlinks (battery switch-congestion: node-06 -> node-02,
    node-07 -> node-03) are covered by the receivers, the senders or one of each alike; the
    senders' clean ring sends leave the receivers.

    With the links and their rates (:func:`.capacity.shown_rates`), a clean link shows that
    part healthy only if it moved more than the node's slow links of that direction got
    (:func:`.capacity.capable`): a congested downlink still passes a small exchange at its
    usual pace, and that exchange's operator is not slow when most of its ranks are behind
    the same congestion (sweep 257 #8: incast into node-04 and node-05, their tree
    all-reduce with node-03 clean at 10.9 GB/s while the pipeline sends into them got 12.5-14;
    the receivers were exonerated and the two healthy senders named)."""
    out_of: dict[str, set[str]] = {}
    into: dict[str, set[str]] = {}
    for a, b in pairs:
        out_of.setdefault(a, set()).add(b)
        into.setdefault(b, set()).add(a)
    clean_out: dict[str, list[str]] = {}
    clean_in: dict[str, list[str]] = {}
    for a, b in clean_pairs:
        clean_out.setdefault(a, []).append(b)
        clean_in.setdefault(b, []).append(a)
    shown = slow is not None and clean is not None and rates is not None
    out = set()
    for x in nodes:
        sends, gets = x in out_of, x in into
        partners = out_of.get(x, set()) | into.get(x, set())
        if shown:
            assert slow is not None and clean is not None
            ok_out = not sends or capable(slow, clean, rates, x, True, partners)
            ok_in = not gets or capable(slow, clean, rates, x, False, partners)
        else:
            ok_out = any(b not in partners for b in clean_out.get(x, ()))
            ok_in = any(a not in partners for a in clean_in.get(x, ()))
        if (sends or gets) and (not sends or ok_out) and (not gets or ok_in):
            out.add(x)
    return out


def unique_cover(sets: Iterable[Iterable[str]], nodes: list[str], max_group: int,
                 exclude: set[str] | None = None) -> tuple[str, ...] | None:
    """The smallest set of nodes meeting every slow record's {its node} + {the nodes it
    sends to} (for a ring record: its one link), when it is the only one of its size (at
    most ``max_group`` nodes); None when none or several are. Three nodes whose records all
    resend to each other (a lossy link under a 3-rank tree, where every rank sends to both
    others) are each one such set: the records do not say which, and a guess names a
    healthy node."""
    want = {frozenset(s) for s in sets}
    index = {x: i for i, x in enumerate(nodes)}
    if not want or len(index) < len(nodes):
        return _unique_cover_scan(want, nodes, max_group, exclude)
    # Every cover of size k holds a node of each set; below the first size with a cover,
    # none holds a node it could do without. So covers of size k are found by choosing,
    # k times, a node of the smallest set not met yet: a few branches per record where
    # scanning every k-combination of the nodes grew as nodes^k.
    members = sorted((sorted(index[x] for x in s if x in index) for s in want), key=len)
    if not members[0]:
        return None  # a set no node can meet
    bit = [0] * len(nodes)
    for j, m in enumerate(members):
        for i in m:
            bit[i] |= 1 << j
    full = (1 << len(members)) - 1
    for k in range(1, max_group + 1):
        found: set[tuple[int, ...]] = set()
        _covers(members, bit, full, 0, (), k, found)
        if not found:
            continue
        covers = [tuple(nodes[i] for i in c) for c in sorted(found)]
        if exclude:
            # covers holding a node whose part is seen healthy elsewhere are not explanations
            covers = [c for c in covers if not exclude & set(c)]
            if not covers:
                return None
        return covers[0] if len(covers) == 1 else None
    return None


def _covers(members: list[list[int]], bit: list[int], full: int, met: int, chosen: tuple[int, ...], k: int,
            found: set[tuple[int, ...]]) -> None:
    """Adds to ``found`` every way (sorted node indices) of meeting all sets with ``k``
    nodes, given those ``chosen`` so far (meeting the sets of mask ``met``)."""
    if met == full:
        if len(chosen) == k:
            found.add(tuple(sorted(chosen)))
        return
    if len(chosen) == k:
        return
    # the sets are sorted by size: the first one not met has the fewest nodes to try
    j = ((full & ~met) & -(full & ~met)).bit_length() - 1
    for i in members[j]:
        _covers(members, bit, full, met | bit[i], (*chosen, i), k, found)


def _unique_cover_scan(want: set[frozenset[str]], nodes: list[str], max_group: int,
                       exclude: set[str] | None) -> tuple[str, ...] | None:
    """:func:`unique_cover` by scanning every combination (no sets, or repeated nodes)."""
    from itertools import combinations

    for k in range(1, max_group + 1):
        found = [c for c in combinations(nodes, k) if all(not s.isdisjoint(c) for s in want)]
        if found and exclude:
            # covers holding a node whose part is seen healthy elsewhere are not explanations
            found = [c for c in found if not exclude & set(c)]
            if not found:
                return None
        if found:
            return found[0] if len(found) == 1 else None
    return None
