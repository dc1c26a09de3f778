"""``pulse bench agent``: the agent's CPU per 100k packets/s and per 10k hook events/s,
each against a reference measured in the same run.

* **packets**: the agent's per-packet path on a generated RoCEv2 capture (decode, binning
  into epochs with the node's addresses, the join, renumbering and encoding of the batches
  it would publish), read from a pcap file instead of the kernel ring; reference: ``tcpdump
  -r FILE -w /dev/null`` on the same file. The figure is CPU seconds per second of traffic
  at 100k packets/s (cores), and ``ratio`` = tcpdump's / the agent's (>= 1: cheaper).
* **hook events**: torch injection op events appended to a followed file; the agent reads
  them (the hook-directory source), decodes and validates them, passes them through the join
  and encodes what it would publish (packed); reference: a bare loop over the same file
  (``orjson.loads`` per line). Figure: cores at 10k events/s; ``ratio`` = bare / agent.

Kafka is left out on purpose (``pulse bench pipeline`` measures it): the figures are what
the agent adds on a node. An agent's own memory is in its health record (``max_rss_bytes``).
"""

from __future__ import annotations

import os
import queue
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click
import orjson

from pulse.cli_types import Number, count
from pulse.errors import ServiceError

HOSTS = 8


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _tcpdump_cpu(tcpdump: str, path: Path) -> float:
    c = _children_cpu()
    proc = subprocess.run([tcpdump, "-r", str(path), "-w", "/dev/null"], capture_output=True)
    if proc.returncode != 0:
        raise ServiceError(f"tcpdump -r {path} failed: {proc.stderr.decode(errors='replace').strip()}")
    return _children_cpu() - c


def _agent_packets_cpu(path: Path, epoch_ns: int) -> tuple[float, int, int]:
    """(CPU s, packets, batches published) of the agent's path over the file."""
    import dataclasses

    from pulse.nic.convert import convert_capture
    from pulse.nic.pcapfile import open_capture

    from pulse import samples

    from .agent_join import TcpJoin

    local = [f"10.0.0.{h}" for h in range(HOSTS)]
    join = TcpJoin("bench", local)
    seq = [0]

    def sink(batches: list[Any], events: list[Any]) -> None:
        join.capture_events(events)
        for b in join.batches(batches):
            samples.encode(dataclasses.replace(b, batch_seq=seq[0]))
            seq[0] += 1

    c = time.process_time()
    conv = convert_capture(open_capture(path), epoch_ns=epoch_ns, window_ns=10_000_000, local=local, node="bench",
                           sink=sink)
    return time.process_time() - c, int(conv.summary["packets"]), seq[0]


def _write_events(path: Path, n: int) -> None:
    from pulse.events import CommEvent, OpEvent, encode

    cid = "torch:00112233445566ff"
    lines = [encode(CommEvent(job="bench", node="bench", comm_id=cid, rank=0, nranks=8, pid=1, source="torch"))]
    t = time.time_ns()
    for i in range(n):
        lines.append(encode(OpEvent(job="bench", node="bench", comm_id=cid, rank=0, seq=i, kind="AllReduce",
                                    count=1 << 20, dtype="bfloat16", bytes=2 << 20, nranks=8, t_host_ns=t + i,
                                    source="torch")))
    path.write_bytes(b"\n".join(lines) + b"\n")


def _agent_events_cpu(directory: Path) -> tuple[float, int]:
    from pulse import events as _events

    from .agent_join import TcpJoin
    from .agent_sources import HookDirSource

    q: queue.Queue[tuple[str, Any]] = queue.Queue()
    src = HookDirSource(q, threading.Event(), directory=directory, node="bench")
    join = TcpJoin("bench", [], gate=False)
    n = 0
    c = time.process_time()
    size = (directory / next(iter(os.listdir(directory)))).stat().st_size
    while sum(f.offset for f in src.files.values()) < size:  # a scan reads at most 16 MiB of a file
        src.scan()
    while not q.empty():
        _kind, evs = q.get_nowait()
        out = join.hook_events(evs)
        values = [_events.encode(e) for e in out]
        for i in range(0, len(values), 4096):  # the publisher's packed messages
            _events.encode_packed_json(values[i:i + 4096])
        n += len(out)
    return time.process_time() - c, n


