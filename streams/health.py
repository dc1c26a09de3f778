"""The worker's health, as a container healthcheck can ask for it (``pulse worker --health``).

A running worker writes its pipeline record (the one it publishes to ``pulse.pipeline``
every half second) to a health file, plus its pid. The probe, a separate short process,
answers healthy only when all of these hold:

- the file is fresh (the worker's event loop is turning) and its process is alive;
- the worker joined its consumer group and holds partitions (``assigned`` > 0), and both
  agents rebuilt their state (``ready``);
- the broker answers a Metadata request from the probe itself (the worker's own view of a
  dead broker can lag: its consumer keeps its assignment until the session times out);
- the group's lag on the input topics (end offset minus committed offset, summed over the
  partitions of samples and hook-events) is at most ``max_lag`` messages.

Imports stay light (no Faust, no numba): a healthcheck runs every few seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import orjson

from pulse.broker import probe_metadata
from pulse.kafka_security import kafka_client_kwargs
from pulse.settings import Settings

DEFAULT_MAX_AGE_S = 30.0
DEFAULT_MAX_LAG = 100_000
BROKER_TIMEOUT_S = 3.0

log = logging.getLogger("pulse.streams.health")
_unwritable: set[Path] = set()


def health_path(settings: Settings) -> Path:
    """Where the worker of ``settings`` writes its health (one file per consumer group and
    data directory: workers of one group on one host need their own PULSE_DATA_DIR)."""
    return settings.data_dir / f"worker-{settings.worker_name or settings.worker_id}.health.json"


def write_health(path: Path, record: dict[str, Any]) -> bool:
    """Replace the health file atomically (a probe never reads half a record). A file that
    cannot be written is logged once and otherwise ignored: the worker's work goes on, and
    its probe answers unhealthy (no file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(orjson.dumps({**record, "pid": os.getpid()}))
        os.replace(tmp, path)
    except OSError as exc:
        if path not in _unwritable:
            _unwritable.add(path)
            log.warning("cannot write the health file %s (%s): `pulse worker --health` will say unhealthy",
                        path, exc)
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _broker_answers(bootstrap: str, timeout_s: float) -> str | None:
    """None when some bootstrap entry answers Metadata, else why not."""
    errors = []
    for entry in bootstrap.split(","):
        host, _, port = entry.strip().rpartition(":")
        try:
            probe_metadata(host or entry, int(port or 9092), timeout=timeout_s)
            return None
        except (OSError, ValueError) as exc:
            errors.append(f"{entry.strip()}: {exc or type(exc).__name__}")
    return "broker unreachable (" + "; ".join(errors) + ")"


async def group_lag(bootstrap: str, group: str, topics: list[str], *, timeout_s: float = 10.0,
                    client: dict[str, Any] | None = None) -> int:
    """Messages of ``topics`` the consumer group has not committed yet (end - committed, or
    end - beginning where it committed nothing), asked without joining the group."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                         request_timeout_ms=int(timeout_s * 1000), **(client or {}))
    await asyncio.wait_for(c.start(), timeout_s)
    try:
        tps = [TopicPartition(t, p) for t in topics for p in sorted(c.partitions_for_topic(t) or ())]
        if not tps:
            return 0
        ends = await c.end_offsets(tps)
        starts = await c.beginning_offsets(tps)
        lag = 0
        for tp in tps:
            committed = await c.committed(tp)
            lag += max(0, ends[tp] - (committed if committed is not None else starts[tp]))
        return lag
    finally:
        await c.stop()


def probe(settings: Settings, path: Path | None = None, *, max_age_s: float = DEFAULT_MAX_AGE_S,
          max_lag: int = DEFAULT_MAX_LAG, now_ns: int | None = None) -> dict[str, Any]:
    """The worker's health: ``{"healthy": bool, "problems": [...], ...}`` (module docstring)."""
    path = path or health_path(settings)
    problems: list[str] = []
    report: dict[str, Any] = {"worker": settings.worker_id, "health_file": str(path)}
    rec: dict[str, Any] = {}
    try:
        rec = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        problems.append(f"no health file {path} (the worker has not started, or writes elsewhere)")
    except (OSError, orjson.JSONDecodeError) as exc:
        problems.append(f"unreadable health file {path}: {exc}")
    if rec:
        now = time.time_ns() if now_ns is None else now_ns
        age_s = (now - int(rec.get("at_ns", 0))) / 1e9
        report.update(age_s=round(age_s, 1), assigned=rec.get("assigned"), ready=rec.get("ready"),
                      pid=rec.get("pid"))
        if isinstance(rec.get("pid"), int) and not _alive(rec["pid"]):
            problems.append(f"worker process {rec['pid']} is not running")
        elif age_s > max_age_s:
            problems.append(f"health file is {age_s:.0f} s old (the worker's loop is stuck or gone)")
        if not rec.get("assigned"):
            problems.append("no partitions assigned (not in its consumer group yet)")
        if not rec.get("ready", False):
            problems.append("agents still rebuilding their state")
    bootstrap = settings.bootstrap()
    # The bare Metadata probe speaks plaintext only; a TLS/SASL broker is asked by the
    # secured consumer below (it fails the same way when the broker is gone).
    plain = settings.kafka_security_protocol == "PLAINTEXT"
    unreachable = _broker_answers(bootstrap, BROKER_TIMEOUT_S) if plain else None
    if unreachable:
        problems.append(unreachable)
    else:
        t = settings.topics
        try:
            lag = asyncio.run(group_lag(bootstrap, settings.worker_id, [t.samples, t.hook_events],
                                        client=kafka_client_kwargs(settings)))
        except Exception as exc:  # the broker answered Metadata but not the offset requests
            problems.append(f"cannot read the group's offsets: {exc or type(exc).__name__}")
        else:
            report["lag"] = lag
            if lag > max_lag:
                problems.append(f"lag {lag} messages > {max_lag}")
    report.update(broker=bootstrap, healthy=not problems, problems=problems)
    return report
