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
from pulse.localization.stragglers import clear_slowest, consistent_count

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


def _naive_clear(act: list[float], epoch: float, ratio: float) -> int:
    top = max(act)
    if act.count(top) > 1:
        return -1
    i = act.index(top)
    others = sorted(a for j, a in enumerate(act) if j != i)
    m = len(others)
    med = others[m // 2] if m % 2 else (others[m // 2 - 1] + others[m // 2]) / 2
    return i if top - epoch >= ratio * (med + epoch) else -1


@given(st.lists(st.integers(1, 60), min_size=3, max_size=12), st.integers(1, 4), st.sampled_from([1.1, 1.15, 1.5]))
def test_clear_slowest_agrees_with_a_naive_reference(epochs: list[int], e: int, ratio: float) -> None:
    act = [float(a * e) for a in epochs]
    assert clear_slowest(np.array(act), float(e), ratio) == _naive_clear(act, float(e), ratio)


def _mild(factor: float, every: int = 1):
    # node-02's NIC on rail 0 is ``factor`` x slower in and out in every ``every``-th
    # operator from the onset (it and the rank sending into it busiest): below the
    # per-operator bound (act_ratio 1.3) at 1.2
    def tweak(comm, seq, r, f):
        if comm == "dp0" and seq >= ONSET and r in (1, 2) and (seq - ONSET) % every == 0:
            f["act_ns"] = int(synth.ACT * (factor if r == 2 else factor - 0.005))
        return f
    return tweak


def test_a_rank_a_little_slower_in_every_operator_is_named():
    vs = run(_mild(1.2), ops=60)
    assert culprits(vs) == {("network-slow", "node", ("node-02",))}
    # no operator alone was slow by the per-operator bound: consistency named it
    assert not anomalies(run(_mild(1.2), ops=60, params=LocalizeParams(straggler_alpha=1e-300)))


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
