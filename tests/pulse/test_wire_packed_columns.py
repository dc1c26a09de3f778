"""Packed op-metrics are checked column by column (``Record.from_dicts``): the same records,
and the same rejections with the same error, as decoding each record alone."""

from __future__ import annotations

import dataclasses
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_strategies import record_of

from pulse import records
from pulse.errors import DecodeError

OpMetrics = records.OpMetrics
BAD_VALUES = [None, "1", 1.5, True, [1], -1, 1 << 63, float("nan"), float("inf"), "", "a b", "x" * 80,
              "Broadcast", "AllReduce", 0, 2.0]
FIELDS = [f.name for f in OpMetrics.FIELDS] + ["type", "v", "extra"]


def _one_by_one(items: list[Any]) -> list[OpMetrics] | str:
    try:
        return [OpMetrics.from_dict(d, f"m records[{i}]") for i, d in enumerate(items)]
    except DecodeError as exc:
        return str(exc)


@settings(max_examples=300, deadline=None)
@given(recs=st.lists(record_of(OpMetrics), min_size=1, max_size=6), data=st.data())
def test_columns_decide_as_each_record_alone(recs: list[OpMetrics], data: st.DataObject) -> None:
    items = [orjson.loads(r.to_json()) for r in recs]
    for _ in range(data.draw(st.integers(0, 2))):  # break some records in some field
        i = data.draw(st.integers(0, len(items) - 1))
        name = data.draw(st.sampled_from(FIELDS))
        if data.draw(st.booleans()):
            items[i].pop(name, None)
        else:
            items[i][name] = data.draw(st.sampled_from(BAD_VALUES))
    alone = _one_by_one(items)
    together = OpMetrics.from_dicts(items)
    if isinstance(alone, str):
        assert together is None
    else:
        assert together == alone
    # through the packed decoder: the same records, or the same first error (of what went
    # on the wire: JSON has no NaN, orjson writes null)
    raw = orjson.dumps({"type": "op-metrics-batch", "v": 1, "records": items})
    alone = _one_by_one(orjson.loads(raw)["records"])
    try:
        got: list[OpMetrics] | str = records.decode_op_metrics_many(raw, "m")
    except DecodeError as exc:
        got = str(exc)
    if isinstance(alone, str) or isinstance(got, list):
        assert got == alone
    else:  # all fine alone, rejected packed: only a pack of several jobs may be
        assert "in a pack of job" in got


def test_a_bad_record_in_a_pack_is_named() -> None:
    good = orjson.loads(records.encode_op_metrics_packed([_rec(1), _rec(2)]))
    assert len(records.op_metrics_from_dict(good, "m")) == 2
    good["records"][1]["end_ns"] = 5
    with pytest.raises(DecodeError, match="end_ns 5 < start_ns"):
        records.op_metrics_from_dict(good, "m")
    good["records"][1]["rank"] = "3"
    with pytest.raises(DecodeError, match=r"m records\[1\]: field 'rank' must be int"):
        records.op_metrics_from_dict(good, "m")


def _rec(seq: int) -> OpMetrics:
    return OpMetrics(job="j", node="node-1", comm_id="c", seq=seq, rank=0, kind="AllReduce", nranks=2,
                     start_ns=10, end_ns=20, duration_ns=10, act_ns=10, volume_bytes=8, expected_bytes=8,
                     complete=True, active_rate=1.0, flows=1, epoch_ns=1)


@pytest.mark.parametrize("change, why", [
    ({"peer_ranks": [1, 2], "peer_done_ns": [5], "peer_bytes": [4, 4], "peer_expected_bytes": [4, 4]}, "of one length"),
    ({"peer_ranks": [1, 2], "peer_done_ns": [5, 6]}, "go together"),
    ({"peer_ranks": [1], "peer_done_ns": [-1], "peer_bytes": [8], "peer_expected_bytes": [8]}, "negative"),
    ({"peer_ranks": [1], "peer_done_ns": [11], "peer_bytes": [8], "peer_expected_bytes": [8]}, "after the record's end"),
    ({"v": 2, "peer_start_ns": [0]}, "needs the other per-peer figures"),
    ({"v": 2, "peer_ranks": [1], "peer_done_ns": [6], "peer_bytes": [8], "peer_expected_bytes": [8],
      "peer_start_ns": [7]}, "first byte"),
    ({"v": 2, "peer_ranks": [1, 2], "peer_done_ns": [6, 6], "peer_bytes": [8, 8], "peer_expected_bytes": [8, 8],
      "peer_start_ns": [0]}, "of their length"),
    ({"peer_ranks": [1], "peer_done_ns": [6], "peer_bytes": [8], "peer_expected_bytes": [8], "peer_start_ns": [0]},
     r"in v=1; it needs v>=2"),
])
def test_per_peer_figures_are_checked_alone_and_packed(change: dict, why: str) -> None:
    good = orjson.loads(records.encode_op_metrics_packed([_rec(1), _rec(2)]))
    good["records"][1].update(change)
    with pytest.raises(DecodeError, match=why):
        records.op_metrics_from_dict(good, "m")
    with pytest.raises(DecodeError, match=why):
        OpMetrics.from_dict(good["records"][1], "m")
    ok = dict(good["records"][1], v=1, peer_ranks=[1], peer_done_ns=[10], peer_bytes=[8], peer_expected_bytes=[8])
    ok.pop("peer_start_ns", None)
    assert OpMetrics.from_dict(ok, "m").peer_done_ns == [10]
    with_start = OpMetrics.from_dict(dict(ok, v=2, peer_start_ns=[3]), "m")
    assert with_start.peer_start_ns == [3] and with_start.wire_version() == 2
    assert OpMetrics.from_dict(ok, "m").wire_version() == 1  # without it: v1, as before


def test_peak_epoch_bytes_is_v3_and_checked_alone_and_packed() -> None:
    good = orjson.loads(records.encode_op_metrics_packed([_rec(1), _rec(2)]))
    ok = dict(good["records"][1], v=3, peak_epoch_bytes=4096)
    rec = OpMetrics.from_dict(ok, "m")
    assert rec.peak_epoch_bytes == 4096 and rec.wire_version() == 3
    old = dict(ok, v=1)
    old.pop("peak_epoch_bytes")
    assert OpMetrics.from_dict(old, "m").wire_version() == 1
    for change, why in (({"v": 2, "peak_epoch_bytes": 5}, r"in v=2; it needs v>=3"),
                        ({"v": 3, "peak_epoch_bytes": -1}, "peak_epoch_bytes")):
        bad = dict(good, records=[good["records"][0], dict(good["records"][1], **change)])
        with pytest.raises(DecodeError, match=why):
            records.op_metrics_from_dict(bad, "m")
        with pytest.raises(DecodeError, match=why):
            OpMetrics.from_dict(bad["records"][1], "m")
    # v3 records pack and unpack column-wise beside older ones
    mixed = [_rec(1), dataclasses.replace(_rec(2), peak_epoch_bytes=7)]
    back = records.op_metrics_from_dict(orjson.loads(records.encode_op_metrics_packed(mixed)), "m")
    assert [r.peak_epoch_bytes for r in back] == [None, 7]
