"""The time-stepped engine: node programs, NCCL-like chunk posting with flow control, fair
sharing of NIC capacity, go-back-N loss, and per-QP epoch accounting.

One tick is 1 µs of true time. Each tick:
1. node programs advance (compute phases end, operators are issued, waits are released);
2. issued operators start on their rank once the previous operator of that comm stream ended;
3. each connection's proxy posts the next chunks whose data dependency, credit (8 slots) and
   (under CPU starvation) proxy delay allow;
4. every QP with posted, untransmitted bytes gets a fair share of its sender NIC's transmit
   and receiver NIC's receive capacity (two-pass max-min), loses packets at the link's loss
   rate (go-back-N: a loss resends the bytes in flight), and transmits FIFO;
5. the bytes are accounted per QP per epoch on the owning node's clock.
When nothing moves, time jumps to the next event. State lives in arrays so the driver can
run the kernel in slices (progress bar) and resume.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
from pulse.sim.workload import COMPUTE, ISSUE, Job

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
def _kernel(t_stop, st, rng, P, FP,
            # static job
            conn_src_node, conn_dst_node, conn_src_nic, conn_dst_nic, conn_lo, conn_hi,
            part_prev, cts_lo, cts_hi, cts_conn, cts_count, ps_lo, ps_hi, ps_conn,
            group_lo, group_hi, group_parts, prog_lo, prog_hi, instr_type, instr_arg, instr_jit,
            ch_conn, ch_bytes, ch_sp, ch_rp, ch_dep, ch_fwd, ch_credit, ch_arrive_consume, ch_grants, ch_seg,
            ch_dep2, ch_fwd2, seg_wake,
            # anomaly
            nic_tx_f, nic_rx_f, nic_loss, nic_flap, nic_burst, conn_grp, grp_cap, node_cf, node_hang,
            node_cpu,
            # dynamic
            node_pc, node_busy, part_issue, part_start, part_end, part_left, pend,
            conn_next, conn_txhead, conn_prog, conn_debt, conn_carry, conn_wait, conn_wake,
            ch_arr, ch_cons, ch_fleft, seg_first, seg_last, seg_tx, seg_left, live, is_live,
            qa, orow,
            # scratch
            ntx, nrx, txcap, rxcap, usedtx, usedrx, active, rate, crate, gcnt):
    n_nodes = node_pc.shape[0]
    n_conn = conn_lo.shape[0]
    n_nic = ntx.shape[0]
    n_grp = grp_cap.shape[0]
    onset = P[P_ONSET]
    epoch = P[P_EPOCH]
    seed = P[P_SEED]
    flap_period = P[P_FLAP_PERIOD]
    flap_down = P[P_FLAP_DOWN]
    t_limit = P[P_TLIMIT]
    fend = P[P_FEND]
    base_cap = FP[F_CAP]
    post_mean = FP[F_POST_MEAN]
    host_mean = FP[F_HOST_MEAN]
    any_flap = False
    for k in range(n_nic):
        if nic_flap[k]:
            any_flap = True
    t = st[S_T]
    while t < t_stop:
        if t >= t_limit:
            st[S_DONE] = 2
            break
        act = False
        st[S_TICKS] += 1
        after = onset <= t < fend  # the fault acts from onset until it ends
        # 1. node programs
        all_done = True
        for n in range(n_nodes):
            if node_pc[n] >= prog_hi[n]:
                continue
            all_done = False
            if node_hang[n] and after:
                continue
            while node_pc[n] < prog_hi[n]:
                i = node_pc[n]
                ty = instr_type[i]
                if ty == COMPUTE:
                    if node_busy[n] < 0:
                        f = node_cf[n] if after else 1.0
                        node_busy[n] = t + int(instr_arg[i] * instr_jit[i] * f)
                    if t >= node_busy[n]:
                        node_pc[n] += 1
                        node_busy[n] = -1
                        act = True
                        continue
                    break
                elif ty == ISSUE:
                    if node_cpu[n] and after:
                        # the starved host thread launches the operator late
                        if node_busy[n] < 0:
                            node_busy[n] = t + int(_expo(rng, host_mean))
                        if t < node_busy[n]:
                            break
                        node_busy[n] = -1
                    g = instr_arg[i]
                    for j in range(group_lo[g], group_hi[g]):
                        p = group_parts[j]
                        part_issue[p] = t
                        pend[st[S_NPEND]] = p
                        st[S_NPEND] += 1
                    node_pc[n] += 1
                    act = True
                    continue
                else:
                    g = instr_arg[i]
                    ok = True
                    for j in range(group_lo[g], group_hi[g]):
                        e = part_end[group_parts[j]]
                        if e < 0 or e > t:
                            ok = False
                            break
                    if ok:
                        node_pc[n] += 1
                        act = True
                        continue
                    break
        # 2. operator starts (stream order per comm and rank)
        k = 0
        npend = st[S_NPEND]
        for idx in range(npend):
            p = pend[idx]
            prev = part_prev[p]
            if part_issue[p] <= t and (prev < 0 or (part_end[prev] >= 0 and part_end[prev] <= t)):
                part_start[p] = t
                act = True
                if t + LAT_NS > st[S_FUTURE]:
                    st[S_FUTURE] = t + LAT_NS
                for j in range(ps_lo[p], ps_hi[p]):
                    c = ps_conn[j]
                    if t < conn_wake[c]:
                        conn_wake[c] = t
                    if not is_live[c]:
                        is_live[c] = True
                        live[st[S_NLIVE]] = c
                        st[S_NLIVE] += 1
                for j in range(cts_lo[p], cts_hi[p]):
                    c = cts_conn[j]
                    if t + LAT_NS < conn_wake[c]:
                        conn_wake[c] = t + LAT_NS
                    b = CTS_BYTES * cts_count[j]
                    tc = _link_up(t, onset, flap_period, flap_down,
                                  after and (nic_flap[conn_src_nic[c]] or nic_flap[conn_dst_nic[c]]))
                    _rec(2 * c + 1, tc, b, 0, epoch, qa, orow, st)
                    _rec(2 * c, tc, 0, b, epoch, qa, orow, st)
                if part_left[p] == 0:
                    part_end[p] = t
            else:
                pend[k] = p
                k += 1
        st[S_NPEND] = k
        # 3. proxies post chunks (live connections: their sender's operator has started)
        k = 0
        for li in range(st[S_NLIVE]):
            c = live[li]
            keep = conn_txhead[c] < conn_next[c] or conn_debt[c] > 0 or (
                conn_next[c] < conn_hi[c] and part_start[ch_sp[conn_next[c]]] >= 0)
            if keep:
                live[k] = c
                k += 1
            else:
                is_live[c] = False
        st[S_NLIVE] = k
        for li in range(k):
            c = live[li]
            # a blocked proxy is looked at again only when what blocks it can have changed:
            # conn_wake is the time a blocking value becomes due, or NEVER until an event
            # (a start, an arrival, a consumption) that can unblock it lowers it
            if conn_wake[c] > t:
                continue
            cpu = node_cpu[conn_src_node[c]] and after
            while conn_next[c] < conn_hi[c]:
                h = conn_next[c]
                s0 = part_start[ch_sp[h]]
                if s0 < 0 or s0 > t:
                    conn_wake[c] = NEVER if s0 < 0 else s0
                    break
                d = ch_dep[h]
                if d >= 0 and (ch_arr[d] < 0 or ch_arr[d] > t):
                    conn_wake[c] = NEVER if ch_arr[d] < 0 else ch_arr[d]
                    break
                d = ch_dep2[h]
                if d >= 0 and (ch_arr[d] < 0 or ch_arr[d] > t):
                    conn_wake[c] = NEVER if ch_arr[d] < 0 else ch_arr[d]
                    break
                cs = ch_credit[h]
                if cs < 0:
                    r0 = part_start[ch_rp[h]]
                    if r0 < 0 or r0 + LAT_NS > t:
                        conn_wake[c] = NEVER if r0 < 0 else r0 + LAT_NS
                        break
                elif ch_cons[cs] < 0 or ch_cons[cs] + LAT_NS > t:
                    conn_wake[c] = NEVER if ch_cons[cs] < 0 else ch_cons[cs] + LAT_NS
                    break
                if cpu:
                    if conn_wait[c] < 0:
                        conn_wait[c] = t + int(_expo(rng, post_mean))
                    if t < conn_wait[c]:
                        conn_wake[c] = conn_wait[c]
                        break
                    conn_wait[c] = -1
                conn_next[c] += 1
                act = True
                for x in range(2):
                    fw = ch_fwd[h] if x == 0 else ch_fwd2[h]
                    if fw < 0:
                        continue
                    # posting forwards the received message: its slot is free again once
                    # every post that forwards it is out (a tree node feeding two children)
                    ch_fleft[fw] -= 1
                    if ch_fleft[fw] > 0:
                        continue
                    cons = t
                    if cpu:
                        cons += int(_expo(rng, post_mean))
                        if cons + LAT_NS > st[S_FUTURE]:
                            st[S_FUTURE] = cons + LAT_NS
                    ch_cons[fw] = cons
                    dc = ch_conn[fw]
                    if cons + LAT_NS < conn_wake[dc]:
                        conn_wake[dc] = cons + LAT_NS
                    if ch_grants[fw]:
                        tc = _link_up(t, onset, flap_period, flap_down,
                                      after and (nic_flap[conn_src_nic[dc]] or nic_flap[conn_dst_nic[dc]]))
                        _rec(2 * dc + 1, tc, CTS_BYTES, 0, epoch, qa, orow, st)
                        _rec(2 * dc, tc, 0, CTS_BYTES, epoch, qa, orow, st)
        # 4. fair share of NIC capacity
        for k2 in range(n_nic):
            ntx[k2] = 0
            nrx[k2] = 0
            usedtx[k2] = 0.0
            usedrx[k2] = 0.0
        na = 0
        for li in range(st[S_NLIVE]):
            c = live[li]
            if conn_txhead[c] < conn_next[c] or conn_debt[c] > 0:
                active[na] = c
                na += 1
                ntx[conn_src_nic[c]] += 1
                nrx[conn_dst_nic[c]] += 1
        moved = False
        if na > 0:
            jb = t // JITTER_BLOCK_NS
            bb = t // BURST_BLOCK_NS
            for k2 in range(n_nic):
                if ntx[k2] == 0 and nrx[k2] == 0:
                    continue
                j = 1.0 + NIC_JITTER * (2.0 * _hash01(seed, k2, jb) - 1.0)
                cap = base_cap * j
                tc = cap
                rc = cap
                if after:
                    tc *= nic_tx_f[k2]
                    rc *= nic_rx_f[k2]
                    if nic_burst[k2] > 0.0 and _hash01(seed + 1, k2, bb) < nic_burst[k2]:
                        rc *= BURST_LEFT
                    if nic_flap[k2] and (t - onset) % flap_period < flap_down:
                        tc = 0.0
                        rc = 0.0
                txcap[k2] = tc
                rxcap[k2] = rc
            # shared constraint of a congested path (background traffic leaves
            # grp_cap x NIC capacity to all of our connections crossing it)
            if after and n_grp > 0:
                for g in range(n_grp):
                    gcnt[g] = 0
                for a in range(na):
                    g = conn_grp[active[a]]
                    if g >= 0:
                        gcnt[g] += 1
            for a in range(na):
                c = active[a]
                s = conn_src_nic[c]
                d = conn_dst_nic[c]
                ccap = base_cap
                g = conn_grp[c]
                if after and g >= 0:
                    ccap = base_cap * grp_cap[g] / gcnt[g]
                crate[a] = ccap
                r = min(txcap[s] / ntx[s], rxcap[d] / nrx[d], ccap)
                rate[a] = r
                usedtx[s] += r
                usedrx[d] += r
            for a in range(na):
                c = active[a]
                s = conn_src_nic[c]
                d = conn_dst_nic[c]
                extra = min((txcap[s] - usedtx[s]) / ntx[s], (rxcap[d] - usedrx[d]) / nrx[d], crate[a] - rate[a])
                if extra > 0.0:
                    rate[a] += extra
            # 5. transmit
            for a in range(na):
                c = active[a]
                budget_f = rate[a] + conn_carry[c]
                budget = int(budget_f)
                conn_carry[c] = budget_f - budget
                if budget <= 0:
                    continue
                s = conn_src_nic[c]
                d = conn_dst_nic[c]
                if after:
                    p_loss = max(nic_loss[s], nic_loss[d])
                    if p_loss > 0.0:
                        nl = _poisson(rng, budget / MTU * p_loss)
                        if nl > 0:
                            # go-back-N: everything in flight after the lost packet is resent.
                            # A loss during a resend rewinds it again: the window in flight
                            # replaces the resend under way, it does not add another one
                            # (adding would diverge once loss x window > 1: ~1.5 at 2 %).
                            bdp = int(rate[a] * RTT_NS / TICK_NS)
                            conn_debt[c] = max(conn_debt[c], nl * max(bdp, MTU))
                wire = 0
                h = conn_txhead[c]
                if conn_debt[c] > 0:
                    pay = min(conn_debt[c], budget)
                    conn_debt[c] -= pay
                    budget -= pay
                    wire += pay
                    hs = h if h < conn_next[c] else h - 1
                    if hs >= conn_lo[c]:
                        sg = ch_seg[hs]
                        seg_tx[sg] += pay
                        seg_last[sg] = t
                while budget > 0 and conn_txhead[c] < conn_next[c]:
                    h = conn_txhead[c]
                    need = ch_bytes[h] - conn_prog[c]
                    take = need if need < budget else budget
                    conn_prog[c] += take
                    budget -= take
                    wire += take
                    sg = ch_seg[h]
                    if seg_first[sg] < 0:
                        seg_first[sg] = t
                    seg_last[sg] = t
                    seg_tx[sg] += take
                    if conn_prog[c] == ch_bytes[h]:
                        conn_prog[c] = 0
                        conn_txhead[c] += 1
                        ta = t + TICK_NS + LAT_NS
                        ch_arr[h] = ta
                        if ta > st[S_FUTURE]:
                            st[S_FUTURE] = ta
                        for x in range(2):
                            wk = seg_wake[ch_seg[h], x]
                            if wk >= 0 and ta < conn_wake[wk]:
                                conn_wake[wk] = ta
                        seg_left[sg] -= 1
                        sp = ch_sp[h]
                        rp = ch_rp[h]
                        part_left[sp] -= 1
                        if part_left[sp] == 0:
                            part_end[sp] = ta
                        part_left[rp] -= 1
                        if part_left[rp] == 0:
                            part_end[rp] = ta
                        if ch_arrive_consume[h]:
                            cons = ta
                            if node_cpu[conn_dst_node[c]] and after:
                                cons += int(_expo(rng, post_mean))
                            ch_cons[h] = cons
                            if cons + LAT_NS > st[S_FUTURE]:
                                st[S_FUTURE] = cons + LAT_NS
                            if cons + LAT_NS < conn_wake[c]:
                                conn_wake[c] = cons + LAT_NS
                            if ch_grants[h]:
                                _rec(2 * c + 1, t, CTS_BYTES, 0, epoch, qa, orow, st)
                                _rec(2 * c, t, 0, CTS_BYTES, epoch, qa, orow, st)
                if wire > 0:
                    moved = True
                    # _rec of the data on both QPs, written out: this is the hottest spot and
                    # an inlined call costs atomic reference counting of its array arguments
                    for side in range(2):
                        q = 2 * c + side
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
                        qa[q, 2 + side] += wire
        if all_done and st[S_NPEND] == 0 and na == 0:
            finished = True
            for c in range(n_conn):
                if conn_next[c] < conn_hi[c]:
                    finished = False
                    break
            if finished:
                st[S_DONE] = 1
                t += TICK_NS
                break
        # 6. advance, jumping over quiet stretches
        nxt = t + TICK_NS
        if act or moved or t <= st[S_FUTURE]:
            st[S_QUIET] = 0
        else:
            st[S_QUIET] += 1
        if st[S_QUIET] > 2:
            cand = t_stop if t_stop < t_limit else t_limit
            for n in range(n_nodes):
                if (node_pc[n] < prog_hi[n] and node_busy[n] > t and node_busy[n] < cand
                        and not (node_hang[n] and after)):
                    cand = node_busy[n]
            for li in range(st[S_NLIVE]):
                c = live[li]
                if conn_wait[c] > t and conn_wait[c] < cand:
                    cand = conn_wait[c]
            if (not after) and onset > t and onset < cand:
                cand = onset
            if after and fend < cand:
                cand = fend
            if any_flap and after:
                ph = (t - onset) % flap_period
                nb = t - ph + (flap_down if ph < flap_down else flap_period)
                if nb < cand:
                    cand = nb
            cand = (cand // TICK_NS) * TICK_NS
            if cand > nxt:
                nxt = cand
        t = nxt
    st[S_T] = t


@dataclasses.dataclass
class Anomaly:
    """Physical quantities the scenario changes (from onset on)."""

    onset_ns: int
    t_limit_ns: int
    nic_tx_f: np.ndarray
    nic_rx_f: np.ndarray
    nic_loss: np.ndarray
    nic_flap: np.ndarray
    nic_burst: np.ndarray
    """Fraction of 20 µs blocks in which a background burst shares the NIC's downlink."""
    conn_grp: np.ndarray
    """Shared-capacity group of each connection (-1: none)."""
    grp_cap: np.ndarray
    """Capacity left to our traffic in a group, as a fraction of one NIC's."""
    node_cf: np.ndarray
    node_hang: np.ndarray
    node_cpu: np.ndarray
    flap_period_ns: int = 1 << 62
    flap_down_ns: int = 0
    end_ns: int = 1 << 62
    """When the fault stops acting (true time; default never)."""
    post_mean_ns: float = 0.0
    host_mean_ns: float = 0.0

    @classmethod
    def none(cls, job: Job, onset_ns: int, t_limit_ns: int) -> Anomaly:
        cfg = job.rc.cfg
        n_nic = cfg.nodes * cfg.nics_per_node
        C = len(job.conns)
        return cls(onset_ns=onset_ns, t_limit_ns=t_limit_ns,
                   nic_tx_f=np.ones(n_nic), nic_rx_f=np.ones(n_nic), nic_loss=np.zeros(n_nic),
                   nic_flap=np.zeros(n_nic, dtype=np.bool_), nic_burst=np.zeros(n_nic),
                   conn_grp=np.full(C, -1, dtype=np.int64), grp_cap=np.zeros(0), node_cf=np.ones(cfg.nodes),
                   node_hang=np.zeros(cfg.nodes, dtype=np.bool_), node_cpu=np.zeros(cfg.nodes, dtype=np.bool_))


