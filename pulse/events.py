"""Hook events (``pulse.hook-events``): what Pulse learns about operators, non-intrusively.

Three record types, each an orjson object with ``type`` and ``v``:

* ``comm`` - a communicator as seen by one rank: membership, and topology where known.
* ``flow`` - binds a (node, nic, flow id) to (comm, rank, peer, channel, direction); flow
  is the local QPN for RDMA or a per-NIC id for a TCP 5-tuple. Captures emit flow events
  with only the addresses filled, hooks with only the comm side: a consumer joins them.
* ``op`` - one operator (collective, P2P call, or grouped P2P set) on one rank: kind,
  size, algorithm, and for grouped P2P the bytes per peer.

Timestamps (``t_host_ns``) are on the clock of the node that recorded them.

Wire versions: ``comm`` and ``op`` events are ``v=1`` unless their rank is unknown or the
comm carries its process-local identity (``ptr``, ``device``); those are ``v=2``. A source
that joins a job mid-run (an NCCL log followed from the middle) knows a communicator only
by its pointer and size: it emits ``v=2`` events without ``rank`` and, once a line names the
rank, a ``comm`` event for the same ``comm_id`` with it. Consumers fill the rank in then
(:mod:`pulse.segmentation.association`); a rank is never guessed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

from pulse._schema import INT64, MAX_MESSAGE_BYTES, NONNEG, UINT32, Field, Record, loads, unpack
from pulse.errors import DecodeError, EncodeError
from pulse.samples import check_name

COLLECTIVES = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce")
P2P = ("Send", "Recv")
GROUPED = "GroupP2P"
OP_KINDS = (*COLLECTIVES, *P2P, GROUPED)
ALGOS = ("ring", "tree", "unknown")
DIRECTIONS = ("send", "recv")
TRANSPORTS = ("roce", "ib", "tcp")


def reporting_ranks(kind: str, nranks: int) -> int:
    """How many of an operator's ranks report a record: only ranks that send data do. A
    Send has one (its Recv none), Broadcast and Reduce one fewer than the ranks (the ring's
    last rank, the root); every rank of the others. A rank whose ring hop stays inside its
    node reports none either; only the communicator's records so far can tell that."""
    if kind == "Send":
        return 1
    if kind in ("Broadcast", "Reduce"):
        return max(1, nranks - 1)
    return nranks


DTYPE_SIZES = {
    "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "float16": 2, "float32": 4, "float64": 8, "bfloat16": 2, "float8e4m3": 1, "float8e5m2": 1,
    "bytes": 1,
}


def _name(what: str, allow_empty: bool = False):  # type: ignore[no-untyped-def]
    def check(v: str) -> str | None:
        try:
            check_name(what, v, allow_empty=allow_empty)
        except Exception as exc:  # EncodeError -> message
            return str(exc)
        return None
    return check


def _ptr(v: str) -> str | None:
    ok = 3 <= len(v) <= 18 and v.startswith("0x") and all(c in "0123456789abcdef" for c in v[2:])
    return None if ok else "must be a lowercase 0x-prefixed hex address of at most 64 bits"


def _comm_id(v: str) -> str | None:
    return None if 0 < len(v) <= 64 and v.isprintable() else "must be 1-64 printable characters"


