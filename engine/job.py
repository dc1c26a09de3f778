"""The job engine: segmentation -> alignment -> localization, one object, driven in arrival
order by ``pulse diagnose``, ``pulse eval``, the lab analysis and the Faust agents alike.

:class:`Localizers` is the localization side of any number of jobs (what the localize
agent holds: op-metrics are keyed by job). :class:`JobEngine` joins it to a
:class:`~.segment_stage.SegmentStage` in one process: what the segmentation stage
forwards (comm/flow events, posted receives, data ends) and emits (operator metrics) goes
straight to the job's localize stage, where the pipeline sends it over the op-metrics
topic. Nothing else differs between the two: the agents only decode, route by key, call
these objects and encode.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

from pulse.localization import LocalizeParams
from pulse.segmentation import SegmentParams

from pulse.events import HookEvent
from pulse.records import DataEnd, Incident, OpMetrics, Verdict
from pulse.samples import EpochBatch

from .localize_stage import FORGET_S, HOLD_NS, IDLE_S, JOB_IDLE_S, Judged, LocalizeStage
from .netonly import NETWORK_ONLY_RATE_RATIO, InferredStage
from .segment_stage import SegmentOutput, SegmentStage


class Localizers:
    """One :class:`LocalizeStage` per job, created on the job's first record."""

    def __init__(self, params: LocalizeParams | None = None, *, hold_ns: int = HOLD_NS, idle_s: float = IDLE_S,
                 budget_s: float | None = None, job_idle_s: float = JOB_IDLE_S) -> None:
        self.params = params if params is not None else LocalizeParams()
        self.hold_ns = hold_ns
        self.idle_s = idle_s
        self.budget_s = budget_s
        self.job_idle_s = job_idle_s
        self.forget_s = FORGET_S
        self.forgotten = 0
        """Jobs dropped after ``forget_s`` without input (see :data:`.localize_stage.FORGET_S`)."""
        self.jobs: dict[str, LocalizeStage] = {}
        self.verdicts = 0
        self._late_forgotten = 0

    def stage(self, job: str) -> LocalizeStage:
        st = self.jobs.get(job)
        if st is None:
            st = self.jobs[job] = LocalizeStage(job, self.params, hold_ns=self.hold_ns, idle_s=self.idle_s,
                                                job_idle_s=self.job_idle_s)
        return st

    def adopt(self, other: Localizers, drop: Iterable[str] = ()) -> None:
        """Take over the jobs ``other`` rebuilt (a worker given their op-metrics partition in
        a rebalance replays it into fresh stages), replacing ours for the jobs in ``drop``."""
        for job in drop:
            self.jobs.pop(job, None)
        self.jobs.update(other.jobs)

    def add_forwarded(self, job: str, items: Iterable[HookEvent | DataEnd], now: float = 0.0) -> None:
        self.stage(job).add_events(items, now)

    def add_metrics(self, records: list[OpMetrics], now: float) -> None:
        by_job: dict[str, list[OpMetrics]] = {}
        for r in records:
            by_job.setdefault(r.job, []).append(r)
        for job, recs in by_job.items():
            self.stage(job).add_metrics(recs, now)

    def tick(self, now: float | None = None, *, budget_s: float | None = -1.0) -> Judged:
        """Release what the aligners held long enough and judge it (call it periodically;
        with a budget, call it again while ``backlog``)."""
        now = time.monotonic() if now is None else now
        budget = self.budget_s if budget_s == -1.0 else budget_s
        out = Judged()
        for st in self.jobs.values():
            st.release(now)
            out.extend(st.ended(now))
        deadline = None if budget is None else time.monotonic() + budget
        for st in self.jobs.values():
            got, cut = st.judge(deadline)
            out.extend(got)
            if cut:
                break
        for job in [j for j, st in self.jobs.items() if st.forgettable(now, self.forget_s)]:
            self._late_forgotten += self.jobs.pop(job).localizer.late_records
            self.forgotten += 1
        self.verdicts += len(out.verdicts)
        return out

    def settle(self) -> Judged:
        """Judge the whole backlog now, releasing nothing new."""
        out = Judged()
        for st in self.jobs.values():
            out.extend(st.judge(None)[0])
        self.verdicts += len(out.verdicts)
        return out

    def finish(self) -> Judged:
        out = Judged()
        for st in self.jobs.values():
            out.extend(st.finish())
        self.verdicts += len(out.verdicts)
        return out

    @property
    def backlog(self) -> int:
        """Records released by the aligners and not judged yet (a budget ran out)."""
        return sum(len(st.backlog) for st in self.jobs.values())

    @property
    def held(self) -> int:
        return sum(st.held for st in self.jobs.values())

    @property
    def late_records(self) -> int:
        """Records that came after their operator was judged without them (a node's data
        too far behind the others'), over every job so far."""
        return self._late_forgotten + sum(st.localizer.late_records for st in self.jobs.values())

    @property
    def active(self) -> bool:
        """Whether a job is known (then ``tick`` may release held operators)."""
        return bool(self.jobs)


