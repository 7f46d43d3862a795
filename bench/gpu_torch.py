#!/usr/bin/env python3
"""gpu_torch.py - the PyTorch anchor of bench/gpu (make bench-gpu): the same
GPT-2 shapes trained on one CUDA GPU with what a plain PyTorch 2.x user
writes: bf16 autocast, fused scaled_dot_product_attention (flash), fused
AdamW, global-norm clipping, eager mode (no torch.compile).

    python3 bench/gpu_torch.py [-m 124m|350m|all] [-B batch] [-s steps]

Prints per model: gpu pytorch <name> tokens_per_s=<x>
Exits 0 without printing a result when torch or CUDA is absent.
"""
import argparse
import os
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("gpu pytorch: no torch here, anchor skipped")
    sys.exit(0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_torch  # noqa: E402  (the CPU anchor's layers)

MODELS = {"124m": ("124M", 12, 768, 12), "350m": ("350M", 24, 1024, 16)}
T, V = 1024, 50304


class Block(train_torch.Block):
    """The CPU anchor's block with PyTorch 2's fused causal attention."""

    def forward(self, x):
        B, T_, C = x.shape
        q, k, v = (t.view(B, T_, self.H, C // self.H).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(C, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T_, C))
        return x + self.fcp(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, H):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, V), tgt.view(-1))


def tokens_per_s(L, C, H, B, steps):
    torch.manual_seed(0)
    model = GPT(L, C, H).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=True)
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")
    for i in range(steps + 2):
        if i == 2:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    torch.cuda.synchronize()
    return steps * B * T / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", default="all")
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-s", type=int, default=10)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu pytorch: no CUDA device, anchor skipped")
        return
    for key in (MODELS if a.m == "all" else [a.m]):
        name, L, C, H = MODELS[key]
        print("gpu pytorch %s bf16 B=%d tokens_per_s=%.0f"
              % (name, a.B, tokens_per_s(L, C, H, a.B, a.s)), flush=True)


if __name__ == "__main__":
    main()
