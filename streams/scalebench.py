"""``pulse bench scale``: what one core keeps up with, per stage, as the job grows.

For each size a healthy job is simulated (packets, as ``pulse sim``) and streamed *in
process* the way the pipeline carries it: the producer's coalescing (20 ms) and packing of
hook events per node, the encoding of every message and its compression (zstd, per
message: Kafka compresses a producer batch of several messages, so this is an upper bound
on the bytes), then the consumer's side in 50 ms chunks of trace time, as the agents take
them: hook-event decoding, epoch-batch decoding, segmentation (one
:class:`~pulse.engine.segment_stage.SegmentStage`), localization (one job's
:class:`~pulse.engine.job.Localizers`). Each stage's CPU time (``time.process_time``) is
divided by the trace's duration: ``*_cpu_per_s`` is the fraction of a core the stage
needs to keep up in real time, and ``*_gpus_per_core`` = GPUs / that. The job's setup
events (comm and flow events, published first) are one chunk measured apart
(``setup_cpu_s``): every segmenter learns every communicator, a cost that grows with
GPUs squared but is paid once per job, not per second. The edge option's
bytes (op metrics packed per node and chunk, plus the hook events) come from the same run.

Reference measured in the same run (the machine is shared): a bare numpy pass (``np.sum``)
over the same epoch rows, as rows/s, and the segmentation's rows/s as a ratio to it.
"""

from __future__ import annotations

import cProfile
import dataclasses
import gc
import io
import math
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import cramjam
import numpy as np
import orjson

from pulse import events as _events
from pulse import samples as _samples
from pulse.cli_types import InDir, count
from pulse.errors import ConfigError

from .state import _pack

COALESCE_NS = 20_000_000
"""The producer's merge window (``pulse produce``'s default ``--coalesce-ms``)."""
SETUP_T = -1
"""Time stamp of the setup events' messages: measured apart, as a job's one-off cost."""
CHUNK_NS = 50_000_000
"""What one agent call takes (``take_events(1024, within=0.05 s)``)."""
GPUS_PER_NODE = 8
PACK_EVENTS = 4096
"""Hook events per packed message (the publisher's limit)."""


@dataclasses.dataclass
class Message:
    t_ns: int
    topic: str  # "samples" | "hook-events"
    key: str
    value: bytes
    v1_bytes: int = 0
    """Kafka bytes of the same message in batch version 1 (zstd), the same-run reference."""


ZSTD_LEVEL = None
"""aiokafka's zstd: it passes no level (cramjam's default)."""


def _zstd(value: bytes) -> int:
    return len(bytes(cramjam.zstd.compress(value, level=ZSTD_LEVEL)))


def stream_messages(reader: Any, *, coalesce_ns: int = COALESCE_NS, version: int = _samples.WIRE_VERSION,
                    reference: bool = False) -> tuple[list[Message], dict[str, float]]:
    """The messages a coalescing publisher sends for a trace, in order, with trace-time
    stamps (its 20 ms merge window and event packing, driven by trace time instead of the
    wall clock), and the producer's encoding CPU."""
    from pulse.producers.coalesce import Coalescer

    def enc(b: _samples.EpochBatch) -> bytes:
        return _samples.encode(b, version=version)

    co = Coalescer(max_age_s=coalesce_ns / 1e9)
    out: list[Message] = []
    pending: dict[str, list[bytes]] = {}
    cpu = {"encode_cpu_s": 0.0, "v1_kafka_zstd_compress_s": 0.0, "v1_kafka_zstd_decompress_s": 0.0}

    def flush_events(t: int) -> None:
        for node, vals in pending.items():
            for i in range(0, len(vals), PACK_EVENTS):
                out.append(Message(t, "hook-events", node, _events.encode_packed_json(vals[i:i + PACK_EVENTS])))
        pending.clear()

    def send(batches: list[_samples.EpochBatch], t: int) -> None:
        if not batches:
            return
        flush_events(t)
        c0 = time.process_time()
        vals = [(b.node, enc(b)) for b in batches]
        cpu["encode_cpu_s"] += time.process_time() - c0
        refs = []
        for b in batches:
            if not reference:
                refs.append(0)
                continue
            v1 = _samples.encode(b, version=1)
            c0 = time.process_time()
            z = bytes(cramjam.zstd.compress(v1, level=ZSTD_LEVEL))
            c1 = time.process_time()
            cramjam.zstd.decompress(z)
            cpu["v1_kafka_zstd_compress_s"] += c1 - c0
            cpu["v1_kafka_zstd_decompress_s"] += time.process_time() - c1
            refs.append(len(z))
        out.extend(Message(t, "samples", node, v, r) for (node, v), r in zip(vals, refs, strict=True))

    setup, timed = reader.timeline()
    first: int | None = None
    for ev in setup:
        pending.setdefault(ev.node, []).append(_events.encode(ev))
    for t, item in timed:
        if first is None:
            first = t
            flush_events(SETUP_T)  # the setup events (comm, flow) are their own first chunk
        send(co.due(t / 1e9), t)
        if isinstance(item, _samples.EpochBatch):
            send(co.add(item, t / 1e9), t)
        else:
            pending.setdefault(item.node, []).append(_events.encode(item))
    end = out[-1].t_ns if out else 0
    flush_events(end)
    send(co.drain(), end)
    return out, cpu


