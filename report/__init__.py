"""``pulse report``: one picture of an anomaly (PNG, plus an HTML page holding it).

Two steps, kept apart so tests can check what a panel shows without reading pixels:

* :func:`build_report_data` (a trace directory) or :func:`build_report_data_from_influx`
  (the measurements the pipeline's sink writes) -> :class:`ReportData`: the arrays and
  records behind every panel;
* :func:`draw` -> the PNG, and :func:`write_html` -> a self-contained page embedding it.

Panels: per-node send rate of the verdict's communicator around its first anomalous
operators (the culprit's curve highlighted, segmented operators shaded); the culprit's
per-flow rates with its own segmented operators; ACT, duration and volume per rank as bars;
the verdict and its evidence. matplotlib is imported only when drawing, with the Agg
backend, so the command runs headless and ``pulse --help`` stays fast.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import math
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np
import orjson

from pulse.errors import ConfigError, ServiceError, TraceError
from pulse.events import FlowEvent, HookEvent
from pulse.records import OpMetrics, Verdict
from pulse.trace import TraceReader, read_batch_file

FIG_W_IN = 16.0
FIG_H_IN = 10.0
DPI = 100
PNG_SIZE = (int(FIG_W_IN * DPI), int(FIG_H_IN * DPI))
"""(width, height) in pixels of every report PNG."""

MAX_POINTS = 600
"""Rate curves are re-binned to at most this many points (multiples of the epoch)."""
FOCUS_OPS = 3
"""How many operators, from the verdict's first one, the rate panels cover."""
MAX_FLOW_CURVES = 16
MAX_EVIDENCE_ITEMS = 8
MAX_BARS = 16
REFERENCE_KEYS = ("peers_median", "reference", "median", "peers")
"""Keys of a per-operator finding in a verdict's evidence that hold the peers' value."""

CULPRIT = "#d62728"
CULPRIT_OTHER = "#ff9f4a"
PEER = "#7f7f7f"


@dataclasses.dataclass
class Curve:
    """A rate series: time from the window start on the node's own clock, and Gb/s."""

    label: str
    node: str
    t_ms: np.ndarray
    gbps: np.ndarray
    culprit: bool
    flow: int | None = None
    nic: str | None = None
    primary: bool = False
    """On the verdict's NIC(s) (or on a culprit node when the verdict names no NIC)."""


@dataclasses.dataclass
class Span:
    """One segmented operator on one rank, relative to the window start (ms)."""

    node: str
    rank: int
    comm_id: str
    seq: int
    t0_ms: float
    t1_ms: float
    culprit: bool
    complete: bool = True
    focus: bool = True
    """One of the focus operators (the others in the window are drawn lighter)."""


@dataclasses.dataclass
class RankBars:
    """Per (communicator, rank) of the peer operators: medians over those in the window."""

    labels: list[str]
    nodes: list[str]
    ranks: list[int]
    comms: list[str]
    act_us: np.ndarray
    duration_us: np.ndarray
    volume_mb: np.ndarray
    culprit: np.ndarray


@dataclasses.dataclass
class ReportData:
    job: str
    source: str
    verdict: Verdict | None
    """The main anomaly verdict (:func:`main_anomaly`; None when there is none)."""
    culprit_nodes: list[str]
    """The nodes highlighted in every panel (the verdict's nodes)."""
    comm_id: str | None
    seqs: list[int]
    """The focus operators' sequence numbers on ``comm_id``."""
    window_ns: tuple[int, int]
    """Start and end of the plotted window (ns, the culprit's clock where it has data)."""
    node_curves: list[Curve]
    flow_curves: list[Curve]
    spans: list[Span]
    bars: RankBars
    evidence: list[tuple[str, str]]
    rate_source: str
    """"epochs" (per-epoch bytes from the trace) or "operators" (one point per operator)."""
    verdicts: int = 0
    """How many verdicts the source holds."""

    @property
    def highlighted_nodes(self) -> list[str]:
        """Nodes drawn as culprits in the rate panel (what tests compare with the truth)."""
        return sorted({c.node for c in self.node_curves if c.culprit})

    @property
    def highlighted_bar_nodes(self) -> list[str]:
        return sorted({n for n, c in zip(self.bars.nodes, self.bars.culprit, strict=True) if c})


