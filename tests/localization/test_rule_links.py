"""Slow links (localization/rules/links.py): the link state from hand-fed link windows,
and the culprit of a given link state."""

from __future__ import annotations

import dataclasses
import itertools

from pulse.localization.finding import ACT, PEER_RATE_IN
from pulse.localization.params import LocalizeParams
from pulse.localization.rules.links import (
    exonerated,
    link_state,
    record_suspects,
    slow_link_hypotheses,
    unique_cover,
)
from pulse.localization.rules.records import paced_by_one

from .findings import MS, ep, evidence, finding, observe, slow_link

P = LocalizeParams()


def test_link_state_needs_persistent_slowness_and_recent_clean_observations():
    ev, p = evidence(clock_skew_ns=0)  # operators 1 ms apart: clocks taken as exact here
    observe(ev, ep("a"), ep("b"), [False] * 6 + [True] * 6, consistent=True)  # 6 of 12: persistent
    observe(ev, ep("c"), ep("d"), [True, False, False] * 4)        # 4 of 12: below persist_frac
    observe(ev, ep("a", 1), ep("d", 1), [False] * 12)              # clean since the slowness began
    observe(ev, ep("b"), ep("c"), [False] * 6, t0=-20 * MS)        # clean, but only before it
    slow, clean = link_state(ev, p)
    assert list(slow) == [(ep("a"), ep("b"))] and len(slow[(ep("a"), ep("b"))]) == 6
    assert (ep("a", 1), ep("d", 1)) in clean
    assert (ep("b"), ep("c")) not in clean
    assert (ep("c"), ep("d")) not in clean  # slow in a third of its recent observations


def test_clean_observations_must_follow_the_slowness_by_the_clock_skew_bound():
    # the slow hits start at 6-11 ms (median 8.5 ms, one node's clock); a clean link's
    # observations on other nodes' clocks count only from 8.5 ms + the skew bound on
    def clean_with(skew_ms: int) -> bool:
        ev, p = evidence(clock_skew_ns=skew_ms * MS)
        observe(ev, ep("a"), ep("b"), [False] * 6 + [True] * 6, consistent=True)
        observe(ev, ep("a", 1), ep("d", 1), [False] * 12)  # ends at 0-11 ms
        return (ep("a", 1), ep("d", 1)) in link_state(ev, p)[1]

    assert clean_with(0) and clean_with(1) is False  # 9.5 ms on: two observations, < link_min_obs
    ev, p = evidence(clock_skew_ns=MS)
    observe(ev, ep("a"), ep("b"), [False] * 6 + [True] * 6, consistent=True)
    observe(ev, ep("a", 1), ep("d", 1), [False] * 12, t0=2 * MS)  # 2-13 ms: four after 9.5 ms
    assert (ep("a", 1), ep("d", 1)) in link_state(ev, p)[1]


def test_slowness_by_timing_alone_must_hold_three_quarters_of_the_window():
    # sweep 109 #7 / 111 #19: healthy ranks downstream of late starters slow for whole
    # steps, 0.58-0.67 of a window; resent bytes and consistent stragglers are tested
    # evidence and keep persist_frac
    def slow_links(**kw) -> list:
        ev, p = evidence(clock_skew_ns=0)
        observe(ev, ep("a"), ep("b"), [False] * 4 + [True] * 8, **kw)    # 8 of 12 = 0.67
        observe(ev, ep("c"), ep("d"), [False] * 3 + [True] * 9, **kw)    # 9 of 12 = 0.75
        observe(ev, ep("e"), ep("f"), [False] * 6 + [True] * 6, **kw)    # 6 of 12 = 0.5
        return sorted(link_state(ev, p)[0])

    assert slow_links() == [(ep("c"), ep("d"))]
    everything = [(ep("a"), ep("b")), (ep("c"), ep("d")), (ep("e"), ep("f"))]
    assert slow_links(metric="volume_ratio") == everything
    assert slow_links(metric="peer_rate") == everything  # an all-to-all's rate: not a ring's timing
    assert slow_links(consistent=True) == everything
    ev, p = evidence(clock_skew_ns=0, timing_persist_frac=0.5)  # the fraction is a parameter
    observe(ev, ep("e"), ep("f"), [False] * 6 + [True] * 6)
    assert list(link_state(ev, p)[0]) == [(ep("e"), ep("f"))]


def test_link_state_ignores_links_of_nodes_without_data():
    ev, p = evidence()
    observe(ev, ep("a"), ep("b"), [True] * 12)
    ev.insufficient.add("b")
    assert link_state(ev, p) == ({}, set())


def test_clean_fraction_is_a_parameter():
    ev, p = evidence(clean_max_slow_frac=0.5)
    observe(ev, ep("a"), ep("b"), [True] * 12)
    observe(ev, ep("c"), ep("d"), [True, False, False] * 4)
    assert (ep("c"), ep("d")) in link_state(ev, p)[1]


def test_the_node_on_every_slow_link_is_network_slow():
    # a's NIC slow in both directions
    slow = {(ep("a"), ep("b")): slow_link(ep("a"), ep("b")), (ep("c"), ep("a")): slow_link(ep("c"), ep("a"))}
    got = slow_link_hypotheses(slow, set(), P)
    assert list(got) == [("network-slow", ("a",))]
    assert got[("network-slow", ("a",))].nics == [ep("a")]


def test_the_node_on_every_slow_link_whose_own_sends_idled_between_bursts_is_not_named():
    """Sweep 251 #18: a starved host upstream of x in a ring; x on every slow link, its own
    sends slow but idle between bursts (paced by what it received), its NIC sending faster
    elsewhere. A cap at x would keep them busy: x is not named from them."""
    from dataclasses import replace

    def state(busy: bool, epoch: int = 10_000):
        ins = [replace(f, epoch_ns=epoch) for f in slow_link(ep("c"), ep("a"))]
        outs = [replace(f, epoch_ns=epoch, value=float(f.end_ns - f.start_ns) if busy else 2.0 * epoch)
                for f in slow_link(ep("a"), ep("b"))]
        return {(ep("c"), ep("a")): ins, (ep("a"), ep("b")): outs}

    assert slow_link_hypotheses(state(busy=False), set(), P) == {}
    assert list(slow_link_hypotheses(state(busy=True), set(), P)) == [("network-slow", ("a",))]
    # without its records' epoch the idle epochs are unknown: as before
    assert list(slow_link_hypotheses(state(busy=False, epoch=0), set(), P)) == [("network-slow", ("a",))]
    # x's NIC seen sending no faster than the slow sends at a known rate: no proof it was not the cap
    rates = ({(ep("a"), ep("b")): 20.0}, {(ep("a", 0), ep("d", 0)): 15.0}, {})
    assert list(slow_link_hypotheses(state(busy=False), {(ep("a"), ep("d"))}, P, rates)) == [
        ("network-slow", ("a",))]
    rates = ({(ep("a"), ep("b")): 20.0}, {(ep("a", 0), ep("d", 0)): 30.0}, {})
    assert slow_link_hypotheses(state(busy=False), {(ep("a"), ep("d"))}, P, rates) == {}


def test_one_slow_link_waits_for_more_evidence():
    slow = {(ep("a"), ep("b")): slow_link(ep("a"), ep("b"))}
    assert slow_link_hypotheses(slow, set(), P) == {}
    # even where one NIC pair would do for a path, and both ends talk cleanly to others
    clean = {(ep("a"), ep("c")), (ep("c"), ep("b"))}
    assert slow_link_hypotheses(slow, clean, LocalizeParams(path_min_links=1)) == {}
    assert slow_link_hypotheses({}, set(), P) == {}


def _path(clean_third: bool):
    # a <-> b slow both ways on two NIC pairs; each still talks cleanly with c and d
    slow = {(ep(x, k), ep(y, k)): slow_link(ep(x, k), ep(y, k)) for k in (0, 1) for x, y in (("a", "b"), ("b", "a"))}
    clean = {(ep("a"), ep("c")), (ep("c"), ep("b")), (ep("b"), ep("d")), (ep("d"), ep("a"))} if clean_third else set()
    return slow, clean


