"""Epoch-sample batches: the binary wire format of ``pulse.samples``.

One batch = one NIC's nonzero per-flow epochs for a time window. Layout (little endian)::

    magic      4s   b"PLSE"
    version    u16  1 or 2
    flags      u16  bit 0: rx_bytes present
    epoch_ns   u32  epoch length (1 µs .. 1 s)
    n_rows     u32
    batch_seq  u64  per (node, nic) counter; a gap means a lost batch
    t0_ns      i64  start of epoch 0 on the node's clock
    job_len, node_len, nic_len   3 x u16, then the three UTF-8 strings
    version 1: flow[n] u32, epoch[n] u32, tx_bytes[n] u32, [rx_bytes[n] u32]
    version 2: the same columns delta-coded, byte-shuffled and LZ4-compressed behind a
               CRC-32 (:mod:`pulse.batchcodec`): ~4x fewer bytes than version 1, and
               ~1.3x fewer than version 1 once both went through Kafka's zstd

``encode`` writes version 1 unless asked for 2 (trace files keep version 1); the
producers publish version 2 (``WIRE_VERSION``). ``decode`` reads both.

Rows are sorted by (flow, epoch) strictly (no duplicate rows) and every row carries
bytes (tx or rx nonzero). Decoding checks all of it and raises :class:`DecodeError`
naming what was wrong; arrays returned by ``decode`` are read-only views on the buffer.
"""

from __future__ import annotations

import dataclasses
import re
import struct

import numpy as np

from pulse import batchcodec
from pulse._schema import MAX_MESSAGE_BYTES
from pulse.errors import DecodeError, EncodeError
from pulse.settings import MAX_EPOCH_NS, MIN_EPOCH_NS

MAGIC = b"PLSE"
VERSION = 1
VERSIONS = (1, 2)
WIRE_VERSION = 2
"""What the producers publish."""
FLAG_RX = 1
_HEAD = struct.Struct("<4sHHIIQqHHH")
HEADER_SIZE = _HEAD.size
MAX_ROWS = 1 << 26
_NAME = re.compile(r"^[A-Za-z0-9_.:@+-]{1,128}$")
_U32 = np.dtype("<u4")


def check_name(what: str, value: str, *, allow_empty: bool = False) -> str:
    """Node, NIC and job names go into file names and Kafka keys: keep them tame."""
    if not isinstance(value, str):
        raise EncodeError(f"{what} must be a string, got {type(value).__name__}")
    if allow_empty and value == "":
        return value
    if not _NAME.fullmatch(value) or value in (".", ".."):
        raise EncodeError(
            f"{what}={value!r}: must be 1-128 characters of letters, digits and _ . : @ + - "
            "(and not . or .., since names become file names)"
        )
    return value


