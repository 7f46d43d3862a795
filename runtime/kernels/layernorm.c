/*
 * layernorm.c - LayerNorm forward/backward over the last dimension.
 *
 * Rows are split across the pool. Backward reduces dw/db through per-thread
 * partial sums in ws (threads x 2C floats) added in thread order, so the
 * result depends only on the thread count. RMSNorm is rmsnorm.c.
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

/* Rows are taken R at a time for the row sums: each row's sum is still
 * one sequential chain (the same float operations in the same order as a
 * row alone), but R independent chains run in parallel instead of one
 * latency-bound chain. */
#define R 4

MR_HOT static void ln_fwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ln_fwd *a = ctxp;
	int C = a->C, c, r, nr;
	size_t i;

	(void)tid;
	for (i = i0; i < i1; i += (size_t)nr) {
		const float *x = a->inp + i * (size_t)C;
		float m[R] = { 0.0f }, v[R] = { 0.0f };

		nr = i1 - i < R ? (int)(i1 - i) : R;
		if (nr == R) {
			for (c = 0; c < C; c++)
				for (r = 0; r < R; r++)
					m[r] += x[(size_t)r * C + c];
		} else {
			for (r = 0; r < nr; r++)
				for (c = 0; c < C; c++)
					m[r] += x[(size_t)r * C + c];
		}
		for (r = 0; r < R; r++)
			m[r] /= (float)C;
		if (nr == R) {
			for (c = 0; c < C; c++)
				for (r = 0; r < R; r++) {
					float d = x[(size_t)r * C + c] - m[r];
					v[r] += d * d;
				}
		} else {
			for (r = 0; r < nr; r++)
				for (c = 0; c < C; c++) {
					float d = x[(size_t)r * C + c] - m[r];
					v[r] += d * d;
				}
		}
		for (r = 0; r < nr; r++) {
			const float *xr = x + (size_t)r * C;
			float *o = a->out + (i + (size_t)r) * (size_t)C;
			float vr = v[r] / (float)C, sr = 1.0f / sqrtf(vr + MR_LN_EPS), mr = m[r];

			for (c = 0; c < C; c++)
				o[c] = (xr[c] - mr) * sr * a->w[c] + a->b[c];
			a->mean[i + (size_t)r] = mr;
			a->rstd[i + (size_t)r] = sr;
		}
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

/* One row's dx (+=) and its dw, db partials; restrict lets GCC vectorise
 * without run-time alias checks (six pointers are more than it versions). */
static inline void bwd_row(float *restrict dx, float *restrict dw, float *restrict db,
			   const float *restrict x, const float *restrict dy,
			   const float *restrict w, float m, float s, float dm, float dnc, int C)
{
	int c;

	for (c = 0; c < C; c++) {
		float n = (x[c] - m) * s, dn = w[c] * dy[c];
		db[c] += dy[c];
		dw[c] += n * dy[c];
		dx[c] += s * (dn - dm - n * dnc);
	}
}

MR_HOT static void ln_bwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ln_bwd *a = ctxp;
	int C = a->C, c, r, nr;
	float *dw = a->ws + (size_t)tid * 2 * (size_t)C, *db = dw + C;
	size_t i;

	memset(dw, 0, sizeof(float) * 2 * (size_t)C);
	for (i = i0; i < i1; i += (size_t)nr) {
		float dnm[R] = { 0.0f }, dnn[R] = { 0.0f };

		nr = i1 - i < R ? (int)(i1 - i) : R;
		if (nr == R) {
			for (c = 0; c < C; c++)
				for (r = 0; r < R; r++) {
					size_t k = (i + (size_t)r) * (size_t)C + (size_t)c;
					float n = (a->inp[k] - a->mean[i + r]) * a->rstd[i + r];
					float dn = a->w[c] * a->dout[k];
					dnm[r] += dn;
					dnn[r] += dn * n;
				}
		} else {
			for (r = 0; r < nr; r++)
				for (c = 0; c < C; c++) {
					size_t k = (i + (size_t)r) * (size_t)C + (size_t)c;
					float n = (a->inp[k] - a->mean[i + r]) * a->rstd[i + r];
					float dn = a->w[c] * a->dout[k];
					dnm[r] += dn;
					dnn[r] += dn * n;
				}
		}
		for (r = 0; r < nr; r++) {
			size_t row = (i + (size_t)r) * (size_t)C;

			bwd_row(a->dinp + row, dw, db, a->inp + row, a->dout + row, a->w,
				a->mean[i + r], a->rstd[i + r], dnm[r] / (float)C,
				dnn[r] / (float)C, C);
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
