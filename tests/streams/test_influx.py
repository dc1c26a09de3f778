"""The InfluxDB sink against real InfluxDB 1.x and VictoriaMetrics (v2 write API)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
import urllib.request

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pulse.streams.influx import InfluxSink, line, op_line
from services import find_binary

from pulse.records import OpMetrics, Verdict


def _metric(rank: int = 0, seq: int = 1, node: str = "node-00", end: int = 2_000_123_456) -> OpMetrics:
    return OpMetrics(job="jx", node=node, comm_id="dp-s0-g1", seq=seq, rank=rank, kind="AllReduce", nranks=4,
                     start_ns=1_000_000_000, end_ns=end, duration_ns=end - 1_000_000_000, act_ns=640_000,
                     volume_bytes=1 << 20, expected_bytes=1 << 20, complete=True, active_rate=1.6e9, flows=2,
                     epoch_ns=32_000)


def _verdict(job: str = "jx", status: str = "anomaly") -> Verdict:
    return Verdict(job=job, status=status, kind="network-slow", level="node", nodes=["node-02"], ranks=[1],
                   nics=["node-02/mlx5_1"], confidence=0.9, evidence={"act_ratio": 1.7}, window={"comm_id": "c"},
                   first_seen_ns=1_796_000_000_500_000_000, emitted_at=1, id="v1")


def _parse_line(text: str) -> tuple[str, dict[str, str], str, int]:
    # A reference parser for the subset we write: unescaped spaces split the three parts.
    parts = re.split(r"(?<!\\) ", text)
    head, fields, ts = " ".join(parts[:-2]), parts[-2], int(parts[-1])
    items = re.split(r"(?<!\\),", head)
    unesc = lambda s: re.sub(r"\\(.)", r"\1", s)  # noqa: E731
    tags = dict(tuple(unesc(x) for x in re.split(r"(?<!\\)=", kv, maxsplit=1)) for kv in items[1:])
    return unesc(items[0]), tags, fields, ts


@given(st.dictionaries(st.text("abc, =", min_size=1, max_size=6), st.text("xy ,=\"", min_size=1, max_size=6),
                       max_size=4),
       st.integers(0, 1 << 62))
def test_line_protocol_escapes_tags(tags, ts):
    text = line("m x", tags, {"f": 1}, ts)
    name, got_tags, fields, got_ts = _parse_line(text)
    assert (name, got_tags, fields, got_ts) == ("m x", tags, "f=1i", ts)


def test_no_seq_or_flow_in_tags_and_ranks_never_collide():
    a, b = op_line(_metric(rank=0)), op_line(_metric(rank=1))
    tags_a = _parse_line(a)[1]
    assert set(tags_a) == {"job", "node", "comm", "op"}
    assert _parse_line(a)[3] != _parse_line(b)[3]  # same series, different ranks: two points
    assert op_line(_metric()) == op_line(_metric())  # deterministic: a rewrite is the same point


def _query1(url: str, q: str) -> list:
    qs = urllib.parse.urlencode({"db": "pulse", "q": q})
    with urllib.request.urlopen(f"{url}/query?{qs}", timeout=10) as r:
        res = json.loads(r.read())["results"][0]
    return res.get("series", [{}])[0].get("values", []) if res.get("series") else []


def test_influxdb1_write_is_idempotent(influxdb1):
    async def go():
        sink = await InfluxSink(influxdb1, flush_interval_s=0.05).setup()
        assert sink.v1
        for _ in range(2):  # the same records twice (a replay after a worker restart)
            sink.add_metrics([_metric(rank=r) for r in range(3)])
            sink.add_verdicts([_verdict(job="idem")])
        await sink.close()
        return sink.stats

    stats = asyncio.run(go())
    assert stats["written"] == 8 and stats["dropped"] == 0
    ops = _query1(influxdb1, "SELECT rank, duration_us FROM pulse_op WHERE job='jx'")
    assert sorted(v[1] for v in ops) == [0, 1, 2]
    vs = _query1(influxdb1, "SELECT nodes, confidence FROM pulse_verdict WHERE job='idem'")
    assert [v[1:] for v in vs] == [["node-02", 0.9]]


def test_victoria_through_the_v2_write_api(victoria):
    async def go():
        sink = await InfluxSink(victoria, flush_interval_s=0.05).setup()
        assert not sink.v1
        sink.add_verdicts([_verdict(job="vm-job")])
        sink.add_verdicts([_verdict(job="vm-job")])
        await sink.close()

    asyncio.run(go())
    series: list = []
    deadline = time.monotonic() + 15
    while not series and time.monotonic() < deadline:
        q = urllib.parse.urlencode({"match[]": '{__name__="pulse_verdict_confidence",job="vm-job"}'})
        with urllib.request.urlopen(f"{victoria}/api/v1/export?{q}", timeout=10) as r:
            series = [json.loads(x) for x in r.read().splitlines() if x.strip()]
        time.sleep(0.3)
    # One series, one timestamp: the rewrite is the same point (VictoriaMetrics keeps raw
    # duplicates on disk unless started with -dedup.minScrapeInterval; queries see one).
    assert len(series) == 1 and set(series[0]["values"]) == {0.9}
    assert len(set(series[0]["timestamps"])) == 1
    assert series[0]["metric"]["status"] == "anomaly" and series[0]["metric"]["kind"] == "network-slow"


def test_unreachable_influx_is_retried_until_the_stop_then_counted_dropped():
    from pulse.broker import free_port

    sink = InfluxSink(f"http://127.0.0.1:{free_port()}", retries=1, backoff_s=(0.01, 0.01), timeout_s=0.5)
    sink.v1 = True  # skip /ping: nothing answers there

    async def go():
        sink._wake = asyncio.Event()
        sink._task = asyncio.create_task(sink._loop())
        sink.add_verdicts([_verdict()])
        await sink.close(timeout_s=5)

    asyncio.run(go())
    # No answer is an outage, not a bad batch: retried past `retries` while the worker
    # runs, counted as dropped only when it stops with the point still unwritten.
    assert sink.dropped == 1 and sink.retried > 1 and sink.failed_batches == 0 and sink.queued == 0


def test_https_with_a_ca_file_and_a_token_from_a_file(influxdb1, victoria, tmp_path):
    """InfluxDB 1.x and the v2 write API (VictoriaMetrics) behind a real TLS terminator
    (stunnel4), certificates made here; the token comes from a file."""
    import dataclasses

    from tlskit import make_pki, stunnel

    from pulse.broker import free_port
    from pulse.errors import ConfigError
    from pulse.settings import Settings

    if find_binary("stunnel4") is None and find_binary("stunnel") is None:
        pytest.skip("MISSING SERVICE: stunnel4 (apt-get install stunnel4)")
    pki = make_pki(tmp_path / "pki")
    token_file = tmp_path / "token"
    token_file.write_text("tok-123\n")
    for plain in (influxdb1, victoria):
        port = free_port()
        upstream = int(plain.rsplit(":", 1)[1])
        with stunnel(tmp_path, port, upstream, pki.path("server.pem"), pki.path("server.key")):
            env = {"PULSE_INFLUX_URL": f"https://127.0.0.1:{port}", "PULSE_INFLUX_CA_FILE": str(pki.path("ca.pem")),
                   "PULSE_INFLUX_TOKEN_FILE": str(token_file)}
            s = Settings.from_env(env)
            assert s.influx_token == "tok-123"
            job = f"tls-{port}"

            async def go(settings: Settings, job: str = job) -> InfluxSink:
                sink = await InfluxSink.from_settings(settings, flush_interval_s=0.05).setup()
                sink.add_verdicts([_verdict(job=job)])
                await sink.close()
                return sink

            sink = asyncio.run(go(s))
            assert sink.written == 1 and sink.dropped == 0, sink.stats
            wrong = dataclasses.replace(s, influx_ca_file=pki.path("other-ca.pem"))
            with pytest.raises(ConfigError, match=r"^PULSE_INFLUX_CA_FILE=.*other-ca.pem: does not verify"):
                asyncio.run(go(wrong))
        if plain == influxdb1:
            assert _query1(influxdb1, f"SELECT nodes FROM pulse_verdict WHERE job='{job}'")


def test_token_never_goes_over_plain_http_to_another_host(tmp_path):
    from pulse.errors import ConfigError
    from pulse.settings import Settings

    with pytest.raises(ConfigError, match=r"PULSE_INFLUX_URL=http://influx\.example:8086: refusing to send"):
        Settings.from_env({"PULSE_INFLUX_URL": "http://influx.example:8086", "PULSE_INFLUX_TOKEN": "t"})
    with pytest.raises(ConfigError, match="refusing to send the InfluxDB token over plain http"):
        InfluxSink("http://10.1.2.3:8086", token="t")
    ok = Settings.from_env({"PULSE_INFLUX_URL": "http://10.1.2.3:8086", "PULSE_INFLUX_TOKEN": "t",
                            "PULSE_INFLUX_ALLOW_PLAIN_TOKEN": "1"})
    assert InfluxSink.from_settings(ok).token == "t"
    InfluxSink("http://127.0.0.1:8086", token="t")  # loopback: the token stays on this host
    InfluxSink("http://10.1.2.3:8086")  # no token, nothing to leak
