"""All-to-all (grouped P2P) records with per-peer figures, judged link by link: which
NIC is slow both ways, which links waited for a late receiver, which carried resent
bytes, and which slow end sent in bursts rather than at a held rate."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .finding import ACT, PEER_RATE_IN
from .opview import Judgement, OpView, finding_of, link_of
from .params import LocalizeParams
from .robust import leave_one_out_medians, median


def judge_peer_rates(view: OpView, p: LocalizeParams, out: Judgement,
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
    # a flow's own rate, from its first byte: a receiver that posted late starts its flows
    # late, not slow (a cold expert's receives in a healthy all-to-all: from the record's
    # start, its links at 0.6 of the others', from their own, alike); unknown without the
    # first bytes, and no receiver is then judged inward
    begin = np.array(begin_l)
    span = np.maximum(done - begin, epoch)
    own = nb / span
    own_ref = median(own)
    own_slow = nb / np.maximum(span - epoch, epoch) < p.rate_ratio * own_ref
    inward = (_starved_receivers(dst_l, own_slow, ~waited, own, p.rate_ratio) - slow_ends
              if (begin >= 0).all() else set())
    if (begin >= 0).all():
        ends = np.array([view.recs[i].end_ns for i in idx], np.int64)
        # a flow that waited for its receiver to post, or carried resent bytes, times the
        # receiver or the loss, not the downlink
        spoiled = waited | (want > 0) & (nb > want * (1.0 + p.vol_excess))
        out.intake += _intake(dst_l, nb, span, ends, spoiled, inward | slow_ends, epoch, p.rate_ratio)
    # bytes beyond what the operator declared for a peer were resent (go-back-N resends
    # whole windows); a lossy NIC loses both ways, so its links out and in carry them
    extra = np.where(want > 0, nb / np.maximum(want, 1.0), 1.0)
    lossy = extra >= 1.0 + p.vol_excess
    lossy_ends = _both_ways(src_l, dst_l, lossy)
    exp = view.col("expected_bytes")
    vol = np.where(exp > 0, view.col("volume_bytes") / np.maximum(exp, 1.0), 1.0)
    # network-only mode's inferred records: rank-level surplus (their peers are not known)
    resent = ({i: finding_of(view, i, ACT, "volume_ratio", v, 1.0) for i, v in enumerate(vol.tolist())
               if v >= 1.0 + p.vol_excess} if p.grouped_resent else {})
    out.findings += resent.values()
    for k, i in enumerate(idx):
        f = resent.get(i)
        if f is None and lossy[k] and (src_l[k] in lossy_ends or dst_l[k] in lossy_ends):
            f = dataclasses.replace(finding_of(view, i, ACT, "volume_ratio", extra[k], 1.0), peer_eps=(dst_l[k],))
            out.findings.append(f)
        elif f is None and hi[k] < bar and (src_l[k] in slow_ends or dst_l[k] in slow_ends):
            f = dataclasses.replace(finding_of(view, i, ACT, "peer_rate", point[k], ref), peer_eps=(dst_l[k],))
            out.findings.append(f)
        elif f is None and dst_l[k] in inward and own_slow[k] and not waited[k]:
            f = dataclasses.replace(finding_of(view, i, ACT, PEER_RATE_IN, own[k], own_ref), peer_eps=(dst_l[k],))
            out.findings.append(f)
        elif f is None and (point[k] < bar or lossy[k]):
            continue  # a slow or lossy link at an end that is not so both ways: says nothing
        out.links.append(link_of(view, i, dst_l[k], f is not None, f))
    return True


def _intake(dst: list[str], nb: np.ndarray, span: np.ndarray, ends: np.ndarray, spoiled: np.ndarray,
            skip: set[str], epoch: float, ratio: float) -> list[tuple[str, int, float]]:
    """Per receiver none of whose flows in was ``spoiled`` (waiting for it to post, resent:
    they time the receiver or the loss): (it, the last end of the records sending into it,
    what its downlink surely carried - the bytes of all its flows in over the longest of
    them, an epoch longer, the flows of an all-to-all running together, each span on its
    sender's clock alone), or 0 where it is in ``skip`` (slow inward or both ways) or took
    in less than ``ratio`` of what the median receiver did. A downlink congested in bursts
    still passes each flow of an all-to-all near its usual pace, every link in clean, while
    all of them together come to half what the others take in (sweep 293 #2: node-03 at
    19-32 GB/s, the other three receivers at 34-53). With two receivers, one's less is the
    other's more: nothing."""
    keys, inv = np.unique(np.array(dst), return_inverse=True)
    if keys.size < 3:
        return []
    total = np.bincount(inv, weights=nb, minlength=keys.size)
    bad = np.bincount(inv, weights=spoiled.astype(np.float64), minlength=keys.size)
    longest = np.zeros(keys.size)
    np.maximum.at(longest, inv, span)
    last = np.zeros(keys.size, np.int64)
    np.maximum.at(last, inv, ends)
    rate = total / (longest + epoch)
    bar = ratio * float(np.median(rate))
    return [(k, int(e), float(r) if k not in skip and r >= bar else 0.0)
            for k, r, b, e in zip(keys.tolist(), rate.tolist(), bad.tolist(), last.tolist(), strict=True) if b == 0]


def _starved_receivers(dst: list[str], flag: np.ndarray, counted: np.ndarray, rate: np.ndarray,
                       ratio: float) -> set[str]:
    """Receivers whose downlink delivered less: more than half of their links in
    ``flag``-ged (below the bar) and ``counted`` (not waiting for it to post), and the
    rates of all their links in summed below ``ratio``
    of the median receiver's sum. A downlink congested by traffic from outside the job
    serves every sender into it a share of what the others get (sweep 229 #18: an
    all-to-all of 15 nodes, every link into node-14 at 0.40-0.52 of the links into the
    others); a receiver of more bytes (a hot expert) fills its downlink and takes in more
    than the median, however slow each of its links. Whether our own other records into
    it took the share is asked when the link rules read the evidence
    (:meth:`.alive.AlivePoints.received_own`): they may be judged after this operator."""
    if not flag.any():
        return set()
    keys, inv = np.unique(np.array(dst), return_inverse=True)
    n = np.bincount(inv, minlength=keys.size).astype(np.float64)
    hit = np.bincount(inv, weights=(flag & counted).astype(np.float64), minlength=keys.size)
    total = np.bincount(inv, weights=rate, minlength=keys.size)
    if keys.size < 3:
        return set()  # two receivers: which one delivered less is the other's more
    bar = ratio * float(np.median(total))
    return {k for k, h, c, t in zip(keys.tolist(), hit.tolist(), n.tolist(), total.tolist(), strict=True)
            if c > 0 and h > 0.5 * c and t < bar}


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
