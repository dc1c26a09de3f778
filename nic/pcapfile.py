"""Capture-file readers: classic pcap and pcapng over a memory-mapped file.

A numba kernel walks the record/block headers once and fills index arrays (data offset,
caplen, wire length, ts_ns, interface); decoding happens elsewhere on those arrays, so no
Python runs per packet. What cannot be used is skipped and counted (``SKIP_NAMES``).
"""

from __future__ import annotations

import dataclasses
import mmap
from pathlib import Path
from typing import Literal

import numba
import numpy as np

from pulse.errors import DecodeError

# Skip reasons counted by the readers (index into the counters array).
R_TRUNCATED_RECORD = 0   # last record/block runs past the end of the file
R_GARBAGE = 1            # a record/block header that makes no sense: rest of file unusable
R_BAD_TIMESTAMP = 2      # sub-second field out of range
R_UNKNOWN_BLOCK = 3      # pcapng block type we do not use (skipped by its length)
R_BAD_BLOCK = 4          # pcapng block whose inner lengths do not fit: skipped by its length
R_NO_INTERFACE = 5       # packet block naming an interface with no IDB
R_NO_TIMESTAMP = 6       # pcapng Simple Packet Block: no timestamp, cannot be binned
R_TOO_MANY_IFACES = 7
N_READ_REASONS = 8
READ_REASON_NAMES = (
    "truncated_record", "garbage", "bad_timestamp", "unknown_block", "bad_block",
    "no_interface", "simple_packet_no_timestamp", "too_many_interfaces",
)

MAX_IFACES = 4096
MAX_CAPLEN = 1 << 24     # 16 MiB: anything larger is a corrupt header

PCAP_US = 0xA1B2C3D4
PCAP_NS = 0xA1B23C4D
PCAPNG_SHB = 0x0A0D0D0A
PCAPNG_BOM = 0x1A2B3C4D

LINKTYPE_NAMES = {0: "NULL", 1: "EN10MB", 101: "RAW", 108: "LOOP", 113: "LINUX_SLL",
                  228: "IPV4", 229: "IPV6", 247: "INFINIBAND", 276: "LINUX_SLL2"}


@dataclasses.dataclass
class PacketIndex:
    """Where each packet's bytes are and when it was seen."""

    data: np.ndarray            # uint8 view of the whole file (memory-mapped)
    offset: np.ndarray          # int64: first byte of the packet
    caplen: np.ndarray          # uint32: bytes present in the file
    wirelen: np.ndarray         # uint32: bytes on the wire
    ts_ns: np.ndarray           # int64
    iface: np.ndarray           # int32: global interface index
    if_linktype: np.ndarray     # int32 per interface
    if_names: list[str]         # per interface ("if<k>" when the file does not say)
    skipped: np.ndarray         # int64 counters indexed by R_*
    fmt: str                    # "pcap-us", "pcap-ns", "pcapng"

    @property
    def n(self) -> int:
        return int(self.offset.shape[0])

    def skip_counts(self) -> dict[str, int]:
        return {READ_REASON_NAMES[i]: int(c) for i, c in enumerate(self.skipped) if c}


@numba.njit(cache=True, inline="always")
def _u16(buf, off, swap):
    if swap:
        return (np.int64(buf[off]) << 8) | np.int64(buf[off + 1])
    return np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)


@numba.njit(cache=True, inline="always")
def _u32(buf, off, swap):
    if swap:
        return ((np.int64(buf[off]) << 24) | (np.int64(buf[off + 1]) << 16)
                | (np.int64(buf[off + 2]) << 8) | np.int64(buf[off + 3]))
    return (np.int64(buf[off]) | (np.int64(buf[off + 1]) << 8)
            | (np.int64(buf[off + 2]) << 16) | (np.int64(buf[off + 3]) << 24))


