"""Every InfluxQL query of the provisioned dashboards runs against a real InfluxDB 1.x
holding what the pipeline's own InfluxDB sink (pulse.streams.influx.InfluxSink) wrote for a
simulated nic-slow job, and returns rows."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from infra_grafana import dashboards, grafana_interval, queries, substitute
from pulse.report import influx_query

from pulse.settings import Settings

DB = "pulse-dash"
# DP=4 rings over 4 nodes (pp 1), 2 rails: small, and the straggler has 3 peers per ring.
SIM_ARGS = ["--nodes", "4", "--pp", "1", "--gpus-per-node", "2", "--nics-per-node", "2", "--steps", "8"]
PIPELINE_POINTS = 5

# Dashboard fields that nothing in the pipeline writes to InfluxDB yet (a producer's spool
# is reported by `pulse produce --json`, not to InfluxDB). Listed, not skipped silently: the
# test below fails as soon as the worker's record carries one, so the entry gets removed.
NOT_WRITTEN_YET = {"spool_bytes": "producers do not report their spool to InfluxDB"}


@pytest.fixture(scope="module")
def written(influxdb1: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Simulate, segment + localize (the code `pulse diagnose` runs), then write operator
    metrics, verdicts and pipeline-health records through the streaming pipeline's sink."""
    from pulse.engine import diagnose
    from pulse.streams.app import Pipeline
    from pulse.streams.influx import InfluxSink, pipeline_line

    trace = tmp_path_factory.mktemp("dash") / "nic-slow"
    cmd = [sys.executable, "-m", "pulse.cli", "sim", "--scenario", "nic-slow", "--seed", "1", *SIM_ARGS,
           "--out", str(trace)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result = diagnose(Path(trace))
    assert result.metrics and result.anomalies, "the nic-slow trace gave no operators or no anomaly"
    assert {i.state for i in result.incidents} >= {"open", "resolved"}
    settings = Settings(broker="127.0.0.1:1", worker_id="pulse-worker")

    async def write() -> dict:
        sink = await InfluxSink(influxdb1, bucket=DB).setup()
        assert sink.v1, "the fixture is InfluxDB 1.x"
        # A worker that writes to InfluxDB, for its pipeline record (built, never started).
        pipe = Pipeline(settings, bootstrap="127.0.0.1:1", influx=sink)
        sink.add_metrics(result.metrics)
        sink.add_verdicts(result.verdicts)
        sink.add_incidents(result.incidents)
        # The worker's timer writes one record per interval; several give the derivatives
        # of the cumulative counters something to work on.
        now = time.time_ns()
        interval = 1_000_000_000
        for i in range(PIPELINE_POINTS):
            rec = pipe.pipeline_record()
            rec.update(batches=100 * i, rows=5000 * i, op_metrics=10 * i, verdicts=i)
            fields = {k: v for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            sink.add([pipeline_line(settings.worker_id, "worker", fields, interval,
                                    now_ns=now - (PIPELINE_POINTS - i) * interval)])
        await sink.flush()
        await sink.close()
        pipe.close()
        assert sink.dropped == 0 and sink.failed_batches == 0
        return {"fields": fields, "written": sink.written}

    info = asyncio.run(write())
    info.update(job=result.job, nodes=sorted({m.node for m in result.metrics}),
                culprit=sorted(result.anomalies[0].nodes), n_ops=len(result.metrics))
    return info


MEASUREMENTS = ("pulse_op", "pulse_verdict", "pulse_incident", "pulse_pipeline")


def _time_range(url: str, text: str = "") -> tuple[int, int]:
    """The span of the measurements a query reads (all when it names none), plus a minute
    each side: the time picker set to where the data is, as a user would."""
    lo, hi = None, None
    for m in [m for m in MEASUREMENTS if f'"{m}"' in text] or MEASUREMENTS:
        for order in ("ASC", "DESC"):
            s = influx_query(url, DB, f'SELECT * FROM "{m}" ORDER BY time {order} LIMIT 1')
            t = s[0]["values"][0][0]
            lo = t if lo is None else min(lo, t)
            hi = t if hi is None else max(hi, t)
    assert lo is not None and hi is not None
    return lo // 1_000_000 - 60_000, hi // 1_000_000 + 60_000


def test_the_sink_wrote_every_measurement(influxdb1: str, written: dict) -> None:
    for m in MEASUREMENTS:
        s = influx_query(influxdb1, DB, f'SELECT count(*) FROM "{m}"')
        assert s and max(v for v in s[0]["values"][0][1:] if v is not None) > 0, m
    ops = influx_query(influxdb1, DB, 'SELECT count("act_us") FROM "pulse_op"')[0]["values"][0][1]
    assert ops == written["n_ops"], "one point per operator per rank (ranks never overwrite each other)"


@pytest.mark.parametrize("node_choice", ["all", "culprit"])
def test_every_dashboard_query_returns_rows(influxdb1: str, written: dict, node_choice: str) -> None:
    nodes = written["nodes"] if node_choice == "all" else written["culprit"]
    variables = {"job": [written["job"]], "node": nodes}
    checked, exempt = 0, []
    for name, dash in dashboards().items():
        for q in queries(name, dash):
            start_ms, end_ms = _time_range(influxdb1, q.text)
            text = substitute(q.text, start_ms=start_ms, end_ms=end_ms,
                              interval=grafana_interval(start_ms, end_ms), variables=variables)
            series = influx_query(influxdb1, DB, text)  # raises on any InfluxDB error
            # A row counts when it holds a value: a misspelt field gives rows of nulls.
            rows = sum(1 for s in series for row in s.get("values") or []
                       if any(v is not None for v in row[1:]))
            missing = [f for f in NOT_WRITTEN_YET if f'"{f}"' in q.text]
            if missing:
                assert rows == 0, f"{q.where}: {missing} is written now: drop it from NOT_WRITTEN_YET"
                exempt.append(q.where)
                continue
            assert rows > 0, f"{name} {q.where}: no rows for\n{text}"
            checked += 1
    assert checked >= 25 and len(exempt) <= len(NOT_WRITTEN_YET)


def test_not_written_yet_is_true_of_the_worker_record(written: dict) -> None:
    for field in NOT_WRITTEN_YET:
        assert field not in written["fields"], f"{field} is in the worker's record now"


def test_node_variable_lists_the_jobs_nodes(influxdb1: str, written: dict) -> None:
    dash = dashboards()["pulse-overview.json"]
    var = {v["name"]: v for v in dash["templating"]["list"]}
    start_ms, end_ms = _time_range(influxdb1)
    jobs = influx_query(influxdb1, DB, var["job"]["query"])
    assert [v[1] for v in jobs[0]["values"]] == [written["job"]]
    q = substitute(var["node"]["query"], start_ms=start_ms, end_ms=end_ms, interval="1s",
                   variables={"job": [written["job"]]})
    nodes = influx_query(influxdb1, DB, q)
    assert sorted(v[1] for v in nodes[0]["values"]) == written["nodes"]
    # ... and nothing for a job that is not there (the filter is applied).
    q = substitute(var["node"]["query"], start_ms=start_ms, end_ms=end_ms, interval="1s",
                   variables={"job": ["no-such-job"]})
    assert influx_query(influxdb1, DB, q) == []


def test_the_provisioned_alert_rule_query_finds_the_incident(influxdb1: str, written: dict) -> None:
    import yaml

    rules = yaml.safe_load((Path(__file__).resolve().parents[2] / "infra/grafana/provisioning/alerting/pulse.yaml")
                           .read_text(encoding="utf-8"))
    [group] = rules["groups"]
    [rule] = group["rules"]
    assert rule["condition"] == "C" and {d["refId"] for d in rule["data"]} == {"A", "B", "C"}
    query = next(d for d in rule["data"] if d["refId"] == "A")
    assert query["datasourceUid"] == "pulse-influxdb"
    start_ms, end_ms = _time_range(influxdb1, query["model"]["query"])
    text = substitute(query["model"]["query"], start_ms=start_ms, end_ms=end_ms, interval="1s", variables={})
    series = influx_query(influxdb1, DB, text)
    assert [(s_["tags"]["job"], s_["tags"]["kind"]) for s_ in series] == [(written["job"], "network-slow")]
    assert series[0]["values"][0][1] == 1  # one incident opened
