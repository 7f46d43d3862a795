/*
 * test_kernels.c - every CPU kernel's backward against central finite
 * differences of its forward. The objective is L = sum_i w_i * out_i with
 * fixed random w, summed in double; kernels are fp32, so the step is 1e-3
 * and the tolerance |fd - analytic| <= 2e-3 + 1e-2 * |fd|. Each test runs on
 * a 2-thread pool so the threaded paths are the ones checked. The forward
 * fast paths are also checked against double references, and the pooled
 * AdamW step bit for bit against the sequential loop.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mr_rng.h"
#include "device/mr_device.h"
#include "kernels/mr_attention.h"
#include "kernels/mr_fastmath.h"
#include "kernels/mr_kernels.h"
#include "optim/mr_adamw.h"

#define EPS 1e-3f

static struct mr_rng rng;
static struct mr_pool *pool;

static void setup(void)
{
	mr_rng_seed(&rng, 99, 0);
	cr_assert_eq(mr_pool_create(&pool, 2), 0);
}

static void teardown(void)
{
	mr_pool_free(pool);
}

static float *randv(size_t n, float scale)
{
	float *p = malloc(n * sizeof(float));
	size_t i;

	cr_assert_not_null(p);
	for (i = 0; i < n; i++)
		p[i] = (float)mr_rng_normal(&rng) * scale;
	return p;
}

static float *zeros(size_t n)
{
	float *p = calloc(n, sizeof(float));

	cr_assert_not_null(p);
	return p;
}

static double wsum(const float *w, const float *out, size_t n)
{
	double s = 0.0;
	size_t i;

	for (i = 0; i < n; i++)
		s += (double)w[i] * out[i];
	return s;
}

static void expect_close(double fd, double an, const char *what, size_t i)
{
	cr_expect(fabs(fd - an) <= 2e-3 + 1e-2 * fabs(fd), "%s[%zu]: fd %.6f analytic %.6f",
		  what, i, fd, an);
}

/* ---- layernorm ---- */
#define LN_N 6
#define LN_C 10
static const float *ln_x, *ln_w, *ln_b;
static float ln_out[LN_N * LN_C], ln_mean[LN_N], ln_rstd[LN_N];

static double ln_obj(const float *x, const float *w, const float *b, const float *dw)
{
	mr_layernorm_fwd(pool, ln_out, ln_mean, ln_rstd, x, w, b, LN_N, LN_C);
	return wsum(dw, ln_out, LN_N * LN_C);
}

Test(kernels, layernorm_backward_matches_fd)
{
	setup();
	float *x = randv(LN_N * LN_C, 2.0f), *w = randv(LN_C, 1.0f), *b = randv(LN_C, 1.0f);
	float *dout = randv(LN_N * LN_C, 1.0f), *dx = zeros(LN_N * LN_C);
	float *dw = zeros(LN_C), *db = zeros(LN_C), *ws = zeros(mr_layernorm_ws_floats(pool, LN_C));
	float *bufs[3] = { x, w, b }, *grads[3] = { dx, dw, db };
	size_t sizes[3] = { LN_N * LN_C, LN_C, LN_C }, i;
	const char *names[3] = { "dx", "dw", "db" };
	int t;

	ln_x = x;
	ln_w = w;
	ln_b = b;
	ln_obj(x, w, b, dout);
	mr_layernorm_bwd(pool, dx, dw, db, dout, x, w, ln_mean, ln_rstd, LN_N, LN_C, ws);
	for (t = 0; t < 3; t++)
		for (i = 0; i < sizes[t]; i++) {
			float keep = bufs[t][i];
			double lp, lm;
			bufs[t][i] = keep + EPS;
			lp = ln_obj(x, w, b, dout);
			bufs[t][i] = keep - EPS;
			lm = ln_obj(x, w, b, dout);
			bufs[t][i] = keep;
			expect_close((lp - lm) / (2.0 * EPS), grads[t][i], names[t], i);
		}
	free(x);
	free(w);
	free(b);
	free(dout);
	free(dx);
	free(dw);
	free(db);
	free(ws);
	teardown();
}

