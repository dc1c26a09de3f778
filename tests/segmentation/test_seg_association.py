"""Flow -> operator association: expected bytes per send flow for every operator kind."""

from __future__ import annotations

import numpy as np
import pytest
from pulse.segmentation.association import algo_steps, associate
from pulse.segmentation.batch import segment_flows
from pulse.segmentation.params import SegmentParams
from segbuilder import TraceBuilder

S = 8_000_000


def ring4(nch=2, extra_p2p=False, rings=True, qps=1):
    """4 ranks on 4 nodes, ring 0-1-2-3 per channel, each rank's flow to next (+ recv)."""
    tb = TraceBuilder()
    nodes = {r: f"n{r}" for r in range(4)}
    tb.comm("c", 4, nodes, rings=[[0, 1, 2, 3]] * nch if rings else None)
    fid = 100
    for r in range(4):
        for ch in range(nch):
            for _ in range(qps):
                tb.flow(nodes[r], "mlx5_0", fid, "c", r, (r + 1) % 4, ch, "send")
                fid += 1
            tb.flow(nodes[r], "mlx5_0", fid, "c", r, (r - 1) % 4, ch, "recv")
            fid += 1
        if extra_p2p:
            tb.flow(nodes[r], "mlx5_0", fid, "c", r, (r + 2) % 4, 0, "send")
            fid += 1
    return tb, nodes


def expected_of(assoc, comm, rank, seq):
    info = assoc.ops[(comm, rank, seq)]
    return sorted(zip(info.flows, info.expected, strict=True))


@pytest.mark.parametrize("kind,factor", [("AllReduce", 2 * 3 / 4), ("AllGather", 3 / 4), ("ReduceScatter", 3 / 4)])
def test_ring_collectives_bytes_per_send_flow(kind, factor):
    tb, nodes = ring4(nch=2)
    for r in range(4):
        tb.op(nodes[r], "c", r, 0, kind, S, algo="ring", nchannels=2, nranks=4)
    a = associate(tb.events)
    for r in range(4):
        got = expected_of(a, "c", r, 0)
        assert len(got) == 2
        assert all(e == int(factor * S / 2) for _, e in got)
        for f, _ in got:
            b = a.bindings[f]
            assert b.direction == "send" and b.peer == (r + 1) % 4
    assert a.ops[("c", 0, 0)].expected_bytes == 2 * int(factor * S / 2)


def test_ring_ignores_non_ring_connections_and_infers_without_rings():
    tb, nodes = ring4(nch=1, extra_p2p=True)
    tb.op(nodes[1], "c", 1, 0, "AllReduce", S, algo="ring", nchannels=1, nranks=4)
    a = associate(tb.events)
    [(f, e)] = expected_of(a, "c", 1, 0)
    assert a.bindings[f].peer == 2 and e == int(1.5 * S)


def test_several_qps_per_connection_split_bytes():
    tb, nodes = ring4(nch=1, qps=3)
    tb.op(nodes[0], "c", 0, 0, "AllGather", S, algo="ring", nchannels=1, nranks=4)
    a = associate(tb.events)
    got = expected_of(a, "c", 0, 0)
    assert len(got) == 3 and all(e == int(0.75 * S / 3) for _, e in got)


def test_broadcast_and_reduce_skip_the_edge_without_data():
    tb, nodes = ring4(nch=1)
    for r in range(4):
        tb.op(nodes[r], "c", r, 0, "Broadcast", S, algo="ring", nchannels=1, nranks=4, root=0)
        tb.op(nodes[r], "c", r, 1, "Reduce", S, algo="ring", nchannels=1, nranks=4, root=2)
    a = associate(tb.events)
    assert ("c", 3, 0) in a.ops_without_flows  # 3 -> 0 would send back to the root
    assert ("c", 2, 1) in a.ops_without_flows  # Reduce: the root sends nothing
    for r in (0, 1, 2):
        assert [e for _, e in expected_of(a, "c", r, 0)] == [S]
    for r in (0, 1, 3):
        assert [e for _, e in expected_of(a, "c", r, 1)] == [S]


def tree_trace(with_trees=True):
    # rank 1 is the root's child with children 2 and 3; tree connections only.
    tb = TraceBuilder()
    nodes = {r: f"n{r}" for r in range(4)}
    trees = {0: [0, -1, 1, -1, -1], 1: [1, 0, 2, 3, -1], 2: [2, 1, -1, -1, -1], 3: [3, 1, -1, -1, -1]}
    for r in range(4):
        tb.events.append(__import__("pulse.events", fromlist=["CommEvent"]).CommEvent(
            job="job", node=nodes[r], comm_id="t", rank=r, nranks=4,
            trees=[trees[r]] if with_trees else None))
    fid = 1
    for r in range(4):
        for p in trees[r][1:]:
            if p >= 0:
                tb.flow(nodes[r], "mlx5_0", fid, "t", r, p, 0, "send")
                fid += 1
    return tb, nodes


