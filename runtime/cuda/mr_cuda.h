/*
 * mr_cuda.h - the CUDA device backend's C interface: device context, device
 * memory, cuBLASLt/cuBLAS GEMMs and the own kernels of the GPT runtime.
 *
 * Every kernel here has a CPU twin in kernels/mr_kernels.h,
 * kernels/mr_attention.h or optim/mr_adamw.h, with the same shapes
 * (llm.c notation: B batch, T time, C channels, N = B*T rows, V vocab) and
 * the same accumulate (+=) / write (=) rule, and tests/gpu/ compares each
 * against its twin.
 *
 * Precision (llm.c's mixed-precision GPU path):
 *   - activations and the weight copies the GEMMs read are bf16 (mr_bf16);
 *   - master weights, parameter gradients, AdamW m/v, LayerNorm mean/rstd,
 *     attention lse/delta, losses are fp32;
 *   - every reduction (GEMM accumulation, LayerNorm statistics, softmax
 *     sums, bias/weight gradient sums, grad norm) runs in fp32 (the grad
 *     norm's last pass in double) and bf16 is only a storage format:
 *     loads convert to fp32, stores round to nearest even once;
 *   - activation gradients (dinp of GEMM/LayerNorm/attention, dlogits) are
 *     bf16 like the activations; parameter gradients (dw, dbias, LayerNorm
 *     dw/db, embedding dwte/dwpe) are fp32 and accumulate (+=) across
 *     micro-batches.
 * Where context parallelism needs more precision (partial attention outputs
 * being merged, dq/dk/dv summed over ring steps) an fp32 variant exists.
 *
 * Determinism: no kernel uses float atomics. Sums over rows (bias, LayerNorm
 * dw/db, embedding gradients, grad norm) go through fixed-shape partials
 * summed in a fixed order; attention backward computes dq and dk/dv in two
 * passes instead of atomics. Same inputs + same device = same bits.
 *
 * Calls are asynchronous on the context's stream unless they say otherwise;
 * a kernel entry returns 0 or a negative MR_E* code when the launch itself
 * failed (bad shape: MR_EINVAL; CUDA error: MR_ESYS), with the reason in
 * mr_cuda_errmsg(). Errors of a running kernel surface at mr_cuda_sync().
 *
 * Ownership: the caller owns struct mr_cuda (mr_cuda_create/mr_cuda_free)
 * and every device buffer it allocates (mr_cuda_alloc/mr_cuda_dfree); all
 * tensor arguments are device pointers unless named *_host. The context
 * owns its stream, cuBLAS/cuBLASLt handles, GEMM workspace and the scratch
 * it uses for partial sums.
 *
 * Non-goals: multi-GPU in one context (one context per rank and device),
 * fp16, fp8, dropout, kernels other than the GPT runtime's.
 */
#ifndef MR_CUDA_H
#define MR_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "mr_err.h"

/* bf16 as stored: the high 16 bits of an IEEE fp32. */
typedef uint16_t mr_bf16;

/* Host-side conversions (round to nearest even; NaN stays NaN). */
static inline mr_bf16 mr_bf16_from_f32(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (mr_bf16)((u >> 16) | 0x40u); /* quiet NaN */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (mr_bf16)(u >> 16);
}

