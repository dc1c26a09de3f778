"""`pulse agent` as a process on the real embedded broker: sources that go away and come back
are picked up without a restart, its health on the pipeline topic, SIGTERM flushes (through
the spool when the broker is away) and exits 0."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from pulse.producers.spool import Spool

from pulse.events import CommEvent, OpEvent, decode_many, encode
from pulse.settings import Settings

PULSE = str(Path(sys.executable).with_name("pulse"))


def _settings(broker: str, tmp: Path) -> Settings:
    return Settings(broker=broker, topic_prefix="t" + uuid.uuid4().hex[:10], partitions=2, spool_dir=tmp / "spool")


def _start(s: Settings, tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PULSE_BROKER=s.broker or "", PULSE_TOPIC_PREFIX=s.topic_prefix,
               PULSE_PARTITIONS=str(s.partitions), PULSE_SPOOL_DIR=str(s.spool_dir))
    log = open(tmp / f"agent-{time.monotonic_ns()}.log", "wb")
    return subprocess.Popen([PULSE, "agent", "--no-rdma", "--health-s", "0.3", *args], stdout=subprocess.PIPE,
                            stderr=log, env=env)


def _read(s: Settings, topic: str) -> list[bytes]:
    from pulse.streams.app import read_back

    return [m.value for m in asyncio.run(read_back(s.broker or "", topic, timeout_s=10))]


def _events(s: Settings) -> list:
    return [e for v in _read(s, s.topics.hook_events) for e in decode_many(v)]


def _health(s: Settings, node: str) -> list[dict]:
    recs = [orjson.loads(v) for v in _read(s, s.topics.pipeline)]
    return [r for r in recs if r.get("agent") == node]


def _wait(what: str, cond: Callable[[], object], timeout_s: float = 60.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _torch_lines(node: str, job: str, pid: int, n_ops: int) -> bytes:
    cid = "torch:" + uuid.uuid4().hex[:16]
    evs = [CommEvent(job=job, node=node, comm_id=cid, rank=0, nranks=2, pid=pid, source="torch")]
    evs += [OpEvent(job=job, node=node, comm_id=cid, rank=0, seq=i, kind="AllReduce", count=256, dtype="float32",
                    bytes=1024, nranks=2, t_host_ns=time.time_ns(), source="torch") for i in range(n_ops)]
    return b"".join(encode(e) + b"\n" for e in evs)


def _stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_hook_directory_that_goes_away_and_comes_back(broker: str, tmp_path: Path) -> None:
    s = _settings(broker, tmp_path)
    hooks = tmp_path / "hooks"  # absent when the agent starts
    proc = _start(s, tmp_path, "--node", "n1", "--hook-dir", str(hooks))
    try:
        _wait("a first health record", lambda: _health(s, "n1"))
        hooks.mkdir()
        (hooks / "torch-n1-101.jsonl").write_bytes(_torch_lines("n1", "job-a", 101, 5))
        (hooks / "torch-n2-102.jsonl").write_bytes(_torch_lines("n2", "job-a", 102, 5))  # another node's
        (hooks / "oplevel-n1-101.jsonl").write_bytes(b"not a hook file\n")
        _wait("job a's events", lambda: len([e for e in _events(s) if e.job == "job-a"]) == 6)
        # the job ends, its directory goes; a later job writes a new one
        shutil.rmtree(hooks)
        _wait("the agent letting go of the files",
              lambda: (_health(s, "n1")[-1]["sources"]["hook-dir"]["files"] == 0))
        hooks.mkdir()
        with open(hooks / "torch-n1-201.jsonl", "wb") as fh:
            fh.write(_torch_lines("n1", "job-b", 201, 3))
            fh.flush()
            _wait("job b's events", lambda: len([e for e in _events(s) if e.job == "job-b"]) == 4)
            fh.write(_torch_lines("n1", "job-b", 201, 2))  # appended while it is followed
        _wait("job b's appended events", lambda: len([e for e in _events(s) if e.job == "job-b"]) == 7)
        assert proc.poll() is None  # never restarted
        last = _health(s, "n1")[-1]
        assert last["sources"]["hook-dir"]["other_nodes"] == 6
        assert last["sources_seen"] == ["hook-dir"]
        assert last["node"] == "n1" and last["drops"] == {"capture_kernel": 0, "spool": 0, "join_buffer": 0}
    finally:
        rc = _stop(proc)
    assert rc == 0
    assert {e.node for e in _events(s)} == {"n1"}


def test_sigterm_flushes_to_the_spool_and_exits_0(tmp_path: Path) -> None:
    # No broker answers: every event must end in the spool, none lost, and exit 0.
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{sk.getsockname()[1]}"
    s = _settings(dead, tmp_path)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    proc = _start(s, tmp_path, "--node", "n1", "--hook-dir", str(hooks), "--json")
    _wait("a health record in the spool", lambda: Spool(s.spool_dir, 1 << 30).bytes > 0)
    (hooks / "torch-n1-7.jsonl").write_bytes(_torch_lines("n1", "j", 7, 500))
    time.sleep(0.3)
    rc = _stop(proc)
    assert rc == 0
    assert proc.stdout is not None
    final = orjson.loads(proc.stdout.read())
    assert final["published"]["events"] == 501
    spool = Spool(s.spool_dir, 1 << 30)
    events, health = [], 0
    while (head := spool.oldest()) is not None:
        path, messages = head
        for topic, _key, value in messages:
            if topic == s.topics.hook_events:
                events += decode_many(value)
            elif topic == s.topics.pipeline:
                health += 1
        spool.release(path)
    assert len(events) == 501 and [e.seq for e in events if isinstance(e, OpEvent)] == list(range(500))
    assert health >= 1 and final["publisher"]["dropped"] == 0


def test_sigterm_with_the_broker_up_delivers_everything(broker: str, tmp_path: Path) -> None:
    s = _settings(broker, tmp_path)
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    proc = _start(s, tmp_path, "--node", "n1", "--hook-dir", str(hooks))
    _wait("a first health record", lambda: _health(s, "n1"))
    (hooks / "torch-n1-7.jsonl").write_bytes(_torch_lines("n1", "j", 7, 2000))
    assert _stop(proc) == 0
    assert len(_events(s)) == 2001
    assert _health(s, "n1")[-1]["final"] is True
    assert not Spool(s.spool_dir, 1 << 30).segments() or Spool(s.spool_dir, 1 << 30).empty


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and raw capture need root")
def test_capture_interface_that_goes_away_and_comes_back(broker: str, tmp_path: Path) -> None:
    ns, peer_ns = f"pagt-{os.getpid()}", f"pagt-{os.getpid()}-p"
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True)  # noqa: E731

    def make_link() -> None:
        run("ip", "netns", "exec", ns, "ip", "link", "add", "pa0", "type", "veth", "peer", "name", "pa1",
            "netns", peer_ns)
        for where, dev, addr in ((ns, "pa0", "10.233.0.1"), (peer_ns, "pa1", "10.233.0.2")):
            run("ip", "netns", "exec", where, "ip", "addr", "add", f"{addr}/24", "dev", dev)
            run("ip", "netns", "exec", where, "ip", "link", "set", dev, "up")

    def traffic() -> None:  # a TCP connection from the peer namespace to pa0's address
        server = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c",
                                   "import socket\ns=socket.socket();s.bind(('10.233.0.1',7000));s.listen(1)\n"
                                   "print('up',flush=True);c,_=s.accept()\nwhile c.recv(65536):pass"],
                                  stdout=subprocess.PIPE)
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == b"up"
            subprocess.run(["ip", "netns", "exec", peer_ns, sys.executable, "-c",
                            "import socket\nc=socket.create_connection(('10.233.0.1',7000),timeout=10)\n"
                            "c.sendall(b'x'*200000);c.close()"], check=True, timeout=30)
            server.wait(timeout=30)
        finally:
            if server.poll() is None:
                server.kill()

    def packets() -> int:
        h = _health(s, "n1")
        return int(h[-1]["sources"]["capture"].get("packets", 0)) if h else 0

    s = _settings(broker, tmp_path)
    run("ip", "netns", "add", ns)
    run("ip", "netns", "add", peer_ns)
    proc = None
    try:
        make_link()
        proc = _start(s, tmp_path, "--node", "n1", "--netns", ns, "--iface", "pa0", "--local", "10.233.0.1")
        _wait("the capture up", lambda: (_health(s, "n1") or [{}])[-1].get("sources", {}).get("capture", {})
              .get("state") == "up")
        traffic()
        first = _wait("captured packets", packets)
        run("ip", "netns", "exec", ns, "ip", "link", "del", "pa0")
        _wait("the capture noticing", lambda: _health(s, "n1")[-1]["sources"]["capture"]["state"] == "down")
        make_link()
        _wait("the capture back", lambda: _health(s, "n1")[-1]["sources"]["capture"]["restarts"] >= 1
              and _health(s, "n1")[-1]["sources"]["capture"]["state"] == "up")
        traffic()
        _wait("packets on the new interface", lambda: packets() > int(first))  # type: ignore[call-overload]
        assert proc.poll() is None
        last = _health(s, "n1")[-1]
        # TCP that no job owns is counted, not published
        assert last["join"]["tcp_flows"] >= 2 and last["join"]["unbound_tcp_rows"] > 0
    finally:
        if proc is not None:
            assert _stop(proc) == 0
        for n in (ns, peer_ns):
            subprocess.run(["ip", "netns", "del", n], capture_output=True)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    p = subprocess.run([PULSE, "agent", "--hook-dir", str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].startswith("error: no broker")
    p = subprocess.run([PULSE, "agent", "--no-rdma", "--broker", "127.0.0.1:1"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 1 and "nothing to do" in p.stderr
    p = subprocess.run([PULSE, "agent", "--broker", "127.0.0.1:1", "--iface", "no-such-if0", "--no-rdma"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 1 and "no address found" in p.stderr
    p = subprocess.run([PULSE, "agent", "--bogus"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 2
