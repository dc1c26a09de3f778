"""The on-disk trace directory: what ``pulse sim`` and ``pulse capture`` write and
``pulse diagnose`` reads.

Layout::

    DIR/meta.json                   {"format": "pulse-trace", "v": 1, "job": ..., "epoch_ns": ...}
    DIR/samples/<node>/<nic>.batches  b"PLSTRACE" u32 version, then records [u32 length][batch]
    DIR/hook-events.jsonl           one hook event (comm / flow / op) per line
    DIR/oplevel.jsonl               optional: per-rank operator start/end (baseline input)
    DIR/truth.json                  optional: ground truth, read only by the scorer

Batches inside a NIC file are in ``batch_seq`` order. A record cut short at the end of a
file (a writer that died) is reported by :class:`TraceError` naming the file and offset,
unless the reader is told to ``tolerate_truncation``, in which case it is counted.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from pulse import events as _events
from pulse import samples as _samples
from pulse.errors import DecodeError, TraceError
from pulse.records import OpLevel, decode_oplevel

FILE_MAGIC = b"PLSTRACE"
FILE_VERSION = 1
_FILE_HEAD = struct.Struct("<8sI")
_LEN = struct.Struct("<I")
MAX_RECORD = 1 << 30


class TraceWriter:
    """Writes a trace directory; use as a context manager."""

    def __init__(self, path: str | Path, *, job: str = "", epoch_ns: int | None = None,
                 meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "samples").mkdir(exist_ok=True)
        self._nic_files: dict[tuple[str, str], IO[bytes]] = {}
        self._events = open(self.path / "hook-events.jsonl", "ab")
        self._oplevel: IO[bytes] | None = None
        self._meta = {"format": "pulse-trace", "v": 1, "job": job, "epoch_ns": epoch_ns, **(meta or {})}
        self.batches_written = 0
        self.events_written = 0

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _nic_file(self, node: str, nic: str) -> IO[bytes]:
        key = (node, nic)
        fh = self._nic_files.get(key)
        if fh is None:
            d = self.path / "samples" / node
            d.mkdir(parents=True, exist_ok=True)
            p = d / f"{nic}.batches"
            fresh = not p.exists() or p.stat().st_size == 0
            fh = open(p, "ab")
            if fresh:
                fh.write(_FILE_HEAD.pack(FILE_MAGIC, FILE_VERSION))
            self._nic_files[key] = fh
        return fh

    def write_batch(self, batch: _samples.EpochBatch) -> None:
        raw = _samples.encode(batch)
        fh = self._nic_file(batch.node, batch.nic)
        fh.write(_LEN.pack(len(raw)))
        fh.write(raw)
        self.batches_written += 1

    def write_event(self, event: _events.HookEvent) -> None:
        self._events.write(_events.encode(event) + b"\n")
        self.events_written += 1

    def write_events(self, events: Iterable[_events.HookEvent]) -> None:
        for e in events:
            self.write_event(e)

    def write_oplevel(self, record: OpLevel) -> None:
        if self._oplevel is None:
            self._oplevel = open(self.path / "oplevel.jsonl", "ab")
        self._oplevel.write(record.to_json() + b"\n")

    def write_truth(self, truth: dict[str, Any]) -> None:
        (self.path / "truth.json").write_bytes(orjson.dumps(truth, option=orjson.OPT_INDENT_2))

    def close(self) -> None:
        for fh in self._nic_files.values():
            fh.close()
        self._nic_files.clear()
        self._events.close()
        if self._oplevel is not None:
            self._oplevel.close()
        (self.path / "meta.json").write_bytes(orjson.dumps(self._meta, option=orjson.OPT_INDENT_2))


def read_batch_file(path: str | Path, *, tolerate_truncation: bool = False,
                    stats: dict[str, int] | None = None) -> Iterator[_samples.EpochBatch]:
    """Yield the batches of one NIC file, validating each."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    if len(data) < _FILE_HEAD.size:
        raise TraceError(f"{p}: {len(data)} bytes, too short for a batch file header")
    magic, version = _FILE_HEAD.unpack_from(data, 0)
    if magic != FILE_MAGIC:
        raise TraceError(f"{p}: not a Pulse batch file (magic {magic!r})")
    if version != FILE_VERSION:
        raise TraceError(f"{p}: batch file version {version}, this Pulse reads {FILE_VERSION}")
    mv = memoryview(data)
    off = _FILE_HEAD.size
    while off < len(data):
        if off + 4 > len(data):
            if tolerate_truncation:
                if stats is not None:
                    stats["truncated_records"] = stats.get("truncated_records", 0) + 1
                return
            raise TraceError(f"{p}: truncated record length at offset {off}")
        (n,) = _LEN.unpack_from(data, off)
        if n > MAX_RECORD or off + 4 + n > len(data):
            if tolerate_truncation:
                if stats is not None:
                    stats["truncated_records"] = stats.get("truncated_records", 0) + 1
                return
            raise TraceError(f"{p}: record at offset {off} claims {n} bytes, only {len(data) - off - 4} left")
        try:
            yield _samples.decode(mv[off + 4:off + 4 + n], where=f"{p}@{off}")
        except DecodeError as exc:
            raise TraceError(str(exc)) from None
        off += 4 + n