Test(kernels, gelu_backward_matches_fd)
{
	setup();
	const size_t n = 10000; /* large enough to be split across threads */
	float *x = randv(n, 3.0f), *dout = randv(n, 1.0f), *dx = zeros(n);
	float a[1], b[1];
	size_t i;

	mr_gelu_bwd(pool, dx, x, dout, n);
	for (i = 0; i < n; i += 37) {
		float xp = x[i] + EPS, xm = x[i] - EPS;
		double fd;
		mr_gelu_fwd(NULL, a, &xp, 1);
		mr_gelu_fwd(NULL, b, &xm, 1);
		fd = ((double)a[0] - b[0]) / (2.0 * EPS) * dout[i];
		expect_close(fd, dx[i], "gelu", i);
	}
	/* the forward at known points */
	{
		float in[3] = { 0.0f, 1.0f, -1.0f }, out[3];
		mr_gelu_fwd(pool, out, in, 3);
		cr_expect(fabsf(out[0]) < 1e-7f);
		cr_expect(fabsf(out[1] - 0.841192f) < 1e-5f, "gelu(1) = %f", (double)out[1]);
		cr_expect(fabsf(out[2] + 0.158808f) < 1e-5f, "gelu(-1) = %f", (double)out[2]);
	}
	free(x);
	free(dout);
	free(dx);
	teardown();
}

Test(kernels, crossentropy_backward_matches_fd)
{
	setup();
	enum { N = 5, V = 13 };
	float *logits = randv(N * V, 3.0f), *d = zeros(N * V), losses[N], lse[N];
	int tg[N] = { 0, 12, 5, 5, 7 };
	const float scale = 0.7f;
	size_t i;

	mr_crossentropy_fwd(pool, losses, lse, logits, tg, N, V);
	memcpy(d, logits, sizeof(float) * N * V);
	mr_crossentropy_bwd_inplace(pool, d, lse, tg, N, V, scale);
	for (i = 0; i < N * V; i++) {
		float keep = logits[i];
		double lp = 0, lm = 0;
		int r;
		logits[i] = keep + EPS;
		mr_crossentropy_fwd(pool, losses, lse, logits, tg, N, V);
		for (r = 0; r < N; r++)
			lp += losses[r];
		logits[i] = keep - EPS;
		mr_crossentropy_fwd(pool, losses, lse, logits, tg, N, V);
		for (r = 0; r < N; r++)
			lm += losses[r];
		logits[i] = keep;
		expect_close((lp - lm) / (2.0 * EPS) * scale, d[i], "dlogits", i);
	}
	/* loss of a uniform row is log V */
	{
		float u[V] = { 0 };
		int t0 = 3;
		mr_crossentropy_fwd(NULL, losses, lse, u, &t0, 1, V);
		cr_expect(fabsf(losses[0] - logf((float)V)) < 1e-6f);
	}
	free(logits);
	free(d);
	teardown();
}

Test(kernels, encoder_backward_matches_fd_with_repeated_tokens)
{
	setup();
	enum { B = 2, T = 5, C = 40, V = 4 };
	int tok[B * T] = { 0, 1, 1, 3, 0, 2, 2, 2, 1, 0 };
	float *wte = randv(V * C, 1.0f), *wpe = randv(T * C, 1.0f), *out = zeros(B * T * C);
	float *dout = randv(B * T * C, 1.0f), *dwte = zeros(V * C), *dwpe = zeros(T * C);
	float *bufs[2] = { wte, wpe }, *grads[2] = { dwte, dwpe };
	size_t sizes[2] = { V * C, T * C }, i;
	int t;

	mr_encoder_bwd(pool, dwte, dwpe, dout, tok, B, T, C);
	for (t = 0; t < 2; t++)
		for (i = 0; i < sizes[t]; i++) {
			float keep = bufs[t][i];
			double lp, lm;
			bufs[t][i] = keep + EPS;
			mr_encoder_fwd(pool, out, tok, wte, wpe, B, T, C);
			lp = wsum(dout, out, B * T * C);
			bufs[t][i] = keep - EPS;
			mr_encoder_fwd(pool, out, tok, wte, wpe, B, T, C);
			lm = wsum(dout, out, B * T * C);
			bufs[t][i] = keep;
			expect_close((lp - lm) / (2.0 * EPS), grads[t][i], t ? "dwpe" : "dwte", i);
		}
	free(wte);
	free(wpe);
	free(out);
	free(dout);
	free(dwte);
	free(dwpe);
	teardown();
}

