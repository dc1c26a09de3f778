"""One NIC's capture stops publishing while the node's other NICs go on.

A NIC that is down still has its windows published (empty, the simulator's and a live
capture's heartbeat), so a NIC whose batches *end* is a capture that died, not a fault: its
operators after that are cut off, not stalled. Before data-end v3 carried each NIC's end,
half a healthy NIC file gave "network fail-stop" on its node: a blame made of missing input.
A NIC that really went down and whose capture saw nothing is still found, because its peers
stall in data that goes on."""

from __future__ import annotations

from pathlib import Path

import mutators as M
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.engine import diagnose
from pulse.sim import SimConfig, simulate

from pulse.errors import DecodeError
from pulse.records import DataEnd, decode_data_end
from pulse.samples import EpochBatch
from pulse.trace import read_truth

SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "pp": 1, "steps": 8}


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("nicstop")
    out = {}
    # nic-down at seed 6: at seed 1 this 4-node ring stalls on every node within the skew
    # bound, and the whole job was named as a group (3 healthy nodes in it: no longer named)
    for name, seed in (("healthy", 1), ("nic-slow", 1), ("nic-down", 6)):
        simulate(SimConfig(scenario=name, seed=seed, **SIZE), root / name)  # type: ignore[arg-type]
        out[name] = root / name
    return out


def stop_at(t_ns: int) -> M.Edit:
    def edit(bs: list[EpochBatch]) -> list[EpochBatch]:
        return [b for b in bs if b.t0_ns < t_ns]
    return edit


def stop_at_half(bs: list[EpochBatch]) -> list[EpochBatch]:
    return stop_at((bs[0].t0_ns + bs[-1].t0_ns) // 2)(bs)


def named(trace: Path) -> set[tuple[str, tuple[str, ...]]]:
    return {(str(v.kind), tuple(v.nodes)) for v in diagnose(trace).anomalies}


def test_a_healthy_nic_whose_capture_died_is_not_blamed(traces: dict[str, Path], tmp_path: Path) -> None:
    for node in ("node-01", "node-02"):
        t = M.copy(traces["healthy"], tmp_path / f"h-{node}")
        M.edit_nic(t, node, stop_at_half, nic="mlx5_1")
        assert named(t) == set(), node


def test_a_bystanders_dead_capture_does_not_move_the_culprit(traces: dict[str, Path], tmp_path: Path) -> None:
    culprit = read_truth(traces["nic-slow"])["culprit"]["nodes"][0]
    clean = named(traces["nic-slow"])
    assert clean == {("network-slow", (culprit,))}
    bystander = next(f"node-{i:02d}" for i in (2, 3, 0) if f"node-{i:02d}" != culprit)
    t = M.copy(traces["nic-slow"], tmp_path / "slow")
    M.edit_nic(t, bystander, stop_at_half, nic="mlx5_0")
    assert named(t) <= clean


def test_a_down_nic_that_published_nothing_is_still_found(traces: dict[str, Path], tmp_path: Path) -> None:
    truth = read_truth(traces["nic-down"])
    node, nic = truth["culprit"]["nics"][0].split("/")
    clean = named(traces["nic-down"])
    assert clean == {("network-stop", (node,))}
    t = M.copy(traces["nic-down"], tmp_path / "down")
    M.edit_nic(t, node, stop_at(int(truth["onset_ns"])), nic=nic)  # its capture saw nothing after
    assert named(t) == clean


def test_data_end_v3_round_trip_and_refusals() -> None:
    d = DataEnd(job="j", node="n", end_ns=5, nic_ends={"mlx5_0": 5, "mlx5_1": 2})
    raw = d.to_json()
    assert b'"v":3' in raw and decode_data_end(raw) == d
    v2 = DataEnd(job="j", node="n", end_ns=5, gaps={"lost_batches": 1})
    assert b'"v":2' in v2.to_json() and decode_data_end(v2.to_json()) == v2
    for bad in ({"mlx5_0": "x"}, {"": 1}, [1], {"a": 1.5}):
        with pytest.raises(DecodeError):
            decode_data_end(raw.replace(b'{"mlx5_0":5,"mlx5_1":2}', __import__("orjson").dumps(bad)))
    with pytest.raises(DecodeError):  # a v2 message may not carry v3's field
        decode_data_end(raw.replace(b'"v":3', b'"v":2'))


def test_data_end_v4_carries_each_nics_last_transmission() -> None:
    d = DataEnd(job="j", node="n", end_ns=9, nic_tx={"mlx5_0": 7})
    raw = d.to_json()
    assert b'"v":4' in raw and decode_data_end(raw) == d
    with pytest.raises(DecodeError):  # a v3 message may not carry v4's field
        decode_data_end(raw.replace(b'"v":4', b'"v":3'))
    with pytest.raises(DecodeError):
        decode_data_end(raw.replace(b'{"mlx5_0":7}', b'{"mlx5_0":"7"}'))
    v3 = DataEnd(job="j", node="n", end_ns=5, nic_ends={"mlx5_0": 5})
    assert b'"v":3' in v3.to_json()  # written at the lowest version that carries it


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3), st.integers(0, 2)), max_size=30),
       st.integers(0, 1 << 40), st.sampled_from([16_000, 128_000]))
