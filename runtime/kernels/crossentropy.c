/*
 * crossentropy.c - softmax fused with cross-entropy.
 *
 * The forward keeps only the per-row logsumexp; the backward turns the
 * logits buffer into dlogits in place, so full probabilities are never
 * stored. Sums are in double for a stable loss; exponentials use the
 * vectorisable mr_fast_expf (~2 ulp). The vocab-parallel pieces (row max,
 * then sum of exponentials and target logit over this rank's vocabulary
 * slice) let tensor parallelism combine rows across ranks without ever
 * gathering full logits. Non-goals: label smoothing, ignore_index.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* -O2 only vectorises loops without an epilogue; these need O3 (and
 * no-trapping-math to if-convert the clamps of mr_fast_expf). */
#pragma GCC optimize("O3", "no-trapping-math")
#endif
#include <math.h>

#include "cpu/mr_simd.h"
#include "mr_fastmath.h"
#include "mr_kernels.h"

struct ce {
	float *losses, *lse, *logits;
	const float *clogits;
	const int *targets;
	int V;
	float dscale;
};

/* Exponentials go through a small buffer so they vectorise; the double sum
 * over them stays one sequential chain in vocabulary order (the same
 * result as summing as they are computed). The row max is order-free. */
#define CE_CHUNK 256

/* max of row (V >= 1), with 8 partial maxima (exact: max is order-free). */
static inline float row_max(const float *row, int V)
{
	float pm[8], mx;
	int v, r;

	for (r = 0; r < 8; r++)
		pm[r] = row[0];
	for (v = 1; v + 8 <= V; v += 8)
		for (r = 0; r < 8; r++)
			pm[r] = row[v + r] > pm[r] ? row[v + r] : pm[r];
	for (; v < V; v++)
		pm[0] = row[v] > pm[0] ? row[v] : pm[0];
	mx = pm[0];
	for (r = 1; r < 8; r++)
		mx = pm[r] > mx ? pm[r] : mx;
	return mx;
}

/* sum over row of exp(row[v] - mx), in double, in vocabulary order. */
static inline double row_sumexp(const float *row, int V, float mx)
{
	float e[CE_CHUNK];
	double s = 0.0;
	int v, v0, n;

	for (v0 = 0; v0 < V; v0 += CE_CHUNK) {
		n = V - v0 < CE_CHUNK ? V - v0 : CE_CHUNK;
		for (v = 0; v < n; v++)
			e[v] = mr_fast_expf(row[v0 + v] - mx);
		for (v = 0; v < n; v++)
			s += (double)e[v];
	}
	return s;
}

MR_HOT static void ce_fwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ce *a = ctxp;
	size_t i;

	(void)tid;
	for (i = i0; i < i1; i++) {
		const float *row = a->clogits + i * (size_t)a->V;
		float mx = row_max(row, a->V);
		double s = row_sumexp(row, a->V, mx);
		float l = mx + (float)log(s > 0.0 ? s : 1.0); /* s >= 1: the max adds 1 */

		a->lse[i] = l;
		a->losses[i] = l - row[a->targets[i]];
	}
}

void mr_crossentropy_fwd(struct mr_pool *p, float *losses, float *lse,
			 const float *logits, const int *targets, int N, int V)
{
	struct ce a = { losses, lse, NULL, logits, targets, V, 0.0f };

	mr_pool_run(p, (size_t)N, 8, ce_fwd_rows, &a);
}

MR_HOT static void ce_bwd_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct ce *a = ctxp;
	size_t i;
	int v;

	(void)tid;
	for (i = i0; i < i1; i++) {
		float *row = a->logits + i * (size_t)a->V;
		float l = a->lse[i];
		for (v = 0; v < a->V; v++)
			row[v] = mr_fast_expf(row[v] - l) * a->dscale;
		if (a->targets[i] >= 0)
			row[a->targets[i]] -= a->dscale;
	}
}

void mr_crossentropy_bwd_inplace(struct mr_pool *p, float *logits, const float *lse,
				 const int *targets, int N, int V, float dscale)
{
	struct ce a = { NULL, (float *)lse, logits, NULL, targets, V, dscale };

	mr_pool_run(p, (size_t)N, 8, ce_bwd_rows, &a);
}

struct cevp {
	float *mx, *sum, *tlogit;
	const float *logits;
	const int *targets;
	int V;
};

MR_HOT static void ce_max_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct cevp *a = ctxp;
	size_t i;

	(void)tid;
	for (i = i0; i < i1; i++)
		a->mx[i] = row_max(a->logits + i * (size_t)a->V, a->V);
}

void mr_crossentropy_rowmax(struct mr_pool *p, float *mx, const float *logits, int N, int V)
{
	struct cevp a = { mx, NULL, NULL, logits, NULL, V };

	mr_pool_run(p, (size_t)N, 8, ce_max_rows, &a);
}

MR_HOT static void ce_sumexp_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct cevp *a = ctxp;
	size_t i;

	(void)tid;
	for (i = i0; i < i1; i++) {
		const float *row = a->logits + i * (size_t)a->V;
		a->sum[i] = (float)row_sumexp(row, a->V, a->mx[i]);
		a->tlogit[i] = a->targets[i] >= 0 ? row[a->targets[i]] : 0.0f;
	}
}

void mr_crossentropy_sumexp(struct mr_pool *p, float *sum, float *tlogit, const float *logits,
			    const float *mx, const int *targets, int N, int V)
{
	struct cevp a = { (float *)mx, sum, tlogit, logits, targets, V };

	mr_pool_run(p, (size_t)N, 8, ce_sumexp_rows, &a);
}
