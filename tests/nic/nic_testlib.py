"""Independent builders and naive references for the nic tests (scapy, struct, pure Python).

Nothing here imports pulse.nic: these are the yardsticks the numba code is held to.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass

from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1AD, Dot1Q, Ether
from scapy.packet import Raw

# Extension header bytes after BTH per RC opcode, from the IBA spec tables (written out
# again here on purpose, not imported from pulse.nic).
EXT = {0x00: 0, 0x01: 0, 0x02: 0, 0x03: 4, 0x04: 0, 0x05: 4, 0x06: 16, 0x07: 0, 0x08: 0, 0x09: 4,
       0x0A: 16, 0x0B: 20, 0x0C: 16, 0x0D: 4, 0x0E: 0, 0x0F: 4, 0x10: 4, 0x11: 4, 0x12: 12,
       0x13: 28, 0x14: 28}
DATA_OPS = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0D, 0x0E, 0x0F, 0x10]


def _ETH() -> Ether:  # explicit MACs: scapy would otherwise resolve routes (slow, IPv6)
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")


@dataclass
class Pkt:
    frame: bytes
    ts_ns: int
    src: str
    dst: str
    qpn: int | None      # RoCE destination QPN
    ports: tuple[int, int] | None
    payload: int         # payload bytes (data packets), 0 otherwise
    kind: str            # data / ack / nak / cnp / request / mad / tcp / other


def roce_frame(src: str, dst: str, opcode: int, qpn: int, payload: int, *, pad: int = 0, v6: bool = False,
               vlans: int = 0, syndrome: int = 0, sport: int = 49152) -> bytes:
    ext = EXT.get(opcode & 0x1F, 0)
    extb = bytearray(ext)
    if (opcode & 0x1F) in (0x11, 0x12, 0x0D, 0x0F, 0x10):
        extb[0] = syndrome
    body = bytes(extb) + bytes(random.getrandbits(8) for _ in range(min(payload, 64))) + bytes(max(0, payload - 64))
    body += bytes(pad)
    l3 = (IPv6(src=src, dst=dst) if v6 else IP(src=src, dst=dst))
    pkt = l3 / UDP(sport=sport, dport=4791) / BTH(opcode=opcode, padcount=pad, dqpn=qpn, psn=1) / Raw(body)
    l2 = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
    if vlans == 1:
        l2 = l2 / Dot1Q(vlan=10)
    elif vlans == 2:
        l2 = l2 / Dot1AD(vlan=20) / Dot1Q(vlan=10)
    return bytes(l2 / pkt)


def tcp_frame(src: str, dst: str, sport: int, dport: int, seq: int, payload: int, *, v6: bool = False,
              opts: bool = False) -> bytes:
    l3 = (IPv6(src=src, dst=dst) if v6 else IP(src=src, dst=dst))
    tcp = TCP(sport=sport, dport=dport, seq=seq, flags="PA",
              options=[("NOP", None), ("NOP", None), ("Timestamp", (1, 2))] if opts else [])
    return bytes(_ETH() / l3 / tcp / Raw(b"z" * payload))


def random_roce_traffic(rng: random.Random, n: int, t0_ns: int, *, v6: bool = False) -> list[Pkt]:
    hosts = ([f"fd00::{i}" for i in range(1, 4)] if v6 else [f"10.1.0.{i}" for i in range(1, 4)])
    out = []
    t = t0_ns
    for _ in range(n):
        t += rng.randint(0, 40_000)
        s, d = rng.sample(hosts, 2)
        qpn = rng.choice([0x11, 0x12, 0x345])
        r = rng.random()
        pad = 0
        if r < 0.6:
            op = rng.choice(DATA_OPS)
            pl = rng.choice([0, 1, 7, 256, 1024, 4096])
            pad = (-pl) % 4
            kind = "data"
        elif r < 0.7:
            op, pl, kind = 0x11, 0, "ack"
        elif r < 0.75:
            op, pl, kind = 0x11, 0, "nak"
        elif r < 0.85:
            op, pl, kind = 0x0C, 0, "request"
        elif r < 0.92:
            op, pl, kind = 0x81, 0, "cnp"
        else:
            op, pl, kind, qpn = 0x64, 0, "mad", 1
        if op == 0x81:
            frame = bytes(_ETH() / (IPv6(src=s, dst=d) if v6 else IP(src=s, dst=d)) / UDP(sport=1, dport=4791)
                          / BTH(opcode=0x81, dqpn=qpn) / Raw(bytes(16)))
        elif kind == "mad":
            frame = bytes(_ETH() / (IPv6(src=s, dst=d) if v6 else IP(src=s, dst=d)) / UDP(sport=1, dport=4791)
                          / BTH(opcode=0x64, dqpn=1) / Raw(bytes(8 + 256)))
        else:
            frame = roce_frame(s, d, op, qpn, pl, pad=pad, v6=v6, vlans=rng.choice([0, 0, 1, 2]),
                               syndrome=0x60 if kind == "nak" else 0)
        out.append(Pkt(frame, t, s, d, qpn, None, pl if kind == "data" else 0, kind))
    return out


# -- capture writers (struct, independent of the readers) ----------------------------------

def write_pcap(path: str, pkts: list[tuple[int, bytes]] | list[Pkt], *, nano: bool = True, big: bool = False,
               linktype: int = 1, snaplen: int = 262144) -> None:
    e = ">" if big else "<"
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    with open(path, "wb") as fh:
        fh.write(struct.pack(e + "IHHiIII", magic, 2, 4, 0, 0, snaplen, linktype))
        for p in pkts:
            ts, frame = (p.ts_ns, p.frame) if isinstance(p, Pkt) else p
            sec, ns = divmod(ts, 1_000_000_000)
            frac = ns if nano else ns // 1000
            cap = frame[:snaplen]
            fh.write(struct.pack(e + "IIII", sec, frac, len(cap), len(frame)) + cap)


def _opt(e: str, code: int, value: bytes) -> bytes:
    return struct.pack(e + "HH", code, len(value)) + value + bytes((-len(value)) % 4)


def _block(e: str, btype: int, body: bytes) -> bytes:
    n = 12 + len(body)
    return struct.pack(e + "II", btype, n) + body + struct.pack(e + "I", n)


def pcapng_shb(big: bool = False) -> bytes:
    e = ">" if big else "<"
    return _block(e, 0x0A0D0D0A, struct.pack(e + "IHHq", 0x1A2B3C4D, 1, 0, -1))


def pcapng_idb(linktype: int = 1, *, big: bool = False, tsresol: int | None = None, tsoffset: int | None = None,
               name: str | None = None, snaplen: int = 0) -> bytes:
    e = ">" if big else "<"
    opts = b""
    if name is not None:
        opts += _opt(e, 2, name.encode())
    if tsresol is not None:
        opts += _opt(e, 9, bytes([tsresol]))
    if tsoffset is not None:
        opts += _opt(e, 14, struct.pack(e + "q", tsoffset))
    if opts:
        opts += _opt(e, 0, b"")
    return _block(e, 1, struct.pack(e + "HHI", linktype, 0, snaplen) + opts)


def pcapng_epb(iface: int, ts_units: int, frame: bytes, *, big: bool = False, wirelen: int | None = None) -> bytes:
    e = ">" if big else "<"
    body = struct.pack(e + "IIIII", iface, ts_units >> 32, ts_units & 0xFFFFFFFF, len(frame),
                       len(frame) if wirelen is None else wirelen)
    return _block(e, 6, body + frame + bytes((-len(frame)) % 4))


def pcapng_spb(frame: bytes, *, big: bool = False) -> bytes:
    e = ">" if big else "<"
    return _block(e, 3, struct.pack(e + "I", len(frame)) + frame + bytes((-len(frame)) % 4))


def pcapng_unknown(big: bool = False) -> bytes:
    e = ">" if big else "<"
    return _block(e, 0x0BAD, b"\x01\x02\x03\x04")


def to_units(ts_ns: int, tsresol: int | None) -> int:
    """ns -> pcapng timestamp units (floor), the inverse of the spec's definition."""
    if tsresol is None:
        tsresol = 6
    if tsresol & 0x80:
        return (ts_ns << (tsresol & 0x7F)) // 1_000_000_000
    return ts_ns * 10 ** (tsresol) // 1_000_000_000


