"""A collective's first byte against its siblings on the node's other NICs
(localization/rules/rail.py: ``_judge_first_bytes``, ``blocked_by``): a NIC down while an
operator is issued, named from which ranks could not send."""

from __future__ import annotations

import pytest
from pulse.localization.evidence import SILENT_START_METRIC
from pulse.localization.rules.rail import blocked_by, judge_rails, rail_hypotheses

from pulse.events import CommEvent

from . import synth
from .findings import MS, ep, evidence

N = 6
ISSUE = 100 * MS


def test_a_ring_blocks_the_down_rank_and_the_rank_sending_to_it():
    assert blocked_by(3, [[0, 1, 2, 3, 4, 5]]) == {2, 3}
    assert blocked_by(3, [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]) == {2, 3}
    # channels on different ring orders: no other rank sends to 3 alone
    assert blocked_by(3, [[0, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0]]) == {3}


def test_a_tree_blocks_the_down_rank_its_children_and_its_ancestors():
    #        0
    #      1   2
    #     3 4   5
    parent = {0: -1, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2}
    assert blocked_by(1, {0: parent}) == {0, 1, 3, 4}
    assert blocked_by(5, {0: parent}) == {0, 2, 5}
    # a second tree (another channel) rooted elsewhere: only what both trees block
    other = {5: -1, 4: 5, 3: 5, 2: 4, 1: 4, 0: 3}
    assert blocked_by(1, {0: parent, 1: other}) == {1, 4}
    assert blocked_by(9, {0: parent}) == set()
    # a parent map that loops (a garbled comm event) ends: the walk stops where it started
    assert blocked_by(1, {0: {0: 1, 1: 0}}) == {0, 1}
    assert blocked_by(0, {0: {0: 5, 1: 0}}) == {0, 1, 5}  # a parent outside the map ends the walk there


def _evidence(rings: list[list[int]] | None = None, trees: list[dict[int, int]] | None = None):
    """r0..r3: one communicator per rail over N nodes (rank r on node r); r0's comm events
    carry ``rings`` (default: one order) or ``trees`` (channel parents)."""
    ev, p = evidence()
    for k in range(4):
        ev.topo.add(synth.comm_events(f"r{k}", list(range(N)), [f"mlx5_{k}"] * N, 100 * k))
    ev.topo.rings.pop("r0")
    ev.topo.add([CommEvent(job="job", node=synth.node(r), comm_id="r0", rank=r, nranks=N, pid=1,
                           rings=rings if trees is None else None,
                           trees=None if trees is None else [[r, t[r], -1, -1, -1] for t in trees])
                 for r in range(N)])
    return ev, p


def _judge(ev, p, late: dict[int, int], rises: dict[int, float] | None = None, noise: float = 0.0) -> None:
    """Every rank issues at ISSUE; its siblings send at once, its r0 record after ``late``;
    ``rises``/``noise``: how late each rank entered r0 (:func:`judge_rails`)."""
    recs = []
    for r in range(N):
        for k in (1, 2, 3):
            ev.rail.note_record(synth.record(f"r{k}", 7, r, r, kind="AllReduce", nranks=N, start=ISSUE,
                                             end=ISSUE + 2 * MS, t_host=ISSUE, nic=f"mlx5_{k}"))
        lag = late.get(r, 0)
        recs.append(synth.record("r0", 7, r, r, kind="AllReduce", nranks=N, start=ISSUE + lag,
                                 end=ISSUE + 2 * MS + max(late.values()), t_host=ISSUE, nic="mlx5_0"))
    judge_rails(ev, p, "r0", recs, [ep(synth.node(r)) for r in range(N)],
                [(ep(synth.node((r + 1) % N)),) for r in range(N)], rises, noise)


def _silent(ev) -> list[tuple[str, frozenset[str]]]:
    return [(f.node, m) for f, m in ev.rail.records if f.metric == SILENT_START_METRIC]


def test_the_down_rank_and_its_ring_predecessor_late_name_the_down_rank():
    ev, p = _evidence(rings=[list(range(N))])
    _judge(ev, p, {2: 20 * MS, 3: 20 * MS})
    assert _silent(ev) == [(synth.node(3), frozenset({synth.node(3)}))]


def test_rings_on_different_orders_leave_the_down_rank_late_alone():
    ev, p = _evidence(rings=[list(range(N)), list(reversed(range(N)))])
    _judge(ev, p, {3: 20 * MS})
    assert _silent(ev) == [(synth.node(3), frozenset({synth.node(3)}))]
    ev, p = _evidence(rings=[list(range(N))])
    _judge(ev, p, {3: 20 * MS})  # one ring order: rank 2 would be late with a down rank 3
    assert _silent(ev) == []


