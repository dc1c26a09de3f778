"""Incidents: one per fault, from the verdict stream of a job.

The localizer judges continuously: while a fault persists it repeats its anomaly verdict,
and it says ``cleared`` once the culprit's operators look like its peers' again for
``LocalizeParams.clear_ops`` operators. An operator (or its automation) wants one thing
per fault instead: an incident that *opens* with the first verdict, is *updated* only when
something an operator would act on changes (the nodes or level it names, its NICs or
ranks, its confidence by a tenth or more), and is *resolved* when the evidence stopped or
the job ended. :class:`IncidentTracker` turns the verdicts into those state changes.

The same fault is the same (kind, level, nodes) as in :mod:`.incidents` (which groups a
finished verdict stream for scoring, the report and the lab); live, a later verdict that
names an overlapping set of nodes with a fault of the same family (network vs
compute/host) also refines the open incident (a path that turns out to be one NIC) rather
than opening a second one, and its id stays the one it opened with.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from pulse.records import Incident, Verdict, kind_family

from .incidents import incident_key

REPORTED = 64
"""Resolved incidents a tracker keeps per job: its own lately, and another worker's after a
takeover."""
CONFIDENCE_STEP = 0.1
"""A change of confidence smaller than this is not an update worth paging about."""

_KIND_WORDS = {
    "network-slow": "network fail-slow", "network-stop": "network fail-stop",
    "compute-slow": "compute fail-slow", "compute-stop": "compute fail-stop (hung)",
    "host-contention": "host contention", "path": "slow path",
}


def incident_id(job: str, kind: str, level: str, nodes: Iterable[str], comm_id: Any, seq: Any) -> str:
    """Stable id of an incident: its job, what it named first, and its first operator."""
    text = "|".join([job, kind, level, ",".join(nodes), str(comm_id), str(seq)])
    return "inc-" + hashlib.sha1(text.encode()).hexdigest()[:16]


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.1f} ms" if abs(ns) >= 100_000 else f"{ns / 1e3:.0f} µs"


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2.0) if n else float("nan")


def _metric_sentence(v: Verdict) -> str:
    """What the deciding metric says, in words, from the verdict's own evidence."""
    ev = v.evidence if isinstance(v.evidence, dict) else {}
    rows = [r for r in ev.get("findings") or [] if isinstance(r, dict) and r.get("node") in v.nodes]
    rows = rows or [r for r in ev.get("findings") or [] if isinstance(r, dict)]
    by: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        val, ref = r.get("value"), r.get("reference")
        if isinstance(val, (int, float)) and isinstance(ref, (int, float)):
            by.setdefault(str(r.get("metric")), []).append((float(val), float(ref)))
    if not by:
        return ""
    metric, pairs = max(by.items(), key=lambda kv: len(kv[1]))
    val = _median([a for a, _ in pairs])
    ref = _median([b for _, b in pairs])
    if metric == "act_ns" and ref > 0:
        return f"its communication took {val / ref:.1f}x the usual time (ACT {_ms(val)} vs {_ms(ref)})"
    if metric == "active_rate" and ref > 0:
        return f"its sends ran at {100 * val / ref:.0f} % of its peers' rate"
    if metric == "volume_ratio":
        return f"it sent {100 * (val - 1):.0f} % more bytes than the operators need (retransmissions)"
    if metric == "sent_fraction":
        return f"its traffic stopped after {100 * val:.0f} % of an operator's bytes"
    if metric == "issue_to_end_ns":
        return f"it issued its collectives {_ms(ref - val)} after its peers"
    if metric == "issue_lag_ns":
        # reference: the rank's own usual lag (judged against its history) or 0 (its peers)
        return (f"it issued its collectives {_ms(val - ref)} later than usual against its peers" if ref
                else f"it issued its collectives {_ms(val)} after its peers")
    if metric == "end_after_other_nics_ns":
        return f"its operators on that NIC ended {_ms(val)} after the same operators on its other NICs"
    if metric == "silent_after_other_nics_ns":
        return (f"all-to-alls on that NIC, its own and its peers' exchanges with it, stalled {_ms(val)} "
                "beyond the same all-to-alls on the nodes' other NICs")
    if metric == "started":
        return "it never started an operator its peers were waiting in"
    return f"{metric} {val:.4g} vs {ref:.4g} for its peers"


