"""Stops (localization/rules/stops.py) on hand-built stalls, absences and receives."""

from __future__ import annotations

import dataclasses

from pulse.localization.finding import ABSENT, STALL
from pulse.localization.rules.stops import stop_hypotheses, unposted_receivers, waits_on_recv

from . import synth
from .findings import MS, ep, evidence, finding

A, B, C, D, E = (synth.node(i) for i in range(5))


def stall(node: str, to: str, *, sent: float = 0.0, end: int = 10 * MS):
    return finding(STALL, node, value=sent, metric="sent_fraction", start=end - MS, end=end,
                   to=(ep(to),))


def absent(node: str, start: int = 10 * MS, seq: int = 0):
    return finding(ABSENT, node, seq=seq, endpoint=node, value=0.0, metric="started", start=start, end=start)


def test_the_node_on_most_first_stalled_links_is_network_stop():
    ev, p = evidence()
    ev.stops.stalls += [stall(A, B), stall(C, A, sent=0.5)]
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (A,))]
    # victims stalling later (beyond stall_first_ns) do not move the blame
    ev.stops.stalls += [stall(D, x, end=500 * MS) for x in (B, C, E)] + [stall(E, D, end=500 * MS)]
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (A,))]


def test_stalls_that_sent_most_of_their_bytes_are_not_a_stop():
    ev, p = evidence()
    ev.stops.stalls += [stall(A, B, sent=0.9), stall(C, A, sent=0.8)]
    assert stop_hypotheses(ev, p) == {}


def test_two_stuck_ends_the_one_alive_with_a_third_party_is_up():
    def ev_with(alive_points: int):
        ev, p = evidence()
        ev.stops.stalls += [stall(A, B), stall(B, A)]
        for i in range(alive_points):  # A's NIC moves bytes in another communicator after the stall
            t = 20 * MS + i * MS
            ev.alive.note(synth.record("other", i, 0, 0, kind="AllReduce", nranks=2, start=t, end=t + 100,
                                       t_host=t, nic="mlx5_0"))
        return ev, p
    ev, p = ev_with(1)  # one record: its first and last epoch are two points (rail_alive_min)
    got = stop_hypotheses(ev, p)
    assert list(got) == [("network-stop", (B,))]
    assert got[("network-stop", (B,))].extra == {"alive_after_stall": {A: 2}}
    ev, p = ev_with(0)
    # nothing tells the two ends apart: neither is named (one of them is healthy)
    assert stop_hypotheses(ev, p) == {}


def test_the_member_absent_from_an_operator_its_peers_are_stuck_in_is_compute_stop():
    ev, p = evidence()
    ev.stops.stalls.append(stall(A, B, sent=0.9))
    ev.stops.absent.append(absent(D))
    assert list(stop_hypotheses(ev, p)) == [("compute-stop", (D,))]


def test_an_absent_node_that_is_itself_stuck_is_not_compute_stop():
    ev, p = evidence()
    ev.stops.stalls.append(stall(D, B, sent=0.9))
    ev.stops.absent.append(absent(D))
    assert stop_hypotheses(ev, p) == {}


def test_no_stop_is_named_while_a_nodes_incomplete_record_waits_for_its_operator():
    # sweep 307 #21, a GPU hung on node-00 under MoE: node-04, stuck in its stage's
    # all-to-all with node-00 (its record incomplete, the operator waiting for node-00's)
    # and so absent from its pipeline send, was named before that all-to-all was judged
    ev, p = evidence()
    ev.stops.stalls.append(stall(A, B, sent=0.9))
    ev.stops.absent.append(absent(D))
    stuck = dataclasses.replace(synth.record("a2a", 7, 1, 3, kind="GroupP2P", nranks=4, start=9 * MS, end=10 * MS,
                                             t_host=9 * MS, nic="mlx5_0"), complete=False)
    ev.stops.note_record(stuck)
    assert stuck.node == D and stop_hypotheses(ev, p) == {}
    ev.stops.note_judged("a2a", 7, [C, D])
    assert list(stop_hypotheses(ev, p)) == [("compute-stop", (D,))]


