"""Run the DDP job in the lab network, capture it, inject the fault, tear everything down."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pulse.lab.faults import Fault, FaultInjector
from pulse.lab.netns import LabNetwork, cgroup_root, require_root

from pulse.errors import ConfigError, ServiceError

MASTER_PORT = 29500
_STEP = re.compile(r"^step (\d+) t_ms=([\d.]+) wall_ns=(\d+)")
_DONE = "done"
"""The job's last line, after it destroyed its process group (then it leaves by os._exit)."""


@dataclasses.dataclass
class LabRun:
    workdir: Path
    pcap: Path
    hook_dir: Path
    nodes: dict[str, str]
    """node name -> IPv4 address"""
    ranks: dict[int, str]
    """rank -> node name"""
    fault: Fault
    onset_wall_ns: int | None
    step_ms: dict[int, list[float]]
    step_end_ns: dict[int, list[int]]
    """rank -> wall clock (ns) at the end of each step, as the job printed it"""
    capture_drops: int | None
    capture_packets: int | None
    master_port: int = MASTER_PORT
    fault_after: int = 0
    """steps run before the fault was injected"""
    fault_effect: dict[str, int] | None = None
    """what the fault did, measured: for ``cpu``, the rank's cgroup ``cpu.stat`` counters
    (``nr_periods``, ``nr_throttled``, ``throttled_ns``) over the whole run"""
    hooks: bool = True
    """whether the job ran with the torch injection; without it (``--no-hooks``) no hook
    file exists and the analysis is network-only"""

    def save(self) -> Path:
        """Write run.json into the work directory (what `pulse lab analyze` reads)."""
        d = dataclasses.asdict(self)
        d["fault"] = dataclasses.asdict(self.fault)
        p = self.workdir / "run.json"
        p.write_text(json.dumps(d, default=str, indent=1))
        return p

    @classmethod
    def load(cls, workdir: Path) -> LabRun:
        p = Path(workdir) / "run.json"
        try:
            d = json.loads(p.read_text())
            return cls(workdir=Path(workdir), pcap=Path(d["pcap"]), hook_dir=Path(d["hook_dir"]), nodes=d["nodes"],
                       ranks={int(k): v for k, v in d["ranks"].items()}, fault=Fault(**d["fault"]),
                       onset_wall_ns=d["onset_wall_ns"],
                       step_ms={int(k): v for k, v in d["step_ms"].items()},
                       step_end_ns={int(k): v for k, v in d["step_end_ns"].items()},
                       capture_drops=d["capture_drops"], capture_packets=d["capture_packets"],
                       master_port=d["master_port"], fault_after=int(d.get("fault_after", 0)),
                       fault_effect=d.get("fault_effect"), hooks=bool(d.get("hooks", True)))
        except FileNotFoundError:
            raise ConfigError(f"{p}: no run.json (not a directory kept by `pulse lab run --keep`)") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{p}: not a lab run record ({exc})") from None


def _injection_dir() -> Path:
    from pulse.hooks import torch_injection_dir  # the hooks package ships the sitecustomize

    return Path(torch_injection_dir())


class _Cgroups:
    def __init__(self, ranks: int, tag: str) -> None:
        root = cgroup_root()
        self.paths: dict[int, Path] = {}
        if root is None:
            return
        for r in range(ranks):
            p = root / f"{tag}-r{r}"
            p.mkdir(exist_ok=True)
            (p / "cpu.cfs_quota_us").write_text("-1")
            self.paths[r] = p

    def cpu_stat(self, rank: int) -> dict[str, int]:
        """The rank's cgroup v1 ``cpu.stat``: periods, throttled periods, throttled time."""
        fields = dict(line.split() for line in (self.paths[rank] / "cpu.stat").read_text().splitlines())
        return {"nr_periods": int(fields.get("nr_periods", 0)), "nr_throttled": int(fields.get("nr_throttled", 0)),
                "throttled_ns": int(fields.get("throttled_time", 0))}

    def close(self) -> None:
        parent_tasks = self.paths and next(iter(self.paths.values())).parent / "tasks"
        for p in self.paths.values():
            try:
                # Move stragglers back to the root group so the directory can go.
                for pid in (p / "tasks").read_text().split():
                    try:
                        Path(str(parent_tasks)).write_text(pid)
                    except OSError:
                        pass
                p.rmdir()
            except OSError:
                pass
        self.paths.clear()


