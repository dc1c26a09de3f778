"""Each localization rule on small hand-built operator metric sets."""

from __future__ import annotations

from pulse.localization import LocalizeParams, Localizer, localize

from pulse.records import Verdict

from . import synth

ONSET = 10


def anomalies(vs: list[Verdict]) -> list[Verdict]:
    return [v for v in vs if v.status == "anomaly"]


def culprits(vs: list[Verdict]) -> set[tuple[str | None, str | None, tuple[str, ...]]]:
    return {(v.kind, v.level, tuple(v.nodes)) for v in anomalies(vs)}


def run(tweak=None, **kw) -> list[Verdict]:
    n = kw.pop("n", 4)
    rails = kw.pop("rails", 2)
    params = kw.pop("params", LocalizeParams())
    shared = kw.get("shared", False)
    return localize(synth.metrics(n, rails, tweak=tweak, **kw), synth.events(n, rails, shared=shared), params)


def test_healthy_jitter_gives_no_alarm_and_a_healthy_verdict():
    for seed in range(5):
        vs = run(seed=seed)
        assert not anomalies(vs)
        assert any(v.status == "healthy" for v in vs)
        assert all(v.method == "pulse" for v in vs)


def _nic_slow(comm, seq, r, f):
    # node-02's NIC on rail 0 is slow in and out: it and the rank sending into it stay
    # busiest in the throttled ring
    if comm == "dp0" and seq >= ONSET and r in (1, 2):
        f["act_ns"] = int(synth.ACT * 1.6)
    return f


def test_network_slow_rank_with_larger_act_is_blamed_with_its_nic():
    slow = _nic_slow
    vs = run(slow)
    assert culprits(vs) == {("network-slow", "node", ("node-02",))}
    v = anomalies(vs)[0]
    assert v.nics == ["node-02/mlx5_0"]
    assert v.ranks == [2]
    f = v.evidence["findings"][-1]
    assert f["metric"] == "act_ns" and f["value"] > 1.3 * f["reference"]
    assert v.window["first_seq"] >= ONSET
    assert v.first_seen_ns >= ONSET * synth.PERIOD - 200_000


def test_slow_nic_in_both_directions_blames_the_nic_not_its_ring_neighbour():
    # node-02's NIC is slow in and out: node-01 (sending into it) also shows a larger ACT,
    # but only node-02 is on every slow link.
    def slow(comm, seq, r, f):
        if comm == "dp0" and seq >= ONSET and r in (1, 2):
            f["act_ns"] = int(synth.ACT * (1.6 if r == 2 else 1.595))
        return f
    assert culprits(run(slow)) == {("network-slow", "node", ("node-02",))}


def test_mild_act_increase_below_threshold_does_not_alarm():
    def slow(comm, seq, r, f):
        if comm == "dp0" and r == 2 and seq >= ONSET:
            f["act_ns"] = int(f["act_ns"] * 1.04)
        return f
    assert not anomalies(run(slow))


def test_occasional_outlier_is_jitter_not_a_fault():
    def blip(comm, seq, r, f):
        if comm == "dp0" and r == 2 and seq in (5, 17, 29):
            f["act_ns"] = int(f["act_ns"] * 1.5)
        return f
    assert not anomalies(run(blip))


def test_recovery_emits_cleared():
    def slow(comm, seq, r, f):
        return _nic_slow(comm, seq, r, f) if seq < 24 else f
    vs = run(slow, ops=60)
    assert culprits(vs) == {("network-slow", "node", ("node-02",))}
    cleared = [v for v in vs if v.status == "cleared"]
    assert cleared and cleared[0].nodes == ["node-02"]
    assert vs.index(cleared[0]) > vs.index(anomalies(vs)[0])


def test_anomaly_is_repeated_while_it_persists():
    assert len(anomalies(run(_nic_slow, ops=60))) >= 3


def test_network_stop_blames_the_node_that_sent_least():
    # node-02's NIC dies: its own sends stall at nothing, and so do the sends into it
    # (dp0: 1 -> 2, dp1 ring 0,2,1,3: 0 -> 2); every other record still completes.
    def stop(comm, seq, r, f):
        if seq == 39 and (r == 2 or (comm, r) in (("dp0", 1), ("dp1", 0))):
            f["complete"] = False
            f["volume_bytes"] = 0 if r == 2 else synth.BYTES // 3
        return f
    assert culprits(run(stop)) == {("network-stop", "node", ("node-02",))}


def test_compute_stop_blames_the_rank_that_never_started():
    def hang(comm, seq, r, f):
        if seq == 39:
            if r == 2:
                return None
            f["complete"] = False
            f["volume_bytes"] = synth.BYTES // 8
        return f
    assert culprits(run(hang)) == {("compute-stop", "node", ("node-02",))}


