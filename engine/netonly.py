"""Network-only mode: operator-like records from the traffic alone, when no operator
descriptor can be had (no profiler plugin, no NCCL log, no torch injection).

What the wire gives without descriptors is each NIC's flows, their bytes per epoch, and,
from the capture's addresses, which NIC each flow talks to. :class:`InferredStage` turns
that into records the localizer already judges:

* **groups**: NICs joined by a flow (a TCP 5-tuple seen on both ends, or an RDMA queue pair
  and its remote) are one group, the union over every flow (a ring, a rail, a pipeline
  pair); NICs without address information form one group per job.
* **operators**: fixed windows of ``window_ns`` of node time. A window holds several of
  the job's operators; what is compared is each NIC's *rate while it sends* in it (bytes
  sent / epochs in which it sent anything), across the NICs of its group. A NIC whose
  link or host is slow sends for longer at a lower rate; healthy ones send in short bursts
  at line rate and idle while they wait (the paper's actual-communication-time argument,
  per window instead of per operator).
* records are ``GroupP2P`` operator metrics (judged by rank-level active rate) with
  ``comm_id`` ``inferred:<job>:<group>`` and ``seq`` the window index, so the localizer runs
  unchanged; rules that need descriptor-only facts see nothing to act on: no issue times
  (lateness, compute-slow), no expected bytes (completion, stops), no posted receives.
* stops (:mod:`.netstop`) and flaps (:mod:`.netflap`) are read from silences, on the
  NICs' own clocks, and reach the localizer as the records its stop and rail rules judge.

What it cannot tell is said in docs/localization.md ("Network-only mode").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
from pulse.localization import LocalizeParams

from pulse.events import FlowEvent, HookEvent
from pulse.records import DataEnd, OpMetrics
from pulse.samples import EpochBatch

from .netflap import Flap, FlapWatch
from .netstop import Stop, StopWatch
from .segment_stage import SegmentOutput

WINDOW_NS = 50_000_000
"""Node time per inferred operator: long enough to hold several collectives of a training
step (each NIC's sending rate is then defined), short enough for a verdict in seconds."""
INFERRED_PREFIX = "inferred:"
SURPLUS_SIBLINGS = 3
"""Rail siblings (links between the same two nodes) needed to say one carried more: with
two, either could be the odd one."""
SURPLUS_WARMUP = 4
"""Windows a link must have carried data in before its cumulated bytes are compared."""
SURPLUS_SPREAD = 8
"""A surplus must exceed this many times the job's median deviation from its siblings."""
NETWORK_ONLY_RATE_RATIO = 0.5
"""A NIC is slow in network-only mode when it sends at half its group's rate or less. An
inferred window mixes several operators and, on TCP, congestion control shares links
unevenly among healthy flows: a real Gloo job's healthy NICs differ by up to ~25 % per
window (tests/engine/traces/lab-rate before its fault), where descriptor mode compares one
operator's ranks at 0.8."""


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        root = x
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[x] != root:
            self.parent[x], x = root, self.parent[x]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


class InferredStage:
    """Same interface as :class:`~.segment_stage.SegmentStage` (``add``, ``finish``,
    ``nodes``, ``gaps``, ``damage``), for traces and streams without descriptors: of the
    hook events only flow events' addresses are read (5-tuples, queue pair numbers: what a
    capture or ``rdma res`` sees); comm, op and every binding to a rank are ignored."""

    def __init__(self, window_ns: int = WINDOW_NS, params: LocalizeParams | None = None) -> None:
        if window_ns <= 0:
            raise ValueError("window_ns must be positive")
        self.window_ns = int(window_ns)
        p = params or LocalizeParams()
        self.vol_excess = p.vol_excess
        self._cum: dict[str, int] = {}
        """link -> bytes it carried so far (emitted windows)."""
        self._nwin: dict[str, int] = {}
        """link -> windows it carried data in."""
        self._stops = StopWatch(p.stall_ns, p.stall_first_ns)
        """Where the traffic stopped when the job goes silent (:mod:`.netstop`)."""
        self._n_stops = 0
        self._flaps = FlapWatch(p.clock_skew_ns, p.rail_keep_ns)
        """Which NIC fell silent and resumed while its node's other NICs sent (:mod:`.netflap`)."""
        self._n_flaps = 0
        self._epoch_ns = 0
        self._win_ns: int | None = None
        """The window in use: ``window_ns`` rounded down to whole epochs of the first batch."""
        self.nodes: dict[str, None] = {}
        self.damage: dict[str, dict[str, int]] = {}
        self.ignored_events = 0
        self._jobs: dict[str, str] = {}
        self._groups = _UnionFind()
        self._tcp: dict[tuple[str, str, int, int], str] = {}
        """(src, dst, sport, dport) -> the first endpoint (node/nic) seen carrying it."""
        self._qp: dict[tuple[int, int], str] = {}
        self._qp_flow: dict[tuple[int, int], tuple[str, int]] = {}
        """(qpn, remote qpn) -> the endpoint owning that queue pair."""
        self._conn: dict[tuple[str, int], tuple[object, object]] = {}
        """(endpoint, flow) -> (its direction's key, the reverse direction's key)."""
        self._dir_tx: dict[object, int] = {}
        """direction key -> bytes sent on it so far (at its sender)."""
        self._peer: dict[tuple[str, int], str] = {}
        """(endpoint, flow) -> the endpoint at the other end of that direction."""
        self._linked: set[str] = set()
        self._comms: dict[tuple[str, frozenset[str]], str] = {}
        self._told: set[tuple[str, str]] = set()
        self._link_flow: dict[str, int] = {}
        """link (``node/nic>node/nic``) -> one of its flows (what its flow event names)."""
        self._tx: dict[str, dict[int, dict[int, list[int]]]] = {}
        """endpoint -> window -> flow -> [bytes sent, epochs it sent in, epoch_ns]."""
        self._end: dict[str, int] = {}
        self._emitted_upto = -(1 << 62)

    # -- the SegmentStage interface ---------------------------------------------------------

    def gaps(self, node: str) -> dict[str, int]:
        return {}

    def forget(self, now: float, idle_s: float) -> list[str]:
        return []  # network-only runs offline (diagnose) only, for now

    def add(self, events: Iterable[HookEvent] = (), batches: Iterable[EpochBatch] = (),
            now: float = 0.0) -> SegmentOutput:
        for e in events:
            if isinstance(e, FlowEvent):
                self._note_flow(e)  # its addresses only: any comm/rank binding is ignored
            else:
                self.ignored_events += 1
        for b in batches:
            self._add_batch(b)
        return self._emit(final=False)

    def finish(self) -> SegmentOutput:
        return self._emit(final=True)

    # -- structure --------------------------------------------------------------------------

    def _note_flow(self, e: FlowEvent) -> None:
        ep = f"{e.node}/{e.nic}"
        self._groups.find(ep)
        fwd: object = None
        rev: object = None
        if e.src is not None and e.dst is not None and e.sport is not None and e.dport is not None:
            # a capture sees a TCP direction on both ends: the same 5-tuple joins them
            fwd, rev = ("tcp", e.src, e.sport, e.dst, e.dport), ("tcp", e.dst, e.dport, e.src, e.sport)
            other = self._tcp.setdefault((e.src, e.dst, e.sport, e.dport), ep)
            if other != ep:
                self._groups.union(ep, other)
                self._linked.update((ep, other))
                self._peer[(ep, e.flow)] = other
                first = next((k for k in self._conn if k[0] == other and self._conn[k][0] == fwd), None)
                if first is not None:
                    self._peer[first] = ep
        elif e.qpn is not None and e.remote_qpn is not None:
            fwd, rev = ("qp", e.qpn, e.remote_qpn), ("qp", e.remote_qpn, e.qpn)
            self._qp[(e.qpn, e.remote_qpn)] = ep
            self._qp_flow[(e.qpn, e.remote_qpn)] = (ep, e.flow)
            mate = self._qp.get((e.remote_qpn, e.qpn))
            if mate is not None and mate != ep:
                other = mate
                self._groups.union(ep, other)
                self._linked.update((ep, other))
                self._peer[(ep, e.flow)] = other
                self._peer[self._qp_flow[(e.remote_qpn, e.qpn)]] = ep
        if fwd is not None:
            self._conn[(ep, e.flow)] = (fwd, rev)

    def _group(self, ep: str) -> str:
        """Its flows' group, or the job's when no address ever tied it to another NIC."""
        if ep in self._linked:
            return self._groups.find(ep)
        return "job:" + self._jobs.get(ep.partition("/")[0], "")

    def _is_data(self, ep: str, flow: int) -> bool:
        """A direction carries the data unless its reverse sent more: the smaller direction
        of a connection is acknowledgements and credits, paced by the data it answers."""
        conn = self._conn.get((ep, flow))
        if conn is None:
            return True
        return self._dir_tx.get(conn[0], 0) >= self._dir_tx.get(conn[1], 0)

    # -- traffic ----------------------------------------------------------------------------

    def _add_batch(self, b: EpochBatch) -> None:
        self.nodes.setdefault(b.node, None)
        if b.job:
            self._jobs.setdefault(b.node, b.job)
        ep = f"{b.node}/{b.nic}"
        self._groups.find(ep)
        self._end[ep] = max(self._end.get(ep, -(1 << 62)), b.t0_ns + (int(b.epoch.max()) + 1) * b.epoch_ns
                            if b.n_rows else b.t0_ns)
        self._epoch_ns = self._epoch_ns or b.epoch_ns
        sent = b.tx_bytes > 0
        self._stops.note(self._jobs.get(b.node, ""), ep, b.t0_ns + (b.epoch[sent].astype(np.int64) + 1) * b.epoch_ns,
                         b.tx_bytes[sent], self._end[ep])
        self._flaps.note(self._jobs.get(b.node, ""), b.node, b.nic, b.epoch_ns,
                         b.t0_ns // b.epoch_ns + b.epoch[sent].astype(np.int64), b.tx_bytes[sent], self._end[ep])
        if not sent.any():
            return
        flow_rows = b.flow[sent]
        flows = np.unique(flow_rows)
        fi = np.searchsorted(flows, flow_rows)
        if self._conn:
            per_flow = np.bincount(fi, weights=b.tx_bytes[sent].astype(np.float64))
            for f, nbytes in zip(flows.tolist(), per_flow.tolist(), strict=True):
                conn = self._conn.get((ep, f))
                if conn is not None:
                    self._dir_tx[conn[0]] = self._dir_tx.get(conn[0], 0) + int(nbytes)
        if self._win_ns is None:
            # whole epochs per window, so windows and epochs share one grid
            self._win_ns = max(self.window_ns // b.epoch_ns, 1) * b.epoch_ns
        per_win = max(self._win_ns // b.epoch_ns, 1)
        win = (b.t0_ns + b.epoch[sent].astype(np.int64) * b.epoch_ns) // self._win_ns
        w0 = int(win.min())
        nw = int(win.max()) - w0 + 1
        key = fi * nw + (win - w0)
        byts = np.bincount(key, weights=b.tx_bytes[sent].astype(np.float64), minlength=flows.shape[0] * nw)
        act = np.bincount(key, minlength=flows.shape[0] * nw)  # rows are unique (flow, epoch)
        for k in np.flatnonzero(byts).tolist():
            f, w = int(flows[k // nw]), w0 + k % nw
            cell = self._tx.setdefault(ep, {}).setdefault(w, {}).setdefault(f, [0, 0, b.epoch_ns])
            cell[0] += int(byts[k])
            cell[1] = min(cell[1] + int(act[k]), per_win)

    def _link(self, ep: str, flow: int) -> str:
        peer = self._peer.get((ep, flow), "")
        name = f"{ep}>{peer}"
        self._link_flow.setdefault(name, flow)
        return name

    def _emit(self, final: bool) -> SegmentOutput:
        out = SegmentOutput()
        if not self._end:
            return out
        # a window is closed when every endpoint's data went two windows past it
        if self._win_ns is None:
            return out
        frontier = min(self._end.values()) // self._win_ns - 2 if not final else 1 << 62
        windows = sorted({w for tx in self._tx.values() for w in tx if self._emitted_upto < w <= frontier})
        for w in windows:
            cells: dict[str, list[int]] = {}
            for ep, tx in self._tx.items():
                for flow, (nbytes, active, epoch_ns) in (tx.pop(w, None) or {}).items():
                    # the data direction is judged on every byte seen so far, not on the
                    # first batch (an acknowledgement can arrive before the data it answers)
                    if active and self._is_data(ep, flow):
                        cell = cells.setdefault(self._link(ep, flow), [0, 0, epoch_ns])
                        cell[0] += nbytes
                        # a link's flows (channels) split one operator's data and send at
                        # the same time: the link sent in as many epochs as its busiest
                        cell[1] = max(cell[1], active)
            for link, cell in cells.items():
                self._cum[link] = self._cum.get(link, 0) + cell[0]
                self._nwin[link] = self._nwin.get(link, 0) + 1
            surplus = self._surplus()
            by_group: dict[str, list[tuple[str, list[int]]]] = {}
            for link, cell in self._main_links(cells):
                by_group.setdefault(self._group(link.partition(">")[0]), []).append((link, cell))
            for group, members_cells in by_group.items():
                # one communicator per set of links sending together: a link idle in a window
                # (a pipeline bubble) is not a member missing from it
                members = frozenset(link for link, _ in members_cells)
                comm = self._comms.get((group, members))
                if comm is None:
                    comm = self._comms[(group, members)] = f"{INFERRED_PREFIX}{len(self._comms)}"
                ranks = {link: i for i, link in enumerate(sorted(members))}
                self._bind(comm, ranks, out)
                for link, (nbytes, active, epoch_ns) in sorted(members_cells):
                    rec = self._record(comm, w, link, ranks, nbytes, active, epoch_ns)
                    if link in surplus:
                        # what it would have carried at its siblings' pace: the localizer reads
                        # volume / expected as the retransmission surplus
                        rec = dataclasses.replace(rec, expected_bytes=max(int(nbytes / surplus[link]), 1))
                    out.metrics.append(rec)
        if windows:
            self._emitted_upto = max(self._emitted_upto, windows[-1])
        for stop in self._stops.check():
            self._stuck(stop, out)
        for flap in self._flaps.check(lossy=bool(self._surplus())):
            self._flapped(flap, out)
        return out

    def _flapped(self, flap: Flap, out: SegmentOutput) -> None:
        """Each silence of the flapping NIC as one inferred operator per NIC of its node, as
        the localizer's rail rule reads them: issued when the NIC fell silent (node clock),
        its siblings' ending where they last sent before it resumed. Its own share ends no
        earlier than it resumed, and no earlier than its silence after its siblings (what
        they sent meanwhile it sends after, at no more than their rate): it ends that late."""
        epoch_ns = self._epoch_ns or 1
        for s in flap.silences:
            self._n_flaps += 1
            ref = int(np.median(list(s.siblings_end_ns.values())))
            late = max(s.end_ns - ref, s.silent_ns)
            for nic, moved in sorted(s.sent_bytes.items()):
                end = ref + late if nic == s.nic else s.siblings_end_ns[nic]
                out.metrics.append(OpMetrics(
                    job=flap.job, node=s.node, comm_id=f"{INFERRED_PREFIX}rail:{s.node}/{nic}", seq=self._n_flaps,
                    rank=0, kind="AllGather", nranks=1, start_ns=s.start_ns, end_ns=max(end, s.start_ns),
                    duration_ns=max(end - s.start_ns, 0), act_ns=0, volume_bytes=moved, expected_bytes=0,
                    complete=True, active_rate=0.0, flows=1, epoch_ns=epoch_ns, nics=[nic], t_host_ns=s.start_ns))

    def _stuck(self, stop: Stop, out: SegmentOutput) -> None:
        """The operator the job is stuck in, as the localizer's stop rules read it: one rank
        per NIC of the job's last traffic, bound like a descriptor would bind it; a record of
        what each NIC sent after the first stop (incomplete, so a stall once its node's data
        went on) for the nodes that went on, none for a node that stopped altogether (absent:
        it never started it). Expected bytes are the present NICs' median: the first NIC to
        stop sent nothing of it."""
        self._n_stops += 1
        comm = f"{INFERRED_PREFIX}stop:{self._n_stops}"
        ranks = {s.endpoint: i for i, s in enumerate(stop.nics)}
        for node, end in sorted(stop.data_end.items()):
            out.forward(stop.job, node, DataEnd(job=stop.job, node=node, end_ns=end))
        for s in stop.nics:
            node, _, nic = s.endpoint.partition("/")
            peer = next((ranks[ln.partition(">")[2]] for ln in self._link_flow
                         if ln.startswith(s.endpoint + ">") and ln.partition(">")[2] in ranks), ranks[s.endpoint])
            flow = next((f for ln, f in self._link_flow.items() if ln.startswith(s.endpoint + ">")), 0)
            out.forward(stop.job, node, FlowEvent(job=stop.job, node=node, nic=nic, flow=flow, comm_id=comm,
                                                  rank=ranks[s.endpoint], peer=peer, channel=0,
                                                  direction="send" if peer != ranks[s.endpoint] else None,
                                                  source="inferred"))
        present = [s for s in stop.nics if s.present]
        expected = max(int(np.median([s.sent_after for s in present])), 1) if present else 1
        epoch_ns = self._epoch_ns or 1
        for s in present:
            node, _, nic = s.endpoint.partition("/")
            end = max(s.last_ns, stop.first_ns)
            out.metrics.append(OpMetrics(
                job=stop.job, node=node, comm_id=comm, seq=0, rank=ranks[s.endpoint], kind="GroupP2P",
                nranks=len(ranks), start_ns=stop.first_ns, end_ns=end, duration_ns=end - stop.first_ns,
                act_ns=0, volume_bytes=s.sent_after, expected_bytes=max(expected, s.sent_after), complete=False,
                active_rate=0.0, flows=1, epoch_ns=epoch_ns, nics=[nic]))

    def _surplus(self) -> dict[str, float]:
        """Links that carried more bytes than their rail siblings, with how many times more.

        Siblings are the links between the same two nodes on other NICs: in a rail-optimized
        job each GPU's NIC carries its own share of the same collectives and pipeline sends,
        so they carry the same bytes (a healthy simulated job: within 0.3 %, cumulated); a
        link that loses packets resends (go-back-N resends whole windows) and carries more.
        Cumulated since each link began, so a rail running a few ms ahead of its siblings
        shows nothing. A link is in surplus beyond the localizer's ``vol_excess`` and beyond
        ``SURPLUS_SPREAD`` times the job's own median deviation (a job whose rails are not
        balanced, e.g. expert routing, raises its own bar)."""
        sib: dict[tuple[str, str], list[str]] = {}
        for link in self._cum:
            src, _, dst = link.partition(">")
            if dst and self._nwin[link] >= SURPLUS_WARMUP:
                sib.setdefault((src.partition("/")[0], dst.partition("/")[0]), []).append(link)
        ratios: dict[str, float] = {}
        for links in sib.values():
            if len(links) < SURPLUS_SIBLINGS:
                continue
            med = float(np.median([self._cum[ln] for ln in links]))
            if med > 0:
                ratios.update((ln, self._cum[ln] / med) for ln in links)
        if not ratios:
            return {}
        dev = float(np.median(np.abs(np.fromiter(ratios.values(), float) - 1.0)))
        bar = 1.0 + max(self.vol_excess, SURPLUS_SPREAD * dev)
        return {ln: r for ln, r in ratios.items() if r >= bar}

    @staticmethod
    def _main_links(cells: dict[str, list[int]]) -> list[tuple[str, list[int]]]:
        """Per sending NIC, the links that carried 90 % of its bytes in the window, largest
        first: a rate is measured where a backlog drove it; a full mesh's other connections
        (a store's, a barrier's few messages) are latency-bound and say nothing of a link's
        capacity."""
        by_ep: dict[str, list[tuple[str, list[int]]]] = {}
        for link, cell in cells.items():
            by_ep.setdefault(link.partition(">")[0], []).append((link, cell))
        out: list[tuple[str, list[int]]] = []
        for links in by_ep.values():
            links.sort(key=lambda lc: -lc[1][0])
            total = sum(c[0] for _, c in links)
            acc = 0
            for link, cell in links:
                if acc >= 0.9 * total:
                    break
                out.append((link, cell))
                acc += cell[0]
        return out

    def _bind(self, comm: str, ranks: dict[str, int], out: SegmentOutput) -> None:
        """Tell the localizer where each link goes, as the bound flow events a descriptor
        source would have given: its peer is a link of the same window sent by the NIC it
        reaches (the receiving NIC's endpoint)."""
        sender_rank: dict[str, int] = {}
        for link, r in sorted(ranks.items(), key=lambda kv: kv[1]):
            sender_rank.setdefault(link.partition(">")[0], r)
        for link, r in ranks.items():
            ep, _, peer = link.partition(">")
            if not peer or peer not in sender_rank or (comm, link) in self._told:
                continue
            self._told.add((comm, link))
            node, _, nic = ep.partition("/")
            job = self._jobs.get(node, "")
            out.forward(job, node, FlowEvent(job=job, node=node, nic=nic, flow=self._link_flow[link], comm_id=comm,
                                             rank=r, peer=sender_rank[peer], channel=0, direction="send",
                                             source="inferred"))

    def _record(self, comm: str, w: int, link: str, ranks: dict[str, int], nbytes: int, active: int,
                epoch_ns: int) -> OpMetrics:
        node, _, nic = link.partition(">")[0].partition("/")
        job = self._jobs.get(node, "")
        act = active * epoch_ns
        win_ns = self._win_ns or self.window_ns
        start = w * win_ns
        return OpMetrics(job=job, node=node, comm_id=comm, seq=w if w >= 0 else 0,
                         rank=ranks[link], kind="GroupP2P", nranks=len(ranks), start_ns=start,
                         end_ns=start + win_ns, duration_ns=win_ns, act_ns=act,
                         volume_bytes=nbytes, expected_bytes=nbytes, complete=True,
                         active_rate=nbytes / (act / 1e9) if act else 0.0, flows=1, epoch_ns=epoch_ns, nics=[nic])
