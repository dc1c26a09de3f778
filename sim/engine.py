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
from collections.abc import Callable

import numpy as np
from pulse.sim.kernel import _kernel
from pulse.sim.kernel_state import (
    F_CAP,
    F_HOST_MEAN,
    F_POST_MEAN,
    P_EOFF,
    P_EPOCH,
    P_FEND,
    P_FLAP_DOWN,
    P_FLAP_PERIOD,
    P_ONSET,
    P_SEED,
    P_TLIMIT,
    S_DONE,
    S_FUTURE,
    S_NOUT,
    S_T,
    S_TICKS,
    TICK_NS,
    _flush,
    _retire,
)
from pulse.sim.messages import Window
from pulse.sim.workload import Job

RowSink = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, "int | None"], None]
"""Receives epoch rows as the run produces them: (qp, epoch, tx, rx, frontier), where every
row still to come has an epoch >= ``frontier`` on its QP's node clock (None: the run is over,
no row follows)."""

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
    laid_steps: int = 0
    """The most steps whose messages were laid out at once."""


def run_engine(job: Job, an: Anomaly, node_off: np.ndarray, eoff_ns: int, seed: int,
               progress: Callable[[int, int], None] | None = None, slice_ns: int = 20_000_000,
               sink: RowSink | None = None, buffer_rows: int | None = None,
               window_steps: int = 1) -> RunResult:
    """Run the kernel in slices of true time; ``progress(t_ns, t_est_ns)`` after each.

    With ``sink``, the epoch rows go to it as they are produced (after each slice, and
    whenever the kernel's row buffer fills) and the result holds none, so a run's memory does
    not grow with its length; without, the result holds them all. ``buffer_rows`` (tests)
    sizes the kernel's row buffer: never what the rows are, only how often they come.

    The job's messages are laid out ``window_steps`` steps ahead of the furthest node and
    dropped once their step is through (:class:`pulse.sim.messages.Window`), so memory does not
    grow with the number of steps either; like ``buffer_rows``, the window never changes the
    run, only how much of the job is laid out at once."""
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
    conn_next = np.zeros(C, dtype=np.int64)
    conn_txhead = np.zeros(C, dtype=np.int64)
    conn_prog = np.zeros(C, dtype=np.int64)
    conn_debt = np.zeros(C, dtype=np.int64)
    conn_carry = np.zeros(C)
    conn_wait = np.full(C, -1, dtype=np.int64)
    conn_wake = np.zeros(C, dtype=np.int64)
    S = len(job.seg_conn)
    seg_first = np.full(S, -1, dtype=np.int64)
    seg_last = np.full(S, -1, dtype=np.int64)
    seg_tx = np.zeros(S, dtype=np.int64)
    seg_left = job.seg_nchunks.astype(np.int64)
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
    cap_rows = 3 * nq + max(1, buffer_rows if buffer_rows is not None else nq + (1 << 20))
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
    min_shift = int(qa[:, 4].min()) if nq else 0

    T = len(job.steps)
    if not (job.step_last[:-1] >= 0).all():
        window_steps = T  # no step boundary the run can stop at: the whole job at once
    win = Window(job.steps, C, S)
    win.move(0, min(max(window_steps, 1), T), (conn_next, conn_txhead))
    prog_stop = _prog_stop(job, win.b)
    laid = win.b - win.a

    t_stop = int(st[S_T]) + slice_ns
    while st[S_DONE] == 0:
        w = win.arrays
        _kernel(t_stop, st, rng, P, FP,
                job.conn_src_node, job.conn_dst_node, job.conn_src_nic, job.conn_dst_nic,
                win.lo, win.hi, job.part_prev, job.cts_lo, job.cts_hi, job.cts_conn, job.cts_count,
                job.ps_lo, job.ps_hi, job.ps_conn,
                job.group_lo, job.group_hi, job.group_parts, job.prog_lo, job.prog_hi,
                job.instr_type, job.instr_arg, job.instr_jit,
                w["ch_conn"], w["ch_bytes"], w["ch_sp"], w["ch_rp"], w["ch_dep"], w["ch_fwd"], w["ch_credit"],
                w["ch_arrive_consume"], w["ch_grants"], w["ch_seg"], w["ch_dep2"], w["ch_fwd2"], win.seg_wake,
                win.seg0, prog_stop,
                an.nic_tx_f, an.nic_rx_f, an.nic_loss, an.nic_flap, an.nic_burst, an.conn_grp, an.grp_cap,
                an.node_cf, an.node_hang, an.node_cpu,
                node_pc, node_busy, part_issue, part_start, part_end, part_left, pend,
                conn_next, conn_txhead, conn_prog, conn_debt, conn_carry, conn_wait, conn_wake,
                w["ch_arr"], w["ch_cons"], w["ch_fleft"], seg_first, seg_last, seg_tx, seg_left, live, is_live,
                qa, orow,
                ntx, nrx, txcap, rxcap, usedtx, usedrx, active, rate, crate, gcnt)
        del w
        done = st[S_DONE] != 0
        if not done:
            _slide(win, job, node_pc, part_end, (conn_next, conn_txhead))
            prog_stop = _prog_stop(job, win.b)
            laid = max(laid, win.b - win.a)
        if done:
            _flush(qa, orow, st)
        else:
            _retire(qa, orow, st, st[S_T])
        n = int(st[S_NOUT])
        q, e, tx, rx = (orow[:n, i].copy() for i in range(4))
        st[S_NOUT] = 0
        if sink is not None:
            # the kernel resumes at st[S_T] and every later record is at that time or after,
            # on an epoch of its node's clock no earlier than this
            sink(q, e, tx, rx, None if done else (int(st[S_T]) + min_shift) // epoch)
        elif n:
            chunks.append((q, e, tx, rx))
        if done or st[S_T] >= t_stop:
            t_stop = int(st[S_T]) + slice_ns
            if progress is not None:
                progress(int(st[S_T]), est)
    if chunks:
        rq, re_, rtx, rrx = (np.concatenate(x) for x in zip(*chunks, strict=True))
    else:
        rq = re_ = rtx = rrx = np.zeros(0, dtype=np.int64)
    return RunResult(part_issue=part_issue, part_start=part_start, part_end=part_end,
                     seg_first=seg_first, seg_last=seg_last, seg_tx=seg_tx, seg_left=seg_left,
                     rows_q=rq, rows_e=re_, rows_tx=rtx, rows_rx=rrx, t_end_ns=int(st[S_T]),
                     hung=bool(st[S_DONE] == 2), ticks=int(st[S_TICKS]),
                     laid_steps=laid)


def _prog_stop(job: Job, b: int) -> np.ndarray:
    """Per node, the instruction at which the run must stop for step ``b`` to be laid out."""
    if b >= len(job.steps):
        return np.full(len(job.prog_lo), 1 << 62, dtype=np.int64)
    return job.step_last[b - 1]


def _slide(win: Window, job: Job, node_pc: np.ndarray, part_end: np.ndarray,
           cursors: tuple[np.ndarray, ...]) -> None:
    """Drop the window's finished steps, and lay out the next step once a node is at the
    last instruction of the window's last one."""
    T = len(job.steps)
    a, b = win.a, win.b
    # a step is through when all its parts ended (then all its messages arrived, and were
    # consumed: a forwarding message is posted before it arrives)
    while a < b and (part_end[job.step_parts[a - 1] if a else 0:job.step_parts[a]] >= 0).all() \
            and win.step_done(a):
        a += 1
    stop = _prog_stop(job, b)
    if b < T and (node_pc >= stop).any():
        b += 1
    if (a, b) != (win.a, win.b):
        win.move(a, b, cursors)
