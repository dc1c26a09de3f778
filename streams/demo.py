"""``pulse demo``: the embedded broker, a worker and a live simulated job, on one machine.

The simulator computes a whole run at once, so the job is simulated first and then
streamed through the producer paced by its own timestamps (real time by default): the
worker sees what it would see from a live 64-GPU job. Each incident state change (open,
updated, resolved) is printed as it arrives (every verdict with ``verbose``), with the
diagnosis latency: wall time of the incident (or verdict) minus the wall time at which
the first anomalous operator ended in the stream. That operator is taken from the
simulator's ground truth (the earliest end, after the onset, of an operator on a culprit
node); only this measurement reads the truth, never the pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from pulse.errors import ServiceError
from pulse.kafka_security import kafka_client_kwargs
from pulse.settings import Settings

READY_TIMEOUT_S = 90.0
FETCH_MAX_WAIT_MS = 50
# A NIC's consecutive batches go out as one message for up to this long: the worker's cost
# is per message, and 50 ms is small against the diagnosis latency.
COALESCE_MS = 50.0
# The worker's health records, kept in the summary: how far behind the live stream it was.
TIMELINE_FIELDS = ("batches", "events", "op_metrics", "verdicts", "lag_ms_segment", "lag_ms_localize",
                   "held_op_metrics", "localize_queued")


@dataclasses.dataclass
class DemoConfig:
    scenario: str = "nic-slow"
    seed: int = 1
    steps: int = 12
    nodes: int = 8
    gpus_per_node: int = 8
    nics_per_node: int = 8
    speed: float = 1.0
    trace_dir: str | None = None
    timeout_s: float = 120.0
    as_json: bool = False
    quiet_s: float = 3.0
    echo: bool = True
    verbose: bool = False
    """Print every verdict, not only the incidents' state changes."""
    workers: int = 1
    """Worker processes in the consumer group (they split the partitions)."""


def first_anomalous_end_ns(truth: dict[str, Any]) -> int | None:
    """End (culprit node clock) of the first operator on a culprit node ending after the onset."""
    if not truth.get("kind") or not truth.get("culprit"):
        return None
    culprits = set(truth["culprit"].get("nodes") or [])
    offsets = truth.get("clock_offsets_ns") or {}
    onset = int(truth.get("onset_ns") or 0)
    seg = truth.get("segments") or {}
    best = None
    for node, end in zip(seg.get("node", []), seg.get("end_ns", []), strict=False):
        # an operator that never ended (a dead NIC, a hung rank) has no end
        if node in culprits and end is not None and end > onset + int(offsets.get(node, 0)):
            best = end if best is None else min(best, end)
    return best


class _Stderr:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stderr, flush=True)


def start_worker(settings: Settings, bootstrap: str, log_path: Path, env: dict[str, str] | None = None,
                 ) -> subprocess.Popen[bytes]:
    """``pulse worker`` as a child process with the given broker and topic settings."""
    child_env = dict(os.environ if env is None else env)
    child_env.update({"PULSE_BROKER": bootstrap, "PULSE_TOPIC_PREFIX": settings.topic_prefix,
                      "PULSE_PARTITIONS": str(settings.partitions), "PULSE_WORKER_ID": settings.worker_id,
                      "PULSE_DATA_DIR": str(settings.data_dir)})  # its health file goes there
    if settings.worker_name:  # one of several workers of the group
        child_env["PULSE_WORKER_NAME"] = settings.worker_name
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "pulse.cli", "worker", "--loglevel", "info"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                                start_new_session=True)


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()


