/*
 * mr_hf_llama.h - a llama model's parameters <-> a Hugging Face Llama
 * directory (what transformers' LlamaForCausalLM.from_pretrained reads):
 * what `meshrun ckpt import --hf` and `meshrun ckpt export --hf` do once
 * the checkpoint is read.
 *
 * The directory:
 *
 *   config.json                   the model (keys below)
 *   model.safetensors             every tensor, or, sharded:
 *   model-0000k-of-0000n.safetensors + model.safetensors.index.json
 *                                 {"metadata": {"total_size": bytes},
 *                                  "weight_map": {tensor: shard file}}
 *   generation_config.json        (export only; import ignores it)
 *
 * Names. torch.nn.Linear stores (out, in), meshrun's table layout, so no
 * matrix is transposed:
 *
 *   tok_emb (V,C)                 model.embed_tokens.weight
 *   h.i.attn_norm.w (C)           model.layers.i.input_layernorm.weight
 *   h.i.attn.q.w (NH*hs,C)        model.layers.i.self_attn.q_proj.weight
 *   h.i.attn.k.w (NKV*hs,C)       model.layers.i.self_attn.k_proj.weight
 *   h.i.attn.v.w (NKV*hs,C)       model.layers.i.self_attn.v_proj.weight
 *   h.i.attn.o.w (C,NH*hs)        model.layers.i.self_attn.o_proj.weight
 *   h.i.mlp_norm.w (C)            model.layers.i.post_attention_layernorm.weight
 *   h.i.mlp.gate.w (F,C)          model.layers.i.mlp.gate_proj.weight
 *   h.i.mlp.up.w (F,C)            model.layers.i.mlp.up_proj.weight
 *   h.i.mlp.down.w (C,F)          model.layers.i.mlp.down_proj.weight
 *   norm.w (C)                    model.norm.weight
 *   output.w (V,C)                lm_head.weight (absent when tied)
 *
 * A llama MoE with experts in every layer is a Mixtral (model_type
 * "mixtral", MixtralForCausalLM): its layers' mlp.* become
 *
 *   h.i.moe.router.w (E,C)        model.layers.i.block_sparse_moe.gate.weight
 *   h.i.moe.gate_up.w (E,2F,C)    ...block_sparse_moe.experts.e.w1.weight (F,C),
 *                                 then experts.e.w3.weight (F,C), for each e
 *   h.i.moe.down.w (E,C,F)        ...block_sparse_moe.experts.e.w2.weight (C,F)
 *
 * read with MixtralConfig's keys num_local_experts, num_experts_per_tok
 * (1 or 2) and router_aux_loss_coef (0.001), its defaults (8 kv heads,
 * rms_norm_eps 1e-5, rope_theta 1e6) and sliding_window null; the model
 * is dropless with renormalised gates, as Mixtral's block is. A model with
 * experts every k > 1 layers, or raw gates, has no Mixtral form: export
 * refuses it naming moe_every / moe_norm_topk. Qwen3-MoE's QK-norm is no
 * meshrun layer: its model_type is refused.
 *
 * Rotary rows need no permutation: meshrun's rotary kernel
 * (kernels/rope.c) pairs element i of a head with element i + hs/2 (the
 * rotate-half layout), which is the convention of Hugging Face's Llama
 * modelling, so q_proj and k_proj rows are copied as they are. The
 * permutation of q/k rows known from HF's conversion script exists only
 * between Meta's original checkpoints (pairs 2i, 2i+1 interleaved) and
 * HF's; a Meta original must be converted to HF's layout first.
 *
 * config.json (transformers' LlamaConfig): model_type "llama" (or "mixtral");
 * hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
 * vocab_size, max_position_embeddings required; num_key_value_heads
 * (absent: num_attention_heads), rms_norm_eps (1e-6), rope_theta (10000),
 * tie_word_embeddings (false) take LlamaConfig's defaults when absent, as
 * transformers would; rope_scaling null/absent or {"rope_type" (or the
 * older "type"): "llama3", factor, low_freq_factor, high_freq_factor,
 * original_max_position_embeddings}; head_dim, when present, must be
 * hidden_size / num_attention_heads; hidden_act, when present, "silu";
 * attention_bias and mlp_bias, when present, false. Other keys are
 * ignored. max_position_embeddings becomes max_seq (or the caller's
 * value), and export writes max_seq as max_position_embeddings.
 *
 * Tensors are read as F32, BF16, F16 or F64 and held as float32; an old
 * checkpoint's rotary buffers (self_attn.rotary_emb.inv_freq) are
 * ignored; a tied model's lm_head.weight is accepted only when equal to
 * the embedding. Export writes F32 and config "torch_dtype": "float32".
 *
 * Ownership: the model is the caller's (import creates it; release with
 * mr_gpt_release). Non-goals: Meta's original consolidated.*.pth, other
 * rope_scaling types (linear, dynamic, yarn), tokenizer files (copy the
 * tokenizer of the source model beside an export yourself).
 */
#ifndef MR_HF_LLAMA_H
#define MR_HF_LLAMA_H

#include <stddef.h>
#include <stdint.h>

#include "model/mr_gpt.h"

/* Where export starts a new shard by default (bytes of tensor data). */
#define MR_HF_SHARD_BYTES (4ull << 30)

/* The Hugging Face name of table tensor t into buf; MR_ENOTFOUND for a
 * name that is no llama parameter. */
int mr_hf_llama_name(const char *ours, char *buf, size_t cap);

/* Writes m's parameters (a one-rank llama model, m->params in host
 * memory) into directory dir (created if missing): the tensors in table
 * order, a new shard begun before a tensor that would take the current
 * one past shard_bytes (0: MR_HF_SHARD_BYTES; one file when everything
 * fits: model.safetensors), config.json and generation_config.json. An
 * existing output file is MR_EEXISTS unless overwrite; a stale shard set
 * (another count) is left alone, never half-replaced: each file is
 * atomic. MR_ENOTSUP naming "arch" for a gpt2 model. *nfiles (may be
 * NULL): the shard files written. */
int mr_hf_llama_export(const struct mr_gpt *m, const char *dir, uint64_t shard_bytes,
		       int overwrite, int *nfiles, struct mr_errbuf *eb);

/* Reads Hugging Face Llama directory dir into a one-rank model created
 * here (B = T = 1, the cpu device); max_seq > 0 replaces
 * max_position_embeddings as the model's max_seq (a llama has no
 * position table: any value is the same parameters). Errors name the file, the key or
 * tensor and the reason: MR_ENOTFOUND (no config.json, no weights),
 * MR_EIO, MR_ECORRUPT / MR_ELIMIT (a file's format), MR_ENOTSUP (a
 * model_type, dtype or rope_scaling this does not read), MR_EINVAL (a
 * key missing or out of range, a tensor missing, misshapen or extra, a
 * weight_map naming a missing shard). On failure m holds nothing. */
int mr_hf_llama_import(struct mr_gpt *m, const char *dir, int max_seq, struct mr_errbuf *eb);

#endif
