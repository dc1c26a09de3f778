"""``pulse produce``: publish samples and hook events to Kafka from a source."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
import orjson

from pulse.cli_types import InDir, InFile, KeepDir, Number, OutDir, check_socket_path, count, seconds
from pulse.errors import ConfigError
from pulse.settings import Settings

_CTX = {"help_option_names": ["-h", "--help"]}


@dataclasses.dataclass
class _Opts:
    settings: Settings
    publisher: dict[str, Any]
    as_json: bool


def _report(opts: _Opts, summary: dict[str, Any]) -> None:
    if opts.as_json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        st = summary.get("publisher", {})
        click.echo(f"published {summary.get('batches', 0)} batches, {summary.get('events', 0)} hook events "
                   f"({st.get('confirmed', 0)} confirmed, {st.get('spool_bytes', 0)} bytes left in the spool, "
                   f"{st.get('dropped', 0)} dropped, {st.get('outages', 0)} broker outages)", err=True)


@click.group(context_settings=_CTX)
@click.option("--broker", help="Kafka bootstrap host:port (default PULSE_BROKER).")
@click.option("--topic-prefix", "prefix", help="Topic prefix (default PULSE_TOPIC_PREFIX or 'pulse').")
@click.option("--partitions", type=count(1, 10_000), help="Partitions of samples/hook-events when creating them.")
@click.option("--compression", type=click.Choice(["zstd", "lz4", "gzip", "none"]), default="zstd", show_default=True)
@click.option("--linger-ms", type=count(0, 60_000), default=5, show_default=True, help="Batching delay of the producer.")
@click.option("--coalesce-ms", type=Number(float, 0.0, 60_000.0), default=20.0, show_default=True,
              help="Merge a NIC's consecutive epoch batches into one message for up to this long (0 = off).")
@click.option("--batch-version", type=click.Choice(["1", "2"]), default="2", show_default=True,
              help="Epoch-batch encoding: 2 is delta-coded and zstd-compressed (~8x smaller); 1 for consumers "
                   "older than it.")
@click.option("--spool-dir", type=KeepDir(), help="Disk spool (default PULSE_SPOOL_DIR).")
@click.option("--spool-max-bytes", type=count(0, 2**50), help="Spool bound (default PULSE_SPOOL_MAX_BYTES).")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.pass_context
def produce(ctx: click.Context, broker: str | None, prefix: str | None, partitions: int | None, compression: str,
            linger_ms: int, coalesce_ms: float, batch_version: str, spool_dir: str | None,
            spool_max_bytes: int | None, as_json: bool) -> None:
    """Publish epoch batches (pulse.samples) and hook events (pulse.hook-events), keyed by node.

    When the broker is unreachable, messages wait in a bounded disk spool and are sent in
    order when it returns; only a full spool loses messages (counted and logged).
    """
    s = Settings.from_env().override(
        broker=broker or None, topic_prefix=prefix or None, partitions=partitions or None,
        spool_dir=Path(spool_dir) if spool_dir else None, spool_max_bytes=spool_max_bytes)
    if not s.broker:
        raise ConfigError("no broker: set PULSE_BROKER or --broker host:port (pulse broker runs an embedded one)")
    if coalesce_ms < 0:
        raise ConfigError(f"--coalesce-ms {coalesce_ms}: must be >= 0 (0 = off)")
    ctx.obj = _Opts(s, {"compression": compression, "linger_ms": linger_ms, "coalesce_ms": coalesce_ms,
                        "batch_version": int(batch_version)}, as_json)


async def _publish_trace(opts: _Opts, trace_dir: str, speed: float, *, rebase: bool) -> dict[str, Any]:
    from .publisher import Publisher
    from .replay import ReplayClock, publish_trace

    t0 = time.perf_counter()
    clock = ReplayClock(speed)
    async with Publisher(opts.settings, **opts.publisher) as pub:
        counts = await publish_trace(pub, trace_dir, speed=speed, clock=clock, rebase=rebase)
        await pub.flush()
    return {**counts, "wall_s": round(time.perf_counter() - t0, 3), "time_offset_ns": clock.offset_ns,
            "publisher": pub.stats}


@produce.command("trace", context_settings=_CTX)
@click.argument("trace_dir", type=InDir())
@click.option("--realtime/--fast", default=False, show_default=True,
              help="Pace by the recorded timestamps, or send as fast as possible.")
@click.option("--speed", type=Number(float, 0.0, 1e6, lo_open=True), default=1.0, show_default=True, help="With --realtime: trace s per wall s.")
@click.option("--wall-clock/--trace-clock", "wall_clock", default=False, show_default=True,
              help="Move every timestamp by one offset so the job starts now (as a live source), "
                   "or keep the recorded ones.")
@click.pass_obj
def trace_cmd(opts: _Opts, trace_dir: str, realtime: bool, speed: float, wall_clock: bool) -> None:
    """Replay a trace directory (pulse sim / pulse capture output)."""
    if speed <= 0:
        raise ConfigError(f"--speed {speed}: must be > 0")
    _report(opts, asyncio.run(_publish_trace(opts, trace_dir, speed if realtime else 0.0, rebase=wall_clock)))


@produce.command("sim", context_settings=_CTX)
@click.option("--scenario", default="nic-slow", show_default=True)
@click.option("--seed", type=count(0, 2**32 - 1), default=0, show_default=True)
@click.option("--steps", type=count(1, 10_000), default=12, show_default=True)
@click.option("--nodes", type=count(2, 256), default=8, show_default=True)
@click.option("--gpus-per-node", type=count(1, 16), default=8, show_default=True)
@click.option("--nics-per-node", type=count(1, 16), default=8, show_default=True)
@click.option("--job", default="sim", show_default=True)
@click.option("--speed", type=Number(float, 0.0, 1e6, lo_open=True), default=1.0, show_default=True, help="Simulated seconds per wall second.")
@click.option("--keep", type=OutDir(force_param=None), default=None, help="Keep the simulated trace here (empty or absent).")
@click.pass_obj
def sim_cmd(opts: _Opts, scenario: str, seed: int, steps: int, nodes: int, gpus_per_node: int, nics_per_node: int,
            job: str, speed: float, keep: str | None) -> None:
    """Stream a simulated job in real time.

    The simulator computes a whole run at once (its engine is not incremental), so the job
    is simulated first and then streamed paced by its own timestamps, moved by one offset so
    that the job runs now (relative timing and per-node clock offsets kept): to the pipeline
    and to InfluxDB it is indistinguishable from a live job. A trace kept with --keep holds
    the simulator's own deterministic timestamps.
    """
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    if speed <= 0:
        raise ConfigError(f"--speed {speed}: must be > 0")
    cfg = SimConfig(scenario=scenario, seed=seed, steps=steps, nodes=nodes, gpus_per_node=gpus_per_node,
                    nics_per_node=nics_per_node, job=job)
    cfg.resolved()
    with tempfile.TemporaryDirectory(prefix="pulse-produce-sim-") as tmp:
        out = Path(keep) if keep else Path(tmp) / "trace"
        if not opts.as_json:
            click.echo(f"simulating {scenario} (seed {seed}, {nodes * gpus_per_node} GPUs, {steps} steps)...", err=True)
        simulate(cfg, out)
        _report(opts, asyncio.run(_publish_trace(opts, str(out), speed, rebase=True)))


def _publish_iter(opts: _Opts, events: Iterable[Any]) -> dict[str, Any]:
    from .sync import SyncPublisher

    n = 0
    with SyncPublisher(opts.settings, **opts.publisher) as pub:
        try:
            for ev in events:
                pub.publish(events=[ev])
                n += 1
        except KeyboardInterrupt:
            pass
        pub.flush(timeout=30)
        stats = pub.stats
    return {"events": n, "batches": 0, "publisher": stats}


@produce.command("nccl-log", context_settings=_CTX)
@click.argument("file", type=InFile(allow_fifo=True, allow_missing=True))
@click.option("--follow", is_flag=True, help="Keep reading as lines are appended (like tail -F).")
@click.option("--idle-exit", type=seconds(), default=None, help="With --follow: stop after this many idle seconds.")
@click.option("--job", default="", help="Job name for the events.")
@click.option("--node", default=None, help="Node name (default: from the log, else the host name).")
@click.pass_obj
def nccl_log_cmd(opts: _Opts, file: str, follow: bool, idle_exit: float | None, job: str, node: str | None) -> None:
    """Hook events (comm, flow, op) from an NCCL debug log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET,COLL)."""
    from pulse.hooks.nccl_log import NcclLogParser, follow_file, parse_file

    if follow:
        parser = NcclLogParser(job=job, node=node)
        events: Iterable[Any] = follow_file(file, parser, idle_timeout=idle_exit)
    else:
        if not Path(file).is_file():
            raise ConfigError(f"{file}: no such file")
        events = parse_file(file, job=job, node=node)[0]
    _report(opts, _publish_iter(opts, events))


@produce.command("plugin", context_settings=_CTX)
@click.argument("path", type=click.Path())
@click.option("--timeout", type=seconds(), default=None, help="Socket: stop after this many seconds without data.")
@click.option("--job", default="", help="Job name for the events.")
@click.option("--node", default=None, help="Node name (default: the plugin's host name).")
@click.pass_obj
def plugin_cmd(opts: _Opts, path: str, timeout: float | None, job: str, node: str | None) -> None:
    """Hook events from the NCCL profiler plugin: a directory of its record files
    (pulse-nccl-*.rec, read once) or its Unix datagram socket (PULSE_HOOK_SOCKET, bound here)."""
    from pulse.hooks.plugin_reader import read_plugin_file, receive_plugin_socket

    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.rec"))
        if not files:
            raise ConfigError(f"{p}: no plugin record files (*.rec) in this directory")

        def from_files() -> Iterable[Any]:
            for f in files:
                yield from read_plugin_file(f, job=job, node=node)[0]

        events: Iterable[Any] = from_files()
    else:
        check_socket_path(p)
        events = receive_plugin_socket(p, timeout=timeout, job=job, node=node)
    _report(opts, _publish_iter(opts, events))


@produce.command("capture", context_settings=_CTX)
@click.option("--iface", required=True, help="Interface to capture on (needs root/CAP_NET_RAW).")
@click.option("--epoch-us", type=Number(float, 1.0, 1e6), default=32.0, show_default=True)
@click.option("--window-ms", type=Number(float, 0.001, 60_000.0), default=10.0, show_default=True, help="Batch window.")
@click.option("--local", "local", multiple=True, help="A local address of this node (repeatable).")
@click.option("--node", default=None, help="Node name (default: the host name).")
@click.option("--job", default="", help="Job name.")
@click.option("--duration", type=seconds(), default=None, help="Stop after this many seconds.")
@click.pass_obj
def capture_cmd(opts: _Opts, iface: str, epoch_us: float, window_ms: float, local: tuple[str, ...],
                node: str | None, job: str, duration: float | None) -> None:
    """Live per-flow epochs from a network interface, published every window."""
    from pulse.nic.live import capture_live

    from .sync import SyncPublisher

    epoch_ns = round(epoch_us * 1000)
    window_ns = int(window_ms * 1e6)
    if window_ns < epoch_ns:
        raise ConfigError(f"--window-ms {window_ms}: must be at least one epoch")
    node_name = node or socket.gethostname().split(".")[0]
    with SyncPublisher(opts.settings, **opts.publisher) as pub:
        summary = capture_live(iface, out=None, epoch_ns=epoch_ns, window_ns=window_ns, local=list(local),
                               node=node_name, job=job, duration_s=duration, publisher=pub.publish,
                               verbose=not opts.as_json)
        pub.flush(timeout=30)
        stats = pub.stats
    _report(opts, {**summary, "publisher": stats})
