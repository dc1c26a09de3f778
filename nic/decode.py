"""Packet decoding (numba): link layer -> IPv4/IPv6 (or IB LRH/GRH) -> RoCE BTH or TCP.

One kernel walks the index arrays of :mod:`pulse.nic.pcapfile` (or of a live ring) and
fills per-packet columns: what the packet is (``kind``), its addresses, destination QPN or
ports, and its *payload* bytes. RoCE payload comes from the UDP length (or the IB PktLen),
never from the captured bytes, so snaplen-cut packets still count in full as long as their
headers were captured.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
from pulse.nic.prefetch import prefetch

# Packet kinds.
K_SKIP = 0
K_ROCE_DATA = 1      # SEND / WRITE / READ response: carries payload
K_ROCE_REQUEST = 2   # READ request, atomic request: no payload toward the responder
K_ROCE_ACK = 3
K_ROCE_NAK = 4       # AETH syndrome NAK or RNR NAK
K_ROCE_CNP = 5
K_ROCE_MAD = 6       # QP0/QP1 management datagrams (connection manager, SMP): not data
K_TCP = 7
KIND_NAMES = ("skip", "roce_data", "roce_request", "roce_ack", "roce_nak", "roce_cnp",
              "roce_mad", "tcp")

# Why a packet was skipped by the decoder.
D_LINKTYPE = 0
D_NON_IP = 1
D_SNAPLEN = 2
D_MALFORMED = 3
D_FRAGMENT = 4
D_OTHER_PROTO = 5
D_ROCE_OPCODE = 6
D_ROCE_LENGTH = 7
D_IB_RAW = 8
N_DECODE_REASONS = 9
DECODE_REASON_NAMES = ("unknown_linktype", "non_ip", "snaplen_cut_headers", "malformed",
                       "ip_fragment", "not_roce_or_tcp", "roce_unknown_opcode",
                       "roce_length_too_short", "ib_non_iba")

FAM_IB_LID = 1
FAM_IP4 = 4
FAM_IP6 = 6

ROCEV2_PORT = 4791
CNP_OPCODE = 0x81

# Per-opcode class and extension-header bytes after the 12-byte BTH (IBA vol 1 ch. 9,
# Linux rxe_opcode.c). Class: 0 invalid, 1 data, 2 request, 3 ack.
_C_BAD, _C_DATA, _C_REQ, _C_ACK = 0, 1, 2, 3
_RC_OPS = {  # low 5 bits -> (class, extension bytes)
    0x00: (1, 0), 0x01: (1, 0), 0x02: (1, 0), 0x03: (1, 4), 0x04: (1, 0), 0x05: (1, 4),
    0x06: (1, 16), 0x07: (1, 0), 0x08: (1, 0), 0x09: (1, 4), 0x0A: (1, 16), 0x0B: (1, 20),
    0x0C: (2, 16), 0x0D: (1, 4), 0x0E: (1, 0), 0x0F: (1, 4), 0x10: (1, 4), 0x11: (3, 4),
    0x12: (3, 12), 0x13: (2, 28), 0x14: (2, 28), 0x16: (1, 4), 0x17: (1, 4),
}


def _opcode_tables() -> tuple[np.ndarray, np.ndarray]:
    cls = np.zeros(256, np.int8)
    ext = np.zeros(256, np.int16)
    for low, (c, e) in _RC_OPS.items():
        cls[0x00 | low], ext[0x00 | low] = c, e                     # RC
        if low <= 0x0B:                                             # UC: sends and writes
            cls[0x20 | low], ext[0x20 | low] = c, e
        # RD: RDETH (4) on everything, DETH (8) on requests
        cls[0x40 | low], ext[0x40 | low] = c, e + 4 + (8 if c != _C_ACK and low not in (0x0D, 0x0E, 0x0F, 0x10) else 0)
        # XRC: XRCETH (4) on requests
        cls[0xA0 | low], ext[0xA0 | low] = c, e + (4 if c != _C_ACK and low not in (0x0D, 0x0E, 0x0F, 0x10) else 0)
    cls[0x64], ext[0x64] = _C_DATA, 8       # UD SEND_ONLY: DETH
    cls[0x65], ext[0x65] = _C_DATA, 12      # UD SEND_ONLY_WITH_IMMEDIATE: DETH + ImmDt
    return cls, ext


OP_CLASS, OP_EXT = _opcode_tables()


@numba.njit(cache=True, inline="always")
def _be16(b, o):
    return (np.int64(b[o]) << 8) | np.int64(b[o + 1])


@numba.njit(cache=True, inline="always")
def _be32(b, o):
    return ((np.int64(b[o]) << 24) | (np.int64(b[o + 1]) << 16)
            | (np.int64(b[o + 2]) << 8) | np.int64(b[o + 3]))


@numba.njit(cache=True, inline="always")
def _be64u(b, o):
    v = np.uint64(0)
    for j in range(8):
        v = (v << np.uint64(8)) | np.uint64(b[o + j])
    return v


# _bth and _decode_one are inlined into their callers and return scalars: as calls they
# cost ~2x the whole decode, and array arguments of an inlined function cost reference
# counting on every packet (~100 ns a packet with 20 arrays, measured).
@numba.njit(cache=True, inline="always")
def _bth(b, q, end, paylen, op_cls, op_ext):
    """Decode a BTH at q; paylen = bytes from BTH start through ICRC. Returns (kind, dest
    QPN, payload, PSN, opcode, skip reason D_* or -1)."""
    if q + 12 > end:
        return K_SKIP, 0, 0, 0, 0, D_SNAPLEN
    op = np.int64(b[q])
    pad = (np.int64(b[q + 1]) >> 4) & 3
    dqp = (np.int64(b[q + 5]) << 16) | (np.int64(b[q + 6]) << 8) | np.int64(b[q + 7])
    psn = (np.int64(b[q + 9]) << 16) | (np.int64(b[q + 10]) << 8) | np.int64(b[q + 11])
    if op == CNP_OPCODE:
        return K_ROCE_CNP, dqp, 0, psn, op, -1
    c = op_cls[op]
    if c == _C_BAD:
        return K_SKIP, dqp, 0, psn, op, D_ROCE_OPCODE
    if dqp <= 1:
        return K_ROCE_MAD, dqp, 0, psn, op, -1
    pl = paylen - 12 - np.int64(op_ext[op]) - pad - 4
    if pl < 0:
        return K_SKIP, dqp, 0, psn, op, D_ROCE_LENGTH
    if c == _C_ACK:
        if q + 13 > end:
            return K_SKIP, dqp, 0, psn, op, D_SNAPLEN
        syn = np.int64(b[q + 12])
        k = K_ROCE_NAK if (syn & 0x60) == 0x60 or (syn & 0x60) == 0x20 else K_ROCE_ACK
        return k, dqp, 0, psn, op, -1
    if c == _C_REQ:
        return K_ROCE_REQUEST, dqp, 0, psn, op, -1
    return K_ROCE_DATA, dqp, pl, psn, op, -1


@numba.njit(cache=True, inline="always")
def _decode_one(b, p, end, wend, lt, op_cls, op_ext):
    """Decode the packet whose link-layer header starts at p (captured bytes up to end,
    wire bytes up to wend). Returns (kind, fam, src_hi, src_lo, dst_hi, dst_lo, qpn, sport,
    dport, payload, seq, opcode, skip reason D_* or -1); what a packet lacks is 0."""
    v4map = np.uint64(0xFFFF00000000)
    z = np.uint64(0)
    fam = 0
    src_hi = z
    src_lo = z
    dst_hi = z
    dst_lo = z
    et = -1          # ethertype of the layer-3 header at q
    q = p
    if lt == 1:
        if p + 14 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        et = _be16(b, p + 12)
        q = p + 14
    elif lt == 113:  # Linux cooked v1: protocol at 14
        if p + 16 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        et = _be16(b, p + 14)
        q = p + 16
    elif lt == 276:  # Linux cooked v2: protocol at 0
        if p + 20 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        et = _be16(b, p)
        q = p + 20
    elif lt == 101 or lt == 228 or lt == 229 or lt == 0 or lt == 108:
        if lt == 0 or lt == 108:
            q = p + 4
        if q + 1 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        ver = np.int64(b[q]) >> 4
        et = 0x0800 if ver == 4 else (0x86DD if ver == 6 else 0)
    elif lt == 247:  # InfiniBand: LRH (+GRH) + BTH
        if p + 8 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        lnh = np.int64(b[p + 1]) & 3
        pktlen = (_be16(b, p + 4) & 0x7FF) * 4
        if lnh == 2:
            dst_lo = np.uint64(_be16(b, p + 2))
            src_lo = np.uint64(_be16(b, p + 6))
            kd, qp, pl, psn, op, why = _bth(b, p + 8, end, pktlen - 8, op_cls, op_ext)
            return kd, FAM_IB_LID, src_hi, src_lo, dst_hi, dst_lo, qp, 0, 0, pl, psn, op, why
        if lnh == 3:
            if p + 48 > end:
                return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
            src_hi = _be64u(b, p + 16)
            src_lo = _be64u(b, p + 24)
            dst_hi = _be64u(b, p + 32)
            dst_lo = _be64u(b, p + 40)
            kd, qp, pl, psn, op, why = _bth(b, p + 48, end, pktlen - 48, op_cls, op_ext)
            return kd, FAM_IP6, src_hi, src_lo, dst_hi, dst_lo, qp, 0, 0, pl, psn, op, why
        return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_IB_RAW
    else:
        return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_LINKTYPE
    # 802.1Q / 802.1ad / QinQ tags
    cut = False
    while et == 0x8100 or et == 0x88A8 or et == 0x9100:
        if q + 4 > end:
            cut = True
            break
        et = _be16(b, q + 2)
        q += 4
    if cut:
        return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
    if et == 0x8915:  # RoCE v1: GRH + BTH
        if q + 40 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        src_hi = _be64u(b, q + 8)
        src_lo = _be64u(b, q + 16)
        dst_hi = _be64u(b, q + 24)
        dst_lo = _be64u(b, q + 32)
        kd, qp, pl, psn, op, why = _bth(b, q + 40, end, _be16(b, q + 4), op_cls, op_ext)
        return kd, FAM_IP6, src_hi, src_lo, dst_hi, dst_lo, qp, 0, 0, pl, psn, op, why
    proto = -1
    l4 = 0
    l4len = 0
    if et == 0x0800:
        if q + 20 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        if (np.int64(b[q]) >> 4) != 4:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_MALFORMED
        ihl = (np.int64(b[q]) & 15) * 4
        total = _be16(b, q + 2)
        if total == 0:  # TSO/BIG TCP super-packet: length from the wire
            total = wend - q
        # a length beyond what the packet had on the wire is a lie, not bytes to count
        if ihl < 20 or total < ihl or total > wend - q:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_MALFORMED
        if (_be16(b, q + 6) & 0x3FFF) != 0:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_FRAGMENT
        proto = np.int64(b[q + 9])
        fam = FAM_IP4
        src_lo = v4map | np.uint64(_be32(b, q + 12))
        dst_lo = v4map | np.uint64(_be32(b, q + 16))
        l4 = q + ihl
        l4len = total - ihl
    elif et == 0x86DD:
        if q + 40 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        if (np.int64(b[q]) >> 4) != 6:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_MALFORMED
        plen = _be16(b, q + 4)
        if plen == 0:  # jumbogram / BIG TCP
            plen = wend - q - 40
        if plen > wend - q - 40:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_MALFORMED
        nh = np.int64(b[q + 6])
        fam = FAM_IP6
        src_hi = _be64u(b, q + 8)
        src_lo = _be64u(b, q + 16)
        dst_hi = _be64u(b, q + 24)
        dst_lo = _be64u(b, q + 32)
        l4 = q + 40
        l4len = plen
        bad = 0
        hops = 0
        while nh == 0 or nh == 43 or nh == 60 or nh == 51 or nh == 44:
            if nh == 44:
                bad = 2
                break
            if l4 + 2 > end:
                bad = 1
                break
            hops += 1
            if hops > 8:
                bad = 3
                break
            hl = (np.int64(b[l4 + 1]) + 2) * 4 if nh == 51 else (np.int64(b[l4 + 1]) + 1) * 8
            nh = np.int64(b[l4])
            l4 += hl
            l4len -= hl
        if bad == 1:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        if bad == 2:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_FRAGMENT
        if bad == 3 or l4len < 0:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_MALFORMED
        proto = nh
    else:
        return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_NON_IP
    if proto == 17:
        if l4 + 8 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        sp = _be16(b, l4)
        dp = _be16(b, l4 + 2)
        if dp != ROCEV2_PORT:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_OTHER_PROTO
        ulen = _be16(b, l4 + 4)
        if ulen == 0 or ulen > l4len:  # 0: IPv6 jumbogram; never trust more than IP says
            ulen = l4len
        if ulen < 8:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_MALFORMED
        kd, qp, pl, psn, op, why = _bth(b, l4 + 8, end, ulen - 8, op_cls, op_ext)
        return kd, fam, src_hi, src_lo, dst_hi, dst_lo, qp, sp, dp, pl, psn, op, why
    if proto == 6:
        if l4 + 14 > end:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_SNAPLEN
        doff = (np.int64(b[l4 + 12]) >> 4) * 4
        if doff < 20 or doff > l4len:
            return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_MALFORMED
        return (K_TCP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, _be16(b, l4), _be16(b, l4 + 2),
                l4len - doff, _be32(b, l4 + 4), np.int64(b[l4 + 13]), -1)  # opcode column: TCP flags
    return K_SKIP, fam, src_hi, src_lo, dst_hi, dst_lo, 0, 0, 0, 0, 0, 0, D_OTHER_PROTO


@numba.njit(cache=True)
def _decode_kernel(b, offset, caplen, wirelen, iface, if_linktype, op_cls, op_ext,
                   kind, fam, src_hi, src_lo, dst_hi, dst_lo, qpn, sport, dport,
                   payload, seq, opcode, counts):
    for i in range(offset.shape[0]):
        p = offset[i]
        r = _decode_one(b, p, p + np.int64(caplen[i]), p + np.int64(wirelen[i]), if_linktype[iface[i]],
                        op_cls, op_ext)
        kind[i] = r[0]
        fam[i] = r[1]
        src_hi[i] = r[2]
        src_lo[i] = r[3]
        dst_hi[i] = r[4]
        dst_lo[i] = r[5]
        qpn[i] = r[6]
        sport[i] = r[7]
        dport[i] = r[8]
        payload[i] = r[9]
        seq[i] = r[10]
        opcode[i] = r[11]
        if r[12] >= 0:
            counts[r[12]] += 1


@dataclasses.dataclass
class Decoded:
    """Per-packet columns (same length as the packet index)."""

    kind: np.ndarray      # int8, K_*
    fam: np.ndarray       # uint8, FAM_*
    src_hi: np.ndarray    # uint64: address as 128 bits (IPv4 as ::ffff:a.b.c.d, IB LID in lo)
    src_lo: np.ndarray
    dst_hi: np.ndarray
    dst_lo: np.ndarray
    qpn: np.ndarray       # uint32: destination QPN (RoCE)
    sport: np.ndarray     # uint16
    dport: np.ndarray
    payload: np.ndarray   # int64: payload bytes (RoCE data, TCP)
    seq: np.ndarray       # uint32: TCP sequence number or RoCE PSN
    opcode: np.ndarray    # uint8: BTH opcode or TCP flags
    skipped: np.ndarray   # int64 counters indexed by D_*

    def skip_counts(self) -> dict[str, int]:
        return {DECODE_REASON_NAMES[i]: int(c) for i, c in enumerate(self.skipped) if c}


def decode_packets(buf: np.ndarray, offset: np.ndarray, caplen: np.ndarray, wirelen: np.ndarray,
                   iface: np.ndarray, if_linktype: np.ndarray) -> Decoded:
    n = offset.shape[0]
    d = empty_decoded(n)
    if n:
        _decode_kernel(buf, offset, caplen, wirelen, iface,
                       np.ascontiguousarray(if_linktype, np.int64), OP_CLASS, OP_EXT,
                       d.kind, d.fam, d.src_hi, d.src_lo, d.dst_hi, d.dst_lo, d.qpn, d.sport,
                       d.dport, d.payload, d.seq, d.opcode, d.skipped)
    return d


PREFETCH_RECORDS = 16  # prefetch distance in records (measured best of 4..32 on 1 KiB records)


@numba.njit(cache=True)
def _pcap_fused_kernel(buf, pos, swap, nano, lt, maxk, ahead, op_cls, op_ext, ts_ns,
                       kind, fam, src_hi, src_lo, dst_hi, dst_lo, qpn, sport, dport,
                       payload, seq, opcode, counts, read_counts):
    """Walk classic pcap records from ``pos`` and decode each packet while its bytes are
    in cache (one pass over the file instead of index + decode). Returns (packets, next
    position, finished)."""
    n = buf.shape[0]
    frac_lim = 1_000_000_000 if nano else 1_000_000
    mul = 1 if nano else 1000
    k = 0
    # The record walk is pointer chasing (each header says where the next one is), so it
    # waits on every cache miss. Guess where the record ``ahead`` records on starts -- as
    # far on as the last ``ahead`` records reached -- and ask for its header early; a
    # wrong guess only wastes a line fetch.
    na = max(ahead, 1)
    ring = np.zeros(na, np.int64)
    while pos < n:
        if k >= maxk:
            return k, pos, False
        if ahead > 0:
            r = k % na
            g = 2 * pos - ring[r]
            ring[r] = pos
            if k >= na and g + 128 <= n:
                prefetch(buf, g)         # three lines: every byte of [g, g + 128)
                prefetch(buf, g + 64)
                prefetch(buf, g + 127)
        if pos + 16 > n:
            read_counts[0] += 1   # R_TRUNCATED_RECORD
            return k, n, True
        if swap:
            sec = _be32(buf, pos)
            frac = _be32(buf, pos + 4)
            cl = _be32(buf, pos + 8)
            wl = _be32(buf, pos + 12)
        else:
            sec = _le32(buf, pos)
            frac = _le32(buf, pos + 4)
            cl = _le32(buf, pos + 8)
            wl = _le32(buf, pos + 12)
        if cl > (1 << 24):
            read_counts[1] += 1   # R_GARBAGE
            return k, n, True
        if pos + 16 + cl > n:
            read_counts[0] += 1
            return k, n, True
        if frac >= frac_lim:
            read_counts[2] += 1   # R_BAD_TIMESTAMP
            pos += 16 + cl
            continue
        ts_ns[k] = sec * 1_000_000_000 + frac * mul
        p = pos + 16
        r = _decode_one(buf, p, p + cl, p + (wl if wl >= cl else cl), lt, op_cls, op_ext)
        kind[k] = r[0]
        fam[k] = r[1]
        src_hi[k] = r[2]
        src_lo[k] = r[3]
        dst_hi[k] = r[4]
        dst_lo[k] = r[5]
        qpn[k] = r[6]
        sport[k] = r[7]
        dport[k] = r[8]
        payload[k] = r[9]
        seq[k] = r[10]
        opcode[k] = r[11]
        if r[12] >= 0:
            counts[r[12]] += 1
        k += 1
        pos += 16 + cl
    return k, pos, True


@numba.njit(cache=True, inline="always")
def _le32(b, o):
    return (np.int64(b[o]) | (np.int64(b[o + 1]) << 8)
            | (np.int64(b[o + 2]) << 16) | (np.int64(b[o + 3]) << 24))


def empty_decoded(n: int) -> Decoded:
    return Decoded(
        kind=np.zeros(n, np.int8), fam=np.zeros(n, np.uint8),
        src_hi=np.zeros(n, np.uint64), src_lo=np.zeros(n, np.uint64),
        dst_hi=np.zeros(n, np.uint64), dst_lo=np.zeros(n, np.uint64),
        qpn=np.zeros(n, np.uint32), sport=np.zeros(n, np.uint16), dport=np.zeros(n, np.uint16),
        payload=np.zeros(n, np.int64), seq=np.zeros(n, np.uint32), opcode=np.zeros(n, np.uint8),
        skipped=np.zeros(N_DECODE_REASONS, np.int64),
    )


def iter_pcap_decoded(buf: np.ndarray, *, swap: bool, nano: bool, linktype: int, read_counts: np.ndarray,
                      chunk: int = 1 << 20, ahead: int = PREFETCH_RECORDS):
    """Yield (ts_ns, Decoded, bytes read) chunks of a classic pcap held in ``buf`` (header at 0).
    ``ahead``: prefetch distance in records (0: none); results do not depend on it."""
    pos = 24
    while True:
        ts = np.empty(chunk, np.int64)
        d = empty_decoded(chunk)
        k, pos, done = _pcap_fused_kernel(buf, pos, swap, nano, linktype, chunk, ahead, OP_CLASS, OP_EXT, ts,
                                          d.kind, d.fam, d.src_hi, d.src_lo, d.dst_hi, d.dst_lo, d.qpn,
                                          d.sport, d.dport, d.payload, d.seq, d.opcode, d.skipped,
                                          read_counts)
        if k:
            cut = Decoded(**{f.name: (getattr(d, f.name) if f.name == "skipped" else getattr(d, f.name)[:k])
                             for f in dataclasses.fields(Decoded)})
            yield ts[:k], cut, int(pos)
        if done:
            return
