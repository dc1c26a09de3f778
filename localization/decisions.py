"""Decisions: the hypotheses the rules produce become open faults, repeated while they
persist and cleared once the culprit is judged clean for a while; the verdicts (anomaly,
cleared, insufficient-data, healthy) are written here. (This is the localizer's own
bookkeeping; the incident records operators see are built from its verdicts by
:mod:`.lifecycle`.)

One fault per node at a time: a new hypothesis of another kind whose nodes an open
incident already covers is that incident's consequence, not a second fault.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from pulse.records import Verdict

from .evidence import Evidence, node_of
from .finding import Finding
from .params import LocalizeParams

Key = tuple[str, tuple[str, ...]]
"""(kind, nodes) of a hypothesis / incident."""


@dataclasses.dataclass
class Hypothesis:
    kind: str
    level: str
    nodes: tuple[str, ...]
    findings: list[Finding]
    confidence: float
    extra: dict[str, Any]
    ranks: list[int] = dataclasses.field(default_factory=list)
    nics: list[str] = dataclasses.field(default_factory=list)
    first_seen_ns: int = 0
    judged_since: int = 0
    clean_run: int = 0


def make_hypothesis(p: LocalizeParams, kind: str, level: str, nodes: tuple[str, ...], fs: list[Finding],
                  culprit: str | None = None, extra: dict[str, Any] | None = None) -> Hypothesis:
    """A hypothesis: ``nodes`` are blamed for ``kind`` on the findings ``fs``; its ranks,
    NICs, first-seen time and confidence come from the culprit's own findings."""
    own = [f for f in fs if f.node in nodes] or fs
    if culprit is not None:
        own = [f for f in fs if f.node == culprit] or own
    ops = {(f.comm_id, f.seq) for f in own}
    conf = round(min(p.conf_max, p.conf_base + p.conf_per_op * len(ops)), 3)
    inc = Hypothesis(kind, level, nodes, fs, conf, extra or {})
    inc.ranks = sorted({f.rank for f in own if f.node in nodes})
    nics = {f.endpoint for f in own if f.node in nodes and "/" in f.endpoint
            and ":" not in f.endpoint.split("/", 1)[1]}
    if not nics and kind in ("network-slow", "network-stop"):
        nics = {e for f in fs for e in f.peer_eps if node_of(e) in nodes and ":" not in e.split("/", 1)[1]}
    inc.nics = sorted(nics)
    inc.first_seen_ns = min((f.start_ns for f in own), default=0)
    return inc


_NO_DATA = frozenset({"no_epoch_data"})
_LINK_KINDS = frozenset({"network-slow", "host-contention", "path"})


def on_slow_link(ev: Evidence, nodes: tuple[str, ...]) -> bool:
    """Whether one of ``nodes`` is an end of a link with ``persist_ops`` slow observations
    in its window."""
    return any(node_of(a) in nodes or node_of(b) in nodes for a, b in ev.hot_links())


def on_stalled_rail(ev: Evidence, nics: list[str]) -> bool:
    """Whether a rail-late record still kept (``rail_keep_ns``) stalled on one of ``nics``,
    at either end of its link."""
    if not nics:
        return False
    mine = set(nics)
    return any(f.endpoint in mine or mine.intersection(f.peer_eps) for f, _m in ev.rail.records)


