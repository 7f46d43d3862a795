/*
 * test_plan_memory.c - the planner's price of meshrun's memory levers
 * (runtime/plan/mr_plan.h): activation recomputation and offload.
 *
 * Recomputation is checked against numbers worked out by hand from the
 * runtime's contract (model/gpt_params.c's carve_acts, 256-byte pieces):
 * per micro-batch slot and recomputing block, selective drops ln1 and ln2
 * with their mean and rstd and the GELU / SwiGLU output; full keeps only
 * the block's output (res3); the stage carves once a recompute layer of
 * one block's dropped tensors (the dense MLP's only if a recomputing block
 * is dense; under full, if one is MoE, the MoE acts and one (Nl, C)
 * output piece - a dense block's recomputation stops before its output). Each expectation is the difference from the same mesh
 * without recomputation (what the blocks drop, less the scratch), so the
 * ends of the model, the workspace and zb-h1's stash cancel.
 *
 * Offload: the AdamW moments (and the fp32 master of the bf16 layout)
 * move to MR_MEM_HOST on GPUs, nothing moves on the cpu device; the
 * offloaded step's time is the host's pass plus the PCIe copies.
 * And the round trip of recompute and offload through a workload config
 * (what --mesh auto runs).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <string.h>

#include "kernels/mr_moe.h"
#include "model/mr_gpt.h"
#include "mr_gpt_worker.h"
#include "parallel/mr_pp_sched.h"
#include "plan/mr_plan.h"

/* A 4-block model of C 128, 4 heads, vocabulary 256, 64 positions on
 * `ranks` local (cpu, fp32) ranks; arch llama: 2 key/value heads, SwiGLU
 * of 384. */
static void tiny(struct mr_plan_input *in, int arch, int ranks, int batch)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };

	mr_plan_input_init(in);
	cr_assert_eq(mr_plan_model_preset(arch == MR_ARCH_LLAMA ? "llama-tiny" : "tiny",
					  &in->model, &eb),
		     0);
	cr_assert_eq(mr_plan_cluster_local(ranks, 1, &in->cluster, &eb), 0, "%s", eb.msg);
	in->prec = MR_PLAN_FP32;
	in->global_batch = batch;
}

static struct mr_plan_mesh mesh(int tp, int sp, int pp, int mb, int schedule)
{
	struct mr_plan_mesh m = { .tp = tp, .cp = 1, .pp = pp, .ep = 1, .sp = sp, .micro_batch = mb,
				  .schedule = schedule, .cp_algo = MR_CP_RING };
	return m;
}

/* ACTS of `stage` under recompute rc (recompute_layers k) minus without. */
static double acts_saved(const struct mr_plan_input *in, struct mr_plan_mesh m, int stage,
			 int rc, int k)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan_mem a, b;

	m.recompute = MR_PLAN_RC_NONE;
	m.recompute_layers = 0;
	cr_assert_eq(mr_plan_mesh_check(in, &m, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_mem_stage(in, &m, stage, &a, &eb), 0, "%s", eb.msg);
	m.recompute = rc;
	m.recompute_layers = k;
	cr_assert_eq(mr_plan_mesh_check(in, &m, &eb), 0, "meshrun recomputes: %s", eb.msg);
	cr_assert_eq(mr_plan_mem_stage(in, &m, stage, &b, &eb), 0, "%s", eb.msg);
	for (int kind = 0; kind < MR_MEM_KINDS; kind++)
		if (kind != MR_MEM_ACTS)
			cr_expect_eq(a.bytes[kind], b.bytes[kind], "only activations change (kind %d)",
				     kind);
	return b.bytes[MR_MEM_ACTS] - a.bytes[MR_MEM_ACTS];
}

/*
 * gpt2, C 128, micro-batch 2 x 64 = N 128 rows, fp32, tp 1. A block's
 * pieces: ln1, ln2, attention output, res2, res3 128*128*4 = 65536 each;
 * the four mean / rstd 128*4 = 512; qkv 128*384*4 = 196608; lse 128*4*4 =
 * 2048; fc and GELU output 128*512*4 = 262144 each: 1052672 in all.
 * selective drops 2*65536 + 4*512 + 262144 = 395264; full all but res3,
 * 987136; the scratch is one block's dropped set.
 */
