"""The chaos soak at CI size (issue 20): one minute of live jobs through the embedded broker
(memory storage: what a restart loses is counted, docs/reliability.md), two workers and
VictoriaMetrics, with a broker kill and restart, a worker SIGKILL and restart, an InfluxDB
outage, poison messages and a producer burst, all on a fixed seed. Nothing here waits on the clock: the
run ends when the group committed every input message and the workers are idle, and the
assertions are on the accounting, never on how long anything took."""

from __future__ import annotations

import pytest
import services

from pulse.settings import Settings

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    if services.find_binary(services.VICTORIA) is None:
        pytest.skip("victoria-metrics is not installed (apt-get install victoria-metrics)")
    from pulse.streams.soak import SoakConfig, run_soak

    workdir = tmp_path_factory.mktemp("soak")
    return run_soak(Settings.from_env({}), SoakConfig(minutes=1.0, seed=1, echo=True), workdir)


def test_every_fault_kind_was_injected(soak):
    assert set(soak["faults_injected"]) == {"broker-restart", "worker-kill", "influx-outage", "poison"}
    assert soak["produced_detail"]["outages"] >= 1  # the producer saw the broker go away
    assert any(r["speed"] > 1 for r in soak["replays"])  # and streamed a burst


def test_the_spool_loses_nothing_and_only_the_memory_broker_does(soak):
    # What the producer spooled during the outage was all delivered, everything a broker
    # held at the end was consumed; the only loss is what the memory broker had confirmed
    # and not yet handed to the group when it was killed, counted.
    assert soak["lost_before_broker"] == 0 and soak["dropped"] == 0 and soak["unconsumed"] == 0
    assert soak["in_spool_at_end"] == 0
    assert soak["broker_distinct"] + soak["unseen_by_observer"] == soak["produced"]
    assert soak["produced_detail"]["spooled"] >= 1
    assert soak["produced_detail"]["delivered_from_spool"] == soak["produced_detail"]["spooled"]
    assert soak["lost"] == soak["lost_in_broker_restarts"]


def test_every_poison_message_is_one_dead_letter(soak):
    assert soak["poison_sent"] == soak["poison_seen"] == 4
    # Nothing but poison is dead-lettered, and every poison message a worker got is one.
    assert soak["dead_lettered"] == soak["poison_dead_lettered"]
    assert soak["poison_dead_lettered"] == soak["poison_sent"] - soak["poison_lost_in_broker_restarts"]


def test_jobs_clear_of_the_broker_and_worker_faults_are_diagnosed_right(soak):
    # Jobs streamed around a memory broker restart or a worker kill lose or skip data
    # (counted above) and may be missed or even misplaced (docs/reliability.md); every
    # other job, InfluxDB outages, poison and bursts notwithstanding, must be right.
    assert soak["clean_incidents_expected"] >= 2
    missed = set(soak["clean_incidents_missed"])
    assert not missed and soak["clean_incidents_wrong"] == 0, (
        [r for r in soak["replays"] if r["job"] in missed], soak["incidents_wrong_detail"], soak["fault_log"],
        soak["late_op_metrics"])
    # One fault, one incident id across a worker kill, whatever the survivor's rebuild
    # judged (the killed worker's incidents are read back); a memory broker's restart loses
    # the incidents topic with the rest, and a job streamed around it can get a second id.
    assert soak["incidents_duplicate"] == soak["incidents_duplicate_broker_restart"], soak["incidents_duplicate_detail"]


def test_verdicts_reach_influx_through_its_outage(soak):
    assert soak["influx_verdict_points_expected"] > 0 and soak["influx_dropped"] == 0
    # A worker SIGKILLed with points still queued loses them (its queue is in memory): the
    # 1-minute schedule kills one after the outage, and it can only hold its last half second.
    assert soak["influx_verdict_points_read"] >= soak["influx_verdict_points_expected"] - 5


def test_every_process_was_sampled(soak):
    for name in ("broker", "victoria", "worker-0", "worker-1", "worker-0-localize", "soak"):
        assert soak["processes"][name]["samples"] >= 2, name
