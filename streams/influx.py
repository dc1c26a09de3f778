"""The InfluxDB sink: verdicts, per-operator metrics and the pipeline's health as points.

Measurements (DESIGN.md "Wire contracts"): ``pulse_verdict`` (tags job, kind, level,
status), ``pulse_incident`` (tags job, kind, level, state), ``pulse_op`` (tags job, node,
comm, op), ``pulse_pipeline`` (tags worker, stage).
Flow ids and seq numbers are fields, never tags (cardinality).

Lifecycle: :meth:`InfluxSink.setup` detects the server from ``/ping`` (an
``X-Influxdb-Version: 1.x`` header means the 1.x ``/write`` endpoint; anything else, e.g.
InfluxDB 2.x/3.x or VictoriaMetrics, gets influxdb-client's v2 write API), ``add_*``
only queue a line (never blocking the agents; a full queue drops and counts), a
background task writes batches from a thread, retrying with exponential backoff, and
:meth:`flush` / :meth:`close` drain it.

An unreachable server, or one answering 408, 429 or 5xx (overloaded, restarting), is
waited for as long as it takes: the batch in hand is retried with backoff (at most
``backoff_s[1]`` apart) and new points queue up to ``max_queue``; beyond that they are
dropped and counted (``dropped``), and what was queued is written when the server
answers again. Only an answer that retrying cannot change (another 4xx) gives up on a
batch after ``retries`` tries. Points still queued when the worker stops are counted as
dropped.

Points older than the bucket's retention are refused by the server (InfluxDB 1.x: HTTP 400,
2.x: 422, "partial write: points beyond retention policy dropped=N"; the rest of the batch
is written). Retrying cannot help, so they are counted (``rejected_retention``, also in
``dropped``) and logged at once, at most once a minute with the running count: a source
whose clock is off, or a replay of old timestamps, shows in the worker's log instead of as
empty dashboards.

Transport: ``https://`` URLs are verified against ``ca_file`` (PULSE_INFLUX_CA_FILE; the
system store when unset). A token is never sent over plain ``http://`` to a host that is not
loopback unless ``allow_plain_token`` (PULSE_INFLUX_ALLOW_PLAIN_TOKEN) says so.

Writes are idempotent: every point's timestamp is a pure function of the record (an
operator's end, a verdict's first-seen time plus a digest of its identity), so writing
the same record twice gives one point.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import orjson

from pulse.errors import ConfigError, ServiceError
from pulse.records import Incident, OpMetrics, Verdict
from pulse.settings import Settings, is_loopback_url

from .sink import QueuedSink

log = logging.getLogger("pulse.streams.influx")

RETENTION_LOG_INTERVAL_S = 60.0
_DROPPED = re.compile(r"dropped[= ](\d+)")


def transient(exc: BaseException) -> bool:
    """True when a failed write may succeed later unchanged: no answer at all (refused,
    reset, timed out) or an answer meaning "not now" (408, 429, 5xx)."""
    status = getattr(exc, "status", None)
    if status is None:
        return True
    try:
        code = int(status)
    except (TypeError, ValueError):
        return True
    return code in (408, 429) or code >= 500


def retention_refused(exc: BaseException, points: int) -> int | None:
    """How many of ``points`` the server refused as beyond the retention policy, when
    ``exc`` says so (1.x and 2.x wordings: "points beyond retention policy dropped=N",
    "dropped N points outside retention policy"); None for any other failure."""
    text = f"{exc} {getattr(exc, 'body', '') or ''}"
    if "retention polic" not in text.lower():
        return None
    m = _DROPPED.search(text)
    return min(int(m.group(1)), points) if m else points


# -- line protocol -----------------------------------------------------------------------

def _esc_key(s: str) -> str:
    # Line protocol cannot express a backslash before an escaped character unambiguously;
    # names here never hold one (check_name), so any is replaced.
    return s.replace("\\", "/").replace(",", r"\,").replace("=", r"\=").replace(" ", r"\ ")


def _esc_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _field(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"{v}i"
    if isinstance(v, float):
        return repr(v) if v == v and abs(v) != float("inf") else "0.0"
    return _esc_str(str(v))


def line(measurement: str, tags: dict[str, str | None], fields: dict[str, Any], ts_ns: int) -> str:
    """One line-protocol point (empty tag values are left out, as InfluxDB requires)."""
    tag_s = "".join(f",{_esc_key(k)}={_esc_key(str(v))}" for k, v in sorted(tags.items())
                    if v is not None and str(v) != "")
    field_s = ",".join(f"{_esc_key(k)}={_field(v)}" for k, v in fields.items() if v is not None)
    return f"{_esc_key(measurement)}{tag_s} {field_s} {int(ts_ns)}"


def _digest(*parts: object) -> int:
    return zlib.crc32(orjson.dumps(parts, option=orjson.OPT_SORT_KEYS)) % 1000


def op_line(m: OpMetrics) -> str:
    # Ranks of one communicator on one node share the tag set; the sub-microsecond part of
    # the timestamp is the rank, so they never overwrite each other.
    ts = (m.end_ns // 1000) * 1000 + m.rank % 1000
    rate_gbps = m.volume_bytes * 8 / m.act_ns if m.act_ns else 0.0
    return line("pulse_op", {"job": m.job or "-", "node": m.node, "comm": m.comm_id, "op": m.kind},
                {"rank": m.rank, "seq": m.seq, "duration_us": m.duration_ns / 1000, "act_us": m.act_ns / 1000,
                 "volume_bytes": m.volume_bytes, "expected_bytes": m.expected_bytes,
                 "rate_gbps": float(rate_gbps), "complete": m.complete, "flows": m.flows}, ts)


def verdict_line(v: Verdict) -> str:
    ident = v.id or (v.status, v.kind, v.level, v.nodes, v.window)
    ts = (v.first_seen_ns // 1000) * 1000 + _digest(ident, v.status)
    return line("pulse_verdict", {"job": v.job or "-", "kind": v.kind or "none", "level": v.level or "none",
                                  "status": v.status},
                {"nodes": ",".join(v.nodes), "ranks": ",".join(map(str, v.ranks)), "nics": ",".join(v.nics),
                 "confidence": float(v.confidence), "first_seen_ns": v.first_seen_ns, "emitted_at": v.emitted_at,
                 "method": v.method or "pulse", "id": v.id or "",
                 "evidence": orjson.dumps(v.evidence).decode()[:4000]}, ts)


def incident_line(i: Incident) -> str:
    # One point per state change, at the trace time it speaks of (Grafana draws them as
    # annotations on the rate panels); the id is a field: one tag value per fault would
    # grow the series without bound.
    at = {"open": i.first_seen_ns, "updated": i.last_seen_ns}.get(i.state, i.resolved_at_ns or i.last_seen_ns)
    ts = (at // 1000) * 1000 + _digest(i.id, i.state, i.updates)
    return line("pulse_incident", {"job": i.job or "-", "kind": i.kind, "level": i.level, "state": i.state},
                {"id": i.id, "nodes": ",".join(i.nodes), "nics": ",".join(i.nics), "ranks": ",".join(map(str, i.ranks)),
                 "summary": i.summary, "confidence": float(i.confidence), "ops": i.ops, "updates": i.updates,
                 "first_seen_ns": i.first_seen_ns, "last_seen_ns": i.last_seen_ns,
                 "resolved_at_ns": i.resolved_at_ns, "resolution": i.resolution, "emitted_at": i.emitted_at}, ts)


def pipeline_line(worker: str, stage: str, fields: dict[str, Any], interval_ns: int,
                  now_ns: int | None = None) -> str:
    now = time.time_ns() if now_ns is None else now_ns
    return line("pulse_pipeline", {"worker": worker, "stage": stage}, fields, now - now % interval_ns)


# -- the sink ----------------------------------------------------------------------------

class InfluxSink(QueuedSink[str]):
    """Batched, retried, non-blocking writer to InfluxDB 1.x or the v2 write API."""

    name = "pulse-influx"

    def __init__(self, url: str, *, org: str = "pulse", bucket: str = "pulse", token: str | None = None,
                 batch_lines: int = 2000, flush_interval_s: float = 0.5, max_queue: int = 200_000,
                 retries: int = 6, backoff_s: tuple[float, float] = (0.2, 5.0), timeout_s: float = 5.0,
                 write_ops: bool = True, ca_file: str | Path | None = None,
                 allow_plain_token: bool = False) -> None:
        super().__init__(max_queue)
        if token and url.startswith("http://") and not allow_plain_token and not is_loopback_url(url):
            raise ConfigError(f"PULSE_INFLUX_URL={url}: refusing to send the InfluxDB token over plain http to a "
                              "non-loopback host (use https://, or set PULSE_INFLUX_ALLOW_PLAIN_TOKEN=1)")
        self.ca_file = str(ca_file) if ca_file is not None else None
        self._ssl: ssl.SSLContext | None = None
        if url.startswith("https://"):
            try:
                self._ssl = ssl.create_default_context(cafile=self.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"PULSE_INFLUX_CA_FILE={self.ca_file}: not a readable PEM CA bundle ({exc})") from None
        self.url = url.rstrip("/")
        self.org = org
        self.bucket = bucket
        self.token = token
        self.batch_lines = batch_lines
        self.flush_interval_s = flush_interval_s
        self.retries = retries
        self.backoff = backoff_s
        self.timeout_s = timeout_s
        self.write_ops = write_ops
        self.version: str | None = None
        self.v1 = False
        self._client: Any = None
        self._write_api: Any = None
        self.written = 0
        self.dropped = 0
        self.failed_batches = 0
        self.retried = 0
        self.rejected_retention = 0
        self.outage_since: float | None = None  # monotonic time of the first failed try of an outage
        self._in_hand = 0
        self._retention_logged_at = -RETENTION_LOG_INTERVAL_S

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> InfluxSink:
        if not settings.influx_url:
            raise ConfigError("PULSE_INFLUX_URL is not set")
        return cls(settings.influx_url, org=settings.influx_org, bucket=settings.influx_bucket,
                   token=settings.influx_token, ca_file=settings.influx_ca_file,
                   allow_plain_token=settings.influx_allow_plain_token, **kwargs)

    # lifecycle ---------------------------------------------------------------------------

    async def setup(self) -> InfluxSink:
        await super().setup()
        return self

    async def _open(self) -> None:
        try:
            await asyncio.to_thread(self._detect)
        except ServiceError as exc:
            # A worker (re)started while InfluxDB is down still starts: the writer detects
            # the server before its first write and queues points until then.
            log.warning("%s; points are queued until it answers", exc)

    def _detect(self) -> None:
        try:
            req = urllib.request.Request(self.url + "/ping", method="GET")
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._ssl) as resp:
                version = resp.headers.get("X-Influxdb-Version") or ""
        except (OSError, urllib.error.URLError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise ConfigError(f"PULSE_INFLUX_CA_FILE={self.ca_file}: does not verify InfluxDB's certificate at "
                                  f"{self.url} ({reason.verify_message})") from None
            raise ServiceError(f"InfluxDB at {self.url} does not answer /ping: {exc}") from None
        self.v1 = version.startswith("1.")
        if self.v1:
            q = urllib.parse.urlencode({"q": f'CREATE DATABASE "{self.bucket}"'})
            self._http("POST", f"/query?{q}", b"")
        else:
            from influxdb_client import InfluxDBClient
            from influxdb_client.client.write_api import SYNCHRONOUS

            self._client = InfluxDBClient(url=self.url, token=self.token or "", org=self.org,
                                          timeout=int(self.timeout_s * 1000), verify_ssl=True,
                                          ssl_ca_cert=self.ca_file)
            self._write_api = self._client.write_api(write_options=SYNCHRONOUS)
        self.version = version  # detected: set last, so a failure above is detected again

    def _http(self, method: str, path: str, body: bytes) -> None:
        headers = {"Content-Type": "text/plain; charset=utf-8"}
        if self.token:
            headers["Authorization"] = f"Token {self.token}"
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._ssl) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode(errors="replace")
            err = ServiceError(f"InfluxDB {self.url}{path.split('?')[0]}: HTTP {exc.code} {detail}")
            err.status = exc.code  # type: ignore[attr-defined]  # transient() reads it
            raise err from None

    def _shut(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None

    # adding (never blocks) ---------------------------------------------------------------

    def add(self, lines: list[str]) -> None:
        room = self.max_queue - len(self._queue)
        if room < len(lines):
            self.dropped += len(lines) - max(room, 0)
            lines = lines[:max(room, 0)]
        self._queue.extend(lines)
        if len(self._queue) >= self.batch_lines:
            self._wake_writer()

    def add_verdicts(self, verdicts: list[Verdict]) -> None:
        self.add([verdict_line(v) for v in verdicts])
        if verdicts:
            self._wake_writer()  # verdicts are what operators wait for: no linger

    def add_incidents(self, incidents: list[Incident]) -> None:
        self.add([incident_line(i) for i in incidents])
        if incidents:
            self._wake_writer()  # what operators wait for, like verdicts

    def add_metrics(self, metrics: list[OpMetrics]) -> None:
        if self.write_ops:
            self.add([op_line(m) for m in metrics])

    def add_pipeline(self, worker: str, stage: str, fields: dict[str, Any], interval_ns: int) -> None:
        self.add([pipeline_line(worker, stage, fields, interval_ns)])

    # writing -----------------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self._queue:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.flush_interval_s)
                continue
            n = min(len(self._queue), self.batch_lines)
            chunk = [self._queue.popleft() for _ in range(n)]
            self._busy = True
            try:
                await self._write_with_retry(chunk)
            finally:
                self._busy = False

    async def _write_with_retry(self, chunk: list[str]) -> None:
        body = ("\n".join(chunk) + "\n").encode()
        delay = self.backoff[0]
        attempt = 0
        # Counted as dropped by close() if the writer is cancelled with it (server still down).
        self._in_hand = len(chunk)
        while True:
            try:
                await asyncio.to_thread(self._write, body)
                self.written += len(chunk)
                self._in_hand = 0
                if self.outage_since is not None:
                    log.warning("InfluxDB %s answers again after %.1f s", self.url,
                                time.monotonic() - self.outage_since)
                    self.outage_since = None
                return
            except Exception as exc:
                refused = retention_refused(exc, len(chunk))
                if refused is not None:
                    self._in_hand = 0
                    self._refused_for_retention(refused, len(chunk), exc)
                    return
                # A server that is down or overloaded is waited for (the queue is the bound);
                # an answer that retrying cannot change is given up after `retries`.
                if not transient(exc) and attempt >= self.retries:
                    self._in_hand = 0
                    self.failed_batches += 1
                    self.dropped += len(chunk)
                    log.error("InfluxDB %s: giving up on %d points after %d tries: %s",
                              self.url, len(chunk), attempt + 1, exc)
                    return
                if transient(exc) and self.outage_since is None:
                    self.outage_since = time.monotonic()
                attempt += 1
                self.retried += 1
                if attempt <= self.retries or attempt % 20 == 0:  # a long outage: not a line per try
                    log.warning("InfluxDB %s write failed (%s); retry in %.1f s (%d queued)", self.url, exc,
                                delay, len(self._queue))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])

    async def close(self, *, timeout_s: float = 10.0) -> None:
        await super().close(timeout_s=timeout_s)
        # What could not be written before the stop (the server still down) is lost: counted.
        left = len(self._queue) + self._in_hand
        if left:
            self.dropped += left
            log.error("InfluxDB %s: %d points not written at stop (server unreachable)", self.url, left)
            self._queue.clear()
            self._in_hand = 0

    def _refused_for_retention(self, refused: int, points: int, exc: BaseException) -> None:
        self.rejected_retention += refused
        self.dropped += refused
        self.written += points - refused  # a partial write keeps the rest of the batch
        now = time.monotonic()
        if now - self._retention_logged_at >= RETENTION_LOG_INTERVAL_S:
            self._retention_logged_at = now
            log.error("InfluxDB %s refused %d of %d points as older than the retention of %r "
                      "(%d so far): are the sources' timestamps on the wall clock? (%s)",
                      self.url, refused, points, self.bucket, self.rejected_retention, exc)

    def _write(self, body: bytes) -> None:
        if self.version is None:
            self._detect()
        if self.v1:
            q = urllib.parse.urlencode({"db": self.bucket, "precision": "ns"})
            self._http("POST", f"/write?{q}", body)
        else:
            from influxdb_client import WritePrecision

            self._write_api.write(bucket=self.bucket, org=self.org, record=body.decode(),
                                  write_precision=WritePrecision.NS)

    @property
    def stats(self) -> dict[str, Any]:
        return {"url": self.url, "api": "v1" if self.v1 else "v2", "written": self.written,
                "queued": len(self._queue), "dropped": self.dropped, "retried": self.retried,
                "failed_batches": self.failed_batches, "rejected_retention": self.rejected_retention,
                "outage": self.outage_since is not None}
