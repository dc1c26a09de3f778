"""The streaming form under load: how many concurrent flows per NIC stream one core
segments in real time (``pulse bench segment --streaming``).

Load: one node, one NIC at line rate (400 Gb/s by default), ``flows`` bound send flows in
communicators of ``flows_per_op`` flows each (ring AllReduce, one flow per channel). At
any time about ``active`` flows carry data (a NIC at line rate shares its 1.6 MB per 32 µs
epoch among the flows transmitting in that epoch: ``active`` = line rate / bytes per
active flow-epoch), so the communicators take turns: each runs operators of 20-400
active epochs, separated by idle gaps that make its duty cycle ``active / flows``. The
segmenter gets the comm and flow events first, then op events (at their host issue
time) and epoch batches (when their window ends) merged in trace time, as a replay
delivers them. Figure: simulated seconds processed per wall second (real time >= 1).
Reference in the same run: the batch form (``segment_trace``) on the same input, whose
records the streaming form must equal.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from pulse.segmentation.association import associate
from pulse.segmentation.batch import segment_trace
from pulse.segmentation.streaming import NodeSegmenter

from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.samples import make_batch

NODE = "bench-00"
NIC = "mlx5_0"
LINE_BYTES_PER_S = 400e9 / 8


def streaming_load(flows: int, *, active: int = 64, flows_per_op: int = 64, seconds: float = 2.0,
                   epoch_ns: int = 32_000, window_ns: int = 10_000_000, seed: int = 0) -> dict[str, Any]:
    """Events and batches of the synthetic load (see the module docstring)."""
    rng = np.random.default_rng(seed)
    ncomm = max(1, flows // flows_per_op)
    fpo = flows // ncomm
    flows = ncomm * fpo
    active = min(active, flows)
    n_ep = int(seconds * 1e9 // epoch_ns)
    row_bytes = int(LINE_BYTES_PER_S * epoch_ns * 1e-9 / active)
    duty = active / flows
    nranks = 8
    events: list[Any] = []
    ops_ep: list[tuple[int, int, int, int]] = []  # (comm, seq, first epoch, length)
    for c in range(ncomm):
        comm = f"c{c:05d}"
        events.append(CommEvent(job="bench", node=NODE, pid=1, comm_id=comm, rank=0, nranks=nranks,
                                rings=[list(range(nranks))]))
        # first operator somewhere in the first mean cycle: the load is steady from the start
        t = int(rng.integers(0, max(1, int(210 / duty))))
        seq = 0
        while t < n_ep:
            length = int(rng.integers(20, 400))
            ops_ep.append((c, seq, t, min(length, n_ep - t)))
            seq += 1
            t += length + max(3, int(length * (1 / duty - 1) * rng.uniform(0.5, 1.5)))
    for c in range(ncomm):
        for ch in range(fpo):
            events.append(FlowEvent(job="bench", node=NODE, nic=NIC, flow=c * fpo + ch, comm_id=f"c{c:05d}",
                                    rank=0, peer=1, channel=ch, direction="send"))
    # expected bytes per flow follow from the op size: ring AllReduce 2(n-1)/n x S / channels
    size = row_bytes * 200 * fpo * nranks // (2 * (nranks - 1))
    ops = []
    for c, seq, t, _length in ops_ep:
        ops.append(OpEvent(job="bench", node=NODE, comm_id=f"c{c:05d}", rank=0, seq=seq, kind="AllReduce",
                           count=size // 4, dtype="float32", bytes=size // 4 * 4, algo="ring", nchannels=fpo,
                           nranks=nranks, t_host_ns=t * epoch_ns - 2 * epoch_ns))
    need = (associate([*events, ops[0]]).ops[(ops[0].comm_id, 0, ops[0].seq)].expected[0]) if ops else 0
    # rows: every flow of a running operator is active in each of its epochs; the op's
    # bytes are spread over its epochs so that each flow carries exactly its expected bytes
    f_parts, e_parts, b_parts = [], [], []
    for c, _seq, t, length in ops_ep:
        per = np.full(length, need // length, np.int64)
        per[: need - int(per.sum())] += 1
        f_parts.append(np.repeat(np.arange(c * fpo, (c + 1) * fpo, dtype=np.int64), length))
        e_parts.append(np.tile(np.arange(t, t + length, dtype=np.int64), fpo))
        b_parts.append(np.tile(per, fpo))
    f = np.concatenate(f_parts) if f_parts else np.zeros(0, np.int64)
    e = np.concatenate(e_parts) if e_parts else np.zeros(0, np.int64)
    b = np.concatenate(b_parts) if b_parts else np.zeros(0, np.int64)
    per_win = max(1, window_ns // epoch_ns)
    win = e // per_win
    order = np.lexsort((e, f, win))
    f, e, b, win = f[order], e[order], b[order], win[order]
    bounds = np.flatnonzero(np.diff(win)) + 1
    starts = np.concatenate(([0], bounds))
    ends = np.concatenate((bounds, [f.size]))
    batches = []
    for k, (s, x) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        w = int(win[s])
        batches.append(make_batch(node=NODE, nic=NIC, t0_ns=w * per_win * epoch_ns, epoch_ns=epoch_ns,
                                  batch_seq=k, flow=f[s:x], epoch=e[s:x] - w * per_win, tx_bytes=b[s:x],
                                  job="bench"))
    timeline = sorted([(op.t_host_ns, 0, i) for i, op in enumerate(ops)]
                      + [(bt.end_ns(), 1, i) for i, bt in enumerate(batches)])
    return {"setup": events, "ops": ops, "batches": batches, "timeline": timeline, "flows": flows,
            "active": active, "flows_per_op": fpo, "seconds": n_ep * epoch_ns / 1e9, "rows": int(f.size),
            "operators": len(ops), "row_bytes": row_bytes, "epoch_ns": epoch_ns, "window_ns": window_ns}


def _feed(load: dict[str, Any]) -> tuple[list[Any], float, NodeSegmenter]:
    seg = NodeSegmenter(NODE)
    ops, batches = load["ops"], load["batches"]
    t = time.perf_counter()
    out = seg.add_events(load["setup"])
    load["setup_s"] = time.perf_counter() - t  # one-off (communicator init): not in the figure
    t = time.perf_counter()
    pend: list[OpEvent] = []
    for _, kind, i in load["timeline"]:
        if kind == 0:
            pend.append(ops[i])  # descriptors that arrive together go in together
            continue
        if pend:
            out += seg.add_events(pend)
            pend = []
        out += seg.update(batches[i])
    if pend:
        out += seg.add_events(pend)
    out += seg.finish()
    return out, time.perf_counter() - t, seg


def _op_key(m: Any) -> tuple[str, int, int]:
    return (m.comm_id, m.rank, m.seq)


def measure_streaming(flows_list: list[int], *, active: int = 64, flows_per_op: int = 64, seconds: float = 2.0,
                      window_ms: float = 10.0, repeats: int = 1, seed: int = 0, check: bool = True) -> dict[str, Any]:
    results = []
    for flows in flows_list:
        load = streaming_load(flows, active=active, flows_per_op=flows_per_op, seconds=seconds,
                              window_ns=int(window_ms * 1e6), seed=seed)
        best = float("inf")
        out: list[Any] = []
        for _ in range(repeats):
            out, dt, _seg = _feed(load)
            best = min(best, dt)
        t = time.perf_counter()
        want = segment_trace(load["batches"], [*load["setup"], *load["ops"]])
        t_batch = time.perf_counter() - t
        same = sorted(out, key=_op_key) == sorted(want, key=_op_key) if check else None
        results.append({
            "flows_per_nic": load["flows"], "active_flows": load["active"], "flows_per_op": load["flows_per_op"],
            "simulated_s": load["seconds"], "rows": load["rows"], "operators": load["operators"],
            "mean_active_flows": load["rows"] / (load["seconds"] * 1e9 / load["epoch_ns"]),
            "batches": len(load["batches"]), "records": len(out), "stream_s": best, "setup_s": load["setup_s"],
            "realtime_factor": load["seconds"] / best, "rows_per_s": load["rows"] / best,
            "batch_form_s": t_batch, "batch_form_realtime_factor": load["seconds"] / t_batch,
            "stream_equals_batch": same, "complete": sum(m.complete for m in out),
        })
    ok = [r["flows_per_nic"] for r in results if r["realtime_factor"] >= 1.0]
    return {
        "bench": "segment-streaming", "epoch_ns": 32_000, "window_ms": window_ms, "line_gbps": 400,
        "runs": results, "max_realtime_flows_per_nic": max(ok) if ok else 0, "target_flows_per_nic": 20_000,
        "cores": 1,
        "reference": "batch form (segment_trace) on the same input in the same run; real time = 1.0",
    }
