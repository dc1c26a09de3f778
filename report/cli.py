"""``pulse report``: the click command (registered lazily by :mod:`pulse.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import orjson

from pulse.cli_types import InDir, OutFile, force_option
from pulse.errors import TraceError

from .draw import draw, title, write_html
from .from_influx import build_report_data_from_influx
from .from_trace import build_report_data
from .model import ReportData


def summary(data: ReportData, png: Path, page: Path) -> dict[str, Any]:
    v = data.verdict
    return {
        "png": str(png), "html": str(page), "job": data.job, "source": data.source,
        "culprit_nodes": data.culprit_nodes, "comm_id": data.comm_id, "seqs": data.seqs,
        "rate_source": data.rate_source, "verdicts": data.verdicts,
        "verdict": None if v is None else v.to_dict(),
    }


def _check_pair(png: Path, force: bool) -> None:
    """The PNG and the HTML written beside it must be two files, neither replaced unasked."""
    if png.suffix.lower() == ".html":
        raise click.BadParameter(f"{png}: the PNG path ends in .html, where the page goes; give a .png",
                                 param_hint="'--out'")
    for p in (png, png.with_suffix(".html")):
        if p.exists() and not force:
            raise click.BadParameter(f"{p}: file exists (give --force to replace it)", param_hint="'--out'")
        if p.exists() and not p.is_file():
            raise click.BadParameter(f"{p}: exists and is not a regular file", param_hint="'--out'")


def _check_url(url: str) -> None:
    from urllib.parse import urlparse

    try:
        u = urlparse(url)
        port = u.port
    except ValueError as exc:
        raise click.BadParameter(f"{url!r}: not a URL ({exc})", param_hint="'--from-influx'") from None
    if u.scheme not in ("http", "https") or not u.hostname:
        raise click.BadParameter(f"{url!r}: not an http(s)://HOST[:PORT] URL", param_hint="'--from-influx'")
    del port


@click.command("report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("trace_dir", required=False, type=InDir())
@click.option("--from-influx", "influx_url", metavar="URL",
              help="Read pulse_op / pulse_verdict from InfluxDB at URL instead of a trace directory.")
@click.option("--job", help="Job to plot (with --from-influx; needed when several jobs are there).")
@click.option("--db", help="InfluxQL database (default: PULSE_INFLUX_BUCKET, 'pulse').")
@force_option("Replace an existing PNG and HTML.")
@click.option("--out", "out_png", type=OutFile(),
              help="PNG to write (default: TRACE_DIR/report.png, or ./pulse-report-JOB.png); "
                   "the HTML page goes beside it with the .html suffix.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
def report(trace_dir: Path | None, influx_url: str | None, job: str | None, db: str | None,
           force: bool, out_png: Path | None, as_json: bool) -> None:
    """Plot an anomaly: rates around the first anomalous operators, ACT and volume per rank,
    the verdict and its evidence (PNG + self-contained HTML)."""
    from pulse.progress import progress

    if (trace_dir is None) == (influx_url is None):
        raise click.UsageError("give a trace directory or --from-influx URL (one of them)")
    if trace_dir is not None and job is not None:
        raise click.UsageError("--job goes with --from-influx (a trace directory holds one job)")
    if out_png is not None:
        _check_pair(out_png, force)
    if influx_url is not None:
        _check_url(influx_url)
    with progress("building the report", total=3, json_mode=as_json) as bar:
        if trace_dir is not None:
            if not trace_dir.is_dir():
                raise TraceError(f"{trace_dir}: not a directory (expected a Pulse trace directory)")
            data = build_report_data(trace_dir)
            default_png = trace_dir / "report.png"
        else:
            assert influx_url is not None
            data = build_report_data_from_influx(influx_url, job=job, db=db)
            default_png = Path(f"pulse-report-{data.job or 'job'}.png")
        bar.advance()
        if out_png is None:
            _check_pair(default_png, force)
        png = draw(data, out_png or default_png)
        bar.advance()
        page = write_html(data, png, png.with_suffix(".html"))
        bar.advance()
    if as_json:
        click.echo(orjson.dumps(summary(data, png, page)).decode())
    else:
        click.echo(title(data), err=True)
        click.echo(f"wrote {png} and {page}", err=True)