Test(plan_memory, gpt2_recompute_per_block_by_hand)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(1, 0, 1, 2, MR_PP_1F1B);

	tiny(&in, MR_ARCH_GPT2, 1, 2);
	/* four blocks drop theirs, the scratch holds one block's */
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_SELECTIVE, 0), -4.0 * 395264 + 395264);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_FULL, 0), -4.0 * 987136 + 987136);
	/* one block: its scratch is what it drops, nothing is saved */
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_SELECTIVE, 1), 0);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_FULL, 1), 0);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_FULL, 3), -3.0 * 987136 + 987136);
}

/*
 * llama-tiny (NH 4, NKV 2, hs 32, F 384) on tp 2 with sp, N 128, Nl 64:
 * ln1, ln2 whole 128*128*4 = 65536; mean, rstd Nl*4 = 256; qkv (2 + 2) x
 * 32 columns 128*128*4 = 65536; attention output 128*64*4 = 32768; lse
 * 128*2*4 = 1024; res2, res3 64*128*4 = 32768; gate | up 128*384*4 =
 * 196608; SwiGLU output 128*192*4 = 98304.
 * selective drops 2*65536 + 4*256 + 98304 = 230400; full drops all but
 * res3: 559104; the scratch is one block's dropped set.
 */
Test(plan_memory, llama_tp_sp_recompute_by_hand)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(2, 1, 1, 2, MR_PP_1F1B);

	tiny(&in, MR_ARCH_LLAMA, 2, 2);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_SELECTIVE, 0), -4.0 * 230400 + 230400);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_FULL, 0), -4.0 * 559104 + 559104);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_FULL, 2), -2.0 * 559104 + 559104);
}

/*
 * tiny-moe: 2 dense and 2 MoE blocks (4 experts top-2, capacity 1.25), N
 * 128, tp 1. A MoE block has no fc / GELU pieces but its MoE acts (the
 * kernel's floats and ints of its shape, each a piece): selective drops
 * 395264 - 262144 = 133120 of it, full 987136 - 524288 + MoE. The scratch
 * is one dense block's dropped set (a dense block recomputes), with the
 * MoE acts and the (Nl, C) output piece (65536) under full.
 */
Test(plan_memory, moe_recompute_by_hand)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(1, 0, 1, 2, MR_PP_1F1B);
	struct mr_moe_shape ms = { 0 };
	double moe;

	tiny(&in, MR_ARCH_GPT2, 1, 2);
	in.model.moe_every = 2;
	in.model.n_experts = 4;
	in.model.top_k = 2;
	in.model.capacity_factor = 1.25;
	ms.N = 128;
	ms.C = 128;
	ms.H = 512;
	ms.E = 4;
	ms.k = 2;
	ms.cap = mr_moe_capacity(128, 4, 2, 1.25f);
	moe = ceil(mr_moe_act_floats(&ms) * 4.0 / 256) * 256 +
	      ceil(mr_moe_act_ints(&ms) * 4.0 / 256) * 256;
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_SELECTIVE, 0),
		     -(2.0 * 395264 + 2.0 * 133120) + 395264);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_FULL, 0),
		     -(2.0 * 987136 + 2.0 * (462848 + moe)) + 987136 + 65536 + moe);
}

/*
 * Pipeline slots: gpt2 on pp 2 under 1F1B with 4 micro-batches, stage 0
 * keeping min(p - s, m) = 2 slots, stage 1 one; recompute_layers 1 makes
 * one block of each stage recompute, in every slot, beside one scratch.
 */
