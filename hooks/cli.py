"""``pulse hooks``: build the NCCL profiler plugin, read its records, parse NCCL logs, read
``rdma res`` output, locate the torch.distributed injection directory."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

import click

from pulse.cli_types import InFile, KeepDir, check_socket_path, count, seconds
from pulse.errors import ConfigError, DecodeError
from pulse.events import HookEvent


def _emit(events: Iterable[HookEvent], as_json: bool) -> dict[str, int]:
    counts: dict[str, int] = {}
    out = sys.stdout.buffer
    for ev in events:
        counts[ev.TYPE] = counts.get(ev.TYPE, 0) + 1
        if as_json:
            out.write(ev.to_json() + b"\n")
            out.flush()
    return counts


def _summary(what: str, counts: dict[str, int], stats: dict[str, int]) -> None:
    ev = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no events"
    st = ", ".join(f"{k}={v}" for k, v in sorted(stats.items()) if v)
    click.echo(f"{what}: {ev}" + (f" ({st})" if st else ""), err=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def hooks() -> None:
    """Operator-descriptor sources: the NCCL profiler plugin, NCCL logs, rdma res, torch."""


@hooks.command()
@click.option("--out", "out_dir", type=KeepDir(), default=None,
              help="Directory for libnccl-profiler-pulse.so (default: a per-user cache).")
@click.option("--force", is_flag=True, help="Rebuild even when the cached build is up to date.")
def build(out_dir: str | None, force: bool) -> None:
    """Compile the NCCL profiler plugin with the system C compiler; print its path.

    Load it with NCCL_PROFILER_PLUGIN=<path> (or that line in /etc/nccl.conf); records go to
    $PULSE_HOOK_DIR/pulse-nccl-<host>-<pid>.rec or the datagram socket $PULSE_HOOK_SOCKET.
    """
    from pulse.hooks.build import build_plugin

    click.echo(str(build_plugin(out_dir, force=force)))


@hooks.command("parse-log")
@click.argument("file", type=InFile(allow_fifo=True, allow_missing=True))
@click.option("--follow", "-f", is_flag=True, help="Keep reading as the file grows (Ctrl-C to stop).")
@click.option("--idle-exit", type=seconds(), default=None, metavar="SECONDS",
              help="With --follow: stop after this many seconds without new lines.")
@click.option("--json", "as_json", is_flag=True, help="Print hook events as JSON lines on stdout.")
@click.option("--job", default="", help="Job name to put in the events.")
@click.option("--node", default=None, help="Node name (default: the host name in each line).")
def parse_log(file: str, follow: bool, idle_exit: float | None, as_json: bool, job: str, node: str | None) -> None:
    """Turn NCCL_DEBUG=INFO output (INIT, COLL, NET, GRAPH) into comm/op/flow events."""
    from pulse.hooks.nccl_log import NcclLogParser, follow_file, parse_file

    if follow:
        parser = NcclLogParser(job=job, node=node)
        counts: dict[str, int] = {}
        try:
            counts = _emit(follow_file(file, parser, idle_timeout=idle_exit), as_json)
        except KeyboardInterrupt:
            pass
        _summary(file, counts, parser.stats)
        return
    if not Path(file).is_file():
        raise ConfigError(f"{file}: not a regular file (a FIFO or stream needs --follow)")
    events, parser = parse_file(file, job=job, node=node)
    counts = _emit(events, as_json)
    _summary(file, counts, {**parser.stats, "net_channels": len(parser.channels)})


def _read_input(file: str) -> bytes:
    if file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(file).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read ({exc.strerror})") from None


def _flag(file: str, malformed: list[str], notes: list[str], readable: int) -> None:
    """Malformed records go to stderr one per line; nothing readable at all is an error."""
    for line in malformed:
        click.echo(f"malformed: {line}", err=True)
    for line in notes:
        click.echo(f"note: {line}", err=True)
    if malformed and not readable:
        raise DecodeError(f"{file}: no record could be read ({malformed[0]})")


@hooks.command("rdma-res")
@click.argument("file", type=InFile(allow_dash=True))
@click.option("--node", required=True, help="Node the output was taken on.")
@click.option("--job", default="", help="Job name to put in the events.")
@click.option("--pid", "pids", type=count(0, 2**22), multiple=True, help="Keep only QPs of this process (repeatable).")
@click.option("--log", "logs", type=InFile(), multiple=True,
              help="NCCL log of this node: bind QPs to NET connections where that is unambiguous.")
@click.option("--json", "as_json", is_flag=True, help="Print flow events as JSON lines on stdout.")
def rdma_res(file: str, node: str, job: str, pids: tuple[int, ...], logs: tuple[str, ...], as_json: bool) -> None:
    """Read `rdma res show qp` output (FILE or - for stdin) into flow events.

    Any form: plain text (the default), -j, -jp, and the broken JSON some releases print
    with -jp -dd. Records that cannot be read are listed on stderr, never guessed at;
    QPs that are not flows (UD, GSI, unconnected RC...) are counted."""
    from pulse.hooks.nccl_log import parse_file
    from pulse.hooks.rdma_res import flows_from_rdma, join_flows, read_rdma_qp

    got = read_rdma_qp(_read_input(file), where=file)
    _flag(file, got.malformed, got.notes, len(got.qps))
    skipped: dict[str, int] = {}
    flows = flows_from_rdma(got.qps, node=node, job=job, pids=pids or None, skipped=skipped)
    channels = []
    for log in logs:
        _, parser = parse_file(log, job=job, node=node)
        channels.extend(parser.channels)
    flows = join_flows(flows, channels=channels)
    counts = _emit(flows, as_json)
    _summary(f"{file} ({got.form})", counts, {"qps": len(got.qps), "bound": sum(f.bound for f in flows),
                                              "malformed": len(got.malformed),
                                              **{f"skipped_{k}": v for k, v in skipped.items()}})


@hooks.command("rdma-stat")
@click.argument("file", type=InFile(allow_dash=True))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per counter set on stdout.")
def rdma_stat(file: str, as_json: bool) -> None:
    """Read `rdma statistic qp show` output (FILE or - for stdin): per-QP counters where the
    NIC binds QPs to counter sets (`rdma statistic qp set link DEV/PORT auto ...`)."""
    import dataclasses

    import orjson
    from pulse.hooks.rdma_res import read_rdma_stat_qp

    sets, bad = read_rdma_stat_qp(_read_input(file), where=file)
    _flag(file, bad, [], len(sets))
    for c in sets:
        if as_json:
            sys.stdout.buffer.write(orjson.dumps(dataclasses.asdict(c)) + b"\n")
    click.echo(f"{file}: {len(sets)} counter set(s), {sum(len(c.lqpns) == 1 for c in sets)} bound to one QP"
               + (f", {len(bad)} malformed" if bad else ""), err=True)


@hooks.command("read-plugin")
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print hook events as JSON lines on stdout.")
@click.option("--job", default="", help="Job name to put in the events.")
@click.option("--node", default=None, help="Node name (default: the host name the plugin recorded).")
@click.option("--timeout", type=seconds(), default=None, metavar="SECONDS",
              help="Socket mode: stop after this many seconds without a datagram.")
@click.option("--max-datagrams", type=count(1), default=None, help="Socket mode: stop after this many datagrams.")
def read_plugin(path: str, as_json: bool, job: str, node: str | None, timeout: float | None,
                max_datagrams: int | None) -> None:
    """Decode the profiler plugin's records: a .rec FILE, or a SOCKET path to bind and
    receive on (the plugin's PULSE_HOOK_SOCKET; an existing socket file is replaced)."""
    from pulse.hooks.plugin_reader import PluginDecoder, read_plugin_file, receive_plugin_socket

    p = Path(path)
    if p.is_file():
        events, stats = read_plugin_file(p, job=job, node=node)
        _summary(path, _emit(events, as_json), stats)
        return
    fresh = not p.exists()
    check_socket_path(p)
    if fresh:
        click.echo(f"{path}: listening on a new datagram socket"
                   + (f" until {timeout:g} s without data" if timeout else " (Ctrl-C stops)"), err=True)
    dec = PluginDecoder(job=job, node=node)
    counts: dict[str, int] = {}
    try:
        counts = _emit(receive_plugin_socket(p, timeout=timeout, max_datagrams=max_datagrams, decoder=dec), as_json)
    except KeyboardInterrupt:
        pass
    _summary(path, counts, dec.stats)


@hooks.command("torch-path")
def torch_path() -> None:
    """Print the torch.distributed injection directory (put it on PYTHONPATH with PULSE_HOOK_DIR set)."""
    from pulse.hooks import torch_injection_dir

    click.echo(str(torch_injection_dir()))
