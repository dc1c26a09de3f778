"""NCCL_DEBUG=INFO parsing: one fixture per format version in the reference (section 2)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.hooks.nccl_log import NCCL_DTYPES, NcclLogParser, NetChannel, follow_file, parse_file, parse_lines

from pulse.cli import main
from pulse.events import CommEvent, FlowEvent, OpEvent, decode

P = "hostA:615:18953 [2] NCCL INFO "  # hostname:pid:tid [cudaDev] NCCL INFO
INIT_218 = P + "comm 0x78cfda045840 rank 2 nranks 4 cudaDev 2 nvmlDev 2 busId 9b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE"


def ops(events):
    return [e for e in events if isinstance(e, OpEvent)]


def comms(events):
    return [e for e in events if isinstance(e, CommEvent)]


def flows(events):
    return [e for e in events if isinstance(e, FlowEvent)]


# ---------------------------------------------------------------- version + prefix

@pytest.mark.parametrize("line,version", [
    ("ubuntu:1:1 [0] NCCL INFO NCCL version 2.18.3+cuda12.2", "2.18.3"),  # issue #1038 form
    ("n:2:3 [7] NCCL INFO NCCL version 2.30.7+cuda13.0", "2.30.7"),
    ("[2026-11-30 09:00:00] n:2:3 [7] NCCL INFO NCCL version 2.26.2+cuda12.8", "2.26.2"),  # timestamp prefix
    ("[rank3]: n:2:3 [7] NCCL INFO NCCL version 2.21.5+cuda12.4", "2.21.5"),  # launcher prefix
])
def test_version_lines(line: str, version: str) -> None:
    parser = NcclLogParser()
    parser.feed([line])
    assert parser.stats["version"] == 1
    assert next(iter(parser._procs.values())).version == version


# ---------------------------------------------------------------- Init COMPLETE, every form

INIT_FORMS = {
    # v2.18-2.20 (real, issue #1814)
    "2.18": ("hostname-test:984:1257 [4] NCCL INFO comm 0x557fe785f7a0 rank 36 nranks 64 cudaDev 4 nvmlDev 4 "
             "busId 9b000 commId 0x5ae77eb5ea4ec1ee - Init COMPLETE", "0x5ae77eb5ea4ec1ee", 36, 64),
    # v2.21-2.22: ncclCommInitRank prefix
    "2.21": ("h:1:2 [0] NCCL INFO ncclCommInitRank comm 0x55d0a1b2c3d0 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 1b000 "
             "commId 0x1f2e3d4c5b6a7988 - Init COMPLETE", "0x1f2e3d4c5b6a7988", 0, 8),
    # v2.23+: function name first
    "2.23": ("h:1:2 [1] NCCL INFO ncclCommInitRankConfig comm 0x55d0a1b2c3d0 rank 1 nranks 2 cudaDev 1 nvmlDev 1 "
             "busId 2c000 commId 0xabc - Init COMPLETE", "0xabc", 1, 2),
    "2.30": ("h:1:2 [1] NCCL INFO ncclCommInitRankScalable comm 0x7f00aa000000 rank 3 nranks 16 cudaDev 3 nvmlDev 3 "
             "busId 3d000 commId 0x0123456789abcdef - Init COMPLETE", "0x123456789abcdef", 3, 16),
}


@pytest.mark.parametrize("form", sorted(INIT_FORMS))
def test_init_complete_forms(form: str) -> None:
    line, comm_id, rank, nranks = INIT_FORMS[form]
    events, parser = parse_lines([line])
    (c,) = comms(events)
    assert (c.comm_id, c.rank, c.nranks, c.pid, c.source) == (comm_id, rank, nranks, int(line.split(":")[1]), "nccl-log")
    assert parser.stats.get("unknown", 0) == 0


def test_split_forms_get_ids_equal_on_every_rank() -> None:
    parent = "h:{pid}:1 [0] NCCL INFO ncclCommInitRank comm 0xaaa{pid} rank {r} nranks 4 cudaDev 0 nvmlDev 0 busId 1b000 commId 0x77 - Init COMPLETE"
    forms = [
        # v2.21-2.22: split prints parent, color, key and commId
        ("ncclCommSplit comm 0xbbb rank {r2} nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 parent 0xaaa{pid} color 1 key 0 "
         "commId 0x99 - Init COMPLETE", "0x99"),
        # v2.23-2.24: no commId
        ("ncclCommSplit comm 0xbbb rank {r2} nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 parent 0xaaa{pid} color 1 key 0 "
         "- Init COMPLETE", "0x77.s0.c1"),
        # v2.25-2.28: splitCount
        ("ncclCommSplit comm 0xbbb rank {r2} nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 parent 0xaaa{pid} splitCount 3 "
         "color 1 key 0 - Init COMPLETE", "0x77.s3.c1"),
        # HEAD: childCount
        ("ncclCommSplit comm 0xbbb rank {r2} nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 parent 0xaaa{pid} childCount 2 "
         "color 1 key 0 - Init COMPLETE", "0x77.s2.c1"),
    ]
    for split, want in forms:
        ids = set()
        for pid, r in ((11, 0), (12, 2)):
            events, _ = parse_lines([parent.format(pid=pid, r=r),
                                     f"h:{pid}:1 [0] NCCL INFO " + split.format(pid=pid, r2=r // 2)])
            ids.add(comms(events)[1].comm_id)
        assert ids == {want}


def test_pre_218_init_has_a_local_id() -> None:
    events, _ = parse_lines(["h:9:9 [7] NCCL INFO comm 0x7fdf08000d00 rank 15 nranks 16 cudaDev 7 busId e7000 - Init COMPLETE"])
    (c,) = comms(events)
    assert c.comm_id == "local:h:9:0x7fdf08000d00" and c.rank == 15


# ---------------------------------------------------------------- COLL lines

REAL_COLL = [
    # NVIDIA/nccl #1193
    ("...:615:18953 [2] NCCL INFO AllReduce: opCount 139d sendbuff 0x78d056200000 recvbuff 0x78d056200000 count 7382228 "
     "datatype 7 op 0 root 0 comm 0x78cfda045840 [nranks=128] stream 0x78d07125e5e0", "AllReduce", 7382228, "float32"),
    # pytorch/torchtitan #1369
    ("hopper01:191370:191425 [1] NCCL INFO AllGather: opCount d sendbuff 0x7fa921200000 recvbuff 0x7fa915800000 "
     "count 2097152 datatype 7 op 0 root 0 comm 0x55fca23fc0f0 [nranks=2] stream 0x55fca193e8e0", "AllGather", 2097152, "float32"),
    ("hopper01:191370:191425 [1] NCCL INFO ReduceScatter: opCount e sendbuff 0x7fa921200000 recvbuff 0x7fa915800000 "
     "count 1048576 datatype 9 op 0 root 0 comm 0x55fca23fc0f0 [nranks=2] stream 0x55fca193e8e0", "ReduceScatter", 1048576, "bfloat16"),
    # NVIDIA/nccl #584 (root = peer for Send/Recv)
    ("ubuntu:199574:201142 [1] NCCL INFO Send: opCount 12 sendbuff 0x7f505e93c000 recvbuff (nil) count 2420736 "
     "datatype 7 op 0 root 1 comm 0x7f5128002e10 [nranks=2] stream 0x55f1de727ae0", "Send", 2420736, "float32"),
]


@pytest.mark.parametrize("line,kind,count,dtype", REAL_COLL)
def test_real_coll_lines(line: str, kind: str, count: int, dtype: str) -> None:
    host, pid = line.split(":")[0], line.split(":")[1]
    comm = line.split(" comm ")[1].split()[0]
    nranks = int(line.split("[nranks=")[1].split("]")[0])
    rank = 0 if kind == "Send" else 1
    init = f"{host}:{pid}:1 [0] NCCL INFO comm {comm} rank {rank} nranks {nranks} cudaDev 0 nvmlDev 0 busId 1 commId 0xfeed - Init COMPLETE"
    events, _parser = parse_lines([init, line])
    (op,) = ops(events)
    scale = nranks if kind in ("AllGather", "ReduceScatter") else 1
    size = {"float32": 4, "bfloat16": 2}[dtype]
    assert (op.kind, op.count, op.dtype, op.bytes) == (kind, count * scale, dtype, count * scale * size)
    assert (op.comm_id, op.rank, op.seq, op.nranks) == ("0xfeed", rank, 0, nranks)
    if kind == "Send":
        assert op.peer == 1


def coll(op: str, opc: int, count: int, dt: int, root: int = 0, comm: str = "0x78cfda045840", nranks: int = 4) -> str:
    return (P + f"{op}: opCount {opc:x} sendbuff 0x1 recvbuff (nil) count {count} datatype {dt} op 0 root {root} "
            f"comm {comm} [nranks={nranks}] stream 0x2")


def test_coll_sequence_groups_and_midrun_comm_before_init() -> None:
    lines = [
        coll("AllReduce", 5, 10, 7),  # before Init: a comm known by pointer only (mid-run)
        INIT_218,
        coll("AllReduce", 6, 100, 7),
        coll("Send", 7, 10, 2, root=1), coll("Recv", 7, 20, 2, root=3), coll("Send", 7, 5, 2, root=3),  # one group
        coll("Send", 8, 4, 4, root=0),  # a lone send
        coll("Broadcast", 9, 8, 1, root=3),
        coll("AlltoAll", 10, 8, 1),  # not a Pulse kind: takes a seq, counted
        coll("Reduce", 11, 8, 99),  # unknown datatype
        coll("Reduce", 12, 8, 11, root=1),
    ]
    events, parser = parse_lines(lines)
    early, *later = ops(events)
    # The Init line re-created the comm at that address: the early op stays with the first one.
    assert (early.kind, early.rank, early.nranks, early.comm_id) == ("AllReduce", None, 4, "local:hostA:615:0x78cfda045840")
    got = [(o.seq, o.kind, o.bytes) for o in later]
    assert got == [(0, "AllReduce", 400), (1, "GroupP2P", 60), (2, "Send", 32), (3, "Broadcast", 8),
                   (6, "Reduce", 8)]
    assert {o.comm_id for o in later} == {"0x5ae77eb5ea4ec1ee"}
    g = later[1]
    assert (g.peers, g.peer_send_bytes, g.peer_recv_bytes, g.group) == ([1, 3], [40, 20], [0, 80], 7)
    assert later[3].root == 3 and later[4].dtype == "float8e5m2"
    assert parser.stats["midrun_comms"] == 1 and parser.stats["unsupported"] == 2


# ---------------------------------------------------------------- GRAPH: rings and trees

def test_rings_trees_attach_to_the_comm() -> None:
    lines = [
        P + "Channel 00/02 :    0   1   2   3",  # v2.18-2.22 " %3d" (issue #1027 style)
        P + "Channel 01/02 : 0 3 2 1",  # v2.23+ width = digits of nranks-1
        P + "Channel 02/04 :    0   8  15  14  13 ...",  # truncated (issue #1538): not a full ring
        P + "Ring 02 : 2 -> 0 -> 1",
        P + "Trees [0] 1/-1/-1->2->0 [1] 0/3/-1->2->-1",
        P + "Tree 0 : 0 -> 2 -> 1/-1/-1",
        INIT_218,
    ]
    events, parser = parse_lines(lines)
    (c,) = comms(events)
    assert c.rings == [[0, 1, 2, 3], [0, 3, 2, 1]]
    assert c.trees == [[2, 0, 1, -1, -1], [2, -1, 0, 3, -1]]
    assert parser.stats["neighbours"] == 2 and parser.stats.get("unknown", 0) == 0


# ---------------------------------------------------------------- NET connections

CHANNEL_FORMS = [
    # v2.18-2.25 (real: nccl-tests #252, nccl #1814)
    ("kolyoz2:25146:25827 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [receive] via NET/IBext_v8/0/GDRDMA",
     (4, 3, 0, "recv", "IBext_v8", 0, None)),
    ("hostname-test:984:1257 [4] NCCL INFO Channel 06/0 : 36[4] -> 20[4] [send] via NET/IBext_v8/3",
     (36, 20, 6, "send", "IBext_v8", 3, None)),
    # PXN: netDev(proxyRank), shared
    ("h:1:2 [0] NCCL INFO Channel 01/0 : 2[2] -> 9[1] [send] via NET/IB/1(3)/GDRDMA/Shared",
     (2, 9, 1, "send", "IB", 1, 3)),
    # v2.26+: (PCI) GDR mode
    ("h:1:2 [0] NCCL INFO Channel 03/1 : 5[5] -> 2[2] [receive] via NET/IB/2/GDRDMA(PCI)",
     (2, 5, 3, "recv", "IB", 2, None)),
    # <= v2.11 style with bus ids (real: nccl #707)
    ("h:1:2 [0] NCCL INFO Channel 01 : 2[c7000] -> 0[87000] [receive] via NET/IB/5/GDRDMA",
     (0, 2, 1, "recv", "IB", 5, None)),
]


@pytest.mark.parametrize("line,want", CHANNEL_FORMS)
def test_net_channel_forms(line: str, want: tuple) -> None:
    rank, peer, ch, direction, net, netdev, proxy = want
    host, pid = line.split(":")[0], int(line.split(":")[1])
    # a comm in which this process has `rank`; runtime connect logs the channel after Init
    init = f"{host}:{pid}:1 [0] NCCL INFO comm 0xc rank {rank} nranks 64 cudaDev 0 nvmlDev 0 busId 1 commId 0x5 - Init COMPLETE"
    _, parser = parse_lines([init, line])
    assert parser.channels == [NetChannel(node=host, pid=pid, comm_id="0x5", rank=rank, peer=peer, channel=ch,
                                          direction=direction, net=net, netdev=netdev, proxy_rank=proxy)]


def test_channels_before_init_bind_when_it_completes_and_local_ones_are_skipped() -> None:
    lines = [
        P + "Channel 00/0 : 1[1] -> 2[2] [receive] via NET/IB/0/GDRDMA",
        P + "Channel 00/0 : 2[2] -> 3[3] via P2P/IPC",
        P + "Channel 00/0 : 2[2] -> 3[3] via P2P/direct pointer",
        P + "Channel 00 : 2[2] -> 3[3] via SHM/direct/direct",
        INIT_218,
    ]
    _, parser = parse_lines(lines)
    assert [(c.comm_id, c.rank, c.peer) for c in parser.channels] == [("0x5ae77eb5ea4ec1ee", 2, 1)]
    assert parser.stats["channel_local"] == 3


# ---------------------------------------------------------------- NET/IB QPN lines, every version form

QPN_FORMS = {
    "2.18-lid": ("NET/IB: Dev 0 Port 1 qpn 1234 mtu 5 LID 7", 0, 1234, "ib"),
    "2.18-gid": ("NET/IB: Dev 1 Port 1 qpn 4660 mtu 5 GID 3 (80FE/AB12CD0000000000)", 1, 4660, "roce"),
    "2.21-roce": ("NET/IB: NCCL Dev 0 IbDev 1 Port 1 qpn 563 mtu 5 query_ece={supported=1, vendor_id=0x15b3, "
                  "options=0x30000002, comp_mask=0x0} GID 3 (0/D5800B1DFFFF0000) fifoRkey=0x1f00 fifoLkey=0x1f00",
                  1, 563, "roce"),
    "2.23-ib": ("NET/IB: NCCL Dev 2 IbDev 2 Port 1 qpn 777 mtu 5 query_ece={supported=0, vendor_id=0x0, options=0x0, "
                "comp_mask=0x0} LID 12 subnet-prefix 18338657682652659712  FLID 0 fifoRkey=0x1 fifoLkey=0x2", 2, 777, "ib"),
    "2.27": ("NET/IB: NCCL Dev 0 IbDev 0 Port 1 qpn 900 mtu 5 GID 3 (0/D5800B1DFFFF0000) fifoRkey=0x1 fifoLkey=0x2",
             0, 900, "roce"),
    "2.27-ece": ("NET/IB: IbDev 0 Port 1 qpn 901 query_ece={supported=1, vendor_id=0x15b3, options=0x30000002, "
                 "comp_mask=0x0}", 0, 901, None),
    "2.29-created": ("NET/IB: ncclIbCreateQp: QP created: port=1 dev=3 devName=mlx5_3 ndevs=1 nmdevs=1 qp_num=1001 "
                     "pkey=0 pd=0x55d0a1b2c3d0", 3, 1001, None),
    "2.29-info": ("NET/IB: ncclIbConnect: NCCL Dev 0 IbDev 0 Port 1 qp_num 1002 mtu 5 GID 3 (0/D58) ctsFifoRkey=0x1 "
                  "ctsFifoLkey=0x2", 0, 1002, "roce"),
    "2.30-created": ("NET/IB: ncclIbCreateQp: QP created: port=1 dev=0 devName=mlx5_0 ndevs=2 nmdevs=1 qp_num=1003 "
                     "pkey=0 pd=0x1 oooRq=0", 0, 1003, None),
}


@pytest.mark.parametrize("form", sorted(QPN_FORMS))
def test_qpn_forms(form: str) -> None:
    msg, dev, qpn, transport = QPN_FORMS[form]
    events, parser = parse_lines([P + msg])
    (f,) = flows(events)
    assert (f.nic, f.flow, f.qpn, f.transport, f.pid, f.node) == (f"mlx5_{dev}", qpn, qpn, transport, 615, "hostA")
    assert not f.bound and parser.stats["qpn"] == 1


def test_device_list_names_the_nics_and_duplicates_collapse() -> None:
    lines = [P + "NET/IB : Using [0]mlx5_4:1/RoCE [1]mlx5_5:1/IB [RO]; OOB enp179s0f0:198.18.2.2<0>",
             P + QPN_FORMS["2.27"][0], P + QPN_FORMS["2.27-ece"][0].replace("901", "900"),
             P + "NET/IB: NCCL Dev 1 IbDev 1 Port 1 qpn 5 mtu 5 LID 1"]
    events, _ = parse_lines(lines)
    assert [(f.nic, f.flow, f.transport) for f in flows(events)] == [("mlx5_4", 900, "roce"), ("mlx5_5", 5, "ib")]


# ---------------------------------------------------------------- robustness

def test_other_lines_are_counted_not_fatal() -> None:
    lines = [
        "random text", "", "\x00\xff binary", "h:1:2 [0] NCCL INFO", P + "Something NCCL 2.31 might print",
        "h:1:2 [0] misc/socket.cc:50 NCCL WARN Net : Connection closed",
        P + "AllReduce: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}",
        P + "comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0",
        P + "comm 0x1 rank 9 nranks 4 cudaDev 0 nvmlDev 0 busId 1 commId 0x2 - Init COMPLETE",  # rank >= nranks
    ]
    events, parser = parse_lines(lines)
    assert events == []
    assert parser.stats["foreign"] == 3 and parser.stats["unknown"] == 1 and parser.stats["other_level"] == 2
    assert parser.stats["info"] == 1 and parser.stats["rank_info"] == 1 and parser.stats["errors"] == 1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=20))
def test_arbitrary_text_never_raises(lines) -> None:
    events, _parser = parse_lines([P + s for s in lines] + lines)
    for e in events:
        assert decode(e.to_json()) == e


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"]),
                          st.integers(0, 1 << 40), st.integers(0, len(NCCL_DTYPES) - 1)), max_size=30),
       st.integers(1, 512))
def test_coll_lines_property(calls, nranks) -> None:
    init = P + f"comm 0xabc rank 0 nranks {nranks} cudaDev 0 nvmlDev 0 busId 1 commId 0x9 - Init COMPLETE"
    events, _ = parse_lines([init] + [coll(k, i, c, d, comm="0xabc", nranks=nranks) for i, (k, c, d) in enumerate(calls)])
    got = ops(events)
    assert [o.seq for o in got] == list(range(len(calls)))
    sizes = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "float16": 2, "float32": 4,
             "float64": 8, "bfloat16": 2, "float8e4m3": 1, "float8e5m2": 1}
    for o, (k, c, d) in zip(got, calls, strict=True):
        n = c * (nranks if k in ("AllGather", "ReduceScatter") else 1)
        assert (o.kind, o.count, o.dtype, o.bytes) == (k, n, NCCL_DTYPES[d], n * sizes[NCCL_DTYPES[d]])


# ---------------------------------------------------------------- follow mode + CLI

def test_follow_reads_appended_partial_and_rotated_lines(tmp_path: Path) -> None:
    log = tmp_path / "nccl.log"
    log.write_text(INIT_218 + "\n" + coll("AllReduce", 1, 4, 7)[:40])
    gen = follow_file(log, idle_timeout=0.5, poll=0.01)
    first = next(gen)
    assert isinstance(first, CommEvent)
    with open(log, "a") as fh:  # the rest of the half-written line
        fh.write(coll("AllReduce", 1, 4, 7)[40:] + "\n")
    second = next(gen)
    assert isinstance(second, OpEvent) and second.bytes == 16
    os.replace(_write(tmp_path / "new.log", INIT_218.replace("commId 0x5ae77eb5ea4ec1ee", "commId 0x1") + "\n"), log)
    third = next(gen)
    assert isinstance(third, CommEvent) and third.comm_id == "0x1"
    assert list(gen) == []  # stops after the idle timeout


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_cli_parse_log(tmp_path: Path) -> None:
    log = _write(tmp_path / "n.log", "\n".join([INIT_218, coll("AllReduce", 1, 4, 7), "junk"]) + "\n")
    res = CliRunner().invoke(main, ["hooks", "parse-log", str(log), "--json", "--job", "j1"])
    assert res.exit_code == 0, res.output
    lines = [decode(x) for x in res.stdout.splitlines()]
    assert [e.TYPE for e in lines] == ["comm", "op"] and lines[1].job == "j1"
    res = CliRunner().invoke(main, ["hooks", "parse-log", str(log), "--follow", "--idle-exit", "0.2", "--json"])
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2
    res = CliRunner().invoke(main, ["hooks", "parse-log", str(tmp_path / "missing.log")])
    assert res.exit_code == 1 and "error:" in res.output


def test_parse_file_missing(tmp_path: Path) -> None:
    from pulse.errors import ConfigError

    with pytest.raises(ConfigError, match="cannot read"):
        parse_file(tmp_path / "nope.log")


def test_timestamp_prefix_sets_host_time() -> None:
    import time

    stamped = "[2026-11-30 09:00:01.25] " + INIT_218
    events, _ = parse_lines([stamped, INIT_218.replace("0x78cfda045840", "0x1")])
    want = int(time.mktime(time.strptime("2026-11-30 09:00:01", "%Y-%m-%d %H:%M:%S"))) * 10**9 + 250_000_000
    assert [e.t_host_ns for e in events] == [want, None]
