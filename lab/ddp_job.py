"""A small DDP training job over Gloo, run as a plain script in each lab namespace.

It knows nothing of Pulse (it imports only torch and the standard library); the lab reads
its stdout for progress ("step N t_ms=...", then "done" once its process group is
destroyed) and learns operators through the torch
injection on PYTHONPATH, exactly as it would on a tenant's job.

It ends with ``os._exit(0)``. Building DDP imports ``torch.distributed.nn``, whose functions
take ``group=group.WORLD`` as a default argument evaluated at import: once the group exists
they hold it, so ``destroy_process_group`` cannot free it and its Gloo threads (two workers,
the TCP event loop, rank 0's store server) live on until the interpreter's last garbage
collection destroys the group mid-finalization, the step where torch aborted now and then
("terminate called without an active exception"). Everything the job owes is written by
then (stdout flushed; the injection writes each record with one unbuffered write).
"""

import os
import sys
import time


def main() -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    steps = int(os.environ.get("LAB_STEPS", "20"))
    width = int(os.environ.get("LAB_WIDTH", "768"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, 16),
    )
    # Small buckets: several gradient AllReduces per step, as in a real job.
    ddp = DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(64, width)
    y = torch.randn(64, 16)
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        dt = (time.perf_counter() - t0) * 1e3
        print(f"step {step} t_ms={dt:.1f} wall_ns={time.time_ns()}", flush=True)
    dist.barrier()  # every rank is past its last collective before any rank goes
    dist.destroy_process_group()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
