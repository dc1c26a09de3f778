"""Faults the lab injects into one node, and how to undo them.

``rate:RANK:RATE``  paced token-bucket limit on the node's egress (``tc qdisc tbf`` with a peak rate)
``loss:RANK:PCT``   random drop of the node's transmitted frames (nftables ``numgen random``
                    in a netdev ingress chain on the node's bridge port)
``cpu:RANK:QUOTA``  CPU quota of the rank's process (cgroup v1 ``cpu.cfs_quota_us`` as a
                    fraction of one CPU)
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from pulse.lab.netns import LabNetwork, run

from pulse.errors import ConfigError

_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmg]?)(?:bit|b)?$", re.I)
FAMILY = {"rate": "network", "loss": "network", "cpu": "compute"}


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str  # none | rate | loss | cpu
    rank: int = -1
    value: float = 0.0
    text: str = "none"

    @property
    def family(self) -> str | None:
        return FAMILY.get(self.kind)


def parse_fault(text: str, n_ranks: int) -> Fault:
    if text in ("", "none"):
        return Fault("none")
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in FAMILY:
        raise ConfigError(f"--fault {text!r}: expected none, rate:RANK:RATE, loss:RANK:PCT or cpu:RANK:QUOTA")
    kind, rank_s, value_s = parts
    try:
        rank = int(rank_s)
    except ValueError:
        raise ConfigError(f"--fault {text!r}: RANK must be an integer") from None
    if not 0 <= rank < n_ranks:
        raise ConfigError(f"--fault {text!r}: rank {rank} not in 0..{n_ranks - 1}")
    if kind == "rate":
        m = _RATE.match(value_s)
        if not m:
            raise ConfigError(f"--fault {text!r}: RATE like 200mbit or 2gbit")
        scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2).lower()]
        value = float(m.group(1)) * scale
        if value < 1e6:
            raise ConfigError(f"--fault {text!r}: rate below 1 Mbit/s would stall the job")
    else:
        try:
            value = float(value_s.rstrip("%"))
        except ValueError:
            raise ConfigError(f"--fault {text!r}: {value_s!r} is not a number") from None
        if kind == "loss" and not 0 < value <= 20:
            raise ConfigError(f"--fault {text!r}: loss percentage must be in (0, 20]")
        if kind == "cpu" and not 0.01 <= value <= 1.0:
            raise ConfigError(f"--fault {text!r}: CPU quota is a fraction of one CPU in [0.01, 1]")
    return Fault(kind, rank, value, text)


class FaultInjector:
    def __init__(self, net: LabNetwork, fault: Fault, cgroups: dict[int, Path]) -> None:
        self.net, self.fault, self.cgroups = net, fault, cgroups
        self.applied = False

    def apply(self) -> None:
        f = self.fault
        if f.kind == "none":
            return
        node = self.net.nodes[f.rank]
        if f.kind == "rate":
            rate_kbit = int(f.value / 1e3)
            # burst must cover at least one timer tick at this rate.
            # A peak rate 10 % above the rate with a one-frame peak bucket paces frames out
            # one by one, like a slower link. Without it, on a loaded host the shaper's
            # deferred wake-ups release the whole bucket at veth speed every few ms: a link
            # that flaps at full speed rather than one that is slow.
            # The peak bucket holds ~50 us of traffic (at least one frame): the shaper wakes
            # up at most every 50 us, which a 2-core host can afford at any rate.
            peak = f.value * 1.1
            mtu = max(1600, int(peak / 8 * 50e-6))
            run([*self.net.exec_prefix(node), "tc", "qdisc", "add", "dev", "eth0", "root", "tbf",
                 "rate", f"{rate_kbit}kbit", "burst", str(max(16000, 2 * mtu)), "latency", "100ms",
                 "peakrate", f"{int(peak / 1e3)}kbit", "mtu", str(mtu)])
        elif f.kind == "loss":
            threshold = round(f.value * 100)  # out of 10000
            port = f"veth{node.index}"
            rules = (
                "table netdev pulselab {\n"
                f"  chain loss {{\n    type filter hook ingress device {port} priority 0; policy accept;\n"
                f"    numgen random mod 10000 < {threshold} drop\n  }}\n}}\n"
            )
            run(["ip", "netns", "exec", self.net.switch_ns, "nft", "-f", "-"], input_text=rules)
        elif f.kind == "cpu":
            cg = self.cgroups[f.rank]
            period = int((cg / "cpu.cfs_period_us").read_text())
            (cg / "cpu.cfs_quota_us").write_text(str(max(1000, int(period * f.value))))
        self.applied = True

    def remove(self) -> None:
        if not self.applied:
            return
        f = self.fault
        node = self.net.nodes[f.rank]
        if f.kind == "rate":
            run([*self.net.exec_prefix(node), "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
        elif f.kind == "loss":
            run(["ip", "netns", "exec", self.net.switch_ns, "nft", "delete", "table", "netdev", "pulselab"],
                check=False)
        elif f.kind == "cpu":
            try:
                (self.cgroups[f.rank] / "cpu.cfs_quota_us").write_text("-1")
            except OSError:
                pass
        self.applied = False
