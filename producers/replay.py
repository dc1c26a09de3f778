"""Replaying a trace directory into Kafka, as fast as possible or paced by its timestamps.

Comm and flow events (membership, flow bindings) go first; then op events and epoch
batches merged in trace time: an op event at its ``t_host_ns``, a batch when its last
epoch ends (that is when a live source could have sent it). Paced replay maps trace time
to wall time (``speed`` trace seconds per wall second) so a recorded or simulated job
looks live to the pipeline; :class:`ReplayClock` keeps the mapping so callers can turn a
trace time into the wall time it was published at.

A live replay (``rebase=True``) also moves every timestamp it publishes (batches' ``t0_ns``,
hook events' ``t_host_ns``) by one offset per run, chosen so that the first timed item
carries the wall-clock time it is sent at: a simulated or recorded job then looks like one
running now to everything downstream (InfluxDB refuses points older than a bucket's
retention), while relative timing and each node's clock offset are kept exactly (so at a
``speed`` other than 1 the job's clock drifts from the wall clock as the run goes on). The
trace files themselves are never changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from pulse import events as _events
from pulse.errors import ConfigError
from pulse.samples import EpochBatch
from pulse.trace import TraceReader

from .publisher import Publisher

SECOND_NS = 1_000_000_000


@dataclass
class ReplayClock:
    """Trace time -> wall time of a paced replay (``speed`` 0 = as fast as possible)."""

    speed: float
    t0_trace_ns: int = 0
    t0_wall: float = field(default_factory=time.time)
    offset_ns: int = 0
    """Added to every published timestamp (0 unless the replay rebases onto the wall clock)."""

    def wall_of(self, trace_ns: int) -> float:
        if self.speed <= 0:
            return self.t0_wall
        return self.t0_wall + (trace_ns - self.t0_trace_ns) / 1e9 / self.speed

    def trace_of(self, wall: float) -> int:
        return int(self.t0_trace_ns + (wall - self.t0_wall) * 1e9 * self.speed)


def rebased(item: EpochBatch | _events.HookEvent, offset_ns: int) -> EpochBatch | _events.HookEvent:
    """``item`` with its timestamp moved by ``offset_ns`` (the item itself when 0 or untimed)."""
    if not offset_ns:
        return item
    if isinstance(item, EpochBatch):
        return dataclasses.replace(item, t0_ns=item.t0_ns + offset_ns)
    if item.t_host_ns is None:
        return item
    return dataclasses.replace(item, t_host_ns=item.t_host_ns + offset_ns)


async def replay_items(trace_dir: str | Path, *, speed: float = 0.0, clock: ReplayClock | None = None,
                       lead_ns: int = 0, rebase: bool = False) -> AsyncIterator[EpochBatch | _events.HookEvent]:
    """Yield the trace's events and batches in publishing order, sleeping to pace them.

    ``lead_ns`` starts the clock that much trace time before the first timed item.
    ``rebase`` moves every timestamp onto the wall clock (module docstring); the offset is
    fixed before the first item, setup events included, and kept in ``clock.offset_ns``.
    """
    if speed < 0:
        raise ConfigError(f"replay speed {speed}: must be >= 0 (0 = as fast as possible)")
    reader = TraceReader(trace_dir)
    setup, timed = reader.timeline()
    offset = 0
    if rebase:
        first_item = next(timed, None)
        if first_item is not None:
            # The first timed item's time (a batch: the end of its last epoch) becomes about
            # now, never later: everything is published at or after the instant it claims.
            # A whole number of epochs keeps every batch on the epoch grid it had (whole
            # seconds when the trace does not say its epoch).
            epoch_ns = reader.meta.get("epoch_ns")
            step = epoch_ns if isinstance(epoch_ns, int) and epoch_ns > 0 else SECOND_NS
            offset = (time.time_ns() - first_item[0]) // step * step
            timed = itertools.chain([first_item], timed)
    if clock is not None:
        clock.offset_ns = offset
    for ev in setup:
        yield rebased(ev, offset)
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
        yield rebased(item, offset)


async def publish_trace(pub: Publisher, trace_dir: str | Path, *, speed: float = 0.0,
                        clock: ReplayClock | None = None, job: str | None = None,
                        rebase: bool = False) -> dict[str, int]:
    """Publish a trace directory through ``pub``; returns counts (``rebase``: onto the wall
    clock, see the module docstring)."""
    clock = clock or ReplayClock(speed)
    counts = {"batches": 0, "events": 0, "rows": 0}
    async for item in replay_items(trace_dir, speed=speed, clock=clock, rebase=rebase):
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
