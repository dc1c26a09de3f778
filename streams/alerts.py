"""Alert delivery: incident state changes POSTed to Alertmanager's API (``/api/v2/alerts``)
or to any webhook that takes the same body.

The body is Alertmanager's list of postable alerts: labels ``alertname`` (PulseIncident),
``job``, ``kind``, ``level``, ``node``, ``nic``, ``incident`` (the stable id) and
``severity``; annotations ``summary`` (the incident's sentence) and ``report`` (a link,
when ``PULSE_ALERT_REPORT_URL`` is set); ``startsAt`` the first operator that showed it;
``endsAt`` set only when the incident is resolved. An open incident is sent again every
``repeat_s`` (Alertmanager resolves an alert it has not heard of for its
``resolve_timeout``, 5 minutes by default).

The sink never blocks the agents: :meth:`AlertSink.add` only queues. One task sends, in
order, batch by batch; a batch that fails (connection refused, 5xx, timeout) is retried
with exponential backoff until it goes through, so a receiver that is down for a while
still gets every change, firing before resolved, when it comes back. Only a queue over
``max_queue`` drops (oldest first, counted): memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any

import orjson

from pulse.records import Incident

from .sink import QueuedSink

log = logging.getLogger("pulse.alerts")


def _rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def alert(inc: Incident, *, report_url: str | None = None, now_ns: int | None = None) -> dict[str, Any]:
    """The Alertmanager postable alert for an incident's current state."""
    labels = {"alertname": "PulseIncident", "job": inc.job or "-", "kind": inc.kind, "level": inc.level,
              "node": ",".join(inc.nodes), "nic": ",".join(inc.nics) or "-", "incident": inc.id,
              "severity": "critical" if inc.kind in ("network-stop", "compute-stop") else "warning"}
    notes = {"summary": inc.summary, "state": inc.state}
    if report_url:
        notes["report"] = report_url.replace("{job}", inc.job).replace("{id}", inc.id)
    out: dict[str, Any] = {"labels": labels, "annotations": notes, "startsAt": _rfc3339(inc.first_seen_ns)}
    if report_url:
        out["generatorURL"] = notes["report"]
    if inc.state == "resolved":
        # Alertmanager takes an alert whose endsAt is not in the future as resolved; the
        # trace time of the resolution may lag the wall clock, so never after "now".
        now = time.time_ns() if now_ns is None else now_ns
        out["endsAt"] = _rfc3339(min(inc.resolved_at_ns or now, now))
    return out


class AlertSink(QueuedSink[Incident]):
    """Queued, retried, ordered delivery of incident state changes to one URL."""

    name = "pulse-alerts"

    def __init__(self, url: str, *, report_url: str | None = None, batch: int = 64, max_queue: int = 10_000,
                 backoff_s: tuple[float, float] = (0.5, 30.0), timeout_s: float = 5.0,
                 repeat_s: float = 60.0) -> None:
        if not url.startswith(("http://", "https://")):
            from pulse.errors import ConfigError

            raise ConfigError(f"PULSE_ALERT_URL={url!r}: must start with http:// or https://")
        super().__init__(max_queue)
        self.url = url
        self.report_url = report_url
        self.batch = batch
        self.backoff = backoff_s
        self.timeout_s = timeout_s
        self.repeat_s = repeat_s
        self._firing: dict[str, Incident] = {}
        self.sent = 0
        self.failures = 0
        self.dropped = 0
        self.last_error: str | None = None

    async def setup(self) -> AlertSink:
        await super().setup()
        return self

    def add(self, incidents: list[Incident]) -> None:
        """Queue state changes (never blocks; the oldest are dropped past ``max_queue``)."""
        for inc in incidents:
            if inc.state == "resolved":
                self._firing.pop(inc.id, None)
            else:
                self._firing[inc.id] = inc
            self._queue.append(inc)
        while len(self._queue) > self.max_queue:
            self._queue.popleft()
            self.dropped += 1
        if incidents:
            self._wake_writer()

    async def _loop(self) -> None:
        assert self._wake is not None
        last_repeat = time.monotonic()
        delay = self.backoff[0]
        while True:
            if not self._queue:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), max(0.05, self.repeat_s - (time.monotonic() - last_repeat)))
            if time.monotonic() - last_repeat >= self.repeat_s:
                last_repeat = time.monotonic()
                # still firing: say so again (queued behind what is pending, in order)
                self._queue.extend(i for i in self._firing.values() if i not in self._queue)
            if not self._queue:
                continue
            chunk = [self._queue[i] for i in range(min(self.batch, len(self._queue)))]
            self._busy = True
            try:
                accepted = await asyncio.to_thread(self._post, chunk)
            except OSError as exc:  # refused, reset, timeout, HTTP error: keep it, try later
                self.failures += 1
                self.last_error = str(exc)
                log.warning("alert delivery to %s failed (%s); retrying in %.1f s", self.url, exc, delay)
                self._busy = False
                await asyncio.sleep(delay)
                delay = min(self.backoff[1], delay * 2)
                continue
            for _ in chunk:  # sent: only now are they off the queue
                if self._queue:
                    self._queue.popleft()
            if accepted:
                self.sent += len(chunk)
            else:
                self.dropped += len(chunk)
            self._busy = False
            delay = self.backoff[0]

    def _post(self, chunk: list[Incident]) -> bool:
        """POST one batch: True when taken, False when refused for good (a 4xx)."""
        body = orjson.dumps([alert(i, report_url=self.report_url) for i in chunk])
        req = urllib.request.Request(self.url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500 and exc.code not in (408, 429):
                # the receiver will never take this body: drop it (counted), do not loop on it
                detail = exc.read()[:200].decode(errors="replace")
                log.error("alert receiver %s refused %d alerts: HTTP %d %s", self.url, len(chunk), exc.code, detail)
                return False
            raise OSError(f"HTTP {exc.code}") from None
        return True

    def stats(self) -> dict[str, Any]:
        return {"alerts_sent": self.sent, "alerts_failed": self.failures, "alerts_dropped": self.dropped,
                "alerts_queued": len(self._queue), "alerts_open": len(self._firing)}