def test_slow_only_between_two_nodes_that_talk_cleanly_to_others_is_a_path():
    assert list(slow_link_hypotheses(*_path(True), P)) == [("path", ("a", "b"))]


def _one_way(consistent: bool = True, busy: bool = True, clean_nics: tuple[int, ...] = (0, 1),
             sender_rate: float = 40.0):
    """a -> b slow on two rails only (a ring: b never sends to a), at most 25 bytes/ns; a
    sends to c and b receives from d on the rails in ``clean_nics`` at known rates."""
    slow = {}
    for k in (0, 1):
        fs = slow_link(ep("a", k), ep("b", k), n=9)
        for f in fs:
            f.consistent = consistent
            f.epoch_ns = 100
            f.value = float(f.end_ns - f.start_ns) / (1 if busy else 2)  # ACT: all its span, or half
        slow[(ep("a", k), ep("b", k))] = fs
    clean = {(ep("a", k), ep("c", k)) for k in (0, 1)} | {(ep("d", k), ep("b", k)) for k in clean_nics}
    slow_hi = {k: 25.0 for k in slow}
    clean_lo = {(ep("a", k), ep("c", k)): sender_rate for k in (0, 1)}
    clean_lo |= {(ep("d", k), ep("b", k)): 40.0 for k in clean_nics}
    clean_in = dict(clean_lo)
    return slow, clean, (slow_hi, clean_lo, clean_in)


def test_a_one_way_path_in_a_ring_needs_no_reverse_direction_when_both_ends_are_cleared():
    # battery path-slow: node-03 -> node-00 slow on every rail, the ring never sends back;
    # the sender's ring straggling and busy NIC rule out its host, and every NIC at both
    # ends moves faster with third nodes
    slow, clean, rates = _one_way()
    assert list(slow_link_hypotheses(slow, clean, P, rates)) == [("path", ("a", "b"))]


def test_a_one_way_path_waits_while_either_end_or_the_host_is_not_cleared():
    # one of b's NICs not seen receiving from a third node (a congested downlink passes a
    # message in a lull: battery congestion seed 1)
    assert slow_link_hypotheses(*_one_way(clean_nics=(0,))[:2], P, _one_way(clean_nics=(0,))[2]) == {}
    # slow by timing alone (a starved host's pipeline sends: battery cpu-contention seed 1)
    slow, clean, rates = _one_way(consistent=False)
    assert slow_link_hypotheses(slow, clean, P, rates) == {}
    # idle between its sends
    slow, clean, rates = _one_way(busy=False)
    assert slow_link_hypotheses(slow, clean, P, rates) == {}
    # the sender's other sends no faster than the slow links
    slow, clean, rates = _one_way(sender_rate=20.0)
    assert slow_link_hypotheses(slow, clean, P, rates) == {}


def test_two_nodes_without_clean_traffic_elsewhere_wait():
    # either NIC could explain it until third-party traffic is seen
    assert slow_link_hypotheses(*_path(False), P) == {}


def test_no_node_on_every_link_is_the_smallest_covering_group():
    # two slow senders on two links each: only {a, d} touches all four
    pairs = [("a", "b"), ("a", "c"), ("d", "e"), ("d", "f")]
    slow = {(ep(x), ep(y)): slow_link(ep(x), ep(y)) for x, y in pairs}
    rest = {(ep("b"), ep("e")), (ep("f"), ep("c"))}  # traffic between the other nodes is fine
    got = slow_link_hypotheses(slow, rest, P)
    assert list(got) == [("path", ("a", "d"))]
    # a group that does not cover every slow link is not an answer
    assert slow_link_hypotheses(slow, rest, LocalizeParams(max_group=1)) == {}


def test_a_group_needs_the_traffic_outside_it_seen_clean():
    # a chain of slow ring links from one node on (a straggler upstream slows its ring
    # successors in turn) is covered by every other node, but with nothing outside that
    # cover seen clean, the whole ring being slow fits as well: no group is named
    chain = ["n0", "n1", "n2", "n3", "n4"]  # its one smallest cover: {n1, n3}
    slow = {(ep(x), ep(y)): slow_link(ep(x), ep(y)) for x, y in itertools.pairwise(chain)}
    assert slow_link_hypotheses(slow, set(), P) == {}
    touching = {(ep("n1"), ep("n9")), (ep("n9"), ep("n3"))}  # clean, but each touches the cover
    assert slow_link_hypotheses(slow, touching, P) == {}
    outside = touching | {(ep("n9"), ep("n8"))}
    assert list(slow_link_hypotheses(slow, outside, P)) == [("path", ("n1", "n3"))]


def test_several_smallest_covers_name_nobody():
    # a cycle a -> b -> d -> c -> a is covered by {a, d} and by {b, c} alike
    pairs = [("a", "b"), ("c", "a"), ("b", "d"), ("d", "c")]
    slow = {(ep(x), ep(y)): slow_link(ep(x), ep(y)) for x, y in pairs}
    assert slow_link_hypotheses(slow, set(), P) == {}
    assert unique_cover([("a", "b"), ("c", "a"), ("b", "d"), ("d", "c")], ["a", "b", "c", "d"], 4) is None
    assert unique_cover([("a", "b", "c"), ("b", "c", "d")], ["a", "b", "c", "d"], 4) is None  # b or c
    assert unique_cover([("a", "b"), ("b", "c")], ["a", "b", "c"], 4) == ("b",)


def _tree3(lossy: str | None, third: bool = False) -> dict:
    """A 3-rank tree (every rank sends to both others) whose records all resent; with
    ``third``, the lossy node's pipeline send to d resent too."""
    nodes = ("a", "b", "c")
    slow = {}
    for x in nodes:
        peers = tuple(ep(y) for y in nodes if y != x)
        fs = [finding(ACT, x, seq=i, value=1.4, metric="volume_ratio", start=i * MS, end=i * MS + 1, to=peers)
              for i in range(4)]
        for d in peers:
            slow[(ep(x), d)] = fs
    if third and lossy:
        slow[(ep(lossy), ep("d"))] = [finding(ACT, lossy, comm="pp", seq=i, value=1.4, metric="volume_ratio",
                                              start=i * MS, end=i * MS + 1, to=(ep("d"),)) for i in range(4)]
    return slow


def test_resending_records_of_a_full_mesh_name_nobody_until_one_node_explains_them_all():
    # each record resends on one of its links; from records that all reach all three nodes
    # any two of them cover every link: naming two is a guess that blames a healthy node
    assert record_suspects([f for fs in _tree3(None).values() for f in fs]) == {"a", "b", "c"}
    assert slow_link_hypotheses(_tree3(None), set(), P) == {}
    # c's own send to a fourth node resends too: c is in every slow record, the only
    # single node that explains them all
    got = slow_link_hypotheses(_tree3("c", third=True), set(), P)
    assert list(got) == [("network-slow", ("c",))]


def test_a_one_way_slowdown_names_no_path_until_the_reverse_is_seen_clean():
    # a -> b slow on two NIC pairs, both talk cleanly with third nodes, b -> a not seen yet:
    # a's starved host fits as well as a one-way path
    slow = {(ep("a", k), ep("b", k)): slow_link(ep("a", k), ep("b", k)) for k in (0, 1)}
    clean = {(ep("a", 2), ep("c", 2)), (ep("c", 2), ep("b", 2))}
    assert slow_link_hypotheses(slow, clean, P) == {}
    # b -> a seen clean: only a's sends are slow, on two NICs, the host rule tells them apart
    got = slow_link_hypotheses(slow, clean | {(ep("b", 3), ep("a", 3))}, P)
    assert list(got) == [("host-contention", ("a",))]


def test_pipeline_sends_into_two_congested_downlinks_name_the_receivers():
    # f -> b and g -> c slow (b's and c's downlinks under one congested leaf): the receivers,
    # the senders or one of each cover them alike; f and g send cleanly to others (their
    # uplinks work) while b and c are not seen receiving cleanly: the receivers
    slow = {(ep("f", k), ep("b", k)): slow_link(ep("f", k), ep("b", k)) for k in (0, 1)}
    slow |= {(ep("g", k), ep("c", k)): slow_link(ep("g", k), ep("c", k)) for k in (0, 1)}
    clean = {(ep("f", 2), ep("h", 2)), (ep("g", 2), ep("h", 2))}
    assert list(slow_link_hypotheses(slow, clean, P)) == [("path", ("b", "c"))]
    assert exonerated({("f", "b"), ("g", "c")}, {("f", "h"), ("g", "h")}, ["b", "c", "f", "g"]) == {"f", "g"}
    assert slow_link_hypotheses(slow, set(), P) == {}  # nothing exonerates anybody: a guess