@dataclasses.dataclass
class RunResult:
    part_issue: np.ndarray
    part_start: np.ndarray
    part_end: np.ndarray
    seg_first: np.ndarray
    seg_last: np.ndarray
    seg_tx: np.ndarray
    seg_left: np.ndarray
    rows_q: np.ndarray
    rows_e: np.ndarray
    rows_tx: np.ndarray
    rows_rx: np.ndarray
    t_end_ns: int
    hung: bool
    ticks: int = 0
    """Ticks the kernel simulated (quiet stretches jumped over are not counted)."""


def run_engine(job: Job, an: Anomaly, node_off: np.ndarray, eoff_ns: int, seed: int,
               progress=None, slice_ns: int = 20_000_000) -> RunResult:
    """Run the kernel in slices of true time; ``progress(t_ns, t_est_ns)`` after each."""
    cfg = job.rc.cfg
    epoch = job.rc.epoch_ns
    n_nic = cfg.nodes * cfg.nics_per_node
    C = len(job.conns)
    P = np.zeros(9, dtype=np.int64)
    P[P_ONSET] = an.onset_ns
    P[P_EPOCH] = epoch
    P[P_EOFF] = eoff_ns
    P[P_FLAP_PERIOD] = an.flap_period_ns
    P[P_FLAP_DOWN] = an.flap_down_ns
    P[P_SEED] = seed & ((1 << 62) - 1)
    P[P_TLIMIT] = an.t_limit_ns
    P[P_FEND] = an.end_ns
    FP = np.zeros(4)
    FP[F_CAP] = cfg.nic_gbps / 8.0 * TICK_NS
    FP[F_POST_MEAN] = an.post_mean_ns
    FP[F_HOST_MEAN] = an.host_mean_ns
    st = np.zeros(8, dtype=np.int64)
    st[S_FUTURE] = -1
    rng = np.array([seed * 2654435761 + 12345], dtype=np.uint64)
    n_nodes = cfg.nodes
    node_pc = job.prog_lo.copy()
    node_busy = np.full(n_nodes, -1, dtype=np.int64)
    Pn = job.n_parts
    part_issue = np.full(Pn, -1, dtype=np.int64)
    part_start = np.full(Pn, -1, dtype=np.int64)
    part_end = np.full(Pn, -1, dtype=np.int64)
    part_left = job.part_pending.copy()
    pend = np.zeros(Pn + 1, dtype=np.int64)
    conn_next = job.conn_lo.copy()
    conn_txhead = job.conn_lo.copy()
    conn_prog = np.zeros(C, dtype=np.int64)
    conn_debt = np.zeros(C, dtype=np.int64)
    conn_carry = np.zeros(C)
    conn_wait = np.full(C, -1, dtype=np.int64)
    conn_wake = np.zeros(C, dtype=np.int64)
    H = len(job.ch_conn)
    ch_arr = np.full(H, -1, dtype=np.int64)
    ch_cons = np.full(H, -1, dtype=np.int64)
    ch_fleft = job.ch_fwd_need.copy()
    S = len(job.seg_conn)
    seg_first = np.full(S, -1, dtype=np.int64)
    seg_last = np.full(S, -1, dtype=np.int64)
    seg_tx = np.zeros(S, dtype=np.int64)
    seg_left = job.seg_nchunks.copy()
    live = np.zeros(C, dtype=np.int64)
    is_live = np.zeros(C, dtype=np.bool_)
    nq = 2 * C
    qnode = np.empty(nq, dtype=np.int64)
    qnode[0::2] = job.conn_src_node
    qnode[1::2] = job.conn_dst_node
    qa = np.zeros((nq, 5), dtype=np.int64)
    qa[:, 0] = -1
    qa[:, 1] = -(1 << 62)
    qa[:, 4] = node_off[qnode] + eoff_ns
    cap_rows = nq * (slice_ns // epoch + 4) + nq
    orow = np.zeros((cap_rows, 4), dtype=np.int64)
    ntx = np.zeros(n_nic, dtype=np.int64)
    nrx = np.zeros(n_nic, dtype=np.int64)
    txcap = np.zeros(n_nic)
    rxcap = np.zeros(n_nic)
    usedtx = np.zeros(n_nic)
    usedrx = np.zeros(n_nic)
    active = np.zeros(C, dtype=np.int64)
    rate = np.zeros(C)
    crate = np.zeros(C)
    gcnt = np.zeros(max(1, len(an.grp_cap)), dtype=np.int64)
    chunks: list[tuple[np.ndarray, ...]] = []
    est = max(int(job.est_step_ns * cfg.steps), 1)

    while st[S_DONE] == 0:
        t_stop = int(st[S_T]) + slice_ns
        _kernel(t_stop, st, rng, P, FP,
                job.conn_src_node, job.conn_dst_node, job.conn_src_nic, job.conn_dst_nic,
                job.conn_lo, job.conn_hi, job.part_prev, job.cts_lo, job.cts_hi, job.cts_conn, job.cts_count,
                job.ps_lo, job.ps_hi, job.ps_conn,
                job.group_lo, job.group_hi, job.group_parts, job.prog_lo, job.prog_hi,
                job.instr_type, job.instr_arg, job.instr_jit,
                job.ch_conn, job.ch_bytes, job.ch_sp, job.ch_rp, job.ch_dep, job.ch_fwd, job.ch_credit,
                job.ch_arrive_consume, job.ch_grants, job.ch_seg, job.ch_dep2, job.ch_fwd2, job.seg_wake,
                an.nic_tx_f, an.nic_rx_f, an.nic_loss, an.nic_flap, an.nic_burst, an.conn_grp, an.grp_cap,
                an.node_cf, an.node_hang, an.node_cpu,
                node_pc, node_busy, part_issue, part_start, part_end, part_left, pend,
                conn_next, conn_txhead, conn_prog, conn_debt, conn_carry, conn_wait, conn_wake,
                ch_arr, ch_cons, ch_fleft, seg_first, seg_last, seg_tx, seg_left, live, is_live,
                qa, orow,
                ntx, nrx, txcap, rxcap, usedtx, usedrx, active, rate, crate, gcnt)
        if st[S_DONE] != 0:
            _flush(qa, orow, st)
        n = int(st[S_NOUT])
        if n:
            chunks.append(tuple(orow[:n, i].copy() for i in range(4)))
            st[S_NOUT] = 0
        if progress is not None:
            progress(int(st[S_T]), est)
    if chunks:
        rq, re_, rtx, rrx = (np.concatenate(x) for x in zip(*chunks, strict=True))
    else:
        rq = re_ = rtx = rrx = np.zeros(0, dtype=np.int64)
    return RunResult(part_issue=part_issue, part_start=part_start, part_end=part_end,
                     seg_first=seg_first, seg_last=seg_last, seg_tx=seg_tx, seg_left=seg_left,
                     rows_q=rq, rows_e=re_, rows_tx=rtx, rows_rx=rrx, t_end_ns=int(st[S_T]),
                     hung=bool(st[S_DONE] == 2), ticks=int(st[S_TICKS]))