Test(plan_memory, recompute_per_slot_under_a_pipeline)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(1, 0, 2, 2, MR_PP_1F1B);

	tiny(&in, MR_ARCH_GPT2, 2, 8);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_SELECTIVE, 1), -2.0 * 395264 + 395264);
	cr_expect_eq(acts_saved(&in, m, 1, MR_PLAN_RC_SELECTIVE, 1), 0);
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_FULL, 1), -2.0 * 987136 + 987136);
	cr_expect_eq(acts_saved(&in, m, 1, MR_PLAN_RC_FULL, 1), 0);
	/* zb-h1: the same slots (its stash is the same with recomputation) */
	m.schedule = MR_PP_ZBH1;
	cr_expect_eq(acts_saved(&in, m, 0, MR_PLAN_RC_FULL, 1), -2.0 * 987136 + 987136);
}

/* ---- time ---------------------------------------------------------------------- */

static struct mr_plan eval(const struct mr_plan_input *in, struct mr_plan_mesh m)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan p;

	cr_assert_eq(mr_plan_mesh_check(in, &m, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_eval(in, &m, &p, &eb), 0, "%s", eb.msg);
	return p;
}

/* Full recompute adds a forward of the recomputing blocks but their MLP
 * output GEMM (gpt2: 24C^2 + 2sC FLOPs per token and block less the
 * output GEMM's 8C^2, the head not), twice under zb-h1 (its weight phase
 * recomputes again); selective adds no FLOPs. */
Test(plan_memory, recompute_time_is_the_extra_forward)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(1, 0, 1, 2, MR_PP_1F1B);
	struct mr_plan none, sel, full;
	double C = 128, s = 64, tok = 2 * 64, rate, blk;

	tiny(&in, MR_ARCH_GPT2, 2, 8);
	rate = in.cluster.peak_flops * in.cluster.mfu;
	/* one block's recomputation, one micro-batch */
	blk = tok * (24 * C * C - 8 * C * C + 2 * s * C) / rate;
	m.dp = 2;
	none = eval(&in, m);
	m.recompute = MR_PLAN_RC_SELECTIVE;
	sel = eval(&in, m);
	m.recompute = MR_PLAN_RC_FULL;
	full = eval(&in, m);
	cr_expect_eq(sel.time.compute_s, none.time.compute_s);
	cr_expect(fabs(full.time.compute_s - none.time.compute_s - 2 * 4 * blk) < 1e-9 * blk,
		  "2 micro-batches x 4 blocks: %g, want %g",
		  full.time.compute_s - none.time.compute_s, 8 * blk);
	m = mesh(1, 0, 2, 2, MR_PP_1F1B); /* 4 micro-batches, one block recomputing */
	m.recompute_layers = 1;
	none = eval(&in, m);
	m.recompute = MR_PLAN_RC_FULL;
	full = eval(&in, m);
	cr_expect(fabs(full.time.compute_s - none.time.compute_s - 4 * blk) < 1e-9 * blk);
	m.schedule = MR_PP_ZBH1;
	m.recompute = MR_PLAN_RC_NONE;
	none = eval(&in, m);
	m.recompute = MR_PLAN_RC_FULL;
	full = eval(&in, m);
	cr_expect(fabs(full.time.compute_s - none.time.compute_s - 2 * 4 * blk) < 1e-9 * blk,
		  "zb-h1 recomputes in B and again in W");
	cr_expect_eq(mr_pp_weight_share(MR_PP_ZBH1), 0.5);
	cr_expect_eq(mr_pp_weight_share(MR_PP_1F1B), 0.0);
}

/* ---- offload ------------------------------------------------------------------- */

static struct mr_plan_mem mem_of(const struct mr_plan_input *in, struct mr_plan_mesh m, int off)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan_mem e;

	m.offload = off;
	cr_assert_eq(mr_plan_mesh_check(in, &m, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_plan_mem_stage(in, &m, 0, &e, &eb), 0, "%s", eb.msg);
	return e;
}

/* gpt2-124m, bf16 on one H100 (ZeRO-0: the rank owns every parameter N):
 * the moments (8N) leave the device; the host holds them and copies of
 * the owned gradients and parameters, 16N. With the master there the
 * device keeps its bf16 copy alone (2N of the 6N) and stages the master's
 * publishing through 4 Mi fp32 (workspace). At ZeRO-3 over 8 the owned
 * part is the shard s = OPTIM / 8 and the device keeps the bf16 shard and
 * slots (of 2 slots + 4 (s + slots)); at ZeRO-1 its padded bf16 gather
 * target p (of 2N + 4p). */
