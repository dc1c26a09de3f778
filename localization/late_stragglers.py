"""A rank that arrives last at its collective step after step: a compute straggler shown
by consistency rather than by the size of one lateness.

The per-operator lateness rules ask a rank to rise above its own baseline by six robust
sigmas of the job's healthy spread, in most operators of a window. Where healthy arrivals
already spread widely, a straggler is late by about that spread and no single operator
proves it: the lab's rank under a CPU quota of 0.3 core (4 ranks sharing 2 cores, whose
healthy issue lags stray by +-40 ms) made the job's steps 50 % slower and issued 30-90 ms
after its peers in 8 of the 9 steps after the onset, never by six sigmas.

Consistency is the stronger evidence, as for slow ACT (:mod:`.stragglers`), with one
difference: the trial is the step, not the operator. Gradient buckets are issued as the
backward pass reaches them, so a rank held up once in a step is late into every bucket
after it: in the lab's healthy runs the latest rank stayed the same for a step's three
buckets and changed from step to step, and in the simulator a rank's lag drifts over
consecutive buckets. Steps are told apart by the communicator's own issue intervals: those
between steps (forward pass, optimizer) and those between the buckets of one step form two
groups (:func:`step_split`); an operator issued after an interval of the first kind opens a
step. The step's latest arrival is the rank whose rises (issue lag above its own baseline,
:class:`.late_baselines.LateBaselines`: clock offsets and a rank's constant place in the
job cancel) summed over the step are strictly the largest, and whose lateness the network
did not explain in some operator of the step (the compute-gap veto,
:func:`.rules.late.late_explained`: a rank behind a slow link issues late after a normal
gap). With ranks alike each is the latest of a step 1/n of the time; a rank that is the
latest in as many of the last ``late_straggler_steps`` steps as keeps the binomial tail,
summed over the n ranks, below ``straggler_alpha`` is a consistent late straggler of that
communicator (:func:`.stragglers.consistent_count`; 4 to 8 ranks, 8 steps: 8 to 6 of them),
and so is one the latest in as many of every step kept (up to ``LONG_WINDOWS`` x 8: 12 to 9
of 16), where a step or two that noise gave another rank leaves room.

A step counts only when the latest arrival's largest rise in it reaches one sigma of the
job's healthy spread (a lateness healthy noise gives one arrival in six), an epoch's
quantisation (``late_floor_epochs``) and ``late_step_frac`` of the step period: ranks are
not alike to the last millisecond (a pipeline stage's first rank, a rank behind a congested
path), and a consistent lag of that size costs the job nothing worth draining a node for.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import numpy as np

from pulse.records import OpMetrics

from .finding import Finding, lateness
from .late_baselines import LateBaselines
from .params import LocalizeParams
from .robust import median
from .stragglers import consistent_count

STEP_HISTORY = 64
"""Issue intervals of a communicator kept to tell its steps apart (several steps' worth)."""
STEP_MIN = 16
"""...needed before the test starts: a few steps."""
STEP_RATIO = 4.0
"""Intervals between steps and inside them form two groups this far apart (the lab: ~10
ms between a step's buckets, 120-230 ms between steps; the simulator's data-parallel
rings: 3 ms and ~170 ms); closer, every operator is its own step."""


def step_split(iv: np.ndarray) -> tuple[float, float]:
    """(boundary, period) of a communicator's issue intervals: an interval above the
    boundary opens a step, and the period is the median of those intervals. The two groups
    are the exact 1-D two-means split of the log intervals; when their centres are less
    than ``STEP_RATIO`` apart, every operator opens a step (boundary 0)."""
    x = np.sort(np.log(np.maximum(iv, 1.0)))
    n = x.size
    c, c2 = np.cumsum(x), np.cumsum(x * x)
    k = np.arange(1, n)
    left, left2 = c[:-1], c2[:-1]
    right, right2 = c[-1] - left, c2[-1] - left2
    sse = left2 - left**2 / k + right2 - right**2 / (n - k)
    j = int(np.argmin(sse))
    lo, hi = left[j] / (j + 1), right[j] / (n - j - 1)
    if hi - lo < math.log(STEP_RATIO):
        return 0.0, float(np.median(iv))
    boundary = math.exp((lo + hi) / 2)
    return boundary, float(np.median(iv[iv > boundary]))


LONG_WINDOWS = 2
"""The longer window of the consistency test, in ``late_straggler_steps``: with three or four
ranks every step of the short window must be the straggler's (a chance of 1/4 per step
leaves no room at 1e-3), so one step that healthy noise or the fault's own rhythm gave to
another rank hides it for as long as that step stays in the window - the lab's rank at 0.18
of a core the latest of 7 of the 8 last steps, 8 of the 9 it was judged in, and missed. Over
every step kept (up to twice as many) the tail leaves room for such steps (8 of 9, 12 of
16 at four ranks; 9 of 16 at eight). Each window is tested at ``straggler_alpha``; nested,
the chance that either passes by luck stays under twice that."""


class _Step:
    __slots__ = ("anyway", "best", "rises", "unexplained")

    def __init__(self) -> None:
        self.anyway: set[int] = set()
        """Ranks late into some operator of the step by their own compute gap, by a rise
        of at least a sigma and the floor, whatever it cost the step."""
        self.rises: dict[int, float] = {}
        """rank -> its rises summed over the step's operators."""
        self.best: dict[int, Finding] = {}
        """rank -> its finding in the operator where it rose most."""
        self.unexplained: set[int] = set()
        """Ranks late into some operator of the step by their own compute gap."""


class _Steps:
    __slots__ = ("intervals", "last", "split", "stale")

    def __init__(self) -> None:
        self.last: float | None = None
        self.intervals: deque[float] = deque(maxlen=STEP_HISTORY)
        self.split = (0.0, 0.0)
        self.stale = STEP_MIN
        """New intervals until the split is computed again (every eighth: it moves slowly)."""

    def opens(self, t: float) -> bool | None:
        """Whether an operator issued at ``t`` (its ranks' median issue) opens a step;
        None while too few intervals are known."""
        last, self.last = self.last, t
        if last is None:
            return None
        self.intervals.append(t - last)
        self.stale -= 1
        if len(self.intervals) < STEP_MIN:
            return None
        if self.stale <= 0:
            self.split = step_split(np.fromiter(self.intervals, np.float64, len(self.intervals)))
            self.stale = 8
        return t - last > self.split[0]


class LateStragglers:
    """Per communicator, the latest arrival of each of its last ``late_straggler_steps``
    steps, and the rank (if any) that is consistently the latest."""

    def __init__(self, p: LocalizeParams, spread: LateBaselines) -> None:
        self.p = p
        self.spread = spread
        self._steps: dict[str, _Steps] = {}
        self._step: dict[str, _Step] = {}
        self.step_no: dict[str, int] = {}
        """comm -> how many steps of it opened so far (the step its latest operator is in),
        once its steps can be told apart."""
        self._wins: dict[str, deque[tuple[int, Finding | None]]] = {}
        self._nranks: dict[str, int] = {}
        self._nodes: dict[str, frozenset[str]] = {}
        self._rank_node: dict[tuple[str, int], str] = {}
        self._shape: dict[str, tuple[int, bool]] = {}
        self._wins_any: dict[str, deque[int]] = {}
        self.latest: dict[str, str] = {}
        """comm -> the node consistently the latest of its steps by its own doing, however
        little that cost the step (support for a node late by the full threshold in its
        other communicators: :func:`.rules.late.late_hypotheses`)."""
        self.consistent: dict[str, tuple[str, list[Finding]]] = {}
        """comm -> (node, the findings of the steps it was the latest in) while one of its
        ranks is consistently the latest."""
        self.judged: dict[str, set[str]] = {}
        """node -> its communicators whose window of steps is full and can show a
        consistent straggler at all (enough ranks for the binomial tail)."""

    def observe(self, comm: str, ordered: list[OpMetrics], rises: dict[int, float],
                finding: Callable[[int], Finding], explained: Callable[[Finding], bool]) -> None:
        """Record one closed collective of ``comm``: ``rises`` maps record index to its
        rank's rise above its baseline (ranks with a baseline; none where the operator's
        lateness cannot be judged - it still counts for the steps); ``finding`` makes the
        late finding of a record index, ``explained`` says whether the compute-gap veto
        explains one. The step in progress counts as it stands, so a straggler is seen at
        the operator that shows it, not at the next step."""
        issues = [r.t_host_ns for r in ordered if r.t_host_ns is not None]
        if len(issues) < len(ordered):
            return
        opens = self._steps.setdefault(comm, _Steps()).opens(median(issues))
        if opens is None:
            self.step_no.pop(comm, None)
            return
        self.step_no[comm] = self.step_no.get(comm, 0) + bool(opens)
        keep = LONG_WINDOWS * self.p.late_straggler_steps
        wins = self._wins.setdefault(comm, deque(maxlen=keep))
        wins_any = self._wins_any.setdefault(comm, deque(maxlen=keep))
        if opens:
            b = self._step.pop(comm, None)
            if b is not None and len(b.rises) >= 2:
                wins.append(self._winner(b))
                wins_any.append(self._latest(b))
        b = self._step.setdefault(comm, _Step())
        if len(rises) >= 2:
            self._nranks[comm] = len(ordered)
            self._nodes[comm] = frozenset(r.node for r in ordered)
            for r in ordered:
                self._rank_node[(comm, r.rank)] = r.node
            shape = self._shape[comm] = LateBaselines.shape(ordered[0])
            epoch = ordered[0].epoch_ns
            # the cheap parts of the floor first: the spread's sigma costs a median or two
            floor = self.p.late_floor_epochs * epoch
            low = max(floor, self.p.late_step_frac * self._steps[comm].split[1])
            sigma: dict[str, float | None] = {}
            for j, rise in rises.items():
                r = ordered[j]
                b.rises[r.rank] = b.rises.get(r.rank, 0.0) + rise
                if rise < floor:
                    continue
                if r.node not in sigma:
                    th = self.spread.threshold(shape, epoch, r.node)
                    sigma[r.node] = None if th is None else th / self.p.late_spread_k
                sg = sigma[r.node]
                if sg is None or rise < sg:
                    continue
                if rise < low:
                    if r.rank not in b.anyway and not explained(finding(j)):
                        b.anyway.add(r.rank)
                    continue
                f = finding(j)
                if r.rank not in b.best or lateness(b.best[r.rank]) < lateness(f):
                    b.best[r.rank] = f
                if r.rank not in b.unexplained and not explained(f):
                    b.unexplained.add(r.rank)
                    b.anyway.add(r.rank)
        current = [self._winner(b)] if len(b.rises) >= 2 else []
        self._judge(comm, [*wins, *current][-keep:])
        now = [self._latest(b)] if len(b.rises) >= 2 else []
        self._judge_latest(comm, [*wins_any, *now][-keep:])

    @staticmethod
    def _winner(b: _Step) -> tuple[int, Finding | None]:
        """The step's latest arrival by its own doing and its finding, or (-1, None): none
        clear. Ranks whose lateness the network explained in every operator are out of the
        contest: the ring successor of a starved rank receives its last chunks late and can
        arrive later than the starved rank itself (lab, 5 ranks, one at 0.22 of a core: its
        successor's summed rises the largest in 9 of 10 steps, every one of them a wait)."""
        rank = _top(b, b.unexplained)
        return (rank, b.best[rank]) if rank >= 0 else (-1, None)

    @staticmethod
    def _latest(b: _Step) -> int:
        """The step's latest arrival by its own doing, whatever its lateness cost (-1: none clear)."""
        return _top(b, b.anyway)

    def _tests(self, comm: str, wins: int) -> list[tuple[int, int]]:
        """(steps, count) per window to test: the last ``late_straggler_steps`` steps, and
        every step kept (up to ``LONG_WINDOWS`` times as many), each with the count of them
        one rank must be the latest in (none while too few steps or ranks are known, or
        where no count is enough)."""
        n = self._nranks.get(comm, 0)
        window = self.p.late_straggler_steps
        if wins < window or n < 2:
            return []
        out = []
        for size in sorted({window, wins}):
            k = consistent_count(n, size, self.p.straggler_alpha)
            if k <= size:
                out.append((size, k))
        return out

    def _judge_latest(self, comm: str, wins: list[int]) -> None:
        self.latest.pop(comm, None)
        for size, k in self._tests(comm, len(wins)):
            last = wins[-size:]
            for rank in set(last) - {-1}:
                if last.count(rank) >= k:
                    self.latest[comm] = self._rank_node[(comm, rank)]

    def _judge(self, comm: str, wins: list[tuple[int, Finding | None]]) -> None:
        self.consistent.pop(comm, None)
        tests = self._tests(comm, len(wins))
        if not tests:
            return
        for node in self._nodes.get(comm, ()):
            self.judged.setdefault(node, set()).add(comm)
        for size, k in tests:
            last = wins[-size:]
            counts: dict[int, int] = {}
            for rank, _ in last:
                if rank >= 0:
                    counts[rank] = counts.get(rank, 0) + 1
            for rank, c in counts.items():
                if c >= k and comm not in self.consistent:
                    mine = [f for r, f in last if r == rank and f is not None]
                    self.consistent[comm] = (mine[0].node, mine)

    def nodes(self, comm_frac: float) -> dict[str, list[Finding]]:
        """node -> its findings, for nodes that are consistent late stragglers in at least
        ``comm_frac`` of their judged communicators."""
        per: dict[str, list[tuple[str, list[Finding]]]] = {}
        for comm, (node, fs) in self.consistent.items():
            per.setdefault(node, []).append((comm, fs))
        out: dict[str, list[Finding]] = {}
        for node, got in per.items():
            if len(got) >= max(1.0, comm_frac * len(self.judged.get(node, ()))):
                out[node] = [f for _, fs in got for f in fs]
        return out


def _top(b: _Step, ranks: set[int]) -> int:
    """Of ``ranks``, the one whose rises summed over the step are strictly the largest (-1: a tie, or none)."""
    own = sorted(((b.rises[rk], rk) for rk in ranks), reverse=True)
    if not own or (len(own) > 1 and own[0][0] <= own[1][0]):
        return -1
    return own[0][1]