@numba.njit(cache=True)
def _pcap_kernel(buf, swap, nano, start, fill, offset, caplen, wirelen, ts_ns, skipped):
    """Walk classic pcap records. With fill=False only counts; returns packets found."""
    n = buf.shape[0]
    pos = start
    k = 0
    frac_lim = 1_000_000_000 if nano else 1_000_000
    mul = 1 if nano else 1000
    while pos < n:
        if pos + 16 > n:
            if fill:
                skipped[R_TRUNCATED_RECORD] += 1
            break
        sec = _u32(buf, pos, swap)
        frac = _u32(buf, pos + 4, swap)
        cl = _u32(buf, pos + 8, swap)
        wl = _u32(buf, pos + 12, swap)
        if cl > MAX_CAPLEN:
            if fill:
                skipped[R_GARBAGE] += 1
            break
        if pos + 16 + cl > n:
            if fill:
                skipped[R_TRUNCATED_RECORD] += 1
            break
        if frac >= frac_lim:
            if fill:
                skipped[R_BAD_TIMESTAMP] += 1
            pos += 16 + cl
            continue
        if fill:
            offset[k] = pos + 16
            caplen[k] = cl
            wirelen[k] = wl if wl >= cl else cl
            ts_ns[k] = sec * 1_000_000_000 + frac * mul
        k += 1
        pos += 16 + cl
    return k


MAX_TS_NS = 1 << 62
"""Latest packet time Pulse takes (ns since 1970: the year 2116). A pcapng timestamp or
offset beyond it is damaged, and int64 arithmetic on it would wrap to 1970 or below."""
_MAX_TS_S = MAX_TS_NS // 1_000_000_000


@numba.njit(cache=True)
def _ts_to_ns(ts, res_base2, res_exp):
    """A pcapng 64-bit timestamp in units of 10^-exp or 2^-exp seconds -> ns (floor), or -1
    when it lies beyond ``MAX_TS_NS``."""
    if res_base2:
        sec = ts >> res_exp
        if sec >= _MAX_TS_S:
            return -1
        if res_exp == 0:
            return ts * 1_000_000_000
        frac = ts & ((np.int64(1) << res_exp) - 1)
        if res_exp > 30:
            frac = frac >> (res_exp - 30)
            return sec * 1_000_000_000 + ((frac * 1_000_000_000) >> 30)
        return sec * 1_000_000_000 + ((frac * 1_000_000_000) >> res_exp)
    if res_exp <= 9:
        m = np.int64(1)
        for _ in range(9 - res_exp):
            m *= 10
        if ts > MAX_TS_NS // m:
            return -1
        return ts * m
    d = np.int64(1)
    for _ in range(res_exp - 9):
        d *= 10
    return ts // d


@numba.njit(cache=True)
def _packet_ns(ts, res_base2, res_exp, tsoff):
    """The packet's time with its interface's ``if_tsoffset`` (seconds) added, or -1 when
    either is out of range or the sum leaves [0, MAX_TS_NS)."""
    t = _ts_to_ns(ts, res_base2, res_exp)
    if t < 0 or tsoff >= _MAX_TS_S or tsoff <= -_MAX_TS_S:
        return -1
    t += tsoff * 1_000_000_000
    if t < 0 or t >= MAX_TS_NS:
        return -1
    return t


