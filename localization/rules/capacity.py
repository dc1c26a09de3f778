"""What the link windows show of a NIC's capacity, for the rules that must tell a cap at one
end of the slow links from a fault elsewhere."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import NamedTuple

from ..evidence import Link, node_of
from ..finding import Finding
from ..robust import median


class Rates(NamedTuple):
    """What the link windows show of the NICs' rates, bytes/ns (0 or absent: unknown)."""

    slow_hi: dict[Link, float]
    """Per slow link, the highest rate its slow observations got."""
    clean_lo: dict[Link, float]
    """Per clean link, the rate its sender's NIC surely reached in one of its recent
    observations."""
    clean_in: dict[Link, float]
    """Per clean link, the rate the link itself surely carried (-1: its records sent to
    several peers at once, so the link's own share is not known)."""
    took_in: dict[str, float] = {}
    """Per NIC, the most its downlink was seen carrying in all-to-alls delivered cleanly
    into it (:class:`.evidence.Intake`): what no one link into it shows."""



def capable(slow: dict[Link, list[Finding]], clean: set[Link], rates: Rates | None, x: str,
            sends: bool, outside: Collection[str]) -> bool:
    """Whether ``x``'s clean traffic with nodes not in ``outside`` shows its NIC (its sends
    when ``sends``, else what it receives) moving more than x's slow links of that direction
    got: then a cap at x does not explain them. Without rates (unknown), any clean link
    with a third node counts. What x receives is shown only by a sender that sent to x
    alone (an all-to-all sender's rate is shared among all its receivers)."""
    mine = [k for k in slow if node_of(k[0 if sends else 1]) == x]
    slow_hi, clean_lo, clean_in = (rates or ({}, {}, {}))[:3]
    shown = clean_lo if sends else clean_in
    bar = max((slow_hi.get(k, 0.0) for k in mine), default=0.0)
    if (not sends and bar > 0 and isinstance(rates, Rates)
            and any(v > bar for e, v in rates.took_in.items() if node_of(e) == x)):
        # the sum of an all-to-all's flows into x (sweep 347 #5, 281 #21: a ring link, a
        # pipeline send into a healthy node slow at 15-24 GB/s while its downlink took in
        # 26-43 GB/s from its all-to-all peers)
        return True
    for a, b in clean:
        me, other = (a, b) if sends else (b, a)
        if node_of(me) != x or node_of(other) in outside:
            continue
        lo = shown.get((a, b), 0.0)
        if lo < 0:
            continue  # the link's own share is not known
        if bar <= 0 or lo == 0 or lo > bar:
            return True
    return False


def beaten_on_every_nic(slow: dict[Link, list[Finding]], clean: set[Link], rates: Rates | None,
                        outside: Collection[str], sends: bool, *, reverse: bool = False) -> bool:
    """Whether every NIC at the sending end of the slow links (``sends``; else at the
    receiving end) is seen, on a clean link with a node not in ``outside``, moving at a
    known rate above what the slow links through it got: :func:`capable` NIC by NIC, and
    no unknown rate counts. One such NIC is not enough to clear a node: a congested
    downlink passes a message now and then in a lull, a starved host's sends keep their
    NIC busy at the pace it posts them. ``reverse``: moving the other way (the sending
    end's NICs receiving, the receiving end's sending), which clears a fault of the NIC or
    its PCIe link: those slow both directions alike."""
    slow_hi, clean_lo, clean_in = (rates or ({}, {}, {}))[:3]
    out = sends != reverse  # the NICs are seen sending
    shown = clean_lo if out else clean_in
    end = 0 if sends else 1
    at = 0 if out else 1
    bars: dict[str, float] = {}
    for k in slow:
        bars[k[end]] = max(bars.get(k[end], 0.0), slow_hi.get(k, 0.0))
    for nic, bar in bars.items():
        if bar <= 0 or not any(k[at] == nic and node_of(k[1 - at]) not in outside and shown.get(k, 0.0) > bar
                               for k in clean):
            return False
    return True


