"""ddp_gloo.py - a torchrun-style DDP workload for meshrun-agent's exec tests.

Reads the torchrun environment (MASTER_ADDR/PORT, RANK, WORLD_SIZE,
LOCAL_RANK), joins a gloo process group, checks an all-reduce, trains a tiny
linear model for a few steps with DistributedDataParallel and prints one
machine-readable line per fact:

    ALLREDUCE rank=R value=V expected=E
    LOSS rank=R step=S loss=L
    DONE rank=R restart=C

MESHRUN_TEST_CRASH_RANK=R (with MESHRUN_TEST_CRASH_RESTART=C, default 0)
makes rank R kill itself with SIGKILL at step 2 on restart C (C = -1: on
every restart), to test recovery and exhausted restarts. Run with Debian's /usr/bin/python3 (python3-torch).
"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    crash_rank = int(os.environ.get("MESHRUN_TEST_CRASH_RANK", "-1"))
    crash_restart = int(os.environ.get("MESHRUN_TEST_CRASH_RESTART", "0"))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=__import__("datetime").timedelta(seconds=60))

    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    print(f"ALLREDUCE rank={rank} value={t.item():g} expected={expected:g}", flush=True)
    if t.item() != expected:
        sys.exit(3)

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1234 + rank)
    w_true = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
    for step in range(8):
        x = torch.randn(32, 8, generator=g)
        y = x @ w_true
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"LOSS rank={rank} step={step} loss={loss.item():.6f}", flush=True)
        if (rank == crash_rank and crash_restart in (restart, -1)
                and step == 2):
            time.sleep(0.2)
            os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    dist.destroy_process_group()
    print(f"DONE rank={rank} restart={restart}", flush=True)


if __name__ == "__main__":
    main()
