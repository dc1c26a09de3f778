"""A fuzz harness over the whole ``pulse`` command line (issue #22).

Every command and option is found by walking the click tree, so a new option is covered
(or fails :func:`test_every_numeric_and_path_parameter_is_validated`) without editing
this file. For each numeric option, hypothesis draws bad values (nan, inf, out of range,
not a number); for each path parameter, a matrix of path kinds it must refuse (missing,
wrong kind, FIFO, /dev/zero, symlink loop, too long, under a regular file, in /proc,
not empty). Each case must end with exit 2 (usage) or 1 (PulseError), exactly one error
line naming the parameter, no traceback, within a deadline (a hang detector, not a speed
assertion), and nothing left behind in the working directory.

Commands run in process (click's CliRunner): a refused value is refused while parsing,
before a command's work starts, so no case runs a broker, a simulation or a capture.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pulse.cli import main
from pulse.cli_types import InDir, InFile, KeepDir, Number, OutDir, OutFile

DEADLINE_S = 60
"""A case still running after this is a hang (a FIFO read, a socket wait)."""

# Path parameters that are not checked at parse time, and why.
UNCHECKED_PATHS = {
    ("broker", "log_path"): "the broker's own log, opened for append by the broker binary",
    ("worker", "health_file"): "rewritten by the worker on every heartbeat; --health reads it",
    ("hooks read-plugin", "path"): "a record file or a socket to bind: check_socket_path in the command",
    ("produce plugin", "path"): "a directory of record files or a socket to bind: check_socket_path",
    ("agent", "hook_dir"): "followed: it may appear, vanish and come back while the agent runs",
    ("agent", "plugin_socket"): "a socket to bind: check_socket_path in the command",
}


def _leaves(cmd: click.Command, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        yield path, cmd  # a group's own options (produce --partitions ...)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            yield from _leaves(sub, (*path, name))
    else:
        yield path, cmd


COMMANDS = list(_leaves(main, ()))


def _params(kinds: tuple[type, ...]) -> list[tuple[tuple[str, ...], click.Parameter]]:
    out = []
    for path, cmd in COMMANDS:
        for p in cmd.params:
            if isinstance(p.type, kinds):
                out.append((path, p))
    return out


NUMERIC = _params((Number, click.IntRange, click.FloatRange))
PATHS = _params((InFile, InDir, OutDir, OutFile))


def _id(case: tuple[tuple[str, ...], click.Parameter]) -> str:
    return " ".join(case[0]) + " " + (case[1].opts[0] if case[1].opts else str(case[1].name))


def _argv(path: tuple[str, ...], p: click.Parameter, value: str) -> list[str]:
    """The bad value first, so it is the first parameter processed."""
    if isinstance(p, click.Argument):
        return [*path, "--", value] if value.startswith("-") else [*path, value]
    return [*path, f"{p.opts[0]}={value}"] if value.startswith("-") else [*path, p.opts[0], value]


@contextlib.contextmanager
def _deadline(seconds: int) -> Iterator[None]:
    def fire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a hang")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _check(res: Result, name: str) -> None:
    out = res.output
    assert "Traceback" not in out, out
    assert res.exception is None or isinstance(res.exception, SystemExit), (res.exception, out)
    assert res.exit_code in (1, 2), (res.exit_code, out, res.exception)
    errors = [line for line in out.splitlines() if line.startswith(("Error:", "error:"))]
    assert len(errors) == 1, out
    assert name in errors[0], (name, errors[0])


def _run(argv: list[str], cwd: Path) -> Result:
    before = _listing(cwd)
    old = Path.cwd()
    os.chdir(cwd)
    try:
        with _deadline(DEADLINE_S):
            # A broker address that is never dialled: a group's own checks (produce needs a
            # broker) pass, so the subcommand's parameters are what is judged.
            res = CliRunner(env={"PULSE_BROKER": "127.0.0.1:9"}).invoke(main, argv, catch_exceptions=True)
    finally:
        os.chdir(old)
    assert _listing(cwd) == before, f"{argv} left {sorted(_listing(cwd) - before)} behind"
    return res


# ---- numbers ---------------------------------------------------------------------------

def _bad_numbers(t: click.ParamType) -> st.SearchStrategy[str]:
    lo = getattr(t, "lo", getattr(t, "min", None))
    hi = getattr(t, "hi", getattr(t, "max", None))
    is_int = getattr(t, "kind", None) is int or isinstance(t, click.IntRange)
    words = st.sampled_from(["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e309", "abc", "", "0x10", "1,5"])
    out: list[st.SearchStrategy[str]] = [words]
    if is_int:
        out.append(st.integers(-(2**20), 2**20).map(lambda k: f"{k}.5"))
    if hi is not None:
        out.append(st.integers(min_value=math.floor(hi) + 1, max_value=2**80).map(str))
        if not is_int:
            out.append(st.floats(min_value=float(hi), exclude_min=True, allow_infinity=False).map(repr))
    if lo is not None:
        out.append(st.integers(min_value=-(2**80), max_value=math.ceil(lo) - 1).map(str))
        if getattr(t, "lo_open", False):
            out.append(st.just(str(int(lo)) if is_int else repr(float(lo))))
    return st.one_of(*out)


@pytest.mark.parametrize("case", NUMERIC, ids=_id)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bad_numbers_are_usage_errors(case: tuple[tuple[str, ...], click.Parameter], data: st.DataObject,
                                      tmp_path: Path) -> None:
    path, p = case
    value = data.draw(_bad_numbers(p.type), label="value")
    res = _run(_argv(path, p, value), tmp_path)
    _check(res, p.opts[0])
    assert res.exit_code == 2


# ---- paths -----------------------------------------------------------------------------

def _kinds(t: click.ParamType) -> list[str]:
    """The path kinds this type must refuse."""
    common = ["loop", "too-long", "under-file"]
    if isinstance(t, InFile):  # a follower may wait for its file, and read a FIFO
        return [*common, "dir", "dev-zero", "socket"] + ([] if t.allow_fifo else ["fifo"]) \
            + ([] if t.allow_missing else ["missing"])
    if isinstance(t, InDir):
        return [*common, "missing", "file", "fifo", "dev-zero"]
    if isinstance(t, KeepDir):
        return [*common, "file", "fifo", "dev-zero", "proc"]
    if isinstance(t, OutDir):
        return [*common, "file", "fifo", "dev-zero", "proc", "not-empty"]
    if isinstance(t, OutFile):
        return [*common, "dir", "fifo", "dev-zero", "proc", "exists"]
    raise AssertionError(t)


def _make(kind: str, root: Path) -> str:
    """A path of ``kind``, created under ``root`` where it needs a file."""
    import socket as _socket

    if kind == "missing":
        return str(root / "nope" / "missing")
    if kind in ("file", "exists"):
        (root / "f").write_bytes(b"x")
        return str(root / "f")
    if kind == "dir":
        (root / "d").mkdir()
        return str(root / "d")
    if kind == "not-empty":
        (root / "full").mkdir()
        (root / "full" / "notes.txt").write_text("mine")
        return str(root / "full")
    if kind == "fifo":
        os.mkfifo(root / "fifo")
        return str(root / "fifo")
    if kind == "socket":
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
        s.bind(str(root / "sock"))
        s.close()
        return str(root / "sock")
    if kind == "dev-zero":
        return "/dev/zero"
    if kind == "loop":
        os.symlink("loop", root / "loop")
        return str(root / "loop")
    if kind == "too-long":
        return str(root / ("a" * 300))
    if kind == "under-file":
        (root / "plain").write_bytes(b"x")
        return str(root / "plain" / "x")
    if kind == "proc":
        return "/proc/pulse-fuzz/out"
    raise AssertionError(kind)


PATH_CASES = [(c, k) for c in PATHS for k in _kinds(c[1].type)]


@pytest.mark.parametrize(("case", "kind"), PATH_CASES, ids=[f"{_id(c)}-{k}" for c, k in PATH_CASES])
def test_bad_paths_are_refused_in_one_line(case: tuple[tuple[str, ...], click.Parameter], kind: str,
                                           tmp_path: Path) -> None:
    path, p = case
    work = tmp_path / "work"
    work.mkdir()
    value = _make(kind, work)
    name = p.opts[0] if isinstance(p, click.Option) else str(p.name).upper()
    res = _run(_argv(path, p, value), work)
    _check(res, name)


# ---- coverage of the harness -----------------------------------------------------------

def test_every_numeric_and_path_parameter_is_validated() -> None:
    """No numeric option left as a plain int/float (nan, inf, 1e30 would reach the code),
    no path parameter left unchecked unless listed with its reason."""
    loose = []
    for path, cmd in COMMANDS:
        for p in cmd.params:
            where = (" ".join(path), str(p.name))
            t = p.type
            if isinstance(t, (click.types.IntParamType, click.types.FloatParamType)) and not isinstance(
                    t, (Number, click.IntRange, click.FloatRange)):
                loose.append(where)
            elif isinstance(t, click.FloatRange) and (t.min is None or t.max is None):
                loose.append(where)  # click's FloatRange lets inf through an open side
            elif isinstance(t, (click.Path, click.File)) and where not in UNCHECKED_PATHS:
                loose.append(where)
    assert not loose
    assert len(NUMERIC) >= 60 and len(PATH_CASES) >= 80


def test_harness_detects_what_it_claims(tmp_path: Path) -> None:
    """The checks fail on the failures they look for (a harness that cannot fail is no test)."""
    @click.command()
    @click.option("--n", type=float)
    def loose(n: float) -> None:
        raise ValueError(f"cannot use {n}")
    res = CliRunner().invoke(loose, ["--n", "nan"])
    with pytest.raises(AssertionError):
        _check(res, "--n")
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    with pytest.raises(TimeoutError), _deadline(1):
        open(fifo, "rb").read()


def test_read_plugin_never_binds_at_a_mistyped_file(tmp_path: Path) -> None:
    for argv in (["hooks", "read-plugin", str(tmp_path / "pulse-nccl-host-1.rec")],
                 ["produce", "plugin", str(tmp_path / "pulse-nccl-host-1.rec")],
                 ["hooks", "read-plugin", str(tmp_path / ("s" * 120))],
                 ["hooks", "read-plugin", "/dev/zero"]):
        res = _run(argv, tmp_path)
        _check(res, argv[-1][:20])
        assert res.exit_code == 1


def test_parse_log_follows_a_fifo_until_idle(tmp_path: Path) -> None:
    fifo = tmp_path / "log"
    os.mkfifo(fifo)
    res = _run(["hooks", "parse-log", "--follow", "--idle-exit", "0.3", str(fifo)], tmp_path)
    assert res.exit_code == 0 and "no events" in res.output
    res = _run(["hooks", "parse-log", str(fifo)], tmp_path)  # not a follower: refused, no hang
    _check(res, "log")


def test_outputs_are_never_appended_to(tmp_path: Path) -> None:
    """sim into a non-empty directory refuses; --force replaces a trace, never appends."""
    args = ["sim", "--nodes", "4", "--pp", "1", "--gpus-per-node", "1", "--nics-per-node", "1", "--steps", "2",
            "--out", str(tmp_path / "t")]
    assert CliRunner().invoke(main, args).exit_code == 0
    files = {p: p.stat().st_size for p in (tmp_path / "t").rglob("*") if p.is_file()}
    res = _run(args, tmp_path)
    _check(res, "--out")
    assert "not empty" in res.output
    res = CliRunner().invoke(main, [*args, "--force"])
    assert res.exit_code == 0, res.output
    assert {p: p.stat().st_size for p in (tmp_path / "t").rglob("*") if p.is_file()} == files


# ---- damaged trace directories ------------------------------------------------------------

def _trace(root: Path) -> Path:
    """A tiny valid trace to damage: one NIC file, one event, meta.json."""
    import numpy as np

    from pulse.events import CommEvent
    from pulse.samples import EpochBatch
    from pulse.trace import TraceWriter
    t = root / "trace"
    with TraceWriter(t, job="j", epoch_ns=32_000) as w:
        w.write_batch(EpochBatch(node="node-00", nic="mlx5_0", job="j", t0_ns=1_000_000_000, epoch_ns=32_000,
                                 batch_seq=0, flow=np.zeros(1, np.uint32), epoch=np.zeros(1, np.uint32),
                                 tx_bytes=np.full(1, 100, np.uint32)))
        w.write_event(CommEvent(job="j", node="node-00", pid=1, comm_id="c1", rank=0, nranks=1))
    return t


def _meta(t: Path, **kw: object) -> None:
    import orjson
    m = orjson.loads((t / "meta.json").read_bytes())
    (t / "meta.json").write_bytes(orjson.dumps({**m, **kw}))


def _replace_with_fifo(p: Path) -> None:
    p.unlink()
    os.mkfifo(p)


TRACE_DAMAGE = {
    "batches-fifo": lambda t: _replace_with_fifo(t / "samples" / "node-00" / "mlx5_0.batches"),
    "events-fifo": lambda t: _replace_with_fifo(t / "hook-events.jsonl"),
    "meta-fifo": lambda t: _replace_with_fifo(t / "meta.json"),
    "batches-dev-zero": lambda t: ((t / "samples" / "node-00" / "mlx5_0.batches").unlink(),
                                   os.symlink("/dev/zero", t / "samples" / "node-00" / "mlx5_0.batches")),
    "samples-a-file": lambda t: (__import__("shutil").rmtree(t / "samples"), (t / "samples").write_bytes(b"x")),
    "samples-link-to-self": lambda t: (__import__("shutil").rmtree(t / "samples"), os.symlink(".", t / "samples")),
    "epoch-ns-text": lambda t: _meta(t, epoch_ns="abc"),
    "epoch-ns-negative": lambda t: _meta(t, epoch_ns=-5),
    "epoch-ns-huge": lambda t: _meta(t, epoch_ns=1e30),
    "job-not-text": lambda t: _meta(t, job=5),
    "job-a-path": lambda t: _meta(t, job="../../etc"),
    "meta-not-json": lambda t: (t / "meta.json").write_bytes(b"{nope"),
}


@pytest.mark.parametrize("command", ["diagnose", "report"])
@pytest.mark.parametrize("damage", sorted(TRACE_DAMAGE))
def test_damaged_trace_directories_are_refused_in_one_line(tmp_path: Path, damage: str, command: str) -> None:
    t = _trace(tmp_path)
    TRACE_DAMAGE[damage](t)
    res = _run([command, str(t)], tmp_path)
    _check(res, str(t))
    assert res.exit_code == 1
