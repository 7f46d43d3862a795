/*
 * test_plan_llama.c - the planner and the llama family: the Llama 3
 * presets' parameters to the integer against the published sizes (Dubey
 * et al. 2024: 8.03B, 70.6B, 405.9B), FLOPs per token against the
 * runtime's own count (mr_gpt_flops_per_token on a real llama model),
 * activations of the SwiGLU MLP and grouped-query attention, the mesh
 * rules llama adds (tp dividing the key/value heads or a multiple of them,
 * replicating them, and dividing the SwiGLU width),
 * cp over grouped-query attention (ulysses' whole key/value heads),
 * Mixtral 8x7B's count and SwiGLU experts' parameters and FLOPs,
 * a workload config with "arch": "llama" read and every plan of it
 * accepted by the worker, and the published deployments - Llama 3 405B
 * on 16,384 H100s as tp 8, cp 1, pp 16, dp 128 (the paper's Table 4) and
 * torchtitan's Llama 3 8B on 8 GPUs under FSDP - among the plans that
 * fit. The ledger of llama jobs against the runtime's is
 * test_plan_ledger.c.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "cpu/mr_pool.h"
#include "model/mr_gpt.h"
#include "mr_gpt_worker.h"
#include "plan/mr_plan.h"
#include "plan/plan_int.h"

static void preset(const char *name, struct mr_plan_model *m)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };

	cr_assert_eq(mr_plan_model_preset(name, m, &eb), 0, "%s", eb.msg);
}

/* V C (embedding) + L (C + C (NH + 2 NKV) hs + C NH hs + C + 3 F C) + C +
 * V C (untied head), computed by hand from Table 3's shapes. */
Test(plan_llama, llama3_presets_have_the_published_parameter_counts)
{
	static const struct {
		const char *name;
		double params, published;
	} rows[] = {
		{ "llama3-8b", 8030261248.0, 8.03e9 },
		{ "llama3-70b", 70553706496.0, 70.6e9 },
		{ "llama3-405b", 405853388800.0, 405.9e9 },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct mr_plan_model m;
		preset(rows[i].name, &m);
		cr_expect_eq(m.arch, MR_ARCH_LLAMA, "%s", rows[i].name);
		cr_expect_eq(m.seq_len, 8192, "%s: Llama 3's pre-training sequence", rows[i].name);
		cr_expect_eq(m.rope_theta, 500000.0, "%s", rows[i].name);
		cr_expect_eq(mr_plan_params(&m), rows[i].params, "%s: %.0f parameters, want %.0f",
			     rows[i].name, mr_plan_params(&m), rows[i].params);
		cr_expect(fabs(mr_plan_params(&m) - rows[i].published) < 0.05e9,
			  "%s: %.3fB rounds to the published %.2fB", rows[i].name,
			  mr_plan_params(&m) / 1e9, rows[i].published / 1e9);
	}
}

/* Mixtral 8x7B (Jiang et al. 2024): V C + L (C + C (NH + 2 NKV) hs +
 * C NH hs + C + E C + E 3 F C) + C + V C by hand - 131,072,000 twice,
 * 41,947,136 + 1,409,323,008 a layer, the final 4,096: the published
 * 46.7B. */
Test(plan_llama, mixtral_preset_has_the_published_parameter_count)
{
	struct mr_plan_model m;

	preset("mixtral-8x7b", &m);
	cr_expect_eq(m.arch, MR_ARCH_LLAMA);
	cr_expect(m.moe_every == 1 && m.n_experts == 8 && m.top_k == 2, "8 experts top-2");
	cr_expect_eq(mr_plan_params(&m), 46702792704.0, "%.0f parameters", mr_plan_params(&m));
	cr_expect(fabs(mr_plan_params(&m) - 46.7e9) < 0.05e9, "%.3fB",
		  mr_plan_params(&m) / 1e9);
}

/* The runtime's config of a plan's model, with its tensors counted by the
 * runtime: the planner's parameter count is the model's, tied or not. */
static size_t runtime_params(const struct mr_plan_model *pm, size_t *flops_per_token)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_gpt_config gc;
	struct mr_pool *pool = NULL;
	struct mr_gpt m;
	size_t n = 0;

	mr__plan_gpt_config(pm, &gc);
	cr_assert_eq(mr_pool_create(&pool, 1), 0);
	cr_assert_eq(mr_gpt_create(&m, &gc, 1, pm->seq_len, pool, &eb), 0, "%s", eb.msg);
	for (int i = 0; i < m.ntensors; i++)
		n += m.tensors[i].n;
	*flops_per_token = mr_gpt_flops_per_token(&m);
	mr_gpt_release(&m);
	mr_pool_free(pool);
	return n;
}