async def wait_worker_ready(bootstrap: str, topic: str, *, timeout_s: float = READY_TIMEOUT_S,
                            proc: subprocess.Popen[bytes] | None = None, log_path: Path | None = None,
                            worker: str | None = None, client: dict[str, Any] | None = None,
                            member: str | None = None) -> dict[str, Any]:
    """Wait for a pipeline record with assigned partitions (the worker joined its group) and
    both agents past rebuilding their state (``ready``), so a job streamed now is taken at once."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="latest", group_id=None,
                         metadata_max_age_ms=1000, fetch_max_wait_ms=FETCH_MAX_WAIT_MS, **(client or {}))
    await c.start()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                tail = log_path.read_bytes()[-2000:].decode(errors="replace") if log_path else ""
                raise ServiceError(f"the worker exited with status {proc.returncode}:\n{tail}")
            batch = await c.getmany(timeout_ms=300)
            for msgs in batch.values():
                for m in msgs:
                    with contextlib.suppress(Exception):
                        rec = orjson.loads(m.value)
                        if (rec.get("assigned", 0) > 0 and rec.get("ready", True)
                                and (worker is None or rec.get("worker") == worker)
                                and (member is None or rec.get("member") == member)):
                            return dict(rec)
    finally:
        await c.stop()
    raise ServiceError(f"the worker did not join its consumer group within {timeout_s:.0f} s"
                       + (f" (log {log_path})" if log_path else ""))


def _incident_text(i: dict[str, Any]) -> str:
    state = str(i.get("state", "")).upper()
    tail = f" ({i.get('resolution')})" if i.get("state") == "resolved" and i.get("resolution") else ""
    return f"{state} {i.get('summary', '')}{tail}"


def _describe(v: dict[str, Any]) -> str:
    if v.get("status") == "anomaly":
        return (f"ANOMALY {v.get('kind')} at {v.get('level')} level: {', '.join(v.get('nodes') or [])}"
                f" (confidence {float(v.get('confidence', 0)):.2f})")
    if v.get("status") == "cleared":
        return f"cleared {v.get('kind')}: {', '.join(v.get('nodes') or [])}"
    return str(v.get("status"))


async def wait_group_split(bootstrap: str, settings: Settings, names: list[str], *, timeout_s: float = READY_TIMEOUT_S,
                           procs: list[subprocess.Popen[bytes]] | None = None) -> dict[str, list[int]]:
    """Wait until the latest pipeline records of the workers ``names`` of the group split the
    input partitions between them (disjoint, every one assigned): a job streamed before
    that would wait for a rebalance."""
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(settings.topics.pipeline, bootstrap_servers=bootstrap, auto_offset_reset="latest",
                         group_id=None, metadata_max_age_ms=1000, fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
                         **kafka_client_kwargs(settings))
    await c.start()
    parts: dict[str, list[int]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for p in procs or []:
                if p.poll() is not None:
                    raise ServiceError(f"a worker exited with status {p.returncode} before the group formed")
            for msgs in (await c.getmany(timeout_ms=300)).values():
                for m in msgs:
                    with contextlib.suppress(Exception):
                        rec = orjson.loads(m.value)
                        if rec.get("worker") == settings.worker_id and rec.get("member") in names:
                            parts[rec["member"]] = list(rec.get("partitions") or [])
            got = sorted(p for v in parts.values() for p in v)
            if len(parts) == len(names) and all(parts.values()) and got == list(range(settings.partitions)):
                return parts
    finally:
        await c.stop()
    raise ServiceError(f"the {len(names)} workers did not split the partitions within {timeout_s:.0f} s: {parts}")


async def _demo(settings: Settings, cfg: DemoConfig, bootstrap: str, trace: Path, workdir: Path) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from pulse.producers.publisher import Publisher, ensure_topics
    from pulse.producers.replay import ReplayClock, publish_trace

    from pulse.trace import read_truth

    say = _Stderr(cfg.echo and not cfg.as_json)
    truth = read_truth(trace) if (trace / "truth.json").exists() else {}
    anomaly_end = first_anomalous_end_ns(truth)
    await ensure_topics(bootstrap, settings, timeout_s=30.0)
    log_path = workdir / "worker.log"
    n = cfg.workers
    members = [dataclasses.replace(settings, worker_name=f"{settings.worker_id}-{i}", data_dir=settings.data_dir / f"w{i}")
               for i in range(n)] if n > 1 else [settings]
    say(f"starting {n} worker{'s' if n > 1 else ''} ({settings.partitions} partitions) on the broker at "
        f"{bootstrap} (log {log_path})...")
    procs = [start_worker(m, bootstrap, log_path) for m in members]
    proc = procs[0]
    results: list[dict[str, Any]] = []
    incidents: list[dict[str, Any]] = []
    timeline: list[dict[str, Any]] = []
    clock = ReplayClock(cfg.speed)
    try:
        if n == 1:
            await wait_worker_ready(bootstrap, settings.topics.pipeline, proc=proc, log_path=log_path,
                                    worker=settings.worker_id, client=kafka_client_kwargs(settings))
        else:
            split = await wait_group_split(bootstrap, settings, [m.worker_name or "" for m in members], procs=procs)
            say("  partitions: " + "; ".join(f"{k} {v}" for k, v in sorted(split.items())))
        # A short fetch wait: Tansu answers a waiting fetch only when the wait ends, and the
        # verdicts' arrival time is what the latency measures.
        cons = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                fetch_max_wait_ms=FETCH_MAX_WAIT_MS, **kafka_client_kwargs(settings))
        await cons.start()
        tps = [TopicPartition(topic, p) for topic in (settings.topics.verdicts, settings.topics.incidents)
               for p in sorted(cons.partitions_for_topic(topic) or {0})]
        cons.assign(tps)
        await cons.seek_to_end(*tps)
        for tp in tps:
            await cons.position(tp)
        pipe = AIOKafkaConsumer(settings.topics.pipeline, bootstrap_servers=bootstrap, group_id=None,
                                auto_offset_reset="latest", fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
                                **kafka_client_kwargs(settings))
        await pipe.start()
        say(f"streaming {trace.name} at {cfg.speed:g}x real time...")
        done = asyncio.Event()
        published: dict[str, Any] = {}
        stats: dict[str, Any] = {}

        async def stream() -> None:
            async with Publisher(settings, bootstrap=bootstrap, linger_ms=2, coalesce_ms=COALESCE_MS) as pub:
                # On the wall clock (one offset for the run): points older than InfluxDB's
                # retention would be refused; the latency below stays in trace time.
                counts = await publish_trace(pub, trace, speed=cfg.speed, clock=clock, rebase=True)
                # Against the job's own length: a publisher slower than real time shows here.
                published["published_s"] = round(time.time() - clock.t0_wall, 3)
                await pub.flush()
                published.update(counts)
                stats.update(pub.stats)
            done.set()

        task = asyncio.create_task(stream())
        worker_batches = 0
        localize_idle = False
        latest: dict[str, dict[str, Any]] = {}  # each worker's last pipeline record
        last_change = time.monotonic()
        end_deadline: float | None = None
        while True:
            got = await cons.getmany(*tps, timeout_ms=100)
            now = time.time()
            for tp, msgs in got.items():
                for m in msgs:
                    v = orjson.loads(m.value)
                    is_incident = tp.topic == settings.topics.incidents
                    lat = None
                    if anomaly_end is not None and (v.get("status") == "anomaly" or v.get("state") == "open"):
                        lat = now - clock.wall_of(anomaly_end)
                    rec = {**v, "received_at": now, "latency_s": lat,
                           "stream_s": round(now - clock.t0_wall, 3)}
                    (incidents if is_incident else results).append(rec)
                    last_change = time.monotonic()
                    if cfg.as_json:
                        sys.stdout.write(orjson.dumps(rec).decode() + "\n")
                        sys.stdout.flush()
                    elif is_incident or cfg.verbose:
                        text = _incident_text(v) if is_incident else _describe(v)
                        say(f"[{rec['stream_s']:7.2f} s] {text}"
                            + (f"   diagnosis latency {lat:.3f} s" if lat is not None else ""))
            pg = await pipe.getmany(timeout_ms=0)
            for msgs in pg.values():
                for m in msgs:
                    with contextlib.suppress(Exception):
                        rec = orjson.loads(m.value)
                        if rec.get("worker") != settings.worker_id:
                            continue
                        timeline.append({"stream_s": round(time.time() - clock.t0_wall, 2),
                                         "member": rec.get("member"), **{k: rec.get(k) for k in TIMELINE_FIELDS}})
                        latest[str(rec.get("member"))] = rec
                        total = sum(int(r.get("batches", 0)) for r in latest.values())
                        if total != worker_batches:
                            worker_batches = total
                            last_change = time.monotonic()
                        # The localizer may still work through a backlog after the input ended.
                        localize_idle = len(latest) >= n and all(
                            not r.get("localize_queued") and not r.get("held_op_metrics") for r in latest.values())
            for p in procs:
                if p.poll() is not None:
                    raise ServiceError(f"a worker died (status {p.returncode}); log {log_path}")
            if done.is_set():
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
                if end_deadline is None:
                    end_deadline = time.monotonic() + cfg.timeout_s
                # The worker counts messages: merged batches when the publisher coalesced.
                caught_up = (worker_batches >= stats.get("batches_out", published.get("batches", 0))
                             and localize_idle)
                quiet = time.monotonic() - last_change > cfg.quiet_s
                if (caught_up and quiet) or time.monotonic() > end_deadline:
                    break
        await cons.stop()
        await pipe.stop()
    finally:
        for p in procs:
            stop_process(p)
    anomalies = [r for r in results if r.get("status") == "anomaly"]
    culprits = set((truth.get("culprit") or {}).get("nodes") or [])
    # The diagnosis is the first verdict naming a culprit node; earlier wrong ones are false alarms.
    right = [r for r in anomalies if culprits & set(r.get("nodes") or [])]
    lats = [r["latency_s"] for r in right if r.get("latency_s") is not None]
    last_state: dict[str, dict[str, Any]] = {}
    for i in incidents:
        last_state[str(i.get("id"))] = i
    opened = [i for i in incidents if i.get("state") == "open"]
    right_inc = [i for i in opened if culprits & set(i.get("nodes") or [])]
    lags = [max(float(t.get("lag_ms_segment") or 0), float(t.get("lag_ms_localize") or 0)) for t in timeline]
    return {
        "type": "demo-summary", "scenario": truth.get("scenario", cfg.scenario), "verdicts": len(results),
        "anomalies": len(anomalies), "first_anomaly": anomalies[0] if anomalies else None,
        "false_alarms_before": len(anomalies) - len(right) if not right else anomalies.index(right[0]),
        "latency_s": lats[0] if lats else None,
        "truth": {"nodes": (truth.get("culprit") or {}).get("nodes"), "kind": truth.get("kind")},
        "batches": published.get("batches", 0), "rows": published.get("rows", 0),
        "published_s": published.get("published_s"), "time_offset_ns": clock.offset_ns,
        "worker_batches": worker_batches, "publisher": stats, "worker_log": str(log_path),
        "worker_timeline": timeline,
        "incidents": list(last_state.values()),
        "incident_latency_s": right_inc[0].get("latency_s") if right_inc else None,
        "worker_lag_max_s": round(max(lags) / 1000, 3) if lags else None,
        "workers": n, "partitions": settings.partitions, "gpus": gpus_of(truth, cfg),
        "worker_lag_max_s_each": {k: round(max((max(float(t.get("lag_ms_segment") or 0),
                                                    float(t.get("lag_ms_localize") or 0))
                                                for t in timeline if t.get("member") == k), default=0) / 1000, 3)
                                  for k in sorted(latest)},
    }


def gpus_of(truth: dict[str, Any], cfg: DemoConfig) -> int:
    """The job's GPU count (the simulated one's, or the streamed trace's truth)."""
    return int(truth.get("gpus") or 0) or cfg.nodes * cfg.gpus_per_node


