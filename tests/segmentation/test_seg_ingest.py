"""The node-wide ingest kernel (all NICs' batches in one pass) against the general path
(per NIC: ``nic_rows`` then ``FlowTable.ingest``), on random and adversarial batches:
several NICs sharing flow numbers, recv flows, rows older than a flow's floor, rx-only
rows, overlapping windows (duplicate rows across batches), empty batches."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.segmentation.flows import LOW, RECV, SEND, FlowTable
from pulse.segmentation.params import SegmentParams
from pulse.segmentation.rows import NicClock, nic_rows
from pulse.segmentation.streamstats import StreamStats

from pulse.samples import EpochBatch

EPOCH = 1000
NUMS = (3, 7, 11, 40)
"""Flow numbers: every NIC uses the same ones (QPNs are per NIC)."""


def _table(states: dict, floors: dict, params: SegmentParams) -> FlowTable:
    def state_of(key):
        st_ = states[key]
        return st_, (0 if st_ == SEND else -1)

    ft = FlowTable("n0", params, StreamStats(), state_of)
    keys = sorted(states)
    ids = ft.ids(keys)
    for key, fid in zip(keys, ids.tolist(), strict=True):
        ft.f.floor[fid] = floors[key]
    return ft


_row = st.tuples(st.sampled_from(NUMS), st.integers(0, 12), st.integers(0, 3000), st.integers(0, 600))
_batch = st.tuples(st.integers(0, 6), st.lists(_row, max_size=12))
_nic = st.lists(_batch, min_size=1, max_size=3)


def _batches(nic: str, spec: list, rx: bool, seq0: int) -> list[EpochBatch]:
    out = []
    for i, (t0_epochs, rows) in enumerate(spec):
        uniq = {(f, e): (t, r) for f, e, t, r in rows}  # a batch has unique, sorted rows
        keys = sorted(uniq)
        out.append(EpochBatch(
            node="n0", nic=nic, t0_ns=t0_epochs * EPOCH + 17, epoch_ns=EPOCH, batch_seq=seq0 + i,
            flow=np.array([k[0] for k in keys], np.uint32), epoch=np.array([k[1] for k in keys], np.uint32),
            tx_bytes=np.array([uniq[k][0] for k in keys], np.uint32),
            rx_bytes=np.array([uniq[k][1] for k in keys], np.uint32) if rx else None))
    return out


@settings(max_examples=150, deadline=None)
@given(nics=st.lists(_nic, min_size=1, max_size=3), earlier=_nic,
       recv=st.sets(st.tuples(st.integers(0, 2), st.sampled_from(NUMS)), max_size=4),
       floors=st.dictionaries(st.tuples(st.integers(0, 2), st.sampled_from(NUMS)), st.integers(0, 10), max_size=4),
       rx=st.booleans(), burst_rx=st.sampled_from([0, 400]))
def test_node_ingest_equals_general_path(nics, earlier, recv, floors, rx, burst_rx):
    params = SegmentParams()
    names = [f"mlx5_{i}" for i in range(len(nics))]
    states = {("n0", n, f): (RECV if (i, f) in recv else SEND) for i, n in enumerate(names) for f in NUMS}
    fl = {("n0", names[i], f): e for (i, f), e in floors.items() if i < len(names)}
    floor = {k: fl.get(k, LOW) for k in states}
    clock = NicClock(EPOCH, 17)
    fast, slow = _table(states, floor, params), _table(states, floor, params)
    # rows buffered before (the store already holds some): the same in both tables
    first = _batches(names[0], earlier, rx, 0)
    for t in (fast, slow):
        f, e, b, _ = nic_rows(first, clock, burst_rx)
        t.ingest(names[0], f, e, b)
    per_nic = [(n, _batches(n, spec, rx, 10)) for n, spec in zip(names, nics, strict=True)]
    got = fast.ingest_fast(per_nic, burst_rx)
    assert got is not None  # every flow known and bound
    kept = 0
    for name, batches in per_nic:
        f, e, b, k = nic_rows(batches, clock, burst_rx)
        kept += k
        slow.ingest(name, f, e, b)
        assert got[1][name] == (int(e.max()) if e.size else LOW)
    assert got[0] == kept
    for a, b in zip(fast.store, slow.store, strict=True):
        assert a.tolist() == b.tolist()
    for col in ("nrows", "has", "floor"):
        assert fast.f.col(col).tolist() == slow.f.col(col).tolist(), col
    assert fast.stats.late_rows == slow.stats.late_rows


def test_unknown_flow_changes_nothing():
    """A flow the table does not know sends the chunk to the general path, untouched."""
    params = SegmentParams()
    states = {("n0", "mlx5_0", 3): SEND}
    t = _table(states, {("n0", "mlx5_0", 3): LOW}, params)
    before = tuple(a.copy() for a in t.store), t.f.col("nrows").copy(), t.f.col("has").copy()
    b = _batches("mlx5_0", [(0, [(3, 1, 10, 0)])], False, 0) + _batches("mlx5_1", [(0, [(3, 1, 10, 0)])], False, 0)
    assert t.ingest_fast([("mlx5_0", b[:1]), ("mlx5_1", b[1:])], 0) is None
    assert all(x.tolist() == y.tolist() for x, y in zip(t.store, before[0], strict=True))
    assert t.f.col("nrows").tolist() == before[1].tolist() and t.f.col("has").tolist() == before[2].tolist()
