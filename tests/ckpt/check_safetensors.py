#!/usr/bin/python3
"""check_safetensors.py - an independent reader of `meshrun ckpt export` files.

    check_safetensors.py FILE --tokens 3,1,4,1,5 --logits LOGITS [--tol 1e-4]
                         [--no-torch]

Parses FILE itself (json + struct + numpy; nothing of meshrun's code): the
8-byte little-endian header length, the JSON header (duplicate keys refused,
padding only spaces), every tensor's dtype, shape and data_offsets (the
data tiled exactly: no overlap, no gap, nothing after), the metadata
(format "pt", meshrun's model config), and the tensor names a Hugging Face
GPT-2 model (plus meshrun's MoE names) has - no more, no less, no lm_head.

Then it runs the GPT-2 forward pass from those tensors in the Hugging Face
convention - Conv1D layers compute x @ W + b with W stored (in, out) -
learned positions, pre-LayerNorm, causal attention, GELU(tanh), the head
tied to wte; MoE layers route as runtime/kernels/mr_moe.h says (softmax
router, top-k, capacity by position or dropless) - in numpy float64, and in
torch float64 when torch imports, on the token sequence, and compares the
logits with LOGITS: the (T, V) float32 little-endian logits meshrun's own
forward computed for the same tokens. A missing transpose, a wrong name or
a shuffled tensor shows up as a difference far above the tolerance.

Exit status: 0 every check passed, 1 a check failed, 2 bad usage.
"""
import argparse
import json
import math
import struct
import sys

import numpy as np

DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2,
          "I8": 1, "U8": 1, "BOOL": 1, "U16": 2, "U32": 4, "U64": 8, "F8_E5M2": 1,
          "F8_E4M3": 1}


class Bad(Exception):
    pass


def no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise Bad("duplicate key %r in the header" % k)
        d[k] = v
    return d


