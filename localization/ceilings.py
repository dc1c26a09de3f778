"""Capacity ceilings: the most bytes a rank's records moved in one epoch, against its own
history.

Physical facts relied on:

* No epoch of a NIC, a PCIe link or a path capped at some rate carries more than that rate
  allows, however the traffic is paced; a healthy link bursts to line rate whenever it has
  the bytes. A starved host posts late and a slow GPU hands its data over late, but what
  they send still goes at line rate: their records' busiest epochs keep their height
  (battery cpu-contention, a host at 30 % of its CPU: its pipeline sends' busiest epochs
  at 34.8-47.9 GB/s, 49-51 before; a PCIe cap at 39 % pins both links of the capped NIC at
  19.7-20.2 GB/s in every record, 49-50 before).
* One record's busiest epoch depends on how much it had to send at once (a tree leaf's few
  bytes never fill an epoch); the most over a rank's recent records of one communicator,
  against the most over its first ones, does not: a training step repeats its operators.
* A link paced by its input forwards at about the pace of the cap upstream of it (a ring
  rank downstream of a capped NIC: busiest epochs 1.2x the cap for a few records), so
  only the ranks at the operator's lowest ceiling - within the flatness of that rank's
  own recent epochs, which a cap pins - are taken as capped, and only when their drop is
  their own (well below the operator's median drop: a whole job that changes its buckets
  changes every ceiling alike).
* A cap is told from a pace set upstream by its flatness (below), which a record shows only
  over :data:`.finding.FLAT_EPOCHS` active epochs or more: shorter records do not enter the
  recent ceiling. Sweep 293 #10: 3.9 MB ring sends of 2-3 epochs at 128 us, paced by switch
  congestion elsewhere in the ring; node-00's busiest epochs each held half its bytes, 0.61
  of its baseline and the lowest of the ring, its few longer records in bursts (1.3-2.1 of
  the flat bound) but too few to veto, and it was named network-slow. A cap stretches the
  records it holds, so at a rate that matters they show it; where they stay that short, the
  timing rules judge them.
* A NIC held to a rate is also flat within a record: every active epoch but its first and
  last carries the same bytes, so its busiest epoch is at most n / (n - 2) of its mean
  active epoch; a NIC fed in bursts by late posts goes past that (:meth:`Ceilings.slow_burst`,
  read by the all-to-all peer-rate rule, where an all-to-all's busiest epoch sums its flows
  to every peer and is not compared across records).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from pulse.records import OpMetrics

from .finding import burst_of, flatness_known
from .params import LocalizeParams
from .robust import median

LEVEL_KEEP_NS = 2_000_000_000
"""How long each rank's job-wide levels (:meth:`Ceilings._alone`) are kept in trace time: the
aligner releases an operator at most its hold (1 s) out of end-time order, so a record is
never judged further behind another communicator's than that."""
LEVEL_STEP_NS = 10_000_000
"""At most one level per rank is kept per this much trace time (a level moves over several
records; a 1,024-GPU job has thousands of ranks). Entries are never changed once kept, so
what a lookup finds does not depend on when it is made."""

BURST_OPS = 3
"""Slow records of an all-to-all rank over which :meth:`Ceilings.slow_burst` takes its
median: one record's figure is noisy (a capped NIC's records 1.02-1.12 of the flat bound,
an all-to-all's tail flows limited by their receivers)."""


