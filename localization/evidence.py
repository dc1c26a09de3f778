"""The evidence the localizer accumulates between operators, which the rule families
(:mod:`.rules`) read.

Each class holds one kind of evidence, bounded (windows, capped buffers), and only
records: deciding what it means is the rules' job. :class:`Evidence` bundles them with
the job's topology and the end of each node's data.

* :class:`References` - the job-wide reference ACT (or GroupP2P rate) per operator shape.
* :class:`LinkWindows` - per directed NIC-to-NIC link, its last observations (slow/clean).
* :class:`Lateness` - per (node, communicator), late arrivals; point-to-point waits; the
  end of each rank's previous operator (its compute gap).
* :class:`.late_baselines.LateBaselines` - each rank's own baseline issue lag, and per
  communicator shape the job's healthy spread around those baselines (the threshold).
* :class:`.late_stragglers.LateStragglers` - per communicator, the latest arrival of each
  recent step and the rank that is consistently the latest.
* :class:`StopEvidence` - stalled records, absences, and the point-to-point receives each
  node posted (who waits for what).
* :class:`RailEvidence` - per-NIC end times of the same operator (siblings) and the
  rail-late records found among them.
* :class:`AlivePoints` - when each NIC last moved bytes, and in which communicator.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from typing import Any

import numpy as np

from pulse.events import GROUPED
from pulse.records import OpMetrics

from .alive import AlivePoints
from .ceilings import Ceilings
from .finding import Finding, LinkObs
from .late_baselines import LateBaselines
from .late_stragglers import LateStragglers
from .params import LocalizeParams
from .robust import RollingRef
from .stop_evidence import StopEvidence
from .stragglers import Stragglers
from .topology import Topology

Link = tuple[str, str]
"""(sender endpoint, receiver endpoint), each node/nic."""


_NODE_OF: dict[str, str] = {}
"""endpoint -> node: the rules ask it for every link of every window at each evaluation."""


def node_of(endpoint: str) -> str:
    node = _NODE_OF.get(endpoint)
    if node is None:
        node = endpoint.split("/", 1)[0]
        if len(_NODE_OF) < 1 << 20:  # bounded: endpoint names come from the input
            _NODE_OF[endpoint] = node
    return node


_PAIR_OF: dict[tuple[str, str], tuple[str, str]] = {}


def node_pairs(links: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
    """{(node_of(a), node_of(b)) for a, b in links}, from a memo: the rules ask it of
    every clean link of the job at each evaluation."""
    get = _PAIR_OF.get
    out = set()
    for key in links:
        pair = get(key)
        if pair is None:
            pair = (node_of(key[0]), node_of(key[1]))
            if len(_PAIR_OF) < 1 << 20:
                _PAIR_OF[key] = pair
        out.add(pair)
    return out


class References:
    """Job-wide reference per operator shape (kind, bytes, ranks): a low percentile of the
    recent records' ACT, or for GroupP2P (volumes differ per operator: expert imbalance)
    the median rank-level rate of all grouped operators of that size."""

    def __init__(self, p: LocalizeParams) -> None:
        self.p = p
        self._refs: dict[tuple[str, int, int], RollingRef] = defaultdict(lambda: RollingRef(p.ref_size))
        self._base: dict[tuple[str, int, int], list[float]] = {}
        self._base_ops: dict[tuple[str, int, int], Counter[str]] = defaultdict(Counter)
        self._stretch: dict[tuple[str, int, int], float] = {}

    @staticmethod
    def shape(r: OpMetrics) -> tuple[str, int, int]:
        return (r.kind, 0 if r.kind == GROUPED else r.expected_bytes, r.nranks)

    def of(self, r: OpMetrics) -> float | None:
        """The reference for ``r``'s shape, None while too few records have been seen."""
        ref = self._refs[self.shape(r)]
        if len(ref) < self.p.ref_min:
            return None
        return ref.percentile(self.p.ref_percentile_grouped if r.kind == GROUPED else self.p.ref_percentile)

    def stretch(self, r: OpMetrics) -> float | None:
        """How far above its reference percentile a healthy record of ``r``'s shape went:
        the longest ACT of the first ``ref_base_ops`` complete operators of each of the
        shape's communicators (a couple of steps of each: one step's buckets have the same
        ranks in the same places) over their own reference percentile (None until they are
        in, and for GroupP2P)."""
        return self._stretch.get(self.shape(r))

    def add(self, ordered: list[OpMetrics]) -> None:
        """A complete operator's records join its shape's sample."""
        grouped = ordered[0].kind == GROUPED
        shape = self.shape(ordered[0])
        vals = np.array([r.active_rate if grouped else r.act_ns for r in ordered if r.act_ns > 0], dtype=np.float64)
        self._refs[shape].extend(vals)
        if grouped or shape in self._stretch or not vals.size:
            return
        ops = self._base_ops[shape]
        comm = ordered[0].comm_id
        if ops[comm] >= self.p.ref_base_ops:
            return
        base = self._base.setdefault(shape, [])
        base.extend(vals.tolist())
        ops[comm] += 1
        if min(ops.values()) >= self.p.ref_base_ops:
            ref = float(np.percentile(base, self.p.ref_percentile))
            self._stretch[shape] = max(base) / ref if ref > 0 else 1.0
            del self._base[shape], self._base_ops[shape]