def test_a_rank_whose_all_to_all_sends_went_out_still_waits_for_a_stalled_peers_bytes():
    # sweep 113 #19: A's NIC died at the end of an all-to-all; D's own sends in it completed,
    # but D never got A's bytes, so D never started the next all-to-all its peers are
    # stuck in - waiting, not hung
    def grouped(node: str, complete: bool):
        r = synth.record("ep", 70, int(node[-2:]), int(node[-2:]), kind="GroupP2P", nranks=4, start=0, end=MS,
                         t_host=0, nic="mlx5_0")
        return r if complete else dataclasses.replace(r, complete=False)
    ev, p = evidence()
    ev.stops.stalls.append(stall(B, A, sent=0.84))
    ev.stops.absent.append(absent(D, seq=71))
    assert list(stop_hypotheses(ev, p)) == [("compute-stop", (D,))]
    ev.stops.note_grouped([grouped(A, False), grouped(C, True), grouped(D, True)], {A})
    assert ev.stops.awaiting == {C, D}
    assert ("compute-stop", (D,)) not in stop_hypotheses(ev, p)
    ev.stops.note_grouped([grouped(B, True)], set())  # nothing stalled: nobody waits
    assert ev.stops.awaiting == {C, D}


def test_a_node_still_issuing_after_its_peer_began_waiting_is_not_compute_stop():
    # sweep 111 #0: the next pipeline stage posted the receive of the step after early;
    # node D finished its own step (issued its buckets 18 ms later), then waited for the
    # stage before it, stopped by a dead NIC elsewhere
    ev, p = evidence(clock_skew_ns=10 * MS)
    ev.stops.stalls.append(stall(A, B, sent=0.9, end=30 * MS))
    ev.stops.absent.append(absent(D, start=10 * MS))
    ev.stops.note_issue(D, 19 * MS)  # within the skew bound of the wait: may have preceded it
    assert list(stop_hypotheses(ev, p)) == [("compute-stop", (D,))]
    ev.stops.note_issue(D, 21 * MS)  # surely after it
    assert stop_hypotheses(ev, p) == {}
    ev.stops.note_issue(D, None)  # an issue time unknown changes nothing
    assert stop_hypotheses(ev, p) == {}


def test_absences_after_the_traffic_stopped_are_victims():
    ev, p = evidence()
    ev.stops.stalls.append(stall(A, B, end=0))
    ev.stops.absent.append(absent(D, start=10 * MS))
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (A,))]


def test_absences_must_mostly_name_one_node():
    ev, p = evidence()
    ev.stops.stalls.append(stall(A, B, sent=0.9))
    ev.stops.absent += [absent(D, seq=0), absent(D, seq=1), absent(E, seq=2)]
    assert stop_hypotheses(ev, p) == {}  # 2 vs 1: not more than twice the others
    ev.stops.absent.append(absent(D, seq=3))
    assert list(stop_hypotheses(ev, p)) == [("compute-stop", (D,))]
    ev, p = evidence(stop_absent_majority=1)
    ev.stops.stalls.append(stall(A, B, sent=0.9))
    ev.stops.absent += [absent(D, seq=0), absent(D, seq=1), absent(E, seq=2)]
    assert list(stop_hypotheses(ev, p)) == [("compute-stop", (D,))]


def _p2p(ev):
    ev.topo.add(synth.comm_events("p", [0, 1], ["mlx5_0", "mlx5_0"], 1))


