"""``pulse lab sweep``: the lab run N times on drawn job sizes, ranks, faults and strengths,
scored like the simulator's sweep (every incident counts).

A draw is a pure function of (sweep seed, index): 4 to 8 ranks, a healthy run about one in
five, otherwise a rate limit (100 Mbit/s to 2 Gbit/s, log-uniform: the strength is a ratio),
a loss (0.5-5 %) or a CPU quota (0.1-0.5 of a core) on a random rank. Each run is exactly the
``pulse lab run`` command line printed beside it, so a wrong or missed one can be run again on
its own. The traffic is real, so a replay is a new run of the same fault, not the same bytes.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pulse.errors import PulseError

HEALTHY_SHARE = 0.2
KINDS = ("rate", "loss", "cpu")
MIN_RANKS, MAX_RANKS = 4, 8
RATE_MBIT = (100.0, 2000.0)
LOSS_PCT = (0.5, 5.0)
CPU_QUOTA = (0.1, 0.5)


@dataclasses.dataclass(frozen=True)
class LabDraw:
    index: int
    ranks: int
    kind: str
    """none | rate | loss | cpu"""
    rank: int
    """The faulty rank (-1: healthy)."""
    strength: float | None
    """Mbit/s for rate, percent for loss, fraction of a core for cpu."""
    steps: int
    fault_after: int

    @property
    def fault(self) -> str:
        """The ``--fault`` argument of ``pulse lab run``."""
        if self.kind == "none":
            return "none"
        value = f"{self.strength:g}mbit" if self.kind == "rate" else f"{self.strength:g}"
        return f"{self.kind}:{self.rank}:{value}"

    def command(self) -> str:
        """The ``pulse lab run`` command line of this run."""
        return shlex.join(["pulse", "lab", "run", "--ranks", str(self.ranks), "--fault", self.fault,
                           "--steps", str(self.steps), "--fault-after", str(self.fault_after)])

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fault": self.fault}


def draw(seed: int, index: int, *, steps: int = 16, fault_after: int = 6) -> LabDraw:
    """The ``index``-th run of the sweep ``seed`` (deterministic)."""
    rng = np.random.default_rng([seed, index, 0x1AB5])
    ranks = int(rng.integers(MIN_RANKS, MAX_RANKS + 1))
    if rng.random() < HEALTHY_SHARE:
        return LabDraw(index, ranks, "none", -1, None, steps, fault_after)
    kind = KINDS[int(rng.integers(len(KINDS)))]
    rank = int(rng.integers(ranks))
    if kind == "rate":
        lo, hi = RATE_MBIT
        strength = float(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
    elif kind == "loss":
        strength = round(float(rng.uniform(*LOSS_PCT)), 2)
    else:
        strength = round(float(rng.uniform(*CPU_QUOTA)), 2)
    return LabDraw(index, ranks, kind, rank, strength, steps, fault_after)


def draws(n: int, seed: int, *, steps: int = 16, fault_after: int = 6) -> list[LabDraw]:
    return [draw(seed, i, steps=steps, fault_after=fault_after) for i in range(n)]


Execute = Callable[[LabDraw, Path], dict[str, Any]]
"""Runs one draw in a work directory; returns ``analyze_run``'s result (with its scores)."""


def lab_executor(*, timeout_s: float = 600.0, epoch_us: int | None = None, warmup: int = 2) -> Execute:
    """The real thing: namespaces, the DDP job, the fault, the capture, Pulse (``pulse lab
    run``'s code path). Checks for root first: a sweep that cannot run is one error, not N
    misses."""
    from pulse.lab.analysis import LAB_EPOCH_NS, analyze_run
    from pulse.lab.faults import parse_fault
    from pulse.lab.netns import require_root
    from pulse.lab.runner import run_lab

    require_root()

    def execute(d: LabDraw, workdir: Path) -> dict[str, Any]:
        r = run_lab(ranks=d.ranks, fault=parse_fault(d.fault, d.ranks), steps=d.steps, fault_after=d.fault_after,
                    workdir=workdir, log=lambda msg: None, timeout_s=timeout_s)
        r.save()
        ns = epoch_us * 1000 if epoch_us is not None else LAB_EPOCH_NS
        return analyze_run(r, workdir / "trace", epoch_ns=ns, warmup_steps=warmup)

    return execute