def run_demo(settings: Settings, cfg: DemoConfig) -> dict[str, Any]:
    from pulse.broker import EmbeddedBroker

    say = _Stderr(cfg.echo and not cfg.as_json)
    with tempfile.TemporaryDirectory(prefix="pulse-demo-") as tmp:
        workdir = Path(tmp)
        settings = dataclasses.replace(settings, spool_dir=workdir / "spool", data_dir=workdir / "data",
                                       partitions=max(settings.partitions, cfg.workers),
                                       worker_id=f"{settings.worker_id}-demo-{os.getpid()}-{time.monotonic_ns() % 100000}")
        trace = Path(cfg.trace_dir) if cfg.trace_dir else workdir / "trace"
        if cfg.trace_dir is None:
            from pulse.sim.config import SimConfig
            from pulse.sim.run import simulate

            simcfg = SimConfig(scenario=cfg.scenario, seed=cfg.seed, steps=cfg.steps, nodes=cfg.nodes,
                               gpus_per_node=cfg.gpus_per_node, nics_per_node=cfg.nics_per_node, job="demo")
            simcfg.resolved()
            say(f"simulating {cfg.scenario} on {cfg.nodes * cfg.gpus_per_node} GPUs ({cfg.steps} steps, seed {cfg.seed})...")
            s = simulate(simcfg, trace)
            say(f"  {s.simulated_s:.2f} s of traffic, {s.batches} batches, {s.events} hook events")
        broker = None
        bootstrap = settings.broker
        if not bootstrap:
            broker = EmbeddedBroker(log_path=workdir / "tansu.log")
            broker.start()
            bootstrap = broker.bootstrap
        try:
            summary = asyncio.run(_demo(settings, cfg, bootstrap, trace, workdir))
        finally:
            if broker is not None:
                broker.stop()
        summary["worker_log"] = None  # removed with the temporary directory
    if cfg.as_json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        say(final_line(summary))
    return summary


def final_line(summary: dict[str, Any]) -> str:
    """The demo's last word: what was found, how fast, and how far behind the worker was."""
    incs = summary.get("incidents") or []
    lag = summary.get("worker_lag_max_s")
    lag_s = f"; the worker lagged the live stream by at most {lag:.2f} s" if lag is not None else ""
    if not incs:
        return f"no incident ({summary.get('verdicts', 0)} verdicts, none anomalous){lag_s}"
    first = min(incs, key=lambda i: int(i.get("first_seen_ns") or 0))
    more = f" (+{len(incs) - 1} more incident{'s' if len(incs) > 2 else ''})" if len(incs) > 1 else ""
    lat = summary.get("incident_latency_s")
    lat_s = f"; diagnosed {lat:.2f} s after the first anomalous operator ended" if lat is not None else ""
    return f"culprit: {first.get('summary')}{more}{lat_s}{lag_s}"