@dataclasses.dataclass(frozen=True)
class CommEvent(Record):
    TYPE = "comm"
    FIELDS = (
        Field("job", "str", check=_name("job", True)),
        Field("node", "str", check=_name("node")),
        Field("comm_id", "str", check=_comm_id),
        Field("rank", "int", required=False, optional_since=2, bounds=(0, 1 << 24)),
        Field("nranks", "int", bounds=(1, 1 << 24)),
        Field("pid", "int", required=False, bounds=NONNEG),
        Field("rings", "list[list[int]]", required=False),
        Field("trees", "list[list[int]]", required=False),
        Field("t_host_ns", "int", required=False, bounds=INT64),
        Field("source", "str", required=False),
        Field("ptr", "str", required=False, since=2, check=_ptr),
        Field("device", "int", required=False, since=2, bounds=(-1, 1 << 16)),
    )
    VERSION = 2
    job: str
    node: str
    comm_id: str
    rank: int | None
    """None (v2 only): not known yet; a later comm event with the same comm_id names it."""
    nranks: int
    pid: int | None = None
    rings: list[list[int]] | None = None
    """Per channel, the ring order of ranks (NCCL ``Channel xx/yy :`` lines)."""
    trees: list[list[int]] | None = None
    """Per channel, [rank, up, down0, down1, down2] with -1 for none."""
    t_host_ns: int | None = None
    source: str | None = None
    ptr: str | None = None
    """The communicator's address in its process (``comm 0x...`` in NCCL logs)."""
    device: int | None = None
    """The CUDA device of the rank's process (``[d]`` in NCCL log lines)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.rank is not None and self.rank >= self.nranks:
            raise DecodeError(f"comm event: rank {self.rank} >= nranks {self.nranks}")


@dataclasses.dataclass(frozen=True)
class FlowEvent(Record):
    TYPE = "flow"
    FIELDS = (
        Field("job", "str", check=_name("job", True)),
        Field("node", "str", check=_name("node")),
        Field("nic", "str", check=_name("nic")),
        Field("flow", "int", bounds=UINT32),
        Field("comm_id", "str", required=False, check=_comm_id),
        Field("rank", "int", required=False, bounds=(0, 1 << 24)),
        Field("peer", "int", required=False, bounds=(0, 1 << 24)),
        Field("channel", "int", required=False, bounds=(0, 1024)),
        Field("direction", "str", required=False, choices=DIRECTIONS),
        Field("transport", "str", required=False, choices=TRANSPORTS),
        Field("qpn", "int", required=False, bounds=(0, (1 << 24) - 1)),
        Field("remote_qpn", "int", required=False, bounds=(0, (1 << 24) - 1)),
        Field("src", "str", required=False),
        Field("dst", "str", required=False),
        Field("sport", "int", required=False, bounds=(0, 65535)),
        Field("dport", "int", required=False, bounds=(0, 65535)),
        Field("pid", "int", required=False, bounds=NONNEG),
        Field("source", "str", required=False),
        Field("t_host_ns", "int", required=False, bounds=INT64),
    )
    job: str
    node: str
    nic: str
    flow: int
    comm_id: str | None = None
    rank: int | None = None
    peer: int | None = None
    channel: int | None = None
    direction: str | None = None
    """``send``: this rank transmits the operator's data on the flow; ``recv``: it receives."""
    transport: str | None = None
    qpn: int | None = None
    remote_qpn: int | None = None
    src: str | None = None
    dst: str | None = None
    sport: int | None = None
    dport: int | None = None
    pid: int | None = None
    source: str | None = None
    t_host_ns: int | None = None

    @property
    def bound(self) -> bool:
        """True when the flow is tied to a communicator rank and peer."""
        return self.comm_id is not None and self.rank is not None and self.peer is not None


@dataclasses.dataclass(frozen=True)
class OpEvent(Record):
    TYPE = "op"
    FIELDS = (
        Field("job", "str", check=_name("job", True)),
        Field("node", "str", check=_name("node")),
        Field("comm_id", "str", check=_comm_id),
        Field("rank", "int", required=False, optional_since=2, bounds=(0, 1 << 24)),
        Field("seq", "int", bounds=NONNEG),
        Field("kind", "str", choices=OP_KINDS),
        Field("count", "int", bounds=NONNEG),
        Field("dtype", "str", choices=tuple(DTYPE_SIZES)),
        Field("bytes", "int", bounds=NONNEG),
        Field("algo", "str", required=False, choices=ALGOS),
        Field("proto", "str", required=False, choices=("simple", "ll", "ll128", "unknown")),
        Field("nchannels", "int", required=False, bounds=(1, 1024)),
        Field("nranks", "int", required=False, bounds=(1, 1 << 24)),
        Field("root", "int", required=False, bounds=(0, 1 << 24)),
        Field("peer", "int", required=False, bounds=(0, 1 << 24)),
        Field("group", "int", required=False, bounds=NONNEG),
        Field("peers", "list[int]", required=False, bounds=(0, 1 << 24)),
        Field("peer_send_bytes", "list[int]", required=False, bounds=NONNEG),
        Field("peer_recv_bytes", "list[int]", required=False, bounds=NONNEG),
        Field("t_host_ns", "int", required=False, bounds=INT64),
        Field("source", "str", required=False),
    )
    VERSION = 2
    job: str
    node: str
    comm_id: str
    rank: int | None
    """None (v2 only): not known yet; a comm event with the same comm_id names it."""
    seq: int
    """Per (comm, rank) operator sequence number; equal across the ranks of one operator."""
    kind: str
    count: int
    dtype: str
    bytes: int
    """User-level size S = count x dtype size (for GroupP2P: total sent by this rank)."""
    algo: str | None = None
    proto: str | None = None
    nchannels: int | None = None
    nranks: int | None = None
    root: int | None = None
    peer: int | None = None
    """For Send/Recv: the peer rank."""
    group: int | None = None
    peers: list[int] | None = None
    """For GroupP2P: the peer ranks, with bytes sent to / received from each below."""
    peer_send_bytes: list[int] | None = None
    peer_recv_bytes: list[int] | None = None
    t_host_ns: int | None = None
    source: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        n = None if self.peers is None else len(self.peers)
        for name in ("peer_send_bytes", "peer_recv_bytes"):
            v = getattr(self, name)
            if v is not None and (n is None or len(v) != n):
                raise DecodeError(f"op event: {name} has {len(v)} entries, peers has {n}")
        if self.kind in P2P and self.peer is None:
            raise DecodeError(f"op event: {self.kind} needs 'peer'")
        if self.kind == GROUPED and self.peers is None:
            raise DecodeError("op event: GroupP2P needs 'peers'")