# ---------------------------------------------------------------- data from a trace directory

def _diagnose(path: Path) -> tuple[list[OpMetrics], list[Verdict]]:
    """Segment and localize a trace directory with the same code ``pulse diagnose`` runs."""
    from pulse.localization.diagnose import diagnose

    result = diagnose(path)
    return list(result.metrics), list(result.verdicts)


def main_anomaly(verdicts: Iterable[Verdict]) -> Verdict | None:
    """The anomaly the report is about: of the incidents (same kind, level and nodes), the
    one repeated most often (verdicts repeat while an anomaly persists), then the most
    confident, then the earliest; its first verdict (the earliest operators' evidence)."""
    groups: dict[tuple[str | None, str | None, tuple[str, ...]], list[Verdict]] = defaultdict(list)
    for v in verdicts:
        if v.status == "anomaly":
            groups[(v.kind, v.level, tuple(sorted(v.nodes)))].append(v)
    if not groups:
        return None
    best = max(groups.values(), key=lambda vs: (len(vs), max(v.confidence for v in vs),
                                                -min(v.first_seen_ns for v in vs)))
    return min(best, key=lambda v: (v.first_seen_ns, v.emitted_at))


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


def _bin_ns(span_ns: int, epoch_ns: int) -> int:
    epochs = max(1, math.ceil(span_ns / MAX_POINTS / epoch_ns))
    return epochs * epoch_ns


def _epoch_curves(reader: TraceReader, flows: dict[tuple[str, str], dict[int, tuple[str, int]]],
                  culprits: set[str], primary_nics: set[str], w0: int, w1: int) -> tuple[list[Curve], list[Curve]]:
    """Per-rank and per-flow (culprit nodes) send rates in [w0, w1) from the epoch batches.

    ``flows`` maps (node, nic) -> {flow id: (comm, rank)} of the peer operators' send flows.
    Rows are binned with one ``bincount`` per batch over (flow index, bin) keys.
    """
    epoch_ns = int(reader.meta.get("epoch_ns") or 0)
    bin_ns = 0
    nbins = 0
    grids: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for node, nic, path in reader.nic_files():
        wanted = flows.get((node, nic))
        if not wanted:
            continue
        ids = np.array(sorted(wanted), dtype=np.uint32)
        per_flow = np.zeros(0)
        for batch in read_batch_file(path):
            if batch.n_rows == 0:
                continue
            if bin_ns == 0:
                epoch_ns = epoch_ns or batch.epoch_ns
                bin_ns = _bin_ns(w1 - w0, epoch_ns)
                nbins = max(1, math.ceil((w1 - w0) / bin_ns))
                per_flow = np.zeros(0)
            if per_flow.size == 0:
                per_flow = np.zeros(ids.size * nbins)
            t = batch.t0_ns + batch.epoch.astype(np.int64) * batch.epoch_ns
            keep = (t >= w0) & (t < w1) & np.isin(batch.flow, ids)
            if not keep.any():
                continue
            idx = (t[keep] - w0) // bin_ns
            fidx = np.searchsorted(ids, batch.flow[keep])
            per_flow += np.bincount(fidx * nbins + idx, weights=batch.tx_bytes[keep].astype(np.float64),
                                    minlength=ids.size * nbins)
        if per_flow.size:
            grids[(node, nic)] = (ids, per_flow.reshape(ids.size, nbins))
    if bin_ns == 0:
        return [], []
    t_ms = np.arange(nbins, dtype=float) * bin_ns / 1e6
    scale = 8.0 / bin_ns  # bytes per bin -> Gb/s
    per_rank: dict[tuple[str, str, str, int], np.ndarray] = {}
    flow_rows: list[tuple[float, Curve]] = []
    for (node, nic), (ids, grid) in sorted(grids.items()):
        for i, f in enumerate(ids):
            comm, rank = flows[(node, nic)][int(f)]
            key = (node, nic, comm, rank)
            per_rank[key] = per_rank.get(key, 0) + grid[i]
            primary = not primary_nics or f"{node}/{nic}" in primary_nics
            if node in culprits and primary and grid[i].any():
                flow_rows.append((float(grid[i].sum()), Curve(
                    label=f"{node}/{nic} flow {int(f):#x} ({comm} r{rank})", node=node, t_ms=t_ms,
                    gbps=grid[i] * scale, culprit=True, flow=int(f), nic=nic)))
    rank_curves = [
        Curve(label=f"{node}/{nic} {comm} r{rank}", node=node, t_ms=t_ms, gbps=acc * scale,
              culprit=node in culprits, nic=nic,
              primary=node in culprits and (not primary_nics or f"{node}/{nic}" in primary_nics))
        for (node, nic, comm, rank), acc in sorted(per_rank.items())
        if acc.any()
    ]
    top = sorted(flow_rows, key=lambda x: -x[0])[:MAX_FLOW_CURVES]
    flow_curves = sorted((c for _, c in top), key=lambda c: (c.nic or "", c.flow or 0))
    return rank_curves, flow_curves


