/*
 * test_cuda_attention.c - the CUDA block-wise attention against its CPU
 * twin (kernels/mr_attention.h): whole causal layer forward and backward
 * for head sizes 32, 64 and 128 with T not a multiple of the tiles, and
 * the context-parallel path (a query slice at an offset, two key blocks,
 * fp32 partials merged, backward per key block with the final lse/delta),
 * and grouped-query attention (NKV key/value heads of NH): the layer
 * entries and the slices against the CPU twins, the layer against the
 * kernels' own multi-head run on the expanded qkv (out, lse, dq
 * bit-identical; dk/dv the group sums) and against itself (the backward
 * twice: the same bits).
 *
 * Those run the block-wise kernels (attention.cu): the layer-entry cases
 * turn the cuDNN path off (mr_cuda_disable_cudnn). The layer through
 * cuDNN's fused flash attention (cudnn_attn.cu) has its own cases at the
 * end: bf16, T 1024 and 4096, head sizes 64 and 128, NKV = NH and NKV <
 * NH, against the fp32 CPU twin on fresh random inputs, with out, lse and
 * dqkv poisoned (NaN bytes) before each call so an element cuDNN does not
 * write fails; each fails when the call did not run through cuDNN (a GPU
 * without a usable cuDNN included: only MESHRUN_CUDNN=0 skips them), and
 * runs forward and backward twice for the same bits.
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
 *   gqa dk/dv vs the multi-head group sums: fp32 rtol 1e-5 (one fp32 sum
 *                            in another order); bf16 2e-2, 1e-2 (each
 *                            multi-head term rounded before the sum)
 * and for the cuDNN path, relative L2 error ||gpu - cpu|| / ||cpu||:
 *   out, dq, dk, dv          1e-2 (the bound): cuDNN rounds P to
 *                            bf16 before P V and P^T dO, dS before dS^T Q,
 *                            each 2^-9 relative, of random sign
 *   lse                      1e-3: fp32 scores from exact bf16 products,
 *                            fp32 max and sum; only the order differs
 * Skipped when there is no CUDA device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cudnn_graph.h"
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
 * context's scratch), in the activation type f32 or bf16, on the
 * block-wise kernels (the cuDNN path off). */
