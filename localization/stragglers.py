"""A rank that is the clear slowest of its symmetric collective, operator after operator.

The per-operator ACT test (:func:`.observations.slow_act_bound`) needs a record to be
``act_ratio`` beyond the job's reference in each operator, a margin sized for one
operator's noise. A link that is only somewhat slower (TCP at 1-2 % loss: its sender's ACT
1.2-1.3x the others', every operator) sits at that margin and is caught in some runs and not
in others (lab, loss:1:2: one run in three with 6 of 30 operators over the bound, no
verdict; the same rank was the slowest of its ring in 28 of those 30).

Consistency is the stronger evidence. In a collective where every rank moves the same
bytes to one peer (a ring), ranks are alike: their order by ACT changes from operator to
operator, each rank's place (0 the fastest, n-1 the slowest) uniform and independent of the
others', so a rank whose places summed over the communicator's last ``window_ops``
operators reach a total whose tail under that null, over the n ranks, is below
``straggler_alpha`` is no accident. Places, not only "the slowest": one operator in which a
retransmission timeout stretched another rank (lab, loss:1:2 in a fresh-clone CI run: two
~240 ms TCP RTOs) or a tie at an epoch's quantisation costs the lossy rank a place or two,
not the whole operator (counting only strict wins needed 10 of 12 at 4 ranks and held in
7 operators of that job: no verdict). Ties take their mid-place, which only pulls totals
toward the middle (conservative). The places say that a rank is slower, not by how much:
ranks are not alike to the last percent (a longer cable, a busier host), and such a rank costs the job nothing worth draining a node for. So its ACT summed
over the window must also be half the per-operator ratio beyond the summed medians of the
other ranks of the same operators (the same operators: step-to-step changes of pace
cancel). The size is judged on the window, not per operator: one operator's ACT is off by
up to an epoch of quantisation either way, which the sums average out, and a link only a
little slower (TCP at 2 % loss: 1.06-1.55x its ring's median, 1.18x over 30 operators)
cleared the margin with an epoch either way in half its operators (lab, loss:1:2: a miss
in one fresh run in three). Such a rank's records are slow in the operators it is the
slowest of (ties included), while it stays that way; the link rules decide, as for any
slow record, which end or path it is.

An operator that another rank entered late says nothing of a rank's own pace: a ring's
ranks upstream of a late one cannot hand it their chunks, and under flow control they send
in stops and starts until it joins (sweep 257 #23: node-06's pipeline sends slowed by its
NIC, its DP ring ranks 4-7 ms late into every operator of 0.8 ms, and node-04, two hops
upstream of it, the slowest of that healthy ring at 9-12 epochs against 7-9, operator after
operator). An operator counts for a rank only if no other rank entered it later than this
rank did by more than this rank's ACT (had it been, the rank necessarily waited in the
middle of its own transfer) and than two sigmas of the job's healthy spread of entries (a
job whose ranks' entries jitter by more than an operator lasts - the lab's 7 processes on
two cores, +-20 ms against 15 ms of ACT - would otherwise have most operators of its
lossy rank's window left out: two 0.7 %-loss runs missed). Entries are compared by their
rises above the ranks' own baselines (:meth:`.late_baselines.LateBaselines.rises_of`),
which no clock offset enters, and the test is run over the operators left
(:meth:`Stragglers.rises`).
"""

from __future__ import annotations

import math
from collections import deque
from functools import lru_cache

import numpy as np

from pulse.events import GROUPED, P2P
from pulse.records import OpMetrics

from .params import LocalizeParams


@lru_cache(maxsize=256)
def tail_count(q: float, window: int, alpha: float) -> int:
    """The fewest of ``window`` independent trials, each a success with chance ``q``, whose
    successes reach a count with a binomial tail at most ``alpha`` (``window + 1``: no
    count is rare enough)."""
    for k in range(1, window + 1):
        tail = sum(math.comb(window, j) * q**j * (1 - q) ** (window - j) for j in range(k, window + 1))
        if tail <= alpha:
            return k
    return window + 1


@lru_cache(maxsize=256)
def place_total(n: int, window: int, alpha: float) -> int:
    """The smallest total, in half places (a tie's mid-place is a whole number of them), of
    one rank's places among ``n`` over ``window`` operators whose chance, for any of the n
    exchangeable ranks, is at most ``alpha`` (``2 * window * (n - 1) + 1``: none is)."""
    top = 2 * window * (n - 1)
    if n < 2:
        return top + 1
    dist = np.zeros(top + 1)
    dist[0] = 1.0
    one = np.zeros(2 * (n - 1) + 1)
    one[::2] = 1.0 / n  # untied places 0, 2, ..., 2(n-1) half places
    for _ in range(window):
        dist = np.convolve(dist, one)[: top + 1]
    tail = np.cumsum(dist[::-1])[::-1]
    ok = np.nonzero(tail <= alpha / n)[0]
    return int(ok[0]) if ok.size else top + 1


