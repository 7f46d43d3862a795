/*
 * test_plan.c - the planner (runtime/plan/mr_plan.h) against published
 * figures, and its search, time model and bad input:
 *   ZeRO (Rajbhandari et al. 2020, section 5): 7.5B parameters on 64 GPUs
 *     with mixed-precision Adam need 120 / 31.4 / 16.6 / 1.9 GB per GPU
 *     under DDP / ZeRO-1 / ZeRO-2 / ZeRO-3 - by the formula and through
 *     a whole plan of a 7.5B model;
 *   Korthikanti et al. 2022 (Table 2): activations per layer without
 *     parallelism, with tp, tp + sp, selective and full recompute, exactly;
 *   Megatron-LM 2021 (Narayanan et al., Table 1, and GPT-3 175B on tp 8 x
 *     pp 16): each published mesh is among the plans that fit 80 GB A100s.
 * The runtime's own ledger and measured step times: test_plan_ledger.c
 * and test_plan_rank.c.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "core/mr_place.h"
#include "mr_gpt_worker.h"
#include "mr_mesh.h"
#include "parallel/mr_pp_sched.h"
#include "plan/mr_plan.h"

static int near(double a, double b, double rel)
{
	return fabs(a - b) <= rel * fabs(b);
}

/* ---- the ZeRO paper ------------------------------------------------------------ */

static const double zero_paper_gb[4] = { 120, 31.4, 16.6, 1.9 };

Test(plan, zero_paper_model_states_7_5b_on_64_gpus)
{
	for (int z = 0; z <= 3; z++) {
		double s[3];
		mr_plan_states(7.5e9, MR_PLAN_MIXED, z, 64, s);
		double gb = (s[0] + s[1] + s[2]) / 1e9;
		cr_expect(near(gb, zero_paper_gb[z], 0.02), "ZeRO-%d: %.2f GB, the paper %.1f", z,
			  gb, zero_paper_gb[z]);
	}
}

/* The same through a whole plan: Megatron's 7.5B model (7.46B parameters)
 * on 64 GPUs in pure data parallel, model states of the rank. */
Test(plan, zero_paper_through_a_plan)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = { .tp = 1, .cp = 1, .pp = 1, .ep = 1, .micro_batch = 1,
				  .recompute = MR_PLAN_RC_FULL, .cp_algo = MR_CP_RING };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	cr_assert_eq(mr_plan_model_preset("megatron-7.5b", &in.model, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_cluster_preset("a100-80g", 64, &in.cluster, &eb), 0);
	in.impl = MR_PLAN_MEGATRON;
	in.prec = MR_PLAN_MIXED;
	in.global_batch = 64;
	for (int z = 0; z <= 3; z++) {
		struct mr_plan p;
		m.zero = z;
		m.dp = 0;
		cr_assert_eq(mr_plan_mesh_check(&in, &m, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_plan_eval(&in, &m, &p, &eb), 0, "%s", eb.msg);
		double gb = (p.mem.bytes[MR_MEM_PARAMS] + p.mem.bytes[MR_MEM_GRADS] +
			     p.mem.bytes[MR_MEM_OPTIM]) /
			    1e9 * 7.5e9 / mr_plan_params(&in.model);
		cr_expect(near(gb, zero_paper_gb[z], 0.02),
			  "ZeRO-%d: %.2f GB scaled to 7.5B, the paper %.1f", z, gb, zero_paper_gb[z]);
	}
}

/* ---- Korthikanti et al. 2022 ----------------------------------------------------- */

static double act(double s, double b, double h, double a, int t, int sp, int rc)
{
	return mr_plan_act_layer(MR_PLAN_MEGATRON, MR_PLAN_MIXED, s, b, h, a, t, sp, rc);
}

Test(plan, korthikanti_activations_per_layer_exactly)
{
	/* GPT-3 175B's layer and a small one, over the paper's tp degrees */
	static const double shapes[][4] = { { 2048, 1, 12288, 96 }, { 1024, 4, 1024, 16 } };

	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		double s = shapes[i][0], b = shapes[i][1], h = shapes[i][2], a = shapes[i][3];
		double sbh = s * b * h;
		cr_expect(near(act(s, b, h, a, 1, 0, MR_PLAN_RC_NONE), sbh * (34 + 5 * a * s / h),
			       1e-12),
			  "no parallelism: sbh(34 + 5as/h)");
		for (int t = 2; t <= 8; t *= 2) {
			cr_expect(near(act(s, b, h, a, t, 0, MR_PLAN_RC_NONE),
				       sbh * (10 + 24.0 / t + 5 * a * s / (h * t)), 1e-12),
				  "tp %d: sbh(10 + 24/t + 5as/ht)", t);
			cr_expect(near(act(s, b, h, a, t, 1, MR_PLAN_RC_NONE),
				       sbh * (34.0 / t + 5 * a * s / (h * t)), 1e-12),
				  "tp %d + sp: sbh(34/t + 5as/ht)", t);
			cr_expect(near(act(s, b, h, a, t, 0, MR_PLAN_RC_SELECTIVE),
				       sbh * (10 + 24.0 / t), 1e-12),
				  "tp %d + selective recompute: sbh(10 + 24/t)", t);
			cr_expect(near(act(s, b, h, a, t, 1, MR_PLAN_RC_SELECTIVE), sbh * 34.0 / t,
				       1e-12),
				  "tp %d + sp + selective recompute: 34sbh/t", t);
			cr_expect(near(act(s, b, h, a, t, 0, MR_PLAN_RC_FULL), 2 * sbh, 1e-12),
				  "tp %d + full recompute: 2sbh", t);
		}
	}
	/* meshrun keeps 16 activation elements per token and h (no dropout
	 * masks, no scores), a log-sum-exp per head and mean/rstd per LayerNorm */
	cr_expect(near(mr_plan_act_layer(MR_PLAN_MESHRUN, MR_PLAN_FP32, 64, 8, 128, 4, 1, 0, 0),
		       64.0 * 8 * (16 * 128 * 4 + 4 * 4 + 4 * 4), 1e-12));
}

