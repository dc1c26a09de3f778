"""The agents' state reads the packed forms like the single ones: a packed hook-events
message segments exactly as its events sent one by one, a malformed pack is one dead letter
while the rest goes on, and the localize state (in process or in its child process) takes
packed op-metrics like single records."""

from __future__ import annotations

import asyncio

import orjson
from pulse.streams.offload import LocalizeProcess
from pulse.streams.state import LocalizeState, Message, SegmentState

from pulse import events as _events
from pulse import samples as _samples
from pulse.records import Incident, decode_data_end, decode_op_metrics_many, kind_family
from pulse.samples import EpochBatch
from pulse.settings import Topics

T = Topics.with_prefix("pk")


def _items(trace):
    from pulse.producers.replay import replay_items

    async def go():
        return [it async for it in replay_items(trace)]

    return asyncio.run(go())


def _messages(items, packed: bool) -> list[Message]:
    """Hook events one per message, or packed per node between batches (order kept)."""
    out: list[Message] = []
    pending: dict[str, list] = {}

    def flush():
        for node, evs in pending.items():
            out.append(Message(T.hook_events, node.encode(), _events.encode_packed(evs), 0, len(out)))
        pending.clear()

    for it in items:
        if isinstance(it, EpochBatch):
            flush()
            out.append(Message(T.samples, it.node.encode(), _samples.encode(it), 0, len(out)))
        elif packed:
            pending.setdefault(it.node, []).append(it)
        else:
            out.append(Message(T.hook_events, it.node.encode(), _events.encode(it), 0, len(out)))
    flush()
    return out


def _run(msgs: list[Message]):
    seg = SegmentState(T)
    recs, forwarded, dead, ends = [], [], [], []
    for i in range(0, len(msgs), 64):
        out = seg.handle(msgs[i:i + 64])
        dead += out.dead
        for _key, value in out.op_metrics:
            kind = orjson.loads(value)["type"]
            if kind in ("op-metrics", "op-metrics-batch"):
                recs += decode_op_metrics_many(value)
            elif kind == "data-end":
                ends.append(decode_data_end(value))
            else:
                forwarded += _events.decode_many(value)
    assert ends  # how far each node's data reaches goes to the localizer too
    return recs, forwarded, dead, seg


def test_packed_hook_events_segment_like_single_ones(sim_trace):
    items = _items(sim_trace("nic-slow"))
    single, packed = _messages(items, False), _messages(items, True)
    assert len(packed) < len(single)
    a, fa, da, sa = _run(single)
    b, fb, db, sb = _run(packed)
    assert a and sorted(map(repr, a)) == sorted(map(repr, b)) and not da and not db
    # comm and flow events are forwarded as they came; receives only as each chunk's latest
    # per communicator and node (what the localizer keeps), so compare that state
    def split(fwd):
        recvs = [e for e in fwd if isinstance(e, _events.OpEvent)]
        latest = {}
        for e in recvs:
            assert e.kind == "Recv"
            key = (e.comm_id, e.node)
            latest[key] = max(latest.get(key, -1), e.seq)
        return sorted(repr(e) for e in fwd if not isinstance(e, _events.OpEvent)), latest
    assert split(fa) == split(fb) and split(fa)[1]
    assert sa.stats["events"] == sb.stats["events"] == sum(not isinstance(i, EpochBatch) for i in items)


def test_a_malformed_pack_is_one_dead_letter_and_the_rest_goes_on(sim_trace):
    items = _items(sim_trace("nic-slow"))
    msgs = _messages(items, True)
    i = next(k for k, m in enumerate(msgs) if m.topic == T.hook_events and b'"type":"batch"' in (m.value or b""))
    bad = orjson.loads(msgs[i].value)
    bad["events"][-1]["seq"] = "seven"
    msgs.insert(i + 1, Message(T.hook_events, msgs[i].key, orjson.dumps(bad), 0, 10_000))
    recs, _fwd, dead, _seg = _run(msgs)
    assert [(d.offset, d.stage) for d in dead] == [(10_000, "segment")]
    assert "events[" in dead[0].error and "seq" in dead[0].error
    # nothing of the bad pack was applied
    assert sorted(map(repr, recs)) == sorted(map(repr, _run(_messages(items, True))[0]))


