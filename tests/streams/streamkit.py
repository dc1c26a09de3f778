"""Helpers for the pipeline tests: small simulated traces, a real worker process, consumers."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pulse.kafka_security import kafka_client_kwargs
from pulse.settings import Settings

SIM_SIZE = {"nodes": 4, "gpus_per_node": 2, "nics_per_node": 2, "steps": 8}
SEEDS = {"nic-slow": 2, "gpu-slow": 2, "healthy": 2, "gpu-hang": 3}


@pytest.fixture(scope="session")
def sim_trace(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """``sim_trace(scenario) -> Path``: a small simulated trace, made once per session."""
    from pulse.sim.config import SimConfig
    from pulse.sim.run import simulate

    made: dict[str, Path] = {}

    def make(scenario: str) -> Path:
        if scenario not in made:
            out = tmp_path_factory.mktemp("sim") / scenario
            simulate(SimConfig(scenario=scenario, seed=SEEDS.get(scenario, 1), job=f"job-{scenario}", **SIM_SIZE), out)
            made[scenario] = out
        return made[scenario]

    return make


def unique_settings(broker: str, tmp: Path, **changes: Any) -> Settings:
    prefix = "t" + uuid.uuid4().hex[:10]
    base = Settings(broker=broker, topic_prefix=prefix, partitions=4, spool_dir=tmp / "spool",
                    worker_id=f"w-{prefix}", data_dir=tmp / "data")
    return dataclasses.replace(base, **changes) if changes else base


@dataclasses.dataclass
class Worker:
    settings: Settings
    log: Path
    env: dict[str, str]
    proc: Any = None

    def start(self) -> Worker:
        import os

        from pulse.streams.demo import start_worker, wait_worker_ready

        env = dict(os.environ)
        env.update(self.env)
        self.proc = start_worker(self.settings, self.settings.broker or "", self.log, env=env)
        asyncio.run(wait_worker_ready(self.settings.broker or "", self.settings.topics.pipeline, proc=self.proc,
                                      log_path=self.log, worker=self.settings.worker_id,
                                      client=kafka_client_kwargs(self.settings)))
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        from pulse.streams.demo import stop_process

        if self.proc is not None:
            stop_process(self.proc, timeout_s=15)

    def log_tail(self) -> str:
        return self.log.read_bytes()[-3000:].decode(errors="replace") if self.log.exists() else ""


@contextlib.contextmanager
def running_worker(settings: Settings, tmp: Path, env: dict[str, str] | None = None) -> Iterator[Worker]:
    from pulse.producers.publisher import ensure_topics

    asyncio.run(ensure_topics(settings.broker or "", settings))
    w = Worker(settings, tmp / f"worker-{time.monotonic_ns()}.log", env or {}).start()
    try:
        yield w
    finally:
        w.stop()


async def read_topic(bootstrap: str, topic: str, *, timeout_s: float = 5.0,
                     client: dict[str, Any] | None = None) -> list[tuple[bytes | None, bytes]]:
    """Every message of ``topic`` as (key, value), read by a plain aiokafka consumer without a
    group (``pulse.streams.app.read_back``: it also copes with Tansu's short end offsets)."""
    from pulse.streams.readback import read_back

    return [(m.key, m.value) for m in await read_back(bootstrap, topic, timeout_s=timeout_s, client=client)]


def latest_pipeline(bootstrap: str, settings: Settings) -> dict[str, Any]:
    recs = [orjson.loads(v) for _, v in asyncio.run(read_topic(bootstrap, settings.topics.pipeline,
                                                                 client=kafka_client_kwargs(settings)))]
    recs = [r for r in recs if r.get("worker") == settings.worker_id]
    return recs[-1] if recs else {}


def wait_caught_up(settings: Settings, batches: int, *, timeout_s: float = 180.0, quiet_s: float = 3.0,
                   worker: Worker | None = None) -> dict[str, Any]:
    """Wait until the worker processed ``batches`` batches and emitted nothing new for ``quiet_s``."""
    bs = settings.broker or ""
    deadline = time.monotonic() + timeout_s
    last: tuple[int, int] | None = None
    since = time.monotonic()
    rec: dict[str, Any] = {}
    while time.monotonic() < deadline:
        if worker is not None and worker.proc.poll() is not None:
            raise AssertionError(f"worker died:\n{worker.log_tail()}")
        rec = latest_pipeline(bs, settings)
        state = (int(rec.get("batches", 0)), int(rec.get("verdicts", 0)) + int(rec.get("op_metrics", 0)))
        if state != last:
            last, since = state, time.monotonic()
        if state[0] >= batches and time.monotonic() - since >= quiet_s:
            return rec
        time.sleep(0.5)
    raise AssertionError(f"worker did not catch up within {timeout_s} s: last pipeline record {rec}"
                         + (f"\n{worker.log_tail()}" if worker else ""))


def verdicts_on_topic(settings: Settings) -> list[dict[str, Any]]:
    return [orjson.loads(v) for _, v in asyncio.run(read_topic(settings.broker or "", settings.topics.verdicts,
                                                                client=kafka_client_kwargs(settings)))]


def publish(settings: Settings, trace: Path, items: list[Any] | None = None, speed: float = 1.0) -> dict[str, int]:
    """Publish a whole trace (or the given items, in order) paced like a live job
    (``speed`` trace seconds per wall second, 0 = as fast as possible); returns counts."""
    from pulse.producers.publisher import Publisher
    from pulse.producers.replay import publish_trace
    from pulse.streams.demo import COALESCE_MS

    from pulse.samples import EpochBatch

    async def go() -> dict[str, int]:
        async with Publisher(settings, coalesce_ms=COALESCE_MS) as pub:
            if items is None:
                counts = await publish_trace(pub, trace, speed=speed)
            else:
                counts = {"batches": 0, "events": 0, "rows": 0}
                t0_wall, t0_trace = time.time(), None
                for it in items:
                    t = it.end_ns() if isinstance(it, EpochBatch) else getattr(it, "t_host_ns", None)
                    if speed > 0 and t is not None:  # paced like a live job
                        t0_trace = t if t0_trace is None else t0_trace
                        delay = t0_wall + (t - t0_trace) / 1e9 / speed - time.time()
                        if delay > 0.001:
                            await asyncio.sleep(delay)
                    if isinstance(it, EpochBatch):
                        await pub.publish_batch(it)
                        counts["batches"] += 1
                    else:
                        await pub.publish_event(it)
                        counts["events"] += 1
            await pub.flush()
            assert pub.stats["dropped"] == 0
            # What the worker counts: messages (a NIC's consecutive batches are merged into one).
            counts["source_batches"] = counts["batches"]
            counts["batches"] = pub.stats.get("batches_out", counts["batches"])
        return counts

    return asyncio.run(go())


def replay_list(trace: Path) -> list[Any]:
    from pulse.producers.replay import replay_items

    async def go() -> list[Any]:
        return [it async for it in replay_items(trace)]

    return asyncio.run(go())
