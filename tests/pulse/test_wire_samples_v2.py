"""Epoch-sample batches, version 2 (delta-coded, byte-shuffled, LZ4): round trips, version
1 still read, and damaged or hostile bytes refused with a DecodeError."""

from __future__ import annotations

import struct
import zlib

import cramjam
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from wire_strategies import batches

from pulse import batchcodec, samples
from pulse.errors import DecodeError, EncodeError, PulseError


def _batch(**over: object) -> samples.EpochBatch:
    args: dict[str, object] = dict(node="node-00", nic="mlx5_0", t0_ns=10, epoch_ns=32_000, batch_seq=7,
                                   flow=[1, 1, 2, 9], epoch=[0, 3, 1, 1], tx_bytes=[10, 20, 30, 40],
                                   rx_bytes=[0, 600, 0, 1])
    args.update(over)
    return samples.make_batch(**args)  # type: ignore[arg-type]


def _names_end(raw: bytes) -> int:
    lj, ln, lc = struct.unpack_from("<HHH", raw, samples.HEADER_SIZE - 6)
    return samples.HEADER_SIZE + lj + ln + lc


def _decode_or_pulse_error(raw: bytes) -> samples.EpochBatch | None:
    """Damaged bytes either fail with a PulseError or decode to a valid batch that encodes
    back to exactly those bytes (nothing silently altered)."""
    try:
        got = samples.decode(raw)
    except PulseError:
        return None
    version = struct.unpack_from("<H", raw, 4)[0]
    assert samples.encode(got, version=version) == raw
    return got


@given(batches())
def test_round_trip(batch: samples.EpochBatch) -> None:
    raw = samples.encode(batch, version=2)
    got = samples.decode(raw)
    assert got == batch
    assert (got.rx_bytes is None) == (batch.rx_bytes is None)
    assert samples.encode(got, version=2) == raw
    for col in (got.flow, got.epoch, got.tx_bytes):
        assert col.dtype == np.dtype("<u4") and not col.flags.writeable


@given(batches())
def test_both_versions_decode_to_the_same_batch(batch: samples.EpochBatch) -> None:
    assert samples.decode(samples.encode(batch, version=1)) == samples.decode(samples.encode(batch, version=2))


def test_version_1_is_still_the_default_and_read() -> None:
    b = _batch()
    raw = samples.encode(b)
    assert struct.unpack_from("<H", raw, 4)[0] == 1
    assert samples.decode(raw) == b


def test_unknown_version_is_refused_both_ways() -> None:
    with pytest.raises(EncodeError, match="version 3"):
        samples.encode(_batch(), version=3)
    raw = bytearray(samples.encode(_batch(), version=2))
    raw[4:6] = struct.pack("<H", 3)
    with pytest.raises(DecodeError, match="unsupported batch version 3"):
        samples.decode(bytes(raw))


def test_smaller_than_version_1_on_a_regular_batch() -> None:
    rng = np.random.default_rng(1)
    flows = np.repeat(np.arange(100, 164, dtype=np.uint32), 200)
    epochs = np.tile(np.arange(1000, 1200, dtype=np.uint32), 64)
    tx = rng.integers(200_000, 340_000, flows.size).astype(np.uint32)
    b = _batch(flow=flows, epoch=epochs, tx_bytes=tx, rx_bytes=np.full(flows.size, 64, np.uint32))
    v1, v2 = samples.encode(b), samples.encode(b, version=2)
    assert len(v2) * 4 < len(v1)
    # and after Kafka's zstd too
    assert len(cramjam.zstd.compress(v2)) < len(cramjam.zstd.compress(v1))
    assert samples.decode(v2) == b


@given(batches(), st.data())
def test_every_truncation_is_refused(batch: samples.EpochBatch, data: st.DataObject) -> None:
    raw = samples.encode(batch, version=2)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        samples.decode(raw[:cut])


@given(batches(), st.binary(min_size=1, max_size=16))
def test_trailing_bytes_refused(batch: samples.EpochBatch, extra: bytes) -> None:
    with pytest.raises(DecodeError):
        samples.decode(samples.encode(batch, version=2) + extra)