class DecisionBook:
    """Open incidents of one job, and when the hypotheses were last evaluated."""

    def __init__(self, p: LocalizeParams) -> None:
        self.p = p
        self.open: dict[Key, Hypothesis] = {}
        self.any_alarm = False
        self.since_healthy = 0
        self._hyps: dict[Key, Hypothesis] = {}
        self._hyps_at: int | None = None
        self._stops_at = (0, 0)
        """How many stalls and absences the stop rules had when last asked."""
        self._told_degraded: dict[str, frozenset[str]] = {}

    def decide(self, ev: Evidence, touched: set[str], job: str, final: bool,
               hypotheses: Callable[[], dict[Key, Hypothesis]], missed: list[str] | None = None) -> list[Verdict]:
        """After one judged operator (of nodes ``touched``): report nodes without data,
        re-evaluate the hypotheses when due, open / repeat / clear incidents. ``missed``:
        the nodes whose missing count this operator raised (None: look at every node)."""
        p = self.p
        out: list[Verdict] = []
        if missed is None:
            due = list(ev.missing.items())
        else:
            # only a count raised now can have reached missing_ops since the last call
            # (every node at it then was reported and is insufficient): no scan of every node
            due = [(n, ev.missing[n]) for n in dict.fromkeys(missed)]
            if len(due) > 1:
                order = {n: i for i, n in enumerate(ev.missing)}
                due.sort(key=lambda nc: order[nc[0]])
        for node, c in due:
            if c >= p.missing_ops and node not in ev.insufficient:
                ev.insufficient.add(node)
                out.append(verdict(job, ev, "insufficient-data", None, "node", (node,), [], [], 0.5,
                                   {"reason": f"no operator records from {node} in {c} operators its peers completed"},
                                   {"ops": c}, ev.last_end_ns))
        for node, gaps in ev.degraded.items():
            if self._told_degraded.get(node) != frozenset(gaps):
                self._told_degraded[node] = frozenset(gaps)
                out.append(verdict(job, ev, "insufficient-data", None, "node", (node,), [], [], 0.5,
                                   {"reason": f"input of {node} incomplete: "
                                    + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(gaps.items())),
                                    "degraded": gaps}, {}, ev.last_end_ns))
        # Hypotheses only change when some window holds evidence (or an incident may clear).
        if not (ev.busy() or self.open):
            self._hyps, self._hyps_at = {}, None
        elif (final or self._hyps_at is None or ev.stops.settled() or self._stops_at != ev.stops.counts()
              or ev.last_end_ns - self._hyps_at >= p.hypotheses_every_ns):
            # new stop evidence is asked at once: after a hang the trace time stops moving,
            # and the stalls of the last operators came in after the last evaluation
            # (sweep 307 #12, a NIC down under MoE: no verdict)
            self._hyps, self._hyps_at, self._stops_at = hypotheses(), ev.last_end_ns, ev.stops.counts()
        hyps = self._hyps
        for key, inc in hyps.items():
            cur = self.open.get(key)
            if cur is None:
                if any(k[0] != key[0] and set(key[1]) <= set(k[1]) for k in self.open):
                    continue  # one fault per node at a time: the open incident explains it
                if (inc.kind.endswith("-stop") or inc.level == "group") and any(n in ev.degraded for n in inc.nodes):
                    # A stop, or a path seen from both ends, may be made of the node's missing
                    # input: its insufficient-data verdict says so instead. (Missing input only
                    # shortens a node's ACT, so it cannot make that node look slow.)
                    continue
                unseen = [n for n in inc.nodes if n not in ev.data_end] if ev.data_end or ev.expects_data_end else []
                if inc.kind.endswith("-stop") and unseen:
                    # Not one epoch batch from the node: a stop cannot be told from input
                    # that never arrived (no capture there, a lost directory, a wrong name).
                    for n in unseen:
                        if self._told_degraded.get(n) != _NO_DATA:
                            self._told_degraded[n] = _NO_DATA
                            out.append(verdict(job, ev, "insufficient-data", None, "node", (n,), [], [], 0.5,
                                               {"reason": f"no epoch data from {n}: its traffic was never seen",
                                                "degraded": {"no_epoch_data": 1}}, {}, ev.last_end_ns))
                    continue
                self.open[key] = inc
                self.any_alarm = True
                out.append(anomaly(job, ev, inc))
                continue
            cur.findings, cur.confidence, cur.extra = inc.findings, inc.confidence, inc.extra
            cur.ranks = sorted(set(cur.ranks) | set(inc.ranks))
            cur.nics = sorted(set(cur.nics) | set(inc.nics))
            cur.clean_run = 0
            if touched & set(cur.nodes):
                cur.judged_since += 1
                if cur.judged_since >= p.repeat_every:
                    cur.judged_since = 0
                    out.append(anomaly(job, ev, cur))
        for key in list(self.open):
            if key in hyps:
                continue
            cur = self.open[key]
            if touched & set(cur.nodes) and not (cur.kind in _LINK_KINDS and (
                    on_slow_link(ev, cur.nodes) or on_stalled_rail(ev, cur.nics))):
                # an operator is clean for a link fault only once its nodes left the
                # persistently slow links: a hypothesis that waits for evidence (a once-a-step
                # ring not sampled since the slowness began) has not seen the fault go; nor
                # has a NIC whose stalls are still recent (a flap stalls it once a period and
                # the operators in between are clean)
                cur.clean_run += 1
            if cur.clean_run >= p.clear_ops:
                del self.open[key]
                out.append(verdict(job, ev, "cleared", cur.kind, cur.level, cur.nodes, cur.ranks, cur.nics,
                                   cur.confidence, {"cleared_after_clean_ops": cur.clean_run},
                                   {"ops": cur.clean_run}, cur.first_seen_ns))
        if not self.open and self.since_healthy >= p.healthy_every:
            out.append(self.healthy(job, ev))
        return out

    def healthy(self, job: str, ev: Evidence) -> Verdict:
        self.since_healthy = 0
        nodes = sorted(ev.links.senders - ev.insufficient)
        degraded = {**{n: {"no_epoch_data": 1} for n, k in self._told_degraded.items() if k == _NO_DATA},
                    **ev.degraded}
        extra: dict[str, Any] = {"degraded": degraded} if degraded else {}
        # Missing input lowers the confidence that nothing is wrong: a fault may hide in it.
        return verdict(job, ev, "healthy", None, None, tuple(nodes), [], [], 0.5 if degraded else 0.9,
                       {"judged_nodes": len(nodes), "closed_ops": ev.closed_ops, **extra},
                       {"ops": ev.closed_ops}, ev.last_end_ns)