@pytest.mark.parametrize("algo", ["tree", "unknown"])
@pytest.mark.parametrize("with_trees", [True, False])
def test_tree_allreduce_sends_s_over_c_to_parent_and_children(algo, with_trees):
    tb, nodes = tree_trace(with_trees)
    tb.op(nodes[1], "t", 1, 0, "AllReduce", S, algo=algo, nchannels=1, nranks=4)
    a = associate(tb.events)
    got = expected_of(a, "t", 1, 0)
    assert sorted(a.bindings[f].peer for f, _ in got) == [0, 2, 3]
    assert all(e == S for _, e in got)
    assert a.ops[("t", 1, 0)].algo == "tree"


def test_unknown_algo_with_one_peer_per_channel_is_ring():
    tb, nodes = ring4(nch=2, rings=False)
    tb.op(nodes[2], "c", 2, 0, "AllReduce", S, algo="unknown", nchannels=2, nranks=4)
    a = associate(tb.events)
    info = a.ops[("c", 2, 0)]
    assert info.algo == "ring" and all(e == int(0.75 * S) for e in info.expected)


def test_send_recv_and_group_p2p():
    tb = TraceBuilder()
    tb.comm("p", 3, {0: "a", 1: "b", 2: "c"})
    fid = 1
    for r in range(3):
        for q in range(3):
            if q != r:
                for ch in range(2):
                    tb.flow("abc"[r], "mlx5_0", fid, "p", r, q, ch, "send")
                    tb.flow("abc"[r], "mlx5_0", fid + 1, "p", r, q, ch, "recv")
                    fid += 2
    tb.op("a", "p", 0, 0, "Send", 1_000_000, peer=1, nchannels=2)
    tb.op("b", "p", 1, 0, "Recv", 1_000_000, peer=0, nchannels=2)
    tb.op("a", "p", 0, 1, "GroupP2P", 3_000, peers=[1, 2], peer_send_bytes=[2_000, 0],
          peer_recv_bytes=[10, 10], nchannels=2, group=7)
    a = associate(tb.events)
    send = expected_of(a, "p", 0, 0)
    assert len(send) == 2 and all(a.bindings[f].peer == 1 and e == 500_000 for f, e in send)
    assert ("p", 1, 0) in a.ops_without_flows  # Recv: no send-flow volume
    grp = expected_of(a, "p", 0, 1)
    assert len(grp) == 2 and all(a.bindings[f].peer == 1 and e == 1_000 for f, e in grp)
    # each send flow's ordered op list
    for f, _ in send:
        seqs, need = a.flow_op_list(f)
        assert list(seqs) == [0, 1] and list(need) == [500_000, 1_000]


def test_unbound_flows_are_reported_not_dropped():
    tb, nodes = ring4(nch=1)
    tb.flow("n0", "mlx5_0", 999, None, None, None, None, None)  # capture-side only
    tb.op(nodes[0], "c", 0, 0, "AllGather", S, algo="ring", nchannels=1, nranks=4)
    tb.send("n0", "mlx5_0", 999, 0, 5000)
    tb.send("n0", "mlx5_0", 555, 3, 7000)  # no flow event at all
    a = associate(tb.events)
    assert ("n0", "mlx5_0", 999) in a.unbound
    segs = segment_flows(tb.batches(), a)
    assert {("n0", "mlx5_0", 999), ("n0", "mlx5_0", 555)} <= set(segs.unbound_flows)


def test_conflicting_duplicate_op_events_counted():
    tb, nodes = ring4(nch=1)
    tb.op(nodes[0], "c", 0, 0, "AllGather", S, algo="ring", nchannels=1, nranks=4)
    tb.op(nodes[0], "c", 0, 0, "AllGather", S, algo="ring", nchannels=1, nranks=4)  # same: fine
    tb.op(nodes[0], "c", 0, 0, "AllGather", 2 * S, algo="ring", nchannels=1, nranks=4)
    a = associate(tb.events)
    assert a.duplicates == 1 and a.ops[("c", 0, 0)].event.bytes == S


def test_flow_op_lists_are_in_seq_order():
    tb, nodes = ring4(nch=1)
    for seq in (3, 0, 2, 1):
        tb.op(nodes[0], "c", 0, seq, "AllReduce", S * (seq + 1), algo="ring", nchannels=1, nranks=4)
    a = associate(tb.events)
    (seqs, need), = a.flow_ops.values()
    assert list(seqs) == [0, 1, 2, 3]
    assert np.all(np.diff(need) > 0)


