"""The real time-series services the test fixtures start: InfluxDB 1.x and VictoriaMetrics."""

from __future__ import annotations

import time
import urllib.parse
import urllib.request
import uuid
from typing import Any

import orjson


def _http(method: str, url: str, body: bytes | None = None, timeout: float = 30) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _influxql(base: str, q: str, db: str | None = None) -> dict[str, Any]:
    params = {"q": q, "epoch": "ns"} | ({"db": db} if db else {})
    status, body = _http("POST", f"{base}/query?{urllib.parse.urlencode(params)}")
    assert status == 200, body
    out = orjson.loads(body)
    assert "error" not in out["results"][0], out
    return out  # type: ignore[no-any-return]


def test_influxdb1_write_and_query(influxdb1: str) -> None:
    status, body = _http("GET", f"{influxdb1}/ping")
    assert status == 204
    db = f"pulse_{uuid.uuid4().hex[:8]}"
    _influxql(influxdb1, f'CREATE DATABASE "{db}"')
    t0 = 1_764_460_800_000_000_000
    lines = [
        f"pulse_op,job=j1,node=node-0{r},comm=c1,kind=AllReduce rank={r}i,seq=7i,duration_us={10.5 + r},"
        f"act_us={8 + r}.25,volume_bytes={1 << 20}i,rate_gbps=12.5,complete=true {t0 + r * 1000}"
        for r in range(4)
    ] + [f'pulse_verdict,job=j1,kind=network-slow,level=node,status=anomaly nodes="node-03",ranks="3",'
         f"confidence=0.93 {t0 + 5000}"]
    status, body = _http("POST", f"{influxdb1}/write?db={db}&precision=ns", "\n".join(lines).encode())
    assert status == 204, body

    res = _influxql(influxdb1, "SELECT rank, duration_us, act_us, volume_bytes, complete, node FROM pulse_op "
                               "WHERE job = 'j1' ORDER BY time", db)
    series = res["results"][0]["series"][0]
    assert series["columns"] == ["time", "rank", "duration_us", "act_us", "volume_bytes", "complete", "node"]
    assert series["values"] == [[t0 + r * 1000, r, 10.5 + r, 8.25 + r, 1 << 20, True, f"node-0{r}"]
                                for r in range(4)]
    agg = _influxql(influxdb1, "SELECT max(act_us) FROM pulse_op GROUP BY node", db)
    assert sorted(s["tags"]["node"] for s in agg["results"][0]["series"]) == [f"node-0{r}" for r in range(4)]
    v = _influxql(influxdb1, "SELECT nodes, confidence FROM pulse_verdict WHERE status = 'anomaly'", db)
    assert v["results"][0]["series"][0]["values"] == [[t0 + 5000, "node-03", 0.93]]
    tags = _influxql(influxdb1, "SHOW TAG KEYS FROM pulse_op", db)
    assert {x[0] for x in tags["results"][0]["series"][0]["values"]} == {"comm", "job", "kind", "node"}


def test_influxdb1_rejects_bad_line_protocol(influxdb1: str) -> None:
    db = f"pulse_{uuid.uuid4().hex[:8]}"
    _influxql(influxdb1, f'CREATE DATABASE "{db}"')
    status, body = _http("POST", f"{influxdb1}/write?db={db}", b"pulse_op,job=j1 this is not line protocol")
    assert status == 400 and b"error" in body


def _victoria_export(base: str, match: str, deadline_s: float = 30.0) -> list[dict[str, Any]]:
    """Rows from /api/v1/export; polls briefly because ingestion is asynchronous."""
    deadline = time.monotonic() + deadline_s
    while True:
        _http("GET", f"{base}/internal/force_flush")
        q = urllib.parse.urlencode({"match[]": match, "start": "0"})
        status, body = _http("GET", f"{base}/api/v1/export?{q}")
        assert status == 200, body
        rows = [orjson.loads(line) for line in body.splitlines() if line.strip()]
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_victoria_through_influxdb_client_v2_write_api(victoria: str) -> None:
    from influxdb_client import InfluxDBClient, Point, WritePrecision
    from influxdb_client.client.write_api import SYNCHRONOUS

    job = f"job{uuid.uuid4().hex[:8]}"
    t0_ms = int(time.time() * 1000) - 60_000
    with InfluxDBClient(url=victoria, token="x", org="o") as client:
        write = client.write_api(write_options=SYNCHRONOUS)
        points = [Point("pulse_op").tag("job", job).tag("node", f"node-0{r}").tag("kind", "AllReduce")
                  .field("act_us", 8.0 + r).field("volume_bytes", 1000 * (r + 1))
                  .time(t0_ms + r, WritePrecision.MS) for r in range(3)]
        write.write(bucket="pulse", record=points)
        write.write(bucket="pulse", record=f"pulse_verdict,job={job},kind=network-slow confidence=0.9 {t0_ms}",
                    write_precision=WritePrecision.MS)

    rows = _victoria_export(victoria, f'{{job="{job}"}}')
    by_name: dict[tuple[str, str], tuple[list[float], list[int]]] = {}
    for row in rows:
        m = row["metric"]
        by_name[(m["__name__"], m.get("node", ""))] = (row["values"], row["timestamps"])
    for r in range(3):
        assert by_name[("pulse_op_act_us", f"node-0{r}")] == ([8.0 + r], [t0_ms + r])
        assert by_name[("pulse_op_volume_bytes", f"node-0{r}")] == ([1000.0 * (r + 1)], [t0_ms + r])
    assert by_name[("pulse_verdict_confidence", "")] == ([0.9], [t0_ms])
    assert {row["metric"]["job"] for row in rows} == {job}


def test_victoria_health(victoria: str) -> None:
    # Note: VictoriaMetrics answers 204 even to unparseable line protocol (it only logs it),
    # so a sink cannot learn about bad lines from its status codes.
    assert _http("GET", f"{victoria}/health")[0] == 200
