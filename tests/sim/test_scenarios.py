"""Every scenario of the battery writes a valid trace at the default 64-GPU size."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
from pulse.sim.config import SimConfig
from pulse.sim.run import simulate
from pulse.sim.scenarios import SCENARIOS

from pulse.trace import TraceReader, read_truth

STEPS = 3
HANGS = {"nic-down", "gpu-hang"}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_writes_a_valid_trace_at_default_size(name: str, tmp_path: Path) -> None:
    out = tmp_path / name
    summary = simulate(SimConfig(scenario=name, seed=11, steps=STEPS, onset_ms=150.0), out)
    assert summary.gpus == 64 and summary.nics == 64 and summary.nodes == 8
    sc = SCENARIOS[name]
    tr = TraceReader(out)
    per_nic: dict = collections.defaultdict(list)
    rows = 0
    for b in tr.batches():
        per_nic[(b.node, b.nic)].append(b.batch_seq)
        rows += b.n_rows
        assert b.job == "sim"
    assert len(per_nic) == 64 and rows == summary.rows
    for seqs in per_nic.values():
        assert seqs == list(range(len(seqs)))
    kinds = collections.Counter(e.TYPE for e in tr.events())
    assert kinds["comm"] > 0 and kinds["flow"] > 0 and kinds["op"] > 0
    if sc.workload == "moe":
        assert any(e.TYPE == "op" and e.kind == "GroupP2P" for e in tr.events())
    truth = read_truth(out)
    assert truth["scenario"] == name and truth["kind"] == sc.kind and truth["level"] == sc.level
    assert truth["workload"] == sc.workload
    if name == "healthy":
        assert truth["culprit"]["nodes"] == []
    else:
        assert len(truth["culprit"]["nodes"]) == (2 if sc.level == "group" else 1)
        assert truth["culprit"]["ranks"]
    incomplete = [r for r in tr.oplevel() if r.end_ns is None]
    if name in HANGS:
        assert summary.hung and incomplete
        assert not all(truth["segments"]["complete"])
    else:
        assert not summary.hung and not incomplete
        assert all(truth["segments"]["complete"])


def test_moe_imbalance_is_natural(tmp_path: Path) -> None:
    out = tmp_path / "moe"
    simulate(SimConfig(scenario="healthy", workload="moe", seed=5, nodes=8, gpus_per_node=1, nics_per_node=1,
                       steps=1), out)
    sizes = [b for e in TraceReader(out).events() if e.TYPE == "op" and e.kind == "GroupP2P"
             for b in e.peer_send_bytes]
    assert len(sizes) > 50
    assert max(sizes) > 1.5 * min(sizes)
    ops = [e for e in TraceReader(out).events() if e.TYPE == "op" and e.kind == "GroupP2P"]
    by_op = collections.defaultdict(dict)
    for e in ops:
        by_op[(e.comm_id, e.seq)][e.rank] = e
    for ranks in by_op.values():
        for r, e in ranks.items():
            for q, sent in zip(e.peers, e.peer_send_bytes, strict=True):
                other = ranks[q]
                assert other.peer_recv_bytes[other.peers.index(r)] == sent


def test_a_dead_nic_carries_nothing_after_the_onset(tmp_path: Path) -> None:
    # neither data nor a clear-to-send: a receiver whose NIC is down cannot grant, and a
    # sender whose NIC is down never hears a grant (the simulator recorded both once, which
    # made a dead receiver look like one that granted: Pulse then blamed the sender)
    out = tmp_path / "down"
    simulate(SimConfig(scenario="nic-down", seed=3, nodes=8, gpus_per_node=2, nics_per_node=2, steps=4,
                       onset_ms=150.0), out)
    truth = read_truth(out)
    node, nic = truth["culprit"]["nics"][0].split("/")
    after = truth["onset_ns"] + truth["clock_offsets_ns"][node]
    tr = TraceReader(out)
    late_rows = 0
    for b in tr.batches():
        if b.node == node and b.nic == nic and b.n_rows:
            late_rows += int(((b.t0_ns + b.epoch.astype("int64") * b.epoch_ns) >= after).sum())
    assert late_rows == 0
