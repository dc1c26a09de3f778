"""Read the NCCL profiler plugin's records and turn them into hook events.

The plugin (``nccl_profiler_plugin.c``) writes 64-byte little-endian records: a ``hello``
first in every file and every datagram (magic, pid, host), then ``init`` (one per
communicator), ``coll``, ``p2p``, ``proxy_op``, ``net_qp`` and ``fini``. This module maps:

* ``init``  -> :class:`~pulse.events.CommEvent` (comm_id = the NCCL commHash as ``0x...``,
  the same value NCCL logs as ``commId 0x...``),
* ``coll``  -> :class:`~pulse.events.OpEvent`; ``p2p`` records of one NCCL group -> one
  ``GroupP2P`` op (or a ``Send``/``Recv`` op when the group holds a single call),
* ``net_qp`` -> :class:`~pulse.events.FlowEvent` (flow = local QPN, peer/channel/direction
  from the proxy op the QP event hangs under).

``seq`` counts operators per communicator in the order the rank issued them (a p2p group is
one operator), which is the same on every rank of the communicator.

Trust: the agent's socket is bound 0660 in a private directory (:mod:`pulse.safefs`), and
every datagram's sender is read from the kernel (``SO_PASSCRED``/``SCM_CREDENTIALS``): only
datagrams from allowed uids are decoded (:class:`SenderPolicy`); the rest are counted in
``stats["rejected_senders"]``, so a local user cannot inject events that blame a node.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pulse.errors import ConfigError, DecodeError
from pulse.events import DTYPE_SIZES, CommEvent, FlowEvent, HookEvent, OpEvent
from pulse.safefs import check_private_dir
from pulse.settings import Settings

REC_SIZE = 64
MAGIC = 0x31534C50
FORMAT = 1
SOURCE = "nccl-plugin"

# Code tables shared with the C plugin (same order as FUNCS/DTYPES/ALGOS/PROTOS there).
FUNCS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", "Send", "Recv",
         "AlltoAll", "Gather", "Scatter", "SendRecv")
DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
          "bfloat16", "float8e4m3", "float8e5m2")
ALGOS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PROTOS = ("ll", "ll128", "simple")
KINDS = {1: "hello", 2: "init", 3: "coll", 4: "p2p", 5: "proxy_op", 6: "net_qp", 7: "fini", 8: "stats"}

_HEAD = [("kind", "u1"), ("abi", "u1"), ("flags", "<u2"), ("ctx", "<u4"), ("t_ns", "<u8")]
_LAYOUTS: dict[str, np.dtype] = {
    "hello": np.dtype([*_HEAD, ("magic", "<u4"), ("pid", "<u4"), ("rec_size", "<u4"), ("format", "<u4"),
                       ("host", "S32")]),
    "init": np.dtype([*_HEAD, ("comm_id", "<u8"), ("rank", "<i4"), ("nranks", "<i4"), ("nnodes", "<i4"),
                      ("pid", "<i4"), ("name", "S24")]),
    "coll": np.dtype([*_HEAD, ("ordinal", "<u8"), ("nccl_seq", "<u8"), ("count", "<u8"), ("root", "<i4"),
                      ("func", "u1"), ("dtype", "u1"), ("algo", "u1"), ("proto", "u1"), ("nch", "u1"),
                      ("nwarps", "u1"), ("pad", "V6"), ("group", "<u8")]),
    "p2p": np.dtype([*_HEAD, ("ordinal", "<u8"), ("group", "<u8"), ("count", "<u8"), ("peer", "<i4"),
                     ("func", "u1"), ("dtype", "u1"), ("nch", "u1"), ("pad", "V17")]),
    "proxy_op": np.dtype([*_HEAD, ("ordinal", "<u8"), ("pid", "<i4"), ("peer", "<i4"), ("nsteps", "<i4"),
                          ("chunk", "<i4"), ("channel", "u1"), ("is_send", "u1"), ("parent_kind", "u1"),
                          ("pad", "V21")]),
    "net_qp": np.dtype([*_HEAD, ("ordinal", "<u8"), ("length", "<u8"), ("qpn", "<i4"), ("device", "<i4"),
                        ("opcode", "<i4"), ("peer", "<i4"), ("channel", "u1"), ("is_send", "u1"),
                        ("has_peer", "u1"), ("pad", "V13")]),
    "fini": np.dtype([*_HEAD, ("comm_id", "<u8"), ("dropped", "<u8"), ("handles_dropped", "<u8"),
                      ("written", "<u8"), ("sink_errors", "<u8"), ("pad", "V8")]),
}
_LAYOUTS["stats"] = _LAYOUTS["fini"]
assert all(dt.itemsize == REC_SIZE for dt in _LAYOUTS.values())
_BAD_NAME = re.compile(r"[^A-Za-z0-9_.:@+-]")


def _code(table: tuple[str, ...], code: int) -> str | None:
    return table[code] if code < len(table) else None


def iter_records(data: bytes | bytearray | memoryview, where: str = "plugin records",
                 state: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """Decode whole 64-byte records into dicts with ``type``, ``host`` and ``pid`` added.

    ``state`` carries the current hello (host, pid) across calls for a stream read in pieces.
    """
    if len(data) % REC_SIZE:
        raise DecodeError(f"{where}: {len(data)} bytes is not a whole number of {REC_SIZE}-byte records")
    state = {} if state is None else state
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, REC_SIZE)
    for i, kind_code in enumerate(raw[:, 0].tolist()):
        kind = KINDS.get(kind_code)
        if kind is None:
            state["unknown"] = state.get("unknown", 0) + 1
            continue
        rec = raw[i].view(_LAYOUTS[kind])[0]
        if kind == "hello":
            if int(rec["magic"]) != MAGIC or int(rec["rec_size"]) != REC_SIZE:
                raise DecodeError(f"{where}: record {i} is not a Pulse plugin hello (bad magic or size)")
            if int(rec["format"]) != FORMAT:
                raise DecodeError(f"{where}: plugin record format {int(rec['format'])} (this Pulse reads {FORMAT})")
            state["host"] = rec["host"].decode("utf-8", "replace") or "unknown"
            state["pid"] = int(rec["pid"])
            continue
        if "host" not in state:
            raise DecodeError(f"{where}: record {i} ({kind}) comes before any hello record")
        out = {name: rec[name].item() for name in rec.dtype.names if name != "pad"}
        out["type"] = kind
        out["host"] = state["host"]
        out["pid"] = state["pid"] if kind != "proxy_op" else out["pid"]
        out["proc"] = state["pid"]
        if kind == "init":
            out["name"] = rec["name"].decode("utf-8", "replace")
        yield out


@dataclass
class _Ctx:
    comm_id: str
    rank: int
    nranks: int
    seq: int = 0
    group: int = 0
    members: list[dict[str, Any]] = field(default_factory=list)


class PluginDecoder:
    """Turns plugin records (bytes, fed in any pieces) into hook events."""

    def __init__(self, job: str = "", node: str | None = None,
                 nic_names: dict[int, str] | None = None, *, max_comms: int = Settings.max_comms_per_job,
                 max_flows: int = Settings.max_flows_per_node) -> None:
        # Bounds: a stream of records (a local user's, with socket access) naming ever new
        # communicators or QPs must not grow this decoder without end.
        self.max_comms = max_comms
        self.max_flows = max_flows
        self.job = job
        self.node = node
        self.nic_names = dict(nic_names or {})
        self.stats: dict[str, int] = {"records": 0, "unknown": 0, "orphans": 0, "unsupported": 0,
                                      "plugin_dropped": 0, "proxy_ops": 0, "qp_events": 0, "rejected_comms": 0,
                                      "rejected_flows": 0}
        self._ctx: dict[tuple[str, int, int], _Ctx] = {}
        self._flows: set[tuple[Any, ...]] = set()
        self._buf = b""
        self._state: dict[str, Any] = {}

    # ---------------------------------------------------------------- input
    def feed(self, data: bytes, where: str = "plugin records") -> list[HookEvent]:
        """Decode a byte stream (a file read in pieces); a partial trailing record is kept."""
        self._buf += bytes(data)
        cut = len(self._buf) - len(self._buf) % REC_SIZE
        chunk, self._buf = self._buf[:cut], self._buf[cut:]
        return self.records(iter_records(chunk, where, self._state))

    def feed_datagram(self, data: bytes, where: str = "plugin datagram") -> list[HookEvent]:
        """Decode one datagram (it starts with its own hello)."""
        return self.records(iter_records(data, where, {}))

    def records(self, recs: Iterable[dict[str, Any]]) -> list[HookEvent]:
        out: list[HookEvent] = []
        for rec in recs:
            self.stats["records"] += 1
            handler = getattr(self, "_on_" + rec["type"], None)
            if handler is not None:
                handler(rec, out)
        self.stats["unknown"] += self._state.pop("unknown", 0)
        return out

    def flush(self) -> list[HookEvent]:
        """Emit the p2p groups still open (call at end of input)."""
        out: list[HookEvent] = []
        for key, ctx in self._ctx.items():
            self._close_group(key, ctx, out)
        return out

    # ---------------------------------------------------------------- records
    def _node(self, rec: dict[str, Any]) -> str:
        return self.node or _BAD_NAME.sub("_", rec["host"])[:128] or "unknown"

    def _on_init(self, rec: dict[str, Any], out: list[HookEvent]) -> None:
        key = (rec["host"], rec["proc"], rec["ctx"])
        nranks, rank = rec["nranks"], rec["rank"]
        if not 0 <= rank < nranks:
            self.stats["unsupported"] += 1
            return
        if key not in self._ctx and len(self._ctx) >= self.max_comms:
            self.stats["rejected_comms"] += 1
            return
        ctx = _Ctx(comm_id=f"{rec['comm_id']:#x}", rank=rank, nranks=nranks)
        self._ctx[key] = ctx
        out.append(CommEvent(job=self.job, node=self._node(rec), comm_id=ctx.comm_id, rank=rank,
                             nranks=nranks, pid=rec["proc"], t_host_ns=rec["t_ns"], source=SOURCE))

    def _lookup(self, rec: dict[str, Any]) -> tuple[tuple[str, int, int], _Ctx] | None:
        key = (rec["host"], rec["proc"], rec["ctx"])
        ctx = self._ctx.get(key)
        if ctx is None:
            self.stats["orphans"] += 1
            return None
        return key, ctx

    def _on_coll(self, rec: dict[str, Any], out: list[HookEvent]) -> None:
        found = self._lookup(rec)
        if found is None:
            return
        key, ctx = found
        self._close_group(key, ctx, out)
        kind, dtype = _code(FUNCS, rec["func"]), _code(DTYPES, rec["dtype"])
        if kind not in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce") or dtype is None:
            self.stats["unsupported"] += 1
            ctx.seq += 1  # still an operator on the wire: keep seq aligned with the other ranks
            return
        count = rec["count"]
        if kind in ("AllGather", "ReduceScatter"):
            count *= ctx.nranks  # NCCL's count is per rank; S is the full array (semantics.md)
        algo = _code(ALGOS, rec["algo"])
        proto = _code(PROTOS, rec["proto"])
        out.append(OpEvent(
            job=self.job, node=self._node(rec), comm_id=ctx.comm_id, rank=ctx.rank, seq=ctx.seq, kind=kind,
            count=count, dtype=dtype, bytes=count * DTYPE_SIZES[dtype],
            algo=algo if algo in ("ring", "tree") else "unknown",
            proto=proto or "unknown", nchannels=rec["nch"] or None, nranks=ctx.nranks,
            root=rec["root"] if kind in ("Broadcast", "Reduce") and 0 <= rec["root"] < ctx.nranks else None,
            t_host_ns=rec["t_ns"], source=SOURCE))
        ctx.seq += 1

    def _on_p2p(self, rec: dict[str, Any], out: list[HookEvent]) -> None:
        found = self._lookup(rec)
        if found is None:
            return
        key, ctx = found
        if ctx.members and (rec["group"] == 0 or rec["group"] != ctx.group):
            self._close_group(key, ctx, out)
        ctx.group = rec["group"]
        ctx.members.append(rec)
        if rec["group"] == 0:
            self._close_group(key, ctx, out)

    def _close_group(self, key: tuple[str, int, int], ctx: _Ctx, out: list[HookEvent]) -> None:
        members, ctx.members = ctx.members, []
        if not members:
            return
        seq = ctx.seq
        ctx.seq += 1
        first = members[0]
        node = self._node(first)
        calls = []
        for m in members:
            func, dtype = _code(FUNCS, m["func"]), _code(DTYPES, m["dtype"])
            if func not in ("Send", "Recv") or dtype is None or not 0 <= m["peer"] < ctx.nranks:
                self.stats["unsupported"] += 1
                return
            calls.append((func, dtype, m["count"], m["peer"], m["nch"]))
        nch = max(c[4] for c in calls) or None
        if len(calls) == 1:
            func, dtype, count, peer, _ = calls[0]
            out.append(OpEvent(job=self.job, node=node, comm_id=ctx.comm_id, rank=ctx.rank, seq=seq, kind=func,
                               count=count, dtype=dtype, bytes=count * DTYPE_SIZES[dtype], nchannels=nch,
                               nranks=ctx.nranks, peer=peer, t_host_ns=first["t_ns"], source=SOURCE))
            return
        peers = sorted({c[3] for c in calls})
        sent = dict.fromkeys(peers, 0)
        recv = dict.fromkeys(peers, 0)
        for func, dtype, count, peer, _ in calls:
            (sent if func == "Send" else recv)[peer] += count * DTYPE_SIZES[dtype]
        dtypes = {c[1] for c in calls if c[0] == "Send"} or {calls[0][1]}
        total = sum(sent.values())
        dtype = dtypes.pop() if len(dtypes) == 1 else "bytes"
        out.append(OpEvent(job=self.job, node=node, comm_id=ctx.comm_id, rank=ctx.rank, seq=seq, kind="GroupP2P",
                           count=total // DTYPE_SIZES[dtype], dtype=dtype, bytes=total, nchannels=nch,
                           nranks=ctx.nranks, group=first["group"], peers=peers,
                           peer_send_bytes=[sent[p] for p in peers], peer_recv_bytes=[recv[p] for p in peers],
                           t_host_ns=first["t_ns"], source=SOURCE))

    def _on_proxy_op(self, rec: dict[str, Any], out: list[HookEvent]) -> None:
        self.stats["proxy_ops"] += 1

    def _on_net_qp(self, rec: dict[str, Any], out: list[HookEvent]) -> None:
        self.stats["qp_events"] += 1
        found = self._lookup(rec)
        if found is None:
            return
        _, ctx = found
        qpn, device = rec["qpn"], rec["device"]
        if not 0 <= qpn < (1 << 24) or device < 0:
            self.stats["unsupported"] += 1
            return
        bound = bool(rec["has_peer"]) and 0 <= rec["peer"] < ctx.nranks
        key = (rec["host"], rec["proc"], device, qpn, rec["peer"] if bound else None, rec["channel"] if bound else None,
               rec["is_send"] if bound else None, ctx.comm_id)
        if key not in self._flows and len(self._flows) >= self.max_flows:
            self.stats["rejected_flows"] += 1
            return
        if key in self._flows:
            return
        self._flows.add(key)
        out.append(FlowEvent(
            job=self.job, node=self._node(rec), nic=self.nic_names.get(device, f"mlx5_{device}"), flow=qpn,
            comm_id=ctx.comm_id, rank=ctx.rank, peer=rec["peer"] if bound else None,
            channel=rec["channel"] if bound else None,
            direction=("send" if rec["is_send"] else "recv") if bound else None,
            qpn=qpn, pid=rec["proc"], source=SOURCE, t_host_ns=rec["t_ns"]))

    def _on_fini(self, rec: dict[str, Any], out: list[HookEvent]) -> None:
        self.stats["plugin_dropped"] = max(self.stats["plugin_dropped"], rec["dropped"])
        found = self._lookup(rec)
        if found is not None:
            self._close_group(*found, out)

    _on_stats = _on_fini


def read_plugin_file(path: str | os.PathLike[str], job: str = "", node: str | None = None,
                     nic_names: dict[int, str] | None = None) -> tuple[list[HookEvent], dict[str, int]]:
    """All hook events of one ``pulse-nccl-<host>-<pid>.rec`` file, and decoding counters."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read plugin records ({exc.strerror})") from None
    if len(data) >= REC_SIZE and data[0] != 1:
        raise DecodeError(f"{p}: does not start with a Pulse plugin hello record")
    dec = PluginDecoder(job=job, node=node, nic_names=nic_names)
    events = dec.feed(data, where=str(p))
    events += dec.flush()
    if dec._buf:
        dec.stats["truncated_bytes"] = len(dec._buf)
    return events, dec.stats


