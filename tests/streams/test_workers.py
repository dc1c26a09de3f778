"""Several workers in one consumer group on the real embedded broker: they split the
partitions (samples and hook events keyed by node, op-metrics by job) and conclude what
one worker concludes; when one is killed, the survivor takes over its partitions (their
state rebuilt from the committed messages) and still names the culprit.

Every wait is on observable state (pipeline records, committed offsets, the verdict and
incident topics) with a bounded timeout; nothing is timed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from pulse.streams.readback import committed_offsets, read_back
from pulse.streams.takeover import partition_of
from streamkit import Worker, publish, read_topic, replay_list, unique_settings, verdicts_on_topic

from pulse.kafka_security import kafka_client_kwargs
from pulse.samples import EpochBatch
from pulse.settings import Settings
from pulse.trace import read_truth

pytestmark = pytest.mark.slow

PARTITIONS = 4
WAIT_S = 240.0  # bound of every wait (a loaded 2-core runner; typically far less)


def _members(s: Settings) -> dict[str, dict[str, Any]]:
    """The latest pipeline record of each worker of the group (by its name)."""
    recs = [orjson.loads(v) for _, v in asyncio.run(read_topic(s.broker or "", s.topics.pipeline,
                                                                client=kafka_client_kwargs(s)))]
    out: dict[str, dict[str, Any]] = {}
    for r in recs:
        if r.get("worker") == s.worker_id:
            out[r["member"]] = r
    return out


def _wait(what: str, check: Any, workers: list[Worker], timeout_s: float = WAIT_S) -> Any:
    """Poll ``check()`` (a value, or None while not there) until it gives a value."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        for w in workers:
            if w.proc is not None and w.proc.poll() is not None and not getattr(w, "killed", False):
                raise AssertionError(f"worker died while waiting for {what}:\n{w.log_tail()}")
        got, last = check()
        if got is not None:
            return got
        time.sleep(0.3)  # a polling interval, not a synchronization: the state decides
    raise AssertionError(f"timed out waiting for {what}; last seen: {last}\n"
                         + "\n".join(w.log_tail()[-1500:] for w in workers))


@contextlib.contextmanager
def group(s: Settings, tmp: Path, n: int) -> Iterator[list[Worker]]:
    """``n`` workers of one consumer group (``s.worker_id``), started one after the other,
    returned once their input partitions are split between them (disjoint, all covered)."""
    from pulse.producers.publisher import ensure_topics

    asyncio.run(ensure_topics(s.broker or "", s))
    tmp.mkdir(parents=True, exist_ok=True)
    workers: list[Worker] = []
    try:
        for i in range(n):
            si = dataclasses.replace(s, worker_name=f"{s.worker_id}-{i}", data_dir=tmp / f"data-{i}")
            workers.append(Worker(si, tmp / f"{si.worker_name}.log", {}).start())
        names = {w.settings.worker_name for w in workers}

        def split() -> tuple[Any, Any]:
            m = {k: v for k, v in _members(s).items() if k in names}
            parts = [p for r in m.values() for p in r.get("partitions", [])]
            ok = len(m) == n and all(r.get("partitions") for r in m.values()) and sorted(parts) == list(
                range(PARTITIONS))
            return (m if ok else None), {k: r.get("partitions") for k, r in m.items()}

        _wait("the workers to split the partitions", split, workers)
        yield workers
    finally:
        for w in workers:
            w.stop()


def _caught_up(s: Settings, batches: int, names: set[str], *, balance: bool = True, records: int = 2) -> Any:
    """A check: every batch segmented (summed over the workers), nothing held or queued for
    localization, and (``balance``) every operator record emitted taken by a localize
    state, on ``records`` consecutive pipeline records of each worker."""
    streak: dict[str, tuple[int, Any]] = {}

    def check() -> tuple[Any, Any]:
        m = {k: v for k, v in _members(s).items() if k in names}
        total = sum(int(r.get("batches", 0)) for r in m.values())
        emitted = sum(int(r.get("op_metrics", 0)) for r in m.values())
        taken = sum(int(r.get("localized", 0)) for r in m.values())
        idle = all(not r.get("held_op_metrics") and not r.get("localize_queued") for r in m.values())
        done = (len(m) == len(names) and total >= batches and emitted > 0 and idle
                and (emitted == taken or not balance))
        for k, r in m.items():
            n, at = streak.get(k, (0, None))
            if r.get("at_ns") != at:  # a new record
                streak[k] = (n + 1 if done else 0, r.get("at_ns"))
        ready = done and all(streak.get(k, (0, None))[0] >= records for k in m)
        return (m if ready else None), {"batches": (total, batches), "emitted/taken": (emitted, taken),
                                        "idle": idle}

    return check


def _incidents(s: Settings) -> list[dict[str, Any]]:
    return [orjson.loads(v) for _, v in asyncio.run(read_topic(s.broker or "", s.topics.incidents,
                                                                client=kafka_client_kwargs(s)))]


def _opened(incs: list[dict[str, Any]]) -> set[tuple[str, str, tuple[str, ...]]]:
    return {(i["kind"], i["level"], tuple(sorted(i["nodes"]))) for i in incs if i.get("state") == "open"}


