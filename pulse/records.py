"""Operator metrics (``pulse.op-metrics``) and verdicts (``pulse.verdicts``), keyed by job."""

from __future__ import annotations

import dataclasses
from typing import Any

from pulse._schema import INT64, NONNEG, Field, Record, loads, unpack
from pulse.errors import DecodeError, EncodeError
from pulse.events import OP_KINDS, _comm_id, _name

STATUSES = ("healthy", "anomaly", "insufficient-data", "cleared")
VERDICT_KINDS = ("network-slow", "network-stop", "compute-slow", "compute-stop", "host-contention", "path")
LEVELS = ("node", "group")
NETWORK_KINDS = ("network-slow", "network-stop", "path")
"""Kind families used in scoring: a network verdict for a compute cause is a misdiagnosis."""


def kind_family(kind: str | None) -> str | None:
    if kind is None:
        return None
    return "network" if kind in NETWORK_KINDS else "compute"


@dataclasses.dataclass(frozen=True)
class OpMetrics(Record):
    TYPE = "op-metrics"
    FIELDS = (
        Field("job", "str", check=_name("job", True)),
        Field("node", "str", check=_name("node")),
        Field("comm_id", "str", check=_comm_id),
        Field("seq", "int", bounds=NONNEG),
        Field("rank", "int", bounds=(0, 1 << 24)),
        Field("kind", "str", choices=OP_KINDS),
        Field("nranks", "int", bounds=(1, 1 << 24)),
        Field("start_ns", "int", bounds=INT64),
        Field("end_ns", "int", bounds=INT64),
        Field("duration_ns", "int", bounds=NONNEG),
        Field("act_ns", "int", bounds=NONNEG),
        Field("volume_bytes", "int", bounds=NONNEG),
        Field("expected_bytes", "int", bounds=NONNEG),
        Field("complete", "bool"),
        Field("active_rate", "float", bounds=(0.0, 1e15)),
        Field("flows", "int", bounds=(0, 1 << 24)),
        Field("epoch_ns", "int", bounds=(1, 1 << 40)),
        Field("nics", "list[str]", required=False),
        Field("group", "int", required=False, bounds=NONNEG),
        Field("t_host_ns", "int", required=False, bounds=INT64),
        Field("granted_ns", "int", required=False, bounds=INT64),
        Field("peer_ranks", "list[int]", required=False),
        Field("peer_done_ns", "list[int]", required=False),
        Field("peer_bytes", "list[int]", required=False),
        Field("peer_expected_bytes", "list[int]", required=False),
        Field("peer_start_ns", "list[int]", required=False, since=2),
        Field("peak_epoch_bytes", "int", required=False, since=3, bounds=NONNEG),
    )
    VERSION = 3
    """v2: ``peer_start_ns``; v3: ``peak_epoch_bytes``. A record is written at the lowest
    version its fields need (without either, v1 byte for byte as before)."""
    job: str
    node: str
    comm_id: str
    seq: int
    rank: int
    kind: str
    nranks: int
    start_ns: int
    """First active epoch of the operator on this rank (node clock)."""
    end_ns: int
    duration_ns: int
    act_ns: int
    """Actual communication time: active epochs x epoch length, gaps excluded."""
    volume_bytes: int
    expected_bytes: int
    complete: bool
    active_rate: float
    """volume / ACT in bytes per second (0 when nothing was sent)."""
    flows: int
    epoch_ns: int
    nics: list[str] | None = None
    group: int | None = None
    t_host_ns: int | None = None
    """When the operator was issued on the host (from its op event), node clock."""
    granted_ns: int | None = None
    """When its receiver's credit grant (a CTS burst) reached this rank's NIC before the
    operator's first data, node clock (wire evidence that the NIC was receiving then;
    absent when not seen: no rx counters, or the grant came while data still flowed)."""
    peer_ranks: list[int] | None = None
    """Grouped P2P (all-to-all), complete records only: the peers this rank sent to, and
    per peer (same order) when its last byte to that peer left, ns after ``start_ns`` (this
    rank's clock alone), and the bytes sent to it. An all-to-all's rank-level figures
    hide a slow NIC (every sender's last flow goes into it, so every rank ends with it);
    which peer each sender finished last is what names it."""
    peer_done_ns: list[int] | None = None
    peer_bytes: list[int] | None = None
    peer_expected_bytes: list[int] | None = None
    """Per peer, the bytes the operator declared for it (the volume condition's share):
    what a peer's link carried beyond it was resent."""
    peer_start_ns: list[int] | None = None
    """Per peer, when its first byte left, ns after ``start_ns`` (the start of that epoch;
    this rank's clock). A flow starts when its receiver has posted the receive, so a flow
    that began after this rank's other flows had ended waited for a late receiver.
    Optional beside the other per-peer figures (producers before it omit it)."""
    peak_epoch_bytes: int | None = None
    """The most bytes the record's send flows moved in one epoch of its span (summed over
    its flows; an epoch shared with a flow's previous or next operator counts whole: what
    crossed the wire then). No epoch of a NIC, a PCIe link or a path capped at some rate
    carries more than that rate allows, while a healthy one bursts to line rate whenever it
    has the bytes: capacity evidence that pacing (late posts, a slow GPU) does not fake.
    None when not measured (producers before v3)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.end_ns < self.start_ns:
            raise DecodeError(f"op-metrics: end_ns {self.end_ns} < start_ns {self.start_ns}")
        per = (self.peer_ranks, self.peer_done_ns, self.peer_bytes, self.peer_expected_bytes)
        if any(x is not None for x in per):
            if any(x is None for x in per) or len({len(x) for x in per}) != 1:  # type: ignore[arg-type]
                raise DecodeError("op-metrics: peer_ranks, peer_done_ns, peer_bytes and peer_expected_bytes go "
                                  "together, of one length")
            if min((*self.peer_done_ns, *self.peer_bytes, *self.peer_ranks,  # type: ignore[misc]
                    *self.peer_expected_bytes), default=0) < 0:  # type: ignore[misc]
                raise DecodeError("op-metrics: negative per-peer figure")
            if max(self.peer_done_ns, default=0) > self.duration_ns:  # type: ignore[arg-type]
                raise DecodeError("op-metrics: a peer's last byte after the record's end")
        if self.peer_start_ns is not None:
            if self.peer_done_ns is None or len(self.peer_start_ns) != len(self.peer_done_ns):
                raise DecodeError("op-metrics: peer_start_ns needs the other per-peer figures, of their length")
            if any(not 0 <= a <= b for a, b in zip(self.peer_start_ns, self.peer_done_ns, strict=True)):
                raise DecodeError("op-metrics: a peer's first byte before the record's start or after its last")


@dataclasses.dataclass(frozen=True)
class Verdict(Record):
    TYPE = "verdict"
    FIELDS = (
        Field("job", "str", check=_name("job", True)),
        Field("status", "str", choices=STATUSES),
        Field("kind", "str", required=False, choices=VERDICT_KINDS),
        Field("level", "str", required=False, choices=LEVELS),
        Field("nodes", "list[str]"),
        Field("ranks", "list[int]"),
        Field("nics", "list[str]"),
        Field("confidence", "float", bounds=(0.0, 1.0)),
        Field("evidence", "json"),
        Field("window", "json"),
        Field("first_seen_ns", "int", bounds=INT64),
        Field("emitted_at", "int", bounds=INT64),
        Field("method", "str", required=False, choices=("pulse", "baseline")),
        Field("id", "str", required=False),
    )
    job: str
    status: str
    kind: str | None
    level: str | None
    nodes: list[str]
    ranks: list[int]
    nics: list[str]
    confidence: float
    evidence: Any
    """The metric values that decided it, and the peers they were compared with."""
    window: Any
    """What the verdict covers: {"comm_id", "first_seq", "last_seq", "ops"}."""
    first_seen_ns: int
    """Trace time (culprit-side clock) of the first operator showing the anomaly."""
    emitted_at: int
    """Wall clock (ns since the Unix epoch) when the verdict was produced."""
    method: str | None = "pulse"
    id: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.status == "anomaly" and (self.kind is None or self.level is None):
            raise DecodeError("verdict: an anomaly needs kind and level")
        if not isinstance(self.evidence, dict) or not isinstance(self.window, dict):
            raise DecodeError("verdict: evidence and window must be JSON objects")


INCIDENT_STATES = ("open", "updated", "resolved")


@dataclasses.dataclass(frozen=True)
class Incident(Record):
    """One fault, from the first verdict that named it to its resolution
    (``pulse.incidents``, compacted, key = id: the latest state of every incident).

    The id is stable: it is derived from (job, kind, level, nodes, first operator) when the
    incident opens and kept through its updates, even when a later verdict refines its
    nodes or level."""

    TYPE = "incident"
    FIELDS = (
        Field("id", "str", check=_name("id")),
        Field("job", "str", check=_name("job", True)),
        Field("state", "str", choices=INCIDENT_STATES),
        Field("kind", "str", choices=VERDICT_KINDS),
        Field("level", "str", choices=LEVELS),
        Field("nodes", "list[str]"),
        Field("ranks", "list[int]"),
        Field("nics", "list[str]"),
        Field("confidence", "float", bounds=(0.0, 1.0)),
        Field("summary", "str"),
        Field("evidence", "json"),
        Field("first_op", "json"),
        Field("ops", "int", bounds=NONNEG),
        Field("updates", "int", bounds=NONNEG),
        Field("first_seen_ns", "int", bounds=INT64),
        Field("last_seen_ns", "int", bounds=INT64),
        Field("resolved_at_ns", "int", required=False, bounds=INT64),
        Field("resolution", "str", required=False, choices=("evidence-stopped", "job-ended")),
        Field("emitted_at", "int", bounds=INT64),
    )
    id: str
    job: str
    state: str
    kind: str
    level: str
    nodes: list[str]
    ranks: list[int]
    nics: list[str]
    confidence: float
    summary: str
    """One sentence for a person: which node and NIC, which metric, how far from its peers."""
    evidence: Any
    """The latest deciding verdict's evidence."""
    first_op: Any
    """{"comm_id", "seq"} of the first operator that showed it."""
    ops: int
    """Operators that showed it (the most any of its verdicts counted)."""
    updates: int
    first_seen_ns: int
    """Trace time (culprit-side clock) of the first operator showing it."""
    last_seen_ns: int
    """Trace time up to which the evidence still showed it."""
    resolved_at_ns: int | None = None
    """Trace time at which it was judged over (resolved only)."""
    resolution: str | None = None
    emitted_at: int = 0
    """Wall clock (ns since the Unix epoch) of this state change."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.state == "resolved") != (self.resolved_at_ns is not None):
            raise DecodeError("incident: resolved_at_ns is set exactly when the state is resolved")
        if not isinstance(self.evidence, dict) or not isinstance(self.first_op, dict):
            raise DecodeError("incident: evidence and first_op must be JSON objects")


def decode_incident(raw: bytes | bytearray | memoryview | str, where: str = "incident") -> Incident:
    return Incident.from_dict(loads(raw, where), where)


def _gap_counts(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, dict) or not all(isinstance(k, str) and type(n) is int and 0 <= n < 1 << 62
                                          for k, n in v.items()):
        return "must be an object of non-negative integer counts"
    return None


def _nic_ends(v: Any) -> str | None:
    if v is None:
        return None
    if not isinstance(v, dict) or len(v) > 4096 or not all(
            isinstance(k, str) and 0 < len(k) <= 64 and type(n) is int and -(1 << 63) <= n < 1 << 63
            for k, n in v.items()):
        return "must be an object of NIC name -> int64 nanoseconds (at most 4096 NICs)"
    return None


@dataclasses.dataclass(frozen=True)
class DataEnd(Record):
    """How far one node's epoch data is known to reach (its node clock), forwarded by the
    segmentation stage to the job's localizer next to the operator metrics: it tells an
    operator that stalled (the node's data went on without it) from one cut off by the end
    of the input, and a receive that waits for ever from one posted a moment ago."""

    TYPE = "data-end"
    VERSION = 4
    FIELDS = (
        Field("job", "str", check=_name("job", True)),
        Field("node", "str", check=_name("node")),
        Field("end_ns", "int", bounds=INT64),
        Field("gaps", "json", required=False, since=2, check=_gap_counts),
        Field("nic_ends", "json", required=False, since=3, check=_nic_ends),
        Field("nic_tx", "json", required=False, since=4, check=_nic_ends),
    )
    job: str
    node: str
    end_ns: int
    gaps: dict[str, int] | None = None
    """What of this node's input the segmentation stage did not use, so far (cumulative):
    ``lost_batches`` (batch_seq gaps), ``late_batches``, ``wild_time_batches`` (t0 outside
    the job's time range), ``clamped_rows`` (bytes beyond a link's capacity in an epoch),
    ``impossible_ops`` (op events with impossible sizes). None or empty: nothing missing."""
    nic_ends: dict[str, int] | None = None
    """How far each of the node's NICs' data reaches (v3). A NIC whose capture stopped
    publishing while the node's other NICs went on has a data end of its own: its operators
    after it are cut off, not stalled (a NIC that is down still publishes empty batches)."""
    nic_tx: dict[str, int] | None = None
    """The end of the last epoch in which each NIC transmitted a byte (any flow: data, a
    receiver's clear-to-send), for the NICs that transmitted since the node's previous data
    end (v4; readers keep the latest). A NIC that transmitted after a peer's grant was due
    was up then: which end of a silent link stopped."""


def decode_data_end(raw: bytes | bytearray | memoryview | str, where: str = "data-end") -> DataEnd:
    return DataEnd.from_dict(loads(raw, where), where)


def decode_op_metrics(raw: bytes | bytearray | memoryview | str, where: str = "op-metrics") -> OpMetrics:
    return OpMetrics.from_dict(loads(raw, where), where)


def decode_verdict(raw: bytes | bytearray | memoryview | str, where: str = "verdict") -> Verdict:
    return Verdict.from_dict(loads(raw, where), where)


@dataclasses.dataclass(frozen=True)
class OpLevel(Record):
    """Per-rank operator start/end as CCL instrumentation records it (``oplevel.jsonl``).

    This is all an operator-level tool sees; the baseline localizer reads only this.
    ``end_ns`` is None for an operator that never finished on that rank.
    """

    TYPE = "oplevel"
    FIELDS = (
        Field("job", "str", check=_name("job", True)),
        Field("node", "str", check=_name("node")),
        Field("comm_id", "str", check=_comm_id),
        Field("rank", "int", bounds=(0, 1 << 24)),
        Field("seq", "int", bounds=NONNEG),
        Field("kind", "str", choices=OP_KINDS),
        Field("nranks", "int", bounds=(1, 1 << 24)),
        Field("start_ns", "int", bounds=INT64),
        Field("end_ns", "int", required=False, bounds=INT64),
    )
    job: str
    node: str
    comm_id: str
    rank: int
    seq: int
    kind: str
    nranks: int
    start_ns: int
    end_ns: int | None = None


def decode_oplevel(raw: bytes | bytearray | memoryview | str, where: str = "oplevel") -> OpLevel:
    return OpLevel.from_dict(loads(raw, where), where)


# -- packed op-metrics (v1) -----------------------------------------------------------------
# One op-metrics message may carry several records of one job, in order:
#     {"type": "op-metrics-batch", "v": 1, "records": [<op-metrics object>, ...]}
# The segment agent emits it (a Kafka message costs a consumer far more than its bytes);
# consumers must keep accepting the single-record form.

PACKED_OP_METRICS_TYPE = "op-metrics-batch"
PACKED_MAX_RECORDS = 1 << 16


def encode_op_metrics_packed(records: list[OpMetrics] | tuple[OpMetrics, ...]) -> bytes:
    """One message holding ``records`` (all of one job, in order); a single record is written
    in the single form."""
    if not records:
        raise EncodeError("packed op-metrics: nothing to pack")
    if len(records) == 1:
        return records[0].to_json()
    return encode_op_metrics_packed_json([r.to_json() for r in records], [r.job for r in records])


def encode_op_metrics_packed_json(values: list[bytes], jobs: list[str] | None = None) -> bytes:
    """The packed form from already encoded single records (``jobs``, when given, checked
    to be one job)."""
    if not values:
        raise EncodeError("packed op-metrics: nothing to pack")
    if len(values) > PACKED_MAX_RECORDS:
        raise EncodeError(f"packed op-metrics: {len(values)} records, at most {PACKED_MAX_RECORDS}")
    if jobs is not None and len(set(jobs)) > 1:
        raise EncodeError(f"packed op-metrics: records of several jobs ({', '.join(sorted(set(jobs)))})")
    if len(values) == 1:
        return values[0]
    return b'{"type":"op-metrics-batch","v":1,"records":[' + b",".join(values) + b"]}"


def op_metrics_from_dict(data: Any, where: str = "op-metrics") -> list[OpMetrics]:
    """The records of a decoded op-metrics message: one for the single form, the list of a
    packed one. A packed message is all or nothing: one bad record rejects it."""
    if not isinstance(data, dict):
        raise DecodeError(f"{where}: expected a JSON object, got {type(data).__name__}")
    if data.get("type") != PACKED_OP_METRICS_TYPE:
        return [OpMetrics.from_dict(data, where)]
    return unpack(data, where, what="op-metrics", key="records", limit=PACKED_MAX_RECORDS,
                  decode=OpMetrics.from_dict, same="job", decode_all=OpMetrics.from_dicts)


def decode_op_metrics_many(raw: bytes | bytearray | memoryview | str, where: str = "op-metrics") -> list[OpMetrics]:
    """Decode an op-metrics record in either form (single or packed)."""
    return op_metrics_from_dict(loads(raw, where), where)