def _int(what: str, value: object, lo: int, hi: int) -> int:
    """An integer scalar (Python or numpy, not bool) in [lo, hi], else EncodeError."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise EncodeError(f"{what}={value!r}: must be an integer, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise EncodeError(f"{what}={value}: must be in [{lo}, {hi}]")
    return int(value)


@dataclasses.dataclass(frozen=True, eq=False)
class EpochBatch:
    """Nonzero (flow, epoch) rows of one NIC for one window."""

    node: str
    nic: str
    t0_ns: int
    epoch_ns: int
    batch_seq: int
    flow: np.ndarray
    epoch: np.ndarray
    tx_bytes: np.ndarray
    rx_bytes: np.ndarray | None = None
    job: str = ""

    @property
    def n_rows(self) -> int:
        return int(self.flow.shape[0])

    def end_ns(self) -> int:
        """End of the last epoch with data (t0 when empty)."""
        if self.n_rows == 0:
            return self.t0_ns
        return self.t0_ns + (int(self.epoch.max()) + 1) * self.epoch_ns

    def tx_end_ns(self) -> int | None:
        """End of the last epoch in which the NIC transmitted (None: it sent nothing)."""
        if self.n_rows == 0:
            return None
        sent = self.epoch[self.tx_bytes > 0]
        if sent.size == 0:
            return None
        return self.t0_ns + (int(sent.max()) + 1) * self.epoch_ns

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EpochBatch):
            return NotImplemented
        if self.rx_bytes is None or other.rx_bytes is None:
            same_rx = self.rx_bytes is None and other.rx_bytes is None
        else:
            same_rx = np.array_equal(self.rx_bytes, other.rx_bytes)
        return (
            (self.node, self.nic, self.job, self.t0_ns, self.epoch_ns, self.batch_seq)
            == (other.node, other.nic, other.job, other.t0_ns, other.epoch_ns, other.batch_seq)
            and np.array_equal(self.flow, other.flow)
            and np.array_equal(self.epoch, other.epoch)
            and np.array_equal(self.tx_bytes, other.tx_bytes)
            and same_rx
        )

    __hash__ = None  # type: ignore[assignment]


def _rows_problem(flow: np.ndarray, epoch: np.ndarray, tx: np.ndarray, rx: np.ndarray | None) -> str | None:
    n = flow.shape[0]
    if n == 0:
        return None
    if n > 1:
        f0, f1 = flow[:-1].astype(np.int64), flow[1:].astype(np.int64)
        e0, e1 = epoch[:-1].astype(np.int64), epoch[1:].astype(np.int64)
        bad = (f1 < f0) | ((f1 == f0) & (e1 <= e0))
        if bad.any():
            i = int(np.argmax(bad)) + 1
            return (
                f"rows not strictly sorted by (flow, epoch) at row {i}: "
                f"({int(flow[i - 1])}, {int(epoch[i - 1])}) then ({int(flow[i])}, {int(epoch[i])})"
            )
    empty = tx == 0 if rx is None else (tx == 0) & (rx == 0)
    if empty.any():
        i = int(np.argmax(empty))
        return f"row {i} (flow {int(flow[i])}, epoch {int(epoch[i])}) carries no bytes"
    return None


def _as_u32(name: str, values: object) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise EncodeError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise EncodeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > 0xFFFFFFFF):
        raise EncodeError(f"{name} has values outside uint32")
    return arr.astype(_U32, copy=False)


def make_batch(
    *,
    node: str,
    nic: str,
    t0_ns: int,
    epoch_ns: int,
    batch_seq: int,
    flow: object,
    epoch: object,
    tx_bytes: object,
    rx_bytes: object | None = None,
    job: str = "",
) -> EpochBatch:
    """Validate and build a batch (arrays converted to little-endian uint32)."""
    check_name("node", node)
    check_name("nic", nic)
    check_name("job", job, allow_empty=True)
    epoch_ns = _int("epoch_ns", epoch_ns, MIN_EPOCH_NS, MAX_EPOCH_NS)
    batch_seq = _int("batch_seq", batch_seq, 0, (1 << 64) - 1)
    t0_ns = _int("t0_ns", t0_ns, -(1 << 63), (1 << 63) - 1)
    f = _as_u32("flow", flow)
    e = _as_u32("epoch", epoch)
    t = _as_u32("tx_bytes", tx_bytes)
    r = None if rx_bytes is None else _as_u32("rx_bytes", rx_bytes)
    lengths = {len(f), len(e), len(t)} | ({len(r)} if r is not None else set())
    if len(lengths) != 1:
        raise EncodeError(f"column lengths differ: flow {len(f)}, epoch {len(e)}, tx {len(t)}"
                          + (f", rx {len(r)}" if r is not None else ""))
    if len(f) > MAX_ROWS:
        raise EncodeError(f"{len(f)} rows: a batch holds at most {MAX_ROWS}")
    problem = _rows_problem(f, e, t, r)
    if problem:
        raise EncodeError(problem)
    return EpochBatch(node=node, nic=nic, t0_ns=t0_ns, epoch_ns=epoch_ns,
                      batch_seq=batch_seq, flow=f, epoch=e, tx_bytes=t, rx_bytes=r, job=job)


def encode(batch: EpochBatch, *, version: int = VERSION) -> bytes:
    """Bytes of a batch built by :func:`make_batch` (or decoded), in wire ``version`` 1 or
    2. A hand-built ``EpochBatch`` is checked for shape and dtype here; row order is
    ``make_batch``'s job."""
    if version not in VERSIONS:
        raise EncodeError(f"batch version {version}: this Pulse writes {VERSIONS}")
    names = [s.encode() for s in (batch.job, batch.node, batch.nic)]
    flags = FLAG_RX if batch.rx_bytes is not None else 0
    cols: list[np.ndarray] = [batch.flow, batch.epoch, batch.tx_bytes]
    if batch.rx_bytes is not None:
        cols.append(batch.rx_bytes)
    for c in cols:
        if not isinstance(c, np.ndarray) or c.ndim != 1 or c.dtype.kind != "u" or c.dtype.itemsize != 4:
            raise EncodeError(f"batch {batch.node}/{batch.nic}: columns must be 1-D uint32 arrays "
                              "(build batches with make_batch)")
    if len({c.shape[0] for c in cols}) != 1:
        raise EncodeError(f"batch {batch.node}/{batch.nic}: column lengths differ "
                          f"({', '.join(str(c.shape[0]) for c in cols)})")
    try:
        head = _HEAD.pack(MAGIC, version, flags, batch.epoch_ns, batch.n_rows, batch.batch_seq,
                          batch.t0_ns, *(len(n) for n in names))
    except struct.error as exc:
        raise EncodeError(f"batch {batch.node}/{batch.nic}: header field out of range ({exc})") from None
    if version == 2:
        return b"".join([head, *names, batchcodec.encode_columns(batch.flow, batch.epoch, batch.tx_bytes,
                                                                  batch.rx_bytes)])
    return b"".join([head, *names, *(np.ascontiguousarray(c, dtype=_U32).tobytes() for c in cols)])


