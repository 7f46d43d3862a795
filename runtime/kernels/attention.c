/*
 * attention.c - block-wise causal attention with online softmax (see
 * mr_attention.h).
 *
 * Forward, per query block: running max m, running sum l and an unnormalised
 * accumulator per row; each key block rescales them by exp(m_old - m_new).
 * Backward (FlashAttention-2): for each key block and each query block,
 * P = exp(S - lse), dV += P^T dO, dP = dO V^T, dS = P * (dP - delta),
 * dQ += scale dS K, dK += scale dS^T Q. Blocks entirely in the causal
 * future are skipped; the diagonal blocks are computed whole and masked.
 *
 * Every tile product (S = Q K^T, P V, dO V^T, P^T dO, dS^T Q, dS K) is one
 * cblas_sgemm on the strided rows in place (64x128 tiles in the layer
 * forward, 128x64 in its backward); the softmax rows
 * between them are own code. The layer entry points run heads on the pool,
 * so these sgemm calls must be single-threaded (the worker sets OpenBLAS to
 * one thread; see kernels/matmul.c).
 *
 * Non-goals: SIMD intrinsics.
 */
#if defined(__GNUC__) && !defined(__clang__)
/* The softmax row loops are plain; O3 (+ no-trapping-math to if-convert
 * the masks and clamps) lets GCC vectorise them. */
#pragma GCC optimize("O3", "no-trapping-math")
#endif
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/mr_simd.h"
#include "mr_fastmath.h"
#include "mr_attention.h"
#include "mr_err.h"

/* The layer's and the slices' block sizes: mr_attention.h. */
#define ATTN_FWD_BQ MR_ATTN_FWD_BQ
#define ATTN_FWD_BK MR_ATTN_FWD_BK
#define ATTN_BWD_BQ MR_ATTN_BWD_BQ
#define ATTN_BWD_BK MR_ATTN_BWD_BK

size_t mr_attn_head_ws_floats(int bq, int bk, int hs)
{
	/* acc (bq*hs) + m, l (bq) + S/P and dP/dS (bq*bk each) */
	return (size_t)bq * (size_t)hs + 2 * (size_t)bq + 2 * (size_t)bq * (size_t)bk;
}

/* Reductions with 8 partial results, combined pairwise: a sequential float
 * sum is one dependent add per element (latency-bound); these vectorise. */
#define NPART 8

