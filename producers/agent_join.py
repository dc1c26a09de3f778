"""The agent's join of captured TCP connections to communicator ranks (``pulse agent``).

RDMA flows are bound by the hooks themselves (the NCCL plugin and log name the QPs) and by
``rdma res``. A TCP collective backend (torch's Gloo) names nothing: the agent binds its
connections from what the node can see, plus what the other nodes' agents announce:

* **owner**: a captured connection's local socket belongs to a process (``/proc/PID/net/tcp``
  and ``/proc/PID/fd``); when that process is a rank of exactly one communicator (its
  ``comm`` hook event carries the pid) the connection is that rank's;
* **peer**: the remote address is another node's (each agent announces its addresses and
  ranks on ``pulse.pipeline``, see :mod:`pulse.producers.agent`); a node with one rank of
  the communicator gives the peer rank;
* **ring order**: Gloo's ring AllReduce sends a rank's data to one peer, so each rank's
  main send peer (most bytes, clearly ahead of the next, stable for a few ticks) is its
  ring successor; the agents announce it, and once the announced successors form one cycle
  the communicator's ``rings`` are known (the lab infers it the same way from a capture).

Until then nothing of the communicator is published: its operators and the rows of its
connections would be segmented without a ring order, and its first collectives (DDP's
parameter broadcast and bucket rebuild) have no op event at all. Once the ring is known,
each agent proposes a start seq a few seconds ahead of its ranks (``START_LEAD_S``);
publication starts at the largest proposal, so every node starts at the same operator, at
the same time, and each node's rows start at that operator's issue time on the node (the
lab analysis's warm-up cut, without knowing the job's steps).

Rows of TCP flows the join does not bind are counted, not published (the segmenter could
only count them); other transports pass through.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import socket
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from pulse.events import CommEvent, FlowEvent, HookEvent, OpEvent
from pulse.samples import EpochBatch

NEXT_MIN_BYTES = 1 << 20
"""Bytes a rank must have sent to its main peer before that peer counts as its successor."""
NEXT_LEAD = 1.5
"""The main peer's bytes over the runner-up's."""
NEXT_STABLE_TICKS = 3
"""Consecutive ticks the main peer must stay the same (DDP's start-up broadcast goes elsewhere)."""
START_LEAD_S = 3.0
"""How far ahead (at the ranks' recent pace) the start is proposed. Every agent must learn
the agreed start before any rank reaches it: then every node publishes from the same
operator on, live. An agent that learns it late sends its buffered rows at once, and the
worker's aligner, which waits at most 1 s of trace time for a node behind, may then release
operators without that node's ranks (and from then on wait for fewer). It covers the
announcements' way round (a health period, a fetch, a tick) with room for a busy host."""
START_MIN_OPS = 4
START_MIN_SEQ = 65
"""The streaming segmenter takes a stream whose first operator has a seq up to its
``late_batches`` (64) for one that began at seq 0 and arrived out of order: it waits for
the missing seqs until 64 later ones arrived, then skips them. An agent starting at seq 40
would have every node's operators held for 64 operators and let out in a burst, at a
different moment on each node: the worker's aligner then releases them in fragments (the
same failure as staggered starts). So the start is never below 65."""
RATE_WINDOW_NS = 5_000_000_000
MAX_BUFFERED_BATCHES = 4096
MAX_BUFFERED_OPS = 65536

ConnKey = tuple[str, int, str, int]
"""(local address, local port, remote address, remote port)."""


def _hex_addr(text: str) -> tuple[str, int]:
    """``/proc/net/tcp`` address ``0100007F:1F90`` -> ("127.0.0.1", 8080)."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        addr = socket.inet_ntop(socket.AF_INET, raw[::-1])
    else:  # four little-endian 32-bit words
        words = struct.unpack("<4I", raw)
        addr = socket.inet_ntop(socket.AF_INET6, struct.pack(">4I", *words))
        if addr.startswith("::ffff:") and "." in addr:
            addr = addr[7:]
    return addr, int(port, 16)


def read_tcp_table(pid: int, proc: Path = Path("/proc")) -> dict[int, ConnKey]:
    """Socket inode -> connection, from the TCP tables of ``pid``'s network namespace."""
    out: dict[int, ConnKey] = {}
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc / str(pid) / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != "01":  # ESTABLISHED only
                continue
            try:
                la, lp = _hex_addr(f[1])
                ra, rp = _hex_addr(f[2])
                out[int(f[9])] = (la, lp, ra, rp)
            except (ValueError, OSError):
                continue
    return out


def socket_inodes(pid: int, proc: Path = Path("/proc")) -> set[int]:
    out: set[int] = set()
    try:
        fds = os.listdir(proc / str(pid) / "fd")
    except OSError:
        return out
    for fd in fds:
        try:
            target = os.readlink(proc / str(pid) / "fd" / fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def process_connections(pid: int, proc: Path = Path("/proc")) -> set[ConnKey]:
    """Established TCP connections whose socket ``pid`` holds."""
    table = read_tcp_table(pid, proc)
    return {table[i] for i in socket_inodes(pid, proc) if i in table}


@dataclasses.dataclass
class _Side:
    nic: str
    flow: int
    event: FlowEvent


@dataclasses.dataclass
class _Conn:
    rank: int
    remote: str
    tx: _Side | None = None
    rx: _Side | None = None
    tx_bytes: int = 0


@dataclasses.dataclass
class _Gate:
    """One gated communicator on this node."""

    comm_id: str
    nranks: int
    pids: dict[int, int] = dataclasses.field(default_factory=dict)
    """local rank -> pid"""
    comm_events: dict[int, CommEvent] = dataclasses.field(default_factory=dict)
    conns: dict[ConnKey, _Conn] = dataclasses.field(default_factory=dict)
    next_seen: dict[int, tuple[int | None, int]] = dataclasses.field(default_factory=dict)
    """local rank -> (main peer, consecutive ticks)"""
    last_seq: dict[int, int] = dataclasses.field(default_factory=dict)
    my_start: dict[int, int] = dataclasses.field(default_factory=dict)
    ring: list[int] | None = None
    start: int | None = None
    released: bool = False
    cut_ns: int | None = None
    ops: list[OpEvent] = dataclasses.field(default_factory=list)
    batches: collections.deque[EpochBatch] = dataclasses.field(default_factory=collections.deque)
    flows: dict[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    """(nic, flow) of a bound connection side -> local rank"""

    def ring_next(self, rank: int) -> int | None:
        v = self.next_seen.get(rank)
        return v[0] if v is not None and v[1] >= NEXT_STABLE_TICKS else None


@dataclasses.dataclass
class JoinStats:
    tcp_flows: int = 0
    bound_flows: int = 0
    unbound_tcp_rows: int = 0
    rows_before_start: int = 0
    ops_before_start: int = 0
    buffer_dropped: int = 0
    ambiguous: int = 0


class TcpJoin:
    """Stateful join for one node; driven by the agent's main loop (not thread safe)."""

    def __init__(self, node: str, addresses: Iterable[str], *, gate: bool = True,
                 proc: Path = Path("/proc")) -> None:
        self.node = node
        self.gate = gate
        """False (no capture): there is nothing to join, torch communicators pass as they come."""
        self.addresses = sorted(set(addresses))
        self.proc = proc
        self.stats = JoinStats()
        self.gates: dict[str, _Gate] = {}
        self._tcp: dict[ConnKey, list[FlowEvent]] = {}
        """captured TCP sides not bound yet"""
        self._transport: dict[tuple[str, int], str] = {}
        self._directory: dict[str, dict[str, Any]] = {}
        self._tcp_seen = 0
        self._looked = 0.0

    # -- inputs ----------------------------------------------------------------------
    def capture_events(self, events: Iterable[FlowEvent]) -> list[HookEvent]:
        """Flow events of the live capture: TCP ones are kept for the join (nothing is
        published for them until bound); others pass."""
        out: list[HookEvent] = []
        for ev in events:
            self._transport[(ev.nic, ev.flow)] = ev.transport or "?"
            if ev.transport != "tcp" or ev.src is None or ev.dst is None:
                out.append(ev)
                continue
            self.stats.tcp_flows += 1
            if ev.src in self.addresses:
                key = (ev.src, int(ev.sport or 0), ev.dst, int(ev.dport or 0))
            else:
                key = (ev.dst, int(ev.dport or 0), ev.src, int(ev.sport or 0))
            self._tcp.setdefault(key, []).append(ev)
        return out

    def hook_events(self, events: Iterable[HookEvent]) -> list[HookEvent]:
        """Hook events of this node: a torch communicator's go through its gate; the rest pass."""
        out: list[HookEvent] = []
        for ev in events:
            if (self.gate and isinstance(ev, CommEvent) and (ev.source or "").startswith("torch")
                    and ev.pid is not None and ev.rank is not None):
                g = self.gates.get(ev.comm_id)
                if g is not None and g.pids.get(ev.rank) not in (None, ev.pid):
                    g = None  # the same communicator id in a new job: start over
                if g is None:
                    g = self.gates[ev.comm_id] = _Gate(ev.comm_id, ev.nranks)
                g.pids[ev.rank] = ev.pid
                g.comm_events[ev.rank] = ev
                if g.released:
                    out.append(ev)
                continue
            if isinstance(ev, OpEvent) and ev.comm_id in self.gates and ev.rank is not None:
                g = self.gates[ev.comm_id]
                g.last_seq[ev.rank] = max(g.last_seq.get(ev.rank, -1), ev.seq)
                if g.released:
                    out.append(ev)
                    continue
                # kept from the start (a rolling window): the start seq is agreed later
                if len(g.ops) >= MAX_BUFFERED_OPS:
                    g.ops.pop(0)
                    if g.my_start:
                        self.stats.buffer_dropped += 1
                g.ops.append(ev)
                continue
            out.append(ev)
        return out

    def batches(self, batches: Iterable[EpochBatch]) -> list[EpochBatch]:
        """Rows of released connections (from the cut on) and of non-TCP flows go out; rows
        of connections waiting for their communicator's start are buffered; the rest counted."""
        out: list[EpochBatch] = []
        for b in batches:
            if b.flow.size == 0:
                continue
            flows = b.flow.astype(np.int64)
            top = int(flows.max()) + 1
            # per flow id: -1 drop, -2 pass, else the index of a gate in `order`
            action = np.full(top, -1, np.int64)
            order = list(self.gates.values())
            for fid in np.unique(flows).tolist():
                if self._transport.get((b.nic, fid), "tcp") != "tcp":
                    action[fid] = -2
            for gi, g in enumerate(order):
                for (nic, fid), _rank in g.flows.items():
                    if nic == b.nic and fid < top:
                        action[fid] = gi
            act = action[flows]
            passed = act == -2
            dropped = act == -1
            self.stats.unbound_tcp_rows += int(dropped.sum())
            if passed.any():
                out.append(_rows(b, passed))
            for gi in np.unique(act[act >= 0]).tolist():
                g = order[gi]
                sel = _rows(b, act == gi)
                if g.released:
                    cut = _trim(sel, g.cut_ns)
                    if cut is not None:
                        out.append(cut)
                else:
                    # a rolling window until the start is agreed: the cut (the first
                    # operator's issue time) may lie before this node learned the start seq
                    if len(g.batches) >= MAX_BUFFERED_BATCHES:
                        old = g.batches.popleft()
                        if g.my_start:
                            self.stats.buffer_dropped += 1
                        else:
                            self.stats.rows_before_start += int(old.flow.size)
                    g.batches.append(sel)
            for gi, g in enumerate(order):
                # bytes per connection: the ring successor is the main send peer
                m = act == gi
                if not m.any() or g.released:
                    continue
                sums = np.bincount(flows[m], weights=b.tx_bytes[m].astype(np.float64), minlength=top)
                for c in g.conns.values():
                    if c.tx is not None and c.tx.nic == b.nic and c.tx.flow < top:
                        c.tx_bytes += int(sums[c.tx.flow])
        return out

    def directory(self, records: Iterable[dict[str, Any]]) -> None:
        """Other agents' announcements (their own record included is harmless)."""
        for r in records:
            node = r.get("node")
            if isinstance(node, str):
                self._directory[node] = r

    # -- the join --------------------------------------------------------------------
    def announce(self) -> dict[str, Any]:
        """What the other agents need from this node: addresses and per communicator the
        local ranks, their ring successors and start seqs."""
        comms = {}
        for g in self.gates.values():
            comms[g.comm_id] = {"nranks": g.nranks, "ranks": {
                str(r): {"next": g.ring_next(r), "start": g.my_start.get(r)} for r in sorted(g.pids)}}
        return {"node": self.node, "addresses": self.addresses, "comms": comms}

    def tick(self) -> tuple[list[EpochBatch], list[HookEvent]]:
        """Bind what can be bound, move gates forward; returns what became publishable."""
        batches: list[EpochBatch] = []
        events: list[HookEvent] = []
        self._own_connections()
        pending = [g for g in self.gates.values() if not g.released]
        for g in pending:
            self._successors(g)
        self.directory([self.announce()])
        for g in pending:
            if g.ring is None:
                ranks = self._global(g.comm_id)
                g.ring = _cycle({r: v.get("next") for r, v in ranks.items()}, g.nranks)
            if g.ring is not None:
                for r in g.pids:
                    if r not in g.my_start:
                        g.my_start[r] = max(START_MIN_SEQ, g.last_seq.get(r, -1) + 1 + self._lead_ops(g, r))
                self.directory([self.announce()])
                ranks = self._global(g.comm_id)
                starts = [v.get("start") for v in ranks.values()]
                if len(ranks) == g.nranks and all(isinstance(s, int) for s in starts):
                    g.start = max(int(s) for s in starts)  # type: ignore[arg-type]
            if g.start is not None:
                b, e = self._release(g)
                batches += b
                events += e
        return batches, events

    @staticmethod
    def _lead_ops(g: _Gate, rank: int) -> int:
        """Operators this rank issues in START_LEAD_S at its recent pace: the start is
        proposed that far ahead, so every agent knows it before any rank gets there."""
        now = time.time_ns()
        recent = sum(1 for o in g.ops if o.rank == rank and o.t_host_ns is not None
                     and now - RATE_WINDOW_NS <= o.t_host_ns <= now)
        return max(START_MIN_OPS, math.ceil(recent * START_LEAD_S * 1e9 / RATE_WINDOW_NS))

    def _own_connections(self) -> None:
        # /proc reads: when new connections were captured, else at most once a second
        # (connections nobody claims, e.g. not a job's, stay listed)
        now = time.monotonic()
        if not self._tcp or (len(self._tcp) == self._tcp_seen and now - self._looked < 1.0):
            return
        self._tcp_seen, self._looked = len(self._tcp), now
        owners: dict[ConnKey, list[tuple[_Gate, int]]] = collections.defaultdict(list)
        for g in self.gates.values():
            if g.released:
                continue
            for rank, pid in g.pids.items():
                for key in process_connections(pid, self.proc):
                    owners[key].append((g, rank))
        for key in list(self._tcp):
            who = owners.get(key)
            if not who:
                continue
            sides = self._tcp.pop(key)
            if len(who) > 1:
                self.stats.ambiguous += 1  # one process, several communicators: cannot tell
                continue
            g, rank = who[0]
            c = g.conns.setdefault(key, _Conn(rank, key[2]))
            for ev in sides:
                side = _Side(ev.nic, ev.flow, ev)
                if ev.src == key[0] and ev.sport == key[1]:
                    c.tx = side
                else:
                    c.rx = side
                g.flows[(ev.nic, ev.flow)] = rank

    def _peer_of(self, comm_id: str, address: str) -> int | None:
        for rec in self._directory.values():
            if address in (rec.get("addresses") or []):
                ranks = ((rec.get("comms") or {}).get(comm_id) or {}).get("ranks") or {}
                if len(ranks) == 1:
                    return int(next(iter(ranks)))
                if len(ranks) > 1:
                    self.stats.ambiguous += 1
                return None
        return None

    def _successors(self, g: _Gate) -> None:
        for rank in g.pids:
            per_peer: dict[int, int] = collections.defaultdict(int)
            for c in g.conns.values():
                if c.rank != rank:
                    continue
                p = self._peer_of(g.comm_id, c.remote)
                if p is not None:
                    per_peer[p] += c.tx_bytes
            best = sorted(per_peer.items(), key=lambda kv: -kv[1])
            main = None
            if best and best[0][1] >= NEXT_MIN_BYTES and (len(best) == 1 or best[0][1] >= NEXT_LEAD * best[1][1]):
                main = best[0][0]
            prev, n = g.next_seen.get(rank, (None, 0))
            g.next_seen[rank] = (main, n + 1 if main is not None and main == prev else (1 if main is not None else 0))

    def _global(self, comm_id: str) -> dict[int, dict[str, Any]]:
        ranks: dict[int, dict[str, Any]] = {}
        for rec in self._directory.values():
            for r, v in (((rec.get("comms") or {}).get(comm_id) or {}).get("ranks") or {}).items():
                ranks[int(r)] = v
        return ranks

    def _release(self, g: _Gate) -> tuple[list[EpochBatch], list[HookEvent]]:
        assert g.start is not None and g.ring is not None
        firsts = {o.rank: o for o in g.ops if o.seq == g.start}
        if set(firsts) != set(g.pids):
            return [], []  # the first operator has not been seen on every local rank yet
        g.cut_ns = min(int(o.t_host_ns or 0) for o in firsts.values())
        events: list[HookEvent] = []
        for ev in g.comm_events.values():
            events.append(ev)
            events.append(dataclasses.replace(ev, rings=[list(g.ring)], source="agent:ring"))
        # one connection per (rank, peer): the one that carried the most (not the store's)
        best: dict[tuple[int, int], _Conn] = {}
        for c in g.conns.values():
            p = self._peer_of(g.comm_id, c.remote)
            if p is None or p == c.rank:
                continue
            if (c.rank, p) not in best or c.tx_bytes > best[(c.rank, p)].tx_bytes:
                best[(c.rank, p)] = c
        g.flows = {}
        for (rank, peer), c in sorted(best.items()):
            for side, direction in ((c.tx, "send"), (c.rx, "recv")):
                if side is None:
                    continue
                g.flows[(side.nic, side.flow)] = rank
                events.append(dataclasses.replace(side.event, job=g.comm_events[rank].job, comm_id=g.comm_id,
                                                  rank=rank, peer=peer, channel=0, direction=direction,
                                                  pid=g.pids[rank], source="agent:tcp"))
                self.stats.bound_flows += 1
        ops = sorted((o for o in g.ops if o.seq >= g.start), key=lambda o: (o.rank, o.seq))
        self.stats.ops_before_start += len(g.ops) - len(ops)
        events += ops
        g.ops = []
        g.released = True
        out = []
        for b in g.batches:
            keep = np.isin(b.flow.astype(np.int64), [f for (nic, f) in g.flows if nic == b.nic])
            t = _trim(_rows(b, keep), g.cut_ns)
            self.stats.rows_before_start += int(b.flow.size) - (0 if t is None else int(t.flow.size))
            if t is not None:
                out.append(t)
        g.batches.clear()
        return out, events

    def forget_ended(self, alive: Iterable[int]) -> None:
        """Drop gates whose processes are all gone (a job ended)."""
        live = set(alive)
        for cid in [c for c, g in self.gates.items() if g.pids and not (set(g.pids.values()) & live)]:
            del self.gates[cid]


def _cycle(nxt: dict[int, Any], n: int) -> list[int] | None:
    if len(nxt) != n or any(not isinstance(v, int) for v in nxt.values()):
        return None
    ring = [0]
    while len(ring) < n:
        ring.append(int(nxt[ring[-1]]))
        if ring[-1] not in nxt:
            return None
    if len(set(ring)) != n or nxt[ring[-1]] != 0:
        return None
    return ring


def _rows(b: EpochBatch, mask: np.ndarray) -> EpochBatch:
    if mask.all():
        return b
    return dataclasses.replace(b, flow=b.flow[mask], epoch=b.epoch[mask], tx_bytes=b.tx_bytes[mask],
                               rx_bytes=None if b.rx_bytes is None else b.rx_bytes[mask])


def _trim(b: EpochBatch, cut_ns: int | None) -> EpochBatch | None:
    if cut_ns is not None:
        keep = b.t0_ns + b.epoch.astype(np.int64) * b.epoch_ns >= cut_ns
        b = _rows(b, keep)
    return b if b.flow.size else None
