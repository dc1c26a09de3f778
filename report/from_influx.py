"""Report data from what the pipeline's InfluxDB sink wrote (:mod:`pulse.streams.influx`):
``pulse_op`` and ``pulse_verdict``, read over InfluxQL (``/query``).

Rows are decoded as the exact inverse of the sink's ``op_line`` and ``verdict_line``:

* ``pulse_op``: tags job (``-`` for no job), node, comm, op (the operator kind); fields rank,
  seq, duration_us, act_us, volume_bytes, expected_bytes, rate_gbps, complete, flows; the
  timestamp is the operator's end truncated to the µs, with ``rank % 1000`` in its ns digits.
* ``pulse_verdict``: tags job, kind and level (``none`` for no value), status; fields nodes,
  ranks and nics (comma-separated), confidence, first_seen_ns, emitted_at, method, id
  (empty for none) and evidence (JSON, cut at 4000 characters: a cut one reads as ``{}``).

What the sink does not write stays unknown here: an operator's start is its end minus its
duration, its communicator's size is the number of ranks that wrote operators for it, its
epoch is unknown (1 ns), and a verdict's window is empty (the report then zooms on the
operators its evidence names).
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import orjson

from pulse.errors import ConfigError, PulseError, ServiceError
from pulse.records import OpMetrics, Verdict

from .assemble import assemble
from .model import ReportData

NO_JOB = "-"
"""The sink's job tag for a record without a job (InfluxDB drops empty tags)."""
NO_VALUE = "none"
"""The sink's kind / level tag for a verdict without one."""


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
    verdicts = [v for v in (verdict_from_row(r) for r in vrows) if v is not None]
    orows = list(_rows(influx_query(url, db, f'SELECT * FROM "pulse_op" WHERE {where}', token=token)))
    if not orows and not verdicts:
        raise ServiceError(f"InfluxDB at {url}, database {db}: nothing for job {job!r}")
    return assemble(job, f"{url} (db {db})", ops_from_rows(orows), verdicts)


def _job(row: dict[str, Any]) -> str:
    job = str(row["job"])
    return "" if job == NO_JOB else job


def ops_from_rows(rows: list[dict[str, Any]]) -> list[OpMetrics]:
    """Operator metrics from ``pulse_op`` rows; a row the sink cannot have written is left
    out of the picture."""
    ranks: dict[str, set[int]] = defaultdict(set)
    for r in rows:
        if isinstance(r.get("comm"), str) and isinstance(r.get("rank"), int):
            ranks[r["comm"]].add(r["rank"])
    out = []
    for r in rows:
        m = op_from_row(r, nranks=len(ranks.get(str(r.get("comm")), ())) or 1)
        if m is not None:
            out.append(m)
    return out


def op_from_row(row: dict[str, Any], *, nranks: int) -> OpMetrics | None:
    try:
        end_ns = int(row["time"]) // 1000 * 1000  # the ns digits are the rank's, not the end's
        duration_ns = round(float(row["duration_us"]) * 1000)
        return OpMetrics(
            job=_job(row), node=str(row["node"]), comm_id=str(row["comm"]), seq=int(row["seq"]),
            rank=int(row["rank"]), kind=str(row["op"]), nranks=nranks,
            start_ns=end_ns - duration_ns, end_ns=end_ns, duration_ns=duration_ns,
            act_ns=round(float(row["act_us"]) * 1000), volume_bytes=int(row["volume_bytes"]),
            expected_bytes=int(row["expected_bytes"]), complete=bool(row["complete"]),
            active_rate=min(float(row["rate_gbps"]) * 1e9 / 8, 1e15), flows=int(row["flows"]), epoch_ns=1,
        )
    except (KeyError, TypeError, ValueError, PulseError):
        return None


def verdict_from_row(row: dict[str, Any]) -> Verdict | None:
    try:
        def tag(name: str) -> str | None:
            value = row.get(name)
            return None if value in (None, "", NO_VALUE) else str(value)

        def split(name: str) -> list[str]:
            return [x for x in str(row[name]).split(",") if x]

        evidence: Any = {}
        try:
            evidence = orjson.loads(row["evidence"])
        except orjson.JSONDecodeError:
            pass  # cut at 4000 characters by the sink
        return Verdict(
            job=_job(row), status=str(row["status"]), kind=tag("kind"), level=tag("level"),
            nodes=split("nodes"), ranks=[int(x) for x in split("ranks")], nics=split("nics"),
            confidence=float(row["confidence"]), evidence=evidence, window={},
            first_seen_ns=int(row["first_seen_ns"]), emitted_at=int(row["emitted_at"]),
            method=tag("method"), id=tag("id"),
        )
    except (KeyError, TypeError, ValueError, PulseError):
        return None
