"""Merging a NIC's consecutive epoch batches: the same rows, a valid batch, a gapless
batch_seq, and the same operator metrics downstream."""

from __future__ import annotations

import asyncio

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pulse.producers.coalesce import Coalescer

from pulse.samples import decode, encode, make_batch

EPOCH = 32_000


@pytest.fixture(scope="module")
def sim_trace_small(tmp_path_factory):
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    out = tmp_path_factory.mktemp("coalesce") / "trace"
    simulate(SimConfig(scenario="nic-slow", seed=3, nodes=4, gpus_per_node=2, nics_per_node=2, steps=4, job="c"), out)
    return out


def _rows_naive(batches):
    """(job, node, nic, flow, absolute epoch start, tx, rx) of every row, one by one."""
    out = []
    for b in batches:
        rx = b.rx_bytes if b.rx_bytes is not None else [None] * b.n_rows
        for f, e, t, r in zip(b.flow.tolist(), b.epoch.tolist(), b.tx_bytes.tolist(), list(rx), strict=True):
            out.append((b.job, b.node, b.nic, f, b.t0_ns + e * b.epoch_ns, t, None if r is None else int(r)))
    return sorted(out, key=repr)


@st.composite
def nic_streams(draw):
    """Time-ordered batches of a few NICs, some with gaps, empty windows, a misaligned t0,
    an epoch_ns change or an overlap (those must start a new merged batch)."""
    nics = draw(st.integers(1, 3))
    with_rx = draw(st.booleans())
    batches = []
    for k in range(nics):
        t0 = draw(st.integers(0, 50)) * EPOCH
        seq = draw(st.integers(0, 5))
        epoch_ns = EPOCH
        for _ in range(draw(st.integers(1, 8))):
            width = draw(st.integers(1, 40))
            nflows = draw(st.integers(0, 4))
            flow, epoch = [], []
            for f in sorted(draw(st.sets(st.integers(0, 2**32 - 1), max_size=nflows))):
                es = sorted(draw(st.sets(st.integers(0, width - 1), min_size=1, max_size=5)))
                flow += [f] * len(es)
                epoch += es
            n = len(flow)
            tx = draw(st.lists(st.integers(1, 2**32 - 1), min_size=n, max_size=n))
            rx = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n)) if with_rx else None
            batches.append(make_batch(node=f"node-{k}", nic="mlx5_0", t0_ns=t0, epoch_ns=epoch_ns, batch_seq=seq,
                                      flow=flow, epoch=epoch, tx_bytes=tx, rx_bytes=rx, job="j"))
            step = width * epoch_ns + draw(st.sampled_from([0, 0, EPOCH, 7 * EPOCH, 1000, -EPOCH]))
            t0 += step
            seq += draw(st.sampled_from([1, 1, 1, 2]))
            if draw(st.integers(0, 9)) == 0:
                epoch_ns = 64_000 if epoch_ns == EPOCH else EPOCH
    order = draw(st.permutations(range(len(batches))))
    # Interleave NICs but keep each NIC's batches in time order.
    per_nic = {}
    for i in order:
        per_nic.setdefault(batches[i].node, []).append(batches[i])
    for v in per_nic.values():
        v.sort(key=lambda b: b.t0_ns)
    out = []
    while any(per_nic.values()):
        for v in per_nic.values():
            if v:
                out.append(v.pop(0))
    return out


@given(nic_streams(), st.integers(1, 200), st.lists(st.integers(0, 10), max_size=10))
@settings(max_examples=150, deadline=None)
def test_merged_batches_hold_the_same_rows_and_a_gapless_seq(batches, max_rows, flush_at):
    c = Coalescer(max_age_s=1e9, max_rows=max_rows)
    out = []
    for i, b in enumerate(batches):
        out += c.add(b, now=0.0)
        if i in flush_at:
            out += c.drain()
    out += c.drain()
    # Valid batches: strictly sorted rows, decodable, no more than max_rows unless one source batch had more.
    for m in out:
        again = decode(encode(m))
        make_batch(node=m.node, nic=m.nic, t0_ns=m.t0_ns, epoch_ns=m.epoch_ns, batch_seq=m.batch_seq,
                   flow=again.flow, epoch=again.epoch, tx_bytes=again.tx_bytes, rx_bytes=again.rx_bytes, job=m.job)
    assert _rows_naive(out) == _rows_naive(batches)
    for node in {b.node for b in batches}:
        src = [b for b in batches if b.node == node]
        seqs = [m.batch_seq for m in out if m.node == node]
        assert seqs == list(range(src[0].batch_seq, src[0].batch_seq + len(seqs)))
        assert len(seqs) <= len(src)
        # Rows keep their epoch_ns: a merged batch never mixes epoch widths.
        assert sum(m.n_rows for m in out if m.node == node and m.epoch_ns == 64_000) == \
            sum(b.n_rows for b in src if b.epoch_ns == 64_000)
    assert c.batches_in == len(batches) and c.batches_out == len(out)