def summary(v: Verdict, ops: int) -> str:
    """One sentence for a person, e.g. "node-03 (node-03/mlx5_0): network fail-slow, its
    sends ran at 38 % of its peers' rate, over 34 operators since 12:01:07 UTC (confidence
    0.99)"."""
    what = _KIND_WORDS.get(str(v.kind), str(v.kind))
    who = (" and ".join(v.nodes) if v.kind == "path" else ", ".join(v.nodes)) or "?"
    if v.nics:
        who += f" ({', '.join(v.nics[:4])}{', ...' if len(v.nics) > 4 else ''})"
    since = datetime.fromtimestamp(v.first_seen_ns / 1e9, UTC).strftime("%H:%M:%S") if v.first_seen_ns else "?"
    ev = v.evidence if isinstance(v.evidence, dict) else {}
    parts = [f"{who}: {what}"]
    sentence = _metric_sentence(v)
    if v.kind == "host-contention" and isinstance(ev.get("out_excess"), (int, float)):
        sentence = (f"its sends were {100 * float(ev['out_excess']):.0f} % slower than usual on "
                    f"{len(ev.get('slow_out_nics') or [])} NICs, what it receives "
                    f"{100 * float(ev.get('in_excess') or 0):.0f} %")
    if sentence:
        parts.append(sentence)
    parts.append(f"over {ops} operator{'s' if ops != 1 else ''} since {since} UTC (confidence {v.confidence:.2f})")
    return ", ".join(parts)


@dataclasses.dataclass
class _Open:
    incident: Incident
    ops: set[tuple[Any, Any]]
    max_ops: int


