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

import dataclasses
from collections.abc import Callable, Collection

import numpy as np

from pulse.events import GROUPED, P2P
from pulse.records import OpMetrics

from .finding import ABSENT, ACT, CEILING, ISSUE_LAG, LATE, MISSING, STALL, Finding, LinkObs, lateness
from .params import LocalizeParams
from .robust import leave_one_out_medians, median


@dataclasses.dataclass
class Judgement:
    links: list[LinkObs] = dataclasses.field(default_factory=list)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    waits: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    judged: list[int] = dataclasses.field(default_factory=list)
    """Indices of records that were compared (clean ones count as health)."""
    issue_lags: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """(record index, how much later than its peers' median it issued, clocks as read) of
    a collective whose traffic is normal: judged against the rank's own history
    (:class:`.late_baselines.LateBaselines`), which cancels its clock offset."""
    arrivals: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """The same issue lags for every complete collective, slow traffic or not: an issue
    comes before the operator's traffic, so its own slowness cannot move it (the
    consistent-latest test, :mod:`.late_stragglers`)."""


@dataclasses.dataclass
class OpView:
    """One closed operator: its ranks' records in rank order, plus per-rank context."""

    comm_id: str
    seq: int
    kind: str
    members: dict[int, str]
    recs: list[OpMetrics]
    endpoints: list[str]
    peer_eps: list[tuple[str, ...]]
    stalled: list[bool]
    """Per record: incomplete and without progress for long enough to be a stall."""
    endpoint_of: Callable[[int], str] | None = None
    """The endpoint of any member rank (for records that name their peers one by one)."""
    egress_busy: Callable[[int], bool] | None = None
    """Per record index: whether a record of another kind shared its NIC meanwhile."""

    def col(self, name: str) -> np.ndarray:
        return np.array([getattr(r, name) for r in self.recs], dtype=np.float64)

    @property
    def missing(self) -> list[int]:
        """Member ranks with no record. Point-to-point operators only have a record on
        the sending side (the receiver sends no data), so they never miss anyone."""
        if self.kind in P2P:
            return []
        present = {r.rank for r in self.recs}
        return sorted(r for r in self.members if r not in present)


def _finding(view: OpView, i: int, kind: str, metric: str, value: float, ref: float) -> Finding:
    r = view.recs[i]
    return Finding(kind, view.comm_id, view.seq, r.rank, r.node, view.endpoints[i], float(value), float(ref),
                   metric, r.start_ns, r.end_ns, view.peer_eps[i], r.flows, r.epoch_ns)


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
                    out.findings.append(_finding(view, int(i), STALL, "sent_fraction", frac[i],
                                                 median(np.delete(frac, i)) if n > 1 else 1.0))
        return out
    out.judged = list(range(n))
    if view.kind == GROUPED:
        _judge_rate(view, p, act_ref, out, burst)
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


def rate_bounds(r: OpMetrics) -> tuple[float, float]:
    """(lowest, highest) rate (bytes/ns) a record's NIC may have sent at while active: its
    ACT counts active epochs, so the time it stands for is known to an epoch either way
    (from two epochs on; a one-epoch record's highest is taken at one epoch)."""
    if r.act_ns <= 0 or r.volume_bytes <= 0:
        return 0.0, 0.0
    e = float(r.epoch_ns)
    return r.volume_bytes / (r.act_ns + e), r.volume_bytes / max(r.act_ns - e, e)


def _link(view: OpView, i: int, dst: str, slow: bool, f: Finding | None) -> LinkObs:
    lo, hi = rate_bounds(view.recs[i])
    return LinkObs(view.endpoints[i], dst, slow, f, view.recs[i].end_ns, lo, hi, len(view.peer_eps[i]) > 1)


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
    # a consistent straggler's operator is slow as any other: the records as busy as it
    # (the one sending into its NIC, within ``act_top_frac``) with it
    near = min((act[i] for i in stragglers), default=float("inf"))
    near -= max(epoch, p.act_top_frac * near)
    slow = [a >= near or (a >= bound and (len(view.peer_eps[i]) < 2
                                          or (a > relay_max if relay_max is not None else recs[i].flows < 2)))
            for i, a in enumerate(act)]
    resent = [v >= 1.0 + p.vol_excess for v in vol]
    slow_op = any(slow) or any(resent) or bool(capped)
    for i in range(len(act)):
        timed = slow[i] and act[i] >= top_from
        blamed = timed or resent[i] or i in capped
        f = None
        if resent[i]:
            f = _finding(view, i, ACT, "volume_ratio", vol[i], 1.0)
        elif timed:
            f = _finding(view, i, ACT, "act_ns", act[i], ref)
            if act[i] >= near:
                f.consistent = True
        elif blamed:
            f = _finding(view, i, ACT, CEILING, *capped[i])
        if not slow_op or blamed:
            for d in view.peer_eps[i]:
                out.links.append(_link(view, i, d, blamed, f))
            if blamed:
                out.findings.append(f)  # type: ignore[arg-type]