def test_a_receiver_waiting_past_a_stall_and_the_sender_that_never_sent():
    ev, p = evidence()
    _p2p(ev)
    ev.stops.last_recv[("p", B)] = (5, 1, 0)
    ev.data_end[B] = p.stall_ns
    waiting, missing = waits_on_recv(ev, p)
    assert waiting == {B}
    assert [(f.kind, f.node, f.seq) for f in missing] == [(ABSENT, A, 5)]
    ev.stops.p2p_seen["p"] = 5  # the sender has a record of that send: not absent
    assert waits_on_recv(ev, p) == ({B}, [])
    ev.stops.p2p_done["p"] = 5  # and it completed: nobody waits
    assert waits_on_recv(ev, p) == (set(), [])


def test_a_receive_waiting_less_than_a_stall_is_not_waiting():
    ev, p = evidence()
    _p2p(ev)
    ev.stops.last_recv[("p", B)] = (5, 1, 0)
    ev.data_end[B] = p.stall_ns - 1
    assert waits_on_recv(ev, p) == (set(), [])


def test_a_send_stalled_on_a_receive_never_posted_blames_the_receiver():
    ev, p = evidence()
    _p2p(ev)
    ev.stops.p2p_seen["p"] = 5
    ev.stops.stalls.append(finding(STALL, A, comm="p", seq=5, rank=0, value=0.0, metric="sent_fraction",
                                   start=MS, end=2 * MS, to=(ep(B),)))
    ev.stops.p2p_issued[("p", B)] = 4
    assert [(f.kind, f.node) for f in unposted_receivers(ev, p)] == [(ABSENT, B)]
    assert list(stop_hypotheses(ev, p)) == [("compute-stop", (B,))]
    ev.stops.p2p_issued[("p", B)] = 5  # it did post it: the sender is stuck on its network
    assert unposted_receivers(ev, p) == []
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (A,))]


# -- the clock-skew bound (LocalizeParams.clock_skew_ns) ------------------------------------

def test_first_stalls_span_the_clock_skew_bound():
    # A's NIC dies: its stall and a victim stall 3 ms later on D's clock (D -> B, C, E).
    # With clocks 1 ms apart at most, the victim is later: A. With clocks possibly 5 ms
    # apart it may have been first: no single node stands out (the victim's three links).
    def stops(skew_ms: int):
        ev, p = evidence(clock_skew_ns=skew_ms * MS)
        ev.stops.stalls += [stall(A, B), stall(C, A, sent=0.5)]
        ev.stops.stalls += [stall(D, x, end=13 * MS) for x in (B, C, E)]
        return list(stop_hypotheses(ev, p))
    assert stops(1) == [("network-stop", (A,))]
    assert stops(5) != [("network-stop", (A,))]


def _alive_at(ev, t: int) -> None:
    """A's NIC moves bytes with a third party at ``t`` (A's clock)."""
    ev.alive.note(synth.record("other", 0, 0, 0, kind="AllReduce", nranks=2, start=t, end=t + 100,
                               t_host=t, nic="mlx5_0"))


def test_alive_after_another_nodes_stall_must_be_the_skew_bound_past_it():
    # only B's send into A stalled (10 ms, B's clock); A's NIC moved bytes at 12 ms on A's
    def got(skew_ms: int):
        ev, p = evidence(clock_skew_ns=skew_ms * MS)
        ev.stops.stalls += [stall(B, A)]
        _alive_at(ev, 12 * MS)
        return stop_hypotheses(ev, p)[("network-stop", (B,))].extra
    assert got(1) == {"alive_after_stall": {A: 2}}
    assert got(3) == {}  # 2 ms may be the clocks: not seen alive (B by "sent the least")