static void layer_entry_case(int f32, int B, int T, int C, int NH)
{
	size_t nqkv = (size_t)B * T * 3 * C, nout = (size_t)B * T * C, nl = (size_t)B * NH * T;
	float *qkv = rand_bf(nqkv, 1.0f), *dout = rand_bf(nout, 1.0f);
	float *out = xmalloc(nout * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
	float *dqkv = xmalloc(nqkv * sizeof(float)), *d_lse;
	float *ws = xmalloc(mr_attn_layer_ws_floats(NULL, T, C / NH) * sizeof(float));
	void *d_qkv, *d_out, *d_dqkv;

	mr_cuda_disable_cudnn(cu);
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

/* ---- grouped-query attention: NKV key/value heads of NH ------------------ */

/* Elements of a (B,T,C+2*NKV*hs) qkv. */
static size_t gqa_qkv_n(int B, int T, int C, int NH, int NKV)
{
	return (size_t)B * T * ((size_t)C + 2 * (size_t)NKV * (size_t)(C / NH));
}

/* The multi-head qkv (B,T,3C) whose query head h has the key and value of
 * the grouped layout's head h / (NH/NKV): the same attention, spelled out. */
static float *gqa_expand(const float *g, int B, int T, int C, int NH, int NKV)
{
	int hs = C / NH, G = NH / NKV, h;
	size_t W = (size_t)C + 2 * (size_t)NKV * hs, r;
	float *m = xmalloc((size_t)B * T * 3 * C * sizeof(float));

	for (r = 0; r < (size_t)B * T; r++) {
		const float *gr = g + r * W;
		float *mr = m + r * 3 * C;

		memcpy(mr, gr, (size_t)C * sizeof(float));
		for (h = 0; h < NH; h++) {
			size_t kv = (size_t)(h / G) * hs;
			memcpy(mr + C + (size_t)h * hs, gr + C + kv, (size_t)hs * sizeof(float));
			memcpy(mr + 2 * C + (size_t)h * hs, gr + C + (size_t)NKV * hs + kv,
			       (size_t)hs * sizeof(float));
		}
	}
	return m;
}

/* The layer entries with NKV < NH (on the block-wise kernels: the cuDNN
 * path off) against the CPU layer (the twin), in the activation type f32
 * or bf16; then against the kernels' own
 * multi-head run on the expanded qkv: out, lse and dq bit-identical (each
 * query head reads the same key/value values through the same
 * arithmetic), dk/dv the group sums of the multi-head dk/dv (another
 * order of the same fp32 sums); then the backward again: bit-identical
 * (no atomics). */
static void gqa_layer_case(int f32, int B, int T, int C, int NH, int NKV)
{
	int hs = C / NH, G = NH / NKV, h;
	size_t nqkv = gqa_qkv_n(B, T, C, NH, NKV), nout = (size_t)B * T * C;
	size_t nl = (size_t)B * NH * T, nm = (size_t)B * T * 3 * C, W = nqkv / ((size_t)B * T), r;
	float *qkv = rand_bf(nqkv, 1.0f), *dout = rand_bf(nout, 1.0f);
	float *out = xmalloc(nout * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
	float *dqkv = xmalloc(nqkv * sizeof(float)), *mqkv = gqa_expand(qkv, B, T, C, NH, NKV);
	float *ws = xmalloc(mr_attn_layer_ws_floats(NULL, T, hs) * sizeof(float));
	float *g_out, *g_lse, *g_dqkv, *m_out, *m_lse, *m_dqkv, *sum, *d_lse, *d_mlse;
	void *d_qkv, *d_out, *d_dqkv, *d_dout, *d_mqkv, *d_mout, *d_mdqkv;

	cr_log_info("gqa layer %s B %d T %d C %d NH %d NKV %d", f32 ? "fp32" : "bf16", B, T, C, NH,
		    NKV);
	mr_cuda_disable_cudnn(cu);
	use_act(f32);
	d_qkv = up_act(qkv, nqkv);
	d_dout = up_act(dout, nout);
	d_out = act_alloc(nout);
	d_dqkv = up_act(rand_bf(nqkv, 10.0f), nqkv); /* old contents must not leak in */
	d_lse = dev_alloc(nl * sizeof(float));
	mr_attn_layer_fwd(NULL, out, lse, qkv, B, T, C, NH, NKV, ws);
	CU_OK(mr_cuda_attn_layer_fwd(cu, d_out, d_lse, d_qkv, B, T, C, NH, NKV));
	g_out = down_act(d_out, nout);
	g_lse = down_f32(d_lse, nl);
	check_close("gqa out", g_out, out, nout, f32 ? 1e-4 : BF_RTOL, f32 ? 1e-5 : BF_ATOL);
	check_close("gqa lse", g_lse, lse, nl, 1e-5, 1e-5);
	mr_attn_layer_bwd(NULL, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, ws);
	CU_OK(mr_cuda_attn_layer_bwd(cu, d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NKV));
	g_dqkv = down_act(d_dqkv, nqkv);
	check_close("gqa dqkv", g_dqkv, dqkv, nqkv, f32 ? 1e-3 : 2e-2, f32 ? 1e-4 : 1e-2);

	/* the multi-head run of the same attention */
	d_mqkv = up_act(mqkv, nm);
	d_mout = act_alloc(nout);
	d_mdqkv = act_alloc(nm);
	d_mlse = dev_alloc(nl * sizeof(float));
	CU_OK(mr_cuda_attn_layer_fwd(cu, d_mout, d_mlse, d_mqkv, B, T, C, NH, NH));
	m_out = down_act(d_mout, nout);
	m_lse = down_f32(d_mlse, nl);
	cr_assert(memcmp(g_out, m_out, nout * sizeof(float)) == 0, "gqa out != multi-head out");
	cr_assert(memcmp(g_lse, m_lse, nl * sizeof(float)) == 0, "gqa lse != multi-head lse");
	CU_OK(mr_cuda_attn_layer_bwd(cu, d_mdqkv, d_dout, d_mqkv, d_mout, d_mlse, B, T, C, NH,
				     NH));
	m_dqkv = down_act(d_mdqkv, nm);
	sum = xmalloc(nqkv * sizeof(float));
	memset(sum, 0, nqkv * sizeof(float));
	for (r = 0; r < (size_t)B * T; r++) {
		cr_assert(memcmp(g_dqkv + r * W, m_dqkv + r * 3 * C,
				 (size_t)C * sizeof(float)) == 0,
			  "gqa dq != multi-head dq in row %zu", r);
		memcpy(sum + r * W, g_dqkv + r * W, (size_t)C * sizeof(float));
		for (h = 0; h < NH; h++) {
			const float *mk = m_dqkv + r * 3 * C + C + (size_t)h * hs;
			float *sk = sum + r * W + C + (size_t)(h / G) * hs;
			int c;

			for (c = 0; c < hs; c++) {
				sk[c] += mk[c];                              /* dk */
				sk[(size_t)NKV * hs + c] += mk[(size_t)C + c]; /* dv */
			}
		}
	}
	/* bf16: each multi-head dk/dv was rounded before the sum, gqa's once */
	check_close("gqa dk/dv vs multi-head sums", g_dqkv, sum, nqkv, f32 ? 1e-5 : 2e-2,
		    f32 ? 1e-6 : 1e-2);

	/* deterministic: the same backward again, the same bits */
	CU_OK(mr_cuda_attn_layer_bwd(cu, d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NKV));
	m_dqkv = down_act(d_dqkv, nqkv);
	cr_assert(memcmp(g_dqkv, m_dqkv, nqkv * sizeof(float)) == 0,
		  "gqa backward not deterministic");
	free(sum);
}

Test(cuda_attn, grouped_query_layer_matches_cpu_and_multi_head)
{
	need_gpu();
	gqa_layer_case(1, 2, 37, 128, 4, 2);
	gqa_layer_case(0, 2, 37, 128, 4, 2);
	gqa_layer_case(1, 1, 45, 128, 4, 1); /* multi-query */
	gqa_layer_case(0, 1, 45, 128, 4, 1);
	gqa_layer_case(0, 1, 70, 512, 8, 2); /* hs 64, groups of 4 */
	gqa_layer_case(1, 1, 33, 512, 4, 2); /* hs 128 */
	gpu_teardown();
}

/* The context-parallel entries on a grouped-query layout (struct
 * mr_cuda_attn.NKV): queries [T/2, T) against key block [0, T/2) and
 * [T/2, T) each, fp32 partials and fp32 gradients (+=) against the CPU
 * slices (mr_attn_slice_*). */
static void gqa_slice_case(int NH, int NKV)
{
	int B = 2, T = 64, hs = 32, C = NH * hs, half = T / 2, blk;
	size_t W = (size_t)C + 2 * (size_t)NKV * hs, nqkv = (size_t)B * T * W;
	size_t no = (size_t)B * half * C, nl = (size_t)B * NH * half, kvw = (size_t)NKV * hs;
	size_t nkv = (size_t)B * T * kvw, ob = (size_t)half * C;
	float *qkv = rand_bf(nqkv, 1.0f), *dout = rand_bf(no, 1.0f);
	float *out = xmalloc(no * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
	float *delta = xmalloc(nl * sizeof(float)), *dq = xmalloc(no * sizeof(float));
	float *dk = xmalloc(nkv * sizeof(float)), *dv = xmalloc(nkv * sizeof(float));
	mr_bf16 *d_qkv = up_bf(qkv, nqkv), *d_dout = up_bf(dout, no);
	float *d_out = dev_alloc(no * sizeof(float)), *d_lse = dev_alloc(nl * sizeof(float));
	float *d_delta = dev_alloc(nl * sizeof(float)), *d_dq = dev_alloc(no * sizeof(float));
	float *d_dk = dev_alloc(nkv * sizeof(float)), *d_dv = dev_alloc(nkv * sizeof(float));

	use_act(0);
	memset(dq, 0, no * sizeof(float));
	memset(dk, 0, nkv * sizeof(float));
	memset(dv, 0, nkv * sizeof(float));
	CU_OK(mr_cuda_memset0(cu, d_dq, no * sizeof(float)));
	CU_OK(mr_cuda_memset0(cu, d_dk, nkv * sizeof(float)));
	CU_OK(mr_cuda_memset0(cu, d_dv, nkv * sizeof(float)));
	for (blk = 0; blk < 2; blk++) {
		size_t k0 = (size_t)blk * half * W, g0 = (size_t)blk * half * kvw;
		struct mr_attn_slice s;
		struct mr_cuda_attn a;

		memset(&s, 0, sizeof(s));
		memset(&a, 0, sizeof(a));
		s.q = qkv + (size_t)half * W;
		s.k = qkv + k0 + C;
		s.v = qkv + k0 + C + kvw;
		a.q = d_qkv + (size_t)half * W;
		a.k = d_qkv + k0 + C;
		a.v = d_qkv + k0 + C + kvw;
		s.q_row = s.kv_row = a.q_row = a.kv_row = W;
		s.q_batch = s.kv_batch = a.q_batch = a.kv_batch = (size_t)T * W;
		s.B = a.B = B;
		s.NH = a.NH = NH;
		s.NKV = a.NKV = NKV;
		s.hs = a.hs = hs;
		s.tq = s.tk = a.tq = a.tk = half;
		s.q_pos0 = a.q_pos0 = half;
		s.k_pos0 = a.k_pos0 = blk * half;
		s.causal = a.causal = 1;
		s.scale = a.scale = 1.0f / sqrtf((float)hs);
		/* a partial per block, then the backward with the block's own
		 * lse and delta (the entries do not care which lse it is) */
		cr_assert_eq(mr_attn_slice_fwd(NULL, &s, out, (size_t)C, ob, lse), 0);
		CU_OK(mr_cuda_attn_fwd_f32(cu, &a, d_out, (size_t)C, ob, d_lse));
		check_close("gqa slice out", down_f32(d_out, no), out, no, 1e-3, 1e-4);
		check_close("gqa slice lse", down_f32(d_lse, nl), lse, nl, 1e-5, 1e-5);
		mr_attn_slice_delta(NULL, delta, dout, out, B, NH, half, hs, (size_t)C, ob);
		CU_OK(mr_cuda_upload(cu, d_delta, delta, nl * sizeof(float)));
		CU_OK(mr_cuda_upload(cu, d_lse, lse, nl * sizeof(float)));
		cr_assert_eq(mr_attn_slice_bwd(NULL, &s, dout, (size_t)C, ob, lse, delta, dq,
					       (size_t)C, ob, dk + g0, dv + g0, kvw,
					       (size_t)T * kvw),
			     0);
		CU_OK(mr_cuda_attn_bwd_f32(cu, &a, d_dout, (size_t)C, ob, d_lse, d_delta, d_dq,
					   (size_t)C, ob, d_dk + g0, d_dv + g0, kvw,
					   (size_t)T * kvw));
	}
	check_close("gqa slice dq", down_f32(d_dq, no), dq, no, 1e-3, 1e-4);
	check_close("gqa slice dk", down_f32(d_dk, nkv), dk, nkv, 1e-3, 1e-4);
	check_close("gqa slice dv", down_f32(d_dv, nkv), dv, nkv, 1e-3, 1e-4);
}

Test(cuda_attn, grouped_query_slices_match_cpu)
{
	need_gpu();
	gqa_slice_case(4, 2);
	gqa_slice_case(4, 1);
	gpu_teardown();
}

/* A key/value head count that does not divide NH is refused, naming the
 * entry. */
Test(cuda_attn, bad_kv_head_count_is_rejected)
{
	mr_bf16 *qkv, *out;
	float *lse;

	need_gpu();
	qkv = dev_alloc(8 * 3 * 128 * sizeof(mr_bf16));
	out = dev_alloc(8 * 128 * sizeof(mr_bf16));
	lse = dev_alloc(4 * 8 * sizeof(float));
	cr_assert_eq(mr_cuda_attn_layer_fwd(cu, out, lse, qkv, 1, 8, 128, 4, 3), MR_EINVAL);
	cr_assert(strstr(mr_cuda_errmsg(cu), "attn_layer") != NULL, "%s", mr_cuda_errmsg(cu));
	cr_assert_eq(mr_cuda_attn_layer_fwd(cu, out, lse, qkv, 1, 8, 128, 4, 0), MR_EINVAL);
	gpu_teardown();
}

/* ---- the layer through cuDNN's fused flash attention (cudnn_attn.cu) ---- */

/* The cuDNN path must run on this GPU: fails where cuDNN cannot be used
 * (scripts/device-run.sh puts the device image's cuDNN on the library
 * path); skips only when the user turned it off. */
static void need_cudnn_path(void)
{
	const char *env = getenv("MESHRUN_CUDNN");
	char why[256] = "";

	if (env && env[0] == '0')
		cr_skip_test("MESHRUN_CUDNN=0: the cuDNN attention is off");
	cr_assert_eq(mr__dnn_load(why, sizeof(why)), 0, "a GPU without a usable cuDNN: %s", why);
}

/* bytes of 0xff at d: NaN in bf16 and in fp32, so an element the call
 * does not write fails every comparison below. */
static void poison(void *d, size_t bytes)
{
	unsigned char *h = xmalloc(bytes);

	memset(h, 0xff, bytes);
	cr_assert_eq(mr_cuda_upload(cu, d, h, bytes), 0, "%s", mr_cuda_errmsg(cu));
	free(h);
}

static size_t nonfinite(const float *x, size_t n)
{
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		k += !isfinite(x[i]);
	return k;
}

/* ||a - b|| / ||b|| over columns [c0, c0 + w) of rows of width W. */
static double rel_l2_cols(const float *a, const float *b, size_t rows, size_t W, size_t c0,
			  size_t w)
{
	double d = 0.0, nb = 0.0;

	for (size_t r = 0; r < rows; r++)
		for (size_t c = c0; c < c0 + w; c++) {
			double x = a[r * W + c], y = b[r * W + c];
			d += (x - y) * (x - y);
			nb += y * y;
		}
	return nb > 0.0 ? sqrt(d / nb) : sqrt(d);
}

/* The n bytes at d. */
static unsigned char *down_bytes(const void *d, size_t n)
{
	unsigned char *h = xmalloc(n);

	cr_assert_eq(mr_cuda_download(cu, h, d, n), 0, "%s", mr_cuda_errmsg(cu));
	return h;
}

/* One call of the layer ran through cuDNN since fast0 calls, none fell
 * back. */
static void ran_fast(const char *what, long fast0, long fb0)
{
	const char *why = "";
	long fb = mr_cuda_attn_fallbacks(cu, &why);

	cr_assert_eq(mr_cuda_attn_fast_calls(cu), fast0 + 1, "the %s did not run through cuDNN: %s",
		     what, why);
	cr_assert_eq(fb, fb0, "the %s fell back: %s", what, why);
}

/* The layer (B,T,NH,NKV,hs) in bf16 through cuDNN against the fp32 CPU
 * twin: out, lse, then dq, dk, dv; outputs poisoned before each call;
 * forward and backward run twice into fresh poisoned buffers: the same
 * bits. */
static void cudnn_case(int B, int T, int NH, int NKV, int hs)
{
	int C = NH * hs;
	size_t W = (size_t)C + 2 * (size_t)NKV * hs, rows = (size_t)B * T, nqkv = rows * W;
	size_t nout = rows * C, nl = (size_t)B * NH * T, kvw = (size_t)NKV * hs;
	float *qkv = rand_bf(nqkv, 1.0f), *dout = rand_bf(nout, 1.0f);
	float *out = xmalloc(nout * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
	float *dqkv = xmalloc(nqkv * sizeof(float));
	float *ws = xmalloc(mr_attn_layer_ws_floats(NULL, T, hs) * sizeof(float));
	float *g_out, *g_lse, *g_dqkv, *d_lse, *d_lse2;
	void *d_qkv, *d_dout, *d_out, *d_out2, *d_dqkv, *d_dqkv2;
	unsigned char *b1, *b2;
	double e_out, e_lse, e_dq, e_dk, e_dv;
	long fast0, fb0;

	use_act(0);
	d_qkv = up_bf(qkv, nqkv);
	d_dout = up_bf(dout, nout);
	d_out = act_alloc(nout);
	d_out2 = act_alloc(nout);
	d_lse = dev_alloc(nl * sizeof(float));
	d_lse2 = dev_alloc(nl * sizeof(float));
	d_dqkv = act_alloc(nqkv);
	d_dqkv2 = act_alloc(nqkv);
	mr_attn_layer_fwd(NULL, out, lse, qkv, B, T, C, NH, NKV, ws);
	mr_attn_layer_bwd(NULL, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV, ws);

	poison(d_out, nout * sizeof(mr_bf16));
	poison(d_lse, nl * sizeof(float));
	fast0 = mr_cuda_attn_fast_calls(cu);
	fb0 = mr_cuda_attn_fallbacks(cu, NULL);
	CU_OK(mr_cuda_attn_layer_fwd(cu, d_out, d_lse, d_qkv, B, T, C, NH, NKV));
	ran_fast("forward", fast0, fb0);
	g_out = down_bf(d_out, nout);
	g_lse = down_f32(d_lse, nl);
	cr_assert_eq(nonfinite(g_out, nout), 0, "out: %zu of %zu elements unwritten or not finite",
		     nonfinite(g_out, nout), nout);
	cr_assert_eq(nonfinite(g_lse, nl), 0, "lse: %zu of %zu unwritten or not finite",
		     nonfinite(g_lse, nl), nl);
	e_out = rel_l2(g_out, out, nout);
	e_lse = rel_l2(g_lse, lse, nl);

	poison(d_dqkv, nqkv * sizeof(mr_bf16));
	fast0 = mr_cuda_attn_fast_calls(cu);
	CU_OK(mr_cuda_attn_layer_bwd(cu, d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NKV));
	ran_fast("backward", fast0, fb0);
	g_dqkv = down_bf(d_dqkv, nqkv);
	cr_assert_eq(nonfinite(g_dqkv, nqkv), 0, "dqkv: %zu of %zu unwritten or not finite",
		     nonfinite(g_dqkv, nqkv), nqkv);
	e_dq = rel_l2_cols(g_dqkv, dqkv, rows, W, 0, (size_t)C);
	e_dk = rel_l2_cols(g_dqkv, dqkv, rows, W, (size_t)C, kvw);
	e_dv = rel_l2_cols(g_dqkv, dqkv, rows, W, (size_t)C + kvw, kvw);
	cr_log_info("cudnn B %d T %d NH %d NKV %d hs %d: rel L2 out %.3g lse %.3g dq %.3g dk %.3g "
		    "dv %.3g", B, T, NH, NKV, hs, e_out, e_lse, e_dq, e_dk, e_dv);
	cr_expect(e_out <= 1e-2, "out rel L2 %g", e_out);
	cr_expect(e_lse <= 1e-3, "lse rel L2 %g", e_lse);
	cr_expect(e_dq <= 1e-2, "dq rel L2 %g", e_dq);
	cr_expect(e_dk <= 1e-2, "dk rel L2 %g", e_dk);
	cr_expect(e_dv <= 1e-2, "dv rel L2 %g", e_dv);

	/* the same bits again */
	poison(d_out2, nout * sizeof(mr_bf16));
	poison(d_lse2, nl * sizeof(float));
	poison(d_dqkv2, nqkv * sizeof(mr_bf16));
	CU_OK(mr_cuda_attn_layer_fwd(cu, d_out2, d_lse2, d_qkv, B, T, C, NH, NKV));
	CU_OK(mr_cuda_attn_layer_bwd(cu, d_dqkv2, d_dout, d_qkv, d_out, d_lse, B, T, C, NH, NKV));
	cr_assert_eq(mr_cuda_attn_fast_calls(cu), fast0 + 3);
	b1 = down_bytes(d_out, nout * sizeof(mr_bf16));
	b2 = down_bytes(d_out2, nout * sizeof(mr_bf16));
	cr_expect(memcmp(b1, b2, nout * sizeof(mr_bf16)) == 0, "forward out not deterministic");
	free(b1);
	free(b2);
	b1 = down_bytes(d_lse, nl * sizeof(float));
	b2 = down_bytes(d_lse2, nl * sizeof(float));
	cr_expect(memcmp(b1, b2, nl * sizeof(float)) == 0, "forward lse not deterministic");
	free(b1);
	free(b2);
	b1 = down_bytes(d_dqkv, nqkv * sizeof(mr_bf16));
	b2 = down_bytes(d_dqkv2, nqkv * sizeof(mr_bf16));
	cr_expect(memcmp(b1, b2, nqkv * sizeof(mr_bf16)) == 0, "backward not deterministic");
	free(b1);
	free(b2);
	free(qkv);
	free(dout);
	free(out);
	free(lse);
	free(dqkv);
	free(ws);
	free(g_out);
	free(g_lse);
	free(g_dqkv);
}

/* T 1024 and 4096, head sizes 64 and 128, NKV = NH and NKV < NH: each
 * pair of those once (GPT-2's shape first, B 2). */
Test(cuda_attn, cudnn_layer_T1024_matches_cpu, .timeout = 300)
{
	need_gpu();
	need_cudnn_path();
	cudnn_case(2, 1024, 12, 12, 64);
	cudnn_case(1, 1024, 8, 2, 128);
	gpu_teardown();
}

Test(cuda_attn, cudnn_layer_T4096_matches_cpu, .timeout = 300)
{
	need_gpu();
	need_cudnn_path();
	cudnn_case(1, 4096, 4, 2, 64);
	cudnn_case(1, 4096, 4, 4, 128);
	gpu_teardown();
}

/* What the cuDNN path does not take falls back to the block-wise kernels
 * counted and named (fp32 activations); turned off, nothing is counted. */
Test(cuda_attn, cudnn_fallback_is_counted_and_named)
{
	int B = 1, T = 128, NH = 2, C = 128;
	void *qkv, *out;
	float *lse;
	const char *why = "";
	long fb0;

	need_gpu();
	need_cudnn_path();
	use_act(1);
	qkv = act_alloc((size_t)B * T * 3 * C);
	out = act_alloc((size_t)B * T * C);
	lse = dev_alloc((size_t)B * NH * T * sizeof(float));
	CU_OK(mr_cuda_memset0(cu, qkv, (size_t)B * T * 3 * C * sizeof(float)));
	fb0 = mr_cuda_attn_fallbacks(cu, NULL);
	CU_OK(mr_cuda_attn_layer_fwd(cu, out, lse, qkv, B, T, C, NH, NH));
	cr_assert_eq(mr_cuda_attn_fallbacks(cu, &why), fb0 + 1);
	cr_assert(strstr(why, "fp32") != NULL, "%s", why);
	cr_assert_eq(mr_cuda_attn_fast_calls(cu), 0);
	mr_cuda_disable_cudnn(cu);
	CU_OK(mr_cuda_attn_layer_fwd(cu, out, lse, qkv, B, T, C, NH, NH));
	cr_assert_eq(mr_cuda_attn_fallbacks(cu, NULL), fb0 + 1, "counted while turned off");
	gpu_teardown();
}