/* Planner and runtime count FLOPs alike (6N + 6LCT per token, N the
 * matrices a token passes): the runtime's N also has the norms' weights
 * (2C a layer and the final C), the planner's GEMMs only. */
Test(plan_llama, params_and_flops_equal_the_runtime_model)
{
	static const struct {
		int kv, ffn, tied, moe_every;
	} shapes[] = { { 2, 0, 0, 0 }, { 4, 384, 0, 0 }, { 1, 160, 1, 0 }, { 2, 0, 0, 2 },
		       { 2, 160, 1, 1 } };

	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		struct mr_plan_input in;
		struct mr_plan_mesh one = { .tp = 1, .cp = 1, .pp = 1, .dp = 1, .ep = 1, .v = 1,
					    .micro_batch = 1 };
		struct mr__plan_stage st;
		struct mr_errbuf eb = { { 0 }, { 0 } };
		double L, C, planned;
		size_t flops, n;

		mr_plan_input_init(&in);
		preset("llama-tiny", &in.model);
		in.model.n_kv_head = shapes[i].kv;
		in.model.ffn_hidden = shapes[i].ffn;
		in.model.tie_embeddings = shapes[i].tied;
		in.model.moe_every = shapes[i].moe_every; /* SwiGLU experts, 4 top-2 */
		in.model.n_experts = shapes[i].moe_every ? 4 : 0;
		in.model.top_k = shapes[i].moe_every ? 2 : 0;
		in.model.capacity_factor = 1.25;
		n = runtime_params(&in.model, &flops);
		cr_expect_eq(mr_plan_params(&in.model), (double)n, "shape %zu: planned %.0f, runtime %zu",
			     i, mr_plan_params(&in.model), n);
		cr_assert_eq(mr__plan_stage(&in, &one, NULL, 0, 0, &st, &eb), 0, "%s", eb.msg);
		cr_expect_eq((double)st.params, (double)n, "the one stage holds the whole model");
		L = in.model.n_layer;
		C = in.model.d_model;
		planned = 3 * mr__plan_fwd_flops(&in, &one, &st) / in.model.seq_len;
		cr_expect_eq(planned + 6 * (2 * L * C + C), (double)flops,
			     "shape %zu: planned %.0f + norms, runtime %zu", i, planned, flops);
		mr__plan_stage_release(&st);
	}
}

/* Korthikanti et al.'s per-layer count with Llama's changes, at 2 bytes
 * (s b h units): no dropout masks, one softmax copy (2as/h), Q K V of
 * (NH + 2 NKV) hs columns, gate | up and the SwiGLU output 3F. */
Test(plan_llama, megatron_activations_count_swiglu_and_gqa)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = { .tp = 8, .cp = 1, .pp = 1, .ep = 1, .v = 1, .sp = 1,
				  .micro_batch = 1, .zero = 1 };
	struct mr_plan_mem pm;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	double s = 8192, h = 16384, a = 128, t = 8, qkv = (128 + 2 * 8) * 128.0, F = 53248;
	double none, sel, per_sel, per_none;

	mr_plan_input_init(&in);
	preset("llama3-405b", &in.model);
	cr_assert_eq(mr_plan_cluster_preset("h100", 8, &in.cluster, &eb), 0);
	in.impl = MR_PLAN_MEGATRON;
	in.prec = MR_PLAN_MIXED;
	in.global_batch = 1;
	in.model.n_layer = 2;   /* two layers: their difference is one */
	m.recompute = MR_PLAN_RC_NONE;
	cr_assert_eq(mr_plan_mesh_check(&in, &m, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_mem_stage(&in, &m, 0, &pm, &eb), 0, "%s", eb.msg);
	none = pm.bytes[MR_MEM_ACTS];
	in.model.n_layer = 1;
	cr_assert_eq(mr_plan_mem_stage(&in, &m, 0, &pm, &eb), 0, "%s", eb.msg);
	none -= pm.bytes[MR_MEM_ACTS];
	in.model.n_layer = 2;
	m.recompute = MR_PLAN_RC_SELECTIVE;
	cr_assert_eq(mr_plan_mem_stage(&in, &m, 0, &pm, &eb), 0, "%s", eb.msg);
	sel = pm.bytes[MR_MEM_ACTS];
	in.model.n_layer = 1;
	cr_assert_eq(mr_plan_mem_stage(&in, &m, 0, &pm, &eb), 0, "%s", eb.msg);
	sel -= pm.bytes[MR_MEM_ACTS];
	/* sp: the two norms' inputs and outputs split by t, the rest by tp */
	per_sel = 2 * s * (4 * h / t + (qkv + h + 2 * F + F) / t);
	per_none = per_sel + 2 * a * s * s / t;
	cr_expect(fabs(sel - per_sel) < 1, "selective: %.0f, want %.0f", sel, per_sel);
	cr_expect(fabs(none - per_none) < 1, "none: %.0f, want %.0f", none, per_none);
}

