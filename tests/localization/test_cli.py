"""`pulse diagnose` end to end on a small simulated trace."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner

from pulse.cli import main


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate
    out = tmp_path_factory.mktemp("t") / "nic-slow"
    simulate(SimConfig(scenario="nic-slow", seed=1, nodes=4, gpus_per_node=2, nics_per_node=2, steps=6,
                       severity=0.25), out)
    return out


def test_diagnose_json_lines_are_verdicts(trace):
    res = CliRunner().invoke(main, ["diagnose", str(trace), "--json", "--verdicts", "--baseline"])
    assert res.exit_code == 0, res.output
    lines = [orjson.loads(x) for x in res.stdout.splitlines() if x.strip()]
    assert lines and {x["type"] for x in lines} == {"verdict"}
    assert {x["method"] for x in lines} == {"pulse", "baseline"}


def test_diagnose_json_lines_are_incident_changes_by_default(trace):
    res = CliRunner().invoke(main, ["diagnose", str(trace), "--json"])
    assert res.exit_code == 0, res.output
    lines = [orjson.loads(x) for x in res.stdout.splitlines() if x.strip()]
    assert lines and {x["type"] for x in lines} == {"incident"}
    # one fault: it opens first and, the trace ending, is resolved last
    assert len({x["id"] for x in lines}) == 1
    assert lines[0]["state"] == "open" and lines[-1]["state"] == "resolved"
    assert "node" in lines[0]["summary"] and lines[0]["nodes"]


def test_diagnose_human_summary_and_errors(trace, tmp_path):
    res = CliRunner().invoke(main, ["diagnose", str(trace)])
    assert res.exit_code == 0
    assert "pulse: incident inc-" in res.stderr and "reference" in res.stderr
    (tmp_path / "x").mkdir()
    bad = CliRunner().invoke(main, ["diagnose", str(tmp_path / "x")])
    assert bad.exit_code == 1 and "error:" in bad.stderr
