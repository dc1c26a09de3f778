"""`pulse agent` end to end, as root: one agent per lab node (its namespace's eth0, the torch
injection's files being written), the embedded broker, a real worker; the worker's verdict
must be the one `pulse lab run`'s analysis gives for the same run (same traffic, captured
by the lab's own tcpdump on the bridge).

One fault (a 200 Mbit/s limit on rank 2), one run: the job, the agents and the worker
share the machine's cores, so this is run sparingly."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest

from pulse.settings import Settings

pytestmark = [pytest.mark.root, pytest.mark.slow]
pytest.importorskip("torch")
if os.geteuid() != 0:
    pytest.skip("the lab needs root", allow_module_level=True)

PULSE = str(Path(sys.executable).with_name("pulse"))
FAULT, RANKS, STEPS, FAULT_AFTER = "rate:2:200mbit", 4, 70, 40
EDGE = {"node-01", "node-03"}
"""Agents that segment their own node's traffic (`--edge`) and publish operator metrics only:
a mixed deployment, whose verdict must be the same as central segmentation's."""
WORKER = ("from pulse.lab.analysis import lab_params\nfrom pulse.settings import Settings\n"
          "from pulse.streams.app import run_worker\n"
          "run_worker(Settings.from_env(), loglevel='info', localize_params=lab_params())\n")


def _env(s: Settings, **more: str) -> dict[str, str]:
    return dict(os.environ, PULSE_BROKER=s.broker or "", PULSE_TOPIC_PREFIX=s.topic_prefix,
                PULSE_PARTITIONS=str(s.partitions), PULSE_WORKER_ID=s.worker_id, **more)


def _pipeline(s: Settings) -> list[dict]:
    from pulse.streams.readback import read_back

    return [orjson.loads(m.value) for m in asyncio.run(read_back(s.broker or "", s.topics.pipeline, timeout_s=10))]


def _stop(p: subprocess.Popen[bytes], timeout: float = 60) -> int:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        return p.wait()


def _samples_on_the_wire(s: Settings) -> list:
    from pulse.streams.readback import read_back

    from pulse.samples import decode

    return [decode(m.value) for m in asyncio.run(read_back(s.broker or "", s.topics.samples, timeout_s=10))]


def _save_stream(s: Settings, out: Path) -> Path:
    """What the agents published, as a trace directory (`pulse diagnose` it when this fails)."""
    from pulse.lab.analysis import LAB_EPOCH_NS
    from pulse.streams.readback import read_back

    from pulse.events import decode_many
    from pulse.samples import decode
    from pulse.trace import TraceWriter

    hooks = asyncio.run(read_back(s.broker or "", s.topics.hook_events, timeout_s=10))
    samples = asyncio.run(read_back(s.broker or "", s.topics.samples, timeout_s=10))
    with TraceWriter(out, job="lab", epoch_ns=LAB_EPOCH_NS, meta={"source": "pulse agent"}) as tw:
        for m in hooks:
            tw.write_events(decode_many(m.value))
        for m in samples:
            tw.write_batch(decode(m.value))
    # and as they arrived (broker timestamps), to replay the stream's own timing; the
    # operator metrics too (the edge agents' and the worker's segmentation: the localizer's
    # whole input, to replay through `LocalizeState.handle` when the verdicts differ)
    ops = asyncio.run(read_back(s.broker or "", s.topics.op_metrics, timeout_s=10))
    names = {s.topics.hook_events: "hooks", s.topics.samples: "samples", s.topics.op_metrics: "op-metrics"}
    with open(out / "messages.jsonl", "wb") as fh:
        for topic, msgs in ((s.topics.hook_events, hooks), (s.topics.samples, samples), (s.topics.op_metrics, ops)):
            for m in msgs:
                fh.write(orjson.dumps({"topic": names[topic],
                                       "ts": m.timestamp, "partition": m.partition, "offset": m.offset,
                                       "value": m.value.hex()}) + b"\n")
    return out


