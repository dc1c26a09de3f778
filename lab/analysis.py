"""A lab run's capture and hook files -> a Pulse trace directory -> verdicts.

What the lab knows that a real deployment learns elsewhere, and nothing more:

* **which address is which node** (each namespace is a node with one address), so a
  captured packet is ``tx`` on its source node's NIC and ``rx`` on its destination's;
* **which TCP connections are the job's**: every connection between two lab nodes except
  the rendezvous store's (MASTER_PORT); a Gloo process group keeps one connection per pair
  of ranks, carrying both directions, so each direction is one Pulse flow: ``send`` on the
  sender's node, ``recv`` on the receiver's;
* **the ring order** Gloo's ring AllReduce uses, read off the capture: each rank's data goes
  to one peer (the one it sent the most bytes to), and these hops form one cycle; it is
  published as the comm's ``rings`` so segmentation knows which send flow carries a rank's
  share (``2(n-1)/n x S``);
* **where the warm-up ends**: DDP's construction (parameter broadcast, shape check) and its
  bucket rebuild after the first step are collectives the C++ reducer issues without any
  Python entry point, so no op event describes them. Their bytes would be taken for the
  first described operators; the analysis therefore starts at the first operator every
  rank issued after the end of step ``warmup_steps - 1`` (from the job's own step lines),
  and drops earlier traffic on each node and earlier op/oplevel records on every rank.

Nothing here reads the fault: the truth is written to ``truth.json`` for the scorer only.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from pulse.errors import ConfigError, TraceError
from pulse.events import CommEvent, FlowEvent, OpEvent, decode
from pulse.records import OpLevel, Verdict, decode_oplevel, kind_family
from pulse.samples import EpochBatch
from pulse.settings import DEFAULT_EPOCH_NS
from pulse.trace import TraceWriter

NIC = "eth0"
TRUTH_KIND = {"rate": "network-slow", "loss": "network-slow", "cpu": "compute-slow"}


@dataclasses.dataclass
class LabInput:
    """What the analysis needs from a lab run (see :class:`pulse.lab.runner.LabRun`)."""

    pcap: Path
    hook_dir: Path
    nodes: dict[str, str]
    """node name -> IPv4 address"""
    ranks: dict[int, str]
    """rank -> node name"""
    step_end_ns: dict[int, list[int]]
    master_port: int
    job: str = "lab"


@dataclasses.dataclass
class Prepared:
    trace_dir: Path
    ring: list[int]
    first_seq: int
    ops: int
    flows_bound: int
    capture: dict[str, Any]


def read_hook_files(hook_dir: Path) -> tuple[list[CommEvent | FlowEvent | OpEvent], list[OpLevel]]:
    events: list[Any] = []
    oplevel: list[OpLevel] = []
    for p in sorted(hook_dir.glob("torch-*.jsonl")):
        for i, line in enumerate(p.read_bytes().splitlines(), 1):
            if line.strip():
                events.append(decode(line, f"{p}:{i}"))
    for p in sorted(hook_dir.glob("oplevel-*.jsonl")):
        for i, line in enumerate(p.read_bytes().splitlines(), 1):
            if line.strip():
                oplevel.append(decode_oplevel(line, f"{p}:{i}"))
    return events, oplevel


def job_comm(events: list[Any], n_ranks: int) -> str:
    """The process group every rank is in (the job's WORLD)."""
    members: dict[str, set[int]] = defaultdict(set)
    for e in events:
        if isinstance(e, CommEvent) and e.nranks == n_ranks and e.rank is not None:
            members[e.comm_id].add(e.rank)
    full = [c for c, m in members.items() if len(m) == n_ranks]
    if not full:
        raise TraceError(f"no process group with all {n_ranks} ranks in the hook events "
                         "(is the torch injection on the job's PYTHONPATH?)")
    return sorted(full)[0]


def first_seq_after_warmup(ops: list[OpEvent], step_end_ns: dict[int, list[int]], warmup_steps: int) -> int:
    """The first seq that every rank issued after its own step ``warmup_steps - 1`` ended."""
    if warmup_steps <= 0:
        return min((o.seq for o in ops), default=0)
    first = 0
    by_rank: dict[int, list[OpEvent]] = defaultdict(list)
    for o in ops:
        if o.rank is not None:
            by_rank[o.rank].append(o)
    for rank, lst in by_rank.items():
        ends = step_end_ns.get(rank) or []
        if len(ends) < warmup_steps:
            raise ConfigError(f"rank {rank} printed {len(ends)} steps; the warm-up needs {warmup_steps}")
        cut = ends[warmup_steps - 1]
        later = [o.seq for o in lst if o.t_host_ns is not None and o.t_host_ns > cut]
        if not later:
            raise ConfigError(f"rank {rank} issued no operator after its warm-up")
        first = max(first, min(later))
    return first


def infer_ring(sent: dict[tuple[int, int], int], n: int) -> list[int]:
    """Ring order from the bytes each rank sent to each peer: each rank's main peer is its
    ring successor; they must form one cycle over all ranks."""
    nxt = {}
    for r in range(n):
        cands = [(b, p) for (s, p), b in sent.items() if s == r]
        if not cands:
            raise TraceError(f"rank {r} sent nothing to any peer: cannot tell the ring order")
        nxt[r] = max(cands)[1]
    ring = [0]
    while len(ring) < n:
        ring.append(nxt[ring[-1]])
    if len(set(ring)) != n or nxt[ring[-1]] != 0:
        raise TraceError(f"the ranks' main send peers {nxt} do not form one ring")
    return ring


def trim_before(b: EpochBatch, cut_ns: int) -> EpochBatch:
    """Drop rows of epochs that start before cut_ns."""
    keep = b.t0_ns + b.epoch.astype(np.int64) * b.epoch_ns >= cut_ns
    if keep.all():
        return b
    return dataclasses.replace(b, flow=b.flow[keep], epoch=b.epoch[keep], tx_bytes=b.tx_bytes[keep],
                               rx_bytes=None if b.rx_bytes is None else b.rx_bytes[keep])


def prepare_trace(inp: LabInput, out: Path, *, epoch_ns: int = DEFAULT_EPOCH_NS, warmup_steps: int = 2,
                  truth: dict[str, Any] | None = None) -> Prepared:
    """Convert the capture, bind flows, cut the warm-up, write a trace directory at ``out``."""
    from pulse.nic.convert import convert_file

    n = len(inp.ranks)
    rank_of_addr = {inp.nodes[name]: r for r, name in inp.ranks.items()}
    node_of_addr = {a: name for name, a in inp.nodes.items()}
    events, oplevel = read_hook_files(inp.hook_dir)
    comm_id = job_comm(events, n)
    ops = [e for e in events if isinstance(e, OpEvent) and e.comm_id == comm_id]
    first = first_seq_after_warmup(ops, inp.step_end_ns, warmup_steps)
    cut = {inp.ranks[o.rank]: int(o.t_host_ns or 0) for o in ops if o.seq == first and o.rank is not None}
    if len(cut) != n:
        raise TraceError(f"operator seq {first} is missing on some ranks: {sorted(cut)}")

    conv = convert_file(inp.pcap, epoch_ns=epoch_ns, job=inp.job)
    # One Gloo connection per rank pair; each direction is a flow. The rendezvous store's
    # connections (MASTER_PORT) are the launcher's, not the job's collectives'.
    conns: dict[tuple[int, int], tuple[int, str, int, str, int]] = {}
    for f in conv.summary["flows"]:
        if f.get("transport") != "tcp" or f["node"] != f["src"]:
            continue
        if inp.master_port in (f["sport"], f["dport"]):
            continue
        s, d = rank_of_addr.get(f["src"]), rank_of_addr.get(f["dst"])
        if s is None or d is None or s == d:
            continue
        key = (s, d)
        cand = (int(f["tx_bytes"]), f["src"], f["sport"], f["dst"], f["dport"])
        if key not in conns or cand > conns[key]:
            conns[key] = cand
    ring = infer_ring({k: v[0] for k, v in conns.items()}, n)
    tuples = {(v[1], v[2], v[3], v[4]): k for k, v in conns.items()}

    bound_events: list[FlowEvent] = []
    for ev in conv.events:
        pair = tuples.get((ev.src, ev.sport, ev.dst, ev.dport))
        node = node_of_addr.get(ev.node)
        if node is None:
            continue
        common = dict(node=node, nic=NIC, job=inp.job, source="lab-capture")
        if pair is None:
            bound_events.append(dataclasses.replace(ev, **common))
            continue
        s, d = pair
        if ev.node == ev.src:
            bound_events.append(dataclasses.replace(ev, **common, comm_id=comm_id, rank=s, peer=d, channel=0,
                                                    direction="send"))
        else:
            bound_events.append(dataclasses.replace(ev, **common, comm_id=comm_id, rank=d, peer=s, channel=0,
                                                    direction="recv"))

    out.mkdir(parents=True, exist_ok=True)
    kept_ops = 0
    with TraceWriter(out, job=inp.job, epoch_ns=epoch_ns, replace=True,
                     meta={"source": "lab", "ring": ring, "first_seq": first, "comm_id": comm_id}) as tw:
        for b in conv.batches:
            node = node_of_addr.get(b.node)
            if node is None:
                continue
            tw.write_batch(trim_before(dataclasses.replace(b, node=node, nic=NIC), cut[node]))
        for e in events:
            if isinstance(e, CommEvent):
                tw.write_event(e)
                if e.comm_id == comm_id:
                    tw.write_event(dataclasses.replace(e, rings=[ring], source="lab:gloo-ring"))
            elif isinstance(e, OpEvent) and (e.comm_id != comm_id or e.seq >= first):
                # No algo is set: segmentation takes a comm that published rings and no
                # trees for a ring, even over Gloo's full mesh of connections.
                tw.write_event(e)
                kept_ops += 1
        tw.write_events(bound_events)
        for rec in oplevel:
            if rec.comm_id != comm_id or rec.seq >= first:
                tw.write_oplevel(rec)
        if truth is not None:
            tw.write_truth(truth)
    summary = {k: conv.summary[k] for k in ("packets", "skipped", "batches")}
    summary["retransmitted_packets"] = int(sum(f.get("retransmitted_packets", 0) for f in conv.summary["flows"]))
    return Prepared(out, ring, first, kept_ops, sum(1 for e in bound_events if e.bound), summary)


def truth_of(fault: Any, ranks: dict[int, str], onset_ns: int | None) -> dict[str, Any]:
    if fault.kind == "none":
        return {"scenario": "healthy", "culprit": {"nodes": [], "ranks": []}, "level": None, "kind": None,
                "onset_ns": None}
    return {"scenario": fault.text, "culprit": {"nodes": [ranks[fault.rank]], "ranks": [fault.rank]},
            "level": "node", "kind": TRUTH_KIND[fault.kind], "onset_ns": onset_ns}


def summarize_verdicts(verdicts: list[Verdict]) -> dict[str, Any]:
    """The anomalies of a run: its incidents, in order of first appearance, each with its
    first verdict's times (trace time)."""
    from pulse.localization.incidents import group_incidents

    anomalies = [{"kind": inc.kind, "family": kind_family(inc.kind), "nodes": list(inc.first.nodes),
                  "level": inc.level, "count": inc.count, "confidence": inc.confidence,
                  "first_seen_ns": inc.first.first_seen_ns,
                  "decided_ns": (inc.first.window or {}).get("decided_at_ns")}
                 for inc in group_incidents(verdicts)]
    if not anomalies:
        status = "healthy" if any(v.status == "healthy" for v in verdicts) or not verdicts else \
            verdicts[-1].status
        return {"status": status, "anomalies": []}
    return {"status": "anomaly", "anomalies": anomalies}


def judge(summary: dict[str, Any], truth: dict[str, Any]) -> bool:
    """Right answer: no anomaly on a healthy run; otherwise every anomaly names exactly the
    culprit node with the right kind family."""
    if truth["kind"] is None:
        return not summary["anomalies"]
    want = set(truth["culprit"]["nodes"])
    fam = kind_family(truth["kind"])
    return bool(summary["anomalies"]) and all(
        set(a["nodes"]) == want and a["family"] == fam for a in summary["anomalies"])


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=False, default=str)


