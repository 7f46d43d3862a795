/*
 * test_cuda_attention.c - the CUDA block-wise attention against its CPU
 * twin (kernels/mr_attention.h): whole causal layer forward and backward
 * for head sizes 32, 64 and 128 with T not a multiple of the tiles, and
 * the context-parallel path (a query slice at an offset, two key blocks,
 * fp32 partials merged, backward per key block with the final lse/delta).
 *
 * Tolerances (|gpu - cpu| <= rtol*|cpu| + atol*max|cpu|):
 *   layer out (bf16)         rtol 8e-3, atol 1e-3
 *   lse (fp32)               rtol 1e-5, atol 1e-5
 *   layer dqkv (bf16)        rtol 2e-2, atol 1e-2 (the GPU's delta comes
 *                            from its bf16 out, the CPU's from fp32)
 *   CP partials, merge, grads (fp32 out/grads, same bf16 inputs)
 *                            rtol 1e-3, atol 1e-4
 *   the layer entries with fp32 activations: out rtol 1e-4, dqkv rtol
 *                            1e-3 (fp32 throughout, other orders)
 * Skipped when there is no CUDA device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_harness.h"
#include "kernels/mr_attention.h"

static struct mr_cuda_attn layer_desc(const mr_bf16 *qkv, int B, int T, int C, int NH)
{
	struct mr_cuda_attn a;
	int hs = C / NH;

	memset(&a, 0, sizeof(a));
	a.q = qkv;
	a.k = qkv + C;
	a.v = qkv + 2 * C;
	a.q_row = a.kv_row = 3 * (size_t)C;
	a.q_batch = a.kv_batch = (size_t)T * 3 * C;
	a.B = B;
	a.NH = NH;
	a.hs = hs;
	a.tq = a.tk = T;
	a.causal = 1;
	a.scale = 1.0f / sqrtf((float)hs);
	return a;
}

static void layer_case(int B, int T, int C, int NH)
{
	int hs = C / NH;
	size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
	float *qkv = rand_bf(nqkv, 1.0f), *dout = rand_bf(nout, 1.0f);
	float *out = xmalloc(nout * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
	float *dqkv = xmalloc(nqkv * sizeof(float));
	float *ws = xmalloc(mr_attn_layer_ws_floats(NULL, T, hs) * sizeof(float));
	mr_bf16 *d_qkv = up_bf(qkv, nqkv), *d_out = dev_alloc(nout * sizeof(mr_bf16));
	mr_bf16 *d_dout = up_bf(dout, nout), *d_dqkv = dev_alloc(nqkv * sizeof(mr_bf16));
	float *d_lse = dev_alloc(nl * sizeof(float)), *d_delta = dev_alloc(nl * sizeof(float));
	struct mr_cuda_attn a = layer_desc(d_qkv, B, T, C, NH);

	mr_attn_layer_fwd(NULL, out, lse, qkv, B, T, C, NH, NH, ws);
	CU_OK(mr_cuda_attn_fwd(cu, &a, d_out, (size_t)C, (size_t)T * C, d_lse));
	check_close("attn out", down_bf(d_out, nout), out, nout, BF_RTOL, BF_ATOL);
	check_close("attn lse", down_f32(d_lse, nl), lse, nl, 1e-5, 1e-5);

	mr_attn_layer_bwd(NULL, dqkv, dout, qkv, out, lse, B, T, C, NH, NH, ws);
	CU_OK(mr_cuda_memset0(cu, d_dqkv, nqkv * sizeof(mr_bf16)));
	CU_OK(mr_cuda_attn_delta(cu, d_delta, d_dout, d_out, B, NH, T, hs, (size_t)C,
				 (size_t)T * C));
	CU_OK(mr_cuda_attn_bwd(cu, &a, d_dout, (size_t)C, (size_t)T * C, d_lse, d_delta, d_dqkv,
			       3 * (size_t)C, (size_t)T * 3 * C, d_dqkv + C, d_dqkv + 2 * C,
			       3 * (size_t)C, (size_t)T * 3 * C));
	check_close("attn dqkv", down_bf(d_dqkv, nqkv), dqkv, nqkv, 2e-2, 1e-2);
}

Test(cuda_attn, layer_hs64_matches_cpu)
{
	need_gpu();
	layer_case(2, 80, 128, 2);
	gpu_teardown();
}

Test(cuda_attn, layer_hs32_matches_cpu)
{
	need_gpu();
	layer_case(1, 45, 128, 4);
	gpu_teardown();
}

Test(cuda_attn, layer_hs128_matches_cpu)
{
	need_gpu();
	layer_case(2, 33, 256, 2);
	gpu_teardown();
}

/* Real shapes: GPT-2's T 1024 with head size 64, and T 4096 with head
 * sizes 64 and 128 (part of the device script, scripts/device-run.sh). */
