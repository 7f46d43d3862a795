#!/usr/bin/env python3
"""gpu_torch.py - the PyTorch anchor of bench/gpu (make bench-gpu): the same
GPT-2 and llama shapes trained on one CUDA GPU with what a plain PyTorch
2.x user writes: bf16 autocast, fused scaled_dot_product_attention (flash),
fused AdamW, global-norm clipping, eager mode; with -c the same model
through torch.compile (the second anchor: its warm-up steps compile).

    python3 bench/gpu_torch.py [-m 124m|350m|1b|all] [-B batch] [-s steps] [-c]

Prints per model: gpu pytorch <name> tokens_per_s=<x> (with -c:
gpu pytorch-compile <name> ...). Exits 0 without printing a result when
torch or CUDA (or, with -c, torch.compile) is absent.
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

# name, arch, L, C, H, key/value heads, SwiGLU hidden, vocab (bench/gpu.c's)
MODELS = {"124m": ("124M", "gpt2", 12, 768, 12, 0, 0, 50304),
          "350m": ("350M", "gpt2", 24, 1024, 16, 0, 0, 50304),
          "1b": ("1B", "llama", 16, 2048, 32, 8, 8192, 32768)}
T = 1024
ROPE_THETA = 500000.0  # meshrun's llama default


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
    def __init__(self, L, C, H, V):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))


class LlamaBlock(train_torch.LlamaBlock):
    """The CPU anchor's llama block with PyTorch 2's fused causal attention
    (over the key/value heads repeated to the query heads)."""

    @staticmethod
    def attend(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Llama(nn.Module):
    def __init__(self, L, C, H, KV, F_, V):
        super().__init__()
        hs = C // H
        self.emb = nn.Embedding(V, C)
        self.blocks = nn.ModuleList([LlamaBlock(C, H, F_, KV) for _ in range(L)])
        self.nf = nn.Parameter(torch.ones(C))
        self.head = nn.Linear(C, V, bias=False)
        inv = 1.0 / (ROPE_THETA ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin())

    def forward(self, idx, tgt):
        T_ = idx.shape[1]
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, None, self.cos[:T_], self.sin[:T_])
        logits = self.head(LlamaBlock.norm(x, self.nf))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), tgt.view(-1))


def tokens_per_s(key, B, steps, compiled):
    _, arch, L, C, H, KV, F_, V = MODELS[key]
    torch.manual_seed(0)
    model = (Llama(L, C, H, KV, F_, V) if arch == "llama" else GPT(L, C, H, V)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=True)
    run = torch.compile(model) if compiled else model
    warmup = 3 if compiled else 2  # the first compiled steps compile
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")
    for i in range(steps + warmup):
        if i == warmup:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = run(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    torch.cuda.synchronize()
    return steps * B * T / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", default="all", choices=["all"] + list(MODELS))
    ap.add_argument("-B", type=int, default=8)
    ap.add_argument("-s", type=int, default=10)
    ap.add_argument("-c", action="store_true", help="through torch.compile")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu pytorch: no CUDA device, anchor skipped")
        return
    if a.c and not hasattr(torch, "compile"):
        print("gpu pytorch: no torch.compile in torch %s, anchor skipped" % torch.__version__)
        return
    for key in (MODELS if a.m == "all" else [a.m]):
        print("gpu %s %s bf16 B=%d tokens_per_s=%.0f"
              % ("pytorch-compile" if a.c else "pytorch", MODELS[key][0], a.B,
                 tokens_per_s(key, a.B, a.s, a.c)), flush=True)


if __name__ == "__main__":
    main()
