"""Host contention: a starved host posts its sends late on every NIC it drives.

Physical fact relied on: the node's own sends slow down far more than what it receives
(the receive side keeps slots posted ahead, so a late proxy thread rarely stalls its
senders; measured: a starved proxy slows its point-to-point sends by x1.8-x8 and what it
receives by x1.0-x2.5), which a NIC, PCIe or link fault cannot do: those slow both
directions alike. One proxy thread serves all of the node's NICs, so its sends are slow
on several of them, while one NIC's fault slows one.
"""

from __future__ import annotations

import numpy as np

from ..decisions import Hypothesis, Key, make_hypothesis
from ..evidence import Link, node_of
from ..finding import Finding
from ..params import LocalizeParams
from .capacity import Rates, capable


def excess(fs: list[Finding]) -> float:
    """Median slowdown of findings over their reference (0.3 = 30 % slower)."""
    xs = [f.value / f.peers - 1.0 for f in fs if f.metric == "act_ns" and f.peers > 0]
    return float(np.median(xs)) if xs else 0.0


def host_shaped(slow: dict[Link, list[Finding]], p: LocalizeParams, x: str) -> bool:
    """Whether the slow links look like x's starved host from x's side alone: x on every
    one, its sends slow on ``host_min_nics`` NICs or more, what it receives at most
    ``host_in_frac`` as slow. A NIC, PCIe or link fault slows both directions alike, so
    until x's receivers are seen receiving cleanly from others (which tells the host from
    their downlinks) the slow links are not x's network either."""
    if not all(x in (node_of(a), node_of(b)) for a, b in slow):
        return False
    out_links = [k for k in slow if node_of(k[0]) == x]
    if len({k[0] for k in out_links}) < p.host_min_nics:
        return False
    out_ex = excess([f for k in out_links for f in slow[k]])
    in_links = [k for k in slow if node_of(k[1]) == x]
    in_ex = excess([f for k in in_links for f in slow[k]]) if in_links else 0.0
    return out_ex > 0 and in_ex <= p.host_in_frac * out_ex


def host_hypothesis(slow: dict[Link, list[Finding]], clean: set[Link], p: LocalizeParams,
                    rates: Rates | None = None) -> dict[Key, Hypothesis]:
    """x is host-contended when every slow link touches x, x's sends are slow on at least
    ``host_min_nics`` of its NICs, the traffic into x is clean or at most ``host_in_frac``
    as slow, and the nodes x sends to still receive cleanly from others (else their
    downlinks are the problem). A link into x that is used and clean, or an out-link of x
    to another receiver that is slow too, rules out a path that only carries x's traffic
    one way. ``slow`` / ``clean``: the link state (:func:`.links.link_state`). A receiver's
    clean traffic clears its downlink only when it came faster than x's slow sends into it
    got (:func:`.capacity.capable`, with ``rates``): a downlink that lost half its capacity
    still takes an all-to-all's flows, bound by their senders' fan-out, at their usual
    pace (sweep 53 #0: congestion into node-00, its stage's 3-rank all-to-all clean, the
    pipeline sends into it from node-03 slow on two NICs, node-03 named host-contention)."""
    nodes = sorted({node_of(a) for a, _ in slow})
    for x in nodes:
        if not all(x in (node_of(a), node_of(b)) for a, b in slow):
            continue
        out_links = [k for k in slow if node_of(k[0]) == x]
        out_nics = {k[0] for k in out_links}
        if len(out_nics) < p.host_min_nics:
            continue
        out_ex = excess([f for k in out_links for f in slow[k]])
        in_links = [k for k in slow if node_of(k[1]) == x]
        in_ex = excess([f for k in in_links for f in slow[k]]) if in_links else 0.0
        if out_ex <= 0 or in_ex > p.host_in_frac * out_ex:
            continue
        receivers = {node_of(k[1]) for k in out_links}
        if not all(capable(slow, clean, rates, d, False, (x,)) for d in receivers):
            continue
        reverse_used = bool(in_links) or any(node_of(a) in receivers and node_of(b) == x and _beats(rates, (a, b), out_links)
                                             for a, b in clean)
        if not (reverse_used or len(receivers) >= 2):
            continue
        hits = [f for fs in slow.values() for f in fs]
        clean_in = sorted({b for a, b in clean if node_of(b) == x})
        return {("host-contention", (x,)): make_hypothesis(
            p, "host-contention", "node", (x,), hits, culprit=x,
            extra={"slow_out_nics": sorted(out_nics), "clean_in_nics": clean_in,
                   "out_excess": round(out_ex, 3), "in_excess": round(in_ex, 3)})}
    return {}


def _beats(rates: Rates | None, link: Link, slow_out: list[Link]) -> bool:
    """Whether a clean link back into x carried more than x's slow sends got, as far as is
    known (rates unknown: it counts, as before rates were read). A path's fault slows only
    the traffic that needs more than it leaves: an all-to-all's flow, bound by its sender's
    fan-out, passes a path at a quarter of its rate untouched, and its rate is its own
    share of an unknown whole (-1), which shows nothing of the path (sweep 283 #11: a path
    at 24 % between node-00 and node-06, the ring's only link between them node-06 ->
    node-00 slow on 4 NICs, node-00's all-to-all sends to node-06 clean; node-06 was named
    host-contention)."""
    slow_hi, _, clean_in = (rates or ({}, {}, {}))[:3]
    lo = clean_in.get(link, 0.0)
    if lo < 0:
        return False
    bar = max((slow_hi.get(k, 0.0) for k in slow_out), default=0.0)
    return bar <= 0 or lo == 0 or lo > bar
