"""Grouping a verdict stream into incidents (the one definition scoring, report and lab use)."""

from __future__ import annotations

import dataclasses

from pulse.localization.incidents import decided_at, group_incidents, incident_key, main_incident

from pulse.records import Verdict


def v(kind, nodes, *, status="anomaly", level=None, seen=1_000, decided=None, conf=0.5, emitted=0,
      comm="c0", first_seq=4):
    level = level or ("node" if len(nodes) == 1 else "group")
    window = {"comm_id": comm, "first_seq": first_seq}
    if decided is not None:
        window["decided_at_ns"] = decided
    return Verdict(job="j", status=status, kind=kind, level=level, nodes=list(nodes), ranks=[], nics=[],
                   confidence=conf, evidence={}, window=window, first_seen_ns=seen, emitted_at=emitted,
                   method="pulse")


def test_repeats_are_one_incident_and_order_is_first_appearance():
    a1 = v("network-slow", ["node-03"], seen=5_000, conf=0.6)
    b1 = v("compute-slow", ["node-01"], seen=2_000)
    a2 = v("network-slow", ["node-03"], seen=4_000, conf=0.9, first_seq=2)
    incs = group_incidents([a1, b1, a2])
    assert [(i.kind, i.nodes) for i in incs] == [("network-slow", ("node-03",)), ("compute-slow", ("node-01",))]
    a = incs[0]
    assert a.count == 2 and a.verdicts == [a1, a2] and a.first is a1
    assert a.confidence == 0.9 and a.first_seen_ns == 4_000 and a.earliest is a2
    assert a.first_op == ("c0", 4) and not a.cleared


def test_node_order_does_not_split_but_level_does():
    incs = group_incidents([v("path", ["node-05", "node-01"]), v("path", ["node-01", "node-05"])])
    assert len(incs) == 1 and incs[0].nodes == ("node-01", "node-05") and incs[0].count == 2
    incs = group_incidents([v("network-stop", ["node-02"], level="node"),
                            v("network-stop", ["node-02"], level="group")])
    assert [i.level for i in incs] == ["node", "group"]
    assert incident_key(v("path", ["b", "a"])) == ("path", "group", ("a", "b"))


def test_healthy_and_insufficient_are_not_alarms_and_cleared_closes():
    healthy = dataclasses.replace(v(None, [], status="healthy"), level=None)
    insufficient = dataclasses.replace(v(None, ["node-02"], status="insufficient-data"), level=None)
    slow = v("network-slow", ["node-03"])
    cleared = v("network-slow", ["node-03"], status="cleared")
    assert group_incidents([healthy, insufficient]) == []
    assert group_incidents([cleared]) == [], "a cleared verdict that closes nothing is no incident"
    (inc,) = group_incidents([healthy, slow, cleared])
    assert inc.cleared and inc.count == 1
    # the same fault alarming again is the same incident, open again
    (inc,) = group_incidents([slow, cleared, slow])
    assert not inc.cleared and inc.count == 2
    # clearing one incident leaves another open
    other = v("compute-slow", ["node-01"])
    incs = group_incidents([slow, other, cleared])
    assert [i.cleared for i in incs] == [True, False]


def test_main_incident_most_repeated_then_most_confident_then_earliest():
    assert main_incident([]) is None
    few = [v("compute-slow", ["node-01"], conf=0.99, seen=1)]
    many = [v("network-slow", ["node-03"], conf=0.5, seen=9), v("network-slow", ["node-03"], conf=0.5, seen=8)]
    assert main_incident(group_incidents(few + many)).kind == "network-slow"
    assert main_incident(group_incidents([v("host-contention", ["x"], conf=0.4), v("compute-stop", ["y"], conf=0.7)])).kind == \
        "compute-stop"
    early, late = v("network-slow", ["x"], seen=5), v("network-slow", ["y"], seen=3)
    assert main_incident(group_incidents([early, late])).nodes == ("y",)


def test_decided_at_falls_back_to_first_seen():
    assert decided_at(v("network-slow", ["x"], seen=7, decided=11)) == 11
    assert decided_at(v("network-slow", ["x"], seen=7)) == 7
