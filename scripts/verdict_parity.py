#!/usr/bin/env python3
"""Verdict parity: run ``localize()`` on the operator metrics of kept battery traces and
write every verdict (``to_dict()`` minus ``emitted_at``) as JSON lines, so two versions of
the localizer can be compared byte for byte.

Segmentation is the expensive part and is not what is being compared, so each trace is
segmented once (``pulse.segmentation.segment_trace``) and its metrics and per-node data
ends (the largest batch ``end_ns`` per node, as ``localization/diagnose.py`` computes them)
are cached as a pickle in ``--cache`` (shared between runs and checkouts: an existing file
is used as is). Run it with each checkout's interpreter, then ``diff`` the two outputs::

    /work/base/.venv/bin/python scripts/verdict_parity.py run /tmp/ev0 -o /tmp/parity-base.jsonl
    .venv/bin/python scripts/verdict_parity.py run /tmp/ev0 -o /tmp/parity-new.jsonl
    .venv/bin/python scripts/verdict_parity.py diff /tmp/parity-base.jsonl /tmp/parity-new.jsonl

A trace directory counts as complete when its ``meta.json`` exists (the trace writer writes
it on close) and it is not the newest directory while an evaluation may still be writing
(``--done-marker``: a file that is non-empty once the writer finished).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any


def complete_traces(root: Path, done_marker: Path | None) -> list[Path]:
    dirs = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    finished = done_marker is None or (done_marker.exists() and done_marker.stat().st_size > 0)
    if not finished and dirs:
        dirs = dirs[:-1]  # the newest may still be simulating (or be diagnosed next)
    return sorted((d for d in dirs if (d / "meta.json").exists()), key=lambda d: d.name)


def segmented(trace: Path, cache: Path) -> dict[str, Any]:
    """{"metrics": [OpMetrics], "data_end": {node: ns}} of a trace, from the cache if there."""
    path = cache / f"{trace.name}.pkl"
    if path.exists():
        with path.open("rb") as f:
            return pickle.load(f)
    from pulse.segmentation import SegmentParams, segment_trace

    from pulse.trace import TraceReader

    reader = TraceReader(trace)
    events = list(reader.events())
    data_end: dict[str, int] = {}

    def batches() -> Any:
        for b in reader.batches():
            if b.end_ns() > data_end.get(b.node, -(1 << 62)):
                data_end[b.node] = b.end_ns()
            yield b

    metrics = segment_trace(batches(), events, SegmentParams())
    out = {"metrics": metrics, "data_end": data_end}
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with tmp.open("wb") as f:
        pickle.dump(out, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)  # atomic: a concurrent reader never sees half a file
    return out


def verdict_lines(trace: Path, cache: Path) -> list[str]:
    from pulse.localization import LocalizeParams, localize

    from pulse.trace import TraceReader

    seg = segmented(trace, cache)
    events = list(TraceReader(trace).events())
    vs = localize(seg["metrics"], events, LocalizeParams(), data_end=seg["data_end"])
    lines = []
    for i, v in enumerate(vs):
        d = v.to_dict()
        d.pop("emitted_at", None)
        lines.append(json.dumps({"trace": trace.name, "i": i, "verdict": d}, sort_keys=True))
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    traces = complete_traces(Path(args.root), Path(args.done_marker) if args.done_marker else None)
    if args.only:
        traces = [t for t in traces if t.name in args.only]
    cache = Path(args.cache)
    if args.cached_only:
        traces = [t for t in traces if (cache / f"{t.name}.pkl").exists()]
    with open(args.output, "w") as out:
        for t in traces:
            lines = verdict_lines(t, cache)
            out.write("".join(line + "\n" for line in lines))
            print(f"{t.name}: {len(lines)} verdicts", file=sys.stderr)
    print(f"{len(traces)} traces", file=sys.stderr)
    return 0


def _by_trace(path: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in Path(path).read_text().splitlines():
        out.setdefault(json.loads(line)["trace"], []).append(line)
    return out


def cmd_diff(args: argparse.Namespace) -> int:
    a, b = _by_trace(args.a), _by_trace(args.b)
    common = sorted(set(a) & set(b))
    differ = [t for t in common if a[t] != b[t]]
    for t in differ:
        print(f"DIFFERENT {t}: {len(a[t])} vs {len(b[t])} verdicts", file=sys.stderr)
    only = sorted(set(a) ^ set(b))
    if only:
        print(f"in one file only (traces without verdicts are absent): {only}", file=sys.stderr)
    print(json.dumps({"compared": len(common), "identical": len(common) - len(differ), "different": differ,
                      "verdicts": sum(len(a[t]) for t in common)}))
    return 1 if differ or only else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="localize every complete trace under ROOT, write verdict JSON lines")
    r.add_argument("root", help="directory of kept traces (pulse eval --keep)")
    r.add_argument("-o", "--output", required=True, help="JSON lines file to write")
    r.add_argument("--cache", default="/tmp/segcache", help="segmentation cache directory (default %(default)s)")
    r.add_argument("--done-marker", default=None,
                   help="file that is non-empty once the trace writer finished (else the newest trace is skipped)")
    r.add_argument("--only", nargs="*", help="only these traces (directory names)")
    r.add_argument("--cached-only", action="store_true", help="skip traces not segmented yet (no cache file)")
    d = sub.add_parser("diff", help="compare two outputs of 'run' trace by trace")
    d.add_argument("a")
    d.add_argument("b")
    args = ap.parse_args(argv)
    return cmd_run(args) if args.cmd == "run" else cmd_diff(args)


if __name__ == "__main__":
    sys.exit(main())