_UCRED = struct.Struct("=iII")  # struct ucred: pid, uid, gid
MAX_DATAGRAM = 1 << 16


class SenderPolicy:
    """Which senders' datagrams the agent keeps: their uid is in ``uids``, or owns a process
    of the job (a pid listed in ``job_cgroup``/cgroup.procs, re-read at most once a second)."""

    def __init__(self, uids: Iterable[int] = (), job_cgroup: str | os.PathLike[str] | None = None) -> None:
        self.uids = frozenset(uids)
        self.job_cgroup = Path(job_cgroup) if job_cgroup is not None else None
        self._job_uids: frozenset[int] = frozenset()
        self._read_at = float("-inf")

    @classmethod
    def from_settings(cls, settings: Settings) -> SenderPolicy:
        uids = settings.hook_allowed_uids
        return cls(uids if uids is not None else (os.geteuid(),), settings.job_cgroup)

    def allows(self, uid: int) -> bool:
        if uid in self.uids:
            return True
        if self.job_cgroup is None:
            return False
        now = time.monotonic()
        if now - self._read_at >= 1.0:
            self._read_at = now
            self._job_uids = frozenset(_owners(self.job_cgroup / "cgroup.procs"))
        return uid in self._job_uids


def _owners(procs: Path) -> Iterator[int]:
    try:
        pids = procs.read_text().split()
    except OSError:
        return
    for pid in pids[:1 << 16]:  # a bound: a job has far fewer processes
        try:
            yield os.stat(f"/proc/{pid}").st_uid
        except (OSError, ValueError):
            continue


