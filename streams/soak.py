"""``pulse bench soak``: the whole pipeline for minutes while things go wrong, with an
accounting of every message at the end (docs/reliability.md).

Services: an S3-compatible store on disk (localbucket) under the embedded broker (Tansu,
``s3://`` storage: a restarted broker has every topic, offset and committed group offset
it had), ``workers`` Pulse workers in one consumer group writing to VictoriaMetrics, and
a producer streaming simulated jobs live. The simulator is slower than real time, so a
few short jobs (a network fault and a compute fault that start and end, and a healthy
one) are simulated once and replayed in turn, each replay as a job of its own on nodes
of its own (``soak-K`` on ``rK-node-NN``), paced at real time or, for bursts, at several
times real time. On a seeded random schedule the run SIGKILLs and restarts the broker,
SIGKILLs and restarts a worker, stops VictoriaMetrics for a while and sends poison
messages into each input topic.

At the end it waits until the group committed everything, reads every topic back from
the broker and counts: messages produced, held by the broker, consumed (committed),
processed more than once, dead-lettered (with their reasons), dropped by a full spool,
and lost (must be 0); incidents expected (one per faulty replay), right (on a culprit
node, right kind family) and wrong; verdict points in VictoriaMetrics against the
verdicts on the topic; RSS and open fds of every process over time.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import logging
import os
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from pulse.errors import ServiceError
from pulse.records import decode_op_metrics_many
from pulse.settings import Settings

from .soak_plan import JOBS, SoakConfig, say, schedule, simulate_jobs
from .soak_report import account
from .soak_services import Sampler, Service, children, object_store, persistent_broker, victoria

COALESCE_MS = 50.0


def _replay_of(key: bytes | None) -> str:
    """The job of an input message: its key is the node, ``rK-node-NN`` for replay K."""
    head = (key or b"").split(b"-", 1)[0]
    return f"soak-{head[1:].decode(errors='replace')}" if head[:1] == b"r" else "?"


class Soak:
    """One soak run's processes, schedule and records (see the module docstring)."""

    def __init__(self, cfg: SoakConfig, settings: Settings, workdir: Path) -> None:
        self.cfg = cfg
        self.workdir = workdir
        self.settings = dataclasses.replace(settings, spool_dir=workdir / "spool", data_dir=workdir / "data",
                                            partitions=cfg.partitions, topic_prefix="pulse",
                                            worker_id=f"pulse-soak-{os.getpid()}", influx_url=None)
        self.rng = random.Random(cfg.seed * 7919 + 1)
        self.store: Service | None = None
        self.vm: Service | None = None
        self.broker: Any = None
        self.workers: list[Any] = [None] * cfg.workers
        self.pipeline: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.poison: collections.Counter[str] = collections.Counter()
        self.replays: list[dict[str, Any]] = []
        self.publisher_stats: dict[str, Any] = {}
        self.sampler = Sampler(self._pids)
        self.t0 = 0.0
        # What the observer saw (audit): input digests, ends per broker incarnation, records.
        self.epoch = 0
        self.ends: dict[int, dict[tuple[str, int], int]] = {}
        self.seen_input: set[bytes] = set()
        self.seen_input_messages = 0
        self.seen_poison: collections.Counter[str] = collections.Counter()
        self.poison_at: list[tuple[int, str, int, int]] = []  # (broker incarnation, topic, partition, offset)
        self.records: dict[str, list[dict[str, Any]]] = {}
        self.seen_at: dict[str, float] = {}  # incident id -> when the observer first read it (s)
        # Per job: the distinct input messages and op-metrics records that reached the broker
        # (did a replay's data all go through segmentation, whatever the fault schedule said).
        self.job_inputs: collections.Counter[str] = collections.Counter()
        # Per broker incarnation and input partition: the lowest offset of each job on it.
        self.job_first_offset: dict[tuple[int, str, int], dict[str, int]] = collections.defaultdict(dict)
        self.job_op_records: dict[str, set[bytes]] = collections.defaultdict(set)
        # The group's committed offsets at the end of each broker incarnation.
        self.committed: dict[int, dict[tuple[str, int], int]] = {}

    # -- processes -------------------------------------------------------------------------

    def _pids(self) -> dict[str, int | None]:
        pids: dict[str, int | None] = {"broker": self.broker.pid if self.broker else None,
                                       "store": self.store.pid if self.store else None,
                                       "victoria": self.vm.pid if self.vm else None, "soak": os.getpid()}
        for i, w in enumerate(self.workers):
            pid = w.pid if w is not None and w.poll() is None else None
            pids[f"worker-{i}"] = pid
            kids = children(pid, b"spawn_main") if pid else []
            pids[f"worker-{i}-localize"] = kids[0] if kids else None
        return pids

    def _start_worker(self, i: int) -> None:
        from .demo import start_worker

        s = dataclasses.replace(self.settings, data_dir=self.workdir / f"worker-{i}")
        assert self.vm is not None
        env = {**os.environ, "PULSE_INFLUX_URL": self.vm.url, "PULSE_INFLUX_BUCKET": "pulse"}
        self.workers[i] = start_worker(s, self.broker.bootstrap, self.workdir / f"worker-{i}.log", env)

    def start(self) -> None:
        from pulse.broker import EmbeddedBroker, free_port

        if self.cfg.storage == "s3":
            self.store = object_store(self.workdir / "store")
            self.broker = persistent_broker(self.store, self.workdir / "tansu.log")
        else:
            self.broker = EmbeddedBroker(log_path=self.workdir / "tansu.log", die_with_parent=False)
        self.broker.requested_port = free_port()  # a restart comes back on the same port
        self.broker.start()
        self.vm = victoria(self.workdir)
        for i in range(self.cfg.workers):
            self._start_worker(i)

    def stop(self) -> None:
        from .demo import stop_process

        for w in self.workers:
            if w is not None:
                stop_process(w)
        if self.broker is not None:
            self.broker.stop()
        for svc in (self.vm, self.store):
            if svc is not None:
                svc.stop()

    # -- background tasks ------------------------------------------------------------------

    async def audit(self, stop: asyncio.Event) -> None:
        """Every message of the input, dead-letter, incident, verdict and pipeline topics, read
        as it arrives by a consumer of no group: an observer independent of the workers. The
        fault injector bumps ``epoch`` after a broker restart; a memory broker came back
        empty, so the observer starts its partitions again from their beginning."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        t = self.settings.topics
        names = (t.samples, t.hook_events, t.dead_letter, t.incidents, t.verdicts, t.pipeline, t.op_metrics)
        c = AIOKafkaConsumer(bootstrap_servers=self.broker.bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=50, metadata_max_age_ms=1000,
                             max_partition_fetch_bytes=8 << 20)
        await c.start()
        tps = [TopicPartition(n, p) for n in names
               for p in range(1 if n in (t.dead_letter, t.pipeline) else self.settings.partitions)]
        c.assign(tps)
        epoch = self.epoch
        try:
            while not stop.is_set():
                if epoch != self.epoch:
                    epoch = self.epoch
                    with contextlib.suppress(Exception):
                        c.assign(tps)
                        await c.seek_to_beginning(*tps)
                try:
                    got = await c.getmany(timeout_ms=200)
                except Exception:
                    await asyncio.sleep(0.2)
                    continue
                for tp, msgs in got.items():
                    for m in msgs:
                        self._observe(epoch, tp.topic, tp.partition, m.offset, m.key, m.value)
        finally:
            with contextlib.suppress(Exception):
                await c.stop()

    def _observe(self, epoch: int, topic: str, partition: int, offset: int, key: bytes | None,
                 value: bytes | None) -> None:
        t = self.settings.topics
        end = self.ends.setdefault(epoch, {})
        end[(topic, partition)] = max(end.get((topic, partition), 0), offset + 1)
        if topic in (t.samples, t.hook_events):
            if key == b"poison":
                self.seen_poison[topic] += 1
                self.poison_at.append((epoch, topic, partition, offset))
            else:
                digest = hashlib.blake2b((key or b"") + b"\0" + (value or b""), digest_size=16).digest()
                if digest not in self.seen_input:
                    job = _replay_of(key)
                    self.job_inputs[job] += 1
                    first = self.job_first_offset[(epoch, topic, partition)]
                    first[job] = min(first.get(job, offset), offset)
                self.seen_input.add(digest)
                self.seen_input_messages += 1
            return
        if topic == t.op_metrics:
            with contextlib.suppress(Exception):  # what does not decode is the workers' to dead-letter
                for rec in decode_op_metrics_many(value or b""):
                    self.job_op_records[rec.job].add(hashlib.blake2b(repr(rec).encode(), digest_size=12).digest())
            return
        with contextlib.suppress(Exception):
            rec = orjson.loads(value or b"")
            if topic == t.pipeline:
                self.pipeline.append(rec)
            else:
                if topic == t.incidents:
                    self.seen_at.setdefault(str(rec.get("id")), round(time.monotonic() - self.t0, 2))
                self.records.setdefault(topic, []).append(rec)

    async def sample(self, stop: asyncio.Event, every_s: float = 2.0) -> None:
        while not stop.is_set():
            self.sampler.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every_s)

    def latest_by_pid(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for rec in self.pipeline:
            if isinstance(rec.get("pid"), int):
                out[rec["pid"]] = rec
        return out

    async def wait_ready(self, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            live = {w.pid for w in self.workers if w is not None and w.poll() is None}
            if len(live) < len(self.workers):
                raise ServiceError(f"a worker exited during startup; logs in {self.workdir}")
            latest = self.latest_by_pid()
            if all(latest.get(pid, {}).get("ready") for pid in live):
                return
            await asyncio.sleep(0.3)
        raise ServiceError(f"the workers were not ready within {timeout_s:.0f} s; logs in {self.workdir}")

    # -- the producer ------------------------------------------------------------------------

    async def produce(self, jobs: list[tuple[Path, dict[str, Any]]], until: float) -> None:
        """Replays of the simulated jobs, back to back, until ``until`` (monotonic)."""
        from pulse.producers.publisher import Publisher
        from pulse.producers.replay import ReplayClock, replay_items

        from pulse.samples import EpochBatch

        async with Publisher(self.settings, bootstrap=self.broker.bootstrap, linger_ms=2,
                             coalesce_ms=COALESCE_MS) as pub:
            k = 0
            while time.monotonic() < until:
                trace, truth = jobs[k % len(jobs)]
                # every third replay a burst, the first at replay 1 (a 1-minute run has one)
                speed = self.cfg.burst_speed if k % 3 == 1 else 1.0
                job, prefix = f"soak-{k}", f"r{k}-"
                rec: dict[str, Any] = {"job": job, "scenario": truth.get("scenario"), "kind": truth.get("kind"), "speed": speed,
                       "culprits": [prefix + n for n in (truth.get("culprit") or {}).get("nodes") or []],
                       "started_s": round(time.monotonic() - self.t0, 2)}
                self.replays.append(rec)
                clock = ReplayClock(speed)
                counts = {"batches": 0, "events": 0}
                rec["counts"] = counts
                n = 0
                async for item in replay_items(trace, speed=speed, clock=clock, rebase=True):
                    item = dataclasses.replace(item, job=job, node=prefix + item.node)  # type: ignore[type-var]
                    if isinstance(item, EpochBatch):
                        await pub.publish_batch(item)
                        counts["batches"] += 1
                    else:
                        await pub.publish_event(item)
                        counts["events"] += 1
                    n += 1
                    if n % 256 == 0:
                        await asyncio.sleep(0)
                rec["ended_s"] = round(time.monotonic() - self.t0, 2)
                k += 1
            say(self.cfg, f"{k} replays published; waiting for the spool to drain")
            try:
                await asyncio.wait_for(pub.flush(), self.cfg.settle_timeout_s)
            except TimeoutError:
                say(self.cfg, f"the publisher did not drain within {self.cfg.settle_timeout_s:.0f} s: {pub.stats}")
            self.publisher_stats = dict(pub.stats)

    # -- faults --------------------------------------------------------------------------------

    async def inject(self, plan: list[tuple[float, str]], stop: asyncio.Event) -> None:
        for at, kind in plan:
            delay = self.t0 + at - time.monotonic()
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
            t = round(time.monotonic() - self.t0, 2)
            detail = await getattr(self, "_" + kind.replace("-", "_"))()
            self.faults.append({"at_s": t, "kind": kind, **detail})
            say(self.cfg, f"t={t:.0f} s: {kind} {detail}")

    async def _broker_restart(self) -> dict[str, Any]:
        from pulse.producers.publisher import ensure_topics

        down = round(self.rng.uniform(1.0, 4.0), 1)
        # What the group had committed when the broker died: with memory storage, what the
        # broker held past it was confirmed to the producer and is gone (counted as lost).
        self.committed[self.epoch] = await self.group_committed()
        await asyncio.sleep(0.3)  # the observer reads what arrived meanwhile
        pid = self.broker.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        await asyncio.to_thread(self.broker._proc.wait)
        await asyncio.sleep(down)
        await asyncio.to_thread(self.broker.start)
        if self.cfg.storage != "s3":  # an empty broker: the topics first (it drops writes to unknown ones)
            with contextlib.suppress(Exception):
                await ensure_topics(self.broker.bootstrap, self.settings, timeout_s=30.0)
            self.epoch += 1
        return {"down_s": down, "storage": self.cfg.storage}

    async def group_committed(self) -> dict[tuple[str, int], int]:
        from pulse.kafka_security import kafka_client_kwargs

        from .readback import committed_offsets

        t = self.settings.topics
        try:
            return await committed_offsets(self.broker.bootstrap, self.settings.worker_id,
                                           [t.samples, t.hook_events], client=kafka_client_kwargs(self.settings))
        except Exception:
            return {}

    async def _worker_kill(self) -> dict[str, Any]:
        i = self.rng.randrange(len(self.workers))
        w = self.workers[i]
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.pid, signal.SIGKILL)
        await asyncio.to_thread(w.wait)
        self._start_worker(i)
        return {"worker": i, "killed_pid": w.pid}

    async def _influx_outage(self) -> dict[str, Any]:
        down = round(self.rng.uniform(5.0, 12.0), 1)
        assert self.vm is not None
        await asyncio.to_thread(self.vm.stop)
        await asyncio.sleep(down)
        await asyncio.to_thread(self.vm.start)
        return {"down_s": down}

    async def _poison(self) -> dict[str, Any]:
        """Undecodable messages into each input topic (sent until the broker confirms them)."""
        from aiokafka import AIOKafkaProducer

        t = self.settings.topics
        values = {t.samples: [b"\x00not an epoch batch", b"PLSB" + os.urandom(40)],
                  t.hook_events: [b"{not json", orjson.dumps({"type": "op", "v": 99, "job": "soak"})]}
        sent: collections.Counter[str] = collections.Counter()
        for _ in range(60):
            p = AIOKafkaProducer(bootstrap_servers=self.broker.bootstrap, acks=-1, request_timeout_ms=5000)
            try:
                await p.start()
                for topic, vals in values.items():
                    for v in vals[sent[topic]:]:
                        await p.send_and_wait(topic, v, key=b"poison")
                        self.poison[topic] += 1
                        sent[topic] += 1
                return {"messages": dict(sent)}
            except Exception:  # the broker is restarting: try again
                await asyncio.sleep(1.0)
            finally:
                with contextlib.suppress(Exception):
                    await p.stop()
        raise ServiceError("could not deliver the poison messages within a minute")

    # -- the end -------------------------------------------------------------------------------

    async def settle(self) -> None:
        """Until the group committed every input message and each live worker is idle (no new
        input for 5 s, nothing queued or held in its localizer), or the settle timeout."""
        t = self.settings.topics
        deadline = time.monotonic() + self.cfg.settle_timeout_s
        seen: dict[int, tuple[int, float]] = {}
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            with contextlib.suppress(Exception):
                committed = await self.group_committed()
                ends = self.ends.get(self.epoch, {})
                if any(committed.get(tp, 0) < end for tp, end in ends.items() if tp[0] in (t.samples, t.hook_events)):
                    continue
                live = {w.pid for w in self.workers if w.poll() is None}
                latest = self.latest_by_pid()
                now = time.monotonic()
                idle = True
                for pid in live:
                    rec = latest.get(pid, {})
                    n = rec.get("messages_in", -1)
                    if seen.get(pid, (None, 0.0))[0] != n:
                        seen[pid] = (n, now)
                    idle = idle and (now - seen[pid][1] >= 5.0 and not rec.get("localize_queued")
                                     and not rec.get("held_op_metrics") and rec.get("ready", False))
                if idle:
                    return
        say(self.cfg, "settle timeout: the accounting shows what was not consumed")


async def _run(cfg: SoakConfig, soak: Soak, jobs: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    from pulse.producers.publisher import ensure_topics

    await ensure_topics(soak.broker.bootstrap, soak.settings, timeout_s=30.0)
    stop = asyncio.Event()
    bg = [asyncio.create_task(soak.audit(stop))]
    try:
        await soak.wait_ready()
        soak.sampler.t0 = time.monotonic()  # memory from here: the workers have loaded everything
        bg.append(asyncio.create_task(soak.sample(stop)))
        say(cfg, f"workers ready; streaming for {cfg.minutes:g} min")
        plan = schedule(cfg)
        soak.t0 = time.monotonic()
        faults = asyncio.create_task(soak.inject(plan, asyncio.Event()))
        await soak.produce(jobs, soak.t0 + cfg.minutes * 60.0)
        await faults  # every planned fault happens, also one planned near the end
        streamed_s = time.monotonic() - soak.t0
        say(cfg, "settling: waiting for the group to commit everything")
        await soak.settle()
        await asyncio.sleep(1.5)  # the last pipeline records
        soak.committed[soak.epoch] = await soak.group_committed()
        return account(soak, streamed_s)
    finally:
        stop.set()
        for task in bg:
            with contextlib.suppress(Exception):
                await task


def run_soak(settings: Settings, cfg: SoakConfig, workdir: str | Path | None = None) -> dict[str, Any]:
    """Run a soak (module docstring); returns the accounting (``lost`` must be 0)."""
    # Every client logs each failed connection while the broker is down: the soak's own
    # lines would drown. The accounting says what happened.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    logging.getLogger("pulse.producers").setLevel(logging.ERROR)
    with contextlib.ExitStack() as stack:
        root = Path(workdir) if workdir is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="pulse-soak-")))
        root.mkdir(parents=True, exist_ok=True)
        say(cfg, f"simulating {len(JOBS)} short jobs (work directory {root})")
        jobs = simulate_jobs(cfg, root / "traces")
        soak = Soak(cfg, settings, root)
        try:
            soak.start()
            say(cfg, f"broker {soak.broker.bootstrap} ({cfg.storage} storage"
                     f"{' on ' + soak.store.url if soak.store else ''}), "
                     f"VictoriaMetrics {soak.vm.url if soak.vm else '?'}, {cfg.workers} workers")
            return asyncio.run(_run(cfg, soak, jobs))
        finally:
            soak.stop()