def test_stalls_waiting_for_an_absent_member_give_way_to_the_stalls_of_started_operators():
    # B's dead NIC: A's pipeline send into B stalled at zero (c0#0, A's NIC busy afterwards),
    # then B, waiting in that receive, never started its stage's collective (c1#5), whose
    # ranks C, D, E stalled sending to each other: their links say nothing of the network
    ev, p = evidence()
    ev.stops.stalls.append(stall(A, B))
    _alive_at(ev, 12 * MS)  # the skew bound (1 ms) past the stall's last byte
    for x, to in ((C, D), (D, E), (E, C), (C, E)):
        ev.stops.stalls.append(finding(STALL, x, comm="c1", seq=5, value=0.03, metric="sent_fraction",
                                       start=11 * MS, end=12 * MS, to=(ep(to),)))
    ev.stops.absent.append(finding(ABSENT, B, comm="c1", seq=5, endpoint=B, metric="started",
                                   start=11 * MS, end=11 * MS))
    ev.data_end[B] = 10 * MS + p.stall_ns
    ev.stops.last_recv[("c0", B)] = (0, 1, 9 * MS)  # B waits in its receive: not compute-stop
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (B,))]


def test_an_unposted_receive_needs_the_receivers_data_a_stall_plus_the_skew_past_the_send():
    ev, p = evidence(clock_skew_ns=5 * MS)
    _p2p(ev)
    ev.stops.p2p_seen["p"] = 5
    ev.stops.stalls.append(finding(STALL, A, comm="p", seq=5, rank=0, value=0.0, metric="sent_fraction",
                                   start=MS, end=2 * MS, to=(ep(B),)))
    ev.stops.p2p_issued[("p", B)] = 4
    ev.data_end[B] = MS + p.stall_ns + 4 * MS  # B's clock may be 5 ms ahead of A's
    assert unposted_receivers(ev, p) == []
    ev.data_end[B] = MS + p.stall_ns + 5 * MS
    assert [(f.kind, f.node) for f in unposted_receivers(ev, p)] == [(ABSENT, B)]


def test_a_stall_before_a_late_peer_issued_allows_for_the_clock_skew_bound():
    from pulse.localization.observations import OpView, _stalled_on_late_peer

    # rank 0 issued at 0 and stalled (last byte at 60 ms, its clock); rank 1 issued 58 ms
    # on its own clock: perhaps after the stall, if the clocks are 2 ms apart or more
    recs = [synth.record("c", 0, 0, 0, kind="AllReduce", nranks=2, start=MS, end=60 * MS, t_host=0,
                         nic="mlx5_0"),
            synth.record("c", 0, 1, 1, kind="AllReduce", nranks=2, start=59 * MS, end=60 * MS, t_host=58 * MS,
                         nic="mlx5_0")]
    view = OpView("c", 0, "AllReduce", {0: A, 1: B}, recs, [ep(A), ep(B)], [(ep(B),), (ep(A),)], [True, True])
    assert not _stalled_on_late_peer(view, 0, evidence(clock_skew_ns=MS)[1])
    assert _stalled_on_late_peer(view, 0, evidence(clock_skew_ns=2 * MS)[1])


def test_a_send_stalled_at_zero_into_a_member_absent_from_the_operator_blames_the_absent_end():
    # B's dead NIC: B finished its last operators before the fault, then waits in a receive
    # that never arrives, so it never starts the all-to-all A is stuck in; A's sends into
    # it stall at zero bytes. Both ends sent nothing of their own, and A only has a stalled
    # record because B never showed up: B is where the traffic stopped.
    ev, p = evidence()
    ev.stops.stalls.append(stall(A, B))
    ev.stops.absent.append(absent(B))
    ev.data_end[B] = 10 * MS + p.stall_ns  # B's last receive: posted, waiting past a stall
    ev.stops.last_recv[("pp", B)] = (3, 1, 9 * MS)
    got = stop_hypotheses(ev, p)
    assert list(got) == [("network-stop", (B,))]
    assert got[("network-stop", (B,))].extra["absent_from_stalled"] == ["c0#0"]
    # without the absence, A's nearly empty stalled record makes A the stopped end
    ev.stops.absent.clear()
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (A,))]


