"""Host contention (localization/rules/host.py) on a hand-built link state."""

from __future__ import annotations

from pulse.localization.params import LocalizeParams
from pulse.localization.rules.host import excess, host_hypothesis

from .findings import ep, slow_link

P = LocalizeParams()


def _state(in_excess: float | None = None, nics: int = 2):
    """node a sends slowly on ``nics`` NICs to b and c (x2); b and c still receive cleanly
    from d; optionally b's sends into a are slow by ``in_excess``."""
    slow = {(ep("a", 0), ep("b", 0)): slow_link(ep("a", 0), ep("b", 0)),
            (ep("a", nics - 1), ep("c", nics - 1)): slow_link(ep("a", nics - 1), ep("c", nics - 1))}
    if in_excess is not None:
        slow[(ep("b", 0), ep("a", 0))] = slow_link(ep("b", 0), ep("a", 0), excess=in_excess)
    clean = {(ep("d", 0), ep("b", 0)), (ep("d", 1), ep("c", nics - 1)), (ep("d", 0), ep("a", 0))}
    return slow, clean


def test_excess_is_the_median_act_slowdown():
    assert abs(excess(slow_link(ep("a"), ep("b"), excess=0.3)) - 0.3) < 1e-12
    assert excess([]) == 0.0


def test_slow_sends_on_two_nics_with_clean_receivers_is_host_contention():
    slow, clean = _state()
    got = host_hypothesis(slow, clean, P)
    assert list(got) == [("host-contention", ("a",))]
    inc = got[("host-contention", ("a",))]
    assert inc.extra["slow_out_nics"] == [ep("a", 0), ep("a", 1)]
    assert inc.extra["clean_in_nics"] == [ep("a", 0)]
    assert inc.extra["out_excess"] == 1.0 and inc.extra["in_excess"] == 0.0


def test_traffic_into_the_node_slow_as_well_is_not_the_host():
    # a NIC / PCIe fault slows both directions alike
    slow, clean = _state(in_excess=1.0)
    assert host_hypothesis(slow, clean, P) == {}
    # into the node much less slow than out of it: still the host
    slow, clean = _state(in_excess=0.2)
    assert list(host_hypothesis(slow, clean, P)) == [("host-contention", ("a",))]


def test_slow_sends_on_one_nic_only_is_not_the_host():
    slow, clean = _state(nics=1)
    assert host_hypothesis(slow, clean, P) == {}


def test_receivers_not_seen_receiving_cleanly_from_others_is_not_the_host():
    slow, clean = _state()
    clean.discard((ep("d", 1), ep("c", 1)))  # c's downlink may be the problem
    assert host_hypothesis(slow, clean, P) == {}



def test_host_shaped_slowness_waits_for_the_receivers_rather_than_naming_the_nic():
    # a's sends slow x4 on two NICs, what b sends into a x1.6: the host's shape. Until c is
    # seen receiving cleanly from others the host rule cannot conclude, and a's NIC (which
    # would slow both directions alike) is not the answer either: nothing yet
    from pulse.localization.rules.links import slow_link_hypotheses

    def state(in_excess: float):
        slow = {(ep("a", k), ep("b", k)): slow_link(ep("a", k), ep("b", k), excess=3.0) for k in (0, 1)}
        slow[(ep("b", 0), ep("a", 0))] = slow_link(ep("b", 0), ep("a", 0), excess=in_excess)
        slow[(ep("a", 1), ep("c", 1))] = slow_link(ep("a", 1), ep("c", 1), excess=3.0)
        return slow, {(ep("d", 0), ep("b", 0)), (ep("d", 0), ep("a", 0))}

    assert slow_link_hypotheses(*state(0.6), P) == {}
    slow, clean = state(0.6)
    clean.add((ep("d", 1), ep("c", 1)))  # now c is seen receiving cleanly
    assert list(slow_link_hypotheses(slow, clean, P)) == [("host-contention", ("a",))]
    # both directions slow alike: a's NIC
    assert list(slow_link_hypotheses(*state(3.0), P)) == [("network-slow", ("a",))]


def test_receivers_cleared_only_by_traffic_faster_than_the_slow_sends_got():
    # with rates known, b's and c's clean traffic from d clears their downlinks only when
    # it came faster than a's slow sends into them got: a downlink that lost half its
    # capacity still takes an all-to-all's fan-out-bound flows at their usual pace
    slow, clean = _state()
    slow_hi = {k: 10.0 for k in slow}
    into = {(ep("d", 0), ep("b", 0)): 25.0, (ep("d", 1), ep("c", 1)): 25.0, (ep("d", 0), ep("a", 0)): 25.0}
    assert list(host_hypothesis(slow, clean, P, (slow_hi, {}, into))) == [("host-contention", ("a",))]
    slower = {**into, (ep("d", 1), ep("c", 1)): 8.0}  # c received no faster than a's sends got
    assert host_hypothesis(slow, clean, P, (slow_hi, {}, slower)) == {}
    shared = {**into, (ep("d", 1), ep("c", 1)): -1.0}  # an all-to-all sender: c's share unknown
    assert host_hypothesis(slow, clean, P, (slow_hi, {}, shared)) == {}


