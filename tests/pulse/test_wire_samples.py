"""Epoch-sample batches: round trips, validation, and hostile bytes."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from wire_strategies import NAME, batches

from pulse import samples
from pulse.errors import DecodeError, EncodeError, PulseError


def _batch(**over: object) -> samples.EpochBatch:
    args: dict[str, object] = dict(node="node-00", nic="mlx5_0", t0_ns=10, epoch_ns=32_000, batch_seq=7,
                                   flow=[1, 1, 2], epoch=[0, 3, 1], tx_bytes=[10, 20, 30])
    args.update(over)
    return samples.make_batch(**args)  # type: ignore[arg-type]


def _decode_or_pulse_error(raw: bytes) -> samples.EpochBatch | None:
    """Decoding hostile bytes may fail only with a PulseError; if it succeeds, the result
    must be a valid batch that encodes back to exactly those bytes (nothing silently altered)."""
    try:
        got = samples.decode(raw)
    except PulseError:
        return None
    assert samples.encode(got) == raw
    return got


@given(batches())
def test_round_trip(batch: samples.EpochBatch) -> None:
    raw = samples.encode(batch)
    got = samples.decode(raw)
    assert got == batch
    assert (got.rx_bytes is None) == (batch.rx_bytes is None)
    assert samples.encode(got) == raw
    for col in (got.flow, got.epoch, got.tx_bytes):
        assert col.dtype == np.dtype("<u4")


@given(batches(with_rx=True))
def test_round_trip_with_rx(batch: samples.EpochBatch) -> None:
    got = samples.decode(samples.encode(batch))
    assert got.rx_bytes is not None and batch.rx_bytes is not None
    assert np.array_equal(got.rx_bytes, batch.rx_bytes)


@given(batches(with_rx=False))
def test_round_trip_without_rx(batch: samples.EpochBatch) -> None:
    raw = samples.encode(batch)
    assert samples.decode(raw).rx_bytes is None
    assert len(raw) == samples.HEADER_SIZE + len(batch.job) + len(batch.node) + len(batch.nic) + 12 * batch.n_rows


@given(batches(), st.data())
def test_every_truncation_is_rejected(batch: samples.EpochBatch, data: st.DataObject) -> None:
    raw = samples.encode(batch)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        samples.decode(raw[:cut])


def test_truncation_at_every_length() -> None:
    raw = samples.encode(_batch(rx_bytes=[1, 0, 5]))
    for cut in range(len(raw)):
        with pytest.raises(DecodeError, match=r"shorter|truncated"):
            samples.decode(raw[:cut])


@given(batches(), st.binary(min_size=1, max_size=16))
def test_trailing_bytes_rejected(batch: samples.EpochBatch, extra: bytes) -> None:
    with pytest.raises(DecodeError, match="oversized"):
        samples.decode(samples.encode(batch) + extra)


@given(batches(max_rows=8), st.data())
def test_bit_flips_never_crash_or_alter_silently(batch: samples.EpochBatch, data: st.DataObject) -> None:
    raw = bytearray(samples.encode(batch))
    for _ in range(data.draw(st.integers(1, 3))):
        bit = data.draw(st.integers(0, 8 * len(raw) - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
    _decode_or_pulse_error(bytes(raw))


@given(batches(max_rows=8), st.data())
def test_corrupted_bytes(batch: samples.EpochBatch, data: st.DataObject) -> None:
    raw = bytearray(samples.encode(batch))
    start = data.draw(st.integers(0, len(raw) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=8))
    raw[start:start + len(junk)] = junk
    _decode_or_pulse_error(bytes(raw))


@given(st.binary(max_size=200))
def test_random_bytes(raw: bytes) -> None:
    _decode_or_pulse_error(raw)


@given(st.binary(max_size=120))
def test_random_bytes_after_a_valid_magic(tail: bytes) -> None:
    _decode_or_pulse_error(samples.MAGIC + struct.pack("<H", samples.VERSION) + tail)


def _header(**over: int) -> bytes:
    fields = dict(magic=samples.MAGIC, version=1, flags=0, epoch_ns=32_000, n=0, seq=0, t0=0, lj=0, ln=1, lc=1)
    fields.update(over)  # type: ignore[arg-type]
    return samples._HEAD.pack(*fields.values())


@pytest.mark.parametrize(("raw", "match"), [
    (b"XXXX" + bytes(samples.HEADER_SIZE), "bad magic"),
    (_header(version=3) + b"ab", "unsupported batch version 3"),
    (_header(flags=2) + b"ab", "unknown flag bits"),
    (_header(epoch_ns=999) + b"ab", "epoch_ns=999"),
    (_header(epoch_ns=1_000_000_001) + b"ab", "epoch_ns"),
    (_header(n=(1 << 26) + 1) + b"ab", "claims"),
    (_header(n=0xFFFFFFFF) + b"ab", "claims"),
    (_header(ln=0) + b"b", "node="),
    (_header(ln=1, lc=1) + b"a/", "nic="),
    (_header(ln=1, lc=1) + b"\xff\xfe", "not UTF-8"),
    (_header(ln=2, lc=1) + b"..b", "node="),
    (_header(n=2) + b"ab" + struct.pack("<6I", 5, 4, 0, 0, 1, 1), "not strictly sorted"),
    (_header(n=2) + b"ab" + struct.pack("<6I", 4, 4, 1, 1, 1, 1), "not strictly sorted"),
    (_header(n=1) + b"ab" + struct.pack("<3I", 4, 1, 0), "carries no bytes"),
    (_header(n=1, flags=1) + b"ab" + struct.pack("<4I", 4, 1, 0, 0), "carries no bytes"),
])
def test_decoder_names_the_problem(raw: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        samples.decode(raw)


def test_rx_only_row_is_valid() -> None:
    raw = _header(n=1, flags=1) + b"ab" + struct.pack("<4I", 4, 1, 0, 9)
    got = samples.decode(raw)
    assert got.tx_bytes.tolist() == [0] and got.rx_bytes is not None and got.rx_bytes.tolist() == [9]


def test_decode_accepts_bytes_like_views() -> None:
    batch = _batch()
    raw = samples.encode(batch)
    assert samples.decode(bytearray(raw)) == batch
    assert samples.decode(memoryview(raw)) == batch
    assert samples.decode(memoryview(b"xx" + raw)[2:]) == batch
    assert samples.decode(np.frombuffer(raw, dtype=np.uint8)) == batch
    aligned = _batch(job="a")  # 88 bytes: viewable as uint32 words
    words = np.frombuffer(samples.encode(aligned), dtype="<u4")
    assert samples.decode(memoryview(words)) == aligned  # read as its raw bytes
    with pytest.raises(DecodeError):
        samples.decode(memoryview(words)[::2])  # not contiguous


@pytest.mark.parametrize("bad", [None, 12, "PLSE", [1, 2], object()])
def test_decode_rejects_non_bytes(bad: object) -> None:
    with pytest.raises(DecodeError):
        samples.decode(bad)  # type: ignore[arg-type]


def test_decoded_arrays_are_read_only() -> None:
    got = samples.decode(samples.encode(_batch()))
    with pytest.raises(ValueError):
        got.flow[0] = 5


@pytest.mark.parametrize(("over", "match"), [
    (dict(node=""), "node="),
    (dict(node="a b"), "node="),
    (dict(node=".."), "node="),
    (dict(node="node-00\n"), "node="),
    (dict(nic="."), "nic="),
    (dict(nic="x" * 129), "nic="),
    (dict(job="j/k"), "job="),
    (dict(node=5), "node must be a string"),
    (dict(epoch_ns=999), "epoch_ns"),
    (dict(epoch_ns=1_000_000_001), "epoch_ns"),
    (dict(epoch_ns=32_000.5), "epoch_ns"),
    (dict(epoch_ns="32000"), "epoch_ns"),
    (dict(batch_seq=-1), "batch_seq"),
    (dict(batch_seq=1 << 64), "batch_seq"),
    (dict(batch_seq=True), "batch_seq"),
    (dict(t0_ns=1 << 63), "t0_ns"),
    (dict(t0_ns=1.5), "t0_ns"),
    (dict(flow=[1, 1]), "lengths differ"),
    (dict(tx_bytes=[1, 2, 3, 4]), "lengths differ"),
    (dict(rx_bytes=[1]), "lengths differ"),
    (dict(flow=[[1, 1, 2]]), "one-dimensional"),
    (dict(flow=[1.0, 1.0, 2.0]), "integers"),
    (dict(flow=[True, True, False]), "integers"),
    (dict(flow=[1, 1, -2]), "outside uint32"),
    (dict(tx_bytes=[1, 2, 1 << 32]), "outside uint32"),
    (dict(flow=[2, 1, 1]), "not strictly sorted"),
    (dict(epoch=[0, 0, 1]), "not strictly sorted"),
    (dict(tx_bytes=[1, 0, 3]), "carries no bytes"),
    (dict(tx_bytes=[1, 0, 3], rx_bytes=[0, 0, 1]), "carries no bytes"),
])
def test_make_batch_validates(over: dict[str, object], match: str) -> None:
    with pytest.raises(EncodeError, match=match):
        _batch(**over)


def test_make_batch_accepts_numpy_integers_and_empty() -> None:
    b = _batch(epoch_ns=np.int64(1000), batch_seq=np.uint64((1 << 64) - 1), t0_ns=np.int64(-5),
               flow=np.array([1, 1, 2], dtype=np.int64))
    assert samples.decode(samples.encode(b)) == b
    empty = _batch(flow=[], epoch=[], tx_bytes=[])
    got = samples.decode(samples.encode(empty))
    assert got.n_rows == 0 and got.end_ns() == empty.t0_ns


def test_encode_rejects_a_hand_built_inconsistent_batch() -> None:
    good = _batch()
    bad = samples.EpochBatch(node=good.node, nic=good.nic, t0_ns=0, epoch_ns=32_000, batch_seq=0,
                             flow=good.flow, epoch=good.epoch[:2], tx_bytes=good.tx_bytes)
    with pytest.raises(EncodeError, match="lengths"):
        samples.encode(bad)
    neg = samples.EpochBatch(node=good.node, nic=good.nic, t0_ns=0, epoch_ns=32_000, batch_seq=-1,
                             flow=good.flow, epoch=good.epoch, tx_bytes=good.tx_bytes)
    with pytest.raises(EncodeError):
        samples.encode(neg)


def test_end_ns() -> None:
    b = _batch(t0_ns=1_000, epoch_ns=2_000, epoch=[0, 3, 1])
    assert b.end_ns() == 1_000 + 4 * 2_000


@given(NAME)
def test_names_are_safe_path_components(name: str) -> None:
    assert samples.check_name("node", name) == name
    assert "/" not in name and name not in (".", "..")
