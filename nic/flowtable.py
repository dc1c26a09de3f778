"""Dense ids for keys in first-seen order (an open-addressing hash kernel) and the TCP
retransmission tracker (highest sequence end seen per flow)."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, inline="always")
def _mix(h, v):
    h ^= v + np.uint64(0x9E3779B97F4A7C15) + (h << np.uint64(6)) + (h >> np.uint64(2))
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(29)
    return h


@numba.njit(cache=True)
def _lookup_kernel(table, store, nstore, keys, valid, ids, firsts):
    """Look up / insert each valid row of ``keys`` (n x m uint64). ``store`` holds the keys
    seen so far (their row = their id, first-seen order); ``table`` maps hash slots to ids.
    Returns (stored keys, rows done): rows done < n when the store or table is full (the
    caller grows both and goes on from there)."""
    n, m = keys.shape
    size = table.shape[0]
    mask = np.uint64(size - 1)
    for i in range(n):
        if not valid[i]:
            ids[i] = -1
            continue
        h = np.uint64(0x84222325CBF29CE4)
        for j in range(m):
            h = _mix(h, keys[i, j])
        slot = h & mask
        while True:
            r = table[slot]
            if r < 0:
                if nstore >= store.shape[0] or 2 * (nstore + 1) > size:
                    return nstore, i
                table[slot] = nstore
                for j in range(m):
                    store[nstore, j] = keys[i, j]
                ids[i] = nstore
                firsts[nstore] = i
                nstore += 1
                break
            same = True
            for j in range(m):
                if store[r, j] != keys[i, j]:
                    same = False
                    break
            if same:
                ids[i] = r
                break
            slot = (slot + np.uint64(1)) & mask
    return nstore, n


@numba.njit(cache=True)
def _rehash_kernel(table, store, nstore):
    m = store.shape[1]
    mask = np.uint64(table.shape[0] - 1)
    for r in range(nstore):
        h = np.uint64(0x84222325CBF29CE4)
        for j in range(m):
            h = _mix(h, store[r, j])
        slot = h & mask
        while table[slot] >= 0:
            slot = (slot + np.uint64(1)) & mask
        table[slot] = r


class KeyTable:
    """Dense ids (0, 1, 2, ... in first-seen order) for fixed-width uint64 keys; persists
    across calls so a live capture keeps its ids."""

    def __init__(self, width: int, capacity: int = 1024) -> None:
        self.width = width
        self.n = 0
        self.new_rows = np.zeros(0, np.int64)  # row of each key the last lookup inserted
        self.store = np.zeros((capacity, width), np.uint64)
        self.table = np.full(_pow2(2 * capacity), -1, np.int64)

    def _grow(self, need: int) -> None:
        cap = max(2 * self.store.shape[0], need)
        store = np.zeros((cap, self.width), np.uint64)
        store[: self.n] = self.store[: self.n]
        self.store = store
        self.table = np.full(_pow2(2 * cap), -1, np.int64)
        _rehash_kernel(self.table, self.store, self.n)

    def lookup(self, keys: np.ndarray, valid: np.ndarray | None = None) -> np.ndarray:
        """Ids of the rows of ``keys`` (-1 where not ``valid``); new keys get new ids and
        ``new_rows`` tells the first row of each."""
        keys = np.ascontiguousarray(keys, np.uint64).reshape(-1, self.width)
        if valid is None:
            valid = np.ones(keys.shape[0], np.bool_)
        valid = np.ascontiguousarray(valid, np.bool_)
        ids = np.empty(keys.shape[0], np.int64)
        before = self.n
        firsts = np.empty(max(self.store.shape[0], 1), np.int64)
        done = 0
        while True:
            nstore, k = _lookup_kernel(self.table, self.store, self.n, keys[done:], valid[done:], ids[done:],
                                       firsts)
            firsts[self.n:nstore] += done
            self.n = int(nstore)
            done += int(k)
            if done >= keys.shape[0]:
                self.new_rows = firsts[before:self.n].copy()
                return ids
            self._grow(self.n + max(1024, min(keys.shape[0] - done, 1 << 20)))
            f2 = np.empty(self.store.shape[0], np.int64)
            f2[: self.n] = firsts[: self.n]
            firsts = f2

    def keys(self) -> np.ndarray:
        return self.store[: self.n]


def _pow2(x: int) -> int:
    p = 16
    while p < x:
        p *= 2
    return p


@numba.njit(cache=True)
def _rank_in_group_kernel(group, out, ngroups):
    counter = np.zeros(ngroups, np.int64)
    for i in range(group.shape[0]):
        g = group[i]
        out[i] = counter[g]
        counter[g] += 1


def rank_in_group(group: np.ndarray, ngroups: int) -> np.ndarray:
    """For items in order, their 0-based position among the items of the same group."""
    out = np.empty(group.shape[0], np.int64)
    _rank_in_group_kernel(np.ascontiguousarray(group, np.int64), out, int(ngroups))
    return out


@numba.njit(cache=True)
def _retrans_kernel(flow, seq, length, hi, seen, rbytes):
    """Bytes of each segment below the highest sequence end already seen on its flow
    (32-bit wrap-around compare)."""
    for i in range(flow.shape[0]):
        f = flow[i]
        ln = length[i]
        rbytes[i] = 0
        if f < 0 or ln <= 0:
            continue
        s = np.int64(seq[i])
        e = (s + ln) & 0xFFFFFFFF
        if not seen[f]:
            seen[f] = True
            hi[f] = e
            continue
        d_end = ((e - hi[f] + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
        d_start = ((s - hi[f] + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
        if d_end <= 0:
            rbytes[i] = ln
        else:
            if d_start < 0:
                rbytes[i] = -d_start
            hi[f] = e


class RetransTracker:
    """Per TCP flow, the highest sequence end seen; persists across calls."""

    def __init__(self) -> None:
        self.hi = np.zeros(1024, np.int64)
        self.seen = np.zeros(1024, np.bool_)

    def update(self, flow: np.ndarray, seq: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Per segment (in capture order), how many of its payload bytes were already sent."""
        flow = np.ascontiguousarray(flow, np.int64)
        need = int(flow.max()) + 1 if flow.size else 0
        if need > self.hi.shape[0]:
            cap = max(need, 2 * self.hi.shape[0])
            self.hi = np.concatenate([self.hi, np.zeros(cap - self.hi.shape[0], np.int64)])
            self.seen = np.concatenate([self.seen, np.zeros(cap - self.seen.shape[0], np.bool_)])
        out = np.empty(flow.shape[0], np.int64)
        _retrans_kernel(flow, np.ascontiguousarray(seq, np.uint32),
                        np.ascontiguousarray(length, np.int64), self.hi, self.seen, out)
        return out