Test(plan_memory, offload_moves_optimizer_state_to_the_host)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(1, 0, 1, 1, MR_PP_1F1B);
	struct mr_plan_mem a, b, c;
	double N, s, slots, p;

	mr_plan_input_init(&in);
	cr_assert_eq(mr_plan_model_preset("gpt2-124m", &in.model, &eb), 0);
	cr_assert_eq(mr_plan_cluster_preset("h100", 1, &in.cluster, &eb), 0);
	in.global_batch = 8;
	N = mr_plan_params(&in.model);
	m.zero = 0;
	a = mem_of(&in, m, MR_PLAN_OFF_NONE);
	b = mem_of(&in, m, MR_PLAN_OFF_OPTIM);
	c = mem_of(&in, m, MR_PLAN_OFF_MASTER);
	cr_expect_eq(a.bytes[MR_MEM_OPTIM], 8 * N);
	cr_expect_eq(a.bytes[MR_MEM_HOST], 0);
	cr_expect(b.bytes[MR_MEM_OPTIM] == 0 && b.bytes[MR_MEM_HOST] == 16 * N);
	cr_expect_eq(b.bytes[MR_MEM_PARAMS], a.bytes[MR_MEM_PARAMS]);
	cr_expect_eq(b.total, a.total - 8 * N, "the host's bytes are not the device's");
	cr_expect_eq(c.bytes[MR_MEM_HOST], 16 * N);
	cr_expect_eq(c.bytes[MR_MEM_PARAMS], 2 * N, "the bf16 copy alone");
	cr_expect_eq(c.bytes[MR_MEM_WORKSPACE], a.bytes[MR_MEM_WORKSPACE] + 4.0 * 4194304);
	cr_expect_eq(c.total, a.total - 12 * N + 4.0 * 4194304);

	cr_assert_eq(mr_plan_cluster_preset("h100", 8, &in.cluster, &eb), 0);
	m.zero = 3;
	a = mem_of(&in, m, MR_PLAN_OFF_NONE);
	c = mem_of(&in, m, MR_PLAN_OFF_MASTER);
	s = a.bytes[MR_MEM_OPTIM] / 8;
	slots = (a.bytes[MR_MEM_PARAMS] - 4 * s) / 6;
	cr_expect_eq(c.bytes[MR_MEM_HOST], 16 * s);
	cr_expect_eq(c.bytes[MR_MEM_PARAMS], 2 * s + 2 * slots);
	m.zero = 1;
	a = mem_of(&in, m, MR_PLAN_OFF_NONE);
	c = mem_of(&in, m, MR_PLAN_OFF_MASTER);
	p = (a.bytes[MR_MEM_PARAMS] - 2 * N) / 4;
	cr_expect_eq(c.bytes[MR_MEM_HOST], 2 * a.bytes[MR_MEM_OPTIM]);
	cr_expect_eq(c.bytes[MR_MEM_PARAMS], 2 * p, "ZeRO-1 gathers bf16 into its padded copy");
}

Test(plan_memory, offload_on_the_cpu_device_changes_nothing)
{
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(1, 0, 1, 2, MR_PP_1F1B);
	struct mr_plan a, b;

	tiny(&in, MR_ARCH_GPT2, 2, 8);
	m.zero = 1;
	a = eval(&in, m);
	for (int off = MR_PLAN_OFF_OPTIM; off < MR_PLAN__OFFS; off++) {
		m.offload = off;
		b = eval(&in, m);
		for (int k = 0; k < MR_MEM_KINDS; k++)
			cr_expect_eq(b.mem.bytes[k], a.mem.bytes[k], "offload %d, kind %d", off, k);
		cr_expect_eq(b.time.step_s, a.time.step_s);
	}
}

/* The offloaded step: AdamW's 30 bytes per owned parameter at the host's
 * bandwidth, then the copies: optimizer+master sends the fp32 gradient
 * down and the fp32 master up (4 + 4 bytes; the GPU makes its bf16 copy);
 * optimizer also the GPU's fp32 master down (8 + 4). */
