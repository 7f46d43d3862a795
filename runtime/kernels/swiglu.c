/*
 * swiglu.c - the SwiGLU gate of the Llama MLP (Shazeer 2020, "GLU Variants
 * Improve Transformer"): out = silu(a) * b, with a = x W_gate and
 * b = x W_up side by side in one (N, 2F) tensor [a | b], so both input
 * projections are one GEMM; silu(a) = a sigmoid(a).
 *
 * Split across the pool by rows.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3", "no-trapping-math")
#endif
#include <math.h>

#include "cpu/mr_simd.h"
#include "mr_kernels.h"

struct sw {
	float *out;
	const float *ab, *dout;
	int F;
};

static inline float sigmoid(float a)
{
	return 1.0f / (1.0f + expf(-a));
}

MR_HOT static void swiglu_fwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct sw *e = ctxp;
	size_t F = (size_t)e->F;

	(void)tid;
	for (size_t i = i0; i < i1; i++) {
		const float *a = e->ab + i * 2 * F, *b = a + F;
		float *o = e->out + i * F;

		for (size_t c = 0; c < F; c++)
			o[c] = a[c] * sigmoid(a[c]) * b[c];
	}
}

void mr_swiglu_fwd(struct mr_pool *p, float *out, const float *ab, int N, int F)
{
	struct sw e = { out, ab, NULL, F };

	mr_pool_run(p, (size_t)N, 16, swiglu_fwd_rows, &e);
}

/* d silu(a) / da = sigmoid(a) (1 + a (1 - sigmoid(a))). */
MR_HOT static void swiglu_bwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct sw *e = ctxp;
	size_t F = (size_t)e->F;

	(void)tid;
	for (size_t i = i0; i < i1; i++) {
		const float *a = e->ab + i * 2 * F, *b = a + F, *dy = e->dout + i * F;
		float *da = e->out + i * 2 * F, *db = da + F;

		for (size_t c = 0; c < F; c++) {
			float s = sigmoid(a[c]), g = dy[c];

			da[c] = g * b[c] * s * (1.0f + a[c] * (1.0f - s));
			db[c] = g * a[c] * s;
		}
	}
}

void mr_swiglu_bwd(struct mr_pool *p, float *dab, const float *ab, const float *dout, int N, int F)
{
	struct sw e = { dab, ab, dout, F };

	mr_pool_run(p, (size_t)N, 16, swiglu_bwd_rows, &e);
}
