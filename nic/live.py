"""Live capture: AF_PACKET TPACKET_V3 ring (Linux), kernel ns timestamps, batches every
window. A numba kernel walks the ring blocks the kernel handed over and builds the same
index arrays the file readers produce, so decoding and binning are shared."""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
from pulse.nic.binner import CaptureBinner, Chunk
from pulse.nic.decode import decode_packets

from pulse.errors import ConfigError
from pulse.trace import TraceWriter

SOL_PACKET = 263
PACKET_RX_RING = 5
PACKET_STATISTICS = 6
PACKET_VERSION = 10
TPACKET_V3 = 2
ETH_P_ALL = 0x0003
TP_STATUS_USER = 1
PACKET_OUTGOING = 4
BLOCK_SIZE = 1 << 20
BLOCK_NR = 64
FRAME_SIZE = 1 << 11
RETIRE_TOV_MS = 4
SIOCGIFFLAGS = 0x8913
SO_ATTACH_FILTER = 26
BPF_RET_K = 0x06
SIOCGIFHWADDR = 0x8927


@numba.njit(cache=True)
def _ring_kernel(ring, first_block, nblocks, block_size, skip_outgoing,
                 offset, caplen, wirelen, ts_ns):
    """Walk ready blocks from ``first_block`` in ring order; returns (packets, blocks, skipped
    outgoing duplicates). Stops at the first block still owned by the kernel or when the
    output arrays are full."""
    k = 0
    nb = 0
    dup = 0
    cap = offset.shape[0]
    while nb < nblocks:
        base = ((first_block + nb) % nblocks) * block_size
        status = np.int64(ring[base + 8]) | (np.int64(ring[base + 9]) << 8) | (
            np.int64(ring[base + 10]) << 16) | (np.int64(ring[base + 11]) << 24)
        if (status & TP_STATUS_USER) == 0:
            break
        npk = np.int64(ring[base + 12]) | (np.int64(ring[base + 13]) << 8) | (
            np.int64(ring[base + 14]) << 16) | (np.int64(ring[base + 15]) << 24)
        if k + npk > cap:
            break
        p = base + (np.int64(ring[base + 16]) | (np.int64(ring[base + 17]) << 8) | (
            np.int64(ring[base + 18]) << 16) | (np.int64(ring[base + 19]) << 24))
        for _ in range(npk):
            nxt = np.int64(0)
            sec = np.int64(0)
            nsec = np.int64(0)
            snap = np.int64(0)
            ln = np.int64(0)
            for j in range(4):
                nxt |= np.int64(ring[p + j]) << (8 * j)
                sec |= np.int64(ring[p + 4 + j]) << (8 * j)
                nsec |= np.int64(ring[p + 8 + j]) << (8 * j)
                snap |= np.int64(ring[p + 12 + j]) << (8 * j)
                ln |= np.int64(ring[p + 16 + j]) << (8 * j)
            mac = np.int64(ring[p + 24]) | (np.int64(ring[p + 25]) << 8)
            pkttype = ring[p + 48 + 10]
            if skip_outgoing and pkttype == PACKET_OUTGOING:
                dup += 1
            else:
                offset[k] = p + mac
                caplen[k] = snap
                wirelen[k] = ln if ln >= snap else snap
                ts_ns[k] = sec * 1_000_000_000 + nsec
                k += 1
            if nxt == 0:
                break
            p += nxt
        nb += 1
    return k, nb, dup


@numba.njit(cache=True)
def _release_kernel(ring, first_block, count, nblocks, block_size):
    for i in range(count):
        base = ((first_block + i) % nblocks) * block_size
        for j in range(4):
            ring[base + 8 + j] = 0


def _linktype(iface: str) -> tuple[int, bool]:
    # ioctls, not /sys/class/net: sysfs shows the network namespace it was mounted in, a
    # socket the namespace of the calling thread (`pulse agent --netns` captures from a
    # thread that entered the node's namespace).
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            req = struct.pack("16s16x", iface.encode()[:15])
            arphrd = struct.unpack("16xH14x", fcntl.ioctl(s.fileno(), SIOCGIFHWADDR, req))[0]
            flags = struct.unpack("16xH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[0]
    except OSError:
        raise ConfigError(f"--iface {iface}: no such network interface") from None
    loop = bool(flags & 0x8)
    if arphrd in (1, 772):
        return 1, loop
    if arphrd == 65534:
        return 101, loop
    raise ConfigError(f"--iface {iface}: link type ARPHRD {arphrd} is not supported (Ethernet, loopback, raw IP)")


def _attach_snaplen(sock: socket.socket, snaplen: int) -> None:
    """A one-instruction classic BPF program, ``ret #snaplen``: the kernel copies at most
    ``snaplen`` bytes of each frame into the ring (as ``tcpdump -s``), so the ring holds ~10x
    more packets of headers, which is all decoding needs (the wire length is kept)."""
    insn = (ctypes.c_ubyte * 8).from_buffer_copy(struct.pack("<HBBI", BPF_RET_K, 0, 0, snaplen))
    prog = struct.pack("HxxxxxxP", 1, ctypes.addressof(insn))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, prog)


