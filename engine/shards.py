"""One job's localization spread over shards, merged by a cheap job-level decision.

Localization is keyed by job, so without shards one job is one partition and one core
however many workers run (a hot key). Here a job's operators are split by communicator
(:func:`shard_of`): the ranks of one operator are always in one shard, which is where the
cross-rank comparison happens (the expensive part: per record and per operator), and each
shard is a whole :class:`~.localize_stage.LocalizeStage` (aligner, localizer) of its own.
What the shards conclude goes to one :class:`JobMerge` per job, which only looks at their
verdicts: an anomaly is the job's as soon as one shard names it; it is cleared once no
shard still names it; the job is healthy only while no shard has an open anomaly. The
job's incidents are tracked there, on the merged verdicts (one incident per fault, not one
per shard that saw it).

Forwarded items follow their communicator (comm and flow events, posted receives); a
node's data end goes to every shard (any of them may hold that node's operators).

What a shard cannot see: evidence that only adds up across communicators (a node's NICs
on several rails, set covers of slow links) is judged per shard, so a fault that shows on
several communicators is named by each shard that holds one (the same incident, merged),
but a pattern that needs two communicators in different shards to be recognised is not.
``pulse bench localize --shards`` and tests/engine/test_shards.py check the battery.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterable

from pulse.localization import LocalizeParams
from pulse.localization.incidents import incident_key
from pulse.localization.lifecycle import IncidentTracker

from pulse.events import HookEvent
from pulse.records import DataEnd, OpMetrics, Verdict, kind_family

from .localize_stage import HOLD_NS, IDLE_S, JOB_IDLE_S, Judged


def shard_of(key: str | None, shards: int) -> int:
    """The shard of a rail (stable across processes: a worker computes it for the key of
    the records it sends, the localize state for what it received)."""
    if shards <= 1 or not key:
        return 0
    # NICs are numbered (mlx5_0..7, ib0..): the index spreads a node's rails evenly (a hash
    # does not: crc32 of "mlx5_0" and "mlx5_1" have the same parity).
    digits = len(key) - len(key.rstrip("0123456789"))
    if digits:
        return int(key[-digits:]) % shards
    return zlib.crc32(key.encode()) % shards


def rail(nics: Iterable[str] | None, comm_id: str | None) -> str | None:
    """What a record is sharded by: its NIC's name without the node (the rail: in a
    rail-optimised cluster every rank of a communicator sends on the same NIC index), or
    its communicator when it names no NIC."""
    for n in nics or ():
        return n.rsplit("/", 1)[-1]
    return comm_id


Key = tuple[str, str, tuple[str, ...]]


class JobMerge:
    """The job-level decision over its shards' verdicts, and the job's incidents."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.tracker = IncidentTracker(job)
        self.open: dict[int, dict[Key, Verdict]] = {}
        self.alarmed = False
        self.healthy_from: int | None = None

    def _held_elsewhere(self, shard: int, v: Verdict) -> bool:
        fam, nodes = kind_family(v.kind), set(v.nodes)
        return any(kind_family(o.kind) == fam and nodes & set(o.nodes)
                   for s, opened in self.open.items() if s != shard for o in opened.values())

    def take(self, shard: int, verdicts: Iterable[Verdict]) -> Judged:
        out: list[Verdict] = []
        mine = self.open.setdefault(shard, {})
        for v in verdicts:
            if v.status == "anomaly":
                mine[incident_key(v)] = v
                self.alarmed = True
                out.append(v)
            elif v.status == "cleared":
                fam, nodes = kind_family(v.kind), set(v.nodes)
                for k in [k for k, o in mine.items() if kind_family(o.kind) == fam and nodes & set(o.nodes)]:
                    del mine[k]
                if not self._held_elsewhere(shard, v):
                    out.append(v)
            elif not any(self.open.values()):
                # healthy / insufficient data: the job's, once (one shard speaks for all)
                if self.healthy_from is None:
                    self.healthy_from = shard
                if shard == self.healthy_from and not (v.status == "healthy" and self.alarmed):
                    out.append(v)
        return Judged(out, self.tracker.observe(out))


