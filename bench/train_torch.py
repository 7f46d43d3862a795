#!/usr/bin/python3
"""train_torch.py - PyTorch (Debian python3-torch, float32, CPU) training
throughput of the same GPT as meshrun's runtime, for bench/train.sh.

    /usr/bin/python3 bench/train_torch.py L D H [T B V STEPS TORCH_THREADS]

Prints: train pytorch L=.. D=.. H=.. tokens_per_s=...
The model is nanoGPT-style nn code (the fastest plain PyTorch 1.13 has on
CPU; scaled_dot_product_attention does not exist in 1.13), AdamW, global
norm clipping, 2 warm-up steps excluded.
"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcp = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x, mask):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.H))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.fcp(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, L, C, H):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)))

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.blocks:
            x = b(x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


def timed_steps(model, opt, idx, tgt, steps, sync=lambda: None):
    """steps optimizer steps after 2 warm-up ones (clip 1.0, as meshrun's
    trainer); sync() runs before the clock starts and before it stops.
    Returns (seconds, last loss)."""
    t0 = 0.0
    for i in range(steps + 2):
        if i == 2:
            sync()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    sync()
    return time.perf_counter() - t0, loss


def main():
    a = [int(x) for x in sys.argv[1:]]
    if len(a) < 3:
        sys.exit("usage: train_torch.py L D H [T B V STEPS TORCH_THREADS]")
    L, D, H = a[:3]
    T, B, V, steps, threads = (a[3:] + [256, 8, 256, 10, 1][len(a) - 3:])[:5]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(V, T, L, D, H)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    dt, loss = timed_steps(model, opt, idx, tgt, steps)
    print("train pytorch L=%d D=%d H=%d T=%d B=%d threads=%d tokens_per_s=%.1f loss=%.4f" %
          (L, D, H, T, B, threads, steps * B * T / dt, loss.item()))


if __name__ == "__main__":
    main()
