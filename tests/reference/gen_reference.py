#!/usr/bin/python3
"""gen_reference.py - PyTorch reference values for meshrun's GPT runtime.

Run by `make reference` with Debian's python3-torch (1.13, float32):

    /usr/bin/python3 tests/reference/gen_reference.py MKWEIGHTS OUTDIR

For each config (dense, moe1, moe2) it asks meshrun's own `mkweights` for a
freshly initialised weights file (format: runtime/model/mr_weights.h),
rebuilds the same model here with its own nn code (explicit attention, no
autograd tricks on our side), and writes OUTDIR/<name>.bin:

  header 256 x int32
    [0] magic 20261122  [1] version 1  [2..11] model config as in the
    weights file  [12] B  [13] T  [14] steps  [15] seed  [16] logits saved
    [17] batches  [18] micro-batches per step  [19] parameter count
    [20] lr  [21] min_lr_frac  [22] warmup  [23] total_steps  [24] beta1
    [25] beta2  [26] eps  [27] weight_decay  [28] grad_clip (float bits)
    [29] dropped MoE assignments in the first forward (all layers)
    [30..31] sum of squares of the initial parameters (float64 bits)
  body
    inputs, targets: batches x B x T int32 each
    logits: the first `logits saved` floats of (B,T,V) for batch 0
    loss, aux: float32 (cross-entropy; sum over MoE layers of E*sum f*P)
    grads: every parameter's gradient of loss + aux_coef*aux on batch 0,
           in the weights-file order (float32)
    losses: `steps` float32, mean cross-entropy of each AdamW step (before
           its update), micro-batches (s*accum+i) % batches

The C test (tests/model/test_reference.c) regenerates the weights from
the seed, checks the sum of squares, and compares without PyTorch.
MoE choices mirror runtime/kernels/mr_moe.h.
"""
import math
import os
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

MAGIC, VERSION = 20261122, 1
WMAGIC = 20261121

CONFIGS = [
    # name, V, maxT, L, C, NH, moe_every, E, k, capf, aux_coef
    ("dense", 64, 32, 2, 64, 4, 0, 0, 0, 0.0, 0.0),
    ("moe1", 64, 32, 2, 32, 4, 2, 4, 1, 0.75, 0.01),
    ("moe2", 64, 32, 2, 32, 4, 2, 4, 2, 0.75, 0.01),
    # head size 32: what the cuda device's attention takes (32 to 128)
    ("dense_hs32", 64, 32, 2, 64, 2, 0, 0, 0, 0.0, 0.0),
    ("moe2_hs32", 64, 32, 2, 64, 2, 2, 4, 2, 0.75, 0.01),
]
B, T, SEED, STEPS, NBATCH, ACCUM = 4, 32, 1337, 10, 4, 2
OPT = dict(lr=3e-3, min_lr_frac=0.1, warmup=2, total=STEPS, beta1=0.9,
           beta2=0.95, eps=1e-8, wd=0.1, clip=1.0)


def fbits(x):
    return struct.unpack("<i", struct.pack("<f", x))[0]


def table(cfg):
    """(name, shape) in meshrun's order (runtime/model/gpt_params.c)."""
    _, V, maxT, L, C, NH, every, E, k, capf, aux = cfg
    t = [("wte", (V, C)), ("wpe", (maxT, C))]
    for l in range(L):
        p = "h.%d." % l
        t += [(p + "ln1.w", (C,)), (p + "ln1.b", (C,)),
              (p + "attn.qkv.w", (3 * C, C)), (p + "attn.qkv.b", (3 * C,)),
              (p + "attn.proj.w", (C, C)), (p + "attn.proj.b", (C,)),
              (p + "ln2.w", (C,)), (p + "ln2.b", (C,))]
        if every > 0 and (l + 1) % every == 0:
            t += [(p + "moe.router.w", (E, C)), (p + "moe.fc.w", (E, 4 * C, C)),
                  (p + "moe.fc.b", (E, 4 * C)), (p + "moe.proj.w", (E, C, 4 * C)),
                  (p + "moe.proj.b", (E, C))]
        else:
            t += [(p + "mlp.fc.w", (4 * C, C)), (p + "mlp.fc.b", (4 * C,)),
                  (p + "mlp.proj.w", (C, 4 * C)), (p + "mlp.proj.b", (C,))]
    t += [("lnf.w", (C,)), ("lnf.b", (C,))]
    return t