static inline float dot(const float *a, const float *b, int n)
{
	float p[NPART] = { 0.0f };
	int i, r;

	for (i = 0; i + NPART <= n; i += NPART)
		for (r = 0; r < NPART; r++)
			p[r] += a[i + r] * b[i + r];
	for (; i < n; i++)
		p[0] += a[i] * b[i];
	return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

static inline float sum_row(const float *a, int n)
{
	float p[NPART] = { 0.0f };
	int i, r;

	for (i = 0; i + NPART <= n; i += NPART)
		for (r = 0; r < NPART; r++)
			p[r] += a[i + r];
	for (; i < n; i++)
		p[0] += a[i];
	return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* max of a[0..n), -inf when n <= 0 (order-independent, so exact). */
static inline float max_row(const float *a, int n)
{
	float p[NPART];
	int i, r;

	for (r = 0; r < NPART; r++)
		p[r] = -INFINITY;
	for (i = 0; i + NPART <= n; i += NPART)
		for (r = 0; r < NPART; r++)
			p[r] = a[i + r] > p[r] ? a[i + r] : p[r];
	for (; i < n; i++)
		p[0] = a[i] > p[0] ? a[i] : p[0];
	for (r = 1; r < NPART; r++)
		p[0] = p[r] > p[0] ? p[r] : p[0];
	return p[0];
}

/* Last key index (exclusive) of [k0, k1) visible to query position qpos. */
static int visible_end(const struct mr_attn_head *h, int qpos, int k0, int k1)
{
	int lim;

	if (!h->causal)
		return k1;
	lim = qpos - h->k_pos0 + 1;
	if (lim < k0)
		return k0;
	return lim < k1 ? lim : k1;
}

MR_HOT void mr_attn_head_fwd(const struct mr_attn_head *h, float *out, size_t out_stride,
			     float *lse, float *ws)
{
	int hs = h->hs, q0, k0, i, j;
	float *acc = ws, *m = acc + (size_t)h->bq * hs, *l = m + h->bq, *s = l + h->bq;

	for (q0 = 0; q0 < h->tq; q0 += h->bq) {
		int q1 = q0 + h->bq < h->tq ? q0 + h->bq : h->tq;
		int nq = q1 - q0;
		int kmax = visible_end(h, h->q_pos0 + q1 - 1, 0, h->tk);
		const float *q = h->q + (size_t)q0 * h->q_stride;

		memset(acc, 0, sizeof(float) * (size_t)nq * hs);
		for (i = 0; i < nq; i++) {
			m[i] = -INFINITY;
			l[i] = 0.0f;
		}
		for (k0 = 0; k0 < kmax; k0 += h->bk) {
			int k1 = k0 + h->bk < kmax ? k0 + h->bk : kmax, nk = k1 - k0;

			/* S (nq,nk) = scale * Q K^T */
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, h->scale, q,
				    (int)h->q_stride, h->k + (size_t)k0 * h->kv_stride,
				    (int)h->kv_stride, 0.0f, s, nk);
			/* online softmax: P = exp(S - m_new), rescale the old rows */
			for (i = 0; i < nq; i++) {
				int ke = visible_end(h, h->q_pos0 + q0 + i, k0, k1) - k0;
				float *si = s + (size_t)i * nk, mx = m[i], bmx, corr, sum;
				float *ai = acc + (size_t)i * hs;

				bmx = max_row(si, ke);
				mx = bmx > mx ? bmx : mx;
				for (j = 0; j < nk; j++)
					si[j] = j < ke ? mr_fast_expf(si[j] - mx) : 0.0f;
				if (ke <= 0)
					continue;
				sum = sum_row(si, ke);
				corr = expf(m[i] - mx); /* 0 when m[i] == -inf */
				if (corr != 1.0f)
					for (j = 0; j < hs; j++)
						ai[j] *= corr;
				l[i] = l[i] * corr + sum;
				m[i] = mx;
			}
			/* acc (nq,hs) += P V */
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, s, nk,
				    h->v + (size_t)k0 * h->kv_stride, (int)h->kv_stride, 1.0f, acc,
				    hs);
		}
		for (i = 0; i < nq; i++) {
			float *o = out + (size_t)(q0 + i) * out_stride;
			if (l[i] > 0.0f) {
				float inv = 1.0f / l[i];
				for (j = 0; j < hs; j++)
					o[j] = acc[(size_t)i * hs + j] * inv;
				lse[q0 + i] = m[i] + logf(l[i]);
			} else {
				memset(o, 0, sizeof(float) * (size_t)hs);
				lse[q0 + i] = -INFINITY;
			}
		}
	}
}

void mr_attn_merge(float *out_a, size_t sa, float *lse_a, const float *out_b, size_t sb,
		   const float *lse_b, int tq, int hs)
{
	int i, j;

	for (i = 0; i < tq; i++) {
		float la = lse_a[i], lb = lse_b[i], mx = la > lb ? la : lb, wa, wb, inv;
		float *oa = out_a + (size_t)i * sa;
		const float *ob = out_b + (size_t)i * sb;

		if (mx == -INFINITY)
			continue; /* both empty: a already holds 0, -inf */
		wa = expf(la - mx);
		wb = expf(lb - mx);
		inv = 1.0f / (wa + wb);
		for (j = 0; j < hs; j++)
			oa[j] = (wa * oa[j] + wb * ob[j]) * inv;
		lse_a[i] = mx + logf(wa + wb);
	}
}