def half_places(act: np.ndarray) -> np.ndarray:
    """Each record's place by ACT among its operator's, in half places: twice the records
    strictly faster plus the others tied with it (0 the fastest, 2(n-1) the slowest; a tie
    takes the mean of the places it spans)."""
    less = (act[None, :] < act[:, None]).sum(axis=1)
    same = (act[None, :] == act[:, None]).sum(axis=1) - 1
    return 2 * less + same


def consistent_count(n: int, window: int, alpha: float) -> int:
    """The fewest operators of ``window`` in which one of ``n`` exchangeable ranks must be
    the slowest for the chance that any rank gets there by luck to stay below ``alpha``
    (``window + 1``: no count is enough)."""
    return tail_count(1.0 / n, window, alpha / n)


def symmetric(ordered: list[OpMetrics], peers: list[int], p: LocalizeParams) -> bool:
    """Every rank moved the same bytes to one peer over as many flows: its ranks are alike
    (a ring, on one channel or several; a tree's relays and leaves, P2P and grouped
    operators are not). ``peers``: per record, how many peers its rank has send flows to;
    a record that moved one flow sent to one of them whatever that says (Gloo binds a flow
    to every peer)."""
    r0 = ordered[0]
    return (len(ordered) >= p.min_ranks and r0.kind not in P2P and r0.kind != GROUPED
            and all(r.complete and r.act_ns > 0 and r.flows == r0.flows and r.expected_bytes == r0.expected_bytes
                    and (r.flows == 1 or n == 1) for r, n in zip(ordered, peers, strict=True)))


def _waited(rank: int, act: float, rises: dict[int, float], noise: float) -> bool:
    """Whether another rank entered the operator later than ``rank`` by more than its ACT
    and than the job's ``noise``."""
    own = rises.get(rank)
    return own is not None and any(x - own > max(act, noise) for k, x in rises.items() if k != rank)


class _Op:
    """One symmetric operator of a window: its ranks, ACTs and half places; the ranks' entry
    rises into it and the job's noise on them, told once it is judged (:meth:`Stragglers.rises`)."""

    __slots__ = ("act", "noise", "places", "ranks", "rises")

    def __init__(self, ranks: tuple[int, ...], act: np.ndarray) -> None:
        self.ranks, self.act, self.places = ranks, act, half_places(act)
        self.rises: dict[int, float] = {}
        self.noise = 0.0


class Stragglers:
    """Per communicator, each rank's place in each of its last ``window_ops`` symmetric
    operators, the operators' ACTs for the size of its lead, and the ranks' entry rises into
    each (:meth:`rises`)."""

    def __init__(self, p: LocalizeParams) -> None:
        self.p = p
        self.ratio = 1.0 + (p.act_ratio - 1.0) / 2.0
        self._last: dict[str, deque[_Op]] = {}

    def observe(self, comm: str, ordered: list[OpMetrics], peers: list[int]) -> frozenset[int]:
        """Record one closed operator of ``comm`` (its records in rank order, and how many
        peers each rank sends to: :func:`symmetric`); the indices of the records that are
        consistent stragglers in it (the slowest of it, ties included)."""
        if not symmetric(ordered, peers, self.p):
            return frozenset()
        act = np.fromiter((r.act_ns for r in ordered), np.float64, len(ordered))
        ranks = tuple(r.rank for r in ordered)
        last = self._last.setdefault(comm, deque(maxlen=self.p.window_ops))
        last.append(_Op(ranks, act))
        if len(last) < last.maxlen:  # type: ignore[operator]
            return frozenset()
        epoch = float(ordered[0].epoch_ns)
        out = []
        for i in np.nonzero(act == act.max())[0]:
            rank = ranks[int(i)]
            held = []
            for op in last:
                if rank in op.ranks:
                    j = op.ranks.index(rank)
                    if not _waited(rank, float(op.act[j]), op.rises, op.noise):
                        held.append((j, op.act, op.places))
            need = place_total(len(ordered), len(held), self.p.straggler_alpha)
            if sum(float(h[j]) for j, _, h in held) < need:
                continue
            own = sum(float(a[j]) for j, a, _ in held)
            others = sum(float(np.median(np.delete(a, j))) for j, a, _ in held)
            if own - epoch >= self.ratio * (others + epoch):
                out.append(int(i))
        return frozenset(out)

    def rises(self, comm: str, ranks: tuple[int, ...], rises: dict[int, float], noise: float = 0.0) -> None:
        """The ranks' entry rises (rank -> ns above its baseline, relative to the others) into
        the operator of ``comm`` last observed, if it was one of this test's (``ranks``: its
        records' ranks, to make sure), and how far a healthy rank's rise strays (``noise``)."""
        last = self._last.get(comm)
        if rises and last and last[-1].ranks == ranks:
            last[-1].rises.update(rises)
            last[-1].noise = noise