def test_the_down_tree_rank_late_with_its_children_and_ancestors():
    parent = {0: -1, 1: 0, 2: 0, 3: 1, 4: 1, 5: 2}
    ev, p = _evidence(trees=[parent])
    _judge(ev, p, {0: 20 * MS, 2: 20 * MS, 5: 20 * MS})
    assert _silent(ev) == []  # one tree: a down leaf 5 and a down parent 2 block the same ranks
    other = {5: -1, 4: 5, 3: 5, 2: 4, 1: 4, 0: 3}
    ev, p = _evidence(trees=[parent, other])  # two trees (channels) tell them apart
    _judge(ev, p, {2: 20 * MS, 5: 20 * MS})
    assert _silent(ev) == [(synth.node(2), frozenset({synth.node(2)}))]
    ev, p = _evidence(trees=[parent, other])
    _judge(ev, p, {5: 20 * MS})
    assert _silent(ev) == [(synth.node(5), frozenset({synth.node(5)}))]


@pytest.mark.parametrize("late", [
    {1: 20 * MS, 4: 20 * MS},  # two ranks no single down NIC explains
    {3: 2 * MS - 1},  # within the bound (rail_late_ns)
    {r: 20 * MS for r in range(4)},  # most of the operator late: the rail as a whole waited
])
def test_late_sets_no_single_down_nic_explains_name_nobody(late):
    ev, p = _evidence(rings=[list(range(N)), list(reversed(range(N)))])
    _judge(ev, p, late)
    assert _silent(ev) == []


def _with_end_late(ev) -> None:
    """Three ring-wide end-late records of rail 0."""
    from pulse.localization.finding import RAIL, Finding
    everyone = frozenset(synth.node(r) for r in range(N))
    for i in range(3):
        f = Finding(RAIL, "r0", 8 + i, 0, synth.node(0), ep(synth.node(0)), float(20 * MS), 0.0,
                    "end_after_other_nics_ns", ISSUE + (i + 1) * 30 * MS, ISSUE + (i + 1) * 30 * MS + MS, ())
        ev.rail.records.append((f, everyone))
    ev.last_end_ns = ISSUE + 200 * MS


def test_a_silent_start_narrows_ring_wide_stalls_to_its_node():
    ev, p = _evidence(rings=[list(range(N)), list(reversed(range(N)))])
    _judge(ev, p, {3: 20 * MS})
    _with_end_late(ev)
    got = rail_hypotheses(ev, p, set())
    assert list(got) == [("network-slow", (synth.node(3),))]


def test_a_nic_busy_with_another_communicator_meanwhile_was_not_down():
    ev, p = _evidence(rings=[list(range(N)), list(reversed(range(N)))])
    _judge(ev, p, {3: 20 * MS})
    # node-03's NIC carried a pipeline send of another communicator during the wait
    ev.alive.note(synth.record("pp", 1, 0, 3, kind="Send", nranks=2, start=ISSUE + 5 * MS, end=ISSUE + 15 * MS,
                               t_host=ISSUE, nic="mlx5_0"))
    _with_end_late(ev)
    assert rail_hypotheses(ev, p, set()) == {}


def test_a_rank_whose_previous_operator_ended_late_starts_from_that_end():
    """Stream order: a lossy ring's operator ends late at some ranks, and their next one
    starts late for it (battery packet-loss seed 3: two healthy ranks of the lossy ring
    2.5-6 ms after their siblings, one of them named before this)."""
    ev, p = _evidence(rings=[list(range(N)), list(reversed(range(N)))])
    ev.rail.note_record(synth.record("r0", 6, 3, 3, kind="AllReduce", nranks=N, start=ISSUE - 5 * MS,
                                     end=ISSUE + 20 * MS, t_host=ISSUE - 5 * MS, nic="mlx5_0"))
    _judge(ev, p, {3: 20 * MS})
    assert _silent(ev) == []


def test_a_silence_another_rank_entered_as_late_is_its_wait_not_a_down_nic():
    # sweep 269 #0: node-04 computing slowly enters every operator ~61 ms late; the rank
    # waiting for its data on one rail's tree sends its first byte there 61.4 ms late
    ev, p = _evidence(rings=[list(range(N)), list(reversed(range(N)))])
    _judge(ev, p, {3: 20 * MS}, rises={0: -0.5 * MS, 1: 0.3 * MS, 2: 19.5 * MS, 3: 0.0}, noise=1.0 * MS)
    assert _silent(ev) == []
    # a late entry well short of the silence, or one within the job's noise, explains nothing
    for rises in ({2: 10 * MS, 3: 0.0}, {2: 0.8 * MS, 3: 0.0}):
        ev, p = _evidence(rings=[list(range(N)), list(reversed(range(N)))])
        _judge(ev, p, {3: 20 * MS}, rises=rises, noise=1.0 * MS)
        assert _silent(ev) == [(synth.node(3), frozenset({synth.node(3)}))]