Test(kernels, matmul_backward_matches_fd)
{
	setup();
	enum { N = 7, IC = 5, OC = 6 };
	float *x = randv(N * IC, 1.0f), *w = randv(OC * IC, 1.0f), *b = randv(OC, 1.0f);
	float *out = zeros(N * OC), *dout = randv(N * OC, 1.0f), *dx = zeros(N * IC);
	float *dw = zeros(OC * IC), *db = zeros(OC), ones[N];
	float *bufs[3] = { x, w, b }, *grads[3] = { dx, dw, db };
	size_t sizes[3] = { N * IC, OC * IC, OC }, i;
	const char *names[3] = { "dx", "dw", "db" };
	int t;

	for (i = 0; i < N; i++)
		ones[i] = 1.0f;
	/* dx accumulates when asked: start from 1 and subtract it back */
	for (i = 0; i < N * IC; i++)
		dx[i] = 1.0f;
	mr_matmul_bwd(pool, dx, dw, db, dout, x, w, N, IC, OC, 1, ones);
	for (i = 0; i < N * IC; i++)
		dx[i] -= 1.0f;
	for (t = 0; t < 3; t++)
		for (i = 0; i < sizes[t]; i++) {
			float keep = bufs[t][i];
			double lp, lm;
			bufs[t][i] = keep + EPS;
			mr_matmul_fwd(pool, out, x, w, b, N, IC, OC);
			lp = wsum(dout, out, N * OC);
			bufs[t][i] = keep - EPS;
			mr_matmul_fwd(pool, out, x, w, b, N, IC, OC);
			lm = wsum(dout, out, N * OC);
			bufs[t][i] = keep;
			expect_close((lp - lm) / (2.0 * EPS), grads[t][i], names[t], i);
		}
	free(x);
	free(w);
	free(b);
	free(out);
	free(dout);
	free(dx);
	free(dw);
	free(db);
	teardown();
}

Test(kernels, residual_and_add)
{
	float a[5] = { 1, 2, 3, 4, 5 }, b[5] = { 5, 4, 3, 2, 1 }, o[5];
	int i;

	mr_residual_fwd(NULL, o, a, b, 5);
	mr_add_inplace(NULL, a, b, 5);
	for (i = 0; i < 5; i++) {
		cr_expect_eq(o[i], 6.0f);
		cr_expect_eq(a[i], 6.0f);
	}
}

Test(kernels, fast_expf_is_within_a_few_ulp)
{
	double worst = 0.0;
	float x;

	for (x = -80.0f; x <= 80.0f; x += 0.01953125f) {
		double e = exp((double)x), r = fabs((double)mr_fast_expf(x) - e) / e;
		if (r > worst)
			worst = r;
	}
	cr_expect(worst < 4e-7, "worst relative error %.3g", worst);
	cr_expect(mr_fast_expf(-1000.0f) >= 0.0f && mr_fast_expf(-1000.0f) < 1e-37f);
	cr_expect(isfinite(mr_fast_expf(1000.0f)));
	cr_expect_eq(mr_fast_expf(0.0f), 1.0f);
	cr_expect(isnan(mr_fast_expf(NAN)), "NaN propagates");
}

/* The forward kernels' fast paths (rows taken 4 at a time with tail rows,
 * vocabulary in chunks, threads splitting the rows) against plain double
 * references: layernorm over 37 rows (2 threads of 18 and 19 rows, so 4-row
 * blocks plus tail rows), cross-entropy with V = 300 (one full chunk of 256
 * plus a 44 tail, not a multiple of 8). */
