/*
 * test_cudnn_graph.c - the cuDNN attention graphs (runtime/cuda/
 * cudnn_attn.cu) built here, without a GPU: for the shapes the layer runs
 * (T 1024 and 4096, head sizes 64 and 128, 12 query heads on 12 key/value
 * heads and 32 on 8, B 2), forward and backward, every tensor, pointwise,
 * matmul and reduction descriptor and every operation of the real
 * builder (mr__dnn_ops_build, the code the device runs) is made and
 * finalized by libcudnn.so.9 - which checks attribute ids and types,
 * dimensions, strides and the operations' shape agreement - and the
 * tensors that hold memory are read back from cuDNN and compared with the
 * packed qkv / out / lse layouts written out here independently. The rules
 * that refuse a shape or a cuDNN version are checked too.
 *
 * What needs a GPU is not here: the operation graph, cuDNN's heuristics
 * and plans need a cuDNN handle (cudnnCreate fails without a device);
 * tests/gpu/test_cuda_attention.c runs the graphs on a GPU against the CPU
 * twin.
 *
 * Skipped where libcudnn.so.9 cannot be loaded (or is older than the
 * fast path's minimum), naming why.
 */
#include <criterion/criterion.h>
#include <cudnn_graph.h>
#include <string.h>

#include "cuda/cudnn_attn.h"

static void need_cudnn(void)
{
	char why[256];

	if (mr__dnn_load(why, sizeof(why)))
		cr_skip_test("no usable cuDNN: %s", why);
}

/* Tensor slot s of g has type t, dims d and strides st (4 each). */
static void expect_tensor(const struct mr__dnn_ops *g, enum mr__dnn_io s, const char *name,
			  int t, const int64_t d[4], const int64_t st[4])
{
	int64_t gd[4], gs[4];
	int gt;

	cr_assert_not_null(g->io[s], "%s is not in the variant pack", name);
	cr_assert_eq(mr__dnn_tensor_get(g->io[s], &gt, gd, gs), 0, "%s: unreadable", name);
	cr_expect_eq(gt, t, "%s: data type %d, want %d", name, gt, t);
	for (int i = 0; i < 4; i++) {
		cr_expect_eq(gd[i], d[i], "%s: dim %d is %lld, want %lld", name, i,
			     (long long)gd[i], (long long)d[i]);
		cr_expect_eq(gs[i], st[i], "%s: stride %d is %lld, want %lld", name, i,
			     (long long)gs[i], (long long)st[i]);
	}
}

/* Builds s's graph and checks it: every descriptor finalized, the
 * operation count, the variant pack's tensors and their layouts. */
static void graph_case(int B, int T, int NH, int NKV, int hs, enum mr__dnn_dir dir)
{
	struct mr__dnn_shape s = { B, T, NH, NKV, hs, dir };
	struct mr__dnn_ops g;
	char why[256] = "";
	/* the layouts: qkv rows of W elements (NH query heads, then NKV key,
	 * then NKV value heads), out rows of C, lse (B,NH,T) */
	int64_t W = (int64_t)(NH + 2 * NKV) * hs, C = (int64_t)NH * hs, BT = (int64_t)T;
	int64_t q[4] = { B, NH, T, hs }, q_st[4] = { BT * W, hs, W, 1 };
	int64_t kt[4] = { B, NKV, hs, T }, kt_st[4] = { BT * W, hs, 1, W };
	int64_t kv[4] = { B, NKV, T, hs }, kv_st[4] = { BT * W, hs, W, 1 };
	int64_t o[4] = { B, NH, T, hs }, o_st[4] = { BT * C, hs, C, 1 };
	int64_t l[4] = { B, NH, T, 1 }, l_st[4] = { (int64_t)NH * T, T, 1, 1 };
	int64_t one[4] = { 1, 1, 1, 1 };
	int want_ops = dir == MR__DNN_FWD ? 14 : NKV == NH ? 21 : 23;

	cr_log_info("%s B %d T %d NH %d NKV %d hs %d", dir == MR__DNN_FWD ? "fwd" : "bwd", B, T,
		    NH, NKV, hs);
	cr_assert_eq(mr__dnn_ops_build(&g, &s, why, sizeof(why)), 0,
		     "%s graph B %d T %d NH %d NKV %d hs %d: %s",
		     dir == MR__DNN_FWD ? "fwd" : "bwd", B, T, NH, NKV, hs, why);
	cr_expect_eq(g.nops, want_ops, "%d operations, want %d", g.nops, want_ops);
	for (int i = 0; i < g.nops; i++)
		cr_expect_not_null(g.ops[i], "operation %d (%s)", i, g.op_name[i]);
	expect_tensor(&g, MR__DNN_Q, "Q", CUDNN_DATA_BFLOAT16, q, q_st);
	expect_tensor(&g, MR__DNN_K, "K^T", CUDNN_DATA_BFLOAT16, kt, kt_st);
	expect_tensor(&g, MR__DNN_O, "O", CUDNN_DATA_BFLOAT16, o, o_st);
	expect_tensor(&g, MR__DNN_STATS, "Stats", CUDNN_DATA_FLOAT, l, l_st);
	expect_tensor(&g, MR__DNN_SCALE, "scale", CUDNN_DATA_FLOAT, one, one);
	expect_tensor(&g, MR__DNN_NEG_INF, "-inf", CUDNN_DATA_FLOAT, one, one);
	if (dir == MR__DNN_FWD) {
		expect_tensor(&g, MR__DNN_V, "V", CUDNN_DATA_BFLOAT16, kv, kv_st);
		for (int i = MR__DNN_DO; i < MR__DNN_NIO; i++)
			if (i != MR__DNN_SCALE && i != MR__DNN_NEG_INF)
				cr_expect_null(g.io[i], "forward has variant-pack slot %d", i);
	} else {
		expect_tensor(&g, MR__DNN_V, "V^T", CUDNN_DATA_BFLOAT16, kt, kt_st);
		expect_tensor(&g, MR__DNN_DO, "dO", CUDNN_DATA_BFLOAT16, o, o_st);
		expect_tensor(&g, MR__DNN_DQ, "dQ", CUDNN_DATA_BFLOAT16, q, q_st);
		expect_tensor(&g, MR__DNN_DK, "dK", CUDNN_DATA_BFLOAT16, kv, kv_st);
		expect_tensor(&g, MR__DNN_DV, "dV", CUDNN_DATA_BFLOAT16, kv, kv_st);
		expect_tensor(&g, MR__DNN_ONE, "one", CUDNN_DATA_FLOAT, one, one);
		expect_tensor(&g, MR__DNN_DSUM, "Dsum", CUDNN_DATA_FLOAT, l, l_st);
	}
	mr__dnn_ops_release(&g);
	cr_expect_eq(g.ndesc, 0);
}

