"""A throw-away PKI made with the openssl CLI, and a TLS Kafka endpoint for tests: the embedded
Tansu broker behind Debian's stunnel4 (Tansu 0.6's CLI refuses --cert together with --key, so
it cannot serve TLS itself; see docs/security.md), the broker advertising stunnel's port."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from services import find_binary

from pulse.broker import HOST, EmbeddedBroker, free_port

_CA_CNF = """[ ca ]
default_ca = local
[ local ]
database = {d}/index.txt
new_certs_dir = {d}/newcerts
serial = {d}/serial
default_md = sha256
policy = anything
copy_extensions = copy
unique_subject = no
[ anything ]
commonName = supplied
"""


def _run(*args: str) -> None:
    subprocess.run(list(args), check=True, capture_output=True, timeout=60)


@dataclasses.dataclass
class Pki:
    dir: Path

    def path(self, name: str) -> Path:
        return self.dir / name


def _ca(d: Path, name: str) -> None:
    (d / f"{name}-db" / "newcerts").mkdir(parents=True)
    (d / f"{name}-db" / "index.txt").write_text("")
    (d / f"{name}-db" / "serial").write_text("1000\n")
    (d / f"{name}.cnf").write_text(_CA_CNF.format(d=d / f"{name}-db"))
    _run("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN=Pulse test {name}",
         "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.pem"))


def _leaf(d: Path, ca: str, name: str, cn: str, *, start: str | None = None, end: str | None = None) -> None:
    key, csr = d / f"{name}.key", d / f"{name}.csr"
    _run("openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(csr))
    dates = ["-startdate", start, "-enddate", end] if start and end else ["-days", "2"]
    _run("openssl", "ca", "-batch", "-notext", "-config", str(d / f"{ca}.cnf"), "-cert", str(d / f"{ca}.pem"),
         "-keyfile", str(d / f"{ca}.key"), "-in", str(csr), "-out", str(d / f"{name}.pem"), *dates)


def make_pki(d: Path) -> Pki:
    """ca.pem (the real CA), other-ca.pem (a CA that signed nothing here), server.pem/.key,
    client.pem/.key, and expired-server / expired-client certificates signed by ca."""
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca")
    _ca(d, "other-ca")
    _leaf(d, "ca", "server", "127.0.0.1")
    _leaf(d, "ca", "client", "pulse-client")
    _leaf(d, "ca", "expired-server", "127.0.0.1", start="20200101000000Z", end="20200201000000Z")
    _leaf(d, "ca", "expired-client", "pulse-client", start="20200101000000Z", end="20200201000000Z")
    return Pki(d)


def _wait_port(port: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def stunnel(workdir: Path, accept: int, connect: int, cert: Path, key: Path,
            client_ca: Path | None = None) -> Iterator[int]:
    """stunnel terminating TLS on ``accept`` for the plain listener ``connect``; with
    ``client_ca`` clients must present a certificate that CA signed."""
    binary = find_binary("stunnel4") or find_binary("stunnel")
    if binary is None:
        raise FileNotFoundError("stunnel4")
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / f"stunnel-{accept}.conf"
    lines = ["foreground = yes", "pid =", f"output = {workdir / f'stunnel-{accept}.log'}", "debug = notice",
             "[kafka]", f"accept = {HOST}:{accept}", f"connect = {HOST}:{connect}", f"cert = {cert}", f"key = {key}"]
    if client_ca is not None:
        lines += [f"CAfile = {client_ca}", "verifyChain = yes", "requireCert = yes"]
    conf.write_text("\n".join(lines) + "\n")
    proc = subprocess.Popen([binary, str(conf)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        if not _wait_port(accept):
            raise RuntimeError(f"stunnel did not listen on {accept}")
        yield accept
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def tls_broker(workdir: Path, pki: Pki, *, server: str = "server", client_ca: bool = False,
               authentication: bool = False) -> Iterator[str]:
    """The embedded broker reachable only through TLS on 127.0.0.1; yields ``host:port``."""
    tls_port = free_port(HOST)
    with contextlib.ExitStack() as stack:
        b = stack.enter_context(EmbeddedBroker(advertised_port=tls_port, log_path=workdir / f"tansu-{tls_port}.log",
                                               authentication=authentication))
        stack.enter_context(stunnel(workdir, tls_port, b.port or 0, pki.path(f"{server}.pem"),
                                    pki.path(f"{server}.key"), pki.path("ca.pem") if client_ca else None))
        yield f"{HOST}:{tls_port}"
