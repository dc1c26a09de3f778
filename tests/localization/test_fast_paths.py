"""The localizer's fast paths against the plain definitions they replace: same answer on
any input (they change how the rules compute, never what they decide)."""

from __future__ import annotations

from collections import deque
from itertools import combinations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.localization.evidence import LinkWindows
from pulse.localization.finding import LinkObs
from pulse.localization.params import LocalizeParams
from pulse.localization.rules.links import exonerated, unique_cover

NODES = [f"n{i}" for i in range(9)]
node = st.sampled_from(NODES)


def cover_by_scan(sets, nodes, max_group, exclude=None):
    """The definition: the first size with covers, scanning every combination in order."""
    want = [frozenset(s) for s in sets]
    for k in range(1, max_group + 1):
        found = [c for c in combinations(nodes, k) if all(not s.isdisjoint(c) for s in want)]
        if found and exclude:
            found = [c for c in found if not exclude & set(c)]
            if not found:
                return None
        if found:
            return found[0] if len(found) == 1 else None
    return None


def exonerated_by_scan(pairs, clean_pairs, nodes):
    out = set()
    for x in nodes:
        sends = any(a == x for a, _ in pairs)
        gets = any(b == x for _, b in pairs)
        partners = {b for a, b in pairs if a == x} | {a for a, b in pairs if b == x}
        ok_out = any(a == x and b not in partners for a, b in clean_pairs)
        ok_in = any(b == x and a not in partners for a, b in clean_pairs)
        if (sends or gets) and (not sends or ok_out) and (not gets or ok_in):
            out.add(x)
    return out


@settings(max_examples=400, deadline=None)
@given(sets=st.lists(st.frozensets(node, min_size=1, max_size=4), max_size=12),
       extra=st.lists(node, max_size=3), max_group=st.integers(1, 4),
       exclude=st.none() | st.sets(node, max_size=3))
def test_unique_cover_is_the_scan_over_every_combination(sets, extra, max_group, exclude):
    nodes = sorted(set().union(*sets) | set(extra)) if sets else sorted(set(extra))
    assert unique_cover(sets, nodes, max_group, exclude) == cover_by_scan(sets, nodes, max_group, exclude)


@settings(max_examples=200, deadline=None)
@given(sets=st.lists(st.frozensets(node, min_size=1, max_size=4), min_size=1, max_size=8),
       nodes=st.lists(node, max_size=6), max_group=st.integers(1, 3))
def test_unique_cover_with_nodes_outside_the_sets_or_repeated(sets, nodes, max_group):
    assert unique_cover(sets, nodes, max_group) == cover_by_scan(sets, nodes, max_group)


pair = st.tuples(node, node).filter(lambda ab: ab[0] != ab[1])


@settings(max_examples=300, deadline=None)
@given(pairs=st.sets(pair, max_size=10), clean=st.sets(pair, max_size=14))
def test_exonerated_is_its_definition(pairs, clean):
    nodes = sorted({n for ab in pairs for n in ab})
    assert exonerated(pairs, clean, nodes) == exonerated_by_scan(pairs, clean, nodes)


@settings(max_examples=200, deadline=None)
@given(obs=st.lists(st.tuples(st.integers(0, 70), st.integers(-50, 50), st.booleans()), max_size=300),
       since=st.integers(-60, 60), window=st.integers(1, 6))
def test_link_windows_recent_counts_are_the_windows(obs, since, window):
    """The column copies count what the deques hold, through row growth and ring wrap."""
    lw = LinkWindows(LocalizeParams(window_ops=window, persist_ops=1))
    for link, end, slow in obs:
        lw.add(LinkObs(f"a/{link}", f"b/{link % 7}", slow, None, end))
    n_recent, n_slow = lw.recent(since)
    assert len(lw.keys) == len(lw.obs)
    for row, key in enumerate(lw.keys):
        win: deque[LinkObs] = lw.obs[key]
        recent = [o for o in win if o.end_ns >= since]
        assert (n_recent[row], n_slow[row]) == (len(recent), sum(o.slow for o in recent))
    assert isinstance(n_recent, np.ndarray)


