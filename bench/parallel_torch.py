#!/usr/bin/python3
"""parallel_torch.py - the PyTorch anchor of `make bench-parallel`: data
parallel scaling of torch.nn.parallel.DistributedDataParallel (gloo, CPU,
float32; Debian python3-torch 1.13) on the same GPT and config as
bench/parallel.c.

    /usr/bin/python3 bench/parallel_torch.py [L D H T B STEPS]

Runs one process alone, then two DDP processes (gloo over loopback, one
torch thread each - meshrun's ranks also run one compute thread - and
DDP's default 25 MB buckets, which overlap the all-reduce with backward;
OpenBLAS pinned to one thread too),
each on its own batch of B sequences, and prints
    parallel pytorch 1rank tokens/s ...
    parallel pytorch ddp2  tokens/s ...
    parallel pytorch dp2_efficiency=<x>
The model is bench/train_torch.py's. 2 warm-up steps are excluded.
"""
import os
import sys

# one compute thread per rank, as meshrun's ranks run: OpenBLAS (which the
# Debian torch calls for matmuls) would otherwise start its own threads
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_torch import GPT, timed_steps  # noqa: E402


def run(rank, world, cfg, port, out):
    L, D, H, T, B, steps = cfg
    torch.set_num_threads(1)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = GPT(256, T, L, D, H)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(rank)
    idx = torch.randint(0, 256, (B, T), generator=g)
    tgt = torch.randint(0, 256, (B, T), generator=g)
    out[rank], _ = timed_steps(model, opt, idx, tgt, steps,
                               dist.barrier if world > 1 else lambda: None)
    if world > 1:
        dist.destroy_process_group()


def tokens_per_s(world, cfg, port):
    L, D, H, T, B, steps = cfg
    out = mp.Manager().dict()
    if world == 1:
        run(0, 1, cfg, port, out)
    else:
        mp.spawn(run, args=(world, cfg, port, out), nprocs=world)
    return world * steps * B * T / max(out.values())


def main():
    a = [int(x) for x in sys.argv[1:]]
    cfg = (a + [4, 256, 4, 256, 8, 8][len(a):])[:6]
    port = 29600 + os.getpid() % 1000
    x1 = tokens_per_s(1, cfg, port)
    print("parallel pytorch 1rank tokens/s %9.0f" % x1, flush=True)
    x2 = tokens_per_s(2, cfg, port)
    print("parallel pytorch ddp2  tokens/s %9.0f" % x2, flush=True)
    print("parallel pytorch dp2_efficiency=%.3f" % (x2 / (2 * x1)))


if __name__ == "__main__":
    main()
