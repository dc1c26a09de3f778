"""The line forms of ``NCCL_DEBUG=INFO`` output that :mod:`pulse.hooks.nccl_log` reads,
NCCL 2.3 - 2.30 (checked against the format strings of every release tag; real examples in
tests/hooks/fixtures/nccl-logs/)."""

from __future__ import annotations

import re

# ncclDataType_t values as printed by COLL lines ("datatype %d").
NCCL_DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
               "bfloat16", "float8e4m3", "float8e5m2")
_COLL_KINDS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce")

_PREFIX = re.compile(
    r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>-?\d+)\] (?:.*? )??NCCL "
    r"(?P<level>INFO|WARN|TRACE|ABORT)(?: (?P<msg>.*))?$")
_VERSION = re.compile(r"NCCL version (?P<ver>\d+\.\d+\.\d+)(?P<suffix>\S*)")
# The COLL line, identical in every release 2.3-2.30 (count %zi until 2.21, %zu from 2.22).
# Anchored at both ends: a line cut by wrapping, or glued to another process's output,
# never matches (it is counted as ``garbled``).
_COLL = re.compile(
    r"(?P<op>\w+): opCount (?P<opc>[0-9a-fA-F]+) sendbuff (?P<sb>\S+) recvbuff (?P<rb>\S+) count (?P<count>\d+) "
    r"datatype (?P<dt>\d+) op (?P<redop>\d+) root (?P<root>-?\d+) comm (?P<comm>0x[0-9a-fA-F]+|\(nil\)) "
    r"\[nranks=(?P<nranks>\d+)\](?: stream (?:0x[0-9a-fA-F]+|\(nil\)))? *$")
_COLL_START = re.compile(r"\w+: opCount ")
# Init lines of every release: 2.3 "comm %p rank %d nranks %d - COMPLETE"; 2.4 "... cudaDev %d
# nvmlDev %d - Init COMPLETE"; 2.5-2.15 "... cudaDev %d busId %x"; 2.16-2.17 "+ commId";
# 2.18-2.20 "+ nvmlDev"; 2.21+ a function name first and the split forms.
_INIT = re.compile(
    r"(?:(?P<fn>\w+) )?comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)"
    r"(?: cudaDev (?P<cudadev>-?\d+)(?: nvmlDev (?P<nvml>-?\d+))?(?: busId (?P<bus>[0-9a-fA-F]+))?)?"
    r"(?: parent (?P<parent>0x[0-9a-fA-F]+|\(nil\))(?: (?:splitCount|childCount) (?P<splitn>\d+))?"
    r" color (?P<color>-?\d+) key (?P<key>-?\d+))?"
    r"(?: commId 0x(?P<cid>[0-9a-fA-F]+))? - (?:Init )?COMPLETE *$")
# Lines that name a comm's rank without creating it: the 2.20+ topology summary, the 2.3
# allocation line, the 2.28+ revoke line, and the 2.12+ Destroy/Abort lines.
_RANK_INFO = re.compile(
    r"(?:CommRevokeAsync START )?comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) n[Rr]anks (?P<nranks>\d+)"
    r"(?P<rest>(?: nNodes \d+ localRanks? \d+.*| nNodes \d+ localRank \d+ cudaDev -?\d+.*)?) *$")
# "Init START" (2.19+; a function name first from 2.21, "[Rank %d] " first from 2.29): names
# the rank (and, unless a split, the commId) of a comm before its Init COMPLETE line.
_INIT_START = re.compile(
    r"(?:\[Rank \d+\] )?(?:\w+ )?comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) "
    r"cudaDev -?\d+ nvmlDev -?\d+ busId [0-9a-fA-F]+(?: parent \S+(?: (?:splitCount|childCount) \d+)? color -?\d+ "
    r"key -?\d+)?(?: commId 0x(?P<cid>[0-9a-fA-F]+))? ?- Init START *$")
_END = re.compile(
    r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cudadev>-?\d+) "
    r"busId [0-9a-fA-F]+ - (?P<what>Destroy|Abort) COMPLETE *$")
