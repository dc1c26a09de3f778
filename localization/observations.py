"""Per-operator observations: look at one closed operator (every rank's record of one
(comm, seq)) and say what it shows.

An operator yields *observations*, which the localizer accumulates as evidence
(:mod:`.evidence`) and the rule families (:mod:`.rules`) read over a window:

* **link observations** - for each rank, the links its data crossed (its NIC -> each peer
  it sends to), marked slow or clean. An operator is *slow* when its ACT is well above the
  job-wide reference for operators of the same shape (kind, bytes, ranks); inside a slow
  ring the links of the ranks with the largest ACT carry the blame (at 32 us epochs every
  rank of a throttled ring looks busy, but the ranks that send out of, or into, the
  bottleneck stay busiest). Grouped P2P is judged by rank-level active rate instead, so
  expert imbalance (more or less data, same rate) is not slowness.
* **lateness** - in a collective whose traffic is normal, a rank whose span from issuing
  the operator to its end (one node's clock) is much shorter than its peers' arrived late:
  its peers waited for it (compute straggler).
* **waits** - how long each point-to-point send waited between issue and first byte (one
  node's clock): a rank that keeps waiting for a peer is a victim, not a straggler.
* **rail skew** (judged across communicators by :mod:`.rules.rail`) - a record that ended much
  later than the same operator (kind, seq, bytes, members) on the node's other NICs, on
  the node's own clock: something on that one NIC's paths stalled.
* **stalls** - records of operators that stopped making progress, with the links they
  could not finish; members that never started an operator their peers are stuck in;
  members missing while their peers completed (their data is missing, not their op).

Times of two nodes are compared only with the clock-skew bound (``LocalizeParams.clock_skew_ns``)
in between; see docs/localization.md, "Clock skew".
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from pulse.events import GROUPED, P2P

from .finding import ABSENT, ACT, CEILING, ISSUE_LAG, LATE, MISSING, STALL, Finding, lateness
from .opview import Judgement, OpView, finding_of, link_of, rate_bounds
from .params import LocalizeParams
from .peer_rates import judge_peer_rates
from .robust import leave_one_out_medians, median

__all__ = ["Judgement", "OpView", "judge", "rate_bounds", "slow_act_bound"]


def judge(view: OpView, p: LocalizeParams, act_ref: float | None, stretch: float | None = None,
          stragglers: Collection[int] = (), capped: dict[int, tuple[float, float]] | None = None,
          burst: Callable[[int], float | None] | None = None) -> Judgement:
    """Observations of one closed operator. ``act_ref``: the job-wide reference ACT of
    operators of this shape (None while too few have been seen); ``stretch``: how far above
    its reference a healthy record of the shape went (:meth:`.evidence.References.stretch`);
    ``stragglers``: indices of records that are their collective's consistent stragglers
    (:class:`.stragglers.Stragglers`), slow whatever the per-operator bound says;
    ``capped``: records whose rank's capacity ceiling fell (:class:`.ceilings.Ceilings`),
    with (recent, baseline) busiest-epoch bytes: their links are slow whatever the timing;
    ``burst``: for an all-to-all, called with a record found slow both ways: how far its
    NIC's busiest epochs went past what a NIC held to one rate shows, over its slow
    records (:meth:`.ceilings.Ceilings.slow_burst`; above 1: not its capacity)."""
    out = Judgement()
    n = len(view.recs)
    if n == 0:
        return out
    complete = [r.complete for r in view.recs]
    all_complete = all(complete)
    missing = view.missing
    if missing:
        if all_complete:
            for rk in missing:
                node = view.members[rk]
                out.findings.append(Finding(MISSING, view.comm_id, view.seq, rk, node, node, float("nan"),
                                            float("nan"), "records", view.recs[0].start_ns, view.recs[0].end_ns))
            return out
        if any(view.stalled):
            r0 = view.recs[complete.index(False)]
            for rk in missing:
                node = view.members[rk]
                out.findings.append(Finding(ABSENT, view.comm_id, view.seq, rk, node, node, 0.0,
                                            float(n), "started", r0.start_ns, r0.end_ns))
    if not all_complete:
        if any(view.stalled):
            exp = view.col("expected_bytes")
            frac = np.where(exp > 0, view.col("volume_bytes") / np.maximum(exp, 1.0), 1.0)
            for i in [i for i, c in enumerate(complete) if not c]:
                if view.stalled[int(i)] and not _stalled_on_late_peer(view, int(i), p):
                    out.findings.append(finding_of(view, int(i), STALL, "sent_fraction", frac[i],
                                                 median(np.delete(frac, i)) if n > 1 else 1.0))
        return out
    out.judged = list(range(n))
    if view.kind == GROUPED:
        _judge_rate(view, p, act_ref, out, burst)
        if capped:
            _judge_capped(view, out, capped)
    else:
        _judge_act(view, p, act_ref, out, stretch, stragglers, capped or {})
    if view.kind in P2P:
        for r in view.recs:
            if r.t_host_ns is not None:
                out.waits.append((r.node, float(r.start_ns - r.t_host_ns)))
    slow = any(lk.slow for lk in out.links)
    if n >= p.late_min_ranks:
        late = Judgement()
        _judge_late(view, p, late)
        out.arrivals = late.issue_lags
        # an issue lag is read across two clocks: one skew bound more
        waited = [f for f in late.findings
                  if lateness(f) >= p.late_override_ns + (p.clock_skew_ns if f.metric == ISSUE_LAG else 0)]
        if slow and waited and p.late_overrides_act:
            # A rank that arrived tens of ms late kept its peers waiting on it: a peer
            # sending into a receiver that does not drain (TCP window, no posted buffers)
            # is active without moving, so its ACT says nothing about the network here;
            # nor do resent bytes: a receiver that does not drain drops what its buffers
            # cannot hold and its senders resend it (lab, a rank at 5 % of a core: every
            # sender resent 2-3 %, and its ring neighbour was named network-slow).
            out.links = [lk for lk in out.links if lk.finding is None]
            out.findings = [f for f in out.findings if f.metric not in ("act_ns", "volume_ratio")]
            slow = any(lk.slow for lk in out.links)
        if not slow:
            out.findings += late.findings
            out.issue_lags = late.issue_lags
        elif waited and p.late_overrides_act:
            # Its peers waited tens of ms for it whatever the links did: a rank starved of
            # CPU drains its sockets late, its senders resend what its full buffers dropped,
            # and that surplus must not hide its lateness (lab, a rank at 5 % of a core,
            # 0.3-1.4 s late in every operator: half its late operators carried resent bytes)
            out.findings += waited
    return out


def _stalled_on_late_peer(view: OpView, i: int, p: LocalizeParams) -> bool:
    """The stall began before some peer had even issued the operator, and that peer came
    ``late_override_ns`` after this rank: a collective cannot move past its first chunks
    without every rank, so this rank waited for a straggler (lab: a receiver at a 5 % CPU
    quota, 1.9 s late, leaves its ring predecessor's sends stuck), not for its network."""
    r = view.recs[i]
    if not p.late_overrides_act or r.t_host_ns is None or view.kind in P2P:
        return False
    issued = [o.t_host_ns for j, o in enumerate(view.recs) if j != i and o.t_host_ns is not None]
    if not issued:
        return False
    last = max(issued)
    # ``last`` is the peer's clock, the stall's last byte this rank's: a peer issue that may
    # have come after it within the skew bound counts as waiting (no network-stop blame)
    return last >= r.end_ns - p.clock_skew_ns and last - r.t_host_ns >= max(p.late_override_ns, p.late_min_ns)


def slow_act_bound(ref: float, epoch: float, p: LocalizeParams) -> float:
    """The smallest measured ACT that is slow against the reference ``ref``. An ACT counts
    active epochs, so the time it stands for may be up to an epoch shorter than it says, and
    the reference's (itself a measured ACT) up to an epoch longer: a record is slow only when
    even then it is ``act_ratio`` x the reference, (act - epoch) >= act_ratio (ref + epoch).
    At a few epochs this is what separates a tree relay paced by its subtree (9 epochs at
    48 us) from a leaf (6) of the same healthy operator; at tens of epochs it is the ratio."""
    return p.act_ratio * (ref + epoch) + epoch


def _judge_act(view: OpView, p: LocalizeParams, ref: float | None, out: Judgement,
               stretch: float | None = None, stragglers: Collection[int] = (),
               capped: dict[int, tuple[float, float]] | None = None) -> None:
    recs = view.recs
    epoch = float(recs[0].epoch_ns)
    capped = capped or {}
    # Short shapes are judged too: the bound is derived from the quantisation, so a few
    # epochs need a larger ratio, not a floor on the length (sweep 151 #10: PCIe at 32 % on
    # the last of 4 pipeline stages, its pipeline sends 3 epochs before and 7 after - 2.3x -
    # and with no shape under 4 epochs judged, its stage-2 partner was named compute-slow).
    if ref is None or ref <= 0:
        _judge_resent(view, p, out)
        _judge_capped(view, out, capped)
        return
    # plain floats (the same float64 arithmetic): an operator has one to a few records,
    # where numpy's per-call cost was most of the work
    act = [float(r.act_ns) for r in recs]
    bound = slow_act_bound(ref, epoch, p)
    # A record that sends to several peers (a tree relay) forwards what its subtree hands
    # it: its active epochs follow its inputs' arrival, not its own links' capacity, and a
    # straggler anywhere upstream spreads them (sweep 23 #11: a host-starved rank in a
    # 12-rank tree at 96 us epochs, relays at 4 epochs before it and 6-8 after, two healthy
    # nodes named network-slow). Such a record is slow only beyond the longest a record of
    # the shape went in its healthy first operators; a single-peer send (ring, pipeline) is
    # paced by its own link and keeps the quantisation bound alone.
    # Until the shape's healthy stretch is measured, a relay's ACT has nothing to be
    # judged against (sweep 37 #8, a healthy 31-rank tree: relays at 2.2x the reference
    # in the first operators, 'host contention' on a healthy node). A record that moved
    # one flow is no relay whatever peers its rank has flows to (Gloo binds one to every
    # peer): it keeps the quantisation bound meanwhile (the lab-loss recording's culprit).
    relay_max = stretch * ref if stretch is not None else None
    amax = max(act)
    top_from = amax - max(epoch, p.act_top_frac * amax)
    vol = [float(r.volume_bytes) / max(float(r.expected_bytes), 1.0) if r.expected_bytes > 0 else 1.0
           for r in recs]
    # a consistent straggler's operator is slow as any other at the straggler's links: its
    # ring neighbours as busy as it (the one sending into its NIC, the one it sends into;
    # within ``act_top_frac``) with it. Not every rank as busy: a ring goes at the pace of
    # its slowest link and the ranks downstream of it stay as busy (sweep 239 #7:
    # congestion into node-04 of a 13-rank ring at 96 us epochs, node-03 sending into it
    # the straggler, ranks 05-08 within the top fraction and their links grouped as a path)
    near = min((act[i] for i in stragglers), default=float("inf"))
    near -= max(epoch, p.act_top_frac * near)
    beside = _beside(view, stragglers)
    slow = [(a >= near and i in beside)
            or (a >= bound and (len(view.peer_eps[i]) < 2
                                or (a > relay_max if relay_max is not None else recs[i].flows < 2)))
            for i, a in enumerate(act)]
    resent = [v >= 1.0 + p.vol_excess for v in vol]
    slow_op = any(slow) or any(resent) or bool(capped)
    paced = _paced_by_cap(capped, ref, epoch)
    if any(resent):
        # Resends pace the operator as a cap does: a ring waits on its lossy link, and
        # every rank's ACT stretches as far as the resending ranks' (sweep 239 #19: 1.7 %
        # loss at node-03 in a 4-rank ring, ranks 0 and 1 at 11-13 epochs with the resending
        # 2 and 3, their links 0->1 and 1->2 slow, and node-01 grouped with node-03 as a path)
        paced = max(paced, max(a for a, r in zip(act, resent, strict=True) if r) + epoch)
    for i in range(len(act)):
        timed = slow[i] and act[i] >= top_from
        if timed and i not in capped and not resent[i] and i not in stragglers and act[i] <= paced:
            # A collective goes at the pace of its slowest link: with a rank's capacity
            # ceiling fallen in this operator, every rank's ACT stretches up to as far as the
            # cap slowed it, and which of them lands in the top epoch is quantisation (sweep
            # 229 #9: a NIC at 39 % in an 11-rank ring at 96 us epochs, ranks 0, 8, 9 and 10
            # as often in the top epoch as the capped ranks 6 and 7; their links were named
            # a path), or the resending ranks' ACT. Their links did what they were asked,
            # and what their windows held from before the cap was known ages out.
            out.paced += [link_of(view, i, d, False, None) for d in view.peer_eps[i]]
            out.links += [link_of(view, i, d, False, None, paced=True) for d in view.peer_eps[i]]
            continue
        blamed = timed or resent[i] or i in capped
        f = None
        if resent[i]:
            f = finding_of(view, i, ACT, "volume_ratio", vol[i], 1.0)
        elif timed:
            f = finding_of(view, i, ACT, "act_ns", act[i], ref)
            if act[i] >= near and i in beside:
                f.consistent = True
        elif blamed:
            f = finding_of(view, i, ACT, CEILING, *capped[i])
        if slow_op and not blamed and not slow[i]:
            # within the bound in a slow operator: the rate it carried is one its NICs
            # reached, but not clean (a congested downlink passes a record in a lull: sweep
            # 199 #7, node-09 under a congested leaf seen receiving cleanly that way, and
            # healthy nodes were grouped with node-08 instead)
            out.paced += [link_of(view, i, d, False, None) for d in view.peer_eps[i]]
        if not slow_op or blamed:
            for d in view.peer_eps[i]:
                out.links.append(link_of(view, i, d, blamed, f))
            if blamed:
                out.findings.append(f)  # type: ignore[arg-type]
        elif capped or any(resent):
            # paced by the capped or resending ranks wherever its ACT landed
            out.links += [link_of(view, i, d, False, None, paced=True) for d in view.peer_eps[i]]


def _beside(view: OpView, stragglers: Collection[int]) -> set[int]:
    """The consistent stragglers and the records on a link with one of them (sending into
    its NIC, or sent into by it)."""
    out = set(stragglers)
    for s in stragglers:
        ep, into = view.endpoints[s], set(view.peer_eps[s])
        out.update(i for i in range(len(view.recs)) if ep in view.peer_eps[i] or view.endpoints[i] in into)
    return out


def _paced_by_cap(capped: dict[int, tuple[float, float]], ref: float, epoch: float) -> float:
    """The longest ACT a record paced by the operator's capped ranks may show: a cap at
    ``top`` bytes per epoch against a baseline of ``base`` slows what crossed it at most
    ``base / top`` times, each ACT an epoch either way (:func:`slow_act_bound`). -inf
    without a cap."""
    if not capped:
        return float("-inf")
    slowdown = max(base / top for top, base in capped.values() if top > 0)
    return slowdown * (ref + epoch) + epoch


def _judge_capped(view: OpView, out: Judgement, capped: dict[int, tuple[float, float]]) -> None:
    """Capped ceilings alone, for an operator whose ACT says nothing (no reference yet):
    only their links are observed, as with resent bytes."""
    for i, (top, base) in capped.items():
        f = finding_of(view, i, ACT, CEILING, top, base)
        for d in view.peer_eps[i]:
            out.links.append(link_of(view, i, d, True, f))
        out.findings.append(f)


def _judge_resent(view: OpView, p: LocalizeParams, out: Judgement) -> None:
    """Resent bytes alone, for an operator whose ACT says nothing (no reference yet): bytes
    counted are bytes, whatever the epoch, and go-back-N resends whole windows (sweep 67
    #8: 1 MB tree buckets of two 128 us epochs, a link at 1.4 % loss, every record of its
    node resending 1.5-2.7x its bytes, and nothing judged). Only the resending records'
    links are observed: a link whose timing was not compared is not seen clean."""
    for i, r in enumerate(view.recs):
        if r.expected_bytes > 0 and r.volume_bytes >= (1.0 + p.vol_excess) * r.expected_bytes:
            f = finding_of(view, i, ACT, "volume_ratio", r.volume_bytes / r.expected_bytes, 1.0)
            for d in view.peer_eps[i]:
                out.links.append(link_of(view, i, d, True, f))
            out.findings.append(f)


def _judge_rate(view: OpView, p: LocalizeParams, rate_ref: float | None, out: Judgement,
                burst: Callable[[int], float | None] | None = None) -> None:
    """``rate_ref``: the job-wide median rank-level rate of grouped operators of this size.
    A rank at a normal rate (vs that reference and its peers) marks its links clean; one
    below it says nothing about *which* of its links is slow (see ``rate_blame``). Records
    that carry per-peer figures are judged link by link instead (:func:`.peer_rates.judge_peer_rates`)."""
    rate = view.col("active_rate")
    if rate.size < p.min_ranks:
        return
    if judge_peer_rates(view, p, out, burst):
        return
    loo = leave_one_out_medians(rate)
    exp = view.col("expected_bytes")
    vol = np.where(exp > 0, view.col("volume_bytes") / np.maximum(exp, 1.0), 1.0)
    for i in range(rate.size):
        low = bool(loo[i] > 0 and rate[i] <= p.rate_ratio * loo[i])
        resent = p.grouped_resent and bool(vol[i] >= 1.0 + p.vol_excess)
        blamed = (p.rate_blame and low) or resent
        if not blamed and (low or rate_ref is None or rate[i] < p.rate_ratio * rate_ref):
            continue
        f = None
        if resent:
            f = finding_of(view, i, ACT, "volume_ratio", vol[i], 1.0)
        elif blamed:
            f = finding_of(view, i, ACT, "active_rate", rate[i], loo[i])
        for d in view.peer_eps[i]:
            out.links.append(link_of(view, i, d, blamed, f))
        if f is not None:
            out.findings.append(f)


def _judge_late(view: OpView, p: LocalizeParams, out: Judgement) -> None:
    th = np.array([np.nan if r.t_host_ns is None else float(r.t_host_ns) for r in view.recs])
    if np.isnan(th).any():
        return
    span = view.col("end_ns") - th  # issue -> end, on each rank's own clock
    # only a collective's ranks are meant to issue together (each waits for the last);
    # the two sides of point-to-point sends issue when their own stage is ready
    collective = view.kind not in P2P
    issue_lag = th - leave_one_out_medians(th) if collective else np.zeros(span.size)
    # A shorter span means the peers waited only if the rank's end came with theirs: a rank
    # that finished earlier (a slow link upstream in its ring delays its peers' last chunks:
    # real Gloo ring at 200 Mbit/s on rank 2, rank 0's ends 40-95 ms before its peers' with
    # issues together) made no one wait. Ends are read across clocks: only what exceeds the
    # skew bound is taken off.
    end = view.col("end_ns")
    early = np.maximum(leave_one_out_medians(end) - end - p.clock_skew_ns, 0.0)
    for i in range(span.size):
        ref = median(np.delete(span, i))
        lag = ref - span[i] - early[i]
        if lag >= p.late_min_ns and lag >= p.late_ratio * max(ref, 0.0):
            out.findings.append(finding_of(view, i, LATE, "issue_to_end_ns", span[i], ref))
        elif collective and issue_lag[i] >= p.late_min_ns + p.clock_skew_ns \
                and issue_lag[i] >= p.late_ratio * max(ref, 0.0):
            # A rank starved of CPU is slow at its own communication too: its end comes late
            # and its span grows by part of its lateness (lab, CPU quota). Its issue came
            # late all the same, by a lag read across clocks: one skew bound more.
            out.findings.append(finding_of(view, i, LATE, ISSUE_LAG, issue_lag[i], 0.0))
    if collective:
        out.issue_lags = list(enumerate(issue_lag.tolist()))
