"""A blocking façade over :class:`~pulse.producers.publisher.Publisher` for synchronous
sources (live capture, followed log files, the plugin socket): the publisher's event loop
runs in a daemon thread; ``publish`` hands messages over and returns once they are queued
(or spooled), never waiting for the broker."""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Iterable
from typing import Any

from pulse import events as _events
from pulse.samples import EpochBatch
from pulse.settings import Settings

from .publisher import Publisher


class SyncPublisher:
    def __init__(self, settings: Settings | None = None, **kwargs: Any) -> None:
        self.settings = settings or Settings.from_env()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pulse-publisher", daemon=True)
        self._thread.start()
        self._pub: Publisher = self._call(self._make(kwargs))
        self._closed = False

    async def _make(self, kwargs: dict[str, Any]) -> Publisher:
        pub = Publisher(self.settings, **kwargs)
        await pub.start(wait_s=5.0)
        return pub

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def publish(self, batches: Iterable[EpochBatch] = (), events: Iterable[_events.HookEvent] = ()) -> None:
        batches, events = list(batches), list(events)

        async def go() -> None:
            for ev in events:  # descriptors first: they tell the segmenter what the bytes are
                await self._pub.publish_event(ev)
            for b in batches:
                await self._pub.publish_batch(b)

        self._call(go())

    __call__ = publish

    def publish_raw(self, topic: str, key: bytes, value: bytes) -> None:
        """One message as it is (e.g. a health record on the pipeline topic), through the spool."""
        self._call(self._pub.publish(topic, key, value))

    def flush(self, timeout: float | None = None) -> None:
        self._call(self._pub.flush(), timeout)

    @property
    def stats(self) -> dict[str, Any]:
        return self._pub.stats

    def close(self, drain_timeout_s: float = 30.0) -> dict[str, Any]:
        if self._closed:
            return self._pub.stats
        self._closed = True
        self._call(self._pub.stop(drain_timeout_s=drain_timeout_s))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        return self._pub.stats

    def __enter__(self) -> SyncPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: SyncPublisher | None = None
_lock = threading.Lock()


def publish_batches(batches: Iterable[EpochBatch] = (), events: Iterable[_events.HookEvent] = ()) -> None:
    """Publish with a process-wide publisher built from ``Settings.from_env()`` (closed, and
    its spool drained as far as possible, at exit). The entry point ``pulse capture
    --publish`` calls per window."""
    global _default
    with _lock:
        if _default is None:
            _default = SyncPublisher()
            atexit.register(_default.close)
    _default.publish(batches, events)
