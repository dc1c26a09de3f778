"""The two real Soft-RoCE captures decode as their README says, and as tshark says."""

from __future__ import annotations

import subprocess
from collections import Counter

import pytest
from nic_testlib import EXT
from pulse.nic.convert import convert_file
from pulse.nic.pcapfile import read_file


def _tshark_payloads(tshark, path):
    out = subprocess.run([tshark, "-r", str(path), "-T", "fields", "-e", "ip.src", "-e", "ip.dst",
                          "-e", "infiniband.bth.opcode", "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.padcnt",
                          "-e", "udp.length"], capture_output=True, text=True, check=True).stdout
    data, acks, mads, other = Counter(), Counter(), 0, 0
    reqs = Counter()
    for line in out.splitlines():
        src, dst, op, qp, pad, ulen = (line.split("\t") + [""] * 6)[:6]
        if not op:
            other += 1
            continue
        op, qp = int(op), int(qp, 16)
        if qp == 1:
            mads += 1
        elif op == 0x11:
            acks[(src, dst, qp)] += 1
        elif op == 0x0C:
            reqs[(src, dst, qp)] += 1
        else:
            data[(src, dst, qp)] += int(ulen) - 8 - 12 - EXT[op & 0x1F] - int(pad) - 4
    return data, acks, reqs, mads, other


@pytest.mark.parametrize("name,a,b,resp_qp,n,n_other", [
    ("softroce-read-write-ecn.pcap", "192.168.65.4", "192.168.65.5", 0x11, 12, 0),
    ("softroce-test.pcap", "192.168.2.24", "192.168.2.25", 0x17, 16, 4),
])
def test_real_capture(real_captures, tshark, name, a, b, resp_qp, n, n_other):
    path = real_captures / name
    assert read_file(path).n == n
    conv = convert_file(path)
    s = conv.summary
    assert s["packets"] == n
    # MADs on QP1 (CM request/reply/ready-to-use and more) are not data
    assert s["decoded"]["roce_mad"] == s["skipped"]["roce_mad"] == 5
    assert s["skipped"].get("non_ip", 0) == n_other
    data, acks, reqs, mads, other = _tshark_payloads(tshark, path)
    assert mads == 5 and other == n_other
    flows = {(f["src"], f["dst"], f["dest_qpn"]): f for f in s["flows"] if f["node"] == f["src"]}
    got = {k: f["tx_bytes"] for k, f in flows.items() if f["tx_packets"]}
    assert got == dict(data)
    # the WRITE Only goes b -> a on QP 0x11; the READ response (First/Middle/Middle/Last)
    # carries 4 KiB back to the requester b, keyed by the requester's QPN
    assert flows[(b, a, 0x11)]["tx_packets"] == 1
    assert flows[(a, b, resp_qp)]["tx_bytes"] == 4096
    assert flows[(a, b, resp_qp)]["tx_packets"] == 4
    assert flows[(b, a, 0x11)]["requests"] == 1 == sum(reqs.values())
    assert sum(f["acks"] for f in flows.values()) == sum(acks.values()) == 1
    # rx side mirrors tx side on the other node
    rx = {(f["src"], f["dst"], f["dest_qpn"]): f["rx_bytes"] for f in s["flows"] if f["node"] == f["dst"]}
    assert {k: v for k, v in rx.items() if v} == {k: v for k, v in got.items() if v}
