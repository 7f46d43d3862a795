/*
 * test_plan_ledger.c - the planner against the runtime itself: real gpt
 * workers (mr_gpt_worker, every rank a thread with real host
 * communicators, bootstrapped through an in-memory KV) train a step of
 * each parity configuration that runs here - one rank, dp under DDP and
 * ZeRO-1/2/3, HSDP, tp, tp+sp, the pipeline under each schedule and with
 * dp, cp under each algorithm, ep under DDP and ZeRO-1/2/3, and their
 * mixes - and every rank's
 * ledger (stats mem_bytes, runtime/core/mr_mem.h) is compared with the
 * planner's prediction for its stage: parameters, gradients and
 * optimizer state to the byte, activations and workspace within 10 %
 * (the bound; today they match to the byte too: --verbose prints
 * both). The llama family's jobs (grouped-query attention, SwiGLU, an
 * untied head or a tied one) run one rank, ZeRO-1/2/3, tp with sp, the
 * pipeline and cp the same way; cp over grouped-query attention (ring,
 * allgather, ulysses) and SwiGLU experts (one rank, ep, tp, ZeRO-3) are
 * held to the byte. Every cpu job runs under recompute none, selective
 * and full, with the same bounds.
 *
 * Built a second time on the emulated cuda device (LEDGER_CUDA_EMUL: the
 * Makefile's gpu-emul/test_plan_ledger), it checks the bf16 model states
 * instead - the bf16 weight copy beside the fp32 master, gradients and
 * AdamW - to the byte, ZeRO-3's copy living only in its parameter slots
 * included (activations and workspace are the cpu build's).
 *
 * The time model's ranking against measured steps is test_plan_rank.c
 * (a binary of its own, so no other test of this one runs beside it).
 */
#include "plan_jobs.h"

/* tol: activations' and workspace's bound, a share of the ledger's */
static void check_one(const char *cfg, int world, int tp, int pp, int cp, int ep, double tol)
{
#ifdef LEDGER_CUDA_EMUL
	const int states_only = 1; /* one emulated GPU per rank */
	char gpus[8];

	snprintf(gpus, sizeof(gpus), "%d", world);
	setenv("MR_CUDA_EMUL_DEVICES", gpus, 1);
#else
	const int states_only = 0;
#endif
	struct job j = { .cfg = cfg, .world = world, .tp = tp, .pp = pp, .cp = cp, .ep = ep,
			 .steps = 1 };
	struct mr_plan_input in;
	struct mr_plan_mesh mesh;
	struct mr_mesh mm;

	run_job(&j);
	plan_of(&j, &in, &mesh);
	cr_assert_eq(mr_mesh_init(&mm, world, tp, pp, cp, ep, 0, NULL), 0);
	for (int r = 0; r < world; r++) {
		struct mr_mesh_coord c;
		struct mr_plan_mem pm;
		struct mr_errbuf eb = { { 0 }, { 0 } };
		const size_t *got = j.st[r].mem_bytes;

		mr_mesh_coord(&mm, r, &c);
		cr_assert_eq(mr_plan_mem_stage(&in, &mesh, c.pp, &pm, &eb), 0, "%s", eb.msg);
		cr_log_info("%s rank %d: ledger %zu %zu %zu %zu %zu, planned %.0f %.0f %.0f %.0f %.0f",
			    cfg, r, got[0], got[1], got[2], got[3], got[4], pm.bytes[0], pm.bytes[1],
			    pm.bytes[2], pm.bytes[3], pm.bytes[4]);
		for (int k = MR_MEM_PARAMS; k < MR_MEM_KINDS; k++) {
			if (k == MR_MEM_ACTS || k == MR_MEM_WORKSPACE)
				continue; /* below, with their bound */
			cr_expect_eq((double)got[k], pm.bytes[k],
				     "%s rank %d (stage %d) %s: ledger %zu, planned %.0f", cfg, r,
				     c.pp, mr_mem_kind_name((enum mr_mem_kind)k), got[k],
				     pm.bytes[k]);
		}
		if (states_only)
			continue;
		cr_expect(fabs(pm.bytes[MR_MEM_ACTS] - (double)got[MR_MEM_ACTS]) <=
				  tol * (double)got[MR_MEM_ACTS],
			  "%s rank %d acts: ledger %zu, planned %.0f", cfg, r, got[MR_MEM_ACTS],
			  pm.bytes[MR_MEM_ACTS]);
		cr_expect(fabs(pm.bytes[MR_MEM_WORKSPACE] - (double)got[MR_MEM_WORKSPACE]) <=
				  tol * (double)got[MR_MEM_WORKSPACE],
			  "%s rank %d workspace: ledger %zu, planned %.0f", cfg, r,
			  got[MR_MEM_WORKSPACE], pm.bytes[MR_MEM_WORKSPACE]);
	}
	json_decref(j.json);
}

