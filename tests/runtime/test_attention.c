/*
 * test_attention.c - block-wise online-softmax attention against a naive
 * double-precision reference: forward (out, lse) and backward (dq, dk, dv)
 * for several sequence lengths and block sizes, the merge of two partial
 * results over disjoint key blocks (what context parallelism does), and
 * the whole-layer entry points on a pool.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/mr_attention.h"
#include "mr_rng.h"

#define HS 16

static float *randv(struct mr_rng *r, size_t n)
{
	float *p = malloc(n * sizeof(float));
	size_t i;

	cr_assert_not_null(p);
	for (i = 0; i < n; i++)
		p[i] = (float)mr_rng_normal(r);
	return p;
}

static float *zeros(size_t n)
{
	float *p = calloc(n, sizeof(float));

	cr_assert_not_null(p);
	return p;
}

/* Naive causal attention of tq queries (positions qp0..) over tk keys
 * (positions kp0..), rows of HS, contiguous. Fills out/lse and, when dout is
 * given, dq/dk/dv (=). */
static void naive(const float *q, const float *k, const float *v, int tq, int qp0, int tk,
		  int kp0, double *out, double *lse, const float *dout, double *dq,
		  double *dk, double *dv)
{
	double sc = 1.0 / sqrt((double)HS), *P = calloc((size_t)tq * tk, sizeof(double));
	int i, j, c;

	cr_assert_not_null(P);
	if (dq) {
		memset(dq, 0, sizeof(double) * tq * HS);
		memset(dk, 0, sizeof(double) * tk * HS);
		memset(dv, 0, sizeof(double) * tk * HS);
	}
	for (i = 0; i < tq; i++) {
		double mx = -INFINITY, s = 0.0;
		for (j = 0; j < tk; j++) {
			double d = 0.0;
			if (kp0 + j > qp0 + i) {
				P[i * tk + j] = -INFINITY;
				continue;
			}
			for (c = 0; c < HS; c++)
				d += (double)q[i * HS + c] * k[j * HS + c];
			P[i * tk + j] = d * sc;
			mx = fmax(mx, d * sc);
		}
		for (j = 0; j < tk; j++)
			s += mx == -INFINITY ? 0.0 : exp(P[i * tk + j] - mx);
		lse[i] = s > 0 ? mx + log(s) : -INFINITY;
		for (c = 0; c < HS; c++)
			out[i * HS + c] = 0.0;
		for (j = 0; j < tk; j++) {
			P[i * tk + j] = s > 0 ? exp(P[i * tk + j] - lse[i]) : 0.0;
			for (c = 0; c < HS; c++)
				out[i * HS + c] += P[i * tk + j] * v[j * HS + c];
		}
		if (dout) {
			double dp[512], dot = 0.0;
			cr_assert(tk <= 512);
			for (j = 0; j < tk; j++) {
				dp[j] = 0.0;
				for (c = 0; c < HS; c++)
					dp[j] += (double)dout[i * HS + c] * v[j * HS + c];
				dot += dp[j] * P[i * tk + j];
			}
			for (j = 0; j < tk; j++) {
				double ds = P[i * tk + j] * (dp[j] - dot) * sc;
				for (c = 0; c < HS; c++) {
					dv[j * HS + c] += P[i * tk + j] * dout[i * HS + c];
					dq[i * HS + c] += ds * k[j * HS + c];
					dk[j * HS + c] += ds * q[i * HS + c];
				}
			}
		}
	}
	free(P);
}

static struct mr_attn_head head(const float *q, const float *k, const float *v, int tq,
				int qp0, int tk, int kp0, int bq, int bk)
{
	struct mr_attn_head h;

	h.q = q;
	h.k = k;
	h.v = v;
	h.q_stride = h.kv_stride = HS;
	h.tq = tq;
	h.q_pos0 = qp0;
	h.tk = tk;
	h.k_pos0 = kp0;
	h.hs = HS;
	h.causal = 1;
	h.scale = 1.0f / sqrtf((float)HS);
	h.bq = bq;
	h.bk = bk;
	return h;
}

static double maxdiff(const float *a, const double *b, size_t n)
{
	double m = 0.0;
	size_t i;

	for (i = 0; i < n; i++)
		m = fmax(m, fabs((double)a[i] - b[i]));
	return m;
}

static const int Ts[] = { 1, 7, 32, 65, 130 };
static const int Bs[][2] = { { 1, 1 }, { 4, 8 }, { 16, 16 }, { 32, 64 }, { 128, 128 } };

