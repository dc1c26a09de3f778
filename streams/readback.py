"""Reading topics back without a consumer group: what a worker replays to rebuild its state,
and what tests and tools read from a topic."""

from __future__ import annotations

import logging
import time
from typing import Any

from .state import Message

log = logging.getLogger("pulse.streams")


async def read_back(bootstrap: str, topic: str, *, upto: dict[int, int] | None = None,
                    client: dict[str, Any] | None = None,
                    timeout_s: float = 60.0, idle_s: float = 0.5, stuck_s: float = 5.0) -> list[Message]:
    """Messages of ``topic`` from the start up to ``upto`` (partition -> offset, exclusive;
    default: the current end), with no consumer group and nothing committed.

    The broker's end offsets are not trusted as a stop: Tansu's ListOffsets(latest) answers
    the last record *batch*'s base offset + 1, so a partition whose last batch holds many
    records (a fast producer) reports an end far below its real one. With ``upto`` the read
    goes on until each partition reached its offset (what a group committed exists), giving
    up on a partition only after ``stuck_s`` without a message (committed past the data: a
    broker that lost it); without ``upto`` it reads until a partition is past its reported
    end and idle for ``idle_s``."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         auto_offset_reset="earliest", max_partition_fetch_bytes=8 << 20, **(client or {}))
    await c.start()
    out: list[Message] = []
    try:
        await c._client.force_metadata_update()
        parts = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return out
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        # Without ``upto`` a partition is done once past its reported end and quiet.
        ends = await c.end_offsets(tps) if upto is None else {}
        stop = {tp: None if upto is None else upto.get(tp.partition, 0) for tp in tps}
        todo = {tp for tp in tps if upto is None or upto.get(tp.partition, 0) > 0}
        nxt = dict.fromkeys(tps, 0)  # the offset after the last one read
        seen = dict.fromkeys(tps, time.monotonic())
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            batch = await c.getmany(*todo, timeout_ms=200)
            now = time.monotonic()
            for tp, msgs in batch.items():
                end = stop[tp]
                out += [Message(topic, m.key, m.value, m.partition, m.offset, m.timestamp)
                        for m in msgs if end is None or m.offset < end]
                if msgs:
                    nxt[tp], seen[tp] = msgs[-1].offset + 1, now
            for tp in list(todo):
                end, quiet = stop[tp], now - seen[tp]
                if end is None:
                    done = nxt[tp] >= ends[tp] and quiet >= idle_s
                elif nxt[tp] >= end:
                    done = True
                elif quiet >= stuck_s:
                    log.warning("%s[%d]: nothing after offset %d, below %d: read back stops there",
                                topic, tp.partition, nxt[tp], end)
                    done = True
                else:
                    done = False
                if done:
                    todo.discard(tp)
        if todo:
            log.warning("%s: read back timed out after %.0f s", topic, timeout_s)
    finally:
        await c.stop()
    return out


async def committed_offsets(bootstrap: str, group: str, topics: list[str], *,
                            client: dict[str, Any] | None = None) -> dict[tuple[str, int], int]:
    """(topic, partition) -> committed offset of a consumer group (empty for a new group).

    Asked through a consumer that never joins the group (the admin client's "all
    partitions" OffsetFetch is not understood by Tansu)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, **(client or {}))
    await c.start()
    out: dict[tuple[str, int], int] = {}
    try:
        await c._client.force_metadata_update()
        for topic in topics:
            for p in sorted(c.partitions_for_topic(topic) or ()):
                off = await c.committed(TopicPartition(topic, p))
                if off is not None and off > 0:
                    out[(topic, p)] = off
    finally:
        await c.stop()
    return out