def test_missing_data_gives_insufficient_data_never_blame():
    def gone(comm, seq, r, f):
        return None if r == 3 and seq >= 5 else f
    vs = run(gone)
    assert not anomalies(vs)
    ins = [v for v in vs if v.status == "insufficient-data"]
    assert ins and ins[0].nodes == ["node-03"]
    healthy = [v for v in vs if v.status == "healthy"]
    assert healthy and all("node-03" not in v.nodes for v in healthy)


def _late(delay: int, onset: int = ONSET):
    # node-02's GPU computes longer: it enters every operator late; its peers wait inside
    # the operator (longer durations), the operator ends together on every rank.
    def late(comm, seq, r, f):
        if seq >= onset:
            if r == 2:
                f["start_ns"] += delay
                f["t_host_ns"] += delay
            else:
                f["duration_ns"] += delay
        return f
    return late


def test_compute_slow_rank_idles_longer_before_its_operators():
    vs = run(_late(8_000_000))
    assert culprits(vs) == {("compute-slow", "node", ("node-02",))}
    f = anomalies(vs)[0].evidence["findings"][-1]
    assert f["metric"] == "issue_to_end_ns" and f["value"] < f["reference"] - 7_000_000


def test_a_rank_that_finishes_first_did_not_keep_its_peers_waiting():
    """Real Gloo ring, rank 2 at 200 Mbit/s (a CI run's lab e2e): every rank issued each
    AllReduce within tens of ms, but rank 0's last chunks came first and its operators
    ended 40-95 ms before its peers': its issue-to-end span was the shortest by more than
    the lab's 60 ms lateness bar, and it was named compute-slow. A shorter span says the
    peers waited only if the rank's end came with theirs."""
    def early_end(comm, seq, r, f):
        if seq >= ONSET:
            f["duration_ns"] += 0 if r == 0 else 12_000_000  # the others' last chunks come later
        return f

    import dataclasses

    from pulse.events import CommEvent

    # no ring order known (Gloo publishes none), so no ring predecessor's end explains it
    evs = [dataclasses.replace(e, rings=None) if isinstance(e, CommEvent) else e for e in synth.events(4, 2)]
    vs = localize(synth.metrics(4, 2, tweak=early_end), evs, LocalizeParams())
    assert not [v for v in anomalies(vs) if v.kind == "compute-slow"]
    # the same spans from a late issue (ends together) are still the rank's own lateness
    vs = localize(synth.metrics(4, 2, tweak=_late(12_000_000)), evs, LocalizeParams())
    assert culprits(vs) == {("compute-slow", "node", ("node-02",))}


def test_resent_bytes_do_not_hide_a_rank_its_peers_waited_for():
    """Lab, a rank at 5 % of a core, 0.3-1.4 s late in every operator: its full socket
    buffers dropped what its senders then resent, and every operator carrying that surplus
    dropped the rank's lateness with it (only 10 of 16 late left: "healthy"). Lateness its
    peers waited tens of ms for is kept beside the surplus."""
    late = _late(80_000_000)

    def starved(comm, seq, r, f):
        f = late(comm, seq, r, f)
        if seq >= ONSET and r == 1:
            f["volume_bytes"] = int(f["expected_bytes"] * 1.05)  # resent into the starved receiver
        return f

    assert ("compute-slow", "node", ("node-02",)) in culprits(run(starved, params=LocalizeParams(late_min_ns=60_000_000)))


def test_lateness_below_the_clock_offset_bound_counts_only_against_the_ranks_own_history():
    # late by 1 ms (the default skew bound) from the first operator: against its peers it
    # could be its clock, and it has no earlier self to differ from
    assert not anomalies(run(_late(1_000_000, onset=0)))
    # late by 1 ms from operator 10 on: its issue lag rose above its own baseline, which
    # no constant clock offset can do
    assert culprits(run(_late(1_000_000))) == {("compute-slow", "node", ("node-02",))}


def test_tx_slow_nic_with_two_peers_is_the_node_not_a_path():
    def slow(comm, seq, r, f):
        if seq >= ONSET and r == 2:
            f["act_ns"] = int(f["act_ns"] * 1.4)
        return f
    assert culprits(run(slow, shared=True)) == {("network-slow", "node", ("node-02",))}


def _group(rate_of: dict[int, float], imbalance: bool):
    def f_(comm, seq, r, f):
        vol = synth.BYTES * ((1 + r) if imbalance else 1)
        act = int(synth.ACT * vol / synth.BYTES / rate_of.get(r, 1.0)) if seq >= ONSET else \
            int(synth.ACT * vol / synth.BYTES)
        f.update(volume_bytes=vol, expected_bytes=vol, act_ns=act)
        return f
    return f_


