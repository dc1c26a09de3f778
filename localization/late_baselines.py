"""Lateness against each rank's own history: its baseline issue lag, and per communicator
shape the job's healthy spread around those baselines (the lateness threshold)."""

from __future__ import annotations

from collections import defaultdict, deque

import numpy as np

from pulse.events import GROUPED
from pulse.records import OpMetrics

from .params import LocalizeParams
from .robust import MAD_TO_SIGMA, leave_one_out_medians, mad, median


class LateBaselines:
    """Lateness against each rank's own history. A rank's issue minus its operator's median
    issue (each on its node's clock) holds its clock's offset and any lag its place in the
    job gives it: both constant, learned per rank as its offset (the median over its first
    ``late_base_ops`` operators). A rank's rise is its issue less its offset, against the
    median of its peers' issues less theirs: on one corrected timeline, so its peers'
    median is a healthy rank's whatever order their clocks put them in (read on the raw
    clocks, a straggler whose clock sits among its peers' is the median of the others for
    some of them, and moves their lags by its whole lateness: sweep 157 #11, a GPU at x1.27
    in 4-rank all-to-alls under 5 ms of skew, two of its three peers at -0.7 ms whenever it
    rose 0.7 ms, and the recent rises lifted the threshold to 4-5 ms). Whether a rise
    is late is judged against the job's own healthy spread, per communicator shape, taken
    two ways, the larger counting: how far the ranks' issue lags strayed from their
    baselines over those first operators (the period the baselines assume healthy: later,
    one straggler of a small communicator moves its peers' issue lags too, through the
    median they are measured against - lab, 4 ranks, one at a 5 % CPU quota: 25 ms before,
    47 ms after), and the recent rises of every rank (a baseline spans a few steps, whose
    buckets are late together, so it cannot show how far a healthy rank drifts from step
    to step: the dense battery job's pipeline moves a stage's issue times by ~2 ms for
    several steps)."""

    def __init__(self, p: LocalizeParams) -> None:
        self.p = p
        self._first: dict[tuple[str, int], list[float]] = {}
        self.offset: dict[tuple[str, int], float] = {}
        """(comm, rank) -> its usual issue minus its operator's median issue (ns): its
        clock's offset and its place in the job."""
        self._memo: tuple[tuple[object, ...], dict[int, float]] | None = None
        self._first_ops: dict[str, deque[dict[int, float]]] = defaultdict(
            lambda: deque(maxlen=4 * p.late_base_ops))
        """comm -> its operators' issue times by rank while some rank learns its offset."""
        self.spread: dict[tuple[int, bool], deque[float]] = defaultdict(
            lambda: deque(maxlen=p.late_spread_size))
        """communicator shape -> its ranks' rises over the operators their offsets were
        learned from (the newest ``late_spread_size``)."""
        self.rises: dict[tuple[int, bool], deque[float]] = defaultdict(
            lambda: deque(maxlen=p.late_spread_size))
        """communicator shape -> the newest rises of its ranks above their baselines."""
        self.rise_nodes: dict[tuple[int, bool], deque[frozenset[str]]] = defaultdict(
            lambda: deque(maxlen=p.late_spread_size))
        """...and per rise, the nodes of the operator it was measured in (same order)."""
        self._spread_n: dict[tuple[int, bool], int] = {}
        self._spread_sigma: dict[tuple[int, bool], tuple[int, float]] = {}

    @staticmethod
    def shape(r: OpMetrics) -> tuple[int, bool]:
        """Communicators of one size and kind (collectives, or grouped all-to-all: expert
        imbalance moves their issue times more) share a spread. Not per operator size: a
        rank's baseline spans its communicator's operators (a data-parallel step issues
        buckets of several sizes, and the baseline must be done within a few steps)."""
        return (r.nranks, r.kind == GROUPED)

    @staticmethod
    def coupled(nranks: int) -> bool:
        """Whether one late rank displaces its peers' issue lags by a share of its own
        lateness. A lag is measured against the median of the other ranks' issues: with two
        or three ranks that median is (or averages in) the late rank itself, so each peer's
        lag falls by a half or all of the lateness; from four ranks on the median of the
        others is an order statistic of healthy ranks, moved by the healthy spread at most."""
        return nranks <= 3

    def threshold(self, shape: tuple[int, bool], epoch_ns: int, node: str | None = None) -> float | None:
        """The rise that counts as late for communicators of ``shape``: ``late_spread_k``
        robust sigmas of their healthy spread, at least ``late_floor_epochs`` epochs; None
        until the spread is known. ``node``: the node whose rise is judged. In a coupled
        shape (:meth:`coupled`) its own lateness displaces its peers' rises in every
        operator it takes part in (sweep 11 #0, gpu-slow under MoE, 3 ranks: the peers at
        -0.4 ms while it rose 0.84 ms, the recent rises' sigma 0.59 ms against 0.05 ms over
        the baselines), so the recent rises it is judged against are those of operators
        without it, when the shape has enough of them."""
        dev = self.spread.get(shape)
        if dev is None or len(dev) < self.p.late_spread_min:
            return None
        n = self._spread_n.get(shape, 0)
        hit = self._spread_sigma.get(shape)
        if hit is not None and hit[0] == n:
            sigma = hit[1]
        else:  # the spread only changes when a baseline completes: its sigma is kept until then
            sigma = MAD_TO_SIGMA * mad(np.fromiter(dev, np.float64, len(dev)))
            self._spread_sigma[shape] = (n, sigma)
        rises = self.rises.get(shape)
        if rises is not None and len(rises) >= self.p.late_spread_min:
            x = np.fromiter(rises, np.float64, len(rises))
            nodes = self.rise_nodes.get(shape)
            if node is not None and nodes is not None and len(nodes) == len(x):
                without = np.fromiter((node not in ns for ns in nodes), np.bool_, len(x))
                if int(without.sum()) >= self.p.late_spread_min:
                    x = x[without]
            sigma = max(sigma, MAD_TO_SIGMA * mad(x))
        return max(self.p.late_spread_k * sigma, self.p.late_floor_epochs * epoch_ns)

    def _baseline_spread(self, comm: str, shape: tuple[int, bool], learned: list[int]) -> None:
        """The rises ``learned`` ranks (their offsets just known) had over the operators
        their offsets were learned from, measured as later ones are: the shape's healthy
        spread."""
        for t in self._first_ops.get(comm, ()):
            ranks = [r for r in t if (comm, r) in self.offset]
            if len(ranks) < 2 or not any(r in learned for r in ranks):
                continue
            u = np.array([t[r] - self.offset[(comm, r)] for r in ranks])
            dev = (u - leave_one_out_medians(u)).tolist()
            self.spread[shape].extend(d for r, d in zip(ranks, dev, strict=True) if r in learned)
        self._spread_n[shape] = self._spread_n.get(shape, 0) + len(learned)
        if not any(k[0] == comm for k in self._first):
            self._first_ops.pop(comm, None)

    def rises_of(self, comm: str, ordered: list[OpMetrics], lags: list[tuple[int, float]]) -> dict[int, float]:
        """Per record index (of ``lags``, the operator's ranks with an issue time) whose rank
        has its offset: its issue less its offset, minus the median of the same over the
        other such ranks (none below two)."""
        # asked up to three times per operator (its lateness, its step, its weak rises)
        key = (comm, ordered[0].seq, len(self.offset), tuple(r.t_host_ns for r in ordered))
        if self._memo is not None and self._memo[0] == key:
            return self._memo[1]
        known = [(i, o) for i, _ in lags if (o := self.offset.get((comm, ordered[i].rank))) is not None]
        out: dict[int, float] = {}
        if len(known) >= 2:
            u = np.array([float(ordered[i].t_host_ns) - o for i, o in known])  # type: ignore[arg-type]
            out = dict(zip([i for i, _ in known], (u - leave_one_out_medians(u)).tolist(), strict=True))
        self._memo = (key, out)
        return out

    def judge(self, comm: str, ordered: list[OpMetrics],
              lags: list[tuple[int, float]]) -> list[tuple[int, float, float]]:
        """(record index, issue lag, reference) of the ranks whose rise (:meth:`rises_of`) is
        above the threshold (read before this operator's rises join the spread), the
        reference being the lag that would have been no rise; ranks still gathering their
        offset add to it."""
        if not lags:
            return []
        shape = self.shape(ordered[0])
        # the threshold is at least late_floor_epochs epochs: below that no rise needs it
        # (it costs two medians over the spread and the recent rises)
        floor = self.p.late_floor_epochs * ordered[0].epoch_ns
        risen = self.rises_of(comm, ordered, lags)
        need = any(x >= floor for x in risen.values())
        coupled = self.coupled(shape[0])
        shared = self.threshold(shape, ordered[0].epoch_ns) if need and not coupled else None
        ths: dict[str, float | None] = {}
        rises: list[float] = []
        out: list[tuple[int, float, float]] = []
        issued = {ordered[i].rank: float(ordered[i].t_host_ns) for i, _ in lags}  # type: ignore[arg-type]
        learned: list[int] = []
        if any((comm, r) not in self.offset for r in issued):
            self._first_ops[comm].append(issued)
            mid = median(list(issued.values()))
        for i, lag in lags:
            key = (comm, ordered[i].rank)
            if key not in self.offset:
                first = self._first.setdefault(key, [])
                first.append(issued[key[1]] - mid)
                if len(first) >= self.p.late_base_ops:
                    self.offset[key] = median(first)
                    learned.append(key[1])
                    del self._first[key]
                continue
            rise = risen.get(i)
            if rise is None:
                continue
            rises.append(rise)
            th = shared
            if coupled and rise >= floor:
                node = ordered[i].node
                if node not in ths:
                    ths[node] = self.threshold(shape, ordered[0].epoch_ns, node)
                th = ths[node]
            if th is not None and rise >= th:
                out.append((i, lag, lag - rise))
        if learned:
            self._baseline_spread(comm, shape, learned)
        if coupled:
            self.rises[shape].extend(rises)
            nodes = frozenset(r.node for r in ordered)
            self.rise_nodes[shape].extend(nodes for _ in rises)
        elif len({ordered[i].node for i, _, _ in out}) != 1:
            # An operator one node alone was late into is not the job's healthy drift: a
            # lone straggler displaces its peers' issue lags in the operators it holds up
            # (sweep 131 #10, a GPU at x1.30 under MoE in 6-rank all-to-alls: the peers'
            # rises went from +-0.1 ms to -0.7..+0.1 ms once it was 1 ms late, and the spread
            # of the recent rises lifted the threshold from 0.37 ms to 1.3-1.9 ms, above its
            # lateness). Where several nodes are late together (a pipeline stage drifting),
            # the operator is the job's spread.
            self.rises[shape].extend(rises)
        return out
