"""Streaming form == batch form on the same input, in any interleaving; bounded state."""

from __future__ import annotations

import random

import pytest
from pulse.segmentation.batch import segment_trace
from pulse.segmentation.params import SegmentationError, SegmentParams
from pulse.segmentation.streaming import NodeSegmenter
from segbuilder import random_trace

from pulse.events import OpEvent


def by_node(items, node):
    return [x for x in items if getattr(x, "node", node) == node]


def stream(node, events, batches, order, params=None, chunk=7):
    """Feed a node's segmenter; ``order``: events_first | batches_first | interleaved."""
    seg = NodeSegmenter(node, params)
    out = []
    evs = list(events)
    bs = list(batches)
    if order == "events_first":
        out += seg.add_events(evs)
        for b in bs:
            out += seg.update(b)
    elif order == "batches_first":
        # comm/flow bindings first (as at communicator init), op descriptors after the traffic
        out += seg.add_events([e for e in evs if not isinstance(e, OpEvent)])
        for b in bs:
            out += seg.update(b)
        out += seg.add_events([e for e in evs if isinstance(e, OpEvent)])
    else:
        rng = random.Random(len(bs) * 31 + len(evs))
        queue = [("e", evs[i:i + chunk]) for i in range(0, len(evs), chunk)]
        queue += [("b", b) for b in bs]
        # keep each kind in order but interleave them randomly
        es = [q for q in queue if q[0] == "e"]
        bq = [q for q in queue if q[0] == "b"]
        while es or bq:
            take_e = es and (not bq or rng.random() < 0.5)
            kind, x = (es if take_e else bq).pop(0)
            out += seg.add_events(x) if kind == "e" else seg.update(x)
    out += seg.finish()
    return sorted(out, key=lambda m: (m.comm_id, m.rank, m.seq)), seg


def keyed_all(per, rng, bound):
    out = []
    for lst in per.values():
        out += sorted(lst, key=lambda b: b.batch_seq + rng.uniform(0, bound))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("order", ["events_first", "batches_first", "interleaved"])
def test_streaming_equals_batch(seed, order):
    tb = random_trace(seed, hang_after=5 if seed == 3 else None)
    batches = tb.batches(window=int(3 + seed * 5))
    want = segment_trace(batches, tb.events)
    assert want
    for node in sorted({m.node for m in want}):
        got, seg = stream(node, [e for e in tb.events if getattr(e, "node", node) == node or e.TYPE == "comm"],
                          [b for b in batches if b.node == node], order)
        assert got == [m for m in want if m.node == node]
        assert seg.stats.lost_batches == 0 and seg.stats.late_batches == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_equals_batch_with_late_out_of_order_batches(seed):
    tb = random_trace(seed + 10)
    batches = tb.batches(window=4)
    want = segment_trace(batches, tb.events)
    params = SegmentParams(late_batches=8)
    for node in sorted({m.node for m in want}):
        mine = [b for b in batches if b.node == node]
        shuffled = keyed_all({n: [b for b in mine if b.nic == n] for n in {b.nic for b in mine}},
                             random.Random(seed), 6)
        assert [b.batch_seq for b in shuffled] != sorted(b.batch_seq for b in shuffled) or len(mine) < 3
        got, seg = stream(node, tb.events, shuffled, "events_first", params)
        assert got == [m for m in want if m.node == node]
        assert seg.stats.reordered_batches > 0 and seg.stats.lost_batches == 0


def test_metrics_are_emitted_before_the_end_of_the_stream():
    tb = random_trace(2)
    batches = tb.batches(window=4)
    node = "node-01"
    seg = NodeSegmenter(node)
    seg.add_events(tb.events)
    early = []
    for b in batches:
        if b.node == node:
            early += seg.update(b)
    rest = seg.finish()
    assert len(early) >= 0.8 * (len(early) + len(rest))
    assert all(m.complete for m in early)
    # an emitted operator's end is before the data the segmenter had seen when emitting it
    assert sorted(early + rest, key=lambda m: (m.comm_id, m.seq)) == \
        [m for m in segment_trace(batches, tb.events) if m.node == node]


def test_lost_batches_counted_and_late_ones_dropped():
    tb = random_trace(4)
    batches = [b for b in tb.batches(window=4) if b.node == "node-00" and b.nic == "mlx5_0"]
    seg = NodeSegmenter("node-00", SegmentParams(late_batches=2))
    seg.add_events(tb.events)
    held = batches[3]
    for b in batches[:3] + batches[4:]:
        seg.update(b)
    assert seg.stats.lost_batches == 1
    seg.update(held)  # too late now
    assert seg.stats.late_batches == 1
    seg.update(batches[5])  # used already: a redelivery, not data that came too late
    assert seg.stats.duplicate_batches == 1 and seg.stats.late_batches == 1
    seg.finish()