def test_grouped_p2p_expert_imbalance_is_not_an_alarm():
    assert not anomalies(run(_group({}, imbalance=True), kind="GroupP2P", n=6, rails=1))


def test_streaming_in_pieces_equals_batch():
    def slow(comm, seq, r, f):
        if comm == "dp0" and r == 2 and seq >= ONSET:
            f["act_ns"] = int(f["act_ns"] * 1.3)
        return f
    ms = sorted(synth.metrics(tweak=slow), key=lambda m: m.end_ns)
    loc = Localizer(LocalizeParams())
    loc.add_events(synth.events())
    out: list[Verdict] = []
    for i in range(0, len(ms), 7):
        out += loc.update(ms[i:i + 7])
    out += loc.finish()
    batch = localize(ms, synth.events(), LocalizeParams())
    strip = lambda vs: [(v.status, v.kind, v.nodes, v.window.get("last_seq")) for v in vs]  # noqa: E731
    assert strip(out) == strip(batch)


def test_verdicts_roundtrip_the_wire_contract():
    def slow(comm, seq, r, f):
        if comm == "dp0" and r == 2 and seq >= ONSET:
            f["act_ns"] = int(f["act_ns"] * 1.3)
        return f
    from pulse.records import decode_verdict
    for v in run(slow):
        assert decode_verdict(v.to_json()) == v


def test_network_stop_first_stall_decides_not_the_cascade():
    # node-02's NIC dies at seq 30: its own send (dp0 ring 0->1->2->3) stalls at nothing
    # first; 5 ms later the job hangs and node-01 - now waiting - stalls on both rails
    # sending into node-02 and node-00. The victims' later stalls must not outvote it.
    def stop(comm, seq, r, f):
        if comm == "dp0" and seq == 30 and r == 2:
            f["complete"], f["volume_bytes"] = False, 0
        elif seq == 31 and r == 1:
            f["start_ns"] += 5_000_000
            f["complete"], f["volume_bytes"] = False, 0
        elif seq > 30 and not (seq == 31 and r != 1):
            return None
        return f
    vs = run(stop, ops=32)
    assert culprits(vs) == {("network-stop", "node", ("node-02",))}


def test_network_stop_sender_receiver_tie_goes_to_the_sender_that_sent_nothing():
    # one stalled record only: node-02's send to node-03 carried nothing (its NIC is dead);
    # node-03 is only named as the peer, so the sender is the node.
    def stop(comm, seq, r, f):
        if comm == "dp0" and seq == 30 and r == 2:
            f["complete"], f["volume_bytes"] = False, 0
        elif seq >= 30 and (comm, seq) != ("dp0", 30):
            return None
        return f
    assert culprits(run(stop, ops=31)) == {("network-stop", "node", ("node-02",))}


def test_grouped_p2p_low_rank_rate_is_not_blamed_on_that_rank():
    # A NIC that lost capacity in both directions: in an all-to-all its peers' sends into
    # it crawl (they share its halved downlink) while its own sends run at half rate, so
    # the culprit has the highest rate of its group and the lowest-rate rank is a victim.
    rates = {0: 0.45, 1: 0.4, 2: 0.6, 3: 0.45, 4: 0.4, 5: 0.45}
    vs = run(_group(rates, imbalance=False), kind="GroupP2P", n=6, rails=1)
    assert all(v.nodes != ["node-01"] and v.nodes != ["node-04"] for v in anomalies(vs))


def test_grouped_p2p_rate_blame_when_enabled_names_the_low_rank():
    vs = run(_group({2: 0.5}, imbalance=True), kind="GroupP2P", n=6, rails=2,
             params=LocalizeParams(rate_blame=True))
    # only its sends are slow, the sends into it are not: a send-side (host) cause
    assert {nodes for _k, _l, nodes in culprits(vs)} == {("node-02",)}


def test_grouped_p2p_surplus_bytes_mark_links_only_when_enabled():
    """A rank whose records carried 30 % more than expected (network-only mode's rail
    siblings' bytes) loses packets: its links are slow when ``grouped_resent`` is on; a
    grouped call's declared bytes alone (the default) say nothing of retransmissions."""
    def resend(comm, seq, r, f):
        if r == 2 and seq >= ONSET:
            f["volume_bytes"] = int(f["expected_bytes"] * 1.3)
        return f
    assert not anomalies(run(resend, kind="GroupP2P", n=6, rails=2))
    vs = run(resend, kind="GroupP2P", n=6, rails=2, params=LocalizeParams(grouped_resent=True))
    assert {(k, nodes) for k, _l, nodes in culprits(vs)} == {("network-slow", ("node-02",))}
    ev = next(v for v in anomalies(vs)).evidence
    assert "volume_ratio" in str(ev)


