"""The soak's accounting: every topic read back from the (persistent) broker at the end and
set against what the producer sent, what the workers say they processed, and the jobs'
ground truth (docs/reliability.md says what each figure means)."""

from __future__ import annotations

import collections
import contextlib
import urllib.parse
import urllib.request
from collections.abc import Collection
from typing import Any

import orjson

from pulse.records import decode_verdict, kind_family

from .influx import verdict_line


def score_incidents(replays: list[dict[str, Any]], incidents: list[dict[str, Any]]) -> dict[str, Any]:
    """Expected: one incident per replay of a faulty job. Right: an incident of that job on a
    culprit node in the right kind family. Wrong: an incident naming no culprit (or on a
    healthy job). Duplicate: a second incident id for the same fault of the same job (what
    a reprocessed message must never cause); counted apart too for the jobs streamed around
    a broker restart, which with memory storage takes the incidents topic and the group's
    offsets with it (the survivor of that rebalance cannot know what was opened)."""
    by_job: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)
    last: dict[str, dict[str, Any]] = {}
    for inc in incidents:
        by_job[str(inc.get("job"))].setdefault(str(inc.get("id")), inc)
        last[str(inc.get("id"))] = inc
    expected = right = wrong = duplicate = duplicate_broker = 0
    missed: list[str] = []
    wrong_ids: list[dict[str, Any]] = []
    dup_ids: list[dict[str, Any]] = []
    for rep in replays:
        incs = list(by_job.get(rep["job"], {}).values())
        culprits = set(rep.get("culprits") or [])
        hits = [i for i in incs if culprits & set(i.get("nodes") or [])
                and kind_family(i.get("kind")) == kind_family(rep.get("kind"))]
        bad = [i for i in incs if not culprits & set(i.get("nodes") or [])]
        if rep.get("kind"):
            expected += 1
            if hits:
                right += 1
            elif rep.get("complete", True):
                missed.append(rep["job"])
            duplicate += max(0, len(hits) - 1)
            if "broker-restart" in rep.get("disturbed_by", ()):
                duplicate_broker += max(0, len(hits) - 1)
            if len(hits) > 1:
                dup_ids.append({"job": rep["job"], "disturbed_by": rep.get("disturbed_by"),
                                "incidents": [{**{k: i.get(k) for k in ("id", "kind", "nodes", "first_op", "first_seen_ns")},
                                               **{k: last[str(i.get("id"))].get(k) for k in (
                                                   "state", "resolution", "resolved_at_ns", "last_seen_ns", "updates")}}
                                              for i in hits]})
        wrong += len(bad)
        wrong_ids += [{"job": rep["job"], "id": i.get("id"), "kind": i.get("kind"), "nodes": i.get("nodes")}
                      for i in bad]
    # Replays clear of the broker restarts and worker kills (what they lose or skip is the
    # memory broker's and the rebalance's doing, docs/reliability.md): their score alone.
    clean = [r for r in replays if not r.get("disturbed")]
    clean_jobs = {r["job"] for r in clean}
    return {"incidents_expected": expected, "incidents_right": right, "incidents_wrong": wrong,
            "incidents_duplicate": duplicate, "incidents_duplicate_broker_restart": duplicate_broker, "incidents_missed": missed, "incidents_wrong_detail": wrong_ids[:20],
            "incidents_duplicate_detail": dup_ids[:20],
            "clean_replays": len(clean),
            "clean_incidents_expected": sum(1 for r in clean if r.get("kind")),
            "clean_incidents_missed": [j for j in missed if j in clean_jobs],
            "clean_incidents_wrong": sum(1 for w in wrong_ids if w["job"] in clean_jobs)}


DISTURB_AFTER_S = 15.0  # a group's session timeout (10 s) and a rebuild after a restart or kill


def mark_disturbed(replays: list[dict[str, Any]], faults: list[dict[str, Any]],
                   skipped: Collection[str] = ()) -> None:
    """A replay streamed while a broker restart or a worker kill could cost it data: from 5 s
    before the fault to DISTURB_AFTER_S after its end (what the workers had not consumed
    by then is what a memory broker loses; at the 1-minute size they lag about a second),
    and any replay in ``skipped``: short of operator records, with input below the offsets
    a restarted memory broker had reached (:func:`below_restart_offsets`), however long
    after the restart that was."""
    windows = [(f["kind"], f["at_s"] - 5.0, f["at_s"] + float(f.get("down_s", 0.0)) + DISTURB_AFTER_S)
               for f in faults if f["kind"] in ("broker-restart", "worker-kill")]
    for r in replays:
        end = r.get("ended_s", float("inf"))
        by = {k for k, lo, hi in windows if r["started_s"] <= hi and end >= lo}
        if r["job"] in skipped:
            by.add("broker-restart")
        r["disturbed_by"] = sorted(by)
        r["disturbed"] = bool(r["disturbed_by"])


