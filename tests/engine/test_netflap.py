"""A flapping NIC in network-only mode (engine/netflap.py): silent while its node's other
NICs send, then sending again; named when it alone is in every multi-node silence."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from pulse.engine.netflap import FlapWatch

EPOCH = 1000
SKEW = 50 * EPOCH
KEEP = 10**12
PERIOD = 100  # epochs between the bursts every NIC sends together
BURST = 20
NICS = ("m0", "m1", "m2", "m3")
NODES = ("n0", "n1", "n2", "n3")


def schedule(bursts: int, silent: dict[str, set[int]]) -> dict[str, np.ndarray]:
    """Every NIC of every node sends a burst of ``BURST`` epochs every ``PERIOD``; a NIC in
    ``silent`` misses the bursts listed and sends their epochs 40 epochs late instead (its
    link was down, its bytes come later)."""
    out = {}
    for node in NODES:
        for nic in NICS:
            ep = f"{node}/{nic}"
            epochs = []
            for k in range(bursts):
                start = k * PERIOD + (40 if k in silent.get(ep, ()) else 0)
                epochs.extend(range(start, start + BURST))
            out[ep] = np.array(sorted(epochs), dtype=np.int64)
    return out


def watch(sends: dict[str, np.ndarray], chunks: int = 1) -> FlapWatch:
    w = FlapWatch(SKEW, KEEP)
    end = max(int(e.max()) for e in sends.values()) + PERIOD
    cuts = np.linspace(0, end, chunks + 1).astype(np.int64)
    for lo, hi in itertools.pairwise(cuts.tolist()):
        for ep, e in sends.items():
            node, _, nic = ep.partition("/")
            part = e[(e >= lo) & (e < hi)]
            w.note("j", node, nic, EPOCH, part, np.full(part.size, 1000), int(hi) * EPOCH)
    return w


def named(w: FlapWatch, lossy: bool = False) -> set[tuple[str, str]]:
    return {(f.node, f.nic) for f in w.check(lossy=lossy)}


# n0/m1 flaps in bursts 5..10: its pipeline partner n2/m1 is silent with it in some, its
# ring partner n1/m1 in others (each waits on the link that is down)
FLAP = {"n0/m1": {5, 6, 7, 8, 9, 10}, "n2/m1": {5, 6, 7}, "n1/m1": {8, 9, 10}}


@pytest.mark.parametrize("chunks", [1, 7])
def test_the_nic_in_every_multi_node_silence_is_named(chunks: int) -> None:
    w = watch(schedule(14, FLAP), chunks)
    flaps = w.check()
    assert [(f.node, f.nic) for f in flaps] == [("n0", "m1")]
    (flap,) = flaps
    assert flap.events == 6
    s = flap.silences[0]
    # silent for the whole 20-epoch burst its siblings sent, and sent again 40 epochs later
    assert s.silent_ns == BURST * EPOCH and s.end_ns - s.start_ns > BURST * EPOCH
    assert s.sent_bytes["m1"] == 0 and all(s.sent_bytes[n] == BURST * 1000 for n in ("m0", "m2", "m3"))
    assert not w.check(), "each silence is reported once"


def test_a_healthy_job_names_no_one() -> None:
    assert not named(watch(schedule(14, {})))


def test_the_two_ends_of_one_link_silent_together_name_no_one() -> None:
    """Either end of a link that goes down can be the one that flapped."""
    assert not named(watch(schedule(14, {"n0/m1": {5, 6, 7, 8}, "n2/m1": {5, 6, 7, 8}})))


def test_silences_of_one_node_alone_name_no_one() -> None:
    """A NIC waiting on a slow peer is silent while its siblings send too; nothing on
    another node stopped with it, so nothing says a link went down."""
    assert not named(watch(schedule(14, {"n0/m1": {5, 6, 7, 8, 9, 10}})))


def test_silences_of_two_nodes_at_different_times_are_not_one_event() -> None:
    """n0/m1 and n2/m1 each miss bursts, never while the other was silent too: no link held
    both, so no multi-node event (each alone is a single-node silence)."""
    assert not named(watch(schedule(14, {"n0/m1": {5, 6, 7}, "n2/m1": {9, 10, 11}})))


def test_too_few_events_name_no_one() -> None:
    assert not named(watch(schedule(14, {"n0/m1": {5, 6}, "n2/m1": {5}, "n1/m1": {6}})))


def test_a_second_silent_nic_on_the_same_node_vetoes() -> None:
    """Two NICs of one node falling silent is the host's or the GPU's doing, not one link's."""
    flap = dict(FLAP)
    flap["n0/m3"] = {12}
    assert not named(watch(schedule(14, flap)))


