"""pulse.progress: a bar on a terminal, silence under --json or when stderr is not a TTY."""

from __future__ import annotations

import io
import os

from pulse.progress import Tracker, enabled, progress


def _tty() -> tuple[io.TextIOWrapper, int]:
    master, slave = os.openpty()
    return io.TextIOWrapper(os.fdopen(slave, "wb", buffering=0), encoding="utf-8", write_through=True), master


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    out = b""
    try:
        while chunk := os.read(fd, 65536):
            out += chunk
    except (BlockingIOError, OSError):
        pass
    return out


def test_quiet_when_not_a_terminal() -> None:
    buf = io.StringIO()
    assert not enabled(stream=buf)
    with progress("work", total=10, stream=buf) as bar:
        assert type(bar) is Tracker and not bar.shown
        for _ in range(10):
            bar.advance()
        bar.update(completed=5, description="x")
    assert buf.getvalue() == ""


def test_quiet_under_json_even_on_a_terminal() -> None:
    stream, master = _tty()
    try:
        assert enabled(stream=stream)
        assert not enabled(json_mode=True, stream=stream)
        with progress("work", total=3, json_mode=True, stream=stream) as bar:
            bar.advance(3)
        stream.flush()
        assert _drain(master) == b""
    finally:
        stream.close()
        os.close(master)


def test_draws_on_a_terminal() -> None:
    stream, master = _tty()
    try:
        with progress("simulating", total=4, stream=stream) as bar:
            assert bar.shown
            for _ in range(4):
                bar.advance()
        stream.flush()
        out = _drain(master)
        assert b"simulating" in out
    finally:
        stream.close()
        os.close(master)


def test_closed_stream_counts_as_not_a_terminal() -> None:
    buf = io.StringIO()
    buf.close()
    assert not enabled(stream=buf)
