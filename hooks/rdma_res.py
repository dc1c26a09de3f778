"""Read ``rdma res show qp`` (iproute2, every output form) and turn its QPs into flow events;
read ``rdma statistic qp show`` (per-QP counters where the NIC has them).

The forms (plain text, ``-j``, ``-jp``, the broken ``-jp -dd`` JSON of some releases) are
read by :mod:`pulse.hooks.rdma_forms`. Each QP carries ``ifname`` (the RDMA device, e.g. ``mlx5_0``), ``port``, ``lqpn``
(local QPN = Pulse's flow id), ``rqpn`` (the peer's QPN), ``type`` (RC, UD, GSI...),
``state``, ``pid`` and ``comm`` (process name, or ``[module]`` for a kernel owner). Only
connected QPs are flows: RC/UC/XRC/driver types, past INIT, with a peer QPN; the others
are counted. :func:`join_flows` then adds what other sources know about the same QPs:

* hook flow events already bound to (comm, rank, peer, channel, direction) - e.g. from the
  NCCL profiler plugin - matched on (node, nic, qpn);
* the other end of a QP pair (A.lqpn == B.rqpn and A.rqpn == B.lqpn, seen on another node):
  a bound end binds its partner with rank and peer swapped and the direction reversed;
* ``Channel ... via NET/...`` log lines (:class:`pulse.hooks.nccl_log.NetChannel`): bound
  only when the match is unique (one unbound NET connection and one unbound QP of that
  process on that NIC), never by guessing an order;
* captured flow events (addresses) matched on (node, nic, flow): src/dst/ports are copied.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from pulse.hooks import rdma_forms
from pulse.hooks.nccl_log import NetChannel

from pulse.errors import DecodeError, EncodeError
from pulse.events import FlowEvent
from pulse.samples import check_name

SOURCE = "rdma-res"
FLOW_TYPES = ("RC", "UC", "XRC", "XRC_INI", "XRC_TGT", "DRIVER")


UNCONNECTED_STATES = ("RESET", "INIT")
# What iproute2 prints (rdma/res.c qp_types_to_str, res-qp.c qp_states_to_str): any other word
# there means a cut or corrupted record.
QP_TYPES = ("SMI", "GSI", "RC", "UC", "UD", "RAW_IPV6", "RAW_ETHERTYPE", "UNKNOWN", "RAW_PACKET", "XRC_INI",
            "XRC_TGT", "DRIVER")
QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN")


@dataclasses.dataclass(frozen=True)
class RdmaQp:
    ifname: str
    port: int | None
    lqpn: int
    rqpn: int | None
    type: str
    state: str | None
    pid: int | None
    comm: str | None
    """The owning process's name, or the kernel module for a kernel QP (brackets removed)."""
    kernel: bool = False
    """Owned by a kernel module (``comm [ib_core]`` / no pid)."""
    pdn: int | None = None


@dataclasses.dataclass
class RdmaQpRead:
    """Everything read from one ``rdma res show qp`` output."""

    qps: list[RdmaQp]
    form: str
    """``text``, ``json`` or ``json-broken``."""
    malformed: list[str]
    """One line per record that could not be read (naming where); nothing was guessed."""
    notes: list[str]
    """Dropped on purpose (driver attributes) or printed by the tool in error."""


@dataclasses.dataclass(frozen=True)
class RdmaQpCounters:
    """One ``rdma statistic qp show`` counter set: the QPs bound to it and its counters."""

    ifname: str
    port: int | None
    cntn: int
    lqpns: tuple[int, ...]
    pid: int | None
    comm: str | None
    qp_type: str | None
    counters: dict[str, int]


