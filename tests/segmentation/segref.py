"""Naive pure-Python reference of the segmentation rules (docs/segmentation.md), one
operator at a time, to check the numba kernel against."""

from __future__ import annotations

import math

COMPLETE, INCOMPLETE = 1, 2


def bounds(need: int, rel: float = 1e-3, abs_bytes: int = 4096) -> tuple[int, int]:
    return max(0, math.floor((1.0 - rel) * need) - abs_bytes), math.floor(rel * need) + abs_bytes


def reference(rows: list[tuple[int, int]], need: list[int], gap: int, stall: int,
              rel: float = 1e-3, abs_bytes: int = 4096, earliest: list[int] | None = None,
              merge: int | None = None) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """rows: (epoch, bytes) ascending; need: expected bytes per operator, in order.
    Returns per operator (start, end, active epochs, bytes, status) and the extra bytes."""
    merge = stall if merge is None else min(merge, stall)
    out = []
    i = 0
    carry = None  # bytes replacing rows[i]'s when a split crossing epoch is shared
    for k in range(len(need)):
        thr, slack = bounds(need[k], rel, abs_bytes)
        has_next = k + 1 < len(need)
        # the next operator's data cannot be on the wire before its host issue epoch
        en = earliest[k + 1] if (has_next and earliest is not None) else -(1 << 62)
        if i >= len(rows):
            out.append((-1, -1, 0, 0, INCOMPLETE))
            continue

        def whole(taken, thr=thr):
            cum = sum(b for _, b in taken)
            return (taken[0][0], taken[-1][0], len(taken), cum, COMPLETE if cum >= thr else INCOMPLETE)

        taken: list[tuple[int, int]] = []
        cum = 0
        cross = None  # (row index, epoch, active epochs so far, surplus)
        tent = None   # index into taken where the rows after a within-tolerance pause start
        result = None
        j = i
        while j < len(rows):
            e, b = rows[j]
            if j == i and carry is not None:
                b = carry
            if taken:
                idle = e - taken[-1][0] - 1
                # rows before the next operator's issue, after a short enough gap, are still
                # this operator's (late retransmissions)
                if ((idle >= gap and cum >= need[k]) or idle > stall) and not (idle <= merge and e < en):
                    result, i, carry = whole(taken), j, None
                    break
                if idle >= gap and thr <= cum < need[k] and tent is None:
                    tent = len(taken)
                if tent is not None and cum + b > need[k] + slack:
                    if rows[i + tent][0] >= en:
                        result = (taken[0][0], taken[tent - 1][0], tent, sum(x for _, x in taken[:tent]), COMPLETE)
                        i, carry = i + tent, None
                        break
                    tent = None
                if cross is not None and has_next and cum + b - need[k] > slack and e >= en:
                    cj, ce, cact, surplus = cross
                    # the first pause (idle epoch) after the crossing at or after the next
                    # operator's issue, if any, is the boundary
                    seq_e = [x for x, _ in taken] + [e]
                    after = [t for t in range(cact, len(seq_e)) if seq_e[t] - seq_e[t - 1] > 1 and seq_e[t] >= en]
                    if not after and ce < en:
                        after = [t for t in range(cact, len(seq_e)) if seq_e[t] >= en]
                    if after:
                        t = after[0]
                        result = (taken[0][0], taken[t - 1][0], t, sum(x for _, x in taken[:t]), COMPLETE)
                        i, carry = i + t, None
                    elif surplus > 0:
                        result = (taken[0][0], ce, cact, need[k], COMPLETE)
                        i, carry = cj, surplus
                    else:
                        result = (taken[0][0], ce, cact, need[k] + surplus, COMPLETE)
                        i, carry = cj + 1, None
                    break
            taken.append((e, b))
            cum += b
            if cross is None and cum >= need[k]:
                cross = (j, e, len(taken), cum - need[k])
                tent = None
            j += 1
        if result is None:
            result, i, carry = whole(taken), len(rows), None
        out.append(result)
    extra = 0
    for j in range(i, len(rows)):
        extra += carry if (j == i and carry is not None) else rows[j][1]
    return out, extra
