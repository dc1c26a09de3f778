"""``pulse sim``: simulate a training cluster with an anomaly and write a trace directory."""

from __future__ import annotations

import sys

import click
import orjson
from pulse.sim.config import WORKLOADS, SimConfig
from pulse.sim.scenarios import SCENARIOS
from pulse.sim.trees import ALGOS

from pulse.cli_types import Number, OutDir, count, force_option, replace_output


def _scenario_help() -> str:
    lines = []
    for s in SCENARIOS.values():
        rng = f" severity [{s.severity_range[0]}, {s.severity_range[1]}]: {s.severity_meaning}" if s.severity_range else ""
        lines.append(f"{s.name}: {s.cause}.{rng}")
    return "; ".join(lines)


@click.command(name="sim", context_settings={"help_option_names": ["-h", "--help"]},
               epilog="Scenarios: " + _scenario_help())
@click.option("--scenario", default="healthy", show_default=True, metavar="NAME",
              help=f"One of: {', '.join(SCENARIOS)}.")
@click.option("--seed", type=count(0, 2**32 - 1), default=0, show_default=True, help="Random seed (the run is deterministic per seed).")
@click.option("--nodes", type=count(2, 256), default=8, show_default=True)
@click.option("--gpus-per-node", type=count(1, 16), default=8, show_default=True)
@click.option("--nics-per-node", type=count(1, 16), default=8, show_default=True)
@click.option("--pp", type=count(1, 16), default=2, show_default=True, help="Pipeline-parallel stages (must divide --nodes).")
@click.option("--steps", type=count(1, 10_000), default=20, show_default=True, help="Training steps to simulate.")
@click.option("--epoch-us", type=count(1, 1000), default=32, show_default=True, help="Epoch length of the samples (µs).")
@click.option("--workload", type=click.Choice(WORKLOADS), default=None,
              help="dense (TP/PP/DP GPT-like) or moe (adds expert all-to-all); default: the scenario's.")
@click.option("--severity", type=Number(float, 0.0, 1e6), default=None, help="Scenario strength (range per scenario; default mid-range).")
@click.option("--onset-ms", type=Number(float, 0.0, 1e9), default=None, help="When the fault starts (true ms from start; default ~35% of the run).")
@click.option("--fault-duration-ms", type=Number(float, 0.0, 1e9, lo_open=True), default=None,
              help="How long the fault acts from its onset (true ms; default: to the end of the run).")
@click.option("--algo", type=click.Choice(ALGOS), default="auto", show_default=True,
              help="DP AllReduce algorithm: ring, NCCL's double binary tree, or auto (NCCL-like cost model: "
                   "tree only for small buckets).")
@click.option("--bucket-mb", type=Number(float, 0.001, 4096.0), default=None,
              help="DP gradient bucket size in MiB (default: dense 64, moe 32); auto picks tree below "
                   "about 1.8 MiB with 4 DP nodes.")
@click.option("--clock-skew-us", type=Number(float, 0.0, 10_000.0), default=100.0, show_default=True,
              help="Each node's clock is offset by a random amount in +- this (µs): 100 is PTP-like, "
                   "NTP-synchronised clusters are often off by 1-10 ms. At most 10000.")
@click.option("--job", default="sim", show_default=True, help="Job name written into every record.")
@force_option()
@click.option("--out", "out", type=OutDir(), default=None,
              help="Trace directory to write (empty or absent); default ./sim-SCENARIO-SEED.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def sim(scenario: str, seed: int, nodes: int, gpus_per_node: int, nics_per_node: int, pp: int, steps: int,
        epoch_us: int, workload: str | None, severity: float | None, onset_ms: float | None,
        fault_duration_ms: float | None, algo: str,
        bucket_mb: float | None, clock_skew_us: float, job: str, force: bool, out: str | None,
        as_json: bool) -> None:
    """Simulate a training cluster (mechanistic NCCL-like traffic) with one anomaly scenario."""
    from pulse.sim.run import simulate

    cfg = SimConfig(scenario=scenario, seed=seed, nodes=nodes, gpus_per_node=gpus_per_node,
                    nics_per_node=nics_per_node, pp=pp, steps=steps, epoch_us=epoch_us, workload=workload,
                    severity=severity, onset_ms=onset_ms, fault_duration_ms=fault_duration_ms, job=job, algo=algo, bucket_mb=bucket_mb,
                    clock_offset_us=clock_skew_us)
    rc = cfg.resolved()  # validate before touching the disk
    if out is None:  # the default path gets the same checks as a given one
        ctx = click.get_current_context()
        out = OutDir().convert(f"sim-{rc.sc.name}-{seed}", next(p for p in ctx.command.params if p.name == "out"), ctx)
    if force:
        replace_output(out)
    show = (not as_json) and sys.stderr.isatty()
    if show:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]sim[/] {task.description}"), BarColumn(),
                      TextColumn("{task.fields[sim_s]:.2f} s simulated"), TimeElapsedColumn(),
                      transient=True) as bar:
            task = bar.add_task(rc.sc.name, total=1.0, sim_s=0.0)

            def progress(t_ns: int, est_ns: int) -> None:
                bar.update(task, completed=min(0.99, t_ns / est_ns), sim_s=t_ns / 1e9)

            summary = simulate(cfg, out, progress=progress)
    else:
        summary = simulate(cfg, out)
    if as_json:
        click.echo(orjson.dumps(summary.to_dict()).decode())
    else:
        click.echo(f"{summary.scenario} seed {summary.seed}: {summary.gpus} GPUs on {summary.nodes} nodes, "
                   f"{summary.algo} AllReduce, {summary.simulated_s:.2f} s simulated in {summary.wall_s:.1f} s, "
                   f"{summary.batches} batches "
                   f"({summary.rows} rows), {summary.events} hook events"
                   + (", job hung" if summary.hung else "") + f" -> {summary.out}", err=True)
