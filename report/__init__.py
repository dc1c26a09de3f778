"""``pulse report``: one picture of an anomaly (PNG, plus an HTML page holding it).

Two steps, kept apart so tests can check what a panel shows without reading pixels:

* data: :func:`build_report_data` (a trace directory, :mod:`.from_trace` and
  :mod:`.epochs`) or :func:`build_report_data_from_influx` (exactly what the pipeline's
  sink writes, :mod:`.from_influx`) -> :class:`ReportData` (:mod:`.model`), chosen by
  :mod:`.assemble` (the main anomaly, the operators and window to show);
* drawing (:mod:`.draw`): :func:`draw` -> the PNG, and :func:`write_html` -> a
  self-contained page embedding it.

The click command is in :mod:`.cli`.
"""

from .assemble import assemble, main_anomaly
from .cli import report, summary
from .draw import CULPRIT, PNG_SIZE, draw, write_html
from .from_influx import build_report_data_from_influx, influx_query
from .from_trace import build_report_data
from .model import Curve, RankBars, ReportData, Span

__all__ = ["CULPRIT", "PNG_SIZE", "Curve", "RankBars", "ReportData", "Span", "assemble", "build_report_data",
           "build_report_data_from_influx", "draw", "influx_query", "main_anomaly", "report", "summary",
           "write_html"]
