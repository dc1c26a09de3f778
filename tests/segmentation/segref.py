"""Naive pure-Python reference of the segmentation rules (docs/segmentation.md), one
operator at a time, to check the numba kernel against."""

from __future__ import annotations

import math

COMPLETE, INCOMPLETE = 1, 2
FAR = 1 << 62


def bounds(need: int, rel: float = 1e-3, abs_bytes: int = 4096) -> tuple[int, int]:
    return max(0, math.floor((1.0 - rel) * need) - abs_bytes), math.floor(rel * need) + abs_bytes


def split_at_crossing(cross: tuple | None, taken: list, row_b: tuple | None, slack: int) -> bool:
    """Rule 4b: the crossing epoch is the last taken, carries more than the slack beyond
    the volume, and brought the next operator's start burst."""
    return (cross is not None and cross[2] == len(taken) and row_b is not None
            and row_b[0] == cross[0] and cross[3] > slack)


def reference(rows: list[tuple], need: list[int], gap: int, stall: int,
              rel: float = 1e-3, abs_bytes: int = 4096, earliest: list[int] | None = None,
              merge: int | None = None, burst_rx: int = 0,
              fills: list[bool] | None = None) -> tuple[list[tuple[int, int, int, int, int]], int]:
    """rows: (epoch, tx bytes) or (epoch, tx bytes, rx bytes), ascending epochs; a row with
    no tx bytes is an rx-only epoch (never active; a CTS burst when rx >= burst_rx > 0).
    need: expected bytes per operator, in order; fills: per operator, whether it posts every
    receive slot at its start (None: none does). Returns per operator (start, end, active
    epochs, bytes, status) and the extra bytes."""
    rows = [(r[0], r[1], r[2] if len(r) > 2 else 0) for r in rows]
    merge = stall if merge is None else min(merge, stall)
    out = []
    i = 0
    carry = None  # bytes replacing rows[i]'s when a split crossing epoch is shared
    for k in range(len(need)):
        thr, slack = bounds(need[k], rel, abs_bytes)
        has_next = k + 1 < len(need)
        # the next operator's data cannot be on the wire before its host issue epoch
        en = earliest[k + 1] if (has_next and earliest is not None) else -FAR
        # CTS-burst rule: only for a next operator that fills every slot
        elig = burst_rx > 0 and has_next and fills is not None and bool(fills[k + 1])

        def whole(taken, thr=thr):
            if not taken:
                return (-1, -1, 0, 0, INCOMPLETE)
            cum = sum(b for _, b, _ in taken)
            return (taken[0][0], taken[-1][0], len(taken), cum, COMPLETE if cum >= thr else INCOMPLETE)

        def upto(taken, t):
            """The operator made of taken[:t]."""
            return (taken[0][0], taken[t - 1][0], t, sum(x for _, x, _ in taken[:t]), COMPLETE)

        taken: list[tuple[int, int, int]] = []  # (epoch, bytes, row index)
        cum = 0
        cross = None  # (row index, epoch, active epochs so far, surplus)
        tent = None   # index into taken where the rows after a within-tolerance pause start
        tent_row = tent_e = 0  # that row's index and epoch
        bz = -FAR     # epoch of the latest CTS burst since the operator started
        rxs = False   # the operator's rows showed rx bytes
        row_b = None  # (row index, len(taken)) of the first data row after a burst after the crossing
        result = None

        j = i
        while j < len(rows):
            e, b, rx = rows[j]
            if j == i and carry is not None:
                b = carry
            if taken and rx > 0:
                rxs = True
                if burst_rx > 0 and rx >= burst_rx:
                    bz = e
            if b == 0:
                j += 1
                continue
            ce = cross[1] if cross is not None else None
            wait_b = (elig and cross is not None and rxs and bz < ce and cum - need[k] > slack
                      and e <= max(ce, en) + merge)
            if cross is not None and elig and row_b is None and bz >= ce and e >= en:
                row_b = (j, len(taken))
            if taken:
                idle = e - taken[-1][0] - 1
                if idle > 0 and split_at_crossing(cross, taken, row_b, slack):
                    result, i, carry = (taken[0][0], cross[1], cross[2], need[k], COMPLETE), cross[0], cross[3]
                    break
                # rows before the next operator's issue, after a short enough gap, are still
                # this operator's (late retransmissions); so are rows before the next
                # operator's start burst when this one carries surplus
                if (((idle >= gap and cum >= need[k]) or idle > stall) and not (idle <= merge and e < en)
                        and not (idle <= merge and wait_b)):
                    result, i, carry = whole(taken), j, None
                    break
                if idle >= gap and thr <= cum < need[k] and tent is None:
                    tent, tent_row, tent_e = len(taken), j, e
                if tent is not None and cross is not None and idle > 0:
                    tent = None  # reached the volume, then paused: that was the tail
                if tent is not None and cum + b > need[k] + slack:
                    if tent_e >= en:
                        result = upto(taken, tent)
                        i, carry = tent_row, None
                        break
                    tent = None
                if cross is not None and has_next and cum + b - need[k] > slack and e >= en:
                    cj, ce, cact, surplus = cross
                    # the first pause (idle epoch) after the crossing at or after the next
                    # operator's issue, if any, is the boundary
                    seq_e = [x for x, _, _ in taken] + [e]
                    seq_j = [x for _, _, x in taken] + [j]
                    after = [t for t in range(cact, len(seq_e)) if seq_e[t] - seq_e[t - 1] > 1 and seq_e[t] >= en]
                    if not after and ce < en:
                        after = [t for t in range(cact, len(seq_e)) if seq_e[t] >= en]
                    rn = seq_j[after[0]] if after else (cj if surplus > 0 else cj + 1)
                    hold = False
                    if elig and rxs and row_b is not None and row_b[0] > rn:
                        # the next operator's data cannot precede its receiver's start burst
                        result = upto(taken, row_b[1])
                        i, carry = row_b[0], None
                    elif row_b is None and wait_b:
                        hold = True
                    elif after:
                        t = after[0]
                        result = upto(taken, t)
                        i, carry = seq_j[t], None
                    elif surplus > 0:
                        result = (taken[0][0], ce, cact, need[k], COMPLETE)
                        i, carry = cj, surplus
                    else:
                        result = (taken[0][0], ce, cact, need[k] + surplus, COMPLETE)
                        i, carry = cj + 1, None
                    if not hold:
                        break
            if not taken:
                bz, rxs, row_b = -FAR, False, None
            taken.append((e, b, j))
            cum += b
            if cross is None and cum >= need[k]:
                cross = (j, e, len(taken), cum - need[k])  # a pending tent stays
                if elig and bz >= e and e >= en:
                    row_b = (j, len(taken) - 1)
            j += 1
        if result is None and split_at_crossing(cross, taken, row_b, slack):
            result, i, carry = (taken[0][0], cross[1], cross[2], need[k], COMPLETE), cross[0], cross[3]
        if result is None:
            result, i, carry = whole(taken), len(rows), None
        out.append(result)
    extra = 0
    for j in range(i, len(rows)):
        extra += carry if (j == i and carry is not None) else rows[j][1]
    return out, extra
