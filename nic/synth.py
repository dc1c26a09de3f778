"""Write large synthetic RoCEv2 captures quickly with numpy (for ``pulse bench pcap``).

Every packet is Ethernet/IPv4/UDP(4791)/BTH/[RETH]/payload/ICRC. Each QP connection is a
fixed (src, dst, dest QPN); packets cycle over the connections, alternating WRITE_FIRST
(with RETH), WRITE_MIDDLE and WRITE_LAST, every ``ack_every``-th packet an ACK back.
Returns the exact payload bytes per connection so callers can check totals.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

_ETH = bytes.fromhex("02000000000102000000000208004500")


def write_roce_pcap(path: str | Path, n_packets: int, *, payload: int = 1024, n_hosts: int = 16,
                    qps_per_pair: int = 4, gap_ns: int = 100, t0_ns: int = 1_700_000_000_000_000_000,
                    snaplen: int = 0, chunk: int = 1 << 17, seed: int = 0) -> dict:
    """Write ``n_packets`` RoCEv2 packets to a nanosecond pcap. ``snaplen`` > 0 cuts the
    captured bytes (headers stay). Returns {"packets", "data_bytes", "acks"}."""
    rng = np.random.default_rng(seed)
    pairs = np.array([(a, b) for a in range(n_hosts) for b in range(n_hosts) if a != b], np.int64)
    rng.shuffle(pairs)
    nconn = len(pairs) * qps_per_pair
    conn_src = np.repeat(pairs[:, 0], qps_per_pair)
    conn_dst = np.repeat(pairs[:, 1], qps_per_pair)
    conn_qpn = 0x100 + np.arange(nconn, dtype=np.int64)
    # Frame: 14 eth + 20 ip + 8 udp + 12 bth + 16 reth (only on FIRST; else zeros in payload
    # room) -> fixed frame length: headers 54 + 16 + payload + 4 ICRC.
    frame = 14 + 20 + 8 + 12 + 16 + payload + 4
    cap = frame if snaplen <= 0 else min(frame, snaplen)
    rec = 16 + cap
    total_data = 0
    acks = 0
    with open(path, "wb") as fh:
        fh.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, max(cap, 65535), 1))
        for start in range(0, n_packets, chunk):
            m = min(chunk, n_packets - start)
            i = np.arange(start, start + m, dtype=np.int64)
            c = i % nconn
            phase = (i // nconn) % 3          # 0 FIRST, 1 MIDDLE, 2 LAST
            ack = (i % 16) == 15
            opcode = np.where(phase == 0, 0x06, np.where(phase == 1, 0x07, 0x08))
            src = np.where(ack, conn_dst[c], conn_src[c])
            dst = np.where(ack, conn_src[c], conn_dst[c])
            qpn = np.where(ack, conn_qpn[c] + 0x10000, conn_qpn[c])
            # header bytes after BTH: RETH (16) for FIRST, AETH (4) for ACK, 0 otherwise;
            # UDP length keeps the frame fixed by moving the difference into payload.
            ext = np.where(ack, 4, np.where(phase == 0, 16, 0))
            opcode = np.where(ack, 0x11, opcode)
            pl = np.where(ack, 0, 16 + payload - ext)
            ulen = 8 + 12 + ext + pl + 4
            iplen = 20 + ulen
            wire = 14 + iplen
            total_data += int(pl.sum())
            acks += int(ack.sum())
            buf = np.zeros((m, rec), np.uint8)
            ts = t0_ns + i * gap_ns
            hdr = np.zeros((m, 4), "<u4")
            hdr[:, 0] = ts // 1_000_000_000
            hdr[:, 1] = ts % 1_000_000_000
            hdr[:, 2] = np.minimum(wire, cap)
            hdr[:, 3] = wire
            buf[:, :16] = hdr.view(np.uint8).reshape(m, 16)
            f = buf[:, 16:]
            f[:, :16] = np.frombuffer(_ETH, np.uint8)
            f[:, 16] = iplen >> 8
            f[:, 17] = iplen & 0xFF
            f[:, 22] = 64
            f[:, 23] = 17
            for off, val in ((26, 0x0A000000 + src), (30, 0x0A000000 + dst)):
                for j in range(4):
                    f[:, off + j] = (val >> (24 - 8 * j)) & 0xFF
            sport = 49152 + (c & 0x3FFF)
            f[:, 34], f[:, 35] = sport >> 8, sport & 0xFF
            f[:, 36], f[:, 37] = 4791 >> 8, 4791 & 0xFF
            f[:, 38], f[:, 39] = ulen >> 8, ulen & 0xFF
            f[:, 42] = opcode
            f[:, 44], f[:, 45] = 0xFF, 0xFF
            f[:, 47], f[:, 48], f[:, 49] = (qpn >> 16) & 0xFF, (qpn >> 8) & 0xFF, qpn & 0xFF
            psn = i // nconn
            f[:, 51], f[:, 52], f[:, 53] = (psn >> 16) & 0xFF, (psn >> 8) & 0xFF, psn & 0xFF
            # frames shorter than the fixed record (ACKs) leave trailing zeros: trim per record
            keep = np.minimum(wire, cap) + 16
            if (keep == rec).all():
                fh.write(buf.tobytes())
            else:
                mask = np.arange(rec)[None, :] < keep[:, None]
                fh.write(buf[mask].tobytes())
    return {"packets": n_packets, "data_bytes": total_data, "acks": acks, "connections": nconn}