class LinkWindows:
    """Per directed link, its last ``window_ops`` observations, with running counts so a
    rule only scans the links that are persistently slow (``hot``)."""

    def __init__(self, p: LocalizeParams) -> None:
        self.p = p
        self.obs: dict[Link, deque[LinkObs]] = defaultdict(lambda: deque(maxlen=p.window_ops))
        self.n_slow = 0
        """Slow observations inside the windows (none: no slow link, no network hypothesis)."""
        self.slow_count: Counter[Link] = Counter()
        """Slow observations per link window."""
        self.hot: dict[Link, None] = {}
        """Links with at least persist_ops slow observations (candidates for link_state)."""

        self.keys: list[Link] = []
        """Row -> link of the column copies below."""
        self.senders: set[str] = set()
        """Nodes at the sending end of a link with observations."""
        self._row: dict[Link, int] = {}
        self._pos: list[int] = []
        # each window's ends and slow flags again as rows of arrays (ring order), so the
        # clean-link scan over every link is one vectorised pass instead of a Python loop
        # over every observation of the job
        self._ends = np.zeros((64, p.window_ops), np.int64)
        self._slow = np.zeros((64, p.window_ops), np.bool_)
        self._rate = np.zeros((64, p.window_ops), np.float64)
        self._shared = np.zeros((64, p.window_ops), np.bool_)
        self._paced = np.zeros((64, p.window_ops), np.bool_)
        self._fill = np.zeros(64, np.int64)

    def add(self, lk: LinkObs) -> None:
        key = (lk.src, lk.dst)
        win = self.obs[key]
        if len(win) == win.maxlen and win[0].slow:
            self.n_slow -= 1
            self.slow_count[key] -= 1
        win.append(lk)
        row = self._row.get(key)
        if row is None:
            row = self._new_row(key)
        pos = self._pos[row]
        self._ends[row, pos] = lk.end_ns
        self._slow[row, pos] = lk.slow
        self._rate[row, pos] = lk.rate_lo
        self._shared[row, pos] = lk.shared
        self._paced[row, pos] = lk.paced
        self._pos[row] = (pos + 1) % self.p.window_ops
        if pos >= self._fill[row]:
            self._fill[row] = pos + 1
        if lk.slow:
            self.n_slow += 1
            self.slow_count[key] += 1
        if self.slow_count[key] >= self.p.persist_ops:
            self.hot[key] = None
        else:
            self.hot.pop(key, None)

    def _new_row(self, key: Link) -> int:
        row = len(self.keys)
        if row == len(self._fill):
            grow = len(self._fill)
            self._ends = np.concatenate([self._ends, np.zeros_like(self._ends[:grow])])
            self._slow = np.concatenate([self._slow, np.zeros_like(self._slow[:grow])])
            self._rate = np.concatenate([self._rate, np.zeros_like(self._rate[:grow])])
            self._shared = np.concatenate([self._shared, np.zeros_like(self._shared[:grow])])
            self._paced = np.concatenate([self._paced, np.zeros_like(self._paced[:grow])])
            self._fill = np.concatenate([self._fill, np.zeros_like(self._fill)])
        self.keys.append(key)
        self.senders.add(node_of(key[0]))
        self._row[key] = row
        self._pos.append(0)
        return row

    def recent(self, since: int) -> tuple[np.ndarray, np.ndarray]:
        """Per row of :attr:`keys`: how many observations of its window ended at or after
        ``since``, and how many of those were slow (paced ones are neither)."""
        n = len(self.keys)
        valid = np.arange(self.p.window_ops) < self._fill[:n, None]
        recent = valid & (self._ends[:n] >= since) & ~self._paced[:n]
        return recent.sum(axis=1), (recent & self._slow[:n]).sum(axis=1)

    def row(self, key: Link) -> int:
        """The row of ``key`` in the column copies (:attr:`keys`)."""
        return self._row[key]

    def clean_rates(self, since: int, rows: np.ndarray) -> tuple[dict[Link, float], dict[Link, float]]:
        """Per link of ``rows`` (of :attr:`keys`) with a clean observation ending at or
        after ``since`` that knew its rate: the highest ``rate_lo`` of those, and the
        highest of those not shared (-1: all were shared)."""
        if rows.size == 0:
            return {}, {}
        valid = np.arange(self.p.window_ops) < self._fill[rows, None]
        rate = self._rate[rows]
        ok = valid & (self._ends[rows] >= since) & ~self._slow[rows] & ~self._paced[rows] & (rate > 0)
        lo = np.where(ok, rate, -np.inf).max(axis=1)
        own = np.where(ok & ~self._shared[rows], rate, -np.inf).max(axis=1)
        has = np.flatnonzero(ok.any(axis=1))
        lo_l, own_l = lo[has].tolist(), np.where(np.isfinite(own[has]), own[has], -1.0).tolist()
        ks = [self.keys[r] for r in rows[has].tolist()]
        return dict(zip(ks, lo_l, strict=True)), dict(zip(ks, own_l, strict=True))


