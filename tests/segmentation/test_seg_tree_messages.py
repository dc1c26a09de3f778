"""A small tree AllReduce is cut into NCCL's tree chunks, finer than a slot: counted by its
messages it fills every slot of its connection, so its receiver's start burst marks where
the previous operator ended (sweep 313 #11)."""

from __future__ import annotations

import pytest
from pulse.segmentation.association import associate
from pulse.segmentation.batch import segment_flows, segment_trace
from segbuilder import TraceBuilder, stream_node
from test_seg_association import tree_trace

from pulse.nccl_chunks import tree_chunk_bytes, tree_depth_at_least

K = 1 << 10
M = 1 << 20


def test_the_tree_depth_bound_never_exceeds_a_binary_tree_or_nccls_depth():
    assert [tree_depth_at_least(n) for n in (1, 2, 3, 4, 7, 8, 9, 16)] == [0, 1, 1, 2, 2, 3, 3, 4]
    for local in range(1, 9):
        for nodes in range(1, 33):
            # NCCL: localRanks - 1 + log2i(nNodes)
            assert tree_depth_at_least(local * nodes) <= local - 1 + nodes.bit_length() - 1


def test_a_deeper_tree_or_more_channels_never_cut_coarser():
    for nbytes in (64 * K, M, 4 * M, 32 * M):
        for nch in (1, 2, 4):
            sizes = [tree_chunk_bytes(nbytes, nch, d) for d in range(0, 8)]
            assert sizes == sorted(sizes, reverse=True)
            assert tree_chunk_bytes(nbytes, nch + 1, 3) <= tree_chunk_bytes(nbytes, nch, 3)


@pytest.mark.parametrize("nchannels", [1, None])
def test_a_small_tree_allreduce_counts_its_tree_chunks(nchannels):
    tb, nodes = tree_trace()
    tb.op(nodes[1], "t", 1, 0, "AllReduce", M, algo="tree", nchannels=nchannels, nranks=4)
    tb.op(nodes[1], "t", 1, 1, "AllReduce", 64 * M, algo="tree", nchannels=nchannels, nranks=4)
    a = associate(tb.events)
    # 1 MiB on one channel of a 4-rank tree (depth at least 2): 128 KiB chunks, 8 per flow;
    # 64 MiB keeps whole steps: its bytes already count 128 of them
    assert a.ops[("t", 1, 0)].msg_bytes == 128 * K
    for flow in a.flow_ops:
        if a.bindings[flow].rank == 1:
            assert a.flow_op_steps(flow).tolist() == [8, 128]


def back_to_back_tree_buckets() -> tuple[TraceBuilder, str]:
    """Rank 1's send to its parent: two 1 MiB tree buckets back to back, the crossing epoch
    carrying the second's first 128 KiB message and its receiver's start burst (8 x 64 B
    rx), then a pause; the next step's bucket 200 epochs later."""
    tb, nodes = tree_trace()
    node = nodes[1]
    e = tb.epoch_ns
    for seq, issued in ((0, 0), (1, 2), (2, 199)):
        tb.op(node, "t", 1, seq, "AllReduce", M, algo="tree", nchannels=1, nranks=4,
              t_host_ns=tb.t0_ns + issued * e)
    flow = 2  # rank 1 -> its parent 0 (tree_trace's flow 1 is rank 0's send)
    tb.send(node, "mlx5_0", flow, 0, 0, 512)
    for ep in (1, 2, 3):
        tb.send(node, "mlx5_0", flow, ep, 256 * K, 64)
    tb.send(node, "mlx5_0", flow, 4, 256 * K + 128 * K, 512 + 64)
    for ep, nb in ((6, 256 * K), (7, 256 * K), (8, 256 * K), (9, 128 * K)):
        tb.send(node, "mlx5_0", flow, ep, nb, 64)
    tb.send(node, "mlx5_0", flow, 200, 0, 512)
    for ep in (201, 202, 203, 204):
        tb.send(node, "mlx5_0", flow, ep, 256 * K, 64)
    return tb, node


def test_back_to_back_tree_buckets_split_at_the_crossing_with_the_start_burst():
    tb, _node = back_to_back_tree_buckets()
    a = associate(tb.events)
    segs = segment_flows(tb.batches(), a)
    rows = {int(segs.seq[i]): i for i in range(len(segs)) if segs.rank[i] == 1 and segs.flow[i] == 2}
    e0 = tb.t0_ns
    got = {q: ((int(segs.start_ns[i]) - e0) // tb.epoch_ns, (int(segs.end_ns[i]) - e0) // tb.epoch_ns,
               int(segs.volume[i])) for q, i in rows.items()}
    # each bucket exactly its volume: the first ends in the crossing epoch (4), the second
    # starts there and ends before the step's gap, the next step's bucket is its own
    assert got == {0: (1, 5, M), 1: (4, 10, M), 2: (201, 205, M)}


@pytest.mark.parametrize("window", [1, 2, 3, 4, 5, 16])
def test_streaming_segments_the_tree_buckets_as_the_batch_does(window):
    # wherever the batches cut the crossing epoch's split, the streaming form's records
    # (the busiest epoch included: the flow's whole epoch) are the batch form's
    tb, node = back_to_back_tree_buckets()
    batches = tb.batches(window=window)
    want = [m for m in segment_trace(batches, tb.events) if m.node == node]
    assert stream_node(node, tb.events, batches) == want
    assert [m.volume_bytes for m in want if m.rank == 1] == [M, M, M]
