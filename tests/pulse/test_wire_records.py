"""JSON wire records: hook events (comm, flow, op), OpMetrics, Verdict, OpLevel."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from wire_strategies import HOOK_EVENT_TYPES, RECORD_TYPES, hook_events, record_of

from pulse import events, records
from pulse._schema import Record
from pulse.errors import DecodeError, EncodeError, PulseError

DECODERS: dict[type[Record], Callable[..., Record]] = {
    events.CommEvent: events.decode,
    events.FlowEvent: events.decode,
    events.OpEvent: events.decode,
    records.OpMetrics: records.decode_op_metrics,
    records.Verdict: records.decode_verdict,
    records.OpLevel: records.decode_oplevel,
}
ALL_TYPES = (*HOOK_EVENT_TYPES, *RECORD_TYPES)
any_record = st.sampled_from(ALL_TYPES).flatmap(lambda cls: record_of(cls).map(lambda r: (cls, r)))


def _encode(rec: Record) -> bytes:
    return events.encode(rec) if isinstance(rec, HOOK_EVENT_TYPES) else rec.to_json()  # type: ignore[arg-type]


def _decode_or_pulse_error(cls: type[Record], raw: bytes) -> Record | None:
    try:
        got = DECODERS[cls](raw)
    except PulseError:
        return None
    # Accepted bytes must give a well-formed record of a known type that survives a round trip.
    assert isinstance(got, ALL_TYPES)
    assert DECODERS[type(got)](_encode(got)) == got
    return got


@given(hook_events)
def test_hook_event_round_trip(event: events.HookEvent) -> None:
    raw = events.encode(event)
    got = events.decode(raw)
    assert type(got) is type(event)
    assert got == event
    assert events.decode(raw.decode()) == event  # str input too
    assert events.from_dict(orjson.loads(raw)) == event


@pytest.mark.parametrize("cls", RECORD_TYPES, ids=lambda c: c.TYPE)
@given(data=st.data())
def test_record_round_trip(cls: type[Record], data: st.DataObject) -> None:
    rec = data.draw(record_of(cls))
    raw = rec.to_json()
    got = DECODERS[cls](raw)
    assert got == rec
    assert got.to_json() == raw
    assert cls.from_dict(rec.to_dict()) == rec


@given(any_record, st.data())
def test_every_truncation_is_rejected(pair: tuple[type[Record], Record], data: st.DataObject) -> None:
    cls, rec = pair
    raw = _encode(rec)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        DECODERS[cls](raw[:cut])


@given(any_record, st.data())
def test_bit_flips(pair: tuple[type[Record], Record], data: st.DataObject) -> None:
    cls, rec = pair
    raw = bytearray(_encode(rec))
    bit = data.draw(st.integers(0, 8 * len(raw) - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    _decode_or_pulse_error(cls, bytes(raw))


@given(any_record, st.data())
def test_corrupted_bytes(pair: tuple[type[Record], Record], data: st.DataObject) -> None:
    cls, rec = pair
    raw = bytearray(_encode(rec))
    start = data.draw(st.integers(0, len(raw) - 1))
    junk = data.draw(st.binary(min_size=1, max_size=6) | st.sampled_from([b"1", b'"', b"null", b"-", b"}"]))
    raw[start:start + len(junk)] = junk
    _decode_or_pulse_error(cls, bytes(raw))


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.TYPE)
@given(raw=st.binary(max_size=120) | st.text(max_size=60).map(str.encode))
def test_random_bytes(cls: type[Record], raw: bytes) -> None:
    _decode_or_pulse_error(cls, raw)


@pytest.mark.parametrize("raw", [
    b"", b"null", b"[]", b"1", b'"x"', b"{", b"[" * 5000, b"\xff\xfe", b'{"type": 1}',
    b'{"type": "bogus", "v": 1}', b'{"type": "op", "v": 1}', b'{"type":"comm","v":1e999}',
    b'{"type":"flow","v":1,"job":"","node":"n","nic":"m","flow":123456789012345678901234567890}',
])
def test_hostile_json(raw: bytes) -> None:
    for decoder in set(DECODERS.values()):
        with pytest.raises(DecodeError):
            decoder(raw)


def _mutations(rec: Record) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """(what, dict) pairs, each a valid record's dict broken in one way."""
    base = rec.to_dict()
    required = [f.name for f in type(rec).FIELDS if f.required]
    typed = [f for f in type(rec).FIELDS if f.kind != "json"]
    wrong_values = {"int": ["1", 1.5, True, None, [1]], "float": ["1.0", True, [1.0]], "str": [1, True, ["a"]],
                    "bool": [0, 1, "true"], "list[int]": [1, ["a"], [True], [1.5]], "list[str]": ["a", [1]],
                    "list[list[int]]": [[1], [["a"]], 3]}

    def drop(name: str) -> tuple[str, dict[str, Any]]:
        d = dict(base)
        d.pop(name)
        return f"missing {name}", d

    def retype(args: tuple[Any, Any]) -> tuple[str, dict[str, Any]]:
        f, value = args
        d = dict(base)
        d[f.name] = value
        return f"{f.name} = {value!r}", d

    def extra(name: str) -> tuple[str, dict[str, Any]]:
        return f"unknown field {name}", {**base, name: 1}

    options = [
        st.sampled_from(required).map(drop),
        st.sampled_from(typed).flatmap(
            lambda f: st.sampled_from([v for v in wrong_values[f.kind] if v is not None or f.required])
            .map(lambda v: (f, v))).map(retype),
        st.text(min_size=1, max_size=8).filter(lambda k: k not in base).map(extra),
        # every version below the record's own (a v2 comm/op event's own is 2: its v2-only
        # fields make v=1 wrong) or above what the reader knows, and values that are not an
        # integer version at all; a record with nothing newer may say any version from its
        # own to the reader's (a reader accepts v=1..VERSION)
        st.sampled_from([v for v in (0, 1, 2, 3, 4, "1", None, 1.0001, True, 1.0)
                         if not (type(v) is int and base["v"] <= v <= type(rec).VERSION)])
        .map(lambda v: (f"v={v!r}", {**base, "v": v})),
    ]
    return st.one_of(*options)


