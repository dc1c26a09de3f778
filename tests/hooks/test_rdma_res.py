"""`rdma -j res show qp` reader and the joins with the other hook sources."""

from __future__ import annotations

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.hooks.nccl_log import NetChannel, parse_lines
from pulse.hooks.rdma_res import flows_from_rdma, join_flows, parse_rdma_qp

from pulse.cli import main
from pulse.errors import DecodeError
from pulse.events import FlowEvent, decode

# Shaped like iproute2's JSON output (rdma/res-qp.c keys).
NODE_A = [
    {"ifindex": 2, "ifname": "mlx5_0", "port": 1, "lqpn": 1, "type": "GSI", "state": "RTS", "sq-psn": 0,
     "comm": "[ib_core]"},
    {"ifindex": 2, "ifname": "mlx5_0", "port": 1, "lqpn": 4660, "rqpn": 8801, "type": "RC", "state": "RTS",
     "rq-psn": 0, "sq-psn": 0, "path-mig-state": "MIGRATED", "pdn": 3, "pid": 4242, "comm": "python3"},
    {"ifindex": 3, "ifname": "mlx5_1", "port": 1, "lqpn": 4661, "rqpn": 8802, "type": "RC", "state": "RTS",
     "rq-psn": 0, "sq-psn": 0, "pdn": 3, "pid": 4242, "comm": "python3"},
    {"ifindex": 3, "ifname": "mlx5_1", "port": 1, "lqpn": 5000, "rqpn": 9000, "type": "RC", "state": "RTS",
     "pid": 999, "comm": "other-job"},
    {"ifindex": 3, "ifname": "mlx5_1", "port": 1, "lqpn": 7, "type": "UD", "state": "RTS", "pid": 4242,
     "comm": "python3"},
]
NODE_B = [
    {"ifindex": 2, "ifname": "mlx5_0", "port": 1, "lqpn": 8801, "rqpn": 4660, "type": "RC", "state": "RTS",
     "pid": 777, "comm": "python3"},
    {"ifindex": 3, "ifname": "mlx5_1", "port": 1, "lqpn": 8802, "rqpn": 4661, "type": "RC", "state": "RTS",
     "pid": 777, "comm": "python3"},
]


def test_parse_and_flows() -> None:
    qps = parse_rdma_qp(orjson.dumps(NODE_A))
    assert len(qps) == 5 and qps[0].rqpn is None and qps[1].pid == 4242
    flows = flows_from_rdma(qps, node="a", job="j")
    assert [(f.nic, f.flow, f.remote_qpn, f.pid) for f in flows] == [
        ("mlx5_0", 4660, 8801, 4242), ("mlx5_1", 4661, 8802, 4242), ("mlx5_1", 5000, 9000, 999)]
    assert all(f.source == "rdma-res" and f.qpn == f.flow and not f.bound for f in flows)
    assert len(flows_from_rdma(qps, node="a", pids=[4242])) == 2
    assert len(flows_from_rdma(qps, node="a", process_names=["other-job"])) == 1
    assert parse_rdma_qp(orjson.dumps({"qp": NODE_B}))[0].lqpn == 8801  # wrapped form


def test_join_plugin_binding_partner_and_addresses() -> None:
    a = flows_from_rdma(parse_rdma_qp(orjson.dumps(NODE_A)), node="a", pids=[4242])
    b = flows_from_rdma(parse_rdma_qp(orjson.dumps(NODE_B)), node="b")
    plugin = FlowEvent(job="", node="a", nic="mlx5_0", flow=4660, comm_id="0x5", rank=3, peer=4, channel=1,
                       direction="send", qpn=4660, source="nccl-plugin")
    capture = FlowEvent(job="", node="b", nic="mlx5_0", flow=8801, src="10.0.0.1", dst="10.0.0.2", sport=49152,
                        dport=4791, transport="roce")
    joined = join_flows(a + b, bound=[plugin], captures=[capture])
    by = {(f.node, f.flow): f for f in joined}
    assert (by["a", 4660].comm_id, by["a", 4660].rank, by["a", 4660].peer, by["a", 4660].direction) == ("0x5", 3, 4, "send")
    # the partner QP on node b: rank/peer swapped, direction reversed
    pb = by["b", 8801]
    assert (pb.comm_id, pb.rank, pb.peer, pb.channel, pb.direction) == ("0x5", 4, 3, 1, "recv")
    assert (pb.src, pb.dst, pb.dport, pb.transport) == ("10.0.0.1", "10.0.0.2", 4791, "roce")
    assert not by["a", 4661].bound and not by["b", 8802].bound
    assert [f.flow for f in joined] == [f.flow for f in a + b]


