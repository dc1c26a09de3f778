"""Trace directories: write/read round trips and damaged files."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from wire_strategies import batches, hook_events, record_of

from pulse import records, samples, trace
from pulse.errors import PulseError, TraceError


def _batch(seq: int = 0, node: str = "node-00", nic: str = "mlx5_0") -> samples.EpochBatch:
    return samples.make_batch(node=node, nic=nic, t0_ns=1000 * seq, epoch_ns=32_000, batch_seq=seq,
                              flow=[1, 2], epoch=[0, 0], tx_bytes=[4, 5], rx_bytes=[0, 1])


def _write_nic_file(path: Path, batches: list[samples.EpochBatch]) -> bytes:
    raw = trace._FILE_HEAD.pack(trace.FILE_MAGIC, trace.FILE_VERSION)
    for b in batches:
        enc = samples.encode(b)
        raw += struct.pack("<I", len(enc)) + enc
    path.write_bytes(raw)
    return raw


@given(st.lists(batches(max_rows=10), max_size=6), st.lists(hook_events, max_size=6),
       st.lists(record_of(records.OpLevel), max_size=3), st.booleans())
def test_trace_directory_round_trip(batch_list: list[samples.EpochBatch], event_list: list[object],
                                    oplevels: list[records.OpLevel], with_truth: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "trace"
        truth = {"scenario": "nic-slow", "culprits": ["node-03"], "onset_ns": 5}
        with trace.TraceWriter(d, job="job-1", epoch_ns=32_000, meta={"scenario": "x"}) as w:
            for b in batch_list:
                w.write_batch(b)
            w.write_events(event_list)  # type: ignore[arg-type]
            for r in oplevels:
                w.write_oplevel(r)
            if with_truth:
                w.write_truth(truth)
        assert w.batches_written == len(batch_list) and w.events_written == len(event_list)
        r = trace.TraceReader(d)
        assert r.meta == {"format": "pulse-trace", "v": 1, "job": "job-1", "epoch_ns": 32_000, "scenario": "x",
                          "complete": True}
        assert r.complete
        got = list(r.batches())
        key = lambda b: (b.node, b.nic)  # noqa: E731
        # per NIC file, batches come back in write order
        for nk in {key(b) for b in batch_list}:
            assert [b for b in got if key(b) == nk] == [b for b in batch_list if key(b) == nk]
        assert len(got) == len(batch_list)
        assert sorted({(n, c) for n, c, _ in r.nic_files()}) == sorted({key(b) for b in batch_list})
        assert list(r.events()) == event_list
        assert list(r.oplevel()) == oplevels
        assert r.has_truth() == with_truth
        if with_truth:
            assert trace.read_truth(d) == truth


def test_layout_on_disk(tmp_path: Path) -> None:
    with trace.TraceWriter(tmp_path, job="j", epoch_ns=32_000) as w:
        w.write_batch(_batch(0))
        w.write_batch(_batch(1))
        w.write_batch(_batch(0, node="node-01", nic="mlx5_3"))
    raw = (tmp_path / "samples" / "node-00" / "mlx5_0.batches").read_bytes()
    assert raw[:8] == b"PLSTRACE" and struct.unpack_from("<I", raw, 8) == (1,)
    (n,) = struct.unpack_from("<I", raw, 12)
    assert samples.decode(raw[16:16 + n]) == _batch(0)
    assert (tmp_path / "samples" / "node-01" / "mlx5_3.batches").is_file()
    assert (tmp_path / "hook-events.jsonl").read_bytes() == b""
    assert orjson.loads((tmp_path / "meta.json").read_bytes())["format"] == "pulse-trace"


def test_a_second_writer_never_appends_to_a_trace(tmp_path: Path) -> None:
    with trace.TraceWriter(tmp_path) as w:
        w.write_batch(_batch(0))
    with pytest.raises(TraceError, match="already holds a trace"):
        trace.TraceWriter(tmp_path)
    assert [b.batch_seq for b in trace.TraceReader(tmp_path).batches()] == [0]
    with trace.TraceWriter(tmp_path, replace=True) as w:
        w.write_batch(_batch(1))
    assert [b.batch_seq for b in trace.TraceReader(tmp_path).batches()] == [1]


def test_a_killed_writer_leaves_a_readable_prefix_marked_incomplete(tmp_path: Path) -> None:
    """No close (SIGKILL): meta.json already says incomplete, flushed records read back."""
    w = trace.TraceWriter(tmp_path, job="j", epoch_ns=32_000)
    w.write_batch(_batch(0))
    w.write_batch(_batch(1))
    w.flush()
    f = tmp_path / "samples" / "node-00" / "mlx5_0.batches"
    with open(f, "ab") as fh:  # a record the writer was in the middle of
        fh.write(struct.pack("<I", 500) + b"x" * 20)
    r = trace.TraceReader(tmp_path)
    assert not r.complete and r.meta["job"] == "j"
    stats: dict[str, int] = {}
    got = list(r.batches(tolerate_truncation=True, stats=stats))
    assert [b.batch_seq for b in got] == [0, 1]
    assert stats == {"truncated_records": 1, "truncated_bytes": 24}


def test_a_writer_left_by_an_exception_records_it(tmp_path: Path) -> None:
    with pytest.raises(OSError), trace.TraceWriter(tmp_path) as w:
        w.write_batch(_batch(0))
        raise OSError("device went away")
    r = trace.TraceReader(tmp_path)
    assert not r.complete and "device went away" in r.meta["error"]


def test_truncated_file_at_every_length(tmp_path: Path) -> None:
    full = _write_nic_file(tmp_path / "full.batches", [_batch(0), _batch(1), _batch(2)])
    rec = len(full[12:]) // 3
    boundaries = {12 + k * rec for k in range(4)}
    p = tmp_path / "cut.batches"
    for cut in range(len(full)):
        p.write_bytes(full[:cut])
        if cut < 12:
            with pytest.raises(TraceError):
                list(trace.read_batch_file(p))
            continue
        complete = (cut - 12) // rec
        if cut in boundaries:  # a cut between records is a valid, shorter file
            assert len(list(trace.read_batch_file(p))) == complete
            continue
        with pytest.raises(TraceError, match=f"{p.name}: (truncated|record at offset)"):
            list(trace.read_batch_file(p))
        stats: dict[str, int] = {}
        got = list(trace.read_batch_file(p, tolerate_truncation=True, stats=stats))
        assert [b.batch_seq for b in got] == list(range(complete))
        assert stats == {"truncated_records": 1, "truncated_bytes": cut - 12 - complete * rec}


def _read_or_pulse_error(p: Path) -> None:
    try:
        got = list(trace.read_batch_file(p))
    except PulseError:
        return
    for b in got:
        assert samples.decode(samples.encode(b)) == b


@given(st.binary(max_size=300))
def test_random_bytes(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "x.batches"
        p.write_bytes(raw)
        _read_or_pulse_error(p)
        p.write_bytes(trace.FILE_MAGIC + struct.pack("<I", 1) + raw)
        _read_or_pulse_error(p)


@given(st.lists(batches(max_rows=6), min_size=1, max_size=3), st.data())
def test_bit_flips_and_corruption(batch_list: list[samples.EpochBatch], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "x.batches"
        raw = bytearray(_write_nic_file(p, batch_list))
        if data.draw(st.booleans()):
            bit = data.draw(st.integers(0, 8 * len(raw) - 1))
            raw[bit // 8] ^= 1 << (bit % 8)
        else:
            start = data.draw(st.integers(0, len(raw) - 1))
            junk = data.draw(st.binary(min_size=1, max_size=8))
            raw[start:start + len(junk)] = junk
        p.write_bytes(bytes(raw))
        _read_or_pulse_error(p)


def test_bad_file_headers(tmp_path: Path) -> None:
    p = tmp_path / "x.batches"
    p.write_bytes(b"PLSTRACX" + struct.pack("<I", 1))
    with pytest.raises(TraceError, match="not a Pulse batch file"):
        list(trace.read_batch_file(p))
    p.write_bytes(b"PLSTRACE" + struct.pack("<I", 2))
    with pytest.raises(TraceError, match="version 2"):
        list(trace.read_batch_file(p))
    with pytest.raises(TraceError, match="cannot read"):
        list(trace.read_batch_file(tmp_path / "missing.batches"))
    with pytest.raises(TraceError, match="cannot read"):
        list(trace.read_batch_file(tmp_path))


def test_bad_batch_inside_a_file_names_file_and_offset(tmp_path: Path) -> None:
    p = tmp_path / "x.batches"
    raw = bytearray(_write_nic_file(p, [_batch(0), _batch(1)]))
    second = 12 + 4 + len(samples.encode(_batch(0)))
    raw[second + 4: second + 8] = b"XXXX"
    p.write_bytes(bytes(raw))
    with pytest.raises(TraceError, match=rf"x\.batches@{second}: bad magic"):
        list(trace.read_batch_file(p))


def test_huge_record_length(tmp_path: Path) -> None:
    p = tmp_path / "x.batches"
    p.write_bytes(trace.FILE_MAGIC + struct.pack("<II", 1, 0xFFFFFFFF) + b"abc")
    with pytest.raises(TraceError, match="claims 4294967295 bytes"):
        list(trace.read_batch_file(p))


def test_reader_rejects_what_is_not_a_trace(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="not a directory"):
        trace.TraceReader(tmp_path / "nope")
    with pytest.raises(TraceError, match="not a Pulse trace"):
        trace.TraceReader(tmp_path)
    (tmp_path / "samples").mkdir()
    assert trace.TraceReader(tmp_path).meta == {}
    for content, match in [(b"{", "not valid JSON"), (b"[]", "not a pulse-trace"),
                           (b'{"format": "other"}', "not a pulse-trace"),
                           (b'{"format": "pulse-trace", "v": 2}', "version 2")]:
        (tmp_path / "meta.json").write_bytes(content)
        with pytest.raises(TraceError, match=match):
            trace.TraceReader(tmp_path)
    (tmp_path / "meta.json").unlink()
    (tmp_path / "meta.json").mkdir()
    with pytest.raises(TraceError, match=r"meta\.json"):
        trace.TraceReader(tmp_path)


def test_bad_event_line_names_file_and_line(tmp_path: Path) -> None:
    ev = b'{"type":"flow","v":1,"job":"","node":"n","nic":"m","flow":3}\n'
    (tmp_path / "hook-events.jsonl").write_bytes(ev + b"\n" + ev + b'{"type":"flow","v":1}\n')
    r = trace.TraceReader(tmp_path)
    with pytest.raises(TraceError, match=r"hook-events\.jsonl:4: missing field"):
        list(r.events())
    (tmp_path / "oplevel.jsonl").write_bytes(b"\xff\xfe\n")
    with pytest.raises(TraceError, match=r"oplevel\.jsonl:1: not valid JSON"):
        list(r.oplevel())
    (tmp_path / "hook-events.jsonl").unlink()
    (tmp_path / "hook-events.jsonl").mkdir()
    with pytest.raises(TraceError, match=r"hook-events\.jsonl"):
        list(r.events())


def test_read_truth_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"no truth\.json"):
        trace.read_truth(tmp_path)
    (tmp_path / "truth.json").write_bytes(b"[1]")
    with pytest.raises(TraceError, match="JSON object"):
        trace.read_truth(tmp_path)
    (tmp_path / "truth.json").write_bytes(b"{")
    with pytest.raises(TraceError, match="not valid JSON"):
        trace.read_truth(tmp_path / "truth.json")
    (tmp_path / "truth.json").unlink()
    (tmp_path / "truth.json").mkdir()
    with pytest.raises(TraceError, match=r"truth\.json"):
        trace.read_truth(tmp_path / "truth.json")
