"""Rail skew (localization/rules/rail.py): sibling comparison on hand-fed records, and the
hypothesis from hand-built rail-late records."""

from __future__ import annotations

from pulse.localization.finding import RAIL
from pulse.localization.rules.rail import judge_rails, rail_hypotheses

from . import synth
from .findings import MS, ep, evidence, finding

A, B, C, D = (synth.node(i) for i in range(4))


def _rails(ev, n: int = 4) -> None:
    """n rail communicators r0.., each between A (rank 0) and B (rank 1), on NIC mlx5_k."""
    for k in range(n):
        ev.topo.add(synth.comm_events(f"r{k}", [0, 1], [f"mlx5_{k}"] * 2, 10 * k))


def _rec(k: int, end: int, t_host: int = 0):
    return synth.record(f"r{k}", 7, 0, 0, kind="AllReduce", nranks=2, start=end - MS, end=end, t_host=t_host,
                        nic=f"mlx5_{k}")


def _judge(ev, p, late_by: int, issued_apart: int = 0) -> None:
    _rails(ev)
    for k in (1, 2, 3):
        ev.rail.note_record(_rec(k, 10 * MS, t_host=issued_apart * k))
    r = _rec(0, 10 * MS + late_by)
    judge_rails(ev, p, "r0", [r], [ep(A)], [(ep(B),)])


def test_a_record_ending_long_after_its_siblings_on_other_nics_is_rail_late():
    ev, p = evidence()
    _judge(ev, p, p.rail_late_ns)
    assert [(f.kind, f.node, f.endpoint, f.value) for f, _m in ev.rail.records] == [
        (RAIL, A, ep(A), float(p.rail_late_ns))]
    assert ev.rail.records[0][1] == frozenset({A, B})


def test_a_record_ending_with_its_siblings_is_not():
    ev, p = evidence()
    _judge(ev, p, p.rail_late_ns - 1)
    assert not ev.rail.records


def test_records_issued_apart_are_not_siblings():
    ev, p = evidence()
    _judge(ev, p, p.rail_late_ns, issued_apart=p.rail_issue_ns + 1)
    assert not ev.rail.records


def _late(node: str, nic: int = 0, i: int = 0):
    t = i * 100 * MS
    return finding(RAIL, node, comm="r0", seq=i, endpoint=ep(node, nic), value=10 * MS, ref=0.0,
                   metric="end_after_other_nics_ns", start=t + 15 * MS, end=t + 20 * MS)


def test_the_node_in_every_rail_late_operator_on_one_nic_is_network_slow():
    ev, p = evidence()
    for i, other in enumerate((B, C, D)):
        ev.rail.records.append((_late(A, i=i), frozenset({A, other})))
    ev.last_end_ns = 300 * MS
    got = rail_hypotheses(ev, p, set())
    assert list(got) == [("network-slow", (A,))]
    assert got[("network-slow", (A,))].nics == [ep(A)]
    assert rail_hypotheses(ev, p, {A}) == {}  # another rule explains A


def test_rail_late_records_spread_over_the_nodes_nics_are_not_one_nic():
    ev, p = evidence()
    for i, other in enumerate((B, C, D)):
        ev.rail.records.append((_late(A, nic=i, i=i), frozenset({A, other})))
    assert rail_hypotheses(ev, p, set()) == {}


def test_old_or_too_few_rail_late_records_do_not_count():
    ev, p = evidence()
    for i, other in enumerate((B, C)):
        ev.rail.records.append((_late(A, i=i), frozenset({A, other})))
    assert rail_hypotheses(ev, p, set()) == {}
    ev.rail.records.append((_late(A, i=2), frozenset({A, D})))
    ev.last_end_ns = 300 * MS + p.rail_keep_ns
    assert rail_hypotheses(ev, p, set()) == {}
    assert len(ev.rail.records) == 0


