"""Follow a growing text file like ``tail -F``, in batches of complete lines."""

from __future__ import annotations

import codecs
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path


def follow_lines(path: str | os.PathLike[str], *, poll: float = 0.2, idle_timeout: float | None = None,
                 from_start: bool = True) -> Iterator[list[str]]:
    """Yield the complete lines appended to ``path``, batch by batch. A file that is
    truncated or replaced (rotation) is read again from its start; a missing file is waited
    for. Stops after ``idle_timeout`` seconds without new data (never when None), then
    yields the unterminated last line, if any."""
    p = Path(path)
    try:
        if stat.S_ISFIFO(os.stat(p).st_mode):
            yield from _follow_fifo(p, poll=poll, idle_timeout=idle_timeout)
            return
    except FileNotFoundError:
        pass
    fh = None
    ino = None
    partial = ""
    last = time.monotonic()
    try:
        while True:
            if fh is None:
                try:
                    fh = open(p, encoding="utf-8", errors="replace")
                    ino = os.fstat(fh.fileno()).st_ino
                    if not from_start:
                        fh.seek(0, os.SEEK_END)
                except FileNotFoundError:
                    fh = None
            chunk = fh.read(1 << 20) if fh is not None else ""
            if chunk:
                last = time.monotonic()
                lines = (partial + chunk).split("\n")
                partial = lines.pop()
                if lines:
                    yield lines
                continue
            try:
                st = os.stat(p)
                if fh is not None and (st.st_ino != ino or st.st_size < fh.tell()):
                    fh.close()
                    # The rest of an unterminated line is lost with the old file: do not glue
                    # it to the new file's first line.
                    fh, partial, from_start = None, "", True
                    continue
            except FileNotFoundError:
                pass
            if idle_timeout is not None and time.monotonic() - last >= idle_timeout:
                break
            time.sleep(poll)
    finally:
        if fh is not None:
            fh.close()
    if partial:
        yield [partial]


def _follow_fifo(p: Path, *, poll: float, idle_timeout: float | None) -> Iterator[list[str]]:
    """A FIFO has no size and blocks an ordinary open or read until a writer comes: read it
    without blocking so that ``idle_timeout`` holds whether or not anyone writes."""
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    partial = ""
    last = time.monotonic()
    try:
        while True:
            try:
                data = os.read(fd, 1 << 20)
            except BlockingIOError:
                data = b""
            if data:
                last = time.monotonic()
                lines = (partial + dec.decode(data)).split("\n")
                partial = lines.pop()
                if lines:
                    yield lines
                continue
            if idle_timeout is not None and time.monotonic() - last >= idle_timeout:
                break
            time.sleep(poll)
    finally:
        os.close(fd)
    partial += dec.decode(b"", final=True)
    if partial:
        yield [partial]
