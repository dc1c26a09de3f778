"""All-to-all (grouped P2P) records that carry per-peer figures are judged link by link.

The records are built the way an all-to-all's physics makes them: every rank's last flow
ends when the slowest link it uses ends, so every rank's ACT is the same and rank-level
figures name nobody; only which peers each sender finished last can."""

from __future__ import annotations

import numpy as np
from pulse.localization import LocalizeParams, localize

from pulse.records import OpMetrics

from . import synth
from .test_rules import ONSET, anomalies, culprits

N = 6
BYTES = 8 << 20          # per peer
LINK_NS = 640_000        # a healthy link's time: 20 epochs


def _alltoall(link_factor, ops: int = 40, seed: int = 0, imbalance: bool = False, comm: str = "ep0",
              surplus=None, idle=None, peak=None) -> list[OpMetrics]:
    """``link_factor(seq, src, dst) -> f``: the link's time is LINK_NS x f; ``surplus(seq,
    src, dst) -> s``: the link carried s x the bytes declared for it (resent); ``idle(seq,
    rank) -> f``: the rank's NIC was active f of its record's span; ``peak(seq, rank) -> f``:
    its busiest epoch carried f x a healthy NIC's (op-metrics v3; None: no figure)."""
    rng = np.random.default_rng(seed)
    out = []
    for seq in range(ops):
        for r in range(N):
            peers = [d for d in range(N) if d != r]
            nb = [BYTES * (1 + (d % 3) if imbalance else 1) for d in peers]
            done = [int(LINK_NS * (nb[i] / BYTES) * link_factor(seq, r, d) + rng.integers(0, 2) * synth.EPOCH)
                    for i, d in enumerate(peers)]
            done = [-(-x // synth.EPOCH) * synth.EPOCH for x in done]  # whole epochs
            dur = max(done)
            act = dur if idle is None else -(-int(dur * idle(seq, r)) // synth.EPOCH) * synth.EPOCH
            start = seq * synth.PERIOD + int(rng.integers(0, 20_000))
            want = nb
            if surplus is not None:
                nb = [int(b * surplus(seq, r, d)) for b, d in zip(nb, peers, strict=True)]
            vol = sum(nb)
            out.append(OpMetrics(job="job", node=synth.node(r), comm_id=comm, seq=seq, rank=r, kind="GroupP2P",
                                 nranks=N, start_ns=start, end_ns=start + dur, duration_ns=dur, act_ns=act,
                                 volume_bytes=vol, expected_bytes=sum(want), complete=True, active_rate=vol / (act * 1e-9),
                                 flows=len(peers), epoch_ns=synth.EPOCH, nics=["mlx5_0"], t_host_ns=start - 50_000,
                                 peer_ranks=peers, peer_done_ns=done, peer_bytes=nb,
                                 peer_expected_bytes=want,
                                 peak_epoch_bytes=None if peak is None else int(
                                     peak(seq, r) * (N - 1) * BYTES * synth.EPOCH / LINK_NS * rng.uniform(0.95, 1.0))))
    return out


def _events(comm: str = "ep0", flow0: int = 0):
    from pulse.events import CommEvent, FlowEvent
    evs: list = []
    for r in range(N):
        evs.append(CommEvent(job="job", node=synth.node(r), comm_id=comm, rank=r, nranks=N, pid=1))
        for d in range(N):
            if d != r:
                evs.append(FlowEvent(job="job", node=synth.node(r), nic="mlx5_0", flow=flow0 + 100 * r + d, comm_id=comm,
                                     rank=r, peer=d, channel=0, direction="send"))
    return evs


def _run(link_factor, **kw):
    return localize(_alltoall(link_factor, **kw), _events(), LocalizeParams())


def test_healthy_all_to_all_with_expert_imbalance_is_quiet():
    assert not anomalies(_run(lambda s, a, b: 1.0, imbalance=True))


def test_a_nic_slow_both_ways_is_named_though_every_rank_ends_together():
    # node-03's NIC at 45 %: its flows out and every flow into it take 2.2x
    def f(seq, src, dst):
        return 1 / 0.45 if seq >= ONSET and 3 in (src, dst) else 1.0
    ms = _alltoall(f)
    late = [m for m in ms if m.seq >= ONSET]
    assert len({m.act_ns for m in late}) <= 2  # rank-level figures tell nobody apart
    assert culprits(_run(f)) == {("network-slow", "node", ("node-03",))}


def test_a_receiver_slow_only_inward_is_no_blame():
    # node-03's downlink also carries another communicator's traffic (a pipeline stage's
    # activations): flows into it are slow, its own sends are not: not its NIC
    def f(seq, src, dst):
        return 1 / 0.45 if seq >= ONSET and dst == 3 else 1.0
    assert not anomalies(_run(f))


def test_a_node_whose_nic_also_carried_another_communicators_sends_is_no_blame():
    # node-03 slow both ways, but each time its NIC also sent a pipeline stage's
    # activations (a Send of communicator pp0 on the same NIC, same clock): its egress
    # was shared, and the flows into it may share its downlink with the reverse traffic
    def f(seq, src, dst):
        return 1 / 0.45 if seq >= ONSET and 3 in (src, dst) else 1.0
    ms = _alltoall(f)
    sends = [synth.record("pp0", m.seq, 0, 3, kind="Send", nranks=2, start=m.start_ns, end=m.end_ns,
                          t_host=m.start_ns - 10_000, nic="mlx5_0", act=m.act_ns)
             for m in ms if m.rank == 3]
    evs = _events() + synth.comm_events("pp0", [3, 0], ["mlx5_0", "mlx5_0"], 9000)
    assert not anomalies(localize(ms + sends, evs, LocalizeParams()))


def test_a_twin_all_to_all_on_the_same_nic_is_no_excuse():
    # two GPUs' all-to-alls share each node's NIC alike (8 GPUs, 4 NICs): that share is in
    # every operator's median link, so it excuses nobody
    def f(seq, src, dst):
        return 1 / 0.45 if seq >= ONSET and 3 in (src, dst) else 1.0
    ms = _alltoall(f) + _alltoall(f, seed=1, comm="ep1")
    evs = _events() + _events("ep1", 10_000)
    assert culprits(localize(ms, evs, LocalizeParams())) == {("network-slow", "node", ("node-03",))}


def test_a_slow_path_between_two_nodes_blames_no_third_node():
    # one link slow both ways makes neither end slow both ways: not localized by the
    # per-peer figures (the pair's other links are clean), and never a third node
    def f(seq, src, dst):
        return 1 / 0.4 if seq >= ONSET and {src, dst} == {1, 4} else 1.0
    vs = _run(f)
    assert all(set(v.nodes) <= {"node-01", "node-04"} for v in anomalies(vs))


def test_a_lossy_nic_is_named_by_the_bytes_its_links_resent_both_ways():
    # 1 % loss on node-03's NIC: every link into and out of it resends (go-back-N), at
    # the same pace; a rank-level surplus would be every rank's (each sends to node-03)
    def lossy(seq, src, dst):
        return 1.08 if seq >= ONSET and 3 in (src, dst) else 1.0
    vs = localize(_alltoall(lambda s, a, b: 1.0, surplus=lossy), _events(), LocalizeParams())
    assert culprits(vs) == {("network-slow", "node", ("node-03",))}
    assert "volume_ratio" in str(anomalies(vs)[0].evidence)


def test_a_surplus_on_every_link_or_only_into_one_node_is_no_blame():
    # headers counted on every link (a uniform wire surplus) name nobody, nor does a surplus
    # only on the links into one node (its NIC would lose both ways)
    def every(seq, src, dst):
        return 1.05
    assert not anomalies(localize(_alltoall(lambda s, a, b: 1.0, surplus=every), _events(), LocalizeParams()))

    def inward(seq, src, dst):
        return 1.08 if seq >= ONSET and dst == 3 else 1.0
    assert not anomalies(localize(_alltoall(lambda s, a, b: 1.0, surplus=inward), _events(), LocalizeParams()))


def test_links_slow_both_ways_at_a_node_whose_nic_sat_idle_are_not_its_nic():
    # a starved host posts its all-to-all late, both ways: its links crawl, but its NIC is
    # idle for a sixth of its records' span, which a capped NIC never is
    def f(seq, src, dst):
        return 1 / 0.45 if seq >= ONSET and 3 in (src, dst) else 1.0

    def idle(seq, r):
        return 0.85 if seq >= ONSET and r == 3 else 1.0
    assert not anomalies(localize(_alltoall(f, idle=idle), _events(), LocalizeParams()))


def _a2a_op(late_rx: bool, starts: bool = True) -> list[OpMetrics]:
    """One 4-rank all-to-all (2 MB per peer, 16 us epochs; times in epochs, each sender's
    clock): rank 3 posted its receives 60 epochs late (``late_rx``) - its peers finished
    their mutual flows sharing their NICs two ways, then sent to it, and it sent to all three
    at once, sharing its NIC three ways - or its NIC was capped at 40 % (every flow into and
    out of it 2.5x)."""
    e = 16_000
    recs = []
    for r in range(4):
        peers = [d for d in range(4) if d != r]
        if late_rx:
            span = {d: ((60, 80) if d == 3 else (0, 12)) for d in peers} if r != 3 else dict.fromkeys(peers, (0, 20))
        else:
            span = {d: (0, 40) if 3 in (r, d) else (0, 16) for d in peers}
        begin = [span[d][0] * e for d in peers]
        done = [span[d][1] * e for d in peers]
        dur = max(done)
        busy = sum(b - a for a, b in span.values())
        act = min(dur, busy * e) if late_rx and r != 3 else dur
        recs.append(OpMetrics(job="job", node=synth.node(r), comm_id="ep0", seq=0, rank=r, kind="GroupP2P", nranks=4,
                              start_ns=0, end_ns=dur, duration_ns=dur, act_ns=act, volume_bytes=3 * (2 << 20),
                              expected_bytes=3 * (2 << 20), complete=True, active_rate=1.0, flows=3, epoch_ns=e,
                              nics=["mlx5_0"], t_host_ns=0, peer_ranks=peers, peer_done_ns=done,
                              peer_bytes=[2 << 20] * 3, peer_expected_bytes=[2 << 20] * 3,
                              peer_start_ns=begin if starts else None))
    return recs


def _judged(recs: list[OpMetrics]):
    from pulse.localization.opview import Judgement, OpView
    from pulse.localization.peer_rates import judge_peer_rates

    eps = [f"{synth.node(r)}/mlx5_0" for r in range(4)]
    view = OpView("ep0", 0, "GroupP2P", {r: synth.node(r) for r in range(4)}, recs, eps,
                  [tuple(x for j, x in enumerate(eps) if j != i) for i in range(4)], [False] * 4,
                  endpoint_of=lambda r: eps[r])
    out = Judgement()
    assert judge_peer_rates(view, LocalizeParams(), out)
    return out


def test_links_into_a_receiver_that_posted_late_are_not_its_downlink():
    # sweep 157 #11: a slow GPU's rank late into 4-rank all-to-alls was named network-slow
    for starts in (True, False):  # first bytes per peer, or (older records) its senders idling
        out = _judged(_a2a_op(late_rx=True, starts=starts))
        assert not out.findings and not any(lk.slow for lk in out.links)
    # a capped NIC: the flows into it start with the others and last
    out = _judged(_a2a_op(late_rx=False))
    assert {f.node for f in out.findings} == {synth.node(r) for r in range(4)}
    assert {lk.dst for lk in out.links if lk.slow} | {lk.src for lk in out.links if lk.slow} >= {"node-03/mlx5_0"}


def _slow_at_3(seq, src, dst):
    return 1 / 0.45 if seq >= ONSET and 3 in (src, dst) else 1.0


def test_a_nic_whose_busiest_epochs_fell_to_its_links_rate_is_network_slow():
    # A NIC at 45 %: no epoch of it carries more than 45 % of what it used to.
    ms = _alltoall(_slow_at_3, peak=lambda seq, r: 0.45 if seq >= ONSET and r == 3 else 1.0)
    assert culprits(localize(ms, _events(), LocalizeParams())) == {("network-slow", "node", ("node-03",))}


def test_links_slow_both_ways_at_a_nic_that_still_bursts_at_line_rate_are_not_its_nic():
    # A host starved of CPU posts its sends and receives late: its links run at 45 % of
    # the operator's median both ways, its NIC busy all along, but every post goes out at
    # line rate (sweep 199 #12).
    ms = _alltoall(_slow_at_3, peak=lambda seq, r: 0.9 if seq >= ONSET and r == 3 else 1.0)
    assert not {c for c in culprits(localize(ms, _events(), LocalizeParams())) if c[0] == "network-slow"}
    # Without the figure (records before op-metrics v3) the links still name it.
    assert culprits(_run(_slow_at_3)) == {("network-slow", "node", ("node-03",))}


def test_a_receiver_whose_downlink_delivered_less_is_starved_inward():
    """Sweep 229 #18: congestion into node-14's downlinks under MoE (15 nodes, pp 1): every
    link into it at 0.40-0.52 of the links into the others, every link out of it normal.
    Judged from each flow's own first byte (a receiver that posted late starts late, not
    slow), a receiver is starved when most of its links in are below the bar and all it
    took in together is below rate_ratio of the median receiver's."""
    import numpy as np
    from pulse.localization.peer_rates import _starved_receivers

    dst = ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"] * 3
    rate = np.array([10.0] * 9 + [4.0] * 3)
    every = np.ones(12, np.bool_)
    assert _starved_receivers(dst, rate < 8.0, every, rate, 0.8) == {"d"}
    # most links slow, but one fast enough that it took in as much as the others: no
    rate = np.array([10.0] * 9 + [5.0, 5.0, 30.0])
    assert _starved_receivers(dst, rate < 8.0, every, rate, 0.8) == set()
    # links that waited for their receiver to post do not count
    rate = np.array([10.0] * 9 + [4.0] * 3)
    waited = every.copy()
    waited[9:11] = False
    assert _starved_receivers(dst, rate < 8.0, waited, rate, 0.8) == set()
    # two receivers: one's less is the other's more
    assert _starved_receivers(dst[6:], rate[6:] < 8.0, every[6:], rate[6:], 0.8) == set()


def test_a_starved_receivers_link_is_excused_while_our_own_other_records_went_into_it():
    """A receiver's downlink that also carried a ring's, a tree's or a pipeline stage's
    records of ours took a share (sweep 37 #4): its all-to-all links slow inward are not
    the network's. Two records on their senders' clocks overlap within the skew bound."""
    from pulse.localization.alive import AlivePoints
    from pulse.localization.finding import ACT, PEER_RATE_IN, Finding
    from pulse.localization.params import LocalizeParams

    ms = 1_000_000
    alive = AlivePoints(LocalizeParams(clock_skew_ns=ms))
    f = Finding(ACT, "ep", 0, 1, "n1", "n1/mlx5_0", 4.0, 9.0, PEER_RATE_IN, 100 * ms, 110 * ms, ("n2/mlx5_0",))
    assert not alive.shared(f)  # nothing else of ours into n2
    alive.note_into("n2/mlx5_0", 50 * ms, 98 * ms)  # ended 2 ms before: outside the skew bound
    alive.note_into("n3/mlx5_0", 100 * ms, 110 * ms)  # into another NIC
    assert not alive.shared(f)
    alive.note_into("n2/mlx5_0", 60 * ms, 99 * ms + ms // 2)  # within the skew bound of its start
    assert alive.shared(f)


def test_what_a_receiver_took_in_from_all_its_flows_is_its_downlinks_rate():
    """An all-to-all sender's rate is shared among its receivers, so no one link into a
    receiver shows its downlink; the bytes of all its flows in over the longest of them do
    (sweep 281 #21, 347 #5: healthy receivers took in 26-43 GB/s from their all-to-all
    peers while a pipeline send or a ring link into them went at 15-24). A receiver slow
    both ways shows 0; one whose flows in waited for it to post shows nothing."""
    import dataclasses

    e = 16_000
    healthy = [dataclasses.replace(r, peer_done_ns=[16 * e] * 3, duration_ns=16 * e, end_ns=16 * e, act_ns=16 * e)
               for r in _a2a_op(late_rx=False)]
    got = {ep: rate for ep, _end, rate in _judged(healthy).intake}
    assert got.keys() == {f"{synth.node(r)}/mlx5_0" for r in range(4)}
    assert all(abs(v - 3 * (2 << 20) / (17 * e)) < 1e-9 for v in got.values())
    # node-03 capped at 40 %: it shows 0, the others what they carried, its slow flow in
    capped = {ep: rate for ep, _end, rate in _judged(_a2a_op(late_rx=False)).intake}
    assert capped["node-03/mlx5_0"] == 0.0
    assert all(abs(capped[f"{synth.node(r)}/mlx5_0"] - 3 * (2 << 20) / (41 * e)) < 1e-9 for r in range(3))
    # node-03 posted its receives late: the flows into it waited, and time the wait
    assert "node-03/mlx5_0" not in {ep for ep, _e, _r in _judged(_a2a_op(late_rx=True)).intake}


def test_a_receiver_that_took_in_less_than_the_others_shows_nothing_of_its_downlink():
    # sweep 293 #2: congestion in bursts into d's downlink; each flow into it near its
    # usual pace (no link below the bar), all of them together half what the others took in
    import numpy as np
    from pulse.localization.peer_rates import _intake

    dst = ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"] * 3
    nb = np.full(12, 1e6)
    span = np.array([1e5] * 9 + [2e5] * 3)
    ends = np.arange(12, dtype=np.int64)
    got = {k: r for k, _e, r in _intake(dst, nb, span, ends, np.zeros(12, np.bool_), set(), 0.0, 0.8)}
    assert got == {"a": 30.0, "b": 30.0, "c": 30.0, "d": 0.0}
    assert _intake(dst[:6], nb[:6], span[:6], ends[:6], np.zeros(6, np.bool_), set(), 0.0, 0.8) == []  # two receivers


def test_a_downlink_is_shown_by_the_median_of_its_recent_all_to_alls():
    # a downlink congested in bursts passes an all-to-all at its usual pace now and then:
    # its best says nothing, its typical all-to-all does (at least link_min_obs of them)
    from pulse.localization.evidence import Intake

    congested, healthy = Intake(LocalizeParams()), Intake(LocalizeParams())
    for t, (c, h) in enumerate(zip([40.0, 0.0, 0.0, 38.0, 0.0], [30.0, 0.0, 32.0, 35.0, 31.0], strict=True)):
        congested.add("d/mlx5_0", t, c)
        healthy.add("d/mlx5_0", t, h)
    assert congested.since(["d"], 0) == {"d/mlx5_0": 0.0}
    assert healthy.since(["d"], 0) == {"d/mlx5_0": 31.0}
    assert healthy.since(["d"], 3) == {}  # two all-to-alls since: too few
    assert healthy.since(["e"], 0) == {}