def decode(buf: bytes | bytearray | memoryview, *, where: str = "batch",
           max_bytes: int = MAX_MESSAGE_BYTES) -> EpochBatch:
    """Decode and fully validate one batch of at most ``max_bytes``; ``where`` prefixes
    error messages."""
    try:
        mv = memoryview(buf)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
    except TypeError as exc:
        raise DecodeError(f"{where}: expected bytes, got {type(buf).__name__} ({exc})") from None
    if mv.nbytes > max_bytes:
        raise DecodeError(f"{where}: message of {mv.nbytes} bytes, over the limit of {max_bytes} "
                          "(PULSE_MAX_MESSAGE_BYTES)")
    if mv.nbytes < HEADER_SIZE:
        raise DecodeError(f"{where}: {mv.nbytes} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, version, flags, epoch_ns, n, seq, t0, lj, ln, lc = _HEAD.unpack_from(mv, 0)
    if magic != MAGIC:
        raise DecodeError(f"{where}: bad magic {bytes(magic)!r} (expected {MAGIC!r}): not an epoch batch")
    if version not in VERSIONS:
        raise DecodeError(f"{where}: unsupported batch version {version} (this Pulse reads {VERSIONS})")
    if flags & ~FLAG_RX:
        raise DecodeError(f"{where}: unknown flag bits 0x{flags & ~FLAG_RX:x}")
    if not MIN_EPOCH_NS <= epoch_ns <= MAX_EPOCH_NS:
        raise DecodeError(f"{where}: epoch_ns={epoch_ns} outside [{MIN_EPOCH_NS}, {MAX_EPOCH_NS}]")
    if n > MAX_ROWS:
        raise DecodeError(f"{where}: header claims {n} rows (limit {MAX_ROWS})")
    ncols = 4 if flags & FLAG_RX else 3
    names_end = HEADER_SIZE + lj + ln + lc
    if version == 1:
        expected = names_end + 4 * n * ncols
        if mv.nbytes != expected:
            kind = "truncated" if mv.nbytes < expected else "oversized"
            raise DecodeError(f"{where}: {kind}: {mv.nbytes} bytes, header says {expected}")
    elif mv.nbytes < names_end:
        raise DecodeError(f"{where}: truncated: {mv.nbytes} bytes, the names end at {names_end}")
    elif 12 * n > max_bytes:
        # never more rows than a version-1 message of the size limit could carry
        raise DecodeError(f"{where}: header claims {n} rows, over the {max_bytes // 12} a message may carry")
    off = HEADER_SIZE
    names = []
    for what, length in (("job", lj), ("node", ln), ("nic", lc)):
        try:
            names.append(bytes(mv[off:off + length]).decode())
        except UnicodeDecodeError:
            raise DecodeError(f"{where}: {what} name is not UTF-8") from None
        off += length
    job, node, nic = names
    try:
        check_name("node", node)
        check_name("nic", nic)
        check_name("job", job, allow_empty=True)
    except EncodeError as exc:
        raise DecodeError(f"{where}: {exc}") from None
    if version == 2:
        cols = list(batchcodec.decode_columns(mv[off:], n, ncols == 4, f"{where} ({node}/{nic} seq {seq})"))
    else:
        cols = []
        for _ in range(ncols):
            cols.append(np.frombuffer(mv, dtype=_U32, count=n, offset=off))
            off += 4 * n
    rx = cols[3] if ncols == 4 else None
    problem = _rows_problem(cols[0], cols[1], cols[2], rx)
    if problem:
        raise DecodeError(f"{where} ({node}/{nic} seq {seq}): {problem}")
    return EpochBatch(node=node, nic=nic, t0_ns=t0, epoch_ns=epoch_ns, batch_seq=seq,
                      flow=cols[0], epoch=cols[1], tx_bytes=cols[2], rx_bytes=rx, job=job)
