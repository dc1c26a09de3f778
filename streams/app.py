"""The Faust app: topics, the segment and localize agents, the pipeline timer.

* Topics are created up front with explicit partition counts (``ensure_topics``): samples
  and hook-events co-partitioned (same key = node, same count); Faust only declares what
  already exists, and broker auto-create is never relied on.
* ``segment`` consumes samples *and* hook-events in one agent (Faust has no stream-stream
  join), per-node :class:`~pulse.segmentation.NodeSegmenter` state in
  :class:`~pulse.streams.state.SegmentState`, and sends op-metrics keyed by job.
* ``localize`` consumes op-metrics, one Localizer per job (in a child process by default,
  see offload.py), and sends verdicts keyed by job, one per message.
* Hook events and op-metrics may travel packed (several records per message, see
  docs/semantics.md): every Kafka message costs a Faust agent ~0.25 ms before any Pulse
  code runs, far more than its bytes.
* Messages that fail to decode go to the dead-letter topic with the error; the partition
  goes on.
* CPU work (numba kernels, localization) runs in one thread per agent on chunks of at most
  ``chunk`` messages, so the event loop keeps serving heartbeats and timers.
* Processing is at-least-once (Tansu has no transactions). State is in memory and
  rebuilt on start: before taking new messages, each agent replays its input topics up to
  its group's committed offsets (outputs dropped: they were sent before that commit), then
  Faust resumes at those offsets. (Faust tables were tried: against Tansu a table's changelog made
  the group join take 30 s and recovery stall, so no table holds state here.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiokafka.partitioner import murmur2

from pulse.bounds import InputBounds
from pulse.kafka_security import check_kafka, faust_broker_credentials, kafka_client_kwargs
from pulse.records import Verdict
from pulse.settings import Settings

from .alerts import AlertSink
from .health import write_health
from .influx import InfluxSink
from .offload import LocalizeProcess
from .readback import committed_offsets, read_back
from .state import LocalizeState, Message, Output, SegmentState
from .takeover import Ownership, incidents_on, replay_partitions

log = logging.getLogger("pulse.streams")

PIPELINE_INTERVAL_S = 0.5
HANDED_LIMIT = 1 << 18
# How long the worker's consumer lets the broker hold a fetch that finds no data. Faust
# hard-codes 1500 ms, and Tansu does not answer a waiting fetch when data arrives: it
# answers at the end of the wait (measured: 0.13-0.54 s per message at 1500, 2-20 ms at
# 100), so every stage of a live stream waited up to half a second per hop.
FETCH_MAX_WAIT_MS = 50


def _short_fetch_wait(ms: int = FETCH_MAX_WAIT_MS) -> None:
    """Make Faust's worker consumer use a ``fetch_max_wait_ms`` of ``ms`` (Faust exposes no
    setting for it; the aiokafka consumer reads the attribute when it starts)."""
    from faust.transport.drivers import aiokafka as faust_aiokafka

    thread = faust_aiokafka.AIOKafkaConsumerThread
    create = getattr(thread, "_create_worker_consumer", None)
    if create is None:  # a Faust that renamed it: correct, only slower on Tansu (see above)
        log.warning("cannot shorten the consumer's fetch wait on this Faust version")
        return
    if getattr(create, "pulse_fetch_wait", None) == ms:
        return
    create = getattr(create, "__wrapped__", create)

    def create_worker_consumer(self: Any, transport: Any) -> Any:
        consumer = create(self, transport)
        consumer._fetch_max_wait_ms = ms
        return consumer

    create_worker_consumer.__wrapped__ = create  # type: ignore[attr-defined]
    create_worker_consumer.pulse_fetch_wait = ms  # type: ignore[attr-defined]
    thread._create_worker_consumer = create_worker_consumer  # type: ignore[method-assign]


def _warm_up() -> None:
    """Load numba kernels and lazily imported modules now rather than on the first
    messages (about a second of stalled stream otherwise)."""
    with contextlib.suppress(ImportError):
        from pulse.segmentation.streaming import warm_up

        warm_up()
    with contextlib.suppress(ImportError):
        import pulse.localization  # noqa: F401


class Pipeline:
    """Builds the Faust app for a :class:`~pulse.settings.Settings`; holds the agents' state."""

    def __init__(self, settings: Settings, *, bootstrap: str | None = None, influx: InfluxSink | None = None,
                 segment_params: Any = None, localize_params: Any = None, chunk: int = 1024,
                 within_s: float = 0.05, on_verdicts: Callable[[list[Verdict]], None] | None = None,
                 session_timeout_s: float = 10.0, localize_process: bool = True,
                 alerts: AlertSink | None = None, health_path: Path | None = None) -> None:
        self.settings = settings
        self.health_path = health_path  # `pulse worker --health` reads it (health.py)
        self.bootstrap = settings.bootstrap(bootstrap)
        self.topics = settings.topics
        self.member = settings.worker_name or settings.worker_id
        # Partitions whose state this worker holds: one it gets in a rebalance (another
        # worker left) is rebuilt from its committed messages first (takeover.py).
        self.seg_owned = Ownership([self.topics.samples, self.topics.hook_events])
        self.loc_owned = Ownership([self.topics.op_metrics])
        self.taken_over = 0
        self.segment_state = SegmentState(self.topics, segment_params, InputBounds.from_settings(settings))
        # Localization in a child process by default: a core of its own rather than a share
        # of this process's GIL with Faust and segmentation (see offload.py).
        if localize_params is None:  # the operator's settings (PULSE_CLOCK_SKEW_US)
            from pulse.engine.configured import localize_params as configured

            localize_params = configured(settings)
        self.localize_state: LocalizeState | LocalizeProcess = (
            LocalizeProcess(localize_params) if localize_process else LocalizeState(localize_params))
        self.influx = influx
        self.alerts = alerts
        self.incidents_sent = 0
        self.chunk = chunk
        self.within_s = within_s
        self.on_verdicts = on_verdicts
        self.session_timeout_s = session_timeout_s
        _warm_up()
        self._seg_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulse-segment")
        self._loc_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pulse-localize")
        self.lag_ms: dict[str, float] = {}
        self.verdicts_sent = 0
        self.dead_sent = 0
        self.messages_in = 0  # input messages taken live (not the rebuild): the soak counts duplicates
        self.started_ns = time.time_ns()
        self.input_done_at_ns = 0
        self.seeded: set[str] = set()
        self._handed: dict[bytes, int] = {}
        self._loc_busy = 0
        self._draining: asyncio.Future[None] | None = None
        self._local_tasks: set[asyncio.Task[None]] = set()
        # Faust creates "<id>-data" in the working directory unless told otherwise; the
        # tables live in memory, so a private temporary directory, removed on close, will do.
        self._datadir = tempfile.mkdtemp(prefix=f"pulse-{settings.worker_id}-")
        self.app = self._build()

    def _build(self) -> Any:
        import faust

        _short_fetch_wait()
        s = self.settings
        t = self.topics
        app = faust.App(
            s.worker_id, broker=f"kafka://{self.bootstrap}", store="memory://", datadir=self._datadir,
            broker_credentials=faust_broker_credentials(s),
            autodiscover=False,
            web_enabled=False, processing_guarantee="at_least_once", topic_partitions=s.partitions,
            topic_replication_factor=1, topic_allow_declare=False, topic_disable_leader=True,
            consumer_auto_offset_reset="earliest", producer_compression_type="zstd", producer_linger_ms=1,
            broker_session_timeout=self.session_timeout_s, broker_heartbeat_interval=1.0,
            broker_rebalance_timeout=self.session_timeout_s, broker_commit_interval=1.0,
            stream_wait_empty=False, producer_acks=-1,
        )
        raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                               "value_serializer": "raw"}
        inputs = app.topic(t.samples, t.hook_events, partitions=s.partitions, **raw)
        op_metrics = app.topic(t.op_metrics, partitions=s.partitions, **raw)
        verdicts = app.topic(t.verdicts, partitions=s.partitions, **raw)
        dead = app.topic(t.dead_letter, partitions=1, **raw)
        pipeline = app.topic(t.pipeline, partitions=1, **raw)
        incidents = app.topic(t.incidents, partitions=s.partitions, **raw)
        self.topic_objects = {"op_metrics": op_metrics, "verdicts": verdicts, "dead": dead, "pipeline": pipeline,
                              "incidents": incidents}

        @app.agent(inputs, name="pulse-segment")
        async def segment(stream: Any) -> None:
            await self._seed_segmenters()
            self.seeded.add("segment")
            async for chunk in stream.take_events(self.chunk, within=self.within_s):
                msgs = [self._message(ev) for ev in chunk]
                await self._take_over(app, msgs, self.seg_owned)
                self.messages_in += len(msgs)
                out = await self._run(self._seg_pool, self.segment_state.handle, msgs)
                self.input_done_at_ns = time.time_ns()
                self._note_lag("segment", chunk)
                await self._publish_op_metrics(app, out.op_metrics, verdicts)
                if self.influx is not None and out.metrics:
                    self.influx.add_metrics(out.metrics)
                await self._dead(out, dead)

        @app.agent(op_metrics, name="pulse-localize")
        async def localize(stream: Any) -> None:
            await self._seed_localizers()
            self.seeded.add("localize")
            async for chunk in stream.take_events(self.chunk, within=self.within_s):
                await self._take_over(app, [self._message(ev) for ev in chunk], self.loc_owned)
                every = [self._message(ev) for ev in chunk]
                msgs = [m for m in every if not self._handed_over(m)]
                self._note_lag("localize", chunk)
                if len(msgs) < len(every) and self._local_tasks:
                    # This chunk is committed once done: the records of it that were handed
                    # to the local localizer must have had their verdicts sent by then, or a
                    # worker killed in between loses them (its successor's rebuild drops the
                    # outputs of what was committed).
                    await asyncio.wait(list(self._local_tasks))
                if not msgs:
                    continue
                out = await self._localize(msgs)
                await self._send_verdicts(out, verdicts)
                await self._dead(out, dead)
                self._drain_backlog(verdicts)

        @app.timer(0.25)
        async def release_held() -> None:
            # Operators held for alignment go out even when no new record arrives.
            if self.localize_state.active:
                out = await self._run(self._loc_pool, lambda _m: self.localize_state.tick(), [])
                await self._send_verdicts(out, verdicts)
                self._drain_backlog(verdicts)

        @app.timer(PIPELINE_INTERVAL_S)
        async def pipeline_stats() -> None:
            rec = self.pipeline_record(app)
            if self.health_path is not None:  # before the send, which waits on the broker
                write_health(self.health_path, rec)
            await pipeline.send(key=s.worker_id.encode(), value=orjson.dumps(rec))
            if self.influx is not None:
                fields = {k: v for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
                self.influx.add_pipeline(s.worker_id, "worker", fields, int(PIPELINE_INTERVAL_S * 1e9))

        if self.alerts is not None:
            sink = self.alerts

            @app.task
            async def alerts_lifecycle() -> None:
                await sink.setup()
                try:
                    await asyncio.Event().wait()
                finally:
                    await sink.close(timeout_s=5.0)  # what is queued still goes out

        if self.influx is not None:
            influx = self.influx

            @app.task
            async def influx_lifecycle() -> None:
                await influx.setup()
                try:
                    await asyncio.Event().wait()  # until the worker stops and cancels this task
                finally:
                    await influx.close(timeout_s=5.0)  # what is queued still goes out

        self.agents = (segment, localize)
        return app

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _message(ev: Any) -> Message:
        m = ev.message
        return Message(topic=m.topic, key=m.key, value=m.value, partition=m.partition, offset=m.offset,
                       timestamp=m.timestamp)

    def _op_metrics_partition(self, key: bytes) -> int:
        # aiokafka's default partitioner, computed here so the partition is known before
        # sending (records of a local partition go to the local localizer directly).
        return (murmur2(key) & 0x7FFFFFFF) % self.settings.partitions

    async def _publish_op_metrics(self, app: Any, records: list[tuple[bytes, bytes]], verdicts: Any) -> None:
        """Send op-metrics (raw bytes straight to the producer: none of Topic.send's
        serialisation and bookkeeping, which cost more than the send), and hand the records
        of partitions this worker owns to its localize state at once: the localize agent
        would only get them back after a produce/fetch round trip behind its backlog. It
        drops them when they come back from the topic (by value)."""
        if not records:
            return
        t = self.topics
        send = app.producer.send
        try:  # only partitions whose state is here (one just taken over is rebuilt first)
            mine = {tp.partition for tp in app.consumer.assignment()
                    if tp.topic == t.op_metrics and self.loc_owned.holds(tp.partition)}
        except Exception:  # no consumer yet (starting): everything goes the long way
            mine = set()
        local: list[Message] = []
        for key, value in records:
            p = self._op_metrics_partition(key)
            if p in mine:  # noted before sending: it must be known when the copy comes back
                local.append(Message(t.op_metrics, key, value, p, None, None))
                self._handed[value] = self._handed.get(value, 0) + 1
            await send(t.op_metrics, key, value, p, None, None)
        if len(self._handed) > HANDED_LIMIT:  # records that never came back (a rebalance)
            self._handed.clear()
        if local:
            fut = self._localize(local)
            task = asyncio.ensure_future(self._after_local_localize(fut, verdicts))
            self._local_tasks.add(task)
            task.add_done_callback(self._local_tasks.discard)

    async def _take_over(self, app: Any, msgs: list[Message], owned: Ownership) -> None:
        """Rebuild the state of partitions new to this worker (a rebalance gave them: another
        worker left) before taking their messages (takeover.py)."""
        try:
            assignment = app.consumer.assignment()
        except Exception:  # no consumer yet
            return
        new = owned.new(assignment, [(m.topic, m.partition) for m in msgs])
        if not new:
            return
        t, n = self.topics, self.settings.partitions
        segment = owned is self.seg_owned
        topics = [t.hook_events, t.samples] if segment else [t.op_metrics]
        replay = await replay_partitions(self.bootstrap, self.settings.worker_id, topics, new,
                                         hook_topic=t.hook_events, client=kafka_client_kwargs(self.settings))
        state: Any = self.segment_state if segment else self.localize_state
        extra: tuple[Any, ...] = ()
        if not segment:  # the jobs' incidents go on with their ids (takeover.py)
            incidents, bad = await incidents_on(self.bootstrap, t.incidents, client=kafka_client_kwargs(self.settings))
            if bad:
                log.warning("%s: %d incident records that do not decode skipped: %s", self.member, len(bad), bad[:3])
            extra = (incidents,)
        await self._run(self._seg_pool if segment else self._loc_pool,
                        lambda _m: state.adopt(new, n, replay, *extra) or Output(), [])
        self.taken_over += len(new)
        log.warning("%s: took over %s partitions %s (rebuilt from %d committed messages)", self.member,
                    "segment" if segment else "localize", sorted(new), len(replay))

    def _localize(self, msgs: list[Message]) -> asyncio.Future[Output]:
        """Records to the localize state, in submission order (one thread); counted until
        done, so the pipeline record can tell a localizer with a backlog from an idle one."""
        self._loc_busy += 1
        fut = asyncio.get_running_loop().run_in_executor(self._loc_pool, self.localize_state.handle, msgs)
        fut.add_done_callback(self._localized)
        return fut

    def _localized(self, _fut: asyncio.Future[Output]) -> None:
        self._loc_busy -= 1

    async def _after_local_localize(self, fut: asyncio.Future[Output], verdicts: Any) -> None:
        out = await fut
        await self._send_verdicts(out, verdicts)
        await self._dead(out, self.topic_objects["dead"])
        self._drain_backlog(verdicts)

    def _drain_backlog(self, verdicts: Any) -> None:
        """While the localize state has released operators left to judge (its calls have a
        time budget), keep calling it, sending each call's verdicts as they come."""
        if self.localize_state.backlog and (self._draining is None or self._draining.done()):
            self._draining = asyncio.ensure_future(self._drain(verdicts))

    async def _drain(self, verdicts: Any) -> None:
        while self.localize_state.backlog:
            out = await self._run(self._loc_pool, lambda _m: self.localize_state.tick(), [])
            await self._send_verdicts(out, verdicts)

    def _handed_over(self, m: Message) -> bool:
        n = self._handed.get(m.value or b"")
        if not n:
            return False
        if n == 1:
            del self._handed[m.value or b""]
        else:
            self._handed[m.value or b""] = n - 1
        return True

    async def _run(self, pool: concurrent.futures.Executor, fn: Callable[[list[Message]], Output],
                   msgs: list[Message]) -> Output:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, msgs)

    def _note_lag(self, stage: str, chunk: list[Any]) -> None:
        ts = max((ev.message.timestamp or 0) for ev in chunk) if chunk else 0
        if ts:
            self.lag_ms[stage] = max(0.0, time.time() * 1000 - ts * (1000 if ts < 1e11 else 1))

    async def _send_verdicts(self, out: Output, topic: Any) -> None:
        """A localize call's verdicts to the verdict topic, and the incident state changes
        they caused to the compacted incidents topic (key = incident id); both to InfluxDB,
        incidents to the alert sink."""
        vs, incs = out.verdicts, out.incidents
        for v in vs:
            await topic.send(key=(v.job or "").encode(), value=v.to_json())
        for i in incs:
            await self.topic_objects["incidents"].send(key=i.id.encode(), value=i.to_json())
        self.verdicts_sent += len(vs)
        self.incidents_sent += len(incs)
        if self.influx is not None:
            if vs:
                self.influx.add_verdicts(vs)
            if incs:
                self.influx.add_incidents(incs)
        if self.alerts is not None and incs:
            self.alerts.add(incs)
        if self.on_verdicts is not None and vs:
            self.on_verdicts(vs)

    async def _dead(self, out: Output, topic: Any) -> None:
        for d in out.dead:
            log.warning("dead letter from %s[%s]@%s: %s", d.topic, d.partition, d.offset, d.error)
            await topic.send(key=d.topic.encode(), value=d.to_json())
        self.dead_sent += len(out.dead)

    async def _replay(self, topics: list[str]) -> list[Message]:
        """What this worker's group had processed and committed before it (re)started, in
        the order it was produced: replaying it rebuilds the in-memory state exactly as it
        was at the commit (outputs were sent before that commit, so they are dropped)."""
        try:
            committed = await committed_offsets(self.bootstrap, self.settings.worker_id, topics,
                                                client=kafka_client_kwargs(self.settings))
        except Exception as exc:  # a broker without OffsetFetch for admins: start empty
            log.warning("cannot read committed offsets (%s): state starts empty", exc)
            return []
        msgs: list[Message] = []
        for topic in topics:
            upto = {p: off for (t, p), off in committed.items() if t == topic}
            if upto:
                msgs += await read_back(self.bootstrap, topic, upto=upto, client=kafka_client_kwargs(self.settings))
        msgs.sort(key=lambda m: (m.timestamp or 0, m.topic != self.topics.hook_events))
        return msgs

    async def _seed_segmenters(self) -> None:
        msgs = await self._replay([self.topics.hook_events, self.topics.samples])
        for i in range(0, len(msgs), 1024):
            await self._run(self._seg_pool, self.segment_state.handle, msgs[i:i + 1024])
        if msgs:
            log.warning("rebuilt segmentation state from %d committed messages", len(msgs))

    async def _seed_localizers(self) -> None:
        if isinstance(self.localize_state, LocalizeProcess):  # the child imported and warmed up
            await asyncio.get_running_loop().run_in_executor(self._loc_pool, self.localize_state.start, 120.0)
        msgs = await self._replay([self.topics.op_metrics])
        for i in range(0, len(msgs), 1024):
            await self._localize(msgs[i:i + 1024])
        await self._run(self._loc_pool, lambda _m: self.localize_state.settle(), [])  # outputs dropped too
        if msgs:
            log.warning("rebuilt localization state from %d committed messages", len(msgs))

    def close(self) -> None:
        """Stop the localize child process (if any) and the agents' threads."""
        if isinstance(self.localize_state, LocalizeProcess):
            self.localize_state.close()
        self._seg_pool.shutdown(wait=False)
        self._loc_pool.shutdown(wait=False)
        shutil.rmtree(self._datadir, ignore_errors=True)

    def pipeline_record(self, app: Any = None) -> dict[str, Any]:
        seg = self.segment_state.stats
        assigned = 0
        with contextlib.suppress(Exception):
            assigned = len((app or self.app).consumer.assignment())
        parts: dict[str, list[int]] = {}
        with contextlib.suppress(Exception):
            for tp in (app or self.app).consumer.assignment():
                parts.setdefault(tp.topic, []).append(tp.partition)
        rec: dict[str, Any] = {
            "type": "pipeline", "v": 1, "worker": self.settings.worker_id, "member": self.member,
            "at_ns": time.time_ns(), "pid": os.getpid(), "messages_in": self.messages_in, "assigned": assigned,
            # Which partitions are this worker's (workers of one group split them).
            "partitions": sorted(parts.get(self.topics.samples, [])),
            "op_partitions": sorted(parts.get(self.topics.op_metrics, [])),
            "taken_over": self.taken_over, "batches": seg["batches"], "rows": seg["rows"], "events": seg["events"],
            "op_metrics": seg["op_metrics"], "verdicts": self.verdicts_sent, "dead_letters": self.dead_sent,
            "lost_batches": seg["lost_batches"], "drops": seg["late_batches"] + seg["lost_batches"],
            "lag_ms_segment": round(self.lag_ms.get("segment", 0.0), 1),
            "lag_ms_localize": round(self.lag_ms.get("localize", 0.0), 1),
            "incidents": self.incidents_sent,
            "held_op_metrics": self.localize_state.held,
            # Records that came after their operator was judged without them (engine/aligner.py).
            "late_op_metrics": self.localize_state.late_records,
            # Operator records the localize state took (its own and other workers').
            "localized": self.localize_state.metrics, "input_done_at_ns": self.input_done_at_ns,
            # Localize calls submitted and not finished (a backlog: verdicts still to come).
            "localize_queued": self._loc_busy,
            # Both agents rebuilt their state and take new messages.
            "ready": len(self.seeded) == 2,
        }
        if self.alerts is not None:
            rec.update(self.alerts.stats())
        if self.influx is not None:
            rec["influx_written"] = self.influx.written
            rec["influx_dropped"] = self.influx.dropped
            rec["influx_rejected_retention"] = self.influx.rejected_retention
        return rec


def run_worker(settings: Settings, *, bootstrap: str | None = None, loglevel: str = "warning",
               influx: InfluxSink | None = None, **kwargs: Any) -> None:
    """Create the topics, then run the Faust worker until SIGINT/SIGTERM (blocks)."""
    import faust
    from pulse.producers.publisher import ensure_topics

    bs = settings.bootstrap(bootstrap)
    asyncio.run(check_kafka(settings, bs))
    asyncio.run(ensure_topics(bs, settings, timeout_s=30.0))
    pipe = Pipeline(settings, bootstrap=bs, influx=influx, **kwargs)
    worker = faust.Worker(pipe.app, loglevel=loglevel, quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit:
        pass
    finally:
        pipe.close()
