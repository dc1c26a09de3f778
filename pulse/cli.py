"""The ``pulse`` command line: one group, subcommands loaded lazily from their packages.

Conventions (DESIGN.md "CLI conventions"): human output and progress on stderr, ``--json``
results on stdout, exit 0 on success, 1 with a one-line message for a :class:`PulseError`,
2 for usage errors.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from pulse.errors import PulseError

# name -> (module:attribute, one-line help). Loading lazily keeps `pulse --help` fast and
# lets a command's heavy imports (numba, faust, matplotlib) happen only when it runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("pulse._broker_cli:broker", "Run the embedded Kafka-compatible broker (Tansu)."),
    "sim": ("pulse.sim.cli:sim", "Simulate a training cluster with an anomaly; write a trace directory."),
    "diagnose": ("pulse.engine.cli:diagnose", "Segment and localize a trace directory in one process."),
    "eval": ("pulse.engine.cli:eval_command", "Score Pulse and the operator-level baseline on the scenario battery."),
    "capture": ("pulse.nic.cli:capture", "Per-flow epochs from a pcap/pcapng file or a live interface."),
    "hooks": ("pulse.hooks.cli:hooks", "Operator-descriptor sources: build the NCCL plugin, parse logs, read rdma res."),
    "produce": ("pulse.producers.cli:produce", "Publish samples and hook events to Kafka."),
    "agent": ("pulse.streams.agent_cli:agent", "The per-node agent: capture + hooks, joined, to Kafka; its health."),
    "worker": ("pulse.streams.cli:worker", "Run the Faust worker (segment and localize agents)."),
    "incidents": ("pulse.streams.incidents_cli:incidents", "List open and recent incidents from the incidents topic."),
    "demo": ("pulse.streams.cli:demo", "Broker + worker + a live simulated job with an anomaly; print verdicts."),
    "report": ("pulse.report:report", "Plot an anomaly (PNG + HTML) from a trace directory or InfluxDB."),
    "lab": ("pulse.lab:lab", "Real torch.distributed traffic in network namespaces with injected faults."),
    "bench": ("pulse.bench:bench", "Benchmarks, each reported as a ratio to a reference measured in the same run."),
}


def load(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in self.lazy:
            return cmd
        try:
            return load(self.lazy[name][0])
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("pulse"):
                raise click.ClickException(f"'{name}' is not available in this build ({exc})") from None
            raise click.ClickException(
                f"'{name}' needs the Python package '{exc.name}', which is not installed") from None
        except AttributeError:
            raise click.ClickException(
                f"'{name}' is not available in this build ({self.lazy[name][0]} is missing)") from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, self.lazy[name][1]) for name in sorted(self.lazy)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PulseError as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(1)
        except OSError as exc:
            # the machine's, not Pulse's: a full disk, a missing permission - one line
            where = f" ({exc.filename})" if exc.filename else ""
            click.echo(f"error: {exc.strerror or exc}{where}", err=True)
            ctx.exit(1)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pulse-monitor", prog_name="pulse")
def main() -> None:
    """Pulse: find the node that slows down a large training job, from its traffic."""


def run() -> None:  # console-script entry point
    main(prog_name="pulse")


if __name__ == "__main__":
    sys.exit(main(prog_name="pulse"))
