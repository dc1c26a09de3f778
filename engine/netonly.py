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

What it cannot tell is said in docs/localization.md ("Network-only mode").
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pulse.events import FlowEvent, HookEvent
from pulse.records import OpMetrics
from pulse.samples import EpochBatch

from .segment_stage import SegmentOutput

WINDOW_NS = 50_000_000
"""Node time per inferred operator: long enough to hold several collectives of a training
step (each NIC's sending rate is then defined), short enough for a verdict in seconds."""
INFERRED_PREFIX = "inferred:"
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

    def __init__(self, window_ns: int = WINDOW_NS) -> None:
        if window_ns <= 0:
            raise ValueError("window_ns must be positive")
        self.window_ns = int(window_ns)
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
        self._dir_ep: dict[object, tuple[str, int]] = {}
        """direction key -> the (endpoint, flow) that sends on it."""
        self._dir_tx: dict[object, int] = {}
        """direction key -> bytes sent on it so far (at its sender)."""
        self._peer: dict[tuple[str, int], str] = {}
        """(endpoint, flow) -> the endpoint at the other end of that direction."""
        self._sending: set[tuple[str, int]] = set()
        self._linked: set[str] = set()
        self._comms: dict[tuple[str, frozenset[str]], str] = {}
        self._told: set[tuple[str, str, int]] = set()
        self._tx: dict[str, dict[int, list[int]]] = {}
        """endpoint -> window -> [bytes sent, epochs with anything sent, epoch_ns]."""
        self._end: dict[str, int] = {}
        self._emitted_upto = -(1 << 62)

    # -- the SegmentStage interface ---------------------------------------------------------

    def gaps(self, node: str) -> dict[str, int]:
        return {}

    def add(self, events: Iterable[HookEvent] = (), batches: Iterable[EpochBatch] = ()) -> SegmentOutput:
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
            other = self._qp.get((e.remote_qpn, e.qpn))
            if other is not None and other != ep:
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
        sent = b.tx_bytes > 0
        if not sent.any():
            return
        flows = np.unique(b.flow[sent])
        if self._conn:
            per_flow = np.bincount(np.searchsorted(flows, b.flow[sent]), weights=b.tx_bytes[sent].astype(np.float64))
            for f, nbytes in zip(flows.tolist(), per_flow.tolist(), strict=True):
                conn = self._conn.get((ep, f))
                if conn is not None:
                    self._dir_tx[conn[0]] = self._dir_tx.get(conn[0], 0) + int(nbytes)
                    self._dir_ep.setdefault(conn[0], (ep, f))
            data = np.array([self._is_data(ep, f) for f in flows.tolist()])
            self._sending.update((ep, f) for f in flows[data].tolist())
            if not data.all():
                sent &= np.isin(b.flow, flows[data])
                if not sent.any():
                    return
        abs_epoch = (b.t0_ns // b.epoch_ns) + b.epoch[sent].astype(np.int64)
        per_win = self.window_ns // b.epoch_ns if self.window_ns >= b.epoch_ns else 1
        win = abs_epoch // per_win
        byts = np.bincount(win - win.min(), weights=b.tx_bytes[sent].astype(np.float64))
        # several flows of a NIC send in the same epoch: the NIC sent in it once
        uniq = np.unique(abs_epoch)
        uw = uniq // per_win
        act = np.bincount(uw - win.min(), minlength=byts.shape[0])
        tx = self._tx.setdefault(ep, {})
        for i in np.flatnonzero(byts):
            w = int(win.min()) + int(i)
            cell = tx.setdefault(w, [0, 0, b.epoch_ns])
            cell[0] += int(byts[i])
            cell[1] = min(cell[1] + int(act[i]), per_win)

    def _emit(self, final: bool) -> SegmentOutput:
        out = SegmentOutput()
        if not self._end:
            return out
        # a window is closed when every endpoint's data went two windows past it
        frontier = min(self._end.values()) // self.window_ns - 2 if not final else 1 << 62
        windows = sorted({w for tx in self._tx.values() for w in tx if self._emitted_upto < w <= frontier})
        for w in windows:
            by_group: dict[str, list[tuple[str, list[int]]]] = {}
            for ep, tx in self._tx.items():
                cell = tx.pop(w, None)
                if cell is not None and cell[1] > 0:
                    by_group.setdefault(self._group(ep), []).append((ep, cell))
            for group, cells in by_group.items():
                # one communicator per set of NICs sending together: a NIC idle in a window
                # (a pipeline bubble) is not a member missing from it
                members = frozenset(ep for ep, _ in cells)
                comm = self._comms.get((group, members))
                if comm is None:
                    comm = self._comms[(group, members)] = f"{INFERRED_PREFIX}{len(self._comms)}"
                ranks = {ep: i for i, ep in enumerate(sorted(members))}
                self._bind(comm, ranks, out)
                for ep, (nbytes, active, epoch_ns) in sorted(cells):
                    out.metrics.append(self._record(comm, w, ep, ranks, nbytes, active, epoch_ns))
        if windows:
            self._emitted_upto = max(self._emitted_upto, windows[-1])
        return out

    def _bind(self, comm: str, ranks: dict[str, int], out: SegmentOutput) -> None:
        """Tell the localizer whom each member sends to (the links its rate is about), as the
        bound flow events a descriptor source would have given."""
        for ep, flow in self._main_flows(ranks):
            peer = self._peer.get((ep, flow))
            if peer not in ranks or (comm, ep, flow) in self._told:
                continue
            self._told.add((comm, ep, flow))
            node, _, nic = ep.partition("/")
            job = self._jobs.get(node, "")
            out.forward(job, node, FlowEvent(job=job, node=node, nic=nic, flow=flow, comm_id=comm, rank=ranks[ep],
                                             peer=ranks[peer], channel=0, direction="send", source="inferred"))

    def _main_flows(self, ranks: dict[str, int]) -> list[tuple[str, int]]:
        """Each member's flows that carried 90 % of its bytes so far, largest first: a rate
        is about the links its bytes went over (a full mesh's idle connections, a store's
        or a barrier's, are not what it measured)."""
        out: list[tuple[str, int]] = []
        for ep in sorted(ranks):
            sent = [(self._dir_tx.get(self._conn[(e, f)][0], 0), f) for e, f in self._sending
                    if e == ep and (e, f) in self._conn and self._is_data(e, f)]
            sent.sort(reverse=True)
            total = sum(b for b, _ in sent)
            acc = 0
            for b, f in sent:
                if total and acc >= 0.9 * total:
                    break
                out.append((ep, f))
                acc += b
        return out

    def _record(self, comm: str, w: int, ep: str, ranks: dict[str, int], nbytes: int, active: int,
                epoch_ns: int) -> OpMetrics:
        node, _, nic = ep.partition("/")
        job = self._jobs.get(node, "")
        act = active * epoch_ns
        start = w * self.window_ns
        return OpMetrics(job=job, node=node, comm_id=comm, seq=w if w >= 0 else 0,
                         rank=ranks[ep], kind="GroupP2P", nranks=len(ranks), start_ns=start,
                         end_ns=start + self.window_ns, duration_ns=self.window_ns, act_ns=act,
                         volume_bytes=nbytes, expected_bytes=nbytes, complete=True,
                         active_rate=nbytes / (act / 1e9) if act else 0.0, flows=1, epoch_ns=epoch_ns, nics=[nic])
