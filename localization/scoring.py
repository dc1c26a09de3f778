"""Scoring verdicts against a simulator's ground truth (DESIGN.md "Scoring").

This is the only module of pulse.localization that reads truth (``truth.json``, through
:func:`pulse.trace.read_truth` in the callers); the localizers never see it.

Per run:

* an **incident** is one (kind, level, nodes) series of anomaly verdicts
  (:mod:`pulse.localization.incidents`: repeats of the same anomaly are one incident;
  ``cleared``, ``healthy`` and ``insufficient-data`` are not alarms), of the verdicts of one
  method when ``method`` is given;
* an incident is **correct** when its kind family (network: network-slow/stop/path; compute:
  compute-slow/stop/host-contention) matches the truth and its nodes are right: for a
  node-level truth, a node-level hit names exactly the culprit node, a group-level hit is a
  set of several nodes that contains it; for a group-level truth (path scenarios), a
  group-level hit is a non-empty set of at most the affected group's nodes;
* the run's **outcome** is ``node`` / ``group`` (best correct incident) unless a wrong
  incident came first, then ``misdiagnosed``; ``missed`` when there is no incident at all;
  on a healthy run any incident is a false alarm;
* every incident, not only the first (``outcome_all``): a run is ``misdiagnosed`` when its
  first incident is wrong *or any* of its incidents names a healthy node - a node outside
  the truth's culprit nodes (for a path truth, the path's nodes). A group incident holding
  the culprit and a healthy node is a group-level hit by the first rule and a wrong blame
  by this one: an operator acting on it drains the healthy node too. An incident of the
  wrong kind family on the culprit node alone is wrong (it counts against
  ``precision_all``) but blames nobody healthy;
* **time to detect** = trace time of the first correct verdict's decision minus onset.

Per incident, ``precision`` counts the incidents that match the truth (first rule);
``precision_all`` the incidents that match it *and* name no healthy node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from pulse.records import Verdict, kind_family

from .incidents import decided_at, group_incidents


@dataclasses.dataclass
class ScenarioScore:
    scenario: str
    seed: int | None
    method: str
    outcome: str
    """node | group | misdiagnosed | missed | healthy-ok | false-alarm."""
    incidents: int
    correct_incidents: int
    wrong_incidents: int
    detect_ns: int | None
    """Onset to the first correct verdict, trace time; None when none came."""
    first_verdict: dict[str, Any] | None = None
    severity: float | None = None
    outcome_all: str = ""
    """Scored on every incident: as ``outcome``, but ``misdiagnosed`` as soon as any incident
    names a healthy node (healthy runs: the same as ``outcome``)."""
    blaming_incidents: int = 0
    """Incidents that name at least one healthy node."""
    exact_incidents: int = 0
    """Incidents that match the truth and name no healthy node."""
    named: list[str] = dataclasses.field(default_factory=list)
    """Every incident as "kind level node,node", in the order they were decided."""
    job_slowdown: float | None = None
    """Evaluation only (``pulse eval --twins``), on missed runs: the job's time after the onset
    over its healthy twin's (the same draw without the fault), 1.0 for a fault that never
    slowed it; None when not measured or the job hung."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _match(v: Verdict, truth: dict[str, Any]) -> str | None:
    """'node' / 'group' when this anomaly verdict is a hit, None when it is wrong."""
    culprit = set((truth.get("culprit") or {}).get("nodes") or [])
    if not culprit or kind_family(v.kind) != kind_family(truth.get("kind")):
        return None
    nodes = set(v.nodes)
    if not nodes:
        return None
    if truth.get("level") == "group":
        return "group" if nodes <= culprit else None
    if nodes == culprit:
        return "node"
    if culprit <= nodes:
        return "group"
    return None


def blames_healthy(v: Verdict, truth: dict[str, Any]) -> bool:
    """Whether the verdict names a node outside the truth's culprit nodes (every node of a
    healthy run is healthy)."""
    culprit = set((truth.get("culprit") or {}).get("nodes") or [])
    return bool(set(v.nodes) - culprit)


