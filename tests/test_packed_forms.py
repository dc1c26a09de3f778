"""Packed wire forms (v1): several hook events of one node, or several op-metrics records of
one job, in one Kafka message. Round trips, the single forms still accepted, and malformed
packs rejected with a DecodeError (never another exception)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent / "pulse"))
from wire_strategies import JSON_VALUE, NAME, hook_events, record_of

from pulse import events, records
from pulse.errors import DecodeError, EncodeError

op_metrics = record_of(records.OpMetrics)


@st.composite
def one_node_events(draw: st.DrawFn, min_size: int = 1) -> list[events.HookEvent]:
    node = draw(NAME)
    evs = draw(st.lists(hook_events, min_size=min_size, max_size=12))
    return [dataclasses.replace(e, node=node) for e in evs]


@st.composite
def one_job_metrics(draw: st.DrawFn, min_size: int = 1) -> list[records.OpMetrics]:
    job = draw(st.one_of(st.just(""), NAME))
    recs = draw(st.lists(op_metrics, min_size=min_size, max_size=12))
    return [dataclasses.replace(r, job=job) for r in recs]


@given(one_node_events())
def test_packed_hook_events_round_trip_in_order(evs):
    raw = events.encode_packed(evs)
    assert events.decode_many(raw) == evs
    assert events.decode_many(raw.decode()) == evs
    assert events.encode_packed_json([e.to_json() for e in evs]) == raw
    if len(evs) > 1:
        assert orjson.loads(raw)["type"] == "batch"
    else:  # one event travels in the single form, readable by every consumer
        assert events.decode(raw) == evs[0]


@given(hook_events)
def test_single_hook_event_form_still_decodes(ev):
    assert events.decode_many(events.encode(ev)) == [ev]


@given(one_job_metrics())
def test_packed_op_metrics_round_trip_in_order(recs):
    raw = records.encode_op_metrics_packed(recs)
    assert records.decode_op_metrics_many(raw) == recs
    assert records.encode_op_metrics_packed_json([r.to_json() for r in recs]) == raw
    if len(recs) > 1:
        assert orjson.loads(raw)["type"] == "op-metrics-batch"
    else:
        assert records.decode_op_metrics(raw) == recs[0]


@given(op_metrics)
def test_single_op_metrics_form_still_decodes(rec):
    assert records.decode_op_metrics_many(rec.to_json()) == [rec]


def _pack(evs, **over):
    d = {"type": "batch", "v": 1, "events": [e.to_dict() for e in evs], **over}
    return orjson.dumps({k: v for k, v in d.items() if v is not ...})


@settings(max_examples=30)  # x 8 malformations
@given(one_node_events(min_size=2))
@pytest.mark.parametrize(("over", "says"), [
    ({"v": 2}, "unsupported version"), ({"v": "1"}, "unsupported version"), ({"v": True}, "unsupported version"),
    ({"v": ...}, "unsupported version"), ({"extra": 1}, "unknown field"), ({"events": []}, "non-empty list"),
    ({"events": {}}, "non-empty list"), ({"events": ...}, "non-empty list"),
])
def test_malformed_packed_hook_events_are_rejected(over, says, evs):
    with pytest.raises(DecodeError, match=says):
        events.decode_many(_pack(evs, **over), "hook-events[3]@9")


@given(one_node_events(min_size=2), st.data())
def test_one_bad_event_rejects_the_whole_pack_naming_its_index(evs, data):
    i = data.draw(st.integers(0, len(evs) - 1))
    items = [e.to_dict() for e in evs]
    items[i] = data.draw(st.one_of(st.just({"type": "batch", "v": 1, "events": [items[0]]}),  # no nesting
                                   st.just({**items[i], "node": ""}), st.integers(-(1 << 63), (1 << 64) - 1),  # what JSON carries
                                   st.just({"type": "op"})))
    with pytest.raises(DecodeError, match=rf"events\[{i}\]"):
        events.decode_many(orjson.dumps({"type": "batch", "v": 1, "events": items}), "here")


@given(one_node_events(min_size=2), NAME)
def test_a_pack_holds_one_node(evs, other):
    if other == evs[0].node:
        return
    mixed = [*evs[:-1], dataclasses.replace(evs[-1], node=other)]
    with pytest.raises(DecodeError, match="in a pack of node"):
        events.decode_many(_pack(mixed))
    with pytest.raises(EncodeError):
        events.encode_packed(mixed)


@given(one_job_metrics(min_size=2), st.data())
def test_malformed_packed_op_metrics_are_rejected(recs, data):
    items = [r.to_dict() for r in recs]
    bad = data.draw(st.sampled_from([
        ({"v": 2}, "unsupported version"), ({"extra": 1}, "unknown field"), ({"records": []}, "non-empty list"),
        ({"records": "x"}, "non-empty list"),
        ({"records": [*items[:-1], {**items[-1], "seq": -1}]}, rf"records\[{len(items) - 1}\]"),
        ({"records": [*items[:-1], {**items[-1], "job": items[0]["job"] + "x"}]}, "in a pack of job"),
    ]))
    over, says = bad
    raw = orjson.dumps({"type": "op-metrics-batch", "v": 1, "records": items, **over})
    with pytest.raises(DecodeError, match=says):
        records.decode_op_metrics_many(raw, "op-metrics[0]@1")


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["type", "v", "events", "records", "x"]), JSON_VALUE, max_size=4),
       st.sampled_from(["batch", "op-metrics-batch"]))
def test_arbitrary_packed_shaped_input_decodes_or_raises_decode_error(d, kind):
    raw = orjson.dumps({**d, "type": kind})
    for decode in (events.decode_many, records.decode_op_metrics_many):
        try:
            decode(raw)
        except DecodeError:
            pass


def test_empty_packs_cannot_be_encoded():
    with pytest.raises(EncodeError):
        events.encode_packed([])
    with pytest.raises(EncodeError):
        records.encode_op_metrics_packed([])
    with pytest.raises(EncodeError):
        records.encode_op_metrics_packed_json([])