def _chunks(messages: list[Message], chunk_ns: int) -> list[list[Message]]:
    chunks: list[list[Message]] = []
    cut: int | None = None
    for m in messages:
        if cut is None or m.t_ns >= cut:
            chunks.append([])
            cut = m.t_ns + chunk_ns
        chunks[-1].append(m)
    return chunks


def measure_trace(trace_dir: str | Path, *, gpus: int, edge: bool = True, profile: int = 0) -> dict[str, Any]:
    """Stream a trace through the stages in process and measure each (see the module).
    ``profile`` > 0: cProfile the segmentation stage alone and print its top functions
    (stderr), by own time and by cumulative time."""
    from pulse.engine.job import Localizers
    from pulse.engine.segment_stage import SegmentStage

    from pulse.trace import TraceReader

    reader = TraceReader(trace_dir)
    messages, prod = stream_messages(reader, reference=True)
    # The input (every message of the trace, held here as the broker would hold it) is
    # moved out of the garbage collector's sight: otherwise each full collection scans
    # it, and that time is charged to whichever stage allocated last (in the pipeline the
    # messages are in Kafka, not in the worker's heap).
    gc.collect()
    gc.freeze()
    seg = SegmentStage()
    loc = Localizers()
    cpu = dict.fromkeys(("hook_decode", "batch_decode", "segment", "localize"), 0.0)
    setup_cpu = dict(cpu)
    rows = n_batches = n_events = n_metrics = 0
    t_lo, t_hi = 1 << 62, -(1 << 62)
    edge_bytes = edge_raw = 0
    verdicts = []
    cols: list[np.ndarray] = []
    prof = cProfile.Profile() if profile else None

    def route(out: Any) -> None:
        nonlocal n_metrics, edge_bytes, edge_raw
        c0 = time.process_time()
        for (job, _node), items in out.forwards.items():
            loc.add_forwarded(job, items)
        loc.add_metrics(out.metrics, 0.0)
        verdicts.extend(loc.tick(0.0, budget_s=None).verdicts)
        cpu["localize"] += time.process_time() - c0
        n_metrics += len(out.metrics)
        if edge:
            # what each node's edge producer publishes for this chunk (streams/edge.py):
            # its metrics and forwarded items, packed as the segment agent packs them
            per_node: dict[str, list[Any]] = {}
            for r in out.metrics:
                per_node.setdefault(r.node, []).append(r)
            for node in set(per_node) | {n for _, n in out.forwards}:
                fwd = {k: v for k, v in out.forwards.items() if k[1] == node}
                for _, raw in _pack(per_node.get(node, []), fwd):
                    edge_raw += len(raw)
                    edge_bytes += _zstd(raw)

    for chunk in _chunks(messages, CHUNK_NS):
        if chunk[0].t_ns == SETUP_T:
            # a job's comm and flow events, once: every segmenter learns every communicator
            # (O(GPUs^2) at the start, none after), so they are reported apart
            before = dict(cpu)
        c0 = time.process_time()
        evs = [e for m in chunk if m.topic == "hook-events" for e in _events.decode_many(m.value)]
        c1 = time.process_time()
        bts = [_samples.decode(m.value) for m in chunk if m.topic == "samples"]
        c2 = time.process_time()
        cpu["hook_decode"] += c1 - c0
        cpu["batch_decode"] += c2 - c1
        n_events += len(evs)
        for b in bts:
            rows += b.n_rows
            n_batches += 1
            if b.n_rows:
                t_lo = min(t_lo, b.t0_ns + int(b.epoch.min()) * b.epoch_ns)
                t_hi = max(t_hi, b.end_ns())
                cols.append(b.tx_bytes)
                cols.append(b.epoch)
                cols.append(b.flow)
        chunk_prof = prof if chunk[0].t_ns != SETUP_T else None  # as the figures: setup apart
        if chunk_prof is not None:
            chunk_prof.enable()
        c0 = time.process_time()
        out = seg.add(evs, bts)
        cpu["segment"] += time.process_time() - c0
        if chunk_prof is not None:
            chunk_prof.disable()
        route(out)
        if chunk[0].t_ns == SETUP_T:
            setup_cpu = {k: cpu[k] - before[k] for k in cpu}
            cpu = before
    if prof is not None:
        prof.enable()
    c0 = time.process_time()
    out = seg.finish()
    cpu["segment"] += time.process_time() - c0
    if prof is not None:
        prof.disable()
        buf = io.StringIO()
        for key in ("tottime", "cumulative"):
            pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(profile)
        print(f"segmentation profile ({gpus} GPUs; CPU times under the profiler):\n{buf.getvalue()}", file=sys.stderr)
    route(out)
    c0 = time.process_time()
    verdicts.extend(loc.finish().verdicts)
    cpu["localize"] += time.process_time() - c0

    gc.unfreeze()
    trace_s = max((t_hi - t_lo) / 1e9, 1e-9)
    sample_bytes = sum(_zstd(m.value) for m in messages if m.topic == "samples")
    sample_raw = sum(len(m.value) for m in messages if m.topic == "samples")
    sample_v1 = sum(m.v1_bytes for m in messages if m.topic == "samples")
    hook_bytes = sum(_zstd(m.value) for m in messages if m.topic == "hook-events")
    ref_s = _numpy_pass(cols)
    seg_s = max(cpu["segment"], 1e-9)
    loc_s = max(cpu["localize"], 1e-9)
    anomalies = sorted({(v.kind, ",".join(v.nodes)) for v in verdicts if v.status == "anomaly"})
    return {
        "gpus": gpus, "source": "simulated packets (healthy, pulse sim)", "trace_s": round(trace_s, 4),
        "epoch_rows": rows, "batches_in": n_batches, "messages": len(messages), "hook_events": n_events,
        "op_metrics": n_metrics,
        "setup_cpu_s": {k: round(v, 4) for k, v in setup_cpu.items()},
        "hook_decode_cpu_per_s": cpu["hook_decode"] / trace_s,
        "batch_decode_cpu_per_s": cpu["batch_decode"] / trace_s,
        "segment_cpu_per_s": cpu["segment"] / trace_s,
        "localize_cpu_per_s": cpu["localize"] / trace_s,
        "producer_encode_cpu_per_s": prod["encode_cpu_s"] / trace_s,
        # same-run reference: what Kafka's zstd costs the clients on version-1 messages
        # (the producer compresses, the consumer decompresses; version 2 carries its own)
        "v1_kafka_zstd_compress_cpu_per_s": prod["v1_kafka_zstd_compress_s"] / trace_s,
        "v1_kafka_zstd_decompress_cpu_per_s": prod["v1_kafka_zstd_decompress_s"] / trace_s,
        "segment_gpus_per_core": gpus / (cpu["segment"] / trace_s) if cpu["segment"] > 0 else math.inf,
        "segment_path_gpus_per_core": gpus / ((cpu["segment"] + cpu["batch_decode"] + cpu["hook_decode"]) / trace_s),
        "localize_gpus_per_core": gpus / (loc_s / trace_s),
        "epoch_rows_per_s": rows / trace_s,
        "segment_rows_per_cpu_s": rows / seg_s,
        "numpy_pass_rows_per_s": rows / ref_s if ref_s > 0 else math.inf,
        "segment_ratio_to_numpy_pass": (rows / seg_s) / (rows / ref_s) if ref_s > 0 else 0.0,
        "op_metrics_per_s": n_metrics / trace_s,
        "localize_us_per_op_metric": 1e6 * loc_s / max(n_metrics, 1),
        "kafka_bytes_per_gpu_s": (sample_bytes + hook_bytes) / gpus / trace_s,
        "kafka_samples_bytes_per_gpu_s": sample_bytes / gpus / trace_s,
        "kafka_hook_bytes_per_gpu_s": hook_bytes / gpus / trace_s,
        "samples_message_bytes_per_gpu_s": sample_raw / gpus / trace_s,
        "batch_version": _samples.WIRE_VERSION,
        "kafka_bytes_per_gpu_s_v1": (sample_v1 + hook_bytes) / gpus / trace_s,
        "kafka_ratio_v1_to_published": (sample_v1 + hook_bytes) / max(sample_bytes + hook_bytes, 1),
        "edge_kafka_bytes_per_gpu_s": edge_bytes / gpus / trace_s if edge else None,
        "edge_message_bytes_per_gpu_s": edge_raw / gpus / trace_s if edge else None,
        "anomalies": [list(a) for a in anomalies],
    }


