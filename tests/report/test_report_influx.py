"""`pulse report --from-influx`: the same anomaly, read back from what the pipeline's
InfluxDB sink wrote to a real InfluxDB 1.x."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from PIL import Image

from pulse.cli import main
from pulse.report import PNG_SIZE, build_report_data_from_influx, draw, main_anomaly
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
    import dataclasses

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