def test_bounded_state_evicts_and_counts():
    tb = random_trace(1, nops=30)
    batches = [b for b in tb.batches(window=4) if b.node == "node-00"]
    params = SegmentParams(max_pending_ops=4, max_buffered_rows=16, late_batches=0)
    seg = NodeSegmenter("node-00", params)
    # op descriptors withheld: rows pile up and must be evicted, not kept
    seg.add_events([e for e in tb.events if not isinstance(e, OpEvent)])
    for b in batches:
        seg.update(b)
    assert seg.stats.evicted_rows > 0
    assert seg.buffered_rows() and all(n <= 16 for n in seg.buffered_rows().values())
    seg.add_events([e for e in tb.events if isinstance(e, OpEvent)])
    assert len(seg._ops) <= 4 and seg.stats.evicted_ops > 0
    seg.finish()


def test_unbound_traffic_is_reported():
    tb = random_trace(0)
    tb.send("node-00", "mlx5_0", 77777, 3, 1000)
    batches = [b for b in tb.batches() if b.node == "node-00"]
    seg = NodeSegmenter("node-00")
    seg.add_events(tb.events)
    for b in batches:
        seg.update(b)
    seg.finish()
    assert ("node-00", "mlx5_0", 77777) in seg.stats.unbound_flows


def test_wrong_node_batch_is_an_error():
    tb = random_trace(0)
    b = next(b for b in tb.batches() if b.node == "node-01")
    with pytest.raises(SegmentationError, match="node-01"):
        NodeSegmenter("node-00").update(b)


@pytest.mark.parametrize("seed", [0, 1, 3])
@pytest.mark.parametrize("group", [2, 5, 1000])
def test_deferred_updates_then_run_equal_batch(seed, group):
    """update(run=False) for several batches, then run(): the batch form's metrics."""
    tb = random_trace(seed, hang_after=5 if seed == 3 else None)
    batches = tb.batches(window=4)
    want = segment_trace(batches, tb.events)
    for node in sorted({m.node for m in want}):
        seg = NodeSegmenter(node)
        out = seg.add_events([e for e in tb.events if getattr(e, "node", node) == node or e.TYPE == "comm"])
        mine = [b for b in batches if b.node == node]
        for i in range(0, len(mine), group):
            for b in mine[i:i + group]:
                assert seg.update(b, run=False) == []
            out += seg.run()
        out += seg.finish()
        assert sorted(out, key=lambda m: (m.comm_id, m.rank, m.seq)) == [m for m in want if m.node == node]


def test_unbound_rows_then_binding_equal_batch():
    """Traffic before its flow bindings (several batches per run): buffered, then segmented."""
    tb = random_trace(2)
    batches = tb.batches(window=4)
    want = segment_trace(batches, tb.events)
    node = "node-01"
    seg = NodeSegmenter(node)
    mine = [b for b in batches if b.node == node]
    half = len(mine) // 2
    out = []
    for b in mine[:half]:
        seg.update(b, run=False)
    out += seg.run()
    assert seg.stats.unbound_flows
    out += seg.add_events([e for e in tb.events if getattr(e, "node", node) == node or e.TYPE == "comm"])
    assert not seg.stats.unbound_flows
    for b in mine[half:]:
        out += seg.update(b)
    out += seg.finish()
    assert sorted(out, key=lambda m: (m.comm_id, m.rank, m.seq)) == [m for m in want if m.node == node]


def test_a_stream_that_begins_after_seq_0_is_not_held_for_64_operators():
    """A rank whose op events begin at seq 3 (an agent attached mid-job, a trace cut after
    its warm-up) waited for seqs 0-2 until 64 later operators had arrived: in the lab, 20 s
    of a CPU-starved rank's records came after the localizer had judged its operators
    without them. The hole is skipped once the rank's own later ops span ``op_hole_ns``."""
    tb = random_trace(2)
    node = "node-01"
    events = [e for e in tb.events if not (isinstance(e, OpEvent) and e.seq < 3)]
    batches = [b for b in tb.batches(window=4) if b.node == node]

    def run(params: SegmentParams) -> tuple[list, list, NodeSegmenter]:
        seg = NodeSegmenter(node, params)
        seg.add_events(events)
        early = [m for b in batches for m in seg.update(b)]
        return early, seg.finish(), seg

    early, rest, seg = run(SegmentParams(op_hole_ns=5_000_000))
    assert seg.stats.lost_ops >= 3  # a stream whose later ops spanned the bound skipped its hole
    assert len(early) >= 0.6 * (len(early) + len(rest)), (len(early), len(rest))
    assert sorted(early + rest, key=lambda m: (m.comm_id, m.rank, m.seq)) == \
        sorted((m for m in segment_trace(batches, events) if m.node == node), key=lambda m: (m.comm_id, m.rank, m.seq))
    # within the bound the hole is still waited for (reordering, not a late start)
    held, _, _ = run(SegmentParams(op_hole_ns=10_000_000_000))
    assert held == []
