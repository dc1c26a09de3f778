"""``pulse bench localize``: what one core of localization keeps up with, in GPUs.

A simulated job is segmented in process and what the segment agents would send to the
job's localize agent (packed op-metrics, forwarded comm/flow events, posted receives and
data ends) is captured per engine call, as Kafka messages. ``--tile K`` makes one job of K
copies of it (nodes and communicators renamed, the copies' records interleaved in trace
time, for each shard the records of its rails), so a 64-GPU simulation stands for a 1,024-GPU job with the same records per
GPU-second (its communicators are the copies' - smaller than one 1,024-GPU job's, so
cross-rank work per record is if anything overstated). Then the localize agent's own state
(:class:`~pulse.streams.state.LocalizeState`: record decoding, aligner, localizer,
incidents) takes those messages, with ``--shards S`` split as the sharded pipeline splits
them (``pulse.engine.shards``: each shard on a core of its own, GPUs per core from the
busiest one; the job-level merge's CPU is reported apart). Reported: CPU seconds per second of traffic and GPUs per
core (the job size one core keeps up with in real time), against a reference measured in
the same run: a bare ``orjson.loads`` of the same messages.
"""

from __future__ import annotations

import cProfile
import dataclasses
import io
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import orjson

from pulse.cli_types import count

Call = list[tuple[bytes, bytes]]


def capture(trace: Path) -> tuple[list[tuple[dict[Any, list[Any]], list[Any]]], float, int]:
    """The localize inputs of each engine call of ``trace`` (forwards, metrics), the trace's
    length in seconds and its node count."""
    from pulse.engine.diagnose import run_engine
    from pulse.engine.job import JobEngine

    from pulse.trace import TraceReader

    calls: list[tuple[dict[Any, list[Any]], list[Any]]] = []

    class Recording(JobEngine):
        def _route(self, out: Any, now: float) -> Any:
            calls.append((dict(out.forwards), list(out.metrics)))
            return super()._route(out, now)

    engine = Recording()
    run_engine(TraceReader(trace), engine)
    ms = engine.metrics
    span = (max(m.end_ns for m in ms) - min(m.start_ns for m in ms)) / 1e9 if ms else 0.0
    return calls, span, len({m.node for m in ms})


def _renamed(item: Any, k: int) -> Any:
    changes: dict[str, Any] = {}
    if getattr(item, "node", None):
        changes["node"] = f"t{k:03d}-{item.node}"
    if getattr(item, "comm_id", None):
        changes["comm_id"] = f"t{k:03d}-{item.comm_id}"
    return dataclasses.replace(item, **changes) if changes else item


def tile(calls: list[tuple[dict[Any, list[Any]], list[Any]]], copies: int, shards: int = 1,
         healthy: list[tuple[dict[Any, list[Any]], list[Any]]] | None = None, faulty: int | None = None
         ) -> list[list[Call]]:
    """Each call's messages for ``copies`` renamed copies of the job, packed as the segment
    agents pack them, for each of ``shards`` shards (what the shard's localize state gets:
    its rails' metrics and flow bindings; membership, posted receives and data ends all).
    With ``healthy`` (the calls of the same job without its fault), only the first
    ``faulty`` copies are of ``calls``, the others of ``healthy``: one fault in a large
    job, as a cluster has it, not ``copies`` identical faults at the same moments."""
    from pulse.engine.shards import rail, shard_of

    from .state import _pack

    n_faulty = copies if healthy is None or faulty is None else min(faulty, copies)
    sources = [calls if k < n_faulty else (healthy or []) for k in range(copies)]
    out: list[list[Call]] = [[] for _ in range(shards)]
    for c in range(max(len(src) for src in sources)):
        fw: dict[Any, list[Any]] = {}
        ms: list[Any] = []
        for k, src in enumerate(sources):
            if c >= len(src):
                continue
            forwards, metrics = src[c]
            for (job, node), items in forwards.items():
                fw[(job, f"t{k:03d}-{node}")] = [_renamed(i, k) for i in items]
            ms += [_renamed(m, k) for m in metrics]
        for i in range(shards):
            sfw = {key: [e for e in items if not getattr(e, "nic", None)
                         or shard_of(rail([e.nic], None), shards) == i] for key, items in fw.items()}
            sms = [m for m in ms if shard_of(rail(m.nics, m.comm_id), shards) == i]
            out[i].append(_pack(sms, {k: v for k, v in sfw.items() if v}))
    return out


def run_localize(calls: list[Call]) -> tuple[float, list[Any], list[Any]]:
    """CPU seconds for a localize state to take every call (one Kafka message each, as the
    agent gets them) and finish; its verdicts and incident state changes."""
    from .state import LocalizeState, Message

    st = LocalizeState()
    verdicts: list[Any] = []
    incidents: list[Any] = []
    t = time.process_time()
    for call in calls:  # offline: now = 0, only trace time releases operators
        out = st.handle([Message("op-metrics", k, v) for k, v in call], now=0.0)
        verdicts += out.verdicts
        incidents += out.incidents
    out = st.finish()
    cpu = time.process_time() - t
    return cpu, verdicts + out.verdicts, incidents + out.incidents


def run_reference(calls: list[Call]) -> float:
    t = time.process_time()
    for call in calls:
        for _k, v in call:
            orjson.loads(v)
    return time.process_time() - t