/* ---- Megatron-LM 2021 ------------------------------------------------------------ */

/* Megatron-LM's setting: mixed precision, full recomputation, micro-batch
 * 1, no ZeRO, on 80 GB A100s. */
static void megatron_input(struct mr_plan_input *in, const char *model, int gpus, int batch)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(in);
	cr_assert_eq(mr_plan_model_preset(model, &in->model, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_cluster_preset("a100-80g", gpus, &in->cluster, &eb), 0);
	in->impl = MR_PLAN_MEGATRON;
	in->prec = MR_PLAN_MIXED;
	in->global_batch = batch;
	in->fix.micro_batch = 1;
	in->fix.zero = 0;
	in->fix.recompute = MR_PLAN_RC_FULL;
	in->fix.cp = 1;
}

/* 1 if a plan with tp t and pp p (and cp 1) fits. */
static int published_fits(const struct mr_plan_result *r, int t, int p)
{
	for (int i = 0; i < r->fitting; i++)
		if (r->plan[i].mesh.tp == t && r->plan[i].mesh.pp == p && r->plan[i].mesh.cp == 1)
			return 1;
	return 0;
}

Test(plan, megatron_gpt3_175b_tp8_pp16_fits_80gb)
{
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	megatron_input(&in, "gpt3-175b", 1024, 1536);
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_expect(r.fitting > 0 && r.fitting < r.n, "%d of %d fit", r.fitting, r.n);
	cr_expect(published_fits(&r, 8, 16), "tp 8 x pp 16 must be among the plans that fit");
	/* and the search could have said otherwise: one GPU's share of the
	 * model states alone is 175B x 16 bytes / 8 = 350 GB without pp */
	cr_expect(!published_fits(&r, 8, 1), "tp 8 without a pipeline cannot fit");
	for (int i = 1; i < r.fitting; i++)
		cr_expect(r.plan[i - 1].time.step_s <= r.plan[i].time.step_s, "ranked by step time");
	mr_plan_result_release(&r);
}

Test(plan, megatron_2021_table1_meshes_fit_80gb)
{
	static const struct {
		const char *model;
		int t, p, gpus, batch;
	} rows[] = {
		{ "megatron-1.7b", 1, 1, 32, 512 },    { "megatron-3.6b", 2, 1, 64, 512 },
		{ "megatron-7.5b", 4, 1, 128, 512 },   { "megatron-18b", 8, 1, 256, 1024 },
		{ "megatron-39b", 8, 2, 512, 1536 },   { "megatron-76b", 8, 4, 1024, 1792 },
		{ "megatron-146b", 8, 8, 1536, 2304 }, { "megatron-310b", 8, 16, 1920, 2160 },
		{ "megatron-530b", 8, 35, 2520, 2520 }, { "megatron-1t", 8, 64, 3072, 3072 },
	};

	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct mr_plan_input in;
		struct mr_plan_result r = { 0 };
		struct mr_errbuf eb = { { 0 }, { 0 } };

		megatron_input(&in, rows[i].model, rows[i].gpus, rows[i].batch);
		in.fix.tp = rows[i].t;
		in.fix.pp = rows[i].p;
		cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
		cr_expect(published_fits(&r, rows[i].t, rows[i].p),
			  "%s on %d GPUs: tp %d x pp %d must fit (%d of %d plans do; closest %.1f "
			  "GB)",
			  rows[i].model, rows[i].gpus, rows[i].t, rows[i].p, r.fitting, r.n,
			  r.n ? r.plan[0].mem.total / 1e9 : 0.0);
		mr_plan_result_release(&r);
	}
}

