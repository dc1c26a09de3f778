"""The one progress-bar convention of the CLI (DESIGN.md "CLI conventions").

A rich progress bar on stderr, shown only when stderr is a terminal and the command is not
in ``--json`` mode; otherwise every call is a no-op, so a command's code is the same either
way::

    with progress("simulating", total=steps, json_mode=as_json) as bar:
        for step in ...:
            bar.advance()

``total=None`` gives an indeterminate bar (a spinner with the elapsed time).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any


class Tracker:
    """What a command talks to; the quiet one drops everything."""

    def advance(self, amount: float = 1.0) -> None:
        pass

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        pass

    @property
    def shown(self) -> bool:
        return False


class _RichTracker(Tracker):
    def __init__(self, bar: Any, task: Any) -> None:
        self._bar = bar
        self._task = task

    def advance(self, amount: float = 1.0) -> None:
        self._bar.advance(self._task, amount)

    def update(self, *, completed: float | None = None, total: float | None = None,
               description: str | None = None) -> None:
        kwargs: dict[str, Any] = {}
        if completed is not None:
            kwargs["completed"] = completed
        if total is not None:
            kwargs["total"] = total
        if description is not None:
            kwargs["description"] = description
        self._bar.update(self._task, **kwargs)

    @property
    def shown(self) -> bool:
        return True


def enabled(*, json_mode: bool = False, stream: IO[str] | None = None) -> bool:
    """True when a bar would be drawn: not --json and the stream is a terminal."""
    if json_mode:
        return False
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real file
        return False


@contextmanager
def progress(description: str, total: float | None = None, *, json_mode: bool = False,
             stream: IO[str] | None = None) -> Iterator[Tracker]:
    """A progress bar on ``stream`` (stderr) when :func:`enabled`, else a quiet tracker."""
    if not enabled(json_mode=json_mode, stream=stream):
        yield Tracker()
        return
    # rich is imported here so quiet runs (tests, --json, pipes) never pay for it.
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = Console(file=sys.stderr if stream is None else stream)
    columns: list[Any] = [SpinnerColumn(), TextColumn("[progress.description]{task.description}")]
    if total is not None:
        columns += [BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()]
    columns.append(TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        yield _RichTracker(bar, bar.add_task(description, total=total))
