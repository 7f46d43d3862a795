#!/usr/bin/python3
"""hf_llama_check.py - an independent reader of `meshrun ckpt export --hf`.

    hf_llama_check.py DIR --tokens 3,1,4 --logits LOGITS [--tol 1e-4]
                      [--permute-qk]

Reads the Hugging Face Llama (or Mixtral) directory DIR with nothing of meshrun's code
and nothing of transformers' or safetensors' (neither is needed): its
config.json (model_type llama, architectures ["LlamaForCausalLM"],
torch_dtype float32, the model's sizes), generation_config.json, and the
weights - model.safetensors, or the shards model.safetensors.index.json's
weight_map names - each parsed from the format (github.com/huggingface/
safetensors): an 8-byte little-endian header length, a JSON header of
{"name": {"dtype", "shape", "data_offsets"}} (duplicate keys refused), the
data tiled exactly by the offsets; the index's weight_map must say where
each tensor is and total_size must be the data's size. The tensor names
must be exactly a Llama's (lm_head.weight absent when tied), each shaped
as config.json says.

It then maps the names to meshrun's and runs tests/reference/llama_model.py's
forward (float64) on the tokens, and compares the logits with LOGITS: the
(T, V) float32 little-endian logits meshrun's own forward computed for the
same tokens from the checkpoint that was exported.

--permute-qk applies to q_proj and k_proj the row permutation that
converts Meta's interleaved rotary layout to the rotate-half one before
the forward: the logits must then differ (exit 1), showing the check tells
the two layouts apart and that meshrun's rows need no permutation.

Exit status: 0 every check passed, 1 a check failed, 2 bad usage.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_model import forward  # noqa: E402

SIZES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8}


class Bad(Exception):
    pass


def no_dups(pairs):
    d = {}
    for k, v in pairs:
        if k in d:
            raise Bad("duplicate key %r" % k)
        d[k] = v
    return d


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f, object_pairs_hook=no_dups)
    except (OSError, ValueError) as e:
        raise Bad("%s: %s" % (path, e))


def decode(raw, dtype, shape):
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F64":
        a = np.frombuffer(raw, dtype="<f8")
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    else:  # BF16: the high half of a float32
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float64).reshape(shape)


def parse(path):
    """Every tensor of one safetensors file, and its data size."""
    raw = open(path, "rb").read()
    if len(raw) < 8:
        raise Bad("%s: %d bytes, no header length" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if n < 2 or n > len(raw) - 8:
        raise Bad("%s: header length %d in a file of %d bytes" % (path, n, len(raw)))
    try:
        head = json.loads(raw[8:8 + n].decode("utf-8"), object_pairs_hook=no_dups)
    except ValueError as e:
        raise Bad("%s: header: %s" % (path, e))
    data = raw[8 + n:]
    meta = head.pop("__metadata__", {})
    if meta.get("format") != "pt":
        raise Bad("%s: __metadata__.format is %r, transformers wants \"pt\"" % (path, meta))
    spans, out = [], {}
    for name, t in head.items():
        if t.get("dtype") not in SIZES:
            raise Bad("%s: %s: dtype %r" % (path, name, t.get("dtype")))
        shape = t["shape"]
        b, e = t["data_offsets"]
        count = int(np.prod(shape)) if shape else 1
        if e - b != count * SIZES[t["dtype"]]:
            raise Bad("%s: %s: offsets [%d, %d) for shape %s" % (path, name, b, e, shape))
        spans.append((b, e, name))
        out[name] = decode(data[b:e], t["dtype"], shape)
    at = 0
    for b, e, name in sorted(spans):
        if b != at:
            raise Bad("%s: %s starts at %d, the previous tensor ended at %d" % (path, name, b, at))
        at = e
    if at != len(data):
        raise Bad("%s: %d bytes of data, the tensors cover %d" % (path, len(data), at))
    return out, len(data)


def read_weights(d):
    single = os.path.join(d, "model.safetensors")
    if os.path.exists(single):
        return parse(single)[0], 1
    index = load_json(os.path.join(d, "model.safetensors.index.json"))
    wm = index["weight_map"]
    tensors, total = {}, 0
    for shard in sorted(set(wm.values())):
        got, size = parse(os.path.join(d, shard))
        total += size
        for name in got:
            if wm.get(name) != shard:
                raise Bad("%s holds %s, the weight_map says %r" % (shard, name, wm.get(name)))
        tensors.update(got)
    if set(wm) != set(tensors):
        raise Bad("weight_map and the shards name different tensors: %s"
                  % sorted(set(wm) ^ set(tensors))[:4])
    if index["metadata"]["total_size"] != total:
        raise Bad("total_size %s, the shards hold %d bytes" % (index["metadata"], total))
    return tensors, len(set(wm.values()))


def interleaved_to_half(w, heads):
    """The row permutation that turns Meta's interleaved rotary pairs
    (2i, 2i+1) into rotate-half pairs (i, i + hs/2)."""
    hs = w.shape[0] // heads
    return w.reshape(heads, hs // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--permute-qk", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    try:
        cfg = load_json(os.path.join(a.dir, "config.json"))
        load_json(os.path.join(a.dir, "generation_config.json"))
        moe = cfg.get("model_type") == "mixtral"
        kind = ("mixtral", ["MixtralForCausalLM"]) if moe else ("llama", ["LlamaForCausalLM"])
        for k, want in (("model_type", kind[0]), ("architectures", kind[1]),
                        ("torch_dtype", "float32"), ("hidden_act", "silu")):
            if cfg.get(k) != want:
                raise Bad("config.json: %s is %r, not %r" % (k, cfg.get(k), want))
        if moe and cfg.get("sliding_window") is not None:
            raise Bad("config.json: sliding_window: llama_model.py's forward has none")
        if cfg.get("rope_scaling") is not None:
            raise Bad("config.json: rope_scaling: llama_model.py's forward has none")
        C, L = cfg["hidden_size"], cfg["num_hidden_layers"]
        NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        V, Fh, hs = cfg["vocab_size"], cfg["intermediate_size"], C // NH
        tie = cfg["tie_word_embeddings"]
        c = {"d_model": C, "n_layer": L, "n_head": NH, "n_kv_head": NKV, "vocab": V,
             "norm_eps": cfg["rms_norm_eps"], "rope_theta": cfg["rope_theta"], "tie": tie}
        if moe:
            # Mixtral's sparse block: experts in every layer, softmax router,
            # top-k gates renormalised, no token dropped
            E = cfg["num_local_experts"]
            c.update({"moe_every": 1, "n_experts": E, "top_k": cfg["num_experts_per_tok"],
                      "dropless": True, "norm_topk": True, "capacity_factor": 1.0})
        tensors, nfiles = read_weights(a.dir)
        want = {"model.embed_tokens.weight": ("tok_emb", (V, C)),
                "model.norm.weight": ("norm.w", (C,))}
        if not tie:
            want["lm_head.weight"] = ("output.w", (V, C))
        for l in range(L):
            mlp = ((("block_sparse_moe.gate", "moe.router.w", (E, C)),) + tuple(
                ("block_sparse_moe.experts.%d.%s" % (e, w), "moe.%d.%s" % (e, w), shape)
                for e in range(E) for w, shape in (("w1", (Fh, C)), ("w3", (Fh, C)),
                                                   ("w2", (C, Fh))))
                   if moe else (("mlp.gate_proj", "mlp.gate.w", (Fh, C)),
                                ("mlp.up_proj", "mlp.up.w", (Fh, C)),
                                ("mlp.down_proj", "mlp.down.w", (C, Fh))))
            for hf, ours, shape in (
                    ("input_layernorm", "attn_norm.w", (C,)),
                    ("self_attn.q_proj", "attn.q.w", (NH * hs, C)),
                    ("self_attn.k_proj", "attn.k.w", (NKV * hs, C)),
                    ("self_attn.v_proj", "attn.v.w", (NKV * hs, C)),
                    ("self_attn.o_proj", "attn.o.w", (C, NH * hs)),
                    ("post_attention_layernorm", "mlp_norm.w", (C,))) + mlp:
                want["model.layers.%d.%s.weight" % (l, hf)] = ("h.%d.%s" % (l, ours), shape)
        if set(want) != set(tensors):
            raise Bad("tensor names: missing %s, extra %s" % (
                sorted(set(want) - set(tensors))[:4], sorted(set(tensors) - set(want))[:4]))
        p = {}
        for hf, (ours, shape) in want.items():
            if tensors[hf].shape != shape:
                raise Bad("%s has shape %s, config.json says %s" % (hf, tensors[hf].shape, shape))
            w = tensors[hf]
            if a.permute_qk and ours.endswith(("attn.q.w", "attn.k.w")):
                w = interleaved_to_half(w, NH if ours.endswith("q.w") else NKV)
            p[ours] = torch.tensor(w, dtype=torch.float64)
        for l in range(L if moe else 0):
            # meshrun's stacked experts: gate_up (E, 2F, C) = [w1; w3], down (E, C, F)
            pre = "h.%d.moe." % l
            p[pre + "gate_up.w"] = torch.stack([torch.cat((p.pop(pre + "%d.w1" % e),
                                                          p.pop(pre + "%d.w3" % e)))
                                                for e in range(E)])
            p[pre + "down.w"] = torch.stack([p.pop(pre + "%d.w2" % e) for e in range(E)])
    except (Bad, KeyError, TypeError) as e:
        print("hf_llama_check: bad directory: %s" % e)
        return 1
    tok = [int(x) for x in a.tokens.split(",")]
    idx = torch.tensor([tok], dtype=torch.long)
    with torch.no_grad():
        logits, _, _ = forward(p, c, idx, torch.zeros_like(idx))
    got = logits[0].numpy()
    ref = np.fromfile(a.logits, dtype="<f4").astype(np.float64)
    if ref.size != got.size:
        print("hf_llama_check: %s holds %d logits, the model makes %d" % (a.logits, ref.size,
                                                                        got.size))
        return 1
    diff = float(np.abs(got.reshape(-1) - ref).max())
    print("hf_llama_check: %d tensors in %d file(s), %d layers, max |logit diff| %.3g (tol %g)"
          % (len(tensors), nfiles, L, diff, a.tol))
    if not diff <= a.tol:
        print("hf_llama_check: logits differ")
        return 1
    print("hf_llama_check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
