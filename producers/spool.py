"""A bounded, ordered, on-disk spool of Kafka messages waiting for the broker.

Messages are appended to segment files ``<seq>.spool`` (records ``[u32 topic][u32 key]
[u32 value]`` lengths, then the bytes); the oldest segment is read back, sent, and
unlinked only after the broker confirmed every record in it. The spool survives a
producer restart: a new :class:`Spool` on the same directory picks up where the old one
stopped. When appending would exceed ``max_bytes`` the message is dropped, counted in
``dropped`` and logged once per burst: the bound is the only way anything is lost.

The directory must be private (:mod:`pulse.safefs`: created 0700, refused when another user
could swap files in it); segments are created ``O_EXCL|O_NOFOLLOW``, mode 0600.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from pulse.errors import ConfigError, DecodeError
from pulse.safefs import create_file, open_private_dir

log = logging.getLogger("pulse.producers.spool")

_REC = struct.Struct("<III")
SUFFIX = ".spool"
SEGMENT_BYTES = 4 << 20

Message = tuple[str, bytes, bytes]
"""(topic, key, value)."""


class Spool:
    def __init__(self, directory: str | os.PathLike[str], max_bytes: int, *,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        if max_bytes < 0:
            raise ConfigError(f"spool bound {max_bytes}: must be >= 0")
        self.dir = Path(directory)
        os.close(open_private_dir(self.dir, "spool directory (PULSE_SPOOL_DIR)"))
        self.max_bytes = int(max_bytes)
        self.segment_bytes = int(segment_bytes)
        self.dropped = 0
        self.dropped_bytes = 0
        self.spooled = 0
        self._dropping = False
        self._writer: tuple[int, object] | None = None  # (segment number, open file)
        segs = self.segments()
        self._next = (self._number(segs[-1]) + 1) if segs else 0
        self.bytes = sum(p.stat().st_size for p in segs)

    @staticmethod
    def _number(path: Path) -> int:
        return int(path.name[: -len(SUFFIX)])

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        found = []
        for p in self.dir.glob(f"*{SUFFIX}"):
            stem = p.name[: -len(SUFFIX)]
            if stem.isdigit():
                found.append(p)
        return sorted(found, key=self._number)

    def __len__(self) -> int:
        return len(self.segments())

    @property
    def empty(self) -> bool:
        # Checked per message on the hot path: no directory scan (empty segment files left
        # by a crash count as nothing and are removed when drained).
        return self.bytes == 0

    def append(self, topic: str, key: bytes, value: bytes) -> bool:
        """Spool one message; False (and counted) when the bound would be exceeded."""
        t = topic.encode()
        size = _REC.size + len(t) + len(key) + len(value)
        if self.bytes + size > self.max_bytes:
            self.dropped += 1
            self.dropped_bytes += len(value)
            if not self._dropping:
                log.error("spool %s is full (%d of %d bytes): dropping messages until it drains",
                          self.dir, self.bytes, self.max_bytes)
                self._dropping = True
            return False
        self._dropping = False
        fh = self._open_writer(size)
        fh.write(_REC.pack(len(t), len(key), len(value)) + t + key + value)  # type: ignore[attr-defined]
        fh.flush()  # type: ignore[attr-defined]
        self.bytes += size
        self.spooled += 1
        return True

    def _open_writer(self, size: int) -> object:
        if self._writer is not None:
            num, fh = self._writer
            if fh.tell() + size <= self.segment_bytes or fh.tell() == 0:  # type: ignore[attr-defined]
                return fh
            fh.close()  # type: ignore[attr-defined]
        num = self._next
        self._next += 1
        dfd = open_private_dir(self.dir, "spool directory (PULSE_SPOOL_DIR)", create=False)
        try:
            fd = create_file(dfd, f"{num:016d}{SUFFIX}", append=True)
        except FileExistsError:
            raise ConfigError(f"spool directory {self.dir}: segment {num:016d}{SUFFIX} appeared "
                              "under us (another writer?)") from None
        finally:
            os.close(dfd)
        fh = os.fdopen(fd, "ab")
        self._writer = (num, fh)
        return fh

    def seal(self) -> None:
        """Close the segment being written so it can be drained."""
        if self._writer is not None:
            self._writer[1].close()  # type: ignore[attr-defined]
            self._writer = None

    def oldest(self) -> tuple[Path, list[Message]] | None:
        """The oldest segment and its messages (sealing the writer if it is the only one)."""
        segs = self.segments()
        if not segs:
            self.bytes = 0
            return None
        if self._writer is not None and self._number(segs[0]) == self._writer[0]:
            self.seal()
        return segs[0], list(read_segment(segs[0]))

    def release(self, path: Path) -> None:
        """The segment's messages are confirmed by the broker: forget them."""
        try:
            size = path.stat().st_size
            path.unlink()
        except FileNotFoundError:
            return
        self.bytes = max(0, self.bytes - size)

    def close(self) -> None:
        self.seal()


def read_segment(path: Path) -> Iterator[Message]:
    data = path.read_bytes()
    off = 0
    while off < len(data):
        if off + _REC.size > len(data):
            log.warning("%s: torn record at offset %d (writer died mid-append); ignoring the tail", path, off)
            return
        lt, lk, lv = _REC.unpack_from(data, off)
        end = off + _REC.size + lt + lk + lv
        if end > len(data):
            log.warning("%s: torn record at offset %d (writer died mid-append); ignoring the tail", path, off)
            return
        p = off + _REC.size
        try:
            topic = data[p:p + lt].decode()
        except UnicodeDecodeError:
            raise DecodeError(f"{path}@{off}: spooled topic name is not UTF-8") from None
        yield topic, data[p + lt:p + lt + lk], data[p + lt + lk:end]
        off = end