# -- rail skew: one NIC that stalls now and then (a flap) -------------------------------------

def _aligned(stall: dict[str, set[int]] | None = None, delay: int = 6_000_000):
    """Operators of every rail issued together (as a node's GPUs issue them); the listed
    communicators' operators end ``delay`` later (their NIC stalled, traffic waited)."""
    def f_(comm, seq, r, f):
        k = int(comm[2:])
        f["start_ns"] -= k * 5_000_000
        f["t_host_ns"] -= k * 5_000_000
        if stall and seq in stall.get(comm, ()):
            f["duration_ns"] += delay
        return f
    return f_


def _p2p(pairs: dict[str, tuple[int, int]], rails: int, ops: int, stall: dict[str, set[int]], delay: int = 6_000_000,
         slow: dict[tuple[str, int], float] | None = None):
    """Point-to-point sends both ways between node pairs, one communicator per rail;
    ``slow``: (communicator, sending node) -> how much longer its sends take from ONSET."""
    evs, ms, flow = [], [], 10_000
    for name, (a, b) in pairs.items():
        for k in range(rails):
            comm = f"{name}{k}"
            evs += synth.comm_events(comm, [a, b], [f"mlx5_{k}"] * 2, flow)
            flow += 2
            for seq in range(ops):
                for rank, nd in enumerate((a, b)):
                    t_host = seq * synth.PERIOD + 2_000_000 + rank * 7_000_000
                    start = t_host + 50_000
                    dur = 400_000 + (delay if seq in stall.get(comm, ()) and rank == 0 else 0)
                    x = slow.get((comm, nd), 1.0) if slow and seq >= ONSET else 1.0
                    ms.append(synth.record(comm, seq, rank, nd, kind="Send", nranks=2, start=start,
                                           end=start + int(dur * x), t_host=t_host, nic=f"mlx5_{k}",
                                           act=int(320_000 * x)))
    return evs, ms


def test_flapping_nic_is_named_from_the_communicators_its_stalls_share():
    # node-02's NIC on rail 1 drops out now and then: whatever runs on it at that moment
    # ends milliseconds after the same operator on the other rails (the ring of rail 1,
    # node-02's sends to node-03 and to node-01); ACT stays normal
    stalls = {"dp1": {12, 20, 28}, "pa1": {14, 22, 30}, "pb1": {16, 24, 32}}
    pevs, pms = _p2p({"pa": (2, 3), "pb": (2, 1)}, 4, 40, stalls)
    ms = synth.metrics(4, 4, tweak=_aligned(stalls)) + pms
    vs = localize(ms, synth.events(4, 4) + pevs, LocalizeParams())
    # while only the ring and the sends to node-03 stalled, node-02 and node-03 are the
    # pair in common (a group); the sends to node-01 single out node-02
    assert all(v.kind == "network-slow" and "node-02" in v.nodes for v in anomalies(vs))
    assert ("network-slow", "node", ("node-02",)) in culprits(vs)
    v = next(v for v in anomalies(vs) if v.level == "node")
    assert v.nics == ["node-02/mlx5_1"]
    assert v.evidence["rule"].get("rail")


def test_rail_skew_spread_over_a_nodes_nics_is_not_a_nic():
    # late ends on every rail in turn (a host reaching its NICs late), not one NIC
    stalls = {f"pa{k}": {12 + 2 * k, 20 + 2 * k} for k in range(4)}
    pevs, pms = _p2p({"pa": (2, 3), "pb": (2, 1)}, 4, 40, stalls)
    vs = localize(synth.metrics(4, 4, tweak=_aligned()) + pms, synth.events(4, 4) + pevs, LocalizeParams())
    assert not any(v.kind == "network-slow" for v in anomalies(vs))


def test_operators_issued_apart_are_not_rail_siblings():
    # the default synthetic rails run 5 ms apart: their ends differ by design
    pevs, pms = _p2p({"pa": (2, 3)}, 4, 40, {})
    assert not anomalies(localize(synth.metrics(4, 4) + pms, synth.events(4, 4) + pevs, LocalizeParams()))


