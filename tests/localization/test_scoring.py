"""Scoring verdicts against ground truth."""

from __future__ import annotations

from pulse.localization import score, summarize

from pulse.records import Verdict

TRUTH = {"scenario": "nic-slow", "seed": 1, "severity": 0.5, "kind": "network-slow", "level": "node",
         "culprit": {"nodes": ["node-03"], "ranks": [], "nics": ["node-03/mlx5_2"]}, "onset_ns": 1_000_000}
PATH = {"scenario": "path-slow", "seed": 1, "kind": "path", "level": "group",
        "culprit": {"nodes": ["node-01", "node-05"]}, "onset_ns": 0}
HEALTHY = {"scenario": "healthy", "seed": 1, "kind": None, "level": None, "culprit": None, "onset_ns": None}


def v(kind, nodes, at=2_000_000, status="anomaly", level=None, method="pulse"):
    level = level or ("node" if len(nodes) == 1 else "group")
    return Verdict(job="j", status=status, kind=kind if status != "healthy" else None,
                   level=level if status != "healthy" else None, nodes=nodes, ranks=[], nics=[],
                   confidence=0.9, evidence={}, window={"decided_at_ns": at}, first_seen_ns=at, emitted_at=0,
                   method=method)


def test_node_hit_and_time_to_detect():
    s = score([v("network-slow", ["node-03"], at=5_000_000)], TRUTH)
    assert s.outcome == "node" and s.detect_ns == 4_000_000 and s.wrong_incidents == 0


def test_repeats_are_one_incident():
    s = score([v("network-slow", ["node-03"]), v("network-slow", ["node-03"], at=9_000_000)], TRUTH)
    assert s.incidents == 1 and s.correct_incidents == 1


def test_wrong_family_is_misdiagnosed():
    assert score([v("compute-slow", ["node-03"])], TRUTH).outcome == "misdiagnosed"
    assert score([v("host-contention", ["node-03"])], TRUTH).outcome == "misdiagnosed"


def test_wrong_node_is_misdiagnosed_and_path_counts_as_network():
    assert score([v("network-slow", ["node-02"])], TRUTH).outcome == "misdiagnosed"
    assert score([v("path", ["node-03", "node-04"])], TRUTH).outcome == "group"


def test_group_containing_culprit_is_group_level_for_a_node_truth():
    assert score([v("network-slow", ["node-02", "node-03"])], TRUTH).outcome == "group"


def test_wrong_alarm_before_the_right_one_is_a_misdiagnosis():
    s = score([v("network-slow", ["node-01"], at=1), v("network-slow", ["node-03"], at=2)], TRUTH)
    assert s.outcome == "misdiagnosed" and s.correct_incidents == 1 and s.wrong_incidents == 1


def test_missed_and_non_alarms():
    assert score([], TRUTH).outcome == "missed"
    assert score([v(None, ["node-03"], status="healthy")], TRUTH).outcome == "missed"
    assert score([v(None, ["node-03"], status="insufficient-data", level="node")], TRUTH).outcome == "missed"


def test_path_truth_needs_a_subset_of_the_group():
    assert score([v("path", ["node-01", "node-05"])], PATH).outcome == "group"
    assert score([v("path", ["node-01", "node-05", "node-02"])], PATH).outcome == "misdiagnosed"
    assert score([v("network-slow", ["node-01"])], PATH).outcome == "group"
    assert score([v("compute-slow", ["node-01"])], PATH).outcome == "misdiagnosed"


def test_healthy_false_alarm_and_summary():
    ok = score([v(None, [], status="healthy")], HEALTHY)
    fa = score([v("network-slow", ["node-00"])], HEALTHY)
    assert ok.outcome == "healthy-ok" and fa.outcome == "false-alarm"
    hit = score([v("network-slow", ["node-03"])], TRUTH)
    s = summarize([ok, fa, hit], "pulse")
    assert s.false_alarms == 1 and s.healthy_runs == 2 and s.node == 1 and s.recall == 1.0
    assert s.precision == 0.5


def test_method_filter():
    vs = [v("network-slow", ["node-03"], method="baseline"), v("network-slow", ["node-02"])]
    assert score(vs, TRUTH, method="baseline").outcome == "node"
    assert score(vs, TRUTH, method="pulse").outcome == "misdiagnosed"
