"""What the engine kernel's inner loop shares: its constants, the slots of its scalar
parameter and state arrays, its random numbers (a counter-based generator and a hash, so a
run is a pure function of its seed), and the per-QP epoch accounting that turns bytes into
epoch rows."""

from __future__ import annotations

import numba
import numpy as np

TICK_NS = 1000
LAT_NS = 2000
RTT_NS = 6000
CTS_BYTES = 64
MTU = 4096
JITTER_BLOCK_NS = 100_000
BURST_BLOCK_NS = 20_000
BURST_LEFT = 1.0 / 8.0
"""Share of a downlink our traffic keeps during a background burst: the burst is an incast
from 7 other ingress ports and the switch serves its ingress ports round-robin."""
NIC_JITTER = 0.03
NEVER = 1 << 62

_K1 = np.uint64(0x9E3779B97F4A7C15)
_K2 = np.uint64(0xBF58476D1CE4E5B9)
_K3 = np.uint64(0x94D049BB133111EB)

# scalar parameter slots (int64)
P_ONSET, P_EPOCH, P_EOFF, P_FLAP_PERIOD, P_FLAP_DOWN, P_SEED, P_TLIMIT, P_FEND = range(8)
# float parameter slots
F_CAP, F_POST_MEAN, F_HOST_MEAN = range(3)
# state slots (int64)
S_T, S_NPEND, S_NOUT, S_FUTURE, S_DONE, S_QUIET, S_TICKS, S_NLIVE = range(8)


@numba.njit(cache=True, inline="always")
def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _K2
    z = (z ^ (z >> np.uint64(27))) * _K3
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, inline="always")
def _hash01(seed, a, b):
    z = np.uint64(seed) ^ (np.uint64(a + 1) * _K1) ^ (np.uint64(b + 7) * _K2)
    return float(_mix(z) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@numba.njit(cache=True, inline="always")
def _rand(rng):
    rng[0] = rng[0] + _K1
    return float(_mix(rng[0]) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@numba.njit(cache=True, inline="always")
def _expo(rng, mean):
    return -mean * np.log(1.0 - _rand(rng))


@numba.njit(cache=True)
def _poisson(rng, lam):
    if lam <= 0.0:
        return 0
    if lam > 30.0:
        # normal approximation (Box-Muller)
        u1 = _rand(rng)
        u2 = _rand(rng)
        z = np.sqrt(-2.0 * np.log(1.0 - u1)) * np.cos(2.0 * np.pi * u2)
        k = int(lam + np.sqrt(lam) * z + 0.5)
        return k if k > 0 else 0
    el = np.exp(-lam)
    k = 0
    p = _rand(rng)
    while p > el:
        k += 1
        p *= _rand(rng)
    return k


@numba.njit(cache=True, inline="always")
def _rec(q, t, tx, rx, epoch, qa, orow, st):
    """Account tx/rx bytes of QP q at true time t into its current epoch; emit the finished
    epoch's row into ``orow`` (q, epoch, tx, rx) when t enters a new one.

    qa[q] = (current epoch, its end in true time, tx, rx, clock shift of the QP's node).
    Times only grow per QP, so a comparison with the end of the current epoch replaces the
    division on the hot path. The state is packed in two arrays because every array argument
    of an inlined call costs an atomic reference-count pair per call."""
    if t >= qa[q, 1]:
        shift = qa[q, 4]
        e = (t + shift) // epoch
        qa[q, 1] = (e + 1) * epoch - shift
        if qa[q, 2] != 0 or qa[q, 3] != 0:
            n = st[S_NOUT]
            orow[n, 0] = q
            orow[n, 1] = qa[q, 0]
            orow[n, 2] = qa[q, 2]
            orow[n, 3] = qa[q, 3]
            st[S_NOUT] = n + 1
        qa[q, 0] = e
        qa[q, 2] = 0
        qa[q, 3] = 0
    qa[q, 2] += tx
    qa[q, 3] += rx


@numba.njit(cache=True, inline="always")
def _rec_cts(c, t, b, recv_down, send_down, epoch, qa, orow, st):
    """A clear-to-send of ``b`` bytes for data connection c: sent by its receiver (row
    2c + 1, tx) and heard by its sender (row 2c, rx). A dead NIC neither sends nor hears
    one: ``recv_down`` - the receiver's NIC cannot transmit (nothing on either row);
    ``send_down`` - the sender's NIC cannot receive (only the receiver's tx)."""
    if recv_down:
        return
    _rec(2 * c + 1, t, b, 0, epoch, qa, orow, st)
    if not send_down:
        _rec(2 * c, t, 0, b, epoch, qa, orow, st)


@numba.njit(cache=True, inline="always")
def _link_up(t, onset, period, down, flap):
    # a control message cannot cross a link that is down: it goes when the link is back
    if flap and t >= onset:
        ph = (t - onset) % period
        if ph < down:
            return t - ph + down
    return t


@numba.njit(cache=True)
def _flush(qa, orow, st):
    for q in range(qa.shape[0]):
        if qa[q, 2] != 0 or qa[q, 3] != 0:
            n = st[S_NOUT]
            orow[n, 0] = q
            orow[n, 1] = qa[q, 0]
            orow[n, 2] = qa[q, 2]
            orow[n, 3] = qa[q, 3]
            st[S_NOUT] = n + 1
            qa[q, 2] = 0
            qa[q, 3] = 0


@numba.njit(cache=True)
def _retire(qa, orow, st, t):
    """Emit now the rows of epochs already over at true time ``t``: every later record is at
    ``t`` or after, so it would emit exactly these rows (same QP, epoch and bytes) on its first
    call; emitting them at a slice's end lets the writer close batches while the run goes on."""
    for q in range(qa.shape[0]):
        if (qa[q, 2] != 0 or qa[q, 3] != 0) and qa[q, 1] <= t:
            n = st[S_NOUT]
            orow[n, 0] = q
            orow[n, 1] = qa[q, 0]
            orow[n, 2] = qa[q, 2]
            orow[n, 3] = qa[q, 3]
            st[S_NOUT] = n + 1
            qa[q, 2] = 0
            qa[q, 3] = 0
