"""Batch form: a whole trace (all batches, all hook events) -> flow segments and metrics."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np
from pulse.segmentation import metrics as _metrics
from pulse.segmentation.association import Association, FlowKey, OpKey, associate
from pulse.segmentation.gather import active_epochs, gather
from pulse.segmentation.kernel import COMPLETE, run_kernel, volume_bounds
from pulse.segmentation.params import SegmentationError, SegmentParams, check_params
from pulse.segmentation.rows import NicClock, collect

from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.records import OpMetrics
from pulse.samples import EpochBatch
from pulse.settings import DEFAULT_EPOCH_NS


@dataclasses.dataclass
class FlowSegments:
    """One row per (send flow, operator it carries), columnar. Times on the node clock;
    ``end_ns`` is exclusive; rows with ``started`` False carry 0 for start/end."""

    node: list[str]
    nic: list[str]
    flow: np.ndarray
    comm_id: list[str]
    rank: np.ndarray
    seq: np.ndarray
    started: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    act_epochs: np.ndarray
    volume: np.ndarray
    expected: np.ndarray
    complete: np.ndarray
    epoch_ns: np.ndarray
    unbound_flows: list[FlowKey]
    """Flows with traffic (or a flow event) but no (comm, rank, peer, direction) binding."""
    extra_bytes: int
    """Data bytes on send flows beyond the last operator they were told about."""

    def __len__(self) -> int:
        return int(self.flow.shape[0])


@dataclasses.dataclass
class _Run:
    segments: FlowSegments
    slot_of: dict[tuple[FlowKey, int], int]
    start: np.ndarray
    end: np.ndarray
    vol: np.ndarray
    status: np.ndarray
    grant: np.ndarray
    slot_rows: tuple[np.ndarray, np.ndarray, np.ndarray]
    """(slot index, grid epoch, tx bytes) of every active epoch of every slot."""
    clocks: dict[str, NicClock]


def _run(batches: Iterable[EpochBatch], assoc: Association, params: SegmentParams) -> _Run:
    rows, clocks = collect(batches, params.burst_rx)
    nodes = {k[0] for k in rows} | {k[0] for k in assoc.flow_ops}
    for node in nodes:
        clocks.setdefault(node, NicClock(DEFAULT_EPOCH_NS, 0))
    unbound: set[FlowKey] = set(assoc.unbound)
    flows: list[FlowKey] = []
    ep_parts, by_parts, counts_parts = [], [], []
    nic_keys = sorted(set(rows) | {(k[0], k[1]) for k in assoc.flow_ops})
    empty = np.zeros(0, np.int64)
    for node, nic in nic_keys:
        fcol, ecol, bcol = rows.get((node, nic), (empty, empty, empty))
        present = np.unique(fcol)
        wanted = []
        for fid in present.tolist():
            b = assoc.bindings.get((node, nic, fid))
            if b is None:
                unbound.add((node, nic, fid))
            elif b.direction == "send":
                wanted.append(fid)
        wanted = sorted(set(wanted) | {k[2] for k in assoc.flow_ops if k[0] == node and k[1] == nic})
        if not wanted:
            continue
        w = np.array(wanted, np.int64)
        lo = np.searchsorted(fcol, w, "left")
        hi = np.searchsorted(fcol, w, "right")
        idx = gather(lo, hi - lo)
        ep_parts.append(ecol[idx])
        by_parts.append(bcol[idx])
        counts_parts.append(hi - lo)
        flows += [(node, nic, f) for f in wanted]
    ep = np.concatenate(ep_parts) if ep_parts else empty
    by = np.concatenate(by_parts) if by_parts else empty
    counts = np.concatenate(counts_parts) if counts_parts else empty
    row_ptr = np.zeros(len(flows) + 1, np.int64)
    np.cumsum(counts, out=row_ptr[1:])

    seq_lists = [assoc.flow_op_list(f) for f in flows]
    op_counts = np.array([len(s) for s, _ in seq_lists], np.int64)
    op_ptr = np.zeros(len(flows) + 1, np.int64)
    np.cumsum(op_counts, out=op_ptr[1:])
    seqs = np.concatenate([s for s, _ in seq_lists]) if seq_lists else empty
    need = np.concatenate([e for _, e in seq_lists]) if seq_lists else empty
    earliest = (np.concatenate([clocks[f[0]].earliest_epoch(assoc.flow_issue_times(f)) for f in flows])
                if flows else empty)
    thr, slack = volume_bounds(need, params.rel_tolerance, params.abs_tolerance)
    steps = np.concatenate([assoc.flow_op_steps(f) for f in flows]) if flows else empty
    fills = params.slot_fills(need, steps)
    flow_epoch = np.array([clocks[f[0]].epoch_ns for f in flows], np.int64)
    # The stall horizon is in epochs of each node's grid; nodes share one epoch length in
    # practice, but keep it exact by running per distinct epoch length.
    out = None
    for ens in np.unique(flow_epoch).tolist() or [DEFAULT_EPOCH_NS]:
        o = run_kernel(row_ptr, ep, by, op_ptr, need, thr, slack, gap=params.gap_epochs,
                       stall=params.stall_epochs(int(ens)), merge=params.merge_epochs(int(ens)),
                       final=True, earliest=earliest, burst_rx=params.burst_rx, fills=fills)
        if out is None:
            out = o
        else:
            sel = np.repeat(flow_epoch == ens, op_counts)
            for name in ("start", "end", "act", "vol", "status", "grant"):
                getattr(out, name)[sel] = getattr(o, name)[sel]
            fsel = flow_epoch == ens
            out.extra[fsel] = o.extra[fsel]
    assert out is not None

    slot_flow = np.repeat(np.arange(len(flows)), op_counts)
    nslots = int(op_ptr[-1])
    node_l, nic_l, comm_l = [], [], []
    rank = np.zeros(nslots, np.int64)
    fid = np.zeros(nslots, np.int64)
    slot_of: dict[tuple[FlowKey, int], int] = {}
    for i, fi in enumerate(slot_flow.tolist()):
        fk = flows[fi]
        b = assoc.bindings[fk]
        node_l.append(fk[0])
        nic_l.append(fk[1])
        comm_l.append(b.comm_id or "")
        rank[i] = b.rank or 0
        fid[i] = fk[2]
        slot_of[(fk, int(seqs[i]))] = i
    ens_slot = flow_epoch[slot_flow] if nslots else empty
    phase = np.array([clocks[f[0]].phase_ns for f in flows], np.int64)[slot_flow] if nslots else empty
    started = out.start >= 0
    start_ns = np.where(started, out.start * ens_slot + phase, 0)
    end_ns = np.where(started, (out.end + 1) * ens_slot + phase, 0)
    segs = FlowSegments(
        node=node_l, nic=nic_l, flow=fid, comm_id=comm_l, rank=rank, seq=seqs.astype(np.int64),
        started=started, start_ns=start_ns, end_ns=end_ns, act_epochs=out.act.copy(),
        volume=out.vol.copy(), expected=need.astype(np.int64), complete=out.status == COMPLETE,
        epoch_ns=ens_slot, unbound_flows=sorted(unbound), extra_bytes=int(out.extra.sum()))

    s_idx = np.flatnonzero(started)
    rep, act_ep, act_tx = active_epochs(ep, by, counts, slot_flow[s_idx], out.start[s_idx], out.end[s_idx])
    slot_rows = (s_idx[rep], act_ep, act_tx)
    return _Run(segs, slot_of, out.start, out.end, out.vol, out.status, out.grant, slot_rows, clocks)


def segment_flows(batches: Iterable[EpochBatch], association: Association,
                  params: SegmentParams | None = None) -> FlowSegments:
    """Segment every bound send flow of a whole trace into its operators."""
    if not isinstance(association, Association):
        raise SegmentationError(f"association must come from associate(), got {type(association).__name__}")
    return _run(batches, association, check_params(params)).segments


def metrics_from_run(run: _Run, assoc: Association) -> list[OpMetrics]:
    keys: list[OpKey] = sorted(assoc.ops)
    op_id = {k: i for i, k in enumerate(keys)}
    slot_op = np.full(len(run.segments), -1, np.int64)
    slots_per_op: list[list[int]] = []
    for k in keys:
        info = assoc.ops[k]
        sl = [run.slot_of[(f, k[2])] for f in info.flows]
        slot_op[sl] = op_id[k]
        slots_per_op.append(sl)
    srow, sep, stx = run.slot_rows
    act = _metrics.union_count(slot_op[srow], sep, len(keys))
    peak = _metrics.epoch_peaks(slot_op[srow], sep, stx, len(keys))
    out = []
    for i, k in enumerate(keys):
        info = assoc.ops[k]
        sa = np.array(slots_per_op[i], np.int64)
        out.append(_metrics.build(info, run.clocks[info.flows[0][0]], run.start[sa], run.end[sa],
                                  run.vol[sa], run.status[sa], int(act[i]), run.grant[sa], int(peak[i])))
    out.sort(key=_metrics.sort_key)
    return out


def segment_trace(batches: Iterable[EpochBatch], events: Iterable[CommEvent | FlowEvent | OpEvent],
                  params: SegmentParams | None = None) -> list[OpMetrics]:
    """Per operator per rank metrics of a whole trace, sorted by (node, comm, rank, seq)."""
    params = check_params(params)
    assoc = associate(events)
    return metrics_from_run(_run(batches, assoc, params), assoc)