def _capped(a_out: float, a_in: float, a_shared: bool, rails: tuple[int, ...] = (0, 1), burst: float = float("nan")):
    """a <-> b slow both ways on the NIC pairs of ``rails``, the slow observations at most 29 bytes/ns;
    b sends and receives cleanly with c at 43 (one peer: ring sends); a's clean traffic
    with c and d at ``a_out`` (its sends) and ``a_in`` (into it), ``a_shared``: records sent
    to several peers at once (an all-to-all)."""
    from pulse.localization.finding import LinkObs
    from pulse.localization.rules.links import link_state, shown_rates

    ev, p = evidence(clock_skew_ns=0)
    for k in rails:
        for x, y in (("a", "b"), ("b", "a")):
            for i in range(6):
                f = finding(ACT, x, seq=i, endpoint=ep(x, k), value=2.0, start=i * MS, end=i * MS + 1,
                            to=(ep(y, k),))
                f.burst = burst
                ev.links.add(LinkObs(ep(x, k), ep(y, k), True, f, i * MS + 1, 20.0, 29.0))

    def clean(src: str, dst: str, rate: float, shared: bool) -> None:
        for i in range(6):
            ev.links.add(LinkObs(ep(src), ep(dst), False, None, (i + 6) * MS, rate, rate * 1.05, shared))
    clean("b", "c", 43.0, False)
    clean("c", "b", 43.0, False)
    clean("a", "d", a_out, a_shared)
    clean("c", "a", a_in, a_shared)
    slow, cl = link_state(ev, p)
    return slow_link_hypotheses(slow, cl, p, shown_rates(ev, p, slow, cl))


def test_a_node_whose_clean_traffic_never_beat_the_slow_links_is_their_cap():
    # a PCIe-capped node's all-to-all is bound by its receivers' fan-in: it keeps its usual
    # pace (27 bytes/ns) below the cap (29), so it does not show a's NIC healthy; b's ring
    # traffic (43) does: a, not the path {a, b}
    assert list(_capped(27.0, 27.0, True)) == [("network-slow", ("a",))]
    # an all-to-all sender's rate is its NIC's, shared among its receivers: at 40 it shows
    # a's sends work, not what a takes in
    assert list(_capped(40.0, 40.0, True)) == [("network-slow", ("a",))]


def test_one_nic_pair_slow_both_ways_names_the_end_not_cleared():
    """Sweep 223 #20: a NIC at 44 % slow only toward its pipeline partner (one NIC pair, both
    ways), the partner's NIC faster both ways elsewhere, its own all-to-all never asking as
    much: its NIC or its path to the partner, and only it fits either way."""
    assert list(_capped(27.0, 27.0, True, rails=(0,), burst=0.95)) == [("network-slow", ("a",))]
    # both ends shown faster: one NIC pair is still a NIC or a path, wait
    assert _capped(40.0, 40.0, False, rails=(0,), burst=0.95) == {}
    # sent in bursts between lulls, or not known to be held to one rate: no cap's shape, wait
    assert _capped(27.0, 27.0, True, rails=(0,), burst=1.4) == {}
    assert _capped(27.0, 27.0, True, rails=(0,)) == {}


def test_one_nic_pair_slow_both_ways_clears_an_end_only_by_that_nic():
    """Battery nic-slow: node-03's NIC 5 at 25 %, its pipeline sends to node-07 and back slow
    on that NIC pair; node-03's other NICs send cleanly (its node is "capable") while its NIC
    5 never went faster than the cap. Only NIC 5 can clear node-03, and node-07's NIC 5 does
    clear node-07: node-03, not its partner."""
    from pulse.localization.finding import LinkObs
    from pulse.localization.rules.links import link_state, shown_rates

    ev, p = evidence(clock_skew_ns=0)
    for x, y in (("a", "b"), ("b", "a")):
        for i in range(6):
            f = finding(ACT, x, seq=i, endpoint=ep(x, 5), value=2.0, start=i * MS, end=i * MS + 1, to=(ep(y, 5),))
            f.burst = 0.97
            ev.links.add(LinkObs(ep(x, 5), ep(y, 5), True, f, i * MS + 1, 10.0, 12.5))
    for node, nic, rate in (("a", 2, 43.0), ("a", 5, 12.0), ("b", 5, 43.0)):
        for i in range(6):  # clean both ways with c on that NIC
            ev.links.add(LinkObs(ep(node, nic), ep("c", nic), False, None, (i + 6) * MS, rate, rate * 1.05))
            ev.links.add(LinkObs(ep("c", nic), ep(node, nic), False, None, (i + 6) * MS, rate, rate * 1.05))
    slow, cl = link_state(ev, p)
    assert list(slow_link_hypotheses(slow, cl, p, shown_rates(ev, p, slow, cl))) == [("network-slow", ("a",))]


def test_both_ends_carrying_other_traffic_faster_than_the_slow_links_is_a_path():
    assert list(_capped(40.0, 40.0, False)) == [("path", ("a", "b"))]


def test_neither_end_shown_faster_than_the_slow_links_waits():
    from pulse.localization.finding import LinkObs
    from pulse.localization.rules.links import link_state, shown_rates

    ev, p = evidence(clock_skew_ns=0)
    for k in (0, 1):
        for x, y in (("a", "b"), ("b", "a")):
            for i in range(6):
                f = finding(ACT, x, seq=i, endpoint=ep(x, k), value=2.0, start=i * MS, end=i * MS + 1,
                            to=(ep(y, k),))
                ev.links.add(LinkObs(ep(x, k), ep(y, k), True, f, i * MS + 1, 20.0, 29.0))
    for src, dst in (("a", "c"), ("c", "a"), ("b", "d"), ("d", "b")):
        for i in range(6):
            ev.links.add(LinkObs(ep(src), ep(dst), False, None, (i + 6) * MS, 25.0, 26.0))
    slow, cl = link_state(ev, p)
    assert slow_link_hypotheses(slow, cl, p, shown_rates(ev, p, slow, cl)) == {}
    assert list(slow_link_hypotheses(slow, cl, p)) == [("path", ("a", "b"))]  # rates unknown: as before


def test_one_sided_slowness_of_a_node_whose_partner_is_cleared_waits_for_the_host_rule():
    # x -> y slow on two NICs, nothing into x slow; y carries its other traffic faster than
    # the slow links went (cleared), x does not: the other-end rule would name x's NIC, but
    # only x's sends are slow - its host's shape, which waits for the host rule
    from pulse.localization.finding import LinkObs
    from pulse.localization.rules.links import link_state, shown_rates

    ev, p = evidence(clock_skew_ns=0)
    for k in (0, 1):
        for i in range(6):
            f = finding(ACT, "x", seq=i, endpoint=ep("x", k), value=4.0, start=i * MS, end=i * MS + 1,
                        to=(ep("y", k),))
            ev.links.add(LinkObs(ep("x", k), ep("y", k), True, f, i * MS + 1, 10.0, 12.0))
    for src, dst, rate in (("y", "c", 43.0), ("c", "y", 43.0), ("x", "c", 11.0)):
        for i in range(6):
            ev.links.add(LinkObs(ep(src), ep(dst), False, None, (i + 6) * MS, rate, rate * 1.05))
    slow, cl = link_state(ev, p)
    assert slow_link_hypotheses(slow, cl, p, shown_rates(ev, p, slow, cl)) == {}