# Ring order (rank 0 only): "Ring %02d : " (2.3), "Channel %02d : " (2.4), "Channel %02d/%02d :" (2.5+).
_RING_ORDER = re.compile(r"(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<nch>\d+))? :(?P<ranks>(?: +\d+)+)(?P<trunc> *\.\.\.)? *$")
_RING_NEIGH = re.compile(r"Ring (?P<ch>\d+) : (?P<prev>-?\d+) -> (?P<rank>\d+) -> (?P<next>-?\d+) *$")
# Trees: " [c] up->rank->d0/d1/d2" (2.4), " [c] d0/d1/d2->rank->up|up->rank->d0/d1/d2" (2.5-2.7,
# the up tree then the down tree), " [c] d0/d1/d2->rank->up" (2.8+).
_TREE_ITEM_24 = r"\[\d+\] -?\d+->-?\d+->-?\d+/-?\d+/-?\d+"
_TREE_ITEM_NEW = r"\[\d+\] -?\d+/-?\d+/-?\d+->-?\d+->-?\d+(?:\|-?\d+->-?\d+->-?\d+/-?\d+/-?\d+)?"
_TREES = re.compile(rf"Trees(?P<body>(?: {_TREE_ITEM_NEW})+|(?: {_TREE_ITEM_24})+) *$")
_TREE_ITEM = re.compile(r"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(-?\d+)->(-?\d+)")
_TREE_ITEM_OLD = re.compile(r"\[(\d+)\] (-?\d+)->(-?\d+)->(-?\d+)/(-?\d+)/(-?\d+)")
_TREE_GRAPH = re.compile(r"Tree \d+ : -?\d+ -> -?\d+ -> -?\d+/-?\d+/-?\d+")
# Connections: "Ring %02d : a -> b via NET" (2.3, receive side, untagged), "Ring %02d : a -> b
# [send] via NET" (2.4), "Ring %02d : a[bus] -> b[bus] ..." (2.5-2.6), "Channel %02d : ..."
# (2.7-2.11), "Channel %02d/%d : ..." (2.12+; the bracket is the busId until 2.17, nvmlDev after).
_CHANNEL = re.compile(
    r"(?P<word>Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)(?:\[(?P<sdev>[0-9a-fA-F]+)\])? -> "
    r"(?P<dst>\d+)(?:\[(?P<ddev>[0-9a-fA-F]+)\])? (?:\[(?P<dir>send|receive)\] )?via (?P<via>\S+)")
_VIA_NET = re.compile(r"NET/(?P<net>[^/]+)/(?P<netdev>\d+)(?:\((?P<proxy>\d+)\))?(?P<flags>\S*)")
# 2.3: one INFO line per device, "NET/IB: [%d] %s:%d/%s " (later releases print it at TRACE).
_NETIB_DEV_23 = re.compile(r"NET/IB: \[(?P<idx>\d+)\] (?P<name>[\w.\-]+):(?P<port>\d+)/(?P<kind>IB|RoCE) *$")
_NETIB_USING = re.compile(r"NET/IB ?: Using")
_NETIB_DEV = re.compile(r"\[(?P<idx>\d+)\](?P<name>[\w.\-]+):(?P<port>\d+)/(?P<kind>IB|RoCE)")
_QPN_FORMS = (
    # 2.29+: "NET/IB: <fn>: QP created: port=%d dev=%d devName=%s ndevs=%d nmdevs=%d qp_num=%u ..."
    re.compile(r"NET/IB: (?P<fn>\w+): QP created: port=(?P<port>\d+) dev=(?P<dev>\d+) devName=(?P<name>\S+) "
               r"ndevs=\d+ nmdevs=\d+ qp_num=(?P<qpn>\d+)"),
    # 2.29: "NET/IB: <fn>: <s> <d> IbDev %d Port %d qp_num %d mtu %d GID ..."
    re.compile(r"NET/IB: (?P<fn>\w+): (?:.*? )?IbDev (?P<dev>\d+) Port (?P<port>\d+) qp_num (?P<qpn>\d+)"
               r"(?P<rest>.*)"),
    # 2.21-2.28: "NET/IB: <s> <d> IbDev %d Port %d qpn %d mtu %d ..." and the 2.27+ ECE line
    re.compile(r"NET/IB: (?:.*? )?IbDev (?P<dev>\d+) Port (?P<port>\d+) qpn (?P<qpn>\d+)(?P<rest>.*)"),
    # 2.18-2.20: "NET/IB: Dev %d Port %d qpn %d mtu %d LID %d" / "... GID %ld (%lX/%lX)"
    re.compile(r"NET/IB: Dev (?P<dev>\d+) Port (?P<port>\d+) qpn (?P<qpn>\d+)(?P<rest>.*)"),
)
_TUNING = re.compile(r"(?:\w+: )?\d+ Bytes -> Algo \S+ proto \S+")
_BAD_NAME = re.compile(r"[^A-Za-z0-9_.:@+-]")
# NCCL_DEBUG_TIMESTAMP_FORMAT's default "[%F %T] " (2.26+, INFO only with
# NCCL_DEBUG_TIMESTAMP_LEVELS=INFO), optionally with sub-second digits; host local time.
_STAMP = re.compile(r"\[(?P<date>\d{4}-\d\d-\d\d)[ T_](?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d{1,9}))?\] ")
