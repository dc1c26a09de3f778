"""The agent's sources, each a supervised thread that survives its input going away.

Each source puts ``(kind, payload)`` items on the agent's queue and keeps its state in a
:class:`SourceStatus` (reported in the agent's health record). A source whose input
disappears (the capture interface or its namespace deleted, the hook directory removed, a
log rotated, the plugin socket unlinked, ``rdma`` failing) goes ``down``, waits and tries
again; a job ending and the next one starting needs no restart of the agent.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import queue
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pulse.errors import PulseError

RETRY_S = 1.0
SCAN_S = 0.2
CLONE_NEWNET = 0x40000000


@dataclasses.dataclass
class SourceStatus:
    name: str
    state: str = "starting"
    """starting | up | down | unavailable | stopped"""
    error: str | None = None
    seen: int = 0
    """items (events, batches, QPs) this source produced"""
    restarts: int = 0
    last_ns: int | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"state": self.state, "error": self.error, "seen": self.seen, "restarts": self.restarts,
                "last_ns": self.last_ns, **self.extra}


class Source(threading.Thread):
    name_: str = "source"
    says_when_up: bool = False
    """True where run_once calls :meth:`up` itself once it really produces (a capture's
    kernels compile and its ring opens first: "up" before that let a job start unwatched)"""

    def __init__(self, out: queue.Queue[tuple[str, Any]], stop: threading.Event) -> None:
        super().__init__(name=f"pulse-agent-{self.name_}", daemon=True)
        self.out = out
        self.halt = stop
        self.status = SourceStatus(self.name_)

    def put(self, kind: str, payload: Any, n: int) -> None:
        if n:
            self.status.seen += n
            self.status.last_ns = time.time_ns()
        self.out.put((kind, payload))

    def up(self) -> None:
        self.status.state = "up"

    def run(self) -> None:
        first = True
        while not self.halt.is_set():
            if not first:
                self.status.restarts += 1
            first = False
            try:
                self.status.state, self.status.error = ("starting" if self.says_when_up else "up"), None
                self.run_once()
                if self.halt.is_set():
                    break
                self.status.state = "down"
            except PulseError as exc:
                self.status.state, self.status.error = "down", str(exc)
            except OSError as exc:
                self.status.state, self.status.error = "down", f"{type(exc).__name__}: {exc}"
            self.halt.wait(RETRY_S)
        self.status.state = "stopped"

    def run_once(self) -> None:  # pragma: no cover - every source overrides it
        raise NotImplementedError


def _netns_path(name: str) -> Path:
    return Path(name) if "/" in name else Path("/run/netns") / name


def enter_netns(name: str) -> None:
    """Move the calling thread into network namespace ``name`` (/run/netns/NAME, as `ip
    netns` creates them). Only this thread moves; its sockets stay in that namespace."""
    path = _netns_path(name)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


class CaptureSource(Source):
    """Live per-flow epochs of one interface (:func:`pulse.nic.live.capture_live`)."""

    name_ = "capture"
    says_when_up = True

    def __init__(self, out: queue.Queue[tuple[str, Any]], stop: threading.Event, *, iface: str, node: str,
                 local: list[str], epoch_ns: int, window_ns: int, netns: str | None = None,
                 job: str = "", snaplen: int = 0) -> None:
        super().__init__(out, stop)
        self.iface, self.node, self.local, self.job, self.snaplen = iface, node, local, job, snaplen
        self.epoch_ns, self.window_ns, self.netns = epoch_ns, window_ns, netns
        self.ready = threading.Event()

    def _ready(self) -> None:
        self.up()
        self.ready.set()

    def run_once(self) -> None:
        from pulse.nic.live import capture_live

        if self.netns:
            enter_netns(self.netns)  # again on every try: the namespace may have been re-created

        def emit(batches: list[Any], events: list[Any]) -> None:
            self.put("capture", (batches, events), len(batches) + len(events))

        def window(stats: dict[str, Any]) -> None:
            # counters of this capture (a restart starts them again): keep the totals
            self.status.extra.update({k: self._base.get(k, 0) + v for k, v in stats.items()})

        ifindex = socket.if_nametoindex(self.iface)  # OSError: no such interface (yet)
        checked = [time.monotonic()]

        def stop() -> bool:
            if self.halt.is_set():
                return True
            if time.monotonic() - checked[0] < 1.0:
                return False
            checked[0] = time.monotonic()
            # A deleted interface leaves the ring open and silent: notice it, and one deleted
            # and created again (a new index), and start over on the new one.
            try:
                gone = socket.if_nametoindex(self.iface) != ifindex
                if self.netns and not gone:
                    # our thread keeps a deleted namespace (and its interfaces) alive
                    gone = os.stat(_netns_path(self.netns)).st_ino != os.stat("/proc/thread-self/ns/net").st_ino
            except OSError:
                gone = True
            if gone:
                self.status.error = f"interface {self.iface} went away"
            return gone

        self._base = {k: v for k, v in self.status.extra.items() if isinstance(v, int)}
        capture_live(self.iface, out=None, epoch_ns=self.epoch_ns, window_ns=self.window_ns, local=self.local,
                     node=self.node, job=self.job, publisher=emit, stop=stop, on_window=window, ready=self._ready,
                     snaplen=self.snaplen)


@dataclasses.dataclass
class _File:
    ino: int
    offset: int = 0
    partial: bytes = b""
    parser: Any = None


class HookDirSource(Source):
    """Follows every hook file of a directory, like ``tail -F``: the torch injection's
    ``torch-*.jsonl``, NCCL debug logs (``*.log``, ``*.txt``) and the NCCL plugin's record
    files (``*.rec``). New files are picked up, removed or replaced files let go (their
    parser flushed); the directory itself may come and go."""

    name_ = "hook-dir"

    def __init__(self, out: queue.Queue[tuple[str, Any]], stop: threading.Event, *, directory: Path,
                 node: str, job: str = "") -> None:
        super().__init__(out, stop)
        self.dir, self.node, self.job = Path(directory), node, job
        self.files: dict[str, _File] = {}
        self.status.extra.update({"files": 0, "bad_lines": 0, "other_nodes": 0})

    def run_once(self) -> None:
        while not self.halt.is_set():
            self.scan()
            self.halt.wait(SCAN_S)
        self.scan()
        self._close_all()

    def _kind(self, name: str) -> str | None:
        if name.startswith("torch-") and name.endswith(".jsonl"):
            return "torch"
        if name.endswith(".rec"):
            return "plugin"
        if name.endswith((".log", ".txt")):
            return "nccl"
        return None

    def scan(self) -> None:
        try:
            names = {e.name: e for e in os.scandir(self.dir) if e.is_file() and self._kind(e.name)}
        except OSError:
            names = {}
        for gone in [n for n in self.files if n not in names]:
            self._close(gone)
        for name in sorted(names):
            try:
                st = names[name].stat()
            except OSError:
                continue
            f = self.files.get(name)
            if f is not None and (f.ino != st.st_ino or st.st_size < f.offset):
                self._close(name)  # replaced or truncated: read the new one from its start
                f = None
            if f is None:
                f = self.files[name] = _File(st.st_ino, parser=self._parser(name))
            if st.st_size > f.offset:
                self._read(name, f)
        self.status.extra["files"] = len(self.files)

    def _parser(self, name: str) -> Any:
        kind = self._kind(name)
        if kind == "nccl":
            from pulse.hooks.nccl_log import NcclLogParser

            return NcclLogParser(job=self.job, node=self.node)
        if kind == "plugin":
            from pulse.hooks.plugin_reader import PluginDecoder

            return PluginDecoder(job=self.job, node=self.node)
        return None

    def _read(self, name: str, f: _File) -> None:
        try:
            with open(self.dir / name, "rb") as fh:
                fh.seek(f.offset)
                data = fh.read(16 << 20)
        except OSError:
            return
        f.offset += len(data)
        kind = self._kind(name)
        events: list[Any] = []
        if kind == "plugin":
            try:
                events = f.parser.feed(data, where=name)
            except PulseError:
                self.status.extra["bad_lines"] += 1
        else:
            data = f.partial + data
            lines = data.split(b"\n")
            f.partial = lines.pop()
            if kind == "torch":
                events = self._torch(lines, name)
            else:
                for line in lines:
                    f.parser.line(line.decode("utf-8", "replace"), events)
        self._emit(events)

    def _torch(self, lines: list[bytes], name: str) -> list[Any]:
        from pulse.events import decode

        out = []
        for line in lines:
            if not line.strip():
                continue
            try:
                ev = decode(line, name)
            except PulseError:
                self.status.extra["bad_lines"] += 1
                continue
            if ev.node != self.node:
                self.status.extra["other_nodes"] += 1  # a directory shared by several nodes
                continue
            out.append(ev)
        return out

    def _emit(self, events: list[Any]) -> None:
        if events:
            self.put("hooks", events, len(events))

    def _close(self, name: str) -> None:
        f = self.files.pop(name)
        if f.parser is not None:
            out: list[Any] = []
            if f.partial and self._kind(name) == "nccl":
                f.parser.line(f.partial.decode("utf-8", "replace"), out)
            self._emit(out + f.parser.flush())

    def _close_all(self) -> None:
        for name in list(self.files):
            self._close(name)


class PluginSocketSource(Source):
    """The NCCL profiler plugin's Unix datagram socket (its ``PULSE_HOOK_SOCKET``), bound
    for the agent's whole life: every job's plugin sends to the same path."""

    name_ = "plugin-socket"

    def __init__(self, out: queue.Queue[tuple[str, Any]], stop: threading.Event, *, path: Path, node: str,
                 job: str = "") -> None:
        super().__init__(out, stop)
        self.path, self.node, self.job = Path(path), node, job
        self.status.extra["bad_datagrams"] = 0

    def run_once(self) -> None:
        from pulse.hooks.plugin_reader import PluginDecoder

        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        dec = PluginDecoder(job=self.job, node=self.node)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(str(self.path))
            ino = self.path.stat().st_ino
            sock.settimeout(0.2)
            while not self.halt.is_set():
                try:
                    data = sock.recv(1 << 16)
                except TimeoutError:
                    try:
                        if self.path.stat().st_ino != ino:
                            return  # someone replaced our socket file: bind again
                    except FileNotFoundError:
                        return
                    continue
                try:
                    events = dec.feed_datagram(data)
                except PulseError:
                    self.status.extra["bad_datagrams"] += 1
                    continue
                if events:
                    self.put("hooks", events, len(events))
            tail = dec.flush()
            if tail:
                self.put("hooks", tail, len(tail))
        finally:
            sock.close()
            if self.halt.is_set():
                self.path.unlink(missing_ok=True)


class RdmaResSource(Source):
    """Polls ``rdma -j res show qp`` (iproute2); the QPs go to the agent's join. Unavailable
    (and said so in the health record) where there is no ``rdma`` tool or no RDMA device."""

    name_ = "rdma-res"

    def __init__(self, out: queue.Queue[tuple[str, Any]], stop: threading.Event, *, every_s: float = 2.0,
                 netns: str | None = None, runner: Callable[[list[str]], str] | None = None) -> None:
        super().__init__(out, stop)
        self.every_s = every_s
        self.netns = netns
        self.runner = runner or self._run

    def _run(self, cmd: list[str]) -> str:
        if self.netns:
            cmd = ["ip", "netns", "exec", self.netns, *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        if proc.returncode != 0:
            raise OSError(proc.returncode, proc.stderr.strip()[:200] or f"{cmd[0]} failed")
        return proc.stdout

    def run(self) -> None:
        if self.runner == self._run and (shutil.which("rdma") is None or not _rdma_devices()):
            self.status.state = "unavailable"
            self.status.error = "no rdma tool" if shutil.which("rdma") is None else "no RDMA device"
            return
        super().run()

    def run_once(self) -> None:
        from pulse.hooks.rdma_res import parse_rdma_qp

        while not self.halt.is_set():
            qps = parse_rdma_qp(self.runner(["rdma", "-j", "res", "show", "qp"]))
            self.put("rdma", qps, len(qps))
            self.halt.wait(self.every_s)


def _rdma_devices() -> list[str]:
    try:
        return sorted(os.listdir("/sys/class/infiniband"))
    except OSError:
        return []
