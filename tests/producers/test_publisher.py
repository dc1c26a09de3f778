"""The publisher on a real embedded broker: delivery, keys, compression, and the spool
across a broker that is killed mid-stream and restarted on the same port."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from pulse.producers.publisher import Publisher

from pulse.broker import EmbeddedBroker
from pulse.events import FlowEvent
from pulse.samples import decode, make_batch
from pulse.settings import Settings


def _batch(i: int, nodes: int = 4):
    n = 50 + i % 7
    return make_batch(node=f"node-{i % nodes:02d}", nic="mlx5_0", t0_ns=i * 1_000_000, epoch_ns=32_000,
                      batch_seq=i // nodes, flow=np.arange(n), epoch=np.arange(n) + i % 3,
                      tx_bytes=np.full(n, 4096), job="j")


async def _consume_all(bootstrap: str, topic: str, want: int, timeout_s: float = 30.0) -> list:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    await c.start()
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < want and time.monotonic() < deadline:
            got = await c.getmany(timeout_ms=300)
            for tp, msgs in got.items():
                out += [(tp.partition, m.key, m.value) for m in msgs]
    finally:
        await c.stop()
    return out


def test_publishes_batches_and_events_keyed_by_node(broker, tmp_path):
    s = Settings(broker=broker, topic_prefix="pub-keys", partitions=4, spool_dir=tmp_path / "spool")

    async def go():
        async with Publisher(s, compression="zstd") as pub:
            for i in range(40):
                await pub.publish_batch(_batch(i))
            await pub.publish_event(FlowEvent(job="j", node="node-01", nic="mlx5_0", flow=7))
            await pub.flush()
            assert pub.stats["confirmed"] == 41 and pub.stats["spooled"] == 0
        return (await _consume_all(broker, s.topics.samples, 40),
                await _consume_all(broker, s.topics.hook_events, 1))

    samples, events = asyncio.run(go())
    got = {(decode(v).node, decode(v).batch_seq) for _, _, v in samples}
    assert got == {(b.node, b.batch_seq) for b in map(_batch, range(40))}
    part_of = {}
    for p, k, v in samples:
        assert k == decode(v).node.encode()
        part_of.setdefault(k, set()).add(p)
    assert all(len(ps) == 1 for ps in part_of.values())  # one node, one partition
    # Co-partitioned: the hook event of node-01 is on node-01's samples partition number.
    assert events[0][0] in part_of[b"node-01"]


@pytest.mark.slow
def test_spool_delivers_every_batch_after_the_broker_returns(tmp_path):
    n_total, kill_at, back_at = 300, 100, 200
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as first:
        port = first.port
        s = Settings(broker=first.bootstrap, topic_prefix="pub-spool", partitions=3,
                     spool_dir=tmp_path / "spool", spool_max_bytes=64 << 20)

        async def before() -> tuple[Publisher, set]:
            pub = Publisher(s, send_timeout_s=2.0, retry_backoff_s=(0.1, 0.5))
            await pub.start(wait_s=10)
            for i in range(kill_at):
                await pub.publish_batch(_batch(i))
            await pub.flush()
            seen = {decode(v).batch_seq * 4 + int(decode(v).node[-2:])
                    for _, _, v in await _consume_all(first.bootstrap, s.topics.samples, kill_at)}
            return pub, seen

        loop = asyncio.new_event_loop()
        pub, seen_before = loop.run_until_complete(before())
    # The broker is gone (memory storage: what it held is gone too); keep publishing.
    assert seen_before == set(range(kill_at))

    async def during() -> None:
        for i in range(kill_at, back_at):
            await pub.publish_batch(_batch(i))
            await asyncio.sleep(0.002)
        await asyncio.sleep(1.0)  # several reconnect attempts fail meanwhile

    loop.run_until_complete(during())
    assert pub.stats["spooled"] >= back_at - kill_at and not pub.stats["connected"]
    assert any((tmp_path / "spool").iterdir())
    with EmbeddedBroker(port=port, log_path=tmp_path / "tansu2.log") as second:

        async def after() -> set:
            for i in range(back_at, n_total):
                await pub.publish_batch(_batch(i))
            await asyncio.wait_for(pub.flush(), 60)
            stats = pub.stats
            await pub.stop()
            assert stats["dropped"] == 0 and stats["outages"] >= 1
            assert stats["delivered_from_spool"] >= back_at - kill_at
            vals = await _consume_all(second.bootstrap, s.topics.samples, n_total - kill_at)
            return {decode(v).batch_seq * 4 + int(decode(v).node[-2:]) for _, _, v in vals}

        seen_after = loop.run_until_complete(after())
    loop.close()
    assert seen_before | seen_after == set(range(n_total))
    assert set(range(kill_at, n_total)) <= seen_after
    assert not list((tmp_path / "spool").glob("*.spool"))


def test_full_spool_counts_drops(tmp_path):
    # No broker at all on this port: everything goes to a tiny spool; the overflow is counted.
    from pulse.broker import free_port

    # Spool room for a few of the ten messages (batch version 2: ~90 bytes each).
    s = Settings(broker=f"127.0.0.1:{free_port()}", topic_prefix="pub-full", partitions=1,
                 spool_dir=tmp_path / "spool", spool_max_bytes=500)

    async def go():
        pub = Publisher(s, send_timeout_s=0.5, retry_backoff_s=(0.1, 0.2))
        await pub.start()
        for i in range(10):
            await pub.publish_batch(_batch(i))
        stats = pub.stats
        await pub.stop(drain_timeout_s=0.2)
        return stats

    stats = asyncio.run(go())
    assert stats["dropped"] > 0 and stats["spooled"] + stats["dropped"] == 10
    assert stats["spool_bytes"] <= 500
