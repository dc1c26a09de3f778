"""``pulse worker`` (the Faust worker) and ``pulse demo`` (broker + worker + live simulated job)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from pulse.cli_types import InDir, Number, count, seconds
from pulse.errors import ConfigError, ServiceError
from pulse.settings import Settings

_CTX = {"help_option_names": ["-h", "--help"]}


def _settings(broker: str | None, prefix: str | None, partitions: int | None, worker_id: str | None) -> Settings:
    return Settings.from_env().override(broker=broker or None, topic_prefix=prefix or None,
                                        partitions=partitions or None, worker_id=worker_id or None)


@click.command(context_settings=_CTX)
@click.option("--broker", help="Kafka bootstrap host:port (default PULSE_BROKER).")
@click.option("--topic-prefix", "prefix", help="Topic prefix (default PULSE_TOPIC_PREFIX or 'pulse').")
@click.option("--partitions", type=count(1, 10_000), help="Partitions of samples/hook-events (default PULSE_PARTITIONS).")
@click.option("--worker-id", help="Faust app id = consumer group (default PULSE_WORKER_ID).")
@click.option("--loglevel", default="warning", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--no-ops-to-influx", is_flag=True, help="Write only verdicts and pipeline health to InfluxDB.")
@click.option("--health", "health", is_flag=True,
              help="Do not run a worker: probe the running one (health file fresh, partitions assigned, "
                   "broker reachable, lag bounded); exit 0 when healthy, 1 otherwise.")
@click.option("--health-file", type=click.Path(dir_okay=False), default=None,
              help="The health file the worker writes and --health reads "
                   "(default PULSE_DATA_DIR/worker-<worker id>.health.json).")
@click.option("--max-lag", type=count(0), default=None,
              help="With --health: most messages the group may be behind on its input topics [100000].")
@click.option("--max-age", type=Number(float, 1.0, 7 * 86400.0), default=None,
              help="With --health: oldest health record, in seconds, from a live worker [30].")
@click.option("--json", "as_json", is_flag=True, help="With --health: the report as JSON on stdout.")
def worker(broker: str | None, prefix: str | None, partitions: int | None, worker_id: str | None,
           loglevel: str, no_ops_to_influx: bool, health: bool, health_file: str | None, max_lag: int | None,
           max_age: float | None, as_json: bool) -> None:
    """Run the Faust worker: segment and localize agents, verdicts to Kafka (and InfluxDB
    when PULSE_INFLUX_URL is set). Stops on SIGINT/SIGTERM. With --health, report whether
    the worker of these settings is healthy instead (a container healthcheck)."""
    from .health import health_path

    s = _settings(broker, prefix, partitions, worker_id)
    if not s.broker:
        raise ConfigError("no broker: set PULSE_BROKER or --broker host:port (pulse broker runs an embedded one)")
    hpath = Path(health_file) if health_file else health_path(s)
    if health:
        _health(s, hpath, max_lag, max_age, as_json)
        return
    if max_lag is not None or max_age is not None or as_json:
        raise click.UsageError("--max-lag, --max-age and --json go with --health")
    from .app import run_worker
    from .influx import InfluxSink

    influx = None
    if s.influx_url:
        influx = InfluxSink.from_settings(s, write_ops=not no_ops_to_influx)
    alerts = None
    if s.alert_url:
        from .alerts import AlertSink

        alerts = AlertSink(s.alert_url, report_url=s.alert_report_url)
    click.echo(f"pulse worker {s.worker_id}: broker {s.broker}, topics {s.topic_prefix}.*, "
               f"{s.partitions} partitions" + (f", InfluxDB {s.influx_url}" if influx else "")
               + (f", alerts to {s.alert_url}" if alerts else ""), err=True)
    run_worker(s, influx=influx, loglevel=loglevel, health_path=hpath, alerts=alerts)


def _health(s: Settings, path: Path, max_lag: int | None, max_age: float | None, as_json: bool) -> None:
    import orjson

    from .health import DEFAULT_MAX_AGE_S, DEFAULT_MAX_LAG, probe

    report = probe(s, path, max_lag=DEFAULT_MAX_LAG if max_lag is None else max_lag,
                   max_age_s=DEFAULT_MAX_AGE_S if max_age is None else max_age)
    if as_json:
        sys.stdout.write(orjson.dumps(report).decode() + "\n")
        sys.stdout.flush()
    if not report["healthy"]:
        raise ServiceError(f"worker {s.worker_id} unhealthy: " + "; ".join(report["problems"]))
    click.echo(f"worker {s.worker_id} healthy: {report.get('assigned')} partitions assigned, "
               f"lag {report.get('lag')} messages, health record {report.get('age_s')} s old", err=True)


@click.command(context_settings=_CTX)
@click.option("--scenario", default="nic-slow", show_default=True, help="Simulator scenario (pulse sim --help).")
@click.option("--seed", type=count(0, 2**32 - 1), default=1, show_default=True)
@click.option("--steps", type=count(1, 10_000), default=12, show_default=True, help="Training steps to simulate.")
@click.option("--nodes", type=count(2, 256), default=8, show_default=True)
@click.option("--gpus-per-node", type=count(1, 16), default=8, show_default=True)
@click.option("--nics-per-node", type=count(1, 16), default=8, show_default=True)
@click.option("--speed", type=Number(float, 0.0, 1e6, lo_open=True), default=1.0, show_default=True,
              help="Replay speed (trace seconds per wall second); 1 = real time.")
@click.option("--trace", "trace_dir", type=InDir(), default=None,
              help="Stream this trace directory instead of simulating one.")
@click.option("--timeout", "timeout_s", type=seconds(), default=120.0, show_default=True,
              help="Give up waiting for verdicts after this many seconds past the end of the stream.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON lines on stdout: one per verdict and per incident state change, then a summary.")
@click.option("--verbose", "-v", is_flag=True, help="Print every verdict, not only the incidents' state changes.")
@click.option("--workers", type=count(1, 64), default=1, show_default=True,
              help="Worker processes in one consumer group (they split the partitions; at least this many).")
def demo(scenario: str, seed: int, steps: int, nodes: int, gpus_per_node: int, nics_per_node: int, speed: float,
         trace_dir: str | None, timeout_s: float, as_json: bool, verbose: bool, workers: int) -> None:
    """The whole pipeline on this machine: the embedded broker (unless PULSE_BROKER is set), a
    worker, and a live simulated job with an anomaly. Prints each incident (open, updated,
    resolved) as it arrives with the time from the end of the first anomalous operator to
    it (every verdict with --verbose), then a one-line summary, and stops.
    The job is streamed on the wall clock (its timestamps moved by one offset, so it runs
    now). Writes to InfluxDB too when PULSE_INFLUX_URL is set."""
    from .demo import DemoConfig, run_demo

    if speed <= 0:
        raise ConfigError(f"--speed {speed}: must be > 0")
    cfg = DemoConfig(scenario=scenario, seed=seed, steps=steps, nodes=nodes, gpus_per_node=gpus_per_node,
                     nics_per_node=nics_per_node, speed=speed, trace_dir=trace_dir, timeout_s=timeout_s,
                     as_json=as_json, verbose=verbose, workers=workers)
    run_demo(Settings.from_env(), cfg)
    sys.stdout.flush()