def test_agents_give_the_lab_verdict(broker: str, tmp_path: Path) -> None:
    from pulse.lab.analysis import LAB_EPOCH_NS, analyze_run, summarize_verdicts, truth_of
    from pulse.lab.faults import parse_fault
    from pulse.lab.runner import run_lab
    from pulse.producers.publisher import ensure_topics
    from pulse.streams.demo import wait_worker_ready
    from pulse.streams.readback import read_back

    from pulse.records import decode_verdict

    prefix = "t" + uuid.uuid4().hex[:10]
    s = Settings(broker=broker, topic_prefix=prefix, partitions=4, worker_id=f"w-{prefix}",
                 spool_dir=tmp_path / "spool", data_dir=tmp_path / "data")
    asyncio.run(ensure_topics(broker, s))
    wlog = open(tmp_path / "worker.log", "wb")
    worker = subprocess.Popen([sys.executable, "-c", WORKER], env=_env(s), stdout=wlog, stderr=subprocess.STDOUT,
                              start_new_session=True)
    agents: dict[str, subprocess.Popen[bytes]] = {}
    workdir = tmp_path / "lab"
    try:
        asyncio.run(wait_worker_ready(broker, s.topics.pipeline, proc=worker, log_path=tmp_path / "worker.log",
                                      worker=s.worker_id))

        def start_agents(net) -> None:  # type: ignore[no-untyped-def]
            for node in net.nodes:
                log = open(tmp_path / f"agent-{node.name}.log", "wb")
                agents[node.name] = subprocess.Popen(
                    [PULSE, "agent", "--node", node.name, "--job", "lab", "--netns", node.netns, "--iface", "eth0",
                     "--local", node.address, "--hook-dir", str(workdir / "hooks"), "--no-rdma",
                     "--epoch-us", str(LAB_EPOCH_NS // 1000), "--json", *(["--edge"] if node.name in EDGE else [])],
                    env=_env(s, PULSE_SPOOL_DIR=str(tmp_path / f"spool-{node.name}")), stdout=subprocess.PIPE,
                    stderr=log)
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline:  # every capture up before the job starts
                ups = {r["agent"] for r in _pipeline(s)
                       if r.get("type") == "agent" and r["sources"].get("capture", {}).get("state") == "up"}
                if ups >= set(agents):
                    return
                dead = [n for n, p in agents.items() if p.poll() is not None]
                assert not dead, f"agents exited: {dead}"
                time.sleep(1)
            raise AssertionError("the agents' captures did not come up")

        run = run_lab(ranks=RANKS, fault=parse_fault(FAULT, RANKS), steps=STEPS, fault_after=FAULT_AFTER,
                      workdir=workdir, log=lambda m: None, timeout_s=400, on_network=start_agents,
                      net_prefix="pagte2e")  # not `pulse lab`'s: a lab run elsewhere on the host is left alone
        finals = {}
        for name, p in agents.items():
            assert _stop(p) == 0, (tmp_path / f"agent-{name}.log").read_text()[-2000:]
            assert p.stdout is not None
            finals[name] = orjson.loads(p.stdout.read())
        # the worker has everything once its counters stop moving
        last, since, deadline = None, time.monotonic(), time.monotonic() + 240
        rec: dict = {}
        while time.monotonic() < deadline:
            recs = [r for r in _pipeline(s) if r.get("worker") == s.worker_id]
            rec = recs[-1] if recs else {}
            state = (rec.get("batches"), rec.get("op_metrics"), rec.get("verdicts"), rec.get("held_op_metrics"))
            if state != last:
                last, since = state, time.monotonic()
            elif time.monotonic() - since > 8 and rec.get("batches"):
                break
            time.sleep(1)
        verdicts = [decode_verdict(m.value) for m in asyncio.run(read_back(broker, s.topics.verdicts, timeout_s=10))]
        streamed_trace = _save_stream(s, tmp_path / "streamed")
    finally:
        for p in agents.values():
            _stop(p, 10)
        _stop(worker, 30)
    lab = analyze_run(run, tmp_path / "trace", epoch_ns=LAB_EPOCH_NS, warmup_steps=2)
    streamed = summarize_verdicts(verdicts)
    truth = truth_of(run.fault, run.ranks, run.onset_wall_ns)
    want = ("network", tuple(truth["culprit"]["nodes"]))
    report = (f"lab {lab['pulse']} ({lab['operators']} operators, capture {lab['capture']}, step ms "
              f"{lab['step_ms']}, first seq {lab['first_seq']}), agents {streamed}, worker {rec}, agents' final "
              f"{finals}; what the central agents published, as a trace directory: {streamed_trace}")

    def first(part: dict) -> tuple | None:
        a = min(part["anomalies"], key=lambda a: a["first_seen_ns"], default=None)
        return None if a is None else (a["family"], tuple(a["nodes"]))

    # The lab's own answer on this run: the culprit, network (a `path` verdict may follow
    # at the job's end, when the last operators drain through the shaped link; both
    # engines give it, and the comparison below is on the diagnosis, the first anomaly).
    assert first(lab["pulse"]) == want, report
    # The agents' kernel rings drop packets when the job, four captures, the worker and
    # the broker share too few cores (a 2-core runner: 150-4,700 per node seen). Those
    # drops are counted but not yet fed to the engine as gaps, so the stream then lacks
    # bytes Pulse takes as slowness: the comparison needs complete captures.
    drops = {name: f["drops"]["capture_kernel"] for name, f in finals.items()}
    assert all(isinstance(d, int) and d >= 0 for d in drops.values()), drops
    if any(drops.values()):
        pytest.skip(f"the agents' captures dropped packets on this machine ({drops}): "
                    "the verdict comparison needs complete captures")
    assert first(streamed) == want, report
    assert all(a["family"] == "network" for a in streamed["anomalies"]), report
    (tmp_path / "finals.json").write_bytes(orjson.dumps(finals))  # the agents' last health records
    for name, f in finals.items():
        assert set(f["sources_seen"]) >= {"capture", "hook-dir"}, (name, f)
        # Kernel ring drops depend on how busy the machine's CPUs are (a shared CI runner):
        # they must be counted and reported, not hidden; the diagnosis above is what must hold.
        assert isinstance(f["drops"]["capture_kernel"], int) and f["drops"]["capture_kernel"] >= 0, (name, f)
        assert f["published"].get("batches", 0) > 0, (name, f["published"])
        # Gloo opens a full mesh, but a ring AllReduce's data crosses only the send flow to
        # the successor and the receive flow from the predecessor: at least two flows must be
        # bound (the diagnosis above shows they were the right ones). The connections to the
        # other peers are bound too when their owner and peer are seen in time
        # (2 * (RANKS - 1) in all); on a loaded runner some are not yet at the end (seen: 4 of
        # 6), a known limit of the agent's TCP join.
        assert 2 <= f["join"]["bound_flows"] <= 2 * (RANKS - 1), (name, f["join"])
        assert f["publisher"]["dropped"] == 0 and f["publisher"]["spool_bytes"] == 0, (name, f["publisher"])
        if name in EDGE:  # operator metrics went out, and no sample or hook event
            assert f["published"]["op_metrics_messages"] > 0 and f["edge"]["refused_batches"] == 0, (name, f)
    central = {b.node for b in _samples_on_the_wire(s)}
    assert central == {f"node-{i:02d}" for i in range(RANKS)} - EDGE, central
    assert rec.get("dead_letters", 0) == 0
