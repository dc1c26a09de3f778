"""Points older than the retention policy: refused by a real InfluxDB 1.x, counted and
logged by the sink, never retried (retrying cannot make an old point young)."""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
import urllib.request
import uuid

from hypothesis import given
from hypothesis import strategies as st
from pulse.streams.influx import InfluxSink, retention_refused

from pulse.errors import ServiceError
from pulse.records import OpMetrics

DAY_NS = 86_400 * 10**9


def _metric(end_ns: int, rank: int) -> OpMetrics:
    return OpMetrics(job="ret", node="node-00", comm_id="c0", seq=1, rank=rank, kind="AllReduce", nranks=4,
                     start_ns=end_ns - 1_000_000, end_ns=end_ns, duration_ns=1_000_000, act_ns=640_000,
                     volume_bytes=1 << 20, expected_bytes=1 << 20, complete=True, active_rate=1.6e9, flows=2,
                     epoch_ns=32_000)


def _influxql(url: str, db: str, q: str) -> bytes:
    data = urllib.parse.urlencode({"db": db, "q": q}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{url}/query", data=data), timeout=10) as r:
        return r.read()


def test_influxdb1_refuses_old_points_and_the_sink_counts_and_logs_them(influxdb1, caplog):
    bucket = "ret_" + uuid.uuid4().hex[:8]
    # The shortest retention InfluxDB accepts is one hour; the sink's CREATE DATABASE on an
    # existing database keeps it.
    _influxql(influxdb1, bucket, f'CREATE DATABASE "{bucket}" WITH DURATION 1h')
    now = time.time_ns()

    async def go() -> InfluxSink:
        sink = await InfluxSink(influxdb1, bucket=bucket, flush_interval_s=0.05, backoff_s=(0.01, 0.01)).setup()
        # One batch: two points from two days ago (a replay of old timestamps), one of now.
        sink.add_metrics([_metric(now - 2 * DAY_NS, 0), _metric(now - 2 * DAY_NS + 5, 1), _metric(now, 2)])
        await sink.close()
        return sink

    with caplog.at_level(logging.ERROR, logger="pulse.streams.influx"):
        sink = asyncio.run(go())
    st_ = sink.stats
    assert st_["rejected_retention"] == 2 and st_["dropped"] == 2
    assert st_["written"] == 1 and st_["retried"] == 0 and st_["failed_batches"] == 0
    logged = [r.getMessage() for r in caplog.records if "retention" in r.getMessage()]
    assert len(logged) == 1 and "refused 2 of 3 points" in logged[0], logged
    # The young point of the batch was written (a partial write).
    assert b'"values":[[' in _influxql(influxdb1, bucket, 'SELECT rank FROM "pulse_op"')


@given(st.integers(1, 10_000), st.integers(0, 20_000))
def test_refused_count_comes_from_the_server_message_in_either_wording(points, dropped):
    # InfluxDB 1.x (tsdb.PartialWriteError) and 2.x wordings, as the servers send them.
    v1 = ServiceError(f"InfluxDB http://x/write: HTTP 400 {{\"error\":\"partial write: points beyond "
                      f"retention policy dropped={dropped}\"}}")
    v2 = ServiceError(f'HTTP 422 {{"code":"unprocessable entity","message":"failure writing points to '
                      f'database: partial write: dropped {dropped} points outside retention policy"}}')
    assert retention_refused(v1, points) == min(dropped, points)
    assert retention_refused(v2, points) == min(dropped, points)
    assert retention_refused(ServiceError("HTTP 500 internal error"), points) is None
    assert retention_refused(ServiceError('HTTP 400 {"error":"partial write: field type conflict"}'), points) is None