MR_HOT void mr_attn_head_bwd(const struct mr_attn_head *h, const float *dout,
			     size_t dout_stride, const float *lse, const float *delta, float *dq,
			     size_t dq_stride, float *dk, float *dv, size_t dkv_stride, float *ws)
{
	int hs = h->hs, q0, k0, i, j;
	float *p = ws + (size_t)h->bq * hs + 2 * (size_t)h->bq;
	float *ds = p + (size_t)h->bq * h->bk;

	for (k0 = 0; k0 < h->tk; k0 += h->bk) {
		int k1 = k0 + h->bk < h->tk ? k0 + h->bk : h->tk, nk = k1 - k0;
		const float *k = h->k + (size_t)k0 * h->kv_stride;
		const float *v = h->v + (size_t)k0 * h->kv_stride;

		/* causal: rows before q_first see none of these keys */
		int q_first = h->causal ? h->k_pos0 + k0 - h->q_pos0 : 0;

		for (q0 = q_first > 0 ? q_first : 0; q0 < h->tq; q0 += h->bq) {
			int q1 = q0 + h->bq < h->tq ? q0 + h->bq : h->tq, nq = q1 - q0;
			const float *q = h->q + (size_t)q0 * h->q_stride;
			const float *d_o = dout + (size_t)q0 * dout_stride;

			if (visible_end(h, h->q_pos0 + q1 - 1, k0, k1) <= k0)
				continue; /* whole block in the causal future */
			/* S = scale Q K^T -> P = exp(S - lse) (0 where masked) */
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, h->scale, q,
				    (int)h->q_stride, k, (int)h->kv_stride, 0.0f, p, nk);
			/* dP = dO V^T */
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, hs, 1.0f, d_o,
				    (int)dout_stride, v, (int)h->kv_stride, 0.0f, ds, nk);
			for (i = 0; i < nq; i++) {
				int ke = visible_end(h, h->q_pos0 + q0 + i, k0, k1) - k0;
				float *pi = p + (size_t)i * nk, *dsi = ds + (size_t)i * nk;
				float li = lse[q0 + i], di = delta[q0 + i];

				if (li == -INFINITY)
					ke = 0;
				for (j = 0; j < nk; j++) {
					pi[j] = j < ke ? mr_fast_expf(pi[j] - li) : 0.0f;
					/* dS = P (dP - delta) scale */
					dsi[j] = pi[j] * (dsi[j] - di) * h->scale;
				}
			}
			/* dV += P^T dO, dK += dS^T Q, dQ += dS K */
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, p, nk,
				    d_o, (int)dout_stride, 1.0f, dv + (size_t)k0 * dkv_stride,
				    (int)dkv_stride);
			cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, nq, 1.0f, ds, nk,
				    q, (int)h->q_stride, 1.0f, dk + (size_t)k0 * dkv_stride,
				    (int)dkv_stride);
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, hs, nk, 1.0f, ds, nk,
				    k, (int)h->kv_stride, 1.0f, dq + (size_t)q0 * dq_stride,
				    (int)dq_stride);
		}
	}
}

/* ---- whole layer ------------------------------------------------------------ */

struct layer_args {
	float *out, *dqkv, *ws;
	const float *qkv, *dout, *cout, *lse;
	float *wlse;
	int B, T, C, NH, NKV;
	size_t ws_per_thread;
};

/* Floats of a qkv row: NH query heads, then NKV key and NKV value heads. */
static size_t qkv_row(const struct layer_args *a)
{
	return (size_t)a->C + 2 * (size_t)a->NKV * (size_t)(a->C / a->NH);
}

/* Per-thread floats: the larger of the forward and backward head
 * workspaces, then delta (T). */
static size_t layer_head_ws(int hs)
{
	size_t f = mr_attn_head_ws_floats(ATTN_FWD_BQ, ATTN_FWD_BK, hs);
	size_t b = mr_attn_head_ws_floats(ATTN_BWD_BQ, ATTN_BWD_BK, hs);

	return f > b ? f : b;
}

size_t mr_attn_layer_ws_floats(const struct mr_pool *p, int T, int hs)
{
	return (size_t)mr_pool_threads(p) * (layer_head_ws(hs) + (size_t)T);
}