# -- a point-to-point send that never got its receiver's grant ------------------------------
def _ungranted(ev, p, t_post: int):
    """A -> B (communicator p, seq 5) stalled at zero bytes without B's grant; B posted the
    receive at ``t_post`` (its clock)."""
    _p2p(ev)
    ev.stops.p2p_seen["p"] = 5
    ev.stops.p2p_issued[("p", B)] = 5
    ev.stops.last_recv[("p", B)] = (5, 1, t_post)
    ev.stops.ungranted.add(("p", 5, 0))
    ev.stops.stalls.append(finding(STALL, A, comm="p", seq=5, rank=0, value=0.0, metric="sent_fraction",
                                   start=MS, end=MS, to=(ep(B),)))


def test_a_send_without_its_grant_names_the_end_whose_nic_was_silent_when_it_was_due():
    # the grant crosses the link from the receiver, the data from the sender: a dead NIC at
    # either end leaves the send at zero without a grant, so that alone names nobody (it
    # named the sender: sweep 23 #2, a pipeline send into a dead NIC)
    ev, p = evidence()
    _ungranted(ev, p, 2 * MS)
    assert stop_hypotheses(ev, p) == {}
    # the receiver's NIC transmitted after it posted the receive (its clear-to-send went out):
    # the sender's end never heard it
    ev.nic_tx[ep(B)] = 2 * MS + 1
    got = stop_hypotheses(ev, p)
    assert list(got) == [("network-stop", (A,))]
    assert got[("network-stop", (A,))].extra == {"alive_after_stall": {B: p.rail_alive_min}}
    # both ends transmitting after the grant was due: nothing tells them apart
    ev.nic_tx[ep(A)] = 2 * MS + p.clock_skew_ns + 1
    assert stop_hypotheses(ev, p) == {}


def test_a_sender_whose_nic_went_on_after_the_grant_was_due_was_up():
    ev, p = evidence()
    _ungranted(ev, p, 2 * MS)
    ev.nic_tx[ep(A)] = 2 * MS + p.clock_skew_ns // 2  # within the skew bound of the post: no proof
    assert stop_hypotheses(ev, p) == {}
    ev.nic_tx[ep(A)] = 2 * MS + p.clock_skew_ns + 1
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (B,))]


def test_a_grant_is_due_only_once_the_receivers_previous_operator_ended():
    """Sweep 239 #6: B posted the receive, then its NIC moved the communicator's previous
    operator until it died; those last bytes came after the post but before the receive
    could run (stream order), so they are no grant."""
    ev, p = evidence()
    _ungranted(ev, p, 2 * MS)
    ev.rail.ends[("p", 1)] = {4: 3 * MS}  # B's previous operator on p ended at 3 ms
    ev.nic_tx[ep(B)] = 3 * MS  # its last bytes: that operator's
    ev.nic_tx[ep(A)] = 3 * MS + p.clock_skew_ns + 1
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (B,))]
    ev.nic_tx[ep(B)] = 3 * MS + 1  # after it: the grant went out, A never heard it
    ev.nic_tx[ep(A)] = 0
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (A,))]


def test_a_send_without_a_grant_gives_way_to_collective_stalls():
    # a dead NIC's own collective send stalls at zero beside its peers' partial ones: those
    # say where, the grant-less pipeline send only that the link broke
    ev, p = evidence()
    _ungranted(ev, p, 2 * MS)
    ev.stops.stalls += [stall(C, D, end=MS), stall(D, C, sent=0.4, end=MS), stall(E, C, sent=0.4, end=MS)]
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (C,))]


