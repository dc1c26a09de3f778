"""Lateness (localization/rules/late.py) on hand-fed lateness windows, waits and
previous-operator ends."""

from __future__ import annotations

from pulse.localization.finding import LATE
from pulse.localization.rules.late import late_explained, late_findings, late_hypotheses

from . import synth
from .findings import MS, evidence, finding

A, B, C = (synth.node(i) for i in range(3))


def late(node: str, comm: str = "c0", seq: int = 0):
    return finding(LATE, node, comm=comm, seq=seq, value=MS, ref=20 * MS, metric="issue_to_end_ns")


def fill(ev, node: str, comm: str, n: int = 16, late_every: int = 1) -> None:
    for i in range(n):
        ev.late.add(node, comm, late(node, comm, i) if late_every and i % late_every == 0 else None)


def test_a_node_late_in_most_of_its_communicators_is_compute_slow():
    ev, p = evidence()
    fill(ev, A, "c0")
    fill(ev, A, "c1")
    fill(ev, B, "c0", late_every=0)
    got = late_hypotheses(ev, p, set(), set())
    assert list(got) == [("compute-slow", (A,))]
    assert len(got[("compute-slow", (A,))].findings) == 32


def test_late_in_one_communicator_of_two_is_not_enough():
    ev, p = evidence()
    fill(ev, A, "c0")
    fill(ev, A, "c1", late_every=0)
    assert late_hypotheses(ev, p, set(), set()) == {}


def test_now_and_then_late_is_not_persistent():
    ev, p = evidence()
    fill(ev, A, "c0", late_every=2)  # half the window, below late_frac
    assert late_hypotheses(ev, p, set(), set()) == {}


def test_windows_late_half_the_time_are_no_evidence_of_punctuality():
    # sweep 11 #0 (gpu-slow x1.31, 128 us epochs): late in every all-to-all, in half of
    # the data-parallel operators, where its lateness sits at the two-epoch floor
    ev, p = evidence()
    for c in ("ep0", "ep1"):
        fill(ev, A, c)
    for c in ("dp0", "dp1"):
        fill(ev, A, c, late_every=2)
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (A,))]
    # late in half the operators of every communicator: not persistent anywhere
    ev, p = evidence()
    for c in ("ep0", "ep1", "dp0", "dp1"):
        fill(ev, A, c, late_every=2)
    assert late_hypotheses(ev, p, set(), set()) == {}
    # and on time in the communicators it was not late in all along still counts against it
    ev, p = evidence()
    for c in ("ep0", "ep1"):
        fill(ev, A, c)
    fill(ev, A, "dp0", late_every=2)
    fill(ev, A, "dp1", late_every=0)
    assert late_hypotheses(ev, p, set(), set()) == {}


def test_a_window_less_than_half_full_does_not_count_yet():
    ev, p = evidence()
    fill(ev, A, "c0", n=7)
    assert late_hypotheses(ev, p, set(), set()) == {}
    ev, p = evidence(late_min_fill=0.25)
    fill(ev, A, "c0", n=7)
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (A,))]


def test_a_node_that_waits_for_its_pipeline_peers_more_than_usual_is_their_victim():
    ev, p = evidence()
    fill(ev, A, "c0")
    for _ in range(3):
        ev.late.add_wait(A, 5 * MS)
    for _ in range(5):
        ev.late.add_wait(B, MS)
    assert late_hypotheses(ev, p, set(), set()) == {}
    ev, p = evidence()
    fill(ev, A, "c0")
    for _ in range(3):
        ev.late.add_wait(A, MS)  # waits as usual: still the straggler
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (A,))]


def test_the_pipeline_peer_of_a_blamed_node_and_blamed_nodes_are_not_stragglers():
    ev, p = evidence()
    ev.topo.add(synth.comm_events("pp", [0, 2], ["mlx5_0", "mlx5_0"], 1))
    fill(ev, A, "c0")
    assert late_hypotheses(ev, p, set(), {C}) == {}    # an open incident on C
    assert late_hypotheses(ev, p, {C}, set()) == {}    # this round's other rules blame C
    assert late_hypotheses(ev, p, {A}, set()) == {}
    ev.insufficient.add(A)
    assert late_hypotheses(ev, p, set(), set()) == {}


def _gap_case(own_prev_end: int, pred_prev_end: int = 0, own_prev_issue: int = -10 * MS,
              pred_act: int = 320_000, **kw):
    ev, p, f, ordered = _gap_setup(own_prev_end, pred_prev_end, own_prev_issue, pred_act, **kw)
    return late_explained(ev, p, "c0", 5, f, ordered)