def test_age_bound_and_source_gaps():
    def b(seq, t0):
        return make_batch(node="n", nic="x", t0_ns=t0, epoch_ns=EPOCH, batch_seq=seq, flow=[1], epoch=[0],
                          tx_bytes=[5])

    c = Coalescer(max_age_s=0.5)
    assert c.add(b(3, 0), now=10.0) == []
    assert c.add(b(4, EPOCH), now=10.2) == []
    assert c.due(now=10.4) == []
    (m,) = c.due(now=10.5)
    assert (m.batch_seq, m.n_rows, m.epoch.tolist()) == (3, 2, [0, 1])
    c.add(b(7, 5 * EPOCH), now=11.0)  # seq 5 and 6 never reached the publisher
    (m2,) = c.drain()
    assert m2.batch_seq == 4 and c.source_gaps == 2


def test_segmentation_sees_the_same_operators(sim_trace_small):
    """The segment state fed merged batches emits the same operator metrics as fed the
    source's batches one by one (the oracle is the uncoalesced stream)."""
    from pulse.producers.replay import replay_items
    from pulse.streams.state import Message, SegmentState

    from pulse import events as _events
    from pulse.samples import EpochBatch
    from pulse.settings import Settings

    topics = Settings(topic_prefix="c").topics

    async def items():
        return [it async for it in replay_items(sim_trace_small)]

    src = asyncio.run(items())
    c = Coalescer(max_age_s=1e9, max_rows=4096)
    merged = []
    for it in src:
        merged += c.add(it, 0.0) if isinstance(it, EpochBatch) else [it]
    merged += c.drain()
    assert c.batches_out < c.batches_in / 4

    def metrics(stream):
        seg = SegmentState(topics)
        msgs = [Message(topics.samples, b"", encode(i)) if isinstance(i, EpochBatch)
                else Message(topics.hook_events, b"", _events.encode(i)) for i in stream]
        out = []
        for i in range(0, len(msgs), 256):
            out += seg.handle(msgs[i:i + 256]).metrics
        out += seg.finish().metrics
        return sorted((m.comm_id, m.seq, m.rank, m.start_ns, m.end_ns, m.volume_bytes, m.act_ns) for m in out)

    a, b = metrics(src), metrics(merged)
    assert a and a == b
    assert not np.isnan(np.array([x[3] for x in a], dtype=float)).any()


def test_numbering_goes_on_across_a_restart_and_starts_over_with_the_source():
    def b(seq):
        return make_batch(node="n", nic="x", t0_ns=seq * 10 * EPOCH, epoch_ns=EPOCH, batch_seq=seq, flow=[1],
                          epoch=[0], tx_bytes=[5], job="j")

    first = Coalescer(max_age_s=1e9, max_rows=2)  # two source batches per merged one
    sent = [m.batch_seq for s in range(6) for m in first.add(b(s), 0.0)] + [m.batch_seq for m in first.drain()]
    assert sent == [0, 1, 2]
    state = orjson.loads(orjson.dumps(first.state()))
    again = Coalescer(max_age_s=1e9, max_rows=2)
    again.restore(state)
    assert [m.batch_seq for s in range(6, 10) for m in again.add(b(s), 0.0)] == [3, 4]
    crashed = Coalescer(max_age_s=1e9, max_rows=2)
    crashed.restore(state, margin=64)
    assert [m.batch_seq for s in range(6, 8) for m in crashed.add(b(s), 0.0)] == [3 + 64]
    anew = Coalescer(max_age_s=1e9, max_rows=2)
    anew.restore(state)
    assert [m.batch_seq for s in range(2) for m in anew.add(b(s), 0.0)] == [0]  # the source started over
