"""Report data from a trace directory: segment and localize it with the same code
``pulse diagnose`` runs, then read the epochs around the main anomaly."""

from __future__ import annotations

import functools
from pathlib import Path

from pulse.records import OpMetrics, Verdict
from pulse.trace import TraceReader

from .assemble import assemble
from .epochs import epoch_curves
from .model import ReportData


def _diagnose(path: Path) -> tuple[list[OpMetrics], list[Verdict]]:
    """Segment and localize a trace directory with the same code ``pulse diagnose`` runs."""
    from pulse.engine import diagnose

    result = diagnose(path)
    return list(result.metrics), list(result.verdicts)


def build_report_data(trace_dir: str | Path) -> ReportData:
    """Segment and localize a trace directory, then gather what each panel shows.

    Never reads ``truth.json``: the report shows what Pulse concluded.
    """
    path = Path(trace_dir)
    reader = TraceReader(path)
    metrics, verdicts = _diagnose(path)
    events = list(reader.events())
    job = str(reader.meta.get("job") or (metrics[0].job if metrics else "")) or path.name
    return assemble(job, str(path), metrics, verdicts, epoch_rates=functools.partial(epoch_curves, reader),
                    events=events)
