"""Incidents: a verdict stream grouped into faults.

The localizer repeats an anomaly verdict while the anomaly persists and closes it with a
``cleared`` verdict, so one fault is a series of verdicts. An incident is one
(kind, level, nodes) series: every anomaly verdict with that key, in the order the
caller gives them, and whether the last word on it was ``cleared``. A key that clears and
alarms again stays one incident (a flapping NIC is one fault, not several).

The localizer keys its own open incidents on (kind, nodes) and never gives one key two
levels, so keying on the level too splits nothing; it only keeps apart what a reader
would call different answers.

Who reads what:

* scoring (:mod:`pulse.localization.scoring`) orders the anomalies by when they were
  decided (:func:`decided_at`) and judges each incident by its first verdict;
* ``pulse report`` draws :func:`main_incident`;
* the lab analysis lists every incident with its count, confidence and first times.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from pulse.records import Verdict

IncidentKey = tuple[str | None, str | None, tuple[str, ...]]


def incident_key(v: Verdict) -> IncidentKey:
    """(kind, level, sorted nodes): what makes two verdicts the same fault."""
    return (v.kind, v.level, tuple(sorted(v.nodes)))


def decided_at(v: Verdict) -> int:
    """Trace time at which the verdict's data was complete (``window.decided_at_ns``; the
    operator-level baseline and older records only have ``first_seen_ns``)."""
    w = v.window if isinstance(v.window, dict) else {}
    at = w.get("decided_at_ns")
    return int(at) if isinstance(at, int) else int(v.first_seen_ns)


@dataclasses.dataclass
class Incident:
    kind: str | None
    level: str | None
    nodes: tuple[str, ...]
    """Sorted."""
    verdicts: list[Verdict]
    """Its anomaly verdicts, in the order they were given (never empty)."""
    cleared: bool = False
    """The last verdict of this key in the stream was ``cleared``."""

    @property
    def first(self) -> Verdict:
        """The first verdict in the order given (scoring: the first decided)."""
        return self.verdicts[0]

    @property
    def count(self) -> int:
        return len(self.verdicts)

    @property
    def confidence(self) -> float:
        return max(float(v.confidence) for v in self.verdicts)

    @property
    def first_seen_ns(self) -> int:
        """Trace time of the earliest anomalous operator any of its verdicts names."""
        return min(v.first_seen_ns for v in self.verdicts)

    @property
    def earliest(self) -> Verdict:
        """The verdict about the earliest operators (ties: the one emitted first)."""
        return min(self.verdicts, key=lambda v: (v.first_seen_ns, v.emitted_at))

    @property
    def first_op(self) -> tuple[Any, Any]:
        """(comm_id, first_seq) of the first verdict's window: the first anomalous operator
        it names (comm_id is a list when the findings span several communicators)."""
        w = self.first.window if isinstance(self.first.window, dict) else {}
        return w.get("comm_id"), w.get("first_seq")


def group_incidents(verdicts: Iterable[Verdict]) -> list[Incident]:
    """The incidents of a verdict stream, in order of their first anomaly verdict.

    ``healthy`` and ``insufficient-data`` verdicts are not alarms and are skipped; a
    ``cleared`` verdict marks its key's incident cleared (and one that closes nothing is
    ignored); an anomaly after it reopens the same incident.
    """
    out: dict[IncidentKey, Incident] = {}
    for v in verdicts:
        key = incident_key(v)
        if v.status == "anomaly":
            inc = out.get(key)
            if inc is None:
                out[key] = Incident(key[0], key[1], key[2], [v])
            else:
                inc.verdicts.append(v)
                inc.cleared = False
        elif v.status == "cleared" and key in out:
            out[key].cleared = True
    return list(out.values())


def main_incident(incidents: Iterable[Incident]) -> Incident | None:
    """The incident a one-picture report is about: the one repeated most often (verdicts
    repeat while an anomaly persists), then the most confident, then the earliest."""
    return max(incidents, key=lambda i: (i.count, i.confidence, -i.first_seen_ns), default=None)
