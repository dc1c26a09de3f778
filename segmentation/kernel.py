"""The per-flow segmentation kernel: volume condition + time-interval condition.

Layers: ``_kernel`` (numba, arrays and scalars only) -> ``run_kernel`` (driver: allocates
outputs, picks dtypes) -> ``segment_rows`` (validated public function).

Rules, per flow (rows = the flow's active epochs, ascending, with their data bytes; ops =
the operators the flow carries, in order, with ``need`` = expected bytes, ``thr`` = the
volume condition threshold, ``slack`` = surplus still taken as the same operator's,
``earliest`` = the first epoch the operator's data can be on the wire, from its host issue
time; docs/segmentation.md has the full rationale):

1. an operator starts at the first active epoch after the previous one ended;
2. it ends at its last active epoch before the first idle gap of >= ``gap`` epochs after
   its bytes reached ``need`` (surplus before that gap - retransmissions, control - stays
   with it), unless the row after the gap precedes the next operator's ``earliest`` and
   the gap is <= ``merge`` epochs (then it is still this operator's: late retransmission);
3. reached ``thr`` but not ``need``, then such a gap: it ended there unless what follows
   is only its missing tail (at most ``need - cum + slack`` bytes before the next gap);
4. back-to-back operators (no such gap): once the bytes beyond ``need`` exceed ``slack``
   at a row at/after the next operator's ``earliest``, the operator is split: at the first
   pause (idle epoch) after the crossing at/after ``earliest`` if any; else at the crossing
   epoch if it is at/after ``earliest`` (the operator gets exactly ``need``, the crossing
   epoch's surplus starts the next operator in that same epoch); else at the first row
   at/after ``earliest``; 4b: a crossing epoch that alone carries more than ``slack``
   beyond ``need``, at/after ``earliest`` and with the next operator's start burst (rule
   7), then a pause: split at the crossing epoch the same way (not kept as resends);
5. a gap of more than ``stall`` epochs closes the operator: complete iff it reached ``thr``,
   else incomplete with the bytes seen (a hang);
6. at the end of the data (``final``) a started operator is complete iff it reached
   ``thr``; operators that never started are incomplete with 0 bytes; rows beyond the last
   operator are counted as extra bytes;
7. CTS bursts (rows carry rx bytes; ``burst_rx`` > 0): the next operator's data cannot
   precede its receiver's start burst, so a split is never placed before the first data
   row after a burst that followed the crossing, and an operator carrying surplus beyond
   ``slack`` keeps the rows until such a burst shows (at most ``merge`` epochs).

The kernel is resumable: without ``final``, decisions that need data not seen yet (a gap
after the last row, whether a next operator exists) are left open, and per flow it reports
the row to resume from (``consumed``, with ``carry`` bytes replacing that row's bytes when
a split crossing epoch is shared). Running it on a prefix, then again from the resume
point on the rest, gives the same closed operators as one run on everything: this is how
the streaming form equals the batch form.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
from pulse.segmentation.params import SegmentationError

OPEN, COMPLETE, INCOMPLETE = 0, 1, 2
FAR = np.int64(1) << 62
"""Watermark meaning 'no more data will come' (final)."""
RX_SHIFT = 40
TX_MASK = (np.int64(1) << RX_SHIFT) - 1
RX_CAP = (1 << 16) - 1
"""A row's bytes value packs tx (data) bytes in the low 40 bits and the flow's rx bytes
in that epoch (capped at RX_CAP; for a send flow: CTS/ACK coming back) above them. Rows
with no tx bytes are rx-only epochs kept for the CTS-burst rule; they are never active."""


def pack_rows(tx: np.ndarray, rx: np.ndarray | None) -> np.ndarray:
    """tx and rx bytes per row -> the kernel's packed int64 value."""
    tx = np.asarray(tx, np.int64)
    if rx is None:
        return tx
    return tx | (np.minimum(np.asarray(rx, np.int64), RX_CAP) << RX_SHIFT)


