"""With coalescing on, the publisher packs a node's hook events of one window into one
message (``{"type": "batch", ...}``), per node and in order, keyed by the node."""

from __future__ import annotations

import asyncio

from pulse.producers.publisher import Publisher
from test_publisher import _batch, _consume_all

from pulse import events as _events
from pulse.events import FlowEvent, OpEvent
from pulse.settings import Settings


def _op(node: str, seq: int) -> OpEvent:
    return OpEvent(job="j", node=node, comm_id="c", rank=int(node[-1]), seq=seq, kind="AllReduce", count=1024,
                   dtype="float32", bytes=4096, t_host_ns=seq * 1000)


def test_coalescing_packs_each_nodes_events_in_order(broker, tmp_path):
    s = Settings(broker=broker, topic_prefix="pub-pack", partitions=4, spool_dir=tmp_path / "spool")
    nodes = [f"node-0{i}" for i in range(3)]
    sent = [FlowEvent(job="j", node=n, nic="mlx5_0", flow=i) for i, n in enumerate(nodes)]
    sent += [_op(nodes[i % 3], i // 3) for i in range(300)]

    async def go():
        async with Publisher(s, coalesce_ms=1000) as pub:
            for ev in sent:
                await pub.publish_event(ev)
            await pub.publish_batch(_batch(0))  # a batch going out sends the pending events first
            await pub.flush()
            stats = pub.stats
        return stats, await _consume_all(broker, s.topics.hook_events, stats["event_messages"])

    stats, msgs = asyncio.run(go())
    assert stats["events_in"] == len(sent) and stats["event_messages"] == len(msgs) < len(sent) / 10
    got: dict[str, list] = {}
    part_of: dict[bytes, int] = {}
    for p, key, value in msgs:
        evs = _events.decode_many(value)
        assert {e.node.encode() for e in evs} == {key}  # one node per message, keyed by it
        assert part_of.setdefault(key, p) == p
        got.setdefault(key.decode(), []).extend(evs)
    assert got == {n: [e for e in sent if e.node == n] for n in nodes}


def test_without_coalescing_events_go_one_per_message(broker, tmp_path):
    s = Settings(broker=broker, topic_prefix="pub-single", partitions=2, spool_dir=tmp_path / "spool")
    sent = [_op("node-01", i) for i in range(5)]

    async def go():
        async with Publisher(s) as pub:
            for ev in sent:
                await pub.publish_event(ev)
            await pub.flush()
        return await _consume_all(broker, s.topics.hook_events, 5)

    msgs = asyncio.run(go())
    assert [_events.decode(v) for _, _, v in msgs] == sent