LAB_EPOCH_NS = 256_000
"""Epoch of the lab's per-flow byte counts: 256 us, not Pulse's default 32 us.

The host's tbf does not pace a 2 Gbit/s limit the way a slower NIC would: on a loaded
2-core host its wake-ups come late and each releases frames at veth speed (~3 Gbit/s), so
the throttled sender's traffic is line-rate bursts with idle gaps of tens of us. ACT counts
active epochs only, and at 32 us those gaps fall out of it: measured on 6 runs of
``rate:R:2gbit``, the culprit's ACT over the 25th percentile of its shape was 1.08-1.11
(median per run) with an active rate of 2.7-3.3 Gbit/s, the same as its peers and inside
healthy noise (12 healthy runs: p90 1.11-1.19). At 256 us the gaps fall inside active epochs and
ACT measures the slower link: culprit median 1.53-1.60 (10th percentile 1.42-1.52), active
rate ~1.1-1.2 Gbit/s vs 1.6-2.0 for its peers, while the loss fault's signal (retransmission
and cwnd stalls of ms) is about the same as at 32 us (1-2 % loss, 7 runs: median
1.26-1.45 at 256 us, 1.26-1.42 at 32 us) and 200 Mbit/s stays ~12x. The cost: a CPU-starved
rank's ring predecessor stalls on its receive window in bursts that 256 us epochs count
(docs/lab.md, "CPU quota at 256 us"). 128 us sits in between (2 Gbit
culprit median 1.18) and would need act_ratio 1.2, at the healthy runs' p90-p99."""

