"""Incidents end to end: one incident per fault that opens and resolves, on the compacted
incidents topic (read by a plain consumer), in InfluxDB 1.x and VictoriaMetrics, and
delivered to alert receivers (a local HTTP server that is down for a while, and a real
Alertmanager)."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from pulse.engine import diagnose
from pulse.localization.lifecycle import IncidentTracker
from pulse.streams.alerts import AlertSink
from pulse.streams.influx import InfluxSink
from streamkit import SIM_SIZE, publish, read_topic, running_worker, unique_settings, wait_caught_up

from pulse.cli import main
from pulse.records import Verdict, decode_incident
from pulse.trace import read_truth

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ending_fault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """nic-slow at the test size for 600 ms from its onset, then the NIC is fine again: long
    enough for slowness shown by ACT alone to hold three quarters of its link's window (9
    of its last 12 operators, ~450 ms of this job's 2-rank ring; 400 ms gave 8)."""
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    out = tmp_path_factory.mktemp("inc") / "nic-slow-ends"
    simulate(SimConfig(scenario="nic-slow", seed=2, job="job-inc", fault_duration_ms=600.0,
                       **{**SIM_SIZE, "steps": 24}), out)
    return out


def test_a_fault_that_ends_is_one_incident_opened_and_resolved(ending_fault: Path) -> None:
    res = diagnose(ending_fault)
    truth = read_truth(ending_fault)
    ids = {i.id for i in res.incidents}
    assert len(ids) == 1, [(i.state, i.kind, i.nodes) for i in res.incidents]
    states = [i.state for i in res.incidents]
    assert states[0] == "open" and states[-1] == "resolved" and states.count("updated") <= 3
    last = res.incidents[-1]
    assert last.resolution == "evidence-stopped" and last.nodes == truth["culprit"]["nodes"]
    # resolved after the cause was removed (trace time; the clock offsets are ~0.1 ms)
    assert last.resolved_at_ns is not None and last.resolved_at_ns > truth["fault_end_ns"]
    assert "network fail-slow" in last.summary and last.nics


def test_a_healthy_run_has_no_incident(sim_trace) -> None:
    assert diagnose(sim_trace("healthy")).incidents == []