class Ceilings:
    """Per (communicator, rank): the busiest epochs of its first ``late_base_ops`` complete
    records (its baseline) and of its last ``ceiling_ops`` (rings and tree leaves:
    :meth:`capped`); for an all-to-all's ranks, how bursty its last slow records were
    (:meth:`slow_burst`)."""

    def __init__(self, p: LocalizeParams) -> None:
        self.p = p
        self._base: dict[tuple[str, int], list[int]] = {}
        self._recent: dict[tuple[str, int], deque[int]] = {}
        self._flat: dict[tuple[str, int], deque[float]] = {}
        self._slow: dict[tuple[str, int], deque[float]] = {}
        self._any: dict[tuple[str, int], deque[int]] = {}
        self._alone_shared: dict[tuple[str, int], deque[bool]] = {}
        self._level: dict[tuple[str, int], deque[tuple[int, float]]] = {}
        """(comm, rank) -> (a record's end, the most its last ``ceiling_ops`` records moved in
        an epoch, short ones included, over its baseline): the job-wide control for
        operators with too few ranks to compare (a level, not a cap: no flatness asked),
        read as of a time so that the order operators are judged in changes nothing."""

    def slow_burst(self, comm: str, r: OpMetrics) -> float | None:
        """``r``'s rank was slow both ways in an all-to-all (the peer-rate rule). A NIC held
        to a rate - its cap - moves the same bytes in every epoch it is active but its
        first and last, so its busiest epoch is at most n / (n - 2) of its mean active
        epoch (n active epochs); a NIC that sends in bursts between idle stretches (a host
        posting late) goes well past it. Returns the median, over the rank's last
        ``BURST_OPS`` slow records (this one included), of that ratio over its bound: above
        1, its NIC was not the limit. None without the figure. Measured: a NIC capped at 25
        and 37.5 % (battery moe-slow-nic) 1.02-1.12 before the bound, a host at 23 % of its
        CPU (sweep 199 #12) 1.48-2.78, healthy records 1.13-2.05."""
        b = burst_of(r.peak_epoch_bytes, r.volume_bytes, r.act_ns, r.epoch_ns)
        if math.isnan(b):
            return None
        rec = self._slow.get((comm, r.rank))
        if rec is None:
            rec = self._slow[(comm, r.rank)] = deque(maxlen=BURST_OPS)
        rec.append(b)
        return median(list(rec))

    def capped(self, comm: str, ordered: list[OpMetrics], peers: list[int],
               shared: Callable[[int], bool]) -> dict[int, tuple[float, float]]:
        """Note one closed operator's records; returns, per record index whose rank's
        ceiling fell to the operator's lowest (see the module), (its recent ceiling, its
        baseline ceiling) in bytes per epoch. ``peers``: per record, how many peer NICs it
        sends to - only one-peer records are judged: a relay sends to several at once at
        the pace its inputs arrive, its busiest epochs as low as a cap's wherever it sits
        below one (a 7-rank tree under a PCIe cap at 26 %: the capped node's relays at
        12.7-13.2 GB/s, a healthy relay elsewhere in the tree below them). ``shared``:
        whether a record's NIC carried a record of another kind meanwhile (its bytes then
        shared the epochs)."""
        p = self.p
        if p.ceiling_ops <= 0 or not ordered:
            return {}
        ready: list[tuple[int, int, float, float]] = []
        for i, r in enumerate(ordered):
            pk = r.peak_epoch_bytes
            if (pk is None or pk <= 0 or not r.complete or peers[i] != 1
                    or (r.nics is not None and len(r.nics) > 1)):
                continue
            key = (comm, r.rank)
            base = self._base.setdefault(key, [])
            if len(base) < p.late_base_ops:
                base.append(pk)
                continue
            self._note_level(key, pk, r.end_ns, max(base))
            if not flatness_known(r.act_ns, r.epoch_ns):
                continue
            rec = self._recent.get(key)
            if rec is None:
                rec = self._recent[key] = deque(maxlen=p.ceiling_ops)
            rec.append(pk)
            bursts = self._flat.get(key)
            if bursts is None:
                bursts = self._flat[key] = deque(maxlen=p.ceiling_ops)
            bursts.append(burst_of(pk, r.volume_bytes, r.act_ns, r.epoch_ns))
            if len(rec) == p.ceiling_ops:
                top = max(rec)
                ready.append((i, top, top / max(base), top / min(rec)))
        if len(ready) < p.min_ranks:
            return self._alone(comm, ordered, ready, shared)
        med = median([x[2] for x in ready])
        _, low, _, flat = min(ready, key=lambda x: x[1])
        out: dict[int, tuple[float, float]] = {}
        for i, top, ratio, _f in ready:
            if (ratio < p.rate_ratio and ratio < p.rate_ratio * med and top <= low * flat and not shared(i)
                    and not self._bursting((comm, ordered[i].rank))):
                out[i] = (float(top), float(top / ratio))
        return out

    def _note_level(self, key: tuple[str, int], pk: int, end_ns: int, base: int) -> None:
        seen = self._any.get(key)
        if seen is None:
            seen = self._any[key] = deque(maxlen=self.p.ceiling_ops)
            self._level[key] = deque()
        seen.append(pk)
        lv = self._level[key]
        if len(seen) == self.p.ceiling_ops and (not lv or end_ns - lv[-1][0] >= LEVEL_STEP_NS):
            lv.append((end_ns, max(seen) / base))
            while len(lv) > 1 and lv[1][0] <= end_ns - LEVEL_KEEP_NS:
                lv.popleft()

    def _level_at(self, key: tuple[str, int], t_ns: int) -> float | None:
        """The rank's level as of its last record that ended by ``t_ns``."""
        for end, ratio in reversed(self._level.get(key, ())):
            if end <= t_ns:
                return ratio
        return None

    def _alone(self, comm: str, ordered: list[OpMetrics], ready: list[tuple[int, int, float, float]],
               shared: Callable[[int], bool]) -> dict[int, tuple[float, float]]:
        """Records of an operator with too few ranks to compare (a pipeline send, a two-rank
        all-to-all) against the job's other communicators and ranks: a ceiling that fell
        well below where the job's ceilings stand is the record's own (sweep 307 #10, 4
        nodes in two pipeline stages, every communicator of two ranks: the four pairs on the
        links of node-01's NIC capped at 0.295 fell from 6.2-6.4 MB per epoch to 1.94, the
        job's other pairs held at 5.6-6.5). Which end of such a link is capped is the link
        rules' to say, as for every capped record.

        What the judgement reads from other communicators is read so that the order the
        operators are judged in - end-time order, but not strictly: a pipeline send waits
        for later sends, an operator for a late rank - hardly matters (the agents and ``pulse
        diagnose`` disagreed by one operator on the battery's moe-slow-nic when it did): the
        job's levels as of records that ended before this one started by more than the clock
        skew bound (on any node's clock, before it), and whether the rank's NIC carried
        another kind's bytes meanwhile over its recent records, most of them, not this one
        alone (the other kind's overlapping record may be released after it)."""
        p = self.p
        out: dict[int, tuple[float, float]] = {}
        for i, top, ratio, _f in ready:
            key = (comm, ordered[i].rank)
            was = self._alone_shared.get(key)
            if was is None:
                was = self._alone_shared[key] = deque(maxlen=p.ceiling_ops)
            was.append(shared(i))
            if ratio >= p.rate_ratio or 2 * sum(was) >= len(was) or self._bursting(key):
                continue
            t = ordered[i].start_ns - p.clock_skew_ns
            job = [v for k in self._level if k != key and (v := self._level_at(k, t)) is not None]
            if len(job) >= 2 * p.min_ranks and ratio < p.rate_ratio * median(job):
                out[i] = (float(top), float(top / ratio))
        return out

    def _bursting(self, key: tuple[str, int]) -> bool:
        """Whether the rank's recent records went clearly past what a NIC held to one rate
        shows (:func:`.finding.burst_of`, their median, most of them known): its busiest
        epochs fell with its input's pace, not to a cap. A ring downstream of a host starved
        of CPU forwards in bursts as the chunks come (sweep 197 #8: four ranks' ceilings fell
        below their peers', at 1.8-2.1 of the flat bound). A capped NIC's rate still varies by
        a few percent from epoch to epoch (sweep 229 #9: its records at 0.98-1.08), so only
        a busiest epoch beyond 1 / ``rate_ratio`` of the bound - the margin at which one rate
        is taken as below another - vetoes the cap: this takes evidence away, and a vetoed
        cap is a fault missed."""
        known = [b for b in self._flat.get(key, ()) if not math.isnan(b)]
        return 2 * len(known) > len(self._flat.get(key, ())) and median(known) > 1.0 / self.p.rate_ratio