def decays(name):
    return name in ("wte", "wpe") or (name.endswith(".w") and ".ln" not in "." + name)


def load_weights(path, cfg):
    raw = open(path, "rb").read()
    hdr = np.frombuffer(raw[:1024], dtype="<i4")
    assert hdr[0] == WMAGIC and hdr[1] == 1, "bad weights file"
    data = np.frombuffer(raw[1024:], dtype="<f4")
    params, off = {}, 0
    for name, shape in table(cfg):
        n = int(np.prod(shape))
        params[name] = torch.tensor(data[off:off + n].reshape(shape).copy(),
                                    requires_grad=True)
        off += n
    assert off == data.size, "weights size mismatch"
    return params, data


def gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def moe(p, pre, x, cfg):
    E, k, capf = cfg[7], cfg[8], cfg[9]
    N, C = x.shape
    probs = torch.softmax(x @ p[pre + "moe.router.w"].t(), dim=-1)
    topv, topi = torch.topk(probs, k, dim=-1)
    gates = topv if k == 1 else topv / topv.sum(-1, keepdim=True)
    cap = int(min(max(math.ceil(capf * N * k / E), 1), N))
    count, routed, dropped = [0] * E, [0] * E, 0
    kept = [[] for _ in range(E)]  # (token, choice) in position order
    ti = topi.tolist()
    for n in range(N):
        for j in range(k):
            e = ti[n][j]
            routed[e] += 1
            if count[e] < cap:
                count[e] += 1
                kept[e].append((n, j))
            else:
                dropped += 1
    y = torch.zeros_like(x)
    for e in range(E):
        if not kept[e]:
            continue
        ns = torch.tensor([a for a, _ in kept[e]])
        js = torch.tensor([b for _, b in kept[e]])
        h = gelu(x[ns] @ p[pre + "moe.fc.w"][e].t() + p[pre + "moe.fc.b"][e])
        yo = h @ p[pre + "moe.proj.w"][e].t() + p[pre + "moe.proj.b"][e]
        y = y.index_add(0, ns, gates[ns, js].unsqueeze(1) * yo)
    f = torch.tensor(routed, dtype=torch.float32) / (N * k)
    aux = E * (f * probs.mean(0)).sum()
    return y, aux, dropped


def forward(p, cfg, idx, tgt):
    _, V, maxT, L, C, NH, every = cfg[:7]
    Bn, Tn = idx.shape
    hs = C // NH
    x = p["wte"][idx] + p["wpe"][:Tn]
    aux_total, dropped = torch.zeros(()), 0
    mask = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    for l in range(L):
        pre = "h.%d." % l
        h = F.layer_norm(x, (C,), p[pre + "ln1.w"], p[pre + "ln1.b"], 1e-5)
        qkv = h @ p[pre + "attn.qkv.w"].t() + p[pre + "attn.qkv.b"]
        q, k, v = qkv.split(C, dim=2)
        q = q.view(Bn, Tn, NH, hs).transpose(1, 2)
        k = k.view(Bn, Tn, NH, hs).transpose(1, 2)
        v = v.view(Bn, Tn, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(Bn, Tn, C)
        x = x + y @ p[pre + "attn.proj.w"].t() + p[pre + "attn.proj.b"]
        h = F.layer_norm(x, (C,), p[pre + "ln2.w"], p[pre + "ln2.b"], 1e-5)
        if every > 0 and (l + 1) % every == 0:
            y, aux, dr = moe(p, pre, h.reshape(Bn * Tn, C), cfg)
            x = x + y.view(Bn, Tn, C)
            aux_total = aux_total + aux
            dropped += dr
        else:
            h = gelu(h @ p[pre + "mlp.fc.w"].t() + p[pre + "mlp.fc.b"])
            x = x + h @ p[pre + "mlp.proj.w"].t() + p[pre + "mlp.proj.b"]
    x = F.layer_norm(x, (C,), p["lnf.w"], p["lnf.b"], 1e-5)
    logits = x @ p["wte"].t()
    loss = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1))
    return logits, loss, aux_total, dropped