@given(any_record, st.data())
def test_broken_records_are_rejected(pair: tuple[type[Record], Record], data: st.DataObject) -> None:
    cls, rec = pair
    what, broken = data.draw(_mutations(rec))
    with pytest.raises(DecodeError):
        DECODERS[cls](orjson.dumps(broken))
        pytest.fail(f"accepted a record with {what}")


JSON_INT_RANGE = (-(1 << 63), (1 << 64) - 1)  # what orjson can write


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.TYPE)
@given(data=st.data())
def test_out_of_range_and_choices(cls: type[Record], data: st.DataObject) -> None:
    base = data.draw(record_of(cls)).to_dict()
    for f in cls.FIELDS:
        bad: list[Any] = []
        if f.choices is not None:
            bad.append("not-a-choice")
        if f.bounds is not None:
            lo, hi = f.bounds
            if f.kind == "float":
                outside = [lo - 1.0, hi * 2 + 1.0]
            else:
                outside = [x for x in (lo - 1, hi + 1) if JSON_INT_RANGE[0] <= x <= JSON_INT_RANGE[1]]
            bad += [[x] for x in outside] if f.kind.startswith("list") else outside
        for value in bad:
            with pytest.raises(DecodeError, match=f.name):
                DECODERS[cls](orjson.dumps({**base, f.name: value}))


def test_error_messages_name_where() -> None:
    with pytest.raises(DecodeError, match=r"^hooks\.jsonl:7: unknown event type 'nope'"):
        events.decode(b'{"type": "nope"}', "hooks.jsonl:7")
    with pytest.raises(DecodeError, match="unsupported version v=2"):
        records.decode_verdict(b'{"type": "verdict", "v": 2}')
    with pytest.raises(DecodeError, match="type 'op' is not 'verdict'"):
        records.decode_verdict(b'{"type": "op", "v": 1}')