@numba.njit(cache=True)
def _pcapng_kernel(buf, fill, offset, caplen, wirelen, ts_ns, iface, skipped,
                   if_linktype, if_snaplen, if_base2, if_exp, if_tsoff, if_name_off, if_name_len):
    """Walk pcapng blocks. Returns (packets, interfaces)."""
    n = buf.shape[0]
    pos = 0
    k = 0
    nif = 0
    sec_first_if = 0
    swap = False
    have_section = False
    while pos < n:
        if pos + 12 > n:
            if fill:
                skipped[R_TRUNCATED_RECORD] += 1
            break
        btype = _u32(buf, pos, False)
        if btype == PCAPNG_SHB:
            if pos + 28 > n:
                if fill:
                    skipped[R_TRUNCATED_RECORD] += 1
                break
            bom = _u32(buf, pos + 8, False)
            if bom == PCAPNG_BOM:
                swap = False
            elif _u32(buf, pos + 8, True) == PCAPNG_BOM:
                swap = True
            else:
                if fill:
                    skipped[R_GARBAGE] += 1
                break
            have_section = True
            sec_first_if = nif
        elif not have_section:
            if fill:
                skipped[R_GARBAGE] += 1
            break
        else:
            btype = _u32(buf, pos, swap)
        blen = _u32(buf, pos + 4, swap)
        if blen < 12 or (blen & 3) != 0:
            if fill:
                skipped[R_GARBAGE] += 1
            break
        if pos + blen > n:
            if fill:
                skipped[R_TRUNCATED_RECORD] += 1
            break
        if _u32(buf, pos + blen - 4, swap) != blen:
            if fill:
                skipped[R_GARBAGE] += 1
            break
        body = pos + 8
        body_end = pos + blen - 4
        if btype == 1:  # Interface Description Block
            if body + 8 > body_end:
                if fill:
                    skipped[R_BAD_BLOCK] += 1
            elif nif >= if_linktype.shape[0]:
                if fill:
                    skipped[R_TOO_MANY_IFACES] += 1
            else:
                if_linktype[nif] = _u16(buf, body, swap)
                if_snaplen[nif] = _u32(buf, body + 4, swap)
                if_base2[nif] = 0
                if_exp[nif] = 6
                if_tsoff[nif] = 0
                if_name_off[nif] = 0
                if_name_len[nif] = 0
                o = body + 8
                while o + 4 <= body_end:
                    code = _u16(buf, o, swap)
                    olen = _u16(buf, o + 2, swap)
                    if code == 0 or o + 4 + olen > body_end:
                        break
                    if code == 9 and olen >= 1:
                        r = np.int64(buf[o + 4])
                        if_base2[nif] = 1 if r & 0x80 else 0
                        if_exp[nif] = r & 0x7F
                        if if_base2[nif] == 0 and if_exp[nif] > 18:
                            if_exp[nif] = 18  # beyond int64 range: clamp
                        if if_base2[nif] == 1 and if_exp[nif] > 62:
                            if_exp[nif] = 62
                    elif code == 14 and olen >= 8:
                        if swap:
                            v = (_u32(buf, o + 4, swap) << 32) | _u32(buf, o + 8, swap)
                        else:
                            v = (_u32(buf, o + 8, swap) << 32) | _u32(buf, o + 4, swap)
                        # an offset of centuries is damage: kept, so that every packet of
                        # the interface is counted as a bad timestamp (never silently unshifted)
                        if_tsoff[nif] = v if -(1 << 33) < v < (1 << 33) else np.int64(1) << 62
                    elif code == 2 and olen > 0:
                        if_name_off[nif] = o + 4
                        if_name_len[nif] = olen
                    o += 4 + ((olen + 3) & ~3)
                nif += 1
        elif btype == 6 or btype == 2:  # Enhanced / obsolete Packet Block
            if body + 20 > body_end:
                if fill:
                    skipped[R_BAD_BLOCK] += 1
            else:
                ifx = _u32(buf, body, swap) if btype == 6 else _u16(buf, body, swap)
                th = _u32(buf, body + 4, swap)
                tl = _u32(buf, body + 8, swap)
                cl = _u32(buf, body + 12, swap)
                wl = _u32(buf, body + 16, swap)
                g = sec_first_if + ifx
                if body + 20 + cl > body_end:
                    if fill:
                        skipped[R_BAD_BLOCK] += 1
                elif g >= nif:
                    if fill:
                        skipped[R_NO_INTERFACE] += 1
                elif th >= (1 << 31) or _packet_ns((th << 32) | tl, if_base2[g], if_exp[g], if_tsoff[g]) < 0:
                    if fill:
                        skipped[R_BAD_TIMESTAMP] += 1
                else:
                    if fill:
                        offset[k] = body + 20
                        caplen[k] = cl
                        wirelen[k] = wl if wl >= cl else cl
                        ts_ns[k] = _packet_ns((th << 32) | tl, if_base2[g], if_exp[g], if_tsoff[g])
                        iface[k] = g
                    k += 1
        elif btype == 3:  # Simple Packet Block: no timestamp
            if fill:
                skipped[R_NO_TIMESTAMP] += 1
        elif btype != PCAPNG_SHB and fill:
            skipped[R_UNKNOWN_BLOCK] += 1
        pos += blen
    return k, nif


