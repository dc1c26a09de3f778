"""Files and directories Pulse creates on a node shared with other users.

Pulse often runs as root next to tenants' jobs, in places like ``/var/tmp`` or ``/run``.
Every directory it writes into must be one nobody else can swap files in, and every file it
creates must be new and never reached through a symlink someone planted:

* a directory is accepted when it is not a symlink, is owned by us (or root), and is not
  writable by group or others, unless it is sticky and ours (then nobody else can rename or
  unlink what we create in it);
* a directory Pulse creates itself is made 0700;
* files are created with ``O_CREAT|O_EXCL|O_NOFOLLOW``, mode 0600, relative to the checked
  directory's descriptor (``openat``), so a rename of a parent in between cannot redirect them.

The same rules are in the NCCL plugin (``hooks/nccl_profiler_plugin.c``) and the torch
injection (``hooks/torch_injection/sitecustomize.py``), which cannot import this module.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pulse.errors import ConfigError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def unsafe_reason(st: os.stat_result, euid: int | None = None) -> str | None:
    """Why a directory with this ``stat`` is not safe to create files in, or None."""
    me = os.geteuid() if euid is None else euid
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    if st.st_uid not in (me, 0):
        return f"owned by uid {st.st_uid}, not by us ({me}) or root"
    if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and st.st_uid == me):
        return "writable by other users (and not a sticky directory of ours)"
    return None


def open_private_dir(path: str | os.PathLike[str], what: str, *, create: bool = True) -> int:
    """A descriptor of the checked directory ``path`` (created 0700 when missing and
    ``create``); :class:`ConfigError` naming ``what`` when it is unsafe or unusable."""
    p = Path(path)
    if create:
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(f"{what} {p}: cannot create it ({exc.strerror})") from None
    try:
        fd = os.open(p, _DIR_FLAGS)
    except OSError as exc:
        reason = "a symlink (refused)" if exc.errno == 40 else exc.strerror  # ELOOP
        raise ConfigError(f"{what} {p}: cannot open it as a directory ({reason})") from None
    reason = unsafe_reason(os.fstat(fd))
    if reason is not None:
        os.close(fd)
        raise ConfigError(f"{what} {p}: refused, {reason}")
    return fd


def check_private_dir(path: str | os.PathLike[str], what: str, *, create: bool = True) -> Path:
    """:func:`open_private_dir`, for callers that only need the check."""
    os.close(open_private_dir(path, what, create=create))
    return Path(path)


def create_file(dir_fd: int, name: str, *, append: bool = False) -> int:
    """A new file ``name`` (mode 0600) in the directory ``dir_fd``; ``FileExistsError`` when
    the name is taken (a stale file or a planted symlink: never followed, never truncated)."""
    flags = _NEW_FILE | (os.O_APPEND if append else 0)
    return os.open(name, flags, 0o600, dir_fd=dir_fd)