/* ---- the search ---------------------------------------------------------------- */

Test(plan, every_plan_obeys_the_mesh_rules)
{
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	cr_assert_eq(mr_plan_model_preset("gpt2-moe-8x", &in.model, &eb), 0);
	cr_assert_eq(mr_plan_cluster_preset("h100", 32, &in.cluster, &eb), 0);
	in.global_batch = 64;
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.n > 0 && r.fitting > 0);
	int ep_seen = 0, ep_zero_seen = 0;
	for (int i = 0; i < r.n; i++) {
		const struct mr_plan_mesh *m = &r.plan[i].mesh;
		cr_expect_eq(m->tp * m->cp * m->pp * m->dp, 32);
		cr_expect(in.model.n_head % m->tp == 0 && m->tp <= 8, "tp %d", m->tp);
		cr_expect(m->cp == 1 || in.model.seq_len % (2 * m->cp) == 0, "cp %d", m->cp);
		cr_expect(m->ep == 1 || (8 % m->ep == 0 && (m->dp * m->cp) % m->ep == 0), "ep");
		cr_expect(!(m->ep > 1 && m->hsdp_shard), "meshrun runs ep without HSDP");
		cr_expect_eq(m->recompute, MR_PLAN_RC_NONE, "meshrun recomputes only when nothing fits");
		cr_expect_eq(m->dp * m->micro_batch * m->micro_batches, 64);
		if (m->pp > 1 && (m->schedule == MR_PP_1F1B || m->schedule == MR_PP_ZBH1))
			cr_expect(m->micro_batches >= m->pp, "1F1B needs m >= pp");
		if (m->pp > 1 && m->schedule == MR_PP_INTERLEAVED)
			cr_expect(m->micro_batches % m->pp == 0 && m->v >= 2);
		if (i > 0 && r.plan[i].fits == r.plan[i - 1].fits && r.plan[i].fits)
			cr_expect(r.plan[i - 1].time.step_s <= r.plan[i].time.step_s);
		cr_expect(i < r.fitting ? r.plan[i].fits : !r.plan[i].fits, "fitting plans first");
		ep_seen |= m->ep > 1;
		ep_zero_seen |= m->ep > 1 && m->zero > 0;
	}
	cr_expect(ep_seen, "expert parallel meshes are enumerated for a MoE model");
	cr_expect(ep_zero_seen, "and with ZeRO, which the runtime runs");
	mr_plan_result_release(&r);
}

/* With the links made free, the step is compute and the schedule's bubble:
 * (p-1)/m for 1F1B and GPipe, (p-1)/(v m) interleaved, a third of 1F1B's
 * for zb-h1 (F = B/2 = W). */
Test(plan, pipeline_bubble_per_schedule)
{
	static const struct {
		int kind, v;
		double bubble;
	} want[] = { { MR_PP_GPIPE, 1, 3.0 / 8 },
		     { MR_PP_1F1B, 1, 3.0 / 8 },
		     { MR_PP_INTERLEAVED, 2, 3.0 / 16 },
		     { MR_PP_ZBH1, 1, 1.0 / 8 } };
	struct mr_plan_input in;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	cr_assert_eq(mr_plan_model_preset("gpt2-350m", &in.model, &eb), 0);
	in.cluster.gpus = 4;
	in.cluster.bw_intra = in.cluster.bw_inter = 1e30;
	in.cluster.lat_intra = in.cluster.lat_inter = 0;
	in.global_batch = 8;
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
		struct mr_plan_mesh m = { .tp = 1, .cp = 1, .pp = 4, .ep = 1, .micro_batch = 1,
					  .schedule = want[i].kind, .v = want[i].v };
		struct mr_plan p;
		cr_assert_eq(mr_plan_mesh_check(&in, &m, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_plan_eval(&in, &m, &p, &eb), 0, "%s", eb.msg);
		cr_expect(near(p.time.bubble_s / p.time.compute_s, want[i].bubble, 1e-9),
			  "%s: bubble %.4f of compute, want %.4f",
			  mr_pp_kind_name((enum mr_pp_kind)want[i].kind),
			  p.time.bubble_s / p.time.compute_s, want[i].bubble);
	}
}

