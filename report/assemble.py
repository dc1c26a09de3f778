"""What a report shows, from operator metrics and verdicts: the main anomaly, the
operators the rate panels zoom on, the window around them, the per-rank bars and the
evidence lines. Pure: the per-epoch rates come from a callback (:mod:`.epochs` over a trace
directory), so this module reads no file and no service."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import orjson

from pulse.events import FlowEvent, HookEvent
from pulse.records import OpMetrics, Verdict

from .model import FOCUS_OPS, MAX_BARS, MAX_EVIDENCE_ITEMS, REFERENCE_KEYS, Curve, RankBars, ReportData, Span

EpochRates = Callable[[dict[tuple[str, str], dict[int, tuple[str, int]]], set[str], set[str], int, int],
                      tuple[list[Curve], list[Curve]]]
"""(flows, culprit nodes, primary NICs, w0, w1) -> (per-rank curves, culprit flow curves):
see :func:`pulse.report.epochs.epoch_curves`."""


def main_anomaly(verdicts: Iterable[Verdict]) -> Verdict | None:
    """The anomaly the report is about: the main incident
    (:func:`pulse.localization.incidents.main_incident`: repeated most often, then most
    confident, then earliest), by its verdict about the earliest operators."""
    from pulse.localization.incidents import group_incidents, main_incident

    inc = main_incident(group_incidents(verdicts))
    return None if inc is None else inc.earliest


def _focus(metrics: Sequence[OpMetrics], verdict: Verdict | None) -> tuple[str | None, list[int]]:
    """The communicator and the operators (seqs) the rate panels zoom on.

    With an anomaly: the culprit's operator that starts closest to the verdict's
    ``first_seen_ns`` (the first anomalous one), on the verdict window's communicator(s)
    where those are known, and the next ones on that communicator. Without: the last
    operators of the busiest communicator.
    """
    if not metrics:
        return None, []
    by_comm: dict[str, set[int]] = defaultdict(set)
    for m in metrics:
        by_comm[m.comm_id].add(m.seq)
    if verdict is not None:
        window = verdict.window if isinstance(verdict.window, dict) else {}
        named = window.get("comm_id")
        comms = {named} if isinstance(named, str) else set(named) if isinstance(named, list) else set()
        comms = {c for c in comms if isinstance(c, str) and c in by_comm}
        mine = [m for m in metrics if m.node in verdict.nodes and (not comms or m.comm_id in comms)]
        named_op = _evidence_op(verdict, mine)
        if named_op is not None:
            return named_op.comm_id, _close_in_time(metrics, named_op, sorted(by_comm[named_op.comm_id]))
        if mine:
            first_seq = window.get("first_seq")
            first = min(mine, key=lambda m: (abs(m.start_ns - verdict.first_seen_ns), m.seq != first_seq,
                                             m.comm_id, m.seq))
            return first.comm_id, _close_in_time(metrics, first, sorted(by_comm[first.comm_id]))
    comm = max(by_comm, key=lambda c: (len(by_comm[c]), c))
    return comm, sorted(by_comm[comm])[-FOCUS_OPS:]


def _evidence_op(verdict: Verdict, mine: Sequence[OpMetrics]) -> OpMetrics | None:
    """The culprit's operator that the verdict's evidence shows most clearly as an outlier.

    Evidence is free-form JSON; where it lists per-operator findings (``comm_id``, ``seq``,
    ``value`` and the peers' value under one of :data:`REFERENCE_KEYS`), take the
    communicator of the largest ratio (among those of 3+ ranks if any) and on it the
    earliest finding with ``value`` >= 1.5 x ``peers_median``: ``first_seen_ns`` may point
    at an operator whose deviation is marginal.
    """
    findings = verdict.evidence.get("findings") if isinstance(verdict.evidence, dict) else None
    if not isinstance(findings, list):
        return None
    by_key = {(m.comm_id, m.seq): m for m in mine}
    scored = []
    for f in findings:
        if not isinstance(f, dict):
            continue
        m = by_key.get((f.get("comm_id"), f.get("seq")))  # type: ignore[arg-type]
        value = f.get("value")
        ref = next((f[k] for k in REFERENCE_KEYS if isinstance(f.get(k), (int, float))), None)
        if m is None or not isinstance(value, (int, float)) or not isinstance(ref, (int, float)) or ref <= 0:
            continue
        scored.append((value / ref, m))
    if not scored:
        return None
    # A communicator of 3+ ranks shows the straggler against peers of the same operator
    # (a 2-rank Send/Recv pair cannot), so prefer one, then the clearest outlier.
    best = max(scored, key=lambda rm: (min(rm[1].nranks, 3), rm[0]))[1]
    clear = [m for r, m in scored if r >= 1.5 and m.comm_id == best.comm_id]
    return min(clear, key=lambda m: m.start_ns) if clear else best


def _close_in_time(metrics: Sequence[OpMetrics], first: OpMetrics, seqs: list[int]) -> list[int]:
    """``first`` and up to FOCUS_OPS-1 following operators of its communicator that start
    soon after it (an operator a training step later would squeeze the picture flat)."""
    start: dict[int, int] = {}
    for m in metrics:
        if m.comm_id == first.comm_id and m.node == first.node:
            start[m.seq] = m.start_ns
    horizon = first.end_ns + 4 * max(first.end_ns - first.start_ns, 1)
    out = [first.seq]
    for s in seqs:
        if s > first.seq and len(out) < FOCUS_OPS and start.get(s, horizon + 1) <= horizon:
            out.append(s)
    return out


def _bars(peers: Sequence[OpMetrics], culprits: set[str], comm: str | None) -> RankBars:
    per_rank: dict[tuple[str, int], list[OpMetrics]] = defaultdict(list)
    for m in peers:
        per_rank[(m.comm_id, m.rank)].append(m)
    keys = sorted(per_rank, key=lambda k: (per_rank[k][0].node, k))
    if len(keys) > MAX_BARS:
        # Too many to read: the focus communicator's ranks and the culprit nodes' other ranks.
        keys = [k for k in keys if k[0] == comm or per_rank[k][0].node in culprits]
        keys = sorted(keys, key=lambda k: k[0] != comm)[:MAX_BARS]
        keys.sort(key=lambda k: (per_rank[k][0].node, k))
    nodes = [per_rank[k][0].node for k in keys]

    def mean(attr: str, scale: float) -> np.ndarray:
        return np.array([np.median([getattr(m, attr) for m in per_rank[k]]) / scale for k in keys], dtype=float)

    return RankBars(
        labels=[f"{n}\n{c} r{r}" for (c, r), n in zip(keys, nodes, strict=True)], nodes=nodes,
        ranks=[r for _, r in keys], comms=[c for c, _ in keys],
        act_us=mean("act_ns", 1e3), duration_us=mean("duration_ns", 1e3), volume_mb=mean("volume_bytes", 1e6),
        culprit=np.array([n in culprits for n in nodes], dtype=bool),
    )


def _evidence(verdict: Verdict | None) -> list[tuple[str, str]]:
    if verdict is None:
        return []
    rows: list[tuple[str, str]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k in value:
                walk(f"{prefix}.{k}" if prefix else str(k), value[k])
            return
        if isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            # e.g. per-operator findings: one line each, "key=value ..."
            for i, item in enumerate(value[:MAX_EVIDENCE_ITEMS]):
                rows.append((f"{prefix}[{i}]", " ".join(f"{k}={_fmt(v)}" for k, v in item.items())))
            if len(value) > MAX_EVIDENCE_ITEMS:
                rows.append((prefix, f"… {len(value) - MAX_EVIDENCE_ITEMS} more"))
            return
        text = _fmt(value)
        rows.append((prefix, text if len(text) <= 160 else text[:157] + "..."))

    walk("", verdict.evidence)
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) > 12:
        return orjson.dumps(value[:12]).decode() + f" … ({len(value)} values)"
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return str(value)


def _peer_ops(metrics: Sequence[OpMetrics], focus: Sequence[OpMetrics], w0: int, w1: int) -> list[OpMetrics]:
    """The focus operators and every operator of the same shape (kind, ranks, expected
    bytes: e.g. the same gradient bucket on the other rails) that overlaps the window: the
    peers a straggler is compared with."""
    shapes = {(m.kind, m.nranks, m.expected_bytes) for m in focus}
    ids = {id(m) for m in focus}
    return [m for m in metrics
            if id(m) in ids or ((m.kind, m.nranks, m.expected_bytes) in shapes and m.end_ns > w0 and m.start_ns < w1)]


def assemble(job: str, source: str, metrics: Sequence[OpMetrics], verdicts: Sequence[Verdict],
             *, epoch_rates: EpochRates | None = None,
             events: Sequence[HookEvent] = ()) -> ReportData:
    """Everything the figure shows, from operator metrics and verdicts (and the raw epochs,
    through ``epoch_rates``, when a trace directory is at hand; ``events`` bind its flows)."""
    verdict = main_anomaly(verdicts)
    culprits = set(verdict.nodes) if verdict is not None else set()
    primary_nics = set(verdict.nics) if verdict is not None else set()
    comm, seqs = _focus(metrics, verdict)
    focus = [m for m in metrics if m.comm_id == comm and m.seq in set(seqs)]
    if focus:
        ref = [m for m in focus if m.node in culprits] or focus
        # A margin of half the focus span each side shows the gaps around the operators.
        lo = min(m.start_ns for m in ref)
        hi = max(m.end_ns for m in ref)
        pad = max((hi - lo) // 2, 1)
        w0, w1 = lo - pad, hi + pad
    else:
        w0 = w1 = 0
    peers = _peer_ops(metrics, focus, w0, w1)
    focus_seqs = set(seqs)
    spans = [
        Span(node=m.node, rank=m.rank, comm_id=m.comm_id, seq=m.seq,
             t0_ms=(max(m.start_ns, w0) - w0) / 1e6, t1_ms=(min(m.end_ns, w1) - w0) / 1e6,
             culprit=m.node in culprits, complete=m.complete, focus=m.seq in focus_seqs)
        for m in sorted(metrics, key=lambda m: (m.rank, m.seq))
        if m.comm_id == comm and m.end_ns > w0 and m.start_ns < w1
    ]
    node_curves: list[Curve] = []
    flow_curves: list[Curve] = []
    if epoch_rates is not None and focus:
        peer_comms = {m.comm_id for m in peers}
        flows: dict[tuple[str, str], dict[int, tuple[str, int]]] = defaultdict(dict)
        for e in events:
            if (isinstance(e, FlowEvent) and e.comm_id in peer_comms and e.direction == "send"
                    and e.rank is not None):
                flows[(e.node, e.nic)][e.flow] = (e.comm_id, e.rank)
        node_curves, flow_curves = epoch_rates(flows, culprits, primary_nics, w0, w1)
    rate_source = "epochs" if node_curves else "operators"
    if not node_curves:
        node_curves = _operator_curves(metrics, {m.comm_id for m in peers} or {comm}, culprits, w0)
    return ReportData(
        job=job, source=source, verdict=verdict, culprit_nodes=sorted(culprits), comm_id=comm,
        seqs=list(seqs), window_ns=(w0, w1), node_curves=node_curves, flow_curves=flow_curves,
        spans=spans, bars=_bars(peers, culprits, comm), evidence=_evidence(verdict),
        rate_source=rate_source, verdicts=len(verdicts),
    )


def _operator_curves(metrics: Sequence[OpMetrics], comms: set[str | None], culprits: set[str],
                     w0: int) -> list[Curve]:
    """Without epochs (InfluxDB holds operators only): one point per operator, its rate."""
    per_rank: dict[tuple[str, str, int], list[OpMetrics]] = defaultdict(list)
    for m in metrics:
        if m.comm_id in comms:
            per_rank[(m.node, m.comm_id, m.rank)].append(m)
    out = []
    for (node, comm, rank), ms in sorted(per_rank.items()):
        ms.sort(key=lambda m: m.start_ns)
        out.append(Curve(
            label=f"{node} {comm} r{rank}", node=node,
            t_ms=np.array([(m.start_ns - w0) / 1e6 for m in ms], dtype=float),
            gbps=np.array([m.active_rate * 8 / 1e9 for m in ms], dtype=float),
            culprit=node in culprits, primary=node in culprits,
        ))
    return out