Test(plan_memory, offload_time_is_the_host_pass_and_the_copies)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(1, 0, 1, 1, MR_PP_1F1B);
	struct mr_plan a, b, c;
	double N, host, pcie;

	mr_plan_input_init(&in);
	cr_assert_eq(mr_plan_model_preset("gpt2-124m", &in.model, &eb), 0);
	cr_assert_eq(mr_plan_cluster_preset("h100", 1, &in.cluster, &eb), 0);
	in.global_batch = 8;
	N = mr_plan_params(&in.model);
	host = in.cluster.host_bw;
	pcie = in.cluster.pcie_bw;
	cr_assert(host > 0 && pcie > 0, "the preset has the host's figures");
	m.zero = 0;
	a = eval(&in, m);
	m.offload = MR_PLAN_OFF_OPTIM;
	b = eval(&in, m);
	m.offload = MR_PLAN_OFF_MASTER;
	c = eval(&in, m);
	cr_expect(fabs(a.time.optim_s - N * 30 / in.cluster.mem_bw) < 1e-9);
	cr_expect(fabs(b.time.optim_s - (N * 30 / host + N * 12 / pcie)) < 1e-9);
	cr_expect(fabs(c.time.optim_s - (N * 30 / host + N * 8 / pcie)) < 1e-9);
	cr_expect(fabs((c.time.step_s - a.time.step_s) - (c.time.optim_s - a.time.optim_s)) <
		  1e-9, "not overlapped with the next forward");
}

/* ---- rules and the workload ------------------------------------------------------ */

Test(plan_memory, rules_of_recompute_and_offload)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan_input in;
	struct mr_plan_mesh m = mesh(1, 0, 1, 2, MR_PP_1F1B);

	tiny(&in, MR_ARCH_GPT2, 1, 2);
	m.recompute = MR_PLAN_RC_FULL;
	cr_expect_eq(mr_plan_mesh_check(&in, &m, &eb), 0, "meshrun recomputes: %s", eb.msg);
	in.impl = MR_PLAN_MEGATRON;
	in.prec = MR_PLAN_MIXED;
	m.recompute_layers = 2;
	cr_expect_eq(mr_plan_mesh_check(&in, &m, &eb), MR_ENOTSUP);
	cr_expect_str_eq(eb.field, "recompute_layers");
	m.recompute_layers = 0;
	m.offload = MR_PLAN_OFF_OPTIM;
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_plan_mesh_check(&in, &m, &eb), MR_ENOTSUP);
	cr_expect_str_eq(eb.field, "offload");
	in.impl = MR_PLAN_MESHRUN;
	in.prec = MR_PLAN_FP32;
	m.recompute_layers = 5;
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_plan_mesh_check(&in, &m, &eb), MR_EINVAL, "beyond the 4 layers");
	cr_expect_str_eq(eb.field, "recompute_layers");
	m.recompute_layers = 0;
	cr_assert_eq(mr_plan_cluster_preset("h100", 1, &in.cluster, &eb), 0);
	m.offload = MR_PLAN_OFF_MASTER;
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_plan_mesh_check(&in, &m, &eb), MR_ENOTSUP, "fp32 has no master copy");
	cr_expect_str_eq(eb.field, "offload");
	cr_expect_eq(mr_plan_mesh_parse("tp=1,recompute=selective,recompute_layers=2,"
					"offload=optimizer+master",
					&m, &eb),
		     0, "%s", eb.msg);
	cr_expect(m.recompute == MR_PLAN_RC_SELECTIVE && m.recompute_layers == 2 &&
		  m.offload == MR_PLAN_OFF_MASTER);
	cr_expect_eq(mr_plan_mesh_parse("offload=disk", &m, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "offload");
}

/* A workload's recompute, recompute_layers and offload are fixed; the
 * plan writes them back; absent, the search picks (none where it fits). */
