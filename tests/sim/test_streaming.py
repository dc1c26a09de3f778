"""The simulator hands its epoch rows over while it runs and writes each batch window once it
is complete, so its memory does not grow with the run. What it writes must not change: the
rows handed over in pieces (the kernel stopped every few dozen rows)
are the rows of the whole run, no row comes with an epoch before a frontier already given,
and the batch files written window by window are byte for byte those of one write at the end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pulse.sim.anomalies import build_anomaly
from pulse.sim.batches import BatchStream
from pulse.sim.config import SimConfig
from pulse.sim.engine import RunResult, run_engine
from pulse.sim.run import T_BASE_NS, _assign_qpns
from pulse.sim.workload import Job, build_job

from pulse.trace import TraceWriter

# a flapping NIC (link-up CTS records at a later time than the tick) on clocks up to 3 ms
# apart (the frontier is the earliest node clock), 16 us epochs
CFG = SimConfig(scenario="nic-flap", seed=11, nodes=4, gpus_per_node=2, nics_per_node=2, steps=3, epoch_us=16,
                onset_ms=40.0, severity=5.0, clock_offset_us=3000.0)


def _setup() -> tuple[Job, object, np.ndarray, int, np.ndarray]:
    rc = CFG.resolved()
    rng = np.random.default_rng([CFG.seed, 0x5EED])
    job = build_job(rc, rng)
    an, _ = build_anomaly(job, rng, 40_000_000, int(4 * job.est_step_ns * CFG.steps + 1e9))
    span = int(CFG.clock_offset_us * 1000)
    offsets = rng.integers(-span, span + 1, size=CFG.nodes).astype(np.int64)
    epoch = rc.epoch_ns
    eoff = -(-1_000_000 // epoch) * epoch + epoch * (-(-2 * span // epoch))
    return job, an, offsets, eoff, _assign_qpns(job, rng)


Piece = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, "int | None"]


@pytest.fixture(scope="module")
def runs() -> tuple[Job, np.ndarray, int, RunResult, RunResult, list[Piece]]:
    job, an, offsets, eoff, qpn = _setup()
    whole = run_engine(job, an, offsets, eoff, CFG.seed)
    pieces: list[Piece] = []
    job2, an2, offsets2, eoff2, _ = _setup()
    streamed = run_engine(job2, an2, offsets2, eoff2, CFG.seed, buffer_rows=64,
                          sink=lambda q, e, tx, rx, f: pieces.append((q, e, tx, rx, f)))
    return job, qpn, eoff, whole, streamed, pieces


def _rows(q: np.ndarray, e: np.ndarray, tx: np.ndarray, rx: np.ndarray) -> np.ndarray:
    r = np.stack([q, e, tx, rx], axis=1)
    return r[np.lexsort((r[:, 1], r[:, 0]))]


def test_rows_handed_over_in_pieces_are_the_rows_of_the_whole_run(runs) -> None:  # type: ignore[no-untyped-def]
    _job, _qpn, _eoff, whole, streamed, pieces = runs
    assert len(whole.rows_q) > 10_000
    assert len(streamed.rows_q) == 0  # the sink got them
    # the 64-row buffer stopped the kernel inside its 20 ms slices, hundreds of times
    assert len(pieces) > 10 * whole.t_end_ns / 20_000_000
    got = _rows(*(np.concatenate([p[i] for p in pieces]) for i in range(4)))
    np.testing.assert_array_equal(got, _rows(whole.rows_q, whole.rows_e, whole.rows_tx, whole.rows_rx))
    # and the run itself is the same run, tick for tick
    assert streamed.t_end_ns == whole.t_end_ns and streamed.ticks == whole.ticks
    for name in ("part_issue", "part_start", "part_end", "seg_first", "seg_last", "seg_tx", "seg_left"):
        np.testing.assert_array_equal(getattr(streamed, name), getattr(whole, name))


def test_no_row_comes_before_a_frontier_already_given(runs) -> None:  # type: ignore[no-untyped-def]
    *_, pieces = runs
    frontier = -1
    advanced = 0
    for q, e, _tx, _rx, f in pieces:
        if len(q):
            assert int(e.min()) >= frontier
        if f is not None:
            assert f >= frontier
            advanced += f > frontier
            frontier = f
    assert pieces[-1][4] is None  # the last piece closes the run
    assert advanced > 50


def _write(out: Path, job: Job, qpn: np.ndarray, eoff: int, res: RunResult, pieces: list[Piece]) -> tuple[int, int]:
    epoch = job.rc.epoch_ns
    with TraceWriter(out, job=CFG.job, epoch_ns=epoch) as w:
        stream = BatchStream(w, job, qpn, T_BASE_NS - eoff)
        for p in pieces:
            stream.add(*p)
        return stream.finish((res.t_end_ns + 3_000_000 + eoff) // epoch)


def test_batches_written_window_by_window_are_those_of_one_write(runs, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    job, qpn, eoff, whole, _streamed, pieces = runs
    at_end = _write(tmp_path / "once", job, qpn, eoff, whole,
                    [(whole.rows_q, whole.rows_e, whole.rows_tx, whole.rows_rx, None)])
    as_run = _write(tmp_path / "streamed", job, qpn, eoff, whole, pieces)
    assert at_end == as_run
    files = sorted(p.relative_to(tmp_path / "once") for p in (tmp_path / "once" / "samples").rglob("*.batches"))
    assert len(files) == CFG.nodes * CFG.nics_per_node
    for f in files:
        assert (tmp_path / "once" / f).read_bytes() == (tmp_path / "streamed" / f).read_bytes(), f