# -- a NIC silent since before its own stalled operator began ------------------------------
def _tree(ev):
    """A 5-node tree operator stalled everywhere within a millisecond: relay C (4 links)
    sent a little, leaf A and root E nothing."""
    ev.stops.stalls += [
        finding(STALL, A, seq=3, value=0.0, metric="sent_fraction", start=2 * MS, end=2 * MS, to=(ep(C),)),
        finding(STALL, E, seq=3, rank=4, value=0.0, metric="sent_fraction", start=2 * MS, end=2 * MS,
                to=(ep(C), ep(D))),
        finding(STALL, C, seq=3, rank=2, value=0.1, metric="sent_fraction", start=MS, end=3 * MS,
                to=(ep(A), ep(B), ep(D), ep(E))),
        finding(STALL, B, seq=3, rank=1, value=0.1, metric="sent_fraction", start=MS, end=3 * MS, to=(ep(C),)),
        finding(STALL, D, seq=3, rank=3, value=0.1, metric="sent_fraction", start=MS, end=3 * MS,
                to=(ep(C), ep(E)))]


def test_the_node_whose_nic_went_silent_before_its_operator_began_is_the_stop():
    ev, p = evidence()
    _tree(ev)
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (C,))]  # the relay: most stalled links
    # every NIC told what it last transmitted: A's before it issued the operator (dead),
    # the root's after (it had nothing to send yet, but was up)
    ev.nic_tx.update({ep(A): MS, ep(E): 5 * MS, ep(B): 4 * MS, ep(C): 4 * MS, ep(D): 4 * MS})
    got = stop_hypotheses(ev, p)
    assert list(got) == [("network-stop", (A,))]
    assert got[("network-stop", (A,))].extra == {"silent_since_issue": ["c0#3"]}


def test_silence_is_only_read_where_it_says_something():
    ev, p = evidence()
    _tree(ev)
    ev.nic_tx.update({ep(B): 4 * MS, ep(C): 4 * MS, ep(D): 4 * MS})
    # A and E never told what they transmitted (no data end with nic_tx): nothing read
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (C,))]
    # both zero senders silent: nothing tells which one is dead
    ev.nic_tx.update({ep(A): MS, ep(E): MS})
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (C,))]
    # a later operator of the communicator queues behind the stalled one: its silence is not read
    ev.nic_tx[ep(E)] = 5 * MS
    ev.stops.stalls.append(finding(STALL, B, seq=4, rank=1, value=0.0, metric="sent_fraction",
                                   start=6 * MS, end=6 * MS, to=(ep(C),)))
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (A,))]


def test_sends_into_a_receiver_that_posted_nothing_give_way_to_the_stalls_of_posted_ones():
    # B's NIC dies while A sends into it (B posted that receive: the grant could not leave).
    # B's stage-mate C, stuck in an exchange with B, posts no receive for D's next pipeline
    # sends, which stall at zero too, on two rails, within the skew bound of A's stall: they
    # outnumber it, but nothing was asked of their links (sweep 103 #19, named C).
    ev, p = evidence(clock_skew_ns=10 * MS)
    ev.topo.add(synth.comm_events("p0", [0, 1], ["mlx5_0", "mlx5_0"], 1))
    for k in (0, 1):
        ev.topo.add(synth.comm_events(f"q{k}", [3, 2], [f"mlx5_{k}"] * 2, 10 + 2 * k))
    ev.stops.stalls.append(finding(STALL, A, comm="p0", seq=5, rank=0, value=0.0, metric="sent_fraction",
                                   start=9 * MS, end=10 * MS, to=(ep(B),)))
    ev.stops.p2p_issued[("p0", B)] = 5
    _alive_at(ev, 30 * MS)  # A's NIC goes on with a third party: A was up
    for k in (0, 1):
        ev.stops.stalls.append(finding(STALL, D, comm=f"q{k}", seq=6, rank=0, value=0.0, metric="sent_fraction",
                                       start=14 * MS, end=15 * MS, to=(ep(C, k),)))
        ev.stops.p2p_issued[(f"q{k}", C)] = 5
        ev.stops.p2p_seen[f"q{k}"] = 6
    ev.data_end[C] = 15 * MS + p.stall_ns + p.clock_skew_ns
    # C's own exchange with B stalled part-way: C is stuck, not hung
    ev.stops.stalls.append(stall(C, B, sent=0.6, end=12 * MS))
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (B,))]