def score(verdicts: Iterable[Verdict], truth: dict[str, Any], *, method: str | None = None) -> ScenarioScore:
    vs = [v for v in verdicts if method is None or v.method == method]
    meth = method or (vs[0].method if vs else "pulse") or "pulse"
    anomalies = sorted((v for v in vs if v.status == "anomaly"), key=lambda v: (decided_at(v), v.emitted_at))
    # Each incident is judged by its first decided verdict, in the order they were decided.
    order = [(_match(inc.first, truth), inc.first) for inc in group_incidents(anomalies)]
    scenario = str(truth.get("scenario", "?"))
    seed = truth.get("seed")
    sev = truth.get("severity")
    healthy = truth.get("kind") is None
    correct = [v for m, v in order if m is not None]
    wrong = [v for m, v in order if m is None]
    first = order[0][1].to_dict() if order else None
    named = [f"{v.kind} {v.level} {','.join(sorted(v.nodes))}" for _m, v in order]
    blaming = sum(blames_healthy(v, truth) for _m, v in order)
    exact = sum(m is not None and not blames_healthy(v, truth) for m, v in order)
    if healthy:
        out = "false-alarm" if order else "healthy-ok"
        return ScenarioScore(scenario, seed, meth, out, len(order), 0, len(order), None, first, sev,
                             outcome_all=out, blaming_incidents=blaming, exact_incidents=0, named=named)
    if not order:
        outcome = "missed"
    elif order[0][0] is None:
        outcome = "misdiagnosed"
    else:
        outcome = "node" if any(m == "node" for m, _ in order) else "group"
    outcome_all = "misdiagnosed" if outcome != "missed" and blaming else outcome
    onset = truth.get("onset_ns")
    detect = None
    if correct and isinstance(onset, int):
        detect = max(0, decided_at(correct[0]) - onset)
    return ScenarioScore(scenario, seed, meth, outcome, len(order), len(correct), len(wrong), detect, first, sev,
                         outcome_all=outcome_all, blaming_incidents=blaming, exact_incidents=exact, named=named)


@dataclasses.dataclass
class Summary:
    method: str
    runs: int
    node: int
    group: int
    misdiagnosed: int
    missed: int
    healthy_runs: int
    false_alarms: int
    precision: float
    recall: float
    mean_detect_ms: float | None
    # -- every incident scored (``ScenarioScore.outcome_all``) --
    node_all: int = 0
    group_all: int = 0
    misdiagnosed_any: int = 0
    """Anomalous runs whose first incident is wrong or any incident names a healthy node."""
    precision_all: float = 1.0
    """Incidents that match the truth and name no healthy node, over all incidents."""
    recall_all: float = 1.0
    """Anomalous runs right on every incident (node or group), over anomalous runs."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def summarize(scores: Iterable[ScenarioScore], method: str) -> Summary:
    ss = [s for s in scores if s.method == method]
    anomalous = [s for s in ss if s.outcome not in ("healthy-ok", "false-alarm")]
    healthy = [s for s in ss if s.outcome in ("healthy-ok", "false-alarm")]
    incidents = sum(s.incidents for s in ss)
    correct = sum(s.correct_incidents for s in ss)
    hits = [s for s in anomalous if s.outcome in ("node", "group")]
    detects = [s.detect_ns for s in anomalous if s.detect_ns is not None]
    hits_all = [s for s in anomalous if s.outcome_all in ("node", "group")]
    exact = sum(s.exact_incidents for s in ss)
    return Summary(
        method=method, runs=len(anomalous),
        node=sum(s.outcome == "node" for s in anomalous), group=sum(s.outcome == "group" for s in anomalous),
        misdiagnosed=sum(s.outcome == "misdiagnosed" for s in anomalous),
        missed=sum(s.outcome == "missed" for s in anomalous),
        healthy_runs=len(healthy), false_alarms=sum(s.outcome == "false-alarm" for s in healthy),
        precision=correct / incidents if incidents else 1.0,
        recall=len(hits) / len(anomalous) if anomalous else 1.0,
        mean_detect_ms=(sum(detects) / len(detects) / 1e6) if detects else None,
        node_all=sum(s.outcome_all == "node" for s in anomalous),
        group_all=sum(s.outcome_all == "group" for s in anomalous),
        misdiagnosed_any=sum(s.outcome_all == "misdiagnosed" for s in anomalous),
        precision_all=exact / incidents if incidents else 1.0,
        recall_all=len(hits_all) / len(anomalous) if anomalous else 1.0,
    )
