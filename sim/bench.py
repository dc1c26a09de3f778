"""``pulse bench sim``: simulated seconds per wall second at the default cluster size.

Reference, measured in the same run: a bare numpy pass that produces the same number of
epoch rows (random flows/epochs/bytes, sorted by (nic, flow, epoch) and written to disk as
raw arrays) - the floor of any simulator that emits those rows. The ratio is
figure / reference = t_numpy / t_sim (1.0 would mean simulating costs no more than writing).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import click
import orjson

from pulse.cli_types import count


def _numpy_reference(rows: int, out: Path) -> float:
    import numpy as np

    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    nic = rng.integers(0, 64, size=rows, dtype=np.int64)
    flow = rng.integers(0, 4096, size=rows, dtype=np.int64)
    epoch = rng.integers(0, 1 << 20, size=rows, dtype=np.int64)
    tx = rng.integers(1, 1 << 20, size=rows, dtype=np.int64)
    order = np.lexsort((epoch, flow, nic))
    with open(out, "wb") as fh:
        for col in (flow, epoch, tx, tx):
            fh.write(col[order].astype("<u4").tobytes())
    return time.perf_counter() - t0


@click.command(name="sim")
@click.option("--steps", type=count(1, 10_000), default=20, show_default=True)
@click.option("--scenario", default="healthy", show_default=True)
@click.option("--seed", type=count(0, 2**32 - 1), default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
def bench_sim(steps: int, scenario: str, seed: int, as_json: bool) -> None:
    """Simulated seconds per wall second at the default size (64 GPUs), vs a bare numpy pass."""
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    cfg = SimConfig(scenario=scenario, seed=seed, steps=steps)
    cfg.resolved()
    tmp = Path(tempfile.mkdtemp(prefix="pulse-bench-sim-"))
    try:
        # warm the numba cache so compilation is not timed
        simulate(SimConfig(scenario="healthy", seed=seed, nodes=4, gpus_per_node=1, nics_per_node=1, steps=1),
                 tmp / "warm")
        t0 = time.perf_counter()
        summary = simulate(cfg, tmp / "run")
        wall = time.perf_counter() - t0
        t_ref = _numpy_reference(summary.rows, tmp / "ref.bin")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    figure = summary.simulated_s / wall
    reference = summary.simulated_s / t_ref
    result = {
        "bench": "sim", "scenario": scenario, "gpus": summary.gpus, "steps": steps,
        "simulated_s": summary.simulated_s, "wall_s": wall, "rows": summary.rows, "batches": summary.batches,
        "figure": figure, "unit": "simulated s per wall s", "reference": reference,
        "reference_what": "bare numpy pass producing and writing the same epoch rows", "ratio": figure / reference,
    }
    if as_json:
        click.echo(orjson.dumps(result).decode())
    else:
        click.echo(f"sim: {figure:.3f} simulated s / wall s ({summary.simulated_s:.2f} s of a {summary.gpus}-GPU job "
                   f"in {wall:.1f} s, {summary.rows} rows); reference (numpy rows pass): {reference:.1f}; "
                   f"ratio {figure / reference:.4f}", err=True)
