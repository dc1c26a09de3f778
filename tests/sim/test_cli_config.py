"""Bad input gives a clear error naming what is valid; the CLI writes and summarises."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from pulse.sim.config import SimConfig
from pulse.sim.run import simulate
from pulse.sim.scenarios import SCENARIOS

from pulse.cli import main
from pulse.errors import ConfigError


@pytest.mark.parametrize(("kw", "message"), [
    (dict(scenario="nic-sloww"), "valid scenarios: healthy, nic-slow"),
    (dict(nodes=6, pp=4), "valid pp values for 6 nodes: 1, 2, 3"),
    (dict(nodes=2, pp=2), "at least 2 nodes per pipeline stage"),
    (dict(gpus_per_node=8, nics_per_node=3), "must divide --gpus-per-node"),
    (dict(scenario="nic-slow", severity=0.9), "valid [0.25, 0.5]"),
    (dict(scenario="gpu-slow", severity=1.0), "valid [1.2, 1.5]"),
    (dict(scenario="nic-down", severity=0.5), "takes no --severity"),
    (dict(scenario="moe-slow-nic", workload="dense"), "needs --workload moe"),
    (dict(workload="sparse"), "valid workloads: dense, moe"),
    (dict(epoch_us=0), "--epoch-us"),
    (dict(steps=0), "--steps"),
    (dict(onset_ms=-1.0), "--onset-ms"),
    (dict(job="bad name"), "job"),
    (dict(bucket_mb=-3.0), "--bucket-mb"),
    (dict(algo="bogus"), "algo"),
])
def test_bad_config_is_a_config_error(kw: dict, message: str) -> None:
    with pytest.raises(Exception) as info:
        SimConfig(**kw).resolved()
    assert isinstance(info.value, ConfigError) or type(info.value).__name__ == "EncodeError"
    assert message in str(info.value)


def test_every_scenario_has_a_valid_default_severity() -> None:
    for sc in SCENARIOS.values():
        rc = SimConfig(scenario=sc.name).resolved()
        if sc.severity_range is None:
            assert rc.severity is None
        else:
            lo, hi = sc.severity_range
            assert lo < rc.severity < hi


def test_out_must_be_empty(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(ConfigError, match="not an empty directory"):
        simulate(SimConfig(nodes=4, gpus_per_node=1, nics_per_node=1, steps=1), tmp_path)
    assert (tmp_path / "x").read_text() == "keep me"


def test_cli_errors_exit_1_with_one_line() -> None:
    r = CliRunner().invoke(main, ["sim", "--scenario", "bogus"])
    assert r.exit_code == 1
    assert "error: unknown scenario 'bogus'" in r.output and "switch-congestion" in r.output
    r = CliRunner().invoke(main, ["sim", "--nodes", "7"])
    assert r.exit_code == 1 and "does not divide" in r.output
    r = CliRunner().invoke(main, ["sim", "--scenario", "packet-loss", "--severity", "0.5"])
    assert r.exit_code == 1 and "valid [0.005, 0.02]" in r.output


def test_cli_help_lists_scenarios() -> None:
    r = CliRunner().invoke(main, ["sim", "--help"])
    assert r.exit_code == 0
    for name in SCENARIOS:
        assert name in r.output


def test_cli_json_summary(tmp_path: Path) -> None:
    out = tmp_path / "t"
    r = CliRunner().invoke(main, ["sim", "--scenario", "gpu-slow", "--seed", "2", "--nodes", "4",
                                  "--gpus-per-node", "1", "--nics-per-node", "1", "--steps", "2",
                                  "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    s = orjson.loads(r.stdout)
    assert s["scenario"] == "gpu-slow" and s["gpus"] == 4 and s["nodes"] == 4
    assert s["simulated_s"] > 0.1 and s["batches"] > 0 and s["events"] > 0 and s["out"] == str(out)
    assert (out / "truth.json").exists() and (out / "oplevel.jsonl").exists()


def test_cli_clock_skew_draws_offsets_in_the_bound(tmp_path: Path) -> None:
    out = tmp_path / "t"
    r = CliRunner().invoke(main, ["sim", "--seed", "3", "--nodes", "4", "--gpus-per-node", "1",
                                  "--nics-per-node", "1", "--steps", "1", "--clock-skew-us", "5000",
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    offsets = orjson.loads((out / "truth.json").read_bytes())["clock_offsets_ns"]
    assert len(offsets) == 4 and all(abs(o) <= 5_000_000 for o in offsets.values())
    assert max(abs(o) for o in offsets.values()) > 100_000  # not the 100 us default
    for bad in ("-1", "10001", "nan"):
        r = CliRunner().invoke(main, ["sim", "--clock-skew-us", bad, "--out", str(tmp_path / "x")])
        assert r.exit_code == 2 and "--clock-skew-us" in r.output and "<= 10000" in r.output
