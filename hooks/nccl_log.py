"""Parse ``NCCL_DEBUG=INFO`` output (NCCL 2.3 - 2.30) into comm / op / flow hook events.

The line forms are in :mod:`pulse.hooks.nccl_forms` and docs/hooks.md. A COLL line of a comm
whose init the log does not hold (a log followed from the middle of a job) still becomes an
op event: of a comm known by its pointer, size, process and device, with no rank until a line
names it (then the comm event is emitted again, with the rank). Send/Recv lines sharing an
opCount on one comm form one ``GroupP2P`` operator. ``Channel ... via NET/...`` lines become
:class:`NetChannel` bindings for joins (see ``rdma_res``); ``NET/IB`` QPN lines become flow
events for the local QPN. Anything else is counted in ``stats``, never fatal; a line that
cannot be read whole (cut by wrapping, two processes' output run together) is counted as
``garbled`` and never guessed at.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pulse.hooks.follow import follow_lines
from pulse.hooks.nccl_forms import (
    _BAD_NAME,
    _CHANNEL,
    _COLL,
    _COLL_KINDS,
    _COLL_START,
    _END,
    _INIT,
    _INIT_START,
    _NETIB_DEV,
    _NETIB_DEV_23,
    _NETIB_USING,
    _PREFIX,
    _QPN_FORMS,
    _RANK_INFO,
    _RING_NEIGH,
    _RING_ORDER,
    _STAMP,
    _TREE_GRAPH,
    _TREE_ITEM,
    _TREE_ITEM_OLD,
    _TREES,
    _TUNING,
    _VERSION,
    _VIA_NET,
    NCCL_DTYPES,
)

from pulse.errors import ConfigError, PulseError
from pulse.events import DTYPE_SIZES, CommEvent, FlowEvent, HookEvent, OpEvent

SOURCE = "nccl-log"


@dataclasses.dataclass(frozen=True)
class NetChannel:
    """One ``Channel xx/y : a[b] -> c[d] [send|receive] via NET/...`` line: a network
    connection of ``rank`` to ``peer`` on ``channel``, through NCCL net device ``netdev``."""

    node: str
    pid: int
    comm_id: str | None
    rank: int
    peer: int
    channel: int
    direction: str
    net: str
    netdev: int
    proxy_rank: int | None = None


@dataclasses.dataclass
class _Comm:
    comm_id: str
    rank: int | None
    """None for a comm first seen in a COLL line until a line names its rank."""
    nranks: int
    ptr: str | None = None
    """Set for comms learned mid-run (their comm events carry it)."""
    device: int | None = None
    seq: int = 0
    group_opc: str | None = None
    members: list[tuple[str, str, int, int, int]] = dataclasses.field(default_factory=list)
    group_t: int | None = None


@dataclasses.dataclass
class _Proc:
    node: str
    version: str | None = None
    comms: dict[str, _Comm] = dataclasses.field(default_factory=dict)
    order: list[str] = dataclasses.field(default_factory=list)
    rings: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    rings_truncated: set[int] = dataclasses.field(default_factory=set)
    trees: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    ibdevs: dict[int, tuple[str, str]] = dataclasses.field(default_factory=dict)
    ranks: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    """(rank, nranks) named for a comm pointer before any COLL line of it."""
    cids: dict[str, str] = dataclasses.field(default_factory=dict)
    """commId named for a comm pointer by an "Init START" line before any COLL line of it."""
    gen: dict[str, int] = dataclasses.field(default_factory=dict)
    """How many comms at this pointer were destroyed (a new one gets a new id)."""
    pending_channels: list[tuple[int, int, int, str, str, int, int | None]] = dataclasses.field(default_factory=list)


class NcclLogParser:
    """Line-by-line parser; keeps per-process state (comms by pointer, rings, devices)."""

    def __init__(self, job: str = "", node: str | None = None, t_host_ns: int | None = None) -> None:
        self.job = job
        self.node = node
        self.t_host_ns = t_host_ns
        self._t_default = t_host_ns
        self.stats: dict[str, int] = {}
        self.channels: list[NetChannel] = []
        self.versions: dict[tuple[str, int], str] = {}
        self._procs: dict[tuple[str, int], _Proc] = {}
        self._qpns: set[tuple[str, int, int, int]] = set()

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    # ---------------------------------------------------------------- input
    def feed(self, lines: Iterable[str]) -> list[HookEvent]:
        out: list[HookEvent] = []
        for line in lines:
            self.line(line, out)
        return out

    def line(self, line: str, out: list[HookEvent]) -> None:
        self._count("lines")
        m = _PREFIX.search(line.rstrip("\r\n"))
        if m is None:
            # A COLL message without its prefix is the second half of a line broken by
            # wrapping or interleaving: which process printed it is unknowable.
            self._count("garbled" if _COLL_START.search(line) else "foreign")
            return
        if m["level"] != "INFO" or m["msg"] is None:
            self._count("other_level")
            return
        host, pid, msg = m["host"], int(m["pid"]), m["msg"].strip()
        if ("NCCL " in msg and _PREFIX.search(msg) is not None) or "NCCL " in line[:m.start()]:
            # Two prefixes on one line: processes wrote into each other's lines, so the
            # message may belong to either of them.
            self._count("garbled")
            return
        stamp = _STAMP.match(line)
        self.t_host_ns = _stamp_ns(stamp) if stamp is not None else self._t_default
        key = (host, pid)
        proc = self._procs.get(key)
        if proc is None:
            proc = self._procs[key] = _Proc(node=self.node or _BAD_NAME.sub("_", host)[:128] or "unknown")
        try:
            handled = self._message(proc, pid, int(m["dev"]), msg, out)
        except (PulseError, ValueError, OverflowError):
            self._count("errors")
            return
        if not handled:
            self._count("unknown")

    def flush(self) -> list[HookEvent]:
        """Emit p2p groups still open (call at end of input); NET connections of processes
        whose comm never showed up are kept, unbound (``comm_id`` None)."""
        out: list[HookEvent] = []
        for (_host, pid), proc in self._procs.items():
            pending, proc.pending_channels = proc.pending_channels, []
            for item in pending:
                self._bind_channel(proc, pid, *item)
            for comm in proc.comms.values():
                self._close_group(proc, comm, out)
        return out

    # ---------------------------------------------------------------- messages
    def _message(self, proc: _Proc, pid: int, dev: int, msg: str, out: list[HookEvent]) -> bool:
        if (m := _COLL.match(msg)) is not None:
            self._count("coll")
            self._coll(proc, pid, dev, m, out)
            return True
        if _COLL_START.match(msg):
            self._count("garbled")  # a COLL line cut short or run into another one
            return True
        if msg.endswith("COMPLETE"):
            if (m := _END.match(msg)) is not None:
                self._count("destroy")
                self._end(proc, pid, m, out)
                return True
            m = _INIT.match(msg)
            if m is None:
                return False
            self._count("init")
            self._init(proc, pid, m, out)
            return True
        if msg.endswith("Init START") and (m := _INIT_START.match(msg)) is not None:
            self._count("init_start")
            if m["cid"] and m["comm"] not in proc.comms:
                proc.cids[m["comm"]] = m["cid"]
            self._learn(proc, pid, m["comm"], int(m["rank"]), int(m["nranks"]), out)
            return True
        if (m := _RANK_INFO.match(msg)) is not None:
            self._count("rank_info")
            self._learn(proc, pid, m["comm"], int(m["rank"]), int(m["nranks"]), out)
            return True
        if (m := _CHANNEL.match(msg)) is not None:
            self._channel(proc, pid, m)
            return True
        if (m := _RING_ORDER.match(msg)) is not None:
            self._count("ring")
            ch = int(m["ch"])
            proc.rings[ch] = [int(x) for x in m["ranks"].split()]
            if m["trunc"]:
                proc.rings_truncated.add(ch)
            return True
        if (m := _TREES.match(msg)) is not None:
            self._count("trees")
            for item in _TREE_ITEM.finditer(m["body"]):
                ch, d0, d1, d2, rank, up = (int(x) for x in item.groups())
                proc.trees[ch] = [rank, up, d0, d1, d2]
            for item in _TREE_ITEM_OLD.finditer(m["body"]):  # 2.4: up->rank->downs
                ch, up, rank, d0, d1, d2 = (int(x) for x in item.groups())
                proc.trees[ch] = [rank, up, d0, d1, d2]
            return True
        if _RING_NEIGH.match(msg) or _TREE_GRAPH.match(msg):
            self._count("neighbours")
            return True
        if msg.startswith("NET/IB"):
            return self._netib(proc, pid, msg, out)
        if (m := _VERSION.search(msg)) is not None:
            self._count("version")
            proc.version = m["ver"]
            return True
        if _TUNING.match(msg):
            self._count("info")
            return True
        return False

    def _comm_id(self, proc: _Proc, m: re.Match[str], pid: int) -> str:
        if m["cid"]:
            return f"{int(m['cid'], 16):#x}"
        parent = proc.comms.get(m["parent"] or "")
        if m["color"] is not None and parent is not None:
            # Split comms print no commId; parent id + split count + color is the same on
            # every member rank.
            return f"{parent.comm_id}.s{m['splitn'] or 0}.c{m['color']}"[:64]
        # Nothing shared across ranks is printed (pre-2.16 lines): a process-local id.
        return _local_id(proc, pid, m["comm"])

    def _init(self, proc: _Proc, pid: int, m: re.Match[str], out: list[HookEvent]) -> None:
        rank, nranks = int(m["rank"]), int(m["nranks"])
        comm = _Comm(comm_id=self._comm_id(proc, m, pid), rank=rank, nranks=nranks)
        proc.ranks.pop(m["comm"], None)
        proc.cids.pop(m["comm"], None)
        if m["comm"] in proc.comms:
            self._forget(proc, m["comm"], out)
        proc.comms[m["comm"]] = comm
        proc.order.append(m["comm"])
        rings = [proc.rings[ch] for ch in sorted(proc.rings)
                 if ch not in proc.rings_truncated and len(proc.rings[ch]) == nranks]
        trees = [proc.trees[ch] for ch in sorted(proc.trees)] if proc.trees else None
        proc.rings, proc.trees, proc.rings_truncated = {}, {}, set()
        out.append(CommEvent(job=self.job, node=proc.node, comm_id=comm.comm_id, rank=rank, nranks=nranks, pid=pid,
                             rings=rings or None, trees=trees if trees and rank == trees[0][0] else None,
                             t_host_ns=self.t_host_ns, source=SOURCE))
        # Connections logged before this comm completed belong to it (2.18-2.21 connect at init).
        pending, proc.pending_channels = proc.pending_channels, []
        for item in pending:
            self._bind_channel(proc, pid, *item)

    def _coll(self, proc: _Proc, pid: int, dev: int, m: re.Match[str], out: list[HookEvent]) -> None:
        ptr, nranks = m["comm"], int(m["nranks"])
        comm = proc.comms.get(ptr)
        if comm is None:
            if not ptr.startswith("0x") or nranks < 1:
                self._count("errors")
                return
            comm = self._midrun(proc, pid, dev, ptr, nranks, out)
        elif comm.nranks != nranks:
            # Not the comm we know at this address (one we did not see destroyed): count
            # it rather than attribute the op to either.
            self._count("conflicts")
            return
        op, opc = m["op"], m["opc"]
        if op in ("Send", "Recv"):
            if comm.members and comm.group_opc != opc:
                self._close_group(proc, comm, out)
            comm.group_opc = opc
            comm.group_t = self.t_host_ns
            comm.members.append((op, m["dt"], int(m["count"]), int(m["root"]), comm.nranks))
            return
        self._close_group(proc, comm, out)
        seq = comm.seq
        comm.seq += 1
        dt = int(m["dt"])
        if op not in _COLL_KINDS or dt >= len(NCCL_DTYPES):
            self._count("unsupported")
            return
        dtype = NCCL_DTYPES[dt]
        count = int(m["count"])
        if op in ("AllGather", "ReduceScatter"):
            count *= comm.nranks  # per-rank count in the log; S is the full array (semantics.md)
        root = int(m["root"])
        out.append(OpEvent(job=self.job, node=proc.node, comm_id=comm.comm_id, rank=comm.rank, seq=seq, kind=op,
                           count=count, dtype=dtype, bytes=count * DTYPE_SIZES[dtype], nranks=comm.nranks,
                           root=root if op in ("Broadcast", "Reduce") and 0 <= root < comm.nranks else None,
                           t_host_ns=self.t_host_ns, source=SOURCE))

    def _midrun(self, proc: _Proc, pid: int, dev: int, ptr: str, nranks: int, out: list[HookEvent]) -> _Comm:
        """A comm whose init the log does not hold (followed from the middle of a job, after
        rotation, or with only COLL enabled): known by its pointer, size, process and device;
        its rank only if a line named it already."""
        self._count("midrun_comms")
        known = proc.ranks.pop(ptr, None)
        rank = known[0] if known is not None and known[1] == nranks and known[0] < nranks else None
        cid = proc.cids.pop(ptr, None)
        # An "Init START" line gave the commId: the id every rank shares, as after Init COMPLETE.
        comm_id = f"{int(cid, 16):#x}" if cid is not None and rank is not None else _local_id(proc, pid, ptr)
        comm = _Comm(comm_id=comm_id, rank=rank, nranks=nranks, ptr=ptr.lower(),
                     device=dev if -1 <= dev <= 1 << 16 else None)
        proc.comms[ptr] = comm
        proc.order.append(ptr)
        out.append(self._comm_event(proc, pid, comm))
        return comm

    def _comm_event(self, proc: _Proc, pid: int, comm: _Comm) -> CommEvent:
        return CommEvent(job=self.job, node=proc.node, comm_id=comm.comm_id, rank=comm.rank, nranks=comm.nranks,
                         pid=pid, ptr=comm.ptr, device=comm.device, t_host_ns=self.t_host_ns, source=SOURCE)

    def _learn(self, proc: _Proc, pid: int, ptr: str, rank: int, nranks: int, out: list[HookEvent]) -> None:
        """A line named the rank of the comm at ``ptr``: fill it in (a comm event again)."""
        if rank >= nranks:
            self._count("errors")
            return
        comm = proc.comms.get(ptr)
        if comm is None:
            proc.ranks[ptr] = (rank, nranks)
            return
        if comm.nranks != nranks or (comm.rank is not None and comm.rank != rank):
            self._count("conflicts")
            return
        if comm.rank is None:
            comm.rank = rank
            self._count("ranks_learned")
            out.append(self._comm_event(proc, pid, comm))

    def _end(self, proc: _Proc, pid: int, m: re.Match[str], out: list[HookEvent]) -> None:
        ptr = m["comm"]
        if int(m["rank"]) >= int(m["nranks"]):
            self._count("errors")  # an impossible line is not trusted to end anything
            return
        self._learn(proc, pid, ptr, int(m["rank"]), int(m["nranks"]), out)
        proc.ranks.pop(ptr, None)
        proc.cids.pop(ptr, None)
        if ptr in proc.comms:
            self._forget(proc, ptr, out)

    def _forget(self, proc: _Proc, ptr: str, out: list[HookEvent]) -> None:
        """The comm at ``ptr`` is gone: a later comm at the same address is another one."""
        comm = proc.comms.pop(ptr)
        self._close_group(proc, comm, out)
        proc.order.remove(ptr)
        proc.gen[ptr] = proc.gen.get(ptr, 0) + 1

    def _close_group(self, proc: _Proc, comm: _Comm, out: list[HookEvent]) -> None:
        members, comm.members = comm.members, []
        if not members:
            return
        seq = comm.seq
        comm.seq += 1
        calls = []
        for op, dt, count, peer, _ in members:
            if int(dt) >= len(NCCL_DTYPES) or not 0 <= peer < comm.nranks:
                self._count("unsupported")
                return
            calls.append((op, NCCL_DTYPES[int(dt)], count, peer))
        if len(calls) == 1:
            op, dtype, count, peer = calls[0]
            out.append(OpEvent(job=self.job, node=proc.node, comm_id=comm.comm_id, rank=comm.rank, seq=seq, kind=op,
                               count=count, dtype=dtype, bytes=count * DTYPE_SIZES[dtype], nranks=comm.nranks,
                               peer=peer, t_host_ns=comm.group_t, source=SOURCE))
            return
        peers = sorted({c[3] for c in calls})
        sent = dict.fromkeys(peers, 0)
        recv = dict.fromkeys(peers, 0)
        for op, dtype, count, peer in calls:
            (sent if op == "Send" else recv)[peer] += count * DTYPE_SIZES[dtype]
        dtypes = {c[1] for c in calls if c[0] == "Send"} or {calls[0][1]}
        dtype = dtypes.pop() if len(dtypes) == 1 else "bytes"
        total = sum(sent.values())
        out.append(OpEvent(job=self.job, node=proc.node, comm_id=comm.comm_id, rank=comm.rank, seq=seq,
                           kind="GroupP2P", count=total // DTYPE_SIZES[dtype], dtype=dtype, bytes=total,
                           nranks=comm.nranks, group=int(comm.group_opc or "0", 16), peers=peers,
                           peer_send_bytes=[sent[p] for p in peers], peer_recv_bytes=[recv[p] for p in peers],
                           t_host_ns=comm.group_t, source=SOURCE))

    def _channel(self, proc: _Proc, pid: int, m: re.Match[str]) -> None:
        via = _VIA_NET.match(m["via"])
        if via is None:  # P2P / SHM / CollNet: inside the node, no NIC flow
            self._count("channel_local")
            return
        if m["dir"] is None:
            # 2.3 printed only the receive side, untagged; no direction is written down,
            # so the line binds nothing.
            self._count("channel_net_untagged")
            return
        self._count("channel_net")
        src, dst = int(m["src"]), int(m["dst"])
        direction = "recv" if m["dir"] == "receive" else "send"
        rank, peer = (dst, src) if direction == "recv" else (src, dst)
        proxy = int(via["proxy"]) if via["proxy"] else None
        item = (rank, peer, int(m["ch"]), direction, via["net"], int(via["netdev"]), proxy)
        if not self._bind_channel(proc, pid, *item, pending_ok=True):
            proc.pending_channels.append(item)

    def _bind_channel(self, proc: _Proc, pid: int, rank: int, peer: int, ch: int, direction: str, net: str,
                      netdev: int, proxy: int | None, pending_ok: bool = False) -> bool:
        # The newest comm of this process in which this process has `rank` (runtime connect
        # in 2.22+ prints these lines after Init COMPLETE).
        for ptr in reversed(proc.order):
            comm = proc.comms[ptr]
            if comm.rank == rank and peer < comm.nranks:
                self.channels.append(NetChannel(node=proc.node, pid=pid, comm_id=comm.comm_id, rank=rank, peer=peer,
                                                channel=ch, direction=direction, net=net, netdev=netdev,
                                                proxy_rank=proxy))
                return True
        if not pending_ok:
            self.channels.append(NetChannel(node=proc.node, pid=pid, comm_id=None, rank=rank, peer=peer, channel=ch,
                                            direction=direction, net=net, netdev=netdev, proxy_rank=proxy))
        return False

    def _netib(self, proc: _Proc, pid: int, msg: str, out: list[HookEvent]) -> bool:
        if (d := _NETIB_DEV_23.match(msg)) is not None:
            self._count("netib_devices")
            proc.ibdevs[int(d["idx"])] = (d["name"], "roce" if d["kind"] == "RoCE" else "ib")
            return True
        if _NETIB_USING.match(msg):
            self._count("netib_devices")
            for d in _NETIB_DEV.finditer(msg):
                proc.ibdevs[int(d["idx"])] = (d["name"], "roce" if d["kind"] == "RoCE" else "ib")
            return True
        for form in _QPN_FORMS:
            m = form.match(msg)
            if m is None:
                continue
            self._count("qpn")
            dev, qpn = int(m["dev"]), int(m["qpn"])
            groups: dict[str, Any] = m.groupdict()
            name = groups.get("name")
            known = proc.ibdevs.get(dev)
            nic = _BAD_NAME.sub("_", name or (known[0] if known else f"mlx5_{dev}"))[:128]
            rest = groups.get("rest") or ""
            transport = known[1] if known else ("roce" if " GID " in rest else "ib" if " LID " in rest else None)
            key = (proc.node, pid, dev, qpn)
            if key in self._qpns or not 0 <= qpn < (1 << 24):
                return True
            self._qpns.add(key)
            out.append(FlowEvent(job=self.job, node=proc.node, nic=nic, flow=qpn, transport=transport, qpn=qpn,
                                 pid=pid, source=SOURCE, t_host_ns=self.t_host_ns))
            return True
        return False


def _local_id(proc: _Proc, pid: int, ptr: str) -> str:
    """A process-local comm id (nothing shared across ranks was printed for it)."""
    gen = proc.gen.get(ptr, 0)
    tail = f"{pid}:{ptr.lower()}{f'.{gen}' if gen else ''}"
    node = proc.node if len(proc.node) + len(tail) <= 57 else hashlib.blake2b(proc.node.encode(), digest_size=6).hexdigest()
    return f"local:{node}:{tail}"[:64]


def _stamp_ns(m: re.Match[str]) -> int | None:
    try:
        t = time.mktime(time.strptime(f"{m['date']} {m['time']}", "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return None
    frac = (m["frac"] or "").ljust(9, "0")
    return int(t) * 1_000_000_000 + int(frac)


def parse_lines(lines: Iterable[str], job: str = "", node: str | None = None) -> tuple[list[HookEvent], NcclLogParser]:
    parser = NcclLogParser(job=job, node=node)
    events = parser.feed(lines)
    events += parser.flush()
    return events, parser


def parse_file(path: str | os.PathLike[str], job: str = "", node: str | None = None) -> tuple[list[HookEvent], NcclLogParser]:
    p = Path(path)
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            return parse_lines(fh, job=job, node=node)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the NCCL log ({exc.strerror})") from None


def follow_file(path: str | os.PathLike[str], parser: NcclLogParser | None = None, *, poll: float = 0.2,
                idle_timeout: float | None = None, from_start: bool = True) -> Iterator[HookEvent]:
    """Yield events as lines are appended to ``path`` (like ``tail -F``: a truncated or
    replaced file is read again from its start); stop after ``idle_timeout`` idle seconds."""
    parser = parser or NcclLogParser()
    for lines in follow_lines(path, poll=poll, idle_timeout=idle_timeout, from_start=from_start):
        out: list[HookEvent] = []
        for line in lines:
            parser.line(line, out)
        yield from out
    yield from parser.flush()
