"""``pulse lab``: a real torch.distributed job in network namespaces, a fault, Pulse's verdict."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import click
from pulse.lab.analysis import LAB_EPOCH_NS

from pulse.cli_types import InDir, KeepDir, OutDir, count
from pulse.errors import ConfigError


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def _verdict_text(part: dict[str, Any]) -> str:
    if not part["anomalies"]:
        return part["status"] if part["status"] != "anomaly" else "no anomaly"
    return "; ".join(f"{a['kind']} {','.join(a['nodes'])} (x{a['count']})" for a in part["anomalies"])


def _ok(correct: bool | None) -> str:
    return "-" if correct is None else "yes" if correct else "no"


def print_table(results: list[dict[str, Any]]) -> None:
    """Verdict next to the truth, one row per run, on stderr."""
    rows = [("fault", "truth", "pulse", "ok", "baseline", "ok", "steps ms (healthy/faulty)")]
    for r in results:
        t = r["truth"]
        truth = "no alarm" if t["kind"] is None else f"{t['family']} {','.join(t['nodes'])}"
        st = r["step_ms"]
        rows.append((r["fault"], truth, _verdict_text(r["pulse"]), "yes" if r["pulse"]["correct"] else "NO",
                     _verdict_text(r["baseline"]), _ok(r["baseline"]["correct"]),
                     f"{st['healthy_median']}/{st['faulty_median'] if st['faulty_median'] is not None else '-'}"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        _echo("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def lab() -> None:
    """Real torch.distributed (DDP over Gloo) traffic in network namespaces, with one injected
    fault, localized by Pulse from the capture and the torch injection's hook events."""


@lab.command("run")
@click.option("--ranks", default=4, show_default=True, type=click.IntRange(2, 16), help="Ranks = nodes (namespaces).")
@click.option("--fault", default="none", show_default=True,
              help="none | rate:RANK:RATE (e.g. 200mbit) | loss:RANK:PCT | cpu:RANK:QUOTA (fraction of one CPU).")
@click.option("--steps", default=16, show_default=True, type=click.IntRange(4, 1000), help="Training steps.")
@click.option("--fault-after", default=6, show_default=True, type=click.IntRange(1, 1000),
              help="Healthy steps before the fault is injected.")
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(1, 100),
              help="Steps left out of the analysis (DDP set-up collectives no hook sees).")
@click.option("--epoch-us", default=LAB_EPOCH_NS // 1000, show_default=True, type=click.IntRange(1, 100_000),
              help="Epoch length for the capture's per-flow bytes.")
@click.option("--width", default=768, show_default=True, type=click.IntRange(16, 8192),
              help="Hidden width of the DDP job's MLP (sets the gradient bytes per step).")
@click.option("--keep", type=OutDir(force_param=None), default=None,
              help="Keep the capture, hook files, trace directory and run.json here.")
@click.option("--timeout", default=600, show_default=True, type=click.IntRange(10, 7200),
              help="Seconds the job may run.")
@click.option("--no-hooks", "no_hooks", is_flag=True,
              help="Run the job without the torch injection (no hook file at all) and diagnose its capture "
                   "in network-only mode, the warm-up cut found in the traffic (docs/lab.md).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout.")
def run_command(ranks: int, fault: str, steps: int, fault_after: int, warmup: int, epoch_us: int, width: int,
                keep: Path | None, timeout: int, no_hooks: bool, as_json: bool) -> None:
    """Create the namespaces, run the job, inject the fault, tear everything down, then run
    Pulse (segmentation + localization) and the operator-level baseline on what was seen.
    Needs root."""
    from pulse.lab.analysis import analyze_run
    from pulse.lab.faults import parse_fault
    from pulse.lab.netns import require_root
    from pulse.lab.runner import run_lab

    f = parse_fault(fault, ranks)
    if f.kind != "none" and fault_after >= steps:
        raise ConfigError(f"--fault-after {fault_after} must be below --steps {steps}")
    if warmup >= min(steps, fault_after if f.kind != "none" else steps):
        raise ConfigError(f"--warmup {warmup} leaves no healthy steps to analyse")
    require_root()
    keep = Path(keep) if keep is not None else None
    workdir = keep if keep is not None else Path(tempfile.mkdtemp(prefix="pulse-lab-"))
    if keep is not None and keep.exists() and any(keep.iterdir()):
        raise ConfigError(f"--keep {keep}: directory exists and is not empty")
    try:
        log = (lambda m: None) if as_json else _echo
        log(f"lab: {ranks} ranks, fault {f.text}, {steps} steps (fault after {fault_after})"
            + (", no hooks: network-only mode" if no_hooks else ""))
        r = run_lab(ranks=ranks, fault=f, steps=steps, fault_after=fault_after, workdir=workdir, log=log,
                    timeout_s=float(timeout), width=width, hooks=not no_hooks)
        r.save()
        log(f"lab: captured {r.capture_packets} packets ({r.capture_drops} dropped by the kernel); analysing")
        result = analyze_run(r, workdir / "trace", epoch_ns=epoch_us * 1000, warmup_steps=warmup)
        if keep is None:
            result["trace"] = None
    finally:
        if keep is None:
            shutil.rmtree(workdir, ignore_errors=True)
    _report(result, as_json)