def _bare_events_cpu(path: Path) -> float:
    c = time.process_time()
    with open(path, "rb") as fh:
        for line in fh.read().split(b"\n"):
            if line:
                orjson.loads(line)
    return time.process_time() - c


@click.command("agent", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--packets", type=count(1000, 100_000_000), default=500_000, show_default=True, help="Packets to generate.")
@click.option("--events", type=count(100, 10_000_000), default=100_000, show_default=True, help="Hook events to generate.")
@click.option("--epoch-us", type=Number(float, 1.0, 1e6), default=32.0, show_default=True)
@click.option("--repeat", type=count(1, 100), default=3, show_default=True, help="Runs of each side; the median counts.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
def bench_agent(packets: int, events: int, epoch_us: float, repeat: int, as_json: bool) -> None:
    """The agent's CPU per 100k packets/s (vs tcpdump -r on the same file) and per 10k hook
    events/s (vs a bare JSON loop over the same file), in the same run."""
    tcpdump = shutil.which("tcpdump") or ("/usr/sbin/tcpdump" if Path("/usr/sbin/tcpdump").exists() else None)
    if tcpdump is None:
        raise ServiceError("tcpdump not found on PATH: the packet reference of this benchmark needs it")
    from pulse.nic.synth import write_roce_pcap

    epoch_ns = int(epoch_us * 1000)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-agent-") as tmp:
        pcap = Path(tmp) / "roce.pcap"
        # 100k packets/s on the wire: windows and batches as a live capture at that rate cuts them
        write_roce_pcap(pcap, packets, payload=1024, n_hosts=HOSTS, qps_per_pair=4, gap_ns=10_000)
        hooks = Path(tmp) / "hooks"
        hooks.mkdir()
        evfile = hooks / "torch-bench-1.jsonl"
        _write_events(evfile, events)
        _agent_packets_cpu(pcap, epoch_ns)  # warm-up: kernels loaded, file cached
        _tcpdump_cpu(tcpdump, pcap)
        ours, ref, ev_ours, ev_ref = [], [], [], []
        n_pk = n_ev = n_b = 0
        for _ in range(max(1, repeat)):
            cpu, n_pk, n_b = _agent_packets_cpu(pcap, epoch_ns)
            ours.append(cpu)
            ref.append(_tcpdump_cpu(tcpdump, pcap))
            cpu, n_ev = _agent_events_cpu(hooks)
            ev_ours.append(cpu)
            ev_ref.append(_bare_events_cpu(evfile))
    pk, pk_ref = statistics.median(ours), statistics.median(ref)
    ev, ev_ref_m = statistics.median(ev_ours), statistics.median(ev_ref)
    per_pk = pk / n_pk * 1e5 if n_pk else None
    per_pk_ref = pk_ref / n_pk * 1e5 if n_pk else None
    per_ev = ev / n_ev * 1e4 if n_ev else None
    per_ev_ref = ev_ref_m / n_ev * 1e4 if n_ev else None
    result: dict[str, Any] = {
        "packets": n_pk, "batches": n_b, "epoch_ns": epoch_ns, "events": n_ev, "repeat": len(ours),
        "agent_cpu_per_100k_pps": per_pk, "tcpdump_cpu_per_100k_pps": per_pk_ref,
        "packets_ratio": pk_ref / pk if pk > 0 else None,
        "agent_cpu_per_10k_events_s": per_ev, "bare_loop_cpu_per_10k_events_s": per_ev_ref,
        "events_ratio": ev_ref_m / ev if ev > 0 else None,
        # the bench process (generated capture and arrays included), not an agent's
        "bench_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "runs": {"agent_packets_cpu_s": ours, "tcpdump_cpu_s": ref, "agent_events_cpu_s": ev_ours,
                 "bare_events_cpu_s": ev_ref},
    }
    if as_json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
    else:
        print(f"packets: agent {per_pk:.3f} cores per 100k packets/s, tcpdump -r {per_pk_ref:.3f} "
              f"(ratio {result['packets_ratio']:.2f}; {n_pk} packets, {n_b} batches)\n"
              f"hook events: agent {per_ev:.3f} cores per 10k events/s, bare JSON loop {per_ev_ref:.4f} "
              f"(ratio {result['events_ratio']:.3f}; {n_ev} events)\n"
              f"peak RSS of the bench process {result['bench_max_rss_bytes'] / 2**20:.0f} MiB", file=sys.stderr)