class _Receiver:
    """A real HTTP server on a port reserved up front, that can be down (nothing listening:
    connections are refused) and come up later."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/api/v2/alerts"
        self.bodies: list[list[dict]] = []
        self.server: http.server.ThreadingHTTPServer | None = None

    def up(self) -> None:
        bodies = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    @property
    def alerts(self) -> list[dict]:
        return [a for b in self.bodies for a in b]


def _influx1(url: str, q: str) -> list[dict]:
    qs = urllib.parse.urlencode({"db": "pulse", "q": q})
    with urllib.request.urlopen(f"{url}/query?{qs}", timeout=10) as resp:
        data = json.loads(resp.read())
    rows = []
    for result in data.get("results", []):
        for series in result.get("series", []) or []:
            for values in series["values"]:
                rows.append(dict(zip(series["columns"], values, strict=True)) | series.get("tags", {}))
    return rows


def test_the_pipeline_publishes_the_incident_stores_it_and_alerts(broker, influxdb1, ending_fault, tmp_path) -> None:
    truth = read_truth(ending_fault)
    recv = _Receiver()  # down while the fault is found: its alerts must wait, not be lost
    s = unique_settings(broker, tmp_path, influx_url=influxdb1)
    env = {"PULSE_INFLUX_URL": influxdb1, "PULSE_INFLUX_BUCKET": "pulse", "PULSE_ALERT_URL": recv.url,
           "PULSE_ALERT_REPORT_URL": "http://grafana.example/d/pulse?var-job={job}&incident={id}"}
    with running_worker(s, tmp_path, env) as w:
        counts = publish(s, ending_fault)
        wait_caught_up(s, counts["batches"], worker=w)
        # the plain consumer a user's automation would run: the compacted topic
        recs = [decode_incident(v) for _k, v in asyncio.run(read_topic(broker, s.topics.incidents))]
        assert recs, "no incident on the topic"
        assert len({r.id for r in recs}) == 1
        assert recs[0].state == "open"
        assert recs[0].nodes == truth["culprit"]["nodes"]
        recv.up()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(a.get("endsAt") for a in recv.alerts):
            time.sleep(0.5)
    recv.down()
    # the alerts: firing first, resolved last, with the labels an on-call rule routes on
    alerts = recv.alerts
    assert alerts, "the receiver never got the alerts after coming back"
    assert "endsAt" not in alerts[0] and alerts[-1].get("endsAt")
    lab = alerts[0]["labels"]
    assert lab["alertname"] == "PulseIncident" and lab["node"] == ",".join(truth["culprit"]["nodes"])
    assert lab["kind"] == "network-slow" and lab["job"] == "job-inc" and lab["nic"].startswith(lab["node"])
    assert lab["incident"] == recs[0].id and "var-job=job-inc" in alerts[0]["annotations"]["report"]
    assert "network fail-slow" in alerts[0]["annotations"]["summary"]
    # InfluxDB 1.x: one point per state change, state a tag, the id a field
    deadline = time.monotonic() + 20
    rows: list[dict] = []
    while time.monotonic() < deadline and len({r["state"] for r in rows}) < 2:
        rows = _influx1(influxdb1, "SELECT * FROM pulse_incident WHERE job='job-inc'")
        time.sleep(0.5)
    assert {r["state"] for r in rows} >= {"open", "resolved"}, rows
    assert {r["id"] for r in rows} == {recs[0].id}
    keys = {r["tagKey"] for r in _influx1(influxdb1, "SHOW TAG KEYS FROM pulse_incident")}
    assert keys == {"job", "kind", "level", "state"}
    # pulse incidents: one line for the one incident
    res = CliRunner().invoke(main, ["incidents", "--broker", broker, "--topic-prefix", s.topic_prefix, "--json"])
    assert res.exit_code == 0, res.output
    listed = [orjson.loads(x) for x in res.stdout.splitlines() if x.strip()]
    assert [x["id"] for x in listed] == [recs[0].id] and listed[0]["state"] == "resolved"


def _verdicts(kind: str, status: str, decided: int) -> list[Verdict]:
    return [Verdict(job="am", status=status, kind=kind, level="node", nodes=["node-07"], ranks=[7],
                    nics=["node-07/mlx5_2"], confidence=0.9, evidence={"findings": [], "outlier_ops": 5},
                    window={"comm_id": "c", "first_seq": 3, "last_seq": 9, "ops": 5, "decided_at_ns": decided},
                    first_seen_ns=time.time_ns() - 5_000_000_000, emitted_at=time.time_ns())]


def test_a_real_alertmanager_takes_firing_then_resolved(alertmanager) -> None:
    tracker = IncidentTracker("am")
    opened = tracker.observe(_verdicts("network-slow", "anomaly", time.time_ns()))
    resolved = tracker.observe(_verdicts("network-slow", "cleared", time.time_ns()))

    def active() -> list[dict]:
        with urllib.request.urlopen(f"{alertmanager}/api/v2/alerts?filter=incident%3D%22{opened[0].id}%22",
                                    timeout=5) as resp:
            return json.loads(resp.read())

    async def go() -> None:
        sink = await AlertSink(f"{alertmanager}/api/v2/alerts").setup()
        sink.add(opened)
        await sink.flush()
        got = active()
        assert [a["labels"]["node"] for a in got] == ["node-07"], got
        assert got[0]["status"]["state"] in ("active", "unprocessed")
        sink.add(resolved)
        await sink.flush()
        await sink.close()
        assert sink.sent == 2 and sink.dropped == 0

    asyncio.run(go())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and active():
        time.sleep(0.2)
    assert active() == []  # resolved: Alertmanager no longer lists it


def test_incidents_reach_victoria_metrics_through_the_v2_write_api(victoria, ending_fault) -> None:
    incs = diagnose(ending_fault).incidents

    async def go() -> None:
        sink = await InfluxSink(victoria, bucket="pulse").setup()
        sink.add_incidents(incs)
        await sink.flush()
        await sink.close()

    asyncio.run(go())
    deadline = time.monotonic() + 20
    series: list[dict] = []
    while time.monotonic() < deadline and len(series) < 2:
        q = urllib.parse.urlencode({"match[]": '{__name__="pulse_incident_confidence",job="job-inc"}'})
        with urllib.request.urlopen(f"{victoria}/api/v1/export?{q}", timeout=10) as resp:
            series = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
        time.sleep(0.5)
    assert {s_["metric"]["state"] for s_ in series} >= {"open", "resolved"}, series
