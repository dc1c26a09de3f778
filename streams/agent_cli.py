"""``pulse agent``: the per-node agent (:mod:`pulse.producers.agent`). The command lives here,
not with the agent, because its edge option (:mod:`pulse.streams.edge`) runs the engine's
segment stage in the agent: the layers below streams may not import the engine."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import click
import orjson

from pulse.cli_types import KeepDir, Number, check_socket_path, seconds
from pulse.errors import ConfigError
from pulse.settings import Settings

_CTX = {"help_option_names": ["-h", "--help"]}


@click.command(context_settings=_CTX)
@click.option("--node", default=None, help="This node's name (default: the host name).")
@click.option("--job", default="", help="Job name for hook events that carry none (NCCL logs, plugin).")
@click.option("--iface", default=None, help="Interface to capture (needs root or CAP_NET_RAW); none: no capture.")
@click.option("--local", "local", multiple=True,
              help="A local address of this node (repeatable; default: the interface's addresses).")
@click.option("--netns", default=None,
              help="Network namespace (name in /run/netns or a path) the interface lives in.")
@click.option("--hook-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory to follow: torch-*.jsonl (torch injection), *.log/*.txt (NCCL logs), *.rec (plugin).")
@click.option("--plugin-socket", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Unix datagram socket to bind for the NCCL profiler plugin (its PULSE_HOOK_SOCKET).")
@click.option("--rdma/--no-rdma", default=True, show_default=True, help="Poll `rdma -j res show qp` when available.")
@click.option("--epoch-us", type=Number(float, 1.0, 1e6), default=None, help="Epoch length (default PULSE_EPOCH_NS).")
@click.option("--window-ms", type=Number(float, 0.001, 60_000.0), default=10.0, show_default=True,
              help="Capture batch window.")
@click.option("--snaplen", type=click.IntRange(0, 65535), default=128, show_default=True,
              help="Bytes of each frame copied to the capture ring (headers are enough; 0 = whole frames).")
@click.option("--health-s", type=seconds(0.0, 3600.0), default=0.5, show_default=True, help="Health record period.")
@click.option("--coalesce-ms", type=Number(float, 0.0, 60_000.0), default=20.0, show_default=True,
              help="Merge a NIC's consecutive batches into one message for up to this long.")
@click.option("--edge", is_flag=True,
              help="Segment this node's traffic here and publish operator metrics only, not its epoch samples "
                   "and hook events (for a Kafka that cannot take µs samples; docs/scale.md).")
@click.option("--broker", help="Kafka bootstrap host:port (default PULSE_BROKER).")
@click.option("--topic-prefix", "prefix", help="Topic prefix (default PULSE_TOPIC_PREFIX).")
@click.option("--spool-dir", type=KeepDir(), help="Disk spool (default PULSE_SPOOL_DIR).")
@click.option("--duration", type=seconds(), default=None, help="Stop after this many seconds (default: SIGTERM).")
@click.option("--json", "as_json", is_flag=True, help="Print the final health record as JSON on stdout.")
def agent(node: str | None, job: str, iface: str | None, local: tuple[str, ...], netns: str | None,
          hook_dir: Path | None, plugin_socket: Path | None, rdma: bool, epoch_us: float | None, window_ms: float, snaplen: int,
          health_s: float, coalesce_ms: float, edge: bool, broker: str | None, prefix: str | None, spool_dir: str | None,
          duration: float | None, as_json: bool) -> None:
    """Run the node agent: live capture, hook directory, plugin socket and rdma res, joined
    (TCP connection -> rank and peer, QPN -> rank and peer) and published to Kafka through
    the disk spool, with its own health on the pipeline topic. SIGTERM flushes and exits 0."""
    from pulse.producers.agent import Agent, AgentConfig, local_addresses

    from pulse.samples import check_name

    s = Settings.from_env().override(broker=broker or None, topic_prefix=prefix or None,
                                     spool_dir=Path(spool_dir) if spool_dir else None)
    if not s.broker:
        raise ConfigError("no broker: set PULSE_BROKER or --broker host:port (pulse broker runs an embedded one)")
    node_name = node or socket.gethostname().split(".")[0]
    try:
        check_name("--node", node_name)
    except Exception as exc:
        raise ConfigError(str(exc)) from None
    if plugin_socket is not None:
        check_socket_path(plugin_socket)
    if not (iface or hook_dir or plugin_socket or rdma):
        raise ConfigError("nothing to do: give --iface, --hook-dir, --plugin-socket or --rdma")
    epoch_ns = round(epoch_us * 1000) if epoch_us is not None else s.epoch_ns
    window_ns = int(window_ms * 1e6)
    if window_ns < epoch_ns:
        raise ConfigError(f"--window-ms {window_ms}: must be at least one epoch")
    addrs = list(local) or local_addresses(iface, netns)
    if iface and not addrs:
        raise ConfigError(f"--iface {iface}: no address found; give --local ADDR")
    cfg = AgentConfig(node=node_name, job=job, iface=iface, local=addrs, netns=netns, hook_dir=hook_dir,
                      plugin_socket=plugin_socket, rdma=rdma, epoch_ns=epoch_ns, window_ns=window_ns,
                      snaplen=snaplen, health_s=health_s, coalesce_ms=coalesce_ms, duration_s=duration)
    segmenter = None
    if edge:
        from pulse.streams.edge import EdgeSegmenter

        segmenter = EdgeSegmenter()
    click.echo(f"pulse agent {node_name}: broker {s.broker}, topics {s.topic_prefix}.*"
               + (", edge: segmenting here, publishing operator metrics" if edge else "")
               + (f", capture {iface} ({', '.join(addrs)})" if iface else "")
               + (f", hooks {hook_dir}" if hook_dir else "")
               + (f", plugin socket {plugin_socket}" if plugin_socket else ""), err=True)
    final = Agent(s, cfg, segmenter=segmenter).run()
    if as_json:
        sys.stdout.write(orjson.dumps(final).decode() + "\n")
    else:
        p = final["published"]
        what = (f"segmented {p['batches']} batches ({p['rows']} rows) and {p['events']} hook events into "
                f"{p.get('op_metrics_messages', 0)} op-metrics messages" if edge else
                f"published {p['batches']} batches ({p['rows']} rows), {p['events']} hook events")
        click.echo(f"pulse agent {node_name}: {what}; spool {final['publisher']['spool_bytes']} bytes left, "
                   f"{final['drops']['capture_kernel']} packets dropped by the kernel", err=True)