def test_records_that_shared_their_nic_with_another_kind_of_operator_are_not_compared():
    # sweep 23 #6: node A's pipeline sends at 2-2.6x their reference on every NIC, each time
    # A's all-to-all ran on the same NICs (A's clock for both): the NIC shared, not slow
    from pulse.localization.finding import LinkObs

    from pulse.events import GROUPED

    from . import synth

    a, b = synth.node(0), synth.node(1)

    def state(overlap_kind: str | None, metric: str = "act_ns", mb: int = 8):
        ev, p = evidence(clock_skew_ns=0)
        for i in range(12):
            t = i * MS
            ev.alive.note(synth.record("pp", i, 0, 0, kind="Send", nranks=2, start=t, end=t + MS // 2,
                                       t_host=t, nic="mlx5_0"))
            if overlap_kind is not None:  # another operator on A's NIC, over most of the send
                ev.alive.note(synth.record(overlap_kind.lower(), i, 0, 0, kind=overlap_kind, nranks=4,
                                           start=t + MS // 10, end=t + 6 * MS // 10, t_host=t,
                                           nic="mlx5_0", nbytes=mb << 20))
            slow = i >= 3  # 9 of 12: persistent by timing alone
            f = finding(ACT, a, comm="pp", seq=i, endpoint=ep(a), value=2.5, metric=metric, start=t,
                        end=t + MS // 2, to=(ep(b),)) if slow else None
            ev.links.add(LinkObs(ep(a), ep(b), slow, f, t + MS // 2))
        return list(link_state(ev, p)[0])

    assert state(None) == [(ep(a), ep(b))]
    # the all-to-all moved 6.4 of its 8 MB during the send: more than the 4.8 MB the send
    # would have moved in its extra time (8 MB x (1 - 1 / 2.5)) - it shared A's NIC
    assert state(GROUPED) == []
    # a small one (0.8 MB of 1 MB) does not explain a 2.5x send
    assert state(GROUPED, mb=1) == [(ep(a), ep(b))]
    assert state("Send") == [(ep(a), ep(b))]                          # a twin of the same kind: as usual
    assert state("AllReduce") == [(ep(a), ep(b))]                     # its own ring traffic: not sharing
    assert state(GROUPED, metric="volume_ratio") == [(ep(a), ep(b))]  # resent bytes are the network's


def test_a_collectives_sends_share_their_nic_with_pipeline_sends_not_with_receives():
    # sweep 67 #1: node C's PCIe capped; the pipeline sends from B into C lingered on B's
    # NICs and slowed B's data-parallel ring with its healthy stage-mate A (both ways),
    # named a slow path A-B before C. A send shares the NIC's transmit side; a receive
    # uses the other direction of the link and shares nothing with a send.
    from pulse.localization.finding import LinkObs

    from . import synth

    a, b = synth.node(0), synth.node(1)

    def state(own_kind: str, overlap_kind: str | None):
        ev, p = evidence(clock_skew_ns=0)
        own = own_kind.lower()
        for i in range(12):
            t = i * MS
            ev.alive.note(synth.record(own, i, 0, 0, kind=own_kind, nranks=2, start=t, end=t + MS // 2,
                                       t_host=t, nic="mlx5_0"))
            if overlap_kind is not None:
                ev.alive.note(synth.record("pp" + overlap_kind.lower(), i, 0, 0, kind=overlap_kind, nranks=2,
                                           start=t + MS // 10, end=t + 6 * MS // 10, t_host=t, nic="mlx5_0"))
            slow = i >= 3  # 9 of 12: persistent by timing alone
            f = finding(ACT, a, comm=own, seq=i, endpoint=ep(a), value=2.5, start=t, end=t + MS // 2,
                        to=(ep(b),)) if slow else None
            ev.links.add(LinkObs(ep(a), ep(b), slow, f, t + MS // 2))
        return list(link_state(ev, p)[0])

    assert state("AllReduce", None) == [(ep(a), ep(b))]
    assert state("AllReduce", "Send") == []                  # 6.4 MB sent meanwhile > 4.8 MB
    assert state("AllReduce", "Recv") == [(ep(a), ep(b))]    # the other direction
    assert state("Recv", "Send") == [(ep(a), ep(b))]         # likewise for a receive's finding


def test_a_shared_answer_is_asked_again_once_its_nics_records_change():
    """``AlivePoints.shared`` keeps its answer per finding (asked at every evaluation) only
    until a record on the finding's NIC arrives: an all-to-all that closes after the slow
    send it overlapped turns the answer."""
    from pulse.localization.evidence import AlivePoints
    from pulse.localization.params import LocalizeParams

    from pulse.events import GROUPED

    from . import synth

    a, b = synth.node(0), synth.node(1)
    alive = AlivePoints(LocalizeParams())
    alive.note(synth.record("pp", 0, 0, 0, kind="Send", nranks=2, start=0, end=MS // 2, t_host=0, nic="mlx5_0"))
    f = finding(ACT, a, comm="pp", seq=0, endpoint=ep(a), value=2.5, start=0, end=MS // 2, to=(ep(b),))
    assert alive.shared(f) is False and alive.shared(f) is False
    alive.note(synth.record("a2a", 0, 0, 0, kind=GROUPED, nranks=4, start=MS // 10, end=6 * MS // 10, t_host=0,
                            nic="mlx5_0", nbytes=8 << 20))
    assert alive.shared(f) is True and alive.shared(f) == alive._shared(f)


def test_a_tree_relay_alone_slow_waits_until_its_peers_are_seen_receiving_cleanly():
    # x relays to a, b and c at once (3 flows); only its records are slow. One slow link
    # among its three makes a record slow, so a's, b's or c's downlink fits as well as x's
    # NIC: x is named only once each peer NIC is seen receiving cleanly from a sender that
    # sent to it alone (a clean relay record only kept the pace it needed)
    from dataclasses import replace
    to = (ep("a"), ep("b"), ep("c"))
    slow = {(ep("x"), d): [replace(f, peer_eps=to, flows=3) for f in slow_link(ep("x"), d)] for d in to}
    relay_in = {(ep("r"), d) for d in to}
    rates = ({}, {}, {k: -1.0 for k in relay_in})
    assert slow_link_hypotheses(slow, relay_in, P, rates) == {}
    single_in = {(ep("s"), d) for d in to}
    rates = ({}, {}, {**{k: -1.0 for k in relay_in}, **{k: 5.0 for k in single_in}})
    got = slow_link_hypotheses(slow, relay_in | single_in, P, rates)
    assert list(got) == [("network-slow", ("x",))]
    # one flow to one peer per record (Gloo binds a flow to every peer): no relay, named
    gloo = {k: [replace(f, flows=1) for f in fs] for k, fs in slow.items()}
    assert list(slow_link_hypotheses(gloo, relay_in, P, ({}, {}, {k: -1.0 for k in relay_in}))) == [
        ("network-slow", ("x",))]


def test_a_host_shaped_sender_and_a_receiver_cleared_only_by_all_to_all_senders_are_no_path():
    # sweep 71 #1: node y's PCIe capped; x's sends into y slow on 4 NICs (x host-shaped:
    # only its sends slow), x's other sends no faster than the slow links, and y seen
    # receiving cleanly only from all-to-all senders (their rate is shared among their
    # receivers: -1, unknown). Named a path {x, y} (y's clean receives cleared it with no
    # rate), then x network-slow; a cap at y explains it as well: nobody yet.
    slow = {(ep("x", k), ep("y", k)): slow_link(ep("x", k), ep("y", k), 6, comm=f"c{k}") for k in range(4)}
    others = {(ep("x", k), ep("z", k)) for k in range(4)}
    a2a_in = {(ep("w", k), ep("y", k)) for k in range(4)}
    back = {(ep("y", k), ep("x", k)) for k in range(4)}
    slow_hi = dict.fromkeys(slow, 10.0)
    clean_lo = dict.fromkeys(others, 8.0)
    rates = (slow_hi, clean_lo, dict.fromkeys(a2a_in, -1.0))
    assert slow_link_hypotheses(slow, others | a2a_in | back, P, rates) == {}
    # y seen receiving from a single-peer sender faster than the slow links went: y's
    # downlink works, and x's host (the rule asked first) is what is left
    single_in = {(ep("v", k), ep("y", k)) for k in range(4)}
    rates = (slow_hi, clean_lo, {**dict.fromkeys(a2a_in, -1.0), **dict.fromkeys(single_in, 20.0)})
    got = slow_link_hypotheses(slow, others | a2a_in | single_in | back, P, rates)
    assert list(got) == [("host-contention", ("x",))]


def test_one_sender_into_a_receiver_no_rate_clears_is_neither_named_nor_a_path():
    # sweep 71 #1, later: x -> y slow on 2 of 4 NICs (x's other sends beat nothing, y's
    # receives shown only by all-to-all senders, y -> x clean): a cap at y fits as well
    # as one at x or the path; named a path, then x
    slow = {(ep("x", k), ep("y", k)): slow_link(ep("x", k), ep("y", k), 6, comm=f"c{k}") for k in (2, 3)}
    others = {(ep("x", k), ep("z", k)) for k in range(4)}
    a2a_in = {(ep("w", k), ep("y", k)) for k in range(4)}
    rx_x = {(ep("z", k), ep("x", k)) for k in range(4)}
    back = {(ep("y", k), ep("x", k)) for k in range(4)}
    rates = (dict.fromkeys(slow, 14.4), dict.fromkeys(others, 11.7), dict.fromkeys(a2a_in, -1.0))
    assert slow_link_hypotheses(slow, others | a2a_in | rx_x | back, P, rates) == {}


def test_relays_of_other_nodes_sharing_one_peer_do_not_name_that_peer():
    # sweep 79 #7: a NIC at 44 % on node-00 of a 10-node tree; the relay records of two
    # other nodes (p to a, b, x; q to c, d, x) were slow, x a peer of both, and x was named.
    # In a pipelined tree a relay's pace is its inputs': the slow link may be upstream.
    from dataclasses import replace

    def relay(src: str, to: tuple[str, ...]) -> dict:
        peers = tuple(ep(d) for d in to)
        fs = [replace(f, peer_eps=peers, flows=len(peers)) for f in slow_link(ep(src), peers[0], 6, comm="t")]
        return {(ep(src), d): fs for d in peers}

    slow = {**relay("p", ("a", "b", "x")), **relay("q", ("c", "d", "x"))}
    assert slow_link_hypotheses(slow, set(), P) == {}
    # x's own relay record slow too: x is in every slow record, its own among them
    slow.update(relay("x", ("p", "q", "e")))
    assert list(slow_link_hypotheses(slow, set(), P)) == [("network-slow", ("x",))]


def test_a_tree_relay_slow_by_its_inputs_pace_joins_no_group():
    # sweep 139 #7: packet loss on x's NIC under a tree all-reduce. x's sends resend bytes
    # (two slow links), its tree neighbours a and b relay slowly to x and two others each;
    # far from x, relay r's records to p, q and s (three flows) went slow by ACT too, its
    # inputs arriving at x's pace. p, q, s and x's neighbours' other peers are seen receiving
    # cleanly from third nodes, so r alone covered its records, and {x, r} was named a path
    # with no link between them. A relay forwards at the pace of its inputs: r joins no group.
    from dataclasses import replace

    def relay(src: str, to: tuple[str, ...], **kw) -> dict:
        return {(ep(src), ep(d)): [replace(f, peer_eps=tuple(ep(t) for t in to), flows=len(to) + 1, **kw)
                                   for f in slow_link(ep(src), ep(d))] for d in to}

    slow = {**{k: [replace(f, metric="volume_ratio") for f in fs]
               for k, fs in relay("x", ("a", "b")).items()},
            **relay("a", ("x", "c", "d")), **relay("b", ("x", "e", "f"))}
    clean = {(ep(o), ep(n)) for n in ("c", "d", "e", "f", "p", "q", "s", "a", "b") for o in ("g", "h")}
    assert list(slow_link_hypotheses(slow, clean, P)) == [("network-slow", ("x",))]
    with_r = {**slow, **relay("r", ("p", "q", "s"))}
    assert slow_link_hypotheses(with_r, clean, P) == {}
    # r's own records resending bytes are its NIC's, not its inputs' pace: the group stands
    resent = {**slow, **{k: [replace(f, metric="volume_ratio") for f in fs]
                         for k, fs in relay("r", ("p", "q", "s")).items()}}
    assert list(slow_link_hypotheses(resent, clean, P)) == [("path", ("r", "x"))]


def test_a_sender_whose_nics_receive_cleanly_is_not_named_for_its_slow_sends():
    # sweep 157 #23: congestion into y's downlinks; x's pipeline sends into y slow on 7 of
    # 8 NICs, y's sends back into the same NICs of x clean, x seen sending nowhere else
    # (host-shaped, nothing shows its sends work), y seen receiving from w on one NIC (a
    # lull of the bursts, below the slow links' rate). x's NIC would slow both directions:
    # not x's network; its host, y's downlink or a one-way path: nobody yet
    slow = {(ep("x", k), ep("y", k)): slow_link(ep("x", k), ep("y", k), 6, comm=f"c{k}") for k in range(7)}
    back = {(ep("y", k), ep("x", k)) for k in range(8)}
    ring_in = {(ep("w", 4), ep("y", 4))}
    rates = (dict.fromkeys(slow, 16.4), dict.fromkeys(back, 21.8), {**dict.fromkeys(back, 21.8),
                                                                     **dict.fromkeys(ring_in, 12.3)})
    assert slow_link_hypotheses(slow, back | ring_in, P, rates) == {}
    # x seen receiving cleanly only on its NIC that sends nothing slow: the others still fit
    got = slow_link_hypotheses(slow, ring_in | {(ep("y", 7), ep("x", 7))}, P, rates)
    assert list(got) == [("network-slow", ("x",))]


def test_slow_both_ways_but_far_more_out_of_one_end_is_no_path():
    # sweep 173 #5: x's host starved; its pipeline sends into y at 5.8x on 4 NICs, y's sends
    # into x at 2x on 2 (x consumes late); both talk cleanly with third nodes, but only in
    # all-to-alls (no one-peer rate): x's host fits, not the path {x, y}
    out = {(ep("x", k), ep("y", k)): slow_link(ep("x", k), ep("y", k), 6, excess=4.8, comm=f"c{k}") for k in range(4)}
    back = {(ep("y", k), ep("x", k)): slow_link(ep("y", k), ep("x", k), 6, excess=1.0, comm=f"c{k}") for k in (0, 2)}
    clean = {(ep("x", k), ep("z", k)) for k in range(4)} | {(ep("z", k), ep("x", k)) for k in range(4)}
    clean |= {(ep("y", k), ep("w", k)) for k in range(4)} | {(ep("w", k), ep("y", k)) for k in range(4)}
    rates = ({k: 6.0 for k in out | back}, dict.fromkeys(clean, 30.0), dict.fromkeys(clean, -1.0))
    assert slow_link_hypotheses(out | back, clean, P, rates) == {}
    # slowed alike both ways, as a path does, both ends shown faster elsewhere: the path
    both = {(ep("y", k), ep("x", k)): slow_link(ep("y", k), ep("x", k), 6, excess=4.8, comm=f"c{k}") for k in range(4)}
    shown = ({k: 6.0 for k in out | both}, dict.fromkeys(clean, 30.0), dict.fromkeys(clean, 30.0))
    assert list(slow_link_hypotheses(out | both, clean, P, shown)) == [("path", ("x", "y"))]


def test_a_member_only_in_relays_paced_by_their_inputs_joins_no_group():
    # sweep 173 #13: a NIC at 43 % on x (16-node tree, 2 stages), named; then a path {y, m}:
    # y is x's pipeline partner (slow both ways with x), m was in the slow records only by
    # its own relay (to r, a, x, c) and by r's relay into it (to a, b, m), both slow by
    # timing alone, paced by x's slow data. A relay's pace is its inputs': m joins no group.
    from dataclasses import replace

    def relay(src: str, to: tuple[str, ...]) -> dict:
        peers = tuple(ep(d) for d in to)
        return {(ep(src), d): [replace(f, peer_eps=peers, flows=len(peers)) for f in slow_link(ep(src), d, 6, comm="t")]
                for d in peers}

    slow = {(ep("x"), ep("y")): slow_link(ep("x"), ep("y"), 6, comm="pp"),
            (ep("y"), ep("x")): slow_link(ep("y"), ep("x"), 6, comm="pp"),
            **relay("r", ("a", "b", "m")), **relay("m", ("r", "a", "x", "c"))}
    # x (its other NICs), r, a, b, c talk cleanly with third nodes both ways; m only sends
    # cleanly to one; y is seen with nobody else
    clean = {(ep(o), ep(n)) for n in ("a", "b", "c", "r", "x") for o in ("g", "h")}
    clean |= {(ep(n), ep(o)) for n in ("a", "b", "c", "r", "x") for o in ("g", "h")}
    clean |= {(ep("m"), ep("g")), (ep("g"), ep("h"))}
    assert slow_link_hypotheses(slow, clean, P) == {}
    # m's own relay resending bytes is its NIC's doing, not its inputs' pace: the group stands
    resent = {**slow, **{k: [replace(f, metric="volume_ratio") for f in fs]
                         for k, fs in relay("m", ("r", "a", "x", "c")).items()}}
    assert list(slow_link_hypotheses(resent, clean, P)) == [("path", ("m", "y"))]


def test_a_starved_hosts_all_to_all_sends_do_not_clear_it():
    # sweep 157 #14: x's host at 30 % of its CPU; its pipeline sends into y at 3.4x on 4
    # NICs, busy through their span (posts every ~47 us, under the 96 us epoch); its
    # all-to-all sends ran at their pace and beat the slow links; y is seen receiving only
    # from all-to-all senders (rate unknown). By elimination y's cap was named. A send over
    # many connections keeps its pace under a starved proxy: only one-peer sends clear it.
    slow = {(ep("x", k), ep("y", k)): [finding(ACT, "x", comm=f"c{k}", seq=i, endpoint=ep("x", k), value=1632.0,
                                               ref=480.0, start=i * MS, end=i * MS + 1632, to=(ep("y", k),))
                                       for i in range(6)] for k in range(4)}
    a2a_out = {(ep("x", k), ep("z", k)) for k in range(4)}
    a2a_in = {(ep("w", k), ep("y", k)) for k in range(4)}
    rates = (dict.fromkeys(slow, 5.5), {**dict.fromkeys(a2a_out, 16.5), **dict.fromkeys(a2a_in, 17.0)},
             {**dict.fromkeys(a2a_out, -1.0), **dict.fromkeys(a2a_in, -1.0)})
    got = slow_link_hypotheses(slow, a2a_out | a2a_in, P, rates)
    assert ("network-slow", ("y",)) not in got and got == {}
    # x's one-peer sends elsewhere beat the slow links: its host is cleared, y's cap named
    one_peer = {(ep("x", k), ep("v", k)) for k in range(4)}
    rates = (rates[0], {**rates[1], **dict.fromkeys(one_peer, 20.0)}, {**rates[2], **dict.fromkeys(one_peer, 20.0)})
    assert list(slow_link_hypotheses(slow, a2a_out | a2a_in | one_peer, P, rates)) == [("network-slow", ("y",))]


def _ring_link(burst: float, *, x_in: float = 40.0, y_out: float = 40.0):
    """x -> y slow on four rails, the one link between them of a ring: x sends to nobody
    else, y receives from nobody else; w sends into x and y sends to z at known rates;
    the slow links got at most 14 bytes/ns, each record busy throughout at ``burst``."""
    slow = {}
    for k in range(4):
        fs = slow_link(ep("x", k), ep("y", k), n=9, comm=f"c{k}")
        for f in fs:
            f.consistent, f.epoch_ns, f.burst = True, 100, burst
            f.value = float(f.end_ns - f.start_ns)
        slow[(ep("x", k), ep("y", k))] = fs
    into_x = {(ep("w", k), ep("x", k)) for k in range(4)}
    out_of_y = {(ep("y", k), ep("z", k)) for k in range(4)}
    clean_lo = {**dict.fromkeys(into_x, 40.0), **dict.fromkeys(out_of_y, y_out)}
    clean_in = {**dict.fromkeys(into_x, x_in), **dict.fromkeys(out_of_y, y_out)}
    return slow, into_x | out_of_y, (dict.fromkeys(slow, 14.0), clean_lo, clean_in)


def test_a_one_way_link_held_to_one_rate_with_both_ends_clean_the_other_way_is_a_path():
    # sweep 229 #12: a path at 24 % of its rate in an 11-node ring; node-05's sends to
    # node-06 at 0.98-0.99 of the flat bound on four NICs, node-05's receives and node-06's
    # sends at 2.8x their rate. A NIC or PCIe fault slows both directions; a starved host or
    # a congested downlink does not hold the sends to one rate: the path between them
    slow, clean, rates = _ring_link(0.99)
    assert list(slow_link_hypotheses(slow, clean, P, rates)) == [("path", ("x", "y"))]


def test_a_one_way_link_that_bursts_or_whose_ends_are_not_cleared_the_other_way_waits():
    # sends into a congested downlink pass bursts in its lulls (1.4-2.9 of the bound) with
    # the sender's NIC busy throughout (sweep 287 #22): y's downlink; a starved host's late
    # posts go out at line rate (1.0-1.85) with its NIC idle between them: x's host, or a
    # PCIe cap behind y's NICs holding x's sends back by its credits (sweep 307 #20), which
    # slows y's own sends too, later: nothing tells them apart yet
    ring = dict.fromkeys((f"c{k}" for k in range(4)), frozenset("wxyz")).__getitem__
    slow, clean, rates = _ring_link(1.4)
    assert list(slow_link_hypotheses(slow, clean, P, rates, members=ring)) == [("network-slow", ("y",))]
    idle = {k: [dataclasses.replace(f, value=f.value / 2) for f in fs] for k, fs in slow.items()}
    assert slow_link_hypotheses(idle, clean, P, rates, members=ring) == {}
    # a starved host's point-to-point sends go back to back at its pace, every epoch active
    # (battery cpu-contention seed 1): only a collective's steps show it idle between them
    pair = dict.fromkeys((f"c{k}" for k in range(4)), frozenset("xy")).__getitem__
    assert slow_link_hypotheses(slow, clean, P, rates, members=pair) == {}
    assert slow_link_hypotheses(*_ring_link(float("nan"))[:2], P, _ring_link(float("nan"))[2]) == {}
    # x's NICs not seen receiving faster than the slow links (x's NIC capped both ways)
    assert slow_link_hypotheses(*_ring_link(0.99, x_in=12.0)[:2], P, _ring_link(0.99, x_in=12.0)[2]) == {}
    # y's NICs not seen sending faster (y's NIC or PCIe capped)
    assert slow_link_hypotheses(*_ring_link(0.99, y_out=12.0)[:2], P, _ring_link(0.99, y_out=12.0)[2]) == {}


def test_a_one_way_link_is_no_path_while_its_receiver_takes_no_more_from_a_third_node():
    # sweep 293 #4: congestion into node-03's downlinks; node-02's sends into it held flat
    # (9.5-11.9 GB/s) and node-02 seen at 16.4 with its other peer, while node-03's pipeline
    # receives from node-01, not slow enough to be flagged, took 8.2-9.4: its downlink is as
    # slow with everyone, so the pair is no path (node-02 was blamed with it)
    slow, clean, (slow_hi, lo, into) = _ring_link(0.99)
    third = {(ep("v", k), ep("y", k)) for k in range(4)}
    assert list(slow_link_hypotheses(slow, clean | third, P, (slow_hi, {**lo, **dict.fromkeys(third, 12.0)},
                                                               {**into, **dict.fromkeys(third, 12.0)}))) != \
        [("path", ("x", "y"))]
    # what y takes in from the third node beats the slow links: the path again
    assert list(slow_link_hypotheses(slow, clean | third, P, (slow_hi, {**lo, **dict.fromkeys(third, 30.0)},
                                                               {**into, **dict.fromkeys(third, 30.0)}))) == \
        [("path", ("x", "y"))]
    # x seen sending to a third node no faster than the slow links: no path either
    out = {(ep("x", k), ep("u", k)) for k in range(4)}
    assert list(slow_link_hypotheses(slow, clean | out, P, (slow_hi, {**lo, **dict.fromkeys(out, 12.0)},
                                                             {**into, **dict.fromkeys(out, 12.0)}))) != \
        [("path", ("x", "y"))]


def test_an_all_to_alls_clean_share_of_a_link_does_not_hide_a_rings_slow_sends_over_it():
    # sweep 199 #19: a path at 23 % of its rate under MoE; the ring's sends over it slow in
    # every operator, the all-to-all's share of the same link (1/13 of a NIC) clean, five
    # all-to-alls per ring operator: in one window, two slow observations of twelve
    from pulse.localization.finding import LinkObs

    def feed(ev, lk):
        ev.links.add(lk)
        if not lk.shared:
            ev.single_links.add(lk)

    ev, p = evidence(clock_skew_ns=0)
    a, b = ep("a"), ep("b")
    for i in range(10):
        f = finding(ACT, "a", seq=i, endpoint=a, value=2.0, start=i * MS, end=i * MS + 1, to=(b,))
        f.consistent = True
        feed(ev, LinkObs(a, b, True, f, i * MS + 1))
        for k in range(5):
            feed(ev, LinkObs(a, b, False, None, i * MS + 100 * k + 2, shared=True))
    slow, clean = link_state(ev, p)
    assert list(slow) == [(a, b)] and len(slow[(a, b)]) == 10
    assert (a, b) not in clean
    # a relay's slowness (sent to several peers at once, one of its links held it up) is
    # still cleared by the link's clean observations of any kind
    ev, p = evidence(clock_skew_ns=0)
    for i in range(10):
        f = finding(ACT, "a", seq=i, endpoint=a, value=2.0, start=i * MS, end=i * MS + 1, to=(b, ep("c")))
        f.consistent = True
        feed(ev, LinkObs(a, b, True, f, i * MS + 1, shared=True))
        for k in range(5):
            feed(ev, LinkObs(a, b, False, None, i * MS + 100 * k + 2, shared=True))
    assert link_state(ev, p)[0] == {}


def test_a_clean_link_exonerates_only_if_it_moved_more_than_the_slow_ones_got():
    # sweep 257 #8: incast into b and d's downlinks; the pipeline sends a -> b and c -> d slow
    # at up to 13-14 bytes/ns, the tree all-reduce e -> b, e -> d "clean" at 10.9 (its
    # operator as slow at every rank behind the same congestion); a and c send cleanly to f
    # at 19.4. The receivers are not exonerated by the clean trickle, the senders are.
    slow = {(ep("a"), ep("b")): [], (ep("c"), ep("d")): []}
    clean = {(ep("e"), ep("b")), (ep("e"), ep("d")), (ep("a"), ep("f")), (ep("c"), ep("f"))}
    pairs = {("a", "b"), ("c", "d")}
    clean_pairs = {("e", "b"), ("e", "d"), ("a", "f"), ("c", "f")}
    nodes = ["a", "b", "c", "d"]
    assert exonerated(pairs, clean_pairs, nodes) == {"a", "b", "c", "d"}  # without rates: any clean link
    slow_hi = {(ep("a"), ep("b")): 13.4, (ep("c"), ep("d")): 14.0}
    shown = {(ep("e"), ep("b")): 10.9, (ep("e"), ep("d")): 10.9, (ep("a"), ep("f")): 19.4, (ep("c"), ep("f")): 19.4}
    assert exonerated(pairs, clean_pairs, nodes, slow, clean, (slow_hi, shown, shown)) == {"a", "c"}
    # the receivers' clean links faster than the slow ones got: their downlinks work
    faster = {**shown, (ep("e"), ep("b")): 19.0, (ep("e"), ep("d")): 19.0}
    assert exonerated(pairs, clean_pairs, nodes, slow, clean, (slow_hi, faster, faster)) == {"a", "b", "c", "d"}


def test_a_ring_paced_by_its_link_into_a_starved_receiver_widens_no_group():
    # sweep 281 #7: incast into x's downlinks; every all-to-all link into x starved (each
    # sender's link into x slow, the rest of its links not), then x's data-parallel ring,
    # paced by its link into x, slow by ACT on x -> y and on y -> z. No node is on every
    # slow link, and x was named a path with y, then with z. A ring rank's ACT stretches
    # with a slow link anywhere in its ring: the links of x's ring say that it waited.
    from pulse.localization.finding import PEER_RATE_IN

    def starved(src: str, k: int) -> list:
        return [finding(ACT, src, comm="a2a", seq=i, endpoint=ep(src, k), value=3.9, ref=5.9, metric=PEER_RATE_IN,
                        start=i * MS, end=i * MS + MS // 2, to=(ep("x", k),)) for i in range(6)]

    slow = {(ep(s, k), ep("x", k)): starved(s, k) for s in ("y", "z", "w") for k in range(2)}
    ring = {(ep("x"), ep("y")): slow_link(ep("x"), ep("y"), 6, comm="ring"),
            (ep("y"), ep("z")): slow_link(ep("y"), ep("z"), 6, comm="ring")}
    slow.update(ring)
    clean = {(ep(a, k), ep(b, k)) for a in ("y", "z", "w") for b in ("y", "z", "w") if a != b for k in range(2)}
    members = {"ring": frozenset("xyzw"), "a2a": frozenset("xyzw")}.__getitem__
    assert list(slow_link_hypotheses(slow, clean, P, members=members)) == [("network-slow", ("x",))]
    # a ring that x is not in waited for something else: its slow link stays evidence
    assert ("network-slow", ("x",)) not in slow_link_hypotheses(
        slow, clean, P, members={"ring": frozenset("yzw"), "a2a": frozenset("xyzw")}.__getitem__)
    # and links slow by rate, not timing, are never set aside
    rated = {**slow, (ep("y"), ep("z")): [dataclasses.replace(f, metric="peer_rate") for f in ring[(ep("y"), ep("z"))]]}
    assert ("network-slow", ("x",)) not in slow_link_hypotheses(rated, clean, P, members=members)


def _relay(src: str, to: tuple[str, ...], burst: float) -> dict:
    """A tree relay of src's, slow by ACT, to every node of ``to`` at once, its busiest
    epochs at ``burst`` of the flat bound."""
    peers = tuple(ep(d) for d in to)
    fs = [dataclasses.replace(f, peer_eps=peers, flows=len(peers), burst=burst)
          for f in slow_link(ep(src), peers[0], 6, comm="t")]
    return {(ep(src), d): fs for d in peers}


def test_a_node_whose_own_relays_moved_in_bursts_is_not_the_cap_of_a_tree():
    # sweep 283 #16: a NIC at 30 % on c of a 7-node tree; every relay of the rail went slow
    # by ACT, x's relay (to c among others) and w's first, and x was the one node in every
    # slow record, its own among them: named. A capped NIC holds its relays' epochs flat;
    # x's busiest epochs were 1.25-1.55 of the flat bound - it forwarded at the pace of
    # its input, in bursts.
    def slow(x_burst: float) -> dict:
        return {**_relay("c", ("b", "x"), 1.1), **_relay("x", ("a", "c", "d", "w"), x_burst),
                **_relay("w", ("a", "e", "x"), 2.0)}

    assert slow_link_hypotheses(slow(1.4), set(), P) == {}
    assert list(slow_link_hypotheses(slow(1.05), set(), P)) == [("network-slow", ("x",))]
    assert list(slow_link_hypotheses(slow(float("nan")), set(), P)) == [("network-slow", ("x",))]  # unknown: as before


def test_a_ring_slow_by_timing_alone_widens_no_group_beyond_the_node_already_named():
    # sweep 281 #7, later: x already named network-slow (incast into its downlinks); the
    # all-to-all links into it clean for a while, its stage's ring slow by ACT alone on
    # w -> x, x -> y and y -> z, w and z seen clean with a third node: x was named a path
    # with y. The ring's links say that it waited for its slowest link, which x explains.
    ring = {(ep(a), ep(b)): slow_link(ep(a), ep(b), 6, comm="ring") for a, b in (("w", "x"), ("x", "y"), ("y", "z"))}
    clean = {(ep(a), ep(b)) for a, b in (("z", "v"), ("v", "z"), ("w", "v"), ("v", "w"))}
    members = {"ring": frozenset("wxyz")}.__getitem__
    assert list(slow_link_hypotheses(ring, clean, P, members=members)) == [("path", ("x", "y"))]  # nothing named
    got = slow_link_hypotheses(ring, clean, P, members=members, named=frozenset({"x"}))
    assert all(k[0] != "path" for k in got)
    # a node named that is in no collective of those links explains nothing of their pace
    assert paced_by_one(ring, {"ring": frozenset("wyz")}.__getitem__, frozenset({"x"})) is None
    assert paced_by_one(ring, members, frozenset({"x"})) == {k: v for k, v in ring.items() if "x" in (k[0][0], k[1][0])}


def test_a_ring_link_kept_busy_in_bursts_into_one_receiver_is_its_downlink():
    # sweep 287 #22 (incast into y's downlinks, a 13-node ring; the job 38 % slower): the
    # ring's only links into y, from x, slow on every NIC and nothing else; x's NIC busy in
    # every epoch of them, its busiest epochs 3.7-4.2x its mean (the downlink's lulls). A
    # starved host posts late and leaves its NIC idle between posts (sweeps 269 #11, 287 #5:
    # busy in 0-1 of 7-12), a cap - x's NIC or the path - holds its rate flat.
    def ring(busy: bool, burst: float) -> dict:
        out = {}
        for k in range(4):
            fs = slow_link(ep("x", k), ep("y", k), 6, comm=f"r{k}")
            out[(ep("x", k), ep("y", k))] = [
                dataclasses.replace(f, epoch_ns=1, value=(f.end_ns - f.start_ns) if busy else 1.0, burst=burst)
                for f in fs]
        return out

    members = dict.fromkeys((f"r{k}" for k in range(4)), frozenset("vwxy")).__getitem__
    assert list(slow_link_hypotheses(ring(True, 4.0), set(), P, members=members)) == [("network-slow", ("y",))]
    assert slow_link_hypotheses(ring(False, 2.3), set(), P, members=members) == {}  # idle between posts: x's host
    assert ("network-slow", ("y",)) not in slow_link_hypotheses(ring(True, 0.99), set(), P, members=members)  # a cap


def test_links_into_several_nics_of_a_node_idle_at_their_sender_name_it_only_if_it_sends_slowly_on_them():
    # sweep 287 #5: node-04 (y) at 46 % of its CPU in a 5-node ring; its sends into x slow
    # on all four NICs, busy in 3 of 38 records, and one of x's ring sends (paced by them)
    # slow too: x on every slow link. A fault at x's end that slows several of its NICs
    # caps them and keeps their senders busy; one that leaves them idle takes one NIC
    def state(busy: bool, nics: tuple[int, ...] = (0, 1, 2, 3)):
        out = {}
        for k in nics:
            fs = slow_link(ep("y", k), ep("x", k), n=8, comm=f"c{k}")
            out[(ep("y", k), ep("x", k))] = [
                dataclasses.replace(f, epoch_ns=10_000, value=float(f.end_ns - f.start_ns) if busy else 20_000.0)
                for f in fs]
        out[(ep("x", 2), ep("z", 2))] = [dataclasses.replace(f, epoch_ns=10_000, value=float(f.end_ns - f.start_ns))
                                         for f in slow_link(ep("x", 2), ep("z", 2), comm="c2")]
        return out

    assert slow_link_hypotheses(state(busy=False), set(), P) == {}
    assert list(slow_link_hypotheses(state(busy=True), set(), P)) == [("network-slow", ("x",))]
    # a PCIe cap behind x's NICs: its senders idle, waiting for x's credits, and x's own
    # sends slow on those NICs alike (sweep 307 #20: busy in 2-4 of 12)
    pcie = state(busy=False) | {(ep("x", k), ep("z", k)): slow_link(ep("x", k), ep("z", k), comm=f"c{k}")
                                for k in range(4)}
    assert list(slow_link_hypotheses(pcie, set(), P)) == [("network-slow", ("x",))]
    # one of x's NICs: a flapping or lossy NIC leaves its senders idle between bursts
    assert list(slow_link_hypotheses(state(busy=False, nics=(2,)) | {
        (ep("w", 2), ep("x", 2)): slow_link(ep("w", 2), ep("x", 2))}, set(), P)) == [("network-slow", ("x",))]


def test_one_stray_link_widens_no_group_beyond_the_node_already_named():
    # sweep 347 #5 (congestion into x's downlinks, an 11-node MoE job): x named
    # network-slow by every all-to-all link into it starved inward; later one ring link
    # elsewhere, u -> v on one NIC, slow by its busiest epochs (they happened to stay low
    # while the ring ran at the congested link's pace), and x was named a group with v.
    def inward(src: str, nic: int) -> list:
        return [dataclasses.replace(f, metric=PEER_RATE_IN, value=0.4) for f in slow_link(ep(src, nic), ep("x", nic), 6,
                                                                                           comm="a2a")]

    into_x = {(ep(s, n), ep("x", n)): inward(s, n) for s in "abcuv" for n in range(2)}
    stray = {(ep("u", 1), ep("v", 1)): [dataclasses.replace(f, metric="peak_epoch_bytes", value=0.6)
                                        for f in slow_link(ep("u", 1), ep("v", 1), 6, comm="ring")]}
    clean = {(ep(a, n), ep(b, n)) for a, b in (("u", "a"), ("a", "u"), ("b", "v"), ("a", "b")) for n in range(2)}
    slow = {**into_x, **stray}
    assert list(slow_link_hypotheses(slow, clean, P)) == [("path", ("v", "x"))]  # nothing named: as before
    assert slow_link_hypotheses(slow, clean, P, named=frozenset({"x"})) == {}
    # two NIC pairs slow on the other side stand on their own
    stray2 = {(ep("u", n), ep("v", n)): [dataclasses.replace(f, metric="peak_epoch_bytes", value=0.6)
                                         for f in slow_link(ep("u", n), ep("v", n), 6, comm="ring")] for n in range(2)}
    assert list(slow_link_hypotheses({**into_x, **stray2}, clean, P, named=frozenset({"x"}))) == [("path", ("v", "x"))]


def test_no_path_with_a_node_already_named_on_its_links_alone():
    # sweep 281 #7: congestion into node-12's downlinks under MoE, named network-slow;
    # 680 ms later its ring partner's sends into it - the same starved downlink - were named
    # a path {node-12, node-15}. The links at a named node are its incident's.
    slow, clean, rates = _one_way()
    assert list(slow_link_hypotheses(slow, clean, P, rates)) == [("path", ("a", "b"))]  # nothing named: as before
    assert slow_link_hypotheses(slow, clean, P, rates, named=frozenset({"b"})) == {}
    assert slow_link_hypotheses(slow, clean, P, rates, named=frozenset({"a"})) == {}
    # two slow links away from the named node stand on their own
    away = {(ep("u", k), ep("v", k)): slow_link(ep("u", k), ep("v", k), n=9) for k in (0, 1)}
    assert slow_link_hypotheses({**slow, **away}, clean, P, rates, named=frozenset({"c"})) == \
        slow_link_hypotheses({**slow, **away}, clean, P, rates)


def test_of_several_nodes_in_every_slow_relay_the_one_held_to_one_rate_is_the_cap():
    # sweep 293 #11: a NIC at 41 % on z of a 5-node tree; the relays of x, y and z slow,
    # each sending to the other two: all three in every slow record. z's relays held flat
    # (1.03 of the bound), x's and y's in bursts (1.8): they forwarded at z's pace.
    def slow(x: float = 1.8, y: float = 1.8, z: float = 1.03) -> dict:
        return {**_relay("x", ("a", "y", "z"), x), **_relay("y", ("b", "x", "z"), y), **_relay("z", ("b", "x", "y"), z)}

    assert list(slow_link_hypotheses(slow(), set(), P)) == [("network-slow", ("z",))]
    assert slow_link_hypotheses(slow(z=1.8), set(), P) == {}           # every relay in bursts: paced from elsewhere
    assert slow_link_hypotheses(slow(z=float("nan")), set(), P) == {}  # z's shape unknown
    assert slow_link_hypotheses(slow(y=1.03), set(), P) == {}          # two held flat: which one is not said
