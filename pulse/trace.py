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

meta.json is written first with ``"complete": false`` and replaced atomically by the final
one at a clean close, so a trace whose writer was killed says so (:attr:`TraceReader.complete`);
a writer never appends to an existing trace. Every file the reader opens must be a regular
file (a FIFO would block it, /dev/zero never ends), and a batch must belong to the NIC its
path names.
"""

from __future__ import annotations

import heapq
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import orjson

from pulse import events as _events
from pulse import samples as _samples
from pulse.errors import DecodeError, EncodeError, TraceError
from pulse.records import OpLevel, decode_oplevel
from pulse.settings import MAX_EPOCH_NS, MIN_EPOCH_NS

FILE_MAGIC = b"PLSTRACE"
FILE_VERSION = 1
_FILE_HEAD = struct.Struct("<8sI")
_LEN = struct.Struct("<I")
MAX_RECORD = 1 << 30
MAX_META = 1 << 20


TRACE_ENTRIES = ("meta.json", "samples", "hook-events.jsonl", "oplevel.jsonl", "truth.json")
"""What a :class:`TraceWriter` puts in its directory (and all that ``replace`` removes)."""


def _truth_pieces(truth: dict[str, Any], key: str, columns: dict[str, Callable[[], Any]]) -> Iterator[bytes]:
    opt = orjson.OPT_INDENT_2
    head = orjson.dumps({**truth, key: {}}, option=opt)
    tail = b"{}\n}"
    if not head.endswith(tail) or not columns:
        yield orjson.dumps({**truth, key: {name: make() for name, make in columns.items()}}, option=opt)
        return
    yield head[:-len(tail)] + b"{\n"
    for i, (name, make) in enumerate(columns.items()):
        # a column nested two levels down: orjson's own layout, indented by 4 more spaces
        body = orjson.dumps(make(), option=opt).replace(b"\n", b"\n    ")
        yield b"    " + orjson.dumps(name) + b": " + body + (b",\n" if i < len(columns) - 1 else b"\n")
    yield b"  }\n}"


def _write_atomic(path: Path, data: bytes | Iterable[bytes]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        for piece in [data] if isinstance(data, bytes) else data:
            fh.write(piece)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def remove_trace(path: str | Path) -> None:
    """Remove what a :class:`TraceWriter` wrote into ``path`` (nothing else)."""
    import shutil

    p = Path(path)
    for name in TRACE_ENTRIES:
        q = p / name
        if q.is_dir() and not q.is_symlink():
            shutil.rmtree(q)
        elif q.exists() or q.is_symlink():
            q.unlink()


class TraceWriter:
    """Writes a trace directory; use as a context manager.

    Crash-safe: meta.json is written first, marked ``"complete": false``, and replaced
    atomically by the final one (``"complete": true``) only when the writer closes cleanly;
    records are length-prefixed and :meth:`flush` (at each window boundary of a live
    capture) pushes them to disk, so a writer killed at any point leaves a readable prefix
    that says it is one. A writer leaving by an exception keeps the ``complete: false``
    marker and records the error. It never appends to an existing trace: ``replace``
    removes one first, otherwise a directory holding a trace is refused."""

    def __init__(self, path: str | Path, *, job: str = "", epoch_ns: int | None = None,
                 meta: dict[str, Any] | None = None, replace: bool = False) -> None:
        self.path = Path(path)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TraceError(f"{self.path}: cannot create the trace directory ({exc.strerror})") from None
        present = [n for n in TRACE_ENTRIES if (self.path / n).exists() or (self.path / n).is_symlink()]
        if present:
            if not replace:
                raise TraceError(f"{self.path}: already holds a trace ({present[0]}); refusing to append to it")
            remove_trace(self.path)
        self._meta = {"format": "pulse-trace", "v": 1, "job": job, "epoch_ns": epoch_ns, **(meta or {})}
        _write_atomic(self.path / "meta.json", orjson.dumps({**self._meta, "complete": False},
                                                            option=orjson.OPT_INDENT_2))
        (self.path / "samples").mkdir(exist_ok=True)
        self._nic_files: dict[tuple[str, str], IO[bytes]] = {}
        self._events = open(self.path / "hook-events.jsonl", "xb")
        self._oplevel: IO[bytes] | None = None
        self.batches_written = 0
        self.events_written = 0
        self.closed = False

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc_type is None or issubclass(exc_type, KeyboardInterrupt):
            self.close()
        else:
            self.close(error=f"{exc_type.__name__}: {exc}")

    def _nic_file(self, node: str, nic: str) -> IO[bytes]:
        key = (node, nic)
        fh = self._nic_files.get(key)
        if fh is None:
            d = self.path / "samples" / node
            d.mkdir(parents=True, exist_ok=True)
            fh = open(d / f"{nic}.batches", "xb")
            fh.write(_FILE_HEAD.pack(FILE_MAGIC, FILE_VERSION))
            self._nic_files[key] = fh
        return fh

    def write_batch(self, batch: _samples.EpochBatch) -> None:
        raw = _samples.encode(batch)
        fh = self._nic_file(batch.node, batch.nic)
        fh.write(_LEN.pack(len(raw)) + raw)  # one write: a record and its length go together
        self.batches_written += 1

    def write_event(self, event: _events.HookEvent) -> None:
        self._events.write(_events.encode(event) + b"\n")
        self.events_written += 1

    def write_events(self, events: Iterable[_events.HookEvent]) -> None:
        for e in events:
            self.write_event(e)

    def write_oplevel(self, record: OpLevel) -> None:
        if self._oplevel is None:
            self._oplevel = open(self.path / "oplevel.jsonl", "xb")
        self._oplevel.write(record.to_json() + b"\n")

    def write_truth(self, truth: dict[str, Any]) -> None:
        _write_atomic(self.path / "truth.json", orjson.dumps(truth, option=orjson.OPT_INDENT_2))

    def write_truth_columns(self, truth: dict[str, Any], key: str, columns: dict[str, Callable[[], Any]]) -> None:
        """``write_truth`` of ``{**truth, key: {name: make() for name, make in columns}}``, the
        same bytes, with each column made, serialized and freed in turn: a simulator's truth
        has a column entry per segment (millions), too many to hold as Python objects at once."""
        _write_atomic(self.path / "truth.json", _truth_pieces(truth, key, columns))

    def _files(self) -> list[IO[bytes]]:
        return [*self._nic_files.values(), self._events, *([self._oplevel] if self._oplevel else [])]

    def flush(self, *, sync: bool = True) -> None:
        """Push every whole record written so far to the files (and to disk with ``sync``)."""
        for fh in self._files():
            fh.flush()
            if sync:
                os.fsync(fh.fileno())

    def close(self, *, error: str | None = None) -> None:
        """Close the files; the trace is marked complete unless ``error`` says why not."""
        if self.closed:
            return
        self.closed = True
        try:
            self.flush()
        finally:
            for fh in self._files():
                fh.close()
            self._nic_files.clear()
        meta = {**self._meta, "complete": error is None, **({"error": error} if error else {})}
        _write_atomic(self.path / "meta.json", orjson.dumps(meta, option=orjson.OPT_INDENT_2))


def _regular(p: Path) -> int:
    """Size of ``p``, which must be a regular file: a FIFO would block the reader for ever
    and a device (/dev/zero) never ends."""
    try:
        st = os.stat(p)
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "a device")
        raise TraceError(f"{p}: cannot read ({kind}, not a regular file)")
    return st.st_size


def read_batch_file(path: str | Path, *, tolerate_truncation: bool = False,
                    stats: dict[str, int] | None = None) -> Iterator[_samples.EpochBatch]:
    """Yield the batches of one NIC file, validating each. With ``tolerate_truncation`` a
    record cut short at the end (a writer that died) ends the file; ``stats`` then counts
    ``truncated_records`` and ``truncated_bytes``."""
    p = Path(path)
    _regular(p)
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
                _cut(stats, len(data) - off)
                return
            raise TraceError(f"{p}: truncated record length at offset {off}")
        (n,) = _LEN.unpack_from(data, off)
        if n > MAX_RECORD or off + 4 + n > len(data):
            if tolerate_truncation:
                _cut(stats, len(data) - off)
                return
            raise TraceError(f"{p}: record at offset {off} claims {n} bytes, only {len(data) - off - 4} left")
        try:
            yield _samples.decode(mv[off + 4:off + 4 + n], where=f"{p}@{off}")
        except DecodeError as exc:
            raise TraceError(str(exc)) from None
        off += 4 + n


def _cut(stats: dict[str, int] | None, nbytes: int) -> None:
    if stats is not None:
        stats["truncated_records"] = stats.get("truncated_records", 0) + 1
        stats["truncated_bytes"] = stats.get("truncated_bytes", 0) + nbytes


def _read_jsonl(path: Path, decode: Any, *, tolerate_truncation: bool = False,
                stats: dict[str, int] | None = None) -> Iterator[Any]:
    if not (path.exists() or path.is_symlink()):
        return
    _regular(path)
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = decode(line, f"{path}:{lineno}")
            except DecodeError as exc:
                if tolerate_truncation and not line.endswith(b"\n"):
                    _cut(stats, len(line))  # the last line of a writer that died mid-line
                    return
                raise TraceError(str(exc)) from None
            yield rec


class TraceReader:
    """Reads a trace directory written by :class:`TraceWriter` (or by hand, same layout)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise TraceError(f"{self.path}: not a directory (expected a Pulse trace directory)")
        if not (self.path / "samples").is_dir() and not (self.path / "hook-events.jsonl").exists():
            raise TraceError(f"{self.path}: no samples/ and no hook-events.jsonl: not a Pulse trace")
        samples = self.path / "samples"
        if samples.is_symlink() or (samples.exists() and not samples.is_dir()):
            raise TraceError(f"{samples}: not a directory of batch files (a link or a file)")
        meta_path = self.path / "meta.json"
        self.meta: dict[str, Any] = {}
        if meta_path.exists() or meta_path.is_symlink():
            if _regular(meta_path) > MAX_META:
                raise TraceError(f"{meta_path}: over {MAX_META} bytes, not a meta file")
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
            job = self.meta.get("job")
            if job is not None:
                try:
                    _samples.check_name("job", job, allow_empty=True)
                except EncodeError as exc:
                    raise TraceError(f"{meta_path}: field {exc}") from None
            ens = self.meta.get("epoch_ns")
            if ens is not None and (type(ens) is not int or not MIN_EPOCH_NS <= ens <= MAX_EPOCH_NS):
                raise TraceError(f"{meta_path}: field 'epoch_ns' must be an integer in "
                                 f"[{MIN_EPOCH_NS}, {MAX_EPOCH_NS}], not {ens!r}")

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

    @property
    def complete(self) -> bool:
        """False when the writer did not finish (killed, or failed: ``meta['error']``)."""
        return self.meta.get("complete", True) is not False

    def timeline(self, *, tolerate_truncation: bool = False, stats: dict[str, int] | None = None,
                 ) -> tuple[list[_events.HookEvent], Iterator[tuple[int, _events.HookEvent | _samples.EpochBatch]]]:
        """The trace in the order a live source publishes it: the setup events (comm and
        flow events, and op events without an issue time) first, then op events and epoch
        batches merged in trace time: an op event at its ``t_host_ns``, a batch when its
        last epoch ends (the earliest a live source could send it). Yields (time, item)."""
        setup: list[_events.HookEvent] = []
        ops: list[tuple[int, int, Any]] = []
        for i, ev in enumerate(self.events(tolerate_truncation=tolerate_truncation, stats=stats)):
            if isinstance(ev, _events.OpEvent) and ev.t_host_ns is not None:
                ops.append((ev.t_host_ns, i, ev))
            else:
                setup.append(ev)
        ops.sort(key=lambda x: (x[0], x[1]))

        def nic_stream(k: int, path: Path) -> Iterator[tuple[int, int, Any]]:
            for b in read_batch_file(path, tolerate_truncation=tolerate_truncation, stats=stats):
                if (b.node, b.nic) != names[k]:
                    # The path names the NIC: a batch of another one was put there by hand
                    # or by a bug; used, it would count twice or on the wrong node, and
                    # dropped, its NIC would look silent (a stop that never happened).
                    raise TraceError(f"{path}: batch {b.batch_seq} is of {b.node}/{b.nic}, not of the "
                                     f"NIC its path names ({'/'.join(names[k])})")
                if stats is not None:
                    stats["batches"] = stats.get("batches", 0) + 1
                yield (b.end_ns(), 1 << 40 | k, b)

        files = self.nic_files()
        names = [(n, c) for n, c, _ in files]
        streams = [nic_stream(k, p) for k, (_, _, p) in enumerate(files)]
        merged = heapq.merge(iter(ops), *streams, key=lambda x: (x[0], x[1]))
        return setup, ((t, item) for t, _, item in merged)

    def events(self, *, tolerate_truncation: bool = False,
               stats: dict[str, int] | None = None) -> Iterator[_events.HookEvent]:
        return _read_jsonl(self.path / "hook-events.jsonl", _events.decode,
                           tolerate_truncation=tolerate_truncation, stats=stats)

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