def test_two_ends_the_one_moving_bytes_during_the_silence_was_up():
    def ev_with(alive: bool):
        ev, p = evidence()
        for i in range(4):
            ev.rail.records.append((_late(A if i % 2 else B, i=i), frozenset({A, B})))
            if alive:  # A's NIC moves bytes in another communicator inside the silent interval
                t = i * 100 * MS + 12 * MS
                ev.alive.note(synth.record("other", i, 0, 0, kind="AllReduce", nranks=2, start=t, end=t + MS // 2,
                                           t_host=t, nic="mlx5_0"))
        ev.last_end_ns = 400 * MS
        return ev, p
    ev, p = ev_with(True)
    got = rail_hypotheses(ev, p, set())
    assert list(got) == [("network-slow", (B,))]
    assert got[("network-slow", (B,))].extra["alive_during_stall"] == {ep(A): ["r0#0", "r0#1", "r0#2", "r0#3"]}
    ev, p = ev_with(False)
    # nothing says which end stopped: the pair would name a healthy node, so nobody is named
    assert rail_hypotheses(ev, p, set()) == {}


def test_stalled_sends_only_into_one_end_take_the_nics_they_went_to():
    # a flap phase-locked with the step catches only B's sends into A's mlx5_2: A has no late
    # record of its own, its end of the stalled links is the NIC they were sent to
    def ev_with(alive: bool, into: list[int]):
        ev, p = evidence()
        for i, nic in enumerate(into):
            f = _late(B, i=i)
            f.peer_eps = (ep(A, nic),)
            ev.rail.records.append((f, frozenset({A, B})))
            if alive:  # B's NIC moves bytes in another communicator inside the silent interval
                t = i * 100 * MS + 12 * MS
                ev.alive.note(synth.record("other", i, 1, 1, kind="AllReduce", nranks=2, start=t, end=t + MS // 2,
                                           t_host=t, nic="mlx5_0"))
        ev.last_end_ns = 400 * MS
        return ev, p
    ev, p = ev_with(True, [2, 2, 2, 2])
    got = rail_hypotheses(ev, p, set())
    assert list(got) == [("network-slow", (A,))] and got[("network-slow", (A,))].nics == [ep(A, 2)]
    assert rail_hypotheses(*ev_with(False, [2, 2, 2, 2]), set()) == {}
    assert rail_hypotheses(*ev_with(True, [0, 1, 2, 3]), set()) == {}  # into all of A's NICs: not one NIC


def test_rail_late_records_on_a_nic_an_open_incident_blames_are_its_doing():
    # A's NIC flaps and is blamed; B, its link partner, has late records as often as A (the
    # flap holds both ends' sends). One stray late record elsewhere (B and C) would leave B
    # the only node common to all: the records on A's blamed NIC are A's doing, and what is
    # left is too little to name anyone.
    ev, p = evidence()
    for i in range(6):
        f = _late(B, i=i) if i % 2 else _late(A, i=i)
        f.peer_eps = (ep(A),) if i % 2 else (ep(B),)
        ev.rail.records.append((f, frozenset({A, B})))
    ev.rail.records.append((_late(C, i=6), frozenset({B, C})))
    ev.last_end_ns = 700 * MS
    assert list(rail_hypotheses(ev, p, set())) == [("network-slow", (B,))]  # the stray record decides
    assert rail_hypotheses(ev, p, set(), {ep(A)}) == {}


# -- all-to-alls (MoE): per-peer rail skew ---------------------------------------------------

NODES4 = (A, B, C, D)


