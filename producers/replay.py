"""Replaying a trace directory into Kafka, as fast as possible or paced by its timestamps.

Comm and flow events (membership, flow bindings) go first; then op events and epoch
batches merged in trace time: an op event at its ``t_host_ns``, a batch when its last
epoch ends (that is when a live source could have sent it). Paced replay maps trace time
to wall time (``speed`` trace seconds per wall second) so a recorded or simulated job
looks live to the pipeline; :class:`ReplayClock` keeps the mapping so callers can turn a
trace time into the wall time it was published at.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from pulse import events as _events
from pulse.errors import ConfigError
from pulse.samples import EpochBatch
from pulse.trace import TraceReader

from .publisher import Publisher


@dataclass
class ReplayClock:
    """Trace time -> wall time of a paced replay (``speed`` 0 = as fast as possible)."""

    speed: float
    t0_trace_ns: int = 0
    t0_wall: float = field(default_factory=time.time)

    def wall_of(self, trace_ns: int) -> float:
        if self.speed <= 0:
            return self.t0_wall
        return self.t0_wall + (trace_ns - self.t0_trace_ns) / 1e9 / self.speed

    def trace_of(self, wall: float) -> int:
        return int(self.t0_trace_ns + (wall - self.t0_wall) * 1e9 * self.speed)


async def replay_items(trace_dir: str | Path, *, speed: float = 0.0, clock: ReplayClock | None = None,
                       lead_ns: int = 0) -> AsyncIterator[EpochBatch | _events.HookEvent]:
    """Yield the trace's events and batches in publishing order, sleeping to pace them.

    ``lead_ns`` starts the clock that much trace time before the first timed item.
    """
    if speed < 0:
        raise ConfigError(f"replay speed {speed}: must be >= 0 (0 = as fast as possible)")
    reader = TraceReader(trace_dir)
    setup, timed = reader.timeline()
    for ev in setup:
        yield ev
    first = True
    for t, item in timed:
        if first:
            if clock is not None:
                clock.t0_trace_ns = t - lead_ns
                clock.t0_wall = time.time()
            first = False
        if speed > 0 and clock is not None:
            delay = clock.wall_of(t) - time.time()
            if delay > 0.0005:
                await asyncio.sleep(delay)
        yield item


async def publish_trace(pub: Publisher, trace_dir: str | Path, *, speed: float = 0.0,
                        clock: ReplayClock | None = None, job: str | None = None) -> dict[str, int]:
    """Publish a trace directory through ``pub``; returns counts."""
    clock = clock or ReplayClock(speed)
    counts = {"batches": 0, "events": 0, "rows": 0}
    async for item in replay_items(trace_dir, speed=speed, clock=clock):
        if isinstance(item, EpochBatch):
            await pub.publish_batch(item)
            counts["batches"] += 1
            counts["rows"] += item.n_rows
        else:
            await pub.publish_event(item)
            counts["events"] += 1
        if (counts["batches"] + counts["events"]) % 256 == 0:
            await asyncio.sleep(0)  # let the delivery tasks run on a fast replay
    return counts
