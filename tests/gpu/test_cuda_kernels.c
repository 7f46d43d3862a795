/*
 * test_cuda_kernels.c - every non-attention CUDA kernel against its CPU
 * twin (kernels/mr_kernels.h, optim/mr_adamw.h) on random inputs, forward
 * and backward, plus determinism of the reductions.
 *
 * Inputs are rounded to bf16 before both sides see them, so differences
 * come only from bf16 output rounding and fp32 summation order.
 * Tolerances (|gpu - cpu| <= rtol*|cpu| + atol*max|cpu|):
 *   bf16 outputs           rtol 8e-3, atol 1e-3 (one rounding: 2^-9 rel)
 *   bf16 accumulated grads rtol 1e-2, atol 4e-3 (input and output rounded)
 *   fp32 reductions        rtol 1e-4, atol 1e-5 (same inputs, other order)
 *   AdamW fp32 master      rtol 1e-5, atol 1e-6 (same formula; FMA only)
 *   fp32 activations       rtol 1e-5, atol 1e-5 (the same kernels for
 *                          float; TF32 GEMMs would be off by ~1e-3)
 * The device layer's kernels (bias, positions, column fill, copies,
 * foreign tokens, vocab-parallel cross-entropy, NULL GEMM outputs) and
 * the MoE kernels against kernels/moe.c's pieces (routing bit-exact on the
 * same logits: top-k, slots, counts) are here too.
 * Tests skip (not fail) when there is no CUDA device; the bf16 conversion
 * and the no-device path run everywhere.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_harness.h"
#include "kernels/mr_kernels.h"
#include "kernels/mr_moe.h"
#include "model/mr_gpt.h"
#include "optim/mr_adamw.h"

/* n zeros on the host. */
static float *xcopy_zero(size_t n)
{
	return xmalloc(n * sizeof(float));
}