def _numpy_pass(cols: list[np.ndarray]) -> float:
    """Best of 3 ``np.sum`` passes over the same columns (seconds)."""
    best = math.inf
    for _ in range(3):
        c0 = time.process_time()
        for c in cols:
            np.sum(c, dtype=np.int64)
        best = min(best, time.process_time() - c0)
    return best


def simulate_job(gpus: int, steps: int, out: Path, seed: int = 1) -> None:
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    nodes = gpus // GPUS_PER_NODE
    simulate(SimConfig(scenario="healthy", seed=seed, nodes=nodes, steps=steps), out)


def measure_size(gpus: int, steps: int, workdir: Path, trace: Path | None = None, profile: int = 0
                 ) -> dict[str, Any]:
    if trace is None:
        trace = workdir / f"healthy-{gpus}"
        w0 = time.perf_counter()
        simulate_job(gpus, steps, trace)
        sim_s = time.perf_counter() - w0
    else:
        sim_s = 0.0
    row = measure_trace(trace, gpus=gpus, profile=profile)
    row["steps"] = steps
    row["sim_wall_s"] = round(sim_s, 2)
    return row


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: a comma-separated list of GPU counts") from None
    # the simulated job has 2 pipeline stages and data parallelism over >= 2 nodes each
    unit = 4 * GPUS_PER_NODE
    bad = [s for s in sizes if s < unit or s % unit]
    if not sizes or bad:
        raise click.BadParameter(f"{text!r}: GPU counts must be multiples of {unit}")
    return sizes