Test(cuda_attn, real_shapes_T1024_and_T4096_match_cpu, .timeout = 600)
{
	need_gpu();
	layer_case(1, 1024, 768, 12);
	layer_case(1, 4096, 256, 4);
	layer_case(1, 4096, 256, 2);
	gpu_teardown();
}

/* The layer entries the device layer calls (dqkv written, delta in the
 * context's scratch), in the activation type f32 or bf16. */
static void layer_entry_case(int f32, int B, int T, int C, int NH)
{
	size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
	float *qkv = rand_bf(nqkv, 1.0f), *dout = rand_bf(nout, 1.0f);
	float *out = xmalloc(nout * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
	float *dqkv = xmalloc(nqkv * sizeof(float)), *d_lse;
	float *ws = xmalloc(mr_attn_layer_ws_floats(NULL, T, C / NH) * sizeof(float));
	void *d_qkv, *d_out, *d_dqkv;

	use_act(f32);
	d_qkv = up_act(qkv, nqkv);
	d_out = act_alloc(nout);
	d_dqkv = up_act(rand_bf(nqkv, 10.0f), nqkv); /* old contents must not leak in */
	d_lse = dev_alloc(nl * sizeof(float));
	mr_attn_layer_fwd(NULL, out, lse, qkv, B, T, C, NH, NH, ws);
	CU_OK(mr_cuda_attn_layer_fwd(cu, d_out, d_lse, d_qkv, B, T, C, NH, NH));
	check_close("layer out", down_act(d_out, nout), out, nout, f32 ? 1e-4 : BF_RTOL,
		    f32 ? 1e-5 : BF_ATOL);
	check_close("layer lse", down_f32(d_lse, nl), lse, nl, 1e-5, 1e-5);
	mr_attn_layer_bwd(NULL, dqkv, dout, qkv, out, lse, B, T, C, NH, NH, ws);
	CU_OK(mr_cuda_attn_layer_bwd(cu, d_dqkv, up_act(dout, nout), d_qkv, d_out, d_lse, B, T,
				     C, NH, NH));
	check_close("layer dqkv", down_act(d_dqkv, nqkv), dqkv, nqkv, f32 ? 1e-3 : 2e-2,
		    f32 ? 1e-4 : 1e-2);
}

Test(cuda_attn, layer_entries_match_cpu_bf16_and_fp32)
{
	need_gpu();
	layer_entry_case(0, 2, 37, 64, 2);
	layer_entry_case(1, 2, 37, 64, 2);
	layer_entry_case(1, 1, 20, 256, 2);
	gpu_teardown();
}

Test(cuda_attn, bad_head_size_is_rejected)
{
	struct mr_cuda_attn a;
	mr_bf16 *qkv, *out;
	float *lse;

	need_gpu();
	qkv = dev_alloc(8 * 3 * 48 * sizeof(mr_bf16));
	out = dev_alloc(8 * 48 * sizeof(mr_bf16));
	lse = dev_alloc(8 * sizeof(float));
	a = layer_desc(qkv, 1, 8, 48, 1); /* hs 48: not a multiple of 32 */
	cr_assert_eq(mr_cuda_attn_fwd(cu, &a, out, 48, 8 * 48, lse), MR_EINVAL);
	cr_assert(strstr(mr_cuda_errmsg(cu), "attn_fwd") != NULL);
	gpu_teardown();
}

/* Context parallel: queries [T/2, T) against key blocks [0, T/2) and
 * [T/2, T) computed separately, merged, and differentiated per block. */
static void cp_case(void)
{
	int T = 96, C = 128, NH = 2, hs = C / NH, half = T / 2, blk, h, i;
	size_t nqkv = (size_t)T * 3 * C, nq = (size_t)half * C, nl = (size_t)NH * half;
	float *qkv = rand_bf(nqkv, 1.0f), *dout = rand_bf(nq, 1.0f);
	float *po[2], *pl[2], *delta = xmalloc(nl * sizeof(float));
	float *dq = xmalloc(nq * sizeof(float)), *dk = xmalloc((size_t)T * C * sizeof(float));
	float *dv = xmalloc((size_t)T * C * sizeof(float));
	float *ws = xmalloc(mr_attn_head_ws_floats(64, 64, hs) * sizeof(float));
	mr_bf16 *d_qkv = up_bf(qkv, nqkv), *d_dout = up_bf(dout, nq);
	mr_bf16 *d_outb = dev_alloc(nq * sizeof(mr_bf16));
	float *d_o[2], *d_l[2], *d_delta = dev_alloc(nl * sizeof(float));
	float *d_dq = dev_alloc(nq * sizeof(float)), *d_dk = dev_alloc((size_t)T * C * sizeof(float));
	float *d_dv = dev_alloc((size_t)T * C * sizeof(float)), *outb;
	struct mr_attn_head hh;

	memset(&hh, 0, sizeof(hh));
	for (blk = 0; blk < 2; blk++) {
		struct mr_cuda_attn a = layer_desc(d_qkv, 1, T, C, NH);

		po[blk] = xmalloc(nq * sizeof(float));
		pl[blk] = xmalloc(nl * sizeof(float));
		d_o[blk] = dev_alloc(nq * sizeof(float));
		d_l[blk] = dev_alloc(nl * sizeof(float));
		a.q = d_qkv + (size_t)half * 3 * C;
		a.tq = half;
		a.q_pos0 = half;
		a.k = d_qkv + C + (size_t)blk * half * 3 * C;
		a.v = d_qkv + 2 * C + (size_t)blk * half * 3 * C;
		a.tk = half;
		a.k_pos0 = blk * half;
		CU_OK(mr_cuda_attn_fwd_f32(cu, &a, d_o[blk], (size_t)C, nq, d_l[blk]));
		for (h = 0; h < NH; h++) {
			hh.q = qkv + (size_t)half * 3 * C + (size_t)h * hs;
			hh.k = qkv + C + (size_t)blk * half * 3 * C + (size_t)h * hs;
			hh.v = hh.k + C;
			hh.q_stride = hh.kv_stride = 3 * (size_t)C;
			hh.tq = hh.tk = half;
			hh.q_pos0 = half;
			hh.k_pos0 = blk * half;
			hh.hs = hs;
			hh.causal = 1;
			hh.scale = 1.0f / sqrtf((float)hs);
			hh.bq = hh.bk = 64;
			mr_attn_head_fwd(&hh, po[blk] + (size_t)h * hs, (size_t)C,
					 pl[blk] + (size_t)h * half, ws);
		}
		check_close("cp partial out", down_f32(d_o[blk], nq), po[blk], nq, 1e-3, 1e-4);
		check_close("cp partial lse", down_f32(d_l[blk], nl), pl[blk], nl, 1e-5, 1e-5);
	}
	for (h = 0; h < NH; h++)
		mr_attn_merge(po[0] + (size_t)h * hs, (size_t)C, pl[0] + (size_t)h * half,
			      po[1] + (size_t)h * hs, (size_t)C, pl[1] + (size_t)h * half, half, hs);
	CU_OK(mr_cuda_attn_merge(cu, d_o[0], d_l[0], d_o[1], d_l[1], 1, NH, half, hs, (size_t)C,
				 nq));
	check_close("cp merged out", down_f32(d_o[0], nq), po[0], nq, 1e-3, 1e-4);
	check_close("cp merged lse", down_f32(d_l[0], nl), pl[0], nl, 1e-5, 1e-5);

	/* backward with the FINAL lse and delta (from the bf16 merged out) */
	CU_OK(mr_cuda_f32_to_bf16(cu, d_outb, d_o[0], nq));
	CU_OK(mr_cuda_attn_delta(cu, d_delta, d_dout, d_outb, 1, NH, half, hs, (size_t)C, nq));
	outb = down_bf(d_outb, nq);
	for (h = 0; h < NH; h++)
		for (i = 0; i < half; i++) {
			double s = 0.0;
			int c;
			for (c = 0; c < hs; c++)
				s += (double)outb[(size_t)i * C + h * hs + c] *
				     dout[(size_t)i * C + h * hs + c];
			delta[(size_t)h * half + i] = (float)s;
		}
	check_close("cp delta", down_f32(d_delta, nl), delta, nl, 1e-4, 1e-5);
	CU_OK(mr_cuda_memset0(cu, d_dq, nq * sizeof(float)));
	CU_OK(mr_cuda_memset0(cu, d_dk, (size_t)T * C * sizeof(float)));
	CU_OK(mr_cuda_memset0(cu, d_dv, (size_t)T * C * sizeof(float)));
	for (blk = 0; blk < 2; blk++) {
		struct mr_cuda_attn a = layer_desc(d_qkv, 1, T, C, NH);
		size_t k0 = (size_t)blk * half;

		a.q = d_qkv + (size_t)half * 3 * C;
		a.tq = half;
		a.q_pos0 = half;
		a.k = d_qkv + C + k0 * 3 * C;
		a.v = d_qkv + 2 * C + k0 * 3 * C;
		a.tk = half;
		a.k_pos0 = (int)k0;
		CU_OK(mr_cuda_attn_bwd_f32(cu, &a, d_dout, (size_t)C, nq, d_l[0], d_delta, d_dq,
					   (size_t)C, nq, d_dk + k0 * C, d_dv + k0 * C, (size_t)C,
					   (size_t)T * C));
		for (h = 0; h < NH; h++) {
			hh.q = qkv + (size_t)half * 3 * C + (size_t)h * hs;
			hh.k = qkv + C + k0 * 3 * C + (size_t)h * hs;
			hh.v = hh.k + C;
			hh.tq = hh.tk = half;
			hh.q_pos0 = half;
			hh.k_pos0 = (int)k0;
			mr_attn_head_bwd(&hh, dout + (size_t)h * hs, (size_t)C,
					 pl[0] + (size_t)h * half, delta + (size_t)h * half,
					 dq + (size_t)h * hs, (size_t)C, dk + k0 * C + (size_t)h * hs,
					 dv + k0 * C + (size_t)h * hs, (size_t)C, ws);
		}
	}
	check_close("cp dq", down_f32(d_dq, nq), dq, nq, 1e-3, 1e-4);
	check_close("cp dk", down_f32(d_dk, (size_t)T * C), dk, (size_t)T * C, 1e-3, 1e-4);
	check_close("cp dv", down_f32(d_dv, (size_t)T * C), dv, (size_t)T * C, 1e-3, 1e-4);
}

Test(cuda_attn, context_parallel_partials_merge_and_backward)
{
	need_gpu();
	cp_case();
	gpu_teardown();
}