def _peer_ops(metrics: Sequence[OpMetrics], focus: Sequence[OpMetrics], w0: int, w1: int) -> list[OpMetrics]:
    """The focus operators and every operator of the same shape (kind, ranks, expected
    bytes: e.g. the same gradient bucket on the other rails) that overlaps the window: the
    peers a straggler is compared with."""
    shapes = {(m.kind, m.nranks, m.expected_bytes) for m in focus}
    ids = {id(m) for m in focus}
    return [m for m in metrics
            if id(m) in ids or ((m.kind, m.nranks, m.expected_bytes) in shapes and m.end_ns > w0 and m.start_ns < w1)]


def assemble(job: str, source: str, metrics: Sequence[OpMetrics], verdicts: Sequence[Verdict],
             *, reader: TraceReader | None = None,
             events: Sequence[HookEvent] = ()) -> ReportData:
    """Everything the figure shows, from operator metrics and verdicts (and the raw epochs
    when a trace directory is at hand)."""
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
    if reader is not None and focus:
        peer_comms = {m.comm_id for m in peers}
        flows: dict[tuple[str, str], dict[int, tuple[str, int]]] = defaultdict(dict)
        for e in events:
            if (isinstance(e, FlowEvent) and e.comm_id in peer_comms and e.direction == "send"
                    and e.rank is not None):
                flows[(e.node, e.nic)][e.flow] = (e.comm_id, e.rank)
        node_curves, flow_curves = _epoch_curves(reader, flows, culprits, primary_nics, w0, w1)
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


def build_report_data(trace_dir: str | Path) -> ReportData:
    """Segment and localize a trace directory, then gather what each panel shows.

    Never reads ``truth.json``: the report shows what Pulse concluded.
    """
    path = Path(trace_dir)
    reader = TraceReader(path)
    metrics, verdicts = _diagnose(path)
    events = list(reader.events())
    job = str(reader.meta.get("job") or (metrics[0].job if metrics else "")) or path.name
    return assemble(job, str(path), metrics, verdicts, reader=reader, events=events)


# ---------------------------------------------------------------- data from InfluxDB