def test_a_sender_whose_other_sends_beat_the_slow_links_is_no_starved_host():
    # a's sends into b slow on two NICs (the host's shape from a's side), but a sends to c
    # faster than those links got, and b is seen receiving only from an all-to-all (its
    # share unknown): b's capped downlink explains it, a's host does not
    from dataclasses import replace

    from pulse.localization.rules.links import slow_link_hypotheses

    # records active through their wire span, as a capped downlink keeps its senders
    slow = {(ep("a", k), ep("b", k)): [replace(f, value=float(f.end_ns - f.start_ns), epoch_ns=32_000)
                                       for f in slow_link(ep("a", k), ep("b", k), excess=1.5)] for k in (0, 1)}
    clean = {(ep("a", 0), ep("c", 0)), (ep("d", 0), ep("b", 0)), (ep("b", 1), ep("a", 1))}
    slow_hi = {k: 10.0 for k in slow}
    sends = {(ep("a", 0), ep("c", 0)): 25.0, (ep("d", 0), ep("b", 0)): 25.0, (ep("b", 1), ep("a", 1)): 25.0}
    into = {(ep("a", 0), ep("c", 0)): 25.0, (ep("d", 0), ep("b", 0)): -1.0, (ep("b", 1), ep("a", 1)): 25.0}
    assert list(slow_link_hypotheses(slow, clean, P, (slow_hi, sends, into))) == [("network-slow", ("b",))]
    # the slow sends left their NICs idle for more than an epoch (a third of each span):
    # no cap paces them so, a starved host's late posts do (sweep 79 #3: the healthy
    # receiver was named network-slow) - b is not named
    idle = {k: [replace(f, value=f.value * 2 / 3) for f in fs] for k, fs in slow.items()}
    assert ("network-slow", ("b",)) not in slow_link_hypotheses(idle, clean, P, (slow_hi, sends, into))
    # a's other sends no faster than the slow links: its host may pace them all, b is not named
    slower = {**sends, (ep("a", 0), ep("c", 0)): 9.0}
    assert ("network-slow", ("b",)) not in slow_link_hypotheses(slow, clean, P, (slow_hi, slower, into))
    # b's downlink seen taking in faster than that from all its all-to-all peers together
    # (sweep 281 #21: a's host at 41 % of its CPU posting its pipeline sends into b at a
    # steady slow pace, b named network-slow): b is cleared and a's host, its sends back
    # from b clean, is what fits
    from pulse.localization.rules.capacity import Rates

    took = Rates(slow_hi, sends, into, {ep("b", 0): 30.0})
    assert list(slow_link_hypotheses(slow, clean, P, took)) == [("host-contention", ("a",))]
    took = Rates(slow_hi, sends, into, {ep("b", 0): 9.0})  # no faster than the slow links: as before
    assert list(slow_link_hypotheses(slow, clean, P, took)) == [("network-slow", ("b",))]


def test_a_reverse_link_clears_a_one_way_path_only_by_the_rate_it_carried():
    # sweep 283 #11: a path at 24 % between a and b; the ring's only link between them,
    # a -> b, slow on 4 NICs; b's all-to-all sends into a clean, at a rate shared among
    # its receivers (-1: unknown); b seen receiving cleanly from d. Named host-contention.
    slow = {(ep("a", k), ep("b", k)): slow_link(ep("a", k), ep("b", k), 6) for k in range(4)}
    back = {(ep("b", k), ep("a", k)) for k in range(4)}
    clean = back | {(ep("d", k), ep("b", k)) for k in range(4)}
    into_b = {(ep("d", k), ep("b", k)): 20.0 for k in range(4)}
    slow_hi = dict.fromkeys(slow, 5.0)
    assert host_hypothesis(slow, clean, P, (slow_hi, {}, {**into_b, **dict.fromkeys(back, -1.0)})) == {}
    # b's sends into a on their own, faster than a's slow sends got: no path fits, a's host does
    got = host_hypothesis(slow, clean, P, (slow_hi, {}, {**into_b, **dict.fromkeys(back, 20.0)}))
    assert list(got) == [("host-contention", ("a",))]
    assert list(host_hypothesis(slow, clean, P)) == [("host-contention", ("a",))]  # rates unknown: as before
