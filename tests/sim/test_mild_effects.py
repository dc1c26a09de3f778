"""Every anomaly scenario, at the *mild* end of its severity range, physically slows the
traffic it affects (or the job), compared with the same seed healthy run.

Spans come from truth.segments (first to last epoch of an operator's bytes on a send flow):
the healthy and faulty runs share the job and its jitter, so the same (operator, sender,
receiver, rail) pairs up across the two runs.
"""

from __future__ import annotations

import collections
import filecmp
from pathlib import Path

import numpy as np
import pytest
from pulse.sim.config import SimConfig
from pulse.sim.run import simulate
from pulse.sim.scenarios import SCENARIOS

from pulse.trace import TraceReader, read_truth

SEED = 7
ONSET_MS = 100.0


def mild(name: str) -> float | None:
    sc = SCENARIOS[name]
    if sc.severity_range is None:
        return None
    lo, hi = sc.severity_range
    return hi if "remaining" in sc.severity_meaning else lo


@pytest.fixture(scope="session")
def healthy_moe(tmp_path_factory: pytest.TempPathFactory, small: dict) -> Path:
    out = tmp_path_factory.mktemp("sim") / "healthy-moe"
    simulate(SimConfig(**small, scenario="healthy", workload="moe", seed=SEED), out)
    return out


def _run(tmp_path: Path, small: dict, name: str, **kw: object) -> Path:
    out = tmp_path / name
    simulate(SimConfig(**{**small, "scenario": name, "seed": SEED, "severity": mild(name),
                          "onset_ms": ONSET_MS, **kw}), out)  # type: ignore[arg-type]
    return out


def _spans(out: Path) -> tuple[dict, dict]:
    """(comm, seq, src node, dst node, nic) -> (true start, span, ACT) of the operator's bytes
    on that edge (channels merged: earliest start, longest span, summed active time)."""
    truth = read_truth(out)
    tr = TraceReader(out)
    node_of: dict[tuple[str, int], str] = {}
    dst: dict[tuple[str, str, int], str] = {}
    events = list(tr.events())
    for e in events:
        if e.TYPE == "comm":
            node_of[(e.comm_id, e.rank)] = e.node
    for e in events:
        if e.TYPE == "flow" and e.direction == "send":
            dst[(e.node, e.nic, e.flow)] = node_of[(e.comm_id, e.peer)]
    active: dict[tuple[str, str, int], list[np.ndarray]] = collections.defaultdict(list)
    epoch_ns = truth["sim"]["epoch_ns"]
    for b in tr.batches():
        t = b.t0_ns + b.epoch.astype(np.int64) * b.epoch_ns
        for f in np.unique(b.flow[b.tx_bytes > 0]):
            if (b.node, b.nic, int(f)) in dst:
                active[(b.node, b.nic, int(f))].append(t[(b.flow == f) & (b.tx_bytes > 0)])
    starts = {k: np.sort(np.concatenate(v)) for k, v in active.items()}
    s = truth["segments"]
    off = truth["clock_offsets_ns"]
    spans: dict[tuple, tuple[int, int, int]] = {}
    for i in range(len(s["flow"])):
        if s["start_ns"][i] is None:
            continue
        node, nic, flow = s["node"][i], s["nic"][i], s["flow"][i]
        key = (s["comm_id"][i], s["seq"][i], node, dst[(node, nic, flow)], nic)
        ts = starts[(node, nic, flow)]
        act = int(np.searchsorted(ts, s["end_ns"][i]) - np.searchsorted(ts, s["start_ns"][i])) * epoch_ns
        start = s["start_ns"][i] - off[node]
        span = s["end_ns"][i] - s["start_ns"][i]
        old = spans.get(key)
        spans[key] = (min(start, old[0]), max(span, old[1]), act + old[2]) if old else (start, span, act)
    return truth, spans


def _slowdown(healthy: Path, faulty: Path, affected) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """Actual communication time (active epochs) of the affected operators after onset, summed,
    faulty over healthy: the same bytes took longer to move."""
    _, hs = _spans(healthy)
    truth, fs = _spans(faulty)
    onset = truth["onset_ns"]
    cul_nodes = set(truth["culprit"]["nodes"])
    cul_nics = {tuple(x.split("/")) for x in truth["culprit"]["nics"]}
    f = h = n = 0
    for key, (start, _span, act) in fs.items():
        if start < onset or key not in hs:
            continue
        _, _, src, dst, nic = key
        if affected(src, dst, nic, cul_nodes, cul_nics):
            f += act
            h += hs[key][2]
            n += 1
    assert n > 0, "no affected operator after onset"
    return f / h, n