def _run(broker: str, trace: Path, tmp: Path, n: int) -> tuple[set[Any], dict[str, dict[str, Any]]]:
    s = unique_settings(broker, tmp, partitions=PARTITIONS)
    with group(s, tmp, n) as workers:
        counts = publish(s, trace)
        names = {w.settings.worker_name or "" for w in workers}
        m = _wait(f"{n} worker(s) to take the whole job", _caught_up(s, counts["batches"], names), workers)
    return _opened(_incidents(s)), m


def test_two_workers_split_the_job_and_open_the_incidents_one_worker_opens(broker, sim_trace, tmp_path):
    trace = sim_trace("nic-slow")
    culprit = set(read_truth(trace)["culprit"]["nodes"])
    one, _ = _run(broker, trace, tmp_path / "one", 1)
    two, members = _run(broker, trace, tmp_path / "two", 2)
    assert any(culprit & set(nodes) for _, _, nodes in one), one  # the job is diagnosed at all
    assert two == one
    # a real split: both workers segmented some of the nodes, and together all of them
    assert all(r["batches"] > 0 and r["op_metrics"] > 0 for r in members.values()), members
    assert sorted(p for r in members.values() for p in r["partitions"]) == list(range(PARTITIONS))


def test_a_killed_worker_s_partitions_are_taken_over_and_the_culprit_still_named(broker, sim_trace, tmp_path):
    trace = sim_trace("nic-slow")
    truth = read_truth(trace)
    culprit = set(truth["culprit"]["nodes"])
    s = unique_settings(broker, tmp_path, partitions=PARTITIONS)
    items = replay_list(trace)
    batches = [i for i, it in enumerate(items) if isinstance(it, EpochBatch)]
    cut = batches[len(batches) // 3]
    with group(s, tmp_path, 2) as workers:
        names = {w.settings.worker_name or "" for w in workers}
        c1 = publish(s, trace, items[:cut], speed=0)
        _wait("both workers to take the first part", _caught_up(s, c1["batches"], names), workers)
        _wait("the group to commit what it took", _all_committed(s), workers)
        # Kill the worker that segments the culprit's node: its segmenter must be rebuilt.
        hot = partition_of(sorted(culprit)[0].encode(), PARTITIONS)
        members = _members(s)
        victim = next(w for w in workers if hot in members[w.settings.worker_name or ""]["partitions"])
        survivor = next(w for w in workers if w is not victim)
        sname = survivor.settings.worker_name or ""
        before_v, before_i = len(verdicts_on_topic(s)), len(_incidents(s))
        victim.kill()  # SIGKILL: no clean shutdown, no final commit
        victim.killed = True  # type: ignore[attr-defined]

        def all_mine() -> tuple[Any, Any]:
            r = _members(s).get(sname, {})
            ok = r.get("partitions") == list(range(PARTITIONS)) and r.get("op_partitions") == list(range(PARTITIONS))
            return (r if ok else None), r.get("partitions")

        _wait("the survivor to be assigned every partition", all_mine, [survivor])
        c2 = publish(s, trace, items[cut:])

        def named() -> tuple[Any, Any]:
            after = verdicts_on_topic(s)[before_v:]
            hits = [v for v in after if v["status"] == "anomaly" and culprit & set(v["nodes"])]
            r = _members(s).get(sname, {})
            return (hits if hits and r.get("taken_over", 0) > 0 else None), (
                [(v["status"], v.get("kind"), v["nodes"]) for v in after][-5:], r.get("taken_over"))

        hits = _wait("a verdict naming the culprit from the survivor", named, [survivor])
        rec = _wait("the survivor to take the rest", _caught_up(s, c2["batches"], {sname}, balance=False), [survivor])[sname]
    assert {v["kind"] for v in hits} == {truth["kind"]}, hits
    assert rec["batches"] >= c2["batches"] and rec["dead_letters"] == 0, rec
    assert rec["taken_over"] >= 1, rec  # the victim's input partitions were rebuilt here
    incs = _incidents(s)
    assert any(culprit & set(i["nodes"]) for i in incs if i.get("state") == "open"), incs
    assert not [i for i in incs[before_i:] if i.get("state") == "open" and not culprit & set(i["nodes"])], incs


def _all_committed(s: Settings) -> Any:
    """A check: the group committed every message of its input topics."""
    bs, client = s.broker or "", kafka_client_kwargs(s)
    topics = [s.topics.samples, s.topics.hook_events]

    def check() -> tuple[Any, Any]:
        ends: dict[tuple[str, int], int] = {}
        for t in topics:
            for m in asyncio.run(read_back(bs, t, client=client, idle_s=0.2)):
                ends[(t, m.partition or 0)] = max(ends.get((t, m.partition or 0), 0), (m.offset or 0) + 1)
        got = asyncio.run(committed_offsets(bs, s.worker_id, topics, client=client))
        behind = {k: (got.get(k, 0), e) for k, e in ends.items() if got.get(k, 0) < e}
        return (True if ends and not behind else None), behind

    return check
