"""``pulse eval --sweep``: the random draws (engine/sweep.py) and a tiny sweep end to end."""

from __future__ import annotations

import shlex
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from pulse.engine import diagnose
from pulse.engine.sweep import EPOCH_CHOICES_US, SweepLimits, draw, draws
from pulse.localization import LocalizeParams, score
from pulse.sim.config import SimConfig
from pulse.sim.scenarios import SCENARIOS

from pulse.cli import main
from pulse.errors import ConfigError
from pulse.trace import read_truth

TINY = ["--max-nodes", "4", "--max-gpus-per-node", "2", "--sweep-steps", "6"]


def _config(d) -> SimConfig:
    return SimConfig(scenario=d.scenario, seed=d.seed, nodes=d.nodes, gpus_per_node=d.gpus_per_node,
                     nics_per_node=d.nics_per_node, pp=d.pp, steps=d.steps, epoch_us=d.epoch_us,
                     workload=d.workload, severity=d.severity, onset_ms=d.onset_ms, algo=d.algo,
                     bucket_mb=d.bucket_mb, clock_offset_us=d.clock_skew_us)


def test_draws_are_deterministic_per_seed_and_index() -> None:
    assert draws(6, 7) == draws(6, 7)
    assert draws(6, 7) != draws(6, 8)
    assert draw(7, 4) == draws(6, 7)[4]  # one run can be drawn on its own


def test_every_draw_is_a_valid_simulation_in_the_documented_ranges() -> None:
    ds = [d for seed in range(4) for d in draws(12, seed)]
    for d in ds:
        rc = _config(d).resolved()  # raises on anything the simulator rejects
        assert 4 <= d.nodes <= 32 and d.gpus_per_node in (4, 8) and d.gpus_per_node % d.nics_per_node == 0
        assert 1 <= d.pp <= 4 and d.nodes % d.pp == 0 and rc.dp >= 2
        assert d.epoch_us in EPOCH_CHOICES_US and 16 <= d.epoch_us <= 128
        assert 0 <= d.clock_skew_us <= 5000 and d.workload in SCENARIOS[d.scenario].workloads
        rng = SCENARIOS[d.scenario].severity_range
        assert (d.severity is None) == (rng is None)
        if rng is not None:
            assert rng[0] <= d.severity <= rng[1]
        assert (d.onset_ms is None) == (d.scenario == "healthy")
        assert d.onset_ms is None or d.onset_ms > 0
    names = {d.scenario for d in ds}
    assert "healthy" in names and len(names) >= 8  # healthy ~1 in 5, the rest spread over the battery
    assert len({(d.nodes, d.gpus_per_node, d.nics_per_node, d.pp) for d in ds}) > len(ds) // 2


def test_limits_cap_the_sizes_and_bad_limits_are_config_errors() -> None:
    lim = SweepLimits(max_nodes=6, max_gpus_per_node=2, steps=5, max_skew_us=10.0)
    for d in draws(16, 3, lim):
        assert 4 <= d.nodes <= 6 and d.gpus_per_node == 2 and d.nics_per_node == 2 and d.steps == 5
        assert d.clock_skew_us <= 10.0
        _config(d).resolved()
    for bad in (SweepLimits(max_nodes=3), SweepLimits(max_gpus_per_node=0), SweepLimits(max_skew_us=20_000),
                SweepLimits(steps=0)):
        with pytest.raises(ConfigError):
            draw(0, 0, bad)
    with pytest.raises(ConfigError, match="--sweep 0"):
        draws(0, 0)


def test_the_replay_command_is_the_drawn_simulation() -> None:
    d = draws(5, 2)[0]
    args = shlex.split(d.command(("--job", "x")))
    assert args[:2] == ["pulse", "sim"]
    opts = dict(zip(args[2::2], args[3::2], strict=False))
    assert opts["--scenario"] == d.scenario and int(opts["--seed"]) == d.seed and int(opts["--nodes"]) == d.nodes
    assert float(opts["--clock-skew-us"]) == d.clock_skew_us and opts["--job"] == "x"


def test_sweep_options_conflict_with_the_battery_choice() -> None:
    r = CliRunner().invoke(main, ["eval", "--sweep", "2", "--scenarios", "nic-slow"])
    assert r.exit_code == 2 and "--sweep" in r.output
    r = CliRunner().invoke(main, ["eval", "--sweep", "0"])
    assert r.exit_code == 2 and "--sweep" in r.output and "out of range" in r.output  # a usage error


