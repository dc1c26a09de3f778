"""Rendering a :class:`~pulse.report.model.ReportData`: the PNG (matplotlib, imported
only when drawing and with the Agg backend, so the command runs headless and
``pulse --help`` stays fast) and a self-contained HTML page embedding it.

Panels: per-node send rate of the verdict's communicator around its first anomalous
operators (the culprit's curve highlighted, segmented operators shaded); the culprit's
per-flow rates with its own segmented operators; ACT, duration and volume per rank as bars;
the verdict and its evidence.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from .model import ReportData

FIG_W_IN = 16.0
FIG_H_IN = 10.0
DPI = 100
PNG_SIZE = (int(FIG_W_IN * DPI), int(FIG_H_IN * DPI))
"""(width, height) in pixels of every report PNG."""

CULPRIT = "#d62728"
CULPRIT_OTHER = "#ff9f4a"
PEER = "#7f7f7f"


def title(data: ReportData) -> str:
    v = data.verdict
    if v is None:
        return f"job {data.job or '?'}: no anomaly ({data.verdicts} verdicts)"
    return (f"job {data.job or '?'}: {v.kind} at {v.level} level — {', '.join(v.nodes)}"
            f" (confidence {v.confidence:.2f})")


def draw(data: ReportData, out_png: str | Path) -> Path:
    """Render the report to ``out_png`` (exactly :data:`PNG_SIZE` pixels)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt
    from matplotlib.figure import Figure

    del plt  # the pyplot state machine is not used: Figure objects are freed with their scope
    fig = Figure(figsize=(FIG_W_IN, FIG_H_IN), dpi=DPI)
    fig.suptitle(title(data), fontsize=14, color=CULPRIT if data.verdict is not None else "black")
    grid = fig.add_gridspec(3, 3, height_ratios=[1.1, 1.0, 0.9], hspace=0.45, wspace=0.28,
                            left=0.05, right=0.98, top=0.92, bottom=0.07)
    ax_nodes = fig.add_subplot(grid[0, :2])
    ax_flows = fig.add_subplot(grid[1, :2], sharex=ax_nodes)
    ax_act = fig.add_subplot(grid[2, 0])
    ax_vol = fig.add_subplot(grid[2, 1])
    ax_text = fig.add_subplot(grid[:, 2])

    seq_colors = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"]
    # Shade each segmented operator over its extent across ranks (node clocks): the focus
    # operators in colour and labelled, the others in the window in grey.
    for seq in sorted({s.seq for s in data.spans}):
        mine = [s for s in data.spans if s.seq == seq]
        lo, hi = min(s.t0_ms for s in mine), max(s.t1_ms for s in mine)
        if seq in data.seqs:
            color = seq_colors[data.seqs.index(seq) % len(seq_colors)]
            ax_nodes.axvspan(lo, hi, color=color, alpha=0.15, lw=0)
            ax_nodes.text(lo, 1.0, f" seq {seq}", transform=ax_nodes.get_xaxis_transform(),
                          va="top", fontsize=8, color=color)
        else:
            ax_nodes.axvspan(lo, hi, color=PEER, alpha=0.08, lw=0)
    for c in sorted(data.node_curves, key=lambda c: (c.culprit, c.primary)):
        if c.primary:
            style: dict[str, Any] = {"color": CULPRIT, "lw": 2.0, "zorder": 3, "label": c.label}
        elif c.culprit:
            style = {"color": CULPRIT_OTHER, "lw": 1.0, "ls": "--", "zorder": 2, "label": c.label}
        else:
            style = {"color": PEER, "lw": 0.8, "alpha": 0.7}
        if data.rate_source == "epochs":
            ax_nodes.step(c.t_ms, c.gbps, where="post", **style)
        else:
            ax_nodes.plot(c.t_ms, c.gbps, marker="o", ms=3, **style)
    ax_nodes.plot([], [], color=PEER, lw=0.8, label="other ranks")
    what = "send rate per rank" if data.rate_source == "epochs" else "active rate per operator"
    ax_nodes.set_title(f"{what} — comm {data.comm_id or '?'}, operators {data.seqs}", fontsize=10)
    ax_nodes.set_ylabel("Gb/s")
    ax_nodes.legend(loc="upper right", fontsize=7)

    for s in data.spans:
        if s.culprit:
            alpha = (0.12 if s.focus else 0.05) * (1 if s.complete else 2.5)
            ax_flows.axvspan(s.t0_ms, s.t1_ms, color=CULPRIT, alpha=alpha, lw=0)
    cmap = matplotlib.colormaps["tab10"]
    for i, c in enumerate(data.flow_curves):
        ax_flows.step(c.t_ms, c.gbps, where="post", lw=1.0, color=cmap(i % 10), label=c.label)
    if data.flow_curves:
        ax_flows.legend(loc="upper right", fontsize=7, ncol=2)
        ax_flows.set_title("culprit's flows (its segmented operators shaded)", fontsize=10)
    else:
        ax_flows.text(0.5, 0.5, "no per-flow epochs in this source (operators only)",
                      ha="center", va="center", transform=ax_flows.transAxes, color=PEER)
        ax_flows.set_title("culprit's segmented operators", fontsize=10)
    ax_flows.set_xlabel("ms from window start (node clocks)")
    ax_flows.set_ylabel("Gb/s")

    b = data.bars
    x = np.arange(len(b.ranks))
    colors = [CULPRIT if c else PEER for c in b.culprit]
    ax_act.bar(x - 0.2, b.act_us, width=0.4, color=colors, label="ACT")
    ax_act.bar(x + 0.2, b.duration_us, width=0.4, color=colors, alpha=0.35, label="duration")
    ax_act.set_title("ACT (solid) vs operator duration (light) per rank, median", fontsize=10)
    ax_act.set_ylabel("µs")
    ax_vol.bar(x, b.volume_mb, color=colors)
    ax_vol.set_title("volume per rank", fontsize=10)
    ax_vol.set_ylabel("MB")
    for ax in (ax_act, ax_vol):
        ax.set_xticks(x, b.labels, fontsize=6 if len(b.labels) <= 8 else 5)

    ax_text.axis("off")
    ax_text.text(0.0, 1.0, _verdict_text(data), va="top", ha="left", family="monospace",
                 fontsize=8, transform=ax_text.transAxes, wrap=True)
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, format="png")
    return out


