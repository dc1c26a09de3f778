"""What an operator's observation says, one record at a time: a finding (a rank slow, late,
stalled, absent or missing in one operator, with the value it was judged on) and a link
observation (the link one rank's data crossed, slow or clean, and the rate its NIC showed).
:mod:`.observations` makes them; the evidence windows and the rules read them."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

ACT = "act"          # slow link (ACT or rate): network-slow / path / host (by direction)
LATE = "late"        # arrived late with normal traffic: compute-slow
STALL = "stall"      # stopped making progress: network-stop
ABSENT = "absent"    # never started an operator its peers are stuck in: compute-stop
MISSING = "missing"  # no record while its peers completed: insufficient-data
RAIL = "rail"        # ended far later than the same operator on the node's other NICs

CEILING = "peak_epoch_bytes"
"""Metric of an ACT finding on a capacity ceiling (:mod:`.ceilings`): value the busiest
epoch of the rank's recent records, reference that of its first ones (capped: value below
the reference). Not timing: late inputs cannot lower it."""
PEER_RATE_IN = "peer_rate_in"
"""Metric of an all-to-all link into a receiver slow inward only (:mod:`.peer_rates`):
value the link's rate, reference the operator's median link rate."""

ISSUE_LAG = "issue_lag_ns"
"""Metric of a LATE finding on the rank's issue lag (its issue minus its peers' median,
clocks as read): value the lag, reference its own baseline (judged against its history)
or 0 (against its peers, with the skew bound); late by value - reference. The other LATE
findings are issue -> end spans against the peers' median (late by reference - value)."""


def lateness(f: Finding) -> float:
    """How late a LATE finding says its rank arrived (ns)."""
    return f.value - f.peers if f.metric == ISSUE_LAG else f.peers - f.value


def _round(x: float) -> float:
    return float(f"{x:.6g}") if np.isfinite(x) else -1.0


@dataclasses.dataclass
class Finding:
    kind: str
    comm_id: str
    seq: int
    rank: int
    node: str
    endpoint: str
    """node/nic of the rank (node/comm:rank when no NIC is known; the node for absences)."""
    value: float
    peers: float
    """The reference it was compared with (peers' median or the job-wide reference)."""
    metric: str
    start_ns: int
    end_ns: int
    peer_eps: tuple[str, ...] = ()
    """Endpoints this rank sends to (the links its traffic crosses)."""
    flows: int = 1
    """Flows the record moved: several to several peers is a relay (one slow link among
    them makes it slow); one flow is one link whatever peers the rank has flows to."""
    epoch_ns: int = 0
    """The record's epoch (0: unknown): an ACT within one of its wire span left its NIC
    busy throughout."""
    consistent: bool = False
    """Slow as its collective's consistent straggler (:mod:`.stragglers`): tested across
    operators already, not by this operator's timing alone."""
    burst: float = float("nan")
    """The record's busiest epoch over its mean active epoch, over the most a NIC held to
    one rate shows, n / (n - 2) for n active epochs (its first and last may be partial):
    at most 1 when one rate held it throughout (a cap: a path at 24 % of its rate,
    0.98-0.99), above when it went faster in some epochs than in others (healthy ring
    sends 1.03-1.2, a starved host's 1.0-1.85, sends into a congested downlink 1.4-2.9).
    NaN: unknown, or too few epochs to tell (:func:`burst_of`)."""

    def busy(self) -> bool:
        """An ACT finding whose record was active through its span (within an epoch): what
        a capped NIC or link does, unlike a starved host's sends, idle between late posts."""
        return self.metric == "act_ns" and self.value >= (self.end_ns - self.start_ns) - self.epoch_ns

    def timing_only(self) -> bool:
        """Slow by this operator's ACT alone against the reference, which a collective rank's
        late inputs stretch too; not bytes resent, nor a consistent straggler, nor a grouped
        operator's rate (each peer's bytes go out when posted, not as a neighbour hands them on)."""
        return self.metric == "act_ns" and not self.consistent

    def evidence(self) -> dict[str, Any]:
        return {"comm_id": self.comm_id, "seq": self.seq, "rank": self.rank, "node": self.node,
                "metric": self.metric, "value": _round(self.value), "reference": _round(self.peers)}


FLAT_EPOCHS = 4
"""Active epochs from which a record's flatness can be judged: its first and last epochs may
be partial, so its busiest epoch is compared with its mean over the others, and the bound a
NIC held to one rate shows, n / (n - 2) for n active epochs, is 2 at four and 3 at three (any
shape passes). With fewer, a NIC held to a cap and one forwarding what its input hands it at a
lower pace look alike; with two, no epoch need even lie wholly inside the transfer."""


def flatness_known(act_ns: float, epoch_ns: float) -> bool:
    """Whether a record active ``act_ns`` spans ``FLAT_EPOCHS`` epochs or more."""
    return epoch_ns > 0 and act_ns > (FLAT_EPOCHS - 1) * epoch_ns


def burst_of(peak_bytes: float | None, volume_bytes: float, act_ns: float, epoch_ns: float) -> float:
    """:attr:`Finding.burst` of a record (NaN under ``FLAT_EPOCHS`` active epochs or without
    its peak)."""
    if peak_bytes is None or peak_bytes <= 0 or not flatness_known(act_ns, epoch_ns) or volume_bytes <= 0:
        return float("nan")
    n = act_ns / epoch_ns
    return peak_bytes / (volume_bytes / n) / (n / (n - 2.0))


@dataclasses.dataclass
class LinkObs:
    src: str
    dst: str
    slow: bool
    finding: Finding | None = None
    end_ns: int = 0
    rate_lo: float = 0.0
    rate_hi: float = 0.0
    """Bounds (bytes/ns) of the rate the record's NIC sent at while active, an epoch of
    quantisation either way on its ACT (0: unknown). A clean observation shows the NIC can
    move at least ``rate_lo``; a slow one that it got at most ``rate_hi``
    (:func:`.rules.links.shown_rates`)."""
    shared: bool = False
    """The record sent to several peers at once (all-to-all, a tree relay): its rate is its
    NIC's, not this link's, and says nothing of what the receiver took in."""
    paced: bool = False
    """The record went at the pace its operator's capped or resending ranks set: neither
    slow nor clean, but newer than the link's older observations, which it ages out of the
    window (a ring's victims blamed by timing at a cap's onset, before the ceilings knew
    the cap, stay slow otherwise: sweep 257 #23)."""