def _silent_pair(alive: dict[int, int], stall_seqs=((14, 30), (22, 38))):
    """node-02 <-> node-03 sends on 4 rails; on rail 1 the sends of ``stall_seqs`` (per rank:
    node-02's, node-03's) wait 6 ms before their first byte (the link is down), then go at
    full speed. ``alive``:
    node -> a third party it exchanges with on rail 1 (comm pc<node>), whose operator's
    credit grant reaches that node's NIC 3 ms into each of those waits."""
    evs, ms = [], []
    delay = 6_000_000
    for k in range(4):
        comm = f"pa{k}"
        evs += synth.comm_events(comm, [2, 3], [f"mlx5_{k}"] * 2, 100 + 2 * k)
        for seq in range(48):
            for rank, nd in enumerate((2, 3)):
                t_host = seq * synth.PERIOD + 2_000_000 + rank * 7_000_000
                start = t_host + 50_000 + (delay if k == 1 and seq in stall_seqs[rank] else 0)
                ms.append(synth.record(comm, seq, rank, nd, kind="Send", nranks=2, start=start, end=start + 400_000,
                                       t_host=t_host, nic=f"mlx5_{k}"))
    waits = sorted((s * synth.PERIOD + 2_000_000 + r * 7_000_000) for r in (0, 1) for s in stall_seqs[r])
    for nd, other in alive.items():
        comm = f"pc{nd}"
        evs += synth.comm_events(comm, [nd, other], ["mlx5_1"] * 2, 200 + 2 * nd)
        for seq, t0 in enumerate(waits):
            for rank, x in enumerate((nd, other)):
                start = t0 + 20_000_000
                ms.append(synth.record(comm, seq, rank, x, kind="Send", nranks=2, start=start, end=start + 400_000,
                                       t_host=start - 50_000, nic="mlx5_1",
                                       granted_ns=t0 + 3_000_000 if x == nd else None))
    return evs, ms


def test_a_stalled_link_end_seen_alive_during_the_silence_is_exonerated():
    # the down periods only ever caught node-02 <-> node-03 traffic: from rail skew alone the
    # two ends cannot be told apart, and the pair would blame a healthy node: nobody is named;
    # node-03's NIC received a third party's credit grant while the link was silent, so it was
    # up and node-02's NIC is the one that stopped
    evs, ms = _silent_pair({})
    assert culprits(localize(ms, evs, LocalizeParams())) == set()
    evs, ms = _silent_pair({3: 1})
    got = culprits(localize(ms, evs, LocalizeParams()))
    assert got == {("network-slow", "node", ("node-02",))}
    v = next(v for v in anomalies(localize(ms, evs, LocalizeParams())) if v.level == "node")
    assert v.nics == ["node-02/mlx5_1"] and "node-03/mlx5_1" in v.evidence["alive_during_stall"]


def test_both_ends_alive_during_the_silence_names_nobody():
    # both NICs moved bytes with third parties while their link was silent: neither stopped
    evs, ms = _silent_pair({3: 1, 2: 0})
    assert culprits(localize(ms, evs, LocalizeParams())) == set()


def test_aliveness_inside_the_clock_offset_margin_does_not_count():
    # a grant 3 ms into a 6 ms wait is not evidence if the clocks may be 3 ms apart
    evs, ms = _silent_pair({3: 1})
    assert culprits(localize(ms, evs, LocalizeParams(clock_skew_ns=3_500_000))) == set()
    assert culprits(localize(ms, evs, LocalizeParams(clock_skew_ns=2_500_000))) == {
        ("network-slow", "node", ("node-02",))}


def test_late_rank_turns_its_peers_act_outliers_into_waiting():
    # node-02 arrives 60 ms late; the rank sending into it looks busy (its sends cannot
    # drain into a receiver that is not there): compute, not network
    def f_(comm, seq, r, f):
        if seq >= ONSET:
            if r == 2:  # the operator still ends together on every rank
                f["t_host_ns"] += 60_000_000
                f["start_ns"] += 60_000_000
            else:
                f["duration_ns"] += 60_000_000
            if into_2(comm, r):
                f["act_ns"] = int(f["act_ns"] * 1.5)
        return f

    def into_2(comm: str, r: int) -> bool:  # r's ring successor in comm is rank 2
        ring = synth.rings(4, 2)[comm]
        return ring[(ring.index(r) + 1) % 4] == 2

    assert culprits(run(f_)) == {("compute-slow", "node", ("node-02",))}
    # without the override its slow operators hide its lateness from the per-operator
    # rules; the consistent-latest test reads arrivals in every operator and is off here
    off = LocalizeParams(late_overrides_act=False, late_straggler_steps=1000)
    assert ("compute-slow", "node", ("node-02",)) not in culprits(run(f_, params=off))
    # and with it on, node-02 and no other node is named: the slowed links into it meet
    # there (network-slow first), and no neighbour is blamed for waiting on it
    named = culprits(run(f_, params=LocalizeParams(late_overrides_act=False)))
    assert named and {n for _, _, nodes in named for n in nodes} == {"node-02"}


