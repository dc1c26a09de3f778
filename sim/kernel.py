"""The engine kernel: one loop over ticks of true time (see :mod:`pulse.sim.engine` for what a
tick does), over the job's and the anomaly's arrays; it stops at ``t_stop``, when the job
ends or hangs, or when its row buffer is nearly full, and resumes from its state arrays."""

from __future__ import annotations

import numba
from pulse.sim.builder import COMPUTE, ISSUE
from pulse.sim.kernel_state import (
    BURST_BLOCK_NS,
    BURST_LEFT,
    CTS_BYTES,
    F_CAP,
    F_HOST_MEAN,
    F_POST_MEAN,
    JITTER_BLOCK_NS,
    LAT_NS,
    MTU,
    NEVER,
    NIC_JITTER,
    P_EPOCH,
    P_FEND,
    P_FLAP_DOWN,
    P_FLAP_PERIOD,
    P_ONSET,
    P_SEED,
    P_TLIMIT,
    RTT_NS,
    S_DONE,
    S_FUTURE,
    S_NLIVE,
    S_NOUT,
    S_NPEND,
    S_QUIET,
    S_T,
    S_TICKS,
    TICK_NS,
    _expo,
    _hash01,
    _link_up,
    _poisson,
    _rec_cts,
)


@numba.njit(cache=True)
def _kernel(t_stop, st, rng, P, FP,
            # static job
            conn_src_node, conn_dst_node, conn_src_nic, conn_dst_nic, conn_lo, conn_hi,
            part_prev, cts_lo, cts_hi, cts_conn, cts_count, ps_lo, ps_hi, ps_conn,
            group_lo, group_hi, group_parts, prog_lo, prog_hi, instr_type, instr_arg, instr_jit,
            ch_conn, ch_bytes, ch_sp, ch_rp, ch_dep, ch_fwd, ch_credit, ch_arrive_consume, ch_grants, ch_seg,
            ch_dep2, ch_fwd2, seg_wake, conn_seg0, prog_stop,
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
    # a tick emits at most two rows per QP (its records fall at t and at a link-up time);
    # stopping before a tick that might overflow the row buffer leaves every state array as
    # the tick found it, so the driver drains the rows and resumes this very tick
    room = orow.shape[0] - 3 * qa.shape[0]
    while t < t_stop:
        if st[S_NOUT] > room:
            break
        if t >= t_limit:
            st[S_DONE] = 2
            break
        # a node at the last instruction of the window's last step (a compute it cannot pass
        # this tick) may issue the next step's operators from the next tick on: stop, still
        # before this tick changes anything, for the driver to lay out the next step
        ahead = False
        for n in range(n_nodes):
            if node_pc[n] >= prog_stop[n]:
                ahead = True
        if ahead:
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
                    _rec_cts(c, tc, b, after and nic_tx_f[conn_dst_nic[c]] == 0.0,
                             after and nic_rx_f[conn_src_nic[c]] == 0.0, epoch, qa, orow, st)
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
                        _rec_cts(dc, tc, CTS_BYTES, after and nic_tx_f[conn_dst_nic[dc]] == 0.0,
                                 after and nic_rx_f[conn_src_nic[dc]] == 0.0, epoch, qa, orow, st)
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
                    # the message resent belongs to a dropped step: its segment is kept
                    sg = ch_seg[hs] if hs >= conn_lo[c] else conn_seg0[c]
                    if sg >= 0:
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
                                _rec_cts(c, t, CTS_BYTES, after and nic_tx_f[conn_dst_nic[c]] == 0.0,
                                         after and nic_rx_f[conn_src_nic[c]] == 0.0, epoch, qa, orow, st)
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
