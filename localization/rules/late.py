"""Lateness: compute-slow.

Physical facts relied on:

* A collective cannot finish before its last rank arrives, so the ranks that arrived on
  time wait for it: in an operator whose traffic is normal, the rank whose span from
  issuing to the end (its own clock) is much shorter than its peers' arrived late. A GPU
  or host straggler is late into every one of its communicators, step after step; buckets
  of one step are late together, so persistence is judged per communicator over
  ``late_window`` operators, then over the node's communicators.
* Vetoes - lateness that is a consequence, not a cause:
  - a rank whose previous operator ended late (its own sends, or the last chunk from its
    ring predecessor) issues late after a *normal* compute gap: it waited for the
    network (:func:`late_explained`);
  - a node that waits for its point-to-point (pipeline) peers more than is usual is late
    because of them; the straggler itself never waits;
  - a node on the pipeline chain of a node another rule already blames waits for it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from pulse.records import OpMetrics

from ..decisions import Hypothesis, Key, make_hypothesis
from ..evidence import GROUPED_RAIL_METRIC, STEP_UNKNOWN, Evidence, node_of
from ..finding import Finding, lateness
from ..params import LocalizeParams
from ..robust import median
from ..stragglers import tail_count


def _waited_for_receiver(p: LocalizeParams, own: OpMetrics, pred: OpMetrics) -> bool:
    """Whether a predecessor's sends into a rank ended late because the rank itself held
    them up: the rank issued its previous operator later than the predecessor (beyond the
    skew bound), and the predecessor's end came later than the rank's own by more than its
    record was active - its bytes sat waiting on the rank's closed receive window, not on a
    slow wire (the lab's CPU-starved rank: its predecessor's sends ended 296 ms after the
    rank's own with 10 ms of active time, which then excused the starved rank's next
    lateness as a wait for the network). A slow link's late end is active time; a starved
    predecessor's late end comes with the predecessor late itself."""
    if own.t_host_ns is None or pred.t_host_ns is None:
        return False
    return (own.t_host_ns - pred.t_host_ns > p.clock_skew_ns
            and pred.end_ns - own.end_ns > pred.act_ns + p.clock_skew_ns)


def late_explained(ev: Evidence, p: LocalizeParams, comm: str, seq: int, f: Finding,
                   ordered: list[OpMetrics]) -> bool:
    """A late issue that follows a normal compute gap after a previous operator that
    ended late (its own sends, or the ring predecessor's it received last): the rank
    waited for the network, not for its own compute. Reads the previous operators' ends,
    so it is asked before this operator's ends are recorded."""
    if p.late_gap_frac <= 0:
        return False
    prev_of = ev.late.prev
    gaps: dict[int, float] = {}
    mixed = False
    for r in ordered:
        prev = prev_of.get((comm, r.rank))
        if prev is None or prev.seq != seq - 1 or r.t_host_ns is None:
            return False  # no previous operator to measure the gap from: keep the finding
        done = prev.end_ns
        # A rank whose own sends ended early still waits for the last chunk from its ring
        # predecessor (the lab's CPU-starved rank keeps its successor waiting while its
        # own predecessor's sends stall on a full receive window). The predecessor's end is
        # on its clock: only an end later than the rank's own by more than two clocks can
        # differ says it came last; within that, the rank's own end (its clock) stands.
        for pr in ev.topo.ring_predecessors(comm, r.rank):
            pe = prev_of.get((comm, pr))
            if (pe is not None and pe.seq == seq - 1 and pe.end_ns - prev.end_ns > p.clock_skew_ns
                    and not _waited_for_receiver(p, prev, pe)):
                done = max(done, pe.end_ns)
                mixed = True
        gaps[r.rank] = float(r.t_host_ns - done)
    if f.rank not in gaps or len(gaps) < 2:
        return False
    others = median([g for rk, g in gaps.items() if rk != f.rank])
    # each gap that ends at a ring predecessor's end (its clock) and starts at the rank's
    # own issue may be one skew bound off, two between the rank's gap and the others';
    # gaps measured on each rank's own clock need no margin
    return gaps[f.rank] - others < p.late_gap_frac * lateness(f) + (2 * p.clock_skew_ns if mixed else 0)


def late_findings(ev: Evidence, p: LocalizeParams, comm: str, seq: int, cands: dict[int, Finding],
                  ordered: list[OpMetrics]) -> dict[int, Finding]:
    """The late findings of one operator that stand: those the compute-gap veto does not
    explain, and those it does where the late end it points to was the rank's own doing -
    the rank had arrived late into that previous operator by its own compute gap. A
    straggler late into an operator finishes its part of it late (Gloo reduces on the CPU:
    the lab's rank at 5 % of a core sent its last chunk of a step 200 ms after its peers
    their last), and DDP queues the next bucket before that end; the veto then read its
    next lateness as a wait for the network, one operator of three (the first bucket of
    each step), and the window held 11 of 16 where 12 are asked. The chain is one operator
    deep: a lateness kept this way does not keep the next, so a network victim's one noisy
    finding that escaped the veto cannot turn its later late ends into its own."""
    out: dict[int, Finding] = {}
    own = ev.late.own
    for rk, f in cands.items():
        if not late_explained(ev, p, comm, seq, f, ordered):
            out[rk] = f
            own[(comm, rk)] = seq
        elif own.get((comm, rk)) == seq - 1:
            out[rk] = f
    return out