def test_a_few_ms_late_does_not_explain_away_real_network_slowness():
    # a node behind a congested downlink arrives a few ms late too: its ring's ACT stays evidence
    def f_(comm, seq, r, f):
        if seq >= ONSET:
            if r == 2:  # the operator still ends together on every rank
                f["t_host_ns"] += 6_000_000
                f["start_ns"] += 6_000_000
            else:
                f["duration_ns"] += 6_000_000
            if r in (1, 2) and comm == "dp0":
                f["act_ns"] = int(f["act_ns"] * 1.6)
        return f
    assert ("network-slow", "node", ("node-02",)) in culprits(run(f_))


def test_pipeline_peer_of_a_blamed_node_is_a_victim_not_a_straggler():
    # node-02's NIC is slow (its sends to node-03 too, which cross the same link as its ring
    # sends); node-03, its point-to-point (pipeline) peer, waits for it and arrives late
    # into its collectives: one fault, not a second compute straggler
    def f_(comm, seq, r, f):
        f = _nic_slow(comm, seq, r, f)
        if seq >= ONSET and r == 3:
            f["t_host_ns"] += 8_000_000
        elif seq >= ONSET:
            f["duration_ns"] += 8_000_000
        return f
    pevs, pms = _p2p({"pa": (2, 3)}, 4, 40, {}, slow={("pa0", 2): 1.6})
    vs = localize(synth.metrics(4, 4, tweak=f_) + pms, synth.events(4, 4) + pevs, LocalizeParams())
    assert ("network-slow", "node", ("node-02",)) in culprits(vs)
    assert not any(v.kind == "compute-slow" for v in anomalies(vs))


def test_evaluating_hypotheses_every_operator_or_throttled_names_the_same_culprits():
    # the throttle only saves work: on every hand-built fault here both name the same nodes
    evs, ms = _silent_pair({3: 1})
    cases = [(ms, evs)]
    stalls = {"dp1": {12, 20, 28}, "pa1": {14, 22, 30}, "pb1": {16, 24, 32}}
    pevs, pms = _p2p({"pa": (2, 3), "pb": (2, 1)}, 4, 40, stalls)
    cases.append((synth.metrics(4, 4, tweak=_aligned(stalls)) + pms, synth.events(4, 4) + pevs))
    for m, e in cases:
        every = culprits(localize(m, e, LocalizeParams(hypotheses_every_ns=0)))
        assert every and culprits(localize(m, e, LocalizeParams(hypotheses_every_ns=50_000_000))) == every


def _ring_late(victim: bool | str):
    """A 4-rank ring 0 -> 1 -> 2 -> 3 (node-00..03), an operator every 120 ms. On odd seqs
    node-02 issues 80 ms after its peers and the operator ends together on every rank
    (node-02's span is 80 ms shorter: "late"). ``victim``: its previous (even) operator
    ended 80 ms late (it sat behind a slow hop) and it issued after the same compute gap
    as its peers; otherwise its previous operator ended with the others and its own gap
    was 80 ms longer (a compute straggler). ``victim="pred"``: node-02's own sends of the
    previous operator ended on time, but those of its ring predecessor (node-01), whose
    last chunk node-02 waited for, ended 80 ms late; node-01 then issues late too."""
    evs, ms = synth.comm_events("dp", [0, 1, 2, 3], ["mlx5_0"] * 4, 300), []
    prev_end = dict.fromkeys(range(4), 0)
    slow_hop = 1 if victim == "pred" else 2
    for seq in range(40):
        base = seq * 120_000_000 + 10_000_000
        late = seq % 2 == 1 and seq >= 10
        issue = {rk: base for rk in range(4)}
        if late:
            # the peers' compute gap: from the operator's common end to the next issue
            issue[2] = (prev_end[slow_hop] + base - prev_end[0]) if victim else base + 80_000_000
            if victim == "pred":
                issue[1] = issue[2]
        end = max(issue.values()) + 10_000_000
        ends = dict.fromkeys(range(4), end)
        if victim and seq % 2 == 0 and seq >= 9:
            ends[slow_hop] = end + 78_000_000  # the hop into node-02 finishes late
        for rk in range(4):
            start = max(issue.values()) + 100_000
            e = max(ends[rk], start + 1)
            ms.append(synth.record("dp", seq, rk, rk, kind="AllReduce", nranks=4, start=start, end=e,
                                   t_host=issue[rk], nic="mlx5_0", act=2_000_000, nbytes=6 << 20))
            prev_end[rk] = ends[rk]
    return evs, ms


