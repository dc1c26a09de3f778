"""A lab run without the torch injection (``pulse lab run --no-hooks``) -> a trace directory
for network-only mode.

No hook file exists, so nothing here knows an operator, a step, a process group or a rank:
the trace holds the capture's per-flow epochs and its flow events (addresses only), as a
node's capture would publish them. What the lab still knows is which address is which node
(one namespace per node, as a deployment knows its hosts).

The warm-up cut comes from the traffic itself. With hooks the analysis starts at the first
operator after step ``warmup_steps - 1``; here DDP's construction (parameter broadcast) and
its bucket rebuild in step 0 are just the job's first bursts, so the cut is the first bulk
data plus ``warmup_steps`` step periods, the period read off the traffic's own periodicity
(autocorrelation of the job's bytes per millisecond over its first second). The harness's
step lines are not read for it (they are used for scoring and the report only).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from pulse.errors import TraceError
from pulse.samples import EpochBatch
from pulse.trace import TraceWriter

from .analysis import trim_before

NIC = "eth0"
BIN_NS = 1_000_000
"""Bins of the job's bytes for the period search: a step is 100s of ms, a bucket's
AllReduce a few ms."""
BULK_BYTES = 64 * 1024
"""A millisecond carrying this much is data, not the rendezvous store's messages (< 1 kB)."""
PERIOD_SPAN_NS = 1_000_000_000
"""Traffic searched for the step period, from the first bulk data: the steps before any
fault (the lab's default injects after 6 steps of 110-170 ms), not the rest of the run, where
a fault stretches the steps. Measured on 4 --no-hooks runs and the 2 kept captures: 2 s
took in a 200 Mbit/s fault's 580 ms steps and, unsmoothed, found 23 ms (a gradient bucket's
AllReduce) for 117 ms steps; 1 s smoothed over 10 ms is within 16 % of the job's printed
step time on all six (the worst: 135 ms for 117)."""
SMOOTH_NS = 10_000_000
"""Moving average before the autocorrelation: a step's several bucket AllReduces, a few ms
apart, must not correlate as a period of their own."""
MIN_PERIOD_NS = 20_000_000
MAX_PERIOD_NS = PERIOD_SPAN_NS // 2
PEAK_SHARE = 0.8
"""The period is the shortest lag whose autocorrelation reaches this share of the highest:
multiples of the period correlate as well, and must not be taken for it."""


@dataclasses.dataclass
class TrafficCut:
    first_data_ns: int
    period_ns: int
    cut_ns: int
    correlation: float
    """autocorrelation at the period (1.0: perfectly periodic)"""

    def to_dict(self) -> dict[str, Any]:
        return {"first_data_ns": self.first_data_ns, "period_ms": round(self.period_ns / 1e6, 1),
                "cut_ns": self.cut_ns, "correlation": round(self.correlation, 3)}


def job_bytes_per_bin(batches: list[EpochBatch], bin_ns: int = BIN_NS) -> tuple[int, np.ndarray]:
    """Every NIC's sent bytes summed into bins of ``bin_ns`` (the lab's nodes share one clock):
    (start of bin 0, bytes per bin)."""
    times = [b.t0_ns + b.epoch.astype(np.int64) * b.epoch_ns for b in batches if b.n_rows]
    if not times:
        raise TraceError("the capture holds no traffic: nothing to cut or diagnose")
    t = np.concatenate(times)
    w = np.concatenate([b.tx_bytes.astype(np.float64) for b in batches if b.n_rows])
    t0 = int(t.min()) // bin_ns * bin_ns
    return t0, np.bincount((t - t0) // bin_ns, weights=w)


def traffic_cut(batches: list[EpochBatch], warmup_steps: int) -> TrafficCut:
    """Where the analysis starts: the first bulk data + ``warmup_steps`` periods of the job's
    traffic."""
    t0, per_bin = job_bytes_per_bin(batches)
    bulk = np.flatnonzero(per_bin >= BULK_BYTES)
    if bulk.size == 0:
        raise TraceError("the capture holds no bulk data (no millisecond with 64 kB): no job traffic")
    start = int(bulk[0])
    x = per_bin[start:start + PERIOD_SPAN_NS // BIN_NS]
    k_smooth = max(SMOOTH_NS // BIN_NS, 1)
    x = np.convolve(x, np.ones(k_smooth) / k_smooth, mode="same")
    lo, hi = MIN_PERIOD_NS // BIN_NS, min(MAX_PERIOD_NS // BIN_NS, x.size // 2)
    if hi <= lo:
        raise TraceError(f"{x.size} ms of job traffic: too short to find its step period")
    x = x - x.mean()
    denom = float(np.dot(x, x))
    if denom <= 0:
        raise TraceError("the job's traffic is flat: no step period to find")
    # normalised by the overlap, so long lags are not penalised for their shorter overlap
    ac = np.array([np.dot(x[:-k], x[k:]) / (x.size - k) for k in range(lo, hi + 1)]) / (denom / x.size)
    peaks = [i for i in range(1, ac.size - 1) if ac[i] >= ac[i - 1] and ac[i] >= ac[i + 1]]
    if not peaks:
        raise TraceError("the job's traffic shows no step period")
    best = max(ac[i] for i in peaks)
    k = next(i for i in peaks if ac[i] >= PEAK_SHARE * best)
    period = (k + lo) * BIN_NS
    first = t0 + start * BIN_NS
    return TrafficCut(first, period, first + warmup_steps * period, float(ac[k]))


@dataclasses.dataclass
class NetOnlyPrepared:
    trace_dir: Path
    cut: TrafficCut
    capture: dict[str, Any]


def prepare_netonly_trace(pcap: Path, nodes: dict[str, str], out: Path, *, epoch_ns: int, warmup_steps: int,
                          job: str = "lab", truth: dict[str, Any] | None = None) -> NetOnlyPrepared:
    """Convert the capture, name each address's node, cut the warm-up found in the traffic,
    write a trace directory at ``out`` with no descriptor in it."""
    from pulse.nic.convert import convert_file

    node_of_addr = {a: name for name, a in nodes.items()}
    conv = convert_file(pcap, epoch_ns=epoch_ns, job=job)
    batches = [dataclasses.replace(b, node=node_of_addr[b.node], nic=NIC)
               for b in conv.batches if b.node in node_of_addr]
    cut = traffic_cut(batches, warmup_steps)
    events = [dataclasses.replace(e, node=node_of_addr[e.node], nic=NIC, job=job, source="lab-capture")
              for e in conv.events if e.node in node_of_addr]
    out.mkdir(parents=True, exist_ok=True)
    with TraceWriter(out, job=job, epoch_ns=epoch_ns, replace=True,
                     meta={"source": "lab", "hooks": False, "traffic_cut": cut.to_dict()}) as tw:
        for b in batches:
            tw.write_batch(trim_before(b, cut.cut_ns))
        tw.write_events(events)
        if truth is not None:
            tw.write_truth(truth)
    summary = {k: conv.summary[k] for k in ("packets", "skipped", "batches")}
    summary["retransmitted_packets"] = int(sum(f.get("retransmitted_packets", 0) for f in conv.summary["flows"]))
    return NetOnlyPrepared(out, cut, summary)
