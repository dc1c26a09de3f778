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


# -- every incident scored ---------------------------------------------------------------

GPU = {"scenario": "gpu-slow", "seed": 1, "kind": "compute-slow", "level": "node",
       "culprit": {"nodes": ["node-02"]}, "onset_ns": 0}


def test_a_later_incident_on_healthy_nodes_is_a_misdiagnosis_on_every_incident():
    # the case: the right node first, then two healthy pipeline stage-mates
    vs = [v("compute-slow", ["node-02"], at=1), v("compute-slow", ["node-00"], at=2),
          v("compute-slow", ["node-04"], at=3)]
    s = score(vs, GPU)
    assert (s.outcome, s.outcome_all) == ("node", "misdiagnosed")
    assert (s.incidents, s.correct_incidents, s.blaming_incidents, s.exact_incidents) == (3, 1, 2, 1)
    sm = summarize([s], "pulse")
    assert (sm.node, sm.misdiagnosed) == (1, 0)
    assert (sm.node_all, sm.misdiagnosed_any, sm.recall_all) == (0, 1, 0.0)
    assert abs(sm.precision - 1 / 3) < 1e-9 and abs(sm.precision_all - 1 / 3) < 1e-9


def test_a_group_holding_the_culprit_and_a_healthy_node_blames_the_healthy_one():
    s = score([v("network-slow", ["node-02", "node-03"])], TRUTH)
    assert (s.outcome, s.outcome_all, s.blaming_incidents, s.exact_incidents) == ("group", "misdiagnosed", 1, 0)
    sm = summarize([s], "pulse")
    assert (sm.precision, sm.precision_all, sm.group, sm.group_all) == (1.0, 0.0, 1, 0)


def test_a_wrong_kind_on_the_culprit_alone_blames_nobody_healthy():
    s = score([v("network-slow", ["node-03"], at=1), v("compute-slow", ["node-03"], at=2)], TRUTH)
    assert (s.outcome, s.outcome_all, s.blaming_incidents, s.exact_incidents) == ("node", "node", 0, 1)
    assert summarize([s], "pulse").precision_all == 0.5


def test_a_wrong_first_incident_stays_a_misdiagnosis_on_every_incident():
    s = score([v("compute-slow", ["node-03"], at=1), v("network-slow", ["node-03"], at=2)], TRUTH)
    assert (s.outcome, s.outcome_all) == ("misdiagnosed", "misdiagnosed")


def test_path_truth_every_incident_inside_the_path_is_no_blame():
    s = score([v("path", ["node-01", "node-05"], at=1), v("network-slow", ["node-05"], at=2)], PATH)
    assert (s.outcome, s.outcome_all, s.blaming_incidents, s.exact_incidents) == ("group", "group", 0, 2)
    s2 = score([v("path", ["node-01", "node-05"], at=1), v("network-slow", ["node-02"], at=2)], PATH)
    assert (s2.outcome, s2.outcome_all) == ("group", "misdiagnosed")


def test_healthy_and_missed_runs_on_every_incident():
    fa = score([v("network-slow", ["node-00"]), v("path", ["node-01", "node-02"])], HEALTHY)
    assert (fa.outcome_all, fa.blaming_incidents, fa.exact_incidents) == ("false-alarm", 2, 0)
    assert score([], HEALTHY).outcome_all == "healthy-ok"
    assert score([], TRUTH).outcome_all == "missed"
    sm = summarize([fa, score([], TRUTH)], "pulse")
    assert (sm.false_alarms, sm.misdiagnosed_any, sm.precision_all, sm.recall_all) == (1, 0, 0.0, 0.0)