LAB_LATE_MIN_NS = 60_000_000
"""Compute fail-slow threshold for the lab: 4 ranks sharing 2 cores arrive at a collective
tens of ms apart for no reason but the scheduler (±13 % step noise), and one rank can stay
unlucky for a few steps; the default 5 ms is meant for a GPU job."""

LAB_PERSIST_OPS = 5
"""Outlier operators (of the 12 in the window) before a slow link alarms, instead of 4.

This is the healthy run's false network-slow alarm. A rank the scheduler keeps preempting
while it sends has a long ACT for a few operators in a row. Gloo keeps a connection to every
peer (each bound as a send flow), so each such operator marks all three of the rank's links
slow at once, and the localizer's two-slow-links condition holds at the first persistent
outlier. Measured at 256 us on 33 kept runs (12 healthy): in the healthy runs operators'
ACT over the reference has p90 1.14-1.26 and p99 1.22-1.42 per run; in one of them rank 3 was at
1.31-1.38 (19.7-20.2 ms against 14.3-15.5 ms) in 4 operators of 12 (seq 12, 18, 19 and one
more): network-slow node-03 with the default 4, nothing with 5. A faulty rank is an outlier
(>= 1.3 and the largest ACT) in 100 % of the operators after the onset at 2 Gbit/s and in
34-83 % at 1-2 % loss; the 34 % run (loss:3:2) is missed with 6, caught with 5."""


