/*
 * test_cudnn_graph.c - the cuDNN attention graphs (runtime/cuda/
 * cudnn_graph.cu) built here, without a GPU: for the shapes the layer runs
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
 * Then cuDNN itself is asked whether its engines take the graphs: the
 * operation graph finalized without a handle (cuDNN 9.8 and later) and
 * cuDNN's heuristics run for an H200 described, not present (device
 * properties in cuDNN's JSON form; cuDNN's engines only need libcuda.so.1
 * to load - the driver's, or the CUDA toolkit's stub here), through the
 * same functions the device's plan building calls: each graph must get at
 * least one engine config (cuDNN's fused attention engines recognise it
 * as scaled dot-product attention); their engines and numerical notes are
 * logged.
 *
 * What needs a GPU is not here: plans (they compile and load kernels) and
 * execution; tests/gpu/test_cuda_attention.c runs the graphs on a GPU
 * against the CPU twin.
 *
 * Skipped where libcudnn.so.9 cannot be loaded (or is older than the
 * fast path's minimum), naming why; the engine check also where no
 * libcuda.so.1 loads or this cuDNN does not take the JSON description.
 */
#include <criterion/criterion.h>
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cudnn_graph.h"

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

/* ---- cuDNN's engines, for an H200 described rather than present ------- */

/* An H200 (sm 9.0, 132 SMs, 141 GB, 60 MB of L2) in cuDNN's JSON form of
 * device properties (the keys libcudnn_graph.so.9 9.19 reads; deviceVer
 * is major * 100 + minor * 10). */
static const char H200[] =
	"{\"maxGridSize\":[2147483647,65535,65535],\"maxBlockSize\":[1024,1024,64],"
	"\"regsPerBlock\":65536,\"multiProcessorCount\":132,\"warpSize\":32,"
	"\"maxSharedMemoryPerBlock\":49152,\"maxSharedMemoryPerBlockOptin\":232448,"
	"\"reservedSharedMemoryPerBlock\":1024,\"maxRegistersPerSM\":65536,\"maxCtasPerSM\":32,"
	"\"maxThreadsPerBlock\":1024,\"maxThreadsPerSM\":2048,\"pciDeviceId\":9013,"
	"\"isTccDriver\":0,\"supportCoopLaunch\":1,\"totalGlobalMem\":150754820096,"
	"\"smClockRateKHz\":1980000,\"memClockRateKHz\":3201000,\"l2CacheSize\":62914560,"
	"\"cudaDeviceId\":0,\"deviceVer\":900,\"driverVer\":13000,"
	"\"deviceName\":\"NVIDIA H200\"}";

/* libcuda.so.1 loaded for cuDNN's engines to find: the driver's, else the
 * CUDA toolkit's stub (same soname; its functions fail, which choosing an
 * engine does not need); skips when neither loads. */
static void need_libcuda(void)
{
	const char *home = getenv("CUDA_HOME");
	char path[512];

	if (dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL))
		return;
	snprintf(path, sizeof(path), "%s/lib64/stubs/libcuda.so", home ? home : "/usr/local/cuda");
	if (!dlopen(path, RTLD_NOW | RTLD_GLOBAL))
		cr_skip_test("no libcuda.so.1 and no stub at %s: %s", path, dlerror());
}

/* s's graph finalized without a handle gets engine configs from cuDNN's
 * heuristics for the described GPU dp. */
static void engines_case(void *dp, int B, int T, int NH, int NKV, int hs, enum mr__dnn_dir dir)
{
	struct mr__dnn_shape s = { B, T, NH, NKV, hs, dir };
	const char *name = dir == MR__DNN_FWD ? "fwd" : "bwd";
	struct mr__dnn_ops g;
	void *graph = NULL, *cfgs[8];
	char why[512] = "", line[256];
	size_t at = 0;
	int n;

	cr_assert_eq(mr__dnn_ops_build(&g, &s, why, sizeof(why)), 0, "%s: %s", name, why);
	cr_assert_eq(mr__dnn_graph(&g, NULL, &graph, why, sizeof(why)), 0, "%s: %s", name, why);
	n = mr__dnn_engine_configs(graph, dp, cfgs, 8, why, sizeof(why));
	cr_assert_gt(n, 0, "%s B %d T %d NH %d NKV %d hs %d: no engine of cuDNN takes the graph: %s",
		     name, B, T, NH, NKV, hs, why);
	line[0] = '\0';
	for (int i = 0; i < n; i++) {
		int64_t index;
		int nondet;

		cr_expect_eq(mr__dnn_engine_info(cfgs[i], &index, &nondet), 0);
		at += (size_t)snprintf(line + at, at < sizeof(line) ? sizeof(line) - at : 0,
				       " %lld%s", (long long)index, nondet ? "(nondet)" : "");
		mr__dnn_destroy(cfgs[i]);
	}
	cr_log_info("%s B %d T %d NH %d NKV %d hs %d: engines%s", name, B, T, NH, NKV, hs, line);
	mr__dnn_destroy(graph);
	mr__dnn_ops_release(&g);
}

Test(cudnn_graph, cudnn_engines_take_the_graphs_on_a_described_h200, .timeout = 300)
{
	static const int shapes[][3] = { { 12, 12, 64 }, { 12, 12, 128 }, { 32, 8, 64 },
					 { 32, 8, 128 } };
	char why[512] = "";
	void *dp;

	need_cudnn();
	need_libcuda();
	dp = mr__dnn_devprop(H200, why, sizeof(why));
	if (!dp)
		cr_skip_test("this cuDNN does not take the H200's description: %s", why);
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++)
		for (int T = 1024; T <= 4096; T *= 4) {
			engines_case(dp, 2, T, shapes[i][0], shapes[i][1], shapes[i][2],
				     MR__DNN_FWD);
			engines_case(dp, 2, T, shapes[i][0], shapes[i][1], shapes[i][2],
				     MR__DNN_BWD);
		}
	engines_case(dp, 1, 256, 4, 1, 64, MR__DNN_BWD); /* multi-query, a short T */
	mr__dnn_destroy(dp);
}
