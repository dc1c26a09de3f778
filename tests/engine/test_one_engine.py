"""One engine: a trace streamed through the agents' code path (Kafka messages, decoded by
the agents' state objects, in chunks, partitions interleaved as a consumer may see them)
gets the same anomaly incidents, with the same first operator, as ``pulse diagnose``.

Kafka keeps order only within a topic partition: samples and hook events are keyed by
node, so each (topic, node) stream is in order while the streams interleave freely (a
consumer fetches partitions at different paces). The op-metrics topic is keyed by job, so
the localize agent reads it in the order the segment agent wrote it.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pulse.engine import diagnose
from pulse.streams.state import LocalizeState, Message, SegmentState

from pulse import events as _events
from pulse import samples as _samples
from pulse.records import Verdict
from pulse.samples import EpochBatch
from pulse.settings import Topics
from pulse.trace import TraceReader

T = Topics.with_prefix("eng")
SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "steps": 8}
SCENARIOS = ["healthy", "nic-slow", "nic-down", "nic-flap", "packet-loss", "pcie-slow", "congestion", "gpu-slow",
             "gpu-hang", "cpu-contention", "moe-slow-nic", "path-slow", "switch-congestion"]
SKEW_NS = 20_000_000
"""How far ahead of the slowest (topic, node) stream a consumer may read another: a fetch
brings up to a few tens of ms of a partition at a time."""
FIXTURES = Path(__file__).parent / "traces"


def incidents(verdicts: list[Verdict]) -> dict[tuple[str, str, tuple[str, ...]], tuple[object, int]]:
    """(kind, level, nodes) -> (communicator, seq) of the first operator that showed it."""
    out: dict[tuple[str, str, tuple[str, ...]], tuple[object, int]] = {}
    for v in verdicts:
        if v.status == "anomaly":
            out.setdefault((str(v.kind), str(v.level), tuple(v.nodes)),
                           (v.window.get("comm_id"), int(v.window.get("first_seq") or 0)))
    return out


def kafka_order(trace: Path, rng: random.Random) -> list[Message]:
    """The trace as a consumer of the samples and hook-events topics may receive it."""
    reader = TraceReader(trace)
    setup, timed = reader.timeline()
    streams: dict[tuple[str, str], list[tuple[int, Message]]] = {}

    def put(t: int, item: EpochBatch | _events.HookEvent) -> None:
        if isinstance(item, EpochBatch):
            msg = Message(T.samples, item.node.encode(), _samples.encode(item))
            key = (T.samples, item.node)
        else:
            msg = Message(T.hook_events, item.node.encode(), _events.encode(item))
            key = (T.hook_events, item.node)
        streams.setdefault(key, []).append((t, msg))

    for ev in setup:  # published first: they come first on each node's partition
        put(-(1 << 62), ev)
    for t, item in timed:
        put(t, item)
    heads = {k: 0 for k in streams}
    out: list[Message] = []
    while heads:
        lo = min(streams[k][i][0] for k, i in heads.items())
        ready = [k for k, i in heads.items() if streams[k][i][0] <= max(lo, 0) + SKEW_NS]
        k = rng.choice(sorted(ready))
        run = rng.randint(1, 16)  # a fetch returns several records of one partition
        i = heads[k]
        for _t, msg in streams[k][i:i + run]:
            out.append(msg)
        heads[k] = i + run
        if heads[k] >= len(streams[k]):
            del heads[k]
    return out


def through_agents(msgs: list[Message], rng: random.Random) -> list[Verdict]:
    seg, loc = SegmentState(T), LocalizeState()
    verdicts: list[Verdict] = []

    def localize(records: list[tuple[bytes, bytes]]) -> None:
        verdicts.extend(loc.handle([Message(T.op_metrics, k, v) for k, v in records], now=0.0).verdicts)

    i = 0
    while i < len(msgs):
        n = rng.randint(1, 1024)  # take_events(chunk=1024, within=50 ms): any size up to it
        out = seg.handle(msgs[i:i + n])
        assert not out.dead
        localize(out.op_metrics)
        i += n
    localize(seg.finish().op_metrics)
    verdicts += loc.finish().verdicts
    return verdicts


@pytest.fixture(scope="module")
def battery(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    root = tmp_path_factory.mktemp("battery")
    out = {}
    for name in SCENARIOS:
        simulate(SimConfig(scenario=name, seed=3, job=f"job-{name}", **SIZE), root / name)
        out[name] = root / name
    for lab in sorted(FIXTURES.glob("lab-*")):
        out[lab.name] = lab
    return out


def test_the_fixtures_hold_two_lab_traces() -> None:
    assert len(sorted(FIXTURES.glob("lab-*/meta.json"))) >= 2


@pytest.mark.parametrize("name", [*SCENARIOS, "lab-rate", "lab-loss"])
def test_the_agents_conclude_what_diagnose_concludes(battery: dict[str, Path], name: str) -> None:
    trace = battery[name]
    want = incidents(diagnose(trace).verdicts)
    if name != "healthy":
        assert want, f"{name}: diagnose raised nothing, so the comparison would be empty"
    else:
        assert not want
    for seed in (1, 2):
        rng = random.Random(seed)
        got = incidents(through_agents(kafka_order(trace, rng), rng))
        assert got == want, f"{name} (order seed {seed}): agents {got} vs diagnose {want}"