/* The data-parallel volume per step is the ring's: DDP all-reduces the
 * fp32 gradients, 2 (n-1)/n of them sent per rank; ZeRO-1 reduce-scatters
 * them and all-gathers the parameters, the same bytes. */
Test(plan, data_parallel_volume_is_the_rings)
{
	struct mr_plan_input in;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	cr_assert_eq(mr_plan_model_preset("gpt2-124m", &in.model, &eb), 0);
	in.cluster.gpus = 8;
	in.prec = MR_PLAN_FP32;
	in.global_batch = 8;
	for (int z = 0; z <= 1; z++) {
		struct mr_plan_mesh m = { .tp = 1, .cp = 1, .pp = 1, .ep = 1, .micro_batch = 1,
					  .zero = z };
		struct mr_plan p;
		cr_assert_eq(mr_plan_mesh_check(&in, &m, &eb), 0);
		cr_assert_eq(mr_plan_eval(&in, &m, &p, &eb), 0);
		cr_expect(near(p.time.comm[MR_AXIS_DP].bytes,
			       2.0 * 7 / 8 * 4 * mr_plan_params(&in.model), 1e-9),
			  "zero %d: %.0f bytes", z, p.time.comm[MR_AXIS_DP].bytes);
		cr_expect_eq(p.time.comm[MR_AXIS_TP].ops, 0);
	}
}

/* ---- bad input --------------------------------------------------------------- */

Test(plan, unknown_presets_and_bad_inputs_name_the_field)
{
	struct mr_plan_input in;
	struct mr_plan_model m;
	struct mr_plan_cluster c;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	cr_expect_eq(mr_plan_model_preset("gpt5", &m, &eb), MR_ENOTFOUND);
	cr_expect_str_eq(eb.field, "model");
	cr_expect(strstr(eb.msg, "gpt2-124m"), "the message lists the presets: %s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_plan_cluster_preset("tpu-v9", 8, &c, &eb), MR_ENOTFOUND);
	cr_expect_str_eq(eb.field, "cluster");
	mr_plan_input_init(&in);
	mr_plan_model_preset("gpt2-124m", &in.model, NULL);
	in.global_batch = 0;
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_plan_check(&in, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "global_batch");
	in.global_batch = 8;
	in.model.n_head = 7;
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_plan_check(&in, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "n_head");
}

Test(plan, nothing_fits_shows_the_closest_plan_and_its_limit)
{
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	char why[512];

	megatron_input(&in, "gpt3-175b", 8, 8);
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.n > 0);
	cr_expect_eq(r.fitting, 0, "175B on one node cannot fit");
	mr_plan_limit(&in, &r.plan[0], why, sizeof(why));
	cr_expect(strstr(why, "GB per GPU") && strstr(why, "80.0 available") &&
			  strstr(why, "raise"),
		  "%s", why);
	for (int i = 1; i < r.n; i++)
		cr_expect(r.plan[0].mem.total <= r.plan[i].mem.total, "the closest comes first");
	mr_plan_result_release(&r);
}

Test(plan, a_world_with_no_valid_mesh_says_why)
{
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(&in);
	cr_assert_eq(mr_plan_model_preset("gpt2-124m", &in.model, &eb), 0);
	in.cluster.gpus = 13; /* prime, above the 12 layers, not dividing the batch */
	in.global_batch = 8;
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_expect_eq(r.n, 0);
	cr_expect(r.refused[0], "a reason is kept");
	mr_plan_result_release(&r);
}

/* ---- text and workload configs ---------------------------------------------------- */