def test_join_net_log_only_when_unique() -> None:
    a = flows_from_rdma(parse_rdma_qp(orjson.dumps(NODE_A)), node="a", pids=[4242])
    init = "a:4242:1 [0] NCCL INFO comm 0xc rank 3 nranks 8 cudaDev 0 nvmlDev 0 busId 1 commId 0x5 - Init COMPLETE"
    one = "a:4242:9 [0] NCCL INFO Channel 00/0 : 3[0] -> 4[0] [send] via NET/IB/1/GDRDMA"
    two = "a:4242:9 [0] NCCL INFO Channel 01/0 : 2[0] -> 3[0] [receive] via NET/IB/1/GDRDMA"
    _, parser = parse_lines([init, one])
    joined = join_flows(a, channels=parser.channels)
    q = {f.flow: f for f in joined}[4661]  # netdev 1 -> mlx5_1: the only QP of pid 4242 there
    assert (q.comm_id, q.rank, q.peer, q.channel, q.direction) == ("0x5", 3, 4, 0, "send")
    _, parser = parse_lines([init, one, two])  # two connections, one QP: ambiguous -> unbound
    assert not any(f.bound for f in join_flows(a, channels=parser.channels))
    # an explicit device map overrides the mlx5_<netdev> default
    ch = [NetChannel(node="a", pid=4242, comm_id="0x5", rank=3, peer=4, channel=0, direction="send", net="IB",
                     netdev=7)]
    assert {f.flow: f for f in join_flows(a, channels=ch, nic_of_netdev={("a", 7): "mlx5_0"})}[4660].bound


@pytest.mark.parametrize("raw,match", [
    (b"not json", "line 1: not a 'link ...' record"),
    (b'{"a": 1}', "expected a JSON list"),
    (b"[1]", "expected an object"),
    (b'[{"lqpn": 5}]', "ifname"),
    (b'[{"ifname": "mlx5_0"}]', "missing 'lqpn'"),
    (b'[{"ifname": "mlx5_0", "lqpn": "5"}]', "must be an integer"),
    (b'[{"ifname": "mlx5_0", "lqpn": -1}]', "negative"),
    (b'[{"ifname": "mlx5_0", "lqpn": 16777216}]', "24-bit"),
    (b'[{"ifname": "mlx5_0", "lqpn": 5, "rqpn": 99999999}]', "24-bit"),
    (b'[{"ifname": "mlx5_0", "lqpn": true}]', "must be an integer"),
])
def test_bad_input(raw: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        parse_rdma_qp(raw, where="fixture")


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers(-(1 << 40), 1 << 40) | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
                        ["ifname", "lqpn", "rqpn", "type", "pid", "comm", "port", "x"]), c, max_size=6), max_leaves=20))
def test_arbitrary_json_is_decoded_or_rejected(value) -> None:
    try:
        qps = parse_rdma_qp(orjson.dumps(value))
    except DecodeError:
        return
    for f in flows_from_rdma(qps, node="n"):
        assert decode(f.to_json()) == f


def test_cli_rdma_res(tmp_path) -> None:
    path = tmp_path / "qp.json"
    path.write_bytes(orjson.dumps(NODE_A))
    res = CliRunner().invoke(main, ["hooks", "rdma-res", str(path), "--node", "a", "--pid", "4242", "--json"])
    assert res.exit_code == 0, res.output
    assert [decode(x).flow for x in res.stdout.splitlines()] == [4660, 4661]
    res = CliRunner().invoke(main, ["hooks", "rdma-res", "-", "--node", "a", "--json"], input=orjson.dumps(NODE_B))
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2
    res = CliRunner().invoke(main, ["hooks", "rdma-res", "-", "--node", "a"], input=b"[{]")
    assert res.exit_code == 1 and "error:" in res.output and "cut short" in res.output
