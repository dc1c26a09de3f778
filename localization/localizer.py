"""The streaming localizer: operator metrics in, verdicts out, one instance per job.

Per closed operator, :func:`rules.judge` yields observations (slow/clean links, late
arrivals, point-to-point waits, stalls, absences). The localizer keeps them over a window
and, after every operator, explains what persists:

* **stops** - a member that never started an operator its peers are stuck in (and is not
  itself stuck in an incomplete operator) is compute-stop; otherwise the node on the most
  stalled links (the one that could not send or receive) is network-stop.
* **slow links** - one node on every persistently slow link is the culprit. Slow in both
  directions, or only into it, is its NIC / PCIe / downlink: network-slow. Only out of it,
  on several of its NICs, while traffic into the same NICs runs normally, is its host not
  posting sends fast enough: host-contention (a NIC or link fault slows both directions;
  a starved proxy thread slows what the node itself sends). Slow links only between two
  nodes that each still talk cleanly to third nodes are a path (group). Otherwise the
  smallest set of nodes covering the slow links is the group (e.g. one leaf switch).
* **rail skew** - records that end milliseconds after the same operator on the node's other
  NICs (one node's clock) implicate that NIC's communicator; the node present in all of
  them, on one NIC of its own, has a stalling NIC (a flap): network-slow. Two nodes that
  only ever appear together are reported as a group.
* **late arrivals** - a node persistently last into collectives whose traffic is normal,
  that does not itself wait for anyone on point-to-point sends, is compute-slow (a node
  that waits on its pipeline peer is late because of that peer).
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from typing import Any

import numpy as np

from pulse.events import GROUPED, P2P, HookEvent, OpEvent
from pulse.records import OpMetrics, Verdict

from .params import LocalizeParams
from .robust import RollingRef, median
from .rules import ABSENT, LATE, MISSING, RAIL, STALL, Finding, LinkObs, OpView, judge
from .topology import Topology

Key = tuple[str, tuple[str, ...]]


@dataclasses.dataclass
class _Incident:
    kind: str
    level: str
    nodes: tuple[str, ...]
    findings: list[Finding]
    confidence: float
    extra: dict[str, Any]
    ranks: list[int] = dataclasses.field(default_factory=list)
    nics: list[str] = dataclasses.field(default_factory=list)
    first_seen_ns: int = 0
    judged_since: int = 0
    clean_run: int = 0


def _node(endpoint: str) -> str:
    return endpoint.split("/", 1)[0]


def _excess(fs: list[Finding]) -> float:
    """Median slowdown of findings over their reference (0.3 = 30 % slower)."""
    xs = [f.value / f.peers - 1.0 for f in fs if f.metric == "act_ns" and f.peers > 0]
    return float(np.median(xs)) if xs else 0.0


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
        self._pending: dict[str, dict[int, dict[int, OpMetrics]]] = defaultdict(lambda: defaultdict(dict))
        self._max_seq: dict[str, int] = {}
        self._closed_upto: dict[str, int] = {}
        self._data_end: dict[str, int] = {}
        self._act_ref: dict[tuple[str, int, int], RollingRef] = defaultdict(lambda: RollingRef(512))
        w = self.p.window_ops
        self._links: dict[tuple[str, str], deque[LinkObs]] = defaultdict(lambda: deque(maxlen=w))
        self._late: dict[tuple[str, str], deque[Finding | None]] = defaultdict(
            lambda: deque(maxlen=self.p.late_window))
        self._waits: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=4 * w))
        self._all_waits: deque[float] = deque(maxlen=1024)
        self._last_recv: dict[tuple[str, str], tuple[int, int, int]] = {}
        self._p2p_done: dict[str, int] = {}
        self._p2p_seen: dict[str, int] = {}
        self._p2p_issued: dict[tuple[str, str], int] = {}
        """(comm, node) -> the last receive that node's rank posted there (its seq)."""
        self._stalls: list[Finding] = []
        self._absent: list[Finding] = []
        self._missing: Counter[str] = Counter()
        self._insufficient: set[str] = set()
        self._incidents: dict[Key, _Incident] = {}
        self._closed_ops = 0
        self._since_healthy = 0
        self._any_alarm = False
        self._last_end_ns = 0
        self._n_slow = 0
        self._link_slow: Counter[tuple[str, str]] = Counter()
        """Slow observations per link window."""
        self._hot: dict[tuple[str, str], None] = {}
        """Links with at least persist_ops slow observations (candidates for _link_state)."""
        """Slow observations inside the link windows (no slow link, no network hypothesis)."""
        self._n_late = 0
        """Late findings inside the lateness windows."""
        self._siblings: dict[tuple[Any, ...], list[tuple[int, int, str]]] = {}
        """(node, kind, seq, bytes, nranks, member nodes) -> (end_ns, t_host_ns, comm) per NIC."""
        self._rail: deque[tuple[Finding, frozenset[str]]] = deque(maxlen=64)
        self._comm_nodes: dict[str, frozenset[str]] = {}
        self._alive: dict[str, tuple[list[int], list[str]]] = {}
        """node/nic -> recent wire times (sorted, node clock) at which the NIC moved bytes,
        and the communicator of each."""
        self._hyps: dict[Key, _Incident] = {}
        self._hyps_at: int | None = None
        self._prev_end: dict[tuple[str, int], tuple[int, int]] = {}
        """(comm, rank) -> (seq, end_ns) of its last judged operator."""
        self._final = False

    # -- input ------------------------------------------------------------------------------

    def add_events(self, events: Iterable[HookEvent]) -> None:
        for e in events:
            if self.job is None:
                self.job = e.job
            if isinstance(e, OpEvent):
                if e.kind == "Recv":
                    # the receiver's side of a point-to-point operator has no record of
                    # its own (it sends no data): remember who waits for what
                    key = (e.comm_id, e.node)
                    self._p2p_issued[key] = max(self._p2p_issued.get(key, -1), e.seq)
                    if e.t_host_ns is not None and e.rank is not None:
                        self._last_recv[key] = (e.seq, e.rank, e.t_host_ns)
                continue
            self.topo.add([e])

    def observe_data_end(self, node: str, end_ns: int) -> None:
        """The node's data (epoch batches, node clock) is known to extend to ``end_ns``."""
        if end_ns > self._data_end.get(node, -(1 << 62)):
            self._data_end[node] = end_ns

    def update(self, metrics: Iterable[OpMetrics]) -> list[Verdict]:
        touched: set[str] = set()
        for m in metrics:
            if self.job is None:
                self.job = m.job
            self.topo.learn_rank(m.comm_id, m.rank, m.node, m.nranks, m.nics)
            if m.seq <= self._closed_upto.get(m.comm_id, -1):
                continue  # arrived after its operator was judged: too late to matter
            if m.kind in P2P:
                self._p2p_seen[m.comm_id] = max(self._p2p_seen.get(m.comm_id, -1), m.seq)
                if m.complete:
                    self._p2p_done[m.comm_id] = max(self._p2p_done.get(m.comm_id, -1), m.seq)
            self._pending[m.comm_id][m.seq][m.rank] = m
            if m.complete and m.kind != GROUPED and m.t_host_ns is not None:
                self._siblings.setdefault(self._sibling_key(m), []).append((m.end_ns, m.t_host_ns, m.comm_id))
            self._note_alive(m)
            self._max_seq[m.comm_id] = max(self._max_seq.get(m.comm_id, -1), m.seq)
            touched.add(m.comm_id)
        return self._close(touched, final=False)

    def finish(self) -> list[Verdict]:
        self._final = True  # the end of the data: every remaining operator re-evaluates
        out = self._close(set(self._pending), final=True)
        if not self._any_alarm and self._closed_ops:
            out.append(self._healthy())
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
                full = len(recs) >= max(nranks, len(members))
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

    def _stalled(self, m: OpMetrics) -> bool:
        if m.complete:
            return False
        end = self._data_end.get(m.node)
        # Without a known data end the segmenter only reports an operator incomplete
        # after it stalled; with one, an operator cut off by the end of the input is not.
        return end is None or end - m.end_ns >= self.p.stall_ns

    def _judge_op(self, comm: str, seq: int, recs: dict[int, OpMetrics]) -> list[Verdict]:
        ordered = [recs[r] for r in sorted(recs)]
        members = dict(self.topo.members(comm))
        for r in ordered:
            members.setdefault(r.rank, r.node)
        endpoints = [self._endpoint(comm, r.rank, r.node, r.nics) for r in ordered]
        peer_eps = []
        for r in ordered:
            eps = {self._endpoint(comm, pr, members.get(pr, "?")) for pr in self.topo.peers_of(comm, r.rank)}
            peer_eps.append(tuple(sorted(e for e in eps if _node(e) not in (r.node, "?"))))
        view = OpView(comm, seq, ordered[0].kind, members, ordered, endpoints, peer_eps,
                      [self._stalled(r) for r in ordered])
        grouped = ordered[0].kind == GROUPED
        # GroupP2P volumes differ per operator (expert imbalance): its job-wide reference
        # is the rank-level rate of all grouped operators of that size (the median)
        cls = (ordered[0].kind, 0 if grouped else ordered[0].expected_bytes, ordered[0].nranks)
        ref = self._act_ref[cls]
        act_ref = None
        if len(ref) >= self.p.ref_min:
            act_ref = ref.percentile(50 if grouped else 25)
        j = judge(view, self.p, act_ref)
        if all(r.complete for r in ordered):
            ref.extend(np.array([r.active_rate if grouped else r.act_ns for r in ordered if r.act_ns > 0],
                                dtype=np.float64))
        self._closed_ops += 1
        self._since_healthy += 1
        self._last_end_ns = max(self._last_end_ns, max(r.end_ns for r in ordered))

        for lk in j.links:
            key = (lk.src, lk.dst)
            win = self._links[key]
            if len(win) == win.maxlen and win[0].slow:
                self._n_slow -= 1
                self._link_slow[key] -= 1
            win.append(lk)
            if lk.slow:
                self._n_slow += 1
                self._link_slow[key] += 1
            if self._link_slow[key] >= self.p.persist_ops:
                self._hot[key] = None
            else:
                self._hot.pop(key, None)
        late = {f.rank: f for f in j.findings if f.kind == LATE and not self._late_explained(comm, seq, f, ordered)}
        for r in ordered:
            self._prev_end[(comm, r.rank)] = (seq, r.end_ns)
        if len(ordered) >= self.p.late_min_ranks and j.judged:
            for i in j.judged:
                r = ordered[i]
                lw = self._late[(r.node, comm)]
                if len(lw) == lw.maxlen and lw[0] is not None:
                    self._n_late -= 1
                lw.append(late.get(r.rank))
                self._n_late += r.rank in late
        for node, w in j.waits:
            self._waits[node].append(w)
            self._all_waits.append(w)
        for f in j.findings:
            if f.kind == MISSING:
                self._missing[f.node] += 1
            elif f.kind == STALL:
                self._stalls.append(f)
            elif f.kind == ABSENT:
                self._absent.append(f)
        for i in j.judged:
            self._missing[ordered[i].node] = 0
        self._judge_rails(comm, ordered, endpoints, peer_eps)
        touched = {_node(e) for e in endpoints}
        return self._decide(touched)

    # -- explanations ------------------------------------------------------------------------------

    def _waits_on_recv(self) -> tuple[set[str], list[Finding]]:
        """Nodes stuck in a point-to-point receive (for longer than a stall), and findings
        for senders that never even issued the send those receivers wait for."""
        waiting: set[str] = set()
        absent: list[Finding] = []
        for (comm, node), (seq, rank, t_host) in self._last_recv.items():
            end = self._data_end.get(node)
            if end is None or end - t_host < self.p.stall_ns or seq <= self._p2p_done.get(comm, -1):
                continue
            waiting.add(node)
            if seq > self._p2p_seen.get(comm, -1):
                for r, n in self.topo.members(comm).items():
                    if r != rank and n != node:
                        absent.append(Finding(ABSENT, comm, seq, r, n, n, 0.0, 1.0, "started", t_host, t_host))
        return waiting, absent

    def _unposted_receivers(self) -> list[Finding]:
        """Findings for receivers that never issued the receive a stalled point-to-point
        send waits for (a hung GPU posts nothing): the sender is not stuck on its network.
        Only once the receiver's own data (when known) goes on for a stall's length past
        the send."""
        out: list[Finding] = []
        for f in self._stalls:
            if f.comm_id not in self._p2p_seen:
                continue
            members = self.topo.members(f.comm_id)
            for rank in self.topo.peers_of(f.comm_id, f.rank):
                peer = members.get(rank)
                last = self._p2p_issued.get((f.comm_id, peer or ""))
                end = self._data_end.get(peer or "")
                # as in _stalled: without a known data end (streaming), the stall itself
                # was only reported after stall_ns of the sender's data
                if (peer is not None and last is not None and last < f.seq
                        and (end is None or end - f.start_ns >= self.p.stall_ns)):
                    out.append(Finding(ABSENT, f.comm_id, f.seq, rank, peer, peer, 0.0, 1.0, "started",
                                       f.start_ns, f.start_ns))
        return out

    def _stop_hypotheses(self) -> dict[Key, _Incident]:
        if not self._stalls and not self._absent:
            return {}
        stuck_nodes = {f.node for f in self._stalls}
        waiting, p2p_absent = self._waits_on_recv()
        # A node missing from an operator is the stopped one only if it is not itself
        # stuck in communication (an incomplete send, a receive that never arrives).
        absent = [f for f in self._absent + p2p_absent + self._unposted_receivers()
                  if f.node not in stuck_nodes | waiting and f.node not in self._insufficient]
        if absent:
            # As with stalls, only the first absences say who stopped: the others are
            # ranks that stopped issuing because they wait for it (a pipeline partner
            # stuck in an AllReduce with the hung rank's node is absent from its sends).
            t0 = min(f.start_ns for f in absent)
            absent = [f for f in absent if f.start_ns <= t0 + self.p.stall_first_ns]
            if self._stalls and min(f.end_ns for f in self._stalls) + self.p.stall_first_ns < t0:
                absent = []  # the traffic stopped before anyone went missing: a stop's victims
        if absent:
            nodes = Counter(f.node for f in absent)
            node, n = nodes.most_common(1)[0]
            if n == sum(nodes.values()) or n > 2 * (sum(nodes.values()) - n):
                return {("compute-stop", (node,)): self._incident("compute-stop", "node", (node,),
                                                                  [f for f in absent if f.node == node])}
        if not any(f.value <= self.p.stop_frac for f in self._stalls):
            return {}
        # Each stalled record implicates its node and the peers it could not finish
        # sending to; the node on the most stalled links is where the traffic stopped.
        # Only the first stalls say where the traffic stopped: a stop hangs the job, and
        # the operators that stall afterwards (peers no longer posting receives, whole
        # pipeline stages waiting) implicate the victims. "First" spans stall_first_ns,
        # well above the clock offset, so no decision hangs on sub-offset timing.
        t0 = min(f.end_ns for f in self._stalls)
        first = [f for f in self._stalls if f.end_ns <= t0 + self.p.stall_first_ns]
        sets = [({f.node} | {_node(e) for e in f.peer_eps}) for f in first]
        hits = Counter(n for s in sets for n in s)
        # ties between a sender and its receiver: the node that sent the least (its own
        # stalled records, nearly empty) is where the traffic stopped
        sent = Counter(f.node for f in first if f.value <= self.p.stop_frac)
        ranked = sorted(hits.items(), key=lambda kv: (-kv[1], -sent.get(kv[0], 0), kv[0]))
        best, nb = ranked[0]
        tied = [n for n, c in ranked if c == nb]
        extra: dict[str, Any] = {}
        if len(tied) == 2:
            # the two ends of the stalled link(s): an end whose NIC went on moving bytes
            # with a third party after the traffic stopped was up (a receiver's dead NIC
            # stalls the sender at zero bytes too, so "sent the least" cannot tell them)
            alive = {x: self._alive_after(x, first) for x in tied}
            up = [x for x in tied if alive[x] >= self.p.rail_alive_min]
            if len(up) == 1 and not alive[tied[0] if up[0] == tied[1] else tied[1]]:
                extra["alive_after_stall"] = {up[0]: alive[up[0]]}
                tied = [x for x in tied if x != up[0]]
                best = tied[0]
        if len(tied) > 1 and sent.get(best, 0) > max(sent.get(n, 0) for n in tied[1:]):
            tied = [best]
        if len(tied) == 1:
            best = tied[0]
            own = [f for f in first if f.node == best] or first
            return {("network-stop", (best,)): self._incident("network-stop", "node", (best,), own, extra=extra)}
        grp = tuple(sorted(tied))
        return {("network-stop", grp): self._incident("network-stop", "group", grp, first)}

    def _link_state(self) -> tuple[dict[tuple[str, str], list[Finding]], set[tuple[str, str]]]:
        """Persistently slow links, and links seen clean since the slowness began (older
        clean observations say nothing about the fault)."""
        slow: dict[tuple[str, str], list[Finding]] = {}
        for key in self._hot:
            obs = self._links[key]
            if _node(key[0]) in self._insufficient or _node(key[1]) in self._insufficient:
                continue
            hits = [o.finding for o in obs if o.slow and o.finding is not None]
            if len(hits) >= self.p.persist_ops and len(hits) >= self.p.persist_frac * len(obs):
                slow[key] = hits
        clean: set[tuple[str, str]] = set()
        if slow:
            # Clean observations only count from when the slowness was there: the median
            # start of the slow hits, not the first (an outlier before the fault began
            # would let pre-fault traffic pass for clean evidence).
            since = int(np.median([f.start_ns for fs in slow.values() for f in fs]))
            for key, obs in self._links.items():
                if key in slow:
                    continue
                recent = [o for o in obs if o.end_ns >= since]
                if len(recent) >= self.p.link_min_obs and sum(o.slow for o in recent) <= 0.25 * len(recent):
                    clean.add(key)
        return slow, clean

    def _network_hypotheses(self) -> dict[Key, _Incident]:
        slow, clean = self._link_state()
        if not slow:
            return {}
        pairs = {(_node(a), _node(b)) for a, b in slow}
        nodes_in = sorted({n for pair in pairs for n in pair})
        covers = [x for x in nodes_in if all(x in pair for pair in pairs)]
        hits = [f for fs in slow.values() for f in fs]
        clean_pairs = {(_node(a), _node(b)) for a, b in clean}

        host = self._host_hypothesis(slow, clean)
        if host:
            return host
        senders = {s for s, _ in pairs}
        if len(senders) == 1 and len(covers) in (1, 2):
            # Only what x sends is slow, and no host verdict yet: until its receivers are
            # seen receiving cleanly from others (or slowly, a downlink), wait.
            x = next(iter(senders))
            out_nics = {k[0] for k in slow}
            receivers = {_node(k[1]) for k in slow}
            if len(out_nics) >= self.p.host_min_nics:
                rx_slow = any(_node(b) in receivers and _node(a) != x for a, b in slow)
                in_slow = any(_node(b) == x for a, b in slow)
                rx_ok = all(any(_node(b) == d and _node(a) != x for a, b in clean) for d in receivers)
                if not (rx_slow or in_slow or rx_ok):
                    return {}
        if len(slow) < 2:
            return {}  # one slow link fits its sender, its receiver and the path alike: wait
        if len(covers) == 1:
            x = covers[0]
            return {("network-slow", (x,)): self._incident("network-slow", "node", (x,), hits, culprit=x)}
        if len(covers) == 2:
            a, b = covers

            def by_path(src: str, dst: str) -> bool:
                # the sender still sends cleanly to a third node, and the receiver still
                # receives cleanly from one: neither NIC explains the slow link
                return (any(s == src and d not in (a, b) for s, d in clean_pairs)
                        and any(d == dst and s not in (a, b) for s, d in clean_pairs))
            nic_pairs = {tuple(sorted(k)) for k in slow}
            if all(by_path(s, d) for s, d in pairs):
                if len(nic_pairs) < self.p.path_min_links:
                    return {}  # one NIC pair only: a NIC or a path, wait for more evidence
                return {("path", (a, b)): self._incident("path", "group", (a, b), hits)}
            if len(nic_pairs) < 2:
                return {}  # both directions of one NIC pair: either NIC or the path, wait
            if not all(any(n in cp for cp in clean_pairs) for n in (a, b)):
                return {}  # nothing yet on a's or b's traffic with third nodes: NIC, host or path
            if len(senders) == 1:
                x = next(iter(senders))
                return {("network-slow", (x,)): self._incident("network-slow", "node", (x,), hits, culprit=x)}
            return {("path", (a, b)): self._incident("path", "group", (a, b), hits)}
        if len({tuple(sorted(k)) for k in slow}) < self.p.path_min_links:
            return {}
        remaining = set(pairs)
        group: list[str] = []
        while remaining and len(group) < self.p.max_group:
            best = max(nodes_in, key=lambda n: sum(n in pair for pair in remaining))
            group.append(best)
            remaining = {pair for pair in remaining if best not in pair}
        grp = tuple(sorted(group))
        return {("path", grp): self._incident("path", "group", grp, hits)}

    def _host_hypothesis(self, slow: dict[tuple[str, str], list[Finding]],
                         clean: set[tuple[str, str]]) -> dict[Key, _Incident]:
        """A starved host posts its sends late on every NIC it drives. Its own sends slow
        down far more than what it receives (the receive side keeps slots posted ahead, so
        a late proxy rarely stalls its senders), which a NIC, PCIe or link fault cannot do:
        those slow both directions alike. So x is host-contended when every slow link
        touches x, x's sends are slow on several of its NICs, the traffic into x is clean or
        much less slow, and the nodes x sends to still receive cleanly from others (else
        their downlinks are the problem). A link into x that is used and clean, or an
        out-link of x to another receiver that is slow too, rules out a path that only
        carries x's traffic one way."""
        nodes = sorted({_node(a) for a, _ in slow})
        for x in nodes:
            if not all(x in (_node(a), _node(b)) for a, b in slow):
                continue
            out_links = [k for k in slow if _node(k[0]) == x]
            out_nics = {k[0] for k in out_links}
            if len(out_nics) < self.p.host_min_nics:
                continue
            out_ex = _excess([f for k in out_links for f in slow[k]])
            in_links = [k for k in slow if _node(k[1]) == x]
            in_ex = _excess([f for k in in_links for f in slow[k]]) if in_links else 0.0
            if out_ex <= 0 or in_ex > self.p.host_in_frac * out_ex:
                continue
            receivers = {_node(k[1]) for k in out_links}
            if not all(any(_node(b) == d and _node(a) != x for a, b in clean) for d in receivers):
                continue
            reverse_used = bool(in_links) or any(_node(a) in receivers and _node(b) == x for a, b in clean)
            if not (reverse_used or len(receivers) >= 2):
                continue
            hits = [f for fs in slow.values() for f in fs]
            clean_in = sorted({b for a, b in clean if _node(b) == x})
            return {("host-contention", (x,)): self._incident(
                "host-contention", "node", (x,), hits, culprit=x,
                extra={"slow_out_nics": sorted(out_nics), "clean_in_nics": clean_in,
                       "out_excess": round(out_ex, 3), "in_excess": round(in_ex, 3)})}
        return {}

    def _member_nodes(self, comm: str) -> frozenset[str]:
        nodes = self._comm_nodes.get(comm)
        if nodes is None:
            members = self.topo.members(comm)
            nodes = frozenset(members.values())
            if len(members) >= self.topo.nranks.get(comm, 1 << 30):
                self._comm_nodes[comm] = nodes  # complete: membership no longer changes
        return nodes

    def _sibling_key(self, m: OpMetrics) -> tuple[Any, ...]:
        return (m.node, m.kind, m.seq, m.expected_bytes, m.nranks, self._member_nodes(m.comm_id) | {m.node})

    def _judge_rails(self, comm: str, ordered: list[OpMetrics], endpoints: list[str],
                     peer_eps: list[tuple[str, ...]]) -> None:
        """Compare each record with the same operator on its node's other NICs."""
        members = self._member_nodes(comm) | {r.node for r in ordered}
        for i, r in enumerate(ordered):
            if not r.complete or r.kind == GROUPED or r.t_host_ns is None:
                continue
            # siblings: the same operator issued at the same moment on the node's other NICs
            sib = [e for e, th, c in self._siblings.get(self._sibling_key(r), ())
                   if c != comm and abs(th - r.t_host_ns) <= self.p.rail_issue_ns]
            if len(sib) < self.p.rail_min_siblings:
                continue
            ref = median(sib)
            if r.end_ns - ref >= self.p.rail_late_ns:
                f = Finding(RAIL, comm, r.seq, r.rank, r.node, endpoints[i], float(r.end_ns - ref), 0.0,
                            "end_after_other_nics_ns", r.start_ns, r.end_ns, peer_eps[i])
                self._rail.append((f, members))
        if len(self._siblings) > 50_000:
            for k in list(self._siblings)[:25_000]:
                del self._siblings[k]

    def _late_explained(self, comm: str, seq: int, f: Finding, ordered: list[OpMetrics]) -> bool:
        """A late issue that follows a normal compute gap after a previous operator that
        ended late (its own sends, or the ring predecessor's it received last): the rank
        waited for the network, not for its own compute."""
        if self.p.late_gap_frac <= 0:
            return False
        gaps: dict[int, float] = {}
        for r in ordered:
            prev = self._prev_end.get((comm, r.rank))
            if prev is None or prev[0] != seq - 1 or r.t_host_ns is None:
                return False  # no previous operator to measure the gap from: keep the finding
            done = prev[1]
            # A rank whose own sends ended early still waits for the last chunk from its ring
            # predecessor (the lab's CPU-starved rank keeps its successor waiting while its
            # own predecessor's sends stall on a full receive window).
            for p in self.topo.ring_predecessors(comm, r.rank):
                pe = self._prev_end.get((comm, p))
                if pe is not None and pe[0] == seq - 1:
                    done = max(done, pe[1])
            gaps[r.rank] = float(r.t_host_ns - done)
        if f.rank not in gaps or len(gaps) < 2:
            return False
        others = median([g for rk, g in gaps.items() if rk != f.rank])
        lag = f.peers - f.value  # how much later than its peers the rank issued
        return gaps[f.rank] - others < self.p.late_gap_frac * lag

    def _note_alive(self, m: OpMetrics) -> None:
        times = [m.start_ns, m.end_ns] if m.volume_bytes > 0 else []
        if m.granted_ns is not None:
            times.append(m.granted_ns)
        for nic in (m.nics or ()) if times else ():
            ep = nic if "/" in nic else f"{m.node}/{nic}"
            ts, cs = self._alive.setdefault(ep, ([], []))
            for t in times:
                i = bisect.bisect_right(ts, t)  # records close nearly in time order: ~the end
                ts.insert(i, t)
                cs.insert(i, m.comm_id)
            if len(ts) > 512:
                del ts[:256], cs[:256]

    def _alive_in(self, ep: str, findings: list[Finding]) -> set[tuple[str, int]]:
        """The rail-late records during whose silent wait (issued with its siblings, not
        on the wire yet) ``ep`` moved bytes in another communicator."""
        ts, cs = self._alive.get(ep, ([], []))
        m = self.p.rail_alive_margin_ns
        hits = set()
        for f in findings:
            lo, hi = f.end_ns - f.value + m, f.start_ns - m
            if hi <= lo:
                continue
            i = bisect.bisect_right(ts, lo)
            while i < len(ts) and ts[i] < hi:
                if cs[i] != f.comm_id:
                    hits.add((f.comm_id, f.seq))
                    break
                i += 1
        return hits

    def _alive_after(self, node: str, first: list[Finding]) -> int:
        """Points at which ``node``'s NICs on the stalled links moved bytes in another
        communicator after the first stall's last progress (plus the clock-offset margin)."""
        eps = {f.endpoint for f in first if f.node == node}
        eps |= {e for f in first for e in f.peer_eps if _node(e) == node}
        comms = {f.comm_id for f in first}
        lo = min(f.end_ns for f in first) + self.p.rail_alive_margin_ns
        n = 0
        for ep in eps:
            ts, cs = self._alive.get(ep, ([], []))
            for i in range(bisect.bisect_right(ts, lo), len(ts)):
                n += cs[i] not in comms
        return n

    def _rail_hypotheses(self, explained: set[str]) -> dict[Key, _Incident]:
        while self._rail and self._rail[0][0].end_ns < self._last_end_ns - self.p.rail_keep_ns:
            self._rail.popleft()
        if len(self._rail) < self.p.rail_persist:
            return {}
        sets = [m for _f, m in self._rail]
        common = sorted(frozenset.intersection(*sets) - self._insufficient)
        findings = [f for f, _m in self._rail]
        if not common or len(common) > 2 or set(common) & explained:
            return {}
        for x in common:
            own = [f.endpoint for f in findings if f.node == x]
            if not own or Counter(own).most_common(1)[0][1] < self.p.rail_nic_frac * len(own):
                return {}  # x's late records spread over its NICs: not one NIC (a host)
        nic_of = {x: Counter(f.endpoint for f in findings if f.node == x).most_common(1)[0][0] for x in common}
        extra: dict[str, Any] = {}
        if len(common) == 2:
            # the two ends of one stalled link: an end seen moving bytes with a third party
            # while the link was silent was up; the other one stopped
            alive = {x: self._alive_in(nic_of[x], findings) for x in common}
            up = [x for x in common if len(alive[x]) >= self.p.rail_alive_min]
            if len(up) == 1 and not alive[common[0] if up[0] == common[1] else common[1]]:
                extra["alive_during_stall"] = {nic_of[up[0]]: sorted(f"{c}#{s}" for c, s in alive[up[0]])[:8]}
                common = [x for x in common if x != up[0]]
        nodes = tuple(common)
        level = "node" if len(nodes) == 1 else "group"
        nics = sorted(nic_of[x] for x in nodes)
        extra.update({"stalled_nics": nics, "comms": sorted({f.comm_id for f in findings})[:8]})
        inc = self._incident("network-slow", level, nodes, findings, culprit=nodes[0] if level == "node" else None,
                             extra=extra)
        inc.nics = nics
        return {("network-slow", nodes): inc}

    def _late_hypotheses(self, explained: set[str]) -> dict[Key, _Incident]:
        out: dict[Key, _Incident] = {}
        if not self._n_late:
            return out
        job_wait = float(np.median(self._all_waits)) if self._all_waits else 0.0
        # Lateness is judged per communicator (the buckets of one step are late
        # together: persistence must span several steps), then per node: most of the
        # node's communicators must show it.
        # A point-to-point (pipeline) peer of a node already blamed arrives late because
        # it waits for that node: not a second straggler.
        blamed = explained | {n for inc in self._incidents.values() for n in inc.nodes}
        waits_on_blamed: set[str] = set()
        if blamed:
            for comm, nr in self.topo.nranks.items():
                nodes = set(self.topo.members(comm).values())
                if nr == 2 and nodes & blamed:
                    waits_on_blamed |= nodes - blamed
        per_node: dict[str, list[tuple[int, list[Finding]]]] = defaultdict(list)
        for (node, _comm), win in self._late.items():
            hits = [f for f in win if f is not None]
            flagged = len(win) >= self.p.late_window // 2 and len(hits) >= self.p.late_frac * len(win)
            per_node[node].append((int(flagged), hits))
        for node, comms in per_node.items():
            if node in explained or node in self._insufficient or node in waits_on_blamed:
                continue
            if sum(f for f, _ in comms) < max(1, self.p.late_comm_frac * len(comms)):
                continue
            hits = [h for f, hs in comms if f for h in hs]
            waits = self._waits.get(node)
            if waits and len(waits) >= self.p.link_min_obs and float(np.median(waits)) > job_wait:
                # it waits for its point-to-point peers more than is usual: it is late
                # because of them (a pipeline victim); the straggler itself never waits
                continue
            out[("compute-slow", (node,))] = self._incident("compute-slow", "node", (node,), hits)
        return out

    def _hypotheses(self) -> dict[Key, _Incident]:
        hyps = self._stop_hypotheses()
        net = self._network_hypotheses()
        hyps.update(net)
        explained = {n for _k, nodes in net for n in nodes} | {n for _k, nodes in hyps for n in nodes}
        if not hyps:
            rail = self._rail_hypotheses(explained)
            hyps.update(rail)
            explained |= {n for _k, nodes in rail for n in nodes}
        hyps.update(self._late_hypotheses(explained))
        return hyps

    def _incident(self, kind: str, level: str, nodes: tuple[str, ...], fs: list[Finding],
                  culprit: str | None = None, extra: dict[str, Any] | None = None) -> _Incident:
        own = [f for f in fs if f.node in nodes] or fs
        if culprit is not None:
            own = [f for f in fs if f.node == culprit] or own
        ops = {(f.comm_id, f.seq) for f in own}
        conf = round(min(0.99, 0.5 + 0.05 * len(ops)), 3)
        inc = _Incident(kind, level, nodes, fs, conf, extra or {})
        inc.ranks = sorted({f.rank for f in own if f.node in nodes})
        nics = {f.endpoint for f in own if f.node in nodes and "/" in f.endpoint
                and ":" not in f.endpoint.split("/", 1)[1]}
        if not nics and kind in ("network-slow", "network-stop"):
            nics = {e for f in fs for e in f.peer_eps if _node(e) in nodes and ":" not in e.split("/", 1)[1]}
        inc.nics = sorted(nics)
        inc.first_seen_ns = min((f.start_ns for f in own), default=0)
        return inc

    # -- verdicts ---------------------------------------------------------------------------------

    def _decide(self, touched: set[str]) -> list[Verdict]:
        out: list[Verdict] = []
        for node, c in self._missing.items():
            if c >= self.p.missing_ops and node not in self._insufficient:
                self._insufficient.add(node)
                out.append(self._verdict(
                    "insufficient-data", None, "node", (node,), [], [], 0.5,
                    {"reason": f"no operator records from {node} in {c} operators its peers completed"},
                    {"ops": c}, self._last_end_ns))
        # Hypotheses only change when some window holds evidence (or an incident may clear).
        busy = self._n_slow or self._n_late or self._stalls or self._absent or self._incidents or self._rail
        if not busy:
            self._hyps, self._hyps_at = {}, None
        elif self._final or self._hyps_at is None or self._last_end_ns - self._hyps_at >= self.p.hypotheses_every_ns:
            self._hyps, self._hyps_at = self._hypotheses(), self._last_end_ns
        hyps = self._hyps
        for key, inc in hyps.items():
            cur = self._incidents.get(key)
            if cur is None:
                if any(k[0] != key[0] and set(key[1]) <= set(k[1]) for k in self._incidents):
                    continue  # one fault per node at a time: the open incident explains it
                self._incidents[key] = inc
                self._any_alarm = True
                out.append(self._anomaly(inc))
                continue
            cur.findings, cur.confidence, cur.extra = inc.findings, inc.confidence, inc.extra
            cur.ranks = sorted(set(cur.ranks) | set(inc.ranks))
            cur.nics = sorted(set(cur.nics) | set(inc.nics))
            cur.clean_run = 0
            if touched & set(cur.nodes):
                cur.judged_since += 1
                if cur.judged_since >= self.p.repeat_every:
                    cur.judged_since = 0
                    out.append(self._anomaly(cur))
        for key in list(self._incidents):
            if key in hyps:
                continue
            cur = self._incidents[key]
            if touched & set(cur.nodes):
                cur.clean_run += 1
            if cur.clean_run >= self.p.clear_ops:
                del self._incidents[key]
                out.append(self._verdict("cleared", cur.kind, cur.level, cur.nodes, cur.ranks, cur.nics,
                                         cur.confidence, {"cleared_after_clean_ops": cur.clean_run},
                                         {"ops": cur.clean_run}, cur.first_seen_ns))
        if not self._incidents and self._since_healthy >= self.p.healthy_every:
            out.append(self._healthy())
        return out

    def _healthy(self) -> Verdict:
        self._since_healthy = 0
        nodes = sorted({_node(k[0]) for k in self._links} - self._insufficient)
        return self._verdict("healthy", None, None, tuple(nodes), [], [], 0.9,
                             {"judged_nodes": len(nodes), "closed_ops": self._closed_ops},
                             {"ops": self._closed_ops}, self._last_end_ns)

    def _anomaly(self, inc: _Incident) -> Verdict:
        own = [f for f in inc.findings if f.node in inc.nodes] or inc.findings
        shown = sorted(own, key=lambda f: (f.end_ns, f.comm_id, f.seq))[-8:]
        evidence: dict[str, Any] = {"rule": dict(Counter(f.kind for f in inc.findings)),
                                    "findings": [f.evidence() for f in shown],
                                    "outlier_ops": len({(f.comm_id, f.seq) for f in own}), **inc.extra}
        if inc.level == "group" or inc.kind in ("network-slow", "host-contention"):
            evidence["links"] = sorted({f"{f.endpoint}->{d}" for f in inc.findings for d in f.peer_eps})[:16]
        comms = sorted({f.comm_id for f in own})
        seqs = [f.seq for f in own]
        window = {"comm_id": comms[0] if len(comms) == 1 else comms, "first_seq": min(seqs, default=0),
                  "last_seq": max(seqs, default=0), "ops": len({(f.comm_id, f.seq) for f in own}),
                  "decided_at_ns": max((f.end_ns for f in own), default=self._last_end_ns)}
        return Verdict(job=self.job or "", status="anomaly", kind=inc.kind, level=inc.level, nodes=list(inc.nodes),
                       ranks=inc.ranks, nics=inc.nics, confidence=inc.confidence, evidence=evidence, window=window,
                       first_seen_ns=inc.first_seen_ns, emitted_at=time.time_ns(), method="pulse")

    def _verdict(self, status: str, kind: str | None, level: str | None, nodes: tuple[str, ...], ranks: list[int],
                 nics: list[str], conf: float, evidence: dict[str, Any], window: dict[str, Any],
                 first_seen: int) -> Verdict:
        window = {"comm_id": None, "first_seq": None, "last_seq": None, **window, "decided_at_ns": self._last_end_ns}
        return Verdict(job=self.job or "", status=status, kind=kind, level=level, nodes=list(nodes), ranks=ranks,
                       nics=nics, confidence=conf, evidence=evidence, window=window, first_seen_ns=first_seen,
                       emitted_at=time.time_ns(), method="pulse")


def localize(metrics: Iterable[OpMetrics], events: Iterable[HookEvent],
             params: LocalizeParams | None = None, *, data_end: dict[str, int] | None = None) -> list[Verdict]:
    """Batch form: all hook events first, then the metrics in end-time order."""
    loc = Localizer(params)
    loc.add_events(events)
    for node, end in (data_end or {}).items():
        loc.observe_data_end(node, end)
    out = loc.update(sorted(metrics, key=lambda m: (m.end_ns, m.comm_id, m.seq, m.rank)))
    return out + loc.finish()
