"""Decoded packets -> per-NIC epoch batches and ``flow`` hook events, chunk by chunk.

Nodes and directions:

* With a local address set (``local=[...]``) the capture is one node's view: a packet
  *from* a local address is ``tx`` on that node's NIC (the capture interface), a packet
  *to* one is ``rx``; packets touching no local address are skipped (``not_local``).
* Without one, every address is its own node (named by the address): each packet is
  ``tx`` on its source's stream and ``rx`` on its destination's stream, on the NIC named
  after the capture interface.

Flows: RoCE = (destination QPN, source address, destination address); TCP = the
directional 5-tuple. Flow ids are dense per (node, NIC), 0, 1, 2, ... in first-seen order.
Bytes in epochs are *payload* bytes of data packets (RoCE SEND/WRITE/READ response, TCP
segments including retransmissions); ACK/NAK/CNP/READ requests are counted, not binned.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
from collections.abc import Sequence
from typing import Any

import numba
import numpy as np
from pulse.nic import decode as D
from pulse.nic.binning import bin_entries
from pulse.nic.flowtable import KeyTable, RetransTracker

from pulse.errors import ConfigError
from pulse.events import FlowEvent
from pulse.samples import EpochBatch, make_batch

_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.:@+-]")
_V4MAP = 0xFFFF00000000
_T_ROCE = 1 << 40
_T_TCP = 2 << 40


def safe_name(raw: str, fallback: str) -> str:
    name = _BAD_NAME_CHARS.sub("_", raw)[:128]
    return name or fallback


def parse_address(text: str) -> tuple[int, int]:
    """An IPv4/IPv6 address (or ``lid-N`` for an IB LID) -> (hi, lo) as the decoder stores it."""
    t = text.strip()
    if t.startswith("lid-"):
        try:
            return 0, int(t[4:], 0)
        except ValueError:
            raise ConfigError(f"local address {text!r}: bad IB LID") from None
    try:
        a = ipaddress.ip_address(t)
    except ValueError:
        raise ConfigError(f"local address {text!r}: not an IPv4 or IPv6 address") from None
    if isinstance(a, ipaddress.IPv4Address):
        return 0, _V4MAP | int(a)
    v = int(a)
    return v >> 64, v & ((1 << 64) - 1)


@functools.lru_cache(maxsize=65536)
def format_address(fam: int, hi: int, lo: int) -> str:
    if fam == D.FAM_IB_LID:
        return f"lid-{lo}"
    if fam == D.FAM_IP4 or (hi == 0 and (lo >> 32) == 0xFFFF):
        return str(ipaddress.IPv4Address(lo & 0xFFFFFFFF))
    return str(ipaddress.IPv6Address((hi << 64) | lo))


@dataclasses.dataclass
class Chunk:
    """Packets of one read: timestamps, interfaces and decoded columns."""

    ts_ns: np.ndarray
    iface: np.ndarray
    dec: D.Decoded


@numba.njit(cache=True)
def _account_kernel(pf, kind, payload, rbytes, ts, pf_txsf, pf_rxsf, stats, e_pf, e_ts, e_bytes):
    """Per-packet-flow counters, and the byte entries to bin. Returns (entries, packets of
    flows with no stream on either side)."""
    k = 0
    orphan = 0
    for i in range(pf.shape[0]):
        f = pf[i]
        if f < 0:
            continue
        if pf_txsf[f] < 0 and pf_rxsf[f] < 0:
            orphan += 1
            continue
        kd = kind[i]
        if kd == D.K_ROCE_DATA or kd == D.K_TCP:
            b = payload[i]
            stats[f, 0] += b
            stats[f, 1] += 1
            if rbytes[i] > 0:
                stats[f, 6] += 1
                stats[f, 7] += rbytes[i]
            if b > 0:
                e_pf[k] = f
                e_ts[k] = ts[i]
                e_bytes[k] = b
                k += 1
        elif kd == D.K_ROCE_ACK:
            stats[f, 2] += 1
        elif kd == D.K_ROCE_NAK:
            stats[f, 3] += 1
        elif kd == D.K_ROCE_CNP:
            stats[f, 4] += 1
        elif kd == D.K_ROCE_REQUEST:
            stats[f, 5] += 1
    return k, orphan


@numba.njit(cache=True)
def _keys_kernel(iface, kind, fam, qpn, sport, dport, src_hi, src_lo, dst_hi, dst_lo, keys, use):
    """Packet-flow keys (iface, transport|qpn|ports, fam, src, dst) in one pass, and which
    packets belong to a flow at all."""
    for i in range(kind.shape[0]):
        kd = kind[i]
        use[i] = kd != D.K_SKIP and kd != D.K_ROCE_MAD
        keys[i, 0] = np.uint64(iface[i])
        if kd == D.K_TCP:
            keys[i, 1] = np.uint64(_T_TCP) | (np.uint64(sport[i]) << np.uint64(16)) | np.uint64(dport[i])
        else:
            keys[i, 1] = np.uint64(_T_ROCE) | np.uint64(qpn[i])
        keys[i, 2] = np.uint64(fam[i])
        keys[i, 3] = src_hi[i]
        keys[i, 4] = src_lo[i]
        keys[i, 5] = dst_hi[i]
        keys[i, 6] = dst_lo[i]


_PF_STATS = 8  # data bytes, data packets, acks, naks, cnps, requests, retrans packets, retrans bytes


class CaptureBinner:
    """Stateful: feed chunks of decoded packets, take batches and flow events as windows
    close. Usable for a file (one or many chunks) and for a live ring."""

    def __init__(self, *, epoch_ns: int, window_ns: int, iface_names: Sequence[str],
                 local: Sequence[str] | None = None, node: str = "local", job: str = "",
                 lateness_ns: int = 0) -> None:
        if epoch_ns < 1000:
            raise ConfigError(f"epoch {epoch_ns} ns: must be at least 1 us")
        self.epoch_ns = int(epoch_ns)
        self.window_epochs = max(1, int(window_ns) // self.epoch_ns)
        self.window_ns = self.window_epochs * self.epoch_ns
        self.job = job
        self.lateness_ns = int(lateness_ns)
        self.iface_names = [safe_name(n, f"if{i}") for i, n in enumerate(iface_names)]
        self.local: tuple[np.ndarray, np.ndarray] | None = None
        self.node_names: list[str] = []
        if local:
            addrs = [parse_address(a) for a in local]
            self.local = (np.array([a[0] for a in addrs], np.uint64), np.array([a[1] for a in addrs], np.uint64))
            self.node_names = [safe_name(node, "local")]
        self.nodes = KeyTable(3)         # (fam, hi, lo) -> node id (no local set)
        self.streams = KeyTable(2)       # (node, iface) -> stream id
        self.pflows = KeyTable(7)        # (iface, transport|qpn|ports, fam, src, dst) -> packet flow
        self.retrans = RetransTracker()
        self.stream_nflows: list[int] = []
        self.pf_txsf = np.zeros(0, np.int64)
        self.pf_rxsf = np.zeros(0, np.int64)
        self.pf_first_ts = np.zeros(0, np.int64)
        self.pf_stats = np.zeros((0, _PF_STATS), np.int64)
        self.sf_stream: list[int] = []
        self.sf_local: list[int] = []
        self.sf_pf: list[int] = []
        self.sf_side: list[int] = []     # 0 source side, 1 destination side, 2 both (src == dst)
        self.batch_seq: dict[int, int] = {}
        self.kinds = np.zeros(len(D.KIND_NAMES), np.int64)
        self.skipped: dict[str, int] = {}
        self.packets = 0
        self.saturated_rows = 0
        self.late_batches = 0
        self._flushed_window: dict[int, int] = {}
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._max_ts: int | None = None
        self._new_events: list[FlowEvent] = []

    @property
    def n_flows(self) -> int:
        return len(self.sf_stream)

    # -- feeding ---------------------------------------------------------------------
    def skip(self, reason: str, count: int) -> None:
        if count:
            self.skipped[reason] = self.skipped.get(reason, 0) + int(count)

    def feed(self, chunk: Chunk) -> None:
        d = chunk.dec
        n = int(chunk.ts_ns.shape[0])
        self.packets += n
        if n == 0:
            return
        for i, c in enumerate(d.skipped):
            self.skip(D.DECODE_REASON_NAMES[i], int(c))
        kinds = np.bincount(d.kind.astype(np.int64), minlength=len(D.KIND_NAMES))[: len(D.KIND_NAMES)]
        self.kinds += kinds
        self.skip("roce_mad", int(kinds[D.K_ROCE_MAD]))
        keys = np.empty((n, 7), np.uint64)
        use = np.empty(n, np.bool_)
        _keys_kernel(np.ascontiguousarray(chunk.iface), d.kind, d.fam, d.qpn, d.sport, d.dport, d.src_hi,
                     d.src_lo, d.dst_hi, d.dst_lo, keys, use)
        roce = d.kind != D.K_TCP
        before = self.pflows.n
        pf = self.pflows.lookup(keys, use)
        if self.pflows.n > before:
            self._new_pflows(before, keys[self.pflows.new_rows], chunk.ts_ns[self.pflows.new_rows])
        is_tcp = ~roce
        if is_tcp.any():
            rbytes = self.retrans.update(np.where(is_tcp, pf, -1), d.seq, np.where(is_tcp, d.payload, 0))
        else:
            rbytes = np.zeros(n, np.int64)
        e = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64))
        ts = np.ascontiguousarray(chunk.ts_ns, np.int64)
        k, orphan = _account_kernel(pf, d.kind, d.payload, rbytes, ts, self.pf_txsf, self.pf_rxsf,
                                    self.pf_stats, *e)
        self.skip("not_local", orphan)
        if k:
            self._pending.append(tuple(a[:k] for a in e))  # type: ignore[arg-type]
        mx = int(ts.max())
        self._max_ts = mx if self._max_ts is None else max(self._max_ts, mx)

    def _new_pflows(self, before: int, keys: np.ndarray, first_ts: np.ndarray) -> None:
        m = keys.shape[0]
        iface = keys[:, 0]
        if self.local is None:
            ak = np.empty((2 * m, 3), np.uint64)
            ak[0::2, 0], ak[0::2, 1], ak[0::2, 2] = keys[:, 2], keys[:, 3], keys[:, 4]
            ak[1::2, 0], ak[1::2, 1], ak[1::2, 2] = keys[:, 2], keys[:, 5], keys[:, 6]
            nb = self.nodes.n
            node = self.nodes.lookup(ak)
            for j in range(nb, self.nodes.n):
                f, hi, lo = (int(x) for x in self.nodes.store[j])
                self.node_names.append(safe_name(format_address(f, hi, lo), f"node{j}"))
            valid = np.ones(2 * m, np.bool_)
        else:
            lh, ll = self.local
            src_loc = np.zeros(m, np.bool_)
            dst_loc = np.zeros(m, np.bool_)
            for h, lo in zip(lh, ll, strict=True):
                src_loc |= (keys[:, 3] == h) & (keys[:, 4] == lo)
                dst_loc |= (keys[:, 5] == h) & (keys[:, 6] == lo)
            valid = np.empty(2 * m, np.bool_)
            valid[0::2], valid[1::2] = src_loc, dst_loc
            node = np.zeros(2 * m, np.int64)
        sk = np.stack([node.astype(np.uint64), np.repeat(iface, 2)], axis=1)
        sb = self.streams.n
        stream = self.streams.lookup(sk, valid).tolist()
        self.stream_nflows.extend([0] * (self.streams.n - sb))
        txsf = np.full(m, -1, np.int64)
        rxsf = np.full(m, -1, np.int64)
        for j in range(m):  # once per new flow, never per packet
            st, sr = stream[2 * j], stream[2 * j + 1]
            if st >= 0:
                txsf[j] = self._add_sf(st, before + j, 2 if st == sr else 0, keys[j], int(first_ts[j]))
            if sr >= 0:
                rxsf[j] = txsf[j] if st == sr else self._add_sf(sr, before + j, 1, keys[j], int(first_ts[j]))
        self.pf_txsf = np.concatenate([self.pf_txsf, txsf])
        self.pf_rxsf = np.concatenate([self.pf_rxsf, rxsf])
        self.pf_first_ts = np.concatenate([self.pf_first_ts, first_ts.astype(np.int64)])
        self.pf_stats = np.concatenate([self.pf_stats, np.zeros((m, _PF_STATS), np.int64)])

    def _add_sf(self, stream: int, pfid: int, side: int, key: np.ndarray, first_ts: int) -> int:
        sf = len(self.sf_stream)
        local = self.stream_nflows[stream]
        self.stream_nflows[stream] += 1
        self.sf_stream.append(stream)
        self.sf_local.append(local)
        self.sf_pf.append(pfid)
        self.sf_side.append(side)
        node, nic = self._stream_names(stream)
        aux, fam = int(key[1]), int(key[2])
        common: dict[str, Any] = dict(job=self.job, node=node, nic=nic, flow=local,
                      src=format_address(fam, int(key[3]), int(key[4])),
                      dst=format_address(fam, int(key[5]), int(key[6])),
                      source="capture", t_host_ns=first_ts)
        if aux & _T_ROCE:
            qpn = aux & 0xFFFFFF
            # the destination QPN is local to the receiving side, remote to the sender
            qp: dict[str, Any] = {"remote_qpn": qpn} if side == 0 else {"qpn": qpn}
            ev = FlowEvent(**common, transport="roce", **qp)
        else:
            ev = FlowEvent(**common, transport="tcp", sport=(aux >> 16) & 0xFFFF, dport=aux & 0xFFFF)
        self._new_events.append(ev)
        return sf

    def _stream_names(self, s: int) -> tuple[str, str]:
        node_id, iface = (int(x) for x in self.streams.store[s])
        return self.node_names[node_id], self.iface_names[iface]

    # -- output ----------------------------------------------------------------------
    def take_events(self) -> list[FlowEvent]:
        ev, self._new_events = self._new_events, []
        return ev

    def flush(self, final: bool = False) -> list[EpochBatch]:
        """Batches of every window that closed (all of them when ``final``)."""
        if not self._pending:
            return []
        if len(self._pending) == 1:
            pf, ts, nb = self._pending[0]
        else:
            pf, ts, nb = (np.concatenate(c) for c in zip(*self._pending, strict=True))
        self._pending = []
        if not final and self._max_ts is not None:
            closed = (self._max_ts - self.lateness_ns) // self.window_ns * self.window_ns
            take = ts < closed
            if not take.all():
                keep = ~take
                self._pending.append((pf[keep], ts[keep], nb[keep]))
                pf, ts, nb = pf[take], ts[take], nb[take]
        if ts.shape[0] == 0:
            return []
        rows = bin_entries(pf, ts, nb, self.pf_txsf, self.pf_rxsf, np.asarray(self.sf_stream, np.int64),
                           epoch_ns=self.epoch_ns, window_epochs=self.window_epochs)
        self.saturated_rows += rows.saturated
        sf_local = np.asarray(self.sf_local, np.int64)
        out = []
        for s, w, a, b in rows.groups():
            node, nic = self._stream_names(s)
            last = self._flushed_window.get(s)
            if last is not None and last >= w:
                self.late_batches += 1
            self._flushed_window[s] = w if last is None else max(w, last)
            seq = self.batch_seq.get(s, 0)
            self.batch_seq[s] = seq + 1
            out.append(make_batch(node=node, nic=nic, t0_ns=w * self.window_ns, epoch_ns=self.epoch_ns,
                                  batch_seq=seq, flow=sf_local[rows.sf[a:b]], epoch=rows.epoch[a:b],
                                  tx_bytes=rows.tx[a:b], rx_bytes=rows.rx[a:b], job=self.job))
        return out

    # -- summary ---------------------------------------------------------------------
    def flow_summary(self) -> list[dict]:
        out = []
        for g in range(self.n_flows):
            pfid = self.sf_pf[g]
            key = self.pflows.store[pfid]
            node, nic = self._stream_names(self.sf_stream[g])
            aux, fam = int(key[1]), int(key[2])
            rec: dict = {"node": node, "nic": nic, "flow": self.sf_local[g],
                         "transport": "roce" if aux & _T_ROCE else "tcp",
                         "src": format_address(fam, int(key[3]), int(key[4])),
                         "dst": format_address(fam, int(key[5]), int(key[6]))}
            if aux & _T_ROCE:
                rec["dest_qpn"] = aux & 0xFFFFFF
            else:
                rec["sport"], rec["dport"] = (aux >> 16) & 0xFFFF, aux & 0xFFFF
            st = [int(x) for x in self.pf_stats[pfid]]
            side = self.sf_side[g]
            tx = side in (0, 2)
            rx = side in (1, 2)
            rec.update({"tx_bytes": st[0] if tx else 0, "tx_packets": st[1] if tx else 0,
                        "rx_bytes": st[0] if rx else 0, "rx_packets": st[1] if rx else 0,
                        "acks": st[2], "naks": st[3], "cnps": st[4], "requests": st[5],
                        "retransmitted_packets": st[6], "retransmitted_bytes": st[7]})
            out.append(rec)
        return out

    def summary(self) -> dict:
        return {
            "packets": self.packets,
            "decoded": {D.KIND_NAMES[i]: int(c) for i, c in enumerate(self.kinds) if i and c},
            "skipped": dict(sorted(self.skipped.items())),
            "nodes": list(self.node_names),
            "streams": [list(self._stream_names(s)) for s in range(self.streams.n)],
            "epoch_ns": self.epoch_ns,
            "window_ns": self.window_ns,
            "saturated_rows": self.saturated_rows,
            "late_batches": self.late_batches,
            "flows": self.flow_summary(),
        }
