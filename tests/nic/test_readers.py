"""Classic pcap and pcapng readers against struct-written files and a naive reader."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nic_testlib import (
    naive_read_pcap,
    pcapng_epb,
    pcapng_idb,
    pcapng_shb,
    pcapng_spb,
    pcapng_unknown,
    roce_frame,
    to_units,
    units_to_ns,
    write_pcap,
)
from pulse.nic.pcapfile import read_buffer, read_file

from pulse.errors import DecodeError, PulseError

T0 = 1_764_460_800_123_456_789


def _frames(n: int, seed: int = 1) -> list[tuple[int, bytes]]:
    rng = random.Random(seed)
    out = []
    t = T0
    for _ in range(n):
        t += rng.randint(1, 50_000)
        out.append((t, roce_frame("10.0.0.1", "10.0.0.2", 0x0A, 0x11, rng.choice([0, 4, 100, 1000]))))
    return out


@pytest.mark.parametrize("nano", [True, False])
@pytest.mark.parametrize("big", [True, False])
def test_classic_pcap_matches_naive_reader(tmp_path, nano, big):
    pkts = _frames(50)
    p = tmp_path / "x.pcap"
    write_pcap(str(p), pkts, nano=nano, big=big, snaplen=90)
    ix = read_file(p)
    ref = naive_read_pcap(p.read_bytes())
    assert ix.n == len(ref) == 50
    assert ix.fmt == ("pcap-ns" if nano else "pcap-us")
    assert ix.ts_ns.tolist() == [r[0] for r in ref]
    assert ix.caplen.tolist() == [r[1] for r in ref]
    assert ix.wirelen.tolist() == [r[2] for r in ref]
    assert [bytes(ix.data[o:o + c]) for o, c in zip(ix.offset, ix.caplen, strict=True)] == [r[3] for r in ref]
    # us files lose the sub-us digits, ns files keep them
    expect = [t if nano else t // 1000 * 1000 for t, _ in pkts]
    assert ix.ts_ns.tolist() == expect
    assert not ix.skip_counts()


@pytest.mark.parametrize("big", [False, True])
def test_pcapng_interfaces_tsresol_offset(tmp_path, big):
    frames = _frames(40, seed=2)
    # interfaces: default us, 10^-9, 10^-3, 2^-20, 2^-30 with an offset, 2^-32
    res = [None, 9, 3, 0x80 | 20, 0x80 | 30, 0x80 | 32]
    offs = [None, None, None, None, -3600, 5]
    blob = pcapng_shb(big) + b"".join(
        pcapng_idb(1, big=big, tsresol=r, tsoffset=o, name=f"mlx5_{i}") for i, (r, o) in enumerate(zip(res, offs, strict=True)))
    expect = []
    for j, (t, f) in enumerate(frames):
        i = j % len(res)
        off = offs[i] or 0
        units = to_units(t - off * 1_000_000_000, res[i])
        blob += pcapng_epb(i, units, f, big=big)
        expect.append((units_to_ns(units, res[i], off), i, len(f)))
        if j == 5:
            blob += pcapng_spb(f, big=big) + pcapng_unknown(big)
    p = tmp_path / "x.pcapng"
    p.write_bytes(blob)
    ix = read_file(p)
    assert ix.fmt == "pcapng"
    assert ix.if_names == [f"mlx5_{i}" for i in range(len(res))]
    assert ix.iface.tolist() == [e[1] for e in expect]
    assert ix.ts_ns.tolist() == [e[0] for e in expect]
    assert ix.caplen.tolist() == [e[2] for e in expect]
    # each lands within one unit of the true time
    for (t, _), got, r in zip(frames, ix.ts_ns.tolist(), [res[j % len(res)] for j in range(len(frames))], strict=True):
        unit = 1e9 / (2 ** (r & 0x7F) if r and r & 0x80 else 10 ** (6 if r is None else r))
        assert abs(got - t) <= max(unit, 1)
    assert ix.skip_counts() == {"simple_packet_no_timestamp": 1, "unknown_block": 1}


def test_pcapng_two_sections_different_byte_orders(tmp_path):
    f = _frames(2, seed=3)
    blob = (pcapng_shb(False) + pcapng_idb(1, tsresol=9) + pcapng_epb(0, f[0][0], f[0][1])
            + pcapng_shb(True) + pcapng_idb(1, big=True, tsresol=9, name="b") + pcapng_epb(0, f[1][0], f[1][1], big=True))
    ix = read_buffer(np.frombuffer(blob, np.uint8))
    assert ix.n == 2
    assert ix.iface.tolist() == [0, 1]          # interface ids restart per section
    assert ix.ts_ns.tolist() == [f[0][0], f[1][0]]


def test_truncated_last_packet_is_counted(tmp_path):
    p = tmp_path / "x.pcap"
    write_pcap(str(p), _frames(10))
    data = p.read_bytes()
    p.write_bytes(data[:-7])
    ix = read_file(p)
    assert ix.n == 9
    assert ix.skip_counts() == {"truncated_record": 1}


def test_garbage_record_header_stops_and_counts(tmp_path):
    p = tmp_path / "x.pcap"
    write_pcap(str(p), _frames(3))
    p.write_bytes(p.read_bytes() + b"\xff" * 40)
    ix = read_file(p)
    assert ix.n == 3
    assert ix.skip_counts() == {"garbage": 1}


def test_not_a_capture(tmp_path):
    p = tmp_path / "x.pcap"
    p.write_bytes(b"hello world, this is not a pcap file")
    with pytest.raises(DecodeError, match="not a pcap or pcapng"):
        read_file(p)
    with pytest.raises(DecodeError, match="no such capture file"):
        read_file(tmp_path / "missing.pcap")
    (tmp_path / "empty.pcap").write_bytes(b"")
    with pytest.raises(DecodeError, match="too short"):
        read_file(tmp_path / "empty.pcap")


def _valid_pcap_bytes() -> bytes:
    import io
    import struct
    buf = io.BytesIO()
    buf.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
    for t, f in _frames(6, seed=9):
        buf.write(struct.pack("<IIII", t // 10**9, t % 10**9, len(f), len(f)) + f)
    return buf.getvalue()


def _valid_pcapng_bytes() -> bytes:
    f = _frames(4, seed=10)
    return pcapng_shb() + pcapng_idb(1, tsresol=9) + b"".join(pcapng_epb(0, t, x) for t, x in f)


def _check_index(ix, size):
    assert ix.n >= 0
    if ix.n:
        assert int(ix.offset.min()) >= 0
        assert int((ix.offset + ix.caplen).max()) <= size
        assert int(ix.iface.max()) < len(ix.if_linktype)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_mutated_files_never_crash(data):
    base = bytearray(data.draw(st.sampled_from([_valid_pcap_bytes(), _valid_pcapng_bytes()])))
    for _ in range(data.draw(st.integers(0, 12))):
        i = data.draw(st.integers(0, len(base) - 1))
        base[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(base)))
    blob = bytes(base[:cut]) + data.draw(st.binary(max_size=64))
    try:
        ix = read_buffer(np.frombuffer(blob, np.uint8) if blob else np.zeros(0, np.uint8))
    except DecodeError:
        return
    _check_index(ix, len(blob))
    # and the decoder + binner on whatever was indexed
    from pulse.nic.binner import CaptureBinner, Chunk
    from pulse.nic.decode import decode_packets
    d = decode_packets(ix.data, ix.offset, ix.caplen, ix.wirelen, ix.iface, ix.if_linktype)
    b = CaptureBinner(epoch_ns=1000, window_ns=10**6, iface_names=ix.if_names)
    try:
        b.feed(Chunk(ix.ts_ns, ix.iface, d))
        b.flush(final=True)
    except PulseError:
        pass


@settings(max_examples=60, deadline=None)
@given(blob=st.binary(min_size=0, max_size=400))
def test_fuzz_random_bytes(blob):
    for head in (b"", _valid_pcap_bytes()[:24], _valid_pcapng_bytes()[:28 + 20]):
        data = head + blob
        try:
            ix = read_buffer(np.frombuffer(data, np.uint8) if data else np.zeros(0, np.uint8))
        except DecodeError:
            continue
        _check_index(ix, len(data))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_fused_pcap_path_equals_index_then_decode(data):
    """The one-pass walk+decode of classic pcap gives exactly what index + decode give."""
    import os
    import tempfile

    from pulse.nic.decode import decode_packets
    from pulse.nic.pcapfile import open_capture

    base = bytearray(_valid_pcap_bytes())
    for _ in range(data.draw(st.integers(0, 10))):
        i = data.draw(st.integers(24, len(base) - 1))
        base[i] = data.draw(st.integers(0, 255))
    blob = bytes(base[:data.draw(st.integers(24, len(base)))])
    fd, name = tempfile.mkstemp(suffix=".pcap")
    try:
        os.write(fd, blob)
        os.close(fd)
        cap = open_capture(name)
        chunks = list(cap.chunks(chunk=data.draw(st.integers(1, 8))))
        ix = read_buffer(np.frombuffer(blob, np.uint8))
        ref = decode_packets(ix.data, ix.offset, ix.caplen, ix.wirelen, ix.iface, ix.if_linktype)
        ts = np.concatenate([c[0] for c in chunks]) if chunks else np.zeros(0, np.int64)
        assert ts.tolist() == ix.ts_ns.tolist()
        for col in ("kind", "fam", "src_lo", "dst_lo", "qpn", "sport", "dport", "payload"):
            got = np.concatenate([getattr(c[2], col) for c in chunks]) if chunks else np.zeros(0)
            assert got.tolist() == getattr(ref, col).tolist(), col
        assert cap.skip_counts() == ix.skip_counts()
        assert sum((c[2].skipped for c in chunks), np.zeros_like(ref.skipped)).tolist() == ref.skipped.tolist()
    finally:
        os.unlink(name)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fused_pcap_prefetch_distance_changes_nothing(data):
    """The prefetching walk (guessed record positions, mixed record lengths, a cut last
    record, records too short for their headers) gives exactly index + decode, whatever
    the prefetch distance."""
    import io
    import struct

    from pulse.nic.decode import decode_packets, iter_pcap_decoded

    rng = random.Random(data.draw(st.integers(0, 2**32)))
    n = data.draw(st.integers(0, 200))
    out = io.BytesIO()
    out.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1))
    t = T0
    for _ in range(n):
        t += rng.randint(0, 40_000)
        f = roce_frame("10.0.0.1", "10.0.0.2", rng.choice([0x0A, 0x11, 0x06]), 0x11,
                       rng.choice([0, 8, 256, 1024, 1024, 1024, 4000]))
        cut = rng.choice([len(f), len(f), len(f), rng.randint(0, len(f))])
        out.write(struct.pack("<IIII", t // 10**9, t % 10**9, cut, len(f)) + f[:cut])
    blob = out.getvalue()
    blob = blob[:data.draw(st.integers(24, len(blob)))]
    buf = np.frombuffer(blob, np.uint8)
    ix = read_buffer(buf)
    ref = decode_packets(ix.data, ix.offset, ix.caplen, ix.wirelen, ix.iface, ix.if_linktype)
    for ahead in (0, 1, 3, 16, 64):
        counts = np.zeros(9, np.int64)
        chunks = list(iter_pcap_decoded(buf, swap=False, nano=True, linktype=1, read_counts=counts,
                                        chunk=data.draw(st.sampled_from([7, 64, 1 << 20])), ahead=ahead))
        ts = np.concatenate([c[0] for c in chunks]) if chunks else np.zeros(0, np.int64)
        assert ts.tolist() == ix.ts_ns.tolist()
        for col in ("kind", "fam", "src_lo", "dst_lo", "qpn", "sport", "dport", "payload", "seq", "opcode"):
            got = np.concatenate([getattr(c[1], col) for c in chunks]) if chunks else np.zeros(0)
            assert got.tolist() == getattr(ref, col).tolist(), (ahead, col)
        assert counts[:8].tolist() == ix.skipped.tolist()


@pytest.mark.parametrize(("tsresol", "units", "tsoffset"), [
    (None, ((1 << 31) - 1) << 32, None),        # ts_high just under 2^31 at the default µs: 2^63 ns would wrap
    (9, (1 << 63) - 1, None),                   # ns units: the largest value is past 2116
    (0x80 | 20, ((1 << 31) - 1) << 32, None),   # 2^-20 s units: seconds beyond 2116
    (None, 1_764_460_800_000_000, 1 << 40),     # a fine timestamp with an absurd if_tsoffset
    (None, 1_764_460_800_000_000, -(1 << 40)),  # ... or one that takes it below 1970
])
def test_pcapng_timestamps_that_would_overflow_are_counted_not_wrapped(tmp_path, tsresol, units, tsoffset):
    frame = roce_frame("10.0.0.1", "10.0.0.2", 0x0A, 0x11, 100)
    good = to_units(T0, tsresol) if tsoffset is None else units
    blob = (pcapng_shb() + pcapng_idb(1, tsresol=tsresol, tsoffset=tsoffset)
            + pcapng_epb(0, units, frame) + pcapng_epb(0, good, frame))
    p = tmp_path / "x.pcapng"
    p.write_bytes(blob)
    ix = read_file(p)
    got = ix.ts_ns.tolist()
    assert all(0 <= t < 1 << 62 for t in got), got  # never 1970-wrapped or negative
    assert ix.skip_counts().get("bad_timestamp", 0) == (2 if tsoffset is not None else 1)
    assert len(got) == (0 if tsoffset is not None else 1)