def _gap_setup(own_prev_end: int, pred_prev_end: int = 0, own_prev_issue: int = -10 * MS,
               pred_act: int = 320_000, **kw):
    """Rank 0 (ring c0 = 0 -> 1 -> ... -> 4) issues seq 5 at 55 ms, the others at 5 ms after
    their previous operators (issued at -10 ms) ended at 0; rank 0's previous (issued at
    ``own_prev_issue``) ended at ``own_prev_end`` and its ring predecessor's (rank 4, active
    ``pred_act``) at ``pred_prev_end``."""
    ev, p = evidence(**kw)
    ev.topo.add(synth.comm_events("c0", [0, 1, 2, 3, 4], ["mlx5_0"] * 5, 1))

    def prev(r: int, end: int, issue: int = -10 * MS, act: int = 320_000):
        return synth.record("c0", 4, r, r, kind="AllReduce", nranks=5, start=end - act, end=end, t_host=issue,
                            nic="mlx5_0", act=act)
    ev.late.prev.update({("c0", r): prev(r, 0) for r in range(1, 4)})
    ev.late.prev.update({("c0", 0): prev(0, own_prev_end, own_prev_issue),
                         ("c0", 4): prev(4, pred_prev_end, act=pred_act)})
    ordered = [synth.record("c0", 5, r, r, kind="AllReduce", nranks=5, start=60 * MS, end=61 * MS,
                            t_host=(55 if r == 0 else 5) * MS, nic="mlx5_0") for r in range(5)]
    f = finding(LATE, A, comm="c0", seq=5, rank=0, value=MS, ref=51 * MS, metric="issue_to_end_ns")
    return ev, p, f, ordered


def test_late_after_a_normal_gap_behind_a_late_previous_operator_waited_for_the_network():
    assert _gap_case(own_prev_end=50 * MS)
    assert _gap_case(own_prev_end=0, pred_prev_end=50 * MS)  # the last chunk came late from its predecessor
    # the rank was late into its previous operator too, and its predecessor's last chunk
    # came late over a slow wire (active all along): still the network
    assert _gap_case(own_prev_end=0, pred_prev_end=50 * MS, own_prev_issue=30 * MS, pred_act=50 * MS)


def test_a_predecessor_held_up_by_the_ranks_own_receive_window_is_no_excuse():
    # The rank issued its previous operator 40 ms after the others, and its predecessor's
    # sends into it ended 50 ms after the rank's own end with 0.32 ms of active time: they
    # sat waiting for the rank to drain them (a CPU-starved receiver), so its next lateness
    # after a long gap is its own.
    assert not _gap_case(own_prev_end=0, pred_prev_end=50 * MS, own_prev_issue=30 * MS)


def test_a_late_end_the_rank_made_itself_by_arriving_late_is_no_excuse():
    # Rank 0's previous operator ended 50 ms after the others' (the veto alone would call
    # its lateness a wait for that end), but the rank had arrived late into that operator
    # by its own compute gap: the late end was its own doing (lab, a rank at 5 % of a core
    # under DDP: the first bucket of each step excused this way, 11 of 16 late, healthy).
    ev, p, f, ordered = _gap_setup(own_prev_end=50 * MS)
    assert late_findings(ev, p, "c0", 5, {0: f}, ordered) == {}  # on time into seq 4: the network's
    ev.late.own[("c0", 0)] = 4
    assert late_findings(ev, p, "c0", 5, {0: f}, ordered) == {0: f}
    # one operator deep: a lateness kept that way does not keep the next one, so a network
    # victim's noise that once escaped the veto does not make its late ends its own
    assert ev.late.own[("c0", 0)] == 4
    ev.late.own[("c0", 0)] = 3
    assert late_findings(ev, p, "c0", 5, {0: f}, ordered) == {}
    # a lateness the veto does not explain is the rank's own, and recorded as such
    ev, p, f, ordered = _gap_setup(own_prev_end=0)
    assert late_findings(ev, p, "c0", 5, {0: f}, ordered) == {0: f} and ev.late.own[("c0", 0)] == 5


def test_late_after_a_long_compute_gap_is_its_own():
    assert not _gap_case(own_prev_end=0)
    assert not _gap_case(own_prev_end=50 * MS, late_gap_frac=0.0)  # veto off


def test_the_gap_veto_allows_for_the_clock_skew_bound():
    # rank 0's gap ends at its ring predecessor's end (another node's clock): 55 - 22 = 33 ms
    # against the others' 5 ms, 28 ms more for 50 ms of lateness. With clocks 1 ms apart that
    # is more than half the lateness plus two skews (27 ms): its own compute. With 3 ms it
    # may be the clocks: explained (no compute-slow blame).
    assert not _gap_case(own_prev_end=0, pred_prev_end=22 * MS, clock_skew_ns=MS)
    assert _gap_case(own_prev_end=0, pred_prev_end=22 * MS, clock_skew_ns=3 * MS)


