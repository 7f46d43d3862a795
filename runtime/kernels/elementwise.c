/*
 * elementwise.c - GELU (tanh), residual add, in-place add.
 *
 * Split across the pool in contiguous ranges. Non-goals: fusion with the
 * GEMMs (OpenBLAS has no epilogues).
 */
#if defined(__GNUC__) && !defined(__clang__)
/* -O2 only vectorises loops without an epilogue; these need O3. The GELU
 * loops also need no-trapping-math to if-convert the clamps in
 * mr_fast_expf (it only lets the compiler ignore FP exception flags; the
 * values computed are the same). */
#pragma GCC optimize("O3", "no-trapping-math")
#endif
#include <math.h>

#include "cpu/mr_simd.h"
#include "mr_fastmath.h"
#include "mr_kernels.h"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through one exp: 1 - 2/(e^{2u} + 1), with the vectorisable
 * mr_fast_expf. Much cheaper than tanhf (a call through expm1f); the
 * absolute error stays ~1e-7, which is what GELU needs (its output is
 * 0.5x(1 + tanh)); saturates cleanly to +-1. */
static inline float fast_tanh(float u)
{
	return 1.0f - 2.0f / (mr_fast_expf(2.0f * u) + 1.0f);
}

struct ew {
	float *out;
	const float *a, *b;
};

MR_HOT static void gelu_fwd_range(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ew *e = ctxp;
	size_t i;

	(void)tid;
	for (i = i0; i < i1; i++) {
		float x = e->a[i];
		float u = GELU_K * (x + 0.044715f * x * x * x);
		e->out[i] = 0.5f * x * (1.0f + fast_tanh(u));
	}
}

void mr_gelu_fwd(struct mr_pool *p, float *out, const float *inp, size_t n)
{
	struct ew e = { out, inp, NULL };

	mr_pool_run(p, n, 4096, gelu_fwd_range, &e);
}

MR_HOT static void gelu_bwd_range(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ew *e = ctxp;
	size_t i;

	(void)tid;
	for (i = i0; i < i1; i++) {
		float x = e->a[i];
		float u = GELU_K * (x + 0.044715f * x * x * x);
		float th = fast_tanh(u);
		float sech2 = 1.0f - th * th;
		float g = 0.5f * (1.0f + th) +
			  0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
		e->out[i] = g * e->b[i];
	}
}

void mr_gelu_bwd(struct mr_pool *p, float *dinp, const float *inp, const float *dout,
		 size_t n)
{
	struct ew e = { dinp, inp, dout };

	mr_pool_run(p, n, 4096, gelu_bwd_range, &e);
}

static void add_range(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ew *e = ctxp;
	size_t i;

	(void)tid;
	for (i = i0; i < i1; i++)
		e->out[i] = e->a[i] + e->b[i];
}

void mr_residual_fwd(struct mr_pool *p, float *out, const float *a, const float *b,
		     size_t n)
{
	struct ew e = { out, a, b };

	mr_pool_run(p, n, 8192, add_range, &e);
}

void mr_add_inplace(struct mr_pool *p, float *y, const float *x, size_t n)
{
	struct ew e = { y, y, x };

	mr_pool_run(p, n, 8192, add_range, &e);
}
