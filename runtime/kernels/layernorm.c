/*
 * layernorm.c - LayerNorm forward/backward over the last dimension.
 *
 * Rows are split across the pool. Backward reduces dw/db through per-thread
 * partial sums in ws (threads x 2C floats) added in thread order, so the
 * result depends only on the thread count. Non-goals: RMSNorm.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* -O2 only vectorises loops without an epilogue; these need O3. */
#pragma GCC optimize("O3")
#endif
#include <math.h>
#include <string.h>

#include "cpu/mr_simd.h"
#include "mr_kernels.h"

struct ln_fwd {
	float *out, *mean, *rstd;
	const float *inp, *w, *b;
	int C;
};

MR_HOT static void ln_fwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ln_fwd *a = ctxp;
	int C = a->C, c;
	size_t i;

	(void)tid;
	for (i = i0; i < i1; i++) {
		const float *x = a->inp + i * (size_t)C;
		float *o = a->out + i * (size_t)C;
		float m = 0.0f, v = 0.0f, s;

		for (c = 0; c < C; c++)
			m += x[c];
		m /= (float)C;
		for (c = 0; c < C; c++) {
			float d = x[c] - m;
			v += d * d;
		}
		v /= (float)C;
		s = 1.0f / sqrtf(v + MR_LN_EPS);
		for (c = 0; c < C; c++)
			o[c] = (x[c] - m) * s * a->w[c] + a->b[c];
		a->mean[i] = m;
		a->rstd[i] = s;
	}
}

void mr_layernorm_fwd(struct mr_pool *p, float *out, float *mean, float *rstd,
		      const float *inp, const float *w, const float *b, int N, int C)
{
	struct ln_fwd a = { out, mean, rstd, inp, w, b, C };

	mr_pool_run(p, (size_t)N, 16, ln_fwd_rows, &a);
}

struct ln_bwd {
	float *dinp, *ws;
	const float *dout, *inp, *w, *mean, *rstd;
	int C;
};

MR_HOT static void ln_bwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ln_bwd *a = ctxp;
	int C = a->C, c;
	float *dw = a->ws + (size_t)tid * 2 * (size_t)C, *db = dw + C;
	size_t i;

	memset(dw, 0, sizeof(float) * 2 * (size_t)C);
	for (i = i0; i < i1; i++) {
		const float *x = a->inp + i * (size_t)C, *dy = a->dout + i * (size_t)C;
		float *dx = a->dinp + i * (size_t)C;
		float m = a->mean[i], s = a->rstd[i], dnm = 0.0f, dnn = 0.0f;

		for (c = 0; c < C; c++) {
			float n = (x[c] - m) * s, dn = a->w[c] * dy[c];
			dnm += dn;
			dnn += dn * n;
		}
		dnm /= (float)C;
		dnn /= (float)C;
		for (c = 0; c < C; c++) {
			float n = (x[c] - m) * s, dn = a->w[c] * dy[c];
			db[c] += dy[c];
			dw[c] += n * dy[c];
			dx[c] += s * (dn - dnm - n * dnn);
		}
	}
}

size_t mr_layernorm_ws_floats(const struct mr_pool *p, int C)
{
	return (size_t)mr_pool_threads(p) * 2 * (size_t)C;
}

void mr_layernorm_bwd(struct mr_pool *p, float *dinp, float *dw, float *db,
		      const float *dout, const float *inp, const float *w,
		      const float *mean, const float *rstd, int N, int C, float *ws)
{
	struct ln_bwd a = { dinp, ws, dout, inp, w, mean, rstd, C };
	int nt = mr_pool_threads(p), t, c;

	/* Threads that get no rows must still contribute zeros. */
	memset(ws, 0, sizeof(float) * 2 * (size_t)C * (size_t)nt);
	mr_pool_run(p, (size_t)N, 16, ln_bwd_rows, &a);
	for (t = 0; t < nt; t++) {
		const float *pw = ws + (size_t)t * 2 * (size_t)C, *pb = pw + C;
		for (c = 0; c < C; c++) {
			dw[c] += pw[c];
			db[c] += pb[c];
		}
	}
}
