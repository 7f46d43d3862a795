/*
 * mr_st_gpt.h - a whole GPT model's parameters as one safetensors file
 * with Hugging Face GPT-2 tensor names, and back: what `meshrun ckpt
 * export` and `meshrun ckpt import` do once the checkpoint is read.
 *
 * Names (docs/CHECKPOINTS.md has the table). Dense parts are those of
 * transformers' GPT2LMHeadModel; its Conv1D layers store (in, out), the
 * transpose of our (out, in) table layout, so every matrix inside a block
 * is written transposed:
 *
 *   wte (V,C)              transformer.wte.weight (V,C)
 *   wpe (maxT,C)           transformer.wpe.weight (maxT,C)
 *   h.i.ln1.w / .b         transformer.h.i.ln_1.weight / .bias
 *   h.i.attn.qkv.w (3C,C)  transformer.h.i.attn.c_attn.weight (C,3C)
 *   h.i.attn.qkv.b         transformer.h.i.attn.c_attn.bias
 *   h.i.attn.proj.w (C,C)  transformer.h.i.attn.c_proj.weight (C,C)^T
 *   h.i.ln2.w / .b         transformer.h.i.ln_2.weight / .bias
 *   h.i.mlp.fc.w (4C,C)    transformer.h.i.mlp.c_fc.weight (C,4C)
 *   h.i.mlp.proj.w (C,4C)  transformer.h.i.mlp.c_proj.weight (4C,C)
 *   (biases as .bias)
 *   lnf.w / .b             transformer.ln_f.weight / .bias
 *
 * No lm_head.weight: the head is tied to wte, as in the gpt2 checkpoints.
 * MoE layers have no GPT-2 name; they keep the same convention:
 *
 *   h.i.moe.router.w (E,C)       transformer.h.i.moe.router.weight (C,E)
 *   h.i.moe.fc.w (E,4C,C)        transformer.h.i.moe.experts.e.c_fc.weight (C,4C) each
 *   h.i.moe.fc.b (E,4C)          transformer.h.i.moe.experts.e.c_fc.bias (4C)
 *   h.i.moe.proj.w (E,C,4C)      transformer.h.i.moe.experts.e.c_proj.weight (4C,C)
 *   h.i.moe.proj.b (E,C)         transformer.h.i.moe.experts.e.c_proj.bias (C)
 *
 * Metadata (strings): "format": "pt" (what transformers' loader wants),
 * "meshrun": "1" (this metadata's version), "step", and the model config
 * as the checkpoint manifest names it (vocab_size, max_seq, n_layer,
 * d_model, n_head, moe_every, n_experts, top_k, capacity_factor,
 * aux_coef, moe_policy), enough to rebuild the model.
 *
 * Import takes a file with that metadata, or a plain GPT-2 file without
 * it (names with or without "transformer.", F32/F16/BF16/F64; the
 * attention mask buffers attn.bias / attn.masked_bias ignored, an
 * lm_head.weight accepted only when equal to wte): the config then comes
 * from the shapes, and n_head, which GPT-2 files do not record, from the
 * caller. Every problem names the tensor or metadata key and the reason.
 *
 * Ownership: the model is the caller's (import creates it; the caller
 * releases it with mr_gpt_release). Non-goals: untied heads, dtypes other
 * than F32 on export, HF's config.json, llama models (mr_hf_llama.h).
 */
#ifndef MR_ST_GPT_H
#define MR_ST_GPT_H

#include <stddef.h>

#include "model/mr_gpt.h"

#define MR_ST_GPT_META_VERSION "1"

/* The file name of table tensor t (of expert e for an expert tensor) into
 * buf; *transposed (may be NULL): written (in, out). MR_ENOTFOUND for a
 * name this mapping does not know. */
int mr_st_gpt_name(const struct mr_gpt_tensor *t, int e, char *buf, size_t cap,
		   int *transposed);

/* Writes m's parameters (a one-rank model, m->params in host memory) to
 * path with the metadata above; overwrite: replace an existing path
 * (else MR_EEXISTS). Atomic (mr_safetensors.h's writer). */
int mr_st_gpt_export(const struct mr_gpt *m, long step, const char *path, int overwrite,
		     struct mr_errbuf *eb);

/* Reads path into a one-rank model created here (B = T = 1, the cpu
 * device): its config from the metadata, or from the shapes with n_head
 * (> 0; required without metadata, and equal to the metadata's with it).
 * *step: the metadata's step (0 without); *had_meta (may be NULL): 1 when
 * the file carried meshrun metadata. Errors: MR_ENOTFOUND / MR_EIO (the
 * file), MR_ECORRUPT / MR_ELIMIT (the format), MR_EINVAL (a tensor or key
 * that does not fit; eb->field "n_head" when n_head is missing or
 * differs). On failure m holds nothing (nothing to release). */
int mr_st_gpt_import(struct mr_gpt *m, const char *path, int n_head, long *step, int *had_meta,
		     struct mr_errbuf *eb);

#endif
