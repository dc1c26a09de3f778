"""The services a soak run starts, kills and restarts, and what it samples from them.

* :class:`Service`: a child process on a fixed 127.0.0.1 port with its own log, that can be
  stopped (SIGTERM), killed (SIGKILL) and started again on the same port and data.
* :func:`object_store`: an S3-compatible server (moto's, in memory, outliving every broker
  restart); Tansu's ``s3://`` storage on it makes a broker restart lose nothing (Tansu 0.6
  as shipped has no ``postgres://`` storage built in; its ``memory://`` loses every topic).
* :func:`victoria`: VictoriaMetrics (Debian ``victoria-metrics``), the InfluxDB the
  workers write to (v2 write API); stopped for a while to test the sink's outage handling.
* :class:`Sampler`: RSS and open file descriptors of every process, over time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pulse.broker import HOST, EmbeddedBroker, free_port
from pulse.errors import ServiceError

BUCKET = "tansu"


def find_binary(name: str) -> str | None:
    """``name`` next to this Python (a venv's bin), on PATH, or in the usual system places."""
    here = Path(sys.executable).parent / name
    if here.is_file():
        return str(here)
    found = shutil.which(name)
    if found:
        return found
    for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin"):
        if (Path(d) / name).is_file():
            return str(Path(d) / name)
    return None


def http_ok(url: str, timeout: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return 200 <= resp.status < 300
    except (OSError, urllib.error.URLError):
        return False


class Service:
    """A child process answering ``health_url`` once up; restartable on the same port."""

    def __init__(self, name: str, cmd: Sequence[str], log_path: Path, health_url: str, url: str,
                 *, startup_timeout: float = 60.0) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self.health_url = health_url
        self.url = url
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.proc is None or self.proc.poll() is not None else self.proc.pid

    def start(self) -> Service:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while not http_ok(self.health_url):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_bytes()[-1500:].decode(errors="replace")
                self.kill()
                raise ServiceError(f"{self.name} did not come up at {self.health_url}; log {self.log_path}:\n{tail}")
            time.sleep(0.1)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        stop_proc(self.proc, timeout)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        self.proc = None


def stop_proc(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def object_store(root: Path) -> Service:
    """moto's S3 server on a free port, with the broker's bucket created.

    It keeps objects in memory, so it is never restarted during a soak: what is tested is
    that a *broker* restart loses nothing. The disk-backed S3 servers installable here were
    tried first: localbucket (PyPI) ignores ``If-Match`` on PUT, and Tansu's dynostore
    allocates offsets with a conditional write of the partition's watermark, so two
    producers on one partition got the same offset and one of them ``UnknownError`` (HTTP
    412 on the batch object): a Faust producer does not retry that (lost pipeline records
    in a 1-minute soak). moto honours ``If-Match`` and ``If-None-Match``."""
    binary = find_binary("moto_server")
    if binary is None:
        raise ServiceError("the soak's persistent broker needs an S3-compatible store: pip install 'moto[server]' "
                           "(pulse-monitor[soak])")
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    url = f"http://{HOST}:{port}"
    svc = Service("moto-s3", [binary, "-H", HOST, "-p", str(port)], root / "moto.log", f"{url}/moto-api/",
                  url).start()
    req = urllib.request.Request(f"{url}/{BUCKET}", method="PUT", data=b"")
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()
    return svc


def persistent_broker(store: Service, log_path: Path) -> EmbeddedBroker:
    """Tansu with ``s3://`` storage on ``store`` (started; restart it with the same port)."""
    env = {"AWS_ENDPOINT": store.url, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "pulse",
           "AWS_SECRET_ACCESS_KEY": "pulse-soak", "AWS_DEFAULT_REGION": "us-east-1"}
    return EmbeddedBroker(log_path=log_path, storage=f"s3://{BUCKET}/", storage_env=env, die_with_parent=False)


def victoria(root: Path) -> Service:
    binary = find_binary("victoria-metrics")
    if binary is None:
        raise ServiceError("the soak writes to VictoriaMetrics: apt-get install victoria-metrics")
    port = free_port()
    url = f"http://{HOST}:{port}"
    cmd = [binary, f"-storageDataPath={root / 'vm-data'}", f"-httpListenAddr={HOST}:{port}",
           "-retentionPeriod=100y", "-loggerLevel=WARN", "-search.latencyOffset=0s", "-memory.allowedBytes=256MiB"]
    return Service("victoria-metrics", cmd, root / "victoria.log", f"{url}/health", url).start()


# -- sampling ------------------------------------------------------------------------------

def rss_mb(pid: int) -> float | None:
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def children(pid: int, marker: bytes = b"") -> list[int]:
    """Direct children of ``pid`` whose command line holds ``marker`` (the worker's localize
    process is multiprocessing's ``spawn_main``; its resource tracker is another child)."""
    out = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    if marker:
        def has(c: int) -> bool:
            try:
                return marker in Path(f"/proc/{c}/cmdline").read_bytes()
            except OSError:
                return False
        out = [c for c in out if has(c)]
    return out


class Sampler:
    """RSS (MiB) and open fds of named processes, sampled over time: ``series[name]`` is a list
    of ``(t_s, pid, rss_mb, fds)``; a process restarted under the same name goes on the same list."""

    def __init__(self, procs: Callable[[], dict[str, int | None]]) -> None:
        self.procs = procs
        self.t0 = time.monotonic()
        self.series: dict[str, list[tuple[float, int, float, int]]] = {}

    def sample(self) -> None:
        t = round(time.monotonic() - self.t0, 1)
        for name, pid in self.procs().items():
            if pid is None:
                continue
            rss, fds = rss_mb(pid), open_fds(pid)
            if rss is not None and fds is not None:
                self.series.setdefault(name, []).append((t, pid, round(rss, 1), fds))

    def at(self, name: str, t_s: float) -> tuple[float, int, float, int] | None:
        """The first sample of ``name`` at or after ``t_s`` (else its last)."""
        s = self.series.get(name) or []
        return next((x for x in s if x[0] >= t_s), s[-1] if s else None)

    def summary(self, mark_s: float) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, s in self.series.items():
            mark = self.at(name, mark_s) or s[0]
            out[name] = {"rss_mb_start": s[0][2], "rss_mb_mark": mark[2], "rss_mb_end": s[-1][2],
                         "rss_mb_peak": max(x[2] for x in s), "fds_start": s[0][3], "fds_end": s[-1][3],
                         "fds_peak": max(x[3] for x in s), "pids": len({x[1] for x in s}), "samples": len(s),
                         "per_pid": self._per_pid(s)}
        return out

    @staticmethod
    def _per_pid(s: list[tuple[float, int, float, int]]) -> list[dict[str, Any]]:
        """Each incarnation's first and last sample (a restarted process starts afresh:
        growth is read within one pid)."""
        out: dict[int, dict[str, Any]] = {}
        for t, pid, rss, fds in s:
            d = out.setdefault(pid, {"pid": pid, "from_s": t, "rss_mb_first": rss, "fds_first": fds})
            d.update(to_s=t, rss_mb_last=rss, fds_last=fds, rss_mb_peak=max(d.get("rss_mb_peak", 0.0), rss))
        return list(out.values())
