"""NCCL logs joined mid-run, on real excerpts (tests/hooks/fixtures/nccl-logs/, each citing its
thread): every readable COLL record becomes an op event with the right kind, count and nranks;
ranks are learned from lines that name them, never guessed; cut and interleaved lines are
counted, never misread."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.hooks.nccl_forms import _COLL, _PREFIX
from pulse.hooks.nccl_log import parse_file, parse_lines

from pulse.events import CommEvent, OpEvent, decode

FIX = Path(__file__).resolve().parent / "fixtures" / "nccl-logs"


def ops(events):
    return [e for e in events if isinstance(e, OpEvent)]


def comms(events):
    return [e for e in events if isinstance(e, CommEvent)]


# Hand-read from each fixture: (pid, kind, elements as printed, NCCL datatype, nranks) of every
# COLL line that is whole and carries one prefix, in log order (a p2p op closes when its
# group does: at the next opCount of its comm or at the end of the log).
EXPECTED = {
    "issue203-tensorflow-allreduce.log": [
        (13135, "AllReduce", 64, 7, 2), (13135, "AllReduce", 64, 7, 2),
        (13135, "AllReduce", 237184, 7, 2), (13135, "AllReduce", 237184, 7, 2),
        (13135, "AllReduce", 386560, 7, 2), (13135, "AllReduce", 386560, 7, 2),
        (13135, "AllReduce", 8192, 7, 2),
    ],
    "issue147-interleaved-broadcast.log": [  # the two-prefix line and the prefix-less one: garbled
        (32625, "Broadcast", 53, 4, 8), (32615, "Broadcast", 25503912, 6, 8),
        (32617, "Broadcast", 53, 4, 8), (32617, "Broadcast", 25503912, 6, 8),
    ],
    "issue1193-ray-allreduce-128.log": [
        (615, "AllReduce", 7382228, 7, 128), (22754, "AllReduce", 7382228, 7, 128),
        (619, "AllReduce", 7066572, 7, 128), (22754, "AllReduce", 7066572, 7, 128),
    ],
    "issue584-send-recv.log": [  # each Send is its own opCount: one op each
        (199574, "Send", 2420736, 7, 2), (199574, "Send", 2420736, 7, 2), (199574, "Send", 2420736, 7, 2),
        (199574, "Send", 2420736, 7, 2), (199574, "Send", 2420736, 7, 2),
        (199574, "Recv", 2420736, 7, 2), (199574, "Send", 2420736, 7, 2),
    ],
    "torchtitan1369-tp-allgather.log": [  # AllGather/ReduceScatter: count x nranks (the full array)
        (191370, "AllGather", 2097152 * 2, 7, 2), (191369, "ReduceScatter", 2097152 * 2, 7, 2),
        (191369, "AllGather", 2097152 * 2, 7, 2), (191370, "ReduceScatter", 2097152 * 2, 7, 2),
        (191370, "AllGather", 2097152 * 2, 7, 2), (191369, "AllReduce", 1, 7, 2), (191369, "AllReduce", 1, 7, 2),
    ],
    "issue1238-nranks1-trailing-space.log": [(30125, "AllReduce", 33554432, 7, 1)] * 4,
}
GARBLED = {"issue147-interleaved-broadcast.log": 2}
DTYPE = {4: ("int64", 8), 6: ("float16", 2), 7: ("float32", 4)}


def test_fixtures_cite_their_source() -> None:
    for path in FIX.glob("*.log"):
        head = path.read_text().splitlines()[0]
        assert head.startswith("# Source: https://github.com/"), path.name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_coll_record_of_a_midrun_log_is_an_op(name: str) -> None:
    events, parser = parse_file(FIX / name)
    got = ops(events)
    assert sorted((o.comm_id, o.seq) for o in got) == sorted({(o.comm_id, o.seq) for o in got})  # no duplicates
    pid_of = {c.comm_id: c.pid for c in comms(events)}
    have = sorted((pid_of[o.comm_id], o.kind, o.count, o.dtype, o.bytes, o.nranks) for o in got)
    want = sorted((pid, kind, count, DTYPE[dt][0], count * DTYPE[dt][1], n) for pid, kind, count, dt, n in EXPECTED[name])
    assert have == want
    # nothing named a rank: unknown, not guessed; one pointer-only comm per (process, pointer)
    assert all(o.rank is None for o in got)
    assert all(c.rank is None and c.ptr and c.ptr.startswith("0x") for c in comms(events))
    assert parser.stats.get("garbled", 0) == GARBLED.get(name, 0)
    assert parser.stats["coll"] == len(EXPECTED[name]) + sum(1 for o in got if o.kind == "GroupP2P")
    for e in events:  # v2 records survive the wire
        assert decode(e.to_json()) == e
        assert e.to_dict()["v"] == 2


def test_midrun_comm_identity_and_seq_per_comm() -> None:
    events, _ = parse_file(FIX / "issue203-tensorflow-allreduce.log")
    cs = comms(events)
    assert [(c.ptr, c.device, c.nranks, c.pid, c.node) for c in cs] == [
        ("0x7f0c741162f0", 0, 2, 13135, "gpu1"), ("0x7f0c7410f0e0", 1, 2, 13135, "gpu1")]
    assert [c.comm_id for c in cs] == ["local:gpu1:13135:0x7f0c741162f0", "local:gpu1:13135:0x7f0c7410f0e0"]
    by_comm = {c.comm_id: [o.seq for o in ops(events) if o.comm_id == c.comm_id] for c in cs}
    assert list(by_comm.values()) == [[0, 1, 2], [0, 1, 2, 3]]


def test_long_host_names_keep_the_pointer_in_the_id() -> None:
    events, _ = parse_file(FIX / "issue1193-ray-allreduce-128.log")
    for c in comms(events):
        assert len(c.comm_id) <= 64 and c.comm_id.startswith("local:") and c.comm_id.endswith(c.ptr)
    assert len({c.comm_id for c in comms(events)}) == 3


# ---------------------------------------------------------------- ranks learned later / earlier

# Synthetic COLL lines in the 2.3-2.30 format (same pid/pointer as the real lines they join).
def coll(prefix: str, ptr: str, opc: int, nranks: int, op: str = "AllReduce", count: int = 8) -> str:
    return (f"{prefix}{op}: opCount {opc:x} sendbuff 0x1 recvbuff 0x2 count {count} datatype 7 op 0 root 0 "
            f"comm {ptr} [nranks={nranks}] stream 0x3")


def test_rank_learned_from_a_later_destroy_line() -> None:
    real = (FIX / "issue1706-destroy.log").read_text().splitlines()
    destroy = [x for x in real if "Destroy COMPLETE" in x]
    pre = "deepseek:2081594:2081611 [1] NCCL INFO "
    lines = [coll(pre, "0x55f68495f4f0", 5, 2), coll(pre, "0x55f68495f4f0", 6, 2), *destroy,
             coll(pre, "0x55f68495f4f0", 0, 2)]  # a new comm at the freed address
    events, parser = parse_lines(lines)
    first, again, second = comms(events)
    assert (first.rank, again.rank, again.comm_id, again.ptr) == (None, 1, first.comm_id, "0x55f68495f4f0")
    assert again.to_dict()["v"] == 2 and parser.stats["ranks_learned"] == 1
    assert second.comm_id == first.comm_id + ".1" and second.rank is None
    assert [(o.comm_id, o.rank) for o in ops(events)] == [(first.comm_id, None)] * 2 + [(second.comm_id, None)]
    assert parser.stats["destroy"] == 2  # the other comm's Destroy names a comm this log never used


def test_rank_named_before_the_first_coll_line() -> None:
    real = [x for x in (FIX / "issue1357-nccl22x-trees-rankinfo.log").read_text().splitlines() if "nRanks" in x]
    pre = "qh100-gpu20:39634:39692 [5] NCCL INFO "
    events, _parser = parse_lines([*real, coll(pre, "0x5558e3c10180", 1, 16)])
    (c,) = comms(events)
    (o,) = ops(events)
    assert (c.rank, c.nranks, o.rank, o.nranks) == (13, 16, 13, 16)


def test_rank_from_revoke_line_and_ops_after_it_carry_it() -> None:
    pre = "n:7:8 [3] NCCL INFO "
    lines = [coll(pre, "0xabc", 1, 4),
             pre + "CommRevokeAsync START comm 0xabc rank 3 nRanks 4 nNodes 1 localRank 3 cudaDev 3",  # 2.28+
             coll(pre, "0xabc", 2, 4)]
    events, _ = parse_lines(lines)
    assert [o.rank for o in ops(events)] == [None, 3]
    assert [c.rank for c in comms(events)] == [None, 3]


def test_conflicting_rank_or_size_is_counted_not_applied() -> None:
    pre = "n:7:8 [3] NCCL INFO "
    lines = [coll(pre, "0xabc", 1, 4),
             pre + "comm 0xabc rank 9 nranks 4 cudaDev 3 busId 1000 - Destroy COMPLETE",  # rank >= nranks
             pre + "comm 0xabc rank 2 nRanks 8 nNodes 1 localRanks 8 localRank 2 MNNVL 0",  # other size
             coll(pre, "0xabc", 2, 8)]  # same address, other size: not this comm
    events, parser = parse_lines(lines)
    assert [o.rank for o in ops(events)] == [None]
    assert parser.stats["conflicts"] == 2 and parser.stats["errors"] == 1


def test_midrun_ops_join_a_comm_initialised_in_the_log_by_pointer_only_after_init() -> None:
    pre = "hostA:615:18953 [2] NCCL INFO "
    init = pre + "comm 0x9 rank 1 nranks 2 cudaDev 2 busId 9b000 - Init COMPLETE"  # 2.5-2.15 form
    events, _ = parse_lines([init, coll(pre, "0x9", 0, 2)])
    (o,) = ops(events)
    assert (o.rank, o.comm_id) == (1, "local:hostA:615:0x9")
    assert comms(events)[0].to_dict()["v"] == 1  # an Init comm stays v1


# ---------------------------------------------------------------- init / ring / tree forms 2.3-2.30

def test_nccl_24_init_ring_tree_lines() -> None:
    events, parser = parse_file(FIX / "issue226-nccl24-ring-tree-init.log")
    assert [(c.rank, c.nranks) for c in comms(events)] == [(15, 64), (19, 64)]
    assert parser.stats["trees"] == 4 and parser.stats["channel_net"] == 10 and parser.stats.get("unknown", 0) == 0
    sends = [(c.rank, c.peer, c.direction, c.net) for c in parser.channels if c.direction == "send"]
    assert (35, 34, "send", "Socket") in sends


def test_nccl_25_trees_with_up_and_down_tree_and_busid_rings() -> None:
    _, parser = parse_file(FIX / "issue302-nccl256-mpi-prefix.log")
    assert parser.stats["trees"] == 1 and parser.stats["channel_local"] == 3 and parser.stats["netib_devices"] == 1
    proc = next(iter(parser._procs.values()))
    assert proc.trees[3] == [155, 154, 153, 146, 162]
    assert proc.ibdevs[3] == ("mlx5_2", "roce")


def test_nccl_27_211_channel_lines_with_busids() -> None:
    _, parser = parse_file(FIX / "issue429-channel-busid-net.log")
    assert parser.stats["channel_local"] == 7 and parser.stats["channel_net"] == 2
    assert {(c.rank, c.peer, c.channel, c.direction, c.netdev) for c in parser.channels} == {
        (14, 6, 2, "recv", 0), (14, 6, 3, "recv", 0)}


@pytest.mark.parametrize("msg,rank,nranks", [
    ("comm 0x7f rank 3 nranks 4 - COMPLETE", 3, 4),  # 2.3
    ("comm 0x7f rank 3 nranks 4 cudaDev 1 nvmlDev 1 - Init COMPLETE", 3, 4),  # 2.4
    ("comm 0x7f rank 3 nranks 4 cudaDev 1 busId 1b000 - Init COMPLETE", 3, 4),  # 2.5-2.15
    ("comm 0x7f rank 3 nranks 4 cudaDev 1 busId 1b000 commId 0xabc - Init COMPLETE", 3, 4),  # 2.16-2.17
])
def test_old_init_forms(msg: str, rank: int, nranks: int) -> None:
    events, parser = parse_lines(["h:1:2 [1] NCCL INFO " + msg])
    (c,) = comms(events)
    assert (c.rank, c.nranks) == (rank, nranks) and parser.stats["init"] == 1


@pytest.mark.parametrize("msg,kept", [
    ("Ring 00 :    0   1   2   3", [0, 1, 2, 3]),  # 2.3 ring order
    ("Channel 00 :    0   1   2   3", [0, 1, 2, 3]),  # 2.4
    ("Channel 00/02 :    0   1   2   3", [0, 1, 2, 3]),  # 2.5+
])
def test_ring_order_forms(msg: str, kept: list[int]) -> None:
    pre = "h:1:2 [0] NCCL INFO "
    events, _ = parse_lines([pre + msg, pre + "comm 0x7f rank 0 nranks 4 cudaDev 0 busId 1 - Init COMPLETE"])
    assert comms(events)[0].rings == [kept]


def test_untagged_23_net_line_binds_nothing() -> None:
    _, parser = parse_lines(["h:1:2 [0] NCCL INFO Ring 00 : 1 -> 0 via NET/IB/0/GDRDMA"])
    assert parser.channels == [] and parser.stats["channel_net_untagged"] == 1


# ---------------------------------------------------------------- properties

REAL_COLL = [x for name in EXPECTED for x in (FIX / name).read_text().splitlines()
             if (m := _PREFIX.search(x)) and m["msg"] and _COLL.match(m["msg"].strip())
             and _PREFIX.search(m["msg"]) is None]


REAL_COLLECTIVES = [x for x in REAL_COLL if "Send:" not in x and "Recv:" not in x]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(REAL_COLL), st.data())
def test_a_line_cut_in_two_is_never_misread(line: str, data: st.DataObject) -> None:
    (want,) = ops(parse_lines([line])[0])
    cut = data.draw(st.integers(1, len(line) - 1))
    events, parser = parse_lines([line[:cut], line[cut:]])
    got = ops(events)
    assert len(got) <= 1
    for o in got:  # only a cut after "[nranks=N]" leaves the record whole
        assert (o.kind, o.count, o.nranks, o.dtype) == (want.kind, want.count, want.nranks, want.dtype)
    if not got:
        assert parser.stats.get("garbled", 0) + parser.stats.get("foreign", 0) + parser.stats.get("unknown", 0) >= 1


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(REAL_COLLECTIVES), st.sampled_from(REAL_COLLECTIVES), st.data())
def test_interleaved_lines_are_never_misread(a: str, b: str, data: st.DataObject) -> None:
    """Another process's output lands inside a line (as in NVIDIA/nccl#147). (Collectives
    only: two whole Send lines of one opCount rightly form one grouped operator.)"""
    at = data.draw(st.integers(0, len(a)))
    cut = data.draw(st.integers(0, len(b)))
    mixed = a[:at] + b[:cut]
    events, _ = parse_lines([mixed, b[cut:] + a[at:]])
    originals = {(o.kind, o.count, o.nranks, o.dtype) for o in ops(parse_lines([a, b])[0])}
    for o in ops(events):
        assert (o.kind, o.count, o.nranks, o.dtype) in originals


NCCLISH = st.sampled_from([
    "NCCL INFO ", "comm 0x1 ", "rank 3 ", "nranks 4 ", "nRanks 4 ", "[nranks=4]", "opCount 1f ", "AllReduce: ",
    "Send: ", "count 9 ", "datatype 7 ", "datatype 99 ", "root -1 ", "- Init COMPLETE", "- Destroy COMPLETE",
    "Trees [0] ", "-1/-1/-1->0->1", "|", "Channel 00/02 : ", "Ring 00 : ", " -> ", "[send] via NET/IB/0", "0x",
    "h:1:2 [0] ", "cudaDev 0 busId 1 ", "commId 0x5 ", "stream 0x2", " ", "\t", "\x00", "é",
])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(NCCLISH, max_size=25).map("".join), max_size=25))
def test_nccl_shaped_garbage_never_raises_and_round_trips(lines: list[str]) -> None:
    events, parser = parse_lines(["h:1:2 [0] NCCL INFO " + x for x in lines] + lines)
    assert parser.stats.get("lines", 0) == 2 * len(lines)
    for e in events:
        assert decode(e.to_json()) == e
        if isinstance(e, OpEvent) and e.rank is not None:
            assert e.rank < (e.nranks or 1 << 24)


# ---------------------------------------------------------------- more real forms, 2.7-2.2x

@pytest.mark.parametrize("name,stats,ranks", [
    ("issue629-init-busid.log", {"init": 8}, [15, 14, 12, 8, 9, 2, 5, 4]),  # 2.8-2.15 Init, no commId
    ("issue1814-nccl22x-ibext-init.log", {"init": 4, "channel_net": 12}, [36, 34, 32, 35]),  # 2.18-2.20
    ("issue707-channel-net-busid.log", {"channel_net": 12}, []),  # 2.7-2.11 NET lines, busId brackets
    ("issue1038-nccl2183-init-start.log", {"init_start": 1, "version": 1, "netib_devices": 1}, []),
    ("issue1029-pdsh-prefix-init-start.log", {"init_start": 4, "netib_devices": 1}, []),  # "<host>: " prefix
    ("issue179-nccl237-init.log", {"netib_devices": 6}, []),  # 2.3.7 per-device NET/IB lines
    ("issue1412-nccl22x-net-p2p-read.log", {"channel_net": 4, "channel_local": 4}, []),
])
def test_more_real_forms(name: str, stats: dict[str, int], ranks: list[int]) -> None:
    events, parser = parse_file(FIX / name)
    assert {k: parser.stats.get(k, 0) for k in stats} == stats
    assert [c.rank for c in comms(events)] == ranks
    assert parser.stats.get("garbled", 0) == 0 and parser.stats.get("errors", 0) == 0


def test_nccl_23_device_list() -> None:
    _, parser = parse_file(FIX / "issue179-nccl237-init.log")
    (proc,) = [p for p in parser._procs.values() if p.ibdevs]
    assert proc.ibdevs == {0: ("mlx5_1", "ib"), 1: ("mlx5_3", "ib"), 2: ("mlx5_0", "ib"), 3: ("mlx5_2", "ib")}


def test_net_channels_of_processes_without_init_are_kept_unbound() -> None:
    _, parser = parse_file(FIX / "issue707-channel-net-busid.log")
    assert len(parser.channels) == 12 and all(c.comm_id is None for c in parser.channels)
    assert (0, 2, 1, "recv", 5) in {(c.rank, c.peer, c.channel, c.direction, c.netdev) for c in parser.channels}
    _, parser = parse_file(FIX / "issue1814-nccl22x-ibext-init.log")
    assert {(c.rank, c.peer, c.net, c.netdev) for c in parser.channels} == {(39, 47, "IBext_v8", 2),
                                                                           (38, 6, "IBext_v8", 1)}


def test_init_start_gives_rank_and_shared_comm_id_to_a_midrun_comm() -> None:
    start = [x for x in (FIX / "issue1038-nccl2183-init-start.log").read_text().splitlines() if "Init START" in x]
    events, _ = parse_lines([*start, coll("host-2:38610:38610 [0] NCCL INFO ", "0x1277bf60", 0, 1)])
    (c,) = comms(events)
    (o,) = ops(events)
    assert (c.comm_id, c.rank, o.comm_id, o.rank) == ("0xbd10cc2bcb56e132", 0, "0xbd10cc2bcb56e132", 0)


def test_init_start_forms_of_229_and_split() -> None:
    pre = "n:1:2 [0] NCCL INFO "
    events, parser = parse_lines([
        pre + "[Rank 3] ncclCommInitRank comm 0x55 rank 3 nranks 4 cudaDev 0 nvmlDev 0 busId 1 commId 0x5 - Init START",
        pre + "ncclCommSplit comm 0x56 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId 1 parent 0x55 splitCount 1 color 0 key 1- Init START",
        coll(pre, "0x55", 0, 4), coll(pre, "0x56", 0, 2)])
    assert parser.stats["init_start"] == 2
    assert [(c.comm_id, c.rank) for c in comms(events)] == [("0x5", 3), ("local:n:1:0x56", 1)]


def test_cli_parse_log_of_a_midrun_log() -> None:
    from click.testing import CliRunner

    from pulse.cli import main

    res = CliRunner().invoke(main, ["hooks", "parse-log", str(FIX / "torchtitan1369-tp-allgather.log"), "--json"])
    assert res.exit_code == 0, res.output
    got = [decode(x.encode()) for x in res.stdout.splitlines()]
    assert sum(isinstance(e, OpEvent) for e in got) == 7 and sum(isinstance(e, CommEvent) for e in got) == 2
    assert "midrun_comms=2" in res.stderr
