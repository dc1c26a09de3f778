"""The agent's TCP join on real sockets of this process (its /proc entries are real): owner
by /proc, peer by the other node's announcement, ring from the bytes, an agreed start."""

from __future__ import annotations

import os
import socket
import time

import numpy as np
import pytest
from pulse.producers import agent_join
from pulse.producers.agent_join import TcpJoin, process_connections

from pulse.events import CommEvent, FlowEvent, OpEvent
from pulse.samples import make_batch

A, B = "127.0.0.2", "127.0.0.3"
CID = "torch:0123456789abcdef"
EPOCH = 256_000


@pytest.fixture
def conn():  # type: ignore[no-untyped-def]
    srv = socket.socket()
    srv.bind((B, 0))
    srv.listen(1)
    cli = socket.socket()
    cli.bind((A, 0))
    cli.connect(srv.getsockname())
    peer, _ = srv.accept()
    yield cli.getsockname()[1], srv.getsockname()[1]
    for s in (cli, peer, srv):
        s.close()


def _op(seq: int, t: int) -> OpEvent:
    return OpEvent(job="j", node="a", comm_id=CID, rank=0, seq=seq, kind="AllReduce", count=1 << 20,
                   dtype="float32", bytes=4 << 20, nranks=2, t_host_ns=t, source="torch")


def _batch(seq: int, t0: int, flows: list[int], tx: int) -> object:
    n = len(flows)
    return make_batch(node="a", nic="eth0", t0_ns=t0, epoch_ns=EPOCH, batch_seq=seq, flow=np.array(flows),
                      epoch=np.zeros(n, np.int64), tx_bytes=np.full(n, tx), rx_bytes=np.full(n, 100))


def test_process_connections_reads_this_process(conn: tuple[int, int]) -> None:
    cport, sport = conn
    mine = process_connections(os.getpid())
    assert (A, cport, B, sport) in mine and (B, sport, A, cport) in mine


def test_join_binds_orders_and_starts_together(conn: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    cport, sport = conn
    monkeypatch.setattr(agent_join, "NEXT_STABLE_TICKS", 2)
    monkeypatch.setattr(agent_join, "START_MIN_SEQ", 0)  # (its own test below)
    j = TcpJoin("a", [A])
    comm = CommEvent(job="j", node="a", comm_id=CID, rank=0, nranks=2, pid=os.getpid(), source="torch")
    # nothing of a torch communicator goes out before its ring and start are known
    assert j.hook_events([comm, *[_op(s, 1_000 + s) for s in range(10)]]) == []
    tx = FlowEvent(job="", node="a", nic="eth0", flow=0, transport="tcp", src=A, sport=cport, dst=B, dport=sport)
    rx = FlowEvent(job="", node="a", nic="eth0", flow=1, transport="tcp", src=B, sport=sport, dst=A, dport=cport)
    other = FlowEvent(job="", node="a", nic="eth0", flow=2, transport="tcp", src=A, sport=1, dst=B, dport=2)
    roce = FlowEvent(job="", node="a", nic="eth0", flow=3, transport="roce", src=A, dst=B, remote_qpn=7)
    assert j.capture_events([tx, rx, other, roce]) == [roce]
    j.tick()  # owners from /proc
    out = j.batches([_batch(0, 0, [0, 1, 2, 3], 3 << 20)])
    assert [b.flow.tolist() for b in out] == [[3]]  # the RoCE flow passes; TCP waits or is dropped
    assert j.stats.unbound_tcp_rows == 1
    # the other node announces its address, its rank and its successor (rank 0)
    j.directory([{"node": "b", "addresses": [B], "comms": {CID: {"nranks": 2, "ranks": {"1": {"next": 0,
                                                                                             "start": 12}}}}}])
    for _ in range(2):
        assert j.tick() == ([], [])
    g = j.gates[CID]
    # proposed ahead of the rank: its last op + 1 + the lead (the minimum: no recent ops)
    assert g.ring == [0, 1] and g.my_start == {0: 10 + agent_join.START_MIN_OPS}
    assert j.announce()["comms"][CID]["ranks"]["0"] == {"next": 1, "start": 14}
    assert g.start == 14  # the largest proposal: every node starts there
    t_first = 5 * EPOCH
    j.hook_events([_op(s, 2_000 + s) for s in range(10, 14)])
    assert j.tick() == ([], [])  # op 14 not seen yet on this node
    j.hook_events([_op(14, t_first), _op(15, t_first + 1)])
    batches, events = j.tick()
    comms = [e for e in events if isinstance(e, CommEvent)]
    assert [c.rings for c in comms] == [None, [[0, 1]]]
    flows = {(e.flow, e.direction, e.peer, e.rank, e.comm_id) for e in events if isinstance(e, FlowEvent)}
    assert flows == {(0, "send", 1, 0, CID), (1, "recv", 1, 0, CID)}
    assert [e.seq for e in events if isinstance(e, OpEvent)] == [14, 15]
    # the buffered rows start at the first operator's issue time: the batch at t0=0 is cut
    assert batches == []
    later = j.batches([_batch(1, 10 * EPOCH, [0, 1, 2], 1000)])
    assert [b.flow.tolist() for b in later] == [[0, 1]]
    assert j.hook_events([_op(16, 0)])[0].seq == 16  # released: ops pass as they come


def test_a_new_job_with_the_same_comm_id_starts_over() -> None:
    j = TcpJoin("a", [A])
    ev = CommEvent(job="j", node="a", comm_id=CID, rank=0, nranks=2, pid=111, source="torch")
    j.hook_events([ev])
    j.gates[CID].my_start[0] = 3
    j.hook_events([CommEvent(job="j2", node="a", comm_id=CID, rank=0, nranks=2, pid=222, source="torch")])
    assert j.gates[CID].pids == {0: 222} and j.gates[CID].my_start == {}
    j.forget_ended([])
    assert j.gates == {}


def test_without_a_capture_nothing_is_gated() -> None:
    j = TcpJoin("a", [], gate=False)
    ev = CommEvent(job="j", node="a", comm_id=CID, rank=0, nranks=2, pid=1, source="torch")
    assert j.hook_events([ev, _op(0, 1)]) == [ev, _op(0, 1)]


def test_the_start_is_proposed_ahead_at_the_ranks_pace() -> None:
    j = TcpJoin("a", [A])
    j.hook_events([CommEvent(job="j", node="a", comm_id=CID, rank=0, nranks=2, pid=111, source="torch")])
    now = time.time_ns()
    # 20 operators in the last 5 s: 4/s, so 3 s ahead is 12 operators
    j.hook_events([_op(s, now - (20 - s) * 250_000_000) for s in range(20)])
    assert j._lead_ops(j.gates[CID], 0) == 12
    assert j._lead_ops(j.gates[CID], 1) == agent_join.START_MIN_OPS  # no recent ops of that rank


def test_the_start_is_never_where_the_segmenter_waits_for_seq_0() -> None:
    from pulse.segmentation.params import SegmentParams

    assert SegmentParams().late_batches < agent_join.START_MIN_SEQ
    j = TcpJoin("a", [A])
    j.hook_events([CommEvent(job="j", node="a", comm_id=CID, rank=0, nranks=2, pid=111, source="torch")])
    g = j.gates[CID]
    g.ring = [0, 1]
    j.tick()
    assert g.my_start == {0: agent_join.START_MIN_SEQ}
