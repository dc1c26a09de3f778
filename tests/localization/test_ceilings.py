"""Capacity ceilings (localization/ceilings.py): the busiest epoch of a rank's recent
records against its own first ones, and against the operator's other ranks."""

from __future__ import annotations

import pytest
from pulse.localization.ceilings import Ceilings
from pulse.localization.finding import ACT, CEILING
from pulse.localization.observations import OpView, judge
from pulse.localization.params import LocalizeParams
from pulse.localization.rules.host import host_shaped

from . import synth

LINE = 800_000  # bytes in one epoch at line rate


def _op(seq: int, peaks: list[int]) -> list:
    return [synth.record("dp0", seq, r, r, kind="AllReduce", nranks=len(peaks), start=seq * 10**7,
                         end=seq * 10**7 + 400_000, t_host=seq * 10**7, nic="mlx5_0", peak_epoch_bytes=pk)
            for r, pk in enumerate(peaks)]


def _run(ceil: Ceilings, ops: list[list[int]], shared=lambda i: False, peers: int = 1) -> list[dict]:
    return [ceil.capped("dp0", _op(s, pk), [peers] * len(pk), shared) for s, pk in enumerate(ops)]


def test_a_rank_pinned_below_its_own_and_its_peers_ceilings_is_capped():
    p = LocalizeParams()
    n = p.late_base_ops + p.ceiling_ops
    healthy = [[LINE - 10 * r for r in range(5)]] * p.late_base_ops
    # from here on rank 1's NIC carries at most 40 % of line rate; the others still burst
    # to it now and then (every other record), their quieter records far lower
    after = [[LINE if s % 2 else LINE // 3, int(0.4 * LINE), LINE, LINE // 2 if s % 2 else LINE, LINE]
             for s in range(p.ceiling_ops + 2)]
    got = _run(Ceilings(p), healthy + after)
    assert all(g == {} for g in got[:n - 1])  # not before a baseline and a full window
    assert got[n - 1] == {1: (pytest.approx(0.4 * LINE, abs=1), pytest.approx(LINE - 10, abs=1))}
    assert got[-1].keys() == {1}


def test_a_drop_every_rank_shares_is_no_cap_and_a_rank_paced_above_the_lowest_is_none():
    p = LocalizeParams()
    base = [[LINE] * 5] * p.late_base_ops
    # the whole job's busiest epochs fall alike (smaller buckets): nobody
    got = _run(Ceilings(p), base + [[LINE // 3] * 5] * p.ceiling_ops)
    assert got[-1] == {}
    # rank 1 capped at 40 %; rank 2 forwards what rank 1 sends, paced at 1.2x the cap:
    # only the lowest ceiling, flat in its window, is the cap
    got = _run(Ceilings(p), base + [[LINE, int(0.4 * LINE), int(0.48 * LINE), LINE, LINE]] * p.ceiling_ops)
    assert got[-1].keys() == {1}


def test_a_relay_or_a_record_sharing_its_nic_is_not_judged_by_its_ceiling_nor_any_when_off():
    p = LocalizeParams()
    ops = [[LINE] * 5] * p.late_base_ops + [[LINE, int(0.4 * LINE), LINE, LINE, LINE]] * p.ceiling_ops
    assert _run(Ceilings(p), ops, shared=lambda i: i == 1)[-1] == {}
    # a relay (several peers at once) forwards at its inputs' pace: not judged
    assert _run(Ceilings(p), ops, peers=3)[-1] == {}
    assert _run(Ceilings(LocalizeParams(ceiling_ops=0)), ops)[-1] == {}


def test_capped_records_mark_their_links_slow_by_capacity_which_no_host_rule_reads():
    p = LocalizeParams()
    recs = _op(30, [LINE] * 4)
    eps = [f"{synth.node(r)}/mlx5_0" for r in range(4)]
    view = OpView("dp0", 30, "AllReduce", {r: synth.node(r) for r in range(4)}, recs, eps,
                  [(eps[(r + 1) % 4],) for r in range(4)], [False] * 4)
    j = judge(view, p, 320_000.0, None, (), {1: (0.4 * LINE, float(LINE))})
    slow = [lk for lk in j.links if lk.slow]
    assert [(lk.src, lk.dst) for lk in slow] == [(eps[1], eps[2])]
    f = slow[0].finding
    assert (f.kind, f.metric, f.value, f.peers) == (ACT, CEILING, 0.4 * LINE, float(LINE))
    assert not f.timing_only()
    # a capped NIC's sends on several NICs are no starved host's (late posts keep the height
    # of their busiest epochs): the host rule's excess reads timing alone
    assert not host_shaped({(f"{synth.node(1)}/mlx5_{k}", eps[2]): [f] for k in range(4)}, p, synth.node(1))


def _ring_view(seq: int, acts: list[int]) -> tuple[OpView, list[str]]:
    recs = [synth.record("dp0", seq, r, r, kind="AllReduce", nranks=len(acts), start=seq * 10**7,
                         end=seq * 10**7 + a, t_host=seq * 10**7, nic="mlx5_0", act=a, peak_epoch_bytes=LINE)
            for r, a in enumerate(acts)]
    n = len(acts)
    eps = [f"{synth.node(r)}/mlx5_0" for r in range(n)]
    return OpView("dp0", seq, "AllReduce", {r: synth.node(r) for r in range(n)}, recs, eps,
                  [(eps[(r + 1) % n],) for r in range(n)], [False] * n), eps


def test_ring_ranks_paced_by_a_capped_rank_are_not_blamed_beyond_what_the_cap_explains():
    """Sweep 229 #9: a NIC at 39 % in an 11-rank ring at 96 us epochs; every rank's ACT
    stretched to 33-34 epochs against 15, and which of them landed in the top epoch was
    quantisation: ranks 0, 8, 9 and 10 as often as the capped ranks 6 and 7, and their links
    were named a path. A collective goes at its slowest link's pace: with a rank's ceiling
    fallen in the operator, the ranks it paces are clean up to as far as the cap slows them."""
    p = LocalizeParams()
    e = synth.EPOCH
    ref = 15.0 * e
    cap = {1: (0.4 * LINE, float(LINE))}  # rank 1 capped at 40 %: up to 2.5x the reference
    view, eps = _ring_view(60, [33 * e, 34 * e, 33 * e, 34 * e])
    j = judge(view, p, ref, None, (), cap)
    assert [(lk.src, lk.slow) for lk in j.links if not lk.paced] == [(eps[1], True)]
    assert {f.rank for f in j.findings} == {1}
    # what they carried is still a rate their NICs reached
    assert [lk.src for lk in j.paced] == [eps[0], eps[2], eps[3]]
    # and their windows get a paced observation, neither slow nor clean, that ages out
    # what they held from before the cap was known (sweep 257 #23)
    assert [(lk.src, lk.slow) for lk in j.links if lk.paced] == [(eps[0], False), (eps[2], False), (eps[3], False)]
    # without the cap, every rank in the top epoch is blamed as before
    j = judge(view, p, ref, None, (), {})
    assert {f.rank for f in j.findings} == {0, 1, 2, 3}
    # a rank slowed past what the cap explains (2.5x the reference, an epoch either way) is
    # slow by its own timing still
    view, eps = _ring_view(61, [33 * e, 34 * e, 33 * e, 45 * e])
    j = judge(view, p, ref, None, (), cap)
    assert {f.rank for f in j.findings} == {1, 3}
    assert [lk.src for lk in j.links if lk.slow] == [eps[1], eps[3]]


def test_ring_ranks_paced_by_resending_ranks_are_not_blamed_beyond_their_act():
    """Sweep 239 #19: 1.7 % loss at node-03's NIC in a 4-rank ring; ranks 0 and 1 at 11-13
    epochs with the resending ranks 2 and 3 (6 before), their links 0->1 and 1->2 slow by
    timing, and node-01 grouped with node-03 as a path. A ring waits on its lossy link as
    on a capped one."""
    import dataclasses

    p = LocalizeParams()
    e = synth.EPOCH
    ref = 6.0 * e
    view, eps = _ring_view(70, [12 * e, 13 * e, 12 * e, 13 * e])
    for r in (2, 3):
        view.recs[r] = dataclasses.replace(view.recs[r], volume_bytes=int(1.4 * view.recs[r].expected_bytes))
    j = judge(view, p, ref, None, (), {})
    assert {f.rank: f.metric for f in j.findings} == {2: "volume_ratio", 3: "volume_ratio"}
    assert sorted(lk.src for lk in j.links if lk.slow) == [eps[2], eps[3]]
    assert sorted(lk.src for lk in j.paced) == [eps[0], eps[1]]
    # slower than the resending ranks (an epoch either way): its own timing
    view, eps = _ring_view(71, [16 * e, 13 * e, 12 * e, 13 * e])
    view.recs[2] = dataclasses.replace(view.recs[2], volume_bytes=int(1.4 * view.recs[2].expected_bytes))
    j = judge(view, p, ref, None, (), {})
    assert {f.rank: f.metric for f in j.findings} == {0: "act_ns", 2: "volume_ratio"}


def test_burst_is_at_most_one_for_a_record_held_to_one_rate_and_above_for_bursts():
    import math

    from pulse.localization.finding import burst_of

    e = 100.0
    # ten active epochs: eight full at the cap, the first and last half full
    assert burst_of(1000.0, 9000.0, 10 * e, e) <= 1.0
    # the same bytes in bursts: its busiest epoch twice its mean
    assert burst_of(1800.0, 9000.0, 10 * e, e) > 1.0
    # too few epochs, or no busiest epoch, to tell
    assert math.isnan(burst_of(1000.0, 3000.0, 3 * e, e)) and math.isnan(burst_of(None, 9000.0, 10 * e, e))


def test_a_rank_whose_busiest_epochs_fell_with_a_bursty_input_is_not_capped():
    """Sweep 197 #8: a ring downstream of a host starved of CPU forwards in bursts as the
    chunks come; four ranks' busiest epochs fell below their peers' (1.8-2.1 of the flat
    bound a NIC held to one rate shows) and were taken as capped. A capped NIC moves the
    same bytes in every epoch (0.98-1.08 of the bound, its rate varying by a few percent)."""
    p = LocalizeParams()
    e = synth.EPOCH

    def op(seq: int, peaks: list[int], act1: int) -> list:
        return [synth.record("dp0", seq, r, r, kind="AllReduce", nranks=len(peaks), start=seq * 10**7,
                             end=seq * 10**7 + 400_000, t_host=seq * 10**7, nic="mlx5_0", peak_epoch_bytes=pk,
                             act=act1 if r == 1 else 10 * e)
                for r, pk in enumerate(peaks)]

    def last(act1: int) -> dict:
        ceil = Ceilings(p)
        ops = [op(s, [LINE] * 5, 10 * e) for s in range(p.late_base_ops)]
        ops += [op(p.late_base_ops + s, [LINE, int(0.4 * LINE), LINE, LINE, LINE], act1) for s in range(p.ceiling_ops)]
        return [ceil.capped("dp0", o, [1] * 5, lambda i: False) for o in ops][-1]

    # 8 MiB in 28 active epochs at 0.4 of line rate at most: every epoch full, flat
    assert last(28 * e).keys() == {1}
    # the same busiest epoch over 40 active epochs: 1.45 of the flat bound, bursts
    assert last(40 * e) == {}


def test_paced_observations_age_a_window_and_show_neither_slowness_nor_health():
    import numpy as np
    from pulse.localization.evidence import LinkWindows
    from pulse.localization.finding import LinkObs

    p = LocalizeParams()
    w = LinkWindows(p)
    key = ("n0/mlx5_0", "n1/mlx5_0")
    for t in range(7):  # slow by timing at a cap's onset, before the ceilings knew it
        w.add(LinkObs(*key, True, None, 1000 + t, 1.0, 2.0))
    assert key in w.hot and w.slow_count[key] == 7
    for t in range(p.window_ops):
        w.add(LinkObs(*key, False, None, 2000 + t, 5.0, 6.0, paced=True))
    assert key not in w.hot and w.slow_count[key] == 0 and w.n_slow == 0
    n_recent, n_slow = w.recent(0)
    assert n_recent.tolist() == [0] and n_slow.tolist() == [0]  # not seen clean
    assert w.clean_rates(0, np.array([w.row(key)], np.int64)) == ({}, {})  # no rate shown clean


def test_a_rank_whose_records_are_too_short_to_show_their_flatness_is_not_judged_by_its_ceiling():
    """Sweep 293 #10: 3.9 MB ring sends of 2-3 active epochs at 128 us, paced by switch
    congestion elsewhere in the ring; node-00's busiest epochs each held half its bytes, 0.61
    of its baseline (a lucky record near one epoch at line rate) and below its peers', and it
    was named network-slow. Under four active epochs a record's flatness cannot be judged,
    so a cap cannot be told from a pace set upstream; a cap stretches its records until it
    can (rank 1 below at 0.4 of line rate: four epochs, the two inner ones full at the cap)."""
    p = LocalizeParams()
    e = synth.EPOCH
    nbytes = int(1.2 * LINE)

    def op(seq: int, peaks: list[int], act1: int) -> list:
        return [synth.record("dp0", seq, r, r, kind="AllReduce", nranks=len(peaks), start=seq * 10**7,
                             end=seq * 10**7 + 400_000, t_host=seq * 10**7, nic="mlx5_0", peak_epoch_bytes=pk,
                             act=act1 if r == 1 else 10 * e, nbytes=nbytes if r == 1 else 8 << 20)
                for r, pk in enumerate(peaks)]

    def last(peak1: int, act1: int) -> dict:
        ceil = Ceilings(p)
        ops = [op(s, [LINE] * 5, 2 * e) for s in range(p.late_base_ops)]
        ops += [op(p.late_base_ops + s, [LINE, peak1, LINE, LINE, LINE], act1) for s in range(p.ceiling_ops)]
        return [ceil.capped("dp0", o, [1] * 5, lambda i: False) for o in ops][-1]

    # two or three active epochs, each with about half the bytes: flat or paced, unknown
    assert last(nbytes // 2, 2 * e) == {} and last(nbytes // 2, 3 * e) == {}
    # the same bytes held to 0.4 of line rate: four epochs, two of them whole and at the cap
    assert last(int(0.4 * LINE), 4 * e).keys() == {1}


def _send(comm: str, seq: int, pk: int, kind: str = "Send") -> list:
    return [synth.record(comm, seq, 0, 1, kind=kind, nranks=2, start=seq * 10**7, end=seq * 10**7 + 400_000,
                         t_host=seq * 10**7, nic="mlx5_0", peak_epoch_bytes=pk)]


def test_a_lone_sender_whose_ceiling_fell_below_the_jobs_is_capped():
    # sweep 307 #10: 4 nodes in two pipeline stages, every communicator of two ranks; the
    # pairs on the links of a NIC capped at 0.295 fell from 6.3 to 1.94 MB per epoch, the
    # job's other pairs held. A pipeline send has no other rank to compare with: the job's
    # other communicators are the control (their short records count for the level only)
    p = LocalizeParams()
    steps = p.late_base_ops + p.ceiling_ops + 1  # one more: the others' windows fill after pp0's
    ceil = Ceilings(p)
    comms = [f"pp{k}" for k in range(8)]
    got = {}
    for s in range(steps):
        after = s >= p.late_base_ops
        for c in comms:
            pk = int(0.3 * LINE) if after and c == "pp0" else LINE
            got[c] = ceil.capped(c, _send(c, s, pk), [1], lambda i: False)
    assert got["pp0"] == {0: (pytest.approx(0.3 * LINE, abs=1), pytest.approx(LINE, abs=1))}
    assert all(got[c] == {} for c in comms[1:])
    # every communicator's ceiling fell alike (smaller buckets): nobody
    ceil = Ceilings(p)
    for s in range(steps):
        for c in comms:
            got[c] = ceil.capped(c, _send(c, s, int(0.3 * LINE) if s >= p.late_base_ops else LINE), [1],
                                 lambda i: False)
    assert all(g == {} for g in got.values())
    # too few other communicators to say where the job stands: nobody
    ceil = Ceilings(p)
    for s in range(steps):
        for c in comms[:3]:
            pk = int(0.3 * LINE) if s >= p.late_base_ops and c == "pp0" else LINE
            got[c] = ceil.capped(c, _send(c, s, pk), [1], lambda i: False)
    assert got["pp0"] == {}
