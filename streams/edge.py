"""The edge option: a node segments its own traffic and publishes operator metrics only.

For clusters whose Kafka cannot take µs epoch samples. The node-side producer runs the very
segmentation stage the central segment agent runs (:class:`~pulse.engine.segment_stage.
SegmentStage`, one per node here) on its own hook events and epoch batches, and publishes
what the segment agent would have put on ``<prefix>.op-metrics`` (key = job): operator
metrics packed per chunk, and what the job's localizer is forwarded (comm and flow events,
the latest posted receive per communicator, data ends with the node's gaps). Neither
samples nor hook events go on their topics: the central worker's localize agent reads the
op-metrics topic as it does from its own segment agent, and concludes the same (tested on
battery scenarios against ``pulse diagnose``). Bytes per GPU-second in both modes are in
``pulse bench scale`` (``kafka_bytes_per_gpu_s``, ``edge_kafka_bytes_per_gpu_s``).

:class:`EdgeSegmenter` is the pure part (chunks in, op-metrics messages out);
:class:`EdgePublisher` sends its messages through a :class:`~pulse.producers.Publisher`
(its disk spool and retries), one chunk per ``chunk_s`` of wall time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from pulse.engine.segment_stage import SegmentOutput, SegmentStage
from pulse.segmentation import SegmentParams

from pulse.errors import PulseError
from pulse.events import HookEvent
from pulse.samples import EpochBatch

from .state import _pack

CHUNK_S = 0.05
"""What the central segment agent takes per call (``take_events(1024, within=0.05 s)``)."""


class EdgeSegmenter:
    """Segmentation of the nodes one producer serves (normally its own node)."""

    def __init__(self, params: SegmentParams | None = None) -> None:
        self.stage = SegmentStage(params)
        self.refused: list[tuple[EpochBatch, PulseError]] = []
        """Batches the segmenters refused (wrong epoch grid, ...), with why: the central
        agent would have dead-lettered them."""
        self.messages = 0
        self.bytes = 0

    def add(self, events: Iterable[HookEvent] = (), batches: Iterable[EpochBatch] = ()) -> list[tuple[bytes, bytes]]:
        """One chunk in; the (key, value) messages for the op-metrics topic out, in order."""
        return self._pack(self.stage.add(events, batches))

    def finish(self) -> list[tuple[bytes, bytes]]:
        """End of the node's input (the agent stops): close everything still open."""
        return self._pack(self.stage.finish())

    def _pack(self, out: SegmentOutput) -> list[tuple[bytes, bytes]]:
        self.refused += out.refused
        msgs = _pack(out.metrics, out.forwards)
        self.messages += len(msgs)
        self.bytes += sum(len(v) for _, v in msgs)
        return msgs

    @property
    def stats(self) -> dict[str, Any]:
        return {**self.stage.stats, "refused_batches": len(self.refused), "messages": self.messages,
                "bytes": self.bytes}


class EdgePublisher:
    """Drop-in for the publisher's ``publish_event`` / ``publish_batch`` on a node that
    segments locally: input is buffered and segmented every ``chunk_s`` (and on
    :meth:`flush`), the op-metrics messages go out through ``pub``."""

    def __init__(self, pub: Any, params: SegmentParams | None = None, *, chunk_s: float = CHUNK_S) -> None:
        self.pub = pub
        self.seg = EdgeSegmenter(params)
        self.chunk_s = chunk_s
        self._events: list[HookEvent] = []
        self._batches: list[EpochBatch] = []
        self._since: float | None = None

    async def publish_event(self, event: HookEvent) -> None:
        self._events.append(event)
        await self._maybe_flush()

    async def publish_batch(self, batch: EpochBatch) -> None:
        self._batches.append(batch)
        await self._maybe_flush()

    async def _maybe_flush(self) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = now
        elif now - self._since >= self.chunk_s:
            await self.flush()

    async def flush(self) -> None:
        """Segment what is buffered and send the messages (the publisher confirms or spools)."""
        events, batches = self._events, self._batches
        self._events, self._batches, self._since = [], [], None
        await self._send(self.seg.add(events, batches))

    async def finish(self) -> None:
        await self.flush()
        await self._send(self.seg.finish())
        await self.pub.flush()

    async def _send(self, msgs: list[tuple[bytes, bytes]]) -> None:
        topic = self.pub.topics.op_metrics
        for key, value in msgs:
            await self.pub.publish(topic, key, value)
