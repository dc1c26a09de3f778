"""The Kafka publisher: epoch batches and hook events out, keyed by node, never lost quietly.

Normal path: aiokafka batches messages per partition (``linger_ms``) and compresses them
(zstd by default). Every message stays in an in-flight window until the broker confirmed
it. When a send fails (broker down, timeout) the failed message and everything queued after
it go to the disk :class:`~pulse.producers.spool.Spool` in order, and so does every new
message until the spool drained: a background task reconnects with backoff, re-creates the
topics (an in-memory broker that restarted has none), sends the oldest spooled segment,
waits for every confirmation, then deletes it. Order per key is kept; a message confirmed
late after a failure may be delivered twice (at-least-once: consumers drop duplicate
``batch_seq``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

import orjson

from pulse import events as _events
from pulse import samples as _samples
from pulse.errors import ConfigError, ServiceError
from pulse.kafka_security import check_kafka, kafka_client_kwargs
from pulse.settings import Settings

from .coalesce import Coalescer
from .spool import Spool

log = logging.getLogger("pulse.producers")

COMPRESSIONS = ("zstd", "lz4", "gzip", "none")
SEQ_STATE_FILE = "coalesce-seq.json"
SEQ_STATE_EVERY_S = 1.0
# Merged batches a crashed publisher may have numbered after its last save (20 ms each).
UNCLEAN_SEQ_MARGIN = 64
# Bounds of a packed hook-events message (a node's events of one coalescing window).
PACK_EVENTS = 4096
PACK_BYTES = 256 << 10
# Spooled messages sent per confirmation wait when draining. A whole 4 MiB segment (thousands
# of messages) had to be confirmed within one timeout: on a loaded machine it never was,
# the segment was sent again from its start, and the spool grew for ever (the soak).
DRAIN_CHUNK = 256


class Publisher:
    """Async publisher of samples and hook events with a disk spool; ``async with`` it."""

    def __init__(self, settings: Settings, *, bootstrap: str | None = None, compression: str = "zstd",
                 linger_ms: int = 5, max_batch_bytes: int = 1 << 20, send_timeout_s: float = 5.0,
                 max_inflight: int = 2000, spool_dir: str | None = None, spool_max_bytes: int | None = None,
                 create_topics: bool = True, client_id: str = "pulse-producer",
                 retry_backoff_s: tuple[float, float] = (0.2, 5.0), probe_interval_s: float = 0.1,
                 coalesce_ms: float = 0.0, coalesce_rows: int = 16384,
                 batch_version: int = _samples.WIRE_VERSION) -> None:
        if compression not in COMPRESSIONS:
            raise ConfigError(f"compression {compression!r}: use one of {', '.join(COMPRESSIONS)}")
        self.settings = settings
        self.bootstrap = settings.bootstrap(bootstrap)
        self.topics = settings.topics
        self.compression = None if compression == "none" else compression
        self.linger_ms = int(linger_ms)
        if batch_version not in _samples.VERSIONS:
            raise ConfigError(f"batch version {batch_version}: use one of {_samples.VERSIONS}")
        # Version 2 (delta-coded, zstd inside) is ~6x smaller than version 1; consumers
        # read both, version 1 is for consumers older than it.
        self.batch_version = int(batch_version)
        self.max_batch_bytes = int(max_batch_bytes)
        self.send_timeout_s = float(send_timeout_s)
        self.max_inflight = int(max_inflight)
        self.create_topics = create_topics
        self.client_id = client_id
        self.backoff = retry_backoff_s
        self.probe_interval_s = probe_interval_s
        # A NIC's consecutive batches merge into one message for up to coalesce_ms (0 = off):
        # per-message costs downstream dwarf the bytes (see coalesce.py).
        self.coalescer = Coalescer(max_age_s=coalesce_ms / 1000, max_rows=coalesce_rows) if coalesce_ms > 0 else None
        # With coalescing on, a node's hook events of one window also go out as one packed
        # message (events.encode_packed_json), in order; they never trail the batches sent
        # after them (every due batch sends the pending events first).
        self._events: dict[str, list[bytes]] = {}
        self._events_bytes: dict[str, int] = {}
        self._events_since: float | None = None
        self.events_in = 0
        self.event_messages = 0
        self.spool = Spool(spool_dir or settings.spool_dir,
                           settings.spool_max_bytes if spool_max_bytes is None else spool_max_bytes)
        self._producer: Any = None
        self._up = False
        self._inflight: collections.deque[tuple[str, bytes, bytes, asyncio.Future[Any]]] = collections.deque()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # Resolved (and replaced) by every outage: the settle loop waits on it beside the
        # oldest message, whose future an outage may leave unresolved for ever.
        self._outage: asyncio.Future[None] | None = None
        self._drain_pos: tuple[Path, int] | None = None  # (segment, messages confirmed) mid-drain
        self._closing = False
        self.sent = 0
        self.confirmed = 0
        self.bytes_sent = 0
        self.outages = 0
        self.delivered_from_spool = 0

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Publisher:
        # A broker that is up gets the first messages directly rather than via the spool.
        await self.start(wait_s=self.send_timeout_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, *, wait_s: float = 0.0) -> None:
        """Start the background tasks; with ``wait_s`` wait that long for a first connection.

        A broker that refuses our TLS or SASL settings (wrong CA, expired certificate, wrong
        password) is a :class:`ConfigError` naming the setting, raised here before anything is
        taken; a broker that is only down is not (messages spool until it is back)."""
        await check_kafka(self.settings, self.bootstrap, timeout_s=max(self.send_timeout_s, 1.0))
        self._outage = asyncio.get_running_loop().create_future()
        self._tasks = [asyncio.create_task(self._settle_loop(), name="pulse-settle"),
                       asyncio.create_task(self._reconnect_loop(), name="pulse-reconnect"),
                       asyncio.create_task(self._watchdog(), name="pulse-watchdog")]
        if self.coalescer is not None:
            self._load_seq_state()
            self._tasks.append(asyncio.create_task(self._coalesce_loop(), name="pulse-coalesce"))
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wait_up(), wait_s)

    async def _wait_up(self) -> None:
        while not self._up:
            await asyncio.sleep(0.02)

    async def stop(self, *, drain_timeout_s: float = 30.0) -> None:
        """Confirm what is in flight and try to drain the spool for up to ``drain_timeout_s``;
        what is left stays on disk for the next run."""
        await self._send_coalesced()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), drain_timeout_s)
        self._closing = True
        if self._inflight:
            self._up = False
        self._wake.set()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks = []
        # Whatever is still unconfirmed goes to disk so a later run can send it.
        self._spool_inflight()
        self._save_seq_state(clean=True)
        self.spool.close()
        await self._close_producer()
        if not self.spool.empty:
            log.warning("%d bytes of messages remain in the spool %s (sent on the next start)",
                        self.spool.bytes, self.spool.dir)

    async def flush(self) -> None:
        """Return once every message given so far is confirmed by the broker (spool drained)."""
        await self._send_coalesced()
        while True:
            if self._inflight:
                # The oldest first (the settle loop confirms in order); bounded, so a future
                # that never resolves shows as a slow flush, not a loop spinning on a done one.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self._inflight[0][3]), 1.0)
                await asyncio.sleep(0.001)
                continue
            if self._up and self.spool.empty and not self._inflight:
                return
            self._wake.set()
            await asyncio.sleep(0.05)

    @property
    def stats(self) -> dict[str, Any]:
        return {"sent": self.sent, "confirmed": self.confirmed, "bytes": self.bytes_sent,
                "inflight": len(self._inflight), "spool_bytes": self.spool.bytes,
                "spooled": self.spool.spooled, "delivered_from_spool": self.delivered_from_spool,
                "dropped": self.spool.dropped, "outages": self.outages, "connected": self._up,
                "events_in": self.events_in, "event_messages": self.event_messages,
                **({"batches_in": self.coalescer.batches_in, "batches_out": self.coalescer.batches_out,
                    "source_gaps": self.coalescer.source_gaps} if self.coalescer is not None else {})}

    # -- publishing ----------------------------------------------------------------------

    def _encode(self, batch: _samples.EpochBatch) -> bytes:
        return _samples.encode(batch, version=self.batch_version)

    async def publish_batch(self, batch: _samples.EpochBatch) -> None:
        if self.coalescer is None:
            await self.publish(self.topics.samples, batch.node.encode(), self._encode(batch))
            return
        for b in self.coalescer.add(batch, time.monotonic()):
            await self.publish(self.topics.samples, b.node.encode(), self._encode(b))

    async def _send_coalesced(self, now: float | None = None) -> None:
        """Send the merged batches that are due (all of them when ``now`` is None), after
        the pending hook events when any batch or the oldest event is due."""
        if self.coalescer is None:
            return
        ready = [] if not len(self.coalescer) else self.coalescer.drain() if now is None else self.coalescer.due(now)
        if self._events and (now is None or ready or now - (self._events_since or now) >= self.coalescer.max_age_s):
            for node in list(self._events):
                await self._send_events(node)
        for b in ready:
            await self.publish(self.topics.samples, b.node.encode(), self._encode(b))

    async def _coalesce_loop(self) -> None:
        assert self.coalescer is not None
        tick = max(self.coalescer.max_age_s / 2, 0.001)
        saved = time.monotonic()
        while True:
            await asyncio.sleep(tick)
            await self._send_coalesced(time.monotonic())
            if time.monotonic() - saved >= SEQ_STATE_EVERY_S:
                self._save_seq_state(clean=False)
                saved = time.monotonic()

    @property
    def _seq_state_path(self) -> Path:
        return Path(self.spool.dir) / SEQ_STATE_FILE

    def _load_seq_state(self) -> None:
        """Merged batches' numbering of the previous publisher on this spool (see coalesce.py).
        After a crash the saved numbers may be up to SEQ_STATE_EVERY_S old: skip ahead."""
        assert self.coalescer is not None
        try:
            data = orjson.loads(self._seq_state_path.read_bytes())
            self.coalescer.restore(data["nics"], margin=0 if data.get("clean") else UNCLEAN_SEQ_MARGIN)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring %s (%s): merged batch numbering starts afresh", self._seq_state_path, exc)

    def _save_seq_state(self, *, clean: bool) -> None:
        if self.coalescer is None:
            return
        path = self._seq_state_path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(orjson.dumps({"v": 1, "clean": clean, "nics": self.coalescer.state()}))
            tmp.replace(path)
        except OSError as exc:
            log.warning("cannot save %s: %s", path, exc)

    async def publish_event(self, event: _events.HookEvent) -> None:
        raw = _events.encode(event)
        self.events_in += 1
        if self.coalescer is None:
            self.event_messages += 1
            await self.publish(self.topics.hook_events, event.node.encode(), raw)
            return
        pending = self._events.setdefault(event.node, [])
        size = self._events_bytes.get(event.node, 0)
        if pending and (len(pending) >= PACK_EVENTS or size + len(raw) > PACK_BYTES):
            await self._send_events(event.node)
            pending = self._events.setdefault(event.node, [])
            size = 0
        if self._events_since is None:
            self._events_since = time.monotonic()
        pending.append(raw)
        self._events_bytes[event.node] = size + len(raw) + 1

    async def _send_events(self, node: str) -> None:
        values = self._events.pop(node, None)
        self._events_bytes.pop(node, None)
        if not self._events:
            self._events_since = None
        if values:
            self.event_messages += 1
            await self.publish(self.topics.hook_events, node.encode(), _events.encode_packed_json(values))

    async def publish(self, topic: str, key: bytes, value: bytes) -> None:
        if not self._up or not self.spool.empty:
            self.spool.append(topic, key, value)
            self._wake.set()
            return
        producer = self._producer
        try:
            # asyncio.timeout, not wait_for: no task per message (wait_for made one, and that
            # was most of the publisher's cost per message).
            async with asyncio.timeout(self.send_timeout_s):
                fut = await producer.send(topic, value, key=key)
        except Exception as exc:  # broker gone, metadata timeout, buffer full for too long
            if self._producer is producer:
                self._down(exc)
            self.spool.append(topic, key, value)
            return
        if not self._up or self._producer is not producer:
            # The broker went down while aiokafka took it (the watchdog stopped the sender,
            # so this future would never resolve): it goes to the spool like the rest. Also
            # when the outage was over before the send returned: the producer that took it
            # was replaced, and its future would hold up every flush for ever (the soak
            # found this after a broker restart).
            self.spool.append(topic, key, value)
            self._wake.set()
            return
        self.sent += 1
        self.bytes_sent += len(value)
        self._inflight.append((topic, key, value, fut))
        self._wake.set()
        if len(self._inflight) >= self.max_inflight:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._inflight[0][3])

    # -- failure handling ----------------------------------------------------------------

    def _down(self, exc: BaseException) -> None:
        if self._up:
            self.outages += 1
            log.warning("broker %s unreachable (%s): spooling to %s", self.bootstrap,
                        type(exc).__name__ or exc, self.spool.dir)
        self._up = False
        # aiokafka would otherwise keep retrying in the background and hand our messages to
        # a restarted in-memory broker before the topics exist again, which acknowledges
        # and drops them: stop its sender now; unconfirmed messages go to the spool.
        self._stop_sender()
        self._spool_inflight()
        if self._outage is not None and not self._outage.done():
            self._outage.set_result(None)
            self._outage = asyncio.get_running_loop().create_future()
        self._wake.set()

    def _stop_sender(self) -> None:
        sender = getattr(self._producer, "_sender", None)
        task = getattr(sender, "sender_task", None)
        if task is not None and not task.done():
            task.cancel()

    async def _watchdog(self) -> None:
        """Probe the broker between sends: an outage shorter than aiokafka's retry window
        must still be noticed (see :meth:`_down`)."""
        from pulse.broker import probe_metadata

        hosts = [h.rsplit(":", 1) for h in self.bootstrap.split(",")]
        secure = self.settings.kafka_security_protocol != "PLAINTEXT"
        conns: dict[tuple[str, int], Any] = {}
        try:
            while True:
                await asyncio.sleep(self.probe_interval_s)
                if not self._up:
                    continue
                ok = False
                for host, port in hosts:
                    try:
                        if secure:
                            await self._probe_secure(conns, host, int(port))
                        else:
                            await asyncio.to_thread(probe_metadata, host, int(port), 1.0)
                        ok = True
                        break
                    except Exception:
                        continue
                if not ok and self._up:
                    self._down(ConnectionError(f"no broker answers at {self.bootstrap}"))
        finally:
            for conn in conns.values():
                conn.close()

    async def _probe_secure(self, conns: dict[tuple[str, int], Any], host: str, port: int) -> None:
        # Over TLS/SASL a raw Metadata request cannot be sent: keep one authenticated
        # connection per server for the probes (a handshake every probe would cost more).
        from aiokafka.conn import create_conn
        from aiokafka.protocol.metadata import MetadataRequest

        conn = conns.pop((host, port), None)
        try:
            if conn is None or not conn.connected():
                conn = await asyncio.wait_for(create_conn(host, port, **kafka_client_kwargs(self.settings)), 1.0)
            await asyncio.wait_for(conn.send(MetadataRequest([])), 1.0)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        conns[(host, port)] = conn

    def _spool_inflight(self) -> None:
        # Unconfirmed messages keep their order ahead of anything spooled after them.
        pending = list(self._inflight)
        self._inflight.clear()
        if not pending:
            return
        # They must precede what is already in the spool only if the spool was empty; a
        # non-empty spool means they were sent after it drained, so after it is right too.
        for topic, key, value, fut in pending:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.confirmed += 1
                continue
            self.spool.append(topic, key, value)

    async def _settle_loop(self) -> None:
        while True:
            if not self._inflight:
                self._wake.clear()
                await self._wake.wait()
                continue
            fut = self._inflight[0][3]
            if not fut.done():
                # Not the bare future: an outage spools it and stops the sender that would
                # resolve it, and this loop then waited for ever while every later message
                # piled up in flight (a flush never returned; found by the soak).
                waits: tuple[asyncio.Future[Any], ...] = (fut,) if self._outage is None else (fut, self._outage)
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if not fut.done():
                    continue  # spooled by the outage: look at what is in flight now
            mine = bool(self._inflight) and self._inflight[0][3] is fut
            if fut.cancelled() or fut.exception() is not None:
                if mine:  # a late failure of a message already spooled changes nothing
                    self._down(fut.exception() or ConnectionError("send cancelled"))
                continue
            if mine:
                self._inflight.popleft()
                self.confirmed += 1

    async def _reconnect_loop(self) -> None:
        delay = self.backoff[0]
        while not self._closing:
            if self._up and self.spool.empty:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                if not self._up:
                    await self._close_producer()
                    await self._connect()
                await self._drain()
                self._up = True
                delay = self.backoff[0]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._up = False
                log.info("broker %s still unreachable (%s); retrying in %.1f s", self.bootstrap, exc, delay)
                await self._close_producer()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.backoff[1])

    async def _connect(self) -> None:
        from aiokafka import AIOKafkaProducer

        if self.create_topics:
            await ensure_topics(self.bootstrap, self.settings, timeout_s=self.send_timeout_s)
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, client_id=self.client_id, acks="all",
            **kafka_client_kwargs(self.settings),
            compression_type=self.compression, linger_ms=self.linger_ms,
            max_batch_size=self.max_batch_bytes, max_request_size=max(self.max_batch_bytes, 16 << 20),
            request_timeout_ms=int(self.send_timeout_s * 1000), retry_backoff_ms=100,
            enable_idempotence=False)
        try:
            await asyncio.wait_for(producer.start(), self.send_timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                await producer.stop()
            raise
        self._producer = producer

    async def _drain(self) -> None:
        """Send the spool oldest segment first, in chunks; each segment is deleted once
        every message in it is confirmed. A failure mid-segment resumes after the last
        confirmed chunk (what a timed-out chunk had sent may arrive twice: at-least-once)."""
        while True:
            head = self.spool.oldest()
            if head is None:
                return
            path, messages = head
            start = self._drain_pos[1] if self._drain_pos is not None and self._drain_pos[0] == path else 0
            for i in range(start, len(messages), DRAIN_CHUNK):
                chunk = messages[i:i + DRAIN_CHUNK]
                futs = []
                for topic, key, value in chunk:
                    futs.append(await asyncio.wait_for(self._producer.send(topic, value, key=key),
                                                       self.send_timeout_s))
                await asyncio.wait_for(asyncio.gather(*futs), self.send_timeout_s * 2)
                self._drain_pos = (path, i + len(chunk))
                self.delivered_from_spool += len(chunk)
                self.sent += len(chunk)
                self.confirmed += len(chunk)
                self.bytes_sent += sum(len(v) for _, _, v in chunk)
            self.spool.release(path)
            self._drain_pos = None
            log.debug("delivered %d spooled messages from %s", len(messages), path.name)

    async def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if self._up:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), self.send_timeout_s)
            return
        # Broker gone: do not let stop() flush (it would retry); drop the client.
        producer._closed = True
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(producer._sender.close(), 1.0)
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(producer.client.close(), 1.0)


async def ensure_topics(bootstrap: str, settings: Settings, *, timeout_s: float = 10.0,
                        derived_partitions: int | None = None) -> dict[str, int]:
    """Create every Pulse topic with explicit partition counts (never broker auto-create).

    samples and hook-events are co-partitioned (same count, same key = node); op-metrics and
    verdicts are keyed by job and get ``derived_partitions`` (default: the same count), as
    does the compacted incidents topic (key = incident id).
    """
    from pulse.broker import create_topics

    t = settings.topics
    n = settings.partitions
    m = derived_partitions or n
    wanted = {t.samples: n, t.hook_events: n, t.op_metrics: m, t.verdicts: m,
              t.dead_letter: 1, t.pipeline: 1, t.incidents: m}
    # incidents: key = incident id, only the latest state of each matters
    compact = {t.incidents: {"cleanup.policy": "compact"}}
    try:
        return await create_topics(bootstrap, wanted, timeout_s=timeout_s, configs=compact,
                                   client=kafka_client_kwargs(settings))
    except ServiceError:
        raise
    except ConfigError:
        raise


def now_ms() -> int:
    return int(time.time() * 1000)