@click.command(name="scale", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--gpus", "gpus_text", default="64,256,1024", show_default=True,
              help="Job sizes (GPUs, 8 per node, 8 NICs per node).")
@click.option("--steps", type=count(2, 1000), default=4, show_default=True,
              help="Training steps simulated per size.")
@click.option("--trace", "trace", type=InDir(), default=None,
              help="Measure this trace directory instead of simulating (one size: --gpus N).")
@click.option("--profile", type=count(0, 200), default=0,
              help="Print cProfile's top N functions of the segmentation stage (stderr; its figures then "
                   "include the profiler's overhead).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
def bench_scale(gpus_text: str, steps: int, trace: str | None, profile: int, as_json: bool) -> None:
    """Per-stage CPU per second of traffic, GPUs per core and Kafka bytes per GPU-second."""
    sizes = _sizes(gpus_text)
    if trace is not None and len(sizes) != 1:
        raise ConfigError("--trace measures one trace: give its size with --gpus N")
    from pulse.segmentation.streaming import warm_up

    warm_up()
    rows = []
    with tempfile.TemporaryDirectory(prefix="pulse-bench-scale-") as tmp:
        for g in sizes:
            print(f"scale: {g} GPUs ...", file=sys.stderr)
            row = measure_size(g, steps, Path(tmp), Path(trace) if trace else None, profile)
            rows.append(row)
            print(f"  {g} GPUs, {row['trace_s']:.2f} s of traffic: segmentation {row['segment_cpu_per_s']:.3f} "
                  f"core/s ({row['segment_gpus_per_core']:.0f} GPUs per core; {row['segment_ratio_to_numpy_pass']:.4f} "
                  f"of a numpy pass), localization {row['localize_cpu_per_s']:.3f} core/s "
                  f"({row['localize_gpus_per_core']:.0f} GPUs per core), hook decoding "
                  f"{row['hook_decode_cpu_per_s']:.3f} core/s, Kafka {row['kafka_bytes_per_gpu_s'] / 1e3:.1f} kB per "
                  f"GPU-s (edge {row['edge_kafka_bytes_per_gpu_s'] / 1e3:.1f} kB)", file=sys.stderr)
    if as_json:
        sys.stdout.write(orjson.dumps({"sizes": rows}).decode() + "\n")