def _ring_stalls(sent: dict[str, float]) -> list:
    """One ring operator stalled at every rank (each sending to the next node in ``sent``'s
    order) with the given sent fractions, and the next operator queued behind it, empty."""
    nodes = list(sent)
    out = []
    for seq, frac in ((4, sent), (5, dict.fromkeys(nodes, 0.0))):
        for i, n in enumerate(nodes):
            out.append(finding(STALL, n, seq=seq, rank=i, value=frac[n], metric="sent_fraction",
                               start=9 * MS, end=10 * MS + i * 1000, to=(ep(nodes[(i + 1) % len(nodes)]),)))
    return out


def test_a_ring_stalled_all_round_names_the_receiver_of_the_rank_its_bytes_piled_up_at():
    # sweep 181 #0: every node on as many stalled links as the next, all within the skew
    # bound; E got 0.58 from D and passed on only 0.50: its receiver A stopped taking bytes
    # (A itself stopped with what it had been given, B to D forward a step more each)
    ev, p = evidence()
    ev.stops.stalls += _ring_stalls({A: 0.50, B: 0.52, C: 0.54, D: 0.58, E: 0.50})
    got = stop_hypotheses(ev, p)
    assert list(got) == [("network-stop", (A,))]
    assert got[("network-stop", (A,))].extra == {"ring_blocked_sender": E}


def test_a_ring_that_piled_nothing_up_names_no_one():
    # broken before any bytes moved, or shortfalls no larger than the ring's own hop steps
    for sent in ({A: 0.0, B: 0.0, C: 0.0, D: 0.0, E: 0.0}, {A: 0.50, B: 0.52, C: 0.54, D: 0.52, E: 0.50}):
        ev, p = evidence()
        ev.stops.stalls += _ring_stalls(sent)
        assert stop_hypotheses(ev, p) == {}


def test_the_one_member_stalled_in_an_all_to_all_its_peers_completed_is_the_stop():
    # sweep 271 #22: A's NIC died with 92 % of its all-to-all sent, every peer's record of it
    # complete; its peers then stalled 3.5 ms later in the next all-to-all A never started,
    # each on a link to every other member: the node count ties
    def grouped(node: str, complete: bool, seq: int = 184):
        r = synth.record("ep", seq, int(node[-2:]), int(node[-2:]), kind="GroupP2P", nranks=4, start=0, end=MS,
                         t_host=0, nic="mlx5_0")
        return r if complete else dataclasses.replace(r, complete=False)
    ev, p = evidence()
    ev.stops.stalls.append(finding(STALL, A, comm="ep", seq=184, value=0.92, metric="sent_fraction",
                                   start=9 * MS, end=10 * MS, to=(ep(B), ep(C), ep(D))))
    assert stop_hypotheses(ev, p) == {}  # most of its bytes sent, and nothing else stalled
    # the next stage's pipeline sends stalled later at zero, their receivers stuck (victims)
    ev.stops.stalls.append(stall(E, B, end=500 * MS))
    assert stop_hypotheses(ev, p) == {}  # A's links name all four alike
    ev.stops.note_grouped([grouped(A, False), grouped(B, True), grouped(C, True), grouped(D, True)], {A})
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (A,))]
    # two members stalled in it: nothing singles one out this way
    ev, p = evidence()
    ev.stops.stalls += [finding(STALL, x, comm="ep", seq=184, value=0.9, metric="sent_fraction",
                                start=9 * MS, end=10 * MS, to=(ep(B), ep(C), ep(D))) for x in (A, B)]
    ev.stops.stalls.append(stall(E, B, end=500 * MS))
    ev.stops.note_grouped([grouped(A, False), grouped(B, False), grouped(C, True), grouped(D, True)], {A, B})
    assert stop_hypotheses(ev, p) == {}


