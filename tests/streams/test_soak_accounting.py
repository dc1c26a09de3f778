"""The soak's per-replay accounting without running a soak: which replays a memory broker's
restart skipped (measured from offsets and records, not a time window), and the job a
message key names (streams/soak.py, streams/soak_report.py)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from pulse.streams.soak import _replay_of
from pulse.streams.soak_report import below_restart_offsets, mark_disturbed


def test_a_node_key_names_its_replay_and_garbage_names_none():
    assert _replay_of(b"r10-node-03") == "soak-10"
    assert _replay_of(b"node-03") == "?"
    assert _replay_of(None) == "?"


@given(st.binary(max_size=40))
def test_any_key_gives_a_job_name_and_never_raises(key):
    assert isinstance(_replay_of(key), str)


def _soak(first, ends):
    return SimpleNamespace(job_first_offset=first, ends=ends)


def test_input_below_the_offsets_the_broker_had_reached_before_its_restart():
    # Partition 0 had reached offset 500 on the first broker; on the restarted one soak-6
    # starts at offset 200 there (skipped by a group resuming at its old position), soak-9
    # at 640 (read); a job on the first broker only is never below anything.
    first = {(0, "samples", 0): {"soak-1": 0}, (1, "samples", 0): {"soak-6": 200, "soak-9": 640},
             (1, "samples", 1): {"soak-9": 10}}
    ends = {0: {("samples", 0): 500}}
    assert below_restart_offsets(_soak(first, ends)) == {"soak-6"}


def test_a_skipped_replay_is_disturbed_by_the_restart_however_late_it_streamed():
    faults = [{"kind": "broker-restart", "at_s": 20.0, "down_s": 4.0}, {"kind": "influx-outage", "at_s": 30.0}]
    reps = [{"job": "soak-1", "started_s": 1.0, "ended_s": 5.0},
            {"job": "soak-6", "started_s": 41.0, "ended_s": 42.0},
            {"job": "soak-7", "started_s": 43.0, "ended_s": 44.0}]
    mark_disturbed(reps, faults, {"soak-6"})
    assert [(r["job"], r["disturbed_by"]) for r in reps] == [
        ("soak-1", []), ("soak-6", ["broker-restart"]), ("soak-7", [])]
    assert [r["disturbed"] for r in reps] == [False, True, False]
