"""Compile the NCCL profiler plugin with the system C compiler, on demand, with a cache.

The cache key is a hash of the C sources and the compiler command, so an edited source or a
different compiler rebuilds; an unchanged one is reused across processes.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from pulse.errors import ConfigError, ServiceError

HERE = Path(__file__).resolve().parent
SOURCES = ("nccl_profiler_plugin.c", "pulse_nccl_abi.h")
LIB_NAME = "libnccl-profiler-pulse.so"
CFLAGS = ("-O2", "-fPIC", "-shared", "-pthread", "-std=gnu11")


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise ServiceError("no C compiler found (install gcc or set CC) to build the NCCL profiler plugin")
    return cc


def source_digest(cc: str) -> str:
    h = hashlib.sha256(" ".join((cc, *CFLAGS)).encode())
    for name in SOURCES:
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:16]


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pulse" / "nccl-plugin"


def build_plugin(out_dir: str | os.PathLike[str] | None = None, *, force: bool = False) -> Path:
    """Build ``libnccl-profiler-pulse.so`` into ``out_dir`` (default: a per-user cache) and
    return its path; reuse an up-to-date build unless ``force``."""
    cc = compiler()
    digest = source_digest(cc)
    out = Path(out_dir) if out_dir is not None else default_cache_dir() / digest
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot create the directory ({exc.strerror})") from None
    lib = out / LIB_NAME
    stamp = out / (LIB_NAME + ".sha")
    if not force and lib.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return lib
    # Compile to a temporary name and rename, so a process loading the library never sees a
    # half-written file.
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out)
    os.close(fd)
    cmd = [cc, *CFLAGS, "-I", str(HERE), "-o", tmp, str(HERE / "nccl_profiler_plugin.c")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ServiceError(f"compiling the NCCL profiler plugin with {cc} failed: {exc}") from None
    if proc.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise ServiceError(f"compiling the NCCL profiler plugin failed ({' '.join(cmd)}):\n{proc.stderr.strip()}")
    os.replace(tmp, lib)
    stamp.write_text(digest + "\n")
    return lib