/* The job as given; on the cpu device under each recomputation mode
 * too (the planner prices the runtime's own layout: the same bound). */
static void check_ledger_tol(const char *cfg, int world, int tp, int pp, int cp, int ep,
			     double tol)
{
#ifndef LEDGER_CUDA_EMUL
	static const char *const modes[] = { "selective", "full" };
	size_t n = strlen(cfg);
	char buf[1024];

	cr_assert(n > 1 && n + 32 < sizeof(buf) && cfg[n - 1] == '}');
	for (int k = 0; k < 2; k++) {
		snprintf(buf, sizeof(buf), "%.*s,\"recompute\":\"%s\"}", (int)n - 1, cfg,
			 modes[k]);
		check_one(buf, world, tp, pp, cp, ep, tol);
	}
#endif
	check_one(cfg, world, tp, pp, cp, ep, tol);
}

static void check_ledger(const char *cfg, int world, int tp, int pp, int cp, int ep)
{
	check_ledger_tol(cfg, world, tp, pp, cp, ep, 0.10);
}

#ifdef LEDGER_CUDA_EMUL
/* head size 32: the device attention's smallest */
#define BF16 "\"vocab_size\":96,\"n_layer\":4,\"d_model\":64,\"n_head\":2,\"seq_len\":32," \
	     "\"batch_size\":2,\"steps\":1,\"threads\":1,\"peak_flops\":1e10," \
	     "\"device\":\"cuda\",\"precision\":\"bf16\""

Test(plan_ledger, bf16_one_rank) { check_ledger("{" BF16 "}", 1, 1, 1, 1, 1); }
Test(plan_ledger, bf16_dp2_zero1) { check_ledger("{" BF16 ",\"zero\":1}", 2, 1, 1, 1, 1); }
Test(plan_ledger, bf16_dp2_zero2) { check_ledger("{" BF16 ",\"zero\":2}", 2, 1, 1, 1, 1); }
/* no whole bf16 copy: it lives in the four parameter slots */
Test(plan_ledger, bf16_dp2_zero3) { check_ledger("{" BF16 ",\"zero\":3}", 2, 1, 1, 1, 1); }
Test(plan_ledger, bf16_dp3_zero3_padded) { check_ledger("{" BF16 ",\"zero\":3}", 3, 1, 1, 1, 1); }
Test(plan_ledger, bf16_tp2_dp2_zero3)
{
	check_ledger("{" BF16 ",\"zero\":3,\"vocab_size\":128}", 4, 2, 1, 1, 1);
}
/* offload (a GPU rank's): the moments and host copies in MR_MEM_HOST; with
 * the master there, no fp32 weights on the device at any ZeRO stage */
