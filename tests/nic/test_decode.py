"""RoCEv2 / TCP decoding and binning against scapy-built traffic and tshark."""

from __future__ import annotations

import functools
import random
import struct
import subprocess
from collections import Counter, defaultdict

import pytest
from nic_testlib import EXT, Pkt, random_roce_traffic, roce_frame, tcp_frame, write_pcap
from pulse.nic.convert import convert_file

from pulse.errors import DecodeError

T0 = 1_764_460_800_000_000_000 + 123_456_789


def _bins_from(conv, epoch_ns):
    """{(node, dir, src, dst, qpn or ports, abs epoch): bytes} from batches + flow events."""
    keys = {}
    for ev in conv.events:
        k = ev.qpn if ev.qpn is not None else ev.remote_qpn
        keys[(ev.node, ev.nic, ev.flow)] = (ev.src, ev.dst, k if ev.transport == "roce" else (ev.sport, ev.dport))
    out = Counter()
    for b in conv.batches:
        for f, e, tx, rx in zip(b.flow.tolist(), b.epoch.tolist(), b.tx_bytes.tolist(), b.rx_bytes.tolist(), strict=True):
            ep = (b.t0_ns + e * b.epoch_ns) // epoch_ns
            src, dst, q = keys[(b.node, b.nic, f)]
            if tx:
                out[(b.node, "tx", src, dst, q, ep)] += tx
            if rx:
                out[(b.node, "rx", src, dst, q, ep)] += rx
    return dict(out)


def _expected_bins(pkts: list[Pkt], epoch_ns: int, ts_of=lambda p: p.ts_ns):
    out = Counter()
    for p in pkts:
        if p.payload:
            q = p.qpn if p.qpn is not None else p.ports
            ep = ts_of(p) // epoch_ns
            out[(p.src, "tx", p.src, p.dst, q, ep)] += p.payload
            out[(p.dst, "rx", p.src, p.dst, q, ep)] += p.payload
    return dict(out)


@functools.cache
def _traffic(seed: int, n: int, v6: bool = False) -> tuple[Pkt, ...]:
    return tuple(random_roce_traffic(random.Random(seed), n, T0, v6=v6))


@pytest.mark.parametrize("v6", [False, True])
@pytest.mark.parametrize("epoch_ns", [1000, 32000, 1_000_000])
def test_roce_bins_match_scapy_ground_truth(tmp_path, v6, epoch_ns):
    pkts = list(_traffic(7, 200, v6))
    p = tmp_path / "roce.pcap"
    write_pcap(str(p), pkts, nano=True)
    conv = convert_file(p, epoch_ns=epoch_ns, window_ns=epoch_ns * 50)
    assert _bins_from(conv, epoch_ns) == _expected_bins(pkts, epoch_ns)
    # the flow counters
    kinds = Counter(x.kind for x in pkts)
    flows = conv.summary["flows"]
    tx_side = [f for f in flows if f["node"] == f["src"]]
    assert sum(f["acks"] for f in tx_side) == kinds["ack"]
    assert sum(f["naks"] for f in tx_side) == kinds["nak"]
    assert sum(f["cnps"] for f in tx_side) == kinds["cnp"]
    assert sum(f["requests"] for f in tx_side) == kinds["request"]
    assert sum(f["tx_packets"] for f in tx_side) == kinds["data"]
    assert conv.summary["skipped"].get("roce_mad", 0) == kinds["mad"]
    # batches are per node/NIC and valid on the wire
    from pulse.samples import decode, encode
    for b in conv.batches:
        assert decode(encode(b)) == b


