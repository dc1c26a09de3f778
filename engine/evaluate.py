"""The evaluation harness behind ``pulse eval``: simulate the scenario battery, run Pulse
and the operator-level baseline on each trace, score both against the ground truth."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import orjson
from pulse.localization import LocalizeParams, ScenarioScore, Summary, score, summarize

from pulse.errors import ConfigError, TraceError
from pulse.trace import read_truth

from .diagnose import diagnose

METHODS = ("pulse", "baseline")


@dataclasses.dataclass(frozen=True)
class Run:
    scenario: str
    seed: int
    severity: float | None
    workload: str
    sim_args: tuple[str, ...] = ()
    name: str | None = None
    """Trace directory name under ``--keep`` (default: scenario-workload-sSEED)."""


def _battery() -> dict[str, Any]:
    from pulse.sim.scenarios import SCENARIOS
    return SCENARIOS


def _mild_is_high(meaning: str) -> bool:
    # "remaining fraction of ..." gets milder as it grows; multipliers, loss rates,
    # durations and shares get milder as they shrink.
    return "remaining" in meaning


def severities(lo: float, hi: float, n: int, mild_high: bool) -> list[float]:
    """n severities spread over [lo, hi], always including the mild end."""
    if n <= 1:
        return [hi if mild_high else lo]
    step = (hi - lo) / (n - 1)
    vals = [round(lo + i * step, 6) for i in range(n)]
    return vals[::-1] if mild_high else vals


def plan(scenarios: Iterable[str] | None, seeds: int, workload: str | None, healthy_seeds: int = 10,
         sim_args: tuple[str, ...] = ()) -> list[Run]:
    battery = _battery()
    names = list(scenarios) if scenarios else list(battery)
    for n in names:
        if n not in battery:
            raise ConfigError(f"unknown scenario {n!r}; valid: {', '.join(battery)}")
    if seeds < 1:
        raise ConfigError("--seeds must be >= 1")
    runs: list[Run] = []
    for name in names:
        sc = battery[name]
        wls = [workload] if workload else [sc.workload]
        wls = [w for w in wls if w in sc.workloads]
        for wl in wls:
            if name == "healthy":
                runs += [Run(name, s, None, wl, sim_args) for s in range(1, max(seeds, healthy_seeds) + 1)]
                continue
            if sc.severity_range is None:
                sevs: list[float | None] = [None] * seeds
            else:
                lo, hi = sc.severity_range
                sevs = list(severities(lo, hi, seeds, _mild_is_high(sc.severity_meaning)))
            runs += [Run(name, s + 1, sev, wl, sim_args) for s, sev in enumerate(sevs)]
    return runs


def sim_command(run: Run) -> list[str]:
    """The ``pulse sim`` arguments of a run (without ``--out``)."""
    args = ["sim", "--scenario", run.scenario, "--seed", str(run.seed), "--workload", run.workload, *run.sim_args]
    if run.severity is not None:
        args += ["--severity", repr(run.severity)]
    return args


def simulate(run: Run, out: Path) -> None:
    from pulse.cli import main
    # the command prints its own one-line error and returns its exit code (not standalone)
    rc = main([*sim_command(run), "--out", str(out)], standalone_mode=False)
    if rc:
        raise TraceError(f"pulse {shlex.join(sim_command(run))} failed (exit {rc}): see the error above")


def _made_by(trace: Path, run: Run) -> bool:
    """Whether a kept trace was simulated for this very run: a sweep of another size or
    seed draws other shapes under the same names (reusing them scored the wrong cluster)."""
    try:
        return orjson.loads(_sidecar(trace).read_bytes()) == sim_command(run)
    except (OSError, orjson.JSONDecodeError):
        return False


def _sidecar(trace: Path) -> Path:
    return trace.with_name(trace.name + ".run.json")


def _complete(trace: Path) -> bool:
    """A kept trace is reused only when its writer finished it."""
    try:
        return orjson.loads((trace / "meta.json").read_bytes()).get("complete", True) is True
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return False


NOT_SLOWED = 0.01
"""``--twins``: a missed fault whose job ran less than this much longer than its healthy twin
after the onset is reported as one that did not slow the job. A reporting bucket, not a
detection threshold: the twin draws its own jitter, so the two differ by a little even
when the fault changed nothing (x1.0000-x1.0025 on the sweeps' invisible faults, e.g. a
path the job's traffic hardly used); the figure itself is in every run's JSON."""


def twin_run(run: Run) -> Run:
    """The same draw without its fault: healthy, no severity (the onset is kept, unused)."""
    return dataclasses.replace(run, scenario="healthy", severity=None,
                               name=f"{run.name or f'{run.scenario}-{run.workload}-s{run.seed}'}-twin")


def job_slowdown(truth: dict[str, Any], twin: dict[str, Any]) -> float | None:
    """The job's time from the onset to its end over its healthy twin's (None: hung, or no
    onset to measure from)."""
    onset = truth.get("onset_ns")
    sim, tsim = truth.get("sim") or {}, twin.get("sim") or {}
    if onset is None or sim.get("hung") or "end_true_ns" not in sim or "end_true_ns" not in tsim:
        return None
    base = tsim["end_true_ns"] - onset
    return (sim["end_true_ns"] - onset) / base if base > 0 else None


def _traced(run: Run, trace: Path, keep: Path | None) -> Path:
    """``trace``, simulated for ``run`` unless ``--keep`` already holds it, made by that run."""
    if not (keep and _complete(trace) and _made_by(trace, run)):
        if trace.exists():
            shutil.rmtree(trace)
        simulate(run, trace)
        if keep:
            _sidecar(trace).write_bytes(orjson.dumps(sim_command(run)))
    return trace


def _twin_slowdown(run: Run, truth: dict[str, Any], tmp: Path, keep: Path | None) -> float | None:
    twin = twin_run(run)
    trace = _traced(twin, keep / twin.name if keep and twin.name else tmp / "twin", keep)
    return job_slowdown(truth, read_truth(trace))


def run_one(run: Run, params: LocalizeParams, keep: Path | None = None,
            network_only: bool = False, twins: bool = False) -> list[ScenarioScore]:
    tmp = Path(tempfile.mkdtemp(prefix="pulse-eval-"))
    try:
        name = run.name or f"{run.scenario}-{run.workload}-s{run.seed}"
        trace = _traced(run, (keep / name) if keep else tmp / "trace", keep)
        res = diagnose(trace, params, baseline=True, network_only=network_only)
        truth = read_truth(trace)
        out = []
        for method, vs in (("pulse", res.verdicts), ("baseline", res.baseline or [])):
            s = score(vs, truth, method=method)
            s.severity = run.severity
            s.scenario = run.scenario if run.workload == _battery()[run.scenario].workload else \
                f"{run.scenario} ({run.workload})"
            out.append(s)
        if twins and run.scenario != "healthy" and any(s.method == "pulse" and s.outcome_all == "missed" for s in out):
            slowdown = _twin_slowdown(run, truth, tmp, keep)
            for s in out:
                s.job_slowdown = slowdown
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def evaluate(runs: list[Run], params: LocalizeParams, *, jobs: int = 2, keep: Path | None = None,
             progress: Callable[[Run, list[ScenarioScore]], None] | None = None,
             network_only: bool = False, twins: bool = False) -> list[ScenarioScore]:
    """Score Pulse and the baseline on every run; ``network_only``: Pulse infers from the
    traffic alone, every descriptor ignored (the baseline is unchanged); ``twins``: each run
    Pulse missed is simulated again without its fault, to measure how much the fault slowed
    the job (:func:`job_slowdown`)."""
    scores: list[ScenarioScore] = []
    if jobs <= 1:
        for r in runs:
            s = run_one(r, params, keep, network_only, twins)
            scores += s
            if progress:
                progress(r, s)
        return scores
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(run_one, r, params, keep, network_only, twins): r for r in runs}
        for fut in as_completed(futs):
            s = fut.result()
            scores += s
            if progress:
                progress(futs[fut], s)
    return scores


def sweep_plan(draws: list[Any], sim_args: tuple[str, ...] = (), sweep_seed: int = 0) -> list[Run]:
    """One run per draw (:mod:`.sweep`), the drawn shape as ``pulse sim`` options."""
    return [Run(d.scenario, d.seed, d.severity, d.workload, (*d.sim_args(), *sim_args),
                name=f"sweep{sweep_seed}-{d.index:03d}-{d.scenario}") for d in draws]


def not_slowed(s: ScenarioScore) -> bool:
    """A missed run whose fault did not slow its job (measured by ``--twins`` only)."""
    return s.outcome_all == "missed" and s.job_slowdown is not None and s.job_slowdown < 1.0 + NOT_SLOWED


def per_scenario(scores: list[ScenarioScore]) -> dict[str, dict[str, dict[str, int]]]:
    table: dict[str, dict[str, dict[str, int]]] = {}
    for s in scores:
        row = table.setdefault(s.scenario, {m: {"runs": 0, "node": 0, "group": 0, "misdiagnosed": 0, "missed": 0,
                                                 "false-alarm": 0, "healthy-ok": 0, "misdiagnosed_any": 0}
                                             for m in METHODS})
        cell = row.setdefault(s.method, {})
        cell["runs"] = cell.get("runs", 0) + 1
        cell[s.outcome] = cell.get(s.outcome, 0) + 1
        # every incident scored: runs that named a healthy node at any point
        cell["misdiagnosed_any"] = cell.get("misdiagnosed_any", 0) + (s.outcome_all == "misdiagnosed")
        if not_slowed(s):
            cell["missed_job_not_slowed"] = cell.get("missed_job_not_slowed", 0) + 1
    return table


def summaries(scores: list[ScenarioScore]) -> dict[str, Summary]:
    return {m: summarize(scores, m) for m in METHODS}