#define OFF ",\"offload\":\"optimizer\""
#define MASTER ",\"offload\":\"optimizer+master\""
Test(plan_ledger, bf16_dp2_offload_zero1) { check_ledger("{" BF16 OFF ",\"zero\":1}", 2, 1, 1, 1, 1); }
Test(plan_ledger, bf16_dp2_master_ddp) { check_ledger("{" BF16 MASTER "}", 2, 1, 1, 1, 1); }
Test(plan_ledger, bf16_dp2_master_zero1) { check_ledger("{" BF16 MASTER ",\"zero\":1}", 2, 1, 1, 1, 1); }
Test(plan_ledger, bf16_dp2_master_zero2) { check_ledger("{" BF16 MASTER ",\"zero\":2}", 2, 1, 1, 1, 1); }
Test(plan_ledger, bf16_dp3_master_zero3_padded)
{
	check_ledger("{" BF16 MASTER ",\"zero\":3}", 3, 1, 1, 1, 1);
}
/* llama's states in bf16: no biases, the untied head's copy too */
#define BF16_LLAMA BF16 ",\"arch\":\"llama\""
Test(plan_ledger, bf16_llama_one_rank) { check_ledger("{" BF16_LLAMA "}", 1, 1, 1, 1, 1); }
Test(plan_ledger, bf16_llama_dp2_zero3)
{
	check_ledger("{" BF16_LLAMA ",\"zero\":3}", 2, 1, 1, 1, 1);
}
#else
/* to the byte, activations and workspace too */
static void check_exact(const char *cfg, int world, int tp, int pp, int cp, int ep)
{
	check_ledger_tol(cfg, world, tp, pp, cp, ep, 0);
}

#define BASE "\"vocab_size\":96,\"n_layer\":4,\"d_model\":64,\"n_head\":4,\"seq_len\":32," \
	     "\"batch_size\":2,\"steps\":1,\"threads\":1,\"peak_flops\":1e10"
#define MOE BASE ",\"moe_every\":2,\"n_experts\":4,\"top_k\":2,\"capacity_factor\":1.25"

