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
from ..evidence import GROUPED_RAIL_METRIC, AlivePoints, Evidence, node_of
from ..finding import RAIL, Finding
from ..params import LocalizeParams
from ..robust import median


def judge_rails(ev: Evidence, p: LocalizeParams, comm: str, ordered: list[OpMetrics], endpoints: list[str],
                peer_eps: list[tuple[str, ...]]) -> None:
    """Compare each record of a closed operator with the same operator on its node's other
    NICs; rail-late records join ``ev.rail.records``."""
    rail = ev.rail
    members = rail.member_nodes(comm) | {r.node for r in ordered}
    for i, r in enumerate(ordered):
        if not r.complete or r.t_host_ns is None:
            continue
        if r.kind == GROUPED:
            _judge_grouped(ev, p, comm, ordered, endpoints, i)
            continue
        # siblings: the same operator issued at the same moment on the node's other NICs
        sib = [e for e, th, c in rail.siblings.get(rail.key(r), ())
               if c != comm and abs(th - r.t_host_ns) <= p.rail_issue_ns]
        if len(sib) < p.rail_min_siblings:
            continue
        ref = median(sib)
        if r.end_ns - ref >= p.rail_late_ns:
            f = Finding(RAIL, comm, r.seq, r.rank, r.node, endpoints[i], float(r.end_ns - ref), 0.0,
                        "end_after_other_nics_ns", r.start_ns, r.end_ns, peer_eps[i])
            rail.records.append((f, members))
    rail.trim()


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
        lo, hi = f.end_ns - f.value + m, f.start_ns - m
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
    records = [(f, m) for f, m in kept if f.endpoint not in open_nics and not open_nics.intersection(f.peer_eps)]
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
