"""torch.distributed injection: a real Gloo job on the CPU that knows nothing of Pulse."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pulse.hooks import torch_injection_dir

from pulse.events import CommEvent, OpEvent, decode

pytest.importorskip("torch")

WORLD = 3
JOB = r'''
import json, os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def run(rank, world, port, outdir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    done = []
    def attempt(name, fn):
        try:
            fn()
            done.append(name)
        except Exception as exc:
            done.append(f"FAILED {name}: {exc!r}")
    attempt("all_reduce", lambda: dist.all_reduce(torch.ones(1000)))
    attempt("all_gather", lambda: dist.all_gather([torch.zeros(10, dtype=torch.int64) for _ in range(world)],
                                                  torch.ones(10, dtype=torch.int64)))
    attempt("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.zeros(8 * world), torch.ones(8)))
    attempt("reduce_scatter", lambda: dist.reduce_scatter(torch.zeros(4), [torch.ones(4) for _ in range(world)]))
    attempt("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * world)))
    attempt("broadcast", lambda: dist.broadcast(torch.ones(16, dtype=torch.float64), src=1))
    attempt("reduce", lambda: dist.reduce(torch.ones(16, dtype=torch.bfloat16), dst=2))
    attempt("all_to_all", lambda: dist.all_to_all([torch.zeros(5) for _ in range(world)],
                                                  [torch.ones(5) for _ in range(world)]))
    attempt("all_to_all_single", lambda: dist.all_to_all_single(torch.zeros(6 * world), torch.ones(6 * world)))
    attempt("barrier", lambda: dist.barrier())
    def p2p():
        if rank == 0:
            dist.send(torch.ones(7), dst=1)
        elif rank == 1:
            dist.recv(torch.zeros(7), src=0)
    attempt("send_recv", p2p)
    def batch():
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        ops = [dist.P2POp(dist.isend, torch.ones(3), nxt), dist.P2POp(dist.irecv, torch.zeros(3), prv)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    attempt("batch_isend_irecv", batch)
    sub = dist.new_group([1, 2])
    if rank in (1, 2):
        attempt("sub_all_reduce", lambda: dist.all_reduce(torch.ones(2, dtype=torch.float16), group=sub))
    with open(os.path.join(outdir, f"done-{rank}.json"), "w") as fh:
        json.dump(done, fh)
    dist.barrier()
    dist.destroy_process_group()
    # No Gloo teardown inside the interpreter's finalization (torch sometimes aborts there);
    # the injection's records are single unbuffered writes, already on disk.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

if __name__ == "__main__":
    world, port, outdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    mp.spawn(run, args=(world, port, outdir), nprocs=world)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PULSE_") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def expected_ops(rank: int) -> list[dict]:
    """What each world-group call must produce on `rank` (seq = position)."""
    others = [p for p in range(WORLD) if p != rank]
    nxt, prv = (rank + 1) % WORLD, (rank - 1) % WORLD
    out = [
        {"kind": "AllReduce", "count": 1000, "dtype": "float32", "bytes": 4000},
        {"kind": "AllGather", "count": 10 * WORLD, "dtype": "int64", "bytes": 80 * WORLD},
        {"kind": "AllGather", "count": 8 * WORLD, "dtype": "float32", "bytes": 32 * WORLD},
        {"kind": "ReduceScatter", "count": 4 * WORLD, "dtype": "float32", "bytes": 16 * WORLD},
        {"kind": "ReduceScatter", "count": 4 * WORLD, "dtype": "float32", "bytes": 16 * WORLD},
        {"kind": "Broadcast", "count": 16, "dtype": "float64", "bytes": 128, "root": 1},
        {"kind": "Reduce", "count": 16, "dtype": "bfloat16", "bytes": 32, "root": 2},
        {"kind": "GroupP2P", "count": 5 * len(others), "dtype": "float32", "bytes": 20 * len(others), "peers": others,
         "peer_send_bytes": [20] * len(others), "peer_recv_bytes": [20] * len(others)},
        {"kind": "GroupP2P", "count": 6 * len(others), "dtype": "float32", "bytes": 24 * len(others), "peers": others,
         "peer_send_bytes": [24] * len(others), "peer_recv_bytes": [24] * len(others)},
        {"kind": "AllReduce", "count": 0, "dtype": "bytes", "bytes": 0},  # barrier
    ]
    if rank == 0:
        out.append({"kind": "Send", "count": 7, "dtype": "float32", "bytes": 28, "peer": 1})
    if rank == 1:
        out.append({"kind": "Recv", "count": 7, "dtype": "float32", "bytes": 28, "peer": 0})
    peers = sorted({nxt, prv})
    out.append({"kind": "GroupP2P", "count": 3, "dtype": "float32", "bytes": 12, "peers": peers,
                "peer_send_bytes": [12 if p == nxt else 0 for p in peers],
                "peer_recv_bytes": [12 if p == prv else 0 for p in peers]})
    out.append({"kind": "AllReduce", "count": 0, "dtype": "bytes", "bytes": 0})  # the closing barrier
    return out


@pytest.fixture(scope="module")
def gloo_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gloo")
    out, other, marks = root / "hooks", root / "other", root / "marks"
    for d in (out, other, marks):
        d.mkdir()
    # A pre-existing sitecustomize later on the path: the injection must chain it.
    (other / "sitecustomize.py").write_text(
        "import os\nopen(os.path.join(os.environ['CHAIN_MARK_DIR'], str(os.getpid())), 'w').close()\n")
    script = root / "job.py"
    script.write_text(JOB)
    env = clean_env(PYTHONPATH=f"{torch_injection_dir()}{os.pathsep}{other}", PULSE_HOOK_DIR=str(out),
                    PULSE_NODE="node-07", PULSE_JOB="job1", CHAIN_MARK_DIR=str(marks))
    res = subprocess.run([sys.executable, str(script), str(WORLD), str(free_port()), str(root)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return root


def load(root: Path) -> dict[int, list]:
    by_rank: dict[int, list] = {}
    files = sorted((root / "hooks").glob("torch-node-07-*.jsonl"))
    assert len(files) == WORLD  # one file per rank process; the launcher made no calls
    for f in files:
        events = [decode(line) for line in f.read_bytes().splitlines()]
        world = [e for e in events if isinstance(e, CommEvent) and e.nranks == WORLD]
        assert len(world) == 1
        by_rank[world[0].rank] = events
    return by_rank


def test_every_rank_records_one_op_per_collective(gloo_job: Path) -> None:
    for rank in range(WORLD):
        done = json.loads((gloo_job / f"done-{rank}.json").read_text())
        assert not [d for d in done if d.startswith("FAILED")], done
    by_rank = load(gloo_job)
    world_ids = set()
    for rank, events in by_rank.items():
        comm = next(e for e in events if isinstance(e, CommEvent) and e.nranks == WORLD)
        world_ids.add(comm.comm_id)
        assert (comm.node, comm.job, comm.source, comm.rank) == ("node-07", "job1", "torch", rank)
        ops = [e for e in events if isinstance(e, OpEvent) and e.comm_id == comm.comm_id]
        assert [o.seq for o in ops] == list(range(len(ops)))
        got = []
        for o in ops:
            d = {k: v for k, v in o.to_dict().items()
                 if k in ("kind", "count", "dtype", "bytes", "root", "peer", "peers", "peer_send_bytes", "peer_recv_bytes")}
            got.append(d)
            assert (o.rank, o.nranks, o.node, o.job) == (rank, WORLD, "node-07", "job1")
            assert o.t_host_ns is not None and o.t_host_ns > 1_600_000_000 * 10**9
        assert got == expected_ops(rank)
    assert len(world_ids) == 1


def test_subgroup_has_its_own_comm_and_group_ranks(gloo_job: Path) -> None:
    by_rank = load(gloo_job)
    sub_ids = set()
    for rank, events in by_rank.items():
        subs = [e for e in events if isinstance(e, CommEvent) and e.nranks == 2]
        if rank == 0:
            assert subs == []  # not a member: no comm, no op
            continue
        (sub,) = subs
        sub_ids.add(sub.comm_id)
        assert sub.rank == rank - 1  # group rank, not global rank
        (op,) = [e for e in events if isinstance(e, OpEvent) and e.comm_id == sub.comm_id]
        assert (op.kind, op.bytes, op.dtype, op.seq, op.rank, op.nranks) == ("AllReduce", 4, "float16", 0, rank - 1, 2)
    assert len(sub_ids) == 1
    world_id = next(e.comm_id for e in by_rank[0] if isinstance(e, CommEvent))
    assert world_id not in sub_ids


def test_existing_sitecustomize_is_chained(gloo_job: Path) -> None:
    # launcher + WORLD spawned workers (+ possibly a resource tracker) each ran the other file
    assert len(list((gloo_job / "marks").iterdir())) >= WORLD + 1


PROBE = r"""
import sys
before = "torch" in sys.modules
import torch.distributed as dist
print(before, hasattr(dist.all_reduce, "__pulse_wrapped__"))
"""


def test_inactive_without_a_pulse_variable() -> None:
    off = subprocess.run([sys.executable, "-c", PROBE], env=clean_env(PYTHONPATH=str(torch_injection_dir())),
                         capture_output=True, text=True, timeout=120)
    assert off.stdout.split() == ["False", "False"], off.stderr


def test_active_injection_does_not_import_torch(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-c", "import sys; print(sorted(m for m in sys.modules if 'torch' in m))"],
                         env=clean_env(PYTHONPATH=str(torch_injection_dir()), PULSE_HOOK_DIR=str(tmp_path)),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stderr


SINGLE = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
t = torch.ones(4)
dist.all_reduce(t)
dist.broadcast(t, src=0)
dist.all_gather_into_tensor(torch.zeros(4), t)
dist.barrier()
print("ok", hasattr(dist.all_reduce, "__pulse_wrapped__"), t.tolist())
# Destroyed here, the group is freed here (nothing else holds it): no Gloo teardown is
# left for the interpreter's finalization, where torch sometimes aborts.
dist.destroy_process_group()
"""


