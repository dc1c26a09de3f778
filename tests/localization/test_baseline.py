"""The operator-level baseline on hand-built per-rank operator start/end records."""

from __future__ import annotations

from pulse.localization import LocalizeParams, baseline_localize

from . import synth

ONSET = 10


def culprits(vs):
    return {(v.kind, v.level, tuple(v.nodes)) for v in vs if v.status == "anomaly"}


def run(tweak=None, **kw):
    return baseline_localize(synth.oplevel(synth.metrics(tweak=tweak, **kw)), LocalizeParams())


def test_healthy_is_quiet():
    for seed in range(4):
        vs = run(seed=seed)
        assert not culprits(vs)
        assert vs and vs[0].status == "healthy" and vs[0].method == "baseline"


def test_latest_starter_is_a_compute_straggler():
    def late(comm, seq, r, f):
        if seq >= ONSET:
            if r == 1:
                f["start_ns"] += 8_000_000
            else:
                f["duration_ns"] += 8_000_000
        return f
    assert culprits(run(late)) == {("compute-slow", "node", ("node-01",))}


def test_latest_starter_within_healthy_compute_jitter_is_ignored():
    # ranks start up to ~2 ms apart in healthy steps: below late_min_ns, no straggler
    def late(comm, seq, r, f):
        if seq >= ONSET:
            if r == 1:
                f["start_ns"] += 2_000_000
            else:
                f["duration_ns"] += 2_000_000
        return f
    assert not any(k == "compute-slow" for k, _l, _n in culprits(run(late)))


def test_lateness_within_clock_offsets_is_ignored():
    def late(comm, seq, r, f):
        if seq >= ONSET and r == 1:
            f["start_ns"] += 90_000
        return f
    assert not culprits(run(late))


def test_rank_that_never_entered_a_hung_operator():
    def hang(comm, seq, r, f):
        if seq == 39:
            if r == 3:
                return None
            f["complete"] = False
        return f
    assert culprits(run(hang)) == {("compute-stop", "node", ("node-03",))}


def test_hang_with_every_rank_inside_is_an_undetermined_group():
    def hang(comm, seq, r, f):
        if comm == "dp0" and seq == 39:
            f["complete"] = False
        return f
    got = culprits(run(hang))
    assert got == {("network-stop", "group", ("node-00", "node-01", "node-02", "node-03"))}


def test_network_straggler_with_identical_durations_is_only_a_group():
    # What the operator view sees of a slow NIC: every rank's operator takes longer, none
    # stands out -> the communicator's nodes as a group (both rails share all nodes here).
    def slow(comm, seq, r, f):
        if comm == "dp0" and seq >= ONSET:
            f["duration_ns"] = int(f["duration_ns"] * 1.5)
        return f
    got = culprits(run(slow))
    assert got == {("network-slow", "group", ("node-00", "node-01", "node-02", "node-03"))}


def test_longest_operator_that_did_not_start_first():
    def long(comm, seq, r, f):
        if comm == "dp0" and seq >= ONSET and r == 2:
            f["duration_ns"] = int(f["duration_ns"] * 1.5)
        return f
    assert ("network-slow", "node", ("node-02",)) in culprits(run(long))


def test_baseline_verdicts_roundtrip_the_wire_contract():
    from pulse.records import decode_verdict

    def late(comm, seq, r, f):
        if seq >= ONSET:
            if r == 1:
                f["start_ns"] += 2_000_000
            else:
                f["duration_ns"] += 2_000_000
        if seq == 39:
            if r == 3:
                return None
            f["complete"] = False
        return f
    vs = run(late)
    assert vs
    for v in vs:
        assert decode_verdict(v.to_json()) == v