class RingSocket:
    """An AF_PACKET socket with a TPACKET_V3 receive ring bound to one interface."""

    def __init__(self, iface: str, *, block_size: int = BLOCK_SIZE, block_nr: int = BLOCK_NR,
                 snaplen: int = 0) -> None:
        if not sys.platform.startswith("linux"):
            raise ConfigError("live capture needs Linux (AF_PACKET)")
        self.linktype, self.loopback = _linktype(iface)
        try:
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        except PermissionError:
            raise ConfigError(f"live capture on {iface} needs root or CAP_NET_RAW "
                              "(run as root, or setcap cap_net_raw+ep on the Python binary)") from None
        try:
            if snaplen > 0:
                _attach_snaplen(self.sock, snaplen)
            self.sock.setsockopt(SOL_PACKET, PACKET_VERSION, TPACKET_V3)
            req = struct.pack("7I", block_size, block_nr, FRAME_SIZE, block_size // FRAME_SIZE * block_nr,
                              RETIRE_TOV_MS, 0, 0)
            self.sock.setsockopt(SOL_PACKET, PACKET_RX_RING, req)
            self.size = block_size * block_nr
            self.mm = mmap.mmap(self.sock.fileno(), self.size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
            self.sock.bind((iface, ETH_P_ALL))
        except OSError as exc:
            self.sock.close()
            raise ConfigError(f"cannot set up a TPACKET_V3 ring on {iface}: {exc}") from None
        self.ring = np.frombuffer(self.mm, dtype=np.uint8)
        self.block_size = block_size
        self.block_nr = block_nr
        self.next_block = 0
        self.drops = 0
        self.kernel_packets = 0
        self.outgoing_duplicates = 0
        cap = block_nr * (block_size // 64 + 1)  # a packet takes >= 64 ring bytes
        self._off = np.empty(cap, np.int64)
        self._cap = np.empty(cap, np.uint32)
        self._len = np.empty(cap, np.uint32)
        self._ts = np.empty(cap, np.int64)
        self.poller = select.poll()
        self.poller.register(self.sock.fileno(), select.POLLIN | select.POLLERR)

    def wait(self, timeout_s: float) -> None:
        self.poller.poll(max(0, int(timeout_s * 1000)))

    def read(self, handle: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]) -> int:
        """Hand every ready block's packets to ``handle`` (ring, offset, caplen, wirelen,
        ts_ns), then give the blocks back to the kernel. Returns packets handled."""
        k, nb, dup = _ring_kernel(self.ring, self.next_block, self.block_nr, self.block_size,
                                  self.loopback, self._off, self._cap, self._len, self._ts)
        if nb == 0:
            return 0
        self.outgoing_duplicates += int(dup)
        handle(self.ring, self._off[:k], self._cap[:k], self._len[:k], self._ts[:k])
        _release_kernel(self.ring, self.next_block, nb, self.block_nr, self.block_size)
        self.next_block = (self.next_block + nb) % self.block_nr
        return int(k)

    def statistics(self) -> None:
        """Accumulate the kernel's packet/drop counters (reading resets them)."""
        raw = self.sock.getsockopt(SOL_PACKET, PACKET_STATISTICS, 12)
        packets, drops, _ = struct.unpack("3I", raw)
        self.kernel_packets += packets
        self.drops += drops

    def close(self) -> None:
        try:
            self.poller.unregister(self.sock.fileno())
        except (KeyError, ValueError):
            pass
        self.ring = np.zeros(0, np.uint8)
        try:
            self.mm.close()
        except BufferError:
            pass
        self.sock.close()


def _warm_up() -> None:
    """Compile (or load) every kernel on a dummy packet before the ring opens, so the first
    real block does not wait seconds for numba while the ring fills up."""
    ring = np.zeros(4096, np.uint8)
    ring[8] = TP_STATUS_USER
    ring[12] = 0
    off, cap, wl, ts = (np.zeros(4, np.int64), np.zeros(4, np.uint32), np.zeros(4, np.uint32), np.zeros(4, np.int64))
    _ring_kernel(ring, 0, 1, 4096, True, off, cap, wl, ts)
    _release_kernel(ring, 0, 1, 1, 4096)
    frame = np.zeros(128, np.uint8)
    frame[12], frame[13], frame[14] = 0x08, 0x00, 0x45
    frame[16], frame[17], frame[23] = 0, 60, 6
    frame[46] = 0x50
    b = CaptureBinner(epoch_ns=1000, window_ns=1000, iface_names=["w"])
    ifs = np.zeros(1, np.int32)
    dec = decode_packets(frame, np.zeros(1, np.int64), np.full(1, 128, np.uint32), np.full(1, 128, np.uint32),
                         ifs, np.array([1], np.int64))
    b.feed(Chunk(np.ones(1, np.int64), ifs, dec))
    b.flush(final=True)


def _stop_on_sigterm() -> Any:
    """SIGTERM (systemd, kill, a container stop) ends a capture like Ctrl-C: the last
    window is flushed and the trace closed complete. Returns the previous handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, stop)


def capture_live(iface: str, *, out: str | None, epoch_ns: int, window_ns: int,
                 local: Sequence[str] | None, node: str, job: str = "", duration_s: float | None = None,
                 publisher: Callable | None = None, verbose: bool = False,
                 ready: Callable[[], None] | None = None, stop: Callable[[], bool] | None = None,
                 on_window: Callable[[dict], None] | None = None, snaplen: int = 0) -> dict:
    """Capture on ``iface`` until ``duration_s``, Ctrl-C or ``stop()`` returns True, writing/
    publishing a batch set every window (``on_window`` gets the running counters then).
    Returns the summary (with ``drops``)."""
    _warm_up()
    if snaplen > 0:
        # Short frames: smaller blocks, more of them. A block is handed over when full or
        # after RETIRE_TOV_MS, so the ring holds block_nr x 4 ms of traffic at least: 64 x 1 MiB
        # blocks retired by the timer hold ~0.26 s, too little for a reader that a busy host
        # does not schedule for a while; 1024 x 64 KiB (same memory) hold ~4 s.
        rs = RingSocket(iface, snaplen=snaplen, block_size=1 << 16, block_nr=BLOCK_SIZE * BLOCK_NR >> 16)
    else:
        rs = RingSocket(iface)
    binner = CaptureBinner(epoch_ns=epoch_ns, window_ns=window_ns, iface_names=[iface],
                           local=local or None, node=node, job=job, lateness_ns=window_ns // 4)
    iface_ids = np.zeros(0, np.int32)
    lt = np.array([rs.linktype], np.int64)
    writer = TraceWriter(out, job=job, epoch_ns=epoch_ns, meta={"source": "live", "iface": iface}) if out else None
    failed: str | None = None
    n_batches = 0

    def emit(batches: list, events: list) -> None:
        nonlocal n_batches
        n_batches += len(batches)
        if writer is not None:
            writer.write_events(events)
            for b in batches:
                writer.write_batch(b)
        if publisher is not None and (batches or events):
            publisher(batches=batches, events=events)

    def handle(ring: np.ndarray, off: np.ndarray, cap: np.ndarray, wl: np.ndarray, ts: np.ndarray) -> None:
        nonlocal iface_ids
        if iface_ids.shape[0] < off.shape[0]:
            iface_ids = np.zeros(off.shape[0], np.int32)
        ifs = iface_ids[: off.shape[0]]
        dec = decode_packets(ring, off, cap, wl, ifs, lt)
        binner.feed(Chunk(ts.copy(), ifs, dec))

    start = time.monotonic()
    next_flush = start + window_ns / 1e9
    if ready is not None:
        ready()
    old_term = _stop_on_sigterm()
    try:
        while True:
            now = time.monotonic()
            if duration_s is not None and now - start >= duration_s:
                break
            if stop is not None and stop():
                break
            rs.wait(min(next_flush - now, 0.05) if next_flush > now else 0)
            rs.read(handle)
            if time.monotonic() >= next_flush:
                rs.statistics()
                emit(binner.flush(), binner.take_events())
                if writer is not None:
                    writer.flush()  # a capture killed now leaves every window so far readable
                next_flush += window_ns / 1e9
                if on_window is not None:
                    on_window({"packets": binner.packets, "flows": binner.n_flows, "drops": rs.drops,
                               "kernel_packets": rs.kernel_packets})
                if verbose:
                    print(f"\r{binner.packets} packets, {binner.n_flows} flows, drops {rs.drops}",
                          end="", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        pass
    except BaseException as exc:
        failed = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        # drain what the kernel still holds: retire timeout lets partly filled blocks out
        time.sleep(RETIRE_TOV_MS * 2 / 1000)
        while rs.read(handle):
            pass
        rs.statistics()
        emit(binner.flush(final=True), binner.take_events())
        if writer is not None:
            writer.close(error=failed)
        rs.close()
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
        if verbose:
            print(file=sys.stderr)
    summary = binner.summary()
    summary.update({"drops": rs.drops, "kernel_packets": rs.kernel_packets,
                    "loopback_outgoing_duplicates": rs.outgoing_duplicates,
                    "batches": n_batches, "iface": iface, "pid": os.getpid()})
    return summary
