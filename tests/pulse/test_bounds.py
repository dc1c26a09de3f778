"""InputBounds: distinct flows per node, communicators per job, nodes per worker."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pulse.bounds import InputBounds
from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.samples import make_batch


def batch(node: str, nic: str, flows: list[int]):
    f = np.array(sorted(set(flows)), np.uint32)
    return make_batch(node=node, nic=nic, t0_ns=0, epoch_ns=32_000, batch_seq=0, flow=np.repeat(f, 2),
                      epoch=np.tile(np.array([0, 1], np.uint32), f.size), tx_bytes=np.ones(2 * f.size, np.uint32))


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["mlx5_0", "mlx5_1"]),
                          st.lists(st.integers(0, 200), min_size=1, max_size=30)), max_size=30),
       st.integers(1, 40))
def test_flows_are_admitted_first_come_up_to_the_bound(batches, cap) -> None:
    bounds = InputBounds(max_flows_per_node=cap)
    admitted: dict[str, list[tuple[str, int]]] = {"a": [], "b": []}
    rejected_rows = 0
    for node, nic, flows in batches:
        b = batch(node, nic, flows)
        out = bounds.admit_batch(b)
        assert out is not None
        for f in sorted(set(flows)):  # the model: first come, first admitted, per node
            if (nic, f) not in admitted[node] and len(admitted[node]) < cap:
                admitted[node].append((nic, f))
        want = {f for n, f in admitted[node] if n == nic}
        kept = set(out.flow.tolist())
        assert kept == want & set(flows)
        assert out.n_rows == 2 * len(kept)  # every row of an admitted flow kept, in order
        assert np.all(np.diff(out.flow.astype(np.int64)) >= 0)
        rejected_rows += b.n_rows - out.n_rows
    assert bounds.stats["rejected_flow_rows"] == rejected_rows


def test_communicators_nodes_and_flow_events() -> None:
    bounds = InputBounds(max_comms_per_job=2, max_nodes=2, max_flows_per_node=1)
    comms = [CommEvent(job="j", node="n0", comm_id=f"{i:#x}", rank=0, nranks=2) for i in range(1, 5)]
    assert [e.comm_id for e in bounds.admit_events(comms)] == ["0x1", "0x2"]
    op = OpEvent(job="j", node="n0", comm_id="0x1", rank=0, nranks=2, seq=0, kind="AllReduce", count=1,
                 dtype="float32", bytes=4)
    stray = OpEvent(job="j", node="n0", comm_id="0x9", rank=0, nranks=2, seq=0, kind="AllReduce", count=1,
                    dtype="float32", bytes=4)
    assert bounds.admit_events([op, stray]) == [op]
    assert bounds.stats["rejected_comm_events"] == 3
    flows = [FlowEvent(job="j", node="n0", nic="mlx5_0", flow=f, comm_id="0x1") for f in (7, 8, 7)]
    assert [e.flow for e in bounds.admit_events(flows)] == [7, 7]
    assert bounds.stats["rejected_flow_events"] == 1
    other = CommEvent(job="j", node="n1", comm_id="0x1", rank=1, nranks=2)
    third = CommEvent(job="j", node="n2", comm_id="0x1", rank=0, nranks=2)
    assert bounds.admit_events([other, third]) == [other]
    assert bounds.admit_batch(batch("n3", "mlx5_0", [1])) is None
    assert bounds.stats["rejected_node_messages"] == 2
