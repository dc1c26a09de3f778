"""`pulse diagnose --cross-check`: the descriptors' flow bindings against the wire.

On the real lab capture (tests/engine/traces/lab-rate: TCP 5-tuples seen on both ends) and
on a small simulated RoCE job (queue pairs and their remotes), first as recorded (they
agree), then with the hook events altered the way a lying or lagging descriptor source
would write them; each alteration must be reported as exactly that flow."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from pulse.engine.crosscheck import cross_check
from pulse.sim import SimConfig, simulate

from pulse.cli import main

LAB = Path(__file__).parent / "traces" / "lab-rate"
SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "pp": 2, "steps": 4}


def _rewrite(src: Path, dst: Path, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> Path:
    shutil.copytree(src, dst)
    events = [orjson.loads(ln) for ln in (src / "hook-events.jsonl").read_bytes().splitlines() if ln.strip()]
    (dst / "hook-events.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in edit(events)))
    return dst


def _bound_sends(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == "flow" and e.get("direction") == "send"]


def test_the_recorded_lab_capture_agrees() -> None:
    c = cross_check(LAB)
    assert c.agrees and (c.declared_flows, c.wire_paired, c.data_flows) == (24, 24, 12)
    assert c.undeclared == [] and c.undeclared_bytes_share == 0.0


def test_a_lying_peer_a_swapped_direction_and_a_lagging_source_are_each_named(tmp_path: Path) -> None:
    from pulse.engine.crosscheck import _tx_bytes

    from pulse.trace import TraceReader

    tx = _tx_bytes(TraceReader(LAB))
    sends = _bound_sends([orjson.loads(ln) for ln in (LAB / "hook-events.jsonl").read_bytes().splitlines()])
    # the three busiest send flows (ring data, not a store's or a barrier's few bytes)
    lie, swap, lag = sorted(sends, key=lambda e: -tx.get((f"{e['node']}/{e['nic']}", e["flow"]), 0))[:3]
    ident = {(e["node"], e["flow"]) for e in (lie, swap, lag)}
    assert len(ident) == 3

    def edit(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for e in events:
            e = dict(e)
            if e["type"] == "flow" and (e["node"], e["flow"]) == (lie["node"], lie["flow"]):
                # the declared peer: another rank than the one the 5-tuple reaches
                e["peer"] = next(r for r in range(4) if r not in (e["rank"], e["peer"]))
            if e["type"] == "flow" and e.get("comm_id") == swap["comm_id"] and e.get("src") == swap["src"] \
                    and e.get("sport") == swap["sport"] and e.get("dport") == swap["dport"]:
                e["direction"] = {"send": "recv", "recv": "send"}[e["direction"]]
            if e["type"] == "flow" and e.get("src") == lag["src"] and e.get("sport") == lag["sport"] \
                    and e.get("dport") == lag["dport"]:
                for k in ("comm_id", "rank", "peer", "channel", "direction"):
                    e.pop(k, None)  # the capture's addresses only: no source bound it
            out.append(e)
        return out

    c = cross_check(_rewrite(LAB, tmp_path / "t", edit))
    assert not c.agrees
    assert [(m["endpoint"], m["flow"]) for m in c.peer_mismatch] == [(f"{lie['node']}/eth0", lie["flow"])]
    # the swapped pair's new "send" end is the receiver: it transmitted nothing of the data
    assert len(c.direction_mismatch) == 1
    d = c.direction_mismatch[0]
    assert d["wire_sender"] == f"{swap['node']}/eth0" and d["sent"] < d["bytes"]
    assert [(u["endpoint"], u["flow"]) for u in c.undeclared] == [(f"{lag['node']}/eth0", lag["flow"])]
    assert 0 < c.undeclared[0]["share"] <= 1 and 0 < c.undeclared_bytes_share < 1
    text = "\n".join(c.lines())
    assert "DISAGREE" in text and "peer:" in text and "direction:" in text and "undeclared:" in text


def test_a_rank_declared_on_two_nodes_is_named(tmp_path: Path) -> None:
    def edit(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        comm = next(e for e in events if e["type"] == "comm")
        return [*events, {**comm, "node": "node-09" if comm["node"] != "node-09" else "node-08"}]

    c = cross_check(_rewrite(LAB, tmp_path / "t", edit))
    assert len(c.rank_conflicts) == 1 and len(c.rank_conflicts[0]["nodes"]) == 2


def test_bindings_without_addresses_compare_nothing_and_say_so(tmp_path: Path) -> None:
    """Flow events from a log that names no address or queue pair: the descriptors cannot
    be checked against the wire, and the report must not sound like an agreement."""
    keys = ("src", "dst", "sport", "dport", "qpn", "remote_qpn")
    c = cross_check(_rewrite(LAB, tmp_path / "t", lambda evs: [{k: v for k, v in e.items() if k not in keys}
                                                              for e in evs]))
    assert c.wire_paired == 0 and c.declared_flows == 24
    assert "nothing to compare" in c.lines()[0] and "agree" not in c.lines()[0]


@pytest.fixture(scope="module")
def roce(tmp_path_factory: pytest.TempPathFactory) -> Path:
    t = tmp_path_factory.mktemp("roce") / "t"
    simulate(SimConfig(scenario="healthy", seed=0, **SIZE), t)  # type: ignore[arg-type]
    return t


def test_a_simulated_roce_job_agrees_and_a_reused_queue_pair_is_named(roce: Path, tmp_path: Path) -> None:
    c = cross_check(roce)
    assert c.agrees and c.declared_flows == c.wire_paired > 0 and c.undeclared == []
    # rdma res polled after the queue pair numbers were reused: one send QP's remote now
    # names a QP of another node (the binding still says the old peer)
    events = [orjson.loads(ln) for ln in (roce / "hook-events.jsonl").read_bytes().splitlines() if ln.strip()]
    qps = [e for e in events if e["type"] == "flow" and e.get("qpn") is not None]
    victim = next(e for e in qps if e["direction"] == "send")
    mate = next(e for e in qps if e["qpn"] == victim["remote_qpn"])
    other = next(e for e in qps if e["direction"] == "recv" and e["node"] not in (victim["node"], mate["node"]))

    def edit(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for e in evs:
            e = dict(e)
            if e["type"] == "flow" and e.get("qpn") == victim["qpn"] and e["node"] == victim["node"]:
                e["remote_qpn"] = other["qpn"]
            if e["type"] == "flow" and e.get("qpn") == other["qpn"] and e["node"] == other["node"]:
                e["remote_qpn"] = victim["qpn"]
            out.append(e)
        return out

    c = cross_check(_rewrite(roce, tmp_path / "t", edit))
    wrong = {(m["endpoint"], m["flow"]) for m in c.peer_mismatch}
    assert (f"{victim['node']}/{victim['nic']}", victim["flow"]) in wrong
    assert all(m["wire_endpoint"].startswith(other["node"]) or m["endpoint"].startswith(other["node"])
               for m in c.peer_mismatch)


def test_the_cli_prints_it_and_adds_one_json_line() -> None:
    r = CliRunner().invoke(main, ["diagnose", str(LAB), "--cross-check"])
    assert r.exit_code == 0, r.output
    assert "descriptors and wire agree" in r.output
    r = CliRunner().invoke(main, ["diagnose", str(LAB), "--cross-check", "--json"])
    last = orjson.loads(r.stdout.splitlines()[-1])
    assert last["cross_check"]["agrees"] is True and last["cross_check"]["declared_flows"] == 24


def test_a_directory_that_is_not_a_trace_is_one_clear_error(tmp_path: Path) -> None:
    from pulse.errors import PulseError

    (tmp_path / "x").mkdir()
    with pytest.raises(PulseError, match="trace"):
        cross_check(tmp_path / "x" / "missing")
    r = CliRunner().invoke(main, ["diagnose", str(tmp_path / "x"), "--cross-check"])
    assert r.exit_code in (1, 2) and "Traceback" not in r.output
