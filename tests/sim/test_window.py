"""The simulator lays out the job's messages a window of steps at a time (the next step when
a node reaches the last instruction of the last one laid out, a step dropped once all its
messages are through), so its memory does not grow with the number of steps. The window must
never change the run: with one step laid out ahead, the run is the run of the whole job laid
out at once, tick for tick and row for row."""

from __future__ import annotations

import numpy as np
import pytest
from pulse.sim.anomalies import build_anomaly
from pulse.sim.config import SimConfig
from pulse.sim.engine import RunResult, run_engine
from pulse.sim.workload import build_job

CASES = {
    # MoE all-to-all at 16 us epochs, one pipeline stage, a slow NIC
    "moe": SimConfig(scenario="moe-slow-nic", seed=3, nodes=4, gpus_per_node=2, nics_per_node=2, pp=1,
                     steps=4, epoch_us=16, workload="moe", onset_ms=30.0),
    # packet loss (go-back-N resends, whose bytes go to the message last sent, which may
    # belong to a dropped step) under tree AllReduce and two pipeline stages
    "loss-tree": SimConfig(scenario="packet-loss", seed=5, nodes=4, gpus_per_node=2, nics_per_node=2, pp=2,
                           steps=4, algo="tree", bucket_mb=1.0, onset_ms=20.0, severity=0.02),
    # a starved proxy (random post and consume delays) on four pipeline stages, skewed clocks
    "cpu-pp4": SimConfig(scenario="cpu-contention", seed=7, nodes=8, gpus_per_node=1, nics_per_node=1, pp=4,
                         steps=4, onset_ms=20.0, clock_offset_us=2000.0),
}


def _run(cfg: SimConfig, window_steps: int) -> RunResult:
    rc = cfg.resolved()
    rng = np.random.default_rng([cfg.seed, 0x5EED])
    job = build_job(rc, rng)
    an, _ = build_anomaly(job, rng, int(cfg.onset_ms * 1e6), int(4 * job.est_step_ns * cfg.steps + 1e9))
    offsets = rng.integers(-2_000_000, 2_000_001, size=cfg.nodes).astype(np.int64)
    return run_engine(job, an, offsets, 5_000_000, cfg.seed, window_steps=window_steps)


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_one_step_ahead_is_the_run_of_the_whole_job(case: str) -> None:
    cfg = CASES[case]
    whole = _run(cfg, cfg.steps)
    windowed = _run(cfg, 1)
    assert whole.laid_steps == cfg.steps
    # the window really slid: never more than two steps laid out (the one running and the
    # next one, until the first is through)
    assert windowed.laid_steps <= 2
    assert not whole.hung and len(whole.rows_q) > 1000
    assert windowed.t_end_ns == whole.t_end_ns and windowed.ticks == whole.ticks
    for name in ("part_issue", "part_start", "part_end", "seg_first", "seg_last", "seg_tx", "seg_left"):
        np.testing.assert_array_equal(getattr(windowed, name), getattr(whole, name), err_msg=name)
    # the same rows; the run stops more often to slide the window, and each stop hands over
    # the rows of epochs already over, so they come in another order (the writer sorts them)
    np.testing.assert_array_equal(_rows(windowed), _rows(whole))


def _rows(r: RunResult) -> np.ndarray:
    rows = np.stack([r.rows_q, r.rows_e, r.rows_tx, r.rows_rx], axis=1)
    return rows[np.lexsort((rows[:, 1], rows[:, 0]))]
