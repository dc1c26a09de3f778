"""Op events without a rank (a source joined mid-run, hook events v2): association holds them
until a comm event of the same (comm_id, node) names exactly one rank, in the batch and the
streaming form; a rank is never guessed."""

from __future__ import annotations

import dataclasses

from pulse.segmentation.association import RankFiller, associate
from pulse.segmentation.batch import segment_trace
from pulse.segmentation.streaming import NodeSegmenter
from segbuilder import random_trace

from pulse.events import CommEvent, FlowEvent, OpEvent


def _unranked(events):
    """The trace as a mid-run log parser sees it: ops first, without rank; each comm event
    (naming the rank) only after them."""
    ops = [dataclasses.replace(e, rank=None) if isinstance(e, OpEvent) else e for e in events
           if not isinstance(e, CommEvent)]
    comms = [e for e in events if isinstance(e, CommEvent)]
    pointer_only = [dataclasses.replace(c, rank=None, rings=None, trees=None, ptr="0x1", device=0) for c in comms]
    return pointer_only + ops, comms


def test_batch_association_fills_ranks_from_late_comm_events() -> None:
    tb = random_trace(2)
    early, comms = _unranked(tb.events)
    want = associate(tb.events)
    assert associate(early).ops == {} and len(associate(early).unranked) == sum(
        isinstance(e, OpEvent) for e in tb.events)
    got = associate(early + comms)
    assert got.unranked == []
    assert {k: (v.flows, v.expected) for k, v in got.ops.items()} == \
        {k: (v.flows, v.expected) for k, v in want.ops.items()}


def test_incremental_add_comms_releases_held_ops() -> None:
    tb = random_trace(1)
    early, comms = _unranked(tb.events)
    flows = [e for e in tb.events if isinstance(e, FlowEvent)]
    ops = [e for e in early if isinstance(e, OpEvent)]
    assoc2 = associate([*[dataclasses.replace(c, rank=None, ptr="0x1") for c in comms], *flows])
    assert assoc2.add_ops(ops) == [] and len(assoc2.unranked) == len(ops) and assoc2.ops == {}
    without = assoc2.add_comms(comms)
    assert assoc2.unranked == []
    assert set(assoc2.ops) | set(without) == {(o.comm_id, c.rank, o.seq) for o in ops for c in comms
                                              if (c.comm_id, c.node) == (o.comm_id, o.node)}


def test_two_ranks_named_for_one_comm_on_one_node_hold_the_ops() -> None:
    op = OpEvent(job="", node="n", comm_id="c", rank=None, seq=0, kind="AllReduce", count=1, dtype="float32",
                 bytes=4, nranks=4)
    filler = RankFiller()
    assert filler.feed([op]) == []
    two = [CommEvent(job="", node="n", comm_id="c", rank=r, nranks=4) for r in (0, 1)]
    assert filler.feed(two[:1]) == [two[0], dataclasses.replace(op, rank=0)]
    assert filler.feed([op]) == [dataclasses.replace(op, rank=0)]
    filler.feed(two[1:])  # now ambiguous: held, never guessed
    assert filler.feed([op]) == [] and filler.held() == [op]
    other_node = dataclasses.replace(two[0], node="m")
    assert filler.feed([other_node]) == [other_node]  # another node's rank does not apply
    assert filler.held() == [op]


def test_filler_is_bounded() -> None:
    filler = RankFiller(limit=2)
    op = OpEvent(job="", node="n", comm_id="c", rank=None, seq=0, kind="AllReduce", count=1, dtype="float32", bytes=4)
    filler.feed([op, op, op])
    assert len(filler.held()) == 2 and filler.dropped == 1


def test_streaming_with_late_ranks_equals_batch() -> None:
    tb = random_trace(3)
    batches = tb.batches(window=4)
    early, comms = _unranked(tb.events)
    want = segment_trace(batches, tb.events)
    for node in sorted({b.node for b in batches}):
        seg = NodeSegmenter(node)
        out = seg.add_events(early)
        for b in batches:
            if b.node == node:
                out += seg.update(b)
        out += seg.add_events(comms)  # the ranks arrive last
        out += seg.finish()
        key = lambda m: (m.comm_id, m.rank, m.seq)  # noqa: E731
        assert sorted(out, key=key) == sorted((m for m in want if m.node == node), key=key)
