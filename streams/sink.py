"""The lifecycle every sink of the worker shares: ``setup`` starts one writer task, ``add``
only queues (the agents never wait on a sink), ``flush`` waits for what was queued,
``close`` flushes within a bound and stops the writer."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Generic, TypeVar

T = TypeVar("T")


class QueuedSink(Generic[T]):
    """A bounded queue drained by one task (:meth:`_loop`, the subclass's writer)."""

    name = "pulse-sink"

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._queue: collections.deque[T] = collections.deque()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._busy = False

    async def setup(self) -> QueuedSink[T]:
        await self._open()
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name=self.name)
        return self

    async def flush(self) -> None:
        """Wait until everything queued so far went out (or the writer stopped)."""
        while (self._queue or self._busy) and self._task is not None and not self._task.done():
            if self._wake is not None:
                self._wake.set()
            await asyncio.sleep(0.02)

    async def close(self, *, timeout_s: float = 10.0) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.flush(), timeout_s)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self._shut()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def _wake_writer(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _open(self) -> None:
        """Connect, before the writer starts (a subclass's hook)."""

    def _shut(self) -> None:
        """Release connections after the writer stopped (a subclass's hook)."""

    async def _loop(self) -> None:
        raise NotImplementedError