def on_nic(src, dst, nic, nodes, nics):  # type: ignore[no-untyped-def]
    return (src, nic) in nics or (dst, nic) in nics


def on_node(src, dst, nic, nodes, nics):  # type: ignore[no-untyped-def]
    return src in nodes or dst in nodes


def into_node(src, dst, nic, nodes, nics):  # type: ignore[no-untyped-def]
    return dst in nodes and src not in nodes


def between(src, dst, nic, nodes, nics):  # type: ignore[no-untyped-def]
    return src in nodes and dst in nodes


# scenario -> (which traffic it affects, least slowdown of that traffic's ACT at mild severity)
TRAFFIC = {
    "nic-slow": (on_nic, 1.5),
    "packet-loss": (on_nic, 1.1),
    "pcie-slow": (on_node, 1.3),
    "congestion": (into_node, 1.4),
    "switch-congestion": (into_node, 1.4),
    "path-slow": (between, 1.5),
}


@pytest.mark.parametrize("name", sorted(TRAFFIC))
def test_mild_fault_slows_the_affected_traffic(name: str, healthy_trace: Path, small: dict,
                                               tmp_path: Path) -> None:
    affected, least = TRAFFIC[name]
    ratio, n = _slowdown(healthy_trace, _run(tmp_path, small, name), affected)
    assert ratio >= least, (name, mild(name), ratio, n)


def test_mild_moe_slow_nic_slows_its_all_to_all(healthy_moe: Path, small: dict, tmp_path: Path) -> None:
    ratio, n = _slowdown(healthy_moe, _run(tmp_path, small, "moe-slow-nic"), on_nic)
    assert ratio >= 1.5, (ratio, n)


def test_switch_congestion_hits_both_nodes_of_the_leaf(healthy_trace: Path, small: dict, tmp_path: Path) -> None:
    faulty = _run(tmp_path, small, "switch-congestion")
    truth = read_truth(faulty)
    a, b = truth["culprit"]["nodes"]
    for node in (a, b):
        ratio, _ = _slowdown(healthy_trace, faulty, lambda s, d, nic, nodes, nics, x=node: d == x and s not in nodes)
        assert ratio >= 1.4, (node, ratio)
    # communicators with no member under the leaf keep their pace
    touched = {e.comm_id for e in TraceReader(faulty).events() if e.TYPE == "comm" and e.node in (a, b)}
    far = {e.comm_id for e in TraceReader(faulty).events() if e.TYPE == "comm"} - touched
    assert far
    _, hs = _spans(healthy_trace)
    _, fs = _spans(faulty)
    keys = [k for k in fs if k[0] in far and k in hs and fs[k][0] >= truth["onset_ns"]]
    assert keys
    assert sum(fs[k][2] for k in keys) < 1.1 * sum(hs[k][2] for k in keys)


def test_severity_orders_the_slowdown(healthy_trace: Path, small: dict, tmp_path: Path) -> None:
    lo, hi = SCENARIOS["congestion"].severity_range  # type: ignore[misc]
    r_lo, _ = _slowdown(healthy_trace, _run(tmp_path / "lo", small, "congestion", severity=lo), into_node)
    r_hi, _ = _slowdown(healthy_trace, _run(tmp_path / "hi", small, "congestion", severity=hi), into_node)
    assert r_hi > 1.5 * r_lo > 2.1


