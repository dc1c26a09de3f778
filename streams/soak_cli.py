"""``pulse bench soak``: the chaos soak's command line (the run itself is in soak.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from pulse.cli_types import KeepDir, Number, count
from pulse.settings import Settings


@click.command("soak", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--minutes", type=Number(float, 0.5, 24 * 60.0), default=10.0, show_default=True,
              help="How long the live job streams (faults on a random schedule meanwhile).")
@click.option("--seed", type=count(0, 2**31 - 1), default=1, show_default=True,
              help="Seeds the jobs' simulation and the fault schedule.")
@click.option("--workers", type=count(1, 8), default=2, show_default=True, help="Workers in the consumer group.")
@click.option("--workdir", type=KeepDir(), default=None,
              help="Keep logs, traces and data here (default: a temporary directory, removed).")
@click.option("--storage", type=click.Choice(["memory", "s3"]), default="memory", show_default=True,
              help="The broker's storage: memory (a restart loses what it held: counted) or s3 (Tansu on "
                   "moto's S3 server: keeps the topics, but Tansu 0.6 stalls consumers on it, docs/reliability.md).")
@click.option("--json", "as_json", is_flag=True, help="The accounting as one JSON object on stdout.")
def bench_soak(minutes: float, seed: int, workers: int, workdir: str | None, storage: str, as_json: bool) -> None:
    """The whole pipeline for MINUTES under broker restarts, worker kills, InfluxDB outages,
    poison messages and producer bursts, with an accounting of every message (lost must be 0)."""
    from .soak import SoakConfig, run_soak

    cfg = SoakConfig(minutes=minutes, seed=seed, workers=workers, echo=True, storage=storage)
    out = run_soak(Settings.from_env(), cfg, Path(workdir) if workdir else None)
    if as_json:
        sys.stdout.write(orjson.dumps(out).decode() + "\n")
    else:
        click.echo(summary_line(out), err=True)
    if out["lost"]:
        sys.exit(1)


def summary_line(out: dict) -> str:  # type: ignore[type-arg]
    return (f"soak {out['minutes']:g} min: produced {out['produced']}, consumed {out['consumed']}, "
            f"duplicates {out['duplicates']}, dead-lettered {out['dead_lettered']} (poison {out['poison_sent']}), "
            f"dropped {out['dropped']}, LOST {out['lost']}; incidents {out['incidents_right']}/"
            f"{out['incidents_expected']} right, {out['incidents_wrong']} wrong; faults {out['faults_injected']}")
