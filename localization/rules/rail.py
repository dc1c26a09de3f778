"""Rail skew: one NIC of a node stalls (a link flap, PFC pauses) while its other NICs run.

Physical facts relied on:

* The same operator (kind, seq, bytes, members) issued at the same moment on a node's
  several NICs (one communicator per rail) ends within an epoch or two on all of them;
  a GPU or host straggler delays every NIC of its node alike. So a record that ends
  ``rail_late_ns`` after its siblings' median - compared on the node's own clock, no
  offset involved - has something on that one NIC's paths stalled.
* The rail-late records implicate their communicator's member nodes; the node present in
  all of them, with most of its own rail-late records on one NIC, has the stalling NIC.
  Two nodes present in all of them are the two ends of one stalled link: an end whose
  NIC moved bytes with a third party while the link was silent was up, so the other end
  is the culprit. When nothing tells the ends apart nobody is named: the pair would blame
  a healthy node for one NIC's fault. An end without late records of its own (only sends
  *into* it stalled) is represented by the NICs those sends went to.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

from pulse.events import GROUPED
from pulse.records import OpMetrics

from ..decisions import Hypothesis, Key, make_hypothesis
from ..evidence import GROUPED_RAIL_METRIC, SILENT_START_METRIC, AlivePoints, Evidence, node_of
from ..finding import RAIL, Finding
from ..params import LocalizeParams
from ..robust import median


def judge_rails(ev: Evidence, p: LocalizeParams, comm: str, ordered: list[OpMetrics], endpoints: list[str],
                peer_eps: list[tuple[str, ...]], rises: dict[int, float] | None = None,
                noise: float = 0.0) -> None:
    """Compare each record of a closed operator with the same operator on its node's other
    NICs; rail-late records join ``ev.rail.records``. ``rises``: per record index, how much
    later than usual its rank entered the operator relative to the others
    (:meth:`.late_baselines.LateBaselines.rises_of`); ``noise``: how far a healthy rank's
    rise strays (two sigmas of the job's healthy spread; 0 while unknown)."""
    rail = ev.rail
    members = rail.member_nodes(comm) | {r.node for r in ordered}
    first_late: dict[int, float] = {}
    for i, r in enumerate(ordered):
        if not r.complete or r.t_host_ns is None:
            continue
        if r.kind == GROUPED:
            _judge_grouped(ev, p, comm, ordered, endpoints, i)
            continue
        # siblings: the same operator issued at the same moment on the node's other NICs
        sib = [(e, st) for e, th, c, st in rail.siblings.get(rail.key(r), ())
               if c != comm and abs(th - r.t_host_ns) <= p.rail_issue_ns]
        if len(sib) < p.rail_min_siblings:
            continue
        ref = median([e for e, _st in sib])
        if r.end_ns - ref >= p.rail_late_ns:
            # a peer that entered this operator late was not kept waiting by the rail: the
            # rail waited for it (its place in each rail's trees differs, and so does the
            # wait). Sweep 269 #0: node-04 computing at 1/1.43, 45-66 ms late into every
            # operator; its parent in one rail's tree ended there ~139 ms after its other
            # rails, which excused node-04 as that late rail's receiver: never named, the
            # job 42 % slower. A receiver that issued on time (a flap's partner) still is.
            late_eps = {endpoints[k] for k, x in (rises or {}).items() if x > noise > 0}
            waiting = tuple(e for e in peer_eps[i] if e not in late_eps)
            f = Finding(RAIL, comm, r.seq, r.rank, r.node, endpoints[i], float(r.end_ns - ref), 0.0,
                        "end_after_other_nics_ns", r.start_ns, r.end_ns, waiting)
            rail.records.append((f, members))
        if r.kind in EVERY_RANK_SENDS:
            # from when it could start: with its siblings, or once its own previous
            # operator ended (a lossy ring ends late at some ranks; their next starts late)
            could = max(median([st for _e, st in sib]), rail.prev_end(r) or 0)
            first_late[i] = r.start_ns - could
    _judge_first_bytes(ev, p, comm, ordered, endpoints, peer_eps, first_late, rises or {}, noise)
    rail.trim()


EVERY_RANK_SENDS = frozenset({"AllReduce", "AllGather", "ReduceScatter"})
"""Collectives in which every rank sends its own data and receives its neighbours' from
the first step (a ring's first chunk, a tree's leaves upward and its interior receiving
from them): a rank with a working NIC moves a byte as soon as its kernel runs."""


def _judge_first_bytes(ev: Evidence, p: LocalizeParams, comm: str, ordered: list[OpMetrics],
                       endpoints: list[str], peer_eps: list[tuple[str, ...]], first_late: dict[int, float],
                       rises: dict[int, float], noise: float) -> None:
    """A record's start is its first byte sent. A rank whose first byte came
    ``rail_late_ns`` after its siblings' on the node's other NICs (same node clock, no
    offset involved) could not send on that one NIC, while a GPU or host fault would delay
    every NIC of the node alike. Which ranks cannot send when the NIC of rank c is down
    follows from the operator's structure (:func:`blocked_by`); when exactly one late rank
    predicts the late set, its record names it (sweep 181 #21: node-00's ring record began
    29.5 ms after its siblings', every other rank's on time, and its ring has no other
    record to tell its six nodes apart; 197 #12: node-04 down and its ring predecessor late
    with it; 223 #5: node-05 down in a 16-node tree, late with its children and the
    ancestors the two trees share). :func:`rail_hypotheses` drops the record if another
    communicator's record kept the NIC busy meanwhile (the stream was busy, not the link).

    Nor when another rank entered the operator late by about as much as the silence
    (``rises``, beyond their ``noise``, within it of the silence): a rank that waits for a
    late one's data cannot send what it forwards, and how long it waits on each rail depends
    on where the late rank sits in that rail's trees, which differ from rail to rail (sweep
    269 #0: node-04 computing at 1/1.43 of its pace, 41-66 ms late into every operator;
    node-00, its parent in one rail's tree, sent its first bytes on that rail 4.1 and 61.4
    ms after its other rails' - node-04 then 60.9 ms late - and was named network-slow)."""
    late = {ordered[i].rank for i, v in first_late.items() if v >= p.rail_late_ns}
    if late:
        silent = min(v for i, v in first_late.items() if ordered[i].rank in late)
        if any(x > noise and x + noise >= silent for k, x in rises.items() if ordered[k].rank not in late):
            return
    if not late or len(first_late) - len(late) < 2:
        return  # the rail as a whole waited (its previous operator stalled): no one NIC
    known = {ordered[i].rank for i in first_late}
    topo = ev.topo
    fits = {c for c in late for model in (topo.rings.get(comm), topo.tree_parent.get(comm)) if model
            and blocked_by(c, model) & known == late}
    if len(fits) != 1:
        return
    c = fits.pop()
    i = next(i for i in first_late if ordered[i].rank == c)
    r = ordered[i]
    f = Finding(RAIL, comm, r.seq, r.rank, r.node, endpoints[i], float(first_late[i]), 0.0, SILENT_START_METRIC,
                r.start_ns, r.end_ns, peer_eps[i])
    ev.rail.records.append((f, frozenset({r.node})))


def blocked_by(c: int, model: list[list[int]] | dict[int, dict[int, int]]) -> set[int]:
    """The ranks that cannot send their first byte of a collective while rank c's NIC is
    down, per channel structure, and so on none of the channels: in a ring (a list of rank
    orders) c and the rank sending to c (every other rank sends its own chunk at once); in
    a tree (channel -> rank -> parent) c, its children (their first send goes up to c) and
    its ancestors (a rank sends up, or the root down, only once every child's data came)."""
    out: set[int] | None = None
    if isinstance(model, list):
        chans = [{c, ring[ring.index(c) - 1]} for ring in model if c in ring and len(ring) > 1]
    else:
        chans = []
        for parent in model.values():
            if c not in parent:
                continue
            got = {c} | {x for x, up in parent.items() if up == c}
            x, hops = parent[c], 0
            while x >= 0 and x not in got and hops < len(parent):
                got.add(x)
                x, hops = parent.get(x, -1), hops + 1
            chans.append(got)
    for got in chans:
        out = got if out is None else out & got
    return out or set()


def silence(f: Finding) -> tuple[int, int]:
    """The interval (its node's clock) in which a rail-late record waited silent: after its
    siblings' first bytes, before its own; or, ending late, after its siblings' ends,
    before its own start."""
    if f.metric == SILENT_START_METRIC:
        return int(f.start_ns - f.value), f.start_ns
    return int(f.end_ns - f.value), f.start_ns


def _judge_grouped(ev: Evidence, p: LocalizeParams, comm: str, ordered: list[OpMetrics], endpoints: list[str],
                   i: int) -> None:
    """An all-to-all against the same all-to-all on its node's other NICs. Its bytes differ
    from rail to rail (expert routing), so only the part of its lateness that was *silence*
    counts: the end after the siblings' median less what its own extra active time explains
    (a NIC moving more bytes is busy longer; a NIC that is down moves nothing, and the
    sends it holds or waits for finish once it is back). Healthy simulated MoE jobs: sibling
    all-to-alls end within an epoch, with no silence at all. An all-to-all talks to every
    peer at once, so the record implicates its own node and the peers whose last byte left
    late (its per-peer completion times), not the whole communicator: the NIC that went
    down is the one every late record has in common (a healthy rank's exchange with it
    stalls; its own exchanges with everyone do)."""
    rail, r = ev.rail, ordered[i]
    if r.peer_ranks is None or r.peer_done_ns is None or r.t_host_ns is None:
        return
    sib = [(e, a) for e, th, c, a in rail.grouped.get(rail.grouped_key(r), ())
           if c != comm and abs(th - r.t_host_ns) <= p.rail_issue_ns]
    if len(sib) < p.rail_min_siblings:
        return
    ref = median([e for e, _a in sib])
    silence = (r.end_ns - ref) - max(0.0, r.act_ns - median([a for _e, a in sib]))
    if silence < p.rail_late_ns:
        return
    node_of_rank = dict(ev.topo.members(comm))
    ep_of_rank = {x.rank: endpoints[j] for j, x in enumerate(ordered)}
    late = [pr for pr, done in zip(r.peer_ranks, r.peer_done_ns, strict=True)
            if r.start_ns + done - ref >= p.rail_late_ns and pr in node_of_rank]
    if not late:
        return
    peers = tuple(sorted({ep_of_rank[pr] for pr in late if pr in ep_of_rank}))
    f = Finding(RAIL, comm, r.seq, r.rank, r.node, endpoints[i], float(silence), 0.0, GROUPED_RAIL_METRIC,
                r.start_ns, r.end_ns, peers)
    rail.records.append((f, frozenset({r.node, *(node_of_rank[pr] for pr in late)})))


def alive_in(alive: AlivePoints, p: LocalizeParams, ep: str, findings: list[Finding]) -> set[tuple[str, int]]:
    """The rail-late records during whose silent wait (issued with its siblings, not
    on the wire yet) ``ep`` moved bytes in another communicator."""
    ts, cs = alive.points(ep)
    m = p.rail_alive_margin_ns
    hits = set()
    for f in findings:
        lo, hi = silence(f)
        lo, hi = lo + m, hi - m
        if hi <= lo:
            continue
        i = bisect.bisect_right(ts, lo)
        while i < len(ts) and ts[i] < hi:
            if cs[i] != f.comm_id:
                hits.add((f.comm_id, f.seq))
                break
            i += 1
    return hits


def rail_hypotheses(ev: Evidence, p: LocalizeParams, explained: set[str],
                    open_nics: set[str] | frozenset[str] = frozenset()) -> dict[Key, Hypothesis]:
    """network-slow for the node (or the two nodes) common to every recent rail-late
    record, unless another rule already explains it. ``open_nics``: NICs an open incident
    already blames for a network fault."""
    kept = ev.rail.records
    while kept and kept[0][0].end_ns < ev.last_end_ns - p.rail_keep_ns:
        kept.popleft()
    # A record whose stalled link ends at a NIC already blamed is that NIC's doing: its
    # link partner's records stall as long as its own (the flap holds both ends' sends),
    # and one unrelated late record left among them would make the partner the only node
    # common to all.
    records = [(f, m) for f, m in kept if f.endpoint not in open_nics and not open_nics.intersection(f.peer_eps)
               and not (f.metric == SILENT_START_METRIC and ev.alive.busy(f.endpoint, *silence(f), f.comm_id, ""))]
    if len(records) < p.rail_persist:
        return {}
    sets = [m for _f, m in records]
    common = sorted(frozenset.intersection(*sets) - ev.insufficient)
    findings = [f for f, _m in records]
    if not common or len(common) > 2 or set(common) & explained:
        return {}
    nic_of: dict[str, str] = {}
    for x in common:
        own = [f.endpoint for f in findings if f.node == x]
        if not own:
            # no late record of x's own: every stalled send went *into* x (a flap that
            # phase-locks with the step only ever catches the gradient sends into it);
            # the NICs they went to are x's end of the stalled links. Not from all-to-alls:
            # their sends into x also wait for x to post its receives, so a GPU of x that
            # issues late looks the same from its peers; a NIC of x that is down stalls x's
            # own sends too, which gives x late records of its own.
            own = [e for f in findings if f.metric != GROUPED_RAIL_METRIC for e in f.peer_eps if node_of(e) == x]
        if not own or Counter(own).most_common(1)[0][1] < p.rail_nic_frac * len(own):
            return {}  # x's late records spread over its NICs: not one NIC (a host)
        nic_of[x] = Counter(own).most_common(1)[0][0]
    extra: dict[str, Any] = {}
    if len(common) == 2:
        # the two ends of one stalled link: an end seen moving bytes with a third party
        # while the link was silent was up; the other one stopped
        alive = {x: alive_in(ev.alive, p, nic_of[x], findings) for x in common}
        up = [x for x in common if len(alive[x]) >= p.rail_alive_min]
        if not (len(up) == 1 and not alive[common[0] if up[0] == common[1] else common[1]]):
            # nothing on the wire says which end stopped: the pair would name a healthy
            # node for one NIC's fault, so nobody is named
            return {}
        extra["alive_during_stall"] = {nic_of[up[0]]: sorted(f"{c}#{s}" for c, s in alive[up[0]])[:8]}
        common = [x for x in common if x != up[0]]
    nodes = tuple(common)
    nics = sorted(nic_of[x] for x in nodes)
    extra.update({"stalled_nics": nics, "comms": sorted({f.comm_id for f in findings})[:8]})
    inc = make_hypothesis(p, "network-slow", "node", nodes, findings, culprit=nodes[0], extra=extra)
    inc.nics = nics
    return {("network-slow", nodes): inc}