def test_the_member_every_other_stalled_record_waits_for_alone_is_the_stop():
    # sweep 271 #1, a NIC dead mid all-to-all under MoE (5 nodes): D's record stalled at
    # 73 % sent, B's at 99 %, short only of its bytes for D - B's NIC finished with every
    # other peer in this very operator. Each stalled record is on a link to every member:
    # the node count ties five ways, and the hung job got no verdict.
    M = 1 << 20

    def grouped(rank: int, short: tuple[int, ...] = (), complete: bool = True):
        peers = [x for x in range(5) if x != rank]
        got = [M // 2 if x in short else M for x in peers]
        r = synth.record("ep", 254, rank, rank, kind="GroupP2P", nranks=5, start=0, end=MS, t_host=0,
                         nic="mlx5_2", peer_ranks=peers, peer_done_ns=[MS] * 4, peer_bytes=got,
                         peer_expected_bytes=[M] * 4, peer_start_ns=[0] * 4)
        return r if complete else dataclasses.replace(r, complete=False, volume_bytes=sum(got))

    def stalls(*nodes: str) -> list:
        return [finding(STALL, x, comm="ep", seq=254, value=0.9, metric="sent_fraction", start=9 * MS,
                        end=10 * MS, to=tuple(ep(y) for y in (A, B, C, D, E) if y != x)) for x in nodes]

    ev, p = evidence()
    ev.stops.stalls += stalls(D, B)
    assert stop_hypotheses(ev, p) == {}
    recs = [grouped(0), grouped(1, short=(3,), complete=False), grouped(2), grouped(3, short=(0, 1, 2, 4),
                                                                                   complete=False), grouped(4)]
    assert [r.node for r in recs] == [A, B, C, D, E]
    ev.stops.note_grouped(recs, {B, D})
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (D,))]
    # B also short of C's bytes: its NIC is not shown up
    ev, p = evidence()
    ev.stops.stalls += stalls(D, B)
    recs[1] = grouped(1, short=(2, 3), complete=False)
    ev.stops.note_grouped(recs, {B, D})
    assert stop_hypotheses(ev, p) == {}
    # B and D each short only of the other's bytes: the link between them broke, at either end
    ev, p = evidence()
    ev.stops.stalls += stalls(D, B)
    recs[1], recs[3] = grouped(1, short=(3,), complete=False), grouped(3, short=(1,), complete=False)
    ev.stops.note_grouped(recs, {B, D})
    assert stop_hypotheses(ev, p) == {}


def test_a_lone_stall_in_an_all_to_all_names_its_member_however_much_it_had_sent():
    # sweep 311 #2, a NIC dead under MoE in a 16-node tree: node-14's all-to-all records
    # stalled at 95 % while every peer's completed, the peers' next all-to-all stalled at
    # 75-78 % (absent node-14); no record at or below stop_frac, and the hung job got no verdict
    ev, p = evidence()
    recs = [dataclasses.replace(synth.record("a2a", 5, r, r, kind="GroupP2P", nranks=4, start=0, end=MS, t_host=0,
                                             nic="mlx5_0"), complete=r != 3) for r in range(4)]
    ev.stops.note_grouped(recs, {D})
    own = dataclasses.replace(stall(D, A, sent=0.95, end=MS), comm_id="a2a", seq=5)
    victims = [dataclasses.replace(stall(x, B, sent=0.77, end=2 * MS), comm_id="a2a", seq=6) for x in (A, B, C)]
    ev.stops.stalls += [own, *victims]
    ev.stops.absent.append(dataclasses.replace(absent(D, start=2 * MS, seq=6), comm_id="a2a"))
    assert recs[3].node == D
    assert list(stop_hypotheses(ev, p)) == [("network-stop", (D,))]
    # the same stalls without the lone one: victims above stop_frac name nobody
    ev2, p2 = evidence()
    ev2.stops.stalls += victims
    assert stop_hypotheses(ev2, p2) == {}