def held_to_one_rate(hits: list[Finding]) -> bool:
    """Whether most slow findings carry a busiest-epoch figure and their median is at most
    the flat bound (:attr:`.Finding.burst`): the bytes went at one rate, as a cap holds
    them, not in bursts between lulls (a congested downlink, a starved host)."""
    bursts = [f.burst for f in hits if not math.isnan(f.burst)]
    return 2 * len(bursts) > len(hits) and median(bursts) <= 1.0


def bursting(fs: list[Finding], ratio: float) -> bool:
    """Whether most findings carry a busiest-epoch figure (:attr:`.Finding.burst`) and their
    median is beyond ``1 / ratio`` of the flat bound: not held to one rate. The margin is the
    one a rate below another takes (a capped NIC's rate varies a few percent from epoch to
    epoch: sweep 229 #9, 0.98-1.08)."""
    bursts = [f.burst for f in fs if not math.isnan(f.burst)]
    return 2 * len(bursts) > len(fs) and median(bursts) > 1.0 / ratio


def downlink_shaped(hits: list[Finding], ratio: float, members: Callable[[str], frozenset[str]]) -> bool:
    """Whether slow collective sends kept their NIC busy through their records (most of
    them) and moved in bursts rather than at one rate (:func:`bursting`): what held them
    back was at the receiving end - a downlink shared with traffic from outside the job,
    served in its lulls. A starved host posts each collective step late and leaves its NIC
    idle between them; a cap at the sender's NIC or on the path holds the rate flat.
    Collectives of three or more ranks only (``members``: a communicator's nodes): a starved
    host's point-to-point sends go back to back at its pace, every epoch active (battery
    cpu-contention seed 1, a host at 30 %: its healthy pipeline partner was named without
    this). Measured: incast into a ring node's downlinks (sweeps 287 #22, 271 #7) busy in
    12 of 12 records at 1.6-4.2 of the flat bound; starved hosts' ring sends (269 #11, 287
    #5) busy in 0-1 of 7-12."""
    timed = [f for f in hits if f.metric == "act_ns"]
    return (2 * sum(f.busy() for f in timed) > len(timed) > 0 and bursting(timed, ratio)
            and all(len(members(f.comm_id)) > 2 for f in hits))


def network_unfit_at(slow: dict[Link, list[Finding]], x: str) -> bool:
    """Whether the slow links into x reach it on two or more of its NICs, their senders'
    NICs sat idle through most of those records (epochs known), and some of those NICs of
    x are not slow sending: no fault of x's network fits them. A fault at x's end that
    slows several of its NICs either caps its downlinks (incast, a congested leaf: the
    senders kept busy, passing bursts in the lulls) or sits behind them (a PCIe cap: it
    slows what x sends on those NICs alike, its senders idle waiting for x's credits -
    sweep 307 #20, busy in 2-4 of 12); a flapping or lossy NIC is one NIC. A starved host
    upstream leaves its sends idle between late posts on all its NICs (sweep 287 #5: node-04
    at 46 % of its CPU in a 5-node ring, its sends into node-00 slow on all four NICs, busy
    in 3 of 38 records, and one of node-00's ring sends, paced by them, slow too: node-00,
    on every slow link, was named network-slow)."""
    into = [(k, fs) for k, fs in slow.items() if node_of(k[1]) == x]
    nics = {k[1] for k, _fs in into}
    if len(nics) < 2 or nics <= {k[0] for k in slow}:
        return False
    timed = [f for _k, fs in into for f in fs if f.metric == "act_ns" and f.epoch_ns > 0]
    return bool(timed) and 2 * sum(f.busy() for f in timed) < len(timed)


def nic_cleared(slow: dict[Link, list[Finding]], clean: set[Link], rates: Rates | None, x: str,
                outside: Collection[str]) -> bool:
    """Whether x's NICs on the slow links are each seen, on clean links with nodes not in
    ``outside`` at known rates, sending faster than x's slow sends got or receiving faster
    than what it received on them: a fault of those NICs (or their PCIe) would slow both
    directions alike. What x receives is often unknown (its senders send to several peers
    at once), so either direction clears."""
    out = {k: v for k, v in slow.items() if node_of(k[0]) == x}
    into = {k: v for k, v in slow.items() if node_of(k[1]) == x}
    return bool(out and into) and (beaten_on_every_nic(out, clean, rates, outside, sends=True)
                                   or beaten_on_every_nic(into, clean, rates, outside, sends=False))