static inline float mr_bf16_to_f32(mr_bf16 h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

struct mr_cuda;

/* ---- device and context ------------------------------------------------ */
/* Number of usable devices; 0 (and a reason in eb) when there is no driver
 * or no device. Never fails otherwise. */
int mr_cuda_device_count(struct mr_errbuf *eb);
/* Context on device `device`: stream, cuBLAS(Lt) handles, 32 MiB GEMM
 * workspace. MR_ENOTSUP when there is no such device. */
int mr_cuda_create(struct mr_cuda **out, int device, struct mr_errbuf *eb);
void mr_cuda_free(struct mr_cuda *cu);
/* The last error message of the context ("" if none). */
const char *mr_cuda_errmsg(const struct mr_cuda *cu);
/* Waits for the stream; reports errors of kernels that ran. */
int mr_cuda_sync(struct mr_cuda *cu);
/* 1 if GEMMs run through cuBLASLt, 0 if through the cuBLAS fallback. */
int mr_cuda_using_lt(const struct mr_cuda *cu);
/* Forces the cuBLAS fallback (tests; also set by MESHRUN_CUBLASLT=0). */
void mr_cuda_disable_lt(struct mr_cuda *cu);

/* ---- memory (device pointers; bytes) ----------------------------------- */
int mr_cuda_alloc(struct mr_cuda *cu, void **p, size_t bytes);
void mr_cuda_dfree(struct mr_cuda *cu, void *p); /* p may be NULL */
int mr_cuda_memset0(struct mr_cuda *cu, void *p, size_t bytes);
/* Synchronous copies (they wait for the stream). */
int mr_cuda_upload(struct mr_cuda *cu, void *dst, const void *src_host, size_t bytes);
int mr_cuda_download(struct mr_cuda *cu, void *dst_host, const void *src, size_t bytes);
/* Device conversions of n elements. */
int mr_cuda_f32_to_bf16(struct mr_cuda *cu, mr_bf16 *dst, const float *src, size_t n);
int mr_cuda_bf16_to_f32(struct mr_cuda *cu, float *dst, const mr_bf16 *src, size_t n);

/* ---- GEMM (cuBLASLt, cuBLAS fallback; bf16 in, fp32 accumulate) --------- */
/* out (N,OC) = inp (N,IC) @ w^T (w is (OC,IC)) + bias (OC, may be NULL).
 * The bias rides in the cuBLASLt epilogue. Twin: mr_matmul_fwd. */
int mr_cuda_matmul_fwd(struct mr_cuda *cu, mr_bf16 *out, const mr_bf16 *inp, const mr_bf16 *w,
		       const mr_bf16 *bias, int N, int IC, int OC);
/* dinp (N,IC) = or += dout @ w (bf16; may be NULL), dw (OC,IC) += dout^T @
 * inp (fp32; may be NULL), dbias (OC) += colsum(dout) (fp32; may be NULL).
 * Twin: mr_matmul_bwd. */
int mr_cuda_matmul_bwd(struct mr_cuda *cu, mr_bf16 *dinp, float *dw, float *dbias,
		       const mr_bf16 *dout, const mr_bf16 *inp, const mr_bf16 *w, int N, int IC,
		       int OC, int accumulate_dinp);
/* All-fp32 variant of the forward (MoE router; no TF32). */
int mr_cuda_matmul_fwd_f32(struct mr_cuda *cu, float *out, const float *inp, const float *w,
			   const float *bias, int N, int IC, int OC);

/* ---- embedding ----------------------------------------------------------- */
/* out (B,T,C) = wte[tok] + wpe[t]; tok (B*T) device ints. Twin:
 * mr_encoder_fwd. */
int mr_cuda_encoder_fwd(struct mr_cuda *cu, mr_bf16 *out, const int *tok, const mr_bf16 *wte,
			const mr_bf16 *wpe, int B, int T, int C);
/* dwte (V,C) += ..., dwpe (T,C) += ... (fp32) from dout (B,T,C). The
 * tokens are read on the HOST (tok_host, B*T ids in [0, V)) to bucket the
 * positions of each distinct token, so every dwte row is summed by one
 * thread per channel in position order: deterministic, no atomics.
 * Twin: mr_encoder_bwd. */
int mr_cuda_encoder_bwd(struct mr_cuda *cu, float *dwte, float *dwpe, const mr_bf16 *dout,
			const int *tok_host, int B, int T, int C, int V);

/* ---- layernorm ------------------------------------------------------------ */
/* out (N,C) bf16; mean, rstd (N) fp32. w, b (C) bf16 copies.
 * Twin: mr_layernorm_fwd. */
int mr_cuda_layernorm_fwd(struct mr_cuda *cu, mr_bf16 *out, float *mean, float *rstd,
			  const mr_bf16 *inp, const mr_bf16 *w, const mr_bf16 *b, int N, int C);
/* dinp (N,C) += (bf16), dw, db (C) += (fp32). Twin: mr_layernorm_bwd. */
int mr_cuda_layernorm_bwd(struct mr_cuda *cu, mr_bf16 *dinp, float *dw, float *db,
			  const mr_bf16 *dout, const mr_bf16 *inp, const mr_bf16 *w,
			  const float *mean, const float *rstd, int N, int C);

/* ---- elementwise (bf16 storage, fp32 math) -------------------------------- */
int mr_cuda_gelu_fwd(struct mr_cuda *cu, mr_bf16 *out, const mr_bf16 *inp, size_t n);
/* dinp = dout * gelu'(inp); dinp may alias dout. */
int mr_cuda_gelu_bwd(struct mr_cuda *cu, mr_bf16 *dinp, const mr_bf16 *inp,
		     const mr_bf16 *dout, size_t n);
/* out = a + b (may alias). Twin: mr_residual_fwd. */
int mr_cuda_residual_fwd(struct mr_cuda *cu, mr_bf16 *out, const mr_bf16 *a, const mr_bf16 *b,
			 size_t n);
/* y += x. Twin: mr_add_inplace. */
int mr_cuda_add_inplace(struct mr_cuda *cu, mr_bf16 *y, const mr_bf16 *x, size_t n);

/* ---- softmax + cross-entropy (fused) -------------------------------------- */
/* logits (N,V) bf16; losses, lse (N) fp32; targets (N) device ints in
 * [0, V) (out of range gives a NaN loss). Twin: mr_crossentropy_fwd. */
int mr_cuda_crossentropy_fwd(struct mr_cuda *cu, float *losses, float *lse,
			     const mr_bf16 *logits, const int *targets, int N, int V);
/* In place: logits becomes (softmax - onehot) * dscale.
 * Twin: mr_crossentropy_bwd_inplace. */
int mr_cuda_crossentropy_bwd_inplace(struct mr_cuda *cu, mr_bf16 *logits, const float *lse,
				     const int *targets, int N, int V, float dscale);

/* ---- attention (block-wise, online softmax; see mr_attention.h) ----------
 * One call runs every (batch, head). Q of head h of batch b, query i is at
 * q + b*q_batch + i*q_row + h*hs (elements); K and V likewise with kv_*;
 * queries sit at absolute positions q_pos0.., keys at k_pos0.. (context
 * parallel slices). hs must be a multiple of 32 and <= 128. */
struct mr_cuda_attn {
	const mr_bf16 *q, *k, *v;
	size_t q_row, q_batch, kv_row, kv_batch;
	int B, NH, hs;
	int tq, q_pos0, tk, k_pos0;
	int causal;
	float scale;        /* usually 1/sqrt(hs) */
};
/* Output rows of (B, tq, NH*hs) at out + b*o_batch + i*o_row + h*hs;
 * lse (B,NH,tq) fp32. Rows that see no key: out 0, lse -inf.
 * Twin: mr_attn_head_fwd / mr_attn_layer_fwd. */
int mr_cuda_attn_fwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, mr_bf16 *out,
		     size_t o_row, size_t o_batch, float *lse);
