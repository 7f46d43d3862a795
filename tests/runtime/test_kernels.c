/*
 * test_kernels.c - every CPU kernel's backward against central finite
 * differences of its forward. The objective is L = sum_i w_i * out_i with
 * fixed random w, summed in double; kernels are fp32, so the step is 1e-3
 * and the tolerance |fd - analytic| <= 2e-3 + 1e-2 * |fd|. Each test runs on
 * a 2-thread pool so the threaded paths are the ones checked.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/mr_fastmath.h"
#include "kernels/mr_kernels.h"
#include "mr_rng.h"

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