/* Query head hh of batch b and the key/value head it reads (hh / group). */
static void head_of(const struct layer_args *a, size_t bh, int bq, int bk,
		    struct mr_attn_head *h)
{
	int b = (int)(bh / (size_t)a->NH), hh = (int)(bh % (size_t)a->NH);
	int hs = a->C / a->NH, kvh = hh / (a->NH / a->NKV);
	const float *row = a->qkv + (size_t)b * a->T * qkv_row(a);

	h->q = row + (size_t)hh * hs;
	h->k = row + a->C + (size_t)kvh * hs;
	h->v = row + a->C + (size_t)(a->NKV + kvh) * hs;
	h->q_stride = h->kv_stride = qkv_row(a);
	h->tq = h->tk = a->T;
	h->q_pos0 = h->k_pos0 = 0;
	h->hs = hs;
	h->causal = 1;
	h->scale = 1.0f / sqrtf((float)hs);
	h->bq = bq;
	h->bk = bk;
}

static void layer_fwd_heads(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct layer_args *a = ctxp;
	float *ws = a->ws + (size_t)tid * a->ws_per_thread;
	size_t bh;

	for (bh = i0; bh < i1; bh++) {
		struct mr_attn_head h;
		size_t b = bh / (size_t)a->NH, hh = bh % (size_t)a->NH;
		int hs = a->C / a->NH;

		head_of(a, bh, ATTN_FWD_BQ, ATTN_FWD_BK, &h);
		mr_attn_head_fwd(&h, a->out + b * a->T * a->C + hh * hs, (size_t)a->C,
				 a->wlse + bh * a->T, ws);
	}
}

void mr_attn_layer_fwd(struct mr_pool *p, float *out, float *lse, const float *qkv,
		       int B, int T, int C, int NH, int NKV, float *ws)
{
	struct layer_args a = { out, NULL, ws, qkv, NULL, NULL, NULL, lse, B, T, C, NH, NKV, 0 };

	a.ws_per_thread = layer_head_ws(C / NH) + (size_t)T;
	mr_pool_run(p, (size_t)B * NH, 1, layer_fwd_heads, &a);
}

/* One item per (batch, key/value head): its dk, dv take the sum over the
 * query heads that share it, added in head order by one thread. */
MR_HOT static void layer_bwd_heads(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct layer_args *a = ctxp;
	float *ws = a->ws + (size_t)tid * a->ws_per_thread;
	float *delta = ws + layer_head_ws(a->C / a->NH);
	int hs = a->C / a->NH, group = a->NH / a->NKV;
	size_t W = qkv_row(a);

	for (size_t bk = i0; bk < i1; bk++) {
		size_t b = bk / (size_t)a->NKV, kvh = bk % (size_t)a->NKV;
		float *drow = a->dqkv + b * a->T * W;
		float *dk = drow + a->C + kvh * hs, *dv = dk + (size_t)a->NKV * hs;

		for (int t = 0; t < a->T; t++) { /* bwd adds: from 0 */
			memset(dk + (size_t)t * W, 0, sizeof(float) * (size_t)hs);
			memset(dv + (size_t)t * W, 0, sizeof(float) * (size_t)hs);
		}
		for (int g = 0; g < group; g++) {
			size_t hh = kvh * group + g, bh = b * a->NH + hh;
			size_t off = b * a->T * a->C + hh * hs;
			float *dq = drow + hh * hs;
			struct mr_attn_head h;

			head_of(a, bh, ATTN_BWD_BQ, ATTN_BWD_BK, &h);
			for (int t = 0; t < a->T; t++) {
				const float *o = a->cout + off + (size_t)t * a->C;
				const float *d = a->dout + off + (size_t)t * a->C;

				delta[t] = dot(o, d, hs);
				memset(dq + (size_t)t * W, 0, sizeof(float) * (size_t)hs);
			}
			mr_attn_head_bwd(&h, a->dout + off, (size_t)a->C, a->lse + bh * a->T, delta,
					 dq, W, dk, dv, W, ws);
		}
	}
}

