"""`pulse lab sweep`: the draws, the scoring, the table, the JSON and the replay lines.

The lab itself (namespaces, the DDP job, the capture) needs root and a minute a run: it runs
in tests/lab/test_lab_sweep_e2e.py. Here each draw is answered by a recorded real lab run
(tests/engine/traces: lab-rate for rate and cpu draws, lab-loss for loss and healthy ones):
Pulse diagnoses that real trace and the verdicts are scored against the *draw's* truth. Most
draws then differ from the recording (another rank, another kind), which is what exercises
the wrong-blame and false-alarm rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pulse.engine import diagnose
from pulse.lab import sweep as sw
from pulse.lab.analysis import lab_params, score_run, truth_of
from pulse.lab.faults import parse_fault

from pulse.cli import main
from pulse.errors import ServiceError
from pulse.trace import read_truth

TRACES = Path(__file__).parent.parent / "engine" / "traces"
PULSE = [str(Path(sys.executable).with_name("pulse"))]


def replay(d: sw.LabDraw, workdir: Path) -> dict[str, Any]:
    trace = TRACES / ("lab-rate" if d.kind in ("rate", "cpu") else "lab-loss")
    res = diagnose(trace, lab_params(), baseline=True)
    truth = truth_of(parse_fault(d.fault, d.ranks), {r: f"node-{r:02d}" for r in range(d.ranks)},
                     read_truth(trace)["onset_ns"])
    return {"step_ms": {"healthy_median": 1.0, "faulty_median": 2.0, "healthy_slowest": 1.2}, **score_run(res.verdicts, res.baseline or [], truth)}


def test_draws_are_deterministic_and_cover_the_ranges() -> None:
    ds = sw.draws(400, 3)
    assert ds == sw.draws(400, 3) and ds != sw.draws(400, 4)
    assert {d.ranks for d in ds} == set(range(4, 9))
    kinds = [d.kind for d in ds]
    assert 0.12 < kinds.count("none") / len(ds) < 0.28 and set(kinds) == {"none", "rate", "loss", "cpu"}
    for d in ds:
        if d.kind == "none":
            assert d.rank == -1 and d.strength is None and d.fault == "none"
            continue
        assert 0 <= d.rank < d.ranks and d.strength is not None
        lo, hi = {"rate": sw.RATE_MBIT, "loss": sw.LOSS_PCT, "cpu": sw.CPU_QUOTA}[d.kind]
        assert lo <= d.strength <= hi
        # the replay line is a valid `pulse lab run` fault for that many ranks
        f = parse_fault(d.fault, d.ranks)
        assert (f.kind, f.rank) == (d.kind, d.rank)
        assert f.value == pytest.approx(d.strength * (1e6 if d.kind == "rate" else 1))
    rates = sorted(d.strength for d in ds if d.kind == "rate" and d.strength)
    assert rates[0] < 300 and rates[-1] > 1000  # log-uniform: both ends drawn


def test_each_run_is_scored_on_every_incident() -> None:
    ds = [sw.LabDraw(0, 4, "rate", 2, 200.0, 16, 6),   # the recording's own fault: right
          sw.LabDraw(1, 4, "loss", 1, 2.0, 16, 6),     # lab-loss: node-01 (no more extra path)
          sw.LabDraw(2, 5, "cpu", 2, 0.2, 16, 6),      # network verdicts for a compute fault
          sw.LabDraw(3, 6, "none", -1, None, 16, 6)]   # any incident is a false alarm
    res = sw.run_sweep(ds, replay)
    by = {r["index"]: r for r in res["runs"]}
    assert (by[0]["outcome_all"], by[0]["right"]) == ("node", True)
    # the localizer once added a path {node-01, node-02} after node-01 here (a wrong blame on
    # every incident); the slow-link rule no longer names a cover holding a node seen healthy
    assert (by[1]["outcome"], by[1]["outcome_all"], by[1]["right"]) == ("node", "node", True)
    # first incident wrong (network verdicts for a compute fault): wrong on every incident too
    assert by[2]["outcome_all"] == "misdiagnosed" and by[3]["outcome_all"] == "false-alarm"
    assert [r["index"] for r in res["wrong"]] == [2, 3]
    assert res["table"]["rate"] == {"runs": 1, "node": 1, "group": 0, "wrong_blame": 0, "missed": 0,
                                    "missed_job_not_slowed": 0}
    assert res["table"]["loss"]["wrong_blame"] == 0 and res["table"]["cpu"]["wrong_blame"] == 1
    assert res["table"]["healthy"] == {"runs": 1, "quiet": 0, "false_alarm": 1}
    s = res["summary"]["pulse"]
    assert (s["runs"], s["node"], s["node_all"], s["misdiagnosed_any"], s["false_alarms"]) == (3, 2, 2, 1, 1)
    lines = "\n".join(sw.table_lines({"sweep": {}, **res}))
    assert f"pulse lab run {ds[2].command().split('pulse lab run ', 1)[-1]}" in lines  # the wrong run's replay
    assert "--fault loss:1:2" not in lines  # a right run has no replay line


def test_a_run_that_did_not_happen_is_listed_not_scored() -> None:
    ds = [sw.LabDraw(0, 4, "rate", 2, 200.0, 16, 6), sw.LabDraw(1, 8, "cpu", 5, 0.2, 16, 6)]

    def some_fail(d: sw.LabDraw, workdir: Path) -> dict[str, Any]:
        if d.kind == "cpu":
            raise ServiceError("the cpu quota on rank 5 never throttled it")
        return replay(d, workdir)

    res = sw.run_sweep(ds, some_fail)
    assert [r["index"] for r in res["runs"]] == [0] and res["table"]["cpu"]["runs"] == 0
    assert res["summary"]["pulse"]["runs"] == 1 and res["summary"]["pulse"]["missed"] == 0
    assert res["errors"] == [{"index": 1, "draw": ds[1].to_dict(), "command": ds[1].command(), "kind": "cpu",
                              "error": "the cpu quota on rank 5 never throttled it"}]
    text = "\n".join(sw.table_lines({"sweep": {}, **res}))
    assert "not run as drawn, not scored: the cpu quota" in text and ds[1].command() in text

    def broken(d: sw.LabDraw, workdir: Path) -> dict[str, Any]:
        raise ServiceError("a rank exited 1")

    with pytest.raises(ServiceError, match=r"lab sweep: no run happened; the last: pulse lab run --ranks \d .*: "
                                           "a rank exited 1"):
        sw.run_sweep(sw.draws(2, 0), broken)


def test_cli_table_json_and_progress(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sw, "lab_executor", lambda **kw: replay)
    r = CliRunner().invoke(main, ["lab", "sweep", "--runs", "6", "--seed", "5", "--json", "--keep", str(tmp_path / "k")])
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["sweep"] == {"runs": 6, "seed": 5, "steps": 16, "fault_after": 6}
    assert [x["draw"] for x in obj["runs"]] == [d.to_dict() for d in sw.draws(6, 5)]
    faulty = [k for k in obj["table"] if k != "healthy"]
    assert sum(obj["table"][k]["runs"] for k in faulty) + obj["table"]["healthy"]["runs"] == 6
    for k in faulty:
        t = obj["table"][k]
        assert t["node"] + t["group"] + t["wrong_blame"] + t["missed"] == t["runs"]
    wrong = [x for x in obj["runs"] if not x["right"]]
    assert wrong and obj["wrong"] == wrong
    err = r.stderr
    assert err.count("lab sweep [") == 6  # progress, one line a run
    assert "wrong blame" in err and "every incident scored" in err
    for x in wrong:
        assert x["command"] in err and x["command"].startswith("pulse lab run --ranks ")
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == [f"run-{i:03d}" for i in range(6)]
    # same seed, same sweep
    again = CliRunner().invoke(main, ["lab", "sweep", "--runs", "6", "--seed", "5", "--json"])
    def brief(o: dict) -> list:  # a verdict's emitted_at is wall time: the rest must match
        return [(x["command"], x["outcome"], x["outcome_all"], x["named"]) for x in o["runs"]]

    assert brief(json.loads(again.stdout)) == brief(obj)


@pytest.mark.parametrize(("args", "match"), [
    (["--runs", "0"], "--runs"), (["--runs", "2", "--fault-after", "16"], "--fault-after 16 must be below"),
    (["--runs", "nan"], "--runs"), ([], "--runs"),
])
def test_cli_refuses_bad_options(args: list[str], match: str) -> None:
    r = CliRunner().invoke(main, ["lab", "sweep", *args])
    assert r.exit_code in (1, 2) and match in r.output and "Traceback" not in r.output


def test_without_root_the_sweep_is_one_clear_error() -> None:
    cmd = [*PULSE, "lab", "sweep", "--runs", "2"]
    if os.geteuid() == 0:
        cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "needs root" in proc.stderr


def test_a_miss_of_a_fault_that_never_slowed_the_job_is_counted_apart() -> None:
    """The harness's own step times say whether the fault slowed the job at all: faulty
    steps no slower than the slowest healthy step. Such a miss stays a miss (not right), and
    the table and the replay line say the job was not slowed."""
    assert sw.job_slowdown({"healthy_median": 200.0, "faulty_median": 230.0, "healthy_slowest": 240.0}) == \
        {"ratio": 1.15, "slowed": False}
    assert sw.job_slowdown({"healthy_median": 200.0, "faulty_median": 330.0, "healthy_slowest": 240.0}) == \
        {"ratio": 1.65, "slowed": True}
    assert sw.job_slowdown({"healthy_median": 200.0, "faulty_median": None}) is None

    def quiet(slowest: float) -> sw.Execute:
        def run(d: sw.LabDraw, workdir: Path) -> dict[str, Any]:
            truth = truth_of(parse_fault(d.fault, d.ranks), {r: f"node-{r:02d}" for r in range(d.ranks)}, 0)
            return {"step_ms": {"healthy_median": 200.0, "faulty_median": 230.0, "healthy_slowest": slowest},
                    **score_run([], [], truth)}
        return run

    ds = [sw.LabDraw(0, 8, "cpu", 6, 0.21, 16, 6)]
    res = sw.run_sweep(ds, quiet(240.0))
    assert res["table"]["cpu"]["missed"] == 1 and res["table"]["cpu"]["missed_job_not_slowed"] == 1
    assert not res["runs"][0]["right"]
    assert any("job steps x1.15, within its healthy steps" in ln for ln in sw.table_lines(res))
    res = sw.run_sweep(ds, quiet(210.0))
    assert res["table"]["cpu"]["missed_job_not_slowed"] == 0
    assert any(ln.endswith("job steps x1.15") for ln in sw.table_lines(res))