class IncidentTracker:
    """The incidents of one job, fed its verdicts in emission order."""

    def __init__(self, job: str, *, clock: Callable[[], int] = time.time_ns) -> None:
        self.job = job
        self.clock = clock
        self.open: dict[str, _Open] = {}
        self.last_ns = 0
        self.opened = 0
        self.reported: collections.deque[Incident] = collections.deque(maxlen=REPORTED)
        """Incidents another worker resolved for this job (a takeover read them back): a
        rebuild that finds the same fault again in the same stretch of the job goes on with
        their ids (:meth:`resume`)."""
        self.resolved: collections.deque[Incident] = collections.deque(maxlen=REPORTED)
        """Incidents this tracker resolved lately (:meth:`known`)."""

    def observe(self, verdicts: Iterable[Verdict]) -> list[Incident]:
        """State changes caused by ``verdicts`` (open, updated, resolved), in order."""
        out: list[Incident] = []
        for v in verdicts:
            decided = v.window.get("decided_at_ns") if isinstance(v.window, dict) else None
            if isinstance(decided, int):
                self.last_ns = max(self.last_ns, decided)
            if v.status == "anomaly":
                out += self._anomaly(v)
            elif v.status == "cleared":
                cur = self._match(v)
                if cur is not None:
                    out.append(self._resolve(cur, "evidence-stopped", decided if isinstance(decided, int) else None))
        return out

    def resume(self, inc: Incident) -> None:
        """Go on with an incident that another worker announced (a rebalance moved the job
        here). The job's state is rebuilt from its committed input,
        which need not open the fault's incident at the same first operator as the live run
        did (the live aligner released operators whose ranks were late on wall-clock
        idleness, the rebuild judges them all at once: the soak saw a gpu-slow job's
        incident opened at seq 36 live and again at seq 56 by the survivor, two ids for one
        fault). The id the world has seen stays: an incident the rebuild opened for the
        same fault (same family, a node in common) gives way to it. A resolved one is kept
        aside: should the rebuild's verdicts find that fault again before the time it was
        resolved at (trace time: the same stretch of the job, judged anew), they go on
        under its id, silently until they change something (the soak's second id came from
        a survivor whose predecessor had opened and resolved the fault before it died)."""
        if inc.id in self.open:
            return  # the rebuild opened it under the same id
        fam = kind_family(inc.kind)
        same = [iid for iid, o in self.open.items()
                if kind_family(o.incident.kind) == fam and set(o.incident.nodes) & set(inc.nodes)]
        if inc.state == "resolved":
            self.reported.append(inc)
            end = inc.resolved_at_ns if inc.resolved_at_ns is not None else inc.last_seen_ns
            same = [iid for iid in same if self.open[iid].incident.first_seen_ns <= end]
            if not same:
                return
            inc = dataclasses.replace(inc, state="open", resolution=None, resolved_at_ns=None)
        for iid in same:
            del self.open[iid]
        self.open[inc.id] = _Open(inc, set(), inc.ops)
        self.last_ns = max(self.last_ns, inc.last_seen_ns)

    def _reported(self, v: Verdict) -> Incident | None:
        """A resolved incident of another worker that ``v`` finds again: the same family, a
        node in common, and ``v`` first seen before that incident was resolved."""
        fam, nodes = kind_family(v.kind), set(v.nodes)
        for inc in self.reported:
            if (kind_family(inc.kind) == fam and nodes & set(inc.nodes) and inc.resolved_at_ns is not None
                    and v.first_seen_ns <= inc.resolved_at_ns):
                return inc
        return None

    def finish(self, end_ns: int | None = None) -> list[Incident]:
        """The job (or the input) ended: every open incident is resolved."""
        at = end_ns if end_ns is not None else self.last_ns
        return [self._resolve(cur, "job-ended", at) for cur in list(self.open.values())]

    def _match(self, v: Verdict) -> _Open | None:
        nodes = set(v.nodes)
        key = incident_key(v)
        exact = [o for o in self.open.values()
                 if (o.incident.kind, o.incident.level, tuple(sorted(o.incident.nodes))) == key]
        if exact:
            return exact[0]
        fam = kind_family(v.kind)
        near = [o for o in self.open.values() if kind_family(o.incident.kind) == fam and nodes & set(o.incident.nodes)]
        return near[0] if near else None

    def _anomaly(self, v: Verdict) -> list[Incident]:
        win = v.window if isinstance(v.window, dict) else {}
        ev = v.evidence if isinstance(v.evidence, dict) else {}
        seen = {(r.get("comm_id"), r.get("seq")) for r in ev.get("findings") or [] if isinstance(r, dict)}
        n_ops = max(int(ev.get("outlier_ops") or 0), int(win.get("ops") or 0))
        decided = win.get("decided_at_ns")
        last = decided if isinstance(decided, int) else self.last_ns
        cur = self._match(v)
        if cur is None:
            again = self._reported(v)
            if again is not None:
                self.open[again.id] = _Open(dataclasses.replace(again, state="open", resolution=None,
                                                                resolved_at_ns=None), seen, n_ops)
                return []
            comm = win.get("comm_id")
            first = {"comm_id": comm[0] if isinstance(comm, list) and comm else comm, "seq": win.get("first_seq")}
            iid = incident_id(self.job, str(v.kind), str(v.level), v.nodes, first["comm_id"], first["seq"])
            ops = max(n_ops, len(seen))
            inc = Incident(id=iid, job=self.job, state="open", kind=str(v.kind), level=str(v.level),
                           nodes=list(v.nodes), ranks=list(v.ranks), nics=list(v.nics), confidence=v.confidence,
                           summary=summary(v, ops), evidence=ev, first_op=first, ops=ops, updates=0,
                           first_seen_ns=v.first_seen_ns, last_seen_ns=last, emitted_at=self.clock())
            self.open[iid] = _Open(inc, seen, n_ops)
            self.opened += 1
            return [inc]
        old = cur.incident
        cur.ops |= seen
        cur.max_ops = max(cur.max_ops, n_ops)
        ops = max(cur.max_ops, len(cur.ops))
        ranks = sorted(set(old.ranks) | set(v.ranks))
        nics = sorted(set(old.nics) | set(v.nics))
        changed = ((v.kind, v.level, list(v.nodes)) != (old.kind, old.level, old.nodes) or ranks != sorted(old.ranks)
                   or nics != sorted(old.nics) or abs(v.confidence - old.confidence) >= CONFIDENCE_STEP)
        new = dataclasses.replace(
            old, kind=str(v.kind), level=str(v.level), nodes=list(v.nodes), ranks=ranks, nics=nics,
            evidence=ev, ops=ops, last_seen_ns=max(old.last_seen_ns, last), summary=summary(v, ops),
            confidence=v.confidence if changed else old.confidence)
        if not changed:
            cur.incident = new  # the latest evidence is kept, but nothing to announce
            return []
        cur.incident = dataclasses.replace(new, state="updated", updates=old.updates + 1, emitted_at=self.clock())
        return [cur.incident]

    def known(self) -> list[Incident]:
        """What this tracker has announced and another must not announce again: its open
        incidents, those it resolved lately, and those it was told of (:meth:`resume`)."""
        return [*self.reported, *self.resolved, *(o.incident for o in self.open.values())]

    def _resolve(self, cur: _Open, why: str, at: int | None) -> Incident:
        del self.open[cur.incident.id]
        inc = cur.incident
        done = dataclasses.replace(inc, state="resolved", resolution=why,
                                   resolved_at_ns=at if at is not None else inc.last_seen_ns,
                                   emitted_at=self.clock())
        self.resolved.append(done)
        return done
