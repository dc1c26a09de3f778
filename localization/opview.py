"""One closed operator as the per-operator judges see it (:class:`OpView`), what they
conclude (:class:`Judgement`), and the findings and link observations they make of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from pulse.events import P2P
from pulse.records import OpMetrics

from .finding import Finding, LinkObs, burst_of


@dataclasses.dataclass
class Judgement:
    links: list[LinkObs] = dataclasses.field(default_factory=list)
    paced: list[LinkObs] = dataclasses.field(default_factory=list)
    """Links of records within the bound in a slow operator (or within what its capped
    ranks explain): not seen clean - a congested downlink passes a record now and then in
    a lull - but the rate they carried is a rate their NICs reached
    (:attr:`.evidence.Evidence.paced`)."""
    findings: list[Finding] = dataclasses.field(default_factory=list)
    waits: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    judged: list[int] = dataclasses.field(default_factory=list)
    """Indices of records that were compared (clean ones count as health)."""
    issue_lags: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    """(record index, how much later than its peers' median it issued, clocks as read) of
    a collective whose traffic is normal: judged against the rank's own history
    (:class:`.late_baselines.LateBaselines`), which cancels its clock offset."""
    intake: list[tuple[str, int, float]] = dataclasses.field(default_factory=list)
    """(receiving NIC, end, bytes/ns) of an all-to-all's receivers whose every flow in was
    clean: what their downlinks carried (:class:`.evidence.Intake`)."""
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


def finding_of(view: OpView, i: int, kind: str, metric: str, value: float, ref: float) -> Finding:
    r = view.recs[i]
    return Finding(kind, view.comm_id, view.seq, r.rank, r.node, view.endpoints[i], float(value), float(ref),
                   metric, r.start_ns, r.end_ns, view.peer_eps[i], r.flows, r.epoch_ns,
                   burst=burst_of(r.peak_epoch_bytes, r.volume_bytes, r.act_ns, r.epoch_ns))


def rate_bounds(r: OpMetrics) -> tuple[float, float]:
    """(lowest, highest) rate (bytes/ns) a record's NIC may have sent at while active: its
    ACT counts active epochs, so the time it stands for is known to an epoch either way
    (from two epochs on; a one-epoch record's highest is taken at one epoch)."""
    if r.act_ns <= 0 or r.volume_bytes <= 0:
        return 0.0, 0.0
    e = float(r.epoch_ns)
    return r.volume_bytes / (r.act_ns + e), r.volume_bytes / max(r.act_ns - e, e)


def link_of(view: OpView, i: int, dst: str, slow: bool, f: Finding | None, paced: bool = False) -> LinkObs:
    lo, hi = rate_bounds(view.recs[i])
    return LinkObs(view.endpoints[i], dst, slow, f, view.recs[i].end_ns, lo, hi, len(view.peer_eps[i]) > 1, paced)