def test_a_tiny_sweep_end_to_end_and_a_replay_of_one_run(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["eval", "--sweep", "3", "--sweep-seed", "1", *TINY, "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.output
    obj = orjson.loads(r.stdout)
    assert obj["sweep"] == {"runs": 3, "seed": 1, "clock_skew_bound_ns": 10_000_000}  # +-5 ms drawn
    rows = obj["runs"]
    assert sorted((x["index"], x["method"]) for x in rows) == [(i, m) for i in range(3) for m in ("baseline", "pulse")]
    for x in rows:
        assert x["replay"].startswith("pulse sim --scenario ") and x["draw"]["nodes"] == 4
        assert x["outcome_all"] in ("node", "group", "misdiagnosed", "missed", "healthy-ok", "false-alarm")
    wrong = {x["index"] for x in rows if x["method"] == "pulse"
             and {x["outcome"], x["outcome_all"]} & {"missed", "misdiagnosed", "false-alarm"}}
    assert {x["index"] for x in obj["wrong"]} == wrong
    for m in ("pulse", "baseline"):
        s = obj["summary"][m]
        assert s["runs"] + s["healthy_runs"] == 3 and "precision_all" in s and "misdiagnosed_any" in s
    # the printed command line gives the same trace, hence the same answer
    pulse_row = next(x for x in rows if x["method"] == "pulse" and x["index"] == 0)
    out = tmp_path / "replay"
    args = shlex.split(pulse_row["replay"])[2:]
    args[args.index("--out") + 1] = str(out)
    rr = CliRunner().invoke(main, ["sim", *args])
    assert rr.exit_code == 0, rr.output
    again = score(diagnose(out, LocalizeParams(clock_skew_ns=10_000_000)).verdicts, read_truth(out), method="pulse")
    assert (again.outcome, again.outcome_all, again.named) == (
        pulse_row["outcome"], pulse_row["outcome_all"], pulse_row["named"])


def test_kept_traces_are_reused_only_for_the_run_that_made_them(tmp_path: Path) -> None:
    # a sweep of the same seed at another size names its runs the same but draws other shapes
    def lim(n: int) -> SweepLimits:
        return SweepLimits(max_nodes=n, max_gpus_per_node=2, steps=6)
    seed = next(s for s in range(1, 200) if draw(s, 0, lim(4)).scenario == draw(s, 0, lim(8)).scenario
                and draw(s, 0, lim(4)).nodes != draw(s, 0, lim(8)).nodes)
    keep = tmp_path / "keep"

    def sweep(nodes: int) -> int:
        args = ["eval", "--sweep", "1", "--sweep-seed", str(seed), "--max-nodes", str(nodes),
                "--max-gpus-per-node", "2", "--sweep-steps", "6", "--jobs", "1", "--keep", str(keep), "--json"]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        drawn = orjson.loads(r.stdout)["runs"][0]["draw"]["nodes"]
        (trace,) = [p for p in keep.iterdir() if p.is_dir()]
        assert read_truth(trace)["sim"]["nodes"] == drawn  # scored on the cluster it drew
        return drawn

    assert sweep(4) != sweep(8)


def test_a_simulation_that_fails_stops_the_evaluation_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    # a full disk: the sim command said so and returned 1, and the evaluation went on to
    # read the half-written trace
    from pulse.trace import TraceWriter

    def full(self, batch) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(TraceWriter, "write_batch", full)
    small = ["--nodes", "4", "--gpus-per-node", "1", "--nics-per-node", "1", "--pp", "1", "--steps", "4"]
    r = CliRunner().invoke(main, ["eval", "--scenarios", "gpu-slow", "--seeds", "1", "--jobs", "1",
                                  *(f"--sim-arg={a}" for a in small)])
    assert r.exit_code == 1, r.output
    assert "error: No space left on device" in r.stderr
    assert "failed (exit 1)" in r.stderr.splitlines()[-1] and "Traceback" not in r.output


def test_job_slowdown_is_the_time_after_the_onset_over_the_healthy_twins() -> None:
    from pulse.engine.evaluate import job_slowdown
    truth = {"onset_ns": 100, "sim": {"end_true_ns": 300, "hung": False}}
    assert job_slowdown(truth, {"sim": {"end_true_ns": 250}}) == pytest.approx(200 / 150)
    assert job_slowdown({**truth, "sim": {"end_true_ns": 300, "hung": True}}, {"sim": {"end_true_ns": 250}}) is None
    assert job_slowdown({**truth, "onset_ns": None}, {"sim": {"end_true_ns": 250}}) is None


def test_a_faults_twin_is_the_same_draw_without_it_and_measures_its_slowdown(tmp_path: Path) -> None:
    from pulse.engine.evaluate import NOT_SLOWED, Run, job_slowdown, simulate, twin_run
    shape = ("--nodes", "4", "--gpus-per-node", "2", "--nics-per-node", "2", "--steps", "6", "--onset-ms", "100")
    run = Run("nic-slow", 3, 0.25, "dense", shape, name="sweep1-000-nic-slow")
    twin = twin_run(run)
    assert (twin.scenario, twin.severity, twin.seed, twin.sim_args, twin.name) == (
        "healthy", None, 3, shape, "sweep1-000-nic-slow-twin")
    simulate(run, tmp_path / "run")
    simulate(twin, tmp_path / "twin")
    truth, healthy = read_truth(tmp_path / "run"), read_truth(tmp_path / "twin")
    assert healthy["scenario"] == "healthy" and healthy["sim"]["nodes"] == truth["sim"]["nodes"] == 4
    # a NIC at a quarter of its capacity from 100 ms on: the job runs longer than without it
    # (x1.049 for this seed: its steps are mostly compute), beyond the "not slowed" bucket
    assert job_slowdown(truth, healthy) > 1.0 + 2 * NOT_SLOWED