def run_lab(*, ranks: int, fault: Fault, steps: int, fault_after: int, workdir: Path,
            log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr), timeout_s: float = 300.0,
            width: int = 768, nice: int = 10,
            on_network: Callable[[LabNetwork], None] | None = None, net_prefix: str = "plab",
            hooks: bool = True) -> LabRun:
    """``hooks=False`` runs the job without the torch injection: nothing on its PYTHONPATH,
    no hook directory, so no descriptor exists at all (network-only mode's input).
``on_network`` runs once the namespaces exist, before the capture and the job start
    (the agent's e2e test starts one `pulse agent` per node there). ``net_prefix`` names
    the namespaces (a run removes stale ones with its prefix: two concurrent runs on one
    host need different prefixes)."""
    require_root()
    workdir.mkdir(parents=True, exist_ok=True)
    hook_dir = workdir / "hooks"
    if hooks:
        hook_dir.mkdir(exist_ok=True)
    pcap = workdir / "capture.pcap"
    tag = f"pulse-lab-{os.getpid()}"
    procs: list[subprocess.Popen[str]] = []
    tcpdump: subprocess.Popen[str] | None = None
    cgroups = _Cgroups(ranks, tag)
    if fault.kind == "cpu" and fault.rank not in cgroups.paths:
        cgroups.close()
        # Without it the quota would have nowhere to go: the run would be healthy while
        # its truth says compute-slow (the injection used to fail in a reader thread, unseen).
        raise ConfigError(f"--fault {fault.text}: needs the cgroup v1 cpu controller "
                          "(/sys/fs/cgroup/cpu with cpu.cfs_quota_us); not found on this host")
    step_ms: dict[int, list[float]] = {r: [] for r in range(ranks)}
    step_end: dict[int, list[int]] = {r: [] for r in range(ranks)}
    onset: list[int] = []
    old_term = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    net = LabNetwork(ranks, prefix=net_prefix)
    injector: FaultInjector | None = None
    drops = packets = None
    effect: dict[str, int] | None = None
    try:
        net.create()
        if on_network is not None:
            on_network(net)
        injector = FaultInjector(net, fault, cgroups.paths)
        tcpdump = subprocess.Popen(
            ["ip", "netns", "exec", net.switch_ns, "tcpdump", "-i", net.bridge, "-s", "96", "-B", "65536",
             "--time-stamp-precision=nano", "-n", "-w", str(pcap), "tcp"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _wait_listening(tcpdump)
        injection = _injection_dir() if hooks else None
        script = Path(__file__).with_name("ddp_job.py")
        master = net.nodes[0].address
        for r, node in enumerate(net.nodes):
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": os.environ.get("HOME", "/root"),
                "MASTER_ADDR": master, "MASTER_PORT": str(MASTER_PORT),
                "WORLD_SIZE": str(ranks), "RANK": str(r), "LOCAL_RANK": "0",
                "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": "1",
                "LAB_STEPS": str(steps), "LAB_WIDTH": str(width),
            }
            if injection is not None:
                env.update({"PYTHONPATH": str(injection), "PULSE_HOOK_DIR": str(hook_dir),
                            "PULSE_NODE": node.name, "PULSE_JOB": "lab"})
            cg = cgroups.paths.get(r)
            # Join the cgroup first: `ip netns exec` remounts /sys inside the namespace.
            join = f"echo $$ > {cg}/tasks; " if cg else ""
            # The ranks run niced: on a busy host the kernel's softirq work (veth delivery,
            # the shaper's timers) must not queue behind them, or a token-bucket limit
            # comes out as line-rate bursts every few ms instead of a slower link.
            cmd = ["sh", "-c", f"{join}exec nice -n {nice} ip netns exec {node.netns} {sys.executable} -u {script}"]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        errors: dict[int, list[str]] = {r: [] for r in range(ranks)}
        done: set[int] = set()
        failed: list[BaseException] = []

        def reader(r: int, p: subprocess.Popen[str]) -> None:
            try:
                read(r, p)
            except BaseException as exc:  # the fault's injection runs here: its failure fails the run
                failed.append(exc)
                assert p.stdout is not None
                for _line in p.stdout:  # keep draining, or the rank blocks on a full pipe
                    pass

        def read(r: int, p: subprocess.Popen[str]) -> None:
            assert p.stdout is not None
            for line in p.stdout:
                if line.strip() == _DONE:
                    done.add(r)
                    continue
                m = _STEP.match(line)
                if not m:
                    errors[r].append(line.rstrip())
                    continue
                step = int(m.group(1))
                step_ms[r].append(float(m.group(2)))
                step_end[r].append(int(m.group(3)))
                if r == 0:
                    log(f"  step {step:3d}  {float(m.group(2)):8.1f} ms")
                    if step + 1 == fault_after and fault.kind != "none" and not onset:
                        injector.apply()  # type: ignore[union-attr]
                        onset.append(time.time_ns())
                        log(f"  fault {fault.text} injected after step {step}")

        threads = [threading.Thread(target=reader, args=(r, p), daemon=True) for r, p in enumerate(procs)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        for r, p in enumerate(procs):
            left = max(1.0, deadline - time.monotonic())
            try:
                rc = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                raise ServiceError(f"lab job did not finish within {timeout_s:.0f} s (rank {r})") from None
            threads[r].join(timeout=5)  # its last lines
            if failed:
                raise ServiceError(f"lab run failed while rank {r} ran: {failed[0]!r}") from failed[0]
            if rc != 0 or r not in done:
                tail = "\n".join(errors[r][-15:])
                what = f"exited with {rc}" if rc != 0 else "exited before its last line ('done')"
                raise ServiceError(f"lab rank {r} {what}:\n{tail}")
        for t in threads:
            t.join(timeout=5)
        if injector.applied and fault.kind == "cpu":
            effect = cgroups.cpu_stat(fault.rank)
            if effect["nr_throttled"] == 0:
                # A quota that never throttled left the job healthy: scoring Pulse against
                # "compute-slow" would blame the detector for a fault that did not happen.
                raise ServiceError(f"the cpu quota on rank {fault.rank} never throttled it ({effect}): "
                                   "the fault did not happen")
        drops, packets = _stop_tcpdump(tcpdump)
        tcpdump = None
    finally:
        signal.signal(signal.SIGTERM, old_term)
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if tcpdump is not None:
            _stop_tcpdump(tcpdump)
        if injector is not None:
            injector.remove()
        cgroups.close()
        net.close()
    return LabRun(workdir=workdir, pcap=pcap, hook_dir=hook_dir,
                  nodes={n.name: n.address for n in net.nodes},
                  ranks={n.index: n.name for n in net.nodes}, fault=fault,
                  onset_wall_ns=onset[0] if onset else None, step_ms=step_ms, step_end_ns=step_end,
                  capture_drops=drops, capture_packets=packets, fault_after=fault_after, fault_effect=effect,
                  hooks=hooks)


def _wait_listening(proc: subprocess.Popen[str]) -> None:
    assert proc.stderr is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if "listening on" in line:
            return
        if proc.poll() is not None or not line:
            raise ServiceError(f"tcpdump did not start: {line.strip()}")
    raise ServiceError("tcpdump did not start listening within 10 s")


def _stop_tcpdump(proc: subprocess.Popen[str]) -> tuple[int | None, int | None]:
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None, None
    drops = packets = None
    for line in err.splitlines():
        m = re.match(r"(\d+) packets? dropped by kernel", line)
        if m:
            drops = int(m.group(1))
        m = re.match(r"(\d+) packets? captured", line)
        if m:
            packets = int(m.group(1))
    return drops, packets