def anomaly(job: str, ev: Evidence, inc: Hypothesis) -> Verdict:
    # a record's finding marks each link it crossed: one finding, shown and counted once
    findings = list({id(f): f for f in inc.findings}.values())
    own = [f for f in findings if f.node in inc.nodes] or findings
    shown = sorted(own, key=lambda f: (f.end_ns, f.comm_id, f.seq))[-8:]
    evidence: dict[str, Any] = {"rule": dict(Counter(f.kind for f in findings)),
                                "findings": [f.evidence() for f in shown],
                                "outlier_ops": len({(f.comm_id, f.seq) for f in own}), **inc.extra}
    degraded = {n: ev.degraded[n] for n in inc.nodes if n in ev.degraded}
    if degraded:
        evidence["degraded_evidence"] = degraded
    if inc.level == "group" or inc.kind in ("network-slow", "host-contention"):
        evidence["links"] = sorted({f"{f.endpoint}->{d}" for f in inc.findings for d in f.peer_eps})[:16]
    comms = sorted({f.comm_id for f in own})
    seqs = [f.seq for f in own]
    window = {"comm_id": comms[0] if len(comms) == 1 else comms, "first_seq": min(seqs, default=0),
              "last_seq": max(seqs, default=0), "ops": len({(f.comm_id, f.seq) for f in own}),
              "decided_at_ns": max((f.end_ns for f in own), default=ev.last_end_ns)}
    return Verdict(job=job, status="anomaly", kind=inc.kind, level=inc.level, nodes=list(inc.nodes),
                   ranks=inc.ranks, nics=inc.nics, confidence=inc.confidence, evidence=evidence, window=window,
                   first_seen_ns=inc.first_seen_ns, emitted_at=time.time_ns(), method="pulse")


def verdict(job: str, ev: Evidence, status: str, kind: str | None, level: str | None, nodes: tuple[str, ...],
            ranks: list[int], nics: list[str], conf: float, evidence: dict[str, Any], window: dict[str, Any],
            first_seen: int) -> Verdict:
    window = {"comm_id": None, "first_seq": None, "last_seq": None, **window, "decided_at_ns": ev.last_end_ns}
    return Verdict(job=job, status=status, kind=kind, level=level, nodes=list(nodes), ranks=ranks,
                   nics=nics, confidence=conf, evidence=evidence, window=window, first_seen_ns=first_seen,
                   emitted_at=time.time_ns(), method="pulse")