def _localize(state, groups):
    vs = []
    for msgs in groups:
        vs += state.handle(msgs, now=0.0).verdicts
    vs += state.finish().verdicts
    return [(v.status, v.kind, v.nodes, v.first_seen_ns) for v in vs]


def test_localize_state_takes_packed_and_single_records_alike(sim_trace):
    items = _items(sim_trace("nic-slow"))
    seg = SegmentState(T)
    # The same records in the same calls: one packed message, or its records one by one.
    packed: list[list[Message]] = []
    single: list[list[Message]] = []
    for i in range(0, len(msgs := _messages(items, True)), 64):
        out = seg.handle(msgs[i:i + 64]).op_metrics
        packed.append([Message(T.op_metrics, key, value, 0, 0) for key, value in out])
        single.append([])
        for key, value in out:
            data = orjson.loads(value)
            parts = data.get("records") or data.get("events") or [data]
            single[-1] += [Message(T.op_metrics, key, orjson.dumps(p), 0, 0) for p in parts]
    assert sum(map(len, packed)) < sum(map(len, single))
    want = _localize(LocalizeState(), single)
    assert any(s == "anomaly" for s, *_ in want)
    assert _localize(LocalizeState(), packed) == want
    child = LocalizeProcess()
    try:
        assert _localize(child, packed) == want
        assert child.held == 0 and child.active
        bad = child.handle([Message(T.op_metrics, b"j", b'{"type": "op-metrics-batch", "v": 1, "records": []}', 0, 1)])
        assert len(bad.dead) == 1 and "non-empty" in bad.dead[0].error
    finally:
        child.close()


def test_a_time_budget_hands_out_the_same_verdicts_in_steps(sim_trace, monkeypatch):
    """With a budget the localize state judges part of what its aligners released per call
    and keeps the rest, in order, for the next calls: the same diagnosis, as it goes."""
    items = _items(sim_trace("nic-slow"))
    seg = SegmentState(T)
    groups: list[list[Message]] = []
    for i in range(0, len(msgs := _messages(items, True)), 64):
        groups.append([Message(T.op_metrics, k, v, 0, 0) for k, v in seg.handle(msgs[i:i + 64]).op_metrics])
    want = _localize(LocalizeState(), groups)
    monkeypatch.setattr("pulse.engine.localize_stage.JUDGE_STEP", 4)  # small steps at this small size
    stepped = LocalizeState(budget_s=0.0)  # one step (>= JUDGE_STEP records) per call
    got, calls = [], 0
    for msgs in groups:
        got += stepped.handle(msgs, now=0.0).verdicts
        while stepped.backlog:
            got += stepped.tick(0.0).verdicts
            calls += 1
    got += stepped.finish().verdicts
    assert calls > 0 and stepped.backlog == 0
    got_t = [(v.status, v.kind, v.nodes, v.first_seen_ns) for v in got]
    # The diagnosis is the same; only a periodic "healthy" verdict's first_seen_ns follows
    # the localizer's call boundaries.
    assert len(got_t) == len(want)
    assert [x for x in got_t if x[0] != "healthy"] == [x for x in want if x[0] != "healthy"]
    assert any(x[0] == "anomaly" for x in want)