@numba.njit(cache=True, inline="always")
def _close(k, start, end, act, vol, status, o_start, o_end, o_act, o_vol, o_status):  # pragma: no cover
    o_start[k] = start
    o_end[k] = end
    o_act[k] = act
    o_vol[k] = vol
    o_status[k] = status


@numba.njit(cache=True, inline="always")
def _first_burst(ep, by, lo, i, after, brx):  # pragma: no cover - numba
    # the earliest epoch > ``after`` among rows lo..i-1 with a CTS burst (>= brx rx bytes)
    g = np.int64(-1)
    if brx <= 0:
        return g
    j = i - 1
    while j >= lo and ep[j] > after:
        if (by[j] >> RX_SHIFT) >= brx:
            g = ep[j]
        j -= 1
    return g


@numba.njit(cache=True, nogil=True)
def _kernel(row_ptr, ep, by, carry_in, op_ptr, need, thr, slack, earliest, gap, stall, merge, wm, final,
            brx, fills, grant_in, o_start, o_end, o_act, o_vol, o_status, o_grant, f_consumed, f_carry, f_next,
            f_extra, f_grant):  # pragma: no cover - numba
    nf = row_ptr.shape[0] - 1
    for f in range(nf):
        lo = row_ptr[f]
        hi = row_ptr[f + 1]
        k = op_ptr[f]
        kend = op_ptr[f + 1]
        ovr_i = lo if carry_in[f] >= 0 else -1
        ovr_b = carry_in[f]
        started = False
        cum = np.int64(0)
        start = np.int64(0)
        last = np.int64(0)
        act = np.int64(0)
        crossed = False
        ce = np.int64(0)
        act_c = np.int64(0)
        s_c = np.int64(0)
        row_c = lo
        tent = False
        row_t = lo
        last_t = np.int64(0)
        act_t = np.int64(0)
        cum_t = np.int64(0)
        row_e = np.int64(-1)
        last_e = np.int64(0)
        act_e = np.int64(0)
        cum_e = np.int64(0)
        row_g = np.int64(-1)
        last_g = np.int64(0)
        act_g = np.int64(0)
        cum_g = np.int64(0)
        consumed = lo
        carry = ovr_b if ovr_i == lo else np.int64(-1)
        extra = np.int64(0)
        # grant rule (see run_kernel): gr = the first burst epoch since the last operator
        # ended, among the rows scanned; g_cons = its value for the rows before ``consumed``
        gr = grant_in[f]
        g_cons = gr
        blocked = False
        kc = np.int64(-1)
        need_k = np.int64(0)
        thr_k = np.int64(0)
        slack_k = np.int64(0)
        nxt = False
        e_next = np.int64(0)
        # CTS-burst rule (see run_kernel): bz = epoch of the latest burst seen since the
        # operator started, rxs = its rows showed rx bytes, row_b = the first data row at or
        # after a burst that followed the crossing (and the next operator's issue).
        elig = False
        bz = -FAR
        rxs = False
        row_b = np.int64(-1)
        last_b = np.int64(0)
        act_b = np.int64(0)
        cum_b = np.int64(0)
        i = lo
        while i < hi:
            if k != kc:
                # this operator's parameters in locals: the loop below runs per row
                kc = k
                if k < kend:
                    need_k = need[k]
                    thr_k = thr[k]
                    slack_k = slack[k]
                nxt = k + 1 < kend
                e_next = earliest[k + 1] if nxt else -FAR
                elig = brx > 0 and nxt and fills[k + 1]
            if started and not crossed and not tent and ovr_i < i:
                # Fast path for the bulk of an operator: accumulate until the row that
                # reaches the threshold or a stall, which the general rules below take.
                while i < hi:
                    e = ep[i]
                    raw = by[i]
                    b = raw & TX_MASK
                    if b == 0 or e - last - 1 > stall or cum + b >= thr_k:
                        break
                    if raw > TX_MASK:
                        rxs = True
                    cum += b
                    act += 1
                    last = e
                    i += 1
                if i >= hi:
                    break
            e = ep[i]
            raw = by[i]
            b = ovr_b if i == ovr_i else raw & TX_MASK
            if started and raw > TX_MASK:
                rxs = True
                if (raw >> RX_SHIFT) >= brx > 0:
                    bz = e
            if not started and gr < 0 and brx > 0 and (raw >> RX_SHIFT) >= brx:
                gr = e
            if b == 0:
                i += 1  # rx-only epoch: not active, only a possible CTS burst
                continue
            # Waiting for the receiver's start burst of the next operator (CTS-burst rule):
            # until it shows, what the flow sends after the crossing is still this operator's.
            wait_b = (elig and crossed and rxs and bz < ce and cum - need_k > slack_k
                      and e <= max(ce, e_next) + merge)
            if crossed and elig and row_b < 0 and bz >= ce and e >= e_next:
                row_b = i
                last_b = last
                act_b = act
                cum_b = cum
            if started:
                g = e - last - 1
                if g > 0 and crossed and last == ce and row_b == row_c and s_c > slack_k:
                    # Rule 4b: the crossing epoch alone carried more than the slack beyond
                    # the volume, at/after the next issue and with the next operator's start
                    # burst, then the flow paused: the surplus is the next operator's first
                    # data (both used the crossing epoch), not this one's resends.
                    started = False
                    _close(k, start, ce, act_c, need_k, 1, o_start, o_end, o_act, o_vol, o_status)
                    k += 1
                    ovr_i = row_c
                    ovr_b = s_c
                    i = row_c
                    carry = s_c
                    gr = _first_burst(ep, by, lo, i, o_end[k - 1], brx)
                    consumed = i
                    g_cons = gr
                    continue
                if (g >= gap and cum >= need_k) or g > stall:
                    if g <= merge and not nxt and not final:
                        blocked = True  # whether this is still ours depends on the next op
                        break
                    if (g > merge or not nxt or e >= e_next) and not (g <= merge and wait_b):
                        _close(k, start, last, act, cum, 1 if cum >= thr_k else 2, o_start, o_end, o_act, o_vol, o_status)
                        k += 1
                        started = False
                        gr = _first_burst(ep, by, lo, i, o_end[k - 1], brx)
                        consumed = i
                        g_cons = gr
                        carry = ovr_b if i == ovr_i else np.int64(-1)
                        continue
                if g >= gap and thr_k <= cum < need_k and not tent:
                    # Within tolerance of the volume, then a pause: the operator ended here
                    # unless what follows is only its small missing tail.
                    tent = True
                    row_t = i
                    last_t = last
                    act_t = act
                    cum_t = cum
                if tent and crossed and g > 0:
                    tent = False  # the tail reached the volume and the flow paused: it was the tail
                if tent and cum + b > need_k + slack_k:
                    if not nxt and not final:
                        blocked = True
                        break
                    if not nxt or ep[row_t] >= e_next:
                        _close(k, start, last_t, act_t, cum_t, 1, o_start, o_end, o_act, o_vol, o_status)
                        k += 1
                        started = False
                        i = row_t
                        gr = _first_burst(ep, by, lo, i, o_end[k - 1], brx)
                        consumed = i
                        g_cons = gr
                        carry = ovr_b if i == ovr_i else np.int64(-1)
                        continue
                    tent = False  # the next operator was not issued yet: still this one's
                if crossed and cum + b - need_k > slack_k and (not nxt or e >= e_next):
                    if nxt:
                        if row_g < 0 and g > 0:
                            row_g = i
                            last_g = last
                            act_g = act
                            cum_g = cum
                        if row_e < 0:
                            row_e = i
                            last_e = last
                            act_e = act
                            cum_e = cum
                        if row_g < 0 and ce < e_next:
                            # No pause, and the crossing precedes the next operator's issue:
                            # the surplus up to the issue is this operator's (retransmission).
                            row_g = row_e
                            last_g = last_e
                            act_g = act_e
                            cum_g = cum_e
                        rn = row_g if row_g >= 0 else (row_c if s_c > 0 else row_c + 1)
                        hold = False
                        if elig and rxs and row_b > rn:
                            # The next operator's data cannot precede its receiver's start
                            # burst: split there, not at the earlier candidate.
                            started = False
                            _close(k, start, last_b, act_b, cum_b, 1, o_start, o_end, o_act, o_vol, o_status)
                            k += 1
                            i = row_b
                            carry = ovr_b if i == ovr_i else np.int64(-1)
                        elif row_b < 0 and wait_b:
                            hold = True  # no start burst yet: this row is still this operator's
                        elif row_g >= 0:
                            started = False
                            # Traffic paused after the volume was reached: that pause,
                            # not the crossing, is the boundary.
                            _close(k, start, last_g, act_g, cum_g, 1, o_start, o_end, o_act, o_vol, o_status)
                            k += 1
                            i = row_g
                            carry = ovr_b if i == ovr_i else np.int64(-1)
                        elif s_c > 0:
                            # Both operators used the crossing epoch.
                            started = False
                            _close(k, start, ce, act_c, need_k, 1, o_start, o_end, o_act, o_vol, o_status)
                            k += 1
                            ovr_i = row_c
                            ovr_b = s_c
                            i = row_c
                            carry = s_c
                        else:
                            started = False
                            _close(k, start, ce, act_c, need_k + s_c, 1, o_start, o_end, o_act, o_vol, o_status)
                            k += 1
                            i = row_c + 1
                            carry = ovr_b if i == ovr_i else np.int64(-1)
                        if not hold:
                            gr = _first_burst(ep, by, lo, i, o_end[k - 1], brx)
                            consumed = i
                            g_cons = gr
                            continue
                    elif not final:
                        blocked = True
                        break
            if k >= kend:
                if final:
                    extra += b
                    i += 1
                    consumed = i
                    carry = np.int64(-1)
                    continue
                blocked = True
                break
            if not started:
                started = True
                start = e
                o_grant[k] = gr
                gr = np.int64(-1)
                cum = np.int64(0)
                act = np.int64(0)
                crossed = False
                tent = False
                row_g = np.int64(-1)
                row_e = np.int64(-1)
                bz = -FAR
                rxs = False
                row_b = np.int64(-1)
            if crossed and nxt and e >= e_next:
                if row_g < 0 and e - last > 1:
                    row_g = i
                    last_g = last
                    act_g = act
                    cum_g = cum
                if row_e < 0:
                    row_e = i
                    last_e = last
                    act_e = act
                    cum_e = cum
            cum += b
            act += 1
            last = e
            if not crossed and cum >= need_k:
                # A pending tentative end (rule 3) survives the crossing: bytes after the
                # pause that reach the volume are only its tail if the flow pauses again
                # before more than the slack follows; otherwise they were the next
                # operator's first bytes (a small first epoch), and the operator ended
                # before the pause.
                crossed = True
                ce = e
                act_c = act
                s_c = cum - need_k
                row_c = i
                row_g = -1
                row_e = -1
                if elig and bz >= e and e >= e_next:
                    row_b = i  # the start burst came with the crossing epoch: no constraint
            i += 1
        if started and not blocked:
            idle = wm[f] - last - 1
            # Closing on the idle gap needs to know that no later row can still be
            # this operator's: later rows lie at or after the watermark.
            safe = idle > merge or (k + 1 < kend and wm[f] >= earliest[k + 1])
            # ... nor can a later row still be held for the next operator's start burst
            held = (elig and crossed and rxs and bz < ce and cum - need[k] > slack[k] and idle <= merge
                    and wm[f] <= max(ce, e_next) + merge)
            split = crossed and last == ce and row_b == row_c and s_c > slack[k]  # rule 4b
            if (final or idle > stall or (idle >= gap and cum >= need[k] and safe and not held)) and split:
                _close(k, start, ce, act_c, need[k], 1, o_start, o_end, o_act, o_vol, o_status)
                k += 1
                if final:
                    # what the next call would do: the next operator starts in the crossing
                    # epoch (its start burst is there) with the surplus, and nothing follows
                    _close(k, ce, ce, 1, s_c, 1 if s_c >= thr[k] else 2, o_start, o_end, o_act, o_vol, o_status)
                    o_grant[k] = ce
                    k += 1
                    consumed = hi
                    carry = np.int64(-1)
                    g_cons = _first_burst(ep, by, lo, hi, ce, brx)
                else:
                    consumed = row_c
                    carry = s_c
                    g_cons = _first_burst(ep, by, lo, row_c, ce, brx)
            elif final or idle > stall or (idle >= gap and cum >= need[k] and safe and not held):
                _close(k, start, last, act, cum, 1 if cum >= thr[k] else 2, o_start, o_end, o_act, o_vol, o_status)
                k += 1
                consumed = hi
                g_cons = _first_burst(ep, by, lo, hi, last, brx)
                carry = np.int64(-1)
        if final:
            # the first operator that never started still got the grant seen since the
            # previous one ended: the receiver posted it, and the sender's NIC received
            # the burst (a receiver's NIC that died after granting stalls it at zero bytes)
            if k < kend:
                o_grant[k] = g_cons if started else gr  # started: closed above, g_cons after it
            while k < kend:
                o_start[k] = -1
                o_end[k] = -1
                o_act[k] = 0
                o_vol[k] = 0
                o_status[k] = 2
                k += 1
        f_consumed[f] = consumed
        f_carry[f] = carry
        f_next[f] = k
        f_extra[f] = extra
        f_grant[f] = g_cons