def waits_on(ev: Evidence, blamed: set[str]) -> set[str]:
    """The nodes of the blamed nodes' pipeline chains: their point-to-point (two-rank
    communicator) peers, those peers' peers, and so on. A straggler in stage s delays the
    stages before and after it alike (each waits for the activations or gradients the next
    hop could not send on time), so with three stages or more a node two hops away is late
    for the same reason as the blamed node's direct peer (found by ``pulse eval --sweep``:
    a GPU at x1.28 in the last of three stages, and a first-stage node blamed too)."""
    out: set[str] = set()
    if not blamed:
        return out
    links: dict[str, set[str]] = {}
    for comm, nr in ev.topo.nranks.items():
        nodes = set(ev.topo.members(comm).values())
        if nr == 2 and len(nodes) == 2:
            a, b = nodes
            links.setdefault(a, set()).add(b)
            links.setdefault(b, set()).add(a)
    todo = list(blamed)
    while todo:
        for peer in links.get(todo.pop(), ()):
            if peer not in blamed and peer not in out:
                out.add(peer)
                todo.append(peer)
    return out


def beside_slowed_links(ev: Evidence) -> set[str]:
    """Nodes at one end of a persistently slow link whose other end has links slowed to
    more peers: the slowed links meet at that other node, and this one waits for it. A
    200 Mbit egress limit on one lab node slows its links to all three peers (their acks
    queue behind its data); each peer, on one of those links, starts the steps after a
    slow operator late and carries that lateness through the step's buckets, where the
    compute-gap veto cannot see it (the buckets were queued before the slow operator
    ended): the lab agent e2e named node-01, then node-03, compute-slow beside node-02's
    fault. A compute straggler whose own links slow down is itself the meeting point
    (its sends and receives both), so it stays a suspect; links slowed to as many peers
    at either end say nothing either way."""
    peers: dict[str, set[str]] = defaultdict(set)
    for a, b in ev.hot_links():
        na, nb = node_of(a), node_of(b)
        if na != nb:
            peers[na].add(nb)
            peers[nb].add(na)
    return {x for x, ys in peers.items() if any(len(peers[y]) > len(ys) for y in ys)}


def persistence(hits: int, judged: int, min_fill: int, late_frac: float) -> float:
    """How much of the persistence a communicator's lateness window shows: 1 when the node
    was late in ``late_frac`` of its judged operators, that share of it below (0 while the
    window holds fewer than ``min_fill``). A window where the node was late in half its
    operators is no evidence that it was on time: a straggler whose lateness sits at the
    threshold of one communicator's shape (two epochs, where 128 us epochs quantise its
    ends) clears it now and then (sweep 11 #0, gpu-slow x1.31: late in every all-to-all,
    in half of the data-parallel operators by 0.26 ms against a 0.256 ms floor). Summed
    over the node's communicators against ``late_comm_frac`` of them: a node late in
    ``late_frac`` of the operators of ``late_comm_frac`` of its communicators passes as
    before, and so does one late in more than ``late_frac`` x ``late_comm_frac`` (56 %) of
    the operators of every communicator (a straggler is late everywhere); a node late in
    fewer of its operators than that does not, however they are spread."""
    if judged < max(min_fill, 1):
        return 0.0
    return min(1.0, hits / (late_frac * judged))


def weakly_late(p: LocalizeParams, rose: Iterable[tuple[bool, int | None]] | None, min_fill: int) -> bool:
    """Whether a node rose by ``late_weak_sigmas`` in so many steps of a communicator's
    window that a healthy rank would do so with chance ``straggler_alpha`` at most: late
    there by less than the full threshold, but late every time. Support only: the node
    must be late by the full threshold in other communicators (:func:`late_hypotheses`).

    The trials are steps, not operators: a healthy rank's issue times drift from step to
    step, and a step's buckets drift together (sweep 197 #5, a healthy 4-node tree job:
    node-01 rose in 9 of 16 buckets, a handful of steps, each bucket counted as a trial of
    chance 1/6). A step counts as risen when most of its operators in the window did;
    operators whose steps are not told apart count one each. A collective's operators
    judged before its steps could be told apart (:data:`.evidence.STEP_UNKNOWN`) do not
    count: their grouping is unknown, and counted one each, the few steps they span pass
    for many trials (sweep 307 #2, a healthy 7-node ring: node-00, whose baseline came
    from two steps it happened to issue early in, rose by 2 sigmas in 8 buckets of two
    steps, counted as 8 of 16 trials, and was named compute-slow)."""
    if rose is None:
        return False
    flags = [(up, step) for up, step in rose if step != STEP_UNKNOWN]
    if len(flags) < max(min_fill, 1):
        return False
    trials: list[list[bool]] = []
    prev: int | None = None
    for up, step in flags:
        if step is None or step != prev or not trials:
            trials.append([])
        trials[-1].append(up)
        prev = step
    risen = sum(1 for t in trials if 2 * sum(t) > len(t))
    return risen >= tail_count(p.late_weak_chance, len(trials), p.straggler_alpha)