def _op(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = dict(type="op", v=1, job="j", node="node-00", comm_id="c1", rank=0, seq=1,
                             kind="AllReduce", count=4, dtype="float32", bytes=16)
    d.update(over)
    return d


@pytest.mark.parametrize(("over", "match"), [
    (dict(kind="Send"), "needs 'peer'"),
    (dict(kind="GroupP2P"), "needs 'peers'"),
    (dict(kind="GroupP2P", peers=[1, 2], peer_send_bytes=[1]), "peer_send_bytes"),
    (dict(peer_recv_bytes=[1]), "peer_recv_bytes"),
    (dict(node="../etc"), "node"),
    (dict(comm_id=""), "comm_id"),
    (dict(comm_id="a\nb"), "comm_id"),
    (dict(dtype="float128"), "dtype"),
])
def test_op_cross_field_checks(over: dict[str, Any], match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        events.decode(orjson.dumps(_op(**over)))


def test_comm_rank_below_nranks() -> None:
    d = dict(type="comm", v=1, job="", node="n", comm_id="c", rank=4, nranks=4)
    with pytest.raises(DecodeError, match="rank 4 >= nranks 4"):
        events.decode(orjson.dumps(d))


def test_flow_bound_property() -> None:
    f = events.FlowEvent(job="", node="n", nic="m", flow=1)
    assert not f.bound
    assert events.FlowEvent(job="", node="n", nic="m", flow=1, comm_id="c", rank=0, peer=1).bound


def test_constructing_invalid_records_raises_pulse_errors() -> None:
    with pytest.raises(EncodeError, match="flow"):
        events.FlowEvent(job="", node="n", nic="m", flow=-1)
    with pytest.raises(PulseError, match="end_ns"):
        records.OpMetrics(
            job="", node="n", comm_id="c", seq=0, rank=0, kind="AllReduce", nranks=2, start_ns=10, end_ns=5,
            duration_ns=0, act_ns=0, volume_bytes=0, expected_bytes=0, complete=False, active_rate=0.0,
            flows=0, epoch_ns=1000)
    with pytest.raises(PulseError, match="anomaly needs kind and level"):
        _verdict(status="anomaly", kind=None)


def _verdict(**over: Any) -> records.Verdict:
    args: dict[str, Any] = dict(job="j", status="anomaly", kind="network-slow", level="node", nodes=["node-03"],
                                ranks=[3], nics=["mlx5_3"], confidence=0.9, evidence={"act_ratio": 2.5},
                                window={"comm_id": "c", "first_seq": 1, "last_seq": 9, "ops": 9},
                                first_seen_ns=1, emitted_at=2)
    args.update(over)
    return records.Verdict(**args)


def test_verdict_evidence_may_hold_numpy_values() -> None:
    v = _verdict(evidence={"act_ratio": np.float64(2.5), "ranks": np.array([3, 4]), "n": np.int64(7)})
    got = records.decode_verdict(v.to_json())
    assert got.evidence == {"act_ratio": 2.5, "ranks": [3, 4], "n": 7}


@pytest.mark.parametrize("evidence", [{"x": object()}, {"x": 1 << 70}, {1: 2}])
def test_unserialisable_evidence_is_an_encode_error(evidence: dict[Any, Any]) -> None:
    with pytest.raises(EncodeError, match="verdict"):
        _verdict(evidence=evidence).to_json()


def test_verdict_evidence_must_be_an_object() -> None:
    with pytest.raises(PulseError, match="evidence"):
        _verdict(evidence=[1, 2])


def test_kind_family() -> None:
    assert records.kind_family("network-stop") == "network"
    assert records.kind_family("path") == "network"
    assert records.kind_family("host-contention") == "compute"
    assert records.kind_family(None) is None


def test_oplevel_unfinished_operator() -> None:
    rec = records.OpLevel(job="", node="n", comm_id="c", rank=1, seq=3, kind="AllGather", nranks=2, start_ns=5)
    got = records.decode_oplevel(rec.to_json())
    assert got == rec and got.end_ns is None
    assert b"end_ns" not in rec.to_json()