@dataclasses.dataclass
class KernelOut:
    """Per op slot: start/end epoch (-1 when it never started), active epochs, bytes,
    status (OPEN, COMPLETE, INCOMPLETE), grant epoch (-1 none); per flow: resume row, carry
    bytes (-1 none), next open op slot, extra bytes beyond the last operator, the grant state
    at the resume row (``grant_in`` of the next call)."""

    start: np.ndarray
    end: np.ndarray
    act: np.ndarray
    vol: np.ndarray
    status: np.ndarray
    consumed: np.ndarray
    carry: np.ndarray
    next_op: np.ndarray
    extra: np.ndarray
    grant: np.ndarray
    grant_next: np.ndarray


def run_kernel(row_ptr: np.ndarray, epochs: np.ndarray, nbytes: np.ndarray, op_ptr: np.ndarray,
               need: np.ndarray, thr: np.ndarray, slack: np.ndarray, *, gap: int, stall: int,
               merge: int | None = None, watermark: np.ndarray | None = None, final: bool = True,
               carry_in: np.ndarray | None = None, earliest: np.ndarray | None = None,
               burst_rx: int = 0, fills: np.ndarray | None = None, grant_in: np.ndarray | None = None) -> KernelOut:
    """Driver: contiguous int64 arrays in, outputs allocated here (no validation).

    ``nbytes`` are packed rows (``pack_rows``). ``burst_rx`` > 0 enables the CTS-burst rule
    for every operator followed by one that ``fills`` every receive slot at its start
    (per operator slot, :meth:`.params.SegmentParams.slot_fills`; None: none does): the
    receiver of a send flow starts an operator by granting all its slots at once (NCCL
    posts NCCL_STEPS receives, each a CTS back to the sender: >= ``burst_rx`` rx bytes in
    one epoch on the send flow), and the sender cannot put a byte of that operator on the
    wire before. So when the previous operator carries surplus (go-back-N resends) on a flow
    that shows rx, its boundary is not placed before that burst; the wait is bounded by
    ``merge`` epochs after the crossing / the next issue.

    Grants (also with ``burst_rx`` > 0): an operator's ``grant`` is the earliest CTS burst
    on its flow after the previous operator's last epoch and at or before its own first
    data epoch - the receiver granting its slots, which it may do long before the sender
    issues the operator. It is wire evidence that the flow's NIC received in that epoch
    (the localizer uses it to tell which end of a stalled link was up). ``grant_in`` per
    flow carries a burst seen before the resume row of a previous call."""
    nf = row_ptr.shape[0] - 1
    nk = need.shape[0]
    i64 = np.int64
    out = KernelOut(
        start=np.full(nk, -1, i64), end=np.full(nk, -1, i64), act=np.zeros(nk, i64),
        vol=np.zeros(nk, i64), status=np.zeros(nk, np.int8), consumed=np.zeros(nf, i64),
        carry=np.zeros(nf, i64), next_op=np.zeros(nf, i64), extra=np.zeros(nf, i64),
        grant=np.full(nk, -1, i64), grant_next=np.full(nf, -1, i64))
    gin = np.full(nf, -1, i64) if grant_in is None else np.ascontiguousarray(grant_in, i64)
    wm = np.full(nf, FAR, i64) if watermark is None else np.ascontiguousarray(watermark, i64)
    cin = np.full(nf, -1, i64) if carry_in is None else np.ascontiguousarray(carry_in, i64)
    early = np.full(nk, -FAR, i64) if earliest is None else np.ascontiguousarray(earliest, i64)
    full = np.zeros(nk, np.bool_) if fills is None else np.ascontiguousarray(fills, np.bool_)
    _kernel(np.ascontiguousarray(row_ptr, i64), np.ascontiguousarray(epochs, i64),
            np.ascontiguousarray(nbytes), cin, np.ascontiguousarray(op_ptr, i64),
            np.ascontiguousarray(need, i64), np.ascontiguousarray(thr, i64),
            np.ascontiguousarray(slack, i64), early, i64(gap), i64(stall),
            i64(stall if merge is None else min(merge, stall)), wm, bool(final),
            i64(burst_rx), full, gin, out.start, out.end, out.act, out.vol, out.status, out.grant,
            out.consumed, out.carry, out.next_op, out.extra, out.grant_next)
    return out