def test_late_issue_after_a_late_previous_end_is_not_a_compute_straggler():
    # node-02 issues 80 ms late on every other operator in both runs (half the window:
    # late_frac 0.5 here); only when its own compute gap is the long one is it a straggler
    p = LocalizeParams(late_min_ns=60_000_000, late_frac=0.5)
    evs, ms = _ring_late(victim=False)
    assert ("compute-slow", "node", ("node-02",)) in culprits(localize(ms, evs, p))
    evs, ms = _ring_late(victim=True)
    assert not any(k == "compute-slow" for k, _l, _n in culprits(localize(ms, evs, p)))
    # the veto off: the same victim is blamed (what the lab's ring showed before)
    off = LocalizeParams(late_min_ns=60_000_000, late_frac=0.5, late_gap_frac=0.0)
    assert ("compute-slow", "node", ("node-02",)) in culprits(localize(ms, evs, off))


def test_late_issue_after_the_ring_predecessors_late_end_is_not_a_compute_straggler():
    # the lab's CPU quota: node-02's own sends end on time, but it waits for the last chunk
    # from node-01, whose sends end late; both then issue late after normal gaps
    p = LocalizeParams(late_min_ns=60_000_000, late_frac=0.5)
    evs, ms = _ring_late(victim="pred")
    assert not any(k == "compute-slow" for k, _l, _n in culprits(localize(ms, evs, p)))
    off = LocalizeParams(late_min_ns=60_000_000, late_frac=0.5, late_gap_frac=0.0)
    assert ("compute-slow", "node", ("node-02",)) in culprits(localize(ms, evs, off))


def _stall_behind_late_peer(peer_delay: int):
    """Every rank issues operator 39 together except node-03, ``peer_delay`` later; node-02
    (sending into node-03) stalls after a few kB, long before node-03 arrives; the rest
    complete once node-03 is there."""
    def f_(comm, seq, r, f):
        if seq == 39 and comm == "dp0":
            if r == 3:
                f["t_host_ns"] += peer_delay
                f["start_ns"] += peer_delay
            elif r == 2:
                f["complete"] = False
                f["volume_bytes"] = 4096
                f["duration_ns"] = 100_000
            else:
                f["duration_ns"] += peer_delay
        return f
    return f_


def test_a_stall_that_began_before_a_peer_issued_is_waiting_not_network_stop():
    late = _stall_behind_late_peer(1_900_000_000)
    assert not any(v.kind == "network-stop" for v in anomalies(run(late, n=4, rails=1)))
    off = LocalizeParams(late_overrides_act=False)
    assert ("network-stop", "node", ("node-02",)) in culprits(run(late, n=4, rails=1, params=off))
    # every rank there on time (within the override): the same stall is the network
    on_time = _stall_behind_late_peer(20_000_000)
    assert ("network-stop", "node", ("node-02",)) in culprits(run(on_time, n=4, rails=1))


def _pairs_late():
    """Data parallelism of two: node-02 pairs with node-03 in two communicators (one per
    GPU); from operator 10 on node-02 issues 30 ms after its partner (its compute is slow),
    and both end together."""
    evs, ms = [], []
    for g in range(2):
        comm = f"dp{g}"
        evs += synth.comm_events(comm, [2, 3], [f"mlx5_{g}"] * 2, 400 + 2 * g)
        for seq in range(40):
            base = seq * 100_000_000 + g * 1_000_000
            issue = {0: base + (30_000_000 if seq >= 10 else 0), 1: base}
            end = max(issue.values()) + 5_000_000
            for rank, nd in enumerate((2, 3)):
                start = max(issue.values()) + 100_000
                ms.append(synth.record(comm, seq, rank, nd, kind="AllReduce", nranks=2, start=start, end=end,
                                       t_host=issue[rank], nic=f"mlx5_{g}", act=2_000_000, nbytes=4 << 20))
    return evs, ms


def test_a_straggler_is_found_in_two_rank_collectives():
    # the rank that arrives later has the shorter issue-to-end span; over both of its
    # communicators that singles out node-02 (with three ranks required, nothing is judged)
    evs, ms = _pairs_late()
    assert culprits(localize(ms, evs, LocalizeParams())) == {("compute-slow", "node", ("node-02",))}
    assert not culprits(localize(ms, evs, LocalizeParams(late_min_ranks=3)))