def _judge_capped(view: OpView, out: Judgement, capped: dict[int, tuple[float, float]]) -> None:
    """Capped ceilings alone, for an operator whose ACT says nothing (no reference yet):
    only their links are observed, as with resent bytes."""
    for i, (top, base) in capped.items():
        f = _finding(view, i, ACT, CEILING, top, base)
        for d in view.peer_eps[i]:
            out.links.append(_link(view, i, d, True, f))
        out.findings.append(f)


def _judge_resent(view: OpView, p: LocalizeParams, out: Judgement) -> None:
    """Resent bytes alone, for an operator whose ACT says nothing (no reference yet): bytes
    counted are bytes, whatever the epoch, and go-back-N resends whole windows (sweep 67
    #8: 1 MB tree buckets of two 128 us epochs, a link at 1.4 % loss, every record of its
    node resending 1.5-2.7x its bytes, and nothing judged). Only the resending records'
    links are observed: a link whose timing was not compared is not seen clean."""
    for i, r in enumerate(view.recs):
        if r.expected_bytes > 0 and r.volume_bytes >= (1.0 + p.vol_excess) * r.expected_bytes:
            f = _finding(view, i, ACT, "volume_ratio", r.volume_bytes / r.expected_bytes, 1.0)
            for d in view.peer_eps[i]:
                out.links.append(_link(view, i, d, True, f))
            out.findings.append(f)


def _judge_rate(view: OpView, p: LocalizeParams, rate_ref: float | None, out: Judgement,
                burst: Callable[[int], float | None] | None = None) -> None:
    """``rate_ref``: the job-wide median rank-level rate of grouped operators of this size.
    A rank at a normal rate (vs that reference and its peers) marks its links clean; one
    below it says nothing about *which* of its links is slow (see ``rate_blame``). Records
    that carry per-peer figures are judged link by link instead (:func:`_judge_peer_rates`)."""
    rate = view.col("active_rate")
    if rate.size < p.min_ranks:
        return
    if _judge_peer_rates(view, p, out, burst):
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
            f = _finding(view, i, ACT, "volume_ratio", vol[i], 1.0)
        elif blamed:
            f = _finding(view, i, ACT, "active_rate", rate[i], loo[i])
        for d in view.peer_eps[i]:
            out.links.append(_link(view, i, d, blamed, f))
        if f is not None:
            out.findings.append(f)