HookEvent = Union[CommEvent, FlowEvent, OpEvent]
_BY_TYPE: dict[str, type[CommEvent] | type[FlowEvent] | type[OpEvent]] = {
    "comm": CommEvent, "flow": FlowEvent, "op": OpEvent,
}


def from_dict(data: Any, where: str = "hook event") -> HookEvent:
    if not isinstance(data, dict):
        raise DecodeError(f"{where}: expected a JSON object, got {type(data).__name__}")
    kind = data.get("type")
    cls = _BY_TYPE.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise DecodeError(f"{where}: unknown event type {kind!r} (expected one of comm, flow, op)")
    return cls.from_dict(data, where)


def decode(raw: bytes | bytearray | memoryview | str, where: str = "hook event") -> HookEvent:
    return from_dict(loads(raw, where), where)


def encode(event: HookEvent) -> bytes:
    return event.to_json()


# -- packed form (v1) -----------------------------------------------------------------------
# One hook-events message may carry several events of one node, in order:
#     {"type": "batch", "v": 1, "events": [<event object>, ...]}
# Producers emit it when they coalesce (each Kafka message costs a consumer far more than
# its bytes); consumers must keep accepting the single-event form above.

PACKED_TYPE = "batch"
PACKED_MAX_EVENTS = 1 << 16


def encode_packed(events: list[HookEvent] | tuple[HookEvent, ...]) -> bytes:
    """One message holding ``events`` (all of one node, in order); a single event is
    written in the single form, which every consumer understands."""
    if not events:
        raise EncodeError("packed hook events: nothing to pack")
    if len(events) == 1:
        return events[0].to_json()
    if len(events) > PACKED_MAX_EVENTS:
        raise EncodeError(f"packed hook events: {len(events)} events, at most {PACKED_MAX_EVENTS}")
    node = events[0].node
    for ev in events:
        if ev.node != node:
            raise EncodeError(f"packed hook events: node {ev.node!r} in a pack of node {node!r}")
    return encode_packed_json([ev.to_json() for ev in events])


def encode_packed_json(values: list[bytes]) -> bytes:
    """The packed form from already encoded single events of one node (the caller's
    promise; ``encode_packed`` checks it)."""
    if not values:
        raise EncodeError("packed hook events: nothing to pack")
    if len(values) > PACKED_MAX_EVENTS:
        raise EncodeError(f"packed hook events: {len(values)} events, at most {PACKED_MAX_EVENTS}")
    if len(values) == 1:
        return values[0]
    return b'{"type":"batch","v":1,"events":[' + b",".join(values) + b"]}"


def events_from_dict(data: Any, where: str = "hook events", *, max_events: int = PACKED_MAX_EVENTS) -> list[HookEvent]:
    """The events of a decoded message: one for the single form, the list of a packed one.

    A packed message is all or nothing: one bad event rejects it (naming its index)."""
    if not isinstance(data, dict):
        raise DecodeError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("type") != PACKED_TYPE:
        return [from_dict(data, where)]
    return unpack(data, where, what="hook events", key="events", limit=min(max_events, PACKED_MAX_EVENTS),
                  decode=from_dict, same="node")


def decode_many(raw: bytes | bytearray | memoryview | str, where: str = "hook events", *,
                max_bytes: int = MAX_MESSAGE_BYTES, max_events: int = PACKED_MAX_EVENTS) -> list[HookEvent]:
    """Decode a hook-events message in either form (single event or packed), of at most
    ``max_bytes`` and ``max_events`` events (never more than :data:`PACKED_MAX_EVENTS`)."""
    return events_from_dict(loads(raw, where, max_bytes), where, max_events=max_events)