Test(attention, blockwise_matches_naive_forward_and_backward)
{
	size_t ti, bi;
	struct mr_rng r;

	mr_rng_seed(&r, 7, 0);
	for (ti = 0; ti < sizeof(Ts) / sizeof(Ts[0]); ti++) {
		int T = Ts[ti];
		float *q = randv(&r, (size_t)T * HS), *k = randv(&r, (size_t)T * HS);
		float *v = randv(&r, (size_t)T * HS), *dout = randv(&r, (size_t)T * HS);
		double *o = calloc((size_t)T * HS, 8), *l = calloc((size_t)T, 8);
		double *dq = calloc((size_t)T * HS, 8), *dk = calloc((size_t)T * HS, 8);
		double *dv = calloc((size_t)T * HS, 8);

		naive(q, k, v, T, 0, T, 0, o, l, dout, dq, dk, dv);
		for (bi = 0; bi < sizeof(Bs) / sizeof(Bs[0]); bi++) {
			struct mr_attn_head h = head(q, k, v, T, 0, T, 0, Bs[bi][0], Bs[bi][1]);
			float *ws = zeros(mr_attn_head_ws_floats(h.bq, h.bk, HS));
			float *out = zeros((size_t)T * HS), *lse = zeros((size_t)T);
			float *delta = zeros((size_t)T);
			float *gq = zeros((size_t)T * HS), *gk = zeros((size_t)T * HS);
			float *gv = zeros((size_t)T * HS);
			int i, c;

			mr_attn_head_fwd(&h, out, HS, lse, ws);
			cr_expect(maxdiff(out, o, (size_t)T * HS) < 2e-5, "T=%d bq=%d bk=%d out", T,
				  h.bq, h.bk);
			cr_expect(maxdiff(lse, l, (size_t)T) < 2e-5, "T=%d bq=%d bk=%d lse", T,
				  h.bq, h.bk);
			for (i = 0; i < T; i++)
				for (c = 0; c < HS; c++)
					delta[i] += out[i * HS + c] * dout[i * HS + c];
			mr_attn_head_bwd(&h, dout, HS, lse, delta, gq, HS, gk, gv, HS, ws);
			cr_expect(maxdiff(gq, dq, (size_t)T * HS) < 5e-5, "T=%d bq=%d bk=%d dq", T,
				  h.bq, h.bk);
			cr_expect(maxdiff(gk, dk, (size_t)T * HS) < 5e-5, "T=%d bq=%d bk=%d dk", T,
				  h.bq, h.bk);
			cr_expect(maxdiff(gv, dv, (size_t)T * HS) < 5e-5, "T=%d bq=%d bk=%d dv", T,
				  h.bq, h.bk);
			free(ws);
			free(out);
			free(lse);
			free(delta);
			free(gq);
			free(gk);
			free(gv);
		}
		free(q);
		free(k);
		free(v);
		free(dout);
		free(o);
		free(l);
		free(dq);
		free(dk);
		free(dv);
	}
}

/* Queries are the last tq positions; keys split at `split` into two
 * blocks processed separately and merged (context-parallel style). */
Test(attention, merge_of_partials_equals_full)
{
	const int T = 48, qp0 = 20, tq = T - qp0;
	const int splits[] = { 1, 16, 20, 33, 47 };
	struct mr_rng r;
	size_t si;

	mr_rng_seed(&r, 11, 0);
	float *q = randv(&r, (size_t)tq * HS), *k = randv(&r, (size_t)T * HS);
	float *v = randv(&r, (size_t)T * HS), *dout = randv(&r, (size_t)tq * HS);
	double *o = calloc((size_t)tq * HS, 8), *l = calloc((size_t)tq, 8);
	double *dq = calloc((size_t)tq * HS, 8), *dk = calloc((size_t)T * HS, 8);
	double *dv = calloc((size_t)T * HS, 8);

	naive(q, k, v, tq, qp0, T, 0, o, l, dout, dq, dk, dv);
	for (si = 0; si < sizeof(splits) / sizeof(splits[0]); si++) {
		int s = splits[si], i, c;
		struct mr_attn_head a = head(q, k, v, tq, qp0, s, 0, 8, 8);
		struct mr_attn_head b = head(q, k + s * HS, v + s * HS, tq, qp0, T - s, s, 8, 8);
		float *ws = zeros(mr_attn_head_ws_floats(8, 8, HS));
		float *oa = zeros((size_t)tq * HS), *la = zeros((size_t)tq);
		float *ob = zeros((size_t)tq * HS), *lb = zeros((size_t)tq);
		float *delta = zeros((size_t)tq), *gq = zeros((size_t)tq * HS);
		float *gk = zeros((size_t)T * HS), *gv = zeros((size_t)T * HS);

		mr_attn_head_fwd(&a, oa, HS, la, ws);
		mr_attn_head_fwd(&b, ob, HS, lb, ws);
		mr_attn_merge(oa, HS, la, ob, HS, lb, tq, HS);
		cr_expect(maxdiff(oa, o, (size_t)tq * HS) < 2e-5, "split %d: merged out", s);
		cr_expect(maxdiff(la, l, (size_t)tq) < 2e-5, "split %d: merged lse", s);
		for (i = 0; i < tq; i++)
			for (c = 0; c < HS; c++)
				delta[i] += oa[i * HS + c] * dout[i * HS + c];
		mr_attn_head_bwd(&a, dout, HS, la, delta, gq, HS, gk, gv, HS, ws);
		mr_attn_head_bwd(&b, dout, HS, la, delta, gq, HS, gk + s * HS, gv + s * HS, HS, ws);
		cr_expect(maxdiff(gq, dq, (size_t)tq * HS) < 5e-5, "split %d: dq", s);
		cr_expect(maxdiff(gk, dk, (size_t)T * HS) < 5e-5, "split %d: dk", s);
		cr_expect(maxdiff(gv, dv, (size_t)T * HS) < 5e-5, "split %d: dv", s);
		free(ws);
		free(oa);
		free(la);
		free(ob);
		free(lb);
		free(delta);
		free(gq);
		free(gk);
		free(gv);
	}
	free(q);
	free(k);
	free(v);
	free(dout);
	free(o);
	free(l);
	free(dq);
	free(dk);
	free(dv);
}

