"""Network-only mode: a NIC that goes silent for a while and then resumes (a flapping link),
read on its own node's clock against the node's other NICs.

In a rail-optimized job each GPU's NIC carries its own share of the same collectives and
pipeline sends, so a node's NICs send together: a healthy NIC is silent while most of its
rail siblings send for an epoch at most. A NIC whose link goes down stops in the middle of
what its siblings go on sending, and sends its share once the link is back: its bytes only
come later (cumulated they are its siblings').

* **silence**: the epochs in which a NIC sent nothing while at least half of its node's
  other NICs (three or more) sent, counted over each of its idle gaps and judged when the
  gap ends (it sends again). It is a silence when it exceeds ``SILENCE_GAPS`` times the
  node's NICs' median longest one so far (one epoch at least): judged against the node's
  own history, on one clock, so no clock offset is involved.
* **who**: a link that goes down silences both its ends (nothing crosses it either way),
  and a ring stalls behind it; a NIC waiting for a slow peer is silent too. Silences of
  several nodes that overlap in time (within the clock-offset bound) are one event. The
  flapping NIC is in every event that spans two nodes or more, the partners of its links
  only in those of the traffic they had with it at the time (a pipeline partner in
  activation sends, the ring in gradient reductions). So a NIC is named when it alone is in
  every multi-node event (``FLAP_PERSIST`` of them at least, within ``keep_ns``), and no
  other NIC of its node fell silent (a host or a GPU fault is not one NIC's). Two NICs in
  every event are the two ends of one link and name nobody: either end can be down.
* **vetoes**: a job whose links resend bytes (the rail surplus of :mod:`.netonly`) names no
  flap: a lossy link's retransmission timeouts silence it exactly as a flap does, and the
  surplus names the lossy NIC.

:meth:`FlapWatch.check` returns the named NIC's silences; :mod:`.netonly` turns each into
the records of one inferred operator per NIC of its node, so that the localizer's rail
rule (``rules/rail.py``: one NIC ending late against its node's other NICs) judges them
unchanged.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .netstop import SILENCE_GAPS

FLAP_SIBLINGS = 3
"""Other NICs a node needs for its NICs' silences to be read (with two, either could be
the odd one)."""
FLAP_PERSIST = 3
"""Multi-node silence events (the named NIC in every one) needed before it is named."""
MAX_EVENTS = 256
"""Silences kept per job (the newest; older ones also expire after ``keep_ns``)."""


@dataclasses.dataclass
class Silence:
    node: str
    nic: str
    start_ns: int
    """End of its last send before the silence (node clock)."""
    end_ns: int
    """Start of its first send after it."""
    silent_ns: int
    """Time it sent nothing while most of its node's other NICs sent."""
    core_start_ns: int
    core_end_ns: int
    """First and last epoch of that time: silences of other nodes that overlap it (within
    the clock-offset bound) are one event."""
    siblings_end_ns: dict[str, int]
    """Its node's other NICs -> the end of their last send before it sent again."""
    sent_bytes: dict[str, int]
    """Every NIC of its node -> bytes sent within the silence (the NIC itself: 0)."""


@dataclasses.dataclass
class Flap:
    job: str
    node: str
    nic: str
    silences: list[Silence]
    """Its silences not reported before, in time order."""
    events: int
    """Multi-node events it was in (all of them)."""


@dataclasses.dataclass
class _NicState:
    pending: list[tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=list)
    """(epoch index, bytes) of sends not processed yet."""
    end: int = -(1 << 62)
    """Epoch index its capture reaches (exclusive)."""
    last: int | None = None
    """Epoch index of its last processed send."""
    carry: int = 0
    """Epochs silent while its siblings sent, since ``last``."""
    first: int = 0
    last_silent: int = 0
    """First and last epoch of the carried silence."""
    longest: int | None = None
    """Its longest such silence so far (epochs); None before its first idle gap."""


class _Node:
    def __init__(self) -> None:
        self.nics: dict[str, _NicState] = {}
        self.done = -(1 << 62)
        """Epochs below this are processed."""
        self.epoch_ns = 0