def below_restart_offsets(soak: Any) -> set[str]:
    """Jobs with input on a restarted memory broker below the offsets its partitions had
    reached before. The group's consumers may resume at their old positions on the new,
    empty partitions and never fetch what lies below (docs/reliability.md): that input is
    never segmented, and nothing counts it (the group commits past it)."""
    out: set[str] = set()
    for (epoch, topic, part), first in soak.job_first_offset.items():
        before = soak.ends.get(epoch - 1, {}).get((topic, part), 0) if epoch else 0
        out |= {job for job, off in first.items() if off < before}
    return out


def _victoria_verdict_points(url: str) -> set[tuple[str, int]] | None:
    q = urllib.parse.urlencode({"match[]": '{__name__="pulse_verdict_confidence"}'})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/export?{q}", timeout=30) as r:
            lines = r.read().splitlines()
    except OSError:
        return None
    points = set()
    for ln in lines:
        s = orjson.loads(ln)
        tags = ",".join(f"{k}={v}" for k, v in sorted(s["metric"].items()) if k != "__name__")
        points |= {(tags, int(ts)) for ts in s["timestamps"]}
    return points


def _expected_points(verdicts: list[Any]) -> set[tuple[str, int]]:
    """The (tag set, ms timestamp) each verdict becomes (VictoriaMetrics keeps ms)."""
    out = set()
    for v in verdicts:
        head, _, rest = verdict_line(v).partition(" ")
        ts_ns = int(rest.rsplit(" ", 1)[1])
        tags = ",".join(sorted(head.split(",")[1:]))
        out.add((tags, ts_ns // 1_000_000))
    return out


def account(soak: Any, streamed_s: float) -> dict[str, Any]:
    s = soak.settings
    t = s.topics
    inputs = (t.samples, t.hook_events)
    pub = soak.publisher_stats
    produced = int(pub.get("batches_out", 0)) + int(pub.get("event_messages", 0))
    dropped = int(pub.get("dropped", 0))
    # Producer -> broker: every message the producer made reached a broker (the observer
    # saw it), or was dropped by a full spool (counted). What the spool re-sent after a
    # failure may arrive twice: distinct digests.
    # Still in the producer's spool when the run ended (on disk, sent by its next start):
    # not delivered in the run, counted as lost here.
    in_spool = max(0, int(pub.get("spooled", 0)) - int(pub.get("delivered_from_spool", 0)))
    unseen = max(0, produced - dropped - in_spool - len(soak.seen_input))
    # Broker -> group: per broker incarnation, what the broker held past the group's
    # committed offsets when it died (a memory broker loses it: it was confirmed to the
    # producer, so nobody sends it again) or, for the last one, at the end.
    consumed = unconsumed = lost_in_restarts = 0
    for epoch, ends in soak.ends.items():
        committed = soak.committed.get(epoch, {})
        for tp, end in ends.items():
            if tp[0] not in inputs:
                continue
            done = min(committed.get(tp, 0), end)
            consumed += done
            if epoch == soak.epoch:
                unconsumed += end - done
            else:
                lost_in_restarts += end - done
    # Messages nobody (not even the observer, ~0.1 s behind) read: with a memory broker,
    # what it confirmed in its last moments (lost with it); otherwise lost before a broker.
    memory = soak.cfg.storage != "s3"
    if memory:
        lost_in_restarts += unseen
    lost_before_broker = 0 if memory else unseen
    # Poison past the group's commit on a broker that was then killed never reached a worker.
    poison_lost = sum(1 for epoch, topic, part, off in soak.poison_at
                      if epoch != soak.epoch and off >= soak.committed.get(epoch, {}).get((topic, part), 0))
    latest = soak.latest_by_pid()
    # What each worker process took live (its last record; a SIGKILLed one's last record
    # is at most 0.5 s old, so `duplicates` is a lower bound).
    processed = sum(int(r.get("messages_in", 0)) for r in latest.values())
    lost_batches = sum(int(r.get("lost_batches", 0)) for r in latest.values())
    late_records = sum(int(r.get("late_op_metrics", 0)) for r in latest.values())
    dead = soak.records.get(t.dead_letter, [])
    reasons = collections.Counter(f"{d.get('stage')}: {str(d.get('error')).split(': ', 1)[-1][:50]}" for d in dead)
    poison_dead = sum(1 for d in dead if d.get("key") == "poison")
    incidents = [i for i in soak.records.get(t.incidents, []) if i.get("type") == "incident" or "state" in i]
    verdicts = []
    for v in soak.records.get(t.verdicts, []):
        with contextlib.suppress(Exception):
            verdicts.append(decode_verdict(orjson.dumps(v)))
    below = below_restart_offsets(soak)
    opened: dict[str, dict[str, dict[str, Any]]] = collections.defaultdict(dict)  # job -> id -> first record
    for i in incidents:
        opened[str(i.get("job"))].setdefault(str(i.get("id")), i)
    for rep in soak.replays:
        rep["complete"] = "ended_s" in rep
        rep["inputs_at_broker"] = soak.job_inputs.get(rep["job"], 0)
        rep["op_records"] = len(soak.job_op_records.get(rep["job"], ()))
        mine = opened.get(rep["job"], {})
        seen = [soak.seen_at[k] for k in mine if k in soak.seen_at]
        rep["first_incident_seen_s"] = min(seen) if seen else None
        rep["incidents_opened"] = [{"kind": i.get("kind"), "nodes": i.get("nodes")} for i in mine.values()]
    # A replay segmented in full gives every record the same trace gives in any replay.
    full = collections.Counter[str]()
    for rep in soak.replays:
        full[rep["scenario"]] = max(full[rep["scenario"]], rep["op_records"])
    for rep in soak.replays:
        rep["op_records_short"] = full[rep["scenario"]] - rep["op_records"]
        rep["input_below_restart_offsets"] = rep["job"] in below
    # Skipped there: short of records (a short replay anywhere else stays clean, and its
    # miss fails the soak).
    skipped = {r["job"] for r in soak.replays if r["input_below_restart_offsets"] and r["op_records_short"]}
    mark_disturbed(soak.replays, soak.faults, skipped)
    scores = score_incidents(soak.replays, incidents)
    expected_points = _expected_points(verdicts)
    got_points = _victoria_verdict_points(soak.vm.url) if soak.vm is not None else None
    mark_s = 120.0 if streamed_s >= 240.0 else streamed_s / 2
    procs = soak.sampler.summary(mark_s)
    faults = collections.Counter(f["kind"] for f in soak.faults)
    lost = lost_before_broker + lost_in_restarts + unconsumed + in_spool
    return {
        "type": "soak", "minutes": soak.cfg.minutes, "seed": soak.cfg.seed, "streamed_s": round(streamed_s, 1),
        "workers": soak.cfg.workers, "storage": soak.cfg.storage,
        "produced": produced, "produced_detail": {
            "batches_in": pub.get("batches_in"), "batch_messages": pub.get("batches_out"),
            "hook_events": pub.get("events_in"), "event_messages": pub.get("event_messages"),
            "spooled": pub.get("spooled"), "delivered_from_spool": pub.get("delivered_from_spool"),
            "outages": pub.get("outages"), "replays": len(soak.replays)},
        "broker_messages": soak.seen_input_messages, "broker_distinct": len(soak.seen_input),
        "broker_duplicates": soak.seen_input_messages - len(soak.seen_input),
        "consumed": consumed, "unconsumed": unconsumed,
        "processed": processed, "duplicates": max(0, processed - consumed),
        "dead_lettered": len(dead), "dead_letter_reasons": dict(reasons),
        "poison_sent": sum(soak.poison.values()), "poison_seen": sum(soak.seen_poison.values()),
        "poison_dead_lettered": poison_dead, "poison_lost_in_broker_restarts": poison_lost,
        "dropped": dropped, "lost": lost, "lost_before_broker": lost_before_broker,
        "lost_in_broker_restarts": lost_in_restarts, "unseen_by_observer": unseen, "in_spool_at_end": in_spool,
        "segmenter_lost_batches": lost_batches, "late_op_metrics": late_records,
        "verdicts": len(verdicts), "incidents": len({i.get("id") for i in incidents}), **scores,
        "influx_written": sum(int(r.get("influx_written", 0)) for r in latest.values()),
        "influx_dropped": sum(int(r.get("influx_dropped", 0)) for r in latest.values()),
        "influx_verdict_points_expected": len(expected_points),
        "influx_verdict_points_read": None if got_points is None else len(got_points & expected_points),
        "rss_mb_start": {k: v["rss_mb_start"] for k, v in procs.items()},
        "rss_mb_mark": {k: v["rss_mb_mark"] for k, v in procs.items()}, "rss_mark_s": round(mark_s, 1),
        "rss_mb_end": {k: v["rss_mb_end"] for k, v in procs.items()},
        "processes": procs,
        "faults_injected": dict(faults), "fault_log": soak.faults, "replays": soak.replays,
        "worker_processes": len(latest), "broker_incarnations": soak.epoch + 1,
    }
