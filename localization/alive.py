"""Per NIC, the recent moments it moved bytes and the records that kept it busy: which end
of a silent link was up, and whether a slow record shared its NIC with an all-to-all."""

from __future__ import annotations

import bisect
from typing import Any

from pulse.events import GROUPED, P2P
from pulse.records import OpMetrics

from .finding import PEER_RATE_IN, Finding
from .params import LocalizeParams

SEND, RECV = P2P


class AlivePoints:
    """Per NIC (node/nic), recent wire times (sorted, node clock) at which it moved bytes
    (a record's first and last epoch, a credit grant it received), and the communicator of
    each: which end of a silent link was up."""

    def __init__(self, p: LocalizeParams) -> None:
        self.p = p
        self._points: dict[str, tuple[list[int], list[str]]] = {}
        self._spans: dict[str, list[tuple[int, int, str, str, float]]] = {}
        """NIC -> recent records on it, sorted by start: (start, end, comm, kind, bytes)."""
        self._longest: dict[str, int] = {}
        self._changed: dict[str, int] = {}
        """NIC -> how many times its spans changed (a :meth:`shared` answer holds until then)."""
        self._shared_memo: dict[tuple[Any, ...], tuple[int, bool]] = {}
        self._into: dict[str, list[tuple[int, int]]] = {}
        """NIC -> our recent records into it other than all-to-alls, sorted: (start, end) on
        the sender's clock (:meth:`received_own`)."""
        self._into_longest: dict[str, int] = {}

    def note(self, m: OpMetrics) -> None:
        times = [m.start_ns, m.end_ns] if m.volume_bytes > 0 else []
        if m.granted_ns is not None:
            times.append(m.granted_ns)
        nics = (m.nics or ()) if times else ()
        for nic in nics:
            ep = nic if "/" in nic else f"{m.node}/{nic}"
            ts, cs = self._points.setdefault(ep, ([], []))
            for t in times:
                i = bisect.bisect_right(ts, t)  # records close nearly in time order: ~the end
                ts.insert(i, t)
                cs.insert(i, m.comm_id)
            if len(ts) > self.p.alive_max:
                del ts[:self.p.alive_drop], cs[:self.p.alive_drop]
            if m.volume_bytes > 0:
                spans = self._spans.setdefault(ep, [])
                span = (m.start_ns, m.end_ns, m.comm_id, m.kind, m.volume_bytes / len(nics))
                spans.insert(bisect.bisect_right(spans, span), span)
                self._changed[ep] = self._changed.get(ep, 0) + 1
                self._longest[ep] = max(self._longest.get(ep, 0), m.end_ns - m.start_ns)
                if len(spans) > self.p.alive_max:
                    del spans[:self.p.alive_drop]

    def note_into(self, dst: str, start: int, end: int) -> None:
        """A record of ours other than an all-to-all (a ring's, a tree's, a pipeline send)
        sent into NIC ``dst`` in [start, end) (its sender's clock)."""
        spans = self._into.setdefault(dst, [])
        bisect.insort(spans, (start, end))
        self._into_longest[dst] = max(self._into_longest.get(dst, 0), end - start)
        if len(spans) > self.p.alive_max:
            del spans[:self.p.alive_drop]

    def received_own(self, f: Finding) -> bool:
        """Whether a record noted by :meth:`note_into` may have been on the wire into the NIC
        ``f``'s link goes to while ``f``'s record was (an all-to-all link into a receiver
        slow inward only: :data:`.finding.PEER_RATE_IN`): its downlink then carried our own
        traffic too, a share, not a fault. The two records are on their senders' clocks: a
        record within the skew bound counts."""
        dst = f.peer_eps[0] if f.peer_eps else ""
        spans = self._into.get(dst)
        if not spans:
            return False
        skew = self.p.clock_skew_ns
        lo = bisect.bisect_left(spans, (f.start_ns - skew - self._into_longest[dst],))
        hi = bisect.bisect_left(spans, (f.end_ns + skew,))
        return any(en > f.start_ns - skew for _st, en in spans[lo:hi])

    def shared(self, f: Finding) -> bool:
        """Whether ``f``'s slowness is the share of its NIC that an all-to-all (or, for a
        collective, a pipeline send) took meanwhile: the bytes those records moved while
        ``f``'s record was on the wire
        (pro rata of their own spans, on the same node's clock) at least the bytes ``f``'s
        record would have moved in its extra active time at its own pace, volume x
        (1 - reference / ACT). The reference of a shape is the pace of its records with the
        NIC as they usually have it (twins of the same kind included); a pipeline send
        sharing its NIC with the node's all-to-all moves its bytes at a share of it (sweep
        23 #6: pipeline sends at 2-2.6x their reference on every NIC of one node, each time
        the node's all-to-all ran on the same NICs, named host-contention before the fault
        began), while a short send inside a long collective leaves it slow. An all-to-all
        drives every link of the NIC at once; a ring or tree collective on the node's own
        NIC is not taken as sharing (counted, a CPU-starved host's pipeline sends, late
        into its own ring traffic, were excused and its host-contention read as
        network-slow: sweep 11 #9). A pipeline send shares the NIC's transmit side with a
        collective's sends (sweep 67 #1: the pipeline sends from a stage into a node whose
        PCIe was capped lingered on the sender's NICs and slowed its data-parallel ring with
        its healthy stage-mate, named a slow path before the capped node); a receive does
        not (a link carries each direction on its own), and nothing shares a receive's
        side but what the peer sends. Only ACT findings: bytes resent are the network's
        whoever shares the NIC."""
        if f.metric == PEER_RATE_IN:
            return self.received_own(f)
        if f.metric != "act_ns" or f.value <= f.peers:
            return False
        # asked of every slow observation of the hot links at each evaluation: the answer
        # only changes when the NIC's spans do
        key = (f.endpoint, f.comm_id, f.seq, f.rank, f.start_ns, f.end_ns, f.value, f.peers)
        version = self._changed.get(f.endpoint, 0)
        hit = self._shared_memo.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]
        if len(self._shared_memo) >= 1 << 16:
            self._shared_memo.clear()
        out = self._shared(f)
        self._shared_memo[key] = (version, out)
        return out

    def _shared(self, f: Finding) -> bool:
        spans = self._spans.get(f.endpoint)
        if not spans:
            return False
        lo = bisect.bisect_left(spans, (f.start_ns - self._longest.get(f.endpoint, 0),))
        hi = bisect.bisect_left(spans, (f.end_ns,))
        own = next((sp for sp in spans[lo:hi] if sp[2] == f.comm_id and sp[0] == f.start_ns), None)
        if own is None:
            return False
        other = 0.0
        for st, en, comm, kind, vol in spans[lo:hi]:
            if comm != f.comm_id and kind != own[3] and en > f.start_ns and (
                    kind == GROUPED or (kind == SEND and own[3] != RECV)):
                other += vol * (min(en, f.end_ns) - max(st, f.start_ns)) / max(en - st, 1)
        return other >= own[4] * (1.0 - f.peers / f.value)

    def busy(self, ep: str, start: int, end: int, comm: str, kind: str) -> bool:
        """Whether a record of another kind (another communicator's) on NIC ``ep`` was on
        the wire during [start, end) (one node's clock): its bytes then shared the NIC.
        Twins of the same kind (two GPUs' all-to-alls on one NIC) share every node's NIC
        alike, and their operators' median link already carries that share."""
        spans = self._spans.get(ep)
        if not spans:
            return False
        lo = bisect.bisect_left(spans, (start - self._longest.get(ep, 0),))
        hi = bisect.bisect_left(spans, (end,))
        return any(c != comm and k != kind and en > start for _st, en, c, k, _v in spans[lo:hi])

    def points(self, ep: str) -> tuple[list[int], list[str]]:
        """(times, comms) of ``ep``, sorted by time (empty lists when never seen)."""
        return self._points.get(ep, ([], []))
