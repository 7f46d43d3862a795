#!/usr/bin/python3
"""llama_model.py - a PyTorch reference of the Llama architecture for
meshrun's llama model (runtime/model/llama.c), float32.

Written from the published semantics - Llama (Touvron et al. 2023) and
Llama 3 (Dubey et al. 2024): pre-norm blocks with RMSNorm (Zhang &
Sennrich 2019), rotary positions in the rotate-half layout (Su et al.
2021; Hugging Face's convention), grouped-query attention (Ainslie et al.
2023: query head h reads key/value head h // (n_head / n_kv_head)), a
SwiGLU MLP (Shazeer 2020), no biases, an untied output head unless tied -
not from any project's code. Autograd gives the gradients; torch's AdamW
the 10 optimizer steps.

    llama_model.py DIR

DIR/case.json: the model ("vocab", "d_model", "n_layer", "n_head",
"n_kv_head", "ffn_hidden", "norm_eps", "rope_theta", "tie"; MoE:
"moe_every", "n_experts", "top_k", "capacity_factor", "aux_coef",
"dropless", "norm_topk": gates renormalised over the chosen), the run ("B",
"T", "steps", "accum", "nbatch") and the optimizer ("lr", "min_lr_frac",
"warmup", "total", "beta1", "beta2", "eps", "weight_decay", "grad_clip"),
and "tensors": [name, shape] in meshrun's table order.
DIR/params.bin: the initial parameters (float32, table order);
DIR/batches.bin: inputs then targets, nbatch x B x T int32 each.
Writes DIR/out.bin, float32: loss of batch 0 (cross-entropy; the gradients
are those of loss + aux_coef * the MoE layers' aux losses), its logits (B*T*vocab), every
gradient (table order), then the mean loss of each optimizer step.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


def experts(p, pre, x, c):
    """A MoE layer of SwiGLU experts (Mixtral) under meshrun's routing rules
    (runtime/kernels/mr_moe.h): softmax router, top-k (renormalised over the
    chosen with norm_topk, else the probabilities), a capacity per expert filled
    in token order, the load-balancing loss E * sum_e f_e P_e."""
    E, k = c["n_experts"], c["top_k"]
    N, C = x.shape
    probs = torch.softmax(x @ p[pre + "moe.router.w"].t(), dim=-1)
    topv, topi = torch.topk(probs, k, dim=-1)
    gates = topv / topv.sum(-1, keepdim=True) if c["norm_topk"] else topv
    cap = N if c["dropless"] else int(min(max(math.ceil(c["capacity_factor"] * N * k / E), 1), N))
    count, routed, kept = [0] * E, [0] * E, [[] for _ in range(E)]
    for n, row in enumerate(topi.tolist()):
        for j, e in enumerate(row):
            routed[e] += 1
            if count[e] < cap:
                count[e] += 1
                kept[e].append((n, j))
    y = torch.zeros_like(x)
    F_ = p[pre + "moe.down.w"].shape[2]
    for e in range(E):
        if not kept[e]:
            continue
        ns = torch.tensor([a for a, _ in kept[e]])
        js = torch.tensor([b for _, b in kept[e]])
        h = x[ns] @ p[pre + "moe.gate_up.w"][e].t()
        h = F.silu(h[:, :F_]) * h[:, F_:]
        out = h @ p[pre + "moe.down.w"][e].t()
        y = y.index_add(0, ns, gates[ns, js].unsqueeze(1) * out)
    f = torch.tensor(routed, dtype=torch.float32) / (N * k)
    return y, E * (f * probs.mean(0)).sum()


def forward(p, c, idx, tgt):
    B, T = idx.shape
    C, NH, NKV = c["d_model"], c["n_head"], c["n_kv_head"]
    hs = C // NH
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
    cos = torch.cat((ang, ang), -1).cos()
    sin = torch.cat((ang, ang), -1).sin()
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    x = p["tok_emb"][idx]
    aux = torch.zeros(())
    every = c.get("moe_every", 0)
    for l in range(c["n_layer"]):
        pre = "h.%d." % l
        h = rmsnorm(x, p[pre + "attn_norm.w"], c["norm_eps"])
        q = (h @ p[pre + "attn.q.w"].t()).view(B, T, NH, hs).transpose(1, 2)
        k = (h @ p[pre + "attn.k.w"].t()).view(B, T, NKV, hs).transpose(1, 2)
        v = (h @ p[pre + "attn.v.w"].t()).view(B, T, NKV, hs).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        k = k.repeat_interleave(NH // NKV, dim=1)
        v = v.repeat_interleave(NH // NKV, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[pre + "attn.o.w"].t()
        h = rmsnorm(x, p[pre + "mlp_norm.w"], c["norm_eps"])
        if every > 0 and (l + 1) % every == 0:
            y, a = experts(p, pre, h.reshape(B * T, C), c)
            x = x + y.view(B, T, C)
            aux = aux + a
            continue
        g = F.silu(h @ p[pre + "mlp.gate.w"].t()) * (h @ p[pre + "mlp.up.w"].t())
        x = x + g @ p[pre + "mlp.down.w"].t()
    x = rmsnorm(x, p["norm.w"], c["norm_eps"])
    head = p["tok_emb"] if c["tie"] else p["output.w"]
    logits = x @ head.t()
    loss = F.cross_entropy(logits.reshape(-1, c["vocab"]), tgt.reshape(-1))
    return logits, loss, aux


def lr_at(c, step):
    if step < c["warmup"]:
        return c["lr"] * (step + 1) / c["warmup"]
    lo = c["lr"] * c["min_lr_frac"]
    r = (step - c["warmup"]) / (c["total"] - c["warmup"])
    return lo + 0.5 * (1.0 + math.cos(math.pi * r)) * (c["lr"] - lo)


def main():
    d = sys.argv[1]
    torch.set_num_threads(1)
    c = json.load(open(os.path.join(d, "case.json")))
    flat = np.fromfile(os.path.join(d, "params.bin"), dtype="<f4")
    p, names, off = {}, [], 0
    for name, shape in c["tensors"]:
        n = int(np.prod(shape))
        p[name] = torch.tensor(flat[off:off + n].reshape(shape).copy(), requires_grad=True)
        names.append(name)
        off += n
    assert off == flat.size, "params.bin holds %d floats, the table %d" % (flat.size, off)
    nb, B, T = c["nbatch"], c["B"], c["T"]
    tok = np.fromfile(os.path.join(d, "batches.bin"), dtype="<i4").reshape(2, nb, B, T)
    inputs = torch.tensor(tok[0], dtype=torch.long)
    targets = torch.tensor(tok[1], dtype=torch.long)

    aux_coef = c.get("aux_coef", 0.0)
    logits, loss, aux = forward(p, c, inputs[0], targets[0])
    (loss + aux_coef * aux).backward()
    grads = torch.cat([p[n].grad.reshape(-1) for n in names])
    out = [np.array([loss.item()], dtype="<f4"),
           logits.detach().reshape(-1).numpy().astype("<f4"),
           grads.detach().numpy().astype("<f4")]

    for n in names:
        p[n].grad = None
    decay = [n for n in names if not n.endswith("norm.w")]
    groups = [{"params": [p[n] for n in decay], "weight_decay": c["weight_decay"]},
              {"params": [p[n] for n in names if n not in decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=c["lr"], betas=(c["beta1"], c["beta2"]), eps=c["eps"])
    losses = []
    for s in range(c["steps"]):
        for gr in opt.param_groups:
            gr["lr"] = lr_at(c, s)
        opt.zero_grad(set_to_none=False)
        tot = 0.0
        for i in range(c["accum"]):
            b = (s * c["accum"] + i) % nb
            _, l_, a_ = forward(p, c, inputs[b], targets[b])
            ((l_ + aux_coef * a_) / c["accum"]).backward()
            tot += l_.item()
        torch.nn.utils.clip_grad_norm_([p[n] for n in names], c["grad_clip"])
        opt.step()
        losses.append(tot / c["accum"])
    out.append(np.array(losses, dtype="<f4"))
    with open(os.path.join(d, "out.bin"), "wb") as f:
        for a in out:
            f.write(a.tobytes())


if __name__ == "__main__":
    main()