Test(plan_ledger, one_rank) { check_ledger("{" BASE "}", 1, 1, 1, 1, 1); }
Test(plan_ledger, one_rank_moe) { check_ledger("{" MOE "}", 1, 1, 1, 1, 1); }
Test(plan_ledger, dp2_ddp) { check_ledger("{" BASE ",\"grad_accum\":2}", 2, 1, 1, 1, 1); }
Test(plan_ledger, dp2_zero1) { check_ledger("{" BASE ",\"zero\":1}", 2, 1, 1, 1, 1); }
Test(plan_ledger, dp2_zero2) { check_ledger("{" BASE ",\"zero\":2}", 2, 1, 1, 1, 1); }
Test(plan_ledger, dp2_zero3) { check_ledger("{" BASE ",\"zero\":3}", 2, 1, 1, 1, 1); }
Test(plan_ledger, dp3_zero3_padded) { check_ledger("{" BASE ",\"zero\":3}", 3, 1, 1, 1, 1); }
Test(plan_ledger, hsdp_2x2_zero2)
{
	check_ledger("{" BASE ",\"zero\":2,\"hsdp_shard\":2}", 4, 1, 1, 1, 1);
}
Test(plan_ledger, tp2) { check_ledger("{" BASE "}", 2, 2, 1, 1, 1); }
Test(plan_ledger, tp2_sp_padded_vocab)
{
	check_ledger("{" BASE ",\"vocab_size\":97,\"sequence_parallel\":true}", 2, 2, 1, 1, 1);
}
Test(plan_ledger, tp2_moe) { check_ledger("{" MOE "}", 2, 2, 1, 1, 1); }
Test(plan_ledger, tp2_dp2_zero3_sp)
{
	check_ledger("{" BASE ",\"zero\":3,\"sequence_parallel\":true}", 4, 2, 1, 1, 1);
}
Test(plan_ledger, pp2_1f1b) { check_ledger("{" BASE ",\"grad_accum\":4}", 2, 1, 2, 1, 1); }
Test(plan_ledger, pp2_gpipe)
{
	check_ledger("{" BASE ",\"grad_accum\":3,\"pp_schedule\":\"gpipe\"}", 2, 1, 2, 1, 1);
}
Test(plan_ledger, pp2_interleaved)
{
	check_ledger("{" BASE ",\"grad_accum\":4,\"pp_schedule\":\"interleaved\"}", 2, 1, 2, 1,
		     1);
}
Test(plan_ledger, pp2_zbh1) { check_ledger("{" BASE ",\"grad_accum\":4,\"pp_schedule\":\"zb-h1\"}", 2, 1, 2, 1, 1); }
Test(plan_ledger, pp4_1f1b_moe) { check_ledger("{" MOE ",\"grad_accum\":4}", 4, 1, 4, 1, 1); }
Test(plan_ledger, pp2_dp2_zero3_runs_as_zero1)
{
	check_ledger("{" BASE ",\"grad_accum\":2,\"zero\":3}", 4, 1, 2, 1, 1);
}
Test(plan_ledger, pp2_tp2_sp)
{
	check_ledger("{" BASE ",\"grad_accum\":2,\"sequence_parallel\":true}", 4, 2, 2, 1, 1);
}
Test(plan_ledger, cp2_ring) { check_ledger("{" BASE "}", 2, 1, 1, 2, 1); }
Test(plan_ledger, cp2_allgather)
{
	check_ledger("{" BASE ",\"cp_algo\":\"allgather\"}", 2, 1, 1, 2, 1);
}
Test(plan_ledger, cp2_ulysses) { check_ledger("{" BASE ",\"cp_algo\":\"ulysses\"}", 2, 1, 1, 2, 1); }
Test(plan_ledger, cp2_dp2_zero1) { check_ledger("{" BASE ",\"zero\":1}", 4, 1, 1, 2, 1); }
Test(plan_ledger, ep2_dropless)
{
	check_ledger("{" MOE ",\"moe_policy\":\"dropless\"}", 2, 1, 1, 1, 2);
}
Test(plan_ledger, ep2_capacity_tp2) { check_ledger("{" MOE "}", 4, 2, 1, 1, 2); }
Test(plan_ledger, ep2_zero1_edp1) { check_ledger("{" MOE ",\"zero\":1}", 2, 1, 1, 1, 2); }
Test(plan_ledger, ep2_over_dp4_zero1) { check_ledger("{" MOE ",\"zero\":1}", 4, 1, 1, 1, 2); }
Test(plan_ledger, ep2_over_dp4_zero2) { check_ledger("{" MOE ",\"zero\":2}", 4, 1, 1, 1, 2); }
Test(plan_ledger, ep2_over_dp4_zero3) { check_ledger("{" MOE ",\"zero\":3}", 4, 1, 1, 1, 2); }
Test(plan_ledger, ep2_tp2_zero3) { check_ledger("{" MOE ",\"zero\":3}", 4, 2, 1, 1, 2); }
Test(plan_ledger, ep2_pp2_zero1)
{
	check_ledger("{" MOE ",\"zero\":1,\"grad_accum\":2}", 4, 1, 2, 1, 2);
}

/* llama: 4 heads over 2 key/value heads, SwiGLU of Llama's rule (256) */
#define LLAMA BASE ",\"arch\":\"llama\",\"n_kv_head\":2"

Test(plan_ledger, llama_one_rank) { check_ledger("{" LLAMA "}", 1, 1, 1, 1, 1); }
Test(plan_ledger, llama_one_rank_tied_ffn)
{
	check_ledger("{" LLAMA ",\"tie_embeddings\":true,\"ffn_hidden\":96}", 1, 1, 1, 1, 1);
}
Test(plan_ledger, llama_dp2_zero1) { check_ledger("{" LLAMA ",\"zero\":1}", 2, 1, 1, 1, 1); }
Test(plan_ledger, llama_dp2_zero2) { check_ledger("{" LLAMA ",\"zero\":2}", 2, 1, 1, 1, 1); }
Test(plan_ledger, llama_dp3_zero3_padded)
{
	check_ledger("{" LLAMA ",\"zero\":3}", 3, 1, 1, 1, 1);
}
Test(plan_ledger, llama_tp2_sp_padded_vocab)
{
	check_ledger("{" LLAMA ",\"vocab_size\":97,\"sequence_parallel\":true}", 2, 2, 1, 1, 1);
}
Test(plan_ledger, llama_tp2_dp2_zero3)
{
	check_ledger("{" LLAMA ",\"zero\":3}", 4, 2, 1, 1, 1);
}
/* untied: the last stage holds the head, not a replica of the embedding */
Test(plan_ledger, llama_pp2_1f1b)
{
	check_ledger("{" LLAMA ",\"grad_accum\":4}", 2, 1, 2, 1, 1);
}
Test(plan_ledger, llama_pp2_tied_zbh1)
{
	check_ledger("{" LLAMA ",\"grad_accum\":4,\"tie_embeddings\":true,"
		     "\"pp_schedule\":\"zb-h1\"}",
		     2, 1, 2, 1, 1);
}
Test(plan_ledger, llama_pp2_dp2_zero1)
{
	check_ledger("{" LLAMA ",\"grad_accum\":2,\"zero\":1}", 4, 1, 2, 1, 1);
}
/* context parallel with key/value heads equal to the query heads, and
 * grouped: the ring's k|v blocks, allgather's rows and ulysses' head
 * groups are 2 NKV hs wide (layers/cp.c's buffer_bytes); these and
 * the llama MoE jobs below match to the byte */
