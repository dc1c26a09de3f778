"""Tree AllReduce: NCCL's double binary tree, the auto choice, conservation per the tree rule
of docs/semantics.md, synchronisation, a slow NIC, and segmentation on a tree trace."""

from __future__ import annotations

import collections
import filecmp
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from pulse.segmentation import associate, segment_flows
from pulse.sim.builder import Builder
from pulse.sim.config import SimConfig
from pulse.sim.engine import Anomaly
from pulse.sim.run import simulate
from pulse.sim.trees import choose_algo, comm_trees, crossover_bytes, double_tree, tree_load
from pulse.sim.workload import DENSE, MOE
from test_engine import CAP, _run
from test_trace import flow_table, flow_totals, true_ops

from pulse.cli import main
from pulse.errors import ConfigError
from pulse.nccl_chunks import tree_chunk_bytes
from pulse.trace import TraceReader, read_truth


def _ref_btree(n: int) -> list[tuple[int, list[int]]]:
    """Naive reference: the tree rooted at 0 where rank r's level is its lowest set bit
    (NCCL trees.cc illustration), built top-down by halving intervals."""
    parent = [-1] * n
    kids: list[list[int]] = [[] for _ in range(n)]
    top = 1
    while top < n:
        top <<= 1
    # root 0 has one child, top/2; a node r at level bit b has children r -/+ b/2
    # (the right one moved down while it falls outside 0..n-1)
    stack = [(0, top)]
    while stack:
        r, bit = stack.pop()
        cands = [r + bit // 2] if r == 0 else ([r - bit // 2] if bit > 1 else [])
        if r != 0 and bit > 1:
            low = bit // 2
            while low and r + low >= n:
                low //= 2
            if low:
                cands.append(r + low)
        for c in cands:
            if 0 < c < n and parent[c] < 0 and c != r:
                parent[c] = r
                kids[r].append(c)
                cb = 1
                while not c & cb:
                    cb <<= 1
                stack.append((c, cb))
    return [(parent[r], sorted(kids[r])) for r in range(n)]


@pytest.mark.parametrize("n", list(range(1, 34)))
def test_double_tree_is_two_spanning_trees(n: int) -> None:
    t0, t1 = double_tree(n)
    assert [(p, sorted(k)) for p, k in zip(t0.parent, t0.children, strict=True)] == _ref_btree(n)
    for t in (t0, t1):
        assert t.parent.count(-1) == 1
        for r in range(n):
            assert len(t.children[r]) <= 2
            for k in t.children[r]:
                assert t.parent[k] == r
        # every rank reaches the root
        for r in range(n):
            seen, x = set(), r
            while t.parent[x] >= 0:
                assert x not in seen
                seen.add(x)
                x = t.parent[x]
            assert x == t.root
    if n > 2:
        # a rank that is an interior node of one tree is (nearly always) a leaf of the other
        interior = [sum(bool(t.children[r]) and t.parent[r] >= 0 for t in (t0, t1)) for r in range(n)]
        assert max(interior) <= 1 or n % 2


def test_trees_match_nccl_illustrations() -> None:
    t0, t1 = double_tree(13)  # trees.cc: 0 - 8, 8 - 4 / 12, ... ; shift by one for odd n
    assert t0.children[0] == (8,) and set(t0.children[8]) == {4, 12} and t0.children[12] == (10,)
    assert t1.root == 1 and t1.children[1] == (9,)
    t0, t1 = double_tree(12)  # mirror for even n: root 11
    assert t1.root == 11 and t1.children[11] == (3,)


def test_comm_trees_follow_the_event_contract() -> None:
    trees = double_tree(4)
    for r in range(4):
        rows = comm_trees(trees, r, 2)
        assert len(rows) == 2
        for ch, row in enumerate(rows):
            t = trees[ch]
            assert len(row) == 5 and row[0] == r and row[1] == t.parent[r]
            assert sorted(x for x in row[2:] if x >= 0) == sorted(t.children[r])


def test_auto_picks_tree_only_for_small_buckets_and_keeps_the_defaults_ring() -> None:
    for nbytes in (DENSE.bucket_bytes, MOE.bucket_bytes):
        assert choose_algo("auto", nbytes, 4, 2, 400.0) == "ring"
    assert choose_algo("auto", 256 << 10, 4, 2, 400.0) == "tree"
    x = crossover_bytes(4, 2, 400.0)
    assert 512 << 10 < x < 8 << 20
    assert choose_algo("auto", x, 4, 2, 400.0) == "tree"
    assert choose_algo("auto", x + 1, 4, 2, 400.0) == "ring"
    # more nodes: the ring's latency grows linearly, the tree's logarithmically
    assert crossover_bytes(16, 2, 400.0) > crossover_bytes(4, 2, 400.0)
    assert choose_algo("tree", 1 << 30, 4, 2, 400.0) == "tree"
    assert choose_algo("ring", 1, 4, 2, 400.0) == "ring"
    # the busiest rank of a double binary tree moves 2 S (interior in one tree, leaf in the other)
    assert tree_load(double_tree(4), 2) == pytest.approx(2.0)


def test_tree_chunking_follows_nccl() -> None:
    assert tree_chunk_bytes(64 << 20, 2, 2) == 512 << 10
    assert tree_chunk_bytes(8 << 20, 2, 2) == 256 << 10  # 16 chunks per channel = depth x 8
    assert tree_chunk_bytes(1 << 20, 2, 2) == 64 << 10  # 8 = depth x 4
    assert tree_chunk_bytes(64 << 10, 2, 2) == 32 << 10  # the floor


@pytest.fixture(scope="module")
def tree_trace(tmp_path_factory: pytest.TempPathFactory, small: dict) -> Path:
    """Auto picks tree for 1 MiB buckets (the default 64 MiB stay ring)."""
    out = tmp_path_factory.mktemp("sim") / "tree"
    res = CliRunner().invoke(main, ["sim", "--scenario", "healthy", "--seed", "5", "--nodes", str(small["nodes"]),
                                    "--gpus-per-node", str(small["gpus_per_node"]), "--nics-per-node",
                                    str(small["nics_per_node"]), "--steps", "3", "--bucket-mb", "1",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "tree AllReduce" in res.output
    return out


def _tree_expected(tr: TraceReader) -> tuple[collections.Counter, collections.Counter]:
    """docs/semantics.md: S / c on each send flow to a tree neighbour (parent or child) of the
    channel, 2(n-1)/n S / c to ring.next for ring AllReduce, S / c per channel for Send."""
    flows = flow_table(tr)
    events = list(tr.events())
    trees = {(e.comm_id, e.rank): e.trees for e in events if e.TYPE == "comm"}
    send = {(f.comm_id, f.rank, f.peer, f.channel): k for k, f in flows.items() if f.direction == "send"}
    expected: collections.Counter = collections.Counter()
    nops: collections.Counter = collections.Counter()
    for e in events:
        if e.TYPE != "op":
            continue
        c = e.nchannels
        if e.kind == "AllReduce":
            assert e.algo == "tree"
            rows = trees[(e.comm_id, e.rank)]
            assert rows is not None and len(rows) == c
            for ch, row in enumerate(rows):
                for peer in (x for x in row[1:] if x >= 0):
                    key = send[(e.comm_id, e.rank, peer, ch)]
                    expected[key] += e.bytes / c
                    nops[key] += 1
        elif e.kind == "Send":
            for ch in range(c):
                key = send[(e.comm_id, e.rank, e.peer, ch)]
                expected[key] += e.bytes / c
                nops[key] += 1
    return expected, nops


def test_tree_run_conserves_bytes(tree_trace: Path) -> None:
    tr = TraceReader(tree_trace)
    tx, _rx = flow_totals(tr)
    expected, nops = _tree_expected(tr)
    assert expected
    for key, exp in expected.items():
        assert tx[key] >= exp, key
        # equal up to 128-byte alignment of the last message (lossless: no retransmission)
        assert tx[key] - exp <= 1e-3 * exp + 4096 * nops[key], (key, tx[key], exp)
    flows = flow_table(tr)
    for key, f in flows.items():
        if f.direction == "send" and key not in expected:
            assert tx[key] == 0, key
    # every tree edge carries data both ways: reduce up and broadcast down
    dp_send = [k for k, f in flows.items() if f.direction == "send" and f.comm_id.startswith("dp")]
    assert dp_send and all(tx[k] > 0 for k in dp_send)


def test_tree_ranks_end_together(tree_trace: Path) -> None:
    tr = TraceReader(tree_trace)
    epoch = tr.meta["epoch_ns"]
    spreads, start_spreads = [], []
    for (comm, _), ranks in true_ops(tr).items():
        if comm.startswith("dp"):
            ends = [e for _, e in ranks.values()]
            assert None not in ends
            spreads.append(max(ends) - min(ends))
            starts = [s for s, _ in ranks.values()]
            start_spreads.append(max(starts) - min(starts))
    assert spreads
    assert np.median(start_spreads) > 10 * epoch  # they did not start together
    assert max(spreads) <= epoch, sorted(spreads)[-5:]


def test_segmentation_finds_the_tree_boundaries(tree_trace: Path) -> None:
    tr = TraceReader(tree_trace)
    truth = read_truth(tree_trace)
    epoch = truth["sim"]["epoch_ns"]
    assoc = associate(tr.events())
    segs = segment_flows(tr.batches(), assoc)
    idx = {(segs.node[i], segs.nic[i], int(segs.flow[i]), segs.comm_id[i], int(segs.seq[i])): i
           for i in range(len(segs))}
    t = truth["segments"]
    within = total = 0
    for j in range(len(t["node"])):
        if not t["comm_id"][j].startswith("dp"):
            continue
        key = (t["node"][j], t["nic"][j], int(t["flow"][j]), t["comm_id"][j], int(t["seq"][j]))
        i = idx[key]
        assert bool(segs.complete[i]) == bool(t["complete"][j]), key
        # the association expects S / c on each tree edge, exactly what the simulator's
        # chunks add up to (1 MiB buckets: 8 messages of 64 KiB per channel)
        assert int(segs.expected[i]) == int(t["expected_bytes"][j]) <= int(t["bytes"][j])
        total += 1
        within += (abs(int(segs.start_ns[i]) - t["start_ns"][j]) <= epoch
                   and abs(int(segs.end_ns[i]) - t["end_ns"][j]) <= epoch)
    assert total > 0
    assert within / total >= 0.99, (within, total)


def _tree_job(n: int, nbytes: int):  # type: ignore[no-untyped-def]
    rc = SimConfig(nodes=n, gpus_per_node=1, nics_per_node=1, steps=1).resolved()
    rng = np.random.default_rng(0)
    b = Builder(rc, rng)
    c = b.add_comm("dp-test", "dp", [(i, 0) for i in range(n)], 2, True)
    op = b.allreduce(c, nbytes, "tree")
    for r in range(n):
        g = b.group([op.parts[r]])
        b.issue(r, g)
        b.wait(r, g)
    return b, rc, rng, op


def test_tree_allreduce_runs_at_the_busiest_rank_pace() -> None:
    S, n = 32 << 20, 4
    b, rc, rng, op = _tree_job(n, S)
    _job, res = _run(b, rc, rng)
    ends = np.array([res.part_end[op.parts[r]] for r in range(n)])
    starts = np.array([res.part_start[op.parts[r]] for r in range(n)])
    ideal = tree_load(double_tree(n), 2) * S / CAP
    dur = ends.max() - starts.min()
    assert ideal <= dur <= ideal * 1.2, (dur, ideal)
    assert ends.max() - ends.min() <= 32_000
    assert (res.seg_tx == S // 2).all()


def test_one_slow_nic_slows_the_tree_allreduce() -> None:
    S, n = 32 << 20, 4
    durs, spans = [], []
    for factor in (1.0, 0.25):
        b, rc, rng, op = _tree_job(n, S)

        def slow(an: Anomaly, f: float = factor) -> None:
            an.nic_tx_f[2] = an.nic_rx_f[2] = f

        job, res = _run(b, rc, rng, slow)
        durs.append(max(res.part_end[op.parts[r]] for r in range(n)) - min(res.part_start[op.parts[r]] for r in range(n)))
        # an edge that does not touch NIC 2 (tree 1: 3 -> 1, the root's broadcast) waits for it
        e31 = int(np.flatnonzero((job.conn_src_node == 3) & (job.conn_dst_node == 1))[0])
        seg = int(np.flatnonzero(job.seg_conn == e31)[0])
        spans.append(res.seg_last[seg] - res.seg_first[seg])
        # every rank still ends with the slowest, up to the slow node forwarding the last
        # broadcast message to its children after the root is done
        ends = [res.part_end[op.parts[r]] for r in range(n)]
        assert max(ends) - min(ends) <= 0.05 * durs[-1]
    # node 2 is interior in tree 0: its NIC moves 2 S in and out, at a quarter of the rate
    assert durs[1] > 3.5 * durs[0], durs
    assert spans[1] > 3.0 * spans[0], spans


def test_algo_and_bucket_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="valid algorithms: auto, ring, tree"):
        SimConfig(algo="nvls").resolved()
    with pytest.raises(ConfigError, match="--bucket-mb"):
        SimConfig(bucket_mb=0.0).resolved()
    res = CliRunner().invoke(main, ["sim", "--algo", "double", "--out", "/nonexistent/x"])
    assert res.exit_code != 0 and "ring" in res.output


def test_forced_ring_and_tree_on_the_cli(tmp_path: Path, small: dict) -> None:
    base = ["sim", "--nodes", "4", "--gpus-per-node", "1", "--nics-per-node", "1", "--steps", "1", "--seed", "2"]
    algos = {}
    for algo in ("ring", "tree"):
        out = tmp_path / algo
        res = CliRunner().invoke(main, [*base, "--algo", algo, "--bucket-mb", "2", "--out", str(out)])
        assert res.exit_code == 0, res.output
        evs = list(TraceReader(out).events())
        algos[algo] = {e.algo for e in evs if e.TYPE == "op" and e.kind == "AllReduce"}
        trees = [e.trees for e in evs if e.TYPE == "comm" and e.comm_id.startswith("dp")]
        assert all((t is not None) == (algo == "tree") for t in trees)
    assert algos == {"ring": {"ring"}, "tree": {"tree"}}


def test_tree_run_is_deterministic(tmp_path: Path, small: dict) -> None:
    kw = dict(small, steps=1, scenario="nic-slow", onset_ms=20.0, seed=9, algo="tree", bucket_mb=2.0)
    a, b = tmp_path / "a", tmp_path / "b"
    simulate(SimConfig(**kw), a)  # type: ignore[arg-type]
    simulate(SimConfig(**kw), b)  # type: ignore[arg-type]
    files = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    assert files
    _match, mismatch, errors = filecmp.cmpfiles(a, b, files, shallow=False)
    assert not mismatch and not errors