def test_a_hung_gpu_is_a_compute_stop_in_the_agents_as_in_diagnose(sim_trace):
    """Seed 3 at the test size: the hung rank's pipeline partner's send stalls on a receive
    that was never posted, which only the forwarded receives tell the localizer (without
    them the agents said network-stop)."""
    from pulse.engine import diagnose

    from pulse.trace import read_truth

    trace = sim_trace("gpu-hang")
    seg, loc, vs = SegmentState(T), LocalizeState(), []
    msgs = _messages(_items(trace), True)
    for i in range(0, len(msgs), 64):
        out = seg.handle(msgs[i:i + 64]).op_metrics
        vs += loc.handle([Message(T.op_metrics, k, v, 0, 0) for k, v in out], now=0.0).verdicts
    # the trace ends 0.55 s after the hang, inside the segmenter's 1 s stall: end of input
    out = seg.finish().op_metrics
    vs += loc.handle([Message(T.op_metrics, k, v, 0, 0) for k, v in out], now=0.0).verdicts
    vs += loc.finish().verdicts
    culprit = tuple(read_truth(trace)["culprit"]["nodes"])
    stream = {(v.kind, tuple(v.nodes)) for v in vs if v.status == "anomaly"}
    batch = {(v.kind, tuple(v.nodes)) for v in diagnose(trace).verdicts if v.status == "anomaly"}
    assert stream == batch == {("compute-stop", culprit)}


def _op_metric_groups(trace) -> list[list[Message]]:
    """The trace's op-metrics messages as the segment state sends them, 64 inputs a call."""
    seg = SegmentState(T)
    msgs = _messages(_items(trace), True)
    return [[Message(T.op_metrics, key, value, 0, 0) for key, value in seg.handle(msgs[i:i + 64]).op_metrics]
            for i in range(0, len(msgs), 64)]


def _until_opened(state, groups) -> tuple[int, Incident]:
    """Feed ``groups`` until an incident opens: how many were fed, and the incident."""
    for n, g in enumerate(groups, 1):
        opened = next((i for i in state.handle(g, now=0.0).incidents if i.state == "open"), None)
        if opened is not None:
            return n, opened
    raise AssertionError("no incident opened")


def _same_fault(later: list[Incident], inc: Incident) -> list[Incident]:
    return [i for i in later if kind_family(i.kind) == kind_family(inc.kind) and set(i.nodes) & set(inc.nodes)]


def test_a_survivor_goes_on_with_the_incidents_the_worker_before_it_opened(sim_trace):
    """A takeover rebuilds a job from its committed records; the incident the killed worker
    had opened (here under another first operator, as when its aligner released late ranks
    on idleness) goes on with its id, in process and in the child process alike."""
    import dataclasses

    groups = _op_metric_groups(sim_trace("nic-slow"))
    cut, opened = _until_opened(LocalizeState(), groups)
    cut += 4  # how far the committed records reach: past the incident's opening
    live = dataclasses.replace(opened, id="inc-live", first_op={**opened.first_op, "seq": opened.first_op["seq"] - 3})
    for state in (LocalizeState(), LocalizeProcess()):
        try:
            state.adopt({0}, 1, [m for g in groups[:cut] for m in g], [live])
            later = []
            for g in groups[cut:]:
                later += state.handle(g, now=0.0).incidents
            later += state.finish().incidents
            same = _same_fault(later, live)
            assert same and {i.id for i in same} == {"inc-live"}, same
            assert "open" not in {i.state for i in same}
        finally:
            if isinstance(state, LocalizeProcess):
                state.close()


def test_a_partition_got_back_after_its_offsets_were_lost_keeps_its_incident_ids(sim_trace):
    """A memory broker's restart loses the topics and the group's offsets: a worker that
    gets its partition back rebuilds the job from nothing, and what it announced before
    it knows itself."""
    groups = _op_metric_groups(sim_trace("nic-slow"))
    state = LocalizeState()
    cut, opened = _until_opened(state, groups)
    state.adopt({0}, 1, [])  # nothing committed any more
    later = []
    for g in groups[cut:]:
        later += state.handle(g, now=0.0).incidents
    later += state.finish().incidents
    same = _same_fault(later, opened)
    assert same and {i.id for i in same} == {opened.id}, same
