"""The whole pipeline on the real embedded broker, a real worker process and real InfluxDB:
producer -> samples/hook-events -> segment agent -> op-metrics -> localize agent -> verdicts."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
import urllib.request

import orjson
import pytest
from streamkit import (
    latest_pipeline,
    publish,
    read_topic,
    replay_list,
    running_worker,
    unique_settings,
    verdicts_on_topic,
    wait_caught_up,
)

from pulse.records import kind_family
from pulse.samples import EpochBatch
from pulse.trace import read_truth

pytestmark = pytest.mark.slow


def _anomalies(verdicts: list[dict]) -> list[dict]:
    return [v for v in verdicts if v["status"] == "anomaly"]


def _influx1_query(url: str, q: str, db: str = "pulse") -> list[dict]:
    qs = urllib.parse.urlencode({"db": db, "q": q})
    with urllib.request.urlopen(f"{url}/query?{qs}", timeout=10) as resp:
        data = json.loads(resp.read())
    rows = []
    for result in data.get("results", []):
        for series in result.get("series", []) or []:
            cols = series["columns"]
            for values in series["values"]:
                rows.append(dict(zip(cols, values, strict=True)) | series.get("tags", {}))
    return rows


def _wait_rows(url: str, q: str, want: int, timeout_s: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = _influx1_query(url, q)
        if len(rows) >= want:
            return rows
        time.sleep(0.5)
    return rows


def test_network_slow_verdicts_on_topic_and_in_influxdb1(broker, influxdb1, sim_trace, tmp_path):
    trace = sim_trace("nic-slow")
    truth = read_truth(trace)
    s = unique_settings(broker, tmp_path, influx_url=influxdb1)
    env = {"PULSE_INFLUX_URL": influxdb1, "PULSE_INFLUX_BUCKET": "pulse"}
    with running_worker(s, tmp_path, env) as w:
        counts = publish(s, trace)
        rec = wait_caught_up(s, counts["batches"], worker=w)
    verdicts = verdicts_on_topic(s)
    anomalies = _anomalies(verdicts)
    assert anomalies, f"no anomaly verdict; got {[v['status'] for v in verdicts]}; pipeline {rec}"
    culprit = set(truth["culprit"]["nodes"])
    hits = [v for v in anomalies if culprit & set(v["nodes"]) and kind_family(v["kind"]) == "network"]
    assert hits, f"no network verdict naming {culprit}: {[(v['kind'], v['nodes']) for v in anomalies]}"
    assert not [v for v in anomalies if kind_family(v["kind"]) == "compute"]
    assert rec["dead_letters"] == 0 and rec["op_metrics"] > 0
    # The same verdicts in InfluxDB 1.x (what Grafana reads), tags as designed.
    job = "job-nic-slow"
    rows = _wait_rows(influxdb1, f"SELECT * FROM pulse_verdict WHERE status='anomaly' AND job='{job}'", 1)
    assert any(culprit & set(r["nodes"].split(",")) for r in rows), rows[:3]
    ops = _wait_rows(influxdb1, f"SELECT count(duration_us) FROM pulse_op WHERE job='{job}'", 1)
    assert ops and ops[0]["count"] > 0
    tag_keys = {r["tagKey"] for r in _influx1_query(influxdb1, "SHOW TAG KEYS FROM pulse_op")}
    assert tag_keys <= {"job", "node", "comm", "op"}, tag_keys  # no flow ids or seq in tags


def test_compute_slow_verdicts_and_victoria(broker, victoria, sim_trace, tmp_path):
    trace = sim_trace("gpu-slow")
    truth = read_truth(trace)
    s = unique_settings(broker, tmp_path)
    env = {"PULSE_INFLUX_URL": victoria}
    with running_worker(s, tmp_path, env) as w:
        counts = publish(s, trace)
        rec = wait_caught_up(s, counts["batches"], worker=w)
    verdicts = verdicts_on_topic(s)
    assert verdicts, f"no verdicts at all; pipeline {rec}"
    # Through the v2 write API (influxdb-client) into VictoriaMetrics: fields become series.
    deadline = time.monotonic() + 20
    series: list[dict] = []
    while time.monotonic() < deadline and not series:
        # Only this job's series: the VictoriaMetrics fixture is shared by the session.
        q = urllib.parse.urlencode({"match[]": '{__name__="pulse_verdict_confidence",job="job-gpu-slow"}'})
        with urllib.request.urlopen(f"{victoria}/api/v1/export?{q}", timeout=10) as resp:
            series = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
        time.sleep(0.5)
    assert series and all("status" in s_["metric"] for s_ in series)
    anomalies = _anomalies(verdicts)
    culprit = set(truth["culprit"]["nodes"])
    # Never a network verdict for a compute cause (a misdiagnosis) ...
    wrong = [v for v in anomalies if kind_family(v["kind"]) == "network"]
    assert not wrong, [(v["kind"], v["nodes"]) for v in wrong]
    # ... and the culprit named, by the one-process diagnosis and by the pipeline alike.
    from pulse.engine import diagnose

    batch = [v for v in diagnose(trace).anomalies if culprit & set(v.nodes) and kind_family(v.kind) == "compute"]
    hits = [v for v in anomalies if culprit & set(v["nodes"]) and kind_family(v["kind"]) == "compute"]
    assert batch, f"pulse diagnose does not name {culprit} as compute-slow at the test size"
    assert hits, (
        f"pipeline {[(v['status'], v.get('kind'), v['nodes']) for v in verdicts]}; diagnose found {len(batch)}")


def test_healthy_no_alarm_and_poison_goes_to_dead_letter(broker, sim_trace, tmp_path):
    trace = sim_trace("healthy")
    s = unique_settings(broker, tmp_path)
    items = replay_list(trace)
    node = next(it.node for it in items if isinstance(it, EpochBatch))

    async def poison() -> None:
        from aiokafka import AIOKafkaProducer

        p = AIOKafkaProducer(bootstrap_servers=broker)
        await p.start()
        try:
            # Same key as real traffic: same partition, which must keep going afterwards.
            await (await p.send(s.topics.samples, b"PLSE garbage", key=node.encode()))
            await (await p.send(s.topics.hook_events, b'{"type": "op", "v": 1}', key=node.encode()))
        finally:
            await p.stop()

    with running_worker(s, tmp_path) as w:
        asyncio.run(poison())
        counts = publish(s, trace, items, speed=0)
        rec = wait_caught_up(s, counts["batches"], worker=w)
    dead = [orjson.loads(v) for _, v in asyncio.run(read_topic(broker, s.topics.dead_letter))]
    assert len(dead) == 2, dead
    assert {d["topic"] for d in dead} == {s.topics.samples, s.topics.hook_events}
    assert all(d["error"] and d["key"] == node for d in dead)
    assert rec["batches"] == counts["batches"]  # every good batch after the poison was processed
    verdicts = verdicts_on_topic(s)
    assert verdicts, f"no verdicts; pipeline {rec}"
    assert not _anomalies(verdicts), [(v["kind"], v["nodes"]) for v in _anomalies(verdicts)]


def test_worker_killed_and_restarted_verdicts_still_arrive(broker, sim_trace, tmp_path):
    trace = sim_trace("nic-slow")
    truth = read_truth(trace)
    s = unique_settings(broker, tmp_path)
    items = replay_list(trace)
    batches = [i for i, it in enumerate(items) if isinstance(it, EpochBatch)]
    cut = batches[len(batches) // 3]
    first, rest = items[:cut], items[cut:]
    with running_worker(s, tmp_path) as w:
        c1 = publish(s, trace, first, speed=0)
        wait_caught_up(s, c1["batches"], worker=w, quiet_s=1.5)
        before = len(verdicts_on_topic(s))
        w.kill()  # SIGKILL: no clean shutdown, no final commit
        w.start()  # same consumer group: resumes from committed offsets, rebuilds membership
        c2 = publish(s, trace, rest)
        rec = wait_caught_up(s, c2["batches"], worker=w)
    verdicts = verdicts_on_topic(s)
    after = verdicts[before:]
    assert after, f"no verdict after the restart; pipeline {rec}; {latest_pipeline(broker, s)}"
    assert rec["batches"] >= c2["batches"] and rec["dead_letters"] == 0, rec
    assert rec["op_metrics"] > 0 and rec["verdicts"] > 0, rec  # the new worker segments and judges
    culprit = set(truth["culprit"]["nodes"])
    if not any(v["status"] == "anomaly" and culprit & set(v["nodes"]) for v in after):
        import warnings

        # Not asserted: the rebuild is exact since read_back stops at the committed offsets
        # (docs/pipeline.md), but a small job's verdict after a 10 s stall is a judgement,
        # not a pipeline property; the warning shows when it happens.
        warnings.warn(f"no anomaly naming {culprit} after the restart: "
                      f"{[(v['status'], v.get('kind'), v['nodes']) for v in after]}; pipeline {rec}", stacklevel=1)
