"""Per operator per rank metrics from hand-made traces with known answers."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.segmentation.batch import segment_trace
from pulse.segmentation.metrics import epoch_peaks, union_count
from pulse.segmentation.params import SegmentationError
from segbuilder import EPOCH_NS, TraceBuilder

from pulse.records import OpMetrics


def two_channel_trace(stop_second=False):
    """Rank 0 of a 2-rank ring, 2 channels: flow A active epochs 0-3, flow B 2-5 and 8."""
    tb = TraceBuilder()
    tb.comm("c", 2, {0: "a", 1: "b"}, rings=[[0, 1], [0, 1]])
    tb.flow("a", "mlx5_0", 1, "c", 0, 1, 0, "send")
    tb.flow("a", "mlx5_1", 2, "c", 0, 1, 1, "send")
    tb.flow("a", "mlx5_0", 3, "c", 0, 1, 0, "recv")
    S = 800_000  # 2(n-1)/n x S / c = 400_000 per flow
    tb.op("a", "c", 0, 0, "AllReduce", S, algo="ring", nchannels=2, nranks=2, t_host_ns=tb.t0_ns - 5000)
    tb.op("a", "c", 0, 1, "AllReduce", S, algo="ring", nchannels=2, nranks=2, t_host_ns=tb.t0_ns + 10**6)
    for e in range(4):
        tb.send("a", "mlx5_0", 1, e, 100_000, rx=64)
    for e in (2, 3, 4, 5):
        tb.send("a", "mlx5_1", 2, e, 90_000)
    if not stop_second:
        tb.send("a", "mlx5_1", 2, 8, 40_000)
    tb.send("a", "mlx5_0", 3, 1, 0, rx=400_000)  # recv flow: never a send volume
    return tb


def test_act_is_the_union_of_active_epochs_and_rate_is_volume_over_act():
    tb = two_channel_trace()
    [m0, m1] = segment_trace(tb.batches(), tb.events)
    assert isinstance(m0, OpMetrics) and (m0.seq, m1.seq) == (0, 1)
    assert m0.start_ns == tb.t0_ns and m0.end_ns == tb.t0_ns + 9 * EPOCH_NS
    assert m0.duration_ns == 9 * EPOCH_NS
    assert m0.act_ns == 7 * EPOCH_NS  # epochs 0-5 and 8, union over both flows
    assert m0.volume_bytes == 800_000 and m0.expected_bytes == 800_000
    assert m0.complete and m0.flows == 2 and m0.nics == ["mlx5_0", "mlx5_1"]
    assert m0.active_rate == pytest.approx(800_000 / (7 * EPOCH_NS * 1e-9))
    assert m0.kind == "AllReduce" and m0.nranks == 2 and m0.t_host_ns == tb.t0_ns - 5000
    assert m0.epoch_ns == EPOCH_NS
    # the next operator never sent anything: incomplete, empty interval at its issue time
    assert not m1.complete and m1.volume_bytes == 0 and m1.act_ns == 0 and m1.active_rate == 0.0
    assert m1.start_ns == m1.end_ns == tb.t0_ns + 10**6


def test_incomplete_operator_keeps_the_bytes_seen():
    tb = two_channel_trace(stop_second=True)
    m0 = segment_trace(tb.batches(), tb.events)[0]
    assert not m0.complete and m0.volume_bytes == 760_000 and m0.act_ns == 6 * EPOCH_NS
    assert m0.end_ns == tb.t0_ns + 6 * EPOCH_NS


def test_group_p2p_rank_rate_across_its_flows():
    tb = TraceBuilder()
    tb.comm("ep", 3, {0: "a", 1: "b", 2: "c"})
    tb.flow("a", "mlx5_0", 10, "ep", 0, 1, 0, "send")
    tb.flow("a", "mlx5_0", 11, "ep", 0, 2, 0, "send")
    tb.op("a", "ep", 0, 0, "GroupP2P", 300_000, peers=[1, 2], peer_send_bytes=[200_000, 100_000],
          nchannels=1, group=3)
    tb.transfer("a", "mlx5_0", 10, 0, 200_000, 50_000)   # epochs 0-3
    tb.transfer("a", "mlx5_0", 11, 10, 100_000, 50_000)  # epochs 10-11
    [m] = segment_trace(tb.batches(), tb.events)
    assert m.kind == "GroupP2P" and m.group == 3 and m.flows == 2 and m.complete
    assert m.act_ns == 6 * EPOCH_NS and m.volume_bytes == 300_000
    assert m.duration_ns == 12 * EPOCH_NS


def test_batches_of_one_node_must_share_the_epoch_length():
    tb = two_channel_trace()
    bs = tb.batches()
    tb2 = TraceBuilder(epoch_ns=64_000)
    tb2.send("a", "mlx5_1", 2, 0, 1)
    with pytest.raises(SegmentationError, match="epoch_ns"):
        segment_trace(bs + tb2.batches(), tb.events)


def test_params_are_checked():
    from pulse.segmentation.params import SegmentParams
    with pytest.raises(SegmentationError, match="gap_epochs"):
        SegmentParams(gap_epochs=0)
    with pytest.raises(SegmentationError, match="params"):
        segment_trace([], [], params={"gap_epochs": 3})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0, 1, 2, 7, 1 << 20, (1 << 41) + 3])), max_size=40),
       st.integers(0, 3))
def test_union_count_equals_reference(pairs, extra_ops):
    """Distinct epochs per operator id (both the one-key sort and the lexsort fallback,
    which epochs spanning 2^41 take)."""
    n = 6 + extra_ops
    want = [len({e for r, e in pairs if r == i}) for i in range(n)]
    ids = np.array([p[0] for p in pairs], np.int64)
    eps = np.array([p[1] for p in pairs], np.int64)
    assert union_count(ids, eps, n).tolist() == want


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([0, 1, 2, 7, 1 << 20, (1 << 41) + 3]),
                          st.integers(1, 1 << 44)), max_size=40), st.integers(0, 3))
def test_epoch_peaks_equals_reference(rows, extra_ops):
    """Per operator id the largest byte sum of one epoch over its rows (several flows can
    share an epoch; an id without rows peaks at 0)."""
    n = 6 + extra_ops
    sums: dict[tuple[int, int], int] = {}
    for r, e, b in rows:
        sums[(r, e)] = sums.get((r, e), 0) + b
    want = [max([b for (r, _e), b in sums.items() if r == i], default=0) for i in range(n)]
    ids = np.array([r[0] for r in rows], np.int64)
    eps = np.array([r[1] for r in rows], np.int64)
    tx = np.array([r[2] for r in rows], np.int64)
    assert epoch_peaks(ids, eps, tx, n).tolist() == want