class Intake:
    """Per NIC, what its downlink was seen carrying in its last ``window_ops`` all-to-alls
    (:func:`.peer_rates._intake`: the bytes of all its flows in over the longest of them,
    0 where it took in less than the others). Its link windows cannot say it: an all-to-all sender's
    rate is shared among its receivers, so no one link into a receiver shows what its
    downlink takes in, while the sum of them does."""

    def __init__(self, p: LocalizeParams) -> None:
        self.p = p
        self._by_node: dict[str, dict[str, deque[tuple[int, float]]]] = {}

    def add(self, ep: str, end_ns: int, rate: float) -> None:
        per = self._by_node.setdefault(node_of(ep), {})
        win = per.get(ep)
        if win is None:
            win = per[ep] = deque(maxlen=self.p.window_ops)
        win.append((end_ns, rate))

    def since(self, nodes: Iterable[str], since: int) -> dict[str, float]:
        """Per NIC of ``nodes``, the median of what it took in over its all-to-alls ended at
        or after ``since`` (at least ``link_min_obs`` of them, as a clean link's), those
        where it took in less than the others counted as 0: a downlink congested in bursts
        passes an all-to-all at its usual pace now and then (sweep 293 #2: node-03's best at
        37-42 GB/s, most of its all-to-alls at half the other receivers'), a healthy one in
        most of them."""
        out: dict[str, float] = {}
        for n in nodes:
            for ep, win in self._by_node.get(n, {}).items():
                got = [r for end, r in win if end >= since]
                if len(got) >= self.p.link_min_obs:
                    out[ep] = float(np.median(got))
        return out


class Lateness:
    """Late arrivals per (node, communicator) over ``late_window`` operators, point-to-point
    waits (issue to first byte) per node and job-wide, and the end of each rank's previous
    operator."""

    def __init__(self, p: LocalizeParams) -> None:
        self.windows: dict[tuple[str, str], deque[Finding | None]] = defaultdict(
            lambda: deque(maxlen=p.late_window))
        """(node, comm) -> per judged operator, its late finding or None."""
        self.rose: dict[tuple[str, str], deque[tuple[bool, int | None]]] = defaultdict(
            lambda: deque(maxlen=p.late_window))
        """(node, comm) -> per judged operator (the same as ``windows``), whether the node's
        issue lag rose above its baseline by ``late_weak_sigmas`` of the job's healthy
        spread (:func:`.rules.late.weakly_late`), and the communicator's step it was in
        (None where steps are not told apart: a point-to-point operator;
        :data:`STEP_UNKNOWN` for a collective whose steps are not known yet)."""
        self.n_late = 0
        """Late findings inside the windows."""
        self.waits: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=p.waits_per_window * p.window_ops))
        self.all_waits: deque[float] = deque(maxlen=p.job_waits_window)
        self.prev: dict[tuple[str, int], OpMetrics] = {}
        """(comm, rank) -> its last judged operator's record."""
        self.own: dict[tuple[str, int], int] = {}
        """(comm, rank) -> the last operator it arrived late into by its own compute gap
        (a late finding the compute-gap veto did not explain)."""

    def add(self, node: str, comm: str, f: Finding | None, rose: bool = False, step: int | None = None) -> None:
        lw = self.windows[(node, comm)]
        if len(lw) == lw.maxlen and lw[0] is not None:
            self.n_late -= 1
        lw.append(f)
        self.rose[(node, comm)].append((rose, step))
        self.n_late += f is not None

    def add_wait(self, node: str, w: float) -> None:
        self.waits[node].append(w)
        self.all_waits.append(w)