def volume_bounds(need: np.ndarray, rel: float, abs_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(thr, slack) per operator: reached at >= (1 - rel) x need - abs (docs/semantics.md);
    up to rel x need + abs bytes beyond need are still the same operator's surplus."""
    need = np.asarray(need, np.int64)
    thr = np.maximum(0, np.floor((1.0 - rel) * need).astype(np.int64) - abs_bytes)
    slack = np.floor(rel * need).astype(np.int64) + abs_bytes
    return thr, slack


def _ptr(name: str, ptr: np.ndarray, n: int) -> np.ndarray:
    p = np.asarray(ptr)
    if p.ndim != 1 or p.size < 1 or p.dtype.kind not in "iu":
        raise SegmentationError(f"{name} must be a 1-D integer array of length >= 1")
    p = p.astype(np.int64)
    if p[0] != 0 or p[-1] != n or np.any(np.diff(p) < 0):
        raise SegmentationError(f"{name} must rise from 0 to {n}")
    return p


def segment_rows(row_ptr: np.ndarray, epochs: np.ndarray, nbytes: np.ndarray, op_ptr: np.ndarray,
                 need: np.ndarray, *, gap: int, stall: int, rel_tolerance: float = 1e-3,
                 abs_tolerance: int = 4096, earliest: np.ndarray | None = None,
                 merge: int | None = None, rx: np.ndarray | None = None, burst_rx: int = 0,
                 fills: np.ndarray | None = None) -> KernelOut:
    """Segment flows given as CSR arrays (validated; final, whole-trace form).

    Flow ``f`` owns rows ``row_ptr[f]:row_ptr[f+1]`` of ``epochs`` (strictly ascending
    within a flow) and ``nbytes`` (tx bytes, > 0 unless ``rx`` is), and operator slots
    ``op_ptr[f]:op_ptr[f+1]`` of ``need`` (expected bytes > 0, in the order the flow carries
    them). ``earliest``: per operator slot, the first epoch its data can be on the wire (its
    host issue time), or None when unknown. ``rx``: the flow's rx bytes per row (rows with
    no tx bytes are rx-only epochs), for the CTS-burst rule (``burst_rx``, and ``fills`` per
    operator slot: see ``run_kernel``).
    """
    ep = np.asarray(epochs)
    by = np.asarray(nbytes)
    nd = np.asarray(need)
    if ep.ndim != 1 or by.shape != ep.shape:
        raise SegmentationError(f"epochs and nbytes must be 1-D of equal length, got {ep.shape}, {by.shape}")
    if ep.size and (ep.dtype.kind not in "iu" or by.dtype.kind not in "iu"):
        raise SegmentationError("epochs and nbytes must be integer arrays")
    rp = _ptr("row_ptr", row_ptr, ep.size)
    op = _ptr("op_ptr", op_ptr, nd.size)
    if rp.size != op.size:
        raise SegmentationError(f"row_ptr has {rp.size - 1} flows, op_ptr {op.size - 1}")
    if gap < 1 or stall < gap:
        raise SegmentationError(f"gap={gap}, stall={stall}: need 1 <= gap <= stall")
    ep = ep.astype(np.int64)
    by = by.astype(np.int64)
    rxa = None
    if rx is not None:
        rxa = np.asarray(rx)
        if rxa.shape != ep.shape or (rxa.size and rxa.dtype.kind not in "iu"):
            raise SegmentationError(f"rx must be an integer array shaped like epochs {ep.shape}")
        rxa = rxa.astype(np.int64)
        if rxa.size and rxa.min() < 0:
            raise SegmentationError(f"row {int(np.argmin(rxa))} has negative rx bytes")
    if by.size and (by.min() < 0 or by.max() > TX_MASK):
        raise SegmentationError(f"row {int(np.argmin(by))} has tx bytes out of range")
    empty = by <= 0 if rxa is None else (by <= 0) & (rxa <= 0)
    if empty.any():
        raise SegmentationError(f"row {int(np.argmax(empty))} carries no bytes: pass active epochs only")
    if ep.size > 1:
        d = np.diff(ep)
        first = np.zeros(ep.size, bool)
        first[rp[:-1][rp[:-1] < ep.size]] = True
        bad = (d <= 0) & ~first[1:]
        if bad.any():
            raise SegmentationError(f"epochs not strictly ascending within a flow at row {int(np.argmax(bad)) + 1}")
    nd = nd.astype(np.int64)
    if nd.size and nd.min() <= 0:
        raise SegmentationError("every operator needs expected bytes > 0")
    thr, slack = volume_bounds(nd, rel_tolerance, abs_tolerance)
    if earliest is not None:
        earliest = np.asarray(earliest)
        if earliest.shape != nd.shape or (earliest.size and earliest.dtype.kind not in "iu"):
            raise SegmentationError(f"earliest must be an integer array shaped like need {nd.shape}")
    if burst_rx < 0:
        raise SegmentationError(f"burst_rx={burst_rx}: need >= 0")
    if fills is not None:
        fills = np.asarray(fills)
        if fills.shape != nd.shape or (fills.size and fills.dtype.kind not in "biu"):
            raise SegmentationError(f"fills must be a boolean array shaped like need {nd.shape}")
    return run_kernel(rp, ep, pack_rows(by, rxa), op, nd, thr, slack, gap=gap, stall=stall, earliest=earliest,
                      merge=merge, burst_rx=burst_rx, fills=fills)