Test(kernels, layernorm_and_crossentropy_forward_match_double_reference)
{
	setup();
	enum { N = 37, C = 50, V = 300 };
	float *x = randv(N * C, 2.0f), *w = randv(C, 1.0f), *b = randv(C, 1.0f);
	float *out = zeros(N * C), mean[N], rstd[N];
	float *logits = randv(N * V, 4.0f), losses[N], lse[N];
	int tg[N], i, c;

	mr_layernorm_fwd(pool, out, mean, rstd, x, w, b, N, C);
	for (i = 0; i < N; i++) {
		double m = 0.0, v = 0.0, s;
		for (c = 0; c < C; c++)
			m += x[i * C + c];
		m /= C;
		for (c = 0; c < C; c++)
			v += (x[i * C + c] - m) * (x[i * C + c] - m);
		s = 1.0 / sqrt(v / C + MR_LN_EPS);
		cr_expect(fabs(mean[i] - m) <= 1e-5 * (1.0 + fabs(m)), "mean[%d]", i);
		cr_expect(fabs(rstd[i] - s) <= 1e-5 * s, "rstd[%d]", i);
		for (c = 0; c < C; c++) {
			double r = (x[i * C + c] - m) * s * w[c] + b[c];
			cr_expect(fabs(out[i * C + c] - r) <= 1e-5 * (1.0 + fabs(r)),
				  "ln out[%d,%d] %f vs %f", i, c, (double)out[i * C + c], r);
		}
	}
	for (i = 0; i < N; i++)
		tg[i] = (i * 37) % V;
	mr_crossentropy_fwd(pool, losses, lse, logits, tg, N, V);
	for (i = 0; i < N; i++) {
		double s = 0.0, l;
		for (c = 0; c < V; c++)
			s += exp((double)logits[i * V + c]);
		l = log(s);
		cr_expect(fabs(lse[i] - l) <= 1e-5 * (1.0 + fabs(l)), "lse[%d] %f vs %f", i,
			  (double)lse[i], l);
		cr_expect(fabs(losses[i] - (l - logits[i * V + tg[i]])) <= 1e-5 * (1.0 + fabs(l)),
			  "loss[%d]", i);
	}
	free(x);
	free(w);
	free(b);
	free(out);
	free(logits);
	teardown();
}

/* The cpu device's AdamW splits a range across the pool; every element
 * must come out bit-identical to the plain sequential AdamW loop (written
 * out here), including the ranges cut between the threads, with and
 * without weight decay. */
static void adamw_ref(const struct mr_adamw_config *c, long t, float lr, float *p,
		      const float *g, float *m, float *v, size_t n, int decay)
{
	double bc1 = 1.0 - pow((double)c->beta1, (double)t);
	double bc2 = 1.0 - pow((double)c->beta2, (double)t);
	float step_size = (float)((double)lr / bc1), bc2_sqrt = (float)sqrt(bc2);
	float dec = decay ? 1.0f - lr * c->weight_decay : 1.0f;
	size_t i;

	for (i = 0; i < n; i++) {
		float gi = g[i], denom;
		p[i] *= dec;
		m[i] = m[i] * c->beta1 + gi * (1.0f - c->beta1);
		v[i] = v[i] * c->beta2 + gi * gi * (1.0f - c->beta2);
		denom = sqrtf(v[i]) / bc2_sqrt + c->eps;
		p[i] -= step_size * (m[i] / denom);
	}
}

Test(kernels, device_adamw_on_the_pool_is_bit_identical_to_the_sequential_loop)
{
	setup();
	static const size_t sizes[3] = { 100003, 17, 60001 };
	const struct mr_adamw_config oc = { 1e-3f, 0.1f, 0, 10, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f,
					MR_LR_COSINE, 0.0f };
	size_t n = sizes[0] + sizes[1] + sizes[2], i, off[3];
	float *p, *g, *m, *v, *rp, *rm, *rv;
	struct mr_dev dev;
	int t, k;

	cr_assert_eq(mr_dev_open(&dev, "cpu", 0, NULL, pool, NULL), 0);
	for (t = 0, off[0] = 0; t < 2; t++)
		off[t + 1] = off[t] + sizes[t];
	p = randv(n, 0.5f);
	g = randv(n, 0.01f);
	m = zeros(n);
	v = zeros(n);
	rp = malloc(n * sizeof(float));
	rm = zeros(n);
	rv = zeros(n);
	cr_assert_not_null(rp);
	memcpy(rp, p, n * sizeof(float));
	for (k = 1; k <= 3; k++) {
		float lr = 1e-3f * (float)k;
		/* the three tensors in one call, the second without decay */
		struct mr_dev_adamw o = { lr, oc.beta1, oc.beta2, oc.eps, oc.weight_decay, k, 1.0f };
		struct mr_dev_adamw_range r[3];
		for (t = 0; t < 3; t++)
			r[t] = (struct mr_dev_adamw_range){ p + off[t], NULL, g + off[t], m + off[t],
							    v + off[t], sizes[t], t != 1 };
		cr_assert_eq(dev.ops->adamw_args(&dev, &o), 0);
		cr_assert_eq(dev.ops->adamw(&dev, r, 3), 0);
		for (t = 0; t < 3; t++)
			adamw_ref(&oc, k, lr, rp + off[t], g + off[t], rm + off[t], rv + off[t],
				  sizes[t], t != 1);
		for (i = 0; i < n; i++)
			g[i] = -0.5f * g[i] + 1e-3f * rp[i];
	}
	cr_expect(memcmp(p, rp, n * sizeof(float)) == 0, "params differ");
	cr_expect(memcmp(m, rm, n * sizeof(float)) == 0, "m differs");
	cr_expect(memcmp(v, rv, n * sizeof(float)) == 0, "v differs");
	mr_dev_close(&dev);
	free(p);
	free(g);
	free(m);
	free(v);
	free(rp);
	free(rm);
	free(rv);
	teardown();
}

