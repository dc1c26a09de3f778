"""A throw-away cluster of network namespaces on one Linux bridge.

Each node is a namespace ``<prefix>-nK`` with one veth ``eth0`` (TSO/GSO/GRO off so the
capture sees real frames) plugged into a bridge that lives in its own namespace
``<prefix>-sw``; the bridge is connected to nothing else, and addresses exist only inside
the namespaces. Everything is torn down by :meth:`LabNetwork.close` (deleting a namespace
deletes its veths, qdiscs and nft tables), which also runs on failure.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import subprocess
from pathlib import Path

from pulse.errors import ConfigError, ServiceError

SUBNET = "10.231.0"
LOCK_DIR = Path("/run/pulse-lab")
"""One lock file per namespace prefix, held (flock) for the network's lifetime: the kernel
drops it when its owner dies, so a prefix whose lock is free has only stale namespaces."""


def run(cmd: list[str], *, check: bool = True, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, input=input_text)
    if check and proc.returncode != 0:
        raise ServiceError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()[:400]}")
    return proc


def require_root() -> None:
    if os.geteuid() != 0:
        raise ConfigError("pulse lab needs root (network namespaces, qdiscs, nftables, cgroups); run it as root")
    for tool in ("ip", "tc", "tcpdump"):
        if shutil.which(tool) is None:
            raise ServiceError(f"pulse lab needs `{tool}` (Debian: iproute2 / tcpdump)")


@dataclasses.dataclass(frozen=True)
class LabNode:
    index: int
    name: str
    netns: str
    address: str


class LabNetwork:
    def __init__(self, n_nodes: int, *, prefix: str = "plab") -> None:
        if not 2 <= n_nodes <= 32:
            raise ConfigError(f"--ranks {n_nodes}: the lab runs 2 to 32 nodes")
        self.prefix = prefix
        self.switch_ns = f"{prefix}-sw"
        self.bridge = "br0"
        self.nodes = [
            LabNode(i, f"node-{i:02d}", f"{prefix}-n{i}", f"{SUBNET}.{10 + i}") for i in range(n_nodes)
        ]
        self._created: list[str] = []
        self._lock: int | None = None

    def __enter__(self) -> LabNetwork:
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take_prefix(self) -> None:
        """Own the prefix, or refuse: deleting the namespaces of a live run (two labs, or a
        test beside ``pulse lab``) pulls the network from under its job and capture."""
        LOCK_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(LOCK_DIR / f"{self.prefix}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(f"another lab run holds the namespaces {self.prefix}-*: wait for it to end "
                              "(it deletes them) or give this one another prefix") from None
        self._lock = fd

    def create(self) -> None:
        self._take_prefix()
        self.cleanup_stale(self.prefix)  # a killed earlier run's: its lock died with it
        run(["ip", "netns", "add", self.switch_ns])
        self._created.append(self.switch_ns)
        sw = ["ip", "netns", "exec", self.switch_ns]
        run([*sw, "ip", "link", "add", self.bridge, "type", "bridge"])
        run([*sw, "ip", "link", "set", self.bridge, "up"])
        run([*sw, "ip", "link", "set", "lo", "up"])
        for node in self.nodes:
            run(["ip", "netns", "add", node.netns])
            self._created.append(node.netns)
            peer = f"veth{node.index}"
            # Create the pair inside the switch namespace, then move one end to the node.
            run([*sw, "ip", "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", node.netns])
            run([*sw, "ip", "link", "set", peer, "master", self.bridge])
            run([*sw, "ip", "link", "set", peer, "up"])
            ns = ["ip", "netns", "exec", node.netns]
            run([*ns, "ip", "addr", "add", f"{node.address}/24", "dev", "eth0"])
            run([*ns, "ip", "link", "set", "eth0", "up"])
            run([*ns, "ip", "link", "set", "lo", "up"])
            for dev, where in ((peer, sw), ("eth0", ns)):
                # Segmentation offloads would hand the capture 64 KiB super-frames.
                run([*where, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off"], check=False)

    def exec_prefix(self, node: LabNode) -> list[str]:
        return ["ip", "netns", "exec", node.netns]

    def close(self) -> None:
        for ns in reversed(self._created):
            run(["ip", "netns", "del", ns], check=False)
        self._created.clear()
        if self._lock is not None:
            os.close(self._lock)  # releases the prefix
            self._lock = None

    @staticmethod
    def cleanup_stale(prefix: str) -> None:
        """Remove namespaces a killed earlier run left behind."""
        out = run(["ip", "netns", "list"], check=False).stdout
        for line in out.splitlines():
            name = line.split()[0] if line.strip() else ""
            if name.startswith(f"{prefix}-"):
                run(["ip", "netns", "del", name], check=False)

    @staticmethod
    def exists(prefix: str) -> list[str]:
        out = run(["ip", "netns", "list"], check=False).stdout
        return [ln.split()[0] for ln in out.splitlines() if ln.strip() and ln.split()[0].startswith(f"{prefix}-")]


def cgroup_root() -> Path | None:
    p = Path("/sys/fs/cgroup/cpu")
    return p if (p / "cpu.cfs_quota_us").exists() else None