STEP_UNKNOWN = -1
"""The step of a collective's operator judged before its communicator's steps can be told
apart (:attr:`.late_stragglers.LateStragglers.step_no`)."""

GROUPED_RAIL_METRIC = "silent_after_other_nics_ns"
"""The metric of an all-to-all's rail-late finding: its silence beyond its siblings'
(``rules/rail.py``), told apart from a ring's or a send's ``end_after_other_nics_ns``."""

SILENT_START_METRIC = "silent_before_other_nics_ns"
"""The metric of a collective's record whose first byte sent came this long after its
siblings' on the node's other NICs, the late ranks of its operator being exactly those a
down NIC of its rank would block (``rules/rail.py``)."""


class RailEvidence:
    """The same operator on a node's NICs: per (node, kind, seq, bytes, nranks, member
    nodes), each NIC's (end_ns, t_host_ns, comm); and the rail-late records found, each
    with the member nodes of its communicator."""

    def __init__(self, p: LocalizeParams, topo: Topology) -> None:
        self.p = p
        self.topo = topo
        self.siblings: dict[tuple[Any, ...], list[tuple[int, int, str, int]]] = {}
        """Per NIC (end_ns, t_host_ns, comm, start_ns)."""
        self.grouped: dict[tuple[Any, ...], list[tuple[int, int, str, int]]] = {}
        """All-to-alls (complete, with their per-peer figures): per NIC (end_ns, t_host_ns,
        comm, act_ns)."""
        self.records: deque[tuple[Finding, frozenset[str]]] = deque(maxlen=p.rail_max_records)
        self.ends: dict[tuple[str, int], dict[int, int]] = {}
        """(comm, rank) -> seq -> end of its latest records: an operator starts on its
        stream only once the one before it ended."""
        self._comm_nodes: dict[str, frozenset[str]] = {}
        self._with_node: dict[tuple[str, str], frozenset[str]] = {}

    def member_nodes(self, comm: str) -> frozenset[str]:
        nodes = self._comm_nodes.get(comm)
        if nodes is None:
            members = self.topo.members(comm)
            nodes = frozenset(members.values())
            if len(members) >= self.topo.nranks.get(comm, 1 << 30):
                self._comm_nodes[comm] = nodes  # complete: membership no longer changes
        return nodes

    def key(self, m: OpMetrics) -> tuple[Any, ...]:
        nodes = self._with_node.get((m.comm_id, m.node))
        if nodes is None:
            nodes = self.member_nodes(m.comm_id) | {m.node}
            if m.comm_id in self._comm_nodes:  # complete membership: one set (and hash) per rank
                self._with_node[(m.comm_id, m.node)] = nodes
        return (m.node, m.kind, m.seq, m.expected_bytes, m.nranks, nodes)

    def grouped_key(self, m: OpMetrics) -> tuple[Any, ...]:
        """An all-to-all's siblings: its bytes differ from rail to rail (expert routing), so
        they are matched without them."""
        node, kind, seq, _nbytes, nranks, nodes = self.key(m)
        return (node, kind, seq, nranks, nodes)

    def note_record(self, m: OpMetrics) -> None:
        if not m.complete or m.t_host_ns is None:
            return
        if m.kind != GROUPED:
            self.siblings.setdefault(self.key(m), []).append((m.end_ns, m.t_host_ns, m.comm_id, m.start_ns))
            ends = self.ends.setdefault((m.comm_id, m.rank), {})
            ends[m.seq] = m.end_ns
            if len(ends) > 4:
                del ends[min(ends)]
        elif m.peer_done_ns is not None:
            self.grouped.setdefault(self.grouped_key(m), []).append((m.end_ns, m.t_host_ns, m.comm_id, m.act_ns))

    def end_of(self, comm: str, rank: int, seq: int) -> int | None:
        """When operator ``seq`` of ``comm`` ended at ``rank`` (None: not seen, or long gone)."""
        return self.ends.get((comm, rank), {}).get(seq)

    def prev_end(self, m: OpMetrics) -> int | None:
        """When the operator before ``m`` on its communicator ended at its rank (None: not seen)."""
        return self.end_of(m.comm_id, m.rank, m.seq - 1)

    def trim(self) -> None:
        for table in (self.siblings, self.grouped):
            if len(table) > self.p.rail_siblings_max:
                for k in list(table)[:self.p.rail_siblings_drop]:
                    del table[k]


