"""`rdma res show qp` in every form iproute2 prints, and `rdma statistic qp show`, on real output
(tests/hooks/fixtures/rdma/, each citing the mail or commit it comes from): every QP read,
nothing misread; non-flows counted and skipped; malformed records flagged."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.hooks.rdma_res import (
    QP_STATES,
    QP_TYPES,
    RdmaQp,
    flows_from_rdma,
    parse_rdma_qp,
    read_rdma_qp,
    read_rdma_stat_qp,
)

from pulse.cli import main
from pulse.errors import DecodeError
from pulse.events import decode

FIX = Path(__file__).resolve().parent / "fixtures" / "rdma"


def body(name: str) -> str:
    """The tool's output: the fixture without its leading '#' citation block."""
    lines = (FIX / name).read_text().splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    return "\n".join(lines) + "\n"


def test_fixtures_cite_their_source() -> None:
    for path in FIX.iterdir():
        head = path.read_text().splitlines()[:4]
        assert head[0].startswith("# Source:") and any("https://" in x for x in head), path.name


Q = RdmaQp  # (ifname, port, lqpn, rqpn, type, state, pid, comm, kernel, pdn)
EXPECTED = {
    "lore-20201231-plain-rc-init.txt": ("text", [
        Q("ibp0s9", 1, 50, 0, "RC", "INIT", 479, "ibv_rc_pingpong", False, 3)]),
    "iproute2-8ecac46a-plain-2018.txt": ("text", [
        Q("mlx5_4", None, 8, None, "UD", "RESET", None, "ib_ipoib", True),
        Q("mlx5_4", 1, 7, None, "UD", "RTS", None, "ib_core", True),
        Q("mlx5_4", 1, 1, None, "GSI", "RTS", None, "ib_core", True),
        Q("mlx5_4", 1, 0, None, "SMI", "RTS", None, "ib_core", True)]),
    "iproute2-96f59e7f-plain-pdn.txt": ("text", [
        Q("mlx5_0", 1, 0, None, "SMI", "RTS", None, "ib_core", True),
        Q("mlx5_0", 1, 1, None, "GSI", "RTS", None, "ib_core", True),
        Q("mlx5_0", 1, 7, None, "UD", "RTS", None, "ib_core", True),
        Q("mlx5_0", 1, 8, None, "UD", "RTS", None, "ib_ipoib", True),
        Q("mlx5_0", 1, 9, 0, "RC", "INIT", 548, "ibv_rc_pingpong", False, 4)]),
    "iproute2-331152752a97-dd-pretty.txt": ("text", [
        Q("cxgb4_0", None, 1028, 0, "RC", "RTS", None, "nvme_rdma", True)]),
    "iproute2-db6d6bec-noport-owner.txt": ("text", [
        Q("mlx5_0", None, 1, None, "GSI", "RTS", None, "ib_core", True),
        Q("mlx5_0", None, 1, None, "GSI", "RTS", None, "ib_core", True),
        Q("rocep0s9", 1, 1, None, "GSI", "RTS", None, "ib_core", True),
        Q("rocep0s9", 1, 1, None, "GSI", "RTS", None, "ib_core", True)]),
    "iproute2-57d7a8fd-dd-driver-qp.txt": ("text", [
        Q("ibp8s0f1", 1, 360, None, "UD", "RTS", None, "mlx5_ib", True),
        Q("ibp8s0f1", 1, 465, None, "DRIVER", "RTS", None, "mlx5_ib", True),
        Q("ibp8s0f1", 1, 0, None, "SMI", "RTS", None, "ib_core", True),
        Q("ibp8s0f1", 1, 1, None, "GSI", "RTS", None, "ib_core", True)]),
    "lore-20220822-hns-jp-dd-attrs-after-brace.json": ("json-broken", [
        Q("hns_0", 1, 41, 40, "RC", "RTR", 1523, "ib_send_bw", False, 9)]),
    "lore-20231229-jp-dd-assertion.json": ("json-broken", [
        Q("hns_1", 1, 1, None, "GSI", "RTS", None, "ib_core", True)]),
    "lore-20231229-jp-dd-unnamed-object.json": ("json-broken", [
        Q("hns_2", 1, 1, None, "GSI", "RTS", None, "ib_core", True)]),
}
# (flows, skipped by reason) from flows_from_rdma
FLOWS = {
    "lore-20201231-plain-rc-init.txt": (0, {"unconnected": 1}),
    "iproute2-8ecac46a-plain-2018.txt": (0, {"type": 4}),
    "iproute2-96f59e7f-plain-pdn.txt": (0, {"type": 4, "unconnected": 1}),
    "iproute2-331152752a97-dd-pretty.txt": (0, {"unconnected": 1}),
    "iproute2-db6d6bec-noport-owner.txt": (0, {"type": 4}),
    "iproute2-57d7a8fd-dd-driver-qp.txt": (0, {"type": 3, "unconnected": 1}),
    "lore-20220822-hns-jp-dd-attrs-after-brace.json": (1, {}),
    "lore-20231229-jp-dd-assertion.json": (0, {"type": 1}),
    "lore-20231229-jp-dd-unnamed-object.json": (0, {"type": 1}),
}
NOTES = {
    "lore-20220822-hns-jp-dd-attrs-after-brace.json": ["5 driver attribute(s) printed outside any QP object (dropped)",
                                                       "1 unmatched closing brace(s)"],
    "lore-20231229-jp-dd-assertion.json": [
        "tool message: rdma: json_writer.c:130: jsonw_end: Assertion `self->depth > 0' failed.",
        "tool message: Aborted (core dumped)",
        "4 driver attribute(s) printed outside any QP object (dropped)"],
    "lore-20231229-jp-dd-unnamed-object.json": [
        "lore-20231229-jp-dd-unnamed-object.json: object 0: unnamed nested object (driver attributes) dropped"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_form_is_read_with_nothing_misread(name: str) -> None:
    form, want = EXPECTED[name]
    got = read_rdma_qp(body(name), where=name)
    assert (got.form, got.qps, got.malformed) == (form, want, [])
    assert got.notes == NOTES.get(name, [])
    assert parse_rdma_qp(body(name), where=name) == want
    skipped: dict[str, int] = {}
    flows = flows_from_rdma(got.qps, node="n", skipped=skipped)
    assert (len(flows), skipped) == FLOWS[name]
    for f in flows:
        assert decode(f.to_json()) == f


def test_the_connected_rc_qp_becomes_a_flow() -> None:
    (f,) = flows_from_rdma(parse_rdma_qp(body("lore-20220822-hns-jp-dd-attrs-after-brace.json")), node="n1")
    assert (f.nic, f.flow, f.qpn, f.remote_qpn, f.pid) == ("hns_0", 41, 41, 40, 1523)


def test_compact_and_pretty_json_of_the_same_qps() -> None:
    """-j and -jp print the objects of the broken forms without the driver attributes; no real
    capture of a valid -j/-jp QP list was found, so these are the real objects re-serialised."""
    qps = [q for name in EXPECTED if name.endswith(".json") for q in EXPECTED[name][1]]
    objs = [{"ifindex": 0, "ifname": q.ifname, "port": q.port, "lqpn": q.lqpn, "rqpn": q.rqpn, "type": q.type,
             "state": q.state, "pdn": q.pdn, "pid": q.pid, "comm": q.comm} for q in qps]
    objs = [{k: v for k, v in o.items() if v is not None} for o in objs]
    for raw in (orjson.dumps(objs), orjson.dumps(objs, option=orjson.OPT_INDENT_2)):
        got = read_rdma_qp(raw)
        assert (got.form, got.malformed, [q.lqpn for q in got.qps]) == ("json", [], [q.lqpn for q in qps])
        assert [q.kernel for q in got.qps] == [q.kernel for q in qps]


def test_srq_output_is_flagged_not_read_as_qps() -> None:
    got = read_rdma_qp(body("iproute2-ad3a118f-srq-jp.json"), where="srq")
    assert got.qps == [] and len(got.malformed) == 2
    assert all("'lqpn' must be an integer" in m for m in got.malformed)
    with pytest.raises(DecodeError, match="srq: entry 0"):
        parse_rdma_qp(body("iproute2-ad3a118f-srq-jp.json"), where="srq")


@pytest.mark.parametrize("name,cntn,lqpns,pid,comm", [
    ("lore-20190606-stat-qp-show.txt", 4, (258,), 9829, "ib_send_bw"),
    ("iproute2-5937552b-stat-qp-show.txt", 5, (178,), 31609, "client.1"),
])
def test_statistic_qp_counters(name: str, cntn: int, lqpns: tuple[int, ...], pid: int, comm: str) -> None:
    sets, bad = read_rdma_stat_qp(body(name), where=name)
    assert bad == []
    (c,) = sets
    assert (c.ifname, c.port, c.cntn, c.lqpns, c.pid, c.comm) == ("mlx5_2", 1, cntn, lqpns, pid, comm)
    assert len(c.counters) == 18 and set(c.counters.values()) == {0}
    assert "out_of_sequence" in c.counters and "req_cqe_flush_error" in c.counters


def test_statistic_json_form() -> None:
    """-j keys per iproute2 rdma/stat.c (lqpn is a JSON array); values from the real text above."""
    sets, _ = read_rdma_stat_qp(body("lore-20190606-stat-qp-show.txt"))
    c = sets[0]
    obj = {"ifindex": 2, "ifname": c.ifname, "port": c.port, "cntn": c.cntn, "pid": c.pid, "comm": c.comm,
           **c.counters, "lqpn": list(c.lqpns)}
    again, bad = read_rdma_stat_qp(orjson.dumps([obj]))
    assert bad == [] and again == sets


def test_cut_statistic_list_is_flagged() -> None:
    sets, bad = read_rdma_stat_qp("link mlx5_2/1 cntn 4 pid 1 comm x rx_write_requests 0\n    LQPN: <25\n")
    assert sets == [] and "LQPN list" in bad[0]


# ---------------------------------------------------------------- properties

def render(q: RdmaQp) -> str:
    """A QP as iproute2's plain text prints it (rdma/res-qp.c field order)."""
    port = "-" if q.port is None else str(q.port)
    out = [f"link {q.ifname}/{port}", f"lqpn {q.lqpn}"]
    if q.rqpn is not None:
        out.append(f"rqpn {q.rqpn}")
    out += [f"type {q.type}", f"state {q.state}", "sq-psn 0"]
    if q.pdn is not None:
        out.append(f"pdn {q.pdn}")
    if q.pid is not None:
        out.append(f"pid {q.pid}")
    out.append(f"comm [{q.comm}]" if q.kernel else f"comm {q.comm}")
    return " ".join(out)


QPS = st.builds(
    lambda name, port, lqpn, rqpn, qtype, state, pid, comm, pdn: RdmaQp(
        ifname=name, port=port, lqpn=lqpn, rqpn=rqpn, type=qtype, state=state, pid=pid, comm=comm,
        kernel=pid is None, pdn=pdn),
    st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), st.none() | st.integers(1, 4),
    st.integers(0, (1 << 24) - 1), st.none() | st.integers(0, (1 << 24) - 1), st.sampled_from(QP_TYPES),
    st.sampled_from(QP_STATES), st.none() | st.integers(1, 1 << 22), st.from_regex(r"[a-z][a-z0-9_.]{0,14}", fullmatch=True),
    st.none() | st.integers(0, 1000))


@settings(max_examples=200, deadline=None)
@given(st.lists(QPS, max_size=8))
def test_text_round_trip(qps: list[RdmaQp]) -> None:
    text = "".join(render(q) + "\n" for q in qps)
    assert parse_rdma_qp(text) == qps


@settings(max_examples=300, deadline=None)
@given(QPS, st.data())
def test_a_cut_text_line_is_flagged_or_loses_only_the_owner_name(q: RdmaQp, data: st.DataObject) -> None:
    line = render(q)
    cut = data.draw(st.integers(1, len(line) - 1))
    got = read_rdma_qp(line[:cut] + "\n" + line[cut:] + "\n")
    for r in got.qps:  # only a cut inside the last word (the owner) leaves a readable record
        assert (r.ifname, r.port, r.lqpn, r.rqpn, r.type, r.state, r.pid, r.pdn) == \
            (q.ifname, q.port, q.lqpn, q.rqpn, q.type, q.state, q.pid, q.pdn)
        assert q.comm.startswith((r.comm or "").rstrip("]").lstrip("["))
    assert len(got.qps) + len(got.malformed) >= 1


@settings(max_examples=200, deadline=None)
@given(st.lists(QPS, min_size=1, max_size=5), st.data())
def test_cut_json_keeps_whole_objects_and_flags_the_rest(qps: list[RdmaQp], data: st.DataObject) -> None:
    objs = [{"ifname": q.ifname, "port": q.port, "lqpn": q.lqpn, "rqpn": q.rqpn, "type": q.type, "state": q.state,
             "pid": q.pid, "comm": f"[{q.comm}]" if q.kernel else q.comm, "pdn": q.pdn} for q in qps]
    raw = orjson.dumps([{k: v for k, v in o.items() if v is not None} for o in objs], option=orjson.OPT_INDENT_2)
    cut = data.draw(st.integers(1, len(raw) - 1))
    got = read_rdma_qp(raw[:cut])
    assert got.qps == qps[: len(got.qps)]  # a prefix of the real QPs, each exact


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300) | st.binary(max_size=300))
def test_garbage_is_flagged_never_raises(raw) -> None:
    got = read_rdma_qp(raw)
    for q in got.qps:
        assert 0 <= q.lqpn < 1 << 24 and q.type in QP_TYPES
    try:
        parse_rdma_qp(raw)
    except DecodeError:
        pass
    read_rdma_stat_qp(raw)


