"""``pulse diagnose`` and ``pulse eval``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson
from pulse.localization import LocalizeParams

from pulse.cli_types import InDir, KeepDir, Number, count
from pulse.records import Incident, Verdict


def _console() -> Any:
    from rich.console import Console
    # wide when not a terminal, so logged tables keep their columns
    return Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def _fmt_ns(ns: int | float | None) -> str:
    if ns is None:
        return "-"
    return f"{ns / 1e6:.1f} ms"


def _evidence_table(console: Any, evidence: Any) -> None:
    from rich.table import Table

    ev = evidence if isinstance(evidence, dict) else {}
    rows = [r for r in ev.get("findings") or [] if isinstance(r, dict)]
    if not rows:
        extra = {k: v for k, v in ev.items() if k not in ("findings", "rule")}
        if extra:
            console.print(f"  evidence: {orjson.dumps(extra, default=str).decode()[:400]}")
        return
    t = Table(title="evidence (the culprit's records vs the reference they were compared with)", show_lines=False)
    for col in ("comm", "seq", "rank", "node", "metric", "value", "reference"):
        t.add_column(col)
    for r in rows:
        t.add_row(*(str(r.get(k)) for k in ("comm_id", "seq", "rank", "node", "metric", "value", "reference")))
    console.print(t)


def _print_insufficient(console: Any, title: str, verdicts: list[Verdict]) -> None:
    """One line per node whose input was incomplete (its first such verdict)."""
    seen: set[tuple[str, ...]] = set()
    for v in verdicts:
        if v.status == "insufficient-data" and tuple(v.nodes) not in seen:
            seen.add(tuple(v.nodes))
            why = v.evidence.get("reason") if isinstance(v.evidence, dict) else v.evidence
            console.print(f"[yellow]{title}: insufficient data[/] for {', '.join(v.nodes)}: {why}")


def _print_incidents(console: Any, incidents: list[Incident], n_verdicts: int, network_only: bool = False) -> None:
    """The incidents of a run, one block each (its final state and evidence)."""
    latest: dict[str, Incident] = {}
    for inc in incidents:
        latest[inc.id] = inc
    if not latest and network_only:
        # not a clean bill of health: only links' rates, surplus bytes and a silent job were judged
        console.print(f"[bold yellow]pulse: no slow link found from the traffic alone[/] ({n_verdicts} verdicts; "
                      "network-only: compute slowness and lateness were not judged)")
        return
    if not latest:
        console.print(f"[bold green]pulse: no incident[/] ({n_verdicts} verdicts, none anomalous)")
        return
    for inc in sorted(latest.values(), key=lambda i: i.first_seen_ns):
        changes = sum(1 for i in incidents if i.id == inc.id)
        console.print(f"[bold red]pulse: incident {inc.id}[/] ({inc.state}"
                      + (f", {inc.resolution}" if inc.resolution else "") + f", {changes} state changes)")
        console.print(f"  {inc.summary}")
        _evidence_table(console, inc.evidence)


def _print_verdicts(console: Any, title: str, verdicts: list[Verdict]) -> None:
    anomalies = [v for v in verdicts if v.status == "anomaly"]
    others = [v for v in verdicts if v.status in ("insufficient-data",)]
    if not anomalies:
        console.print(f"[bold green]{title}: no anomaly[/] ({len(verdicts)} verdicts)")
    seen: set[tuple[Any, ...]] = set()
    for v in anomalies:
        key = (v.kind, tuple(v.nodes))
        if key in seen:
            continue
        seen.add(key)
        console.print(f"[bold red]{title}: {v.kind}[/] at {v.level} level: [bold]{', '.join(v.nodes)}[/]"
                      f"  nics={','.join(v.nics) or '-'} ranks={v.ranks} confidence={v.confidence:.2f}"
                      f"  first seen {_fmt_ns(v.first_seen_ns)} (trace clock)")
        _evidence_table(console, v.evidence)
    _print_insufficient(console, title, others)


def _damage_line(d: dict[str, Any]) -> str:
    parts = []
    if d.get("incomplete"):
        parts.append("incomplete trace (its writer did not finish" + (f": {d['error']}" if d.get("error") else "")
                     + ")")
    if d.get("truncated_records"):
        parts.append(f"read up to the last whole record, cut {d['truncated_records']} partial record(s), "
                     f"{d.get('truncated_bytes', 0)} bytes")
    for node, gaps in (d.get("nodes") or {}).items():
        parts.append(f"{node}: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(gaps.items())))
    return "; ".join(parts)


@click.command("diagnose")
@click.argument("trace_dir", type=InDir())
@click.option("--json", "as_json", is_flag=True,
              help="JSON lines on stdout: every incident state change (with --verdicts: every verdict).")
@click.option("--verdicts", "show_verdicts", is_flag=True,
              help="Report the raw verdict stream instead of incidents.")
@click.option("--baseline", is_flag=True, help="Also run the operator-level baseline (oplevel.jsonl; its verdicts).")
@click.option("--no-hooks", "no_hooks", is_flag=True,
              help="Network-only mode: ignore every operator descriptor and infer from the traffic alone "
                   "(chosen by itself when the trace has no op event).")
@click.option("--cross-check", "cross", is_flag=True,
              help="Also compare the descriptors' flow bindings with the wire (peers, directions, undeclared "
                   "traffic): where a descriptor source lies or lags. With --json: one more line, "
                   '{"cross_check": {...}}.')
def diagnose(trace_dir: Path, as_json: bool, show_verdicts: bool, baseline: bool, no_hooks: bool,
             cross: bool) -> None:
    """Segment and localize the trace directory TRACE_DIR in one process (no broker), with the
    same engine as the streaming agents. Prints one block per incident (a fault: when it was
    seen, what it names, the evidence); --verdicts for every verdict instead."""
    from .configured import localize_params
    from .diagnose import diagnose as run

    res = run(trace_dir, localize_params(), baseline=baseline,  # PULSE_CLOCK_SKEW_US
              network_only=True if no_hooks else None)
    if res.network_only:
        click.echo(f"pulse: network-only mode ({res.network_only_reason}): operators inferred from the traffic "
                   "alone, judged by each link's sending rate and bytes against its rail siblings, and a silent job by "
                   "which NIC or node fell silent first; no issue times, expected bytes or posted receives, "
                   "so compute slowness and lateness are not judged", err=True)
    if res.damage:  # on stderr in both modes: --json consumers read records on stdout
        click.echo(f"warning: {trace_dir}: " + _damage_line(res.damage), err=True)
    check = None
    if cross:
        from .crosscheck import cross_check

        check = cross_check(trace_dir)
    if as_json:
        out = sys.stdout.buffer
        records: list[Any] = list(res.verdicts) if show_verdicts else list(res.incidents)
        for r in records + (res.baseline or []):
            out.write(r.to_json() + b"\n")
        if check is not None:
            out.write(orjson.dumps({"cross_check": check.to_dict()}) + b"\n")
        out.flush()
        return
    console = _console()
    console.print(f"{trace_dir}: job {res.job or '-'}, {len(res.metrics)} operator records, {res.n_events} hook events")
    if show_verdicts:
        _print_verdicts(console, "pulse", res.verdicts)
    else:
        _print_incidents(console, res.incidents, len(res.verdicts), res.network_only)
        _print_insufficient(console, "pulse", res.verdicts)
    if res.baseline is not None:
        _print_verdicts(console, "baseline", res.baseline)
    if check is not None:
        for line in check.lines():
            console.print(line, markup=False, highlight=False)


def _table(console: Any, scores: list[Any], sums: dict[str, Any]) -> None:
    from rich.table import Table

    from .evaluate import METHODS, per_scenario

    t = Table(title="Pulse vs operator-level baseline (runs: node-level / group-level / misdiagnosed / missed, "
                    "judged by the first incident; 'any': runs with any incident naming a healthy node)")
    t.add_column("scenario")
    t.add_column("runs", justify="right")
    cols = ("node", "group", "misdiagnosed", "missed", "misdiagnosed_any")
    for m in METHODS:
        for col in ("node", "group", "misdiag", "missed", "any"):
            t.add_column(f"{m} {col}", justify="right")
    for name, row in per_scenario(scores).items():
        runs = row["pulse"].get("runs", 0)
        if "healthy" in name:
            cells = []
            for m in METHODS:
                fa = row[m].get("false-alarm", 0)
                cells += [f"ok {row[m].get('healthy-ok', 0)}", f"FA {fa}", "", "", ""]
            t.add_row(name, str(runs), *cells)
            continue
        cells = []
        for m in METHODS:
            cells += [str(row[m].get(k, 0)) for k in cols]
        t.add_row(name, str(runs), *cells)
    console.print(t)
    s = Table(title="Summary (first incident | every incident)")
    s.add_column("method")
    for col in ("precision", "recall", "node-level", "group-level", "misdiagnosed", "missed", "false alarms",
                "mean onset->verdict", "precision all", "recall all", "misdiagnosed any"):
        s.add_column(col, justify="right")
    for m in METHODS:
        x = sums[m]
        s.add_row(m, f"{100 * x.precision:.1f} %", f"{100 * x.recall:.1f} %", f"{x.node}/{x.runs}",
                  f"{x.group}/{x.runs}", str(x.misdiagnosed), str(x.missed), f"{x.false_alarms}/{x.healthy_runs}",
                  "-" if x.mean_detect_ms is None else f"{x.mean_detect_ms:.1f} ms",
                  f"{100 * x.precision_all:.1f} %", f"{100 * x.recall_all:.1f} %", str(x.misdiagnosed_any))
    console.print(s)


@click.command("eval")
@click.option("--scenarios", "scenarios", default=None,
              help="Comma-separated scenario names (default: the whole battery).")
@click.option("--seeds", default=3, show_default=True, type=count(1, 1000), help="Seeds per anomaly scenario.")
@click.option("--healthy-seeds", default=10, show_default=True, type=count(0, 10_000),
              help="Seeds of the healthy scenario (at least --seeds).")
@click.option("--workload", type=click.Choice(["dense", "moe"]), default=None,
              help="Workload for every scenario (default: each scenario's own).")
@click.option("--jobs", default=2, show_default=True, type=count(1, 256), help="Worker processes.")
@click.option("--keep", type=KeepDir(), default=None,
              help="Keep (and reuse) the simulated traces in this directory instead of a temp dir.")
@click.option("--sim-arg", "sim_args", multiple=True, help="Extra argument passed to `pulse sim` (repeatable).")
@click.option("--sweep", "sweep_n", type=count(1, 100_000), default=None,
              help="Instead of the battery: N runs, each of a random scenario (healthy ~1 in 5), cluster shape, "
                   "workload, algorithm, bucket size, epoch, severity, onset and clock skew.")
@click.option("--sweep-seed", type=count(0, 2**31 - 1), default=0, show_default=True, help="Seed of the --sweep draws.")
@click.option("--max-nodes", type=count(4, 256), default=32, show_default=True, help="--sweep: largest node count drawn (>= 4).")
@click.option("--max-gpus-per-node", type=count(1, 16), default=8, show_default=True,
              help="--sweep: GPUs per node are drawn from 4 and 8 up to this (below 4: this value).")
@click.option("--sweep-steps", type=count(1, 10_000), default=20, show_default=True, help="--sweep: training steps per run.")
@click.option("--max-clock-skew-us", type=Number(float, 0.0, 10_000.0), default=5000.0, show_default=True,
              help="--sweep: each run's clock offsets are drawn in +- a value drawn up to this (µs).")
@click.option("--no-hooks", "no_hooks", is_flag=True,
              help="Score Pulse in network-only mode: every descriptor ignored, operators inferred from the traffic.")
@click.option("--twins", is_flag=True,
              help="Simulate each run Pulse missed again without its fault and report how much the fault "
                   "slowed the job (a missed fault that never slowed it is counted apart).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with per-run scores and summaries.")
def eval_command(scenarios: str | None, seeds: int, healthy_seeds: int, workload: str | None, jobs: int,
                 keep: Path | None, sim_args: tuple[str, ...], sweep_n: int | None, sweep_seed: int,
                 max_nodes: int, max_gpus_per_node: int, sweep_steps: int, max_clock_skew_us: float,
                 no_hooks: bool, twins: bool, as_json: bool) -> None:
    """Simulate the scenario battery (or a random --sweep), run Pulse and the baseline on every
    trace, score both."""
    from .evaluate import evaluate, per_scenario, plan, summaries, sweep_plan

    names = [s.strip() for s in scenarios.split(",") if s.strip()] if scenarios else None
    drawn: list[Any] = []
    if sweep_n is not None:
        from .sweep import SweepLimits, draws

        if names or workload:
            raise click.UsageError("--sweep draws the scenario and workload: drop --scenarios / --workload")
        limits = SweepLimits(max_nodes=max_nodes, max_gpus_per_node=max_gpus_per_node, steps=sweep_steps,
                             max_skew_us=max_clock_skew_us)
        drawn = draws(sweep_n, sweep_seed, limits)
        runs = sweep_plan(drawn, tuple(sim_args), sweep_seed)
        # the localizer is told the clock sync the runs were drawn under, as an operator
        # configures their cluster's (two clocks up to twice the offset bound apart)
        bound = max(LocalizeParams().clock_skew_ns, int(2 * max_clock_skew_us * 1000))
    else:
        runs = plan(names, seeds, workload, healthy_seeds, tuple(sim_args))
    by_name: dict[str, Any] = {}
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
    console = _console()
    show = not as_json and sys.stderr.isatty()
    from .configured import localize_params

    # a sweep states the skew its runs were drawn with; the battery runs under the configured one
    params = LocalizeParams(clock_skew_ns=bound) if drawn else localize_params()
    if show:
        from rich.progress import Progress

        with Progress(console=console) as prog:
            task = prog.add_task("simulate + diagnose", total=len(runs))

            def tick(run: Any, s: Any) -> None:
                by_name[run.name] = s
                prog.advance(task)
            scores = evaluate(runs, params, jobs=jobs, keep=keep, progress=tick, network_only=no_hooks, twins=twins)
    else:
        def note(run: Any, s: Any) -> None:
            by_name[run.name] = s
            if not as_json:
                console.print(f"{run.scenario} seed {run.seed} sev {run.severity}: "
                              + ", ".join(f"{x.method}={x.outcome}" for x in s))
        scores = evaluate(runs, params, jobs=jobs, keep=keep, progress=note, network_only=no_hooks, twins=twins)
    order = {n: i for i, n in enumerate(dict.fromkeys(r.scenario for r in runs))}
    scores.sort(key=lambda s: (order.get(s.scenario.split(" ")[0], 99), s.scenario, s.seed or 0, s.method))
    sums = summaries(scores)
    if drawn:
        _sweep_report(console, drawn, runs, by_name, scores, sums, tuple(sim_args), sweep_seed, as_json, params, twins)
        return
    if as_json:
        obj = {"runs": [s.to_dict() for s in scores], "per_scenario": per_scenario(scores),
               "summary": {m: x.to_dict() for m, x in sums.items()}, "network_only": no_hooks,
               **({"missed_job_not_slowed": _not_slowed(scores)} if twins else {})}
        sys.stdout.buffer.write(orjson.dumps(obj) + b"\n")
        return
    _table(console, scores, sums)
    if twins:
        _twins_line(console, scores)


WRONG = ("missed", "misdiagnosed", "false-alarm")


def _not_slowed(scores: list[Any]) -> int:
    from .evaluate import not_slowed
    return sum(s.method == "pulse" and not_slowed(s) for s in scores)


def _twins_line(console: Any, scores: list[Any]) -> None:
    from .evaluate import NOT_SLOWED
    missed = sum(s.method == "pulse" and s.outcome_all == "missed" for s in scores)
    console.print(f"pulse missed {missed} faulty runs; the fault slowed the job by less than "
                  f"{100 * NOT_SLOWED:g} % (its healthy twin) in {_not_slowed(scores)} of them")


def _sweep_report(console: Any, drawn: list[Any], runs: list[Any], by_name: dict[str, Any], scores: list[Any],
                  sums: dict[str, Any], extra: tuple[str, ...], sweep_seed: int, as_json: bool,
                  params: LocalizeParams, twins: bool = False) -> None:
    """The battery's table and summary, then every Pulse miss, misdiagnosis (first incident
    or any incident) and false alarm with its drawn parameters and a replayable command."""
    from .evaluate import per_scenario

    rows = []
    for d, run in zip(drawn, runs, strict=True):
        for s in by_name.get(run.name, []):
            rows.append({**s.to_dict(), "index": d.index, "draw": d.to_dict(), "replay": d.command(extra)})
    wrong = [r for r in rows if r["method"] == "pulse" and (r["outcome"] in WRONG or r["outcome_all"] in WRONG)]
    if as_json:
        obj = {"sweep": {"runs": len(drawn), "seed": sweep_seed, "clock_skew_bound_ns": params.clock_skew_ns},
               "runs": rows, "wrong": wrong,
               **({"missed_job_not_slowed": _not_slowed(scores)} if twins else {}),
               "per_scenario": per_scenario(scores), "summary": {m: x.to_dict() for m, x in sums.items()}}
        sys.stdout.buffer.write(orjson.dumps(obj) + b"\n")
        return
    _table(console, scores, sums)
    if twins:
        _twins_line(console, scores)
    if not wrong:
        console.print(f"[bold green]sweep {sweep_seed}: every one of {len(drawn)} runs right on every incident[/]")
        return
    console.print(f"[bold]sweep {sweep_seed}: {len(wrong)} of {len(drawn)} runs wrong or missed (pulse; clock-skew "
                  f"bound {params.clock_skew_ns / 1e6:g} ms)[/]")
    for r in wrong:
        d = r["draw"]
        slowed = "" if r.get("job_slowdown") is None else f" (job x{r['job_slowdown']:.4f} of its healthy twin)"
        console.print(f"#{r['index']} {d['scenario']} -> {r['outcome']} (every incident: {r['outcome_all']}): "
                      + ("; ".join(r["named"]) or "no incident") + slowed)
        console.print(f"  {r['replay']}", soft_wrap=True)