def measure(per_shard: list[list[Call]], span_s: float, gpus: int, profile: int = 0) -> dict[str, Any]:
    """Each shard's localize state in turn (each would have a core of its own), then the
    job-level merge of their verdicts; GPUs per core from the busiest shard."""
    from pulse.engine.shards import JobMerge

    run_localize(per_shard[0][:4])  # imports and first calls, not to be charged to shard 0
    prof = cProfile.Profile() if profile else None
    if prof is not None:
        prof.enable()
    runs = [run_localize(calls) for calls in per_shard]
    t = time.process_time()
    merges: dict[str, JobMerge] = {}
    incidents: list[Any] = []
    verdicts: list[Any] = []
    if len(runs) > 1:  # the shards' verdicts merged per job (shards.py); in emission order per shard
        for i, (_cpu, vs, _incs) in enumerate(runs):
            for v in vs:
                got = merges.setdefault(v.job, JobMerge(v.job)).take(i, [v])
                verdicts += got.verdicts
                incidents += got.incidents
    else:
        verdicts, incidents = runs[0][1], runs[0][2]
    merge_cpu = time.process_time() - t
    if prof is not None:
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(profile)
        print(buf.getvalue(), file=sys.stderr)
    cpus = [r[0] for r in runs]
    busiest = max(cpus)
    ref = max(run_reference(calls) for calls in per_shard)
    records = sum(len(orjson.loads(v).get("records", ())) for calls in per_shard for call in calls
                  for _k, v in call)
    return {
        "gpus": gpus, "trace_s": round(span_s, 3), "shards": len(runs), "op_metrics": records,
        "localize_cpu_s": round(sum(cpus), 3), "shard_cpu_s": [round(c, 3) for c in cpus],
        "merge_cpu_s": round(merge_cpu, 4),
        "localize_cpu_per_s": round(busiest / span_s, 3),
        "localize_gpus_per_core": round(gpus * span_s / busiest, 1),
        "us_per_record": round(sum(cpus) / max(records, 1) * 1e6, 2),
        "reference_decode_cpu_s": round(ref, 3), "ratio": round(ref / busiest, 4),
        # what the op-metrics topic carries (JSON, before Kafka's compression)
        "op_metrics_bytes_per_gpu_s": round(sum(len(v) for calls in per_shard for call in calls
                                                for _k, v in call) / gpus / span_s),
        "anomalies": sorted({(v.kind, tuple(v.nodes)) for v in verdicts if v.status == "anomaly"}),
        "incidents": sorted({(i.kind, tuple(i.nodes)) for i in incidents if i.state == "open"}),
    }


@click.command()
@click.option("--scenario", default="nic-slow", show_default=True)
@click.option("--seed", type=count(0, 2**32 - 1), default=1, show_default=True)
@click.option("--nodes", type=count(2, 256), default=8, show_default=True, help="Nodes of the simulated job.")
@click.option("--steps", type=count(1, 10_000), default=12, show_default=True)
@click.option("--tile", "copies", type=count(1, 1024), default=16, show_default=True,
              help="Copies of the simulated job localized as one job (16 x 64 GPUs = 1,024).")
@click.option("--shards", type=count(1, 1024), default=1, show_default=True,
              help="Localization shards per job (each run in turn on this core).")
@click.option("--faulty", type=count(1, 1024), default=None,
              help="Copies that carry the scenario's fault, the others healthy runs of the same job "
                   "(default: every copy, as measured before; 1: one fault in the large job).")
@click.option("--profile", type=count(0, 200), default=0, help="Print cProfile's top N functions (stderr).")
@click.option("--json", "as_json", is_flag=True)
def bench_localize(scenario: str, seed: int, nodes: int, steps: int, copies: int, shards: int, faulty: int | None,
                   profile: int, as_json: bool) -> None:
    """Localization CPU per second of traffic and GPUs per core, vs a bare JSON decode of the
    same messages."""
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    healthy = None
    with tempfile.TemporaryDirectory(prefix="pulse-bench-loc-") as tmp:
        simulate(SimConfig(scenario=scenario, seed=seed, nodes=nodes, steps=steps, job="bench"), Path(tmp) / "t")
        raw, span, _nodes = capture(Path(tmp) / "t")
        if faulty is not None and faulty < copies and scenario != "healthy":
            simulate(SimConfig(scenario="healthy", seed=seed, nodes=nodes, steps=steps, job="bench"), Path(tmp) / "h")
            healthy, h_span, _ = capture(Path(tmp) / "h")
            span = max(span, h_span)
    gpus = nodes * 8  # the simulator's default GPUs per node
    res = measure(tile(raw, copies, shards, healthy, faulty), span, gpus * copies, profile)
    res.update(scenario=scenario, seed=seed, tile=copies, faulty=copies if healthy is None else faulty)
    if as_json:
        sys.stdout.write(orjson.dumps(res).decode() + "\n")
    else:
        click.echo(f"localization of a {res['gpus']}-GPU job ({copies} x {gpus}, {res['trace_s']} s of traffic, "
                   f"{res['op_metrics']} records, {shards} shard(s)): {res['localize_cpu_s']} s CPU = "
                   f"{res['localize_gpus_per_core']} GPUs per core on the busiest shard "
                   f"({res['us_per_record']} us per record); "
                   f"reference orjson.loads of the same messages {res['reference_decode_cpu_s']} s "
                   f"(ratio {res['ratio']}); incidents {res['incidents']}", err=True)