Test(cuda, bf16_conversion_rounds_to_nearest_even)
{
	uint32_t h;

	cr_assert_eq(mr_bf16_from_f32(1.0f), 0x3f80);
	cr_assert_eq(mr_bf16_from_f32(-0.0f), 0x8000);
	/* 1 + half an ulp (2^-8) ties to even 1.0; 1 + 1.5 ulp to 1 + 2 ulp */
	cr_assert_eq(mr_bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);
	cr_assert_eq(mr_bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);
	cr_assert_eq(mr_bf16_from_f32(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
	cr_assert_eq(mr_bf16_from_f32(INFINITY), 0x7f80);
	cr_assert(isnan(mr_bf16_to_f32(mr_bf16_from_f32(NAN))));
	/* the largest finite float rounds up to inf, as on the device */
	cr_assert_eq(mr_bf16_from_f32(3.4028235e38f), 0x7f80);
	for (h = 0; h < 0x10000; h++) {
		float f = mr_bf16_to_f32((mr_bf16)h);
		if (!isnan(f))
			cr_assert_eq(mr_bf16_from_f32(f), h, "bf16 0x%04x does not round-trip", h);
	}
}

Test(cuda, missing_device_is_reported_not_fatal)
{
	struct mr_errbuf eb = { { 0 }, { 0 } }, why = { { 0 }, { 0 } };
	struct mr_cuda *c = NULL;
	int n = mr_cuda_device_count(&why), rc;

	cr_assert_geq(n, 0);
	cr_assert(n > 0 || strstr(why.msg, "no cuda device") != NULL, "reason: '%s'", why.msg);
	rc = mr_cuda_create(&c, n, &eb); /* one past the last device */
	cr_assert_eq(rc, MR_ENOTSUP);
	cr_assert_null(c);
	cr_assert(strstr(eb.msg, "not available") != NULL, "message: %s", eb.msg);
	if (n == 0)
		cr_log_info("no CUDA device here: the kernel comparisons will be skipped");
}

static void matmul_case(int use_lt, int N, int IC, int OC)
{
	float *inp = rand_bf((size_t)N * IC, 1.0f), *w = rand_bf((size_t)OC * IC, 0.1f);
	float *bias = rand_bf(OC, 0.5f), *dout = rand_bf((size_t)N * OC, 1.0f);
	float *dinp0 = rand_bf((size_t)N * IC, 1.0f), *dw0 = rand_bf((size_t)OC * IC, 1.0f);
	float *db0 = rand_bf(OC, 1.0f);
	float *out = xmalloc(sizeof(float) * N * OC), *dinp = xmalloc(sizeof(float) * N * IC);
	float *dw = xmalloc(sizeof(float) * OC * IC), *db = xmalloc(sizeof(float) * OC);
	float *ones = xmalloc(sizeof(float) * N), *g;
	mr_bf16 *d_out = dev_alloc(sizeof(mr_bf16) * N * OC), *d_inp = up_bf(inp, (size_t)N * IC);
	mr_bf16 *d_w = up_bf(w, (size_t)OC * IC), *d_b = up_bf(bias, OC);
	mr_bf16 *d_dout = up_bf(dout, (size_t)N * OC), *d_dinp = up_bf(dinp0, (size_t)N * IC);
	float *d_dw = up_f32(dw0, (size_t)OC * IC), *d_db = up_f32(db0, OC);
	int i;

	if (!use_lt)
		mr_cuda_disable_lt(cu);
	for (i = 0; i < N; i++)
		ones[i] = 1.0f;
	mr_matmul_fwd(NULL, out, inp, w, bias, N, IC, OC);
	CU_OK(mr_cuda_matmul_fwd(cu, d_out, d_inp, d_w, d_b, N, IC, OC));
	g = down_bf(d_out, (size_t)N * OC);
	check_close("matmul out", g, out, (size_t)N * OC, BF_RTOL, BF_ATOL);
	free(g);

	memcpy(dinp, dinp0, sizeof(float) * N * IC);
	memcpy(dw, dw0, sizeof(float) * OC * IC);
	memcpy(db, db0, sizeof(float) * OC);
	mr_matmul_bwd(NULL, dinp, dw, db, dout, inp, w, N, IC, OC, 1, ones);
	CU_OK(mr_cuda_matmul_bwd(cu, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, IC, OC, 1));
	g = down_bf(d_dinp, (size_t)N * IC);
	check_close("matmul dinp", g, dinp, (size_t)N * IC, 1e-2, 4e-3);
	free(g);
	g = down_f32(d_dw, (size_t)OC * IC);
	check_close("matmul dw", g, dw, (size_t)OC * IC, 1e-4, 1e-5);
	free(g);
	g = down_f32(d_db, OC);
	check_close("matmul dbias", g, db, OC, 1e-4, 1e-5);
	free(g);
}

Test(cuda, matmul_cublaslt_matches_cpu)
{
	const char *why = "";

	need_gpu();
	cr_assert(mr_cuda_using_lt(cu), "cuBLASLt not in use");
	matmul_case(1, 70, 96, 136);
	/* again: the second run reuses each shape's cached plan */
	matmul_case(1, 70, 96, 136);
	cr_expect_eq(mr_cuda_lt_fallbacks(cu, &why), 0, "the fast path did not run: %s", why);
	gpu_teardown();
}

/* GPT-2 124M's GEMM shapes in bf16 (one sequence of T 1024 rows): each
 * runs through cuBLASLt, none through the fallback. */
Test(cuda, matmul_gpt2_shapes_take_the_cublaslt_path)
{
	static const int shapes[][2] = { { 768, 2304 }, { 768, 768 }, { 768, 3072 },
					 { 3072, 768 }, { 768, 50304 } };
	const char *why = "";

	need_gpu();
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		matmul_case(1, 1024, shapes[i][0], shapes[i][1]);
	cr_expect_eq(mr_cuda_lt_fallbacks(cu, &why), 0, "the fast path did not run: %s", why);
	gpu_teardown();
}

/* The MLP output GEMM's backward with the GELU's gradient in its epilogue
 * (GPT-2 124M's shape, and an odd one), against the CPU's GEMM then GELU
 * backward; the poisoned dinp must be overwritten; no fallback. */
static void dgelu_case(int N, int IC, int OC)
{
	size_t ni = (size_t)N * IC, no = (size_t)N * OC;
	float *inp = rand_bf(ni, 1.0f), *w = rand_bf((size_t)OC * IC, 0.1f);
	float *pre = rand_bf(ni, 2.0f), *dout = rand_bf(no, 1.0f);
	float *dinp = xmalloc(ni * sizeof(float)), *dw = xmalloc((size_t)OC * IC * sizeof(float));
	float *ones = xmalloc(sizeof(float) * N), *g;
	mr_bf16 *d_inp = up_bf(inp, ni), *d_w = up_bf(w, (size_t)OC * IC);
	mr_bf16 *d_pre = up_bf(pre, ni), *d_dout = up_bf(dout, no), *d_dinp;
	float *d_dw;
	int i;

	memset(dw, 0, (size_t)OC * IC * sizeof(float));
	d_dw = up_f32(dw, (size_t)OC * IC);
	for (i = 0; i < N; i++)
		ones[i] = 1.0f;
	for (size_t j = 0; j < ni; j++)
		dinp[j] = NAN; /* poison: every element must be written */
	d_dinp = up_bf(dinp, ni);
	memset(dinp, 0, ni * sizeof(float));
	mr_matmul_bwd(NULL, dinp, dw, NULL, dout, inp, w, N, IC, OC, 0, ones);
	mr_gelu_bwd(NULL, dinp, pre, dinp, ni);
	CU_OK(mr_cuda_matmul_dgelu_bwd(cu, d_dinp, d_dw, NULL, d_dout, d_inp, d_w, d_pre, N, IC,
				       OC));
	g = down_bf(d_dinp, ni);
	check_close("dgelu dinp", g, dinp, ni, 1e-2, 4e-3);
	free(g);
	g = down_f32(d_dw, (size_t)OC * IC);
	check_close("dgelu dw", g, dw, (size_t)OC * IC, 1e-4, 1e-5);
	free(g);
	free(inp);
	free(w);
	free(pre);
	free(dout);
	free(dinp);
	free(dw);
	free(ones);
}

Test(cuda, matmul_dgelu_epilogue_matches_cpu)
{
	const char *why = "";

	need_gpu();
	cr_assert(mr_cuda_using_lt(cu), "cuBLASLt not in use");
	dgelu_case(1024, 3072, 768);
	dgelu_case(70, 96, 136);
	cr_expect_eq(mr_cuda_lt_fallbacks(cu, &why), 0, "the epilogue did not run: %s", why);
	gpu_teardown();
}

/* The MLP's first GEMM with the GELU in its epilogue (GELU_AUX_BIAS), one
 * GEMM or a strided batch of them, against the CPU's GEMM then GELU: the
 * GELU's input (pre) and output, both poisoned first so an unwritten
 * element fails (fp32 activations: fp32_activations_match_cpu_without_tf32). */
static void gelu_fwd_case(int batch, int N, int IC, int OC)
{
	size_t ni = (size_t)batch * N * IC, no = (size_t)batch * N * OC, iw = (size_t)OC * IC;
	float *inp = rand_bf(ni, 1.0f), *w = rand_bf(iw * batch, 0.1f);
	float *bias = rand_bf((size_t)batch * OC, 0.5f), *pre = xmalloc(no * sizeof(float));
	float *out = xmalloc(no * sizeof(float)), *poison = xmalloc(no * sizeof(float)), *g;
	mr_bf16 *d_inp = up_bf(inp, ni), *d_w = up_bf(w, iw * batch);
	mr_bf16 *d_b = up_bf(bias, (size_t)batch * OC), *d_pre, *d_out;

	for (size_t j = 0; j < no; j++)
		poison[j] = NAN;
	d_pre = up_bf(poison, no);
	d_out = up_bf(poison, no);
	for (int b = 0; b < batch; b++)
		mr_matmul_fwd(NULL, pre + (size_t)b * N * OC, inp + (size_t)b * N * IC, w + b * iw,
			      bias + (size_t)b * OC, N, IC, OC);
	mr_gelu_fwd(NULL, out, pre, no);
	if (batch == 1)
		CU_OK(mr_cuda_matmul_gelu_fwd(cu, d_out, d_pre, d_inp, d_w, d_b, N, IC, OC));
	else
		CU_OK(mr_cuda_matmul_gelu_fwd_batched(cu, d_out, d_pre, d_inp, d_w, d_b, batch, N,
						      IC, OC));
	g = down_bf(d_pre, no);
	check_close("gelu epilogue pre", g, pre, no, BF_RTOL, BF_ATOL);
	free(g);
	g = down_bf(d_out, no);
	check_close("gelu epilogue out", g, out, no, BF_RTOL, BF_ATOL);
	free(g);
	free(inp);
	free(w);
	free(bias);
	free(pre);
	free(out);
	free(poison);
}

Test(cuda, matmul_gelu_epilogue_matches_cpu)
{
	const char *why = "";

	need_gpu();
	cr_assert(mr_cuda_using_lt(cu), "cuBLASLt not in use");
	gelu_fwd_case(1, 1024, 768, 3072); /* GPT-2 124M's fc, one sequence */
	gelu_fwd_case(1, 70, 96, 136);
	gelu_fwd_case(4, 24, 64, 256); /* a MoE layer's experts */
	cr_expect_eq(mr_cuda_lt_fallbacks(cu, &why), 0, "the epilogue did not run: %s", why);
	gpu_teardown();
}

/* The strided-batched GEMMs (the MoE experts'): batch items of (N, IC) x
 * (OC, IC) with their own weights and biases, each against the CPU twin
 * on its slices - forward with bias, backward dinp (=), dw and dbias
 * (+=), and the DGELU variant (poisoned dinp, every element written). */
static void batched_case(int use_lt, int batch, int N, int IC, int OC)
{
	size_t ni = (size_t)batch * N * IC, no = (size_t)batch * N * OC;
	size_t nw = (size_t)batch * OC * IC, nb = (size_t)batch * OC, iw = (size_t)OC * IC;
	float *inp = rand_bf(ni, 1.0f), *w = rand_bf(nw, 0.1f), *bias = rand_bf(nb, 0.5f);
	float *dout = rand_bf(no, 1.0f), *pre = rand_bf(ni, 2.0f), *dw0 = rand_bf(nw, 1.0f);
	float *db0 = rand_bf(nb, 1.0f), *out = xmalloc(sizeof(float) * no);
	float *dinp = xmalloc(sizeof(float) * ni), *dg = xmalloc(sizeof(float) * ni);
	float *dw = xmalloc(sizeof(float) * nw), *db = xmalloc(sizeof(float) * nb);
	float *ones = xmalloc(sizeof(float) * N), *poison = xmalloc(sizeof(float) * ni), *g;
	mr_bf16 *d_out = dev_alloc(sizeof(mr_bf16) * no), *d_inp = up_bf(inp, ni);
	mr_bf16 *d_w = up_bf(w, nw), *d_b = up_bf(bias, nb), *d_dout = up_bf(dout, no);
	mr_bf16 *d_pre = up_bf(pre, ni), *d_dinp, *d_dg;
	float *d_dw = up_f32(dw0, nw), *d_db = up_f32(db0, nb);
	int b, i;

	if (!use_lt)
		mr_cuda_disable_lt(cu);
	for (i = 0; i < N; i++)
		ones[i] = 1.0f;
	for (size_t j = 0; j < ni; j++)
		poison[j] = NAN;
	d_dinp = up_bf(poison, ni);
	d_dg = up_bf(poison, ni);
	memcpy(dw, dw0, sizeof(float) * nw);
	memcpy(db, db0, sizeof(float) * nb);
	for (b = 0; b < batch; b++) {
		size_t oi = (size_t)b * N * IC, oo = (size_t)b * N * OC;
		mr_matmul_fwd(NULL, out + oo, inp + oi, w + b * iw, bias + (size_t)b * OC, N, IC,
			      OC);
		memset(dinp + oi, 0, sizeof(float) * N * IC);
		mr_matmul_bwd(NULL, dinp + oi, dw + b * iw, db + (size_t)b * OC, dout + oo,
			      inp + oi, w + b * iw, N, IC, OC, 0, ones);
		memcpy(dg + oi, dinp + oi, sizeof(float) * N * IC);
		mr_gelu_bwd(NULL, dg + oi, pre + oi, dg + oi, (size_t)N * IC);
	}
	CU_OK(mr_cuda_matmul_fwd_batched(cu, d_out, d_inp, d_w, d_b, batch, N, IC, OC));
	CU_OK(mr_cuda_matmul_bwd_batched(cu, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, batch, N, IC,
					 OC));
	CU_OK(mr_cuda_matmul_dgelu_bwd_batched(cu, d_dg, NULL, NULL, d_dout, d_inp, d_w, d_pre,
					       batch, N, IC, OC));
	g = down_bf(d_out, no);
	check_close("batched out", g, out, no, BF_RTOL, BF_ATOL);
	free(g);
	g = down_bf(d_dinp, ni);
	check_close("batched dinp", g, dinp, ni, 1e-2, 4e-3);
	free(g);
	g = down_bf(d_dg, ni);
	check_close("batched dgelu dinp", g, dg, ni, 1e-2, 4e-3);
	free(g);
	g = down_f32(d_dw, nw);
	check_close("batched dw", g, dw, nw, 1e-4, 1e-5);
	free(g);
	g = down_f32(d_db, nb);
	check_close("batched dbias", g, db, nb, 1e-4, 1e-5);
	free(g);
	free(inp);
	free(w);
	free(bias);
	free(dout);
	free(pre);
	free(dw0);
	free(db0);
	free(out);
	free(dinp);
	free(dg);
	free(dw);
	free(db);
	free(ones);
	free(poison);
}

Test(cuda, matmul_batched_matches_cpu_per_item)
{
	const char *why = "";

	need_gpu();
	cr_assert(mr_cuda_using_lt(cu), "cuBLASLt not in use");
	batched_case(1, 4, 24, 64, 256); /* a MoE layer's experts: (E, cap, C) */
	batched_case(1, 4, 24, 256, 64);
	cr_expect_eq(mr_cuda_lt_fallbacks(cu, &why), 0, "the fast path did not run: %s", why);
	batched_case(0, 3, 70, 96, 136); /* cublasGemmStridedBatchedEx */
	gpu_teardown();
}

Test(cuda, matmul_cublas_fallback_matches_cpu)
{
	need_gpu();
	matmul_case(0, 70, 96, 136);
	cr_assert_not(mr_cuda_using_lt(cu));
	gpu_teardown();
}

Test(cuda, matmul_f32_matches_cpu)
{
	int N = 33, IC = 40, OC = 24;
	float *inp, *w, *bias, *out, *d_out, *g;

	need_gpu();
	inp = rand_bf((size_t)N * IC, 1.0f);
	w = rand_bf((size_t)OC * IC, 0.2f);
	bias = rand_bf(OC, 1.0f);
	out = xmalloc(sizeof(float) * N * OC);
	d_out = dev_alloc(sizeof(float) * N * OC);
	mr_matmul_fwd(NULL, out, inp, w, bias, N, IC, OC);
	CU_OK(mr_cuda_matmul_fwd_f32(cu, d_out, up_f32(inp, (size_t)N * IC),
				     up_f32(w, (size_t)OC * IC), up_f32(bias, OC), N, IC, OC));
	g = down_f32(d_out, (size_t)N * OC);
	check_close("matmul_f32 out", g, out, (size_t)N * OC, 1e-5, 1e-6);
	gpu_teardown();
}

Test(cuda, encoder_matches_cpu_and_is_deterministic)
{
	int B = 3, T = 40, C = 72, V = 11, N = B * T, i;
	float *wte, *wpe, *dout, *out, *dwte, *dwte0, *dwpe, *g, *g2;
	int *tok = xmalloc(sizeof(int) * N);
	mr_bf16 *d_out;
	float *d_dwte, *d_dwpe;

	need_gpu();
	wte = rand_bf((size_t)V * C, 1.0f);
	wpe = rand_bf((size_t)T * C, 1.0f);
	dout = rand_bf((size_t)N * C, 1.0f);
	out = xmalloc(sizeof(float) * N * C);
	dwte = rand_bf((size_t)V * C, 1.0f);
	dwte0 = xmalloc(sizeof(float) * V * C);
	memcpy(dwte0, dwte, sizeof(float) * V * C);
	dwpe = rand_bf((size_t)T * C, 1.0f);
	for (i = 0; i < N; i++) /* small vocab: many repeats; token 10 never used */
		tok[i] = (int)mr_rng_below(&rng, (uint64_t)V - 1);
	d_out = dev_alloc(sizeof(mr_bf16) * N * C);
	d_dwte = up_f32(dwte, (size_t)V * C);
	d_dwpe = up_f32(dwpe, (size_t)T * C);
	mr_encoder_fwd(NULL, out, tok, wte, wpe, B, T, C);
	CU_OK(mr_cuda_encoder_fwd(cu, d_out, up_int(tok, N), up_bf(wte, (size_t)V * C),
				  up_bf(wpe, (size_t)T * C), B, T, C));
	g = down_bf(d_out, (size_t)N * C);
	check_close("encoder out", g, out, (size_t)N * C, BF_RTOL, BF_ATOL);

	mr_encoder_bwd(NULL, dwte, dwpe, dout, tok, B, T, C);
	CU_OK(mr_cuda_encoder_bwd(cu, d_dwte, d_dwpe, up_bf(dout, (size_t)N * C), tok, B, T, C,
				  V));
	g = down_f32(d_dwte, (size_t)V * C);
	check_close("encoder dwte", g, dwte, (size_t)V * C, 1e-4, 1e-5);
	check_close("encoder dwpe", down_f32(d_dwpe, (size_t)T * C), dwpe, (size_t)T * C, 1e-4,
		    1e-5);

	/* same inputs again from the same start: bit-identical */
	cr_assert_eq(mr_cuda_upload(cu, d_dwte, dwte0, sizeof(float) * V * C), 0);
	CU_OK(mr_cuda_encoder_bwd(cu, d_dwte, d_dwpe, up_bf(dout, (size_t)N * C), tok, B, T, C,
				  V));
	g2 = down_f32(d_dwte, (size_t)V * C);
	cr_assert(memcmp(g, g2, sizeof(float) * V * C) == 0, "encoder dwte not deterministic");
	tok[0] = V; /* out of range: named error, nothing launched */
	cr_assert_eq(mr_cuda_encoder_bwd(cu, d_dwte, d_dwpe, d_out, tok, B, T, C, V), MR_ERANGE);
	cr_assert(strstr(mr_cuda_errmsg(cu), "out of range") != NULL);
	gpu_teardown();
}

static void layernorm_case(int N, int C)
{
	float *inp, *w, *b, *dout, *out, *mean, *rstd, *dinp, *dw, *db, *ws, *g;
	mr_bf16 *d_inp, *d_w, *d_out, *d_dinp;
	float *d_mean, *d_rstd, *d_dw, *d_db;

	inp = rand_bf((size_t)N * C, 2.0f);
	w = rand_bf(C, 1.0f);
	b = rand_bf(C, 1.0f);
	dout = rand_bf((size_t)N * C, 1.0f);
	dinp = rand_bf((size_t)N * C, 1.0f);
	dw = rand_bf(C, 1.0f);
	db = rand_bf(C, 1.0f);
	out = xmalloc(sizeof(float) * N * C);
	mean = xmalloc(sizeof(float) * N);
	rstd = xmalloc(sizeof(float) * N);
	ws = xmalloc(sizeof(float) * mr_layernorm_ws_floats(NULL, C));
	d_inp = up_bf(inp, (size_t)N * C);
	d_w = up_bf(w, C);
	d_out = dev_alloc(sizeof(mr_bf16) * N * C);
	d_mean = dev_alloc(sizeof(float) * N);
	d_rstd = dev_alloc(sizeof(float) * N);
	d_dinp = up_bf(dinp, (size_t)N * C);
	d_dw = up_f32(dw, C);
	d_db = up_f32(db, C);

	mr_layernorm_fwd(NULL, out, mean, rstd, inp, w, b, N, C);
	CU_OK(mr_cuda_layernorm_fwd(cu, d_out, d_mean, d_rstd, d_inp, d_w, up_bf(b, C), N, C));
	g = down_bf(d_out, (size_t)N * C);
	check_close("layernorm out", g, out, (size_t)N * C, BF_RTOL, BF_ATOL);
	check_close("layernorm mean", down_f32(d_mean, N), mean, N, 1e-4, 1e-5);
	check_close("layernorm rstd", down_f32(d_rstd, N), rstd, N, 1e-4, 1e-5);

	mr_layernorm_bwd(NULL, dinp, dw, db, dout, inp, w, mean, rstd, N, C, ws);
	CU_OK(mr_cuda_layernorm_bwd(cu, d_dinp, d_dw, d_db, up_bf(dout, (size_t)N * C), d_inp,
				    d_w, d_mean, d_rstd, N, C));
	check_close("layernorm dinp", down_bf(d_dinp, (size_t)N * C), dinp, (size_t)N * C, 1e-2,
		    4e-3);
	check_close("layernorm dw", down_f32(d_dw, C), dw, C, 1e-4, 1e-5);
	check_close("layernorm db", down_f32(d_db, C), db, C, 1e-4, 1e-5);
}

Test(cuda, layernorm_matches_cpu)
{
	need_gpu();
	layernorm_case(37, 200); /* packed: 16-byte loads */
	layernorm_case(37, 196); /* element by element */
	gpu_teardown();
}

/* Device buffers a and b of n values (bf16, or fp32) hold the same bytes. */
static void same_bytes(const char *what, const void *a, const void *b, size_t n, int bf16)
{
	float *x = bf16 ? down_bf((const mr_bf16 *)a, n) : down_f32((const float *)a, n);
	float *y = bf16 ? down_bf((const mr_bf16 *)b, n) : down_f32((const float *)b, n);

	cr_assert(!memcmp(x, y, n * sizeof(float)), "the fused %s differs", what);
	free(x);
	free(y);
}

/* The residual add fused into the LayerNorm gives the two kernels' bits:
 * the sum, the output and the statistics (GPT-2's width and an odd one). */
static void add_layernorm_case(int N, int C)
{
	size_t n = (size_t)N * C;
	float *y = rand_bf(n, 1.0f), *x = rand_bf(n, 1.0f), *w = rand_bf(C, 1.0f);
	float *b = rand_bf(C, 1.0f);
	mr_bf16 *dy1 = up_bf(y, n), *dy2 = up_bf(y, n), *dx = up_bf(x, n), *dw = up_bf(w, C);
	mr_bf16 *db = up_bf(b, C), *o1 = dev_alloc(n * sizeof(mr_bf16));
	mr_bf16 *o2 = dev_alloc(n * sizeof(mr_bf16));
	float *m1 = dev_alloc(N * sizeof(float)), *r1 = dev_alloc(N * sizeof(float));
	float *m2 = dev_alloc(N * sizeof(float)), *r2 = dev_alloc(N * sizeof(float));

	CU_OK(mr_cuda_add_inplace(cu, dy1, dx, n));
	CU_OK(mr_cuda_layernorm_fwd(cu, o1, m1, r1, dy1, dw, db, N, C));
	CU_OK(mr_cuda_add_layernorm_fwd(cu, dy2, o2, m2, r2, dx, dw, db, N, C));
	same_bytes("sum", dy1, dy2, n, 1);
	same_bytes("norm", o1, o2, n, 1);
	same_bytes("rstd", r1, r2, N, 0);
	same_bytes("mean", m1, m2, N, 0);
	free(y);
	free(x);
	free(w);
	free(b);
}

/* GELU forward and backward and the add through the packed path (16-byte
 * loads: n a multiple of 8 and not, whole packs and a tail) and the
 * element path (views one element off alignment), bf16, against their CPU
 * twins; outputs poisoned (NaN) first, so a missed element fails. */
static void elementwise_case(size_t n, size_t off)
{
	float *a = rand_bf(n, 3.0f), *b = rand_bf(n, 1.0f), *want = xmalloc(n * sizeof(float));
	float *nan = xmalloc((n + off) * sizeof(float)), *g;
	mr_bf16 *da = up_bf(a, n), *db = up_bf(b, n), *buf;
	size_t i;

	for (i = 0; i < n + off; i++)
		nan[i] = NAN;
	buf = up_bf(nan, n + off); /* the output view starts off elements in */
	mr_gelu_fwd(NULL, want, a, n);
	CU_OK(mr_cuda_gelu_fwd(cu, buf + off, da, n));
	g = down_bf(buf + off, n);
	check_close("gelu_fwd", g, want, n, 1e-2, 1e-3);
	free(g);
	mr_gelu_bwd(NULL, want, a, b, n);
	CU_OK(mr_cuda_gelu_bwd(cu, buf + off, da, db, n));
	g = down_bf(buf + off, n);
	check_close("gelu_bwd", g, want, n, 1e-2, 1e-3);
	free(g);
	mr_residual_fwd(NULL, want, a, b, n);
	CU_OK(mr_cuda_residual_fwd(cu, buf + off, da, db, n));
	g = down_bf(buf + off, n);
	check_close("add", g, want, n, 1e-2, 1e-3);
	free(g);
	free(a);
	free(b);
	free(want);
	free(nan);
}

Test(cuda, elementwise_packed_and_unaligned_match_cpu)
{
	static const size_t sizes[] = { 1, 7, 8, 9, 4096, 1000003 };

	need_gpu();
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		elementwise_case(sizes[i], 0);
		elementwise_case(sizes[i], 1);
	}
	gpu_teardown();
}

Test(cuda, add_layernorm_is_add_then_layernorm_bit_for_bit)
{
	need_gpu();
	add_layernorm_case(1024, 768); /* packed */
	add_layernorm_case(37, 196);   /* not a whole number of 16-byte packs */
	gpu_teardown();
}

/* RMSNorm, rotary (H heads of hd inside rows of ROW, far positions out of
 * order, Llama 3.1's scaled frequencies) and SwiGLU against their CPU
 * twins, bf16 activations. */
static void llama_case(int N, int C, int H, int HD, int ROW, int F)
{
	static const struct mr_rope_scaling sc = { 8.0f, 1.0f, 4.0f, 8192 };
	float *inp, *w, *dout, *out, *rstd, *dinp, *dw, *ws, *x, *dx, *ab, *gs, *sw, *dab;
	float *inv = xmalloc(sizeof(float) * (size_t)HD / 2);
	int *pos = xmalloc(sizeof(int) * (size_t)N), i;
	mr_bf16 *d_inp, *d_w, *d_out, *d_dinp, *d_x, *d_dx, *d_ab, *d_sw, *d_dab;
	float *d_rstd, *d_dw, *d_inv;
	int *d_pos;

	/* RMSNorm */
	inp = rand_bf((size_t)N * C, 2.0f);
	w = rand_bf(C, 1.0f);
	dout = rand_bf((size_t)N * C, 1.0f);
	dinp = rand_bf((size_t)N * C, 1.0f);
	dw = rand_bf(C, 1.0f);
	out = xmalloc(sizeof(float) * N * C);
	rstd = xmalloc(sizeof(float) * N);
	ws = xmalloc(sizeof(float) * mr_rmsnorm_ws_floats(NULL, C));
	d_inp = up_bf(inp, (size_t)N * C);
	d_w = up_bf(w, C);
	d_out = dev_alloc(sizeof(mr_bf16) * N * C);
	d_rstd = dev_alloc(sizeof(float) * N);
	d_dinp = up_bf(dinp, (size_t)N * C);
	d_dw = up_f32(dw, C);
	mr_rmsnorm_fwd(NULL, out, rstd, inp, w, N, C, 1e-5f);
	CU_OK(mr_cuda_rmsnorm_fwd(cu, d_out, d_rstd, d_inp, d_w, N, C, 1e-5f));
	check_close("rmsnorm out", down_bf(d_out, (size_t)N * C), out, (size_t)N * C, BF_RTOL,
		    BF_ATOL);
	check_close("rmsnorm rstd", down_f32(d_rstd, N), rstd, N, 1e-4, 1e-5);
	mr_rmsnorm_bwd(NULL, dinp, dw, dout, inp, w, rstd, N, C, ws);
	CU_OK(mr_cuda_rmsnorm_bwd(cu, d_dinp, d_dw, up_bf(dout, (size_t)N * C), d_inp, d_w,
				  d_rstd, N, C));
	check_close("rmsnorm dinp", down_bf(d_dinp, (size_t)N * C), dinp, (size_t)N * C, 1e-2,
		    4e-3);
	check_close("rmsnorm dw", down_f32(d_dw, C), dw, C, 1e-4, 1e-5);

	/* rotary: the first H heads of each ROW-wide row; the rest untouched */
	for (i = 0; i < N; i++)
		pos[i] = (i * 977 + 13) % 131072;
	mr_rope_freqs(inv, HD, 500000.0f, &sc);
	x = rand_bf((size_t)N * ROW, 1.0f);
	dx = rand_bf((size_t)N * ROW, 1.0f);
	d_x = up_bf(x, (size_t)N * ROW);
	d_dx = up_bf(dx, (size_t)N * ROW);
	d_pos = up_int(pos, N);
	d_inv = up_f32(inv, (size_t)HD / 2);
	mr_rope_fwd(NULL, x, ROW, N, H, HD, pos, inv);
	mr_rope_bwd(NULL, dx, ROW, N, H, HD, pos, inv);
	CU_OK(mr_cuda_rope_fwd(cu, d_x, ROW, N, H, HD, d_pos, d_inv));
	CU_OK(mr_cuda_rope_bwd(cu, d_dx, ROW, N, H, HD, d_pos, d_inv));
	check_close("rope x", down_bf(d_x, (size_t)N * ROW), x, (size_t)N * ROW, BF_RTOL, BF_ATOL);
	check_close("rope dx", down_bf(d_dx, (size_t)N * ROW), dx, (size_t)N * ROW, BF_RTOL,
		    BF_ATOL);

	/* SwiGLU, the backward in place as a model would run it */
	ab = rand_bf((size_t)N * 2 * F, 4.0f);
	gs = rand_bf((size_t)N * F, 1.0f);
	sw = xmalloc(sizeof(float) * N * F);
	dab = xmalloc(sizeof(float) * N * 2 * F);
	d_ab = up_bf(ab, (size_t)N * 2 * F);
	d_sw = dev_alloc(sizeof(mr_bf16) * N * F);
	d_dab = d_ab;
	mr_swiglu_fwd(NULL, sw, ab, N, F);
	mr_swiglu_bwd(NULL, dab, ab, gs, N, F);
	CU_OK(mr_cuda_swiglu_fwd(cu, d_sw, d_ab, N, F));
	check_close("swiglu out", down_bf(d_sw, (size_t)N * F), sw, (size_t)N * F, BF_RTOL,
		    BF_ATOL);
	CU_OK(mr_cuda_swiglu_bwd(cu, d_dab, d_ab, up_bf(gs, (size_t)N * F), N, F));
	check_close("swiglu dab", down_bf(d_dab, (size_t)N * 2 * F), dab, (size_t)N * 2 * F,
		    1e-2, 4e-3);
	free(inv);
	free(pos);
}

/* Both paths of each kernel: rows of whole 16-byte packs (Llama's
 * shapes), and widths that are not (element by element). */
Test(cuda, llama_kernels_match_cpu)
{
	need_gpu();
	llama_case(300, 512, 4, 128, 8 * 128, 704);
	llama_case(37, 100, 3, 36, 4 * 36 + 2, 100);
	gpu_teardown();
}

Test(cuda, gelu_residual_add_match_cpu)
{
	size_t n = 5000;
	float *x, *y, *dout, *out, *din;
	mr_bf16 *d_x, *d_o, *d_do;

	need_gpu();
	x = rand_bf(n, 2.0f);
	y = rand_bf(n, 1.0f);
	dout = rand_bf(n, 1.0f);
	out = xmalloc(sizeof(float) * n);
	din = xmalloc(sizeof(float) * n);
	d_x = up_bf(x, n);
	d_o = dev_alloc(sizeof(mr_bf16) * n);
	d_do = up_bf(dout, n);

	mr_gelu_fwd(NULL, out, x, n);
	CU_OK(mr_cuda_gelu_fwd(cu, d_o, d_x, n));
	check_close("gelu out", down_bf(d_o, n), out, n, BF_RTOL, BF_ATOL);
	mr_gelu_bwd(NULL, din, x, dout, n);
	CU_OK(mr_cuda_gelu_bwd(cu, d_do, d_x, d_do, n)); /* in place, as the model does */
	check_close("gelu dinp", down_bf(d_do, n), din, n, BF_RTOL, BF_ATOL);

	mr_residual_fwd(NULL, out, x, y, n);
	CU_OK(mr_cuda_residual_fwd(cu, d_o, d_x, up_bf(y, n), n));
	check_close("residual", down_bf(d_o, n), out, n, BF_RTOL, BF_ATOL);
	mr_add_inplace(NULL, out, y, n); /* out = x + y + y */
	CU_OK(mr_cuda_add_inplace(cu, d_o, up_bf(y, n), n));
	check_close("add_inplace", down_bf(d_o, n), out, n, 1e-2, 2e-3);
	gpu_teardown();
}

static void crossentropy_case(int N, int V)
{
	float *logits, *losses, *lse, *d_losses, *d_lse;
	int *tgt = xmalloc(sizeof(int) * N), *d_tgt, i;
	mr_bf16 *d_logits;

	logits = rand_bf((size_t)N * V, 3.0f);
	losses = xmalloc(sizeof(float) * N);
	lse = xmalloc(sizeof(float) * N);
	for (i = 0; i < N; i++)
		tgt[i] = (int)mr_rng_below(&rng, (uint64_t)V);
	d_logits = up_bf(logits, (size_t)N * V);
	d_tgt = up_int(tgt, N);
	d_losses = dev_alloc(sizeof(float) * N);
	d_lse = dev_alloc(sizeof(float) * N);

	mr_crossentropy_fwd(NULL, losses, lse, logits, tgt, N, V);
	CU_OK(mr_cuda_crossentropy_fwd(cu, d_losses, d_lse, d_logits, d_tgt, N, V));
	check_close("ce losses", down_f32(d_losses, N), losses, N, 1e-5, 1e-5);
	check_close("ce lse", down_f32(d_lse, N), lse, N, 1e-5, 1e-5);
	mr_crossentropy_bwd_inplace(NULL, logits, lse, tgt, N, V, 1.0f / N);
	CU_OK(mr_cuda_crossentropy_bwd_inplace(cu, d_logits, d_lse, d_tgt, N, V, 1.0f / N));
	check_close("ce dlogits", down_bf(d_logits, (size_t)N * V), logits, (size_t)N * V,
		    BF_RTOL, BF_ATOL);
}

Test(cuda, crossentropy_matches_cpu)
{
	need_gpu();
	crossentropy_case(19, 1000);
	gpu_teardown();
}

/* The shapes a GPT-2 124M step runs (T 1024, C 768, the MLP's 3072,
 * vocab 50304) and rows past 65,535 (a grid's y and z limit): what the
 * small cases above cannot show. Part of make test-gpu and of the device
 * script (scripts/device-run.sh). */
Test(cuda, real_shapes_match_cpu, .timeout = 600)
{
	need_gpu();
	matmul_case(1, 2048, 768, 3072);
	matmul_case(1, 70000, 64, 96);
	layernorm_case(70000, 768);
	crossentropy_case(64, 50304);
	crossentropy_case(70000, 64);
	gpu_teardown();
}

Test(cuda, adamw_matches_cpu)
{
	struct mr_adamw_config cfg = { 1e-3f, 0.1f, 2, 10, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f,
					MR_LR_COSINE, 0.0f };
	size_t n0 = 300, n1 = 77, n = n0 + n1, i;
	float *p, *g, *m, *v, *d_p, *d_g, *d_m, *d_v;
	mr_bf16 *d_pb;
	long step;

	need_gpu();
	p = rand_bf(n, 1.0f);
	g = rand_bf(n, 0.1f);
	m = xmalloc(2 * n * sizeof(float));
	memset(m, 0, 2 * n * sizeof(float));
	v = m + n;
	d_p = up_f32(p, n);
	d_g = up_f32(g, n);
	d_m = up_f32(m, n);
	d_v = up_f32(v, n);
	d_pb = dev_alloc(n * sizeof(mr_bf16));
	for (step = 0; step < 3; step++) {
		float lr = mr_lr_at(&cfg, step);
		struct mr_cuda_adamw o = { lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
					   step + 1, 1.0f };

		/* the twin: a decayed range and one without decay */
		mr_adamw_update_range(&cfg, step + 1, lr, p, g, m, v, n0, 1);
		mr_adamw_update_range(&cfg, step + 1, lr, p + n0, g + n0, m + n0, v + n0, n1, 0);
		CU_OK(mr_cuda_adamw_step(cu, d_p, d_pb, d_g, d_m, d_v, n0, &o));
		o.weight_decay = 0.0f;
		CU_OK(mr_cuda_adamw_step(cu, d_p + n0, d_pb + n0, d_g + n0, d_m + n0, d_v + n0, n1,
					 &o));
	}
	{
		float *gp = down_f32(d_p, n), *gb = down_bf(d_pb, n);
		check_close("adamw p", gp, p, n, 1e-5, 1e-6);
		check_close("adamw m", down_f32(d_m, n), m, n, 1e-5, 1e-6);
		check_close("adamw v", down_f32(d_v, n), v, n, 1e-5, 1e-6);
		for (i = 0; i < n; i++)
			cr_assert_eq(mr_bf16_from_f32(gp[i]), mr_bf16_from_f32(gb[i]),
				     "bf16 copy [%zu] is not the rounded master weight", i);
	}
	gpu_teardown();
}

Test(cuda, grad_norm_matches_cpu_and_is_deterministic)
{
	size_t n = 1000003, i;
	float *g, *d_g, *h;
	double s1 = 0.0, s2 = -1.0, ref;

	need_gpu();
	g = rand_bf(n, 0.01f);
	d_g = up_f32(g, n);
	ref = mr_grad_sumsq(g, n);
	cr_assert_eq(mr_cuda_grad_sumsq(cu, d_g, n, &s1), 0, "%s", mr_cuda_errmsg(cu));
	cr_assert_eq(mr_cuda_grad_sumsq(cu, d_g, n, &s2), 0, "%s", mr_cuda_errmsg(cu));
	cr_assert(fabs(s1 - ref) <= 1e-5 * ref, "sumsq gpu %.10g cpu %.10g", s1, ref);
	cr_assert(s1 == s2, "two runs differ: %.17g vs %.17g", s1, s2);
	{
		/* several ranges at once, one empty (the step's per-tensor norms) */
		size_t off[4] = { 0, 1000, 1000, 5000 }, len[4] = { 1000, 0, 4000, n - 5000 };
		double got[4], want;
		int r;
		cr_assert_eq(mr_cuda_grad_sumsq_ranges(cu, d_g, off, len, 4, got), 0, "%s",
			     mr_cuda_errmsg(cu));
		for (r = 0; r < 4; r++) {
			want = mr_grad_sumsq(g + off[r], len[r]);
			cr_assert(fabs(got[r] - want) <= 1e-5 * want, "range %d: gpu %.10g cpu %.10g",
				  r, got[r], want);
		}
	}
	{
		float f = mr_grad_clip_factor(sqrt(ref), 0.5f);
		for (i = 0; i < n; i++)
			g[i] *= f;
		CU_OK(mr_cuda_scale(cu, d_g, n, f));
	}
	h = down_f32(d_g, n);
	check_close("clipped grads", h, g, n, 1e-6, 0.0);
	gpu_teardown();
}

/* ---- fp32 activations ("precision": "fp32") ------------------------------------
 * The same kernels instantiated for float: the CPU twin's results up to
 * summation order (rtol 1e-5, atol 1e-5 of the largest). A GEMM that ran
 * in TF32 (10-bit mantissa) would be off by ~1e-3 and fail. */
#define F32_TOL 1e-5, 1e-5

Test(cuda, fp32_activations_match_cpu_without_tf32)
{
	int N = 37, IC = 96, OC = 72, C = IC, V = 50, i;
	/* out holds the GEMM's rows (OC wide), then layernorm's and gelu's (IC) */
	size_t nic = (size_t)N * IC, noc = (size_t)N * OC, nout = nic > noc ? nic : noc;
	float *inp, *w, *b, *lb, *dout, *out, *dinp, *dw, *db, *ones, *mean, *rstd, *ws, *lg, *loss,
		*lse;
	void *d_inp, *d_w, *d_b, *d_lb, *d_out, *d_dout, *d_dinp, *d_lg;
	float *d_dw, *d_db, *d_mean, *d_rstd, *d_loss, *d_lse;
	int *tgt = xmalloc(sizeof(int) * N), *d_tgt;

	need_gpu();
	use_act(1);
	inp = rand_bf(nic, 1.0f);
	w = rand_bf((size_t)OC * IC, 0.2f);
	b = rand_bf(OC, 0.5f);
	dout = rand_bf(noc, 1.0f);
	out = xmalloc(nout * sizeof(float));
	dinp = xcopy_zero(nic);
	dw = xcopy_zero((size_t)OC * IC);
	db = xcopy_zero(OC);
	ones = xmalloc(N * sizeof(float));
	for (i = 0; i < N; i++)
		ones[i] = 1.0f;
	d_inp = up_act(inp, nic);
	d_w = up_act(w, (size_t)OC * IC);
	d_b = up_act(b, OC);
	d_dout = up_act(dout, noc);
	d_out = act_alloc(nout);
	d_dinp = act_alloc(nic);
	d_dw = up_f32(dw, (size_t)OC * IC);
	d_db = up_f32(db, OC);
	/* GEMMs */
	mr_matmul_fwd(NULL, out, inp, w, b, N, IC, OC);
	CU_OK(mr_cuda_matmul_fwd(cu, d_out, d_inp, d_w, d_b, N, IC, OC));
	check_close("f32 matmul out", down_act(d_out, noc), out, noc, F32_TOL);
	mr_matmul_bwd(NULL, dinp, dw, db, dout, inp, w, N, IC, OC, 0, ones);
	CU_OK(mr_cuda_matmul_bwd(cu, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, IC, OC, 0));
	check_close("f32 matmul dinp", down_act(d_dinp, nic), dinp, nic, F32_TOL);
	check_close("f32 matmul dw", down_f32(d_dw, (size_t)OC * IC), dw, (size_t)OC * IC, F32_TOL);
	check_close("f32 matmul dbias", down_f32(d_db, OC), db, OC, F32_TOL);
	/* the fused GELU entry with fp32 activations: the GEMM, then the GELU
	 * kernel (the epilogue's GELU is not exact to fp32), no fallback */
	{
		float *pre = xmalloc(noc * sizeof(float)), *gl = xmalloc(noc * sizeof(float));
		void *d_pre = act_alloc(noc);
		const char *why = "";

		mr_matmul_fwd(NULL, pre, inp, w, b, N, IC, OC);
		mr_gelu_fwd(NULL, gl, pre, noc);
		CU_OK(mr_cuda_matmul_gelu_fwd(cu, d_out, d_pre, d_inp, d_w, d_b, N, IC, OC));
		check_close("f32 fused gelu pre", down_act(d_pre, noc), pre, noc, F32_TOL);
		check_close("f32 fused gelu out", down_act(d_out, noc), gl, noc, F32_TOL);
		cr_expect_eq(mr_cuda_lt_fallbacks(cu, &why), 0, "a fallback: %s", why);
		free(pre);
		free(gl);
	}
	/* layernorm over the GEMM input rows, with C-sized weights (the
	 * GEMM's first C weights) and bias, gradients accumulated on the
	 * GEMM's */
	mean = xmalloc(N * sizeof(float));
	rstd = xmalloc(N * sizeof(float));
	ws = xmalloc(mr_layernorm_ws_floats(NULL, C) * sizeof(float));
	d_mean = dev_alloc(N * sizeof(float));
	d_rstd = dev_alloc(N * sizeof(float));
	lb = rand_bf(C, 0.5f);
	d_lb = up_act(lb, C);
	mr_layernorm_fwd(NULL, out, mean, rstd, inp, w, lb, N, C);
	CU_OK(mr_cuda_layernorm_fwd(cu, d_out, d_mean, d_rstd, d_inp, d_w, d_lb, N, C));
	check_close("f32 layernorm out", down_act(d_out, nic), out, nic, F32_TOL);
	mr_layernorm_bwd(NULL, dinp, dw, dw + C, inp, inp, w, mean, rstd, N, C, ws);
	CU_OK(mr_cuda_layernorm_bwd(cu, d_dinp, d_dw, d_dw + C, d_inp, d_inp, d_w, d_mean, d_rstd,
				    N, C));
	check_close("f32 layernorm dinp", down_act(d_dinp, nic), dinp, nic, F32_TOL);
	check_close("f32 layernorm dw, db", down_f32(d_dw, 2 * (size_t)C), dw, 2 * (size_t)C,
		    F32_TOL);
	/* GELU and cross-entropy */
	mr_gelu_fwd(NULL, out, inp, nic);
	CU_OK(mr_cuda_gelu_fwd(cu, d_out, d_inp, nic));
	check_close("f32 gelu", down_act(d_out, nic), out, nic, F32_TOL);
	lg = rand_bf((size_t)N * V, 3.0f);
	loss = xmalloc(N * sizeof(float));
	lse = xmalloc(N * sizeof(float));
	for (i = 0; i < N; i++)
		tgt[i] = (int)mr_rng_below(&rng, (uint64_t)V);
	d_lg = up_act(lg, (size_t)N * V);
	d_tgt = up_int(tgt, N);
	d_loss = dev_alloc(N * sizeof(float));
	d_lse = dev_alloc(N * sizeof(float));
	mr_crossentropy_fwd(NULL, loss, lse, lg, tgt, N, V);
	CU_OK(mr_cuda_crossentropy_fwd(cu, d_loss, d_lse, d_lg, d_tgt, N, V));
	check_close("f32 ce losses", down_f32(d_loss, N), loss, N, F32_TOL);
	mr_crossentropy_bwd_inplace(NULL, lg, lse, tgt, N, V, 0.5f);
	CU_OK(mr_cuda_crossentropy_bwd_inplace(cu, d_lg, d_lse, d_tgt, N, V, 0.5f));
	check_close("f32 ce dlogits", down_act(d_lg, (size_t)N * V), lg, (size_t)N * V, F32_TOL);
	gpu_teardown();
}

Test(cuda, fp32_adamw_writes_an_exact_compute_copy)
{
	struct mr_adamw_config c = { 0 };
	struct mr_cuda_adamw o = { 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f };
	size_t n = 1000, i;
	float *p, *g, *m, *v, *d_p, *d_pc, *gp, *gc;

	need_gpu();
	use_act(1);
	p = rand_bf(n, 1.0f);
	g = rand_bf(n, 0.1f);
	m = xcopy_zero(n);
	v = xcopy_zero(n);
	d_p = up_f32(p, n);
	d_pc = act_alloc(n);
	c.beta1 = o.beta1;
	c.beta2 = o.beta2;
	c.eps = o.eps;
	c.weight_decay = o.weight_decay;
	mr_adamw_update_range(&c, 1, o.lr, p, g, m, v, n, 1);
	CU_OK(mr_cuda_adamw_step(cu, d_p, d_pc, up_f32(g, n), up_f32(xcopy_zero(n), n),
				 up_f32(xcopy_zero(n), n), n, &o));
	gp = down_f32(d_p, n);
	gc = down_act(d_pc, n);
	check_close("f32 adamw p", gp, p, n, 1e-5, 1e-6);
	for (i = 0; i < n; i++)
		cr_assert_eq(gc[i], gp[i], "fp32 compute copy [%zu] is not the master", i);
	gpu_teardown();
}

/* ---- the device layer's small kernels ---------------------------------------------- */

static void rows_case(int C)
{
	int n = 29, T = 12, period = 4, off = 8, V = 40, from = 33, r, c;
	size_t nc = (size_t)n * C, i;
	float *rows = rand_bf(nc, 1.0f), *bias = rand_bf(C, 1.0f), *wpe = rand_bf((size_t)T * C, 1.0f);
	float *want = xmalloc(nc * sizeof(float)), *y = rand_bf(nc, 1.0f), *x = rand_bf(nc, 1.0f);
	void *d_rows, *d_cp;
	float *d_y, *got;

	need_gpu();
	d_rows = up_act(rows, nc);
	/* rows += bias */
	for (i = 0; i < nc; i++)
		want[i] = rows[i] + bias[i % (size_t)C];
	CU_OK(mr_cuda_add_bias(cu, d_rows, up_act(bias, C), n, C));
	check_close("add_bias", down_act(d_rows, nc), want, nc, BF_RTOL, BF_ATOL);
	/* rows += wpe[off + r % period] (a sequence-parallel shard) */
	d_rows = up_act(rows, nc);
	for (r = 0; r < n; r++)
		for (c = 0; c < C; c++)
			want[(size_t)r * C + c] = rows[(size_t)r * C + c] +
						  wpe[(size_t)(off + r % period) * C + c];
	CU_OK(mr_cuda_add_pos(cu, d_rows, up_act(wpe, (size_t)T * C), n, C, period, off));
	check_close("add_pos", down_act(d_rows, nc), want, nc, BF_RTOL, BF_ATOL);
	/* columns [from, V) := value, the rest untouched */
	d_rows = up_act(rows, (size_t)n * V);
	memcpy(want, rows, sizeof(float) * n * V);
	for (r = 0; r < n; r++)
		for (c = from; c < V; c++)
			want[(size_t)r * V + c] = -1e30f;
	CU_OK(mr_cuda_fill_cols(cu, d_rows, n, V, from, -1e30f));
	check_close("fill_cols", down_act(d_rows, (size_t)n * V), want, (size_t)n * V, BF_RTOL,
		    0.0);
	/* fp32 y += x */
	d_y = up_f32(y, nc);
	for (i = 0; i < nc; i++)
		y[i] += x[i];
	CU_OK(mr_cuda_add_f32(cu, d_y, up_f32(x, nc), nc));
	check_close("add_f32", down_f32(d_y, nc), y, nc, 0.0, 0.0);
	/* device copies: flat, then 2-D with odd pitches */
	d_cp = act_alloc(nc);
	CU_OK(mr_cuda_memset0(cu, d_cp, nc * sizeof(mr_bf16)));
	CU_OK(mr_cuda_copy2d(cu, d_cp, 7 * sizeof(mr_bf16), up_act(rows, nc), 5 * sizeof(mr_bf16),
			     3 * sizeof(mr_bf16), 20));
	got = down_act(d_cp, nc);
	for (r = 0; r < 20; r++)
		for (c = 0; c < 7; c++)
			cr_assert_eq(got[r * 7 + c], c < 3 ? rows[r * 5 + c] : 0.0f,
				     "copy2d row %d col %d", r, c);
	CU_OK(mr_cuda_copy(cu, d_cp, up_act(rows, nc), nc * sizeof(mr_bf16)));
	check_close("copy", down_act(d_cp, nc), rows, nc, 0.0, 0.0);
}

/* Widths of whole 16-byte packs (48) and not (45): both paths. */
Test(cuda, bias_positions_fill_and_copies_match_cpu)
{
	need_gpu();
	rows_case(48);
	rows_case(45);
	gpu_teardown();
}

/* fp32 -> bf16 -> fp32 on the device: round to nearest even as the host's
 * conversion, exactly, packed and at an odd element offset (unaligned),
 * with tails. */
Test(cuda, bf16_conversions_match_the_host)
{
	static const size_t sizes[] = { 1, 7, 8, 9, 4099 };

	need_gpu();
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++)
		for (size_t off = 0; off < 2; off++) {
			size_t n = sizes[k], i;
			float *x = rand_bf(n + off, 3.0f), *got, *back;
			float *d_x, *d_back = dev_alloc(sizeof(float) * (n + off));
			mr_bf16 *d_b = dev_alloc(sizeof(mr_bf16) * (n + off));

			for (i = 0; i < n + off; i++) /* not bf16 values: rounding shows */
				x[i] += 1e-3f * (float)(i % 7);
			d_x = up_f32(x, n + off);
			CU_OK(mr_cuda_f32_to_bf16(cu, d_b + off, d_x + off, n));
			CU_OK(mr_cuda_bf16_to_f32(cu, d_back + off, d_b + off, n));
			got = down_bf(d_b, n + off);
			back = down_f32(d_back, n + off);
			for (i = off; i < n + off; i++) {
				float want = mr_bf16_to_f32(mr_bf16_from_f32(x[i]));

				cr_assert_eq(got[i], want, "f32_to_bf16 n %zu off %zu [%zu]", n,
					     off, i);
				cr_assert_eq(back[i], want, "bf16_to_f32 n %zu off %zu [%zu]", n,
					     off, i);
			}
			free(x);
			free(got);
			free(back);
		}
	gpu_teardown();
}

