"""Score flow segments against a simulator's truth ``segments`` (tests only)."""

from __future__ import annotations

import dataclasses

import numpy as np
from pulse.segmentation.batch import FlowSegments


@dataclasses.dataclass
class Score:
    complete_truth: int
    within: int
    missing: list
    """Truth (flow, op) rows that segmentation does not have."""
    wrong_status: list
    """(key, truth complete, segmented complete)."""
    off: list
    """(key, truth start/end epochs, segmented start/end epochs) beyond tolerance."""
    expected_mismatch: list
    extra_segments: int

    @property
    def boundary_rate(self) -> float:
        return self.within / self.complete_truth if self.complete_truth else 1.0


def score(segs: FlowSegments, truth: dict, epoch_ns: int, tol_epochs: int = 1) -> Score:
    t = truth["segments"]
    idx = {(segs.node[i], segs.nic[i], int(segs.flow[i]), segs.comm_id[i], int(segs.seq[i])): i
           for i in range(len(segs))}
    missing, wrong, off, exp_mm = [], [], [], []
    within = complete_truth = 0
    seen = set()
    for j in range(len(t["node"])):
        key = (t["node"][j], t["nic"][j], int(t["flow"][j]), t["comm_id"][j], int(t["seq"][j]))
        i = idx.get(key)
        if i is None:
            missing.append(key)
            continue
        seen.add(key)
        if "expected_bytes" in t and int(t["expected_bytes"][j]) != int(segs.expected[i]):
            exp_mm.append((key, int(t["expected_bytes"][j]), int(segs.expected[i])))
        tc = bool(t["complete"][j])
        if tc != bool(segs.complete[i]):
            wrong.append((key, tc, bool(segs.complete[i])))
        if not tc:
            continue
        complete_truth += 1
        ds = abs(int(segs.start_ns[i]) - int(t["start_ns"][j]))
        de = abs(int(segs.end_ns[i]) - int(t["end_ns"][j]))
        if segs.started[i] and ds <= tol_epochs * epoch_ns and de <= tol_epochs * epoch_ns:
            within += 1
        else:
            off.append((key, (int(t["start_ns"][j]) // epoch_ns, int(t["end_ns"][j]) // epoch_ns),
                        (int(segs.start_ns[i]) // epoch_ns, int(segs.end_ns[i]) // epoch_ns)))
    extra = sum(1 for k in idx if k not in seen)
    return Score(complete_truth, within, missing, wrong, off, exp_mm, extra)


def summary(s: Score) -> str:
    return (f"boundaries {s.within}/{s.complete_truth} ({100 * s.boundary_rate:.2f} %), "
            f"missing {len(s.missing)}, wrong status {len(s.wrong_status)}, off {len(s.off)}, "
            f"expected mismatches {len(s.expected_mismatch)}, extra segments {s.extra_segments}")


def to_array(x) -> np.ndarray:
    return np.asarray(x)
