"""Re-aligning one job's operator metrics in trace time before localization."""

from __future__ import annotations

from pulse.events import reporting_ranks
from pulse.records import OpMetrics


class Aligner:
    """Re-aligns one job's operator metrics in time before localization.

    Ranks of one operator come from different nodes, hence different partitions, which a
    worker consumes at different paces (a backlog on one partition, a slow fetch). The
    localizer's judgement depends on the order it sees operators in (it closes an operator
    once later ones show up and keeps per-process history), so it must see them as a live
    job produces them: in time order. An operator's records wait here until it has all its
    ``nranks`` ranks and every node still reporting has gone past the operator's end (a
    per-node watermark in trace time). Bounds, both in trace time so a processing backlog
    changes nothing: a node more than ``hold_ns`` behind the most advanced one no longer
    holds the watermark (it may have stopped), and an operator that ended ``hold_ns``
    before the most advanced node's latest operator goes out as it is. When no record
    arrived for ``idle_s`` of wall time (the job paused or ended), everything goes out.
    Released operators go out in end-time order, in seq order per communicator.

    Live, trace time alone cannot tell a node that stopped reporting from one whose data is
    behind in the pipeline: after an outage the agents' spools drain faster than real time,
    and the worker segmenting one node can be seconds of trace time behind the worker
    segmenting the others. So, live, a node whose data end (``observe_data_end``, forwarded
    by the segment stage) still moved within the last ``hold_ns`` read as wall time and has
    not gone ``hold_ns`` past its last record is lagging, not stopped: it keeps holding the
    watermark, and no operator ending less than ``hold_ns`` before its data end goes out
    without it (nor for idleness while its data still comes). Offline (``now`` left at 0)
    the bounds stay in trace time only.
    """

    def __init__(self, hold_ns: int, idle_s: float) -> None:
        self.hold_ns = hold_ns
        self.idle_s = idle_s
        self.pending: dict[str, dict[int, dict[int, OpMetrics]]] = {}
        self.known: dict[str, set[int]] = {}
        self.calibrated: set[str] = set()
        self.node_end: dict[str, int] = {}
        self.last_add = 0.0
        self.data_end: dict[str, int] = {}
        self.data_moved: dict[str, float] = {}
        """Per node: how far its data was segmented (trace time), and when that last moved (wall)."""

    def observe_data_end(self, node: str, end_ns: int, now: float) -> None:
        if end_ns > self.data_end.get(node, -(1 << 62)):
            self.data_end[node] = end_ns
            self.data_moved[node] = now

    def _lagging(self, now: float) -> dict[str, int]:
        """Live: the data end of each node whose data is still coming and has not gone the
        hold past its last record (class docstring); nothing offline."""
        if now <= 0.0:
            return {}
        hold_s = self.hold_ns / 1e9
        return {n: e for n, e in self.data_end.items()
                if now - self.data_moved[n] < hold_s and e - self.node_end.get(n, e) < self.hold_ns}

    def add(self, m: OpMetrics, now: float) -> None:
        self.pending.setdefault(m.comm_id, {}).setdefault(m.seq, {})[m.rank] = m
        self.known.setdefault(m.comm_id, set()).add(m.rank)
        self.node_end[m.node] = max(self.node_end.get(m.node, m.end_ns), m.end_ns)
        self.last_add = now

    def _complete(self, comm: str, recs: dict[int, OpMetrics]) -> bool:
        # Not "the ranks seen so far" at first: under skew those are one node's, and an
        # operator released without its late ranks would have them dropped as too late.
        # But only ranks that send data report an operator (`reporting_ranks`). Once a
        # communicator's ranks have reported (an operator of it was released), a rank that
        # never reports for it (its ring hop inside a node) is not waited for either.
        # Without this, such operators waited for the hold bound and, released in seq
        # order, held back every later one of their communicator.
        rec = next(iter(recs.values()))
        need = reporting_ranks(rec.kind, rec.nranks)
        if comm in self.calibrated:
            need = min(need, len(self.known.get(comm, ())))
        return len(recs) >= need

    def ready(self, now: float, *, flush: bool = False) -> list[OpMetrics]:
        """Operators that can go out now (all of them with ``flush``: the input ended)."""
        if not self.node_end:
            return []
        lagging = {} if flush else self._lagging(now)
        floor = min(lagging.values(), default=1 << 62)  # the data end of the most lagging node
        idle = flush or (now - self.last_add >= self.idle_s
                         and not any(now - self.data_moved[n] < self.idle_s for n in lagging))
        top = max(self.node_end.values())
        wm = min(end for n, end in self.node_end.items() if end >= top - self.hold_ns or n in lagging)
        chosen: list[tuple[int, str, int]] = []
        for comm, ops in self.pending.items():
            for seq in sorted(ops):
                recs = ops[seq]
                end = max(r.end_ns for r in recs.values())
                held = top - end < self.hold_ns or floor - end < self.hold_ns
                if not (idle or not held or (end <= wm and self._complete(comm, recs))):
                    break
                chosen.append((end, comm, seq))
        out: list[OpMetrics] = []
        for _, comm, seq in sorted(chosen):
            recs = self.pending[comm].pop(seq)
            self.calibrated.add(comm)
            out += [recs[r] for r in sorted(recs)]
        return out

    @property
    def held(self) -> int:
        return sum(len(r) for ops in self.pending.values() for r in ops.values())