@given(batches(max_rows=8), st.data())
def test_bit_flips_never_crash_or_alter_silently(batch: samples.EpochBatch, data: st.DataObject) -> None:
    raw = bytearray(samples.encode(batch, version=2))
    for _ in range(data.draw(st.integers(1, 3))):
        bit = data.draw(st.integers(0, 8 * len(raw) - 1))
        raw[bit // 8] ^= 1 << (bit % 8)
    _decode_or_pulse_error(bytes(raw))


@given(batches(max_rows=8), st.data())
def test_damaged_columns_are_refused(batch: samples.EpochBatch, data: st.DataObject) -> None:
    raw = bytearray(samples.encode(batch, version=2))
    start = _names_end(bytes(raw))
    if start == len(raw):
        return  # an empty batch has no columns to damage
    at = data.draw(st.integers(start, len(raw) - 1))
    raw[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(DecodeError):
        samples.decode(bytes(raw))


@given(batches(max_rows=8), st.binary(max_size=64))
def test_any_column_bytes_with_a_right_crc(batch: samples.EpochBatch, junk: bytes) -> None:
    """Whatever follows a valid header (with a CRC that matches, so the block is decompressed):
    a DecodeError or a valid batch, never another exception."""
    raw = samples.encode(batch, version=2)
    head = raw[:_names_end(raw)]
    try:
        got = samples.decode(head + zlib.crc32(junk).to_bytes(4, "little") + junk)
    except DecodeError:
        return
    samples.make_batch(node=got.node, nic=got.nic, job=got.job, t0_ns=got.t0_ns, epoch_ns=got.epoch_ns,
                       batch_seq=got.batch_seq, flow=got.flow, epoch=got.epoch, tx_bytes=got.tx_bytes,
                       rx_bytes=got.rx_bytes)


def _with_block(b: samples.EpochBatch, block: bytes) -> bytes:
    raw = samples.encode(b, version=2)
    return raw[:_names_end(raw)] + zlib.crc32(block).to_bytes(4, "little") + block


def test_block_larger_than_the_rows_is_refused() -> None:
    b = _batch()  # 4 rows with rx: 64 bytes of columns
    bomb = bytes(cramjam.lz4.compress_block(bytes(1 << 22), store_size=False))  # 4 MiB of zeros in a few bytes
    assert len(bomb) < 20_000
    with pytest.raises(DecodeError, match="do not decompress to the 64 bytes"):
        samples.decode(_with_block(b, bomb))


def test_not_lz4_is_refused() -> None:
    with pytest.raises(DecodeError, match="do not decompress"):
        samples.decode(_with_block(_batch(), b"\xff" * 40))


def test_a_wrong_crc_is_refused_before_decompressing() -> None:
    raw = bytearray(samples.encode(_batch(), version=2))
    raw[_names_end(bytes(raw))] ^= 1
    with pytest.raises(DecodeError, match="CRC-32"):
        samples.decode(bytes(raw))


def test_empty_batch() -> None:
    b = _batch(flow=[], epoch=[], tx_bytes=[], rx_bytes=None)
    raw = samples.encode(b, version=2)
    assert samples.decode(raw) == b
    with pytest.raises(DecodeError, match="0 rows"):
        samples.decode(raw + b"\x00")


def test_decoder_checks_rows_like_version_1() -> None:
    """Columns that decompress fine but break the batch rules (here: an empty row)."""
    b = _batch()
    cols = [np.diff(b.flow, prepend=np.uint32(0)), np.diff(b.epoch, prepend=np.uint32(0)),
            np.array([10, 20, 0, 40], np.uint32), np.array([0, 600, 0, 1], np.uint32)]
    payload = np.concatenate([batchcodec._shuffled(c) for c in cols]).tobytes()
    with pytest.raises(DecodeError, match="carries no bytes"):
        samples.decode(_with_block(b, bytes(cramjam.lz4.compress_block(payload, store_size=False))))


def test_a_header_that_claims_more_columns_than_the_block_holds_is_refused():
    # the header is outside the CRC; LZ4 decompression into a larger buffer pads with zeros,
    # so a flipped rx flag decoded to rows with rx 0 (found by the bit-flip property test)
    raw = bytearray(samples.encode(_batch(rx_bytes=None), version=2))
    flags = struct.unpack_from("<H", raw, 6)[0]
    struct.pack_into("<H", raw, 6, flags | samples.FLAG_RX)
    with pytest.raises(PulseError, match="decompress to"):
        samples.decode(bytes(raw))