def test_a_batch_knows_the_end_of_its_last_epoch_with_a_transmission(rows, t0, epoch_ns) -> None:
    b = EpochBatch(node="n", nic="mlx5_0", t0_ns=t0, epoch_ns=epoch_ns, batch_seq=0,
                   flow=np.array([r[1] for r in rows], np.uint32), epoch=np.array([r[0] for r in rows], np.uint32),
                   tx_bytes=np.array([r[2] for r in rows], np.uint32), rx_bytes=np.ones(len(rows), np.uint32))
    sent = [e for e, _f, tx in rows if tx > 0]
    assert b.tx_end_ns() == (t0 + (max(sent) + 1) * epoch_ns if sent else None)


def test_the_segment_stage_forwards_what_each_nic_last_transmitted() -> None:
    from pulse.engine.segment_stage import SegmentStage

    def batch(nic: str, seq: int, tx: list[int]) -> EpochBatch:
        n = len(tx)
        return EpochBatch(node="n", nic=nic, t0_ns=seq * 1_000_000, epoch_ns=100_000, batch_seq=seq,
                          flow=np.zeros(n, np.uint32), epoch=np.arange(n, dtype=np.uint32),
                          tx_bytes=np.array(tx, np.uint32), rx_bytes=np.full(n, 64, np.uint32), job="j")

    stage = SegmentStage()

    def ends(out) -> list[DataEnd]:
        return [f for v in out.forwards.values() for f in v if isinstance(f, DataEnd)]
    first = ends(stage.add(batches=[batch("mlx5_0", 0, [5, 0, 0]), batch("mlx5_1", 0, [0, 0, 9])]))
    assert first[-1].nic_tx == {"mlx5_0": 100_000, "mlx5_1": 300_000}
    # only what changed since: mlx5_1 received (a clear-to-send it never answered), sent nothing
    nxt = ends(stage.add(batches=[batch("mlx5_0", 1, [0, 5]), batch("mlx5_1", 1, [0, 0, 0])]))
    assert nxt[-1].nic_tx == {"mlx5_0": 1_200_000}


def test_a_dead_nic_is_named_by_its_silence_not_its_ring_neighbour(tmp_path: Path) -> None:
    # seed 4: the dead NIC's ring predecessor stalls at zero bytes first (no credit from
    # it), and "the node that sent the least" named that healthy predecessor; the dead
    # NIC transmitted nothing from before the operator's issue on, the predecessor's did
    simulate(SimConfig(scenario="nic-down", seed=4, **SIZE), tmp_path / "down")  # type: ignore[arg-type]
    truth = read_truth(tmp_path / "down")
    assert named(tmp_path / "down") == {("network-stop", tuple(truth["culprit"]["nodes"]))}