Test(plan_ledger, llama_cp2_ring_mha)
{
	check_ledger("{" BASE ",\"arch\":\"llama\",\"n_kv_head\":4}", 2, 1, 1, 2, 1);
}
Test(plan_ledger, llama_cp2_ring_gqa) { check_exact("{" LLAMA "}", 2, 1, 1, 2, 1); }
Test(plan_ledger, llama_cp2_allgather_gqa)
{
	check_exact("{" LLAMA ",\"cp_algo\":\"allgather\"}", 2, 1, 1, 2, 1);
}
Test(plan_ledger, llama_cp2_ulysses_gqa)
{
	check_exact("{" LLAMA ",\"cp_algo\":\"ulysses\"}", 2, 1, 1, 2, 1);
}
Test(plan_ledger, llama_cp2_tp2_ring_gqa) { check_exact("{" LLAMA "}", 4, 2, 1, 2, 1); }
/* replicated key/value heads (tp above n_kv_head): each rank one whole
 * head (k and v of hs rows), its gradient's stash in the workspace; to
 * the byte */
Test(plan_ledger, llama_tp4_sp_kv_replicated)
{
	check_exact("{" LLAMA ",\"sequence_parallel\":true}", 4, 4, 1, 1, 1);
}
Test(plan_ledger, llama_tp2_dp2_zero3_mqa)
{
	check_exact("{" BASE ",\"arch\":\"llama\",\"n_kv_head\":1,\"zero\":3}", 4, 2, 1, 1, 1);
}
Test(plan_ledger, llama_cp2_tp2_allgather_mqa)
{
	check_exact("{" BASE ",\"arch\":\"llama\",\"n_kv_head\":1,\"cp_algo\":\"allgather\"}",
		    4, 2, 1, 2, 1);
}

/* SwiGLU experts (Mixtral's): (E, 2F, C) gate | up and (E, C, F) down */
#define LLAMA_MOE LLAMA ",\"moe_every\":2,\"n_experts\":4,\"top_k\":2,\"capacity_factor\":1.25"

Test(plan_ledger, llama_moe_one_rank) { check_exact("{" LLAMA_MOE "}", 1, 1, 1, 1, 1); }
Test(plan_ledger, llama_moe_ep2) { check_exact("{" LLAMA_MOE "}", 2, 1, 1, 1, 2); }
Test(plan_ledger, llama_moe_tp2) { check_exact("{" LLAMA_MOE "}", 2, 2, 1, 1, 1); }
Test(plan_ledger, llama_moe_dp2_zero3)
{
	check_exact("{" LLAMA_MOE ",\"zero\":3}", 2, 1, 1, 1, 1);
}
Test(plan_ledger, llama_moe_ep2_dropless_ffn)
{
	check_exact("{" LLAMA_MOE ",\"moe_policy\":\"dropless\",\"ffn_hidden\":96}", 2, 1, 1,
		     1, 2);
}
#endif
