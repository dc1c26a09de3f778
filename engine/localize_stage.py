"""The localization half of the engine, for one job: operator metrics, forwarded hook
events and data ends in (in arrival order), verdicts out.

Ranks of one operator come from different nodes, hence, in the pipeline, different
partitions consumed at different paces; offline they come from per-node segmenters that
close operators at different times. Either way the :class:`~.aligner.Aligner` puts them
back in trace-time order before the :class:`~pulse.localization.Localizer` judges them,
so what it concludes depends on the trace, not on who delivered it when.

With a time budget, a call judges released operators for about that long and keeps the
rest (in order) for the next call: a localizer behind a backlog hands out its verdicts as
it goes rather than all at the end of one long call.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Iterable

from pulse.localization import LocalizeParams, Localizer
from pulse.localization.lifecycle import IncidentTracker

from pulse.events import HookEvent
from pulse.records import DataEnd, Incident, OpMetrics, Verdict

from .aligner import Aligner

HOLD_NS = 1_000_000_000
"""Trace time an operator waits for its late ranks before it is judged without them."""
IDLE_S = 0.5
"""Wall time without any record after which everything held goes out (a live job paused
or ended; offline runs never idle, they call ``finish``)."""
JOB_IDLE_S = 60.0
"""Wall time without any operator record after which a live job is taken as ended: its open
incidents are resolved (``job-ended``), so an alert does not fire for ever after the job died
or was stopped. Longer than a checkpoint pause of most jobs' steps; offline runs never idle
(their input ends with ``finish``)."""
FORGET_S = 120.0
"""Wall time without any input after which a job's localizer (and a node's segmenter) is
dropped, a minute after ``JOB_IDLE_S`` resolved its incidents: keeping every job and node
ever seen grows a worker without bound (the soak measured 92 -> 299 MiB in 390 s as jobs
came and went). A job back after a longer pause (a checkpoint) is judged anew: it costs
the references of its first few dozen operators, not a wrong verdict."""
JUDGE_STEP = 64
"""Records per localizer call when a time budget applies (about 30 ms at 64 GPUs)."""


@dataclasses.dataclass
class Judged:
    """What judging produced: every verdict, and the incident state changes they caused."""

    verdicts: list[Verdict] = dataclasses.field(default_factory=list)
    incidents: list[Incident] = dataclasses.field(default_factory=list)

    def extend(self, other: Judged) -> None:
        self.verdicts += other.verdicts
        self.incidents += other.incidents


def take_ops(queue: collections.deque[OpMetrics], n: int | None) -> list[OpMetrics]:
    """The first ``n`` or more records of ``queue`` up to an operator's end (all when
    ``n`` is None): an operator's ranks are judged in one call, as the aligner released them."""
    if n is None or len(queue) <= n:
        out = list(queue)
        queue.clear()
        return out
    out = [queue.popleft() for _ in range(n)]
    last = (out[-1].comm_id, out[-1].seq)
    while queue and (queue[0].comm_id, queue[0].seq) == last:
        out.append(queue.popleft())
    return out


class LocalizeStage:
    """One job's aligner, localizer and incident tracker."""

    def __init__(self, job: str, params: LocalizeParams | None = None, *, hold_ns: int = HOLD_NS,
                 idle_s: float = IDLE_S, job_idle_s: float = JOB_IDLE_S) -> None:
        self.job = job
        self.localizer = Localizer(params, job=job or None)
        self.localizer.ev.expects_data_end = True  # the segment stage forwards every node's data end
        self.aligner = Aligner(hold_ns, idle_s)
        self.tracker = IncidentTracker(job)
        self.data_end = 0
        self.job_idle_s = job_idle_s
        self.last_record: float | None = None
        """Wall time of the latest operator record (None: none yet)."""
        self.backlog: collections.deque[OpMetrics] = collections.deque()
        self.metrics = 0
        self.verdicts = 0

    def add_events(self, events: Iterable[HookEvent | DataEnd], now: float = 0.0) -> None:
        """Forwarded items: hook events (membership, flows, posted receives) and data ends
        (``now``: the wall clock of a live run, 0 offline; see :class:`~.aligner.Aligner`)."""
        hooks: list[HookEvent] = []
        for e in events:
            if isinstance(e, DataEnd):
                if hooks:
                    self.localizer.add_events(hooks)
                    hooks = []
                self.localizer.observe_data_end(e.node, e.end_ns, e.nic_ends, e.nic_tx)
                self.aligner.observe_data_end(e.node, e.end_ns, now)
                if e.gaps:
                    self.localizer.observe_gaps(e.node, e.gaps)
                self.data_end = max(self.data_end, e.end_ns)
            else:
                hooks.append(e)
        if hooks:
            self.localizer.add_events(hooks)

    def add_metrics(self, records: Iterable[OpMetrics], now: float) -> None:
        n = 0
        for rec in records:
            self.aligner.add(rec, now)
            n += 1
        self.metrics += n
        if n:
            self.last_record = now

    def release(self, now: float, *, flush: bool = False) -> None:
        """Move what the aligner holds long enough (everything with ``flush``) to the
        backlog (judged by ``judge``)."""
        self.backlog.extend(self.aligner.ready(now, flush=flush))

    def judge(self, deadline: float | None) -> tuple[Judged, bool]:
        """Judge the backlog, until ``deadline`` (monotonic) if given; returns what that
        produced and whether the deadline cut it short."""
        out: list[Verdict] = []
        cut = False
        while self.backlog:
            out += self.localizer.update(take_ops(self.backlog, None if deadline is None else JUDGE_STEP))
            if deadline is not None and time.monotonic() >= deadline:
                cut = True
                break
        return self._judged(out), cut

    def ended(self, now: float) -> Judged:
        """When no record came for ``job_idle_s``: the open incidents are resolved (the job
        ended). The localizer keeps its state: a job that comes back is judged on."""
        if not self.tracker.open or self.last_record is None or now - self.last_record < self.job_idle_s:
            return Judged()
        return Judged(incidents=self.tracker.finish(self.data_end or None))

    def forgettable(self, now: float, forget_s: float) -> bool:
        """Idle for ``forget_s`` with nothing held, judged or open: safe to drop."""
        return (self.last_record is not None and now - self.last_record >= forget_s and not self.tracker.open
                and not self.held)

    def finish(self) -> Judged:
        """The end of the input: release and judge everything, the localizer's last word,
        and every incident still open is resolved (the job ended)."""
        self.release(0.0, flush=True)
        out, _ = self.judge(None)
        out.extend(self._judged(self.localizer.finish()))
        out.incidents += self.tracker.finish(self.data_end or None)
        return out

    def _judged(self, verdicts: list[Verdict]) -> Judged:
        self.verdicts += len(verdicts)
        return Judged(verdicts, self.tracker.observe(verdicts))

    @property
    def held(self) -> int:
        return self.aligner.held + len(self.backlog)
