"""Bounds on what hostile or broken input can make a worker remember.

Decoders bound each message (:data:`pulse._schema.MAX_MESSAGE_BYTES`, events per packed
message, rows per batch). What no single message shows is how many *distinct* things a
stream names: a producer (or anyone who can write to the topics) can send millions of
flow ids, communicators or node names, each of which would get its own state downstream.
:class:`InputBounds` sits between the decoders and that state, remembers at most

* ``max_flows_per_node`` distinct (nic, flow) per node (from batches and flow events),
* ``max_comms_per_job`` distinct communicators per job (comm and op events),
* ``max_nodes_per_worker`` nodes and :data:`MAX_JOBS` jobs per worker,
* ``max_events_per_batch`` events per packed hook-events message,

and drops (and counts, in :attr:`InputBounds.stats`) what goes past them: rows of new flows
are cut out of a batch, events of new communicators are dropped, a batch or event of a node
or job past the cap is dropped whole. What was admitted once stays admitted.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pulse import events as _events
from pulse.samples import EpochBatch
from pulse.settings import Settings

MAX_JOBS = 4_096
"""Distinct jobs one worker keeps state for."""


@dataclasses.dataclass
class _Node:
    # nic -> admitted flow numbers, sorted: a batch of known flows costs one vectorized
    # lookup, not Python work per flow.
    flows: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    n: int = 0


class InputBounds:
    def __init__(self, *, max_flows_per_node: int = Settings.max_flows_per_node,
                 max_comms_per_job: int = Settings.max_comms_per_job,
                 max_nodes: int = Settings.max_nodes_per_worker, max_jobs: int = MAX_JOBS,
                 max_message_bytes: int = Settings.max_message_bytes,
                 max_events: int = Settings.max_events_per_batch) -> None:
        self.max_bytes = max_message_bytes
        self.max_events = max_events
        self.max_flows = max_flows_per_node
        self.max_comms = max_comms_per_job
        self.max_nodes = max_nodes
        self.max_jobs = max_jobs
        self._nodes: dict[str, _Node] = {}
        self._comms: dict[str, set[str]] = {}
        self.stats = {"rejected_flow_rows": 0, "rejected_flow_events": 0, "rejected_comm_events": 0,
                      "rejected_node_messages": 0, "rejected_job_events": 0}

    @classmethod
    def from_settings(cls, settings: Settings) -> InputBounds:
        return cls(max_flows_per_node=settings.max_flows_per_node, max_comms_per_job=settings.max_comms_per_job,
                   max_message_bytes=settings.max_message_bytes, max_nodes=settings.max_nodes_per_worker,
                   max_events=settings.max_events_per_batch)

    # ---- nodes and flows -----------------------------------------------------------------
    def _node(self, name: str) -> _Node | None:
        node = self._nodes.get(name)
        if node is None and len(self._nodes) < self.max_nodes:
            node = self._nodes[name] = _Node()
        return node

    def _admit_flows(self, node: _Node, nic: str, flows: np.ndarray) -> np.ndarray:
        """Which of ``flows`` (distinct, sorted) may be kept."""
        known = node.flows.get(nic)
        if known is None:
            known = np.empty(0, np.int64)
        pos = np.searchsorted(known, flows)
        ok = (pos < known.size) & (known[np.minimum(pos, max(known.size - 1, 0))] == flows) if known.size \
            else np.zeros(flows.size, bool)
        new = np.flatnonzero(~ok)
        take = new[: max(self.max_flows - node.n, 0)]
        if take.size:
            node.flows[nic] = np.union1d(known, flows[take].astype(np.int64))
            node.n += int(take.size)
            ok[take] = True
        return ok

    def admit_batch(self, batch: EpochBatch) -> EpochBatch | None:
        """The batch, without the rows of flows past the node's bound (None: node past the cap)."""
        node = self._node(batch.node)
        if node is None:
            self.stats["rejected_node_messages"] += 1
            return None
        if batch.n_rows == 0:
            return batch
        f = batch.flow.astype(np.int64)  # rows are sorted by flow: distinct flows in one pass
        first = np.ones(f.size, bool)
        first[1:] = f[1:] != f[:-1]
        flows = f[first]
        ok = self._admit_flows(node, batch.nic, flows)
        if ok.all():
            return batch
        keep = np.repeat(ok, np.diff(np.append(np.flatnonzero(first), f.size)))
        self.stats["rejected_flow_rows"] += int(batch.n_rows - keep.sum())
        rx = batch.rx_bytes[keep] if batch.rx_bytes is not None else None
        return dataclasses.replace(batch, flow=batch.flow[keep], epoch=batch.epoch[keep],
                                   tx_bytes=batch.tx_bytes[keep], rx_bytes=rx)

    # ---- hook events ---------------------------------------------------------------------
    def _admit_comm(self, job: str, comm_id: str) -> bool:
        comms = self._comms.get(job)
        if comms is None:
            if len(self._comms) >= self.max_jobs:
                self.stats["rejected_job_events"] += 1
                return False
            comms = self._comms[job] = set()
        if comm_id in comms:
            return True
        if len(comms) >= self.max_comms:
            self.stats["rejected_comm_events"] += 1
            return False
        comms.add(comm_id)
        return True

    def admit_events(self, evs: list[_events.HookEvent]) -> list[_events.HookEvent]:
        """The events that stay within the bounds, in order."""
        out: list[_events.HookEvent] = []
        for ev in evs:
            node = self._node(ev.node)
            if node is None:
                self.stats["rejected_node_messages"] += 1
                continue
            if isinstance(ev, _events.FlowEvent):
                if not self._admit_flows(node, ev.nic, np.array([ev.flow], np.int64))[0]:
                    self.stats["rejected_flow_events"] += 1
                    continue
                if ev.comm_id is not None and not self._admit_comm(ev.job, ev.comm_id):
                    continue
            elif not self._admit_comm(ev.job, ev.comm_id):
                continue
            out.append(ev)
        return out