Test(plan_llama, meshrun_activations_carve_gate_up_and_grouped_qkv)
{
	/* one llama layer on one rank, fp32, as gpt_params.c carves it */
	struct mr_plan_input in;
	struct mr_plan_mesh m = { .tp = 1, .cp = 1, .pp = 1, .ep = 1, .v = 1, .micro_batch = 2 };
	struct mr_plan_mem pm;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	double N = 2 * 64, C = 128, qkv = (4 + 2 * 2) * 32.0, F = 384, two, one;

	mr_plan_input_init(&in);
	preset("llama-tiny", &in.model);
	cr_assert_eq(mr_plan_cluster_local(1, 1, &in.cluster, &eb), 0);
	in.prec = MR_PLAN_FP32;
	in.global_batch = 2;
	in.model.n_layer = 2;
	cr_assert_eq(mr_plan_mesh_check(&in, &m, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_mem_stage(&in, &m, 0, &pm, &eb), 0, "%s", eb.msg);
	two = pm.bytes[MR_MEM_ACTS];
	in.model.n_layer = 1;
	cr_assert_eq(mr_plan_mem_stage(&in, &m, 0, &pm, &eb), 0, "%s", eb.msg);
	one = pm.bytes[MR_MEM_ACTS];
	/* ln1, qkv, atty, res2, ln2, gate|up, swiglu, res3; 4 rows of N
	 * (means, rstds) and the lse of N x NH: every piece a multiple of 256 */
	cr_expect_eq(two - one, 4 * N * (C + qkv + C + C + C + 2 * F + F + C) + 4 * 4 * N +
				      4 * N * 4);
}

Test(plan_llama, tp_must_share_the_kv_heads_and_divide_the_swiglu_width)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = { .tp = 4, .cp = 1, .pp = 1, .ep = 1, .v = 1, .micro_batch = 1 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	preset("llama-tiny", &in.model); /* 4 heads, 2 of them key/value */
	in.global_batch = 8;
	/* tp 4 over 2 key/value heads replicates them (pairs share one) */
	cr_expect_eq(mr_plan_mesh_check(&in, &m, &eb), 0, "%s", eb.msg);
	/* 2 key/value heads over tp 3: neither splits nor replicates */
	mr_errbuf_clear(&eb);
	m = (struct mr_plan_mesh){ .tp = 3, .cp = 1, .pp = 1, .ep = 1, .v = 1, .micro_batch = 1 };
	in.model.n_head = 6;
	cr_expect_eq(mr_plan_mesh_check(&in, &m, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "tp");
	cr_expect(strstr(eb.msg, "key/value heads"), "%s", eb.msg);
	in.model.n_head = 4;
	mr_errbuf_clear(&eb);
	m = (struct mr_plan_mesh){ .tp = 2, .cp = 1, .pp = 1, .ep = 1, .v = 1, .micro_batch = 1 };
	in.model.ffn_hidden = 385;
	cr_expect_eq(mr_plan_mesh_check(&in, &m, &eb), MR_EINVAL);
	cr_expect(strstr(eb.msg, "SwiGLU"), "%s", eb.msg);
	mr_errbuf_clear(&eb);
}

/* tp above n_kv_head: each block's backward also sums its k and v weight
 * gradients (2 C hs fp32) over the ranks sharing the heads (layers/tp.c):
 * llama-tiny at tp 4 over 2 key/value heads, pairs - a ring all-reduce of
 * 2 ranks sends (2 (2 - 1) / 2) x 2 C hs x 4 bytes per block and
 * micro-batch; with 4 key/value heads (split, not shared) nothing more. */
Test(plan_llama, replicated_kv_heads_sum_their_weight_gradients)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = { .tp = 4, .cp = 1, .pp = 1, .dp = 1, .ep = 1, .v = 1,
				  .micro_batch = 1, .zero = 0, .sp = 0, .schedule = 1 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan rep, split;
	double C, hs, blocks;

	mr_plan_input_init(&in);
	preset("llama-tiny", &in.model);
	cr_assert_eq(mr_plan_cluster_preset("h100", 4, &in.cluster, &eb), 0, "%s", eb.msg);
	in.global_batch = 8;
	C = in.model.d_model;
	hs = C / in.model.n_head;
	cr_assert_eq(mr_plan_mesh_check(&in, &m, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_eval(&in, &m, &rep, &eb), 0, "%s", eb.msg);
	in.model.n_kv_head = in.model.n_head;
	cr_assert_eq(mr_plan_eval(&in, &m, &split, &eb), 0, "%s", eb.msg);
	blocks = (double)in.model.n_layer * m.micro_batches;
	/* the activations' collectives send rows of C either way */
	cr_expect(rep.time.comm[MR_AXIS_TP].bytes - split.time.comm[MR_AXIS_TP].bytes ==
			  blocks * 2 * C * hs * 4,
		  "kv sum bytes %g, want %g",
		  rep.time.comm[MR_AXIS_TP].bytes - split.time.comm[MR_AXIS_TP].bytes,
		  blocks * 2 * C * hs * 4);
}

/* Grouped-query attention runs under every cp algorithm (layers/cp.c);
 * ulysses gives each rank a group of whole query and key/value heads, so
 * cp must divide both per tp rank, as mr_cp_create refuses naming the
 * field. */
Test(plan_llama, cp_takes_gqa_and_ulysses_needs_whole_kv_heads)
{
	static const struct {
		int algo, cp;
		const char *field; /* NULL: accepted */
	} rows[] = {
		{ MR_CP_RING, 2, NULL },     { MR_CP_ALLGATHER, 2, NULL },
		{ MR_CP_ULYSSES, 2, NULL },  { MR_CP_RING, 4, NULL },
		{ MR_CP_ULYSSES, 4, "n_kv_head" },
	};
	struct mr_plan_input in;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	preset("llama-tiny", &in.model); /* 4 heads, 2 of them key/value; seq 64 */
	in.global_batch = 8;
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct mr_plan_mesh m = { .tp = 1, .cp = rows[i].cp, .pp = 1, .ep = 1, .v = 1,
					  .micro_batch = 1, .cp_algo = rows[i].algo };
		int rc;
		in.cluster.gpus = rows[i].cp;
		mr_errbuf_clear(&eb);
		rc = mr_plan_mesh_check(&in, &m, &eb);
		if (!rows[i].field) {
			cr_expect_eq(rc, 0, "%s cp %d: %s", mr_plan_cp_algo_name(rows[i].algo),
				     rows[i].cp, eb.msg);
			continue;
		}
		cr_expect_eq(rc, MR_EINVAL, "%s cp %d", mr_plan_cp_algo_name(rows[i].algo),
			     rows[i].cp);
		cr_expect_str_eq(eb.field, rows[i].field);
		cr_expect(strstr(eb.msg, "2 key/value heads"), "%s", eb.msg);
	}
}

/* A llama MoE model is planned (SwiGLU experts, kernels/mr_moe.h), and ep
 * splits its experts. */
Test(plan_llama, llama_moe_is_planned)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = { .tp = 1, .cp = 1, .pp = 1, .ep = 2, .v = 1, .micro_batch = 1 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr__plan_stage st;

	mr_plan_input_init(&in);
	preset("llama-tiny", &in.model);
	in.model.moe_every = 2;
	in.model.n_experts = 4;
	in.model.top_k = 2;
	in.model.capacity_factor = 1.25;
	in.global_batch = 8;
	in.cluster.gpus = 2;
	cr_assert_eq(mr_plan_check(&in, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_mesh_check(&in, &m, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr__plan_stage(&in, &m, NULL, 0, 0, &st, &eb), 0, "%s", eb.msg);
	/* two MoE layers of 2 local experts' gate | up and down (3 F C) */
	cr_expect_eq(st.moe_layers, 2);
	cr_expect_eq((double)st.experts, 2 * 2 * 3 * 384.0 * 128);
	mr__plan_stage_release(&st);
}

#define LLAMA "{\"arch\":\"llama\",\"n_layer\":4,\"d_model\":64,\"n_head\":4,\"n_kv_head\":2," \
	      "\"seq_len\":32,\"vocab_size\":96,\"batch_size\":1,\"grad_accum\":4"

Test(plan_llama, workload_config_plans_the_runtime_model_and_every_plan_runs)
{
	json_t *c = json_loads(LLAMA ",\"ffn_hidden\":160,\"tie_embeddings\":true,"
				     "\"rope_theta\":10000}",
			       0, NULL);
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int world = 4, tps = 0, cps = 0, reps = 0;

	cr_assert_not_null(c);
	cr_assert_eq(mr_plan_cluster_local(world, 1, &in.cluster, &eb), 0);
	cr_assert_eq(mr_plan_from_workload(c, world, &in, &eb), 0, "%s", eb.msg);
	cr_expect_eq(in.model.arch, MR_ARCH_LLAMA);
	cr_expect_eq(in.model.n_kv_head, 2);
	cr_expect_eq(in.model.ffn_hidden, 160);
	cr_expect_eq(in.model.tie_embeddings, 1);
	cr_expect_eq(in.model.rope_theta, 10000.0);
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.n > 0);
	for (int i = 0; i < r.n; i++) {
		const struct mr_plan_mesh *m = &r.plan[i].mesh;
		json_t *planned = json_deep_copy(c);
		struct mr_worker_env env = { 0 };
		struct mr_place where;
		char line[160];

		mr_plan_mesh_format(m, line, sizeof(line));
		tps += m->tp == 2;
		reps += m->tp == 4; /* replicated key/value heads */
		cps += m->cp > 1;
		cr_assert_eq(mr_plan_to_workload(m, planned), 0);
		env.world_size = world;
		env.tp = m->tp;
		env.pp = m->pp;
		env.cp = m->cp;
		env.ep = m->ep;
		for (int rank = 0; rank < world; rank++) {
			mr_errbuf_clear(&eb);
			env.rank = rank;
			cr_expect_eq(mr_gpt_worker_place(planned, &env, &where, NULL, &eb), 0,
				     "plan %s, rank %d: %s", line, rank, eb.msg);
		}
		json_decref(planned);
	}
	cr_expect(tps > 0, "tp 2 is among the plans");
	cr_expect(reps > 0, "tp 4 over 2 key/value heads is among the plans");
	cr_expect(cps > 0, "cp over grouped-query attention is among the plans");
	mr_plan_result_release(&r);
	json_decref(c);
}

/* ---- published deployments -------------------------------------------- */

static int has_mesh(const struct mr_plan_result *r, int tp, int cp, int pp, int dp)
{
	for (int i = 0; i < r->fitting; i++) {
		const struct mr_plan_mesh *m = &r->plan[i].mesh;
		if (m->tp == tp && m->cp == cp && m->pp == pp && m->dp == dp)
			return 1;
	}
	return 0;
}

/* Dubey et al. 2024, Table 4: 405B on 16,384 H100 80GB, tp 8, cp 1, pp 16,
 * dp 128, 16M tokens a step (2,048 sequences of 8,192), micro-batch 1. */
Test(plan_llama, llama3_405b_on_16k_h100_as_published)
{
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	preset("llama3-405b", &in.model);
	cr_assert_eq(mr_plan_cluster_preset("h100", 16384, &in.cluster, &eb), 0);
	in.impl = MR_PLAN_MEGATRON;
	in.prec = MR_PLAN_MIXED;
	in.global_batch = 2048;
	in.fix.micro_batch = 1;
	in.fix.tp = 8;
	in.fix.pp = 16;
	in.fix.cp = 1;
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_expect(has_mesh(&r, 8, 1, 16, 128), "tp 8 cp 1 pp 16 dp 128 must fit (%d of %d do)",
		  r.fitting, r.n);
	mr_plan_result_release(&r);
	/* and it could have failed: without a pipeline, sharding only the
	 * optimizer state, 405.9B / 8 x 4 bytes of weights and gradients
	 * alone are 203 GB a GPU */
	in.fix.pp = 1;
	in.fix.zero = 1;
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_expect_eq(r.fitting, 0, "405B on tp 8 under ZeRO-1 fits nowhere");
	mr_plan_result_release(&r);
}

/* torchtitan's Llama 3 8B recipe: 8 GPUs, FSDP (ZeRO-3) over all of them,
 * one 8,192-token sequence per GPU. */
Test(plan_llama, llama3_8b_fsdp_on_8_h100)
{
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	preset("llama3-8b", &in.model);
	cr_assert_eq(mr_plan_cluster_preset("h100", 8, &in.cluster, &eb), 0);
	in.impl = MR_PLAN_MEGATRON;
	in.prec = MR_PLAN_MIXED;
	in.global_batch = 8;
	in.fix.micro_batch = 1;
	in.fix.tp = in.fix.pp = in.fix.cp = 1;
	in.fix.zero = 3;
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_expect(has_mesh(&r, 1, 1, 1, 8), "FSDP over 8 GPUs must fit (%d of %d do)", r.fitting,
		  r.n);
	mr_plan_result_release(&r);
	/* while plain data parallelism (16 bytes a parameter: 128 GB) cannot */
	in.fix.zero = 0;
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_expect_eq(r.fitting, 0, "8B without ZeRO fits no 80 GB GPU");
	mr_plan_result_release(&r);
}