def _qp(fields: dict[str, Any], here: str, text: bool) -> RdmaQp:
    ifname = fields.get("ifname")
    if not isinstance(ifname, str) or not ifname:
        raise DecodeError(f"{here}: missing or empty 'ifname'")
    try:
        check_name("ifname", ifname)
    except EncodeError as exc:
        raise DecodeError(f"{here}: {exc}") from None
    if fields.get("lqpn") is None:
        raise DecodeError(f"{here}: missing 'lqpn'")
    num = {k: rdma_forms.check_int(fields, k, here, text) for k in ("lqpn", "rqpn", "port", "pid", "pdn")}
    for k in ("lqpn", "rqpn"):
        v = num[k]
        if v is not None and v >= 1 << 24:
            raise DecodeError(f"{here}: {k} {v} is not a 24-bit QP number")
    qtype, state, comm = fields.get("type"), fields.get("state"), fields.get("comm")
    if qtype not in QP_TYPES:
        raise DecodeError(f"{here}: type {qtype!r:.20} is not a QP type")
    if (state is not None or text) and state not in QP_STATES:
        raise DecodeError(f"{here}: state {state!r:.20} is not a QP state")
    if text and not isinstance(comm, str):
        # iproute2 ends every QP line with its owner: a line without one was cut short.
        raise DecodeError(f"{here}: no 'comm' (the line is incomplete)")
    kernel = False
    if isinstance(comm, str) and comm.startswith("[") and comm.endswith("]"):
        comm, kernel = comm[1:-1], True
    elif num["pid"] in (None, 0) and isinstance(comm, str) and comm:
        kernel = "pid" not in fields or num["pid"] == 0
    lqpn = num["lqpn"]
    assert lqpn is not None
    return RdmaQp(ifname=ifname, port=num["port"], lqpn=lqpn, rqpn=num["rqpn"],
                  type=qtype, state=state if isinstance(state, str) else None,
                  pid=num["pid"] if not kernel else None, comm=comm if isinstance(comm, str) else None,
                  kernel=kernel, pdn=num["pdn"])


def read_rdma_qp(raw: str | bytes, where: str = "rdma res show qp") -> RdmaQpRead:
    """Read ``rdma res show qp`` output in any form; a record that cannot be read is listed
    in ``malformed`` (and left out), never misread."""
    got = rdma_forms.read(raw, where)
    qps: list[RdmaQp] = []
    bad: list[str] = []
    for e in got.entries:
        if e.fields is None:
            bad.append(e.problem or e.where)
            continue
        try:
            qps.append(_qp(e.fields, e.where, got.form == "text"))
        except DecodeError as exc:
            bad.append(str(exc))
    return RdmaQpRead(qps=qps, form=got.form, malformed=bad, notes=got.notes)


def parse_rdma_qp(raw: str | bytes, where: str = "rdma res show qp") -> list[RdmaQp]:
    """Every QP of ``rdma res show qp`` output (any form); raises :class:`DecodeError` naming
    the first record that cannot be read (use :func:`read_rdma_qp` to keep the others)."""
    got = read_rdma_qp(raw, where)
    if got.malformed:
        raise DecodeError(got.malformed[0])
    return got.qps


def read_rdma_stat_qp(raw: str | bytes, where: str = "rdma statistic qp show",
                      ) -> tuple[list[RdmaQpCounters], list[str]]:
    """Counter sets of ``rdma statistic qp show`` (text or JSON) and the records that could
    not be read. A set bound to one QP gives that QP's counters; one shared by several QPs
    (auto mode groups a process's QPs) only their sum."""
    got = rdma_forms.read(raw, where, text_record="stat")
    out: list[RdmaQpCounters] = []
    bad: list[str] = []
    text = got.form == "text"
    for e in got.entries:
        if e.fields is None:
            bad.append(e.problem or e.where)
            continue
        f = e.fields
        try:
            ifname = f.get("ifname")
            if not isinstance(ifname, str) or not ifname:
                raise DecodeError(f"{e.where}: missing 'ifname'")
            cntn = rdma_forms.check_int(f, "cntn", e.where, text)
            if cntn is None:
                raise DecodeError(f"{e.where}: missing 'cntn'")
            lq = f.get("lqpn", [])
            if not isinstance(lq, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 24
                                                   for x in lq):
                raise DecodeError(f"{e.where}: 'lqpn' must be a list of QP numbers")
            skip = {"ifindex", "ifname", "port", "cntn", "lqpn", "pid", "comm", "qp-type"}
            counters = {k: rdma_forms.check_int(f, k, e.where, text) for k in f if k not in skip}
            comm = f.get("comm")
            out.append(RdmaQpCounters(
                ifname=ifname, port=rdma_forms.check_int(f, "port", e.where, text), cntn=cntn, lqpns=tuple(lq),
                pid=rdma_forms.check_int(f, "pid", e.where, text),
                comm=comm.strip("[]") if isinstance(comm, str) else None,
                qp_type=f["qp-type"] if isinstance(f.get("qp-type"), str) else None,
                counters={k: v for k, v in counters.items() if v is not None}))
        except DecodeError as exc:
            bad.append(str(exc))
    return out, bad