static void both_directions(int T, int NH, int NKV, int hs)
{
	graph_case(2, T, NH, NKV, hs, MR__DNN_FWD);
	graph_case(2, T, NH, NKV, hs, MR__DNN_BWD);
}

Test(cudnn_graph, multi_head_graphs_finalize_T1024_and_T4096)
{
	need_cudnn();
	both_directions(1024, 12, 12, 64);
	both_directions(1024, 12, 12, 128);
	both_directions(4096, 12, 12, 64);
	both_directions(4096, 12, 12, 128);
}

Test(cudnn_graph, grouped_query_graphs_finalize_T1024_and_T4096)
{
	need_cudnn();
	both_directions(1024, 32, 8, 64);
	both_directions(1024, 32, 8, 128);
	both_directions(4096, 32, 8, 64);
	both_directions(4096, 32, 8, 128);
	both_directions(1024, 4, 1, 64); /* multi-query */
}

/* A graph of a bad shape fails with the reason, and releasing what was
 * made is safe. */
Test(cudnn_graph, bad_shape_fails_naming_it)
{
	struct mr__dnn_shape s = { 1, 64, 12, 5, 64, MR__DNN_FWD }; /* 5 does not divide 12 */
	struct mr__dnn_ops g;
	char why[256] = "";

	need_cudnn();
	cr_assert_eq(mr__dnn_ops_build(&g, &s, why, sizeof(why)), -1);
	cr_expect(strstr(why, "NKV 5") != NULL, "%s", why);
	mr__dnn_ops_release(&g);
	cr_expect_eq(g.ndesc, 0);
}

/* The refusal rules (no library needed): the version floor and its
 * known-bad releases, head sizes, the backward's T before 9.15.1. */
Test(cudnn_graph, refusal_rules)
{
	struct mr__dnn_shape f = { 2, 1000, 12, 4, 64, MR__DNN_FWD };
	struct mr__dnn_shape b = { 2, 1000, 12, 4, 64, MR__DNN_BWD };
	char why[256];

	cr_expect_eq(mr__dnn_refuses(&f, 91900, why, sizeof(why)), 0, "%s", why);
	cr_expect_eq(mr__dnn_refuses(&b, 91900, why, sizeof(why)), 0, "%s", why);
	cr_expect_eq(mr__dnn_refuses(&f, 91002, why, sizeof(why)), 0, "%s", why);
	cr_expect_eq(mr__dnn_refuses(&f, 91001, why, sizeof(why)), 1);
	cr_expect(strstr(why, "older") != NULL, "%s", why);
	cr_expect_eq(mr__dnn_refuses(&f, 90800, why, sizeof(why)), 1);
	/* T not a multiple of 128: the backward before 9.15.1 only */
	cr_expect_eq(mr__dnn_refuses(&b, 91500, why, sizeof(why)), 1);
	cr_expect(strstr(why, "multiple of 128") != NULL, "%s", why);
	cr_expect_eq(mr__dnn_refuses(&f, 91500, why, sizeof(why)), 0, "%s", why);
	b.T = 1024;
	cr_expect_eq(mr__dnn_refuses(&b, 91500, why, sizeof(why)), 0, "%s", why);
	b.T = 1;
	cr_expect_eq(mr__dnn_refuses(&b, 91900, why, sizeof(why)), 1);
	/* head sizes: multiples of 8 up to 128 */
	f.hs = 128;
	cr_expect_eq(mr__dnn_refuses(&f, 91900, why, sizeof(why)), 0, "%s", why);
	f.hs = 256;
	cr_expect_eq(mr__dnn_refuses(&f, 91900, why, sizeof(why)), 1);
	cr_expect(strstr(why, "head size 256") != NULL, "%s", why);
	f.hs = 36;
	cr_expect_eq(mr__dnn_refuses(&f, 91900, why, sizeof(why)), 1);
}

/* The library loads once: the version is what it reports, at least the
 * minimum. */
Test(cudnn_graph, loads_once_with_its_version)
{
	char why[256] = "";

	need_cudnn();
	cr_expect_geq(mr__dnn_version(), MR__DNN_MIN_VERSION);
	cr_expect_eq(mr__dnn_load(why, sizeof(why)), 0, "%s", why);
	cr_log_info("cuDNN %ld", mr__dnn_version());
}
