"""Stops: network-stop and compute-stop.

Physical facts relied on:

* A collective cannot complete without every rank, and a point-to-point send cannot
  complete without its receive posted: when one node stops, every operator involving it
  stalls, then (milliseconds later) the operators of ranks waiting on those. Only the
  *first* stalls / absences - those within ``stall_first_ns`` of the earliest, well above
  the clock offset - say where the traffic stopped; the later ones are victims.
* A member that never started an operator its peers are stuck in (and is not itself
  stuck in an incomplete operator or a receive) stopped computing: compute-stop. A hung
  GPU also posts no receives, so a send stalled on a receive that was never posted is
  its victim, not its network.
* Otherwise the node on the most first-stalled links is where the network stopped
  (network-stop). Between the two ends of the stalled link(s), the one that sent the
  least is the stopped one; when both sent nothing (a receiver's dead NIC stalls its
  sender at zero bytes), the end whose NIC went on moving bytes with a third party after
  the stall was up.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

from ..decisions import Hypothesis, Key, make_hypothesis
from ..evidence import Evidence, node_of
from ..finding import ABSENT, STALL, Finding
from ..params import LocalizeParams
from ..robust import median


def waits_on_recv(ev: Evidence, p: LocalizeParams) -> tuple[set[str], list[Finding]]:
    """Nodes stuck in a point-to-point receive (for longer than a stall), and findings
    for senders that never even issued the send those receivers wait for."""
    st = ev.stops
    waiting: set[str] = set()
    absent: list[Finding] = []
    for (comm, node), (seq, rank, t_host) in st.last_recv.items():
        end = ev.data_end.get(node)
        if end is None or end - t_host < p.stall_ns or seq <= st.p2p_done.get(comm, -1):
            continue
        waiting.add(node)
        if seq > st.p2p_seen.get(comm, -1):
            for r, n in ev.topo.members(comm).items():
                if r != rank and n != node:
                    absent.append(Finding(ABSENT, comm, seq, r, n, n, 0.0, 1.0, "started", t_host, t_host))
    return waiting, absent


def unposted_receivers(ev: Evidence, p: LocalizeParams) -> list[Finding]:
    """Findings for receivers that never issued the receive a stalled point-to-point
    send waits for (a hung GPU posts nothing): the sender is not stuck on its network.
    Only once the receiver's own data (when known) goes on for a stall's length past
    the send."""
    return [absent for _send, absent in _unposted(ev, p)]


def _unposted(ev: Evidence, p: LocalizeParams) -> list[tuple[Finding, Finding]]:
    """(stalled send, absence of its receiver) for each send :func:`unposted_receivers` reads."""
    st = ev.stops
    out: list[tuple[Finding, Finding]] = []
    for f in st.stalls:
        if f.comm_id not in st.p2p_seen:
            continue
        members = ev.topo.members(f.comm_id)
        for rank in ev.topo.peers_of(f.comm_id, f.rank):
            peer = members.get(rank)
            last = st.p2p_issued.get((f.comm_id, peer or ""))
            end = ev.data_end.get(peer or "")
            # as in Evidence.stalled: without a known data end (streaming), the stall
            # itself was only reported after stall_ns of the sender's data. The receiver's
            # data end and the send's start are two nodes' clocks: the skew bound on top.
            if (peer is not None and last is not None and last < f.seq
                    and (end is None or end - f.start_ns >= p.stall_ns + p.clock_skew_ns)):
                out.append((f, Finding(ABSENT, f.comm_id, f.seq, rank, peer, peer, 0.0, 1.0, "started",
                                       f.start_ns, f.start_ns)))
    return out


def grant_due(ev: Evidence, p: LocalizeParams, f: Finding, node: str) -> int | None:
    """For a point-to-point send stalled without its receiver's grant, the moment by which
    the grant was due at ``node``'s NIC, on its clock: at the receiver, its posted receive
    (the clear-to-send leaves its NIC then); at the sender, that moment one skew bound
    later (another node's clock). None when the receive was not posted (nothing was due)
    or ``node`` is neither end."""
    if (f.comm_id, f.seq, f.rank) not in ev.stops.ungranted:
        return None
    peers = {node_of(e) for e in f.peer_eps}
    if len(peers) != 1:
        return None
    peer = next(iter(peers))
    recv = ev.stops.last_recv.get((f.comm_id, peer))
    if recv is None or recv[0] != f.seq:
        return None
    # the receive runs in stream order: its grant leaves only once the communicator's
    # previous operator at the receiver ended (sweep 239 #6: a receive posted 24 ms before
    # the receiver's NIC died behind a send that ended as it died; its NIC's last bytes,
    # that send's, came after the post and passed for the grant, and nobody was named)
    due = max(recv[2], ev.rail.end_of(f.comm_id, recv[1], f.seq - 1) or recv[2])
    if node == peer:
        return due
    if node == f.node:
        return due + p.clock_skew_ns
    return None


def alive_after(ev: Evidence, p: LocalizeParams, node: str, first: list[Finding]) -> int:
    """Points at which ``node``'s NICs on the stalled links moved bytes in another
    communicator after the first stall's last progress (plus the clock-offset margin). The
    margin also covers a record of the end's own, on its own clock: a stalled record's last
    byte may precede its NIC's death by however long it waited for its peer (tried without
    it: sharded nic-down, ``tests/engine/test_shards.py``, named a healthy node).

    Stalls that are all sends waiting for a posted receive's grant are read from the moment
    the grant was due at ``node`` (:func:`grant_due`), and a NIC that transmitted anything
    after it (its data end's ``nic_tx``: the receiver's own clear-to-send counts) was up
    then: its end of the link did its part (the battery's nic-down: the receiver's NIC sent
    its grant, the sender's dead NIC never heard it; sweep 23 #2 the other way round)."""
    eps = {f.endpoint for f in first if f.node == node}
    eps |= {e for f in first for e in f.peer_eps if node_of(e) == node}
    comms = {f.comm_id for f in first}
    due = [grant_due(ev, p, f, node) for f in first]
    granted_path = bool(due) and all(d is not None for d in due)
    if granted_path:
        lo = min(d for d in due if d is not None)
        if any(ev.nic_tx.get(ep, -(1 << 62)) > lo for ep in eps):
            return p.rail_alive_min
    else:
        lo = min(f.end_ns for f in first) + p.rail_alive_margin_ns
    n = 0
    for ep in eps:
        ts, cs = ev.alive.points(ep)
        for i in range(bisect.bisect_right(ts, lo), len(ts)):
            n += cs[i] not in comms
    return n


def silent_since_issue(ev: Evidence, stalls: list[Finding]) -> tuple[str, list[Finding]] | None:
    """The one node whose stalled record sent nothing and whose NIC transmitted nothing from
    before that operator's issue on (its data ends' ``nic_tx``, its own clock: no skew): its
    NIC was dead when the operator began. Only each communicator's first stalled operator
    counts (later ones queue behind it and send nothing either), and not a send that never
    got its grant (it was not allowed to send). Any number of peers, trees included: a
    13-rank tree AllReduce around a dead leaf stalls every rank within a millisecond, and
    the node on the most stalled links was a relay (the dead NIC last transmitted 10 ms
    before the onset, every other one until 14 ms after it). None when no node, or more
    than one, is silent so."""
    first_seq: dict[str, int] = {}
    for f in stalls:
        first_seq[f.comm_id] = min(first_seq.get(f.comm_id, f.seq), f.seq)
    told = {ep.split("/", 1)[0] for ep in ev.nic_tx}
    silent: dict[str, list[Finding]] = {}
    for f in stalls:
        if (f.seq != first_seq[f.comm_id] or f.value > 0.0 or f.node not in told
                or (f.comm_id, f.seq, f.rank) in ev.stops.ungranted):
            continue
        if ev.nic_tx.get(f.endpoint, -(1 << 62)) < f.start_ns:
            silent.setdefault(f.node, []).append(f)
    if len(silent) != 1:
        return None
    return next(iter(silent.items()))


def compute_stop(ev: Evidence, p: LocalizeParams) -> dict[Key, Hypothesis]:
    """The node that stopped issuing operators, if the first absences name one."""
    st = ev.stops
    # a rank whose own all-to-all sends went out still waits in it for a stalled peer's
    # bytes (sweep 113 #19: a dead NIC's all-to-all peers, absent from the next one, were
    # named compute-stop)
    stuck_nodes = {f.node for f in st.stalls} | st.awaiting
    waiting, p2p_absent = waits_on_recv(ev, p)
    # A node missing from an operator is the stopped one only if it is not itself
    # stuck in communication (an incomplete send, a receive that never arrives).
    # ... nor one that went on issuing operators after its peers began waiting for it (the
    # skew bound past their clock): a hung GPU issues nothing from its hang on, while a
    # pipeline stage finishing its step still does when the next stage has already posted
    # the receive of the step after (sweep 111 #0: node-14 issued its data-parallel
    # buckets 18 ms after its successor's early receive, then waited for its own stage
    # before it, stopped by a dead NIC; it was named compute-stop)
    absent = [f for f in st.absent + p2p_absent + unposted_receivers(ev, p)
              if f.node not in stuck_nodes | waiting and f.node not in ev.insufficient
              and st.last_issue.get(f.node, -(1 << 62)) <= f.start_ns + p.clock_skew_ns]
    if absent:
        # As with stalls, only the first absences say who stopped: the others are
        # ranks that stopped issuing because they wait for it (a pipeline partner
        # stuck in an AllReduce with the hung rank's node is absent from its sends).
        t0 = min(f.start_ns for f in absent)
        absent = [f for f in absent if f.start_ns <= t0 + p.stall_first_ns]
        if st.stalls and min(f.end_ns for f in st.stalls) + p.stall_first_ns < t0:
            absent = []  # the traffic stopped before anyone went missing: a stop's victims
    if absent:
        nodes = Counter(f.node for f in absent)
        node, n = nodes.most_common(1)[0]
        if n == sum(nodes.values()) or n > p.stop_absent_majority * (sum(nodes.values()) - n):
            return {("compute-stop", (node,)): make_hypothesis(p, "compute-stop", "node", (node,),
                                                             [f for f in absent if f.node == node])}
    return {}


def network_stop(ev: Evidence, p: LocalizeParams) -> dict[Key, Hypothesis]:
    """The node (or the two ends) where the traffic stopped first."""
    stalls = ev.stops.stalls
    if not stalls:
        return {}
    # A stalled record that sent most of its bytes may be a victim waiting on a peer; only
    # one that stopped early, or a lone stall in an all-to-all (below), says a link died.
    stopped = any(f.value <= p.stop_frac for f in stalls)
    # Each stalled record implicates its node and the peers it could not finish
    # sending to; the node on the most stalled links is where the traffic stopped.
    # Only the first stalls say where the traffic stopped: a stop hangs the job, and
    # the operators that stall afterwards (peers no longer posting receives, whole
    # pipeline stages waiting) implicate the victims. "First" spans stall_first_ns,
    # well above the clock offset, so no decision hangs on sub-offset timing.
    # A collective stalled because a member never issued it (absent) waits for that member:
    # whatever keeps it away stopped it, not its own links (sweep 23 #2: a dead NIC's node
    # waiting in a pipeline receive, absent from its stage's tree AllReduce, whose 96
    # stalled records named a tree relay). When operators everyone started stalled too,
    # those say where the traffic stopped; otherwise the waiting ones are read (the tie
    # below then names the absent end).
    absent_ops = {(f.comm_id, f.seq) for f in ev.stops.absent}
    started = [f for f in stalls if (f.comm_id, f.seq) not in absent_ops]
    if started and len(started) < len(stalls):
        stalls = started
    # Likewise a point-to-point send whose receiver never posted the receive: the receiver's
    # host is held by something else (a stop elsewhere), and nothing crossed the link because
    # nothing was asked of it (sweep 103 #19: a dead NIC's stage-mate, stuck in an all-to-all
    # with it, posted no receive for its pipeline partner's next sends; with a 10 ms skew
    # bound those stalls counted among the first and named the stage-mate network-stop).
    unposted = {id(send) for send, _absent in _unposted(ev, p)}
    posted = [f for f in stalls if id(f) not in unposted]
    if posted and len(posted) < len(stalls):
        stalls = posted
    # A point-to-point send stalled at zero bytes without its receiver's grant says the
    # link between the two broke, not at which end (the grant crosses it from the receiver,
    # the data from the sender: a dead NIC at either end stops both). When other records
    # stalled too, those say where: a dead NIC's own collective sends stall at zero beside
    # its peers' partial ones.
    granted = [f for f in stalls if (f.comm_id, f.seq, f.rank) not in ev.stops.ungranted]
    if granted and len(granted) < len(stalls):
        stalls = granted
    t0 = min(f.end_ns for f in stalls)
    first = [f for f in stalls if f.end_ns <= t0 + p.stall_first_ns]
    dead = silent_since_issue(ev, stalls) if stopped else None
    if dead is not None:
        node, own = dead
        return {("network-stop", (node,)): make_hypothesis(
            p, "network-stop", "node", (node,), own,
            extra={"silent_since_issue": sorted({f"{f.comm_id}#{f.seq}" for f in own})[:8]})}
    lone = {ev.stops.lone.get((f.comm_id, f.seq), "") for f in first}
    if len(lone) == 1 and "" not in lone:
        # Every first stall is an all-to-all in which that one member's record stalled while
        # every other member's completed - their sends into it included: its own sends
        # stopped with its peers' going on, and the victims' stalls came after (sweep 271
        # #22: node-04's NIC dead mid all-to-all at 92 % sent, its 7 peers done; their next
        # all-to-all stalled 3.5 ms later, absent node-04, and every node tied on those
        # links: no verdict on a hung job). However much it had sent: a NIC that dies on
        # an all-to-all's last flows leaves every record above stop_frac, the lone one
        # included (sweep 311 #2, a dead NIC under MoE in a 16-node tree: node-14's records
        # at 95 %, its peers' next all-to-all at 75-78 %, and the hung job got no verdict).
        node = lone.pop()
        own = [f for f in first if f.node == node] or first
        return {("network-stop", (node,)): make_hypothesis(
            p, "network-stop", "node", (node,), own,
            extra={"alone_stalled_in": sorted({f"{f.comm_id}#{f.seq}" for f in own})[:8]})}
    if not stopped:
        return {}
    sets = [({f.node} | {node_of(e) for e in f.peer_eps}) for f in first]
    hits = Counter(n for s in sets for n in s)
    # ties between a sender and its receiver: the node that sent the least (its own
    # stalled records, nearly empty) is where the traffic stopped. Not a send whose
    # receiver's grant never reached it: it was not allowed to send, and the receiving end
    # has no record to compare (sweep 23 #2: a pipeline send into a dead NIC, stalled at
    # zero bytes without its grant, named the sender)
    sent = Counter(f.node for f in first
                   if f.value <= p.stop_frac and (f.comm_id, f.seq, f.rank) not in ev.stops.ungranted)
    ranked = sorted(hits.items(), key=lambda kv: (-kv[1], -sent.get(kv[0], 0), kv[0]))
    best, nb = ranked[0]
    tied = [n for n, c in ranked if c == nb]
    extra: dict[str, Any] = {}
    if len(tied) == 2:
        # the two ends of the stalled link(s): an end whose NIC went on moving bytes
        # with a third party after the traffic stopped was up (a receiver's dead NIC
        # stalls the sender at zero bytes too, so "sent the least" cannot tell them)
        alive = {x: alive_after(ev, p, x, first) for x in tied}
        up = [x for x in tied if alive[x] >= p.rail_alive_min]
        if len(up) == 1 and not alive[tied[0] if up[0] == tied[1] else tied[1]]:
            extra["alive_after_stall"] = {up[0]: alive[up[0]]}
            tied = [x for x in tied if x != up[0]]
            best = tied[0]
    if len(tied) == 2:
        # A send stalled at zero bytes into a member that never started the operator waits
        # for that member (no receive posted, nothing to move), not for its own network:
        # the absent end is where the traffic stopped (it is stuck on something else - a
        # hung GPU is compute_stop's, a receive that never arrives this rule's).
        absent = {(f.comm_id, f.seq, f.node) for f in ev.stops.absent}
        waited = [x for x in tied if any(f.node != x and (f.comm_id, f.seq, x) in absent for f in first)]
        if len(waited) == 1:
            extra["absent_from_stalled"] = sorted({f"{f.comm_id}#{f.seq}" for f in first
                                                    if (f.comm_id, f.seq, waited[0]) in absent})[:8]
            tied = waited
            best = tied[0]
    if len(tied) > 1 and sent.get(best, 0) > max(sent.get(n, 0) for n in tied[1:]):
        tied = [best]
    if len(tied) > 1:
        # a ring stalls all round, every node on as many stalled links as the next: where
        # its bytes piled up says which link broke
        blocked = ring_break(first)
        if blocked is not None and blocked[1] in tied:
            tied = [blocked[1]]
            extra["ring_blocked_sender"] = blocked[0]
    if len(tied) == 1:
        best = tied[0]
        own = [f for f in first if f.node == best] or first
        return {("network-stop", (best,)): make_hypothesis(p, "network-stop", "node", (best,), own, extra=extra)}
    # Ends that nothing tells apart (a two-rank ring between them, both stalled at the same
    # fraction at the same moment within the skew bound) are not named as a group: one of
    # them is healthy, and an operator would drain both (sweep 29 #9: {node-02, node-03}
    # named before node-02's pipeline send, stalled at the same instant, singled it out).
    # The stalls that follow, or a third party's traffic, decide later.
    return {}


def ring_break(first: list[Finding]) -> tuple[str, str] | None:
    """(blocked sender, its receiver) of a ring collective that stalled all round, or None.

    A ring rank forwards what it received (plus its own share): walked along the ring, the
    stalled ranks' sent fractions rise by about a step per hop from the break on. The rank
    whose receiver stopped taking bytes holds what its predecessor sent it and cannot pass
    it on: it sent far less than it received (sweep 181 #0: a NIC dead mid-AllReduce in an
    11-rank ring, every rank stalled at 81-92 % within 0.1 ms - far inside the skew bound -
    its predecessor's sender 6.7 MB short of what it was given, every other rank at most
    0.07 MB). Its receiver is the dead end either way: a dead receiving NIC stops taking
    bytes, and a dead NIC's node also stops its own sends only as far as it was given (its
    predecessor, blocked into it, is the one short). Back-pressure (a rank's buffers full
    behind a blocked successor) leaves each rank behind it short of one buffer at most.
    Only each communicator's first stalled operator, a single cycle of one-peer ranks, and
    only when the largest shortfall exceeds every other one by more than the ring's median
    hop difference (a break at the very start piles nothing up: no answer)."""
    first_seq: dict[str, int] = {}
    for f in first:
        first_seq[f.comm_id] = min(first_seq.get(f.comm_id, f.seq), f.seq)
    ops: dict[tuple[str, int], list[Finding]] = {}
    for f in first:
        if f.kind == STALL and f.seq == first_seq[f.comm_id]:
            ops.setdefault((f.comm_id, f.seq), []).append(f)
    found: set[tuple[str, str]] = set()
    for recs in ops.values():
        by_ep = {f.endpoint: f for f in recs}
        if len(recs) < 3 or len(by_ep) != len(recs) or any(
                len(f.peer_eps) != 1 or f.peer_eps[0] not in by_ep for f in recs):
            continue
        pred = {f.peer_eps[0]: f for f in recs}
        if len(pred) != len(recs) or not _one_cycle(recs, by_ep):
            continue
        short = sorted(((pred[f.endpoint].value - f.value, f) for f in recs), key=lambda sf: sf[0])
        step = median([abs(s) for s, _f in short])
        top, f = short[-1]
        if top > 0 and top - short[-2][0] > step:
            found.add((f.node, node_of(f.peer_eps[0])))
    return next(iter(found)) if len(found) == 1 else None


def _one_cycle(recs: list[Finding], by_ep: dict[str, Finding]) -> bool:
    f, seen = recs[0], 0
    while seen < len(recs):
        f, seen = by_ep[f.peer_eps[0]], seen + 1
        if f is recs[0]:
            break
    return seen == len(recs) and f is recs[0]


def stop_hypotheses(ev: Evidence, p: LocalizeParams) -> dict[Key, Hypothesis]:
    """compute-stop when the first absences name a node, else network-stop once a stalled
    record sent at most ``stop_frac`` of its bytes."""
    ev.stops.deferred = False
    if not ev.stops.stalls and not ev.stops.absent:
        return {}
    ev.stops.deferred = ev.stops.in_flight()
    if ev.stops.deferred:
        # Some node's incomplete record waits for its operator's other records: whether it
        # stalled there - stuck, not the stop - is not known yet, and the first stalls and
        # absences read without it name the wrong end (sweep 307 #21, a GPU hung on node-00
        # under MoE: node-04, stuck in its stage's all-to-all with node-00 and so absent
        # from its pipeline send, was named first; the all-to-all, waiting for node-00's
        # record, was judged stalled only later)
        return {}
    return compute_stop(ev, p) or network_stop(ev, p)
