"""``pulse bench``: every figure is printed with a reference measured in the same run and
their ratio, since the machines are shared and noisy (DESIGN.md "Budgets")."""

from __future__ import annotations

import click

from pulse.cli import LazyGroup

BENCHES: dict[str, tuple[str, str]] = {
    "sim": ("pulse.sim.bench:bench_sim", "Simulated seconds per wall second at the default size."),
    "segment": ("pulse.segmentation.bench:bench_segment", "Segmentation kernel rows/s vs a bare numpy pass."),
    "pcap": ("pulse.nic.bench:bench_pcap", "pcap read+decode+bin packets/s vs tcpdump -r."),
    "agent": ("pulse.producers.agent_bench:bench_agent", "Node agent CPU per 100k packets/s and 10k hook events/s."),
    "localize": ("pulse.streams.localize_bench:bench_localize", "Localization GPUs per core vs a bare JSON decode."),
    "pipeline": ("pulse.streams.bench:bench_pipeline", "Producer->broker->segment agent vs raw aiokafka; demo latency."),
    "scale": ("pulse.streams.scalebench:bench_scale", "Per-stage CPU per second of traffic, GPUs per core, Kafka bytes per GPU-s."),
    "soak": ("pulse.streams.soak_cli:bench_soak", "The pipeline for minutes under faults: every message accounted for."),
}


@click.group(cls=LazyGroup, lazy=BENCHES)
def bench() -> None:
    """Benchmarks (figure, same-run reference, ratio)."""