Test(cuda, encoder_with_foreign_tokens_and_without_positions)
{
	int B = 2, T = 33, C = 40, V = 9, N = B * T, i;
	float *wte = rand_bf((size_t)V * C, 1.0f), *wpe = rand_bf((size_t)T * C, 1.0f);
	float *dout = rand_bf((size_t)N * C, 1.0f), *out = xmalloc(sizeof(float) * N * C);
	float *dwte = xcopy_zero((size_t)V * C), *d_dwte;
	int *tok = xmalloc(sizeof(int) * N);
	void *d_out;

	need_gpu();
	for (i = 0; i < N; i++) /* a third of the rows belong to another rank */
		tok[i] = i % 3 == 0 ? -1 : (int)mr_rng_below(&rng, (uint64_t)V);
	d_out = act_alloc((size_t)N * C);
	mr_encoder_fwd(NULL, out, tok, wte, NULL, B, T, C);
	CU_OK(mr_cuda_encoder_fwd(cu, d_out, up_int(tok, N), up_act(wte, (size_t)V * C), NULL, B,
				  T, C));
	check_close("encoder out, tok < 0, no wpe", down_act(d_out, (size_t)N * C), out,
		    (size_t)N * C, BF_RTOL, BF_ATOL);
	d_dwte = up_f32(dwte, (size_t)V * C);
	mr_encoder_bwd(NULL, dwte, NULL, dout, tok, B, T, C);
	CU_OK(mr_cuda_encoder_bwd(cu, d_dwte, NULL, up_act(dout, (size_t)N * C), tok, B, T, C, V));
	check_close("encoder dwte, tok < 0 skipped", down_f32(d_dwte, (size_t)V * C), dwte,
		    (size_t)V * C, 1e-4, 1e-5);
	(void)wpe;
	gpu_teardown();
}

