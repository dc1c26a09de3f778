"""Click parameter types every ``pulse`` command uses for numbers and paths.

A bad value is a usage error (exit 2) naming the option and what it accepts, raised
before any work starts: nan, inf and out-of-range numbers; output directories that are
not empty (``--force`` replaces a Pulse trace, never appends to it) or cannot be
created; inputs that are not regular files (a FIFO, a device such as /dev/zero or a
socket would hang a reader or exhaust memory) unless the command follows a stream.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from pathlib import Path
from typing import Any

import click

from pulse.errors import ConfigError
from pulse.trace import TRACE_ENTRIES, remove_trace

# Linux: a component over NAME_MAX or a path over PATH_MAX fails deep inside a writer.
NAME_MAX = 255
PATH_MAX = 4096


class Number(click.ParamType):
    """An int or float within [lo, hi]; nan and inf are never accepted."""

    def __init__(self, kind: type = float, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False) -> None:
        self.kind = kind
        self.lo = lo
        self.hi = hi
        self.lo_open = lo_open
        self.name = "integer" if kind is int else "number"

    def _range(self) -> str:
        lo = "" if self.lo is None else f"{'>' if self.lo_open else '>='} {self._fmt(self.lo)}"
        hi = "" if self.hi is None else f"<= {self._fmt(self.hi)}"
        return " and ".join(x for x in (lo, hi) if x) or "finite"

    def _fmt(self, v: float) -> str:
        return str(int(v)) if self.kind is int else f"{v:g}"

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "INTEGER" if self.kind is int else "NUMBER"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a number", param, ctx)
        if self.kind is int:
            if isinstance(value, int):
                v: Any = value
            else:
                try:
                    v = int(str(value).strip(), 10)
                except ValueError:
                    self.fail(f"{value!r} is not an integer (must be {self._range()})", param, ctx)
        else:
            try:
                v = float(value)
            except (TypeError, ValueError):
                self.fail(f"{value!r} is not a number (must be {self._range()})", param, ctx)
            if not math.isfinite(v):
                self.fail(f"{value!r} is not a finite number (must be {self._range()})", param, ctx)
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            self.fail(f"{value} is out of range (must be {self._range()})", param, ctx)
        if self.hi is not None and v > self.hi:
            self.fail(f"{value} is out of range (must be {self._range()})", param, ctx)
        return v


def count(lo: int = 0, hi: int = 2**31 - 1) -> Number:
    return Number(int, lo, hi)


def seconds(lo: float = 0.0, hi: float = 7 * 86400.0, *, lo_open: bool = True) -> Number:
    """A duration or timeout: positive and at most a week unless told otherwise."""
    return Number(float, lo, hi, lo_open=lo_open)


def _check_name(path: Path, param: click.Parameter | None, ctx: click.Context | None, fail: Any) -> None:
    s = os.fsencode(str(path))
    if len(s) >= PATH_MAX:
        fail(f"{str(path)[:40]}...: path is {len(s)} bytes, longer than the system allows ({PATH_MAX - 1})",
             param, ctx)
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            fail(f"{part[:40]}...: a file name over {NAME_MAX} bytes", param, ctx)


def _looks_like_trace(p: Path) -> bool:
    return any((p / n).exists() or (p / n).is_symlink() for n in TRACE_ENTRIES)


class OutDir(click.ParamType):
    """A directory to write: absent and creatable, or an empty directory. With the
    command's ``--force`` (declared eager, so it is parsed first) an existing Pulse trace is
    accepted and replaced by :func:`replace_output`; a directory holding anything else is
    never touched."""

    name = "directory"

    def __init__(self, force_param: str | None = "force") -> None:
        self.force_param = force_param

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        p = Path(os.fsdecode(value))
        _check_name(p, param, ctx, self.fail)
        force = bool(ctx and self.force_param and ctx.params.get(self.force_param))
        hint = " (give --force to replace it)" if self.force_param else ""
        try:
            st = os.stat(p)
        except FileNotFoundError:
            if p.is_symlink():
                self.fail(f"{p}: a dangling symbolic link", param, ctx)
            _check_creatable(p, param, ctx, self.fail)
            return str(p)
        except OSError as exc:
            self.fail(f"{p}: {_reason(exc)}", param, ctx)
        if not stat.S_ISDIR(st.st_mode):
            self.fail(f"{p}: exists and is not a directory", param, ctx)
        try:
            entries = os.listdir(p)
        except OSError as exc:
            self.fail(f"{p}: {_reason(exc)}", param, ctx)
        if not os.access(p, os.W_OK | os.X_OK):
            self.fail(f"{p}: directory is not writable", param, ctx)
        if entries:
            if not force:
                self.fail(f"{p}: directory is not empty{hint}", param, ctx)
            others = sorted(set(entries) - set(TRACE_ENTRIES))
            if others:
                self.fail(f"{p}: not a Pulse trace ({others[0]!r} in it); --force replaces only a trace",
                          param, ctx)
        return str(p)


class KeepDir(OutDir):
    """A directory a command keeps its work in and reuses (a cache): an existing directory,
    or an absent one that can be created."""

    def __init__(self) -> None:
        super().__init__(force_param=None)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        p = Path(os.fsdecode(value))
        _check_name(p, param, ctx, self.fail)
        try:
            if stat.S_ISDIR(os.stat(p).st_mode) and os.access(p, os.W_OK | os.X_OK):
                return p
        except OSError:
            pass  # absent, or a loop: OutDir says which
        return Path(super().convert(value, param, ctx))


class OutFile(click.ParamType):
    """A file to write: its directory must exist and be writable; an existing file is
    replaced only with ``--force``."""

    name = "file"

    def __init__(self, force_param: str | None = "force") -> None:
        self.force_param = force_param

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        p = Path(os.fsdecode(value))
        _check_name(p, param, ctx, self.fail)
        force = bool(ctx and self.force_param and ctx.params.get(self.force_param))
        try:
            st = os.stat(p)
        except FileNotFoundError:
            if p.is_symlink():
                self.fail(f"{p}: a dangling symbolic link", param, ctx)
            _check_creatable(p, param, ctx, self.fail)
            return p
        except OSError as exc:
            self.fail(f"{p}: {_reason(exc)}", param, ctx)
        if not stat.S_ISREG(st.st_mode):
            self.fail(f"{p}: exists and is not a regular file", param, ctx)
        if not force:
            self.fail(f"{p}: file exists (give --force to replace it)", param, ctx)
        if not os.access(p, os.W_OK):
            self.fail(f"{p}: file is not writable", param, ctx)
        return p


def _reason(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "too many levels of symbolic links"
    return exc.strerror or str(exc)


def _check_creatable(p: Path, param: click.Parameter | None, ctx: click.Context | None, fail: Any, *,
                     directory: bool = True) -> None:
    """The nearest existing ancestor must be a writable directory on a real file system."""
    anc = p.absolute().parent
    while True:
        try:
            st = os.stat(anc)
            break
        except FileNotFoundError:
            if not directory:
                fail(f"{p}: directory {anc} does not exist", param, ctx)
            anc = anc.parent
        except OSError as exc:
            fail(f"{p}: {anc}: {_reason(exc)}", param, ctx)
    if not stat.S_ISDIR(st.st_mode):
        fail(f"{p}: {anc} is not a directory", param, ctx)
    real = os.path.realpath(anc)
    if real == "/proc" or real.startswith(("/proc/", "/sys/")) or real == "/sys":
        fail(f"{p}: cannot write under {real}", param, ctx)
    if not os.access(anc, os.W_OK | os.X_OK):
        fail(f"{p}: {anc} is not writable", param, ctx)


def replace_output(path: str | Path) -> None:
    """Remove what a previous Pulse run wrote into ``path`` (only the trace entries, which
    :class:`OutDir` checked are all there is), so a rerun replaces rather than appends."""
    remove_trace(path)


class InFile(click.ParamType):
    """An existing regular file to read (``-`` for stdin where allowed). A FIFO is
    accepted only by a follower (it is a stream); a device, socket or directory never."""

    name = "file"

    def __init__(self, *, allow_dash: bool = False, allow_fifo: bool = False, allow_missing: bool = False) -> None:
        self.allow_dash = allow_dash
        self.allow_fifo = allow_fifo
        self.allow_missing = allow_missing  # a follower waits for the file to appear

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        s = os.fsdecode(value)
        if self.allow_dash and s == "-":
            return s
        p = Path(s)
        _check_name(p, param, ctx, self.fail)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            if self.allow_missing and not p.is_symlink():
                return s
            self.fail(f"{p}: no such file", param, ctx)
        except OSError as exc:
            self.fail(f"{p}: {_reason(exc)}", param, ctx)
        if stat.S_ISREG(st.st_mode) or (self.allow_fifo and stat.S_ISFIFO(st.st_mode)):
            if not os.access(p, os.R_OK):
                self.fail(f"{p}: file is not readable", param, ctx)
            return s
        self.fail(f"{p}: {kind_of(st.st_mode)}, not a regular file", param, ctx)


class InDir(click.ParamType):
    """An existing, readable directory."""

    name = "directory"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        p = Path(os.fsdecode(value))
        _check_name(p, param, ctx, self.fail)
        try:
            st = os.stat(p)
        except FileNotFoundError:
            self.fail(f"{p}: no such directory", param, ctx)
        except OSError as exc:
            self.fail(f"{p}: {_reason(exc)}", param, ctx)
        if not stat.S_ISDIR(st.st_mode):
            self.fail(f"{p}: {kind_of(st.st_mode)}, not a directory", param, ctx)
        if not os.access(p, os.R_OK | os.X_OK):
            self.fail(f"{p}: directory is not readable", param, ctx)
        return p


def kind_of(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISREG(mode):
        return "a regular file"
    return "not a regular file"


def force_option(help: str = "Replace an existing output (a Pulse trace or file); never appends.") -> Any:
    """``--force``, parsed before the output path so :class:`OutDir` can see it."""
    return click.option("--force", is_flag=True, is_eager=True, help=help)


SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the terminating NUL


def check_socket_path(path: str | Path) -> None:
    """A path a datagram socket is about to be bound at: an existing socket (replaced), or
    a new name in an existing directory. Binding creates a file that then waits for data,
    so a mistyped record-file name or anything that is not a socket is refused."""
    p = Path(path)
    if p.exists() or p.is_symlink():
        mode = os.lstat(p).st_mode
        if not stat.S_ISSOCK(mode):
            raise ConfigError(f"{p}: {kind_of(mode)}, neither a record file nor a socket")
        return
    if p.suffix in (".rec", ".log", ".jsonl", ".json", ".txt"):
        raise ConfigError(f"{p}: no such record file (a socket path must not end in {p.suffix})")
    if not p.parent.is_dir():
        raise ConfigError(f"{p}: directory {p.parent} does not exist")
    if len(os.fsencode(str(p))) > SOCKET_PATH_MAX:
        raise ConfigError(f"{p}: a socket path is at most {SOCKET_PATH_MAX} bytes")