class Evidence:
    """Everything the rules read about one job."""

    def __init__(self, p: LocalizeParams, topo: Topology | None = None) -> None:
        self.p = p
        self.topo = topo or Topology()
        self.data_end: dict[str, int] = {}
        """node -> how far its data (epoch batches, node clock) is known to extend."""
        self.nic_end: dict[str, dict[str, int]] = {}
        """node -> NIC -> its own data end, for nodes where some NIC's data lags the node's."""
        self.nic_tx: dict[str, int] = {}
        """node/nic -> end of the last epoch its NIC transmitted in (node clock)."""
        self.expects_data_end = False
        """True when data ends are fed (the engine): a node without one then has sent no
        epoch data at all, even when no node has (a bare ``localize()`` call may feed none)."""
        self.refs = References(p)
        self.stragglers = Stragglers(p)
        self.links = LinkWindows(p)
        self.single_links = LinkWindows(p)
        """The same links' observations by records that sent to one peer (rings, pipeline
        sends, tree leaves) again, in windows of their own: such a record asks its link for
        all of its NIC, a record sent to several peers at once (an all-to-all, a tree relay)
        only for a share. A link capped between the two is clean for one and slow for the
        other, and the all-to-all's far more numerous observations must not push the others
        out (sweep 199 #19: a path at 23 % of its rate under MoE, the ring's sends over it
        slow in every operator, two in each window of twelve observations). A clean share
        still clears a relay's slowness: which of its links held it up is not known."""
        self.paced = LinkWindows(p)
        """Links of records within the bound in slow operators: neither clean nor slow, only
        the rates they carried (:func:`.rules.links.network_hypotheses`)."""
        self.intake = Intake(p)
        self.late = Lateness(p)
        self.late_base = LateBaselines(p)
        self.late_stragglers = LateStragglers(p, self.late_base)
        self.stops = StopEvidence()
        self.rail = RailEvidence(p, self.topo)
        self.alive = AlivePoints(p)
        self.ceilings = Ceilings(p)
        self.missing: Counter[str] = Counter()
        """node -> closed operators in a row without its record while its peers completed."""
        self.insufficient: set[str] = set()
        """Nodes reported insufficient-data: no rule blames them."""
        self.degraded: dict[str, dict[str, int]] = {}
        """node -> what of its input the segmentation stage could not use (lost batches...)."""
        self.closed_ops = 0
        self.last_end_ns = 0

    def busy(self) -> bool:
        """Whether any window holds evidence a rule could act on."""
        return bool(self.links.n_slow or self.late.n_late or self.late_stragglers.consistent
                    or self.stops.stalls or self.stops.absent
                    or self.rail.records)

    def hot_links(self) -> list[Link]:
        """Links with ``persist_ops`` slow observations in their window, or in their
        one-peer records' window (:attr:`single_links`)."""
        return list({**self.links.hot, **self.single_links.hot})

    def stalled(self, m: OpMetrics) -> bool:
        if m.complete:
            return False
        end = self.data_end.get(m.node)
        # Without a known data end the segmenter only reports an operator incomplete
        # after it stalled; with one, an operator cut off by the end of the input is not.
        return end is None or end - m.end_ns >= self.p.stall_ns

    def nic_cut(self, m: OpMetrics) -> bool:
        """Whether the data of one of the record's NICs ends before the record could be
        called stalled: that NIC's capture stopped publishing while the node's others went
        on, so the record may be cut off there rather than stalled."""
        nic_end = self.nic_end.get(m.node)
        if not nic_end or not m.nics:
            return False
        end = min(nic_end.get(n.rpartition("/")[2], 1 << 62) for n in m.nics)
        # a NIC whose batches merely arrive a window after the node's others is not cut
        behind = self.data_end.get(m.node, end) - end >= self.p.stall_ns
        return behind and end - m.end_ns < self.p.stall_ns
