/*
 * test_llama_kernels.c - the Llama family's CPU kernels (RMSNorm, rotary
 * positions, SwiGLU; runtime/kernels/mr_kernels.h) against PyTorch:
 * tests/reference/llama_ops.py, written from the published semantics,
 * computes every forward value and every gradient by autograd on the same
 * random inputs, and each must match within fp32 rounding - on a pool of
 * three threads, so the row splits and the per-thread dw partials are in
 * play. Rotary positions are out of order and large (a context-parallel
 * rank's chunks), the rows wider than the heads rotated (q inside a qkv
 * row: the rest must stay untouched), and the frequencies are checked with
 * and without Llama 3.1's scaling.
 *
 * Skipped when /usr/bin/python3 has no torch (Debian's python3-torch,
 * which scripts/deps.sh installs).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/mr_pool.h"
#include "kernels/mr_kernels.h"

enum { N = 37, C = 48, F = 40, H = 3, D = 64, KV = 2 };
#define ROW ((size_t)(H + 2 * KV) * D) /* a qkv row: q's heads, then k and v */
#define THETA 500000.0f
#define EPS 1e-5f

static const struct mr_rope_scaling llama31 = { 8.0f, 1.0f, 4.0f, 8192 };

static float *randv(size_t n, float scale, unsigned *seed)
{
	float *v = malloc(n * sizeof(float));

	cr_assert_not_null(v);
	for (size_t i = 0; i < n; i++) {
		*seed = *seed * 1103515245u + 12345u;
		v[i] = scale * ((float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f);
	}
	return v;
}

static void put(FILE *f, const float *v, size_t n)
{
	cr_assert_eq(fwrite(v, sizeof(float), n, f), n);
}

static void expect_close(const char *what, const float *got, const float *want, size_t n,
			 float rtol, float atol)
{
	size_t bad = 0, worst = 0;
	float wd = 0.0f;

	for (size_t i = 0; i < n; i++) {
		float d = fabsf(got[i] - want[i]);
		if (!(d <= atol + rtol * fabsf(want[i]))) {
			if (!bad || d > wd) {
				wd = d;
				worst = i;
			}
			bad++;
		}
	}
	cr_expect_eq(bad, 0, "%s: %zu of %zu differ from PyTorch; worst [%zu] %.9g vs %.9g", what,
		     bad, n, worst, (double)got[worst], (double)want[worst]);
}

Test(llama_kernels, rmsnorm_rope_swiglu_match_pytorch, .timeout = 240)
{
	char dir[] = "/tmp/mr-llama-XXXXXX", in[64], out[64], cmd[512];
	unsigned seed = 20261128;
	struct mr_pool *pool;
	float *x = randv((size_t)N * C, 2.0f, &seed), *w = randv(C, 1.0f, &seed);
	float *gy = randv((size_t)N * C, 1.0f, &seed), *ab = randv((size_t)N * 2 * F, 4.0f, &seed);
	float *gsw = randv((size_t)N * F, 1.0f, &seed), *qkv = randv((size_t)N * ROW, 1.0f, &seed);
	float *gqkv = randv((size_t)N * ROW, 1.0f, &seed), *q = malloc(sizeof(float) * N * H * D);
	float *gq = malloc(sizeof(float) * N * H * D), *posf = malloc(sizeof(float) * N);
	float y[N * C], dx[N * C], dw[C], rstd[N], sw[N * F], dab[N * 2 * F];
	float inv[D / 2], inv_s[D / 2], *ws, *ref, *orig = malloc(sizeof(float) * N * ROW);
	size_t nref = (size_t)N * C * 2 + C + (size_t)N * F + (size_t)N * 2 * F +
		      2 * (size_t)N * H * D + D;
	int pos[N];
	FILE *f;

	if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
		cr_skip_test("/usr/bin/python3 has no torch");
	cr_assert_eq(mr_pool_create(&pool, 3), 0);
	cr_assert_not_null(mkdtemp(dir));
	/* positions out of order and far out, as a cp rank's chunks are */
	for (int n = 0; n < N; n++) {
		pos[n] = (n * 977 + 13) % 8191;
		posf[n] = (float)pos[n];
	}
	for (int n = 0; n < N; n++) {
		memcpy(q + (size_t)n * H * D, qkv + (size_t)n * ROW, sizeof(float) * H * D);
		memcpy(gq + (size_t)n * H * D, gqkv + (size_t)n * ROW, sizeof(float) * H * D);
	}
	snprintf(in, sizeof(in), "%s/in.bin", dir);
	snprintf(out, sizeof(out), "%s/out.bin", dir);
	cr_assert_not_null(f = fopen(in, "wb"));
	put(f, x, (size_t)N * C);
	put(f, w, C);
	put(f, gy, (size_t)N * C);
	put(f, ab, (size_t)N * 2 * F);
	put(f, gsw, (size_t)N * F);
	put(f, q, (size_t)N * H * D);
	put(f, gq, (size_t)N * H * D);
	put(f, posf, N);
	fclose(f);
	snprintf(cmd, sizeof(cmd),
		 "/usr/bin/python3 tests/reference/llama_ops.py %s %s %d %d %d %d %d %.1f %g %g %g "
		 "%g %d",
		 in, out, N, C, F, H, D, (double)THETA, (double)EPS, (double)llama31.factor,
		 (double)llama31.low_freq_factor, (double)llama31.high_freq_factor,
		 llama31.original_max_pos);
	cr_assert_eq(system(cmd), 0, "%s", cmd);
	ref = malloc(sizeof(float) * nref);
	cr_assert_not_null(f = fopen(out, "rb"));
	cr_assert_eq(fread(ref, sizeof(float), nref, f), nref, "short reference %s", out);
	fclose(f);

	/* RMSNorm: dx and dw accumulate (+=) from zero */
	mr_rmsnorm_fwd(pool, y, rstd, x, w, N, C, EPS);
	memset(dx, 0, sizeof(dx));
	memset(dw, 0, sizeof(dw));
	ws = calloc(mr_rmsnorm_ws_floats(pool, C), sizeof(float));
	mr_rmsnorm_bwd(pool, dx, dw, gy, x, w, rstd, N, C, ws);
	expect_close("rmsnorm y", y, ref, (size_t)N * C, 1e-5f, 1e-6f);
	expect_close("rmsnorm dx", dx, ref + N * C, (size_t)N * C, 1e-4f, 1e-5f);
	expect_close("rmsnorm dw", dw, ref + 2 * N * C, C, 1e-4f, 1e-5f);

	/* SwiGLU */
	mr_swiglu_fwd(pool, sw, ab, N, F);
	mr_swiglu_bwd(pool, dab, ab, gsw, N, F);
	expect_close("swiglu out", sw, ref + 2 * N * C + C, (size_t)N * F, 1e-5f, 1e-6f);
	expect_close("swiglu dab", dab, ref + 2 * N * C + C + N * F, (size_t)N * 2 * F, 1e-5f,
		     1e-6f);

	/* rotary: q's heads inside qkv rows; k and v stay as they were */
	memcpy(orig, qkv, sizeof(float) * N * ROW);
	mr_rope_freqs(inv, D, THETA, NULL);
	mr_rope_freqs(inv_s, D, THETA, &llama31);
	mr_rope_fwd(pool, qkv, ROW, N, H, D, pos, inv);
	mr_rope_bwd(pool, gqkv, ROW, N, H, D, pos, inv);
	{
		const float *rq = ref + 2 * N * C + C + 3 * N * F, *rdq = rq + N * H * D;
		const float *rinv = rdq + N * H * D, *rinv_s = rinv + D / 2;

		for (int n = 0; n < N; n++) {
			char what[64];
			snprintf(what, sizeof(what), "rope q row %d (position %d)", n, pos[n]);
			expect_close(what, qkv + (size_t)n * ROW, rq + (size_t)n * H * D, H * D,
				     1e-5f, 2e-6f);
			snprintf(what, sizeof(what), "rope dq row %d (position %d)", n, pos[n]);
			expect_close(what, gqkv + (size_t)n * ROW, rdq + (size_t)n * H * D, H * D,
				     1e-5f, 2e-6f);
			cr_expect_eq(memcmp(qkv + (size_t)n * ROW + H * D,
					    orig + (size_t)n * ROW + H * D,
					    sizeof(float) * 2 * KV * D),
				     0, "row %d: rotary touched k or v", n);
		}
		expect_close("inv_freq", inv, rinv, D / 2, 1e-6f, 0.0f);
		expect_close("inv_freq scaled (Llama 3.1)", inv_s, rinv_s, D / 2, 1e-6f, 0.0f);
		/* the scaling changes the low frequencies, not the high ones */
		cr_expect_eq(inv_s[0], inv[0]);
		cr_expect_lt(inv_s[D / 2 - 1], inv[D / 2 - 1]);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	cr_expect_eq(system(cmd), 0);
	mr_pool_free(pool);
	free(x), free(w), free(gy), free(ab), free(gsw), free(qkv), free(gqkv), free(q), free(gq);
	free(posf), free(ws), free(ref), free(orig);
}
