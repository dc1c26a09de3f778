"""The agents' state without Kafka: dead letters, and the localize agent's time alignment."""

from __future__ import annotations

import random

import orjson
from hypothesis import given
from hypothesis import strategies as st
from pulse.engine import Aligner as _Aligner
from pulse.streams.state import LocalizeState, Message, SegmentState

from pulse.records import OpMetrics
from pulse.settings import Topics

T = Topics.with_prefix("st")
S, MS = 1_000_000_000, 1_000_000


def _m(comm: str, seq: int, rank: int, end: int, nranks: int = 3) -> OpMetrics:
    return OpMetrics(job="j", node=f"node-{rank:02d}", comm_id=comm, seq=seq, rank=rank, kind="AllReduce",
                     nranks=nranks, start_ns=end - 1000, end_ns=end, duration_ns=1000, act_ns=800, volume_bytes=10,
                     expected_bytes=10, complete=True, active_rate=1.0, flows=1, epoch_ns=32_000)


def test_bad_messages_become_dead_letters_and_the_rest_goes_on():
    seg = SegmentState(T)
    good = orjson.dumps({"type": "flow", "v": 1, "job": "j", "node": "node-00", "nic": "mlx5_0", "flow": 7})
    out = seg.handle([Message(T.samples, b"node-00", b"not a batch", 0, 5),
                      Message(T.hook_events, b"node-00", b"{broken", 0, 6),
                      Message(T.hook_events, b"node-00", good, 0, 7)])
    assert [(d.topic, d.offset) for d in out.dead] == [(T.samples, 5), (T.hook_events, 6)]
    assert all(d.error for d in out.dead)
    rec = orjson.loads(out.dead[0].to_json())
    assert rec["stage"] == "segment" and rec["value_bytes"] == len(b"not a batch")
    assert seg.stats["events"] == 1 and len(out.op_metrics) == 1  # the flow event is forwarded to its job
    loc = LocalizeState()
    out2 = loc.handle([Message(T.op_metrics, b"j", b"[1, 2]", 1, 0)])
    assert len(out2.dead) == 1 and out2.dead[0].stage == "localize"


def _ops(n_ops: int, rng: random.Random) -> list[OpMetrics]:
    # Two communicators of 3 ranks; each rank's operators end in increasing time.
    out = []
    for seq in range(n_ops):
        for comm in ("a", "b"):
            base = seq * 1_000_000 + (0 if comm == "a" else 500_000)
            out += [_m(comm, seq, r, base + rng.randrange(0, 50_000)) for r in range(3)]
    return out


@given(st.integers(1, 12), st.integers(1, 40), st.randoms(use_true_random=False))
def test_skewed_arrival_releases_like_in_order_arrival(n_ops, burst, rnd):
    recs = _ops(n_ops, random.Random(n_ops))
    by_node: dict[str, list[OpMetrics]] = {}
    for m in sorted(recs, key=lambda m: m.end_ns):
        by_node.setdefault(m.node, []).append(m)
    skewed = []
    queues = {k: list(v) for k, v in by_node.items()}
    while any(queues.values()):  # bursts of one node at a time, like a lagging partition
        k = rnd.choice([k for k, q in queues.items() if q])
        skewed += queues[k][:burst]
        del queues[k][:burst]

    def released(order: list[OpMetrics]) -> list[tuple[str, int, int]]:
        al = _Aligner(hold_ns=10**12, idle_s=10.0)
        out = []
        for m in order:
            al.add(m, now=0.0)
            out += al.ready(0.0)
        out += al.ready(100.0)  # idle: the rest goes out
        return [(m.comm_id, m.seq, m.rank) for m in out]

    in_order = released(sorted(recs, key=lambda m: m.end_ns))
    got = released(skewed)
    assert sorted(got) == sorted(in_order)  # nothing lost or duplicated
    # Operators go out whole, and in seq order per communicator.
    for comm in ("a", "b"):
        seqs = [s for c, s, _ in got if c == comm]
        assert seqs == sorted(seqs)
    ops = [(c, s) for c, s, _ in got]
    for i in range(0, len(ops), 3):
        assert len(set(ops[i:i + 3])) == 1


def test_a_rank_that_never_reports_is_released_after_the_hold():
    al = _Aligner(hold_ns=1_000_000, idle_s=10.0)
    for r in (0, 1):  # rank 2 stopped
        al.add(_m("a", 0, r, 1_000), now=0.0)
    assert al.ready(0.0) == []
    al.add(_m("a", 5, 0, 5_000_000), now=0.1)  # the job moved on by more than the hold
    assert [(m.seq, m.rank) for m in al.ready(0.1)] == [(0, 0), (0, 1)]


def _kind(m: OpMetrics, kind: str) -> OpMetrics:
    return OpMetrics(**{**{f.name: getattr(m, f.name) for f in OpMetrics.FIELDS}, "kind": kind})