def _read_jsonl(path: Path, decode: Any) -> Iterator[Any]:
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield decode(line, f"{path}:{lineno}")
            except DecodeError as exc:
                raise TraceError(str(exc)) from None


class TraceReader:
    """Reads a trace directory written by :class:`TraceWriter` (or by hand, same layout)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise TraceError(f"{self.path}: not a directory (expected a Pulse trace directory)")
        if not (self.path / "samples").is_dir() and not (self.path / "hook-events.jsonl").exists():
            raise TraceError(f"{self.path}: no samples/ and no hook-events.jsonl: not a Pulse trace")
        meta_path = self.path / "meta.json"
        self.meta: dict[str, Any] = {}
        if meta_path.exists():
            try:
                self.meta = orjson.loads(meta_path.read_bytes())
            except orjson.JSONDecodeError as exc:
                raise TraceError(f"{meta_path}: not valid JSON ({exc})") from None
            except OSError as exc:
                raise TraceError(f"{meta_path}: cannot read ({exc.strerror})") from None
            if not isinstance(self.meta, dict) or self.meta.get("format") != "pulse-trace":
                raise TraceError(f"{meta_path}: not a pulse-trace meta file")
            if self.meta.get("v") != 1:
                raise TraceError(f"{meta_path}: trace version {self.meta.get('v')!r}, this Pulse reads 1")

    def nic_files(self) -> list[tuple[str, str, Path]]:
        """(node, nic, path) of every batch file, sorted."""
        out = []
        root = self.path / "samples"
        if root.is_dir():
            for p in sorted(root.glob("*/*.batches")):
                out.append((p.parent.name, p.name[: -len(".batches")], p))
        return out

    def batches(self, *, tolerate_truncation: bool = False,
                stats: dict[str, int] | None = None) -> Iterator[_samples.EpochBatch]:
        """Every batch, NIC file by NIC file."""
        for _, _, p in self.nic_files():
            yield from read_batch_file(p, tolerate_truncation=tolerate_truncation, stats=stats)

    def timeline(self) -> tuple[list[_events.HookEvent], Iterator[tuple[int, _events.HookEvent | _samples.EpochBatch]]]:
        """The trace in the order a live source publishes it: the setup events (comm and
        flow events, and op events without an issue time) first, then op events and epoch
        batches merged in trace time: an op event at its ``t_host_ns``, a batch when its
        last epoch ends (the earliest a live source could send it). Yields (time, item)."""
        setup: list[_events.HookEvent] = []
        ops: list[tuple[int, int, Any]] = []
        for i, ev in enumerate(self.events()):
            if isinstance(ev, _events.OpEvent) and ev.t_host_ns is not None:
                ops.append((ev.t_host_ns, i, ev))
            else:
                setup.append(ev)
        ops.sort(key=lambda x: (x[0], x[1]))

        def nic_stream(k: int, path: Path) -> Iterator[tuple[int, int, Any]]:
            for b in read_batch_file(path):
                yield (b.end_ns(), 1 << 40 | k, b)

        streams = [nic_stream(k, p) for k, (_, _, p) in enumerate(self.nic_files())]
        merged = heapq.merge(iter(ops), *streams, key=lambda x: (x[0], x[1]))
        return setup, ((t, item) for t, _, item in merged)

    def events(self) -> Iterator[_events.HookEvent]:
        return _read_jsonl(self.path / "hook-events.jsonl", _events.decode)

    def oplevel(self) -> Iterator[OpLevel]:
        return _read_jsonl(self.path / "oplevel.jsonl", decode_oplevel)

    def has_truth(self) -> bool:
        return (self.path / "truth.json").exists()


def read_truth(path: str | Path) -> dict[str, Any]:
    """Ground truth of a simulated trace. For the scorer and tests only: no segmentation
    or localization code may call this."""
    p = Path(path)
    p = p / "truth.json" if p.is_dir() else p
    try:
        data = orjson.loads(p.read_bytes())
    except FileNotFoundError:
        raise TraceError(f"{p}: no truth.json (only simulated traces have ground truth)") from None
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TraceError(f"{p}: truth must be a JSON object")
    return data
