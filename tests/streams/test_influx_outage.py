"""The InfluxDB sink through an outage of a real VictoriaMetrics (stopped and started again on
the same port and data): nothing blocks, points wait in a bounded queue, and everything
queued is written when the server returns (issue 20, "slow and full sinks")."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import services
from pulse.streams.influx import InfluxSink, line, transient

from pulse.errors import ServiceError


@pytest.fixture
def vm(tmp_path):
    binary = services.find_binary(services.VICTORIA)
    if binary is None:
        pytest.skip("victoria-metrics is not installed")
    svc = services.start_victoria(tmp_path, binary)
    try:
        yield svc
    finally:
        svc.stop()


def _lines(measurement: str, n: int, start: int = 0) -> list[str]:
    return [line(measurement, {"t": "x"}, {"v": i}, 1_796_000_000_000_000_000 + i * 1_000_000)
            for i in range(start, start + n)]


def _read_back(url: str, measurement: str, want: int) -> int:
    """Samples of ``<measurement>_v`` VictoriaMetrics returns, polled until ``want`` or 30 s
    (it makes fresh points searchable after a short delay)."""
    q = urllib.parse.urlencode({"match[]": f'{{__name__="{measurement}_v"}}'})
    deadline = time.monotonic() + 30
    n = 0
    while time.monotonic() < deadline:
        urllib.request.urlopen(f"{url}/internal/force_flush", timeout=10).read()
        with urllib.request.urlopen(f"{url}/api/v1/export?{q}", timeout=10) as r:
            series = [json.loads(x) for x in r.read().splitlines() if x.strip()]
        n = sum(len(set(s["timestamps"])) for s in series)
        if n >= want:
            return n
        time.sleep(0.3)
    return n


def _restart(svc: services.Service) -> None:
    # Same command line: same port and storage directory, as a restarted server would be.
    svc.start()


def test_an_outage_longer_than_the_retries_loses_nothing(vm):
    sink = InfluxSink(vm.url, retries=2, backoff_s=(0.02, 0.1), timeout_s=2.0, batch_lines=10)

    async def go():
        await sink.setup()
        sink.add(_lines("soak_outage", 10))
        await sink.flush()
        assert sink.written == 10
        vm.stop()
        sink.add(_lines("soak_outage", 30, start=10))
        # Past the point where the sink used to give a batch up (retries + 1 tries).
        while sink.retried < sink.retries + 3:
            await asyncio.sleep(0.02)
        assert sink.dropped == 0 and sink.written == 10 and sink.stats["outage"]
        await asyncio.to_thread(_restart, vm)
        await sink.flush()
        await sink.close()

    asyncio.run(go())
    assert sink.written == 40 and sink.dropped == 0 and sink.failed_batches == 0
    assert not sink.stats["outage"]
    assert _read_back(vm.url, "soak_outage", 40) == 40


def test_a_worker_starting_during_an_outage_queues_until_the_server_answers(vm):
    vm.stop()
    sink = InfluxSink(vm.url, retries=1, backoff_s=(0.02, 0.1), timeout_s=2.0)

    async def go():
        await sink.setup()  # does not raise: the server is detected before the first write
        assert sink.version is None
        sink.add(_lines("soak_late", 5))
        while sink.retried < 3:
            await asyncio.sleep(0.02)
        assert sink.written == 0 and sink.dropped == 0
        await asyncio.to_thread(_restart, vm)
        await sink.flush()
        await sink.close()

    asyncio.run(go())
    assert sink.written == 5 and sink.dropped == 0 and sink.version is not None
    assert _read_back(vm.url, "soak_late", 5) == 5


def test_the_queue_is_the_bound_and_what_overflows_is_counted():
    sink = InfluxSink("http://127.0.0.1:9", max_queue=10)  # no writer: nothing drains
    sink.add(_lines("soak_bound", 7))
    sink.add(_lines("soak_bound", 18, start=7))
    assert sink.queued == 10 and sink.dropped == 15


def test_overload_answers_are_retried_and_bad_requests_are_not():
    def err(status):
        e = ServiceError("x")
        if status is not None:
            e.status = status
        return e

    for status in (None, 408, 429, 500, 502, 503, 504):
        assert transient(err(status)), status
    for status in (400, 401, 403, 404, 413, 422):
        assert not transient(err(status)), status
    assert transient(urllib.error.URLError("refused")) and transient(ConnectionResetError())