def influx_query(url: str, db: str, query: str, *, token: str | None = None,
                 timeout: float = 30.0) -> list[dict[str, Any]]:
    """Run one InfluxQL statement on ``/query`` (InfluxDB 1.x, or 2.x through its DBRP
    mapping) and return its series (``name``, ``tags``, ``columns``, ``values``)."""
    params = urllib.parse.urlencode({"db": db, "q": query, "epoch": "ns"})
    req = urllib.request.Request(f"{url.rstrip('/')}/query?{params}")
    if token:
        req.add_header("Authorization", f"Token {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = orjson.loads(resp.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode(errors="replace")
        raise ServiceError(f"InfluxDB at {url}: HTTP {exc.code} for {query!r}: {detail}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise ServiceError(f"InfluxDB at {url}: cannot query ({exc})") from None
    except orjson.JSONDecodeError:
        raise ServiceError(f"InfluxDB at {url}: /query did not return JSON") from None
    series: list[dict[str, Any]] = []
    for result in body.get("results", []):
        if "error" in result:
            raise ServiceError(f"InfluxDB at {url}: {result['error']} (query {query!r})")
        series.extend(result.get("series", []))
    return series


def _rows(series: list[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    for s in series:
        tags = s.get("tags") or {}
        cols = s["columns"]
        for values in s["values"]:
            row = dict(tags)
            row.update({c: v for c, v in zip(cols, values, strict=True) if v is not None or c not in row})
            yield row


def _as_list(value: Any, conv: Any) -> list[Any]:
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return [conv(v) for v in value]
    text = str(value)
    if text.startswith("["):
        try:
            return [conv(v) for v in orjson.loads(text)]
        except (orjson.JSONDecodeError, ValueError, TypeError):
            pass
    return [conv(v.strip()) for v in text.split(",") if v.strip()]


def _as_json(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value.startswith("{"):
        try:
            out = orjson.loads(value)
            return out if isinstance(out, dict) else {}
        except orjson.JSONDecodeError:
            return {}
    return {}


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_report_data_from_influx(url: str, *, job: str | None = None, db: str | None = None,
                                  token: str | None = None) -> ReportData:
    """The same figure from what the pipeline wrote to InfluxDB (``pulse_op``,
    ``pulse_verdict``): operator-level rates instead of per-epoch curves."""
    from pulse.settings import Settings

    settings = Settings.from_env()
    db = db or settings.influx_bucket
    token = token if token is not None else settings.influx_token
    if job is None:
        jobs: list[str] = [j for r in _rows(influx_query(
            url, db, 'SHOW TAG VALUES FROM "pulse_verdict" WITH KEY = "job"', token=token))
            if isinstance(j := r.get("value"), str)]
        if len(jobs) != 1:
            raise ConfigError(
                f"InfluxDB at {url} holds verdicts for {len(jobs)} jobs ({', '.join(jobs[:10]) or 'none'}): "
                "name one with --job")
        job = jobs[0]
    where = f'"job" = {_quote(job)}'
    vrows = list(_rows(influx_query(url, db, f'SELECT * FROM "pulse_verdict" WHERE {where}', token=token)))
    verdicts = [v for v in (_verdict_from_row(r, job) for r in vrows) if v is not None]
    orows = list(_rows(influx_query(url, db, f'SELECT * FROM "pulse_op" WHERE {where}', token=token)))
    if not orows and not verdicts:
        raise ServiceError(f"InfluxDB at {url}, database {db}: nothing for job {job!r}")
    metrics = [m for m in (_op_from_row(r, job) for r in orows) if m is not None]
    return assemble(job, f"{url} (db {db})", metrics, verdicts)


def _num(row: dict[str, Any], *names: str, default: float = 0.0) -> float:
    for n in names:
        v = row.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return default


def _op_from_row(row: dict[str, Any], job: str) -> OpMetrics | None:
    try:
        duration_ns = int(_num(row, "duration_us") * 1e3)
        act_ns = int(_num(row, "act_us") * 1e3)
        # The sink stamps an operator's point with its end (µs, the rank in the ns digits).
        start_ns = int(_num(row, "start_ns", default=_num(row, "time") - duration_ns))
        volume = int(_num(row, "volume_bytes"))
        rate = _num(row, "rate_gbps") * 1e9 / 8
        if rate == 0.0 and act_ns > 0:
            rate = volume / (act_ns / 1e9)
        return OpMetrics(
            job=job, node=str(row.get("node")), comm_id=str(row.get("comm") or row.get("comm_id")),
            seq=int(_num(row, "seq")), rank=int(_num(row, "rank")),
            kind=str(row.get("kind") or row.get("op") or row.get("op_kind") or "AllReduce"),
            nranks=max(1, int(_num(row, "nranks", default=1))),
            start_ns=start_ns, end_ns=start_ns + duration_ns, duration_ns=duration_ns, act_ns=act_ns,
            volume_bytes=volume, expected_bytes=int(_num(row, "expected_bytes")),
            complete=bool(row.get("complete", True)), active_rate=min(rate, 1e15),
            flows=int(_num(row, "flows")), epoch_ns=max(1, int(_num(row, "epoch_ns", default=1))),
        )
    except Exception:  # a row we cannot read is left out of the picture, not fatal
        return None


def _verdict_from_row(row: dict[str, Any], job: str) -> Verdict | None:
    try:
        status = str(row.get("status"))
        window = _as_json(row.get("window"))
        for k in ("comm_id", "first_seq", "last_seq"):
            if k in row and k not in window:
                window[k] = row[k] if k == "comm_id" else int(row[k])
        def tag(name: str) -> str | None:
            value = row.get(name)
            return None if value in (None, "", "none") else str(value)

        return Verdict(
            job=job, status=status, kind=tag("kind"), level=tag("level"),
            nodes=_as_list(row.get("nodes"), str), ranks=_as_list(row.get("ranks"), int),
            nics=_as_list(row.get("nics"), str), confidence=min(1.0, max(0.0, _num(row, "confidence"))),
            evidence=_as_json(row.get("evidence")), window=window,
            first_seen_ns=int(_num(row, "first_seen_ns", "time")),
            emitted_at=int(_num(row, "emitted_at", "time")), method=tag("method"), id=tag("id"),
        )
    except Exception:  # idem: an unreadable verdict row is skipped
        return None


# ---------------------------------------------------------------- drawing

def _title(data: ReportData) -> str:
    v = data.verdict
    if v is None:
        return f"job {data.job or '?'}: no anomaly ({data.verdicts} verdicts)"
    return (f"job {data.job or '?'}: {v.kind} at {v.level} level — {', '.join(v.nodes)}"
            f" (confidence {v.confidence:.2f})")


def draw(data: ReportData, out_png: str | Path) -> Path:
    """Render the report to ``out_png`` (exactly :data:`PNG_SIZE` pixels)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt
    from matplotlib.figure import Figure

    del plt  # the pyplot state machine is not used: Figure objects are freed with their scope
    fig = Figure(figsize=(FIG_W_IN, FIG_H_IN), dpi=DPI)
    fig.suptitle(_title(data), fontsize=14, color=CULPRIT if data.verdict is not None else "black")
    grid = fig.add_gridspec(3, 3, height_ratios=[1.1, 1.0, 0.9], hspace=0.45, wspace=0.28,
                            left=0.05, right=0.98, top=0.92, bottom=0.07)
    ax_nodes = fig.add_subplot(grid[0, :2])
    ax_flows = fig.add_subplot(grid[1, :2], sharex=ax_nodes)
    ax_act = fig.add_subplot(grid[2, 0])
    ax_vol = fig.add_subplot(grid[2, 1])
    ax_text = fig.add_subplot(grid[:, 2])

    seq_colors = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
    # Shade each segmented operator over its extent across ranks (node clocks): the focus
    # operators in colour and labelled, the others in the window in grey.
    for seq in sorted({s.seq for s in data.spans}):
        mine = [s for s in data.spans if s.seq == seq]
        lo, hi = min(s.t0_ms for s in mine), max(s.t1_ms for s in mine)
        if seq in data.seqs:
            color = seq_colors[data.seqs.index(seq) % len(seq_colors)]
            ax_nodes.axvspan(lo, hi, color=color, alpha=0.15, lw=0)
            ax_nodes.text(lo, 1.0, f" seq {seq}", transform=ax_nodes.get_xaxis_transform(),
                          va="top", fontsize=8, color=color)
        else:
            ax_nodes.axvspan(lo, hi, color=PEER, alpha=0.08, lw=0)
    for c in sorted(data.node_curves, key=lambda c: (c.culprit, c.primary)):
        if c.primary:
            style: dict[str, Any] = {"color": CULPRIT, "lw": 2.0, "zorder": 3, "label": c.label}
        elif c.culprit:
            style = {"color": CULPRIT_OTHER, "lw": 1.0, "ls": "--", "zorder": 2, "label": c.label}
        else:
            style = {"color": PEER, "lw": 0.8, "alpha": 0.7}
        if data.rate_source == "epochs":
            ax_nodes.step(c.t_ms, c.gbps, where="post", **style)
        else:
            ax_nodes.plot(c.t_ms, c.gbps, marker="o", ms=3, **style)
    ax_nodes.plot([], [], color=PEER, lw=0.8, label="other ranks")
    what = "send rate per rank" if data.rate_source == "epochs" else "active rate per operator"
    ax_nodes.set_title(f"{what} — comm {data.comm_id or '?'}, operators {data.seqs}", fontsize=10)
    ax_nodes.set_ylabel("Gb/s")
    ax_nodes.legend(loc="upper right", fontsize=7)

    for s in data.spans:
        if s.culprit:
            alpha = (0.12 if s.focus else 0.05) * (1 if s.complete else 2.5)
            ax_flows.axvspan(s.t0_ms, s.t1_ms, color=CULPRIT, alpha=alpha, lw=0)
    cmap = matplotlib.colormaps["tab10"]
    for i, c in enumerate(data.flow_curves):
        ax_flows.step(c.t_ms, c.gbps, where="post", lw=1.0, color=cmap(i % 10), label=c.label)
    if data.flow_curves:
        ax_flows.legend(loc="upper right", fontsize=7, ncol=2)
        ax_flows.set_title("culprit's flows (its segmented operators shaded)", fontsize=10)
    else:
        ax_flows.text(0.5, 0.5, "no per-flow epochs in this source (operators only)",
                      ha="center", va="center", transform=ax_flows.transAxes, color=PEER)
        ax_flows.set_title("culprit's segmented operators", fontsize=10)
    ax_flows.set_xlabel("ms from window start (node clocks)")
    ax_flows.set_ylabel("Gb/s")

    b = data.bars
    x = np.arange(len(b.ranks))
    colors = [CULPRIT if c else PEER for c in b.culprit]
    ax_act.bar(x - 0.2, b.act_us, width=0.4, color=colors, label="ACT")
    ax_act.bar(x + 0.2, b.duration_us, width=0.4, color=colors, alpha=0.35, label="duration")
    ax_act.set_title("ACT (solid) vs operator duration (light) per rank, median", fontsize=10)
    ax_act.set_ylabel("µs")
    ax_vol.bar(x, b.volume_mb, color=colors)
    ax_vol.set_title("volume per rank", fontsize=10)
    ax_vol.set_ylabel("MB")
    for ax in (ax_act, ax_vol):
        ax.set_xticks(x, b.labels, fontsize=6 if len(b.labels) <= 8 else 5)

    ax_text.axis("off")
    ax_text.text(0.0, 1.0, _verdict_text(data), va="top", ha="left", family="monospace",
                 fontsize=8, transform=ax_text.transAxes, wrap=True)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, format="png")
    return out


def _verdict_text(data: ReportData) -> str:
    v = data.verdict
    lines = [f"source: {_shorten(data.source, 44)}", f"verdicts: {data.verdicts}", ""]
    if v is None:
        lines.append("no anomaly verdict")
    else:
        lines += [
            f"status:     {v.status}",
            f"kind:       {v.kind}",
            f"level:      {v.level}",
            f"nodes:      {', '.join(v.nodes)}",
            f"ranks:      {', '.join(map(str, v.ranks[:16]))}",
            f"nics:       {', '.join(v.nics[:8])}",
            f"confidence: {v.confidence:.3f}",
            f"first seen: {v.first_seen_ns} ns",
            f"window:     {_shorten(orjson.dumps(v.window).decode(), 40)}",
            "", "evidence:",
        ]
        lines += [f"  {_shorten(k, 24)}: {_shorten(val, 30)}" for k, val in data.evidence[:40]]
    return "\n".join(lines)


def _shorten(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def write_html(data: ReportData, png: str | Path, out_html: str | Path) -> Path:
    """A self-contained page: the PNG embedded as base64, the verdict and evidence as tables."""
    raw = Path(png).read_bytes()
    b64 = base64.b64encode(raw).decode()
    e = html.escape
    v = data.verdict
    vrows = "" if v is None else "".join(
        f"<tr><th>{e(k)}</th><td>{e(str(val))}</td></tr>"
        for k, val in (("kind", v.kind), ("level", v.level), ("nodes", ", ".join(v.nodes)),
                       ("ranks", ", ".join(map(str, v.ranks))), ("nics", ", ".join(v.nics)),
                       ("confidence", f"{v.confidence:.3f}"), ("first seen (ns)", v.first_seen_ns),
                       ("window", orjson.dumps(v.window).decode())))
    erows = "".join(f"<tr><th>{e(k)}</th><td>{e(val)}</td></tr>" for k, val in data.evidence)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Pulse report — {e(data.job)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse;margin:1em 0}}
th,td{{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}}
th{{background:#f3f3f3}}img{{max-width:100%}}.culprit{{color:{CULPRIT}}}</style></head>
<body><h1 class="{'culprit' if v else ''}">{e(_title(data))}</h1>
<p>source: <code>{e(data.source)}</code>; communicator <code>{e(str(data.comm_id))}</code>,
operators {e(str(data.seqs))}; rates from {e(data.rate_source)}.</p>
<img alt="Pulse anomaly report" width="{PNG_SIZE[0]}" height="{PNG_SIZE[1]}" src="data:image/png;base64,{b64}">
<h2>Verdict</h2><table>{vrows or '<tr><td>no anomaly verdict</td></tr>'}</table>
<h2>Evidence</h2><table>{erows or '<tr><td>none</td></tr>'}</table>
</body></html>
"""
    out = Path(out_html)
    out.write_text(page, encoding="utf-8")
    return out


def summary(data: ReportData, png: Path, page: Path) -> dict[str, Any]:
    v = data.verdict
    return {
        "png": str(png), "html": str(page), "job": data.job, "source": data.source,
        "culprit_nodes": data.culprit_nodes, "comm_id": data.comm_id, "seqs": data.seqs,
        "rate_source": data.rate_source, "verdicts": data.verdicts,
        "verdict": None if v is None else v.to_dict(),
    }


# ---------------------------------------------------------------- CLI

@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("trace_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--from-influx", "influx_url", metavar="URL",
              help="Read pulse_op / pulse_verdict from InfluxDB at URL instead of a trace directory.")
@click.option("--job", help="Job to plot (with --from-influx; needed when several jobs are there).")
@click.option("--db", help="InfluxQL database (default: PULSE_INFLUX_BUCKET, 'pulse').")
@click.option("--out", "out_png", type=click.Path(dir_okay=False, path_type=Path),
              help="PNG to write (default: TRACE_DIR/report.png, or ./pulse-report-JOB.png); "
                   "the HTML page goes beside it with the .html suffix.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def report(trace_dir: Path | None, influx_url: str | None, job: str | None, db: str | None,
           out_png: Path | None, as_json: bool) -> None:
    """Plot an anomaly: rates around the first anomalous operators, ACT and volume per rank,
    the verdict and its evidence (PNG + self-contained HTML)."""
    from pulse.progress import progress

    if (trace_dir is None) == (influx_url is None):
        raise click.UsageError("give a trace directory or --from-influx URL (one of them)")
    if trace_dir is not None and job is not None:
        raise click.UsageError("--job goes with --from-influx (a trace directory holds one job)")
    with progress("building the report", total=3, json_mode=as_json) as bar:
        if trace_dir is not None:
            if not trace_dir.is_dir():
                raise TraceError(f"{trace_dir}: not a directory (expected a Pulse trace directory)")
            data = build_report_data(trace_dir)
            default_png = trace_dir / "report.png"
        else:
            assert influx_url is not None
            data = build_report_data_from_influx(influx_url, job=job, db=db)
            default_png = Path(f"pulse-report-{data.job or 'job'}.png")
        bar.advance()
        png = draw(data, out_png or default_png)
        bar.advance()
        page = write_html(data, png, png.with_suffix(".html"))
        bar.advance()
    if as_json:
        click.echo(orjson.dumps(summary(data, png, page)).decode())
    else:
        click.echo(_title(data), err=True)
        click.echo(f"wrote {png} and {page}", err=True)