def test_new_parameters_reject_bad_values():
    import pytest

    from pulse.errors import ConfigError

    for bad in ({"hypotheses_every_ns": -1}, {"clock_skew_ns": -5}, {"rail_alive_min": 0},
                {"late_min_ranks": 0}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            LocalizeParams(**bad)


# -- stops at a pipeline partner: a hung GPU vs a dead NIC ------------------------------------

STOP_SEQ = 30


def _pipeline_stop(*, recv_posted: bool, third_party_after: bool, cascade_absence: bool = False):
    """node-02 sends to node-03 over a point-to-point communicator ``pp0`` (mlx5_0), next
    to the 4-node ring ``dp0``; operator STOP_SEQ of ``pp0`` stalls at zero bytes and the
    job stops. ``recv_posted``: node-03 issued the matching receive (its NIC died) or not
    (its GPU hung and it issues nothing more). ``third_party_after``: node-02's mlx5_0 goes
    on moving bytes with node-01 (``pb0``) after the stall. ``cascade_absence``: 5 ms after
    the stall node-00 misses a ring operator (it waits behind the stop)."""
    from pulse.events import OpEvent
    period = synth.PERIOD
    t_stop = STOP_SEQ * period + 1_000_000

    def ring(comm, seq, r, f):
        if seq < STOP_SEQ:
            return f
        if cascade_absence and seq == STOP_SEQ:
            if r == 0:
                return None
            f["start_ns"] = t_stop + 5_000_000
            sent = 0 if r == 3 else synth.BYTES // 4  # node-03's NIC is dead
            f["complete"], f["volume_bytes"], f["duration_ns"] = False, sent, 100_000
            return f
        return None

    ms = synth.metrics(4, 1, ops=STOP_SEQ + 1, tweak=ring)
    evs = synth.events(4, 1) + synth.comm_events("pp0", [2, 3], ["mlx5_0"] * 2, 500)
    evs += synth.comm_events("pb0", [2, 1], ["mlx5_0"] * 2, 600)
    for seq in range(STOP_SEQ + 1):
        t = seq * period + 1_000_000
        evs.append(OpEvent(job="job", node="node-02", comm_id="pp0", rank=0, seq=seq, kind="Send", count=1 << 20,
                           dtype="float32", bytes=4 << 20, peer=1, t_host_ns=t))
        if seq < STOP_SEQ or recv_posted:
            evs.append(OpEvent(job="job", node="node-03", comm_id="pp0", rank=1, seq=seq, kind="Recv",
                               count=1 << 20, dtype="float32", bytes=4 << 20, peer=0, t_host_ns=t))
        rec = synth.record("pp0", seq, 0, 2, kind="Send", nranks=2, start=t + 50_000, end=t + 450_000, t_host=t,
                           nic="mlx5_0", nbytes=4 << 20)
        if seq == STOP_SEQ:
            rec = rec.__class__.from_dict({**rec.to_dict(), "complete": False, "volume_bytes": 0,
                                           "end_ns": t + 50_000, "duration_ns": 0})
        ms.append(rec)
    for seq in range(STOP_SEQ + (4 if third_party_after else 0)):
        t = seq * period + 3_000_000  # 2 ms after the stall: before the cascade
        ms.append(synth.record("pb0", seq, 0, 2, kind="Send", nranks=2, start=t, end=t + 400_000, t_host=t - 50_000,
                               nic="mlx5_0", nbytes=4 << 20))
    data_end = {synth.node(i): t_stop + 3_000_000_000 for i in range(4)}
    return localize(ms, evs, LocalizeParams(), data_end=data_end)


def test_a_send_stalled_on_a_receiver_that_never_posted_is_its_compute_stop():
    assert culprits(_pipeline_stop(recv_posted=False, third_party_after=False)) == {
        ("compute-stop", "node", ("node-03",))}


def test_a_send_stalled_on_a_posted_receive_with_the_sender_alive_is_the_receivers_nic():
    vs = _pipeline_stop(recv_posted=True, third_party_after=True)
    assert culprits(vs) == {("network-stop", "node", ("node-03",))}
    assert anomalies(vs)[0].evidence.get("alive_after_stall")
    # without the third-party traffic the two ends look alike; the sender's empty send
    # decides, as before
    assert culprits(_pipeline_stop(recv_posted=True, third_party_after=False)) == {
        ("network-stop", "node", ("node-02",))}


def test_a_rank_missing_after_the_traffic_stopped_is_a_victim_not_a_compute_stop():
    vs = _pipeline_stop(recv_posted=True, third_party_after=True, cascade_absence=True)
    assert not any(v.kind == "compute-stop" for v in anomalies(vs))
    assert ("network-stop", "node", ("node-03",)) in culprits(vs)


def test_a_node_whose_records_come_back_is_judged_again():
    """Only node-02's records in the first operators (the others' captures started late:
    the lab's first run on a fresh machine, numba compiling); once their records arrive they
    must count again, or every link to them stays exempt and node-02's slow NIC is never
    named."""
    def late_start_then_slow(comm, seq, r, f):
        if r != 2 and seq < 5:
            return None
        return _nic_slow(comm, seq, r, f)
    vs = run(late_start_then_slow)
    assert {n for v in vs if v.status == "insufficient-data" for n in v.nodes} == {"node-00", "node-01", "node-03"}
    assert culprits(vs) == {("network-slow", "node", ("node-02",))}