/* The device's sums of squares: each range one sequential double sum,
 * whatever the pool's split. */
Test(kernels, device_sumsq_of_ranges_equals_one_sequential_sum_each)
{
	setup();
	const size_t n = 300007, off[4] = { 0, 5, 200000, 200000 }, len[4] = { 5, 150000, 0, 100007 };
	float *g = randv(n, 1.0f);
	double out[4], ref;
	struct mr_dev dev;
	size_t i;
	int k;

	cr_assert_eq(mr_dev_open(&dev, "cpu", 0, NULL, pool, NULL), 0);
	cr_assert_eq(dev.ops->sumsq(&dev, g, off, len, 4, out), 0);
	for (k = 0; k < 4; k++) {
		for (ref = 0.0, i = 0; i < len[k]; i++)
			ref += (double)g[off[k] + i] * g[off[k] + i];
		cr_expect(out[k] == ref, "range %d: %.17g, sequential %.17g", k, out[k], ref);
	}
	mr_dev_close(&dev);
	free(g);
	teardown();
}

/* ---- attention: the layer block sizes against a naive double reference ---- */
#define AHS 16

/* Causal attention of tq query rows (positions qp0..) over tk key rows
 * (positions kp0..), row strides qs / ks: out (tq,AHS), and with dout the
 * gradients dq (tq,AHS), dk, dv (tk,AHS), all contiguous doubles (=). */
static void attn_naive(const float *q, size_t qs, const float *k, const float *v, size_t ks,
		       int tq, int qp0, int tk, int kp0, const float *dout, size_t ds,
		       double *out, double *dq, double *dk, double *dv)
{
	double sc = 1.0 / sqrt((double)AHS), *P = calloc((size_t)tk, sizeof(double));
	double *dp = calloc((size_t)tk, sizeof(double));
	int i, j, c;

	cr_assert(P && dp);
	memset(dq, 0, sizeof(double) * (size_t)tq * AHS);
	memset(dk, 0, sizeof(double) * (size_t)tk * AHS);
	memset(dv, 0, sizeof(double) * (size_t)tk * AHS);
	for (i = 0; i < tq; i++) {
		double mx = -INFINITY, sum = 0.0, dot = 0.0;
		for (j = 0; j < tk && kp0 + j <= qp0 + i; j++) {
			double d = 0.0;
			for (c = 0; c < AHS; c++)
				d += (double)q[i * qs + c] * k[j * ks + c];
			P[j] = d * sc;
			mx = fmax(mx, P[j]);
		}
		int n = j;
		for (j = 0; j < n; j++)
			sum += exp(P[j] - mx);
		for (c = 0; c < AHS; c++)
			out[i * AHS + c] = 0.0;
		for (j = 0; j < n; j++) {
			P[j] = exp(P[j] - mx) / sum;
			for (c = 0; c < AHS; c++)
				out[i * AHS + c] += P[j] * v[j * ks + c];
		}
		for (j = 0; j < n; j++) {
			dp[j] = 0.0;
			for (c = 0; c < AHS; c++)
				dp[j] += (double)dout[i * ds + c] * v[j * ks + c];
			dot += dp[j] * P[j];
		}
		for (j = 0; j < n; j++) {
			double g = P[j] * (dp[j] - dot) * sc;
			for (c = 0; c < AHS; c++) {
				dv[j * AHS + c] += P[j] * dout[i * ds + c];
				dq[i * AHS + c] += g * k[j * ks + c];
				dk[j * AHS + c] += g * q[i * qs + c];
			}
		}
	}
	free(P);
	free(dp);
}