def _verdict_text(data: ReportData) -> str:
    v = data.verdict
    lines = [f"source: {_shorten(data.source, 44)}", f"verdicts: {data.verdicts}", ""]
    if v is None:
        lines.append("no anomaly verdict")
    else:
        lines += [
            f"status:     {v.status}",
            f"kind:       {v.kind}",
            f"level:      {v.level}",
            f"nodes:      {', '.join(v.nodes)}",
            f"ranks:      {', '.join(map(str, v.ranks[:16]))}",
            f"nics:       {', '.join(v.nics[:8])}",
            f"confidence: {v.confidence:.3f}",
            f"first seen: {v.first_seen_ns} ns",
            f"window:     {_shorten(orjson.dumps(v.window).decode(), 40)}",
            "", "evidence:",
        ]
        lines += [f"  {_shorten(k, 24)}: {_shorten(val, 30)}" for k, val in data.evidence[:40]]
    return "\n".join(lines)


def _shorten(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def write_html(data: ReportData, png: str | Path, out_html: str | Path) -> Path:
    """A self-contained page: the PNG embedded as base64, the verdict and evidence as tables."""
    raw = Path(png).read_bytes()
    b64 = base64.b64encode(raw).decode()
    e = html.escape
    v = data.verdict
    vrows = "" if v is None else "".join(
        f"<tr><th>{e(k)}</th><td>{e(str(val))}</td></tr>"
        for k, val in (("kind", v.kind), ("level", v.level), ("nodes", ", ".join(v.nodes)),
                       ("ranks", ", ".join(map(str, v.ranks))), ("nics", ", ".join(v.nics)),
                       ("confidence", f"{v.confidence:.3f}"), ("first seen (ns)", v.first_seen_ns),
                       ("window", orjson.dumps(v.window).decode())))
    erows = "".join(f"<tr><th>{e(k)}</th><td>{e(val)}</td></tr>" for k, val in data.evidence)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Pulse report — {e(data.job)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}}table{{border-collapse:collapse;margin:1em 0}}
th,td{{border:1px solid #ccc;padding:2px 8px;text-align:left;font-size:13px}}
th{{background:#f3f3f3}}img{{max-width:100%}}.culprit{{color:{CULPRIT}}}</style></head>
<body><h1 class="{'culprit' if v else ''}">{e(title(data))}</h1>
<p>source: <code>{e(data.source)}</code>; communicator <code>{e(str(data.comm_id))}</code>,
operators {e(str(data.seqs))}; rates from {e(data.rate_source)}.</p>
<img alt="Pulse anomaly report" width="{PNG_SIZE[0]}" height="{PNG_SIZE[1]}" src="data:image/png;base64,{b64}">
<h2>Verdict</h2><table>{vrows or '<tr><td>no anomaly verdict</td></tr>'}</table>
<h2>Evidence</h2><table>{erows or '<tr><td>none</td></tr>'}</table>
</body></html>
"""
    out = Path(out_html)
    out.write_text(page, encoding="utf-8")
    return out
