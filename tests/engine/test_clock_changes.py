"""A node's clock that is stepped or slewed mid-run (NTP/chrony corrections: ntpd slews up
to 500 us/s, chrony faster, a step when the offset grows too large) is not a fault: every
timestamp of that node moves together, which no rule may read as a late or slow node."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import mutators as M
import orjson
import pytest
from pulse.engine import diagnose
from pulse.sim import SimConfig, simulate

SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "pp": 1, "steps": 10}


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("clock")
    out = {}
    for workload in ("dense", "moe"):
        simulate(SimConfig(scenario="healthy", seed=2, workload=workload, **SIZE), root / workload)  # type: ignore[arg-type]
        out[workload] = root / workload
    return out


def _shift(trace: Path, node: str, offset: object) -> None:
    """Move every timestamp of ``node`` by ``offset(t)`` ns (batches by whole epochs)."""
    for p in sorted((trace / "samples" / node).glob("*.batches")):
        M.edit_nic(trace, node, lambda bs: [dataclasses.replace(b, t0_ns=b.t0_ns + offset(b.t0_ns) // b.epoch_ns  # type: ignore[operator]
                                                                 * b.epoch_ns) for b in bs], nic=p.stem)
    path = trace / "hook-events.jsonl"
    lines = []
    for line in path.read_bytes().splitlines():
        e = orjson.loads(line)
        if e.get("node") == node and "t_host_ns" in e:
            e["t_host_ns"] += offset(e["t_host_ns"])  # type: ignore[operator]
        lines.append(orjson.dumps(e))
    path.write_bytes(b"\n".join(lines) + b"\n")


def _middle(trace: Path) -> int:
    from pulse.trace import TraceReader

    t0s = sorted(b.t0_ns for b in TraceReader(trace).batches())
    return t0s[len(t0s) // 2]


def step(at: int, by: int) -> object:
    return lambda t: by if t >= at else 0


def slew(at: int, ns_per_s: float) -> object:
    return lambda t: int(ns_per_s * max(0, t - at) / 1e9)


@pytest.mark.parametrize("workload", ["dense", "moe"])
@pytest.mark.parametrize("change", ["step +2ms", "step -2ms", "slew 0.5ms/s", "slew 5ms/s"])
def test_a_clock_correction_on_a_healthy_node_is_no_anomaly(healthy: dict[str, Path], tmp_path: Path,
                                                            workload: str, change: str) -> None:
    t = M.copy(healthy[workload], tmp_path / "t")
    mid = _middle(t)
    kind, amount = change.split()
    if kind == "step":
        offset = step(mid, int(float(amount.rstrip("ms")) * 1_000_000))
    else:
        offset = slew(mid, float(amount.removesuffix("ms/s")) * 1_000_000)
    _shift(t, "node-02", offset)
    assert not diagnose(t).anomalies


def test_the_shift_moves_the_node(healthy: dict[str, Path], tmp_path: Path) -> None:
    """The mutation does what it says (else the test above proves nothing)."""
    t = M.copy(healthy["dense"], tmp_path / "t")
    before = {b.batch_seq: b.t0_ns for b in M.read_batch_file(M.nic_file(t, "node-02"))}
    _shift(t, "node-02", step(0, 2_000_000))
    after = {b.batch_seq: b.t0_ns for b in M.read_batch_file(M.nic_file(t, "node-02"))}
    assert after and all(after[k] - before[k] == 2_000_000 // 32_000 * 32_000 for k in after)
