"""Incidents from a verdict stream: open once, update only on what an operator acts on,
resolve on ``cleared`` or at the end of the job; a refinement is the same incident."""

from __future__ import annotations

import dataclasses

from pulse.localization.lifecycle import IncidentTracker, incident_id, summary

from pulse.records import Incident, Verdict


def _v(status: str = "anomaly", kind: str | None = "network-slow", level: str | None = "node",
       nodes: tuple[str, ...] = ("node-03",), nics: tuple[str, ...] = ("node-03/mlx5_0",), conf: float = 0.99,
       first_seq: int = 10, decided: int = 5_000, metric: str = "act_ns", value: float = 2_600.0,
       ref: float = 1_000.0, ops: int = 6) -> Verdict:
    findings = [{"comm_id": "dp0", "seq": first_seq + i, "rank": 3, "node": nodes[0], "metric": metric,
                 "value": value, "reference": ref} for i in range(ops)]
    return Verdict(job="j", status=status, kind=kind, level=level, nodes=list(nodes), ranks=[3], nics=list(nics),
                   confidence=conf, evidence={"findings": findings, "outlier_ops": ops},
                   window={"comm_id": "dp0", "first_seq": first_seq, "last_seq": first_seq + ops,
                           "ops": ops, "decided_at_ns": decided},
                   first_seen_ns=1_796_000_000_000_000_000, emitted_at=1)


def _tracker() -> IncidentTracker:
    return IncidentTracker("j", clock=lambda: 42)


def test_a_persisting_fault_is_one_incident_and_repeats_announce_nothing() -> None:
    t = _tracker()
    opened = t.observe([_v()])
    assert [i.state for i in opened] == ["open"]
    assert opened[0].id == incident_id("j", "network-slow", "node", ["node-03"], "dp0", 10)
    assert t.observe([_v(decided=6_000), _v(decided=7_000, conf=0.95)]) == []  # nothing changed
    resolved = t.observe([_v("cleared", decided=9_000)])
    assert [(i.state, i.resolution, i.resolved_at_ns, i.id) for i in resolved] == [
        ("resolved", "evidence-stopped", 9_000, opened[0].id)]
    assert t.finish() == []  # nothing left open


def test_updates_come_from_a_new_nic_or_a_confidence_step() -> None:
    t = _tracker()
    t.observe([_v(conf=0.6)])
    up = t.observe([_v(nics=("node-03/mlx5_0", "node-03/mlx5_1"), conf=0.6)])
    assert [(i.state, i.updates, i.nics) for i in up] == [("updated", 1, ["node-03/mlx5_0", "node-03/mlx5_1"])]
    up2 = t.observe([_v(nics=("node-03/mlx5_1",), conf=0.75)])
    assert [(i.state, i.updates, round(i.confidence, 2)) for i in up2] == [("updated", 2, 0.75)]


def test_a_refined_verdict_updates_the_same_incident() -> None:
    t = _tracker()
    first = t.observe([_v(kind="path", level="group", nodes=("node-01", "node-02"))])[0]
    up = t.observe([_v(nodes=("node-01",), nics=("node-01/eth0",))])
    assert [(i.id, i.state, i.kind, i.level, i.nodes) for i in up] == [
        (first.id, "updated", "network-slow", "node", ["node-01"])]
    # a compute fault on the same node is another fault (another family): a second incident
    other = t.observe([_v(kind="compute-slow", nodes=("node-01",), metric="issue_to_end_ns",
                          value=1e6, ref=9e6)])
    assert [i.state for i in other] == ["open"] and other[0].id != first.id
    ended = t.finish(end_ns=123)
    assert {(i.state, i.resolution, i.resolved_at_ns) for i in ended} == {("resolved", "job-ended", 123)}


def test_healthy_verdicts_make_no_incident() -> None:
    t = _tracker()
    assert t.observe([_v("healthy", kind=None, level=None, nodes=("node-01", "node-02"))]) == []
    assert t.finish() == []


def test_the_summary_says_who_what_and_how_far_from_the_peers() -> None:
    s = summary(_v(), 34)
    assert s.startswith("node-03 (node-03/mlx5_0): network fail-slow")
    assert "2.6x the usual time" in s and "over 34 operators" in s and "confidence 0.99" in s
    rate = summary(_v(metric="active_rate", value=38.0, ref=100.0), 5)
    assert "38 % of its peers' rate" in rate
    late = summary(_v(kind="compute-slow", nics=(), metric="issue_to_end_ns", value=2e6, ref=50e6), 8)
    assert late.startswith("node-03: compute fail-slow") and "48.0 ms after its peers" in late


