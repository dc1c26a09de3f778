"""Network-only mode: where a job's traffic stopped, from the traffic alone.

A job that hangs goes silent while every NIC's capture goes on publishing (empty batches).
What the wire shows of the cause is the order in which the NICs fell silent: the NIC or
node that stopped sends first, and its peers go on for milliseconds (until their flow
control windows fill and they need its data), then the whole job waits.

* **silence**: every NIC that ever sent has been silent for at least ``stall_ns`` (the
  localizer's stall) and for at least ``SILENCE_GAPS`` times its own longest idle gap so
  far: longer than the job ever paused on its own, judged per NIC against its history.
* **the first to stop**: among the NICs that sent within ``stall_ns`` of the job's last
  traffic, those whose last send lies within ``skew_ns`` (the clock-offset bound) of the
  earliest. They must all be on one node, someone must have gone on after them, and each
  must have stayed silent, while the job went on, ``SILENCE_GAPS`` times longer than it
  ever idled (a NIC idle in a pipeline bubble when the job hung elsewhere is no stop).
* **what stopped**: when another NIC of that node went on sending after the first stop,
  the node was alive and one NIC's traffic stopped (network-stop: its record of the stuck
  operator sent nothing); when every NIC of the node stopped at once (two or more) the node
  stopped issuing work (compute-stop: it is absent from the stuck operator). A node with a
  single NIC cannot tell the two apart, and nothing is concluded.

:meth:`StopWatch.check` returns the stuck operator as per-NIC facts; :mod:`.netonly` turns
them into incomplete operator records (and bound members, data ends) that the localizer's
stop rules judge unchanged.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

SILENCE_GAPS = 4
"""A NIC is silent once it has been idle this many times its longest idle gap so far (and
a stall's length): a job's own rhythm (pipeline bubbles, the optimizer step between
iterations) never idles a NIC for several of its longest pauses in a row."""
HISTORY_NS = 5_000_000_000
"""Sends kept per NIC (node time) to count what each sent after the first stop: the job
goes on for milliseconds to a few hundred after one of its NICs or nodes stopped."""


@dataclasses.dataclass
class _Nic:
    last_ns: int = -(1 << 62)
    """End of the last epoch it sent in (node clock)."""
    max_gap_ns: int = 0
    """Longest interval between two epochs it sent in."""
    end_ns: int = -(1 << 62)
    """How far its capture reaches (empty batches included)."""
    sends: collections.deque[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=collections.deque)
    """(epoch end times, bytes) of its recent sends, oldest first."""

    def sent_after(self, t_ns: int) -> int:
        return int(sum(int(b[t > t_ns].sum()) for t, b in self.sends))


@dataclasses.dataclass
class StuckNic:
    endpoint: str
    last_ns: int
    sent_after: int
    """Bytes it sent after the first stop (plus the clock-offset margin)."""
    present: bool
    """Its node went on sending after the first stop (False: the node is absent)."""


@dataclasses.dataclass
class Stop:
    job: str
    kind: str
    """``network-stop`` or ``compute-stop``: what the order of silences says."""
    node: str
    first_ns: int
    """Last send of the first NIC to stop (its node's clock)."""
    nics: list[StuckNic]
    """Every NIC that took part in the job's last traffic, the first to stop included."""
    data_end: dict[str, int]
    """node -> how far its capture reaches."""


class StopWatch:
    """Per-NIC send history and silences of the jobs one inferred stage sees."""

    def __init__(self, stall_ns: int, skew_ns: int) -> None:
        self.stall_ns = int(stall_ns)
        self.skew_ns = int(skew_ns)
        self._nics: dict[str, dict[str, _Nic]] = {}
        """job -> endpoint -> its state."""
        self._stopped: dict[str, int] = {}
        """job -> its last traffic when a stop was reported (one report per silence)."""

    def note(self, job: str, ep: str, t_end_ns: np.ndarray, nbytes: np.ndarray, capture_end_ns: int) -> None:
        """One batch of one NIC: the end times of the epochs it sent in (any order) and the
        bytes in each, and how far its capture now reaches."""
        nic = self._nics.setdefault(job, {}).setdefault(ep, _Nic())
        nic.end_ns = max(nic.end_ns, capture_end_ns)
        if t_end_ns.size == 0:
            return
        t, inv = np.unique(t_end_ns.astype(np.int64), return_inverse=True)
        b = np.bincount(inv, weights=nbytes.astype(np.float64), minlength=t.size)
        prev = nic.last_ns if nic.last_ns > -(1 << 61) else int(t[0])
        gaps = np.diff(np.concatenate(([prev], t)))
        nic.max_gap_ns = max(nic.max_gap_ns, int(gaps.max()))
        nic.last_ns = max(nic.last_ns, int(t[-1]))
        nic.sends.append((t, b))
        while nic.sends and int(nic.sends[0][0][-1]) < nic.last_ns - HISTORY_NS:
            nic.sends.popleft()

    def check(self) -> list[Stop]:
        out = []
        for job, nics in self._nics.items():
            stop = self._check_job(job, nics)
            if stop is not None:
                out.append(stop)
        return out

    def _silent(self, nic: _Nic) -> bool:
        return nic.end_ns - nic.last_ns >= max(self.stall_ns, SILENCE_GAPS * nic.max_gap_ns)

    def _check_job(self, job: str, nics: dict[str, _Nic]) -> Stop | None:
        senders = {ep: n for ep, n in nics.items() if n.last_ns > -(1 << 61)}
        if len(senders) < 2:
            return None
        last = max(n.last_ns for n in senders.values())
        if self._stopped.get(job) == last or not all(self._silent(n) for n in senders.values()):
            return None
        self._stopped[job] = last  # judged once per silence, whatever it concludes
        recent = {ep: n for ep, n in senders.items() if last - n.last_ns < self.stall_ns}
        t_first = min(n.last_ns for n in recent.values())
        first = {ep for ep, n in recent.items() if n.last_ns <= t_first + self.skew_ns}
        nodes = {ep.partition("/")[0] for ep in first}
        if len(nodes) != 1 or len(first) == len(recent):
            return None  # several nodes at once, or everyone together: no order to read
        node = next(iter(nodes))
        # A NIC idle in a pipeline bubble when a stop elsewhere hung the job also falls silent
        # "first", having idled nearly as long before (a sweep run: 102 ms after a longest gap
        # of 67 ms, the dead NIC's node stopping 14 ms later): the first must have stayed
        # silent, while the job went on, as long as a silence of the whole job is.
        if any(last - recent[ep].last_ns < SILENCE_GAPS * recent[ep].max_gap_ns for ep in first):
            return None
        on_node = [ep for ep in recent if ep.partition("/")[0] == node]
        went_on = [ep for ep in on_node if ep not in first]
        if went_on:
            kind = "network-stop"
        elif len(first) >= 2:
            kind = "compute-stop"
        else:
            return None  # one NIC on its node: a dead NIC and a hung host look the same
        cut = t_first + self.skew_ns
        present_nodes = {ep.partition("/")[0] for ep in recent if ep not in first}
        stuck = [StuckNic(ep, n.last_ns, n.sent_after(cut), ep.partition("/")[0] in present_nodes)
                 for ep, n in sorted(recent.items())]
        ends: dict[str, int] = {}
        for ep, n in nics.items():
            nd = ep.partition("/")[0]
            ends[nd] = max(ends.get(nd, -(1 << 62)), n.end_ns)
        return Stop(job, kind, node, t_first, stuck, ends)
