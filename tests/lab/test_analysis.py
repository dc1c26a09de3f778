"""Pure parts of the lab: fault parsing, ring inference, warm-up cut, trimming, verdict judging."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pulse.lab.analysis import (
    first_seq_after_warmup,
    infer_ring,
    judge,
    summarize_verdicts,
    trim_before,
    truth_of,
)
from pulse.lab.faults import parse_fault

from pulse.errors import ConfigError, PulseError, TraceError
from pulse.events import OpEvent
from pulse.records import Verdict
from pulse.samples import make_batch


@pytest.mark.parametrize(("text", "kind", "rank", "value"), [
    ("none", "none", -1, 0.0), ("rate:2:200mbit", "rate", 2, 200e6), ("rate:0:2gbit", "rate", 0, 2e9),
    ("rate:1:1.5g", "rate", 1, 1.5e9), ("loss:3:1.5", "loss", 3, 1.5), ("loss:1:2%", "loss", 1, 2.0),
    ("cpu:3:0.05", "cpu", 3, 0.05),
])
def test_parse_fault(text: str, kind: str, rank: int, value: float) -> None:
    f = parse_fault(text, 4)
    assert (f.kind, f.rank, f.value) == (kind, rank, pytest.approx(value))


@pytest.mark.parametrize("text", ["rate:4:1gbit", "rate:1:100kbit", "loss:1:0", "loss:1:50", "cpu:1:2",
                                  "cpu:1:x", "disk:1:2", "rate:1", "rate:a:1gbit", "rate:1:fast"])
def test_parse_fault_rejects(text: str) -> None:
    with pytest.raises(ConfigError, match="--fault"):
        parse_fault(text, 4)


@given(st.text(max_size=30))
def test_parse_fault_never_crashes(text: str) -> None:
    try:
        parse_fault(text, 4)
    except PulseError:
        pass


@given(st.permutations(list(range(6))), st.integers(0, 10**6))
def test_infer_ring_follows_each_ranks_main_peer(order: list[int], noise: int) -> None:
    n = len(order)
    sent = {}
    for i, r in enumerate(order):
        sent[(r, order[(i + 1) % n])] = 10**9
        sent[(r, order[(i + 2) % n])] = noise  # set-up traffic on other pairs
    ring = infer_ring(sent, n)
    assert ring[0] == 0 and sorted(ring) == list(range(n))
    for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
        assert order[(order.index(a) + 1) % n] == b


def test_infer_ring_rejects_what_is_not_one_ring() -> None:
    with pytest.raises(TraceError, match="one ring"):
        infer_ring({(0, 1): 5, (1, 0): 5, (2, 3): 5, (3, 2): 5}, 4)
    with pytest.raises(TraceError, match="sent nothing"):
        infer_ring({(0, 1): 5}, 2)


def _op(rank: int, seq: int, t: int) -> OpEvent:
    return OpEvent(job="lab", node=f"node-{rank:02d}", comm_id="c", rank=rank, seq=seq, kind="AllReduce",
                   count=4, dtype="float32", bytes=16, t_host_ns=t)


def test_warmup_cut_is_the_first_seq_every_rank_issued_after_its_warmup() -> None:
    # rank 0 issues seq s at 100 s, rank 1 lags by 150; step ends: rank 0 at 250, rank 1 at 420
    ops = [_op(0, s, 100 * s) for s in range(8)] + [_op(1, s, 100 * s + 150) for s in range(8)]
    ends = {0: [120, 250], 1: [300, 420]}
    assert first_seq_after_warmup(ops, ends, 2) == 3  # rank 0: seq 3 (300 > 250); rank 1: seq 3 (450 > 420)
    assert first_seq_after_warmup(ops, ends, 1) == 2  # rank 0: 200 > 120; rank 1: seq 2 (350 > 300)
    with pytest.raises(ConfigError, match="printed 2 steps"):
        first_seq_after_warmup(ops, ends, 3)


def test_trim_drops_epochs_before_the_cut_only() -> None:
    b = make_batch(node="n", nic="eth0", t0_ns=100_000, epoch_ns=1000, batch_seq=0, flow=[0, 0, 1, 1],
                   epoch=[0, 5, 2, 9], tx_bytes=[1, 2, 3, 4], rx_bytes=[0, 0, 1, 1])
    t = trim_before(b, 105_000)
    assert t.flow.tolist() == [0, 1] and t.epoch.tolist() == [5, 9] and t.tx_bytes.tolist() == [2, 4]
    assert t.rx_bytes is not None and t.rx_bytes.tolist() == [0, 1]
    assert trim_before(b, 0) is b
    assert trim_before(b, 10**9).n_rows == 0
    assert np.array_equal(b.epoch, [0, 5, 2, 9])  # the input is left alone


def _v(status: str, kind: str | None = None, nodes: tuple[str, ...] = ()) -> Verdict:
    return Verdict(job="lab", status=status, kind=kind, level="node" if kind else None, nodes=list(nodes),
                   ranks=[], nics=[], confidence=0.9, evidence={}, window={}, first_seen_ns=1, emitted_at=2)


def test_judge_and_summary() -> None:
    class F:
        kind, rank, text = "rate", 2, "rate:2:200mbit"

    truth = truth_of(F, {0: "node-00", 1: "node-01", 2: "node-02", 3: "node-03"}, 5)
    assert truth["culprit"]["nodes"] == ["node-02"] and truth["kind"] == "network-slow"
    good = summarize_verdicts([_v("healthy"), _v("anomaly", "network-slow", ("node-02",)),
                               _v("anomaly", "network-slow", ("node-02",)), _v("cleared")])
    assert good["anomalies"][0]["count"] == 2 and judge(good, truth)
    assert not judge(summarize_verdicts([_v("anomaly", "compute-slow", ("node-02",))]), truth)
    assert not judge(summarize_verdicts([_v("anomaly", "network-slow", ("node-02",)),
                                         _v("anomaly", "path", ("node-02", "node-03"))]), truth)
    assert not judge(summarize_verdicts([_v("healthy")]), truth)

    class N:
        kind, rank, text = "none", -1, "none"

    healthy = truth_of(N, {}, None)
    assert judge(summarize_verdicts([_v("healthy")]), healthy)
    assert judge(summarize_verdicts([]), healthy)
    assert not judge(summarize_verdicts([_v("anomaly", "compute-slow", ("node-01",))]), healthy)