static double amax_diff(const float *a, size_t as, const double *b, int rows)
{
	double m = 0.0;
	int i, c;

	for (i = 0; i < rows; i++)
		for (c = 0; c < AHS; c++)
			m = fmax(m, fabs(a[i * as + c] - b[i * AHS + c]));
	return m;
}

/* The layer entry points on the pool (T = 200: several 64/128 blocks, the
 * backward's query range starting past unaligned block edges), and one head
 * with its queries offset from its keys (ring attention's case) with the
 * same block sizes. */
Test(kernels, attention_layer_and_offset_head_match_naive)
{
	setup();
	enum { T = 200, NH = 2, C = NH * AHS };
	float *qkv = randv((size_t)T * 3 * C, 1.5f), *dout = randv((size_t)T * C, 1.0f);
	float *out = zeros((size_t)T * C), *lse = zeros((size_t)NH * T);
	float *dqkv = randv((size_t)T * 3 * C, 1.0f); /* garbage: bwd writes (=) */
	float *ws = zeros(mr_attn_layer_ws_floats(pool, T, AHS) + 4096);
	double *o = calloc((size_t)T * AHS, 8), *dq = calloc((size_t)T * AHS, 8);
	double *dk = calloc((size_t)T * AHS, 8), *dv = calloc((size_t)T * AHS, 8);
	int hh;

	cr_assert(o && dq && dk && dv);
	mr_attn_layer_fwd(pool, out, lse, qkv, 1, T, C, NH, NH, ws);
	mr_attn_layer_bwd(pool, dqkv, dout, qkv, out, lse, 1, T, C, NH, NH, ws);
	for (hh = 0; hh < NH; hh++) {
		const float *q = qkv + hh * AHS, *k = q + C, *v = q + 2 * C;
		attn_naive(q, 3 * C, k, v, 3 * C, T, 0, T, 0, dout + hh * AHS, C, o, dq, dk, dv);
		cr_expect(amax_diff(out + hh * AHS, C, o, T) < 2e-5, "layer out head %d", hh);
		cr_expect(amax_diff(dqkv + hh * AHS, 3 * C, dq, T) < 5e-5, "layer dq head %d", hh);
		cr_expect(amax_diff(dqkv + C + hh * AHS, 3 * C, dk, T) < 5e-5, "layer dk %d", hh);
		cr_expect(amax_diff(dqkv + 2 * C + hh * AHS, 3 * C, dv, T) < 5e-5, "layer dv %d",
			  hh);
	}
	{
		/* queries at positions 70..219 over keys at 0..199 */
		enum { TQ = 150, QP0 = 70 };
		const float *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
		struct mr_attn_head h = { q, k, v, 3 * C, 3 * C, TQ, QP0, T, 0, AHS, 1,
					  1.0f / sqrtf((float)AHS), 64, 128 };
		float *ho = zeros((size_t)TQ * AHS), *hl = zeros(TQ), *delta = zeros(TQ);
		float *gq = zeros((size_t)TQ * AHS), *gk = zeros((size_t)T * AHS);
		float *gv = zeros((size_t)T * AHS);
		float *hws = zeros(mr_attn_head_ws_floats(128, 128, AHS));
		int i, c;

		mr_attn_head_fwd(&h, ho, AHS, hl, hws);
		for (i = 0; i < TQ; i++)
			for (c = 0; c < AHS; c++)
				delta[i] += ho[i * AHS + c] * dout[i * C + c];
		h.bq = 128;
		h.bk = 64;
		mr_attn_head_bwd(&h, dout, C, hl, delta, gq, AHS, gk, gv, AHS, hws);
		attn_naive(q, 3 * C, k, v, 3 * C, TQ, QP0, T, 0, dout, C, o, dq, dk, dv);
		cr_expect(amax_diff(ho, AHS, o, TQ) < 2e-5, "offset head out");
		cr_expect(amax_diff(gq, AHS, dq, TQ) < 5e-5, "offset head dq");
		cr_expect(amax_diff(gk, AHS, dk, T) < 5e-5, "offset head dk");
		cr_expect(amax_diff(gv, AHS, dv, T) < 5e-5, "offset head dv");
		free(ho);
		free(hl);
		free(delta);
		free(gq);
		free(gk);
		free(gv);
		free(hws);
	}
	free(qkv);
	free(dout);
	free(out);
	free(lse);
	free(dqkv);
	free(ws);
	free(o);
	free(dq);
	free(dk);
	free(dv);
	teardown();
}