@lab.command("sweep")
@click.option("--runs", "n_runs", type=count(1, 1000), required=True, help="Lab runs to draw and run.")
@click.option("--seed", type=count(0, 2**32 - 1), default=0, show_default=True,
              help="Sweep seed: the draws are a pure function of it.")
@click.option("--steps", type=count(4, 1000), default=16, show_default=True, help="Training steps per run.")
@click.option("--fault-after", type=count(1, 1000), default=6, show_default=True,
              help="Healthy steps before the fault is injected.")
@click.option("--timeout", type=count(10, 7200), default=600, show_default=True, help="Seconds each job may run.")
@click.option("--keep", type=KeepDir(), default=None,
              help="Keep every run's capture, trace and run.json here (run-000, run-001, ...).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (table, summaries, every run) on stdout.")
def sweep_command(n_runs: int, seed: int, steps: int, fault_after: int, timeout: int, keep: Path | None,
                  as_json: bool) -> None:
    """Run the lab N times, each on 4 to 8 ranks with a drawn fault on a drawn rank (rate
    100 Mbit/s-2 Gbit/s, loss 0.5-5 %, CPU quota 0.1-0.5 of a core, or healthy about one run
    in five), and print Pulse's accuracy per fault kind, every incident scored, with every
    wrong or missed run's `pulse lab run` command line. Needs root."""
    from pulse.lab import sweep as sw

    if fault_after >= steps:
        raise ConfigError(f"--fault-after {fault_after} must be below --steps {steps}")
    ds = sw.draws(n_runs, seed, steps=steps, fault_after=fault_after)
    execute = sw.lab_executor(timeout_s=float(timeout))  # needs root: refused here, before any run
    if keep is not None:
        Path(keep).mkdir(parents=True, exist_ok=True)
    result = sw.run_sweep(ds, execute, keep=Path(keep) if keep else None, progress=_echo)
    result = {"sweep": {"runs": n_runs, "seed": seed, "steps": steps, "fault_after": fault_after}, **result}
    for line in sw.table_lines(result):
        _echo(line)
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")


@lab.command("analyze")
@click.argument("workdir", type=InDir())
@click.option("--warmup", default=2, show_default=True, type=click.IntRange(1, 100))
@click.option("--epoch-us", default=LAB_EPOCH_NS // 1000, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--no-hooks", "no_hooks", is_flag=True,
              help="Network-only mode even if the run has hook files (automatic for a --no-hooks run).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout.")
def analyze_command(workdir: Path, warmup: int, epoch_us: int, no_hooks: bool, as_json: bool) -> None:
    """Analyse again a run kept with `pulse lab run --keep DIR` (no root needed)."""
    from pulse.lab.analysis import analyze_run
    from pulse.lab.runner import LabRun

    r = LabRun.load(workdir)
    out = workdir / f"trace-{epoch_us}us"
    if out.exists():
        shutil.rmtree(out)
    _report(analyze_run(r, out, epoch_ns=epoch_us * 1000, warmup_steps=warmup, no_hooks=True if no_hooks else None),
            as_json)


def _report(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
    else:
        if result.get("network_only"):
            cut = result["traffic_cut"]
            _echo(f"network-only mode: no descriptor; operators inferred from the traffic, the first "
                  f"{(cut['cut_ns'] - cut['first_data_ns']) / 1e6:.0f} ms of data left out (step period "
                  f"{cut['period_ms']} ms read off the traffic)")
        print_table([result])
        if result["pulse"].get("not_judged"):
            _echo(f"network-only mode: {result['pulse']['not_judged']}")
        if result.get("trace"):
            how = "" if result.get("network_only") else " --baseline"
            _echo(f"trace directory: {result['trace']}  (pulse diagnose {result['trace']}{how})")
