"""Hook events v2: comm/op events without a rank, comms with their process-local identity.
Records that need none of it stay v1, byte for byte; a v1 reader's contract is unchanged."""

from __future__ import annotations

import orjson
import pytest

from pulse import events
from pulse.errors import DecodeError, EncodeError
from pulse.events import CommEvent, OpEvent

OP = dict(job="j", node="n", comm_id="local:n:7:0xabc", seq=0, kind="AllReduce", count=4, dtype="float32", bytes=16,
          nranks=8)


def test_ranked_events_are_written_exactly_as_v1() -> None:
    op = OpEvent(rank=3, **OP)
    assert orjson.loads(op.to_json()) == {"type": "op", "v": 1, "rank": 3, **OP}
    c = CommEvent(job="j", node="n", comm_id="0x5", rank=1, nranks=2, pid=7)
    assert c.to_json() == b'{"type":"comm","v":1,"job":"j","node":"n","comm_id":"0x5","rank":1,"nranks":2,"pid":7}'


def test_rank_unknown_or_identity_make_v2_and_round_trip() -> None:
    op = OpEvent(rank=None, **OP)
    c = CommEvent(job="j", node="n", comm_id="local:n:7:0xabc", rank=None, nranks=8, pid=7, ptr="0xabc", device=3)
    learned = CommEvent(job="j", node="n", comm_id="local:n:7:0xabc", rank=5, nranks=8, pid=7, ptr="0xabc", device=3)
    for e in (op, c, learned):
        d = orjson.loads(e.to_json())
        assert d["v"] == 2 and events.decode(e.to_json()) == e
    assert "rank" not in orjson.loads(op.to_json())
    pack = events.encode_packed([c, op, learned])
    assert events.decode_many(pack) == [c, op, learned]


@pytest.mark.parametrize("raw,match", [
    ({"type": "op", "v": 1, **OP}, "missing field 'rank'"),  # v1 always had a rank
    ({"type": "comm", "v": 1, "job": "", "node": "n", "comm_id": "c", "nranks": 2}, "missing field 'rank'"),
    ({"type": "comm", "v": 1, "job": "", "node": "n", "comm_id": "c", "rank": 0, "nranks": 2, "ptr": "0x1"},
     "unknown field.*ptr.*v>=2"),
    ({"type": "comm", "v": 3, "job": "", "node": "n", "comm_id": "c", "rank": 0, "nranks": 2},
     r"unsupported version v=3 \(this Pulse reads v=1..2\)"),
    ({"type": "comm", "v": 2, "job": "", "node": "n", "comm_id": "c", "nranks": 2, "ptr": "0xZZ"}, "ptr"),
    ({"type": "comm", "v": 2, "job": "", "node": "n", "comm_id": "c", "nranks": 2, "ptr": "0xABC"}, "ptr"),
    ({"type": "comm", "v": 2, "job": "", "node": "n", "comm_id": "c", "rank": 2, "nranks": 2}, "rank 2 >= nranks 2"),
])
def test_version_rules_are_enforced(raw: dict, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        events.decode(orjson.dumps(raw))


def test_v2_record_is_what_a_v1_reader_rejects_clearly() -> None:
    """The contract a v1-only consumer relies on: an unknown version is an error naming it."""
    v2 = CommEvent(job="", node="n", comm_id="c", rank=None, nranks=2).to_dict()
    assert v2["v"] == 2
    with pytest.raises(EncodeError, match="ptr"):
        CommEvent(job="", node="n", comm_id="c", rank=0, nranks=2, ptr="not-hex")