def _judge_peer_rates(view: OpView, p: LocalizeParams, out: Judgement,
                      burst: Callable[[int], float | None] | None = None) -> bool:
    """Grouped P2P with per-peer figures on every record, judged link by link. An
    all-to-all ends together on every rank (each sender's last flow is the one into the
    slowest receiver), so rank-level figures cannot say which NIC is slow; per peer they
    can. A link's rate is bytes / time from its sender's first byte to its last byte to
    that peer (one clock), taken an epoch shorter (the quantisation bound), against the
    operator's median link. A NIC that lost capacity is slow both ways: more than half of
    its links out and of its links in are below ``rate_ratio`` of the operator's median,
    while every other endpoint has one slow link each way (into and out of it). A receiver
    whose downlink also carries another communicator's traffic (a pipeline stage's
    activations) is slow only inward; one whose NIC sent records of another kind meanwhile
    (its own clock) is not taken as slow out: its egress was shared. A link is
    slow when its own rate is below the bar and an end of it is slow both ways; the link
    rules then find the node on all of them. Returns False (nothing judged) when a
    record lacks the figures."""
    if view.endpoint_of is None or any(r.peer_ranks is None for r in view.recs):
        return False
    epoch = float(view.recs[0].epoch_ns)
    src_l: list[str] = []
    dst_l: list[str] = []
    idx: list[int] = []
    nb_l: list[float] = []
    done_l: list[float] = []
    want_l: list[float] = []
    begin_l: list[float] = []
    for i, r in enumerate(view.recs):
        me = view.endpoints[i]
        wants = r.peer_expected_bytes or [0] * len(r.peer_ranks)  # type: ignore[arg-type]
        begins = r.peer_start_ns or [-1] * len(r.peer_ranks)  # type: ignore[arg-type]
        for pr, t, b, w, t0 in zip(r.peer_ranks, r.peer_done_ns, r.peer_bytes, wants, begins,  # type: ignore[arg-type]
                                   strict=True):
            dst = view.endpoint_of(pr)
            if t <= 0 or b <= 0 or dst.split("/", 1)[0] in (r.node, "?"):
                continue  # no wire between them (or the peer's node is not known yet)
            src_l.append(me)
            dst_l.append(dst)
            idx.append(i)
            nb_l.append(float(b))
            done_l.append(float(t))
            want_l.append(float(w))
            begin_l.append(float(t0))
    if len(nb_l) < p.min_ranks:
        return False
    nb = np.array(nb_l)
    done = np.array(done_l)
    want = np.array(want_l)
    point = nb / done
    ref = median(point)
    if ref <= 0:
        return False
    bar = p.rate_ratio * ref
    hi = nb / np.maximum(done - epoch, epoch)
    busy = {view.endpoints[i] for i in set(idx) if view.egress_busy is not None and view.egress_busy(i)}
    # A capped NIC is active through its whole record; a starved host posts late and leaves
    # it idle between posts (sweep 61 #3: a host at a third of its CPU, its all-to-all
    # records active 0.76-0.97 of their span, its links slow both ways, named network-slow;
    # every NIC-capped or lossy culprit seen, 1.0): idle epochs are not the NIC's capacity.
    idle = {view.endpoints[i] for i in set(idx)
            if view.recs[i].act_ns < view.recs[i].duration_ns - view.recs[i].epoch_ns}
    # A link into a receiver that posted its receive late is slow by the wait, not by the
    # wire, and says nothing of the receiver's downlink (sweep 157 #11: a GPU at x1.27, its
    # rank 0.35-1.1 ms late into 4-rank all-to-alls, every link into it "slow", and its own
    # sends - all at once, sharing its NIC three ways where its peers had shared theirs two
    # ways meanwhile - below the operator's median: named network-slow).
    waited = _waited_for_receiver(idx, np.array(begin_l), done, idle, src_l)
    slow_ends = _both_ways(src_l, dst_l, hi < bar, ~waited) - busy - idle
    if slow_ends and burst is not None:
        slow_ends -= _bursting(view, idx, slow_ends, burst)
    # bytes beyond what the operator declared for a peer were resent (go-back-N resends
    # whole windows); a lossy NIC loses both ways, so its links out and in carry them
    extra = np.where(want > 0, nb / np.maximum(want, 1.0), 1.0)
    lossy = extra >= 1.0 + p.vol_excess
    lossy_ends = _both_ways(src_l, dst_l, lossy)
    exp = view.col("expected_bytes")
    vol = np.where(exp > 0, view.col("volume_bytes") / np.maximum(exp, 1.0), 1.0)
    # network-only mode's inferred records: rank-level surplus (their peers are not known)
    resent = ({i: _finding(view, i, ACT, "volume_ratio", v, 1.0) for i, v in enumerate(vol.tolist())
               if v >= 1.0 + p.vol_excess} if p.grouped_resent else {})
    out.findings += resent.values()
    for k, i in enumerate(idx):
        f = resent.get(i)
        if f is None and lossy[k] and (src_l[k] in lossy_ends or dst_l[k] in lossy_ends):
            f = dataclasses.replace(_finding(view, i, ACT, "volume_ratio", extra[k], 1.0), peer_eps=(dst_l[k],))
            out.findings.append(f)
        elif f is None and hi[k] < bar and (src_l[k] in slow_ends or dst_l[k] in slow_ends):
            f = dataclasses.replace(_finding(view, i, ACT, "peer_rate", point[k], ref), peer_eps=(dst_l[k],))
            out.findings.append(f)
        elif f is None and (point[k] < bar or lossy[k]):
            continue  # a slow or lossy link at an end that is not so both ways: says nothing
        out.links.append(_link(view, i, dst_l[k], f is not None, f))
    return True


