/*
 * mr_kernels.h - the CPU kernels of the GPT runtime (fp32).
 *
 * Shapes use llm.c's notation: B batch, T time, C channels, OC/IC output
 * and input channels, V vocabulary, N = B*T rows. Every tensor is row-major
 * and contiguous unless a stride is given. Backward kernels ACCUMULATE into
 * parameter gradients (+=) so micro-batches add up; for activation
 * gradients each function says whether it writes (=) or adds (+=).
 *
 * Every matmul goes through OpenBLAS (mr_matmul_*); everything else is own
 * C code run on a struct mr_pool (may be NULL = calling thread only).
 * `ws` arguments are caller-owned workspace of the size the matching
 * *_ws_floats() function returns.
 *
 * Non-goals: fp16/bf16 (the CUDA backend), shapes that are not row-major.
 */
#ifndef MR_KERNELS_H
#define MR_KERNELS_H

#include <stddef.h>

#include "cpu/mr_pool.h"

#define MR_LN_EPS 1e-5f

/* ---- matmul (OpenBLAS; split across the pool, see matmul.c) --------------- */
/* out (N,OC) = inp (N,IC) @ w^T (w is (OC,IC)) + bias (OC, may be NULL). */
void mr_matmul_fwd(struct mr_pool *p, float *out, const float *inp, const float *w, const float *bias,
		   int N, int IC, int OC);
/* dinp (N,IC) = or += dout @ w; dw (OC,IC) += dout^T @ inp; dbias += colsum(dout).
 * dinp may be NULL (not needed); accumulate_dinp selects += over =.
 * ones is a workspace of N floats equal to 1 (for the bias gemv). */
void mr_matmul_bwd(struct mr_pool *p, float *dinp, float *dw, float *dbias, const float *dout,
		   const float *inp, const float *w, int N, int IC, int OC,
		   int accumulate_dinp, const float *ones);

/* ---- embedding -------------------------------------------------------------- */
/* out (B,T,C) = wte[tok] + wpe[t]; tok < 0 gives a zero wte part, wpe NULL
 * no position part (tensor parallel, see encoder.c). */
void mr_encoder_fwd(struct mr_pool *p, float *out, const int *tok, const float *wte,
		    const float *wpe, int B, int T, int C);
/* dwte (V,C) += ..., dwpe (T,C) += ... from dout (B,T,C); tok < 0 rows
 * skip dwte; dwte or dwpe may be NULL. */
void mr_encoder_bwd(struct mr_pool *p, float *dwte, float *dwpe, const float *dout,
		    const int *tok, int B, int T, int C);

/* ---- layernorm -------------------------------------------------------------- */
/* out (N,C); mean, rstd (N) saved for backward. */
void mr_layernorm_fwd(struct mr_pool *p, float *out, float *mean, float *rstd,
		      const float *inp, const float *w, const float *b, int N, int C);
/* dinp (N,C) += ...; dw, db (C) += .... ws: mr_layernorm_ws_floats(). */
void mr_layernorm_bwd(struct mr_pool *p, float *dinp, float *dw, float *db,
		      const float *dout, const float *inp, const float *w,
		      const float *mean, const float *rstd, int N, int C, float *ws);
size_t mr_layernorm_ws_floats(const struct mr_pool *p, int C);

/* ---- the Llama family: RMSNorm, rotary positions, SwiGLU ------------------- */
/* out (N,C) = inp / sqrt(mean(inp^2) + eps) * w; rstd (N) saved for backward. */
void mr_rmsnorm_fwd(struct mr_pool *p, float *out, float *rstd, const float *inp, const float *w,
		    int N, int C, float eps);
/* dinp (N,C) += ...; dw (C) += .... ws: mr_rmsnorm_ws_floats(). */
void mr_rmsnorm_bwd(struct mr_pool *p, float *dinp, float *dw, const float *dout,
		    const float *inp, const float *w, const float *rstd, int N, int C, float *ws);
size_t mr_rmsnorm_ws_floats(const struct mr_pool *p, int C);

#define MR_ROPE_MAX_D 512 /* head sizes up to this (even) */
/* Llama 3.1's frequency scaling ("rope_scaling"); factor 0: none. */
struct mr_rope_scaling {
	float factor, low_freq_factor, high_freq_factor;
	int original_max_pos;
};
/* inv_freq (D/2) = theta^(-2i/D), scaled by sc (may be NULL). */
void mr_rope_freqs(float *inv_freq, int D, float theta, const struct mr_rope_scaling *sc);
/* Rotates, in place, nheads heads of size D at the start of each of N rows
 * stride floats apart, row n at position pos[n] (rope.c: the rotate-half
 * layout). */
void mr_rope_fwd(struct mr_pool *p, float *x, size_t stride, int N, int nheads, int D,
		 const int *pos, const float *inv_freq);
/* The gradient through mr_rope_fwd, in place on dx (same layout). */
void mr_rope_bwd(struct mr_pool *p, float *dx, size_t stride, int N, int nheads, int D,
		 const int *pos, const float *inv_freq);

/* out (N,F) = silu(a) * b where ab (N,2F) holds [a | b] per row. */
void mr_swiglu_fwd(struct mr_pool *p, float *out, const float *ab, int N, int F);
/* dab (N,2F) = [da | db] from dout (N,F) (writes; may alias ab). */
void mr_swiglu_bwd(struct mr_pool *p, float *dab, const float *ab, const float *dout, int N,
		   int F);

/* ---- elementwise ------------------------------------------------------------ */
/* GELU, tanh approximation (GPT-2): out = 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))). */
void mr_gelu_fwd(struct mr_pool *p, float *out, const float *inp, size_t n);
/* dinp = dout * gelu'(inp) (writes, may alias dout). */
void mr_gelu_bwd(struct mr_pool *p, float *dinp, const float *inp, const float *dout,
		 size_t n);
/* out = a + b (out may alias a or b). */
void mr_residual_fwd(struct mr_pool *p, float *out, const float *a, const float *b,
		     size_t n);
/* y += x. */
void mr_add_inplace(struct mr_pool *p, float *y, const float *x, size_t n);

/* ---- softmax + cross-entropy (fused) ---------------------------------------- */
/* logits (N,V): losses[i] = logsumexp(row) - row[target]; lse[i] saved.
 * Targets must be in [0, V). */
void mr_crossentropy_fwd(struct mr_pool *p, float *losses, float *lse,
			 const float *logits, const int *targets, int N, int V);
/* In place: logits becomes dlogits = (softmax(row) - onehot) * dscale;
 * a negative target subtracts no one-hot (vocab-parallel rows). */
void mr_crossentropy_bwd_inplace(struct mr_pool *p, float *logits, const float *lse,
				 const int *targets, int N, int V, float dscale);
/* Vocab-parallel pieces over a (N,V) slice: mx (N) = row max; then
 * sum (N) = sum exp(row - mx) and tlogit (N) = row[target] (0 when the
 * target is negative, i.e. on another rank). */
void mr_crossentropy_rowmax(struct mr_pool *p, float *mx, const float *logits, int N, int V);
void mr_crossentropy_sumexp(struct mr_pool *p, float *sum, float *tlogit, const float *logits,
			    const float *mx, const int *targets, int N, int V);

#endif