Test(cuda, crossentropy_vocab_parallel_pieces_match_cpu)
{
	int N = 23, V = 700, i;
	float *lg = rand_bf((size_t)N * V, 3.0f), *mx = xmalloc(N * sizeof(float));
	float *sum = xmalloc(N * sizeof(float)), *tl = xmalloc(N * sizeof(float));
	float *loss = xmalloc(N * sizeof(float)), *lse = xmalloc(N * sizeof(float));
	float *d_mx, *d_sum, *d_tl, *d_loss, *d_lse;
	int *tgt = xmalloc(sizeof(int) * N), *d_tgt;
	void *d_lg;

	need_gpu();
	for (i = 0; i < N; i++)
		tgt[i] = i % 4 == 1 ? -1 : (int)mr_rng_below(&rng, (uint64_t)V);
	d_lg = up_act(lg, (size_t)N * V);
	d_tgt = up_int(tgt, N);
	d_mx = dev_alloc(N * sizeof(float));
	d_sum = dev_alloc(N * sizeof(float));
	d_tl = dev_alloc(N * sizeof(float));
	d_loss = dev_alloc(N * sizeof(float));
	d_lse = dev_alloc(N * sizeof(float));
	mr_crossentropy_rowmax(NULL, mx, lg, N, V);
	mr_crossentropy_sumexp(NULL, sum, tl, lg, mx, tgt, N, V);
	for (i = 0; i < N; i++) {
		lse[i] = mx[i] + logf(sum[i]);
		loss[i] = lse[i] - tl[i];
	}
	CU_OK(mr_cuda_crossentropy_rowmax(cu, d_mx, d_lg, N, V));
	CU_OK(mr_cuda_crossentropy_sumexp(cu, d_sum, d_tl, d_lg, d_mx, d_tgt, N, V));
	CU_OK(mr_cuda_crossentropy_finish(cu, d_loss, d_lse, d_mx, d_sum, d_tl, N));
	check_close("ce rowmax", down_f32(d_mx, N), mx, N, 0.0, 0.0);
	check_close("ce sumexp", down_f32(d_sum, N), sum, N, 1e-5, 1e-6);
	check_close("ce target logit (0 elsewhere)", down_f32(d_tl, N), tl, N, 0.0, 0.0);
	check_close("ce finish lse", down_f32(d_lse, N), lse, N, 1e-5, 1e-6);
	check_close("ce finish loss", down_f32(d_loss, N), loss, N, 1e-5, 1e-5);
	mr_crossentropy_bwd_inplace(NULL, lg, lse, tgt, N, V, 0.125f);
	CU_OK(mr_cuda_crossentropy_bwd_inplace(cu, d_lg, d_lse, d_tgt, N, V, 0.125f));
	check_close("ce dlogits, tgt < 0 rows", down_act(d_lg, (size_t)N * V), lg, (size_t)N * V,
		    BF_RTOL, BF_ATOL);
	gpu_teardown();
}

