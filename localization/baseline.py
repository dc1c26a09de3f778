"""The operator-level baseline: what a tool that instruments the CCL (Greyhound / Holmes /
Flight-Recorder-like) can conclude from per-rank operator start and end alone.

Its rules, each the best such tools use:

1. **Hang**: an operator some ranks never finish. A rank that never entered it is the
   culprit (compute-stop, as Flight Recorder's "who did not join"). If every rank entered,
   the hang is in communication but the operator view cannot say where: the communicator's
   nodes, group level.
2. **Latest starter** (HTA / Greyhound straggler rule): the rank that persistently enters
   operators last, by more than the clock-offset bound, is a compute straggler.
3. **Longest operator**: a rank whose own operator duration is persistently the longest,
   without having started before the median rank (which would only mean it waited), is
   network-slow.
4. **Slow collective, no rank stands out** (Holmes-like cross-iteration analysis): when a
   communicator's operator durations rise persistently above their own early baseline,
   blame the nodes common to every slowed communicator: one node if the intersection is a
   single node, else the group.

Start times are compared across nodes here (that is what operator-level tools do), but
only with margins well above the +-100 us clock offset: the latest-starter margin is
Pulse's own ``late_min_ns`` (5 ms; healthy compute jitter makes ranks start up to ~2 ms
apart, so a tighter margin alarms on every healthy run).

Thresholds are Pulse's own (``LocalizeParams``): a duration is long at ``act_ratio`` (1.3x)
the reference, a starter late at ``late_min_ns``, persistence ``persist_ops`` of
``window_ops`` - the same margins Pulse gets, so the comparison is of information, not of
tuning.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable
from typing import Any

import numpy as np

from pulse.records import OpLevel, Verdict

from .params import LocalizeParams

BASELINE_OPS = 16
"""Operators of a (comm, kind) class that form its own baseline duration (several steps:
pipeline sends alternate forward and backward sizes, gradient buckets differ)."""


def baseline_localize(oplevel_records: Iterable[OpLevel], params: LocalizeParams | None = None,
                      *, job: str | None = None) -> list[Verdict]:
    p = params or LocalizeParams()
    ops: dict[tuple[str, int], dict[int, OpLevel]] = defaultdict(dict)
    members: dict[str, dict[int, str]] = defaultdict(dict)
    nranks: dict[str, int] = {}
    for r in oplevel_records:
        job = job if job is not None else r.job
        ops[(r.comm_id, r.seq)][r.rank] = r
        members[r.comm_id][r.rank] = r.node
        nranks[r.comm_id] = r.nranks
    out: list[Verdict] = []
    late_win: dict[str, deque[bool]] = defaultdict(lambda: deque(maxlen=p.window_ops))
    long_win: dict[str, deque[bool]] = defaultdict(lambda: deque(maxlen=p.window_ops))
    late_first: dict[str, int] = {}
    long_first: dict[str, int] = {}
    class_base: dict[tuple[str, str], list[float]] = defaultdict(list)
    slow_win: dict[str, deque[bool]] = defaultdict(lambda: deque(maxlen=p.window_ops))
    slow_first: dict[str, int] = {}
    alarmed: set[tuple[str, tuple[str, ...]]] = set()
    job = job or ""

    def emit(kind: str, level: str, nodes: list[str], ranks: list[int], evidence: dict[str, Any],
             window: dict[str, Any], first_seen: int, at_ns: int) -> None:
        key = (kind, tuple(nodes))
        if key in alarmed:
            return
        alarmed.add(key)
        out.append(Verdict(job=job, status="anomaly", kind=kind, level=level, nodes=nodes, ranks=ranks, nics=[],
                           confidence=0.6 if level == "node" else 0.4, evidence=evidence,
                           window={**window, "decided_at_ns": at_ns}, first_seen_ns=first_seen,
                           emitted_at=time.time_ns(), method="baseline"))

    order = sorted(ops, key=lambda k: (min(r.start_ns for r in ops[k].values()), k))
    for comm, seq in order:
        recs = ops[(comm, seq)]
        ranks = sorted(recs)
        start = np.array([recs[r].start_ns for r in ranks], dtype=np.float64)
        done = [recs[r].end_ns is not None for r in ranks]
        win = {"comm_id": comm, "first_seq": seq, "last_seq": seq, "ops": 1}
        at = int(start.max())
        if not all(done) or len(recs) < nranks[comm]:
            absent = sorted(set(range(nranks[comm])) - set(recs))
            if absent and not all(done):
                nodes = sorted({members[comm].get(r, "?") for r in absent} - {"?"})
                if nodes:
                    emit("compute-stop", "node" if len(nodes) == 1 else "group", nodes, absent,
                         {"rule": "never entered a hung operator", "absent_ranks": [int(a) for a in absent]}, win, at, at)
                    continue
            if not all(done):
                nodes = sorted(set(members[comm].values()))
                emit("network-stop", "group", nodes, ranks,
                     {"rule": "hung operator, every rank entered: undetermined"}, win, at, at)
            continue
        end = np.array([recs[r].end_ns for r in ranks], dtype=np.float64)
        dur = end - start
        med = float(np.median(dur))
        late_here = False
        if len(ranks) >= 3:
            i = int(np.argmax(start))
            late_here = start[i] - float(np.median(np.delete(start, i))) >= max(p.late_min_ns, 0.1 * med)
        # Rule 4: the communicator's own history (a late starter explains long durations:
        # its peers waited for it). Not for two-rank point-to-point operators: their
        # duration is mostly the wait for the partner to post its receive, which the
        # pipeline schedule varies by far more than any threshold.
        cls = (comm, recs[ranks[0]].kind)
        base = class_base[cls]
        if len(ranks) < max(p.min_ranks, 3):
            pass
        elif len(base) < BASELINE_OPS:
            base.append(med)
        else:
            slow = med >= p.act_ratio * float(np.median(base)) and not late_here
            slow_win[comm].append(slow)
            if slow:
                slow_first.setdefault(comm, int(start.min()))
            if sum(slow_win[comm]) >= p.persist_ops and sum(slow_win[comm]) >= p.persist_frac * len(slow_win[comm]):
                slowed = [c for c, w in slow_win.items() if sum(w) >= p.persist_ops]
                common = set.intersection(*(set(members[c].values()) for c in slowed))
                nodes = sorted(common) if common else sorted(set(members[comm].values()))
                emit("network-slow", "node" if len(nodes) == 1 else "group", nodes, [],
                     {"rule": "communicator durations above their baseline", "slowed_comms": slowed,
                      "median_duration_ns": float(med), "baseline_ns": float(np.median(base))},
                     win, slow_first[comm], int(end.max()))
        if len(ranks) < max(p.min_ranks, 3):
            continue
        # Rule 2: latest starter.
        i = int(np.argmax(start))
        late = start[i] - float(np.median(np.delete(start, i)))
        node = recs[ranks[i]].node
        for n in set(members[comm].values()):
            late_win[n].append(n == node and late >= max(p.late_min_ns, 0.1 * med))
        if late >= p.late_min_ns:
            late_first.setdefault(node, int(start[i]))
        w = late_win[node]
        if sum(w) >= p.persist_ops and sum(w) >= p.persist_frac * len(w):
            emit("compute-slow", "node", [node], [ranks[i]],
                 {"rule": "latest starter", "lateness_ns": float(late), "late_ops": int(sum(w))}, win, late_first[node],
                 int(end.max()))
        # Rule 3: longest operator that did not start first.
        j = int(np.argmax(dur))
        others = np.delete(dur, j)
        # a rank that started before the median waited for the others: that is not slowness
        # (starts within twice the clock-offset bound of the median count as on time)
        on_time = start[j] >= float(np.median(start)) - p.late_min_ns / 25
        longest = dur[j] >= p.act_ratio * float(np.median(others)) and on_time
        lnode = recs[ranks[j]].node
        for n in set(members[comm].values()):
            long_win[n].append(n == lnode and longest)
        if longest:
            long_first.setdefault(lnode, int(start[j]))
        w = long_win[lnode]
        if sum(w) >= p.persist_ops and sum(w) >= p.persist_frac * len(w):
            emit("network-slow", "node", [lnode], [ranks[j]],
                 {"rule": "longest operator", "duration_ns": float(dur[j]),
                  "peers_median_ns": float(np.median(others))}, win, long_first[lnode], int(end.max()))
    if not out and ops:
        out.append(Verdict(job=job, status="healthy", kind=None, level=None,
                           nodes=sorted({n for m in members.values() for n in m.values()}), ranks=[], nics=[],
                           confidence=0.5, evidence={"ops": len(ops), "rules": dict(Counter())},
                           window={"comm_id": None, "first_seq": None, "last_seq": None, "ops": len(ops)},
                           first_seen_ns=0, emitted_at=time.time_ns(), method="baseline"))
    return out
