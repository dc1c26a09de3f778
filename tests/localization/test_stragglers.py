"""Consistent stragglers (localization/stragglers.py): the count a rank needs is the
binomial tail's, the margin is checked against a naive reference, and on a ring a node whose
sends are a little slower in every operator - below the per-operator bound - is named, while
the same slowness now and then, or a smaller one always, is not."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from pulse.localization import LocalizeParams
from pulse.localization.stragglers import Stragglers, consistent_count, half_places, place_total

from . import synth
from .test_rules import ONSET, anomalies, culprits, run


def _tail(n: int, window: int, k: int) -> float:
    """P(one rank is the slowest in >= k of ``window`` operators), each at 1/n, by
    enumerating every pattern of operators it was the slowest in."""
    q = 1.0 / n
    return sum(q ** sum(bits) * (1 - q) ** (window - sum(bits))
               for bits in itertools.product((0, 1), repeat=window) if sum(bits) >= k)


def test_the_count_is_the_smallest_whose_tail_over_all_ranks_is_below_alpha():
    for n, window, alpha in [(3, 12, 1e-3), (4, 12, 1e-3), (8, 12, 1e-3), (4, 8, 1e-2), (16, 10, 1e-4)]:
        k = consistent_count(n, window, alpha)
        assert k <= window
        assert n * _tail(n, window, k) <= alpha
        assert k == 1 or n * _tail(n, window, k - 1) > alpha
    # two ranks can never be told apart in 4 operators at 1e-3: no count is enough
    assert consistent_count(2, 4, 1e-3) == 5


def _place_tail(n: int, window: int, total: int) -> float:
    """P(one rank's untied places over ``window`` operators sum to >= ``total`` half
    places), by enumerating every sequence of places."""
    return sum(1 for seq in itertools.product(range(n), repeat=window) if 2 * sum(seq) >= total) / n**window


def test_the_place_total_is_the_smallest_whose_tail_over_all_ranks_is_below_alpha():
    for n, window, alpha in [(3, 6, 1e-2), (4, 5, 1e-2), (2, 8, 1e-1), (5, 4, 1e-2), (3, 8, 1e-3)]:
        need = place_total(n, window, alpha)
        top = 2 * window * (n - 1)
        if need <= top:
            assert n * _place_tail(n, window, need) <= alpha
        assert need == 0 or n * _place_tail(n, window, need - 1) > alpha
    # two ranks cannot be told apart in 4 operators at 1e-3: no total is enough
    assert place_total(2, 4, 1e-3) == 2 * 4 + 1


def _naive_half_places(act: list[float]) -> list[int]:
    # the mean of the 0-based places a tie spans, doubled
    out = []
    for x in act:
        spanned = [k for k, y in enumerate(sorted(act)) if y == x]
        out.append(round(2 * sum(spanned) / len(spanned)))
    return out


@given(st.lists(st.integers(1, 60), min_size=2, max_size=12))
def test_half_places_agree_with_a_naive_reference(epochs: list[int]) -> None:
    act = [float(a) for a in epochs]
    assert half_places(np.array(act)).tolist() == _naive_half_places(act)


def test_a_lead_broken_by_a_stretched_peer_now_and_then_still_holds():
    # the lab's loss run in CI: the lossy rank slowest in most operators, but two of the
    # window's with another rank stretched by a retransmission timeout and two ties at
    # the top: not 10 strict wins of 12, yet its places total far beyond chance
    st_ = Stragglers(LocalizeParams())
    flagged = []
    base = [10.0, 10.4, 10.2, 10.6]
    for k in range(12):
        act = list(base)
        act[1] = 13.0
        if k in (3, 8):
            act[2] = 30.0  # another rank stretched: the lossy rank second
        if k in (5, 10):
            act[3] = 13.0  # a tie at the top
        recs = [synth.record("dp0", k, r, r, kind="AllReduce", nranks=4, start=0, end=40_000_000, t_host=0,
                             nic="eth0", act=int(a * 1e6)) for r, a in enumerate(act)]
        flagged.append(st_.observe("dp0", recs, [1, 1, 1, 1]))
    assert flagged[-1] == frozenset({1})
    assert all(not f for f in flagged[:-1])  # the window was not full before


def _mild(factor: float, every: int = 1, *, then: float | None = None):
    # node-02's NIC on rail 0 is ``factor`` x slower in and out in every ``every``-th
    # operator from the onset (it and the rank sending into it busiest): below the
    # per-operator bound (act_ratio 1.3) at 1.2; ``then``: that factor in the operators
    # between
    def tweak(comm, seq, r, f):
        if comm == "dp0" and seq >= ONSET and r in (1, 2):
            x = factor if (seq - ONSET) % every == 0 else then
            if x is not None:
                f["act_ns"] = int(synth.ACT * (x if r == 2 else x - 0.005))
        return f
    return tweak


def test_a_rank_a_little_slower_in_every_operator_is_named():
    vs = run(_mild(1.2), ops=60)
    assert culprits(vs) == {("network-slow", "node", ("node-02",))}
    # no operator alone was slow by the per-operator bound: consistency named it
    assert not anomalies(run(_mild(1.2), ops=60, params=LocalizeParams(straggler_alpha=1e-300)))


def test_a_lead_judged_over_the_window_not_operator_by_operator():
    # 1.25x and 1.1x in turn (the lab's TCP at 2 % loss: 1.06-1.55x, 1.18x over the job):
    # an epoch either way on each operator clears half the margin (1.15x) in half of them,
    # too few for the count; summed over the window the lead is 1.17x
    vs = run(_mild(1.25, every=2, then=1.1), ops=60)
    assert culprits(vs) == {("network-slow", "node", ("node-02",))}


def test_the_same_slowness_in_every_other_operator_or_a_smaller_one_always_is_not():
    assert not anomalies(run(_mild(1.2, every=2), ops=60))
    assert not anomalies(run(_mild(1.1), ops=60))


def test_a_straggler_alpha_outside_0_1_is_a_config_error():
    import pytest

    from pulse.errors import ConfigError, PulseError

    assert issubclass(ConfigError, PulseError)
    for bad in (0.0, 1.0, -0.5, 2.0):
        with pytest.raises(ConfigError, match="straggler_alpha"):
            LocalizeParams(straggler_alpha=bad)


def test_the_ranks_downstream_of_a_straggler_as_busy_as_it_are_not_blamed():
    # sweep 239 #7: congestion into node-04 of a 13-rank ring; the rank sending into it the
    # consistent straggler, and ranks downstream kept as busy by the ring's pace in most
    # operators. Here node-02 is 1.3x slower (at the per-operator bound, not beyond it), the
    # rank sending into it as busy, and ranks 4-7 of the 12-rank ring as busy in two
    # operators of three: only the straggler's links carry the blame, and node-02 stays named
    # while it lasts (with the downstream links slow too, no single node covered them and the
    # hypothesis was dropped after its first verdict; in the sweep, a group took its place)
    def tweak(comm, seq, r, f):
        if comm == "dp0" and seq >= ONSET:
            if r == 2:
                f["act_ns"] = int(synth.ACT * 1.3)
            elif r == 1 or (r in (4, 5, 6, 7) and seq % 3):
                f["act_ns"] = int(synth.ACT * 1.295)
        return f

    vs = run(tweak, n=12, rails=1, ops=60)
    assert culprits(vs) == {("network-slow", "node", ("node-02",))}
    assert len(anomalies(vs)) >= 3  # repeated while it persists


def test_operators_another_rank_entered_late_do_not_count_for_a_rank():
    # sweep 257 #23: a ring rank two hops upstream of one that enters every operator 4-7 ms
    # late waits in the middle of its own sends and is the slowest of the healthy ring,
    # operator after operator; with the late entries told, its window is empty
    def window(rises: dict[int, float] | None, noise: float = 0.0) -> frozenset[int]:
        st_ = Stragglers(LocalizeParams())
        out = frozenset()
        for k in range(12):
            act = [8.0, 8.0, 8.0, 8.0, 10.0, 7.0, 7.0]
            recs = [synth.record("dp0", k, r, r, kind="AllReduce", nranks=7, start=0, end=6_000_000, t_host=0,
                                 nic="eth0", act=int(a * 96_000)) for r, a in enumerate(act)]
            out = st_.observe("dp0", recs, [1] * 7)
            if rises is not None:
                st_.rises("dp0", tuple(range(7)), rises, noise)
        return out

    assert window(None) == frozenset({4})
    assert window({0: 100_000.0, 4: -300_000.0, 6: 5_000_000.0}) == frozenset()
    # a late rank by less than the candidate's own ACT does not excuse it
    assert window({4: 0.0, 6: 500_000.0}) == frozenset({4})
    # nor does the candidate's own lateness
    assert window({4: 5_000_000.0, 6: 0.0}) == frozenset({4})
    # nor a late entry within the job's healthy jitter (the lab: +-20 ms against 15 ms of ACT)
    assert window({4: 0.0, 6: 5_000_000.0}, noise=6_000_000.0) == frozenset({4})
