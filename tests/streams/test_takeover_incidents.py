"""What a takeover reads back from the incidents topic (streams/takeover.py): the latest
state of each incident, in topic order, and every record that does not decode skipped
with its reason, never an exception that would stop the rebuild."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st
from pulse.streams.state import Message
from pulse.streams.takeover import latest_incidents

from pulse.records import Incident

T = "pulse.incidents"


def _inc(i: int, state: str = "open", updates: int = 0) -> Incident:
    resolved = state == "resolved"
    return Incident(id=f"inc-{i:016x}", job="j", state=state, kind="network-slow", level="node",
                    nodes=["node-01"], ranks=[1], nics=["node-01/mlx5_0"], confidence=0.9, summary="s",
                    evidence={}, first_op={"comm_id": "dp0", "seq": 3}, ops=4, updates=updates,
                    first_seen_ns=1_000, last_seen_ns=2_000, resolved_at_ns=3_000 if resolved else None,
                    resolution="evidence-stopped" if resolved else None, emitted_at=5)


def _msg(value: bytes, offset: int) -> Message:
    return Message(T, None, value, 0, offset)


def test_garbage_is_skipped_with_its_reason_and_the_rest_kept() -> None:
    good = [_inc(1), _inc(2)]
    msgs = [_msg(good[0].to_json(), 0), _msg(b"\xff not json", 1), _msg(b'{"type": "incident", "v": 1}', 2),
            _msg(b"", 3), _msg(good[1].to_json(), 4)]
    incs, bad = latest_incidents(msgs)
    assert [i.id for i in incs] == [g.id for g in good]
    assert len(bad) == 3 and all(f"{T}[0]@" in why for why in bad)


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["open", "updated", "resolved"])), max_size=20))
def test_the_latest_state_of_each_incident_wins(seq: list[tuple[int, str]]) -> None:
    msgs = [_msg(_inc(i, state, updates=k).to_json(), k) for k, (i, state) in enumerate(seq)]
    want: dict[str, Incident] = {}
    for k, (i, state) in enumerate(seq):  # naive: the last record of each id
        want[f"inc-{i:016x}"] = _inc(i, state, updates=k)
    incs, bad = latest_incidents(msgs)
    assert not bad
    assert {i.id: dataclasses.asdict(i) for i in incs} == {k: dataclasses.asdict(v) for k, v in want.items()}