def _a2a(k: int, rank: int, *, end: int, act: int = 320_000, late_to: dict[int, int] | None = None,
         nbytes: int = 8 << 20):
    """Rank ``rank`` (on node ``rank``) of the all-to-all on rail ``k`` (4 ranks, one per node),
    started at 9 ms: its last byte to each peer left at ``end``, or at ``late_to[peer]``."""
    start = 9 * MS
    peers = [q for q in range(4) if q != rank]
    done = [(late_to or {}).get(q, end) - start for q in peers]
    return synth.record(f"a{k}", 7, rank, rank, kind="GroupP2P", nranks=4, start=start, end=start + max(done),
                        t_host=0, nic=f"mlx5_{k}", act=act, nbytes=nbytes, peer_ranks=peers, peer_done_ns=done,
                        peer_bytes=[nbytes // 3] * 3, peer_expected_bytes=[nbytes // 3] * 3)


def _judge_a2a(ev, p, rank: int, *, late_to: dict[int, int], act: int = 320_000) -> None:
    """Rank ``rank``'s all-to-all on rail 0 judged against the same operator on rails 1-3
    (which moved other byte counts, as expert routing does) of its node."""
    for k in range(4):
        ev.topo.add(synth.comm_events(f"a{k}", [0, 1, 2, 3], [f"mlx5_{k}"] * 4, 10 * k))
    for k in (1, 2, 3):
        ev.rail.note_record(_a2a(k, rank, end=10 * MS, nbytes=(4 + k) << 20))
    ordered = [_a2a(0, r, end=10 * MS, late_to=late_to if r == rank else None, act=act if r == rank else 320_000)
               for r in range(4)]
    for r in ordered:
        ev.rail.note_record(r)
    judge_rails(ev, p, "a0", ordered, [ep(n) for n in NODES4], [tuple(ep(m) for m in NODES4 if m != n) for n in NODES4])


def test_an_all_to_all_silent_toward_one_peer_implicates_that_peer_only():
    ev, p = evidence()
    _judge_a2a(ev, p, 0, late_to={1: 10 * MS + p.rail_late_ns})
    [(f, members)] = list(ev.rail.records)
    assert (f.node, f.endpoint, f.metric, f.peer_eps) == (A, ep(A), "silent_after_other_nics_ns", (ep(B),))
    assert members == frozenset({A, B})  # not the whole communicator


def test_an_all_to_all_late_by_its_own_extra_bytes_is_not_rail_late():
    ev, p = evidence()
    # as late, but active all that time: a NIC moving more bytes, not a NIC that was down
    _judge_a2a(ev, p, 0, late_to={1: 10 * MS + p.rail_late_ns}, act=320_000 + p.rail_late_ns)
    assert not ev.rail.records


def test_an_all_to_all_ending_with_its_siblings_is_not_rail_late():
    ev, p = evidence()
    _judge_a2a(ev, p, 0, late_to={1: 10 * MS + p.rail_late_ns - 1})
    assert not ev.rail.records


def test_the_nic_every_stalled_all_to_all_has_in_common_is_network_slow():
    # B's mlx5_0 is down for a while: its own exchanges with everyone stall, and so does
    # each peer's exchange with it
    ev, p = evidence()
    late = 10 * MS + 5 * MS
    _judge_a2a(ev, p, 1, late_to={0: late, 2: late, 3: late})
    for rank in (0, 2, 3):
        _judge_a2a(ev, p, rank, late_to={1: late})
    assert [sorted(m) for _f, m in ev.rail.records] == [[A, B, C, D], [A, B], [B, C], [B, D]]
    ev.last_end_ns = late
    got = rail_hypotheses(ev, p, set())
    assert list(got) == [("network-slow", (B,))] and got[("network-slow", (B,))].nics == [ep(B)]


def test_peers_waiting_for_a_late_issuer_name_nobody():
    # B's GPU issues its all-to-all late (not a sibling of its other rails): every peer's
    # exchange with B waits for B's receives, but B's own sends never stall. From the
    # peers' side this is what a down NIC looks like; without a late record of B's own,
    # nobody is named (a NIC fault stalls its own sends too).
    ev, p = evidence()
    for rank in (0, 2, 3):
        _judge_a2a(ev, p, rank, late_to={1: 15 * MS})
    ev.last_end_ns = 15 * MS
    assert len(ev.rail.records) == 3
    assert rail_hypotheses(ev, p, set()) == {}


def test_a_peer_that_entered_late_is_not_kept_waiting_by_the_late_rail():
    # sweep 269 #0: B computing at 1/1.43, ~63 ms late into every operator; A, its parent in
    # one rail's tree, ended there long after its other rails, and that late record excused
    # B as its receiver (rules/late.py: waits_on_rail) - B's lateness was never named
    def judged(rise_b: float) -> tuple:
        ev, p = evidence()
        _rails(ev)
        for k in (1, 2, 3):
            ev.rail.note_record(_rec(k, 10 * MS))
        a = _rec(0, 10 * MS + 3 * p.rail_late_ns)
        b = synth.record("r0", 7, 1, 0, kind="AllReduce", nranks=2, start=9 * MS, end=10 * MS, t_host=0, nic="mlx5_0")
        judge_rails(ev, p, "r0", [a, b], [ep(A), ep(B)], [(ep(B),), (ep(A),)], {0: 0.0, 1: rise_b}, noise=2 * MS)
        return tuple(f.peer_eps for f, _m in ev.rail.records)

    assert judged(60 * MS) == ((),)  # the rail waited for B: B waited for nothing
    assert judged(MS) == ((ep(B),),)  # B entered on time: it got its data that late