Test(cuda, matmul_bwd_overwrites_and_skips_null_outputs)
{
	int N = 45, IC = 64, OC = 24, i;
	float *inp = rand_bf((size_t)N * IC, 1.0f), *w = rand_bf((size_t)OC * IC, 0.2f);
	float *dout = rand_bf((size_t)N * OC, 1.0f), *dinp = xcopy_zero((size_t)N * IC);
	float *ones = xmalloc(N * sizeof(float)), *d_dw, *g;
	void *d_dinp;

	need_gpu();
	for (i = 0; i < N; i++)
		ones[i] = 1.0f;
	d_dinp = up_act(rand_bf((size_t)N * IC, 100.0f), (size_t)N * IC); /* garbage to overwrite */
	d_dw = up_f32(xcopy_zero((size_t)OC * IC), (size_t)OC * IC);
	mr_matmul_bwd(NULL, dinp, NULL, NULL, dout, inp, w, N, IC, OC, 0, ones);
	CU_OK(mr_cuda_matmul_bwd(cu, d_dinp, NULL, NULL, up_act(dout, (size_t)N * OC),
				 up_act(inp, (size_t)N * IC), up_act(w, (size_t)OC * IC), N, IC, OC,
				 0));
	check_close("dinp = (acc 0)", down_act(d_dinp, (size_t)N * IC), dinp, (size_t)N * IC,
		    1e-2, 4e-3);
	CU_OK(mr_cuda_matmul_bwd(cu, NULL, d_dw, NULL, up_act(dout, (size_t)N * OC),
				 up_act(inp, (size_t)N * IC), up_act(w, (size_t)OC * IC), N, IC, OC,
				 1));
	g = down_f32(d_dw, (size_t)OC * IC);
	{
		float *dw = xcopy_zero((size_t)OC * IC);
		mr_matmul_bwd(NULL, NULL, dw, NULL, dout, inp, w, N, IC, OC, 1, ones);
		check_close("dw alone", g, dw, (size_t)OC * IC, 1e-4, 1e-5);
	}
	gpu_teardown();
}