def run_sweep(ds: list[LabDraw], execute: Execute, *, keep: Path | None = None,
              progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Every draw through ``execute``, in order. A run that raises a
    :class:`~pulse.errors.PulseError` (a job that failed, a CPU quota that never throttled
    the rank on a host where it got less than its quota anyway) did not happen as drawn: it is
    listed under ``errors`` with its reason and scored nowhere, not counted as a miss. A sweep
    in which no run happened is that error."""
    rows: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    last: PulseError | None = None
    for d in ds:
        t0 = time.monotonic()
        workdir = keep / f"run-{d.index:03d}" if keep is not None else Path(tempfile.mkdtemp(prefix="pulse-lab-sweep-"))
        workdir.mkdir(parents=True, exist_ok=True)
        where = f"lab sweep [{d.index + 1}/{len(ds)}] {d.fault} on {d.ranks} ranks"
        try:
            res = execute(d, workdir)
        except PulseError as exc:
            last = exc
            errors.append({"index": d.index, "draw": d.to_dict(), "command": d.command(), "kind": d.kind,
                           "error": str(exc)})
            progress(f"{where}: not run as drawn, not scored: {exc}")
            continue
        finally:
            if keep is None:
                shutil.rmtree(workdir, ignore_errors=True)
        row = _row(d, res)
        rows.append(row)
        progress(f"{where}: {_verdict(row)} ({time.monotonic() - t0:.0f} s)")
    if not rows and last is not None:
        raise type(last)(f"lab sweep: no run happened; the last: {errors[-1]['command']}: {last}")
    return {"runs": rows, "table": table(rows), "summary": summaries(rows),
            "wrong": [r for r in rows if not r["right"]], "errors": errors}


def _row(d: LabDraw, res: dict[str, Any]) -> dict[str, Any]:
    s, b = res["score"], res["baseline_score"]
    return {"index": d.index, "draw": d.to_dict(), "command": d.command(), "kind": d.kind,
            "outcome": s["outcome"], "outcome_all": s["outcome_all"], "named": s["named"],
            "right": s["outcome_all"] in ("node", "group", "healthy-ok"),
            "baseline": {"outcome": b["outcome"], "outcome_all": b["outcome_all"], "named": b["named"]},
            "score": s, "baseline_score": b, "step_ms": res.get("step_ms"),
            "capture": res.get("capture"), "fault_effect": res.get("fault_effect"),
            "job_slowdown": job_slowdown(res.get("step_ms"))}


def job_slowdown(step_ms: dict[str, Any] | None) -> dict[str, Any] | None:
    """How much the fault slowed the job, as the harness measured its steps (not Pulse):
    the faulty steps' median over the healthy steps' median, and whether it exceeds the
    slowest healthy step (``slowed``). A fault that never slowed the job (a CPU quota above
    what a rank of an oversubscribed host got anyway) may leave nothing on the wire either;
    the table counts such misses apart, still as misses."""
    if not step_ms or step_ms.get("faulty_median") is None or not step_ms.get("healthy_median"):
        return None
    slowest = step_ms.get("healthy_slowest")
    return {"ratio": round(step_ms["faulty_median"] / step_ms["healthy_median"], 2),
            "slowed": None if slowest is None else bool(step_ms["faulty_median"] > slowest)}


def _verdict(row: dict[str, Any]) -> str:
    named = "; ".join(row["named"]) or "no incident"
    return f"{OUTCOME_TEXT[row['outcome_all']]} ({named})"


OUTCOME_TEXT = {"node": "right node", "group": "right group", "misdiagnosed": "wrong blame", "missed": "missed",
                "healthy-ok": "quiet", "false-alarm": "false alarm"}


def table(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per fault kind: runs and outcomes on every incident (node / group / wrong blame /
    missed); healthy runs: quiet / false alarm."""
    out: dict[str, dict[str, int]] = {}
    for kind in (*KINDS, "none"):
        rs = [r for r in rows if r["kind"] == kind]
        if kind == "none":
            out["healthy"] = {"runs": len(rs), "quiet": sum(r["outcome_all"] == "healthy-ok" for r in rs),
                              "false_alarm": sum(r["outcome_all"] == "false-alarm" for r in rs)}
        else:
            out[kind] = {"runs": len(rs), "node": sum(r["outcome_all"] == "node" for r in rs),
                         "group": sum(r["outcome_all"] == "group" for r in rs),
                         "wrong_blame": sum(r["outcome_all"] == "misdiagnosed" for r in rs),
                         "missed": sum(r["outcome_all"] == "missed" for r in rs),
                         "missed_job_not_slowed": sum(r["outcome_all"] == "missed" and _not_slowed(r) for r in rs)}
    return out


def _not_slowed(row: dict[str, Any]) -> bool:
    js = row.get("job_slowdown")
    return js is not None and js.get("slowed") is False


def summaries(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``pulse.localization.scoring.summarize`` over the runs, for Pulse and the baseline:
    first-incident and every-incident figures, as ``pulse eval`` reports them."""
    from pulse.localization import ScenarioScore, summarize

    out = {}
    for method, key in (("pulse", "score"), ("baseline", "baseline_score")):
        scores = [ScenarioScore(**r[key]) for r in rows]
        out[method] = summarize(scores, method).to_dict()
    return out


def table_lines(result: dict[str, Any]) -> list[str]:
    """The human report: the table, the totals, then every wrong or missed run with its
    replay command."""
    t = result["table"]
    head = ("fault", "runs", "node", "group", "wrong blame", "missed", "of which job not slowed")
    rows = [head] + [(k, str(v["runs"]), str(v["node"]), str(v["group"]), str(v["wrong_blame"]), str(v["missed"]),
                      str(v.get("missed_job_not_slowed", 0))) for k, v in t.items() if k != "healthy"]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    h = t["healthy"]
    lines.append(f"healthy  {h['runs']} runs: {h['quiet']} quiet, {h['false_alarm']} false alarm")
    s = result["summary"]["pulse"]
    faulty = s["runs"]
    right = s["node_all"] + s["group_all"]
    lines.append(f"pulse, every incident scored: {right}/{faulty} faulty runs right, {s['misdiagnosed_any']} wrong "
                 f"blame, {s['missed']} missed, {s['false_alarms']}/{s['healthy_runs']} false alarms; precision "
                 f"{s['precision_all']:.2f} (first incident only: {s['node'] + s['group']}/{faulty} right, "
                 f"precision {s['precision']:.2f})")
    b = result["summary"]["baseline"]
    lines.append(f"baseline, every incident scored: {b['node_all'] + b['group_all']}/{b['runs']} right, "
                 f"{b['misdiagnosed_any']} wrong blame, {b['missed']} missed, {b['false_alarms']}/{b['healthy_runs']} "
                 "false alarms")
    for r in result["wrong"]:
        js = r.get("job_slowdown")
        steps = "" if not js else (f"; job steps x{js['ratio']:.2f}"
                                   + (", within its healthy steps" if js["slowed"] is False else ""))
        lines.append(f"#{r['index']} {r['draw']['fault']} on {r['draw']['ranks']} ranks: {_verdict(r)}{steps}")
        lines.append(f"    {r['command']}")
    for e in result.get("errors", []):
        lines.append(f"#{e['index']} {e['draw']['fault']} on {e['draw']['ranks']} ranks: not run as drawn, "
                     f"not scored: {e['error']}")
        lines.append(f"    {e['command']}")
    return lines
