/*
 * test_attention.c - block-wise online-softmax attention against a naive
 * double-precision reference: forward (out, lse) and backward (dq, dk, dv)
 * for several sequence lengths and block sizes, the merge of two partial
 * results over disjoint key blocks (what context parallelism does), and
 * the whole-layer and slice entry points on a pool, multi-head and
 * grouped-query (fewer key/value heads than query heads).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mr_rng.h"
#include "kernels/mr_attention.h"

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

/* The layer on a pool of two threads against the naive reference per
 * query head, which reads key/value head h / (NH/NKV); a key/value head's
 * gradient is the sum over its group's (summed here in double). */
static void layer_vs_naive(int NH, int NKV)
{
	enum { B = 2, T = 40 };
	const int C = NH * HS, W = C + 2 * NKV * HS, group = NH / NKV;
	struct mr_pool *pool;
	struct mr_rng r;
	int b, h, t, c;

	mr_rng_seed(&r, 3, 0);
	cr_assert_eq(mr_pool_create(&pool, 2), 0);
	float *qkv = randv(&r, (size_t)B * T * W), *dout = randv(&r, (size_t)B * T * C);
	float *out = zeros((size_t)B * T * C), *lse = zeros((size_t)B * NH * T);
	float *dqkv = zeros((size_t)B * T * W);
	float *ws = zeros(mr_attn_layer_ws_floats(pool, T, HS));
	float q[T * HS], k[T * HS], v[T * HS], d[T * HS];
	double o[T * HS], l[T], dq[T * HS], dk[T * HS], dv[T * HS];
	double *dkv = calloc((size_t)B * T * 2 * NKV * HS, sizeof(double));

	cr_assert_not_null(dkv);
	mr_attn_layer_fwd(pool, out, lse, qkv, B, T, C, NH, NKV, ws);
	mr_attn_layer_bwd(pool, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, ws);
	for (b = 0; b < B; b++)
		for (h = 0; h < NH; h++) {
			int kvh = h / group;

			for (t = 0; t < T; t++)
				for (c = 0; c < HS; c++) {
					const float *row = qkv + ((size_t)b * T + t) * W;
					q[t * HS + c] = row[h * HS + c];
					k[t * HS + c] = row[C + kvh * HS + c];
					v[t * HS + c] = row[C + (NKV + kvh) * HS + c];
					d[t * HS + c] = dout[((size_t)b * T + t) * C + h * HS + c];
				}
			naive(q, k, v, T, 0, T, 0, o, l, d, dq, dk, dv);
			for (t = 0; t < T; t++) {
				double *g = dkv + ((size_t)b * T + t) * 2 * NKV * HS;
				cr_expect(fabs(lse[((size_t)b * NH + h) * T + t] - l[t]) < 2e-5);
				for (c = 0; c < HS; c++) {
					size_t i = ((size_t)b * T + t) * C + h * HS + c;
					size_t j = ((size_t)b * T + t) * W + h * HS + c;
					cr_expect(fabs(out[i] - o[t * HS + c]) < 2e-5);
					cr_expect(fabs(dqkv[j] - dq[t * HS + c]) < 5e-5);
					g[kvh * HS + c] += dk[t * HS + c];
					g[(NKV + kvh) * HS + c] += dv[t * HS + c];
				}
			}
		}
	for (b = 0; b < B; b++)
		for (t = 0; t < T; t++)
			for (c = 0; c < 2 * NKV * HS; c++) {
				float got = dqkv[((size_t)b * T + t) * W + C + c];
				double want = dkv[((size_t)b * T + t) * 2 * NKV * HS + c];
				cr_expect(fabs(got - want) < 1e-4, "NH %d NKV %d: d%s[%d][%d][%d] %g vs %g",
					  NH, NKV, c < NKV * HS ? "k" : "v", b, t, c % (NKV * HS),
					  (double)got, want);
			}
	free(qkv);
	free(dout);
	free(out);
	free(lse);
	free(dqkv);
	free(ws);
	free(dkv);
	mr_pool_free(pool);
}

