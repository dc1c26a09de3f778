"""Per-peer figures of grouped P2P records (who each sender finished last): the reduction
against a naive reference, and their consistency with the record on simulator traces."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from pulse.segmentation.association import OpInfo
from pulse.segmentation.batch import segment_trace
from pulse.segmentation.metrics import peer_figures

from pulse.events import OpEvent
from pulse.trace import TraceReader


def _info(flow_peers: list[int] | None) -> OpInfo:
    ev = OpEvent(job="j", node="n", comm_id="c", rank=0, seq=0, kind="GroupP2P", bytes=1, nranks=4,
                 count=1, dtype="int8", peers=[1, 2, 3])
    n = len(flow_peers or [])
    return OpInfo(event=ev, algo="p2p", nranks=4, flows=[("n", "mlx5_0", i) for i in range(n)], expected=[1] * n,
                  flow_peers=flow_peers)


def _naive(peers: list[int], first: int, start: list[int], end: list[int], vol: list[int], epoch: int):
    out: dict[int, list[int]] = {}
    for p, s, e, v in zip(peers, start, end, vol, strict=True):
        last, nb, want, begin = out.get(p, [first, 0, 0, s])
        out[p] = [max(last, e), nb + v, want + 1, min(begin, s)]  # _info declares 1 byte per flow
    ks = sorted(out)
    return (ks, [(out[k][0] + 1 - first) * epoch for k in ks], [out[k][1] for k in ks], [out[k][2] for k in ks],
            [(out[k][3] - first) * epoch for k in ks])


@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 25), st.integers(0, 25), st.integers(0, 1 << 40)),
                min_size=1, max_size=24),
       st.integers(0, 10), st.sampled_from([1, 16_000, 96_000]))
def test_peer_figures_match_a_naive_reduction(flows, first, epoch):
    peers = [p for p, _, _, _ in flows]
    start = [first + s for _, s, _, _ in flows]
    end = [first + s + d for _, s, d, _ in flows]
    vol = [v for _, _, _, v in flows]
    got = peer_figures(_info(peers), first, np.array(start, np.int64), np.array(end, np.int64),
                       np.array(vol, np.int64), epoch)
    assert got == _naive(peers, first, start, end, vol, epoch)


def test_no_figures_for_other_operators_or_a_flow_that_never_started():
    start = np.array([0, 2], np.int64)
    end = np.array([3, 4], np.int64)
    vol = np.array([10, 10], np.int64)
    assert peer_figures(_info(None), 0, start, end, vol, 1) is None
    assert peer_figures(_info([1, 2]), -1, start, end, vol, 1) is None
    assert peer_figures(_info([1, 2]), 2, np.array([2, -1], np.int64), np.array([3, -1], np.int64), vol, 1) is None


def test_sim_all_to_all_records_carry_consistent_peer_figures(sim_traces):
    reader = TraceReader(sim_traces.get(("nic-slow", 1, "moe")))
    recs = segment_trace(reader.batches(), reader.events())
    grouped = [m for m in recs if m.kind == "GroupP2P" and m.complete]
    assert grouped
    for m in grouped:
        assert m.peer_ranks is not None and m.rank not in m.peer_ranks
        assert sum(m.peer_bytes) == m.volume_bytes  # type: ignore[arg-type]
        assert sum(m.peer_expected_bytes) == m.expected_bytes  # type: ignore[arg-type]
        assert max(m.peer_done_ns) == m.end_ns - m.start_ns  # type: ignore[arg-type]
        assert min(m.peer_start_ns) == 0  # type: ignore[arg-type]
        assert all(0 <= a < b for a, b in zip(m.peer_start_ns, m.peer_done_ns, strict=True))  # type: ignore[arg-type]
    assert all(m.peer_ranks is None for m in recs if m.kind != "GroupP2P")


def test_a_stalled_all_to_all_record_says_which_peers_it_finished_with():
    # a NIC that died mid all-to-all leaves its peers' records short only of their bytes
    # for it: which peers a stalled record finished with tells the stop rules whose NIC
    # worked with third parties (sweep 271 #1); streaming and batch forms agree
    from segbuilder import TraceBuilder, stream_node

    tb = TraceBuilder()
    tb.comm("p", 3, {0: "a", 1: "b", 2: "c"})
    tb.flow("a", "mlx5_0", 1, "p", 0, 1, 0, "send")
    tb.flow("a", "mlx5_0", 2, "p", 0, 2, 0, "send")
    tb.op("a", "p", 0, 0, "GroupP2P", 2_000_000, peers=[1, 2], peer_send_bytes=[1_000_000, 1_000_000],
          peer_recv_bytes=[10, 10], nchannels=1, group=1)
    tb.transfer("a", "mlx5_0", 1, 1, 1_000_000, 250_000, comm_id="p", seq=0)
    tb.transfer("a", "mlx5_0", 2, 1, 1_000_000, 250_000, comm_id="p", seq=0, stop_after=400_000)
    tb.send("a", "mlx5_0", 1, 3000, 0, 512)  # the data goes on long after: the stall is closed
    batches = tb.batches()
    want = segment_trace(batches, tb.events)
    (rec,) = want
    assert not rec.complete
    assert rec.peer_ranks == [1, 2]
    assert rec.peer_bytes == [1_000_000, 400_000] and rec.peer_expected_bytes == [1_000_000, 1_000_000]
    assert stream_node("a", tb.events, batches) == want
