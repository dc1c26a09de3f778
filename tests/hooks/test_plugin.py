"""The NCCL profiler plugin, driven through the ABI exactly as NCCL calls it."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.hooks import build_plugin
from pulse.hooks.plugin_reader import (
    DTYPES,
    FUNCS,
    REC_SIZE,
    PluginDecoder,
    iter_records,
    read_plugin_file,
    receive_plugin_socket,
)

from pulse.errors import DecodeError
from pulse.events import CommEvent, FlowEvent, OpEvent

WORLD = "0x5ae77eb5ea4ec1ee"
BASE_RECORDS = 19  # records one harness run produces (see nccl_harness.c), before flooding


def run_harness(harness: Path, lib: Path, version: int, env: dict[str, str], flood: int = 0,
                threads: int = 0) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    full.update(env)
    return subprocess.run([str(harness), str(lib), str(version), str(flood), str(threads)], env=full,
                          capture_output=True, text=True, timeout=60)


def strip(ev):  # drop what differs between runs
    d = ev.to_dict()
    d.pop("t_host_ns", None)
    d.pop("pid", None)
    return d


def expected_events() -> list[dict]:
    base = {"v": 1, "job": "", "node": "nodeA", "source": "nccl-plugin"}
    op = {**base, "type": "op", "comm_id": WORLD, "rank": 1, "nranks": 4}
    return [
        {**base, "type": "comm", "comm_id": WORLD, "rank": 1, "nranks": 4},
        {**base, "type": "comm", "comm_id": "0x42", "rank": 0, "nranks": 2},
        {**op, "seq": 0, "kind": "AllReduce", "count": 1024, "dtype": "float32", "bytes": 4096, "algo": "ring",
         "proto": "simple", "nchannels": 2},
        {**base, "type": "flow", "nic": "mlx5_1", "flow": 0x1234, "comm_id": WORLD, "rank": 1, "peer": 2, "channel": 1,
         "direction": "send", "qpn": 0x1234},
        {**base, "type": "flow", "nic": "mlx5_0", "flow": 0x2222, "comm_id": WORLD, "rank": 1, "peer": 0, "channel": 0,
         "direction": "recv", "qpn": 0x2222},
        # AllGather: NCCL's count is per rank; S is the full array (x nranks)
        {**op, "seq": 1, "kind": "AllGather", "count": 1024, "dtype": "bfloat16", "bytes": 2048, "algo": "tree",
         "proto": "ll128", "nchannels": 1},
        {**op, "seq": 2, "kind": "GroupP2P", "count": 110, "dtype": "int32", "bytes": 440, "nchannels": 2,
         "peers": [0, 2], "peer_send_bytes": [400, 40], "peer_recv_bytes": [0, 200]},
        {**op, "seq": 3, "kind": "Send", "count": 7, "dtype": "float64", "bytes": 56, "nchannels": 2, "peer": 3},
        {**op, "seq": 4, "kind": "Broadcast", "count": 8, "dtype": "uint8", "bytes": 8, "algo": "ring", "proto": "ll",
         "nchannels": 4, "root": 2},
        {**base, "type": "op", "comm_id": "0x42", "rank": 0, "nranks": 2, "seq": 0, "kind": "ReduceScatter",
         "count": 1024, "dtype": "float16", "bytes": 2048, "algo": "ring", "proto": "simple", "nchannels": 2},
        {**base, "type": "comm", "comm_id": "0x77", "rank": 0, "nranks": 1},
        {**base, "type": "op", "comm_id": "0x77", "rank": 0, "nranks": 1, "seq": 0, "kind": "AllReduce", "count": 3,
         "dtype": "int64", "bytes": 24, "algo": "tree", "proto": "simple", "nchannels": 1},
    ]


def normalise(events):
    out = [strip(e) for e in events]
    for d in out:
        d.pop("group", None)  # a process-wide group number: checked separately
    return out


def test_exports_every_version_symbol(plugin_lib: Path) -> None:
    lib = ctypes.CDLL(str(plugin_lib))
    for v in (4, 5, 6):
        table = ctypes.c_void_p.in_dll(lib, f"ncclProfiler_v{v}")  # first member: const char* name
        assert ctypes.string_at(table.value) == b"Pulse"
    with pytest.raises(ValueError):
        ctypes.c_void_p.in_dll(lib, "ncclProfiler_v3")


def test_build_is_cached_and_rebuilt_on_force(tmp_path: Path) -> None:
    first = build_plugin(tmp_path)
    mtime = first.stat().st_mtime_ns
    assert build_plugin(tmp_path) == first and first.stat().st_mtime_ns == mtime
    ino = first.stat().st_ino
    build_plugin(tmp_path, force=True)
    assert first.stat().st_ino != ino  # replaced atomically by a fresh build


@pytest.mark.parametrize("version", [4, 5, 6])
def test_file_sink_records_every_event_kind(plugin_lib: Path, harness: Path, tmp_path: Path, version: int) -> None:
    res = run_harness(harness, plugin_lib, version, {"PULSE_HOOK_DIR": str(tmp_path), "PULSE_NODE": "nodeA"})
    assert res.returncode == 0, res.stderr
    assert "mask=159" in res.stdout  # group|coll|p2p|proxyOp|proxyStep|netPlugin
    files = list(tmp_path.glob("pulse-nccl-nodeA-*.rec"))
    assert len(files) == 1
    events, stats = read_plugin_file(files[0])
    assert normalise(events) == expected_events()
    assert stats["records"] == BASE_RECORDS and stats["proxy_ops"] == 2 and stats["qp_events"] == 2
    assert stats["orphans"] == stats["unsupported"] == stats["plugin_dropped"] == 0
    grouped = [e for e in events if isinstance(e, OpEvent) and e.kind == "GroupP2P"]
    assert grouped[0].group is not None and grouped[0].group > 0
    pids = {e.pid for e in events if isinstance(e, (CommEvent, FlowEvent))}
    assert pids == {int(files[0].stem.rsplit("-", 1)[1])}


@pytest.mark.parametrize("version", [4, 6])
def test_socket_sink_delivers_the_same_events(plugin_lib: Path, harness: Path, tmp_path: Path, version: int) -> None:
    sock = tmp_path / "agent.sock"
    gen = receive_plugin_socket(sock, timeout=0.3)  # bound now; datagrams queue until read
    res = run_harness(harness, plugin_lib, version, {"PULSE_HOOK_SOCKET": str(sock), "PULSE_NODE": "nodeA"})
    assert res.returncode == 0, res.stderr
    # finalize flushed everything before the harness exited: the queue holds all of it
    first = list(gen)
    assert not sock.exists()
    assert normalise(first) == expected_events()


def test_unwritable_directory_disables_quietly(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    afile = tmp_path / "not-a-dir"
    afile.write_text("x")
    for bad in ("/nonexistent/pulse/dir", str(afile)):
        for version in (4, 5, 6):
            res = run_harness(harness, plugin_lib, version, {"PULSE_HOOK_DIR": bad})
            assert res.returncode == 0, res.stderr
            assert "mask=0" in res.stdout and "failures=0" in res.stdout
    assert afile.read_text() == "x"


def test_socket_without_reader_keeps_caller_working(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    for version in (4, 5, 6):
        res = run_harness(harness, plugin_lib, version, {"PULSE_HOOK_SOCKET": str(tmp_path / "nobody.sock")},
                          flood=2000)
        assert res.returncode == 0, res.stderr
        assert "mask=159" in res.stdout and "failures=0" in res.stdout
    long_path = str(tmp_path / ("x" * 200))  # longer than sun_path: plugin disables itself
    res = run_harness(harness, plugin_lib, 5, {"PULSE_HOOK_SOCKET": long_path})
    assert res.returncode == 0 and "mask=0" in res.stdout


def test_full_ring_drops_and_counts(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    flood = 20000
    res = run_harness(harness, plugin_lib, 5, {"PULSE_HOOK_DIR": str(tmp_path), "PULSE_NODE": "nodeA",
                                               "PULSE_NCCL_RING": "64"}, flood=flood)
    assert res.returncode == 0, res.stderr
    (path,) = tmp_path.glob("*.rec")
    dec = PluginDecoder()
    finis = []
    for rec in iter_records(path.read_bytes(), str(path)):
        dec.stats["records"] += 1
        if rec["type"] == "fini":
            finis.append(rec)
    # The last communicator starts after the writer drained and stopped, so its fini is never
    # dropped and carries the process's final drop count: every record is either in the file
    # or counted as dropped.
    assert finis and finis[-1]["comm_id"] == 0x77
    assert dec.stats["records"] + finis[-1]["dropped"] == BASE_RECORDS + flood
    assert path.stat().st_size < (BASE_RECORDS + flood) * REC_SIZE  # bounded: most were dropped


def test_concurrent_producers_lose_nothing_and_keep_order(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    threads, n = 4, 5000
    res = run_harness(harness, plugin_lib, 5, {"PULSE_HOOK_DIR": str(tmp_path), "PULSE_NCCL_RING": str(1 << 16)},
                      flood=n, threads=threads)
    assert res.returncode == 0, res.stderr
    (path,) = tmp_path.glob("*.rec")
    events, stats = read_plugin_file(path)
    assert stats["plugin_dropped"] == 0
    by_comm: dict[str, list[OpEvent]] = {}
    for e in events:
        if isinstance(e, OpEvent):
            by_comm.setdefault(e.comm_id, []).append(e)
    assert sorted(by_comm) == [f"{0x1000 + i:#x}" for i in range(threads)]
    for ops in by_comm.values():  # every record, whole and in issue order per comm
        assert [(o.seq, o.count) for o in ops] == [(i, i) for i in range(n)]


# ------------------------------------------------------------------ reader on its own

_HEAD = np.dtype([("kind", "u1"), ("abi", "u1"), ("flags", "<u2"), ("ctx", "<u4"), ("t_ns", "<u8")])


def hello(host: bytes = b"h1", pid: int = 7) -> bytes:
    rec = np.zeros(1, dtype=np.dtype([*[(n, _HEAD[n]) for n in _HEAD.names], ("magic", "<u4"), ("pid", "<u4"),
                                      ("rec_size", "<u4"), ("format", "<u4"), ("host", "S32")]))
    rec["kind"], rec["magic"], rec["pid"], rec["rec_size"], rec["format"], rec["host"] = 1, 0x31534C50, pid, 64, 1, host
    return rec.tobytes()


def init_rec(ctx: int, comm: int, rank: int, nranks: int) -> bytes:
    rec = np.zeros(1, dtype=np.dtype([*[(n, _HEAD[n]) for n in _HEAD.names], ("comm_id", "<u8"), ("rank", "<i4"),
                                      ("nranks", "<i4"), ("nnodes", "<i4"), ("pid", "<i4"), ("name", "S24")]))
    rec["kind"], rec["ctx"], rec["comm_id"], rec["rank"], rec["nranks"] = 2, ctx, comm, rank, nranks
    return rec.tobytes()


def coll_rec(ctx: int, func: int, dtype: int, count: int, t: int) -> bytes:
    raw = bytearray(64)
    raw[0], raw[1] = 3, 5
    raw[4:8] = ctx.to_bytes(4, "little")
    raw[8:16] = t.to_bytes(8, "little")
    raw[32:40] = count.to_bytes(8, "little")
    raw[44], raw[45], raw[46], raw[47], raw[48] = func, dtype, 1, 2, 2
    return bytes(raw)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.integers(0, 1 << 40)), max_size=40),
       st.integers(1, 64))
def test_reader_coll_records_property(colls, nranks) -> None:
    data = hello() + init_rec(1, 0xABC, nranks - 1, nranks)
    data += b"".join(coll_rec(1, f, d, c, i) for i, (f, d, c) in enumerate(colls))
    dec = PluginDecoder()
    # feed in awkward pieces: records split across calls must decode the same
    events = []
    for i in range(0, len(data), 50):
        events += dec.feed(data[i:i + 50])
    events += dec.flush()
    ops = [e for e in events if isinstance(e, OpEvent)]
    ok = [(i, f, d, c) for i, (f, d, c) in enumerate(colls) if f < 5 and d < len(DTYPES)]
    assert len(ops) == len(ok)
    for op, (i, f, d, c) in zip(ops, ok, strict=True):
        assert op.seq == i  # unsupported ops still take a seq
        assert op.kind == FUNCS[f] and op.dtype == DTYPES[d]
        n = c * (nranks if FUNCS[f] in ("AllGather", "ReduceScatter") else 1)
        assert op.count == n and op.bytes == n * {"int8": 1, "uint8": 1, "float16": 2, "bfloat16": 2, "float32": 4,
                                                   "int32": 4, "uint32": 4, "float64": 8, "int64": 8, "uint64": 8,
                                                   "float8e4m3": 1, "float8e5m2": 1}[DTYPES[d]]
    assert dec.stats["unsupported"] == len(colls) - len(ok)


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=640))
def test_reader_never_crashes_on_garbage(blob) -> None:
    data = hello() + blob[: len(blob) - len(blob) % 64]
    try:
        PluginDecoder().feed(data)
    except DecodeError:
        pass


def test_reader_rejects_bad_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.rec"
    bad.write_bytes(b"\x03" + bytes(63))
    with pytest.raises(DecodeError, match="hello"):
        read_plugin_file(bad)
    with pytest.raises(DecodeError, match="before any hello"):
        list(iter_records(coll_rec(1, 0, 7, 1, 0)))
    wrong = bytearray(hello())
    wrong[16] ^= 0xFF
    with pytest.raises(DecodeError, match="magic"):
        list(iter_records(bytes(wrong)))
    with pytest.raises(DecodeError, match="whole number"):
        list(iter_records(hello()[:40]))
    trunc = tmp_path / "trunc.rec"
    trunc.write_bytes(hello() + init_rec(1, 5, 0, 2) + b"\x03" * 10)
    events, stats = read_plugin_file(trunc)
    assert len(events) == 1 and stats["truncated_bytes"] == 10
    orphan = tmp_path / "orphan.rec"
    orphan.write_bytes(hello() + coll_rec(9, 0, 7, 1, 0) + bytes([200]) + bytes(63))
    events, stats = read_plugin_file(orphan)
    assert events == [] and stats["orphans"] == 1 and stats["unknown"] == 1


def test_cli_build_read_and_torch_path(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from pulse.cli import main
    from pulse.events import decode

    runner = CliRunner()
    res = runner.invoke(main, ["hooks", "build", "--out", str(tmp_path / "lib")])
    assert res.exit_code == 0, res.output
    lib = Path(res.stdout.strip())
    assert lib.name == "libnccl-profiler-pulse.so" and lib.is_file()
    out = tmp_path / "rec"
    out.mkdir()
    assert run_harness(harness, lib, 6, {"PULSE_HOOK_DIR": str(out), "PULSE_NODE": "nodeA"}).returncode == 0
    (rec,) = out.glob("*.rec")
    res = runner.invoke(main, ["hooks", "read-plugin", str(rec), "--json", "--job", "j9"])
    assert res.exit_code == 0, res.output
    events = [decode(x) for x in res.stdout.splitlines()]
    assert normalise([e for e in events]) == [{**d, "job": "j9"} for d in expected_events()]
    res = runner.invoke(main, ["hooks", "read-plugin", str(tmp_path)])
    assert res.exit_code == 1 and "neither a record file nor a socket" in res.output
    res = runner.invoke(main, ["hooks", "torch-path"])
    assert res.exit_code == 0 and (Path(res.stdout.strip()) / "sitecustomize.py").is_file()


def test_cli_read_plugin_socket(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    import sys

    from pulse.events import decode

    sock = tmp_path / "s.sock"
    agent = subprocess.Popen([sys.executable, "-m", "pulse.cli", "hooks", "read-plugin", str(sock), "--json",
                              "--timeout", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(3000):  # wait until the agent has bound its socket
            if sock.exists() or agent.poll() is not None:
                break
            time.sleep(0.01)
        assert sock.exists(), agent.stderr.read() if agent.poll() is not None else "agent did not bind"
        res = run_harness(harness, plugin_lib, 4, {"PULSE_HOOK_SOCKET": str(sock), "PULSE_NODE": "nodeA"})
        assert res.returncode == 0
        out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 0, err
    assert normalise([decode(x) for x in out.splitlines()]) == expected_events()


def test_sanitizers_find_nothing(tmp_path: Path) -> None:
    """The plugin and the harness built with ASan+UBSan: every version, threads, failing sinks."""
    here = Path(__file__).resolve().parent
    from pulse.hooks.build import HERE as hooks_dir
    lib, drv = tmp_path / "lib.so", tmp_path / "drv"
    flags = ["-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]
    try:
        subprocess.run(["cc", *flags, "-fPIC", "-shared", "-pthread", "-std=gnu11", "-I", str(hooks_dir), "-o", str(lib),
                        str(hooks_dir / "nccl_profiler_plugin.c")], check=True, capture_output=True, timeout=120)
        subprocess.run(["cc", *flags, "-o", str(drv), str(here / "nccl_harness.c"), "-ldl", "-pthread"], check=True,
                       capture_output=True, timeout=120)
    except (subprocess.CalledProcessError, FileNotFoundError):
        pytest.skip("no sanitizer runtime for this compiler")
    out = tmp_path / "out"
    out.mkdir()
    env = {"ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1"}
    runs = [(v, {"PULSE_HOOK_DIR": str(out)}, 3000, 0) for v in (4, 5, 6)]
    runs += [(5, {"PULSE_HOOK_DIR": str(out), "PULSE_NCCL_RING": "64"}, 3000, 4),
             (6, {"PULSE_HOOK_SOCKET": str(tmp_path / "none.sock")}, 500, 2),
             (4, {"PULSE_HOOK_DIR": "/nonexistent"}, 100, 0)]
    for version, extra, flood, threads in runs:
        res = run_harness(drv, lib, version, {**env, **extra}, flood=flood, threads=threads)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "runtime error" not in res.stderr and "AddressSanitizer" not in res.stderr, res.stderr[-3000:]


# ------------------------------------------------------------------ file and socket safety

def run_with_planted(harness: Path, lib: Path, plant: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the harness under a shell that first plants ``plant`` (a command where ``$$`` is the
    pid the harness will have: exec keeps it), as an attacker who guesses the pid would."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_")}
    full.update(env)
    return subprocess.run(["bash", "-c", f'{plant} && exec "$0" "$1" 5 0 0', str(harness), str(lib)], env=full,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("planted", ["symlink", "file"])
def test_planted_record_path_is_not_followed(plugin_lib: Path, harness: Path, tmp_path: Path, planted: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: sticky, ours (the test's user), writable by all
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    target = f'{shared}/pulse-nccl-nodeA-$$.rec'
    plant = f'ln -s {victim} "{target}"' if planted == "symlink" else f'echo planted > "{target}"'
    res = run_with_planted(harness, plugin_lib, plant, {"PULSE_HOOK_DIR": str(shared), "PULSE_NODE": "nodeA"})
    assert res.returncode == 0, res.stderr  # the job is unharmed
    assert "mask=0" in res.stdout and "failures=0" in res.stdout
    assert "refusal=record file already exists (not followed) count=1" in res.stdout
    # and said so once through NCCL's logger, at WARN level
    assert res.stdout.count("nccl-log: level=2 Pulse profiler disabled: record file already exists") == 1
    assert victim.read_bytes() == b"precious\n"
    (rec,) = shared.iterdir()
    assert rec.is_symlink() if planted == "symlink" else rec.read_text() == "planted\n"


def test_unsafe_directories_are_refused(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # writable by all, not sticky: anyone may swap our file
    res = run_harness(harness, plugin_lib, 6, {"PULSE_HOOK_DIR": str(open_dir)})
    assert res.returncode == 0 and "mask=0" in res.stdout
    assert "refusal=record directory writable by others count=1" in res.stdout
    link = tmp_path / "link"
    good = tmp_path / "good"
    good.mkdir()
    link.symlink_to(good)  # the directory itself must not be a symlink either
    res = run_harness(harness, plugin_lib, 6, {"PULSE_HOOK_DIR": str(link)})
    assert "mask=0" in res.stdout and "refusal=record directory missing" in res.stdout
    assert list(open_dir.iterdir()) == [] and list(good.iterdir()) == []
    if os.geteuid() == 0:  # a directory of another user (nobody), even one that is private
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        res = run_harness(harness, plugin_lib, 4, {"PULSE_HOOK_DIR": str(theirs)})
        assert "mask=0" in res.stdout and "refusal=record directory owned by another user count=1" in res.stdout
        sticky_theirs = tmp_path / "sticky-theirs"
        sticky_theirs.mkdir()
        sticky_theirs.chmod(0o1777)
        os.chown(sticky_theirs, 65534, 65534)
        res = run_harness(harness, plugin_lib, 4, {"PULSE_HOOK_DIR": str(sticky_theirs)})
        assert "mask=0" in res.stdout and "refusal=record directory owned by another user" in res.stdout


def test_default_directory_is_private(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    res = run_harness(harness, plugin_lib, 5, {"XDG_RUNTIME_DIR": str(runtime), "PULSE_NODE": "nodeA"})
    assert res.returncode == 0 and "mask=159" in res.stdout and "refusal=none" in res.stdout
    d = runtime / "pulse"
    assert d.stat().st_mode & 0o777 == 0o700
    (rec,) = d.glob("pulse-nccl-nodeA-*.rec")
    assert rec.stat().st_mode & 0o777 == 0o600  # communicator and traffic shapes are nobody else's
    events, _ = read_plugin_file(rec)
    assert normalise(events) == expected_events()  # the writer restarted for comm 0x77 appended


def test_socket_in_unsafe_directory_is_refused(plugin_lib: Path, harness: Path, tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    res = run_harness(harness, plugin_lib, 5, {"PULSE_HOOK_SOCKET": str(open_dir / "agent.sock")})
    assert res.returncode == 0 and "mask=0" in res.stdout
    assert "refusal=socket directory unsafe count=1" in res.stdout


def test_socket_is_private_and_keeps_only_allowed_senders(tmp_path: Path) -> None:
    from pulse.hooks.plugin_reader import SenderPolicy

    if os.geteuid() != 0:
        pytest.skip("needs root to send as another uid (setuid to nobody)")
    import socket
    import tempfile

    # Under /tmp (tmp_path's parents are 0700): a private directory nobody may traverse.
    d = Path(tempfile.mkdtemp(prefix="pulse-agent-", dir="/tmp"))
    try:
        d.chmod(0o711)
        sock = d / "agent.sock"
        dec = PluginDecoder()
        gen = receive_plugin_socket(sock, timeout=0.3, decoder=dec, senders=SenderPolicy(uids=(0,)))
        assert sock.stat().st_mode & 0o777 == 0o660
        os.chown(sock, 0, 65534)  # the job's group may connect: the kernel still tells who sent
        forged = hello(b"nodeA", 4242) + init_rec(1, 0xBAD, 0, 2) + coll_rec(1, 0, 7, 1 << 30, 1)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: a local user who found the socket
            try:
                os.setgid(65534)
                os.setuid(65534)
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                s.sendto(forged, str(sock))
                os._exit(0)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0  # it did get through to the socket
        real = hello(b"nodeA", os.getpid()) + init_rec(1, 0x600D, 1, 2)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(real, str(sock))
        events = list(gen)
        assert [e.comm_id for e in events] == ["0x600d"]  # the forged communicator never appears
        assert dec.stats["rejected_senders"] == 1
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


def test_sender_policy_and_socket_directory_rules(tmp_path: Path) -> None:
    from pulse.hooks.plugin_reader import SenderPolicy

    from pulse.errors import ConfigError
    from pulse.settings import Settings

    cg = tmp_path / "job.slice"
    cg.mkdir()
    (cg / "cgroup.procs").write_text(f"{os.getpid()}\n999999999\n")  # one live process, one gone
    policy = SenderPolicy(uids=(), job_cgroup=cg)
    assert policy.allows(os.geteuid()) and not policy.allows(65534)
    default = SenderPolicy.from_settings(Settings())
    assert default.allows(os.geteuid()) and not default.allows(65534)
    assert SenderPolicy.from_settings(Settings(hook_allowed_uids=(65534,))).allows(65534)
    fresh = tmp_path / "made" / "agent.sock"  # a missing directory is created private
    list(receive_plugin_socket(fresh, timeout=0.01))
    assert (tmp_path / "made").stat().st_mode & 0o777 == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(ConfigError, match=r"hook socket directory .*writable by other users"):
        receive_plugin_socket(open_dir / "agent.sock", timeout=0.01)
    link = tmp_path / "link.sock"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        receive_plugin_socket(link, timeout=0.01)
