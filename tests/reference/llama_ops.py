#!/usr/bin/python3
"""llama_ops.py - PyTorch reference for meshrun's Llama-family kernels.

Written from the published semantics (RMSNorm: Zhang & Sennrich 2019;
rotary embedding in the rotate-half layout of Hugging Face's Llama, Su et
al. 2021; SwiGLU: Shazeer 2020; Llama 3.1's frequency scaling), not from
any project's code. Forward values and gradients by autograd, float32.

    llama_ops.py IN OUT N C F H D THETA EPS FACTOR LOW HIGH ORIG

IN holds float32, in order: x (N,C), w (C), gy (N,C), ab (N,2F),
gsw (N,F), q (N,H,D), gq (N,H,D), pos (N). OUT gets float32, in order:
y (N,C), dx (N,C), dw (C), sw (N,F), dab (N,2F), qr (N,H,D), dq (N,H,D),
inv_freq (D/2) without scaling, inv_freq (D/2) with it.
"""
import math
import sys

import numpy as np
import torch


def inv_freq(D, theta, factor, low, high, orig):
    f = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D))
    if factor <= 0:
        return f
    out = []
    for v in f.tolist():
        wl = 2 * math.pi / v
        if wl < orig / high:
            out.append(v)
        elif wl > orig / low:
            out.append(v / factor)
        else:
            t = (orig / wl - low) / (high - low)
            out.append((1 - t) * v / factor + t * v)
    return torch.tensor(out, dtype=torch.float32)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    N, C, F, H, D = (int(a) for a in sys.argv[3:8])
    theta, eps, factor, low, high = (float(a) for a in sys.argv[8:13])
    orig = int(sys.argv[13])
    sizes = [N * C, C, N * C, N * 2 * F, N * F, N * H * D, N * H * D, N]
    raw = np.fromfile(src, dtype=np.float32)
    assert raw.size == sum(sizes), (raw.size, sum(sizes))
    parts, at = [], 0
    for n in sizes:
        parts.append(torch.from_numpy(raw[at:at + n].copy()))
        at += n
    x, w, gy, ab, gsw, q, gq, pos = parts

    x = x.view(N, C).requires_grad_()
    w = w.requires_grad_()
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    y.backward(gy.view(N, C))

    ab = ab.view(N, 2 * F).requires_grad_()
    a, b = ab[:, :F], ab[:, F:]
    sw = a * torch.sigmoid(a) * b
    sw.backward(gsw.view(N, F))

    f = inv_freq(D, theta, 0, low, high, orig)
    ang = pos.view(N, 1) * f.view(1, D // 2)
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().view(N, 1, D), emb.sin().view(N, 1, D)
    q = q.view(N, H, D).requires_grad_()
    rot = torch.cat([-q[..., D // 2:], q[..., :D // 2]], -1)
    qr = q * cos + rot * sin
    qr.backward(gq.view(N, H, D))

    fs = inv_freq(D, theta, factor, low, high, orig)
    out = [y, x.grad, w.grad, sw, ab.grad, qr, q.grad, f, fs]
    np.concatenate([t.detach().reshape(-1).numpy() for t in out]).astype(np.float32).tofile(dst)


if __name__ == "__main__":
    main()
