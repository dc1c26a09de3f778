"""Boundaries on hand-made traces with known truth (random sizes, gaps, back-to-back
operators, mid-operator stalls, retransmission surplus, a hang; 32 µs and 1 µs epochs)."""

from __future__ import annotations

import pytest
from pulse.segmentation.association import associate
from pulse.segmentation.batch import segment_flows, segment_trace
from segbuilder import random_trace, stream_node


@pytest.mark.parametrize("epoch_ns", [32_000, 1_000])
@pytest.mark.parametrize("seed", range(8))
def test_handmade_boundaries_within_one_epoch(seed, epoch_ns):
    tb = random_trace(seed, epoch_ns=epoch_ns, hang_after=5 if seed % 4 == 0 else None)
    segs = segment_flows(tb.batches(), associate(tb.events))
    idx = {(segs.node[i], segs.nic[i], int(segs.flow[i]), segs.comm_id[i], int(segs.seq[i])): i
           for i in range(len(segs))}
    assert len(idx) == len(tb.truth)
    for t in tb.truth:
        i = idx[(t.node, t.nic, t.flow, t.comm_id, t.seq)]
        assert bool(segs.complete[i]) == t.complete, t
        if t.complete:
            assert abs(int(segs.start_ns[i]) - t.start_ns) <= epoch_ns, t
            assert abs(int(segs.end_ns[i]) - t.end_ns) <= epoch_ns, t
            assert segs.volume[i] >= segs.expected[i] * 0.999 - 4096


def test_one_microsecond_epochs_streaming_equals_batch():
    tb = random_trace(6, epoch_ns=1_000)
    batches = tb.batches(window=50)
    want = segment_trace(batches, tb.events)
    for node in sorted({m.node for m in want}):
        got = stream_node(node, tb.events, batches)
        assert got == [m for m in want if m.node == node]
        assert all(m.epoch_ns == 1_000 for m in got)
