"""Partitions a worker takes over in a rebalance: which ones are new to its state, and
their replay.

Samples and hook events are keyed by node and op-metrics by job, so the state of a node
(its segmenter) or of a job (aligner, localizer, incidents) lives on the worker that owns
its partition. When a worker leaves the group (stopped, or killed: the group's session
timeout), the survivors get its partitions. Faust resumes them at the group's committed
offsets, so each survivor first rebuilds the state of those partitions from their
messages up to the committed offsets, into fresh state (outputs dropped: the worker that
left sent them before that commit), and adopts it. The same holds for a partition a worker
had, lost and got back: what it held for it is stale and replaced.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pulse.errors import PulseError
from pulse.records import Incident, decode_incident

from .readback import committed_offsets, read_back
from .state import Message, partition_of

__all__ = ["Ownership", "incidents_on", "latest_incidents", "partition_of", "replay_partitions"]


class Ownership:
    """The partitions of some topics whose state this worker holds."""

    def __init__(self, topics: Iterable[str]) -> None:
        self.topics = frozenset(topics)
        self.owned: set[int] | None = None
        """None until the first look: the start-up rebuild covered every partition then."""

    def new(self, assignment: Iterable[Any], seen: Iterable[tuple[str, int | None]] = ()) -> set[int]:
        """Partitions assigned (or that messages came from) whose state this worker does not
        hold; from then on it does. An empty assignment (the middle of a rebalance) changes
        nothing: dropping every partition would rebuild those kept for nothing."""
        cur = {tp.partition for tp in assignment if tp.topic in self.topics}
        cur |= {p for t, p in seen if t in self.topics and p is not None}
        if not cur:
            return set()
        if self.owned is None:
            self.owned = cur
            return set()
        new = cur - self.owned
        self.owned = cur  # revoked partitions leave: got back later, they are rebuilt
        return new

    def holds(self, partition: int) -> bool:
        return self.owned is not None and partition in self.owned


async def replay_partitions(bootstrap: str, group: str, topics: list[str], partitions: set[int], *,
                            hook_topic: str | None = None, client: dict[str, Any] | None = None,
                            ) -> list[Message]:
    """The messages of ``partitions`` of ``topics`` up to the group's committed offsets, in
    the order they were produced (hook events before samples of the same timestamp)."""
    committed = await committed_offsets(bootstrap, group, topics, client=client)
    msgs: list[Message] = []
    for topic in topics:
        upto = {p: off for (t, p), off in committed.items() if t == topic and p in partitions}
        if upto:
            msgs += await read_back(bootstrap, topic, upto=upto, client=client)
    msgs.sort(key=lambda m: (m.timestamp or 0, m.topic != hook_topic))
    return msgs


def latest_incidents(messages: Iterable[Message]) -> tuple[list[Incident], list[str]]:
    """The latest state of each incident in ``messages`` (the compacted incidents topic, read
    back for a takeover: the jobs' incidents go on with their ids), and why each record
    that does not decode was skipped (workers wrote them; nothing to dead-letter)."""
    last: dict[str, Incident] = {}
    bad: list[str] = []
    for m in messages:
        try:
            inc = decode_incident(m.value or b"", f"{m.topic}[{m.partition}]@{m.offset}")
        except PulseError as exc:
            bad.append(str(exc))
            continue
        last[inc.id] = inc
    return list(last.values()), bad


async def incidents_on(bootstrap: str, topic: str, *, client: dict[str, Any] | None = None,
                       ) -> tuple[list[Incident], list[str]]:
    """:func:`latest_incidents` of the incidents topic as the broker holds it now."""
    return latest_incidents(await read_back(bootstrap, topic, client=client))