def flows_from_rdma(qps: Iterable[RdmaQp], node: str, job: str = "", *, pids: Iterable[int] | None = None,
                    process_names: Iterable[str] | None = None, t_host_ns: int | None = None,
                    skipped: dict[str, int] | None = None) -> list[FlowEvent]:
    """One unbound flow event per connected QP (optionally only some processes). QPs that
    are not flows are counted in ``skipped`` by reason: ``type`` (UD, GSI, SMI, driver
    QPs...), ``unconnected`` (RESET/INIT, or no peer QPN yet)."""
    want_pids = set(pids) if pids is not None else None
    want_names = set(process_names) if process_names is not None else None
    skipped = skipped if skipped is not None else {}
    out = []
    for q in qps:
        if q.type not in FLOW_TYPES or q.lqpn == 0:
            skipped["type"] = skipped.get("type", 0) + 1
            continue
        if q.state in UNCONNECTED_STATES or not q.rqpn:  # no peer QP: nothing to bind it to
            skipped["unconnected"] = skipped.get("unconnected", 0) + 1
            continue
        if want_pids is not None and q.pid not in want_pids:
            continue
        if want_names is not None and q.comm not in want_names:
            continue
        out.append(FlowEvent(job=job, node=node, nic=q.ifname, flow=q.lqpn, qpn=q.lqpn, remote_qpn=q.rqpn,
                             pid=q.pid, source=SOURCE, t_host_ns=t_host_ns))
    return out


_BINDING = ("comm_id", "rank", "peer", "channel", "direction")
_ADDRESS = ("src", "dst", "sport", "dport")


def _merge(flow: FlowEvent, other: FlowEvent, fields: tuple[str, ...]) -> FlowEvent:
    updates = {f: getattr(other, f) for f in fields if getattr(flow, f) is None and getattr(other, f) is not None}
    return dataclasses.replace(flow, **updates) if updates else flow


def join_flows(flows: Iterable[FlowEvent], bound: Iterable[FlowEvent] = (), channels: Iterable[NetChannel] = (),
               captures: Iterable[FlowEvent] = (), nic_of_netdev: Mapping[tuple[str, int], str] | None = None,
               ) -> list[FlowEvent]:
    """Complete ``flows`` (typically from :func:`flows_from_rdma`, any number of nodes) with
    bindings and addresses from the other sources; returns them in the same order."""
    result = list(flows)
    index = {(f.node, f.nic, f.flow): i for i, f in enumerate(result)}

    for b in bound:  # 1. same QP already bound by another source
        i = index.get((b.node, b.nic, b.flow))
        if i is not None and b.bound:
            result[i] = _merge(result[i], b, _BINDING)

    # 3. NET log lines: unique (node, pid, nic) matches only
    nic_of_netdev = nic_of_netdev or {}
    open_channels: dict[tuple[str, int | None, str], list[NetChannel]] = defaultdict(list)
    for ch in channels:
        if ch.comm_id is not None:
            nic = nic_of_netdev.get((ch.node, ch.netdev), f"mlx5_{ch.netdev}")
            open_channels[(ch.node, ch.pid, nic)].append(ch)
    open_qps: dict[tuple[str, int | None, str], list[int]] = defaultdict(list)
    for i, f in enumerate(result):
        if not f.bound:
            open_qps[(f.node, f.pid, f.nic)].append(i)
    for key, chans in open_channels.items():
        qps = open_qps.get(key, [])
        if len(chans) == 1 and len(qps) == 1:
            ch = chans[0]
            result[qps[0]] = dataclasses.replace(result[qps[0]], comm_id=ch.comm_id, rank=ch.rank, peer=ch.peer,
                                                 channel=ch.channel, direction=ch.direction)

    # 2. the other end of each QP pair, across nodes (repeat once so bindings can chain)
    for _ in range(2):
        by_pair: dict[tuple[int, int], list[int]] = defaultdict(list)
        for i, f in enumerate(result):
            if f.remote_qpn is not None:
                by_pair[(f.flow, f.remote_qpn)].append(i)
        for i, f in enumerate(result):
            if f.bound or f.remote_qpn is None:
                continue
            partners = [j for j in by_pair.get((f.remote_qpn, f.flow), []) if result[j].node != f.node]
            if len(partners) != 1 or not result[partners[0]].bound:
                continue
            p = result[partners[0]]
            result[i] = dataclasses.replace(f, comm_id=p.comm_id, rank=p.peer, peer=p.rank, channel=p.channel,
                                            direction=None if p.direction is None else
                                            ("recv" if p.direction == "send" else "send"))

    for c in captures:  # 4. captured addresses
        i = index.get((c.node, c.nic, c.flow))
        if i is not None:
            result[i] = _merge(result[i], c, (*_ADDRESS, "transport"))
    return result
