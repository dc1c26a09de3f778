"""The localize agent's state in a child process, so localization gets a core of its own.

A worker's Faust event loop, its segment thread and its localize thread share one GIL: on
the default 64-GPU demo localization alone needs more CPU than the stream's duration, and
in the same process it also starves segmentation. :class:`LocalizeProcess` has the
interface of :class:`~pulse.streams.state.LocalizeState` that the app uses (``handle``,
``tick``, ``held``, ``active``) and runs it in one spawned child (a single worker process,
so calls are applied in the order they are made; the app makes them from one thread).
Messages go over as bytes and verdicts come back: a few kB per call.

The child is spawned, not forked (the worker has running threads and sockets), and exits
when the worker does (also after a SIGKILL: it watches its parent).
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Iterable
from typing import Any

from pulse.records import Incident

from .state import LocalizeState, Message, Output

log = logging.getLogger("pulse.streams")

_state: LocalizeState | None = None


def _init(params: Any, kwargs: dict[str, Any]) -> None:
    global _state
    _state = LocalizeState(params, **kwargs)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="pulse-parent-watch", daemon=True).start()


def _exit_with_parent(parent: int) -> None:
    # The child holds both ends of its call queue, so a parent that was SIGKILLed leaves it
    # waiting forever: notice the parent is gone (re-parented) and leave.
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


Reply = tuple[Output, int, bool, int, int, int]


def _reply(out: Output) -> Reply:
    assert _state is not None
    return out, _state.held, _state.active, _state.backlog, _state.metrics, _state.late_records


def _handle(messages: list[Message], now: float | None) -> Reply:
    assert _state is not None
    return _reply(_state.handle(messages, now))


def _tick(now: float | None) -> Reply:
    assert _state is not None
    return _reply(_state.tick(now) if _state.active else Output())


def _settle() -> Reply:
    assert _state is not None
    return _reply(_state.settle())


def _adopt(partitions: set[int], count: int, messages: list[Message], incidents: list[Incident]) -> Reply:
    assert _state is not None
    _state.adopt(partitions, count, messages, incidents)
    return _reply(Output())


def _finish() -> Reply:
    assert _state is not None
    return _reply(_state.finish())


class LocalizeProcess:
    """:class:`LocalizeState` in a child process (blocking calls; make them from one thread).

    Calls judge released operators for at most ``budget_s`` (then ``backlog`` > 0: call
    ``tick`` again), so verdicts come back while the localizer works through a backlog."""

    def __init__(self, params: Any = None, *, budget_s: float | None = 0.1, **kwargs: Any) -> None:
        self._args = (params, {**kwargs, "budget_s": budget_s})
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.held = 0
        self.active = False
        self.backlog = 0
        self.metrics = 0
        self.late_records = 0

    def start(self, timeout_s: float | None = None) -> None:
        """Spawn the child and wait until it imported localization (the first call does
        it otherwise; a worker calls this before taking messages)."""
        self._submit(_tick, None).result(timeout_s)

    def _submit(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_init, initargs=self._args)
        return self._pool.submit(fn, *args)

    def _call(self, fn: Any, *args: Any) -> Output:
        out, self.held, self.active, self.backlog, self.metrics, self.late_records = self._submit(fn, *args).result()
        return out

    def handle(self, messages: Iterable[Message], now: float | None = None) -> Output:
        return self._call(_handle, list(messages), now)

    def tick(self, now: float | None = None) -> Output:
        return self._call(_tick, now)

    def settle(self) -> Output:
        return self._call(_settle)

    def adopt(self, partitions: set[int], count: int, messages: list[Message],
              incidents: Iterable[Incident] = ()) -> None:
        self._call(_adopt, partitions, count, messages, list(incidents))

    def finish(self) -> Output:
        return self._call(_finish)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