Test(plan_memory, workload_round_trip_of_recompute_and_offload)
{
	json_t *c = json_loads("{\"n_layer\":4,\"d_model\":64,\"n_head\":4,\"seq_len\":32,"
			       "\"batch_size\":2,\"recompute\":\"selective\","
			       "\"recompute_layers\":2,\"offload\":\"optimizer\","
			       "\"device\":\"cuda\"}",
			       0, NULL);
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };

	cr_assert_not_null(c);
	cr_assert_eq(mr_plan_cluster_preset("h100", 4, &in.cluster, &eb), 0);
	cr_assert_eq(mr_plan_from_workload(c, 4, &in, &eb), 0, "%s", eb.msg);
	cr_expect_eq(in.fix.recompute, MR_PLAN_RC_SELECTIVE);
	cr_expect_eq(in.fix.recompute_layers, 2);
	cr_expect_eq(in.fix.offload, MR_PLAN_OFF_OPTIM);
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.fitting > 0);
	cr_expect(r.plan[0].mem.bytes[MR_MEM_HOST] > 0, "the moments are on the host");
	json_object_del(c, "recompute");
	json_object_del(c, "recompute_layers");
	json_object_del(c, "offload");
	cr_assert_eq(mr_plan_to_workload(&r.plan[0].mesh, c), 0);
	cr_expect_str_eq(json_string_value(json_object_get(c, "recompute")), "selective");
	cr_expect_eq(json_integer_value(json_object_get(c, "recompute_layers")), 2);
	cr_expect_str_eq(json_string_value(json_object_get(c, "offload")), "optimizer");
	cr_expect_eq(mr_gpt_worker_check_config(c, &eb), 0, "%s", eb.msg);
	mr_plan_result_release(&r);

	/* absent: searched, and nothing is needed where everything fits */
	json_object_del(c, "recompute");
	json_object_del(c, "recompute_layers");
	json_object_del(c, "offload");
	cr_assert_eq(mr_plan_from_workload(c, 4, &in, &eb), 0, "%s", eb.msg);
	cr_expect(in.fix.recompute == -1 && in.fix.offload == -1);
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.fitting > 0);
	for (int i = 0; i < r.n; i++)
		cr_expect(r.plan[i].mesh.recompute == MR_PLAN_RC_NONE &&
				  r.plan[i].mesh.offload == MR_PLAN_OFF_NONE,
			  "the lean pass fits: no second pass");
	cr_assert_eq(mr_plan_to_workload(&r.plan[0].mesh, c), 0);
	cr_expect_str_eq(json_string_value(json_object_get(c, "recompute")), "none");
	cr_expect_str_eq(json_string_value(json_object_get(c, "offload")), "none");
	cr_expect_null(json_object_get(c, "recompute_layers"));
	mr_plan_result_release(&r);
	json_decref(c);
}

Test(plan_memory, search_reaches_for_recompute_and_offload_when_nothing_fits)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan_input in;
	struct mr_plan_result r = { 0 };
	double smallest;

	mr_plan_input_init(&in);
	cr_assert_eq(mr_plan_model_preset("llama-7b-like", &in.model, &eb), 0);
	cr_assert_eq(mr_plan_cluster_preset("h100", 1, &in.cluster, &eb), 0);
	in.global_batch = 8;
	in.fix.offload = MR_PLAN_OFF_NONE;
	in.fix.recompute = MR_PLAN_RC_NONE;
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.n > 0);
	smallest = r.plan[0].mem.total; /* nothing fitting: sorted by memory */
	cr_assert_eq(r.fitting, 0, "6.6B with AdamW on one 80 GB GPU: %.1f GB", smallest / 1e9);
	mr_plan_result_release(&r);
	in.fix.offload = in.fix.recompute = -1;
	cr_assert_eq(mr_plan_search(&in, &r, &eb), 0, "%s", eb.msg);
	cr_assert(r.fitting > 0, "with recompute and offload it fits");
	cr_expect(r.plan[0].mesh.recompute != MR_PLAN_RC_NONE ||
			  r.plan[0].mesh.offload != MR_PLAN_OFF_NONE,
		  "the plan uses one of them");
	mr_plan_result_release(&r);
}