def receive_plugin_socket(path: str | os.PathLike[str], *, timeout: float | None = None,
                          max_datagrams: int | None = None, job: str = "", node: str | None = None,
                          nic_names: dict[int, str] | None = None,
                          decoder: PluginDecoder | None = None,
                          senders: SenderPolicy | None = None) -> Iterator[HookEvent]:
    """Bind a Unix datagram socket at ``path`` (the plugin's ``PULSE_HOOK_SOCKET``) now, and
    return an iterator of hook events as datagrams arrive; it stops after ``timeout`` seconds
    without data or after ``max_datagrams``, and then removes the socket file.

    The socket's directory must be private (created 0700 when missing); the socket is 0660.
    Datagrams from senders ``senders`` does not allow (default: the settings'
    ``PULSE_HOOK_ALLOWED_UIDS``, else our own uid, plus the owners of ``PULSE_JOB_CGROUP``'s
    processes) are dropped and counted in ``stats["rejected_senders"]``."""
    p = Path(path)
    check_private_dir(p.parent, "hook socket directory")
    if p.is_symlink() or (p.exists() and not p.is_socket()):
        raise ConfigError(f"{p}: exists and is not a socket")
    p.unlink(missing_ok=True)
    policy = senders if senders is not None else SenderPolicy.from_settings(Settings.from_env())
    dec = decoder or PluginDecoder(job=job, node=node, nic_names=nic_names)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    old = os.umask(0o117)  # born 0660: no window in which anyone else may connect
    try:
        sock.bind(str(p))
    except OSError as exc:
        sock.close()
        raise ConfigError(f"{p}: cannot bind a datagram socket ({exc.strerror})") from None
    finally:
        os.umask(old)
    sock.settimeout(timeout)
    return _receive(sock, p, dec, max_datagrams, policy)