def test_cli_reads_every_form_and_flags(tmp_path) -> None:
    p = tmp_path / "qp.txt"
    p.write_text(body("iproute2-96f59e7f-plain-pdn.txt") + "link mlx5_0/1 lqpn 12 type RC\n")
    res = CliRunner().invoke(main, ["hooks", "rdma-res", str(p), "--node", "a", "--json"])
    assert res.exit_code == 0, res.output
    assert res.stdout == ""
    assert "malformed:" in res.stderr and "skipped_type=4" in res.stderr and "skipped_unconnected=1" in res.stderr
    p.write_text(body("lore-20231229-jp-dd-assertion.json"))
    res = CliRunner().invoke(main, ["hooks", "rdma-res", str(p), "--node", "a"])
    assert res.exit_code == 0 and "note: tool message: Aborted (core dumped)" in res.stderr
    p.write_text("nothing like rdma output\n")
    res = CliRunner().invoke(main, ["hooks", "rdma-res", str(p), "--node", "a"])
    assert res.exit_code == 1 and "no record could be read" in res.output
    p.write_text(body("lore-20190606-stat-qp-show.txt"))
    res = CliRunner().invoke(main, ["hooks", "rdma-stat", str(p), "--json"])
    assert res.exit_code == 0, res.output
    assert orjson.loads(res.stdout)["lqpns"] == [258]