def parse(path):
    """The header (in file order), the metadata and every tensor as numpy."""
    raw = open(path, "rb").read()
    if len(raw) < 8:
        raise Bad("%d bytes: no header length" % len(raw))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8 or n < 2:
        raise Bad("header length %d in a file of %d bytes" % (n, len(raw)))
    if n % 8:
        raise Bad("header length %d is not a multiple of 8" % n)
    text = raw[8:8 + n].decode("utf-8")
    if not text.startswith("{"):
        raise Bad("the header does not start with '{'")
    body = text.rstrip(" ")
    if len(text) - len(body) >= 8:
        raise Bad("more than 7 bytes of padding")
    header = json.loads(body, object_pairs_hook=no_dups)
    meta = header.pop("__metadata__", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise Bad("metadata must map strings to strings")
    data = raw[8 + n:]
    spans, tensors = [], {}
    for name, e in header.items():
        if set(e) != {"dtype", "shape", "data_offsets"}:
            raise Bad("%s: keys %s" % (name, sorted(e)))
        if e["dtype"] != "F32":
            raise Bad("%s: dtype %s, meshrun exports F32" % (name, e["dtype"]))
        shape = e["shape"]
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise Bad("%s: shape %r" % (name, shape))
        b, end = e["data_offsets"]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not (0 <= b <= end <= len(data)) or end - b != count * DTYPES["F32"]:
            raise Bad("%s: data_offsets %r for shape %r (%d data bytes)" %
                      (name, e["data_offsets"], shape, len(data)))
        spans.append((b, end, name))
        tensors[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(shape)
    at = 0
    for b, end, name in sorted(spans):
        if b != at:
            raise Bad("%s: data at %d, expected %d (%s)" %
                      (name, b, at, "overlap" if b < at else "gap"))
        at = end
    if at != len(data):
        raise Bad("%d bytes after the last tensor" % (len(data) - at))
    # meshrun lays the tensors out in header order
    order = [name for _, _, name in sorted(spans)]
    if order != list(header):
        raise Bad("the data is not in header order")
    return list(header), meta, tensors


def config(meta):
    if meta.get("format") != "pt" or meta.get("meshrun") != "1":
        raise Bad("metadata format %r meshrun %r, expected 'pt' and '1'" %
                  (meta.get("format"), meta.get("meshrun")))
    c = {k: int(meta[k]) for k in ("vocab_size", "max_seq", "n_layer", "d_model", "n_head",
                                   "moe_every", "n_experts", "top_k", "step")}
    c["capacity_factor"] = float(meta["capacity_factor"])
    c["dropless"] = meta["moe_policy"] == "dropless"
    return c


def is_moe(c, layer):
    return c["moe_every"] > 0 and (layer + 1) % c["moe_every"] == 0


def expected(c):
    """Every name and shape the file must hold, in meshrun's table order."""
    V, T, L, C, E = c["vocab_size"], c["max_seq"], c["n_layer"], c["d_model"], c["n_experts"]
    out = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (T, C))]
    for l in range(L):
        p = "transformer.h.%d." % l
        out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,))]
        if is_moe(c, l):
            out.append((p + "moe.router.weight", (C, E)))
            for part, shape in (("c_fc.weight", (C, 4 * C)), ("c_fc.bias", (4 * C,)),
                                ("c_proj.weight", (4 * C, C)), ("c_proj.bias", (C,))):
                out += [(p + "moe.experts.%d.%s" % (e, part), shape) for e in range(E)]
        else:
            out += [(p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                    (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    out += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    return out


def check_names(names, tensors, c):
    want = expected(c)
    if names != [n for n, _ in want]:
        missing = [n for n, _ in want if n not in tensors]
        extra = [n for n in names if n not in dict(want)]
        raise Bad("names: missing %s, unexpected %s, or out of order" % (missing[:4], extra[:4]))
    for n, shape in want:
        if tuple(tensors[n].shape) != shape:
            raise Bad("%s: shape %s, expected %s" % (n, tensors[n].shape, shape))


# ---- the forward pass, numpy ----

def layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def routing(probs, c):
    """(token, choice, expert, gate) kept, in mr_moe.h's order."""
    N, E = probs.shape
    k = c["top_k"]
    cap = N if c["dropless"] else min(max(math.ceil(c["capacity_factor"] * N * k / E), 1), N)
    count, kept = [0] * E, []
    for n in range(N):
        top = sorted(range(E), key=lambda e: (-probs[n, e], e))[:k]
        s = sum(probs[n, e] for e in top)
        for j, e in enumerate(top):
            if count[e] < cap:
                count[e] += 1
                kept.append((n, e, probs[n, e] if k == 1 else probs[n, e] / s))
    return kept


def forward_np(p, c, tok):
    T, C, H = len(tok), c["d_model"], c["n_head"]
    hs = C // H
    g = lambda n: p[n].astype(np.float64)
    x = g("transformer.wte.weight")[tok] + g("transformer.wpe.weight")[:T]
    mask = np.tril(np.ones((T, T), dtype=bool))
    for l in range(c["n_layer"]):
        pre = "transformer.h.%d." % l
        h = layer_norm(x, g(pre + "ln_1.weight"), g(pre + "ln_1.bias"))
        qkv = h @ g(pre + "attn.c_attn.weight") + g(pre + "attn.c_attn.bias")
        q, k, v = (qkv[:, i * C:(i + 1) * C].reshape(T, H, hs).transpose(1, 0, 2)
                   for i in range(3))
        att = q @ k.transpose(0, 2, 1) / math.sqrt(hs)
        att = softmax(np.where(mask, att, -np.inf))
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ g(pre + "attn.c_proj.weight") + g(pre + "attn.c_proj.bias")
        h = layer_norm(x, g(pre + "ln_2.weight"), g(pre + "ln_2.bias"))
        if is_moe(c, l):
            probs = softmax(h @ g(pre + "moe.router.weight"))
            y = np.zeros_like(h)
            for n, e, gate in routing(probs, c):
                ex = pre + "moe.experts.%d." % e
                a = gelu(h[n] @ g(ex + "c_fc.weight") + g(ex + "c_fc.bias"))
                y[n] += gate * (a @ g(ex + "c_proj.weight") + g(ex + "c_proj.bias"))
            x = x + y
        else:
            a = gelu(h @ g(pre + "mlp.c_fc.weight") + g(pre + "mlp.c_fc.bias"))
            x = x + a @ g(pre + "mlp.c_proj.weight") + g(pre + "mlp.c_proj.bias")
    x = layer_norm(x, g("transformer.ln_f.weight"), g("transformer.ln_f.bias"))
    return x @ g("transformer.wte.weight").T


def forward_torch(torch, p, c, tok):
    """The same in torch (float64, F.layer_norm, F.softmax): a second,
    library-computed opinion on the dense path and the MoE experts."""
    F = torch.nn.functional
    T, C, H = len(tok), c["d_model"], c["n_head"]
    hs = C // H
    g = lambda n: torch.from_numpy(p[n].astype(np.float64))
    idx = torch.tensor(tok)
    x = g("transformer.wte.weight")[idx] + g("transformer.wpe.weight")[:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(c["n_layer"]):
        pre = "transformer.h.%d." % l
        h = F.layer_norm(x, (C,), g(pre + "ln_1.weight"), g(pre + "ln_1.bias"), 1e-5)
        qkv = torch.addmm(g(pre + "attn.c_attn.bias"), h, g(pre + "attn.c_attn.weight"))
        q, k, v = (t.view(T, H, hs).transpose(0, 1) for t in qkv.split(C, dim=1))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + torch.addmm(g(pre + "attn.c_proj.bias"), y, g(pre + "attn.c_proj.weight"))
        h = F.layer_norm(x, (C,), g(pre + "ln_2.weight"), g(pre + "ln_2.bias"), 1e-5)
        if is_moe(c, l):
            probs = torch.softmax(h @ g(pre + "moe.router.weight"), dim=-1)
            y = torch.zeros_like(h)
            for n, e, gate in routing(probs.numpy(), c):
                ex = pre + "moe.experts.%d." % e
                a = F.gelu(h[n] @ g(ex + "c_fc.weight") + g(ex + "c_fc.bias"),
                           approximate="tanh")
                y[n] += float(gate) * (a @ g(ex + "c_proj.weight") + g(ex + "c_proj.bias"))
            x = x + y
        else:
            a = F.gelu(torch.addmm(g(pre + "mlp.c_fc.bias"), h, g(pre + "mlp.c_fc.weight")),
                       approximate="tanh")
            x = x + torch.addmm(g(pre + "mlp.c_proj.bias"), a, g(pre + "mlp.c_proj.weight"))
    x = F.layer_norm(x, (C,), g("transformer.ln_f.weight"), g("transformer.ln_f.bias"), 1e-5)
    return (x @ g("transformer.wte.weight").t()).numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    tok = [int(t) for t in a.tokens.split(",")]
    try:
        names, meta, p = parse(a.file)
        c = config(meta)
        check_names(names, p, c)
        if not all(0 <= t < c["vocab_size"] for t in tok) or len(tok) > c["max_seq"]:
            raise Bad("tokens out of the model's range")
        want = np.fromfile(a.logits, dtype="<f4")
        if want.size != len(tok) * c["vocab_size"]:
            raise Bad("%s: %d floats, expected T*V = %d" %
                      (a.logits, want.size, len(tok) * c["vocab_size"]))
        want = want.reshape(len(tok), c["vocab_size"]).astype(np.float64)
        results = [("numpy", forward_np(p, c, tok))]
        if not a.no_torch:
            try:
                import torch
            except ImportError:
                torch = None
                print("check_safetensors: torch not importable, numpy only")
            if torch is not None:
                results.append(("torch %s" % torch.__version__, forward_torch(torch, p, c, tok)))
        ok = True
        for name, got in results:
            d = float(np.abs(got - want).max())
            print("check_safetensors: %s: %d tensors, step %d, max |logit - meshrun| = %.3g "
                  "(tol %g)" % (name, len(names), c["step"], d, a.tol))
            ok &= d <= a.tol
        if not ok:
            raise Bad("logits differ from meshrun's beyond %g" % a.tol)
    except (Bad, ValueError, KeyError, json.JSONDecodeError, UnicodeDecodeError) as e:
        print("check_safetensors: FAIL: %s: %s" % (a.file, e))
        return 1
    print("check_safetensors: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