Test(attention, fully_masked_rows_have_zero_output)
{
	float q[HS], k[HS], v[HS], out[HS], lse[1], ws[256];
	struct mr_attn_head h = head(q, k, v, 1, 3, 1, 5, 4, 4); /* key after query */
	int c;

	for (c = 0; c < HS; c++)
		q[c] = k[c] = v[c] = 1.0f;
	mr_attn_head_fwd(&h, out, HS, lse, ws);
	cr_expect(isinf(lse[0]) && lse[0] < 0);
	for (c = 0; c < HS; c++)
		cr_expect_eq(out[c], 0.0f);
}

Test(attention, layer_on_pool_matches_per_head_naive)
{
	const int B = 2, T = 40, NH = 3, C = NH * HS;
	struct mr_pool *pool;
	struct mr_rng r;
	int b, h, t, c;

	mr_rng_seed(&r, 3, 0);
	cr_assert_eq(mr_pool_create(&pool, 2), 0);
	float *qkv = randv(&r, (size_t)B * T * 3 * C), *dout = randv(&r, (size_t)B * T * C);
	float *out = zeros((size_t)B * T * C), *lse = zeros((size_t)B * NH * T);
	float *dqkv = zeros((size_t)B * T * 3 * C);
	float *ws = zeros(mr_attn_layer_ws_floats(pool, T, HS));
	float q[T * HS], k[T * HS], v[T * HS], d[T * HS];
	double o[T * HS], l[T], dq[T * HS], dk[T * HS], dv[T * HS];

	mr_attn_layer_fwd(pool, out, lse, qkv, B, T, C, NH, ws);
	mr_attn_layer_bwd(pool, dqkv, dout, qkv, out, lse, B, T, C, NH, ws);
	for (b = 0; b < B; b++)
		for (h = 0; h < NH; h++) {
			for (t = 0; t < T; t++)
				for (c = 0; c < HS; c++) {
					const float *row = qkv + ((size_t)b * T + t) * 3 * C + h * HS + c;
					q[t * HS + c] = row[0];
					k[t * HS + c] = row[C];
					v[t * HS + c] = row[2 * C];
					d[t * HS + c] = dout[((size_t)b * T + t) * C + h * HS + c];
				}
			naive(q, k, v, T, 0, T, 0, o, l, d, dq, dk, dv);
			for (t = 0; t < T; t++) {
				cr_expect(fabs(lse[((size_t)b * NH + h) * T + t] - l[t]) < 2e-5);
				for (c = 0; c < HS; c++) {
					size_t i = ((size_t)b * T + t) * C + h * HS + c;
					size_t j = ((size_t)b * T + t) * 3 * C + h * HS + c;
					cr_expect(fabs(out[i] - o[t * HS + c]) < 2e-5);
					cr_expect(fabs(dqkv[j] - dq[t * HS + c]) < 5e-5);
					cr_expect(fabs(dqkv[j + C] - dk[t * HS + c]) < 5e-5);
					cr_expect(fabs(dqkv[j + 2 * C] - dv[t * HS + c]) < 5e-5);
				}
			}
		}
	free(qkv);
	free(dout);
	free(out);
	free(lse);
	free(dqkv);
	free(ws);
	mr_pool_free(pool);
}
