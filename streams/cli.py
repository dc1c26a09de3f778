"""``pulse worker`` (the Faust worker) and ``pulse demo`` (broker + worker + live simulated job)."""

from __future__ import annotations

import sys

import click

from pulse.errors import ConfigError
from pulse.settings import Settings

_CTX = {"help_option_names": ["-h", "--help"]}


def _settings(broker: str | None, prefix: str | None, partitions: int | None, worker_id: str | None) -> Settings:
    return Settings.from_env().override(broker=broker or None, topic_prefix=prefix or None,
                                        partitions=partitions or None, worker_id=worker_id or None)


@click.command(context_settings=_CTX)
@click.option("--broker", help="Kafka bootstrap host:port (default PULSE_BROKER).")
@click.option("--topic-prefix", "prefix", help="Topic prefix (default PULSE_TOPIC_PREFIX or 'pulse').")
@click.option("--partitions", type=int, help="Partitions of samples/hook-events (default PULSE_PARTITIONS).")
@click.option("--worker-id", help="Faust app id = consumer group (default PULSE_WORKER_ID).")
@click.option("--loglevel", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--no-ops-to-influx", is_flag=True, help="Write only verdicts and pipeline health to InfluxDB.")
def worker(broker: str | None, prefix: str | None, partitions: int | None, worker_id: str | None,
           loglevel: str, no_ops_to_influx: bool) -> None:
    """Run the Faust worker: segment and localize agents, verdicts to Kafka (and InfluxDB
    when PULSE_INFLUX_URL is set). Stops on SIGINT/SIGTERM."""
    from .app import run_worker
    from .influx import InfluxSink

    s = _settings(broker, prefix, partitions, worker_id)
    if not s.broker:
        raise ConfigError("no broker: set PULSE_BROKER or --broker host:port (pulse broker runs an embedded one)")
    influx = None
    if s.influx_url:
        influx = InfluxSink.from_settings(s, write_ops=not no_ops_to_influx)
    click.echo(f"pulse worker {s.worker_id}: broker {s.broker}, topics {s.topic_prefix}.*, "
               f"{s.partitions} partitions" + (f", InfluxDB {s.influx_url}" if influx else ""), err=True)
    run_worker(s, influx=influx, loglevel=loglevel)


@click.command(context_settings=_CTX)
@click.option("--scenario", default="nic-slow", show_default=True, help="Simulator scenario (pulse sim --help).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--steps", type=int, default=12, show_default=True, help="Training steps to simulate.")
@click.option("--nodes", type=int, default=8, show_default=True)
@click.option("--gpus-per-node", type=int, default=8, show_default=True)
@click.option("--nics-per-node", type=int, default=8, show_default=True)
@click.option("--speed", type=float, default=1.0, show_default=True,
              help="Replay speed (trace seconds per wall second); 1 = real time.")
@click.option("--trace", "trace_dir", type=click.Path(file_okay=False, exists=True), default=None,
              help="Stream this trace directory instead of simulating one.")
@click.option("--timeout", "timeout_s", type=float, default=120.0, show_default=True,
              help="Give up waiting for verdicts after this many seconds past the end of the stream.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines on stdout: one per verdict, then a summary.")
def demo(scenario: str, seed: int, steps: int, nodes: int, gpus_per_node: int, nics_per_node: int, speed: float,
         trace_dir: str | None, timeout_s: float, as_json: bool) -> None:
    """The whole pipeline on this machine: the embedded broker (unless PULSE_BROKER is set), a
    worker, and a live simulated job with an anomaly. Prints each verdict as it arrives with
    the time from the end of the first anomalous operator to the verdict, then stops.
    Writes to InfluxDB too when PULSE_INFLUX_URL is set."""
    from .demo import DemoConfig, run_demo

    if speed <= 0:
        raise ConfigError(f"--speed {speed}: must be > 0")
    cfg = DemoConfig(scenario=scenario, seed=seed, steps=steps, nodes=nodes, gpus_per_node=gpus_per_node,
                     nics_per_node=nics_per_node, speed=speed, trace_dir=trace_dir, timeout_s=timeout_s,
                     as_json=as_json)
    summary = run_demo(Settings.from_env(), cfg)
    if not as_json:
        lat = summary.get("latency_s")
        click.echo(f"{summary['verdicts']} verdicts ({summary['anomalies']} anomalies); "
                   + (f"diagnosis latency {lat:.3f} s" if lat is not None else "no anomaly verdict")
                   + f"; {summary['batches']} batches streamed", err=True)
    sys.stdout.flush()