def test_incident_records_round_trip_and_reject_inconsistency() -> None:
    import pytest

    from pulse.errors import DecodeError
    from pulse.records import decode_incident

    inc = _tracker().observe([_v()])[0]
    assert decode_incident(inc.to_json()) == inc
    bad = inc.to_dict() | {"state": "resolved"}  # resolved without resolved_at_ns
    with pytest.raises(DecodeError, match="resolved_at_ns"):
        Incident.from_dict(bad)
    with pytest.raises(DecodeError, match="state"):
        Incident.from_dict(inc.to_dict() | {"state": "closed"})


def test_an_incident_another_worker_opened_goes_on_with_its_id() -> None:
    # the live worker opened the fault at seq 10 and was killed; the survivor's rebuild
    # of the job opened it at seq 30 (its aligner judged late ranks differently)
    live = _tracker().observe([_v()])[0]
    t = _tracker()
    rebuilt = t.observe([_v(first_seq=30)])[0]
    assert rebuilt.id != live.id
    t.resume(live)
    assert list(t.open) == [live.id]  # the rebuild's own incident of that fault gave way
    assert t.observe([_v(first_seq=40, decided=8_000)]) == []  # the same fault, nothing new
    up = t.observe([_v(first_seq=40, nics=("node-03/mlx5_0", "node-03/mlx5_1"))])
    assert [(i.id, i.state) for i in up] == [(live.id, "updated")]
    assert [(i.id, i.resolution) for i in t.observe([_v("cleared", decided=9_000)])] == [
        (live.id, "evidence-stopped")]


def test_resuming_keeps_other_faults_and_ignores_resolved_ones() -> None:
    t = _tracker()
    compute = t.observe([_v(kind="compute-slow", metric="issue_to_end_ns", value=1e6, ref=9e6)])[0]
    net = _tracker().observe([_v()])[0]
    t.resume(net)
    assert set(t.open) == {compute.id, net.id}  # another family on the same node stays
    done = _tracker()
    first = done.observe([_v(nodes=("node-05",), nics=("node-05/mlx5_0",))])[0]
    gone = done.observe([_v("cleared", nodes=("node-05",), nics=("node-05/mlx5_0",))])[0]
    t.resume(gone)
    assert first.id not in t.open
    t.resume(net)  # twice is once
    assert set(t.open) == {compute.id, net.id}


def _resolved_elsewhere() -> tuple[int, Incident, Incident]:
    """Trace time 0, and a fault another worker opened and resolved."""
    t0 = _v().first_seen_ns
    before = _tracker()
    first = before.observe([_v(decided=t0 + 5_000)])[0]
    return t0, first, before.observe([_v("cleared", decided=t0 + 9_000)])[0]


def test_a_fault_another_worker_resolved_found_again_in_the_same_stretch_keeps_its_id() -> None:
    # the killed worker opened and resolved the fault; the survivor's rebuild of the same
    # stretch of the job finds it again a few operators later (trace time throughout)
    t0, first, gone = _resolved_elsewhere()
    t = _tracker()
    t.resume(gone)
    assert t.observe([_v(first_seq=30, decided=t0 + 6_000)]) == []  # the world has seen this one
    assert [(i.id, i.state) for i in t.observe([_v("cleared", decided=t0 + 9_500)])] == [(first.id, "resolved")]
    # found after the time it was resolved at: a new episode, a new incident
    t2 = _tracker()
    t2.resume(gone)
    anew = dataclasses.replace(_v(first_seq=90, decided=t0 + 20_000), first_seen_ns=t0 + 10_000)
    opened = t2.observe([anew])
    assert [i.state for i in opened] == ["open"] and opened[0].id != first.id


def test_a_fault_the_rebuild_opened_again_after_another_worker_resolved_it_keeps_its_id() -> None:
    t0, first, gone = _resolved_elsewhere()
    t = _tracker()
    rebuilt = t.observe([_v(first_seq=30, decided=t0 + 6_000)])[0]  # the rebuild, outputs dropped
    assert rebuilt.id != first.id
    t.resume(gone)
    assert list(t.open) == [first.id]
    assert [(i.id, i.state) for i in t.observe([_v("cleared", decided=t0 + 9_500)])] == [(first.id, "resolved")]