def _map(path: Path) -> np.ndarray:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise DecodeError(f"{path}: cannot read ({exc.strerror})") from None
    if size == 0:
        return np.zeros(0, dtype=np.uint8)
    with open(path, "rb") as fh:
        # MAP_POPULATE: fault the whole file in at once instead of page by page
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mm = mmap.mmap(fh.fileno(), 0, flags=flags, prot=mmap.PROT_READ)
    return np.frombuffer(mm, dtype=np.uint8)


def read_buffer(buf: np.ndarray, where: str = "capture") -> PacketIndex:
    """Index the packets of a capture held in ``buf`` (uint8). Raises DecodeError when the
    bytes are not a pcap/pcapng file at all."""
    if buf.dtype != np.uint8 or buf.ndim != 1:
        buf = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)  # type: ignore[arg-type]
    if buf.shape[0] < 4:
        raise DecodeError(f"{where}: {buf.shape[0]} bytes, too short for a capture file")
    skipped = np.zeros(N_READ_REASONS, dtype=np.int64)
    magic_le = int.from_bytes(bytes(buf[:4]), "little")
    magic_be = int.from_bytes(bytes(buf[:4]), "big")
    if magic_le in (PCAP_US, PCAP_NS) or magic_be in (PCAP_US, PCAP_NS):
        swap = magic_le not in (PCAP_US, PCAP_NS)
        nano = (magic_be if swap else magic_le) == PCAP_NS
        if buf.shape[0] < 24:
            raise DecodeError(f"{where}: truncated pcap file header ({buf.shape[0]} of 24 bytes)")
        order: Literal["big", "little"] = "big" if swap else "little"
        linktype = int.from_bytes(bytes(buf[20:24]), order) & 0x0FFFFFFF  # upper bits: FCS info
        e64 = np.empty(0, np.int64)
        e32 = np.empty(0, np.uint32)
        count = _pcap_kernel(buf, swap, nano, 24, False, e64, e32, e32, e64, skipped)
        offset = np.empty(count, np.int64)
        caplen = np.empty(count, np.uint32)
        wirelen = np.empty(count, np.uint32)
        ts = np.empty(count, np.int64)
        _pcap_kernel(buf, swap, nano, 24, True, offset, caplen, wirelen, ts, skipped)
        return PacketIndex(buf, offset, caplen, wirelen, ts, np.zeros(count, np.int32),
                           np.array([linktype], np.int32), ["if0"], skipped,
                           "pcap-ns" if nano else "pcap-us")
    if magic_le == PCAPNG_SHB:
        ifs = [np.zeros(MAX_IFACES, np.int64) for _ in range(7)]
        e64 = np.empty(0, np.int64)
        e32 = np.empty(0, np.uint32)
        ei = np.empty(0, np.int32)
        count, _ = _pcapng_kernel(buf, False, e64, e32, e32, e64, ei, skipped, *ifs)
        offset = np.empty(count, np.int64)
        caplen = np.empty(count, np.uint32)
        wirelen = np.empty(count, np.uint32)
        ts = np.empty(count, np.int64)
        iface = np.empty(count, np.int32)
        _, nif = _pcapng_kernel(buf, True, offset, caplen, wirelen, ts, iface, skipped, *ifs)
        names = []
        for i in range(nif):
            o, ln = int(ifs[5][i]), int(ifs[6][i])
            raw = bytes(buf[o:o + ln]).split(b"\0", 1)[0] if ln else b""
            names.append(raw.decode("utf-8", "replace") or f"if{i}")
        return PacketIndex(buf, offset, caplen, wirelen, ts, iface,
                           ifs[0][:nif].astype(np.int32), names, skipped, "pcapng")
    raise DecodeError(f"{where}: not a pcap or pcapng file (magic 0x{magic_le:08x})")


