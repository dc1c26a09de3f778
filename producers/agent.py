"""``pulse agent``: the one process an operator runs per node.

Sources (:mod:`pulse.producers.agent_sources`), each a supervised thread: the live capture
of the node's interface, a hook directory (torch injection files, NCCL logs, plugin record
files), the NCCL profiler plugin's socket, and ``rdma res`` polling. Their output comes to
one loop here, which joins it (:mod:`pulse.producers.agent_join` for TCP connections,
:func:`pulse.hooks.rdma_res.join_flows` for RDMA QPs), numbers the batches it publishes, and
hands everything to the :class:`~pulse.producers.publisher.Publisher` (disk spool, so a
broker outage loses nothing up to the spool's bound).

Every ``health_s`` it publishes a health record on ``<prefix>.pipeline`` (``"agent": node``):
sources and their state, drops, lag, what was published, the join's counters, its CPU and
memory, and the announcements the other agents' joins read (addresses, ranks, ring
successors, start seqs). It reads those records back from the same topic.

SIGTERM / SIGINT: the sources stop (the capture flushes its last window), what they handed
over is joined and published, the publisher confirms or spools everything, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import queue
import resource
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from pulse.events import FlowEvent, HookEvent
from pulse.samples import EpochBatch
from pulse.settings import DEFAULT_EPOCH_NS, Settings

from .agent_join import TcpJoin
from .agent_sources import CaptureSource, HookDirSource, PluginSocketSource, RdmaResSource, Source

log = logging.getLogger("pulse.producers.agent")

TICK_S = 0.25
MAX_QUEUE = 10_000
"""Items (a capture window, a batch of hook events) waiting for the loop; beyond, the
sources block: the kernel ring then drops packets, and counts them."""


@dataclasses.dataclass
class AgentConfig:
    node: str
    job: str = ""
    iface: str | None = None
    local: list[str] = dataclasses.field(default_factory=list)
    netns: str | None = None
    hook_dir: Path | None = None
    plugin_socket: Path | None = None
    rdma: bool = True
    epoch_ns: int = DEFAULT_EPOCH_NS
    window_ns: int = 10_000_000
    snaplen: int = 128
    """bytes of each frame the kernel copies to the capture ring (headers; 0 = all)"""
    health_s: float = 0.5
    coalesce_ms: float = 20.0
    duration_s: float | None = None


class Agent:
    def __init__(self, settings: Settings, cfg: AgentConfig, *, segmenter: Any = None) -> None:
        """``segmenter``: the edge option (:class:`pulse.streams.edge.EdgeSegmenter`, given
        by the CLI: producers do not import the engine): the node's own hook events and epoch
        batches are segmented here, and only its operator metrics (with what the job's
        localizer is forwarded) go out, on the op-metrics topic."""
        self.settings = settings
        self.cfg = cfg
        self.segmenter = segmenter
        self.stop = threading.Event()
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(MAX_QUEUE)
        self.join = TcpJoin(cfg.node, cfg.local, gate=bool(cfg.iface))
        self.sources: list[Source] = []
        self._seq: dict[tuple[str, str], int] = {}
        self._bound_rdma: dict[tuple[str, str, int], FlowEvent] = {}
        self._rdma_sent: dict[tuple[str, str, int], FlowEvent] = {}
        self.published = {"batches": 0, "rows": 0, "events": 0, "health": 0}
        self.last_batch_end_ns: int | None = None
        self._dir_thread: threading.Thread | None = None
        self._pub: Any = None

    # -- set-up ----------------------------------------------------------------------
    def _make_sources(self) -> None:
        c, q, s = self.cfg, self.queue, self.stop
        if c.iface:
            self.sources.append(CaptureSource(q, s, iface=c.iface, node=c.node, local=c.local, epoch_ns=c.epoch_ns,
                                              window_ns=c.window_ns, netns=c.netns, job=c.job,
                                              snaplen=c.snaplen))
        if c.hook_dir is not None:
            self.sources.append(HookDirSource(q, s, directory=c.hook_dir, node=c.node, job=c.job))
        if c.plugin_socket is not None:
            self.sources.append(PluginSocketSource(q, s, path=c.plugin_socket, node=c.node, job=c.job))
        if c.rdma:
            self.sources.append(RdmaResSource(q, s, netns=c.netns))

    def run(self) -> dict[str, Any]:
        """Run until SIGTERM/SIGINT (or ``duration_s``); returns the final health record."""
        from .sync import SyncPublisher

        self._install_signals()  # first: a SIGTERM while the publisher waits for the broker
        self._pub = SyncPublisher(self.settings, coalesce_ms=self.cfg.coalesce_ms,
                                  client_id=f"pulse-agent-{self.cfg.node}")
        self._make_sources()
        for src in self.sources:
            src.start()
        self._dir_thread = threading.Thread(target=self._directory_loop, name="pulse-agent-directory", daemon=True)
        self._dir_thread.start()
        started = time.monotonic()
        next_tick = next_health = time.monotonic()
        try:
            while not self.stop.is_set():
                self._drain(timeout=0.05)
                now = time.monotonic()
                if now >= next_tick:
                    self._tick()
                    next_tick = now + TICK_S
                if now >= next_health:
                    self._health()
                    next_health = now + self.cfg.health_s
                if self.cfg.duration_s is not None and now - started >= self.cfg.duration_s:
                    self.stop.set()
        finally:
            self.stop.set()
            for src in self.sources:
                src.join(timeout=10)
            self._drain(timeout=0)
            self._tick()
            if self.segmenter is not None:  # the node's input ends: close its open operators
                self._publish_edge(self.segmenter.finish())
            final = self._health(final=True)
            self._pub.close(drain_timeout_s=30.0)
            final["publisher"] = self._publisher_stats()
        return final

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, frame: object) -> None:
            self.stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    # -- the loop --------------------------------------------------------------------
    def _drain(self, timeout: float) -> None:
        batches: list[EpochBatch] = []
        events: list[HookEvent] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                left = deadline - time.monotonic()
                kind, payload = self.queue.get(timeout=left) if left > 0 and not batches and not events \
                    else self.queue.get_nowait()
            except queue.Empty:
                break
            if kind == "capture":
                b, e = payload
                events += self.join.capture_events(e)
                batches += self.join.batches(b)
            elif kind == "hooks":
                for ev in payload:
                    if isinstance(ev, FlowEvent) and ev.bound and ev.qpn is not None:
                        self._bound_rdma[(ev.node, ev.nic, ev.flow)] = ev
                events += self.join.hook_events(payload)
            elif kind == "rdma":
                events += self._rdma(payload)
            elif kind == "directory":
                self.join.directory(payload)
        self._publish(batches, events)

    def _rdma(self, qps: list[Any]) -> list[HookEvent]:
        """QPs of this node's processes, completed with the hooks' bindings; only new or
        changed ones are published."""
        from pulse.hooks.rdma_res import flows_from_rdma, join_flows

        flows = flows_from_rdma(qps, self.cfg.node, self.cfg.job, t_host_ns=time.time_ns())
        joined = join_flows(flows, bound=self._bound_rdma.values())
        out: list[HookEvent] = []
        for f in joined:
            key = (f.node, f.nic, f.flow)
            old = self._rdma_sent.get(key)
            if old is not None and dataclasses.replace(old, t_host_ns=None) == dataclasses.replace(f, t_host_ns=None):
                continue
            self._rdma_sent[key] = f
            out.append(f)
        return out

    def _tick(self) -> None:
        b, e = self.join.tick()
        self._publish(b, e)
        pids = {p for g in self.join.gates.values() for p in g.pids.values()}
        if pids:
            self.join.forget_ended(p for p in pids if Path(f"/proc/{p}").exists())

    def _publish(self, batches: list[EpochBatch], events: list[HookEvent]) -> None:
        if not batches and not events:
            return
        out = []
        for b in batches:
            # the join drops rows and whole batches: number what goes out without gaps
            key = (b.node, b.nic)
            seq = self._seq.get(key, 0)
            self._seq[key] = seq + 1
            out.append(dataclasses.replace(b, batch_seq=seq))
            self.published["rows"] += int(b.flow.size)
            end = b.end_ns()
            self.last_batch_end_ns = end if self.last_batch_end_ns is None else max(self.last_batch_end_ns, end)
        self.published["batches"] += len(out)
        self.published["events"] += len(events)
        if self.segmenter is not None:
            self._publish_edge(self.segmenter.add(events, out))
        else:
            self._pub.publish(batches=out, events=events)

    def _publish_edge(self, msgs: list[tuple[bytes, bytes]]) -> None:
        topic = self.settings.topics.op_metrics
        for key, value in msgs:
            self._pub.publish_raw(topic, key, value)
        self.published["op_metrics_messages"] = self.published.get("op_metrics_messages", 0) + len(msgs)

    # -- health and the directory ----------------------------------------------------
    def _publisher_stats(self) -> dict[str, Any]:
        st = self._pub.stats
        keys = ("sent", "confirmed", "spool_bytes", "spooled", "delivered_from_spool", "dropped", "outages",
                "connected", "inflight")
        return {k: st.get(k) for k in keys}

    def _health(self, final: bool = False) -> dict[str, Any]:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        now = time.time_ns()
        sources = {s.status.name: s.status.as_dict() for s in self.sources}
        capture = next((s.status.extra for s in self.sources if isinstance(s, CaptureSource)), {})
        rec = {
            "type": "agent", "v": 1, "agent": self.cfg.node, "node": self.cfg.node, "job": self.cfg.job,
            "t_ns": now, "final": final, "pid": os.getpid(), "host": socket.gethostname(),
            **self.join.announce(),
            "sources": sources,
            "sources_seen": sorted(n for n, s in sources.items() if s["seen"]),
            "drops": {"capture_kernel": int(capture.get("drops", 0)),
                      "spool": int(self._pub.stats.get("dropped", 0)),
                      "join_buffer": self.join.stats.buffer_dropped},
            "lag_ms": None if self.last_batch_end_ns is None else round((now - self.last_batch_end_ns) / 1e6, 1),
            "queue": self.queue.qsize(),
            "published": dict(self.published),
            **({"edge": self.segmenter.stats} if self.segmenter is not None else {}),
            "join": dataclasses.asdict(self.join.stats),
            "publisher": self._publisher_stats(),
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 3),
            "max_rss_bytes": ru.ru_maxrss * 1024,
        }
        self._pub.publish_raw(self.settings.topics.pipeline, self.cfg.node.encode(), orjson.dumps(rec))
        self.published["health"] += 1
        return rec

    def _directory_loop(self) -> None:
        """Other agents' records from the pipeline topic, for the join (reconnects)."""
        while not self.stop.is_set():
            try:
                asyncio.run(self._consume_directory())
            except Exception as exc:  # broker away: the join waits, the agent goes on
                log.info("directory consumer: %s; retrying", exc)
            self.stop.wait(1.0)

    async def _consume_directory(self) -> None:
        from aiokafka import AIOKafkaConsumer

        c = AIOKafkaConsumer(self.settings.topics.pipeline, bootstrap_servers=self.settings.bootstrap(None),
                             auto_offset_reset="earliest", group_id=None, fetch_max_wait_ms=100,
                             metadata_max_age_ms=2000)
        await c.start()
        try:
            while not self.stop.is_set():
                got = await c.getmany(timeout_ms=200)
                recs = []
                for msgs in got.values():
                    for m in msgs:
                        with contextlib.suppress(Exception):
                            r = orjson.loads(m.value)
                            if r.get("type") == "agent" and r.get("node") != self.cfg.node:
                                recs.append(r)
                if recs:
                    self.queue.put(("directory", recs))
        finally:
            await c.stop()


def local_addresses(iface: str | None, netns: str | None) -> list[str]:
    """IPv4/IPv6 addresses of ``iface`` (``ip -j addr``), inside ``netns`` when given."""
    import subprocess

    if not iface:
        return []
    cmd = ["ip", "-j", "addr", "show", "dev", iface]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        data = orjson.loads(proc.stdout or "[]")
    except (OSError, subprocess.SubprocessError, orjson.JSONDecodeError):
        return []
    return [a["local"] for link in data for a in link.get("addr_info", []) if a.get("scope") != "link"
            and "local" in a]
