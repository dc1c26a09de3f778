"""The messages (chunks) of the job, laid out a window of steps at a time.

The kernel indexes messages by position: each connection's messages are contiguous, in
creation (= step, then stream) order, between ``lo[c]`` and ``hi[c]``. Laying out every step
up front costs ~66 bytes per message: 6.8 M messages per step at 32 x 8 x 8 MoE, so the
window holds only the steps the run has reached. Every reference between messages (data
dependency, forward, credit) stays inside one operator, hence inside one step, so a step
can be laid out on its own and shifted into place, and a finished step dropped: no message
left refers to it.
"""

from __future__ import annotations

import numpy as np
from pulse.sim.builder import CHUNK_STEPS, P2P_CHUNK_BYTES, SLICE_STEPS, SLOTS, StepSegs

STATIC = ("ch_conn", "ch_bytes", "ch_sp", "ch_rp", "ch_dep", "ch_fwd", "ch_credit", "ch_arrive_consume",
          "ch_grants", "ch_seg", "ch_dep2", "ch_fwd2")
REFS = frozenset(("ch_dep", "ch_fwd", "ch_credit", "ch_dep2", "ch_fwd2"))
"""Arrays that hold message positions (-1: none)."""
DYNAMIC = ("ch_arr", "ch_cons", "ch_fleft")
_DT = {"ch_arrive_consume": np.bool_, "ch_grants": np.bool_, "ch_arr": np.int64, "ch_cons": np.int64}


def step_counts(ss: StepSegs, C: int) -> np.ndarray:
    """Messages of the step per connection."""
    return np.bincount(ss.conn, weights=ss.n, minlength=C).astype(np.int64)


