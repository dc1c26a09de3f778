"""`pulse lab run --no-hooks`: the lab job without the torch injection, diagnosed in
network-only mode (issue #21). The traffic-based warm-up cut is checked on the real lab
captures kept as fixtures; the run itself needs root and torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import orjson
import pytest
from pulse.lab.netonly_trace import traffic_cut

from pulse.errors import TraceError
from pulse.samples import make_batch
from pulse.trace import TraceReader

TRACES = Path(__file__).parents[1] / "engine" / "traces"
PULSE = [str(Path(sys.executable).with_name("pulse"))]


@pytest.mark.parametrize("name", ["lab-rate", "lab-loss"])
def test_step_period_read_off_the_traffic_matches_the_jobs_steps(name: str) -> None:
    """The fixtures start after the hooked warm-up cut, so their first healthy steps are the
    traffic's first seconds: the period found there must be the job's healthy step time (as
    the job printed it, read here only to check)."""
    run = json.loads((TRACES / name / "run.json").read_text())
    batches = list(TraceReader(TRACES / name).batches())
    cut = traffic_cut(batches, warmup_steps=2)
    healthy = [t for steps in run["step_ms"].values() for t in steps[2:run["fault_after"]]]
    assert 0.75 * np.median(healthy) <= cut.period_ns / 1e6 <= 1.25 * np.median(healthy), (cut, np.median(healthy))
    assert cut.cut_ns == cut.first_data_ns + 2 * cut.period_ns


def test_periodic_bursts_give_their_period_not_a_multiple() -> None:
    # 120 ms steps, each one 20 ms burst of 1 MB per ms, on one NIC; 256 us epochs
    epoch = 256_000
    rows = [(0, e) for s in range(16) for e in range(s * 120_000_000 // epoch, (s * 120_000_000 + 20_000_000) // epoch)]
    ep = np.array([e for _, e in rows], np.uint32)
    b = make_batch(node="n0", nic="eth0", t0_ns=5_000_000_000, epoch_ns=epoch, batch_seq=0, flow=np.zeros(ep.size, np.uint32),
                   epoch=ep, tx_bytes=np.full(ep.size, 256_000, np.uint32))
    cut = traffic_cut([b], warmup_steps=3)
    assert abs(cut.period_ns - 120_000_000) <= 1_000_000
    assert cut.first_data_ns == 5_000_000_000
    assert cut.cut_ns == cut.first_data_ns + 3 * cut.period_ns


def test_no_bulk_traffic_says_so() -> None:
    b = make_batch(node="n0", nic="eth0", t0_ns=0, epoch_ns=256_000, batch_seq=0, flow=np.zeros(3, np.uint32),
                   epoch=np.arange(3, dtype=np.uint32), tx_bytes=np.full(3, 100, np.uint32))
    with pytest.raises(TraceError, match="no bulk data"):
        traffic_cut([b], warmup_steps=2)


@pytest.mark.root
@pytest.mark.slow
def test_lab_run_without_hooks_sees_the_rate_limited_rank_and_blames_no_other(tmp_path: Path) -> None:
    """The job runs without the injection (no hook file is written at all); rank 2's egress
    is limited to 200 Mbit/s after step 6. Its capture alone must show node-02 sending at a
    fraction of its peers' rate, and whatever is named must be node-02, network. Whether
    node-02 is named at all is not asserted: its slow link 02->01 is Gloo's only data link
    from node-02 to node-01, and node-01 is on it too; node-02 is named only in the windows
    where its acknowledgements, queued behind its data in the shaper, also slow the link into
    it (8 of 13 measured runs; docs/lab.md, "Network-only runs")."""
    pytest.importorskip("torch")
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    from pulse.engine import diagnose
    from pulse.lab.analysis import lab_params

    keep = tmp_path / "k"
    proc = subprocess.run([*PULSE, "lab", "run", "--ranks", "4", "--fault", "rate:2:200mbit", "--steps", "16",
                           "--fault-after", "6", "--no-hooks", "--json", "--keep", str(keep)],
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(proc.stdout)
    run = json.loads((keep / "run.json").read_text())
    assert not (keep / "hooks").exists() and run["hooks"] is False
    events = [orjson.loads(ln) for ln in (Path(res["trace"]) / "hook-events.jsonl").read_bytes().splitlines()]
    assert events and all(e["type"] == "flow" and e.get("comm_id") is None for e in events)
    assert res["network_only"] and res["baseline"]["correct"] is None
    healthy_ms = res["step_ms"]["healthy_median"]
    assert 0.5 * healthy_ms <= res["traffic_cut"]["period_ms"] <= 2 * healthy_ms, res["traffic_cut"]
    # what network-only mode judged: each window's sending rates, node-02's far below the rest
    d = diagnose(res["trace"], lab_params(), network_only=True)
    by_window: dict[int, dict[str, float]] = {}
    for m in d.metrics:
        if m.start_ns >= run["onset_wall_ns"] and m.active_rate > 0:
            w = by_window.setdefault(m.start_ns, {})
            w[m.node] = min(w.get(m.node, np.inf), m.active_rate)
    ratios = [w["node-02"] / float(np.median([v for k, v in w.items() if k != "node-02"]))
              for w in by_window.values() if "node-02" in w and len(w) >= 3]
    assert len(ratios) >= 10 and float(np.median(ratios)) <= 0.25, ratios
    assert all(a["nodes"] == ["node-02"] and a["family"] == "network" for a in res["pulse"]["anomalies"]), res["pulse"]
    if not res["pulse"]["anomalies"]:
        assert res["pulse"]["status"] == "no node named from the traffic alone" and res["pulse"]["not_judged"]