Test(attention, layer_on_pool_matches_per_head_naive) { layer_vs_naive(3, 3); }
Test(attention, grouped_query_layer_matches_naive) { layer_vs_naive(4, 2); }
Test(attention, multi_query_layer_matches_naive) { layer_vs_naive(3, 1); }

/* Context parallelism's entry points with grouped-query heads: the slice
 * over the whole sequence gives the layer's numbers, and so do two key
 * blocks merged, their backward adding into the same dk, dv. */
Test(attention, grouped_query_slices_equal_the_layer)
{
	enum { B = 2, T = 48, NH = 4, NKV = 2, C = NH * HS, W = C + 2 * NKV * HS, K0 = 20 };
	struct mr_pool *pool;
	struct mr_rng r;

	mr_rng_seed(&r, 9, 0);
	cr_assert_eq(mr_pool_create(&pool, 3), 0);
	float *qkv = randv(&r, (size_t)B * T * W), *dout = randv(&r, (size_t)B * T * C);
	float *out = zeros((size_t)B * T * C), *lse = zeros((size_t)B * NH * T);
	float *dqkv = zeros((size_t)B * T * W), *ws = zeros(mr_attn_layer_ws_floats(pool, T, HS));
	float *so = zeros((size_t)B * T * C), *slse = zeros((size_t)B * NH * T);
	float *so2 = zeros((size_t)B * T * C), *slse2 = zeros((size_t)B * NH * T);
	float *sd = zeros((size_t)B * T * W), *delta = zeros((size_t)B * NH * T);
	struct mr_attn_slice a = { qkv, qkv + C, qkv + C + NKV * HS, W, (size_t)T * W, W,
				   (size_t)T * W, B, NH, HS, T, 0, K0, 0, 1,
				   1.0f / sqrtf((float)HS), NKV };
	struct mr_attn_slice a2 = a;

	mr_attn_layer_fwd(pool, out, lse, qkv, B, T, C, NH, NKV, ws);
	mr_attn_layer_bwd(pool, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, ws);
	/* keys [0, K0) and [K0, T): two partials, merged */
	a2.k += (size_t)K0 * W;
	a2.v += (size_t)K0 * W;
	a2.tk = T - K0;
	a2.k_pos0 = K0;
	cr_assert_eq(mr_attn_slice_fwd(pool, &a, so, C, (size_t)T * C, slse), 0);
	cr_assert_eq(mr_attn_slice_fwd(pool, &a2, so2, C, (size_t)T * C, slse2), 0);
	mr_attn_slice_merge(pool, so, slse, so2, slse2, B, NH, T, HS, C, (size_t)T * C);
	mr_attn_slice_delta(pool, delta, dout, so, B, NH, T, HS, C, (size_t)T * C);
	cr_assert_eq(mr_attn_slice_bwd(pool, &a, dout, C, (size_t)T * C, slse, delta, sd, W,
				       (size_t)T * W, sd + C, sd + C + NKV * HS, W, (size_t)T * W),
		     0);
	cr_assert_eq(mr_attn_slice_bwd(pool, &a2, dout, C, (size_t)T * C, slse, delta, sd, W,
				       (size_t)T * W, sd + C + (size_t)K0 * W,
				       sd + C + NKV * HS + (size_t)K0 * W, W, (size_t)T * W),
		     0);
	for (size_t i = 0; i < (size_t)B * T * C; i++)
		cr_expect(fabsf(so[i] - out[i]) < 2e-5f, "out[%zu] %g vs %g", i, (double)so[i],
			  (double)out[i]);
	for (size_t i = 0; i < (size_t)B * NH * T; i++)
		cr_expect(fabsf(slse[i] - lse[i]) < 2e-5f, "lse[%zu]", i);
	for (size_t i = 0; i < (size_t)B * T * W; i++)
		cr_expect(fabsf(sd[i] - dqkv[i]) < 5e-5f, "dqkv[%zu] %g vs %g", i, (double)sd[i],
			  (double)dqkv[i]);
	free(qkv), free(dout), free(out), free(lse), free(dqkv), free(ws), free(so), free(slse);
	free(so2), free(slse2), free(sd), free(delta);
	mr_pool_free(pool);
}
