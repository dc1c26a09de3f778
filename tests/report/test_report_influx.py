"""`pulse report --from-influx`: the same anomaly, read back from what the pipeline's
InfluxDB sink wrote to a real InfluxDB 1.x."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from PIL import Image
from pulse.report import PNG_SIZE, build_report_data_from_influx, draw, main_anomaly
from pulse.report.from_influx import _rows, influx_query, ops_from_rows, verdict_from_row

from pulse.cli import main
from pulse.trace import read_truth

DB = "pulse-report"


@pytest.fixture(scope="module")
def written(influxdb1: str, nic_slow: Path):  # type: ignore[no-untyped-def]
    from pulse.engine import diagnose
    from pulse.streams.influx import InfluxSink

    result = diagnose(nic_slow)

    async def write() -> None:
        sink = await InfluxSink(influxdb1, bucket=DB).setup()
        sink.add_metrics(result.metrics)
        sink.add_verdicts(result.verdicts)
        await sink.flush()
        await sink.close()
        assert sink.written == len(result.metrics) + len(result.verdicts)

    asyncio.run(write())
    return result


def test_culprit_panel_from_influx(influxdb1: str, nic_slow: Path, written) -> None:  # type: ignore[no-untyped-def]
    truth = read_truth(nic_slow)
    data = build_report_data_from_influx(influxdb1, job=written.job, db=DB)
    assert data.rate_source == "operators" and not data.flow_curves
    assert data.verdict is not None and data.verdict.kind == "network-slow"
    # The same verdict as from the trace directory, after the round trip through InfluxDB.
    main_v = main_anomaly(written.verdicts)
    assert (data.verdict.kind, data.verdict.level, data.verdict.nodes, data.verdict.first_seen_ns) == (
        main_v.kind, main_v.level, main_v.nodes, main_v.first_seen_ns)
    assert data.highlighted_nodes == sorted(truth["culprit"]["nodes"]) == sorted(main_v.nodes)
    assert data.highlighted_bar_nodes == data.highlighted_nodes
    # Every operator came back, with its ACT and volume (to the µs the sink keeps).
    assert sum(len(c.t_ms) for c in data.node_curves) >= len(data.bars.ranks)
    assert data.evidence, "the evidence survives the round trip"


def test_rows_decode_to_what_the_sink_wrote(influxdb1: str, written) -> None:  # type: ignore[no-untyped-def]
    """The decoder is the sink's exact inverse, except what the sink does not keep: the
    end below the µs, the epoch, the verdict's window, an evidence cut at 4000 characters."""
    where = f"WHERE \"job\" = '{written.job}'"
    rows = list(_rows(influx_query(influxdb1, DB, f'SELECT * FROM "pulse_op" {where}')))
    ops = {(m.node, m.comm_id, m.seq, m.rank): m for m in ops_from_rows(rows)}
    assert len(ops) == len(rows) == len(written.metrics)
    for m in written.metrics:
        got = ops[(m.node, m.comm_id, m.seq, m.rank)]
        assert got.end_ns == m.end_ns // 1000 * 1000 and got.start_ns == got.end_ns - m.duration_ns
        assert (got.job, got.kind, got.nranks, got.duration_ns, got.act_ns, got.volume_bytes, got.expected_bytes,
                got.complete, got.flows) == (m.job, m.kind, m.nranks, m.duration_ns, m.act_ns, m.volume_bytes,
                                             m.expected_bytes, m.complete, m.flows)
        assert abs(got.active_rate - m.active_rate) <= 1e-9 * m.active_rate
    rows = list(_rows(influx_query(influxdb1, DB, f'SELECT * FROM "pulse_verdict" {where}')))
    back = sorted((verdict_from_row(r) for r in rows), key=lambda v: (v.first_seen_ns, v.emitted_at))
    assert None not in back
    sent = sorted(written.verdicts, key=lambda v: (v.first_seen_ns, v.emitted_at))
    for got, v in zip(back, sent, strict=True):
        short = len(orjson.dumps(v.evidence)) <= 4000
        assert got == dataclasses.replace(v, window={}, evidence=v.evidence if short else {})


def test_cli_from_influx_finds_the_only_job(influxdb1: str, tmp_path: Path, written) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "influx.png"
    r = CliRunner().invoke(main, ["report", "--from-influx", influxdb1, "--db", DB, "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    summary = orjson.loads(r.stdout)
    assert summary["job"] == written.job
    assert summary["culprit_nodes"] == sorted(main_anomaly(written.verdicts).nodes)
    assert Image.open(out).size == PNG_SIZE


def test_unknown_job_is_an_error(influxdb1: str, written) -> None:  # type: ignore[no-untyped-def]
    r = CliRunner().invoke(main, ["report", "--from-influx", influxdb1, "--db", DB, "--job", "no-such-job"])
    assert r.exit_code == 1 and "nothing for job 'no-such-job'" in r.output


def test_draws_from_influx(influxdb1: str, tmp_path: Path, written) -> None:  # type: ignore[no-untyped-def]
    data = build_report_data_from_influx(influxdb1, job=written.job, db=DB)
    png = draw(data, tmp_path / "x.png")
    assert Image.open(png).size == PNG_SIZE and png.stat().st_size > 20_000


def test_several_jobs_need_job(influxdb1: str, written) -> None:  # type: ignore[no-untyped-def]
    from pulse.streams.influx import InfluxSink

    db = "pulse-two-jobs"
    v = main_anomaly(written.verdicts)

    async def write() -> None:
        sink = await InfluxSink(influxdb1, bucket=db).setup()
        sink.add_verdicts([v, dataclasses.replace(v, job="other-job")])
        await sink.flush()
        await sink.close()

    asyncio.run(write())
    r = CliRunner().invoke(main, ["report", "--from-influx", influxdb1, "--db", db])
    assert r.exit_code == 1 and "2 jobs" in r.output and "other-job" in r.output and "--job" in r.output
    data = build_report_data_from_influx(influxdb1, job="other-job", db=db)
    assert data.verdict is not None and data.verdict.nodes == v.nodes and data.job == "other-job"