def units_to_ns(units: int, tsresol: int | None, offset_s: int = 0) -> int:
    if tsresol is None:
        tsresol = 6
    if tsresol & 0x80:
        return (units * 1_000_000_000 >> (tsresol & 0x7F)) + offset_s * 1_000_000_000
    return units * 1_000_000_000 // 10 ** tsresol + offset_s * 1_000_000_000


# -- naive references ------------------------------------------------------------------------

def naive_read_pcap(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(ts_ns, caplen, wirelen, bytes) per complete record of a classic pcap."""
    magic = data[:4]
    e = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    nano = struct.unpack(e + "I", magic)[0] == 0xA1B23C4D
    out = []
    pos = 24
    while pos + 16 <= len(data):
        sec, frac, cl, wl = struct.unpack_from(e + "IIII", data, pos)
        if cl > (1 << 24) or pos + 16 + cl > len(data):
            break
        if frac < (1_000_000_000 if nano else 1_000_000):
            out.append((sec * 1_000_000_000 + frac * (1 if nano else 1000), cl, max(wl, cl),
                        data[pos + 16:pos + 16 + cl]))
        pos += 16 + cl
    return out


def naive_bins(entries: list[tuple[str, int, int]], epoch_ns: int) -> dict[tuple[str, int], int]:
    """(flow key, ts_ns, bytes) -> {(flow key, absolute epoch): bytes}."""
    out: dict[tuple[str, int], int] = {}
    for key, ts, b in entries:
        if b:
            k = (key, ts // epoch_ns)
            out[k] = out.get(k, 0) + b
    return out
