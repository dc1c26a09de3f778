"""Network-only inference (engine/netonly.py) on hand-built traffic: groups from addresses,
the data direction of a connection, and each NIC's sending rate per window."""

from __future__ import annotations

import numpy as np
import pytest
from pulse.engine.netonly import InferredStage

from pulse.events import FlowEvent
from pulse.samples import make_batch

EPOCH = 1000
WIN = 100_000  # 100 epochs


def tcp(node: str, flow: int, src: str, sport: int, dst: str, dport: int) -> FlowEvent:
    return FlowEvent(job="j", node=node, nic="eth0", flow=flow, transport="tcp", src=src, dst=dst, sport=sport,
                     dport=dport)


def batch(node: str, seq: int, t0: int, rows: list[tuple[int, int, int]]) -> object:
    flow, epoch, tx = (np.array(c, dtype=np.uint32) for c in zip(*rows, strict=True)) if rows else \
        (np.zeros(0, np.uint32),) * 3
    return make_batch(node=node, nic="eth0", t0_ns=t0, epoch_ns=EPOCH, batch_seq=seq, flow=flow, epoch=epoch,
                      tx_bytes=tx, rx_bytes=np.zeros_like(tx), job="j")


def ring_events() -> list[FlowEvent]:
    """a -> b -> c -> a, each connection seen on both ends (flow 0 sends, flow 1 receives;
    the reverse direction of each is its acknowledgements)."""
    ips = {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"}
    out = []
    for n, succ in (("a", "b"), ("b", "c"), ("c", "a")):
        fwd = (ips[n], 5000, ips[succ], 6000)
        out += [tcp(n, 0, *fwd), tcp(succ, 1, *fwd)]
        out += [tcp(n, 2, fwd[2], fwd[3], fwd[0], fwd[1]), tcp(succ, 3, fwd[2], fwd[3], fwd[0], fwd[1])]
    return out


def test_a_slow_sender_has_the_lowest_rate_and_acks_are_not_data() -> None:
    st = InferredStage(window_ns=WIN)
    st.add(ring_events())
    outs = []
    for w in range(6):
        t0 = w * WIN
        # a and b send 10 epochs of 1000 B; c sends the same bytes over 40 epochs (slow);
        # each receiver acknowledges every epoch it receives with 40 B (flow 3 at the receiver)
        rows = {"a": [(0, e, 1000) for e in range(10)] + [(3, e, 40) for e in range(40)],
                "b": [(0, e, 1000) for e in range(10)] + [(3, e, 40) for e in range(10)],
                "c": [(0, e, 250) for e in range(40)] + [(3, e, 40) for e in range(10)]}
        outs.append(st.add([], [batch(n, w, t0, r) for n, r in rows.items()]))
    outs.append(st.finish())
    recs = [m for o in outs for m in o.metrics]
    assert recs, "records come out at the end"
    rate = {}
    for m in recs:
        rate.setdefault(m.node, []).append(m.active_rate)
        assert m.kind == "GroupP2P" and m.comm_id.startswith("inferred:") and m.complete
    # the acknowledgements (flow 3, the smaller direction) neither add epochs nor bytes
    assert np.median(rate["a"]) == pytest.approx(1000 / (EPOCH / 1e9))
    assert np.median(rate["c"]) == pytest.approx(250 / (EPOCH / 1e9))
    binds = [e for o in outs for items in o.forwards.values() for e in items]
    sends = {(e.node, e.peer) for e in binds if isinstance(e, FlowEvent)}
    ranks = {m.node: m.rank for m in recs}
    assert sends == {("a", ranks["b"]), ("b", ranks["c"]), ("c", ranks["a"])}


def test_windows_close_only_when_every_nic_went_past_them() -> None:
    st = InferredStage(window_ns=WIN)
    st.add(ring_events())
    out = st.add([], [batch("a", 0, 0, [(0, 1, 100)]), batch("b", 0, 0, [(0, 1, 100)])])
    assert not out.metrics  # c has not reported
    out = st.add([], [batch(n, 1, 5 * WIN, [(0, 1, 100)]) for n in "abc"])
    assert {m.seq for m in out.metrics} == {0}


def test_unpaired_flows_form_one_group_and_are_data() -> None:
    st = InferredStage(window_ns=WIN)
    st.add([], [batch(n, 0, 0, [(7, e, 100) for e in range(5)]) for n in "xyz"])
    out = st.finish()
    assert len({m.comm_id for m in out.metrics}) == 1 and len(out.metrics) == 3
    assert not [e for items in out.forwards.values() for e in items]  # no address: no link bound


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError):
        InferredStage(window_ns=0)


SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "pp": 1, "steps": 8}


@pytest.mark.parametrize("scenario,workload", [("healthy", "dense"), ("moe-slow-nic", "moe"), ("nic-slow", "dense")])
def test_simulated_jobs_without_descriptors_never_blame_a_healthy_node(tmp_path, scenario, workload):  # type: ignore[no-untyped-def]
    """Network-only on a simulated RoCE job (QP numbers only): quiet when healthy, the slow
    NIC's node when its links show it (all-to-all), and otherwise nothing, never another node."""
    from pulse.engine import diagnose
    from pulse.sim import SimConfig, simulate

    from pulse.trace import read_truth

    simulate(SimConfig(scenario=scenario, seed=0, workload=workload, **SIZE), tmp_path / "t")  # type: ignore[arg-type]
    truth = read_truth(tmp_path / "t")
    res = diagnose(tmp_path / "t", network_only=True)
    named = {n for i in res.incidents for n in i.nodes}
    assert named <= set(truth["culprit"]["nodes"])
    if scenario == "moe-slow-nic":
        assert named == set(truth["culprit"]["nodes"])
        assert {i.kind for i in res.incidents} == {"network-slow"}


def test_windows_lie_on_the_epoch_grid_and_contain_their_traffic() -> None:
    """50 ms is not a whole number of 32 us epochs: the window is rounded to whole epochs,
    so a record's [start, end) holds its traffic even at real clock values (~1.8e18 ns)."""
    t0 = 1_796_000_000_000_000_000 // 32_000 * 32_000
    st = InferredStage()
    b = make_batch(node="x", nic="m", t0_ns=t0, epoch_ns=32_000, batch_seq=0, flow=np.array([1, 1], np.uint32),
                   epoch=np.array([3, 4], np.uint32), tx_bytes=np.array([100, 100], np.uint32), job="j")
    out = st.add([], [b])
    out.extend(st.finish())
    (m,) = out.metrics
    t = t0 + 3 * 32_000
    assert m.start_ns <= t < m.end_ns and (m.end_ns - m.start_ns) % 32_000 == 0
    assert m.act_ns == 2 * 32_000 and m.volume_bytes == 200


def qp(node: str, nic: str, flow: int, qpn: int, remote: int) -> FlowEvent:
    return FlowEvent(job="j", node=node, nic=nic, flow=flow, transport="roce", qpn=qpn, remote_qpn=remote)


def test_a_link_carrying_more_than_its_rail_siblings_is_marked_as_resending() -> None:
    """Four rails between nodes a and b carry the same pipeline sends; rail 2 loses packets
    and resends 30 % more. Its records expect its siblings' bytes; the others expect their own."""
    st = InferredStage(window_ns=WIN)
    events = []
    for k in range(4):
        events += [qp("a", f"m{k}", 1, 100 + k, 200 + k), qp("b", f"m{k}", 1, 200 + k, 100 + k)]
    st.add(events)
    recs = []
    for w in range(10):
        bs = []
        for k in range(4):
            per = 1300 if k == 2 and w >= 2 else 1000
            rows = [(1, e, per) for e in range(10)]
            bs.append(make_batch(node="a", nic=f"m{k}", t0_ns=w * WIN, epoch_ns=EPOCH, batch_seq=w,
                                 flow=np.array([r[0] for r in rows], np.uint32),
                                 epoch=np.array([r[1] for r in rows], np.uint32),
                                 tx_bytes=np.array([r[2] for r in rows], np.uint32), job="j"))
            bs.append(make_batch(node="b", nic=f"m{k}", t0_ns=w * WIN, epoch_ns=EPOCH, batch_seq=w,
                                 flow=np.array([1], np.uint32), epoch=np.array([0], np.uint32),
                                 tx_bytes=np.array([10], np.uint32), job="j"))
        recs += st.add([], bs).metrics
    recs += st.finish().metrics
    sent = [m for m in recs if m.node == "a"]
    assert sent
    resent = {m.nics[0] for m in sent if m.volume_bytes > m.expected_bytes}
    assert resent == {"m2"}
    last = max((m for m in sent if m.nics == ["m2"]), key=lambda m: m.seq)
    assert 1.02 < last.volume_bytes / last.expected_bytes < 1.3  # cumulated since the link began