def test_mild_nic_flap_stalls_the_nic_and_recurs(healthy_trace: Path, small: dict, tmp_path: Path) -> None:
    # first run: which NIC flaps (drawn from the seed); then put the first flap 300 us into
    # an AllReduce of that NIC's ring, so that it certainly catches an operator in flight
    probe = read_truth(_run(tmp_path / "probe", small, "nic-flap"))
    node, nic = probe["culprit"]["nics"][0].split("/")
    _, hs = _spans(healthy_trace)
    t0 = probe["sim"]["t0_true_ns"]
    ar = sorted(v[0] for k, v in hs.items() if k[0].startswith("dp") and k[2] == node and k[4] == nic)
    onset = next(x for x in ar if x > t0 + 100_000_000) + 300_000
    out = _run(tmp_path, small, "nic-flap", onset_ms=(onset - t0) / 1e6)
    truth = read_truth(out)
    d = truth["detail"]
    end = truth["sim"]["end_true_ns"]
    onset = truth["onset_ns"]
    windows = [(t, t + d["down_ns"]) for t in range(onset, end, d["period_ns"])]
    assert len(windows) >= 4
    off = truth["clock_offsets_ns"][node]
    bytes_in = collections.Counter()
    for b in TraceReader(out).batches():
        if (b.node, b.nic) != (node, nic) or not b.n_rows:
            continue
        t = b.t0_ns + b.epoch.astype(np.int64) * b.epoch_ns - off
        for i, (w0, w1) in enumerate(windows):
            inside = (t >= w0 + b.epoch_ns) & (t + 2 * b.epoch_ns <= w1)
            bytes_in[i] += int(b.tx_bytes[inside].sum() + b.rx_bytes[inside].sum())
    # while down, the NIC carries nothing at all (data nor flow-control messages)
    assert sum(bytes_in.values()) == 0, bytes_in
    # the AllReduce caught by the first flap: every edge of its ring, the culprit's and its
    # peers', waits for the NIC to come back, so the operator is stretched by the down time
    _, fs = _spans(out)
    w0, w1 = windows[0]
    caught = {k[:2] for k, v in fs.items() if k[2] == node and k[4] == nic and k[0].startswith("dp")
              and v[0] < w0 < v[0] + v[1]}
    assert caught
    for k, (start, span, _act) in fs.items():
        if k[:2] in caught:
            assert start + span >= w1, k
            assert span - hs[k][1] >= 0.5 * (w1 - w0), k


def test_mild_gpu_slow_stretches_the_job(healthy_trace: Path, small: dict, tmp_path: Path) -> None:
    faulty = read_truth(_run(tmp_path, small, "gpu-slow"))
    healthy = read_truth(healthy_trace)

    def length(t: dict) -> int:
        return t["sim"]["end_true_ns"] - t["sim"]["t0_true_ns"]

    onset = faulty["onset_ns"] - faulty["sim"]["t0_true_ns"]
    # compute x1.2 from onset on a job that is mostly compute
    assert length(faulty) - onset >= 1.1 * (length(healthy) - onset)


@pytest.mark.parametrize("name", ["nic-down", "gpu-hang"])
def test_stops_leave_operators_incomplete(name: str, small: dict, tmp_path: Path) -> None:
    truth = read_truth(_run(tmp_path, small, name))
    assert truth["sim"]["hung"]
    assert not all(truth["segments"]["complete"])


def test_mild_cpu_contention_launches_late(healthy_trace: Path, small: dict, tmp_path: Path) -> None:
    faulty = _run(tmp_path, small, "cpu-contention")
    truth = read_truth(faulty)
    node = truth["culprit"]["nodes"][0]

    def issued(out: Path) -> dict:
        off = read_truth(out)["clock_offsets_ns"]
        return {(e.comm_id, e.seq, e.rank): e.t_host_ns - off[e.node]
                for e in TraceReader(out).events() if e.TYPE == "op" and e.node == node}

    h, f = issued(healthy_trace), issued(faulty)
    late = [f[k] - h[k] for k in f if k in h and f[k] >= truth["onset_ns"]]
    # the starved launch thread adds ~Exp(300 us x 0.3/0.7) per operator, and it accumulates
    assert late and np.median(late) >= 100_000, np.median(late)


@pytest.mark.parametrize("name", ["switch-congestion", "nic-flap"])
def test_bursts_and_flaps_are_deterministic(name: str, small: dict, tmp_path: Path) -> None:
    kw = dict(small, steps=1, scenario=name, onset_ms=20.0, seed=3)
    a, b = tmp_path / "a", tmp_path / "b"
    simulate(SimConfig(**kw), a)  # type: ignore[arg-type]
    simulate(SimConfig(**kw), b)  # type: ignore[arg-type]
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files
    _match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert not mismatch and not errors
