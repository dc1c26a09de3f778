"""Slow links: network-slow (one node), path (two nodes) or group (a few nodes).

Physical facts relied on:

* Every byte of a NIC's traffic crosses that NIC, its PCIe link and its switch port: a
  fault there slows every link that starts or ends at it, so one node on every
  persistently slow link is the culprit (network-slow, with that NIC). Slow in both
  directions, or only into it, is its NIC / PCIe / downlink; only out of it, on several
  NICs, is its host (:mod:`.host`, asked first).
* A fault on the path between two nodes (a switch-to-switch link, a route) slows only
  their traffic with each other: when each of them still sends and receives cleanly with
  third nodes, neither NIC explains the slow links - a path (group of two).
* Otherwise the smallest set of nodes covering the slow links is the group (e.g. the
  nodes behind one leaf switch).
* One slow link alone fits its sender, its receiver and the path alike: wait for more.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..decisions import Hypothesis, Key, make_hypothesis
from ..evidence import Evidence, Link, node_of, node_pairs
from ..finding import PEER_RATE_IN, Finding
from ..params import LocalizeParams
from ..robust import median
from .capacity import (
    Rates,
    beaten_on_every_nic,
    capable,
    downlink_shaped,
    held_to_one_rate,
    network_unfit_at,
    nic_cleared,
    one_way_path,
)
from .cover import exonerated, unique_cover
from .host import host_hypothesis, host_shaped
from .records import bursting_relays, paced_by_one, record_nodes, record_suspects

__all__ = ["exonerated", "link_state", "network_hypotheses", "record_suspects", "shown_rates",
           "slow_link_hypotheses", "unique_cover"]


def link_state(ev: Evidence, p: LocalizeParams) -> tuple[dict[Link, list[Finding]], set[Link]]:
    """Persistently slow links (at least ``persist_ops`` slow observations, and
    ``persist_frac`` of the window, ``timing_persist_frac`` when their ACT alone says slow),
    and links seen clean since the slowness began (older clean observations say nothing
    about the fault)."""
    slow, clean, _, _ = _link_state(ev, p)
    return slow, clean


def _link_state(ev: Evidence, p: LocalizeParams) -> tuple[dict[Link, list[Finding]], set[Link], int, np.ndarray]:
    """:func:`link_state`, with the time clean observations count from and the clean links'
    rows in the link windows (for :func:`shown_rates`, which reads the same rows). A link is
    slow by its observations, or by those of its one-peer records alone
    (:attr:`.Evidence.single_links`)."""
    links = ev.links
    slow: dict[Link, list[Finding]] = {}
    for windows in (links, ev.single_links):
        for key in windows.hot:
            if key in slow or node_of(key[0]) in ev.insufficient or node_of(key[1]) in ev.insufficient:
                continue
            obs = windows.obs[key]
            # a record that shared its NIC with another kind of operator is not compared
            hits = [o.finding for o in obs if o.slow and o.finding is not None and not ev.alive.shared(o.finding)]
            if len(hits) >= p.persist_ops and len(hits) >= p.persist_frac * len(obs):
                tested = sum(1 for f in hits if not f.timing_only())
                if tested >= p.persist_frac * len(obs) or len(hits) >= p.timing_persist_frac * len(obs):
                    slow[key] = hits
    if not slow:
        return slow, set(), 0, np.zeros(0, np.int64)
    # Clean observations only count from when the slowness was there: the median
    # start of the slow hits, not the first (an outlier before the fault began
    # would let pre-fault traffic pass for clean evidence).
    # The starts and the observations' ends are on different nodes' clocks: only an
    # observation ending a skew bound after ``since`` surely followed it.
    since = _since(slow, p)
    n_recent, n_slow = links.recent(since)
    ok = (n_recent >= p.link_min_obs) & (n_slow <= p.clean_max_slow_frac * n_recent)
    rows = [r for r in np.flatnonzero(ok).tolist() if links.keys[r] not in slow]
    return slow, set(map(links.keys.__getitem__, rows)), since, np.array(rows, np.int64)


def _since(slow: dict[Link, list[Finding]], p: LocalizeParams) -> int:
    return int(np.median([f.start_ns for fs in slow.values() for f in fs])) + p.clock_skew_ns


def shown_rates(ev: Evidence, p: LocalizeParams, slow: dict[Link, list[Finding]], clean: set[Link],
                *, since: int | None = None, rows: np.ndarray | None = None) -> Rates:
    """What the link windows show of the NICs' capacity. A NIC capped at some rate still
    carries, at their usual pace, flows that never ask it for more (an all-to-all bound by
    its receivers' fan-in, a latency-bound exchange), so a clean link says the NIC works
    only up to the rate it carried; the slow links' observations say what the NIC, or the
    path, let through. ``since`` and ``rows``: what :func:`_link_state` found (the clean
    links' rows in the link windows), to not compute them again."""
    slow_hi: dict[Link, float] = {}
    if not slow:
        return Rates(slow_hi, {}, {})
    if since is None:
        since = _since(slow, p)
    for key in slow:
        his = [o.rate_hi for o in ev.links.obs[key] if o.slow and o.rate_hi > 0]
        if his:
            slow_hi[key] = median(his)
    # a cap is a hard bound: one clean record faster than it shows the NIC is not capped
    if rows is None:
        rows = np.array([ev.links.row(k) for k in clean], np.int64)
    clean_lo, clean_in = ev.links.clean_rates(since, rows)
    return Rates(slow_hi, clean_lo, clean_in, ev.intake.since({node_of(e) for k in slow for e in k}, since))


def network_hypotheses(ev: Evidence, p: LocalizeParams, named: frozenset[str] = frozenset()) -> dict[Key, Hypothesis]:
    """The slow links' culprit; ``named``: the nodes of the network incidents already open."""
    slow, clean, since, rows = _link_state(ev, p)
    if not slow:
        return {}
    paced = ev.paced.clean_rates(since, np.arange(len(ev.paced.keys), dtype=np.int64))
    return slow_link_hypotheses(slow, clean, p, shown_rates(ev, p, slow, clean, since=since, rows=rows), paced,
                                members=ev.rail.member_nodes, named=named)


def slow_link_hypotheses(slow: dict[Link, list[Finding]], clean: set[Link], p: LocalizeParams,
                         rates: Rates | None = None,
                         paced: tuple[dict[Link, float], dict[Link, float]] | None = None, *,
                         members: Callable[[str], frozenset[str]] | None = None,
                         named: frozenset[str] = frozenset()) -> dict[Key, Hypothesis]:
    """The culprit of the slow links, given the link state (slow links with their findings,
    clean links, and optionally what they show of the NICs' rates: :func:`shown_rates`).
    ``paced``: the rates links carried in records within the bound of slow operators since
    the slowness began (:attr:`.Evidence.paced`; as :meth:`.LinkWindows.clean_rates`), read
    only where a NIC's capacity the other way is asked (:func:`.capacity.one_way_path`).
    ``members``: a communicator's nodes, to set aside the links a collective's pace
    explains when no node is on every slow link (:func:`.records.paced_by_one`), given the
    nodes already ``named`` in open network incidents."""
    if not slow:
        return {}
    pairs = node_pairs(slow)
    nodes_in = sorted({n for pair in pairs for n in pair})
    # a link slow only as one into a receiver starved inward blames its receiver, never
    # its sender (sweep 223 #18: congestion into node-12 and node-13, node-11's links into
    # both persistently slow first, and node-11 was on every slow link)
    inward = {node_of(k[0]) for k, fs in slow.items() if all(f.metric == PEER_RATE_IN for f in fs)}
    covers = [x for x in nodes_in if all(x in pair for pair in pairs) and x not in inward]
    if not covers and members is not None:
        kept = paced_by_one(slow, members, named)
        if kept is not None:
            return slow_link_hypotheses(kept, clean, p, rates, paced)
    hits = [f for fs in slow.values() for f in fs]
    clean_pairs = node_pairs(clean)
    one_way_memo: list[bool] = []

    def one_way() -> bool:  # asked by two branches; computed once
        if not one_way_memo:
            one_way_memo.append(one_way_path(slow, clean, rates, covers, hits, paced))
        return one_way_memo[0]

    host = host_hypothesis(slow, clean, p, rates)
    if host:
        return host
    senders = {s for s, _ in pairs}
    if len(senders) == 1 and len(covers) in (1, 2):
        # Only what x sends is slow, and no host verdict yet: until its receivers are
        # seen receiving cleanly from others (or slowly, a downlink), wait.
        x = next(iter(senders))
        out_nics = {k[0] for k in slow}
        receivers = {node_of(k[1]) for k in slow}
        if len(out_nics) >= p.host_min_nics:
            rx_slow = any(node_of(b) in receivers and node_of(a) != x for a, b in slow)
            in_slow = any(node_of(b) == x for a, b in slow)
            rx_ok = all(any(node_of(b) == d and node_of(a) != x for a, b in clean) for d in receivers)
            if not (rx_slow or in_slow or rx_ok or one_way()):
                if len(receivers) == 1 and members is not None and downlink_shaped(hits, p.rate_ratio, members):
                    # x's NIC busy in bursts: held back at the one receiving end
                    y = next(iter(receivers))
                    return {("network-slow", (y,)): make_hypothesis(p, "network-slow", "node", (y,), hits, culprit=y)}
                return {}
    if len(slow) < 2:
        return {}  # one slow link fits its sender, its receiver and the path alike: wait
    if len(covers) == 1:
        x = covers[0]
        if _paced_end(slow, clean, rates, x, hits) or network_unfit_at(slow, x):
            return {}
        if host_shaped(slow, p, x):
            # x's sends slow far more than what it receives, on several NICs: its host
            # (asked first above) is waiting for its receivers to be seen receiving cleanly
            # from others; a fault of x's NIC or PCIe would slow both directions alike
            return {}
        if all(f.node == x and len(f.peer_eps) > 1 and f.flows > 1 for f in hits):
            # Every slow record is x's, each sending to several peers at once (a tree
            # relay): one slow link among them makes it slow, so any of those peers'
            # downlinks fits as well as x's NIC, until each is seen receiving cleanly from
            # a third node on that NIC, by a sender that sent to it alone (a clean relay
            # record says only that its links kept the pace it needed). Sweep 59 #1: two
            # nodes behind a congested leaf, the tree relay sending to both of them slow,
            # the relays sending to one of them clean: the first named network-slow.
            shown_in = (rates or ({}, {}, {}))[2]
            peers = {e for f in hits for e in f.peer_eps if node_of(e) != x}
            if not all(any(b == e and node_of(a) != x and shown_in.get((a, b), 0.0) >= 0 for a, b in clean)
                       for e in peers):
                return {}
        return {("network-slow", (x,)): make_hypothesis(p, "network-slow", "node", (x,), hits, culprit=x)}
    if len(covers) == 2 and named & set(covers) and _unexplained(slow, named) < 2:
        # every slow link is at a node named in an open network incident: that incident's
        # (as for a group below); the other end, or the pair as a path, would stand on one
        # link at most (sweep 281 #7: congestion into node-12's downlinks under MoE, named
        # network-slow; 680 ms later its ring partner node-15's sends into it - the same
        # starved downlink - named a path {node-12, node-15})
        return {}
    if len(covers) == 2:
        a, b = covers
        if len({tuple(sorted(k)) for k in slow}) >= p.path_min_links and one_way():
            return {("path", (a, b)): make_hypothesis(p, "path", "group", (a, b), hits)}
        # One end's sends slowed far more than what it receives: a starved host paces all
        # its sends, so its other traffic never beats the slow links either, and no cap is
        # shown; what clears that end is then any clean traffic with third nodes (battery
        # cpu-contention seed 3: node-03 -> node-07 only; the rate test named node-03's NIC
        # before the host rule could conclude). An end whose other sends to one peer at a
        # time beat the slow links is no starved host (sweep 53 #0: node-03's sends into a
        # congested downlink slow, its sends to three other nodes faster): the rates then
        # still tell which end is capped. Records sent to several peers at once do not show
        # it: a starved proxy posts each connection's chunks late, and a send spread over
        # many connections (an all-to-all) keeps its pace where one connection's does not
        # (sweep 157 #14: a host at 30 % of its CPU, its pipeline sends at 3.4x their
        # reference on 4 NICs while its all-to-all sends ran at 1.09x and beat them; its
        # healthy pipeline partner was named network-slow by elimination). The other end
        # keeps the rate test: a receiver capped below its other senders' all-to-all rates
        # (unknown: shared among their receivers) is not cleared by them (sweep 71 #1: a
        # PCIe-capped node's one slow sender on 4 NICs, host-shaped, and the pair was named
        # a path).
        one_peer = Rates(rates[0], rates[2], rates[2]) if rates is not None else None
        host_ends = {x for x in covers if host_shaped(slow, p, x) and not capable(slow, clean, one_peer, x, True, covers)}

        def cap(x: str, sends: bool) -> bool:
            return capable(slow, clean, None if x in host_ends else rates, x, sends, covers)

        def by_path(src: str, dst: str) -> bool:
            # the sender still sends cleanly to a third node, and the receiver still
            # receives cleanly from one, faster than the slow links went: neither NIC
            # explains the slow link
            return cap(src, True) and cap(dst, False)

        def healthy(x: str) -> bool:
            return all((s != x or cap(x, True)) and (d != x or cap(x, False)) for s, d in pairs)
        judged = None if host_ends else rates  # the rate branches below
        nic_pairs = {tuple(sorted(k)) for k in slow}
        ok = [x for x in covers if healthy(x)]
        timed = [f for f in hits if f.metric == "act_ns"]
        one_pair = (len(nic_pairs) < p.path_min_links and judged is not None and (a, b) in pairs
                    and (b, a) in pairs and held_to_one_rate(hits))
        if one_pair:
            # one NIC pair slow both ways, held to one rate as a cap holds them: an end is
            # cleared only by its own NIC of that pair moving faster at a known rate (any
            # clean link of a node's other NICs clears it in ``ok``: the battery's capped
            # NIC, its pipeline partner named)
            ok = [x for x in covers if nic_cleared(slow, clean, judged, x, covers)]
        if (judged is not None and len(ok) == 1 and 2 * sum(f.busy() for f in timed) > len(timed)
                and (len(nic_pairs) >= p.path_min_links or one_pair)):
            # one end carries its other traffic faster than the slow links went, in every
            # direction they take; the other end's clean traffic never asked for that much
            # (a PCIe-capped node's all-to-all, bound by fan-in, keeps its usual pace): the
            # other end's cap explains every slow link - if they kept their NICs busy, as
            # a cap does: a starved host's late pipeline sends leave idle epochs (0.74-0.97
            # of their span active, every capped culprit 1.0) while its bulk sends beat
            # them (sweep 79 #3: the healthy receiver was named network-slow). One NIC pair
            # slow both ways is enough: the cleared end's NIC went faster both ways, and only
            # the other end - its NIC or its path to the cleared one - fits (sweep 223 #20: a
            # NIC at 44 % slow only toward its pipeline partner, whose own NIC sent and
            # received at 1.5x the slow links' rate elsewhere, its all-to-all never asking as
            # much; it waited for a second NIC pair that never came)
            x = covers[0] if ok[0] == covers[1] else covers[1]
            return {("network-slow", (x,)): make_hypothesis(p, "network-slow", "node", (x,), hits, culprit=x)}
        if all(by_path(s, d) for s, d in pairs):
            if len(nic_pairs) < p.path_min_links:
                return {}  # one NIC pair only: a NIC or a path, wait for more evidence
            if len(senders) == 1:
                x = next(iter(senders))
                if not (any(node_of(a) != x and node_of(b) == x for a, b in clean if node_of(a) in covers)
                        or _no_host_nor_nic(slow, clean, rates, covers, hits)):
                    # only x -> y is slow and y -> x is not seen clean yet: x's starved host
                    # (its proxy posts these sends late; its ring sends keep the ring's pace)
                    # fits as well as a one-way path, and the host rule needs the reverse
                    # direction to tell them: wait for it, unless the slow links themselves
                    # rule the host out (a ring, where that direction never comes)
                    return {}
            return {("path", (a, b)): make_hypothesis(p, "path", "group", (a, b), hits)}
        if len(nic_pairs) < 2:
            return {}  # both directions of one NIC pair: either NIC or the path, wait
        if not all(any(n in cp for cp in clean_pairs) for n in (a, b)):
            return {}  # nothing yet on a's or b's traffic with third nodes: NIC, host or path
        if judged is not None and not ok:
            # neither end's other traffic went faster than the slow links: a cap at either
            # end explains them as well as the path does (or, with one sender, a cap at the
            # receiver as well as at the sender: sweep 71 #1, a PCIe-capped receiver whose
            # all-to-all peers' sends into it were rate-unknown, and the one sender whose
            # links into it were slow was named)
            return {}
        if len(senders) == 1:
            x = next(iter(senders))
            if x in ok:
                return {}  # the sender's other sends beat the slow links: not its NIC
            if x in host_ends and {k[0] for k in slow} & {b for _a, b in clean}:
                # Its sends slow, what it receives on the same NICs clean: a NIC or PCIe
                # fault slows both directions, so its own network does not fit; its host, the
                # receiver's downlink or a one-way path do, and the host rule waits for the
                # receiver's capacity to be shown (sweep 157 #23: congestion into node-05's
                # downlinks, node-01's pipeline sends into it slow on 7 NICs while node-05's
                # sends back into the same NICs of node-01 ran clean; node-01 was named).
                return {}
            return {("network-slow", (x,)): make_hypothesis(p, "network-slow", "node", (x,), hits, culprit=x)}
        if host_ends:
            # Slow both ways, but one end's sends far more than what it receives (a path
            # slows both directions alike): that end's starved host fits, its receives
            # stretched by its late consumption, and the host rule waits for its receivers'
            # capacity to be shown (sweep 173 #5: a host at 28 % of its CPU, its pipeline
            # sends at 5.8x, its partner's sends into it at 2x; named a path).
            return {}
        return {("path", (a, b)): make_hypothesis(p, "path", "group", (a, b), hits)}
    if len({tuple(sorted(k)) for k in slow}) < p.path_min_links:
        return {}
    suspects = record_suspects(hits)
    if len(suspects) > 1:
        suspects = _held_relay(suspects, hits, p.rate_ratio)
    if len(suspects) == 1:
        # A record that sends to several peers (a tree relay, a full mesh) is slow, or
        # resends, because of *one* of its links, not all: its finding marks every link
        # it crossed. The one node in every slow record's {sender} + peers is the only
        # single node that explains them all.
        x = next(iter(suspects))
        if all(f.node != x and len(f.peer_eps) > 1 and f.flows > 1 for f in hits):
            # Only other nodes' relay records are slow, x merely a peer of each: a relay
            # forwards at the pace its inputs arrive, so a slow link upstream in a
            # pipelined tree stretches relays anywhere below it, and the one node their
            # peer sets share is a coincidence of the tree's shape (sweep 79 #7: a NIC at
            # 44 % on node-00, the relays of node-02 and node-06 slow, node-04 - a peer of
            # both - named). Nothing of x's own says it: wait.
            return {}
        if bursting_relays([f for f in hits if f.node == x], p.rate_ratio):
            return {}
        return {("network-slow", (x,)): make_hypothesis(p, "network-slow", "node", (x,), hits, culprit=x)}
    if named & set(nodes_in) and _unexplained(slow, named) < 2:
        # The links at a node named in an open network incident are that incident's; a
        # group naming more nodes stands on what is left, and one slow link fits its
        # sender, its receiver and the path alike (sweep 347 #5: congestion into node-06's
        # downlinks under MoE, named; every all-to-all link into it slow, and one ring link
        # elsewhere, node-10 -> node-00 on one NIC, whose busiest epochs happened to stay
        # low while the ring ran at the congested link's pace: node-06 and node-00 named a
        # group)
        return {}
    sets = {record_nodes(f) for f in hits} or {frozenset(k) for k in pairs}
    nodes = sorted(set().union(*sets))
    grp = unique_cover(sets, nodes, p.max_group, exonerated(pairs, clean_pairs, nodes, slow, clean, rates))
    if grp is None:
        return {}  # several smallest sets explain the slow links alike: naming one would be a guess
    if _paced_relay(grp, hits):
        return {}
    if not any(node_of(a) not in grp and node_of(b) not in grp for a, b in clean):
        # A group's fault leaves the traffic between the other nodes alone; with none of it
        # seen clean since the slowness began, a slowdown of the whole communicator fits as
        # well (sweep 53 #11: one starved host, 8 consecutive ring links slow from it on,
        # no clean link anywhere, and the smallest cover of that chain - every other node -
        # was named a group of four)
        return {}
    return {("path", grp): make_hypothesis(p, "path", "group", grp, hits)}


def _paced_end(slow: dict[Link, list[Finding]], clean: set[Link], rates: Rates | None, x: str,
               hits: list[Finding]) -> bool:
    """Whether x, on every slow link, sent its slow sends with its NIC idle between bursts
    (most not busy: paced by what it received) and each of those NICs whose slow rate is
    known was seen sending faster at a known rate elsewhere: x's NIC did not hold them back
    (a cap keeps them busy, both ways alike), and what is slow into x is its senders' doing
    or its downlink's, which the all-to-all inward rule judges (sweep 251 #18: a starved
    host node-01 in a 4-rank ring under MoE; node-02, downstream, on every slow link, its
    ring sends busy in 7 of 19, its all-to-all sends faster on the same NIC; named
    network-slow after the right compute-slow)."""
    timed = [f for f in hits if f.node == x and f.metric == "act_ns"]
    own = [f for f in timed if f.epoch_ns > 0]  # its wire span and epoch known
    if 2 * len(own) <= len(timed) or 2 * sum(f.busy() for f in own) > len(own):
        return False
    slow_hi = (rates or ({}, {}, {}))[0]
    known = {k: v for k, v in slow.items() if node_of(k[0]) == x and slow_hi.get(k, 0.0) > 0}
    return beaten_on_every_nic(known, clean, rates, [x], sends=True)


def _held_relay(suspects: set[str], hits: list[Finding], ratio: float) -> set[str]:
    """Of several nodes in every slow record (a small tree, where each relay sends to most
    of the others), the one whose own slow relays were held to one rate while every other
    one's own relays moved in bursts; else all of them. A NIC capped at a rate keeps its
    relays' epochs flat; a relay fed at the pace of that cap forwards each chunk at line
    rate as it comes (:func:`.records.bursting_relays`). Sweep 293 #11: a NIC at 41 % on
    node-04 of a 5-node tree (the job 5.7 % slower), the relays of node-02, node-03 and
    node-04 slow, each sending to the other two: node-04's at 1.03 of the flat bound in
    every record, the others' at 1.76-1.87; missed."""
    own = {x: [f for f in hits if f.node == x] for x in suspects}
    paced = {x for x, fs in own.items() if bursting_relays(fs, ratio)}
    rest = suspects - paced
    if len(rest) != 1 or not paced:
        return suspects
    fs = own[next(iter(rest))]
    bursts = [f.burst for f in fs if not math.isnan(f.burst)]
    return rest if 2 * len(bursts) > len(fs) and median(bursts) <= 1.0 / ratio else suspects


def _paced_relay(grp: tuple[str, ...], hits: list[Finding]) -> bool:
    """Whether a member of the group is in it only by relay records slow by timing alone
    (tree relays sending to several peers at once, its own or with it as a peer): a relay
    forwards at the pace its inputs arrive, so a fault upstream stretches it wherever it
    sits in the tree, and nothing sent into it nor resent says its NIC is at fault. Sweep
    139 #7 (packet loss on node-00 under a 14-node tree): node-06's relay records to three
    exonerated peers went slow by ACT after node-00's, and the pair was named a path with
    no link between them."""
    sets = [(f, record_nodes(f)) for f in hits]
    for g in grp:
        others = set(grp) - {g}
        own = [f for f, ns in sets if g in ns and not ns & others]
        if own and all(len(f.peer_eps) > 1 and f.flows > 1 and f.timing_only() for f in own):
            # its own relays or another node's relays with it among their peers (sweep 173
            # #13: a NIC at 43 % on node-13 in a 16-node tree, named; then node-11, in the
            # group only by its own relay and by node-09's relay into it, both paced by
            # node-13's slow data, named a path with node-05, node-13's pipeline partner)
            return True
    return False


def _no_host_nor_nic(slow: dict[Link, list[Finding]], clean: set[Link], rates: Rates | None,
                     covers: list[str], hits: list[Finding]) -> bool:
    """One-way slow links x -> y that neither x's host nor either end's NIC explains, without
    the reverse direction (battery path-slow: node-03 -> node-00 on every rail of a ring,
    which has no link node-00 -> node-03): x is its ring's consistent straggler (a starved
    host's ring sends keep the ring's pace; its pipeline sends are what it delays), its slow
    sends kept its NIC busy (a cap's or a path's, not idle between late posts), and every
    NIC at either end is seen moving faster with third nodes at a known rate. Battery
    congestion seed 1: one of node-00's eight NICs passed a message in a lull;
    cpu-contention seed 1: the starved node's busy pipeline sends on two NICs - both were
    named a path with a healthy node without these."""
    timed = [f for f in hits if f.metric == "act_ns"]
    return (2 * sum(f.busy() for f in timed) > len(timed) > 0
            and 2 * sum(f.consistent for f in hits) > len(hits)
            and beaten_on_every_nic(slow, clean, rates, covers, sends=True)
            and beaten_on_every_nic(slow, clean, rates, covers, sends=False))


def _unexplained(slow: dict[Link, list[Finding]], named: frozenset[str]) -> int:
    """How many slow links touch no node named in an open network incident."""
    return sum(1 for k in slow if not {node_of(k[0]), node_of(k[1])} & named)
