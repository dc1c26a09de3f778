"""``pulse bench pipeline``: epoch rows/s through producer -> broker -> segment agent, against
a raw aiokafka produce + consume of the same bytes in the same run; and the diagnosis
latency of ``pulse demo`` (median over runs)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import orjson

from pulse.cli_types import count
from pulse.kafka_security import kafka_client_kwargs
from pulse.settings import Settings


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds so far of a process and its live children (the worker's
    localize process) (Linux /proc; 0 elsewhere)."""
    total = 0.0
    try:
        pids = [pid]
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    if int(_stat(int(d.name))[1]) == pid:
                        pids.append(int(d.name))
                except (OSError, ValueError, IndexError):
                    continue
        for p in pids:
            try:
                fields = _stat(p)
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        return 0.0
    return total


async def _raw_reference(bootstrap: str, messages: list[tuple[str, bytes, bytes]], partitions: int,
                         cpu: dict[str, float] | None = None) -> float:
    """Seconds for a bare aiokafka producer + consumer to move the same bytes (their CPU
    seconds into ``cpu["raw_cpu_s"]``)."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from pulse.broker import create_topics

    topic = f"bench-raw-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, {topic: partitions})
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, compression_type="zstd", linger_ms=5,
                            max_request_size=16 << 20)
    cons = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest",
                            max_partition_fetch_bytes=8 << 20)
    await prod.start()
    await cons.start()
    try:
        t0 = time.perf_counter()
        c0 = time.process_time()
        futs = [await prod.send(topic, v, key=k) for _, k, v in messages]
        await asyncio.gather(*futs)
        n = 0
        while n < len(messages):
            got = await cons.getmany(timeout_ms=500)
            n += sum(len(v) for v in got.values())
        if cpu is not None:
            cpu["raw_cpu_s"] = time.process_time() - c0
        return time.perf_counter() - t0
    finally:
        await prod.stop()
        await cons.stop()


async def _pipeline_run(settings: Settings, trace: Path, workdir: Path) -> dict[str, Any]:
    from aiokafka import AIOKafkaConsumer
    from pulse.producers.publisher import Publisher, ensure_topics
    from pulse.producers.replay import replay_items

    from pulse.samples import EpochBatch
    from pulse.samples import encode as encode_batch

    from .demo import COALESCE_MS, start_worker, stop_process, wait_worker_ready

    bs = settings.broker or ""
    items = [it async for it in replay_items(trace)]
    batches = [it for it in items if isinstance(it, EpochBatch)]
    rows = sum(b.n_rows for b in batches)
    raw_msgs = [(settings.topics.samples, b.node.encode(), encode_batch(b)) for b in batches]
    await ensure_topics(bs, settings)
    log = workdir / "worker.log"
    proc = start_worker(settings, bs, log)
    try:
        await wait_worker_ready(bs, settings.topics.pipeline, proc=proc, log_path=log, worker=settings.worker_id,
                                client=kafka_client_kwargs(settings))
        pipe = AIOKafkaConsumer(settings.topics.pipeline, bootstrap_servers=bs, group_id=None,
                                auto_offset_reset="latest", **kafka_client_kwargs(settings))
        await pipe.start()
        async with Publisher(settings, linger_ms=5, coalesce_ms=COALESCE_MS) as pub:
            t0 = time.time()  # after connecting, like the raw reference
            c0, w0 = time.process_time(), _cpu_s(proc.pid)
            for it in items:
                if isinstance(it, EpochBatch):
                    await pub.publish_batch(it)
                else:
                    await pub.publish_event(it)
            await pub.flush()
            stats = pub.stats
            publisher_cpu_s = time.process_time() - c0
        wire_batches = stats.get("batches_out", len(batches))
        events = len(items) - len(batches)
        done_at = None
        deadline = time.time() + 600
        while done_at is None and time.time() < deadline:
            got = await pipe.getmany(timeout_ms=500)
            for msgs in got.values():
                for m in msgs:
                    rec = orjson.loads(m.value)
                    # Done = every message the producer sent went through the segment agent
                    # (batches and hook events), timed by when its last chunk finished.
                    if (rec.get("worker") == settings.worker_id and rec.get("batches", 0) >= wire_batches
                            and rec.get("events", 0) >= events):
                        done_at = rec.get("input_done_at_ns", rec["at_ns"]) / 1e9
                        worker_cpu_s = _cpu_s(proc.pid) - w0
        await pipe.stop()
    finally:
        stop_process(proc)
    if done_at is None:
        raise click.ClickException("the worker did not process every batch within 600 s")
    pipeline_s = max(done_at - t0, 1e-6)
    cpu: dict[str, float] = {}
    raw_s = await _raw_reference(bs, raw_msgs, settings.partitions, cpu)
    return {"rows": rows, "batches": len(batches), "wire_batches": wire_batches, "events": events,
            "bytes": sum(len(v) for _, _, v in raw_msgs), "publisher": stats,
            "pipeline_s": round(pipeline_s, 3), "raw_s": round(raw_s, 3),
            # CPU seconds, less sensitive to other load on the machine than wall time (the
            # worker's figure is read up to 0.5 s late, with the pipeline record).
            "publisher_cpu_s": round(publisher_cpu_s, 3), "worker_cpu_s": round(worker_cpu_s, 3),
            "raw_cpu_s": round(cpu.get("raw_cpu_s", 0.0), 3),
            "pipeline_rows_per_s": rows / pipeline_s, "raw_rows_per_s": rows / raw_s}


@click.command("pipeline", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--nodes", type=count(2, 256), default=4, show_default=True)
@click.option("--gpus-per-node", type=count(1, 16), default=4, show_default=True)
@click.option("--nics-per-node", type=count(1, 16), default=4, show_default=True)
@click.option("--steps", type=count(1, 10_000), default=8, show_default=True)
@click.option("--demo-runs", type=count(0, 100), default=3, show_default=True, help="pulse demo runs for the latency median (0 = skip).")
@click.option("--json", "as_json", is_flag=True)
def bench_pipeline(nodes: int, gpus_per_node: int, nics_per_node: int, steps: int, demo_runs: int,
                   as_json: bool) -> None:
    """Epoch rows/s producer -> broker -> segment agent vs raw aiokafka (target ratio >= 0.5),
    and pulse demo's diagnosis latency (target median <= 1 s)."""
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    from pulse.broker import EmbeddedBroker

    from .demo import DemoConfig, run_demo

    base = Settings.from_env()
    out: dict[str, Any] = {"bench": "pipeline"}
    with tempfile.TemporaryDirectory(prefix="pulse-bench-") as tmp:
        workdir = Path(tmp)
        trace = workdir / "trace"
        simulate(SimConfig(scenario="nic-slow", seed=1, nodes=nodes, gpus_per_node=gpus_per_node,
                           nics_per_node=nics_per_node, steps=steps, job="bench"), trace)
        broker = None
        bs = base.broker
        if not bs:
            broker = EmbeddedBroker(log_path=workdir / "tansu.log").start()
            bs = broker.bootstrap
        try:
            prefix = f"bench{uuid.uuid4().hex[:6]}"
            s = dataclasses.replace(base, broker=bs, topic_prefix=prefix, worker_id=f"bench-{prefix}",
                                    spool_dir=workdir / "spool")
            thr = asyncio.run(_pipeline_run(s, trace, workdir))
        finally:
            if broker is not None:
                broker.stop()
    ratio = thr["pipeline_rows_per_s"] / thr["raw_rows_per_s"]
    pipe_cpu = thr["publisher_cpu_s"] + thr["worker_cpu_s"]
    out["throughput"] = {**thr, "ratio": round(ratio, 4), "target_ratio": 0.5,
                         "cpu_ratio": round(thr["raw_cpu_s"] / pipe_cpu, 4) if pipe_cpu > 0 else None}
    lats = []
    runs = []
    for i in range(demo_runs):
        summary = run_demo(dataclasses.replace(base, topic_prefix=f"benchdemo{i}"),
                           DemoConfig(scenario="nic-slow", seed=1 + i, nodes=nodes, gpus_per_node=gpus_per_node,
                                      nics_per_node=nics_per_node, steps=steps, echo=False, timeout_s=120))
        runs.append({"seed": 1 + i, "latency_s": summary.get("latency_s"), "verdicts": summary["verdicts"],
                     "anomalies": summary["anomalies"]})
        if summary.get("latency_s") is not None:
            lats.append(summary["latency_s"])
    out["demo_latency"] = {"runs": runs, "median_s": statistics.median(lats) if lats else None,
                           "target_median_s": 1.0, "paper_s": 6.0}
    if as_json:
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
    else:
        t = out["throughput"]
        click.echo(f"pipeline: {t['pipeline_rows_per_s']:,.0f} epoch rows/s ({t['rows']} rows in {t['pipeline_s']} s); "
                   f"raw aiokafka: {t['raw_rows_per_s']:,.0f} rows/s; ratio {t['ratio']:.3f} (target >= 0.5)", err=True)
        m = out["demo_latency"]["median_s"]
        click.echo("demo diagnosis latency: " + (f"median {m:.3f} s" if m is not None else "no anomaly verdict")
                   + f" over {len(lats)} of {demo_runs} runs (target <= 1 s)", err=True)
