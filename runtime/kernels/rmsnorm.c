/*
 * rmsnorm.c - RMSNorm forward/backward over the last dimension (the Llama
 * family's norm; Zhang & Sennrich 2019): y = x / sqrt(mean(x^2) + eps) * w,
 * no mean subtracted and no bias.
 *
 * Rows are split across the pool. Backward reduces dw through per-thread
 * partial sums in ws (threads x C floats) added in thread order, so the
 * result depends only on the thread count (as layernorm.c).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <math.h>
#include <string.h>

#include "cpu/mr_simd.h"
#include "mr_kernels.h"

struct rms_fwd {
	float *out, *rstd;
	const float *inp, *w;
	int C;
	float eps;
};

MR_HOT static void rms_fwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct rms_fwd *a = ctxp;
	int C = a->C, c;

	(void)tid;
	for (size_t i = i0; i < i1; i++) {
		const float *x = a->inp + i * (size_t)C;
		float *o = a->out + i * (size_t)C, ss = 0.0f, s;

		for (c = 0; c < C; c++)
			ss += x[c] * x[c];
		s = 1.0f / sqrtf(ss / (float)C + a->eps);
		for (c = 0; c < C; c++)
			o[c] = x[c] * s * a->w[c];
		a->rstd[i] = s;
	}
}

void mr_rmsnorm_fwd(struct mr_pool *p, float *out, float *rstd, const float *inp, const float *w,
		    int N, int C, float eps)
{
	struct rms_fwd a = { out, rstd, inp, w, C, eps };

	mr_pool_run(p, (size_t)N, 16, rms_fwd_rows, &a);
}

struct rms_bwd {
	float *dinp, *ws;
	const float *dout, *inp, *w, *rstd;
	int C;
};

/* With n = x s and g = w dy: dx = s (g - n mean(g n)), dw += dy n. */
MR_HOT static void rms_bwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct rms_bwd *a = ctxp;
	int C = a->C, c;
	float *dw = a->ws + (size_t)tid * (size_t)C;

	for (size_t i = i0; i < i1; i++) {
		size_t row = i * (size_t)C;
		const float *restrict x = a->inp + row, *restrict dy = a->dout + row;
		float *restrict dx = a->dinp + row;
		float s = a->rstd[i], gn = 0.0f, m;

		for (c = 0; c < C; c++)
			gn += a->w[c] * dy[c] * x[c] * s;
		m = gn / (float)C;
		for (c = 0; c < C; c++) {
			float n = x[c] * s;
			dw[c] += dy[c] * n;
			dx[c] += s * (a->w[c] * dy[c] - n * m);
		}
	}
}

size_t mr_rmsnorm_ws_floats(const struct mr_pool *p, int C)
{
	return (size_t)mr_pool_threads(p) * (size_t)C;
}

void mr_rmsnorm_bwd(struct mr_pool *p, float *dinp, float *dw, const float *dout,
		    const float *inp, const float *w, const float *rstd, int N, int C, float *ws)
{
	struct rms_bwd a = { dinp, ws, dout, inp, w, rstd, C };
	int nt = mr_pool_threads(p);

	/* threads that get no rows must still contribute zeros */
	memset(ws, 0, sizeof(float) * (size_t)C * (size_t)nt);
	mr_pool_run(p, (size_t)N, 16, rms_bwd_rows, &a);
	for (int t = 0; t < nt; t++)
		for (int c = 0; c < C; c++)
			dw[c] += ws[(size_t)t * (size_t)C + (size_t)c];
}