@settings(max_examples=200, deadline=None)
@given(obs=st.lists(st.tuples(st.integers(0, 40), st.integers(-50, 50), st.booleans(),
                              st.sampled_from([0.0, 0.5, 1.0, 2.5, 7.0]), st.booleans()), max_size=300),
       since=st.integers(-60, 60), window=st.integers(1, 6), pick=st.integers(0, 2 ** 40))
def test_link_windows_clean_rates_are_the_windows(obs, since, window, pick):
    """The clean links' rate bounds (:func:`.rules.links.shown_rates`) read from the column
    copies are the per-observation scan they replace."""
    lw = LinkWindows(LocalizeParams(window_ops=window, persist_ops=1))
    for link, end, slow, rate, shared in obs:
        lw.add(LinkObs(f"a/{link}", f"b/{link % 7}", slow, None, end, rate_lo=rate, shared=shared))
    keys = [k for i, k in enumerate(lw.keys) if pick >> (i % 40) & 1]
    want_lo, want_in = {}, {}
    for key in keys:
        recent = [o for o in lw.obs[key] if not o.slow and o.end_ns >= since and o.rate_lo > 0]
        if recent:
            want_lo[key] = max(o.rate_lo for o in recent)
            want_in[key] = max((o.rate_lo for o in recent if not o.shared), default=-1.0)
    assert lw.clean_rates(since, np.array([lw.row(k) for k in keys], np.int64)) == (want_lo, want_in)


@settings(max_examples=300, deadline=None)
@given(xs=st.lists(st.floats(-1e15, 1e15) | st.integers(-5, 5).map(float) | st.just(float("nan")), max_size=600))
def test_mad_is_numpys_median_of_deviations(xs):
    from pulse.localization.robust import mad

    x = np.array(xs, dtype=np.float64)
    want = float(np.median(np.abs(x - np.median(x)))) if x.size else float("nan")
    got = mad(x)
    assert got == want or (got != got and want != want)


def _send(rank: int, node: str, seq: int, nics: list[str] | None = None):
    from pulse.records import OpMetrics

    return OpMetrics(job="j", node=node, comm_id="pp", seq=seq, rank=rank, kind="Send", nranks=2,
                     start_ns=1000 * seq, end_ns=1000 * seq + 500, duration_ns=500, act_ns=500, volume_bytes=8,
                     expected_bytes=8, complete=True, active_rate=1.0, flows=1, epoch_ns=100, nics=nics)


def test_cached_endpoints_follow_the_membership():
    """The per-rank endpoint cache is dropped when a flow binding or a comm event changes
    what the endpoints derive from: the view is the one an uncached localizer builds."""
    from pulse.localization import Localizer

    from pulse.events import CommEvent, FlowEvent

    loc = Localizer()
    a = _send(0, "n0", 1)
    before = loc._view("pp", 1, [a])
    assert before.endpoints == ["n0/pp:0"] and before.peer_eps == [()]
    loc.add_events([CommEvent(job="j", node="n0", comm_id="pp", rank=0, nranks=2, rings=[[0, 1]]),
                    CommEvent(job="j", node="n1", comm_id="pp", rank=1, nranks=2, rings=[[0, 1]])])
    loc.update([])
    assert loc._view("pp", 2, [a]).peer_eps == [("n1/pp:1",)]
    loc.update([_send(1, "n1", 4, ["mlx5_5"])])  # a record's own NIC, learnt from the record
    assert loc._view("pp", 5, [a]).peer_eps == [("n1/mlx5_5",)]
    loc.add_events([FlowEvent(job="j", node="n0", nic="mlx5_3", flow=7, comm_id="pp", rank=0, peer=1,
                              direction="send"),
                    FlowEvent(job="j", node="n1", nic="mlx5_3", flow=9, comm_id="pp", rank=1, peer=0,
                              direction="send")])
    after = loc._view("pp", 3, [a])
    fresh = Localizer()
    fresh.topo = loc.topo
    assert after.endpoints == fresh._view("pp", 3, [a]).endpoints == ["n0/mlx5_3"]
    assert after.peer_eps == fresh._view("pp", 3, [a]).peer_eps == [("n1/mlx5_3",)]
