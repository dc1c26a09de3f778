"""The descriptors' structure against the wire's (``pulse diagnose --cross-check``).

A descriptor source (profiler plugin, NCCL log, ``rdma res``, the torch injection) binds a
flow of a NIC to a communicator rank, its peer rank and a direction. The wire says, for the
same flow, who is really at the other end (a TCP 5-tuple seen on both ends, a queue pair
and its remote queue pair) and which way the bytes went (which end transmitted them). A
source that lies (a wrong rank-to-peer table) or lags (a communicator created after its
last poll, a queue pair reused by another job) shows up as a disagreement here, where
descriptor mode would silently judge the wrong link.

Checked, each from facts both sides state:

* **peer**: the declared peer rank's node against the node at the wire's other end;
* **direction**: of a flow's two ends, the one declared ``send`` must be the one that
  transmitted more (the other end's bytes are acknowledgements and credits, paced by the
  data they answer: on RoCE a receiving queue pair transmits ~0.05 % of what it receives);
* **undeclared traffic**: flows that carried data with no binding at all, with their
  share of their NIC's bytes (a lagging source leaves real traffic unexplained);
* **ranks on two nodes**: one (communicator, rank) declared on different nodes.

Nothing here is a verdict on the job: it says whether the descriptors can be trusted.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.trace import TraceReader

SHOWN = 8
"""Disagreements of each kind listed in the human report (all of them in ``to_dict``)."""


@dataclasses.dataclass
class CrossCheck:
    declared_flows: int
    """Flow events binding a flow to a communicator rank."""
    wire_paired: int
    """Of those, flows whose other end the wire shows (addresses or queue pairs seen on both ends)."""
    data_flows: int
    """Flows that transmitted any byte in the samples."""
    peer_mismatch: list[dict[str, Any]]
    direction_mismatch: list[dict[str, Any]]
    undeclared: list[dict[str, Any]]
    rank_conflicts: list[dict[str, Any]]
    undeclared_bytes_share: float
    """Bytes on undeclared flows over all bytes transmitted."""

    @property
    def agrees(self) -> bool:
        """No disagreement found (see :attr:`wire_paired` for how much could be compared)."""
        return not (self.peer_mismatch or self.direction_mismatch or self.rank_conflicts)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "agrees": self.agrees}

    def lines(self) -> list[str]:
        """The human report."""
        head = (f"cross-check: {self.declared_flows} declared flows, {self.wire_paired} with both ends on the wire, "
                f"{self.data_flows} flows carried data; undeclared traffic {100 * self.undeclared_bytes_share:.1f} % "
                "of all bytes")
        if not self.agrees:
            verdict = ": DISAGREE"
        elif self.wire_paired == 0:
            # nothing was compared: agreeing would be a healthy-sounding answer without a basis
            verdict = (": nothing to compare (no declared flow's other end is on the wire: the flow events "
                       "carry no addresses or queue pair numbers)")
        else:
            verdict = ": descriptors and wire agree"
        out = [head + verdict]
        for m in self.peer_mismatch[:SHOWN]:
            out.append(f"  peer: {m['endpoint']} flow {m['flow']} ({m['comm_id']} rank {m['rank']}) is declared to "
                       f"reach rank {m['peer']} on {m['declared_node']}, the wire reaches {m['wire_endpoint']}")
        for m in self.direction_mismatch[:SHOWN]:
            out.append(f"  direction: {m['endpoint']} flow {m['flow']} ({m['comm_id']} rank {m['rank']}) is declared "
                       f"to send, but it transmitted {m['sent']} B and {m['wire_sender']} {m['bytes']} B")
        for m in self.rank_conflicts[:SHOWN]:
            out.append(f"  rank: {m['comm_id']} rank {m['rank']} declared on {', '.join(m['nodes'])}")
        for m in self.undeclared[:SHOWN]:
            peer = f" to {m['wire_endpoint']}" if m["wire_endpoint"] else ""
            out.append(f"  undeclared: {m['endpoint']} flow {m['flow']}{peer} carried {m['bytes']} B "
                       f"({100 * m['share']:.1f} % of its NIC's bytes) with no descriptor")
        for kind, xs in (("peer", self.peer_mismatch), ("direction", self.direction_mismatch),
                         ("rank", self.rank_conflicts), ("undeclared", self.undeclared)):
            if len(xs) > SHOWN:
                out.append(f"  ... {len(xs) - SHOWN} more {kind} lines in --json")
        return out


def _tx_bytes(reader: TraceReader) -> dict[tuple[str, int], int]:
    """(node/nic, flow) -> bytes it transmitted over the whole trace."""
    acc: dict[str, dict[int, int]] = defaultdict(dict)
    for b in reader.batches(tolerate_truncation=True):
        if not b.flow.size:
            continue
        flows, inv = np.unique(b.flow, return_inverse=True)
        sums = np.bincount(inv, weights=b.tx_bytes.astype(np.float64))
        mine = acc[f"{b.node}/{b.nic}"]
        for f, s in zip(flows.tolist(), sums.tolist(), strict=True):  # one row per flow, not per epoch
            mine[f] = mine.get(f, 0) + int(s)
    return {(ep, f): n for ep, d in acc.items() for f, n in d.items()}


def _wire_ends(flows: list[FlowEvent]) -> dict[tuple[str, int], tuple[str, int]]:
    """(endpoint, flow) -> (endpoint, flow) at the other end of the same direction: a TCP
    5-tuple reported by two endpoints, or a queue pair and the one whose remote it is."""
    by_tuple: dict[tuple[Any, ...], list[tuple[str, int]]] = defaultdict(list)
    by_qp: dict[tuple[int, int], tuple[str, int]] = {}
    for e in flows:
        key = (f"{e.node}/{e.nic}", e.flow)
        if e.src is not None and e.dst is not None and e.sport is not None and e.dport is not None:
            ends = by_tuple[(e.src, e.sport, e.dst, e.dport)]
            if key not in ends:
                ends.append(key)
        elif e.qpn is not None and e.remote_qpn is not None:
            by_qp[(e.qpn, e.remote_qpn)] = key
    out: dict[tuple[str, int], tuple[str, int]] = {}
    for ends in by_tuple.values():
        if len(ends) == 2 and ends[0][0] != ends[1][0]:
            out[ends[0]], out[ends[1]] = ends[1], ends[0]
    for (q, r), key in by_qp.items():
        mate = by_qp.get((r, q))
        if mate is not None and mate[0] != key[0]:
            out[key] = mate
    return out


def cross_check(trace_dir: str | Path) -> CrossCheck:
    """Compare the trace's descriptors with its traffic (see the module's doc)."""
    reader = TraceReader(trace_dir)
    flows: list[FlowEvent] = []
    rank_nodes: dict[tuple[str, int], set[str]] = defaultdict(set)
    for e in reader.events(tolerate_truncation=True):
        if isinstance(e, FlowEvent):
            flows.append(e)
            if e.comm_id is not None and e.rank is not None:
                rank_nodes[(e.comm_id, e.rank)].add(e.node)
        elif isinstance(e, CommEvent | OpEvent) and e.rank is not None:
            rank_nodes[(e.comm_id, e.rank)].add(e.node)
    tx = _tx_bytes(reader)
    ends = _wire_ends(flows)
    node_tx: dict[str, int] = defaultdict(int)
    for (ep, _f), n in tx.items():
        node_tx[ep] += n

    bound: dict[tuple[str, int], FlowEvent] = {}
    for e in flows:
        if e.comm_id is not None and e.rank is not None:
            bound[(f"{e.node}/{e.nic}", e.flow)] = e
    peer_mismatch, direction_mismatch = [], []
    for key, e in bound.items():
        other = ends.get(key)
        if other is None:
            continue
        where = {"endpoint": key[0], "flow": key[1], "comm_id": e.comm_id, "rank": e.rank}
        declared = rank_nodes.get((str(e.comm_id), e.peer), set()) if e.peer is not None else set()
        wire_node = other[0].partition("/")[0]
        if declared and wire_node not in declared:
            peer_mismatch.append({**where, "peer": e.peer, "declared_node": ",".join(sorted(declared)),
                                  "wire_endpoint": other[0]})
        if e.direction == "send" and tx.get(key, 0) < tx.get(other, 0):
            direction_mismatch.append({**where, "wire_sender": other[0], "bytes": tx[other], "sent": tx.get(key, 0)})
    undeclared: list[dict[str, Any]] = []
    total = sum(tx.values())
    for key, n in sorted(tx.items(), key=lambda kv: -kv[1]):
        if n <= 0 or key in bound:
            continue
        other = ends.get(key)
        if other is not None and other in bound:
            continue  # its other end is declared: the binding names this direction
        undeclared.append({"endpoint": key[0], "flow": key[1], "bytes": n, "share": round(n / node_tx[key[0]], 6),
                           "wire_endpoint": other[0] if other else None})
    conflicts = [{"comm_id": c, "rank": r, "nodes": sorted(ns)} for (c, r), ns in sorted(rank_nodes.items())
                 if len(ns) > 1]
    paired = sum(1 for k in bound if k in ends)
    return CrossCheck(len(bound), paired, sum(1 for n in tx.values() if n > 0), peer_mismatch, direction_mismatch,
                      undeclared, conflicts, round(sum(int(u["bytes"]) for u in undeclared) / total, 6) if total else 0.0)