def late_hypotheses(ev: Evidence, p: LocalizeParams, explained: set[str],
                    open_nodes: set[str]) -> dict[Key, Hypothesis]:
    """compute-slow for each node persistently late in most of its communicators, unless
    already explained, a pipeline peer of a blamed node (``explained`` by this round's
    other rules or ``open_nodes`` of open incidents), or a usual waiter."""
    out: dict[Key, Hypothesis] = {}
    lt = ev.late
    consistent = ev.late_stragglers.nodes(p.late_comm_frac) if ev.late_stragglers.consistent else {}
    if not lt.n_late and not consistent:
        return out
    job_wait = float(np.median(lt.all_waits)) if lt.all_waits else 0.0
    # Lateness is judged per communicator (the buckets of one step are late
    # together: persistence must span several steps), then per node: most of the
    # node's communicators must show it.
    # A point-to-point (pipeline) peer of a node already blamed arrives late because
    # it waits for that node: not a second straggler.
    waits_on_blamed = waits_on(ev, explained | open_nodes)
    # Sends into a stalled link are what their receiver waits for: a node at the
    # receiving end of a recent rail-late record (a send that ended milliseconds after the
    # same operator on the sender's other NICs) got its data that late, and is late because
    # of it (nic-flap, sweep 7 #5: the partner's collectives 32 ms late, the flap 35 ms).
    # Not an all-to-all's: its late peers may be late issuers themselves (their receives
    # held its sends), which this would excuse.
    waits_on_rail = {node_of(e) for f, _m in ev.rail.records if f.metric != GROUPED_RAIL_METRIC for e in f.peer_eps}
    # ... and so is every stage of the receivers' pipeline chains: a stalled pipeline link
    # delays the stages after it as a straggler does (sweep 337 #13: a NIC of node-00 in
    # stage 0 of 4 flapping, its link with node-04 rail-late both ways and neither end
    # named - nothing on the wire said which end stopped - while node-08, two stages on in
    # the same chain, arrived ~23 ms late into its data-parallel operators and was named
    # compute-slow). A compute straggler's own sends are late on every NIC alike, never
    # rail-late, so this excuses no straggler by its own doing.
    waits_on_rail |= waits_on(ev, waits_on_rail)
    waits_on_link = beside_slowed_links(ev)
    min_fill = int(p.late_min_fill * p.late_window)
    per_node: dict[str, list[tuple[float, bool, list[Finding]]]] = defaultdict(list)
    for key, win in lt.windows.items():
        hits = [f for f in win if f is not None]
        per_node[key[0]].append((persistence(len(hits), len(win), min_fill, p.late_frac),
                                 weakly_late(p, lt.rose.get(key), min_fill)
                                 or ev.late_stragglers.latest.get(key[1]) == key[0], hits))
    late: dict[str, list[Finding]] = {}
    for node, comms in per_node.items():
        strong = sum(f for f, _w, _ in comms)
        if strong >= 1 and sum(1.0 if w else f for f, w, _ in comms) >= p.late_comm_frac * len(comms):
            late[node] = [h for f, _w, hs in comms if f for h in hs]
    if consistent and not (explained or open_nodes):
        # Late at most steps, if by less than six sigmas. The count assumes ranks alike,
        # which a fault already found breaks: the ranks around it wait for it unequally,
        # step after step, and one operator of a step whose veto missed it suffices (lab
        # agent e2e, 200 Mbit on node-02: compute-slow on node-01 in one run, on node-03 in
        # the next, each 8-13 s after node-02 network-slow).
        for node, fs in consistent.items():
            late.setdefault(node, fs)
    for node, hits in late.items():
        if (node in explained or node in ev.insufficient or node in waits_on_blamed or node in waits_on_rail
                or node in waits_on_link):
            continue
        waits = lt.waits.get(node)
        if waits and len(waits) >= p.link_min_obs and float(np.median(waits)) > job_wait:
            # it waits for its point-to-point peers more than is usual: it is late
            # because of them (a pipeline victim); the straggler itself never waits
            continue
        out[("compute-slow", (node,))] = make_hypothesis(p, "compute-slow", "node", (node,), hits)
    return out
