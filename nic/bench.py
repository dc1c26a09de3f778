"""``pulse bench pcap``: read+decode+bin packets/s against ``tcpdump -r FILE -w /dev/null``
on the same file in the same run."""

from __future__ import annotations

import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import orjson

from pulse.cli_types import InFile, Number, count
from pulse.errors import ServiceError


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _time_tcpdump(tcpdump: str, path: Path) -> tuple[float, float]:
    """(wall s, CPU s) of one ``tcpdump -r FILE -w /dev/null``."""
    c = _children_cpu()
    t = time.perf_counter()
    proc = subprocess.run([tcpdump, "-r", str(path), "-w", "/dev/null"], capture_output=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise ServiceError(f"tcpdump -r {path} failed: {proc.stderr.decode(errors='replace').strip()}")
    return dt, _children_cpu() - c


def _time_pulse(path: Path, epoch_ns: int) -> tuple[float, float, int, int]:
    from pulse.nic.convert import convert_capture
    from pulse.nic.pcapfile import open_capture

    c = time.process_time()
    t = time.perf_counter()
    cap = open_capture(path)
    n_batches = [0]

    def sink(b: list, e: list) -> None:
        n_batches[0] += len(b)
    conv = convert_capture(cap, epoch_ns=epoch_ns, sink=sink)
    dt = time.perf_counter() - t
    return dt, time.process_time() - c, int(conv.summary["packets"]), n_batches[0]


@click.command("pcap", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--pcap", "pcap", type=InFile(),
              help="Benchmark this file instead of a generated one.")
@click.option("--packets", type=count(1, 10**9), default=1_000_000, show_default=True, help="Packets to generate.")
@click.option("--payload", type=count(1, 9000), default=1024, show_default=True, help="RoCE payload bytes per data packet.")
@click.option("--epoch-us", type=Number(float, 1.0, 1e6), default=32.0, show_default=True)
@click.option("--repeat", type=count(1, 1000), default=5, show_default=True,
              help="Runs of each side, alternating which goes first; the median counts.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON on stdout.")
def bench_pcap(pcap: str | None, packets: int, payload: int, epoch_us: float, repeat: int, as_json: bool) -> None:
    """pcap read+decode+bin packets/s vs tcpdump -r FILE -w /dev/null (same file, same run)."""
    tcpdump = shutil.which("tcpdump") or ("/usr/bin/tcpdump" if Path("/usr/bin/tcpdump").exists() else None)
    if tcpdump is None:
        raise ServiceError("tcpdump not found on PATH: the reference of this benchmark needs it")
    epoch_ns = int(epoch_us * 1000)
    with tempfile.TemporaryDirectory(prefix="pulse-bench-pcap-") as tmp:
        if pcap is None:
            from pulse.nic.synth import write_roce_pcap
            path = Path(tmp) / "roce.pcap"
            t = time.perf_counter()
            write_roce_pcap(path, packets, payload=payload, n_hosts=8, qps_per_pair=4)
            gen_s = time.perf_counter() - t
            if not as_json:
                print(f"generated {packets} RoCEv2 packets ({path.stat().st_size / 1e6:.0f} MB) "
                      f"in {gen_s:.1f} s", file=sys.stderr)
        else:
            path = Path(pcap)
        # warm-up: numba kernels compiled/loaded, file in the page cache for both sides
        _time_pulse(path, epoch_ns)
        _time_tcpdump(tcpdump, path)
        ours, ref, ours_cpu, ref_cpu = [], [], [], []
        n = nb = 0
        for i in range(max(1, repeat)):
            # alternate who goes first so neither side always gets the cache the other left
            for side in (("tcpdump", "pulse") if i % 2 == 0 else ("pulse", "tcpdump")):
                if side == "pulse":
                    dt, cpu, n, nb = _time_pulse(path, epoch_ns)
                    ours.append(dt)
                    ours_cpu.append(cpu)
                else:
                    dt, cpu = _time_tcpdump(tcpdump, path)
                    ref.append(dt)
                    ref_cpu.append(cpu)
        size = path.stat().st_size
    med, med_ref = statistics.median(ours), statistics.median(ref)
    cpu, cpu_ref = statistics.median(ours_cpu), statistics.median(ref_cpu)
    best, best_ref = min(ours), min(ref)
    result = {
        "packets": n, "file_bytes": size, "batches": nb, "epoch_ns": epoch_ns, "repeat": len(ours),
        # medians of the alternating runs (best-of below)
        "pulse_s": med, "pulse_packets_per_s": n / med if med > 0 else None,
        "tcpdump_s": med_ref, "tcpdump_packets_per_s": n / med_ref if med_ref > 0 else None,
        "ratio": med_ref / med if med > 0 else None, "target": 1.0,
        # CPU seconds (user + system) as well: on a shared machine wall time mostly
        # measures the neighbours
        "pulse_cpu_s": cpu, "tcpdump_cpu_s": cpu_ref, "cpu_ratio": cpu_ref / cpu if cpu > 0 else None,
        "pulse_best_s": best, "tcpdump_best_s": best_ref, "ratio_best": best_ref / best if best > 0 else None,
        "runs": {"pulse_s": ours, "tcpdump_s": ref, "pulse_cpu_s": ours_cpu, "tcpdump_cpu_s": ref_cpu},
    }
    if as_json:
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
    else:
        print(f"pulse read+decode+bin: {result['pulse_packets_per_s']:,.0f} packets/s (median {med:.3f} s)\n"
              f"tcpdump -r -w /dev/null: {result['tcpdump_packets_per_s']:,.0f} packets/s (median {med_ref:.3f} s)\n"
              f"ratio: {result['ratio']:.2f} (target >= 1.0); CPU-time ratio {result['cpu_ratio']:.2f} "
              f"({cpu:.3f} s vs {cpu_ref:.3f} s)", file=sys.stderr)
