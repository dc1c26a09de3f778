"""The edge option: each node segments its own hook events and epoch batches and publishes
only the op-metrics messages (metrics and forwarded events); the central localize agent's
state reads them and concludes what ``pulse diagnose`` (central segmentation) concludes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pulse.engine import diagnose
from pulse.streams.edge import EdgePublisher, EdgeSegmenter
from pulse.streams.state import LocalizeState, Message

from pulse import events as _events
from pulse.records import Verdict, decode_op_metrics_many
from pulse.samples import EpochBatch
from pulse.settings import Topics
from pulse.trace import TraceReader

T = Topics.with_prefix("edge")
SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "steps": 8}
SCENARIOS = ["healthy", "nic-slow", "gpu-hang", "path-slow", "cpu-contention"]
CHUNK_NS = 50_000_000


def incidents(verdicts: list[Verdict]) -> dict[tuple[str, str, tuple[str, ...]], tuple[object, int]]:
    out: dict[tuple[str, str, tuple[str, ...]], tuple[object, int]] = {}
    for v in verdicts:
        if v.status == "anomaly":
            out.setdefault((str(v.kind), str(v.level), tuple(v.nodes)),
                           (v.window.get("comm_id"), int(v.window.get("first_seq") or 0)))
    return out


def per_node_chunks(trace: Path) -> list[tuple[str, list[_events.HookEvent], list[EpochBatch]]]:
    """The trace as each node's producer sees it (its own items only), cut into 50 ms
    chunks of trace time per node; the chunks of all nodes in the order they close."""
    setup, timed = TraceReader(trace).timeline()
    out: list[tuple[str, list[_events.HookEvent], list[EpochBatch]]] = []
    cur: dict[str, tuple[list[_events.HookEvent], list[EpochBatch]]] = {}
    start: dict[str, int] = {}
    for ev in setup:  # published first
        cur.setdefault(ev.node, ([], []))[0].append(ev)
    for t, item in timed:
        node = item.node
        if node in start and t >= start[node] + CHUNK_NS:
            out.append((node, *cur.pop(node)))
            del start[node]
        start.setdefault(node, t)
        evs, bts = cur.setdefault(node, ([], []))
        (bts if isinstance(item, EpochBatch) else evs).append(item)  # type: ignore[arg-type]
    out += [(node, evs, bts) for node, (evs, bts) in cur.items()]
    return out


def through_edge(trace: Path) -> tuple[list[Verdict], list[tuple[bytes, bytes]]]:
    edges: dict[str, EdgeSegmenter] = {}
    loc = LocalizeState()
    verdicts: list[Verdict] = []
    sent: list[tuple[bytes, bytes]] = []

    def localize(msgs: list[tuple[bytes, bytes]]) -> None:
        sent.extend(msgs)
        verdicts.extend(loc.handle([Message(T.op_metrics, k, v) for k, v in msgs], now=0.0).verdicts)

    for node, evs, bts in per_node_chunks(trace):
        assert all(e.node == node for e in evs) and all(b.node == node for b in bts)
        localize(edges.setdefault(node, EdgeSegmenter()).add(evs, bts))
    for seg in edges.values():
        localize(seg.finish())
        assert not seg.refused
    verdicts += loc.finish().verdicts
    return verdicts, sent


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    root = tmp_path_factory.mktemp("edge")
    for name in SCENARIOS:
        simulate(SimConfig(scenario=name, seed=3, job=f"job-{name}", **SIZE), root / name)
    return {name: root / name for name in SCENARIOS}


@pytest.mark.parametrize("name", SCENARIOS)
def test_edge_segmentation_concludes_what_central_segmentation_concludes(battery: dict[str, Path], name: str) -> None:
    central = diagnose(battery[name])
    want = incidents(central.verdicts)
    assert bool(want) == (name != "healthy"), f"{name}: diagnose found {want}"
    verdicts, sent = through_edge(battery[name])
    assert incidents(verdicts) == want
    # the same operator records travelled, and nothing but op-metrics messages
    got = sorted((m.node, m.comm_id, m.rank, m.seq, m.act_ns, m.volume_bytes)
                 for _, v in sent if b'"op-metrics' in v[:40] for m in decode_op_metrics_many(v))
    assert got == sorted((m.node, m.comm_id, m.rank, m.seq, m.act_ns, m.volume_bytes) for m in central.metrics)


class _Recorder:
    """The part of a Publisher the edge publisher uses, recording what it sends."""

    def __init__(self) -> None:
        self.topics = T
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.flushed = 0

    async def publish(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent.append((topic, key, value))

    async def flush(self) -> None:
        self.flushed += 1


def test_edge_publisher_sends_op_metrics_only(battery: dict[str, Path]) -> None:
    rec = _Recorder()
    edge = EdgePublisher(rec, chunk_s=0.0)

    async def go() -> None:
        setup, timed = TraceReader(battery["nic-slow"]).timeline()
        for ev in setup:
            if ev.node == "node-01":
                await edge.publish_event(ev)
        for _, item in timed:
            if item.node == "node-01":
                await (edge.publish_batch(item) if isinstance(item, EpochBatch) else edge.publish_event(item))
        await edge.finish()

    asyncio.run(go())
    assert rec.flushed == 1 and rec.sent
    assert {t for t, _, _ in rec.sent} == {T.op_metrics}
    assert {k for _, k, _ in rec.sent} == {b"job-nic-slow"}
    nodes = {m.node for _, _, v in rec.sent if b'"op-metrics' in v[:40] for m in decode_op_metrics_many(v)}
    assert nodes == {"node-01"}
    assert edge.seg.stats["op_metrics"] > 0