def lr_at(step):
    o = OPT
    if step < o["warmup"]:
        return o["lr"] * (step + 1) / o["warmup"]
    lo = o["lr"] * o["min_lr_frac"]
    r = (step - o["warmup"]) / (o["total"] - o["warmup"])
    return lo + 0.5 * (1.0 + math.cos(math.pi * r)) * (o["lr"] - lo)


def make_batches(V):
    g = torch.Generator().manual_seed(SEED)
    seq = torch.randint(0, V, (NBATCH, B, T + 1), generator=g)
    return seq[:, :, :-1].contiguous(), seq[:, :, 1:].contiguous()


def run(cfg, mkweights, outdir):
    name, V, maxT, L, C, NH, every, E, k, capf, aux_coef = cfg
    wpath = os.path.join(outdir, name + ".weights.tmp")
    subprocess.check_call([mkweights, wpath, str(SEED)] +
                          [str(a) for a in cfg[1:]])
    p, flat = load_weights(wpath, cfg)
    os.unlink(wpath)
    sumsq = float(np.sum(flat.astype(np.float64) ** 2))
    names = [n for n, _ in table(cfg)]
    inputs, targets = make_batches(V)

    logits, loss, aux, dropped = forward(p, cfg, inputs[0], targets[0])
    (loss + aux_coef * aux).backward()
    grads = [p[n].grad.detach().clone() for n in names]
    nlog = min(logits.numel(), T * V)
    logits_slice = logits.detach().reshape(-1)[:nlog].clone()
    if every > 0:
        assert dropped > 0, "config %s drops no tokens" % name

    for n in names:
        p[n].grad = None
    groups = [{"params": [p[n] for n in names if decays(n)], "weight_decay": OPT["wd"]},
              {"params": [p[n] for n in names if not decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]),
                            eps=OPT["eps"])
    losses = []
    for s in range(STEPS):
        for gr in opt.param_groups:
            gr["lr"] = lr_at(s)
        opt.zero_grad(set_to_none=False)
        tot = 0.0
        for i in range(ACCUM):
            b = (s * ACCUM + i) % NBATCH
            _, l_, a_, _ = forward(p, cfg, inputs[b], targets[b])
            ((l_ + aux_coef * a_) / ACCUM).backward()
            tot += l_.item()
        torch.nn.utils.clip_grad_norm_([p[n] for n in names], OPT["clip"])
        opt.step()
        losses.append(tot / ACCUM)

    hdr = np.zeros(256, dtype="<i4")
    hdr[0:2] = [MAGIC, VERSION]
    hdr[2:12] = [V, maxT, L, C, NH, every, E, k, fbits(capf), fbits(aux_coef)]
    hdr[12:20] = [B, T, STEPS, SEED, nlog, NBATCH, ACCUM, flat.size]
    hdr[20:29] = [fbits(OPT["lr"]), fbits(OPT["min_lr_frac"]), OPT["warmup"], OPT["total"],
                  fbits(OPT["beta1"]), fbits(OPT["beta2"]), fbits(OPT["eps"]),
                  fbits(OPT["wd"]), fbits(OPT["clip"])]
    hdr[29] = dropped
    hdr[30:32] = np.frombuffer(struct.pack("<d", sumsq), dtype="<i4")
    out = os.path.join(outdir, name + ".bin")
    with open(out, "wb") as f:
        f.write(hdr.tobytes())
        f.write(inputs.numpy().astype("<i4").tobytes())
        f.write(targets.numpy().astype("<i4").tobytes())
        f.write(logits_slice.numpy().astype("<f4").tobytes())
        f.write(np.array([loss.item(), aux.item()], dtype="<f4").tobytes())
        f.write(torch.cat([g.reshape(-1) for g in grads]).numpy().astype("<f4").tobytes())
        f.write(np.array(losses, dtype="<f4").tobytes())
    print("reference: %s loss=%.6f aux=%.6f dropped=%d losses %.4f -> %.4f (%d bytes)" %
          (out, loss.item(), aux.item(), dropped, losses[0], losses[-1], os.path.getsize(out)))


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gen_reference.py MKWEIGHTS OUTDIR")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for cfg in CONFIGS:
        run(cfg, sys.argv[1], sys.argv[2])


if __name__ == "__main__":
    main()
