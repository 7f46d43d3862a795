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
 * Tests skip (not fail) when there is no CUDA device; the bf16 conversion
 * and the no-device path run everywhere.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_harness.h"
#include "kernels/mr_kernels.h"
#include "model/mr_gpt.h"
#include "optim/mr_adamw.h"

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

static void matmul_case(int use_lt)
{
	int N = 70, IC = 96, OC = 136;
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
	need_gpu();
	cr_assert(mr_cuda_using_lt(cu), "cuBLASLt not in use");
	matmul_case(1);
	gpu_teardown();
}

Test(cuda, matmul_cublas_fallback_matches_cpu)
{
	need_gpu();
	matmul_case(0);
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

Test(cuda, layernorm_matches_cpu)
{
	int N = 37, C = 200;
	float *inp, *w, *b, *dout, *out, *mean, *rstd, *dinp, *dw, *db, *ws, *g;
	mr_bf16 *d_inp, *d_w, *d_out, *d_dinp;
	float *d_mean, *d_rstd, *d_dw, *d_db;

	need_gpu();
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

Test(cuda, crossentropy_matches_cpu)
{
	int N = 19, V = 1000, i;
	float *logits, *losses, *lse, *d_losses, *d_lse;
	int *tgt = xmalloc(sizeof(int) * N), *d_tgt;
	mr_bf16 *d_logits;

	need_gpu();
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
	gpu_teardown();
}

Test(cuda, adamw_matches_cpu)
{
	struct mr_gpt_tensor tt[2];
	struct mr_gpt model;
	struct mr_adamw_config cfg = { 1e-3f, 0.1f, 2, 10, 0.9f, 0.95f, 1e-8f, 0.1f, 1.0f };
	struct mr_adamw opt;
	size_t n0 = 300, n1 = 77, n = n0 + n1, i;
	float *p, *g, *m, *v, *d_p, *d_g, *d_m, *d_v;
	mr_bf16 *d_pb;
	long step;

	need_gpu();
	memset(&model, 0, sizeof(model));
	memset(tt, 0, sizeof(tt));
	tt[0].off = 0;
	tt[0].n = n0;
	tt[0].decay = 1;
	tt[1].off = n0;
	tt[1].n = n1;
	tt[1].decay = 0;
	model.ntensors = 2;
	model.tensors = tt;
	p = rand_bf(n, 1.0f);
	g = rand_bf(n, 0.1f);
	model.params = p;
	model.grads = g;
	opt.cfg = cfg;
	opt.n = n;
	opt.t = 0;
	m = xmalloc(2 * n * sizeof(float));
	v = m + n;
	opt.m = m;
	opt.v = v;
	d_p = up_f32(p, n);
	d_g = up_f32(g, n);
	d_m = up_f32(m, n);
	d_v = up_f32(v, n);
	d_pb = dev_alloc(n * sizeof(mr_bf16));
	for (step = 0; step < 3; step++) {
		float lr = mr_lr_at(&cfg, step);
		struct mr_cuda_adamw o = { lr, cfg.beta1, cfg.beta2, cfg.eps, cfg.weight_decay,
					   step + 1, 1.0f };

		mr_adamw_step(&opt, &model, lr);
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
	size_t n = 1000003;
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
	mr_grad_clip(g, n, sqrt(ref), 0.5f);
	CU_OK(mr_cuda_scale(cu, d_g, n, (float)(0.5 / (sqrt(ref) + 1e-6))));
	h = down_f32(d_g, n);
	check_close("clipped grads", h, g, n, 1e-6, 0.0);
	gpu_teardown();
}