class JobEngine:
    """Segmentation and localization of one or more jobs in one process.

    Feed chunks in arrival order with :meth:`feed` (hook events and epoch batches, as a
    live source publishes them: see :meth:`pulse.trace.TraceReader.timeline`), then call
    :meth:`finish`. ``now`` is the wall clock of a live run; offline runs leave it at 0,
    so nothing is released for idleness and only trace time decides.
    """

    def __init__(self, segment_params: SegmentParams | None = None, localize_params: LocalizeParams | None = None,
                 *, hold_ns: int = HOLD_NS, network_only: bool = False, shards: int = 1) -> None:
        from .shards import ShardedLocalizers

        self.network_only = network_only
        """Operators inferred from the traffic alone (:mod:`.netonly`): descriptors ignored."""
        if network_only:
            # inferred records are per-link sending rates over a window, each bound to the NIC
            # it reaches: a low one marks that link slow, bytes beyond its rail siblings' mark
            # it losing packets (see netonly's docstring)
            localize_params = dataclasses.replace(localize_params or LocalizeParams(), rate_blame=True,
                                                 rate_ratio=NETWORK_ONLY_RATE_RATIO, group_verdicts=False,
                                                 grouped_resent=True)
        self.segment: SegmentStage | InferredStage = (InferredStage(params=localize_params) if network_only
                                                      else SegmentStage(segment_params))
        # One job's localization over ``shards`` shards, merged per job (shards.py).
        self.localize: Localizers | ShardedLocalizers = (
            ShardedLocalizers(shards, localize_params, hold_ns=hold_ns) if shards > 1
            else Localizers(localize_params, hold_ns=hold_ns))
        self.metrics: list[OpMetrics] = []
        self.verdicts: list[Verdict] = []
        self.incidents: list[Incident] = []
        """Every incident state change, in order."""

    def feed(self, events: Iterable[HookEvent] = (), batches: Iterable[EpochBatch] = (),
             now: float = 0.0) -> list[Verdict]:
        out = self.segment.add(events, batches, now=now)
        if now:
            self.segment.forget(now, FORGET_S)
        if out.refused:
            batch, exc = out.refused[0]
            raise type(exc)(f"{batch.node}/{batch.nic} batch {batch.batch_seq}: {exc}")
        return self._route(out, now)

    def finish(self) -> list[Verdict]:
        vs = self._route(self.segment.finish(), 0.0)
        return vs + self._keep(self.localize.finish())

    def _route(self, out: SegmentOutput, now: float) -> list[Verdict]:
        for (job, _node), items in out.forwards.items():
            self.localize.add_forwarded(job, items, now)
        self.metrics += out.metrics
        self.localize.add_metrics(out.metrics, now)
        return self._keep(self.localize.tick(now, budget_s=None))

    def _keep(self, judged: Judged) -> list[Verdict]:
        self.verdicts += judged.verdicts
        self.incidents += judged.incidents
        return judged.verdicts
