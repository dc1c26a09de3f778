"""Real services for tests: InfluxDB 1.x and VictoriaMetrics, each on free 127.0.0.1 ports
with its own temporary directory, started as child processes and stopped at the end.

The embedded Kafka broker lives in :mod:`pulse.broker` (``pulse demo`` uses it too).
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# one copy, in the package: the soak starts these services outside the tests too
from pulse.streams.soak_services import find_binary as find_binary
from pulse.streams.soak_services import http_ok as http_ok

from pulse.broker import HOST, free_port

INFLUXD = "influxd"
VICTORIA = "victoria-metrics"
ALERTMANAGER = "prometheus-alertmanager"
APT_HINT = "apt-get install -y influxdb victoria-metrics (scripts/dev.sh test does it as root)"


class ServiceStartError(RuntimeError):
    """A test service did not come up (the message quotes its log)."""


class Service:
    """A child process with a log file and an HTTP health URL; a context manager."""

    def __init__(self, name: str, cmd: Sequence[str], workdir: Path, health_url: str, base_url: str,
                 *, startup_timeout: float = 60.0) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.workdir = workdir
        self.health_url = health_url
        self.url = base_url
        self.startup_timeout = startup_timeout
        self.log_path = workdir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def log_tail(self, limit: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def start(self) -> Service:
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=self.workdir,
                                          start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout
        while not http_ok(self.health_url):
            if self._proc.poll() is not None:
                raise ServiceStartError(f"{self.name} exited with status {self._proc.returncode} "
                                        f"during startup; log:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceStartError(f"{self.name} did not answer {self.health_url} within "
                                        f"{self.startup_timeout:.0f} s; log:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        proc, self._proc = self._proc, None
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

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _start_with_retries(make: Callable[[], Service], attempts: int = 3) -> Service:
    # A free port can be taken by someone else between probing and binding: retry on new ports.
    last: ServiceStartError | None = None
    for _ in range(attempts):
        svc = make()
        try:
            return svc.start()
        except ServiceStartError as exc:
            last = exc
    assert last is not None
    raise last


INFLUXDB_CONF = """\
reporting-disabled = true
bind-address = "{host}:{rpc_port}"

[meta]
  dir = "{root}/meta"
  retention-autocreate = true
  logging-enabled = false

[data]
  dir = "{root}/data"
  wal-dir = "{root}/wal"
  wal-fsync-delay = "0s"
  index-version = "inmem"
  query-log-enabled = false
  trace-logging-enabled = false

[monitor]
  store-enabled = false

[retention]
  enabled = false

[continuous_queries]
  enabled = false

[subscriber]
  enabled = false

[http]
  enabled = true
  bind-address = "{host}:{http_port}"
  auth-enabled = false
  log-enabled = false
  pprof-enabled = false
  unix-socket-enabled = false

[logging]
  level = "warn"
  suppress-logo = true
"""


def start_influxdb1(root: Path, binary: str) -> Service:
    """``influxd`` (1.x) with a config, data, meta and WAL under ``root``; URL ``http://127.0.0.1:PORT``."""

    def make() -> Service:
        http_port, rpc_port = free_port(), free_port()
        conf = root / "influxdb.conf"
        conf.write_text(INFLUXDB_CONF.format(host=HOST, rpc_port=rpc_port, http_port=http_port, root=root))
        url = f"http://{HOST}:{http_port}"
        return Service("influxd", [binary, "-config", str(conf)], root, f"{url}/ping", url)

    return _start_with_retries(make)


def start_victoria(root: Path, binary: str) -> Service:
    """``victoria-metrics`` with storage under ``root``; URL ``http://127.0.0.1:PORT``."""

    def make() -> Service:
        port = free_port()
        url = f"http://{HOST}:{port}"
        cmd = [binary, f"-storageDataPath={root / 'data'}", f"-httpListenAddr={HOST}:{port}",
               "-retentionPeriod=100y", "-loggerLevel=WARN", "-search.latencyOffset=0s",
               "-memory.allowedBytes=256MiB"]
        return Service("victoria-metrics", cmd, root, f"{url}/health", url)

    return _start_with_retries(make)


ALERTMANAGER_CONF = """\
route:
  receiver: "null"
  group_wait: 1s
receivers:
  - name: "null"
"""


def start_alertmanager(root: Path, binary: str) -> Service:
    """``prometheus-alertmanager`` (0.25) with a config that routes everything nowhere (the
    tests read its API), its storage under ``root``, no clustering; URL ``http://127.0.0.1:PORT``."""

    def make() -> Service:
        port = free_port()
        conf = root / "alertmanager.yml"
        conf.write_text(ALERTMANAGER_CONF)
        url = f"http://{HOST}:{port}"
        cmd = [binary, f"--config.file={conf}", f"--storage.path={root / 'data'}",
               f"--web.listen-address={HOST}:{port}", "--cluster.listen-address=", "--log.level=warn"]
        return Service("alertmanager", cmd, root, f"{url}/-/ready", url)

    return _start_with_retries(make)


@contextlib.contextmanager
def temporary_service(kind: str, binary: str):  # type: ignore[no-untyped-def]
    """Start ``kind`` ("influxdb1", "victoria" or "alertmanager") in a fresh temporary directory."""
    root = Path(tempfile.mkdtemp(prefix=f"pulse-test-{kind}-"))
    starter = {"influxdb1": start_influxdb1, "victoria": start_victoria, "alertmanager": start_alertmanager}[kind]
    svc = None
    try:
        svc = starter(root, binary)
        yield svc
    finally:
        if svc is not None:
            svc.stop()
        shutil.rmtree(root, ignore_errors=True)
