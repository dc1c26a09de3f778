"""``pulse capture``: per-flow epochs from a capture file or a live interface."""

from __future__ import annotations

import importlib
import socket
import sys

import click
import orjson

from pulse.cli_types import InFile, Number, OutDir, force_option, replace_output, seconds
from pulse.errors import ConfigError
from pulse.settings import MAX_EPOCH_NS, MIN_EPOCH_NS


def _default_node() -> str:
    from pulse.nic.binner import safe_name
    return safe_name(socket.gethostname().split(".")[0], "local")


def _publisher():  # type: ignore[no-untyped-def]
    """The producers' publishing entry point, if that package provides one yet."""
    try:
        mod = importlib.import_module("pulse.producers")
    except ImportError:
        return None
    for name in ("publish_batches", "publish"):
        fn = getattr(mod, name, None)
        if callable(fn):
            return fn
    return None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--pcap", "pcap", type=InFile(), help="Read this pcap/pcapng file.")
@click.option("--iface", help="Capture live on this interface (Linux AF_PACKET, needs root/CAP_NET_RAW).")
@force_option()
@click.option("--out", type=OutDir(), help="Write a trace directory here (empty or absent).")
@click.option("--publish", is_flag=True, help="Publish batches to Kafka (live only; needs pulse.producers).")
@click.option("--epoch-us", type=Number(float, 1.0, 1e6), default=32.0, show_default=True, help="Epoch length in microseconds (>= 1).")
@click.option("--window-ms", type=Number(float, 0.001, 60_000.0), default=100.0, show_default=True,
              help="Batch window (and live flush interval) in milliseconds.")
@click.option("--local", "local", multiple=True,
              help="A local address of the capturing node (repeatable): packets from it are tx, to it rx. "
                   "Without any, every address is its own node.")
@click.option("--node", default=None, help="Node name for --local captures (default: the host name).")
@click.option("--job", default="", help="Job name put in batches and events.")
@click.option("--duration", type=seconds(), default=None, help="Live: stop after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def capture(pcap: str | None, iface: str | None, force: bool, out: str | None, publish: bool, epoch_us: float,
            window_ms: float, local: tuple[str, ...], node: str | None, job: str,
            duration: float | None, as_json: bool) -> None:
    """Per-flow microsecond epochs from a pcap/pcapng file or a live interface.

    \b
    pulse capture --pcap FILE --out DIR [--epoch-us 32] [--local ADDR ...] [--json]
    pulse capture --iface IF [--epoch-us 32] (--out DIR | --publish) [--duration S]
    """
    if (pcap is None) == (iface is None):
        raise ConfigError("give exactly one of --pcap FILE or --iface IF")
    epoch_ns = round(epoch_us * 1000)
    if not MIN_EPOCH_NS <= epoch_ns <= MAX_EPOCH_NS:
        raise ConfigError(f"--epoch-us {epoch_us}: must be between 1 and 1000000")
    window_ns = int(window_ms * 1_000_000)
    if window_ns < epoch_ns:
        raise ConfigError(f"--window-ms {window_ms}: must be at least one epoch")
    node_name = node or _default_node()
    if out is not None and force:
        replace_output(out)
    if pcap is not None:
        if publish:
            raise ConfigError("--publish is for live capture; convert a file with --out DIR")
        if out is None and not as_json:
            raise ConfigError("--pcap needs --out DIR (or --json for a summary only)")
        summary = _convert(pcap, out, epoch_ns, window_ns, list(local), node_name, job, as_json)
    else:
        if publish:
            pub = _publisher()
            if pub is None:
                raise ConfigError("--publish needs the Kafka publisher of pulse.producers, which this build "
                                  "does not provide yet; use --out DIR")
        elif out is None:
            raise ConfigError("--iface needs --out DIR or --publish")
        from pulse.nic.live import capture_live
        summary = capture_live(iface, out=out, epoch_ns=epoch_ns, window_ns=window_ns, local=list(local),
                               node=node_name, job=job, duration_s=duration,
                               publisher=_publisher() if publish else None, verbose=not as_json)
    if as_json:
        sys.stdout.write(orjson.dumps(summary).decode() + "\n")
    else:
        _print_human(summary)


def _convert(pcap: str, out: str | None, epoch_ns: int, window_ns: int, local: list[str], node: str,
             job: str, as_json: bool) -> dict:
    from pulse.nic.convert import convert_capture, convert_file
    from pulse.nic.pcapfile import open_capture

    kwargs = dict(epoch_ns=epoch_ns, window_ns=window_ns, local=local or None, node=node, job=job)
    if as_json or not sys.stderr.isatty():
        return convert_file(pcap, out, **kwargs).summary
    from rich.progress import Progress

    from pulse.trace import TraceWriter

    cap = open_capture(pcap)
    with Progress(transient=True) as prog:
        task = prog.add_task("decoding packets", total=max(cap.size_hint, 1))

        def tick(done: int, total: int) -> None:
            prog.update(task, completed=min(done, total))
        if out is None:
            return convert_capture(cap, progress=tick, **kwargs).summary
        with TraceWriter(out, job=job, epoch_ns=epoch_ns, meta={"source": "capture", "capture": pcap}) as tw:
            def sink(b, e):  # type: ignore[no-untyped-def]
                tw.write_events(e)
                for x in b:
                    tw.write_batch(x)
            return convert_capture(cap, progress=tick, sink=sink, **kwargs).summary


def _print_human(summary: dict) -> None:
    err = click.get_text_stream("stderr")
    err.write(f"{summary['packets']} packets, {len(summary['flows'])} flows, {summary.get('batches', 0)} batches\n")
    if summary.get("decoded"):
        err.write("decoded: " + ", ".join(f"{k} {v}" for k, v in summary["decoded"].items()) + "\n")
    if summary.get("skipped"):
        err.write("skipped: " + ", ".join(f"{k} {v}" for k, v in summary["skipped"].items()) + "\n")
    if "drops" in summary:
        err.write(f"capture drops: {summary['drops']}\n")
