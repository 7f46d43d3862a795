/*
 * mr_cuda_gpt.h - a dense GPT trained on one CUDA device: the device twin
 * of struct mr_gpt + mr_step_run (model/mr_gpt.h, mr_step.h), built
 * from the kernels of mr_cuda.h.
 *
 * What lives on the device (one allocation per ledger category):
 *   params    fp32 master weights (n) + their bf16 copy (n) the GEMMs read
 *   grads     fp32 (n), += across micro-batches
 *   optim     AdamW m, v fp32 (n each)
 *   acts      bf16 activations of every layer (llm.c layout), fp32
 *             LayerNorm mean/rstd, attention lse, losses, token ids
 *   workspace bf16 backward scratch (dres, dln, datty, dqkv, dfch), fp32
 *             attention delta
 * n is the parameter count of the CPU model's tensor table; every buffer
 * above uses that table's order and offsets, so host buffers passed to
 * upload/download are exactly struct mr_gpt.params.
 *
 * One step (mr_cuda_gpt_step) is mr_step_run: zero grads, accum
 * micro-batches of forward + backward(dscale = 1/accum), the global grad
 * norm (sum of squares on the device, fp32 partials then double), clipping
 * by min(1, clip / (norm + 1e-6)) folded into AdamW's grad_scale, the
 * learning rate of mr_lr_at(step), AdamW with weight decay only on tensors
 * whose table entry has decay = 1, then the bf16 copy is refreshed by the
 * same kernel. A non-finite loss or grad norm fails with MR_ENONFINITE and
 * the message of mr_step_run (step number, first non-finite tensor).
 *
 * Scope: tp = 1, dense layers only (moe_every = 0: MoE needs device
 * routing, future work), head size a multiple of 32 and <= 128 (the
 * attention kernel). mr_cuda_gpt_check tells which field is out of scope.
 *
 * Synchronisation: forward waits for the stream when it uploads the
 * tokens and when it reads the losses back (summed on the host and checked
 * to be finite, as the CPU trainer does); backward buckets the tokens on
 * the host for the embedding gradient (mr_cuda_encoder_bwd); step also
 * waits for the grad norm. Everything else is queued on cu's stream.
 *
 * Ownership: mr_cuda_gpt_create borrows cu (it must outlive the model) and
 * returns a model freed with mr_cuda_gpt_free (NULL is a no-op). Host
 * buffers are the caller's. Non-goals: tensor/pipeline/data parallelism
 * on the device, MoE, fp16/fp8, activation recomputation.
 */
#ifndef MR_CUDA_GPT_H
#define MR_CUDA_GPT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "cuda/mr_cuda.h"
#include "mr_mem.h"
#include "mr_step.h"

struct mr_cuda_gpt;

/* The checks of mr_gpt_create (config, batch_size, seq_len) plus the
 * device's scope (moe_every = 0; head size); no device needed. The message
 * and eb->field name the offending field. */
int mr_cuda_gpt_check(const struct mr_gpt_config *cfg, int B, int T, struct mr_errbuf *eb);

/* Allocates the model for micro-batches of (B,T) on cu and the AdamW state
 * for ocfg; parameters are zero until init or upload, m, v and the step
 * count are zero. */
int mr_cuda_gpt_create(struct mr_cuda_gpt **out, struct mr_cuda *cu,
		       const struct mr_gpt_config *cfg, int B, int T,
		       const struct mr_adamw_config *ocfg, struct mr_errbuf *eb);
void mr_cuda_gpt_free(struct mr_cuda_gpt *g);

/* The parameter table (tensors, ntensors, nparams, cfg) of the model, a
 * host struct mr_gpt of shape (1,1) without params/grads. Read only. */
const struct mr_gpt *mr_cuda_gpt_table(const struct mr_cuda_gpt *g);
size_t mr_cuda_gpt_nparams(const struct mr_cuda_gpt *g);
/* Device bytes by category (MR_MEM_PARAMS..MR_MEM_WORKSPACE), from the
 * allocations themselves. The cu context's own GEMM workspace and kernel
 * scratch (32 MiB + small) are not in it. */
const struct mr_mem *mr_cuda_gpt_mem(const struct mr_cuda_gpt *g);
/* Training FLOPs per token (6N + 6LCT at this model's T), as
 * mr_gpt_flops_per_token of a host model of the same shape: for MFU. */
size_t mr_cuda_gpt_flops_per_token(const struct mr_cuda_gpt *g);
/* Steps taken (the AdamW t); set when resuming from a checkpoint. */
long mr_cuda_gpt_steps(const struct mr_cuda_gpt *g);
void mr_cuda_gpt_set_steps(struct mr_cuda_gpt *g, long t);

/* The values of mr_gpt_init_params(seed) (bit-identical fp32 masters). */
int mr_cuda_gpt_init_params(struct mr_cuda_gpt *g, uint64_t seed, struct mr_errbuf *eb);
/* host (n floats, table order) <-> fp32 masters; upload also refreshes
 * the bf16 copy. n must be mr_cuda_gpt_nparams. Synchronous. */
int mr_cuda_gpt_upload_params(struct mr_cuda_gpt *g, const float *host, size_t n,
			      struct mr_errbuf *eb);
int mr_cuda_gpt_download_params(struct mr_cuda_gpt *g, float *host, size_t n,
				struct mr_errbuf *eb);
/* Gradients of the last backward (unclipped: clipping is applied inside
 * the AdamW update). Synchronous. */
int mr_cuda_gpt_download_grads(struct mr_cuda_gpt *g, float *host, size_t n,
			       struct mr_errbuf *eb);
/* AdamW m and v (n floats each; checkpoints). Synchronous. */
int mr_cuda_gpt_download_optim(struct mr_cuda_gpt *g, float *m, float *v, size_t n,
			       struct mr_errbuf *eb);
int mr_cuda_gpt_upload_optim(struct mr_cuda_gpt *g, const float *m, const float *v, size_t n,
			     struct mr_errbuf *eb);

/* inputs/targets (B,T) host token ids, checked to be in [0, V) (MR_ERANGE
 * names the first bad one, as mr_gpt_forward). *loss = mean cross-entropy
 * (targets may be NULL: logits only, *loss = 0). */
int mr_cuda_gpt_forward(struct mr_cuda_gpt *g, const int *inputs, const int *targets,
			float *loss, struct mr_errbuf *eb);
int mr_cuda_gpt_zero_grad(struct mr_cuda_gpt *g, struct mr_errbuf *eb);
/* grads += d(loss * dscale)/dparams; after a forward with targets. */
int mr_cuda_gpt_backward(struct mr_cuda_gpt *g, float dscale, struct mr_errbuf *eb);
/* mr_step_run on the device: inputs/targets are accum consecutive
 * (B,T) micro-batches (host). r gets loss, grad_norm (before clipping),
 * lr; aux_loss is 0 (dense). */
int mr_cuda_gpt_step(struct mr_cuda_gpt *g, const int *inputs, const int *targets, int accum,
		     struct mr_step_result *r, struct mr_errbuf *eb);

#ifdef __cplusplus
}
#endif

#endif
