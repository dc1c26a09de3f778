"""Send rates from a trace directory's epoch batches: per rank over every rail of the
compared operators, and per flow on the culprit nodes, in the report's window."""

from __future__ import annotations

import math

import numpy as np

from pulse.trace import TraceReader, read_batch_file

from .model import MAX_FLOW_CURVES, MAX_POINTS, Curve


def _bin_ns(span_ns: int, epoch_ns: int) -> int:
    epochs = max(1, math.ceil(span_ns / MAX_POINTS / epoch_ns))
    return epochs * epoch_ns


def epoch_curves(reader: TraceReader, flows: dict[tuple[str, str], dict[int, tuple[str, int]]],
                 culprits: set[str], primary_nics: set[str], w0: int, w1: int) -> tuple[list[Curve], list[Curve]]:
    """Per-rank and per-flow (culprit nodes) send rates in [w0, w1) from the epoch batches.

    ``flows`` maps (node, nic) -> {flow id: (comm, rank)} of the peer operators' send flows.
    Rows are binned with one ``bincount`` per batch over (flow index, bin) keys.
    """
    epoch_ns = int(reader.meta.get("epoch_ns") or 0)
    bin_ns = 0
    nbins = 0
    grids: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}
    for node, nic, path in reader.nic_files():
        wanted = flows.get((node, nic))
        if not wanted:
            continue
        ids = np.array(sorted(wanted), dtype=np.uint32)
        per_flow = np.zeros(0)
        for batch in read_batch_file(path):
            if batch.n_rows == 0:
                continue
            if bin_ns == 0:
                epoch_ns = epoch_ns or batch.epoch_ns
                bin_ns = _bin_ns(w1 - w0, epoch_ns)
                nbins = max(1, math.ceil((w1 - w0) / bin_ns))
                per_flow = np.zeros(0)
            if per_flow.size == 0:
                per_flow = np.zeros(ids.size * nbins)
            t = batch.t0_ns + batch.epoch.astype(np.int64) * batch.epoch_ns
            keep = (t >= w0) & (t < w1) & np.isin(batch.flow, ids)
            if not keep.any():
                continue
            idx = (t[keep] - w0) // bin_ns
            fidx = np.searchsorted(ids, batch.flow[keep])
            per_flow += np.bincount(fidx * nbins + idx, weights=batch.tx_bytes[keep].astype(np.float64),
                                    minlength=ids.size * nbins)
        if per_flow.size:
            grids[(node, nic)] = (ids, per_flow.reshape(ids.size, nbins))
    if bin_ns == 0:
        return [], []
    t_ms = np.arange(nbins, dtype=float) * bin_ns / 1e6
    scale = 8.0 / bin_ns  # bytes per bin -> Gb/s
    per_rank: dict[tuple[str, str, str, int], np.ndarray] = {}
    flow_rows: list[tuple[float, Curve]] = []
    for (node, nic), (ids, grid) in sorted(grids.items()):
        for i, f in enumerate(ids):
            comm, rank = flows[(node, nic)][int(f)]
            key = (node, nic, comm, rank)
            per_rank[key] = per_rank.get(key, 0) + grid[i]
            primary = not primary_nics or f"{node}/{nic}" in primary_nics
            if node in culprits and primary and grid[i].any():
                flow_rows.append((float(grid[i].sum()), Curve(
                    label=f"{node}/{nic} flow {int(f):#x} ({comm} r{rank})", node=node, t_ms=t_ms,
                    gbps=grid[i] * scale, culprit=True, flow=int(f), nic=nic)))
    rank_curves = [
        Curve(label=f"{node}/{nic} {comm} r{rank}", node=node, t_ms=t_ms, gbps=acc * scale,
              culprit=node in culprits, nic=nic,
              primary=node in culprits and (not primary_nics or f"{node}/{nic}" in primary_nics))
        for (node, nic, comm, rank), acc in sorted(per_rank.items())
        if acc.any()
    ]
    top = sorted(flow_rows, key=lambda x: -x[0])[:MAX_FLOW_CURVES]
    flow_curves = sorted((c for _, c in top), key=lambda c: (c.nic or "", c.flow or 0))
    return rank_curves, flow_curves