def test_a_send_has_one_record_and_does_not_wait_for_the_hold():
    """Only the sender of a Send reports (its Recv has no send flow): one record is all."""
    al = _Aligner(hold_ns=1_000_000_000, idle_s=10.0)
    al.add(_kind(_m("pp", 0, 0, 1_000, nranks=2), "Send"), now=0.0)
    al.add(_kind(_m("pp", 1, 1, 2_000, nranks=2), "Send"), now=0.0)
    al.add(_m("dp", 0, 0, 3_000, nranks=2), now=0.0)
    al.add(_m("dp", 0, 1, 3_000, nranks=2), now=0.0)
    got = [(m.comm_id, m.seq, m.rank) for m in al.ready(0.0)]
    assert got == [("pp", 0, 0), ("pp", 1, 1), ("dp", 0, 0), ("dp", 0, 1)]


def test_a_rank_that_never_reported_holds_only_until_the_comm_is_calibrated():
    al = _Aligner(hold_ns=1_000_000, idle_s=10.0)
    for r in (0, 1):  # rank 2's ring hop is inside its node: it never reports
        al.add(_m("a", 0, r, 1_000), now=0.0)
    assert al.ready(0.0) == []
    al.add(_m("a", 1, 0, 2_000_000), now=0.1)
    assert [(m.seq, m.rank) for m in al.ready(0.1)] == [(0, 0), (0, 1)]  # by the hold bound
    al.add(_m("a", 1, 1, 2_000_000), now=0.2)
    al.add(_m("a", 2, 0, 2_100_000), now=0.2)
    al.add(_m("a", 2, 1, 2_100_000), now=0.2)
    # seqs 1 and 2 have every rank that reports for "a" and every node went past them:
    # released at once, not after the hold
    assert [(m.seq, m.rank) for m in al.ready(0.2)] == [(1, 0), (1, 1), (2, 0), (2, 1)]


def test_live_a_node_whose_data_lags_in_the_pipeline_keeps_holding():
    """After an outage the spools drain faster than real time and one worker can segment its
    nodes seconds of trace time behind the other's: node-02's data end still moves, so its
    rank is waited for, not taken as stopped (engine/aligner.py)."""
    al = _Aligner(hold_ns=S, idle_s=0.5)
    for r in (0, 1, 2):
        al.observe_data_end(f"node-{r:02d}", 500 * MS, now=1.0)
    for r in (0, 1):
        al.add(_m("a", 0, r, 1_000 * MS), now=1.0)
        al.add(_m("a", 9, r, 9_000 * MS), now=1.0)  # nodes 0 and 1 went 9 s of trace on
        al.observe_data_end(f"node-{r:02d}", 9_000 * MS, now=1.0)
    al.observe_data_end("node-02", 600 * MS, now=1.2)  # its data still comes, slowly
    assert al.ready(1.3) == []
    al.observe_data_end("node-02", 900 * MS, now=1.6)
    assert al.ready(1.9) == []  # no record for 0.9 s, but node-02's data moved: not idle
    al.add(_m("a", 0, 2, 1_000 * MS), now=2.0)
    al.observe_data_end("node-02", 1_200 * MS, now=2.0)
    assert [(m.seq, m.rank) for m in al.ready(2.0)] == [(0, 0), (0, 1), (0, 2)]


def _two_nodes_9_s_on(idle_s: float, now: float) -> _Aligner:
    """Nodes 0 and 1 reported seq 0 and seq 9 (9 s of trace later); node-02 nothing."""
    al = _Aligner(hold_ns=S, idle_s=idle_s)
    for r in (0, 1):
        al.add(_m("a", 0, r, 1_000 * MS), now=now)
        al.add(_m("a", 9, r, 9_000 * MS), now=now)
    return al


def test_live_a_node_whose_data_stopped_or_went_on_without_records_no_longer_holds():
    al = _two_nodes_9_s_on(10.0, 1.0)
    al.observe_data_end("node-02", 600 * MS, now=1.0)
    assert al.ready(1.5) == []  # its data moved within the hold (the hold read as wall time)
    assert [(m.seq, m.rank) for m in al.ready(2.1)][:2] == [(0, 0), (0, 1)]  # no data for 1.1 s
    al2 = _Aligner(hold_ns=S, idle_s=10.0)
    al2.add(_m("a", 0, 2, 100 * MS), now=1.0)
    for r in (0, 1):
        al2.add(_m("a", 1, r, 2_000 * MS), now=1.0)
        al2.add(_m("a", 9, r, 9_000 * MS), now=1.0)
    al2.observe_data_end("node-02", 2_500 * MS, now=1.4)  # data 2.5 s past its last record
    assert [(m.seq, m.rank) for m in al2.ready(1.5)][:3] == [(0, 2), (1, 0), (1, 1)]


def test_offline_the_bounds_stay_in_trace_time():
    al = _two_nodes_9_s_on(0.5, 0.0)
    al.observe_data_end("node-02", 600 * MS, now=0.0)
    assert [(m.seq, m.rank) for m in al.ready(0.0)][:2] == [(0, 0), (0, 1)]
