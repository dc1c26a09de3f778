"""`pulse report` on a simulated nic-slow trace: the culprit panel is right, on the data
behind the figure, and the PNG / HTML are what they claim to be."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from PIL import Image
from pulse.report import CULPRIT, PNG_SIZE, build_report_data, draw, write_html

from pulse.cli import main
from pulse.trace import read_truth


@pytest.fixture(scope="module")
def data(nic_slow: Path):  # type: ignore[no-untyped-def]
    return build_report_data(nic_slow)


def test_culprit_panel_names_the_verdicts_and_the_truths_culprit(nic_slow: Path, data) -> None:  # type: ignore[no-untyped-def]
    truth = read_truth(nic_slow)
    assert data.verdict is not None, "Pulse found no anomaly on a nic-slow trace"
    assert data.verdict.kind == truth["kind"] == "network-slow"
    assert sorted(data.verdict.nodes) == sorted(truth["culprit"]["nodes"])
    # What the figure highlights, read from the arrays it is drawn from:
    assert data.highlighted_nodes == sorted(data.verdict.nodes) == sorted(truth["culprit"]["nodes"])
    assert data.highlighted_bar_nodes == data.highlighted_nodes
    assert data.flow_curves and {c.node for c in data.flow_curves} == set(truth["culprit"]["nodes"])
    assert all(c.culprit for c in data.flow_curves)
    # Rate curves per rank of the compared operators; those on the culprit nodes are
    # highlighted, and the boldest ones are on the verdict's NIC, the truth's degraded NIC.
    assert data.rate_source == "epochs"
    assert {c.node for c in data.node_curves} <= set(data.bars.nodes)
    assert len({c.node for c in data.node_curves}) >= 3
    assert {c.node for c in data.node_curves if c.culprit} == set(truth["culprit"]["nodes"])
    primary = {f"{c.node}/{c.nic}" for c in data.node_curves if c.primary}
    assert primary == set(data.verdict.nics) == set(truth["culprit"]["nics"])
    assert all(c.culprit for c in data.node_curves if c.primary)


def test_panels_show_the_network_straggler_signature(data) -> None:  # type: ignore[no-untyped-def]
    # A slow NIC: its rank's ACT is the longest while durations stay close (the blind spot).
    b = data.bars
    assert b.culprit.any() and not b.culprit.all()
    assert b.act_us[b.culprit].max() > np.median(b.act_us[~b.culprit])
    assert b.act_us[b.culprit].max() >= b.act_us.max()
    # ... while operator durations are close across the ranks of the ring (the blind spot).
    ring = [i for i, c in enumerate(b.comms) if c == data.comm_id]
    assert len(ring) >= 3
    dur = b.duration_us[ring]
    assert dur.max() / dur.min() < 1.25 < b.act_us[ring].max() / b.act_us[ring].min()
    # The degraded NIC's send rate while active is below its peers' (the curves themselves).
    def peak(c) -> float:  # type: ignore[no-untyped-def]
        return float(np.percentile(c.gbps[c.gbps > 0], 90))

    slow = [peak(c) for c in data.node_curves if c.primary and c.gbps.any()]
    others = [peak(c) for c in data.node_curves if not c.culprit and c.gbps.any()]
    assert slow and others and max(slow) < 0.75 * np.median(others)
    # The focus operators are shaded (others of the communicator in the window too, lighter),
    # with extents inside the window.
    assert data.seqs and {s.seq for s in data.spans if s.focus} == set(data.seqs)
    w = (data.window_ns[1] - data.window_ns[0]) / 1e6
    assert all(0 <= s.t0_ms <= s.t1_ms <= w for s in data.spans)
    # Curves cover the window and carry bytes.
    for c in data.node_curves:
        assert c.t_ms.shape == c.gbps.shape and c.t_ms[0] == 0 and c.t_ms[-1] < w
        assert np.all(np.isfinite(c.gbps)) and (c.gbps >= 0).all()
    assert data.evidence, "the verdict's evidence is listed"


def test_png_and_html(tmp_path: Path, data) -> None:  # type: ignore[no-untyped-def]
    png = draw(data, tmp_path / "r.png")
    raw = png.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) > 20_000
    img = Image.open(png).convert("RGB")
    assert img.size == PNG_SIZE
    px = np.asarray(img).reshape(-1, 3).astype(int)
    assert px.std() > 10, "a blank image"
    red = np.array([int(CULPRIT[i:i + 2], 16) for i in (1, 3, 5)])
    assert (np.abs(px - red).sum(axis=1) < 30).sum() > 500, "the culprit's colour is not drawn"
    page = write_html(data, png, tmp_path / "r.html")
    text = page.read_text()
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert m and base64.b64decode(m.group(1)) == raw
    # a URL needs its "://", which base64 never holds: the embedded PNG's bytes may spell
    # "http" by chance (a fresh-clone CI run: "...6httpKSkti...")
    assert not re.search(r"(?i)\b(?:https?:)?//", text.replace(str(data.source), "").replace(m.group(1), "")), \
        "self-contained: no external resources"
    for node in data.verdict.nodes:
        assert node in text


def test_cli_writes_png_and_html(tmp_path: Path, nic_slow: Path) -> None:
    out = tmp_path / "sub" / "anomaly.png"
    r = CliRunner().invoke(main, ["report", str(nic_slow), "--out", str(out), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    summary = orjson.loads(r.stdout)
    truth = read_truth(nic_slow)
    assert summary["culprit_nodes"] == sorted(truth["culprit"]["nodes"])
    assert Path(summary["png"]) == out and Image.open(out).size == PNG_SIZE
    assert Path(summary["html"]) == out.with_suffix(".html") and out.with_suffix(".html").stat().st_size > len(
        out.read_bytes())


def test_cli_usage_and_input_errors(tmp_path: Path) -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["report"])
    assert r.exit_code == 2 and "trace directory or --from-influx" in r.output
    r = runner.invoke(main, ["report", str(tmp_path), "--from-influx", "http://127.0.0.1:9"])
    assert r.exit_code == 2
    r = runner.invoke(main, ["report", str(tmp_path)])
    assert r.exit_code == 1 and r.output.startswith("error:") and "not a Pulse trace" in r.output
    r = runner.invoke(main, ["report", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "no such directory" in r.output
    # An InfluxDB that is not there is a one-line ServiceError, not a traceback.
    r = runner.invoke(main, ["report", "--from-influx", "http://127.0.0.1:9", "--job", "j"])
    assert r.exit_code == 1 and r.output.startswith("error: InfluxDB at http://127.0.0.1:9")


def test_healthy_trace_highlights_nothing(tmp_path_factory: pytest.TempPathFactory) -> None:
    from report_sim import simulate

    trace = simulate(tmp_path_factory.mktemp("healthy") / "healthy", "healthy", 2)
    data = build_report_data(trace)
    assert data.verdict is None and data.culprit_nodes == []
    assert data.highlighted_nodes == [] and data.highlighted_bar_nodes == []
    assert not any(c.culprit or c.primary for c in data.node_curves) and data.flow_curves == []
    assert data.node_curves and data.bars.ranks, "the busiest communicator is still drawn"
    png = draw(data, trace / "report.png")
    assert Image.open(png).size == PNG_SIZE
