"""Read ``rdma -j res show qp`` (iproute2) and turn its QPs into flow events.

Each QP object carries ``ifname`` (the RDMA device, e.g. ``mlx5_0``), ``port``, ``lqpn``
(local QPN = Pulse's flow id), ``rqpn`` (the peer's QPN), ``type`` (RC, UD, GSI...),
``state``, ``pid`` and ``comm`` (process name). Only connected (RC/UC/XRC) QPs with a QPN
are flows. :func:`join_flows` then adds what other sources know about the same QPs:

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

import orjson
from pulse.hooks.nccl_log import NetChannel

from pulse.errors import DecodeError, EncodeError
from pulse.events import FlowEvent
from pulse.samples import check_name

SOURCE = "rdma-res"
FLOW_TYPES = ("RC", "UC", "XRC", "XRC_INI", "XRC_TGT", "DRIVER")


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


def _int(obj: Mapping[str, Any], key: str, where: str, required: bool = False) -> int | None:
    v = obj.get(key)
    if v is None:
        if required:
            raise DecodeError(f"{where}: missing {key!r}")
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise DecodeError(f"{where}: {key!r} must be an integer, got {v!r:.40}")
    if v < 0:
        raise DecodeError(f"{where}: {key!r}={v} is negative")
    return v


def parse_rdma_qp(raw: str | bytes, where: str = "rdma res show qp") -> list[RdmaQp]:
    """Validate and decode ``rdma -j res show qp`` output (a JSON list of objects)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"{where}: not valid JSON ({exc})") from None
    if isinstance(data, dict):  # some iproute2 builds wrap the list
        data = data.get("qp", data.get("res", data))
    if not isinstance(data, list):
        raise DecodeError(f"{where}: expected a JSON list of QP objects, got {type(data).__name__}")
    out = []
    for i, obj in enumerate(data):
        here = f"{where}: entry {i}"
        if not isinstance(obj, dict):
            raise DecodeError(f"{here}: expected an object, got {type(obj).__name__}")
        ifname = obj.get("ifname")
        if not isinstance(ifname, str) or not ifname:
            raise DecodeError(f"{here}: missing or empty 'ifname'")
        try:
            check_name("ifname", ifname)
        except EncodeError as exc:
            raise DecodeError(f"{here}: {exc}") from None
        lqpn = _int(obj, "lqpn", here, required=True)
        assert lqpn is not None
        if lqpn >= 1 << 24:
            raise DecodeError(f"{here}: lqpn {lqpn} is not a 24-bit QP number")
        rqpn = _int(obj, "rqpn", here)
        if rqpn is not None and rqpn >= 1 << 24:
            raise DecodeError(f"{here}: rqpn {rqpn} is not a 24-bit QP number")
        qtype = obj.get("type")
        state = obj.get("state")
        comm = obj.get("comm")
        out.append(RdmaQp(ifname=ifname, port=_int(obj, "port", here), lqpn=lqpn, rqpn=rqpn,
                          type=qtype if isinstance(qtype, str) else "?",
                          state=state if isinstance(state, str) else None, pid=_int(obj, "pid", here),
                          comm=comm if isinstance(comm, str) else None))
    return out


def flows_from_rdma(qps: Iterable[RdmaQp], node: str, job: str = "", *, pids: Iterable[int] | None = None,
                    process_names: Iterable[str] | None = None, t_host_ns: int | None = None) -> list[FlowEvent]:
    """One unbound flow event per connected QP (optionally only some processes)."""
    want_pids = set(pids) if pids is not None else None
    want_names = set(process_names) if process_names is not None else None
    out = []
    for q in qps:
        if q.type not in FLOW_TYPES or q.lqpn == 0:
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