def test_the_whole_pipeline_chain_of_a_blamed_node_waits_for_it():
    from pulse.localization.rules.late import waits_on

    # three stages: A (stage 0) <-> B (stage 1) <-> C (stage 2); D is another chain's
    ev, p = evidence()
    ev.topo.add(synth.comm_events("pp-s0", [0, 1], ["mlx5_0", "mlx5_0"], 1))
    ev.topo.add(synth.comm_events("pp-s1", [1, 2], ["mlx5_0", "mlx5_0"], 3))
    ev.topo.add(synth.comm_events("pp-x", [3, 4], ["mlx5_0", "mlx5_0"], 5))
    assert waits_on(ev, {C}) == {A, B}   # two hops away: late for the same reason
    assert waits_on(ev, {A}) == {B, C}
    assert waits_on(ev, {B}) == {A, C}
    assert waits_on(ev, set()) == set()
    fill(ev, A, "c0")
    assert late_hypotheses(ev, p, set(), {C}) == {}  # C's open incident explains A's lateness
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (A,))]


def test_a_node_whose_receives_from_one_rail_stall_waits_for_them():
    # B's sends into A's mlx5_1 ended 32 ms after the same operator on B's other NICs (a
    # flapping NIC on that link): A got that data 32 ms late, and its collectives are late
    # by as much - a victim of the link, not a compute straggler
    from pulse.localization.finding import RAIL

    from .findings import ep

    ev, p = evidence()
    fill(ev, A, "c0")
    fill(ev, A, "c1")
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (A,))]
    f = finding(RAIL, B, comm="pp", endpoint=ep(B, 1), value=32 * MS, ref=0.0, metric="end_after_other_nics_ns",
                to=(ep(A, 1),))
    ev.rail.records.append((f, frozenset({A, B})))
    assert late_hypotheses(ev, p, set(), set()) == {}


def test_the_pipeline_chain_of_a_rail_late_link_waits_for_it():
    # Sweep 337 #13: a NIC of node-00 in stage 0 of 4 flapping; its pipeline link with the
    # stage-1 node rail-late both ways (neither end named: nothing said which end stopped);
    # the stage-2 node of the same chain, two hops from the link, late into its
    # data-parallel operators: waiting for the stalled link as its neighbours do
    from pulse.localization.finding import RAIL

    from .findings import ep

    D = synth.node(3)
    ev, p = evidence()
    ev.topo.add(synth.comm_events("pp-s0", [0, 1], ["mlx5_0", "mlx5_0"], 1))
    ev.topo.add(synth.comm_events("pp-s1", [1, 2], ["mlx5_0", "mlx5_0"], 3))
    ev.topo.add(synth.comm_events("pp-x", [3, 4], ["mlx5_0", "mlx5_0"], 5))
    for node in (C, D):
        fill(ev, node, "c0")
        fill(ev, node, "c1")
    f = finding(RAIL, B, comm="pp-s0", endpoint=ep(B, 1), value=20 * MS, ref=0.0, metric="end_after_other_nics_ns",
                to=(ep(A, 1),))
    ev.rail.records.append((f, frozenset({A, B})))
    # C (stage 2 of the link's chain) waits; D, on another chain, is still a straggler
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (D,))]


def test_a_node_on_a_slowed_link_of_a_node_with_more_slowed_links_waits_for_it():
    # The lab agent e2e (200 Mbit on node-02's egress): node-02's links to all three peers
    # slow, and a peer on one of them late in most of its operators - a victim
    from .findings import ep, observe

    D = synth.node(3)
    ev, p = evidence()
    fill(ev, B, "c0")
    fill(ev, B, "c1")
    observe(ev, ep(A), ep(B), [True] * 8)
    # one slowed link: as many slowed peers at either end, no side to take
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (B,))]
    observe(ev, ep(A), ep(C), [True] * 8)
    observe(ev, ep(D), ep(A), [True] * 8)
    assert late_hypotheses(ev, p, set(), set()) == {}
    # the node its slowed links meet at stays a suspect: a starved rank slows its own sends
    # and receives, and its peers are the ones on one slowed link each
    ev, p = evidence()
    fill(ev, A, "c0")
    fill(ev, A, "c1")
    observe(ev, ep(A), ep(B), [True] * 8)
    observe(ev, ep(D), ep(A), [True] * 8)
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (A,))]
    # slow now and then is no slowed link
    ev, p = evidence()
    fill(ev, B, "c0")
    fill(ev, B, "c1")
    for dst in (B, C, D):
        observe(ev, ep(A), ep(dst), [True, False, False, False] * 2)
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (B,))]


def test_a_consistent_late_straggler_is_not_named_beside_a_fault_already_found():
    def consistent(ev):
        f = late(B, "dp0", 9)
        ev.late_stragglers.consistent["dp0"] = (B, [f])
        ev.late_stragglers.judged[B] = {"dp0"}

    ev, p = evidence()
    consistent(ev)
    assert list(late_hypotheses(ev, p, set(), set())) == [("compute-slow", (B,))]
    assert late_hypotheses(ev, p, {A}, set()) == {}
    assert late_hypotheses(ev, p, set(), {A}) == {}
