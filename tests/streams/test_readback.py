"""The state rebuild's read-back on the real embedded broker: it must return exactly the
messages before a committed offset, however the producer batched them (Tansu reports a
partition's end as its last record batch's base offset + 1, far short of the real end
when that batch holds many records)."""

from __future__ import annotations

import asyncio

import pytest
from pulse.streams.readback import committed_offsets, read_back
from streamkit import unique_settings

pytestmark = pytest.mark.slow


async def _produce_batched(bootstrap: str, topic: str, n: int, partition: int) -> None:
    from aiokafka import AIOKafkaProducer

    # A long linger and no await per send: the n records go out in one or a few batches.
    p = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=200, compression_type="zstd")
    await p.start()
    try:
        futs = [await p.send(topic, f"m{i}".encode(), key=b"k", partition=partition) for i in range(n)]
        await asyncio.gather(*futs)
    finally:
        await p.stop()


async def _commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await c.start()
    try:
        tps = [TopicPartition(t, p) for t, p in offsets]
        c.assign(tps)
        await c.commit({TopicPartition(t, p): off for (t, p), off in offsets.items()})
    finally:
        await c.stop()


def test_read_back_stops_at_the_committed_offset_of_batched_messages(broker, tmp_path):
    from pulse.producers.publisher import ensure_topics

    s = unique_settings(broker, tmp_path)
    topic = s.topics.hook_events
    asyncio.run(ensure_topics(broker, s))
    asyncio.run(_produce_batched(broker, topic, 300, partition=1))
    asyncio.run(_produce_batched(broker, topic, 40, partition=2))
    group = f"g-{s.topic_prefix}"
    asyncio.run(_commit(broker, group, {(topic, 1): 257, (topic, 2): 40}))

    committed = asyncio.run(committed_offsets(broker, group, [topic]))
    assert committed == {(topic, 1): 257, (topic, 2): 40}
    upto = {p: off for (_, p), off in committed.items()}
    got = asyncio.run(read_back(broker, topic, upto=upto))
    by_part = {p: [m.offset for m in got if m.partition == p] for p in (0, 1, 2, 3)}
    assert by_part == {0: [], 1: list(range(257)), 2: list(range(40)), 3: []}
    assert [m.value for m in got if m.partition == 1] == [f"m{i}".encode() for i in range(257)]

    everything = asyncio.run(read_back(broker, topic))
    assert sorted((m.partition, m.offset) for m in everything) == (
        [(1, i) for i in range(300)] + [(2, i) for i in range(40)])


def test_read_back_gives_up_on_a_committed_offset_past_the_data(broker, tmp_path):
    from pulse.producers.publisher import ensure_topics

    s = unique_settings(broker, tmp_path)
    topic = s.topics.samples
    asyncio.run(ensure_topics(broker, s))
    asyncio.run(_produce_batched(broker, topic, 25, partition=0))
    # A group that committed more than the broker holds (a broker that lost data).
    got = asyncio.run(read_back(broker, topic, upto={0: 100, 3: 7}, stuck_s=1.0, timeout_s=30.0))
    assert [(m.partition, m.offset) for m in got] == [(0, i) for i in range(25)]