def test_a_job_that_resends_bytes_names_no_flap() -> None:
    """A lossy link's retransmission timeouts silence it as a flap does: the surplus rule
    names the lossy NIC."""
    assert not named(watch(schedule(14, FLAP)), lossy=True)


def lagged(sends: dict[str, np.ndarray], late: dict[str, set[int]], by: int) -> dict[str, np.ndarray]:
    """``sends`` with the bursts listed per NIC started ``by`` epochs late."""
    out = dict(sends)
    for ep, bursts in late.items():
        e = sends[ep]
        shift = np.isin(e // PERIOD, list(bursts)) & ((e % PERIOD) < BURST)
        out[ep] = np.unique(np.where(shift, e + by, e))
    return out


def test_a_silence_no_longer_than_the_nodes_usual_ones_is_not_one() -> None:
    """Every NIC of n0, n1 and n2 lags its siblings by 3 epochs once (their usual rhythm): the
    bound is 4 times that, so silences of 10 epochs are no event, bursts missed whole (20) are."""
    usual = {f"{node}/{nic}": {k + 1} for node in ("n0", "n1", "n2") for k, nic in enumerate(NICS)}
    w = watch(lagged(schedule(14, FLAP), usual, 3))
    assert [(f.node, f.nic) for f in w.check()] == [("n0", "m1")]
    assert not named(watch(lagged(lagged(schedule(14, {}), usual, 3), FLAP, 10)))


def write_trace(path, sends: dict[str, np.ndarray], epoch_ns: int, chunk: int = 50) -> None:  # type: ignore[no-untyped-def]
    """Each NIC's sends (one flow, 4000 B an epoch) as batches of ``chunk`` epochs, empty
    ones included (a capture that goes on)."""
    from pulse.samples import make_batch
    from pulse.trace import TraceWriter

    end = max(int(e.max()) for e in sends.values()) + PERIOD
    with TraceWriter(path, job="j", epoch_ns=epoch_ns) as tw:
        for ep, e in sends.items():
            node, _, nic = ep.partition("/")
            for seq, lo in enumerate(range(0, end, chunk)):
                part = e[(e >= lo) & (e < lo + chunk)] - lo
                tw.write_batch(make_batch(node=node, nic=nic, t0_ns=lo * epoch_ns, epoch_ns=epoch_ns, batch_seq=seq,
                                          flow=np.zeros(part.size, np.uint32), epoch=part.astype(np.uint32),
                                          tx_bytes=np.full(part.size, 4000, np.uint32), job="j"))


def test_diagnose_names_the_flapping_nic_by_the_rail_rule(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """End to end without descriptors: at 100 us epochs the flapping NIC's bursts come 4 ms
    after its siblings' (the rail rule's bar is 2 ms): network-slow on its node, on that NIC,
    with how late it ended in the evidence; the two ends of one link alone name nobody."""
    from pulse.engine import diagnose

    write_trace(tmp_path / "flap", schedule(14, FLAP), 100_000)
    res = diagnose(tmp_path / "flap", network_only=True)
    assert {(i.kind, i.level, tuple(i.nodes), tuple(i.nics or ())) for i in res.incidents} == \
        {("network-slow", "node", ("n0",), ("n0/m1",))}
    assert "ended" in res.incidents[0].summary and "after the same operators on its other NICs" in \
        res.incidents[0].summary
    write_trace(tmp_path / "pair", schedule(14, {"n0/m1": {5, 6, 7, 8}, "n2/m1": {5, 6, 7, 8}}), 100_000)
    assert not diagnose(tmp_path / "pair", network_only=True).incidents