Test(plan, mesh_text_parses_and_refuses_unknown_keys)
{
	struct mr_plan_mesh m;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	char buf[160];

	cr_assert_eq(mr_plan_mesh_parse("tp=8,pp=16,dp=12,mb=1,zero=1,schedule=interleaved,"
					"recompute=full,cp_algo=ulysses",
					&m, &eb),
		     0, "%s", eb.msg);
	cr_expect(m.tp == 8 && m.pp == 16 && m.dp == 12 && m.micro_batch == 1 && m.zero == 1);
	cr_expect(m.schedule == MR_PP_INTERLEAVED && m.recompute == MR_PLAN_RC_FULL &&
		  m.cp_algo == MR_CP_ULYSSES);
	cr_expect(m.sp == -1 && m.cp == 0, "unset keys are \"any\"");
	m.sp = 1;
	m.micro_batches = 128;
	m.v = 2;
	mr_plan_mesh_format(&m, buf, sizeof(buf));
	cr_expect(strstr(buf, "tp=8") && strstr(buf, "pp=16") && strstr(buf, "mb=1x128") &&
			  strstr(buf, "interleaved"),
		  "%s", buf);
	cr_expect_eq(mr_plan_mesh_parse("tp=2,ppp=3", &m, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "mesh");
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_plan_mesh_parse("tp=two", &m, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "tp");
}

Test(plan, workload_config_in_and_out)
{
	json_t *c = json_loads("{\"n_layer\":4,\"d_model\":64,\"n_head\":4,\"seq_len\":32,"
			       "\"batch_size\":2,\"grad_accum\":3,\"zero\":1}",
			       0, NULL);
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	cr_assert_not_null(c);
	cr_assert_eq(mr_plan_cluster_local(4, 1, &in.cluster, &eb), 0);
	cr_assert_eq(mr_plan_from_workload(c, 4, &in, &eb), 0, "%s", eb.msg);
	cr_expect_eq(in.model.vocab, 256, "the worker's default vocabulary");
	cr_expect_eq(in.global_batch, 2 * 3 * 4, "batch_size x grad_accum x world");
	cr_expect_eq(in.fix.micro_batch, 2);
	cr_expect_eq(in.fix.zero, 1, "what the config sets is fixed");
	cr_expect_eq(in.fix.sp, -1, "what it does not is searched");
	cr_expect_eq(in.prec, MR_PLAN_FP32);
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.fitting > 0);
	cr_assert_eq(mr_plan_to_workload(&r.plan[0].mesh, c), 0);
	cr_expect_eq(mr_gpt_worker_check_config(c, &eb), 0, "the plan's config is the worker's: %s",
		     eb.msg);
	cr_expect_eq(json_integer_value(json_object_get(c, "batch_size")) *
			     json_integer_value(json_object_get(c, "grad_accum")) *
			     r.plan[0].mesh.dp,
		     24, "the global batch is kept");
	mr_plan_result_release(&r);
	json_decref(c);

	c = json_loads("{\"n_layer\":4,\"pp_layers\":[2,2]}", 0, NULL);
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_plan_from_workload(c, 2, &in, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "pp_layers");
	json_decref(c);
	c = json_loads("{\"n_layers\":4}", 0, NULL);
	mr_errbuf_clear(&eb);
	cr_expect(mr_plan_from_workload(c, 2, &in, &eb) < 0);
	cr_expect(strstr(eb.msg, "n_layers"), "an unknown key is named: %s", eb.msg);
	json_decref(c);
}

/* Every plan the search finds is a job the runtime accepts: its workload
 * config placed on every rank of its mesh as the worker places it (the
 * mesh, the split, the schedule against the micro-batches). */
static void runtime_accepts_every_plan(const char *js, int world)
{
	json_t *c = json_loads(js, 0, NULL);
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	cr_assert_not_null(c);
	cr_assert_eq(mr_plan_cluster_local(world, 1, &in.cluster, &eb), 0);
	cr_assert_eq(mr_plan_from_workload(c, world, &in, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.n > 0);
	for (int i = 0; i < r.n; i++) {
		const struct mr_plan_mesh *m = &r.plan[i].mesh;
		json_t *planned = json_deep_copy(c);
		struct mr_worker_env env = { 0 };
		struct mr_place where;
		char line[160];

		mr_plan_mesh_format(m, line, sizeof(line));
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
				     "%s: plan %s, rank %d: %s", js, line, rank, eb.msg);
		}
		json_decref(planned);
	}
	mr_plan_result_release(&r);
	json_decref(c);
}

Test(plan, the_runtime_accepts_every_plan)
{
	runtime_accepts_every_plan("{\"n_layer\":4,\"d_model\":64,\"n_head\":4,\"seq_len\":32,"
				   "\"batch_size\":1,\"grad_accum\":2}",
				   8);
	runtime_accepts_every_plan("{\"n_layer\":4,\"d_model\":64,\"n_head\":4,\"seq_len\":32,"
				   "\"batch_size\":1,\"grad_accum\":4,\"moe_every\":2,"
				   "\"n_experts\":4,\"top_k\":2,\"cp_algo\":\"ulysses\"}",
				   4);
	runtime_accepts_every_plan("{\"n_layer\":4,\"d_model\":64,\"n_head\":4,\"seq_len\":32,"
				   "\"batch_size\":1,\"grad_accum\":4,"
				   "\"pp_schedule\":\"interleaved\"}",
				   4);
}