def test_unwritable_hook_dir_never_breaks_the_job() -> None:
    res = subprocess.run([sys.executable, "-c", SINGLE],
                         env=clean_env(PYTHONPATH=str(torch_injection_dir()), PULSE_HOOK_DIR="/nonexistent/pulse"),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "ok True [1.0, 1.0, 1.0, 1.0]"  # wrapped, recording failed, job unaffected


RELEASE = r"""
import gc, weakref, torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
dist.all_reduce(torch.ones(2))
sub = dist.new_group([0])
dist.all_reduce(torch.ones(2), group=sub)
refs = [weakref.ref(dist.group.WORLD), weakref.ref(sub)]
del sub
dist.destroy_process_group()
gc.collect()
print("alive", sum(r() is not None for r in refs), hasattr(dist.all_reduce, "__pulse_wrapped__"))
"""


def test_destroyed_groups_are_not_kept_alive(tmp_path: Path) -> None:
    # A group the injection held on to outlived destroy_process_group to the interpreter's
    # exit, where torch's Gloo teardown sometimes aborts the process (SIGABRT in CI).
    res = subprocess.run([sys.executable, "-c", RELEASE],
                         env=clean_env(PYTHONPATH=str(torch_injection_dir()), PULSE_HOOK_DIR=str(tmp_path)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "alive 0 True"
    assert any(tmp_path.glob("torch-*.jsonl"))  # it did record the two groups' operators


PLANTED = r"""
import os, sys, torch, torch.distributed as dist
d = os.environ["PULSE_HOOK_DIR"]
os.symlink(sys.argv[1], os.path.join(d, f"torch-nodeA-{os.getpid()}.jsonl"))  # the attacker's guess
dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
t = torch.ones(4)
dist.all_reduce(t)
dist.broadcast(t, src=0)
print("ok", t.tolist(), sys.modules["sitecustomize"]._refusals)
dist.destroy_process_group()
"""


def test_planted_symlink_is_not_followed(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky and ours, like /tmp for a root job: allowed, but never followed
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    res = subprocess.run([sys.executable, "-c", PLANTED, str(victim)],
                         env=clean_env(PYTHONPATH=str(torch_injection_dir()), PULSE_HOOK_DIR=str(shared),
                                       PULSE_NODE="nodeA"),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "ok [1.0, 1.0, 1.0, 1.0] {'record file already exists (not followed)': 1}"
    assert victim.read_text() == "precious\n"
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    res = subprocess.run([sys.executable, "-c", SINGLE],
                         env=clean_env(PYTHONPATH=str(torch_injection_dir()), PULSE_HOOK_DIR=str(open_dir)),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert list(open_dir.iterdir()) == []  # refused: writable by others and not sticky