def test_each_flow_op_carries_its_algorithms_fewest_messages():
    # a ring AllReduce hands on 2 (n - 1) pieces on every flow, an AllGather n - 1, however
    # small its bytes: what tells the segmentation its receiver posts every slot at its start
    tb, nodes = ring4(nch=1)
    tb.op(nodes[0], "c", 0, 0, "AllReduce", S, algo="ring", nchannels=1, nranks=4)
    tb.op(nodes[0], "c", 0, 1, "AllGather", S, algo="ring", nchannels=1, nranks=4)
    tb.op(nodes[0], "c", 0, 2, "Broadcast", S, algo="ring", nchannels=1, nranks=4, root=3)
    a = associate(tb.events)
    (flow,) = a.flow_ops
    assert a.flow_op_steps(flow).tolist() == [6, 3, 1]
    assert [a.ops[("c", 0, q)].steps for q in range(3)] == [6, 3, 1]
    a.drop_ops([("c", 0, 1)])
    assert a.flow_op_steps(flow).tolist() == [6, 1]
    assert algo_steps("AllReduce", "tree", 16) == 1 and algo_steps("AllReduce", "ring", 1) == 1


def test_an_operator_fills_every_slot_by_its_messages_or_its_bytes():
    need = np.array([2 << 20, 2 << 20, 4 << 20, 1 << 20])
    steps = np.array([24, 1, 1, 6])
    assert SegmentParams().slot_fills(need, steps).tolist() == [True, False, True, False]
    assert SegmentParams(cts_slots=4).slot_fills(need, steps).tolist() == [True, True, True, True]


def gloo_mesh():
    """Gloo-like: 4 ranks, one TCP connection per peer pair (full mesh, channel 0), the
    comm publishes its ring, AllReduce with algo unknown (Gloo does not say)."""
    tb = TraceBuilder()
    nodes = {r: f"g{r}" for r in range(4)}
    tb.comm("gloo", 4, nodes, rings=[[0, 1, 2, 3]])
    fid = {}
    for r in range(4):
        for p in range(4):
            if p != r:
                fid[(r, p)] = 10 * r + p
                tb.flow(nodes[r], "eth0", 10 * r + p, "gloo", r, p, 0, "send")
                tb.flow(nodes[r], "eth0", 100 + 10 * r + p, "gloo", r, p, 0, "recv")
    return tb, nodes, fid


@pytest.mark.parametrize("algo", [None, "unknown"])
def test_full_mesh_with_a_published_ring_is_ring(algo):
    tb, nodes, fid = gloo_mesh()
    per = int(2 * 3 / 4 * S)
    for r in range(4):
        tb.op(nodes[r], "gloo", r, 0, "AllReduce", S, algo=algo, nranks=4, t_host_ns=tb.t0_ns)
        tb.op(nodes[r], "gloo", r, 1, "AllReduce", S, algo=algo, nranks=4, t_host_ns=tb.t0_ns + 60 * 32_000)
        # data on the ring edge only; a little traffic on a non-neighbour connection
        # (barriers, rendezvous) while the operators run
        tb.transfer(nodes[r], "eth0", fid[(r, (r + 1) % 4)], 2, per, 500_000, comm_id="gloo", seq=0)
        tb.transfer(nodes[r], "eth0", fid[(r, (r + 1) % 4)], 70, per, 500_000, comm_id="gloo", seq=1)
        tb.send(nodes[r], "eth0", fid[(r, (r + 2) % 4)], 5, 300)
    a = associate(tb.events)
    assert a.ambiguous_algo == 0
    for r in range(4):
        info = a.ops[("gloo", r, 0)]
        assert info.algo == "ring"
        assert [(a.bindings[f].peer, e) for f, e in zip(info.flows, info.expected, strict=True)] == [((r + 1) % 4, per)]
    segs = segment_flows(tb.batches(), a)
    assert len(segs) == 8 and segs.complete.all()
    by_key = {(segs.node[i], int(segs.flow[i]), int(segs.seq[i])): i for i in range(len(segs))}
    for t in tb.truth:
        i = by_key[(t.node, t.flow, t.seq)]
        assert (segs.start_ns[i], segs.end_ns[i], segs.volume[i]) == (t.start_ns, t.end_ns, t.nbytes)
    assert segs.extra_bytes == 4 * 300  # the non-neighbour bytes belong to no operator


def test_full_mesh_with_published_trees_stays_tree():
    # Trees published too: rank 1's connections are exactly its tree peers (parent 0,
    # children 2 and 3), which the ring alone does not explain: tree, as before.
    trees = [[0, -1, 1, -1, -1], [1, 0, 2, 3, -1], [2, 1, -1, -1, -1], [3, 1, -1, -1, -1]]
    tb, nodes, _ = gloo_mesh()
    tb.events = [e for e in tb.events if e.TYPE != "comm"]
    for r in range(4):
        tb.events.insert(0, __import__("pulse.events", fromlist=["CommEvent"]).CommEvent(
            job="job", node=nodes[r], comm_id="gloo", rank=r, nranks=4, rings=[[0, 1, 2, 3]], trees=[trees[r]]))
    tb.op(nodes[1], "gloo", 1, 0, "AllReduce", S, nranks=4)
    a = associate(tb.events)
    info = a.ops[("gloo", 1, 0)]
    assert info.algo == "tree" and sorted(a.bindings[f].peer for f in info.flows) == [0, 2, 3]