def _sender_uid(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= _UCRED.size:
            return int(_UCRED.unpack_from(data)[1])
    return None


def _receive(sock: socket.socket, p: Path, dec: PluginDecoder, max_datagrams: int | None,
             policy: SenderPolicy) -> Iterator[HookEvent]:
    dec.stats.setdefault("rejected_senders", 0)
    cmsg = socket.CMSG_SPACE(_UCRED.size)
    try:
        n = 0
        while max_datagrams is None or n < max_datagrams:
            try:
                data, anc, flags, _ = sock.recvmsg(MAX_DATAGRAM, cmsg)
            except TimeoutError:
                break
            n += 1
            uid = _sender_uid(anc)
            if uid is None or not policy.allows(uid):
                dec.stats["rejected_senders"] += 1
                continue
            if flags & socket.MSG_TRUNC:
                dec.stats["bad_datagrams"] = dec.stats.get("bad_datagrams", 0) + 1
                continue
            try:
                yield from dec.feed_datagram(data, where=f"{p} datagram {n}")
            except DecodeError:
                dec.stats["bad_datagrams"] = dec.stats.get("bad_datagrams", 0) + 1
        yield from dec.flush()
    finally:
        sock.close()
        p.unlink(missing_ok=True)


def follow_plugin_file(path: str | os.PathLike[str], *, poll: float = 0.2, idle_timeout: float | None = None,
                       decoder: PluginDecoder | None = None) -> Iterator[HookEvent]:
    """Yield events from a growing record file until ``idle_timeout`` seconds pass with no data."""
    dec = decoder or PluginDecoder()
    last = time.monotonic()
    with open(path, "rb") as fh:
        while True:
            data = fh.read(1 << 20)
            if data:
                last = time.monotonic()
                yield from dec.feed(data, where=str(path))
                continue
            if idle_timeout is not None and time.monotonic() - last >= idle_timeout:
                break
            time.sleep(poll)
    yield from dec.flush()