class FlapWatch:
    """Per node, each NIC's silences while its siblings send; per job, the NIC common to the
    multi-node events."""

    def __init__(self, skew_ns: int, keep_ns: int) -> None:
        self.skew_ns = int(skew_ns)
        self.keep_ns = int(keep_ns)
        self._nodes: dict[tuple[str, str], _Node] = {}
        self._events: dict[str, list[Silence]] = {}
        self._told: dict[str, set[tuple[str, str, int]]] = {}

    def note(self, job: str, node: str, nic: str, epoch_ns: int, epochs: np.ndarray, nbytes: np.ndarray,
             capture_end_ns: int) -> None:
        """One batch of one NIC: the absolute epoch indices (``t_ns // epoch_ns``) it sent in,
        the bytes in each, and how far its capture now reaches."""
        nd = self._nodes.setdefault((job, node), _Node())
        if nd.epoch_ns and epoch_ns != nd.epoch_ns:
            return  # one grid per node: a NIC on another epoch length is not compared
        nd.epoch_ns = epoch_ns
        st = nd.nics.setdefault(nic, _NicState())
        st.end = max(st.end, capture_end_ns // epoch_ns)
        if epochs.size:
            st.pending.append((epochs.astype(np.int64), nbytes.astype(np.int64)))

    # -- per node ---------------------------------------------------------------------------

    def _process(self, job: str, node: str, nd: _Node) -> None:
        if len(nd.nics) < FLAP_SIBLINGS + 1:
            return
        names = sorted(nd.nics)
        frontier = min(nd.nics[n].end for n in names)
        lo = nd.done
        if lo <= -(1 << 61):
            firsts = [int(min(int(e.min()) for e, _ in nd.nics[n].pending)) for n in names if nd.nics[n].pending]
            if not firsts:
                return
            lo = min(firsts)
        if frontier <= lo:
            return
        width = frontier - lo
        sent = np.zeros((len(names), width), dtype=np.bool_)
        byts = np.zeros((len(names), width), dtype=np.int64)
        for i, n in enumerate(names):
            st = nd.nics[n]
            keep = []
            for e, b in st.pending:
                inside = (e >= lo) & (e < frontier)
                sent[i, e[inside] - lo] = True
                np.add.at(byts[i], e[inside] - lo, b[inside])
                later = e >= frontier
                if later.any():
                    keep.append((e[later], b[later]))
            st.pending = keep
        nd.done = frontier
        busy_count = sent.sum(axis=0)
        others = len(names) - 1
        gaps: list[tuple[int, int, int, int, int, int]] = []
        """(end, NIC index, start, silent epochs, first, last silent epoch): absolute."""
        for i, n in enumerate(names):
            st = nd.nics[n]
            sib_busy = (busy_count - sent[i]) * 2 >= others
            silent = sib_busy & ~sent[i]
            cs = np.concatenate(([0], np.cumsum(silent)))
            where = np.flatnonzero(silent)
            xs = np.flatnonzero(sent[i])
            if xs.size:
                prev = np.concatenate(([-1], xs[:-1]))
                counts = cs[xs] - cs[prev + 1]
                counts[0] += st.carry
                idle = np.flatnonzero(xs > prev + 1)
                if st.last is None:
                    idle = idle[idle > 0]  # its first send starts its history, ends no gap
                for j in idle.tolist():
                    x, px = int(xs[j]), int(prev[j])
                    hits = where[(where > px) & (where < x)]
                    first = st.first if (j == 0 and st.carry) else (lo + int(hits[0]) if hits.size else 0)
                    final = lo + int(hits[-1]) if hits.size else st.last_silent
                    start = st.last if (j == 0 and st.last is not None) else lo + px
                    gaps.append((lo + x, i, start, int(counts[j]), first, final))
                st.carry = 0
                st.last = lo + int(xs[-1])
                px = int(xs[-1])
            else:
                px = -1
            tail = where[where > px]
            if tail.size:
                if not st.carry:
                    st.first = lo + int(tail[0])
                st.last_silent = lo + int(tail[-1])
            st.carry += int(tail.size)
        # in time order, each against the node's history so far
        for resumed, i, start, count, first, final in sorted(gaps):
            st = nd.nics[names[i]]
            if st.longest is not None and count > 0:
                hist = [nd.nics[n].longest or 0 for n in names]
                if count > SILENCE_GAPS * max(float(np.median(hist)), 1.0):
                    self._event(job, node, nd, names, i, sent, byts, lo, start, resumed, count, first, final)
            st.longest = max(st.longest or 0, count)

    def _event(self, job: str, node: str, nd: _Node, names: list[str], i: int, sent: np.ndarray,
               byts: np.ndarray, lo: int, a: int, b: int, count: int, first: int, last: int) -> None:
        ens = nd.epoch_ns
        sib_end: dict[str, int] = {}
        moved: dict[str, int] = {}
        for k, n in enumerate(names):
            if k == i:
                moved[n] = 0
                continue
            seg = sent[k, max(a + 1 - lo, 0):b - lo]
            idx = np.flatnonzero(seg)
            last = (max(a + 1 - lo, 0) + int(idx[-1]) + lo) if idx.size else a
            sib_end[n] = (last + 1) * ens
            moved[n] = int(byts[k, max(a + 1 - lo, 0):b - lo].sum())
        ev = Silence(node, names[i], (a + 1) * ens, b * ens, count * ens, first * ens, (last + 1) * ens, sib_end, moved)
        evs = self._events.setdefault(job, [])
        evs.append(ev)
        if len(evs) > MAX_EVENTS:
            del evs[:len(evs) - MAX_EVENTS]

    # -- per job ----------------------------------------------------------------------------

    def check(self, lossy: bool = False) -> list[Flap]:
        """Process what every NIC of a node has reported, then name the flapping NIC of each
        job where one alone explains the multi-node silences. ``lossy``: the job's links
        resend bytes (then nothing is named)."""
        for (job, node), nd in self._nodes.items():
            self._process(job, node, nd)
        out = []
        for job, evs in self._events.items():
            flap = self._judge(job, evs, lossy)
            if flap is not None:
                out.append(flap)
        return out

    def _judge(self, job: str, evs: list[Silence], lossy: bool) -> Flap | None:
        if not evs:
            return None
        newest = max(e.end_ns for e in evs)
        evs[:] = [e for e in evs if e.end_ns >= newest - self.keep_ns]
        done = min((nd.done * nd.epoch_ns for (j, _n), nd in self._nodes.items()
                    if j == job and nd.done > -(1 << 61)), default=-(1 << 62))
        # one event: silences each silent while the other's siblings sent (a down link holds
        # both its ends, and the ring behind it, for as long as it is down), within the skew
        sk = self.skew_ns
        order = sorted(evs, key=lambda e: e.start_ns)
        group = list(range(len(order)))

        def root(k: int) -> int:
            while group[k] != k:
                group[k] = group[group[k]]
                k = group[k]
            return k

        for i, x in enumerate(order):
            for j in range(i + 1, len(order)):
                y = order[j]
                if y.start_ns > x.end_ns + sk:
                    break
                if (y.start_ns - sk <= x.core_start_ns and x.core_end_ns <= y.end_ns + sk
                        and x.start_ns - sk <= y.core_start_ns and y.core_end_ns <= x.end_ns + sk):
                    group[root(j)] = root(i)
        members: dict[int, list[Silence]] = {}
        for k, e in enumerate(order):
            members.setdefault(root(k), []).append(e)
        # final: every node's data went past it (a silence still open elsewhere could join)
        multi = [m for m in members.values()
                 if max(e.end_ns for e in m) + sk < done and len({e.node for e in m}) >= 2]
        if len(multi) < FLAP_PERSIST or lossy:
            return None
        common = set.intersection(*({(s.node, s.nic) for s in m} for m in multi))
        if len(common) != 1:
            return None
        node, nic = next(iter(common))
        if any(s.node == node and s.nic != nic for s in evs):
            return None  # another NIC of its node fell silent too: not one NIC's fault
        told = self._told.setdefault(job, set())
        new = []
        for m in multi:
            for s in m:
                key = (s.node, s.nic, s.start_ns)
                if (s.node, s.nic) == (node, nic) and key not in told:
                    told.add(key)
                    new.append(s)
        if not new:
            return None
        return Flap(job, node, nic, new, len(multi))