def step_messages(ss: StepSegs, C: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The step's messages laid out on their own (positions from 0, per connection in
    creation order), with ``ch_fleft``'s start, and the [S, 2] waiting connections of its
    segments."""
    S = len(ss)
    seg_conn = ss.conn.astype(np.int64)
    seg_n = ss.n.astype(np.int64)
    order = np.argsort(seg_conn, kind="stable")
    seg_base = np.empty(S, dtype=np.int64)
    seg_base[order] = np.concatenate([[0], np.cumsum(seg_n[order])[:-1]]) if S else np.zeros(0, np.int64)
    H = int(seg_n.sum())
    pos = np.arange(H, dtype=np.int64)
    ch_seg = np.repeat(order, seg_n[order]).astype(np.int64)
    j = pos - seg_base[ch_seg]
    n_of = seg_n[ch_seg]
    ch_conn = seg_conn[ch_seg]
    # P2P: full chunks but the last; ring and tree: the sizes the builder gave
    ch_bytes = np.full(H, P2P_CHUNK_BYTES, dtype=np.int64)
    p2p = np.flatnonzero(~ss.explicit & (seg_n > 0))
    ch_bytes[seg_base[p2p] + seg_n[p2p] - 1] = ss.p2p_bytes[p2p] - P2P_CHUNK_BYTES * (seg_n[p2p] - 1)
    for x, sizes in ss.sizes.items():
        if seg_n[x]:
            ch_bytes[seg_base[x]:seg_base[x] + seg_n[x]] = sizes
    # flow control: message j needs the slot freed by message j - SLOTS of its segment
    ch_credit = np.where(j >= SLOTS, pos - SLOTS, -1)
    ch_grants = j < n_of - SLOTS
    ch_dep = np.full(H, -1, dtype=np.int64)
    ch_fwd = np.full(H, -1, dtype=np.int64)
    ch_dep2 = np.full(H, -1, dtype=np.int64)
    ch_fwd2 = np.full(H, -1, dtype=np.int64)
    ch_arrive_consume = np.ones(H, dtype=np.bool_)
    seg_steps = ss.steps.astype(np.int64)
    seg_dep = np.where(ss.dep >= 0, ss.dep.astype(np.int64) - ss.s0, -1)
    ring = np.flatnonzero((seg_steps[ch_seg] > 0) & (seg_dep[ch_seg] >= 0))
    if len(ring):
        jr, nr = j[ring], n_of[ring]
        steps = seg_steps[ch_seg[ring]]
        k, w = np.divmod(jr, CHUNK_STEPS)
        has_dep = (k % steps) != 0
        dlo = seg_base[seg_dep[ch_seg[ring]]]
        last_of_slice = (w // SLICE_STEPS) * SLICE_STEPS + SLICE_STEPS - 1
        ch_dep[ring] = np.where(has_dep, dlo + (k - 1) * CHUNK_STEPS + last_of_slice, -1)
        ch_fwd[ring] = np.where(has_dep, dlo + jr - CHUNK_STEPS, -1)
        # in-edge message m is forwarded by our message m + CHUNK_STEPS unless m belongs to
        # the last ring step of a loop (then it is final data, consumed on arrival); each
        # ring segment is the in-edge of exactly one other
        consumed_later = ((k + 1) % steps != 0) & (jr + CHUNK_STEPS < nr)
        ch_arrive_consume[dlo + jr] = ~consumed_later
    for sidx, feeds in ss.tree:
        lo, n = int(seg_base[sidx - ss.s0]), int(seg_n[sidx - ss.s0])
        for dep, fwd, d in zip((ch_dep, ch_dep2), (ch_fwd, ch_fwd2), feeds, strict=False):
            dep[lo:lo + n] = fwd[lo:lo + n] = int(seg_base[d - ss.s0]) + np.arange(n)
    seg_wake = _waiters(S, ch_seg, ch_conn, ch_dep, ch_dep2)
    fwd_ref = np.concatenate([ch_fwd[ch_fwd >= 0], ch_fwd2[ch_fwd2 >= 0]])
    ch_fwd_need = np.bincount(fwd_ref, minlength=H).astype(np.int64)
    for sidx, _ in ss.tree:
        lo, n = int(seg_base[sidx - ss.s0]), int(seg_n[sidx - ss.s0])
        ch_arrive_consume[lo:lo + n] = ch_fwd_need[lo:lo + n] == 0
    i32 = np.int32
    out = {"ch_conn": ch_conn.astype(i32), "ch_bytes": ch_bytes.astype(i32),
           "ch_sp": ss.sp[ch_seg], "ch_rp": ss.rp[ch_seg],
           "ch_dep": ch_dep.astype(i32), "ch_fwd": ch_fwd.astype(i32), "ch_credit": ch_credit.astype(i32),
           "ch_arrive_consume": ch_arrive_consume, "ch_grants": ch_grants,
           "ch_seg": (ch_seg + ss.s0).astype(i32), "ch_dep2": ch_dep2.astype(i32), "ch_fwd2": ch_fwd2.astype(i32),
           "ch_fleft": ch_fwd_need.astype(i32)}
    return out, seg_wake


def _waiters(S: int, ch_seg: np.ndarray, ch_conn: np.ndarray, ch_dep: np.ndarray, ch_dep2: np.ndarray) -> np.ndarray:
    """Per segment, the (at most two) connections with messages that wait for its arrivals."""
    h = np.concatenate([np.flatnonzero(ch_dep >= 0), np.flatnonzero(ch_dep2 >= 0)])
    d = np.concatenate([ch_dep[ch_dep >= 0], ch_dep2[ch_dep2 >= 0]])
    span = int(ch_conn.max()) + 1 if len(ch_conn) else 1
    key = np.unique(ch_seg[d] * span + ch_conn[h])
    pairs = np.stack([key // span, key % span], axis=1).reshape(-1, 2)
    out = np.full((S, 2), -1, dtype=np.int32)
    if len(pairs):
        first = np.r_[True, pairs[1:, 0] != pairs[:-1, 0]]
        rank = np.arange(len(pairs)) - np.maximum.accumulate(np.where(first, np.arange(len(pairs)), 0))
        if rank.max() > 1:
            raise AssertionError("a segment with more than two waiting connections")
        out[pairs[:, 0], rank] = pairs[:, 1]
    return out


class Window:
    """The messages of steps [a, b), laid out as the kernel reads them, with their run state.

    ``move`` drops finished steps and lays out new ones, shifting every position (message
    references, and the caller's per-connection cursors) to the new layout."""

    def __init__(self, steps: list[StepSegs], n_conn: int, n_segs: int) -> None:
        self.steps = steps
        self.C = n_conn
        self.a = self.b = 0
        self.cnt: list[np.ndarray] = []
        """Messages per connection of each step in the window."""
        self.lo = np.zeros(n_conn, dtype=np.int64)
        self.hi = np.zeros(n_conn, dtype=np.int64)
        self.seg0 = np.full(n_conn, -1, dtype=np.int64)
        """Per connection, the segment of its last message before the window (-1: none)."""
        self.seg_wake = np.full((max(n_segs, 1), 2), -1, dtype=np.int32)
        self.arrays: dict[str, np.ndarray] = {
            k: np.zeros(0, dtype=_DT.get(k, np.int32)) for k in (*STATIC, *DYNAMIC)}

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self.__dict__["arrays"][name]
        except KeyError:
            raise AttributeError(name) from None

    def step_done(self, s: int) -> bool:
        """Every message of step ``s`` (in the window) has arrived and been consumed."""
        before = np.sum(self.cnt[:s - self.a], axis=0) if s > self.a else 0
        cnt = self.cnt[s - self.a]
        idx = (np.repeat(self.lo + before, cnt)
               + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt)))
        return bool((self.ch_arr[idx] >= 0).all() and (self.ch_cons[idx] >= 0).all())

    def move(self, a: int, b: int, cursors: tuple[np.ndarray, ...]) -> None:
        """Make the window steps [a, b) (a >= self.a, b >= self.b); ``cursors`` (message
        positions per connection, e.g. the next message to post) are shifted in place."""
        C = self.C
        drop = np.zeros(C, dtype=np.int64)
        for s in range(self.a, min(a, self.b)):
            drop += self.cnt[s - self.a]
        kept = self.hi - self.lo - drop
        new = list(range(max(a, self.b), b))
        new_cnt = [step_counts(self.steps[s], C) for s in new]
        total = kept + (np.sum(new_cnt, axis=0) if new_cnt else 0)
        new_lo = np.cumsum(total) - total
        H = int(total.sum())
        old_conn = self.ch_conn.astype(np.int64)
        shift_old = new_lo - self.lo - drop
        in_conn = np.arange(len(old_conn), dtype=np.int64) - self.lo[old_conn]
        keep = in_conn >= drop[old_conn]
        del in_conn
        gone = np.flatnonzero(~keep)
        if len(gone) and not ((self.ch_arr[gone] >= 0).all() and (self.ch_cons[gone] >= 0).all()):
            raise AssertionError("dropping a step whose messages are not all through")
        dropped = drop > 0
        self.seg0[dropped] = self.ch_seg[self.lo[dropped] + drop[dropped] - 1]
        del gone
        src = np.flatnonzero(keep)
        del keep
        dst = src + shift_old[old_conn[src]]
        for x in cursors:
            if (x < self.lo + drop).any():
                raise AssertionError("a cursor inside a dropped step")
            x += shift_old
        # lay out each new step on its own, then place each array in turn (old and new
        # copies of one array at a time, not of the whole window)
        laid = []
        base = new_lo + kept
        for s, cnt in zip(new, new_cnt, strict=True):
            msgs, wake = step_messages(self.steps[s], C)
            ss = self.steps[s]
            self.seg_wake[ss.s0:ss.s0 + len(ss)] = wake
            conn = msgs["ch_conn"].astype(np.int64)
            shift = base - (np.cumsum(cnt) - cnt)
            laid.append((msgs, conn, np.arange(len(conn), dtype=np.int64) + shift[conn]))
            base = base + cnt
        for k in (*STATIC, *DYNAMIC):
            old = self.arrays.pop(k)
            out = np.empty(H, dtype=old.dtype)
            v = old[src]
            del old
            if k in REFS:
                ok = v >= 0
                v[ok] += shift_old[old_conn[v[ok]]].astype(v.dtype)
            out[dst] = v
            del v
            for msgs, _conn, at in laid:
                if k in DYNAMIC and k != "ch_fleft":
                    out[at] = -1
                    continue
                w = msgs.pop(k)
                if k in REFS:
                    ok = w >= 0
                    w[ok] = at[w[ok]]
                out[at] = w
            self.arrays[k] = out
        self.cnt = self.cnt[min(a, self.b) - self.a:] + new_cnt
        self.a, self.b = a, b
        self.lo = new_lo
        self.hi = new_lo + total