void mr_attn_layer_bwd(struct mr_pool *p, float *dqkv, const float *dout,
		       const float *qkv, const float *out, const float *lse, int B, int T,
		       int C, int NH, int NKV, float *ws)
{
	struct layer_args a = { NULL, dqkv, ws, qkv, dout, out, lse, NULL, B, T, C, NH, NKV, 0 };

	a.ws_per_thread = layer_head_ws(C / NH) + (size_t)T;
	/* every (b, kv head) zeroes its own dq|dk|dv columns first (in parallel) */
	mr_pool_run(p, (size_t)B * NKV, 1, layer_bwd_heads, &a);
}

/* ---- slices ------------------------------------------------------------------ */

struct slice_args {
	const struct mr_attn_slice *a;
	const float *dout, *lse, *delta, *out_b, *lse_b;
	float *out, *olse, *dq, *dk, *dv, *ws;
	size_t o_row, o_batch, dq_row, dq_batch, dkv_row, dkv_batch, ws_per_thread;
	int NH, tq, hs;
};

/* Key/value heads of a slice (NKV 0: one per query head). */
static int slice_nkv(const struct mr_attn_slice *a)
{
	return a->NKV > 0 ? a->NKV : a->NH;
}

static void slice_head(const struct mr_attn_slice *a, size_t bh, int bq, int bk,
		       struct mr_attn_head *h)
{
	size_t b = bh / (size_t)a->NH, hh = bh % (size_t)a->NH, c = hh * (size_t)a->hs;
	size_t ckv = hh / (size_t)(a->NH / slice_nkv(a)) * (size_t)a->hs;

	h->q = a->q + b * a->q_batch + c;
	h->k = a->k + b * a->kv_batch + ckv;
	h->v = a->v + b * a->kv_batch + ckv;
	h->q_stride = a->q_row;
	h->kv_stride = a->kv_row;
	h->tq = a->tq;
	h->q_pos0 = a->q_pos0;
	h->tk = a->tk;
	h->k_pos0 = a->k_pos0;
	h->hs = a->hs;
	h->causal = a->causal;
	h->scale = a->scale;
	h->bq = bq;
	h->bk = bk;
}

/* the (b, head) output offset in floats */
static size_t slice_out(const struct slice_args *s, size_t bh)
{
	return bh / (size_t)s->NH * s->o_batch + bh % (size_t)s->NH * (size_t)s->hs;
}

static void slice_fwd_heads(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct slice_args *s = ctxp;
	size_t bh;

	for (bh = i0; bh < i1; bh++) {
		struct mr_attn_head h;
		slice_head(s->a, bh, ATTN_FWD_BQ, ATTN_FWD_BK, &h);
		mr_attn_head_fwd(&h, s->out + slice_out(s, bh), s->o_row, s->olse + bh * s->tq,
				 s->ws + (size_t)tid * s->ws_per_thread);
	}
}

/* Runs fn over items of s's slice with per-thread workspace: n_heads
 * per batch row (query heads for the forward, key/value heads for the
 * backward, whose dk/dv a group of query heads shares). */
static int slice_run(struct mr_pool *p, struct slice_args *s, int n_heads,
		     void (*fn)(void *, size_t, size_t, int))
{
	s->NH = s->a->NH;
	s->tq = s->a->tq;
	s->hs = s->a->hs;
	s->ws_per_thread = layer_head_ws(s->hs);
	if (!(s->ws = malloc(sizeof(float) * s->ws_per_thread * (size_t)mr_pool_threads(p))))
		return MR_ENOMEM;
	/* items write disjoint columns of every output: no two threads share one */
	mr_pool_run(p, (size_t)s->a->B * (size_t)n_heads, 1, fn, s);
	free(s->ws);
	return 0;
}

int mr_attn_slice_fwd(struct mr_pool *p, const struct mr_attn_slice *a, float *out,
		      size_t o_row, size_t o_batch, float *lse)
{
	struct slice_args s = { 0 };

	s.a = a;
	s.out = out;
	s.olse = lse;
	s.o_row = o_row;
	s.o_batch = o_batch;
	return slice_run(p, &s, a->NH, slice_fwd_heads);
}