def read_file(path: str | Path) -> PacketIndex:
    """Memory-map ``path`` and index its packets."""
    p = Path(path)
    if not p.is_file():
        raise DecodeError(f"{p}: no such capture file")
    return read_buffer(_map(p), where=str(p))


@dataclasses.dataclass
class Capture:
    """An opened capture file: what its interfaces are and its packets in decoded chunks."""

    path: str
    fmt: str
    buf: np.ndarray
    if_linktype: np.ndarray
    if_names: list[str]
    read_skipped: np.ndarray
    _index: PacketIndex | None = None
    _swap: bool = False
    _nano: bool = False

    def chunks(self, chunk: int = 1 << 20):  # type: ignore[no-untyped-def]
        """Yield (ts_ns, iface, Decoded, progress) chunk by chunk; progress counts toward
        ``size_hint``."""
        from pulse.nic import decode as D

        if self._index is None:  # classic pcap: walk and decode in one pass
            for ts, dec, pos in D.iter_pcap_decoded(self.buf, swap=self._swap, nano=self._nano,
                                                    linktype=int(self.if_linktype[0]),
                                                    read_counts=self.read_skipped, chunk=chunk):
                yield ts, np.zeros(ts.shape[0], np.int32), dec, pos
            return
        ix = self._index
        for start in range(0, ix.n, chunk):
            stop = min(ix.n, start + chunk)
            dec = D.decode_packets(ix.data, ix.offset[start:stop], ix.caplen[start:stop],
                                   ix.wirelen[start:stop], ix.iface[start:stop], ix.if_linktype)
            yield ix.ts_ns[start:stop], ix.iface[start:stop], dec, stop

    @property
    def size_hint(self) -> int:
        """Packets (pcapng, exact) or file bytes (pcap) for a progress bar."""
        return self._index.n if self._index is not None else int(self.buf.shape[0])

    def skip_counts(self) -> dict[str, int]:
        return {name: int(self.read_skipped[i]) for i, name in enumerate(READ_REASON_NAMES) if self.read_skipped[i]}


def open_capture(path: str | Path) -> Capture:
    """Open a pcap/pcapng file for chunked decoding (classic pcap is read and decoded in one
    pass; pcapng is indexed first)."""
    p = Path(path)
    if not p.is_file():
        raise DecodeError(f"{p}: no such capture file")
    buf = _map(p)
    if buf.shape[0] >= 24:
        le = int.from_bytes(bytes(buf[:4]), "little")
        be = int.from_bytes(bytes(buf[:4]), "big")
        if le in (PCAP_US, PCAP_NS) or be in (PCAP_US, PCAP_NS):
            swap = le not in (PCAP_US, PCAP_NS)
            nano = (be if swap else le) == PCAP_NS
            lt = int.from_bytes(bytes(buf[20:24]), "big" if swap else "little") & 0x0FFFFFFF
            return Capture(str(p), "pcap-ns" if nano else "pcap-us", buf, np.array([lt], np.int32), ["if0"],
                           np.zeros(N_READ_REASONS + 1, np.int64), None, swap, nano)  # +1: kernel scratch
    ix = read_buffer(buf, where=str(p))
    return Capture(str(p), ix.fmt, buf, ix.if_linktype, ix.if_names, ix.skipped, ix)