/* The same with an fp32 output, for partials that will be merged. */
int mr_cuda_attn_fwd_f32(struct mr_cuda *cu, const struct mr_cuda_attn *a, float *out,
			 size_t o_row, size_t o_batch, float *lse);
/* out_a, lse_a := merge(a, b) over disjoint key sets (fp32, same layout).
 * Twin: mr_attn_merge. */
int mr_cuda_attn_merge(struct mr_cuda *cu, float *out_a, float *lse_a, const float *out_b,
		       const float *lse_b, int B, int NH, int tq, int hs, size_t o_row,
		       size_t o_batch);
/* delta (B,NH,tq) = rowsum(dout * out) over each head's hs channels;
 * dout/out laid out like the forward output. */
int mr_cuda_attn_delta(struct mr_cuda *cu, float *delta, const mr_bf16 *dout,
		       const mr_bf16 *out, int B, int NH, int tq, int hs, size_t o_row,
		       size_t o_batch);
/* dq (like q, stride dq_row/dq_batch), dk, dv (like k/v, dkv_*): +=, from
 * dout (laid out like the output), the FINAL lse and delta. dq is computed
 * by one pass over key blocks, dk/dv by one over query blocks (no atomics).
 * Twin: mr_attn_head_bwd / mr_attn_layer_bwd (which zeroes dqkv first). */
int mr_cuda_attn_bwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, const mr_bf16 *dout,
		     size_t o_row, size_t o_batch, const float *lse, const float *delta,
		     mr_bf16 *dq, size_t dq_row, size_t dq_batch, mr_bf16 *dk, mr_bf16 *dv,
		     size_t dkv_row, size_t dkv_batch);
/* The same accumulating into fp32 gradients (ring attention). */
int mr_cuda_attn_bwd_f32(struct mr_cuda *cu, const struct mr_cuda_attn *a,
			 const mr_bf16 *dout, size_t o_row, size_t o_batch, const float *lse,
			 const float *delta, float *dq, size_t dq_row, size_t dq_batch,
			 float *dk, float *dv, size_t dkv_row, size_t dkv_batch);

/* ---- optimizer ------------------------------------------------------------- */
struct mr_cuda_adamw {
	float lr, beta1, beta2, eps;
	float weight_decay;  /* 0 for tensors without decay (biases, LayerNorm) */
	long t;              /* step number, 1-based, after increment */
	float grad_scale;    /* multiplies g first (clipping); 1 = none */
};
/* p (n) fp32 master, g, m, v (n) fp32; p_bf16 (n) may be NULL, else gets
 * the rounded new p. Twin: mr_adamw_step (one tensor's range). */
int mr_cuda_adamw_step(struct mr_cuda *cu, float *p, mr_bf16 *p_bf16, const float *g, float *m,
		       float *v, size_t n, const struct mr_cuda_adamw *o);
/* *sumsq_host = sum of g^2, two passes (fixed 512 partials, then one block
 * in double): deterministic. Synchronous. Twin: mr_grad_sumsq. */
int mr_cuda_grad_sumsq(struct mr_cuda *cu, const float *g, size_t n, double *sumsq_host);
/* g *= scale. */
int mr_cuda_scale(struct mr_cuda *cu, float *g, size_t n, float scale);

#ifdef __cplusplus
}
#endif

#endif