class ShardedLocalizers:
    """:class:`~.job.Localizers` with every job split over ``shards`` shards and merged
    (same interface: the localize agent and the job engine drive either)."""

    def __init__(self, shards: int, params: LocalizeParams | None = None, *, hold_ns: int = HOLD_NS,
                 idle_s: float = IDLE_S, budget_s: float | None = None, job_idle_s: float = JOB_IDLE_S) -> None:
        from .job import Localizers

        self.n = shards
        self.shards = [Localizers(params, hold_ns=hold_ns, idle_s=idle_s, budget_s=budget_s,
                                  job_idle_s=job_idle_s) for _ in range(shards)]
        self.params = self.shards[0].params
        self.hold_ns, self.idle_s, self.budget_s = hold_ns, idle_s, budget_s
        self.merges: dict[str, JobMerge] = {}
        self.verdicts = 0

    @property
    def jobs(self) -> dict[str, object]:
        return {j: st for sh in self.shards for j, st in sh.jobs.items()}

    def merge(self, job: str) -> JobMerge:
        m = self.merges.get(job)
        if m is None:
            m = self.merges[job] = JobMerge(job)
        return m

    def add_forwarded(self, job: str, items: Iterable[HookEvent | DataEnd], now: float = 0.0) -> None:
        per: list[list[HookEvent | DataEnd]] = [[] for _ in self.shards]
        for e in items:
            nic = getattr(e, "nic", None)
            if nic:  # a flow binding: its rail's
                per[shard_of(rail([nic], None), self.n)].append(e)
            else:  # membership, posted receives, data ends: every shard may need them
                for p in per:
                    p.append(e)
        for sh, p in zip(self.shards, per, strict=True):
            if p:
                sh.add_forwarded(job, p, now)

    def add_metrics(self, records: list[OpMetrics], now: float) -> None:
        per: list[list[OpMetrics]] = [[] for _ in self.shards]
        for r in records:
            per[shard_of(rail(r.nics, r.comm_id), self.n)].append(r)
        for sh, p in zip(self.shards, per, strict=True):
            if p:
                sh.add_metrics(p, now)

    def _merged(self, shard: int, got: Judged) -> Judged:
        by_job: dict[str, list[Verdict]] = {}
        for v in got.verdicts:
            by_job.setdefault(v.job or "", []).append(v)
        out = Judged()
        for job, vs in by_job.items():
            out.extend(self.merge(job).take(shard, vs))
        self.verdicts += len(out.verdicts)
        return out

    def tick(self, now: float | None = None, *, budget_s: float | None = -1.0) -> Judged:
        now = time.monotonic() if now is None else now
        out = Judged()
        for i, sh in enumerate(self.shards):
            out.extend(self._merged(i, sh.tick(now, budget_s=budget_s)))
        return out

    def settle(self) -> Judged:
        out = Judged()
        for i, sh in enumerate(self.shards):
            out.extend(self._merged(i, sh.settle()))
        return out

    def finish(self) -> Judged:
        out = Judged()
        for i, sh in enumerate(self.shards):
            got = Judged()
            for st in sh.jobs.values():  # the shards' own incident trackers are not the job's
                st.release(0.0, flush=True)
                got.extend(st.judge(None)[0])
                got.extend(st._judged(st.localizer.finish()))
            out.extend(self._merged(i, got))
        ends = {j: max((sh.jobs[j].data_end for sh in self.shards if j in sh.jobs), default=0)
                for j in self.merges}
        for job, m in self.merges.items():
            out.incidents += m.tracker.finish(ends.get(job) or None)
        return out

    def adopt(self, other: ShardedLocalizers, drop: Iterable[str] = ()) -> None:
        drop = list(drop)
        for sh, osh in zip(self.shards, other.shards, strict=True):
            sh.adopt(osh, drop)
        for job in drop:
            self.merges.pop(job, None)
        self.merges.update(other.merges)

    @property
    def backlog(self) -> int:
        return sum(sh.backlog for sh in self.shards)

    @property
    def held(self) -> int:
        return sum(sh.held for sh in self.shards)

    @property
    def active(self) -> bool:
        return any(sh.active for sh in self.shards)