def _bursting(view: OpView, idx: list[int], ends: set[str], burst: Callable[[int], float | None]) -> set[str]:
    """Of ``ends`` (slow both ways), those whose NIC sent in bursts, not held to a rate
    (``burst``: :meth:`.ceilings.Ceilings.slow_burst` above 1). A NIC that lost capacity
    runs flat at its cap through its slow records; a host that posts late (starved of
    CPU) leaves its NIC idle between posts and sends each at line rate (sweep 199 #12: a
    host at 23 % of its CPU under MoE, its links 0.49-0.78 of the operator's median rate
    both ways, its NIC busy in every 64 us epoch yet its busiest epochs 1.5-2.8x its mean
    one; named network-slow). Records without the figure (before op-metrics v3) keep the
    finding."""
    out: set[str] = set()
    for i in set(idx):
        e = view.endpoints[i]
        if e in ends:
            got = burst(i)
            if got is not None and got > 1.0:
                out.add(e)
    return out


def _waited_for_receiver(idx: list[int], begin: np.ndarray, done: np.ndarray, idle: set[str],
                         src: list[str]) -> np.ndarray:
    """Per link, whether its flow waited for its receiver to post: a flow starts when its
    receiver has posted the receive, and a sender's flows to receivers on time start
    together, so one that began only once half the sender's other flows had ended waited
    (its sender's clock alone). A capped receiver's flow starts with the others and lasts.
    Records without first-byte figures (``begin`` < 0) say it by their sender idling
    within its record (nothing to send meanwhile: a capped receiver keeps it busy)."""
    out = np.zeros(begin.size, np.bool_)
    ix = np.array(idx)
    for i in set(idx):
        ks = np.flatnonzero(ix == i)
        if begin[ks[0]] < 0:
            out[ks] = src[ks[0]] in idle
        elif ks.size > 1:
            out[ks] = begin[ks] >= leave_one_out_medians(done[ks])
    return out


def _both_ways(src: list[str], dst: list[str], flag: np.ndarray, inward: np.ndarray | None = None) -> set[str]:
    """Endpoints more than half of whose links out, and more than half of whose links in,
    are flagged. A faulty NIC's links are all flagged; every other endpoint has one link
    each way with it, at most half of its links from three ranks on. ``inward``: the links
    that count for their receiver (default all); an endpoint with none counted is not
    slow inward."""
    def shares(ends: list[str], use: np.ndarray) -> dict[str, float]:
        keys, inv = np.unique(np.array(ends), return_inverse=True)
        n = np.bincount(inv, weights=use.astype(np.float64), minlength=keys.size)
        hit = np.bincount(inv, weights=(flag & use).astype(np.float64), minlength=keys.size)
        return {k: h / c for k, h, c in zip(keys.tolist(), hit.tolist(), n.tolist(), strict=True) if c > 0}
    every = np.ones(flag.size, np.bool_)
    out_s, in_s = shares(src, every), shares(dst, every if inward is None else inward)
    return {e for e, x in out_s.items() if x > 0.5 and in_s.get(e, 0.0) > 0.5}


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
            out.findings.append(_finding(view, i, LATE, "issue_to_end_ns", span[i], ref))
        elif collective and issue_lag[i] >= p.late_min_ns + p.clock_skew_ns \
                and issue_lag[i] >= p.late_ratio * max(ref, 0.0):
            # A rank starved of CPU is slow at its own communication too: its end comes late
            # and its span grows by part of its lateness (lab, CPU quota). Its issue came
            # late all the same, by a lag read across clocks: one skew bound more.
            out.findings.append(_finding(view, i, LATE, ISSUE_LAG, issue_lag[i], 0.0))
    if collective:
        out.issue_lags = list(enumerate(issue_lag.tolist()))