def lab_params() -> Any:
    """Localizer parameters for the lab (docs/lab.md): the lateness threshold and the
    persistence differ from the defaults; the ACT ratio is the default's."""
    from pulse.localization import LocalizeParams

    return LocalizeParams(late_min_ns=LAB_LATE_MIN_NS, persist_ops=LAB_PERSIST_OPS)


NETONLY_NO_NODE = "no node named from the traffic alone"
NETONLY_NOT_JUDGED = ("compute faults (a slow or starved rank, lateness) cannot be judged without issue times; "
                      "a slow link is blamed on a node only when that node is on every slow link (in a ring with "
                      "one NIC per node, one slow link leaves both its ends equally suspect)")
"""What a network-only lab run says when it names nobody: what was and was not judged,
never "healthy" (docs/lab.md, "Network-only runs")."""


def analyze_run(run: Any, out: Path, *, epoch_ns: int = LAB_EPOCH_NS, warmup_steps: int = 2,
                params: Any = None, no_hooks: bool | None = None) -> dict[str, Any]:
    """Trace directory + Pulse + baseline for a finished lab run -> a JSON-able result.

    ``no_hooks`` (default: the run's own ``hooks`` flag) analyses in network-only mode: the
    warm-up cut from the traffic, operators inferred from it, no baseline (it needs the
    descriptors' operator start/end)."""
    from pulse.engine import diagnose

    network_only = (not getattr(run, "hooks", True)) if no_hooks is None else no_hooks
    truth = truth_of(run.fault, run.ranks, run.onset_wall_ns)
    extra: dict[str, Any] = {}
    if network_only:
        from pulse.lab.netonly_trace import prepare_netonly_trace

        nprep = prepare_netonly_trace(run.pcap, run.nodes, out, epoch_ns=epoch_ns, warmup_steps=warmup_steps,
                                      truth=truth)
        res = diagnose(nprep.trace_dir, params if params is not None else lab_params(), network_only=True)
        trace_dir, capture = nprep.trace_dir, nprep.capture
        extra = {"network_only": True, "traffic_cut": nprep.cut.to_dict(), "first_seq": None, "ring": None}
    else:
        inp = LabInput(pcap=run.pcap, hook_dir=run.hook_dir, nodes=run.nodes, ranks=run.ranks,
                       step_end_ns=run.step_end_ns, master_port=run.master_port)
        prep = prepare_trace(inp, out, epoch_ns=epoch_ns, warmup_steps=warmup_steps, truth=truth)
        res = diagnose(prep.trace_dir, params if params is not None else lab_params(), baseline=True)
        trace_dir, capture = prep.trace_dir, prep.capture
        extra = {"network_only": False, "first_seq": prep.first_seq, "ring": prep.ring}
    pulse_sum = summarize_verdicts(res.verdicts)
    if network_only and not pulse_sum["anomalies"]:
        pulse_sum["status"] = NETONLY_NO_NODE
        pulse_sum["not_judged"] = NETONLY_NOT_JUDGED
    base_sum = summarize_verdicts(res.baseline or [])
    if network_only:
        base_sum = {"status": "not run (no descriptors)", "anomalies": []}
    scored = score_run(res.verdicts, res.baseline or [], truth)
    for part in (pulse_sum, base_sum):
        for a in part["anomalies"]:
            # first_seen and decided are trace time (node clock = wall clock here), onset the
            # harness's: the first operator showing it, and the data the first verdict came on
            on = run.onset_wall_ns
            a["after_onset_ms"] = None if on is None else round((a["first_seen_ns"] - on) / 1e6, 1)
            a["decided_after_onset_ms"] = (None if on is None or a["decided_ns"] is None
                                           else round((a["decided_ns"] - on) / 1e6, 1))
    healthy_ms = [t for r in run.step_ms.values() for t in r[warmup_steps:_fault_step(run)]]
    faulty_ms = [t for r in run.step_ms.values() for t in r[_fault_step(run):]] if run.fault.kind != "none" else []
    return {
        "fault": run.fault.text,
        "truth": {"nodes": truth["culprit"]["nodes"], "kind": truth["kind"], "family": kind_family(truth["kind"])},
        "pulse": {**pulse_sum, "correct": judge(pulse_sum, truth)},
        "baseline": {**base_sum, "correct": None if network_only else judge(base_sum, truth)},
        "trace": str(trace_dir),
        "operators": len(res.metrics),
        **extra,
        "epoch_ns": epoch_ns,
        "capture": {**capture, "kernel_drops": run.capture_drops},
        "step_ms": {"healthy_median": _median(healthy_ms), "faulty_median": _median(faulty_ms),
                    "healthy_slowest": _slowest_step(run, warmup_steps)},
        "fault_effect": getattr(run, "fault_effect", None),
        **scored,
    }


def score_run(verdicts: list[Verdict], baseline: list[Verdict], truth: dict[str, Any]) -> dict[str, Any]:
    """Pulse's and the baseline's verdicts scored as the simulator's runs are
    (:func:`pulse.localization.score`: every incident, first-incident figures beside)."""
    from pulse.localization import score

    return {"score": score(verdicts, truth, method="pulse").to_dict(),
            "baseline_score": score(baseline, truth, method="baseline").to_dict()}


def _fault_step(run: Any) -> int:
    steps = max((len(v) for v in run.step_ms.values()), default=0)
    return steps if run.fault.kind == "none" else getattr(run, "fault_after", steps)


def _slowest_step(run: Any, warmup_steps: int) -> float | None:
    """The slowest healthy step of the job (each step's median over its ranks): how slow the
    job got by itself, which a fault's steps must exceed to have slowed it at all."""
    end = _fault_step(run)
    per_step = [_median([r[i] for r in run.step_ms.values() if i < len(r)]) for i in range(warmup_steps, end)]
    return max((t for t in per_step if t is not None), default=None)


def _median(xs: list[float]) -> float | None:
    return round(float(np.median(xs)), 1) if xs else None