def one_way_path(slow: dict[Link, list[Finding]], clean: set[Link], rates: Rates | None,
                  covers: list[str], hits: list[Finding],
                  paced: tuple[dict[Link, float], dict[Link, float]] | None = None) -> bool:
    """Only x -> y is slow, on every NIC pair through which x sends to y, and neither x's other
    sends nor y's other receives need to be seen (a ring between them: x sends to y alone, y
    receives from x alone). What the other direction and the slow sends themselves show
    tells the causes apart:

    * a NIC or PCIe fault slows both directions alike: every one of x's NICs is seen
      receiving, and every one of y's sending, at a known rate above what the slow links got;
    * a starved host sends what it posts at line rate, idle in between, and a congested
      downlink passes bursts in its lulls: the slow sends were held to one rate throughout
      (:attr:`.Finding.burst`, their median at most 1) and kept their NIC busy.

    What is left is the path between them (sweep 229 #12: a path at 24 % of its rate in an
    11-node ring, node-05's sends to node-06 at 0.98-0.99 of the flat bound on four NICs,
    its receives and node-06's sends at 2.8x that rate; missed, waiting for node-06 to be
    seen receiving from a third node, which a ring never shows). The other direction's
    rates count from records within the bound in slow operators too (``paced``): a ring
    paced by the path is slow as a whole, and its records that kept within the bound are
    no less a rate their NICs reached."""
    if rates is None or len(covers) != 2 or len({node_of(a) for a, _ in slow}) != 1:
        return False
    x = node_of(next(iter(slow))[0])
    y = next(c for c in covers if c != x)
    if _seen_short(slow, clean, rates, x, True, covers) or _seen_short(slow, clean, rates, y, False, covers):
        return False
    timed = [f for f in hits if f.metric == "act_ns"]
    if not (held_to_one_rate(hits) and 2 * sum(f.busy() for f in timed) > len(timed) > 0):
        return False
    lo, own = paced or ({}, {})
    shown = clean | lo.keys()
    both = Rates(rates[0], _most(rates[1], lo), _most(rates[2], own))
    return (beaten_on_every_nic(slow, shown, both, covers, sends=True, reverse=True)
            and beaten_on_every_nic(slow, shown, both, covers, sends=False, reverse=True))


def _seen_short(slow: dict[Link, list[Finding]], clean: set[Link], rates: Rates, x: str, sends: bool,
                covers: Collection[str]) -> bool:
    """Whether x is seen, on clean links with a third node in the slow links' direction (its
    sends when ``sends``, else what it receives) at known rates, and none of them moved more
    than the slow links got (:func:`capable`): then x's own NIC is as slow with everyone,
    and a path between the two ends does not explain the slow links - a ring between them
    shows nothing else and is not asked. Sweep 293 #4: congestion into node-03's downlinks,
    node-02's sends into it held flat at 9.5-11.9 GB/s on four NICs and node-02 seen sending
    and receiving at 16.4 elsewhere, while node-03's pipeline receives from node-01, not
    slow enough to be flagged, took 8.2-9.4: the pair was named a path (node-02 a wrong
    blame) before node-01's sends were flagged and named node-03."""
    shown = rates[1] if sends else rates[2]
    end, far = (0, 1) if sends else (1, 0)
    seen = any(node_of(k[end]) == x and node_of(k[far]) not in covers and shown.get(k, 0.0) > 0 for k in clean)
    return seen and not capable(slow, clean, rates, x, sends, covers)


def _most(a: dict[Link, float], b: dict[Link, float]) -> dict[Link, float]:
    return {k: max(a.get(k, -math.inf), b.get(k, -math.inf)) for k in a.keys() | b.keys()}