/* ---- MoE kernels against kernels/moe.c's pieces --------------------------------------- */

static void moe_kernels_case(int f32, int k, float cf)
{
	struct mr_moe_shape s;
	struct mr_moe_acts a;
	int N = 70, C = 64, E = 6, A, e, i, dropped = -1, counts[6];
	float aux = -1.0f;
	float *x, *rw, *rows, *dy, *y, *dyo, *dgate, *dl, *fbuf;
	int *ibuf, *d_topi, *d_slot, *d_count, *d_routed, *got_i;
	float *d_probs, *d_gate, *d_dgate, *got;
	void *d_x, *d_xin, *d_y, *d_dyo, *d_dl, *d_rows;
	size_t ec, nr;

	need_gpu();
	use_act(f32);
	memset(&s, 0, sizeof(s));
	s.N = N;
	s.C = C;
	s.H = 4 * C;
	s.E = E;
	s.k = k;
	s.cap = mr_moe_capacity(N, E, k, cf);
	A = N * k;
	ec = (size_t)E * s.cap;
	nr = ec * C;
	x = rand_bf((size_t)N * C, 1.0f);
	rw = rand_bf((size_t)E * C, 0.3f);
	fbuf = xmalloc(mr_moe_act_floats(&s) * sizeof(float));
	ibuf = xmalloc(mr_moe_act_ints(&s) * sizeof(int));
	mr_moe_acts_bind(&a, &s, fbuf, ibuf);
	/* the twin: fp32 router GEMM, then the routing rules */
	mr_matmul_fwd(NULL, a.probs, x, rw, NULL, N, C, E);
	mr_moe_route(&s, &a);
	d_x = up_act(x, (size_t)N * C);
	d_probs = dev_alloc(sizeof(float) * N * E);
	d_gate = dev_alloc(sizeof(float) * A);
	d_topi = dev_alloc(sizeof(int) * A);
	d_slot = dev_alloc(sizeof(int) * A);
	d_count = dev_alloc(sizeof(int) * E);
	d_routed = dev_alloc(sizeof(int) * E);
	CU_OK(mr_cuda_moe_route(cu, &s, d_probs, d_topi, d_gate, d_slot, d_count, d_routed, NULL,
				d_x, up_act(rw, (size_t)E * C), counts, &aux, &dropped));
	check_close("moe probs", down_f32(d_probs, (size_t)N * E), a.probs, (size_t)N * E, 1e-4,
		    1e-6);
	check_close("moe gates", down_f32(d_gate, A), a.gate, A, 1e-4, 1e-6);
	got_i = xmalloc(sizeof(int) * A);
	cr_assert_eq(mr_cuda_download(cu, got_i, d_topi, sizeof(int) * A), 0);
	cr_assert(memcmp(got_i, a.topi, sizeof(int) * A) == 0, "top-k choices differ");
	cr_assert_eq(mr_cuda_download(cu, got_i, d_slot, sizeof(int) * A), 0);
	cr_assert(memcmp(got_i, a.slot, sizeof(int) * A) == 0, "capacity slots differ");
	cr_assert(memcmp(counts, a.count, sizeof(int) * E) == 0, "counts read back differ");
	cr_assert_eq(mr_cuda_download(cu, got_i, d_routed, sizeof(int) * E), 0);
	cr_assert(memcmp(got_i, a.routed, sizeof(int) * E) == 0, "routed differ");
	cr_assert_eq(dropped, a.dropped);
	cr_assert(fabsf(aux - a.aux) <= 1e-5f * a.aux, "aux gpu %g cpu %g", aux, a.aux);
	/* the same inputs again, nothing read back (the sync-free path's
	 * stat on the device): the same bits (no atomics in the routing) */
	{
		float aux2 = 0.0f, *p1 = down_f32(d_probs, (size_t)N * E), *p2;
		int *d_stat = dev_alloc(2 * sizeof(int)), stat[2];
		CU_OK(mr_cuda_moe_route(cu, &s, d_probs, d_topi, d_gate, d_slot, d_count, d_routed,
					d_stat, d_x, up_act(rw, (size_t)E * C), NULL, NULL, NULL));
		p2 = down_f32(d_probs, (size_t)N * E);
		cr_assert_eq(mr_cuda_download(cu, stat, d_stat, sizeof(stat)), 0);
		memcpy(&aux2, &stat[0], sizeof(float));
		cr_assert(memcmp(p1, p2, sizeof(float) * N * E) == 0 && aux2 == aux,
			  "routing is not deterministic");
		cr_assert_eq(stat[1], dropped, "dropped on the device %d, read back %d", stat[1],
			     dropped);
		/* context parallel's aux loss from routed summed over 2 ranks */
		CU_OK(mr_cuda_moe_aux(cu, &s, d_stat, d_probs, d_routed, 2));
		cr_assert_eq(mr_cuda_download(cu, stat, d_stat, sizeof(stat)), 0);
		memcpy(&aux2, &stat[0], sizeof(float));
		aux = mr_moe_aux(&s, a.probs, a.routed, 2);
		cr_assert(fabsf(aux2 - aux) <= 1e-5f * aux, "aux over 2 ranks: gpu %g cpu %g",
			  aux2, aux);
	}
	/* dispatch: the kept rows, bit for bit */
	d_xin = act_alloc(nr);
	CU_OK(mr_cuda_moe_dispatch(cu, &s, d_xin, d_x, d_topi, d_slot));
	mr_moe_dispatch(&s, &a, a.xin, x);
	got = down_act(d_xin, nr);
	for (e = 0; e < E; e++)
		for (i = 0; i < a.count[e] * C; i++)
			cr_assert_eq(got[(size_t)e * s.cap * C + i], a.xin[(size_t)e * s.cap * C + i],
				     "dispatched row of expert %d", e);
	/* combine, gated and not */
	rows = rand_bf(nr, 1.0f);
	y = xmalloc(sizeof(float) * N * C);
	d_rows = up_act(rows, nr);
	d_y = act_alloc((size_t)N * C);
	mr_moe_combine(&s, &a, 1, y, rows);
	CU_OK(mr_cuda_moe_combine(cu, &s, d_y, d_rows, d_topi, d_slot, d_gate));
	check_close("moe combine", down_act(d_y, (size_t)N * C), y, (size_t)N * C,
		    f32 ? 1e-5 : BF_RTOL, f32 ? 1e-6 : BF_ATOL);
	mr_moe_combine(&s, &a, 0, y, rows);
	CU_OK(mr_cuda_moe_combine(cu, &s, d_y, d_rows, d_topi, d_slot, NULL));
	check_close("moe gather (no gate)", down_act(d_y, (size_t)N * C), y, (size_t)N * C,
		    f32 ? 1e-5 : BF_RTOL, f32 ? 1e-6 : BF_ATOL);
	/* combine backward: dyo rows of kept assignments, dgate */
	dy = rand_bf((size_t)N * C, 1.0f);
	dyo = xcopy_zero(nr);
	dgate = xmalloc(sizeof(float) * A);
	d_dyo = up_act(dyo, nr);
	d_dgate = dev_alloc(sizeof(float) * A);
	mr_moe_combine_bwd(&s, &a, dyo, dgate, dy, rows);
	CU_OK(mr_cuda_moe_combine_bwd(cu, &s, d_dyo, d_dgate, up_act(dy, (size_t)N * C), d_rows,
				      d_topi, d_slot, d_gate));
	check_close("moe dyo", down_act(d_dyo, nr), dyo, nr, f32 ? 1e-5 : BF_RTOL,
		    f32 ? 1e-6 : BF_ATOL);
	check_close("moe dgate", down_f32(d_dgate, A), dgate, A, 1e-4, 1e-5);
	/* router backward (from the same dgate on both sides) */
	dl = xmalloc(sizeof(float) * N * E);
	d_dl = act_alloc((size_t)N * E);
	mr_moe_router_bwd(&s, &a, dl, dgate, 0.02f);
	CU_OK(mr_cuda_moe_router_bwd(cu, &s, d_dl, d_probs, d_topi, d_gate, up_f32(dgate, A),
				     d_routed, 0.02f));
	check_close("moe router dlogits", down_act(d_dl, (size_t)N * E), dl, (size_t)N * E,
		    f32 ? 1e-4 : BF_RTOL, f32 ? 1e-5 : BF_ATOL);
	gpu_teardown();
}

Test(cuda, moe_kernels_match_their_cpu_twins)
{
	moe_kernels_case(0, 1, 1.0f);
}

Test(cuda, moe_kernels_top2_with_drops_fp32)
{
	moe_kernels_case(1, 2, 0.5f);
}

Test(cuda, moe_kernels_top2_bf16)
{
	moe_kernels_case(0, 2, 1.5f);
}
