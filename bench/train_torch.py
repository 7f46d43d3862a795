#!/usr/bin/python3
"""train_torch.py - PyTorch (Debian python3-torch, float32, CPU) training
throughput of the same GPT as meshrun's runtime, for bench/train.sh.

    /usr/bin/python3 bench/train_torch.py L D H [T B V STEPS TORCH_THREADS [llama]]

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
import torch.utils.checkpoint
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


RECOMPUTE = False  # "recompute" on the command line: full activation checkpointing


def run_block(block, *args):
    """A block's forward; with RECOMPUTE through torch.utils.checkpoint (the
    block keeps its input only and runs again in the backward, as
    meshrun's "recompute": "full")."""
    if RECOMPUTE:
        return torch.utils.checkpoint.checkpoint(block, *args)
    return block(*args)


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
            x = run_block(b, x, self.mask)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), tgt.view(-1))


class LlamaBlock(nn.Module):
    """Llama's block as plain nn code: RMSNorm (no nn.RMSNorm in 1.13),
    rotary positions (rotate-half), grouped-query attention (KV key/value
    heads; H/2 unless given, as bench/train.c's llama runs), SwiGLU, no
    biases."""

    def __init__(self, C, H, F_, KV=0):
        super().__init__()
        self.H, self.KV = H, KV or H // 2
        hs = C // H
        self.n1, self.n2 = nn.Parameter(torch.ones(C)), nn.Parameter(torch.ones(C))
        self.q = nn.Linear(C, C, bias=False)
        self.kv = nn.Linear(C, 2 * self.KV * hs, bias=False)
        self.o = nn.Linear(C, C, bias=False)
        self.gu = nn.Linear(C, 2 * F_, bias=False)
        self.down = nn.Linear(F_, C, bias=False)

    @staticmethod
    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    @staticmethod
    def rotate(x, cos, sin):
        h = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin

    @staticmethod
    def attend(q, k, v, mask):
        """Causal attention of (B, H, T, hs) heads."""
        T = q.shape[2]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
        att = att.masked_fill(mask[:T, :T] == 0, float("-inf")).softmax(dim=-1)
        return att @ v

    def forward(self, x, mask, cos, sin):
        B, T, C = x.shape
        hs = C // self.H
        h = self.norm(x, self.n1)
        q = self.q(h).view(B, T, self.H, hs).transpose(1, 2)
        k, v = self.kv(h).split(self.KV * hs, dim=2)
        k = k.reshape(B, T, self.KV, hs).transpose(1, 2)
        v = v.reshape(B, T, self.KV, hs).transpose(1, 2)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        k = k.repeat_interleave(self.H // self.KV, dim=1)
        v = v.repeat_interleave(self.H // self.KV, dim=1)
        y = self.attend(q, k, v, mask)
        x = x + self.o(y.transpose(1, 2).contiguous().view(B, T, C))
        g, u = self.gu(self.norm(x, self.n2)).chunk(2, dim=-1)
        return x + self.down(F.silu(g) * u)


class Llama(nn.Module):
    def __init__(self, V, T, L, C, H):
        super().__init__()
        F_ = (2 * 4 * C // 3 + 255) // 256 * 256  # the runtime's default ffn_hidden
        hs = C // H
        self.emb = nn.Embedding(V, C)
        self.blocks = nn.ModuleList([LlamaBlock(C, H, F_) for _ in range(L)])
        self.nf = nn.Parameter(torch.ones(C))
        self.head = nn.Linear(C, V, bias=False)
        inv = 1.0 / (10000.0 ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat((ang, ang), -1).cos())
        self.register_buffer("sin", torch.cat((ang, ang), -1).sin())
        self.register_buffer("mask", torch.tril(torch.ones(T, T)))

    def forward(self, idx, tgt):
        T = idx.shape[1]
        x = self.emb(idx)
        for b in self.blocks:
            x = run_block(b, x, self.mask, self.cos[:T], self.sin[:T])
        logits = self.head(LlamaBlock.norm(x, self.nf))
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
    global RECOMPUTE
    RECOMPUTE = sys.argv[-1] == "recompute"
    if RECOMPUTE:
        sys.argv.pop()
    arch = sys.argv.pop() if sys.argv[-1] in ("gpt2", "llama") else "gpt2"
    a = [int(x) for x in sys.argv[1:]]
    if len(a) < 3:
        sys.exit("usage: train_torch.py L D H [T B V STEPS TORCH_THREADS [gpt2|llama "
                 "[recompute]]]")
    L, D, H = a[:3]
    T, B, V, steps, threads = (a[3:] + [256, 8, 256, 10, 1][len(a) - 3:])[:5]
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = (Llama if arch == "llama" else GPT)(V, T, L, D, H)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    idx = torch.randint(0, V, (B, T))
    tgt = torch.randint(0, V, (B, T))
    dt, loss = timed_steps(model, opt, idx, tgt, steps)
    print("train pytorch arch=%s L=%d D=%d H=%d T=%d B=%d threads=%d recompute=%d "
          "tokens_per_s=%.1f loss=%.4f" % (arch, L, D, H, T, B, threads, RECOMPUTE,
                                           steps * B * T / dt, loss.item()))


if __name__ == "__main__":
    main()