def test_us_timestamps_land_in_the_right_epochs(tmp_path):
    # packets straddling epoch edges: exactly at k*E, at k*E - 1 ns
    E = 4000
    base = T0 // E * E
    times = [base, base - 1, base + E - 1, base + E, base + 3 * E + 999, base + 3 * E + 1000]
    pkts = [Pkt(roce_frame("10.0.0.1", "10.0.0.2", 0x0A, 0x11, 100 + i), t, "10.0.0.1", "10.0.0.2", 0x11, None,
                100 + i, "data") for i, t in enumerate(times)]
    for nano in (True, False):
        p = tmp_path / f"t{nano}.pcap"
        write_pcap(str(p), pkts, nano=nano)
        conv = convert_file(p, epoch_ns=E)
        ts_of = (lambda x: x.ts_ns) if nano else (lambda x: x.ts_ns // 1000 * 1000)
        assert _bins_from(conv, E) == _expected_bins(pkts, E, ts_of)


def test_tshark_agrees_on_per_flow_bytes(tmp_path, tshark):
    pkts = random_roce_traffic(random.Random(11), 200, T0)
    p = tmp_path / "roce.pcap"
    write_pcap(str(p), pkts, nano=True)
    out = subprocess.run([tshark, "-r", str(p), "-Y", "infiniband", "-T", "fields", "-e", "ip.src", "-e", "ip.dst",
                          "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.padcnt",
                          "-e", "udp.length"], capture_output=True, text=True, check=True).stdout
    ref = Counter()
    for line in out.splitlines():
        src, dst, op, qp, pad, ulen = line.split("\t")
        op = int(op)
        low = op & 0x1F
        if op == 0x81 or op >= 0x60 or low in (0x0C, 0x11, 0x12, 0x13, 0x14):
            continue
        ref[(src, dst, int(qp, 16))] += int(ulen) - 8 - 12 - EXT[low] - int(pad) - 4
    conv = convert_file(p)
    got = {(f["src"], f["dst"], f["dest_qpn"]): f["tx_bytes"] for f in conv.summary["flows"]
           if f["node"] == f["src"] and f["tx_bytes"]}
    assert got == {k: v for k, v in ref.items() if v}


def test_local_address_set_gives_one_node(tmp_path):
    pkts = random_roce_traffic(random.Random(5), 150, T0)
    p = tmp_path / "roce.pcap"
    write_pcap(str(p), pkts)
    conv = convert_file(p, local=["10.1.0.1"], node="gpu-node-7")
    assert {b.node for b in conv.batches} == {"gpu-node-7"}
    tx = sum(x.payload for x in pkts if x.src == "10.1.0.1")
    rx = sum(x.payload for x in pkts if x.dst == "10.1.0.1")
    assert sum(int(b.tx_bytes.sum()) for b in conv.batches) == tx
    assert sum(int(b.rx_bytes.sum()) for b in conv.batches) == rx
    assert conv.summary["skipped"]["not_local"] == sum(
        1 for x in pkts if x.kind != "mad" and "10.1.0.1" not in (x.src, x.dst))
    # flow ids dense per NIC in first-seen order
    ids = [e.flow for e in conv.events]
    assert ids == list(range(len(ids)))


def test_snaplen_cut_packets_count_in_full(tmp_path):
    pkts = random_roce_traffic(random.Random(3), 100, T0)
    full = tmp_path / "full.pcap"
    cut = tmp_path / "cut.pcap"
    write_pcap(str(full), pkts)
    write_pcap(str(cut), pkts, snaplen=78)   # eth+vlan*2+ip+udp+bth = 70: headers survive
    a, b = convert_file(full), convert_file(cut)
    assert _bins_from(a, 32000) == _bins_from(b, 32000)
    tiny = tmp_path / "tiny.pcap"
    write_pcap(str(tiny), [*pkts, Pkt(tcp_frame("1.1.1.1", "2.2.2.2", 1, 2, 0, 10), T0, "", "", None, None, 0, "")],
               snaplen=30)
    with pytest.raises(DecodeError, match="no usable"):
        convert_file(tiny)


def _sll(frame_l3: bytes, proto: int) -> bytes:
    return struct.pack(">HHH8sH", 0, 1, 6, b"\x02" * 8, proto) + frame_l3


def _sll2(frame_l3: bytes, proto: int) -> bytes:
    return struct.pack(">HHIHBB8s", proto, 0, 1, 1, 0, 6, b"\x02" * 8) + frame_l3


def test_link_types(tmp_path):
    eth = roce_frame("10.0.0.1", "10.0.0.2", 0x04, 0x22, 300)
    l3 = eth[14:]
    for lt, frame in ((113, _sll(l3, 0x0800)), (276, _sll2(l3, 0x0800)), (101, l3), (228, l3)):
        p = tmp_path / f"lt{lt}.pcap"
        write_pcap(str(p), [(T0, frame)], linktype=lt)
        conv = convert_file(p)
        assert [f["tx_bytes"] for f in conv.summary["flows"] if f["tx_bytes"]] == [300], lt
    # raw InfiniBand: LRH (local, LNH=2) + BTH + RETH + payload + ICRC (+ VCRC on the wire)
    payload = 512
    bth = struct.pack(">BBHII", 0x0A, 0, 0xFFFF, 0x000033, 7)
    pktlen = (8 + 12 + 16 + payload + 4) // 4
    lrh = struct.pack(">BBHHH", 0x00, 0x02, 0x0005, pktlen, 0x0009)
    ib = lrh + bth + bytes(16) + bytes(payload) + bytes(4) + bytes(2)
    p = tmp_path / "ib.pcap"
    write_pcap(str(p), [(T0, ib)], linktype=247)
    conv = convert_file(p)
    f = [x for x in conv.summary["flows"] if x["tx_bytes"]]
    assert [(x["src"], x["dst"], x["dest_qpn"], x["tx_bytes"]) for x in f] == [("lid-9", "lid-5", 0x33, payload)]
    # unknown link type and non-IP frames are skipped and counted
    p = tmp_path / "unk.pcap"
    write_pcap(str(p), [(T0, eth)], linktype=147)
    with pytest.raises(DecodeError, match="unknown_linktype 1"):
        convert_file(p)
    arp = bytes(12) + b"\x08\x06" + bytes(28)
    p = tmp_path / "mixed.pcap"
    write_pcap(str(p), [(T0, arp), (T0 + 1, eth)])
    assert convert_file(p).summary["skipped"] == {"non_ip": 1}


def _naive_retrans(segments):
    hi = {}
    out = []
    for key, seq, ln in segments:
        if ln <= 0:
            out.append(0)
            continue
        end = (seq + ln) % 2**32
        if key not in hi:
            hi[key] = end
            out.append(0)
            continue
        def d(a, b):
            return ((a - b + 2**31) % 2**32) - 2**31
        if d(end, hi[key]) <= 0:
            out.append(ln)
        else:
            out.append(max(0, -d(seq, hi[key])))
            hi[key] = end
    return out


def test_tcp_bytes_and_retransmissions(tmp_path):
    rng = random.Random(4)
    segs = []
    pkts = []
    t = T0
    nxt = {1: 2**32 - 3000, 2: 100}   # flow 1 wraps around 2^32
    for _ in range(200):
        c = rng.choice([1, 2])
        ln = rng.choice([0, 100, 1448])
        if rng.random() < 0.2 and nxt[c] > 3000:
            seq = (nxt[c] - rng.choice([ln, ln // 2, 3000])) % 2**32   # retransmission / overlap
        else:
            seq = nxt[c]
            nxt[c] = (nxt[c] + ln) % 2**32
        t += rng.randint(1, 20_000)
        sport = 40000 + c
        pkts.append(Pkt(tcp_frame("10.9.0.1", "10.9.0.2", sport, 5000, seq, ln, opts=c == 2), t, "10.9.0.1",
                        "10.9.0.2", None, (sport, 5000), ln, "tcp"))
        segs.append((c, seq, ln))
    p = tmp_path / "tcp.pcap"
    write_pcap(str(p), pkts)
    conv = convert_file(p, epoch_ns=8000)
    assert _bins_from(conv, 8000) == _expected_bins(pkts, 8000)
    ref = _naive_retrans(segs)
    flows = {f["sport"]: f for f in conv.summary["flows"] if f["node"] == "10.9.0.1"}
    for c in (1, 2):
        r = [x for (cc, _, _), x in zip(segs, ref, strict=True) if cc == c]
        assert flows[40000 + c]["retransmitted_bytes"] == sum(r)
        assert flows[40000 + c]["retransmitted_packets"] == sum(1 for x in r if x)
        assert flows[40000 + c]["tx_bytes"] == sum(ln for cc, _, ln in segs if cc == c)


def test_flow_events_bind_addresses_and_qpns(tmp_path):
    pkts = [Pkt(roce_frame("10.0.0.1", "10.0.0.2", 0x0A, 0x11, 64), T0, "10.0.0.1", "10.0.0.2", 0x11, None, 64, "data"),
            Pkt(roce_frame("10.0.0.2", "10.0.0.1", 0x11, 0x17, 0), T0 + 5, "10.0.0.2", "10.0.0.1", 0x17, None, 0, "ack")]
    p = tmp_path / "x.pcap"
    write_pcap(str(p), pkts)
    conv = convert_file(p)
    evs = {(e.node, e.flow): e for e in conv.events}
    a = evs[("10.0.0.1", 0)]
    assert (a.transport, a.src, a.dst, a.remote_qpn, a.qpn, a.source) == ("roce", "10.0.0.1", "10.0.0.2", 0x11, None, "capture")
    b = evs[("10.0.0.2", 0)]
    assert (b.qpn, b.remote_qpn) == (0x11, None)
    ack_flows = [e for e in conv.events if 0x17 in (e.qpn, e.remote_qpn)]
    assert {(e.node, e.flow) for e in ack_flows} == {("10.0.0.2", 1), ("10.0.0.1", 1)}
    per = defaultdict(int)
    for f in conv.summary["flows"]:
        per[f["dest_qpn"]] += f["acks"]
    assert per[0x17] == 2   # counted on both sides' flow


@pytest.mark.parametrize("v6", [False, True])
def test_an_ip_length_beyond_the_packet_is_malformed_not_counted(tmp_path, v6):
    """A header claiming more bytes than the packet carried on the wire must not inflate the
    flow's volume (a damaged or forged capture): the packet is dropped as malformed."""
    src, dst = ("fd00::1", "fd00::2") if v6 else ("10.0.0.1", "10.0.0.2")
    good = tcp_frame(src, dst, 5000, 6000, 1, 1000, v6=v6)
    bad = bytearray(good)
    if v6:
        struct.pack_into(">H", bad, 14 + 4, 65000)   # IPv6 payload length
    else:
        struct.pack_into(">H", bad, 14 + 2, 65000)   # IPv4 total length
    p = tmp_path / "x.pcap"
    write_pcap(str(p), [(T0, good), (T0 + 1000, bytes(bad))])
    conv = convert_file(p)
    tx = sum(int(b.tx_bytes.sum()) for b in conv.batches)
    assert tx == 1000, tx  # the good packet only
    assert conv.summary["skipped"].get("malformed") == 1, conv.summary["skipped"]