static void slice_merge_heads(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct slice_args *s = ctxp;
	size_t bh;

	(void)tid;
	for (bh = i0; bh < i1; bh++)
		mr_attn_merge(s->out + slice_out(s, bh), s->o_row, s->olse + bh * s->tq,
			      s->out_b + slice_out(s, bh), s->o_row, s->lse_b + bh * s->tq, s->tq,
			      s->hs);
}

void mr_attn_slice_merge(struct mr_pool *p, float *out_a, float *lse_a, const float *out_b,
			 const float *lse_b, int B, int NH, int tq, int hs, size_t o_row,
			 size_t o_batch)
{
	struct slice_args s = { 0 };

	s.out = out_a;
	s.olse = lse_a;
	s.out_b = out_b;
	s.lse_b = lse_b;
	s.o_row = o_row;
	s.o_batch = o_batch;
	s.NH = NH;
	s.tq = tq;
	s.hs = hs;
	mr_pool_run(p, (size_t)B * NH, 1, slice_merge_heads, &s);
}

void mr_attn_slice_delta(struct mr_pool *p, float *delta, const float *dout, const float *out,
			 int B, int NH, int tq, int hs, size_t o_row, size_t o_batch)
{
	size_t bh;
	int t;

	(void)p;
	for (bh = 0; bh < (size_t)B * NH; bh++) {
		size_t off = bh / (size_t)NH * o_batch + bh % (size_t)NH * (size_t)hs;
		for (t = 0; t < tq; t++) {
			const float *o = out + off + (size_t)t * o_row, *g = dout + off + (size_t)t * o_row;
			float s = 0.0f;
			int c;
			/* in channel order, as the CUDA kernel's twin */
			for (c = 0; c < hs; c++)
				s += g[c] * o[c];
			delta[bh * tq + t] = s;
		}
	}
}

/* One item per (batch, key/value head); its query heads in order. */
static void slice_bwd_heads(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct slice_args *s = ctxp;
	const struct mr_attn_slice *a = s->a;
	size_t nkv = (size_t)slice_nkv(a), group = (size_t)a->NH / nkv;

	for (size_t bk = i0; bk < i1; bk++) {
		size_t b = bk / nkv, ckv = bk % nkv * (size_t)a->hs;

		for (size_t g = 0; g < group; g++) {
			size_t bh = b * (size_t)a->NH + bk % nkv * group + g;
			size_t c = bh % (size_t)a->NH * (size_t)a->hs;
			struct mr_attn_head h;

			slice_head(a, bh, ATTN_BWD_BQ, ATTN_BWD_BK, &h);
			mr_attn_head_bwd(&h, s->dout + slice_out(s, bh), s->o_row,
					 s->lse + bh * s->tq, s->delta + bh * s->tq,
					 s->dq + b * s->dq_batch + c, s->dq_row,
					 s->dk + b * s->dkv_batch + ckv, s->dv + b * s->dkv_batch + ckv,
					 s->dkv_row, s->ws + (size_t)tid * s->ws_per_thread);
		}
	}
}

int mr_attn_slice_bwd(struct mr_pool *p, const struct mr_attn_slice *a, const float *dout,
		      size_t o_row, size_t o_batch, const float *lse, const float *delta,
		      float *dq, size_t dq_row, size_t dq_batch, float *dk, float *dv,
		      size_t dkv_row, size_t dkv_batch)
{
	struct slice_args s = { 0 };

	s.a = a;
	s.dout = dout;
	s.lse = lse;
	s.delta = delta;
	s.dq = dq;
	s.dk = dk;
	s.dv = dv;
	s.o_row = o_row;
	s.o_batch = o_batch;
	s.dq_row = dq_row;
	s.dq_batch = dq_batch;
	s.dkv_row = dkv_row;
	s.dkv_batch = dkv_batch;
	return slice_run(p, &s, slice_nkv(a), slice_bwd_heads);
}
