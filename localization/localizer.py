"""The streaming localizer: operator metrics in, verdicts out, one instance per job.

Per closed operator, :func:`.observations.judge` yields observations (slow/clean links,
late arrivals, point-to-point waits, stalls, absences). The localizer keeps them as
evidence (:mod:`.evidence`) and, after every operator, asks the rule families
(:mod:`.rules`) to explain what persists; :mod:`.decisions` turns their hypotheses into
incidents and verdicts. This module only coordinates: closing operators in order, feeding
the evidence, asking the rules. The families:

* **stops** (:mod:`.rules.stops`) - a member that never started an operator its peers
  are stuck in (and is not itself stuck in an incomplete operator) is compute-stop;
  otherwise the node on the most stalled links (the one that could not send or receive)
  is network-stop.
* **slow links** (:mod:`.rules.links`, :mod:`.rules.host`) - one node on every
  persistently slow link is the culprit. Slow in both directions, or only into it, is its
  NIC / PCIe / downlink: network-slow. Only out of it, on several of its NICs, while
  traffic into the same NICs runs normally, is its host not posting sends fast enough:
  host-contention (a NIC or link fault slows both directions; a starved proxy thread
  slows what the node itself sends). Slow links only between two nodes that each still
  talk cleanly to third nodes are a path (group). Otherwise the smallest set of nodes
  covering the slow links is the group (e.g. one leaf switch).
* **rail skew** (:mod:`.rules.rail`) - records that end milliseconds after the same
  operator on the node's other NICs (one node's clock) implicate that NIC's communicator;
  the node present in all of them, on one NIC of its own, has a stalling NIC (a flap):
  network-slow. Two nodes that only ever appear together are reported as a group.
* **late arrivals** (:mod:`.rules.late`) - a node persistently last into collectives whose
  traffic is normal, that does not itself wait for anyone on point-to-point sends, is
  compute-slow (a node that waits on its pipeline peer is late because of that peer).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from pulse.events import COLLECTIVES, GROUPED, HookEvent, OpEvent, reporting_ranks
from pulse.records import OpMetrics, Verdict

from .decisions import DecisionBook, Hypothesis, Key
from .evidence import STEP_UNKNOWN, Evidence, node_of
from .finding import ABSENT, ISSUE_LAG, LATE, MISSING, STALL, Finding
from .observations import OpView, judge
from .params import LocalizeParams
from .rules import hypotheses
from .rules.late import late_explained, late_findings
from .rules.rail import judge_rails
from .topology import Topology


class Localizer:
    """Compares the ranks of each operator and, over a window of operators, names the
    culprit node (or group) and the kind of fault.

    Feed hook events with :meth:`add_events` (membership: rank -> node, nranks; flow
    bindings: NICs and send peers), operator metrics with :meth:`update`, optionally the
    end of each node's data with :meth:`observe_data_end` (lets a batch run tell a stalled
    operator from one cut off by the end of the input), and call :meth:`finish` at the end.
    """

    def __init__(self, params: LocalizeParams | None = None, *, job: str | None = None) -> None:
        self.p = params or LocalizeParams()
        self.topo = Topology()
        self.job = job
        self.ev = Evidence(self.p, self.topo)
        self.book = DecisionBook(self.p)
        self._pending: dict[str, dict[int, dict[int, OpMetrics]]] = defaultdict(lambda: defaultdict(dict))
        self._max_seq: dict[str, int] = {}
        self._closed_upto: dict[str, int] = {}
        self.late_records = 0
        """Records that came after their operator was judged (without them)."""
        self._final = False
        self._eps: dict[tuple[str, int, str, tuple[str, ...] | None], str] = {}
        self._peer_eps: dict[tuple[str, int, str], tuple[str, ...]] = {}
        self._eps_version = -1

    # -- input ------------------------------------------------------------------------------

    def add_events(self, events: Iterable[HookEvent]) -> None:
        for e in events:
            if self.job is None:
                self.job = e.job
            if isinstance(e, OpEvent):
                if e.kind == "Recv":
                    # the receiver's side of a point-to-point operator has no record of
                    # its own (it sends no data): remember who waits for what
                    self.ev.stops.note_recv(e)
                continue
            self.topo.add([e])

    def observe_data_end(self, node: str, end_ns: int, nic_ends: dict[str, int] | None = None,
                         nic_tx: dict[str, int] | None = None) -> None:
        """The node's data (epoch batches, node clock) is known to extend to ``end_ns``;
        ``nic_ends``: each NIC's own end when some lag behind (None: every NIC reaches it);
        ``nic_tx``: the end of the last epoch some NICs transmitted in (the latest kept)."""
        if end_ns > self.ev.data_end.get(node, -(1 << 62)):
            self.ev.data_end[node] = end_ns
        for nic, t in (nic_tx or {}).items():
            ep = f"{node}/{nic}"
            if t > self.ev.nic_tx.get(ep, -(1 << 62)):
                self.ev.nic_tx[ep] = t
        if nic_ends:
            self.ev.nic_end[node] = dict(nic_ends)
        else:
            self.ev.nic_end.pop(node, None)

    def observe_gaps(self, node: str, gaps: dict[str, int]) -> None:
        """What of ``node``'s input was not used so far (cumulative counts): verdicts say so."""
        if gaps:
            self.ev.degraded[node] = dict(gaps)

    def update(self, metrics: Iterable[OpMetrics]) -> list[Verdict]:
        touched: set[str] = set()
        for m in metrics:
            if self.job is None:
                self.job = m.job
            self.topo.learn_rank(m.comm_id, m.rank, m.node, m.nranks, m.nics)
            if m.seq <= self._closed_upto.get(m.comm_id, -1):
                self.late_records += 1  # arrived after its operator was judged: too late to matter
                continue
            self.ev.stops.note_record(m)
            self._pending[m.comm_id][m.seq][m.rank] = m
            self.ev.rail.note_record(m)
            self.ev.alive.note(m)
            self._max_seq[m.comm_id] = max(self._max_seq.get(m.comm_id, -1), m.seq)
            touched.add(m.comm_id)
        return self._close(touched, final=False)

    def finish(self) -> list[Verdict]:
        self._final = True  # the end of the data: every remaining operator re-evaluates
        closed = self.ev.closed_ops
        out = self._close(set(self._pending), final=True)
        if self.ev.closed_ops == closed and closed:
            # nothing was left to judge: the end of the data is still a time to decide (what
            # the last operators showed may have come in after the last evaluation)
            out += self.book.decide(self.ev, set(), self.job or "", True, self._hypotheses, [])
        if not self.book.any_alarm and self.ev.closed_ops and not any(v.status == "healthy" for v in out):
            out.append(self.book.healthy(self.job or "", self.ev))
        return out

    # -- closing operators ---------------------------------------------------------------------

    def _close(self, comms: set[str], final: bool) -> list[Verdict]:
        """Judge every operator that is ready, in trace-time order across communicators
        (so a batch run sees operators in the order a live run would)."""
        ready: list[tuple[int, str, int, dict[int, OpMetrics]]] = []
        for comm in sorted(comms):
            ops = self._pending.get(comm)
            if not ops:
                continue
            members = self.topo.members(comm)
            nranks = self.topo.nranks.get(comm, len(members))
            for seq in sorted(ops):
                recs = ops[seq]
                full = len(recs) >= reporting_ranks(next(iter(recs.values())).kind, max(nranks, len(members)))
                if not (final or full or self._max_seq.get(comm, -1) >= seq + self.p.close_lag):
                    break
                del ops[seq]
                self._closed_upto[comm] = max(self._closed_upto.get(comm, -1), seq)
                ready.append((min(r.end_ns for r in recs.values()), comm, seq, recs))
        ready.sort(key=lambda x: (x[0], x[1], x[2]))
        out: list[Verdict] = []
        for _, comm, seq, recs in ready:
            out += self._judge_op(comm, seq, recs)
        return out

    def _endpoint(self, comm: str, rank: int, node: str, nics: Iterable[str] | None = None) -> str:
        known = sorted(self.topo.rank_nics.get((comm, rank), ()))
        if not known and nics:
            known = sorted(n if "/" in n else f"{node}/{n}" for n in nics)
        return known[0] if known else f"{node}/{comm}:{rank}"

    def _view(self, comm: str, seq: int, ordered: list[OpMetrics]) -> OpView:
        topo = self.topo
        if topo.version != self._eps_version:
            # endpoints and peers only change with the membership: computed once per rank
            # (sorting NIC sets per record was a good part of each operator's cost)
            self._eps.clear()
            self._peer_eps.clear()
            self._eps_version = topo.version
        known = topo.members(comm)
        members = dict(known)
        for r in ordered:
            members.setdefault(r.rank, r.node)
        endpoints = []
        peer_eps = []
        for r in ordered:
            key = (comm, r.rank, r.node, tuple(r.nics) if r.nics else None)
            ep = self._eps.get(key)
            if ep is None:
                ep = self._eps[key] = self._endpoint(comm, r.rank, r.node, r.nics)
            endpoints.append(ep)
            pkey = (comm, r.rank, r.node)
            pe = self._peer_eps.get(pkey)
            if pe is None:
                peers = topo.peers_of(comm, r.rank)
                eps = {self._endpoint(comm, pr, members.get(pr, "?")) for pr in peers}
                pe = tuple(sorted(e for e in eps if node_of(e) not in (r.node, "?")))
                if all(pr in known for pr in peers):  # else the records' own nodes were used
                    self._peer_eps[pkey] = pe
            peer_eps.append(pe)
        own = {r.rank: ep for r, ep in zip(ordered, endpoints, strict=True)}

        def endpoint_of(rank: int) -> str:
            ep = own.get(rank)
            return ep if ep is not None else self._endpoint(comm, rank, members.get(rank, "?"))

        def egress_busy(i: int) -> bool:
            r = ordered[i]
            return self.ev.alive.busy(endpoints[i], r.start_ns, r.end_ns, comm, r.kind)

        return OpView(comm, seq, ordered[0].kind, members, ordered, endpoints, peer_eps, self._stalled(ordered),
                      endpoint_of, egress_busy)

    def _observe_step(self, comm: str, seq: int, view: OpView, ordered: list[OpMetrics],
                       lags: list[tuple[int, float]]) -> None:
        """Feed one collective to the consistent-latest test (:mod:`.late_stragglers`):
        its ranks' rises above their baselines and the compute-gap veto. Asked before
        this operator's ends are recorded (the veto reads the previous operator's)."""
        ev, p = self.ev, self.p
        lag_of = dict(lags)
        rises = ev.late_base.rises_of(comm, ordered, lags)

        def finding(i: int) -> Finding:
            r = ordered[i]
            return Finding(LATE, comm, seq, r.rank, r.node, view.endpoints[i], lag_of[i],
                           lag_of[i] - rises[i], ISSUE_LAG, r.start_ns, r.end_ns, view.peer_eps[i],
                           r.flows, r.epoch_ns)

        ev.late_stragglers.observe(comm, ordered, rises, finding, lambda f: late_explained(ev, p, comm, seq, f, ordered))

    def _entries(self, comm: str, ordered: list[OpMetrics],
                 lags: list[tuple[int, float]]) -> tuple[dict[int, float] | None, float]:
        """Per record index, its rank's rise into the operator (:meth:`.LateBaselines.rises_of`),
        and two sigmas of the job's healthy spread of rises for its shape (0 while unknown)."""
        if not lags:
            return None, 0.0
        base = self.ev.late_base
        th = base.threshold(base.shape(ordered[0]), ordered[0].epoch_ns)
        noise = self.p.late_weak_sigmas * th / self.p.late_spread_k if th is not None else 0.0
        return base.rises_of(comm, ordered, lags), noise

    def _rose(self, comm: str, ordered: list[OpMetrics], lags: list[tuple[int, float]]) -> set[int]:
        """Record indexes whose issue lag rose above their rank's baseline by
        ``late_weak_sigmas`` of the job's healthy spread for the operator's shape (the
        full threshold over ``late_spread_k``, its floor included)."""
        base = self.ev.late_base
        rises = list(base.rises_of(comm, ordered, lags).items())
        # the threshold is at least its floor: below that share of it no rise counts, and
        # the spread's medians are not worth computing
        least = self.p.late_weak_sigmas / self.p.late_spread_k * self.p.late_floor_epochs * ordered[0].epoch_ns
        if not rises or max(x for _, x in rises) < max(least, 1.0):
            return set()
        th = base.threshold(base.shape(ordered[0]), ordered[0].epoch_ns)
        if th is None:
            return set()
        weak = self.p.late_weak_sigmas * th / self.p.late_spread_k
        return {i for i, x in rises if x >= weak}

    def _stalled(self, ordered: list[OpMetrics]) -> list[bool]:
        """Which records of one operator stalled. A record whose NIC's data ended early (its
        capture stopped publishing, the node's other NICs went on) is only taken as stalled
        when a record of the same operator on another node stalled in data that went on: a
        NIC that went down stalls its peers too; a capture that died leaves them complete."""
        stalled = [self.ev.stalled(r) for r in ordered]
        cut = [s and self.ev.nic_cut(r) for r, s in zip(ordered, stalled, strict=True)]
        if not any(cut):
            return stalled
        seen = {r.node for r, s, c in zip(ordered, stalled, cut, strict=True) if s and not c}
        return [s and (not c or bool(seen - {r.node})) for r, s, c in zip(ordered, stalled, cut, strict=True)]

    def _judge_op(self, comm: str, seq: int, recs: dict[int, OpMetrics]) -> list[Verdict]:
        """Observe one closed operator, add what it shows to the evidence, then decide."""
        ev, p = self.ev, self.p
        ordered = [recs[r] for r in sorted(recs)]
        ev.stops.note_judged(comm, seq, [r.node for r in ordered])
        view = self._view(comm, seq, ordered)
        if view.kind != GROUPED:
            for r, pe in zip(ordered, view.peer_eps, strict=True):
                for d in pe:
                    ev.alive.note_into(d, r.start_ns, r.end_ns)
        stragglers = ev.stragglers.observe(comm, ordered, [len(e) for e in view.peer_eps])
        capped = (ev.ceilings.capped(comm, ordered, [len(e) for e in view.peer_eps], view.egress_busy)
                  if view.egress_busy is not None else {})
        burst = None
        if view.kind == GROUPED:
            def burst(i: int) -> float | None:
                return ev.ceilings.slow_burst(comm, ordered[i])
        j = judge(view, p, ev.refs.of(ordered[0]), ev.refs.stretch(ordered[0]), stragglers, capped, burst)
        if all(r.complete for r in ordered):
            ev.refs.add(ordered)
        ev.closed_ops += 1
        self.book.since_healthy += 1
        ev.last_end_ns = max(ev.last_end_ns, max(r.end_ns for r in ordered))

        for lk in j.links:
            ev.links.add(lk)
            if not lk.shared:
                ev.single_links.add(lk)
        for lk in j.paced:
            ev.paced.add(lk)
        for e, end, rate in j.intake:
            ev.intake.add(e, end, rate)
        # the lateness veto reads the previous operators' ends: ask it before recording these
        cands = {f.rank: f for f in j.findings if f.kind == LATE}
        rises, noise = self._entries(comm, ordered, j.issue_lags)
        if rises:
            ev.stragglers.rises(comm, tuple(r.rank for r in ordered), {ordered[i].rank: x for i, x in rises.items()},
                                noise)
        for i, lag, base in ev.late_base.judge(comm, ordered, j.issue_lags):
            r = ordered[i]
            cands.setdefault(r.rank, Finding(LATE, comm, seq, r.rank, r.node, view.endpoints[i], lag, base,
                                             ISSUE_LAG, r.start_ns, r.end_ns, view.peer_eps[i]))
        if j.judged and view.kind in COLLECTIVES:
            self._observe_step(comm, seq, view, ordered, j.arrivals)
        late = late_findings(ev, p, comm, seq, cands, ordered)
        for r in ordered:
            ev.late.prev[(comm, r.rank)] = r
        if len(ordered) >= p.late_min_ranks and j.judged:
            rose = self._rose(comm, ordered, j.issue_lags)
            step = ev.late_stragglers.step_no.get(comm, STEP_UNKNOWN) if view.kind in COLLECTIVES else None
            for i in j.judged:
                r = ordered[i]
                ev.late.add(r.node, comm, late.get(r.rank), i in rose, step)
        for node, w in j.waits:
            ev.late.add_wait(node, w)
        missed: list[str] = []
        for f in j.findings:
            if f.kind == MISSING:
                ev.missing[f.node] += 1
                missed.append(f.node)
            elif f.kind == STALL:
                ev.stops.stalls.append(f)
            elif f.kind == ABSENT:
                ev.stops.absent.append(f)
        if view.kind == GROUPED:
            ev.stops.note_grouped(ordered, {f.node for f in j.findings if f.kind == STALL})
        for i in j.judged:
            ev.missing[ordered[i].node] = 0
            # its records are back: judge it again (a node missing from the first operators,
            # a capture that started late, was otherwise exempt for the rest of the job, and
            # a slow link at it never counted)
            ev.insufficient.discard(ordered[i].node)
        judge_rails(ev, p, comm, ordered, view.endpoints, view.peer_eps, rises, noise)
        touched = {node_of(e) for e in view.endpoints}
        return self.book.decide(ev, touched, self.job or "", self._final, self._hypotheses, missed)

    def _hypotheses(self) -> dict[Key, Hypothesis]:
        opened = self.book.open.values()
        return hypotheses(self.ev, self.p, {n for inc in opened for n in inc.nodes},
                          {e for inc in opened if inc.kind in ("network-slow", "network-stop") for e in inc.nics})


def localize(metrics: Iterable[OpMetrics], events: Iterable[HookEvent],
             params: LocalizeParams | None = None, *, data_end: dict[str, int] | None = None) -> list[Verdict]:
    """Batch form: all hook events first, then the metrics in end-time order."""
    loc = Localizer(params)
    loc.add_events(events)
    for node, end in (data_end or {}).items():
        loc.observe_data_end(node, end)
    out = loc.update(sorted(metrics, key=lambda m: (m.end_ns, m.comm_id, m.seq, m.rank)))
    return out + loc.finish()
