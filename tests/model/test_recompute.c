/*
 * test_recompute.c - activation recomputation (model/mr_gpt.h's enum
 * mr_gpt_recompute) trains exactly as keeping every activation does.
 *
 * Each case runs one job of real gpt workers (every rank a thread, real
 * host communicators; tests/plan/plan_jobs.h) three times - recompute
 * none, selective and full - for three steps, and compares what rank 0
 * writes: the loss log (loss, aux loss, gradient norm per step, as
 * printed text) and the gathered final weights (save_weights), BYTE FOR
 * BYTE. On the cpu device the recomputed tensors come from the same
 * kernels over the same inputs in the same order, so nothing may differ:
 * a recomputation reading the wrong input, routing MoE tokens anew, a
 * ZeRO-3 unit not gathered again, a collective re-run out of step or the
 * aux loss counted twice all change a byte.
 *
 * The cases cover what recomputation re-runs: one rank (gpt2 and llama,
 * dense and MoE), tensor parallel with sp (the norms' all-gathers), context
 * parallel (ring and Ulysses exchanges over grouped-query attention),
 * expert parallel (the dispatch, with capacity drops), ZeRO-3 (parameters
 * gathered again), the pipeline under each schedule (a slot per micro-batch;
 * zb-h1's weight phase recomputes again), and recompute_layers. The
 * ledger's activation bytes must fall from none to selective to full, and
 * equal the planner's (plan/mr_plan.h) to the byte in every mode.
 *
 * Built a second time on the emulated cuda device (RECOMPUTE_CUDA_EMUL:
 * the Makefile's gpu-emul/test_recompute), in bf16, one job per mode:
 * the device's kernels are deterministic too, so the same bytes hold.
 * There the dense blocks' GELU rides in the fc GEMM's epilogue, which
 * rounds otherwise than the GELU kernel a selective recomputation runs
 * again, so selective blocks keep the two apart (model/gpt2.c): their
 * reference is a fourth run without recomputation and with the fusion
 * off (MESHRUN_FUSED_GELU=0), which must fuse as many GELUs as selective
 * does (the MoE experts', whose GELU selective does not recompute) and
 * fewer than the run with it on.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../plan/plan_jobs.h"
#include "proc.h"
#ifdef RECOMPUTE_CUDA_EMUL
#include "../gpu/cuda_emul.h"
#endif

#ifdef RECOMPUTE_CUDA_EMUL
/* bf16 on the emulated cuda device, head size 32 (its attention's
 * smallest); a rank a device */
#define BASE                                                                             \
	"\"vocab_size\":96,\"n_layer\":4,\"d_model\":64,\"n_head\":2,\"seq_len\":32,"       \
	"\"batch_size\":2,\"threads\":1,\"log_every\":100,\"device\":\"cuda\","              \
	"\"precision\":\"bf16\""
#define EMUL 1
#else
#define BASE                                                                             \
	"\"vocab_size\":96,\"n_layer\":4,\"d_model\":64,\"n_head\":4,\"seq_len\":32,"       \
	"\"batch_size\":2,\"threads\":1,\"log_every\":100"
#define EMUL 0
#endif
/* the emulated device runs one job per mode (its ops are slow) */
#define CPU_ONLY .disabled = EMUL
#define MOE ",\"moe_every\":2,\"n_experts\":4,\"top_k\":2,\"capacity_factor\":1.0"
#define LLAMA ",\"arch\":\"llama\",\"n_kv_head\":2"

static const char *const modes[] = { "none", "selective", "full", "none" };

/* A whole file (*n bytes; NUL-terminated), which must exist. */
static char *slurp(const char *path, size_t *n)
{
	char *b = mr_test_slurp(path, n);

	cr_assert_not_null(b, "%s missing", path);
	return b;
}

/* The planner's activation bytes for rank 0's stage of job j. */
static double planned_acts(const struct job *j)
{
	struct mr_plan_input in;
	struct mr_plan_mesh mesh;
	struct mr_plan_mem pm;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	plan_of(j, &in, &mesh);
	cr_assert_eq(mr_plan_mem_stage(&in, &mesh, 0, &pm, &eb), 0, "%s", eb.msg);
	return pm.bytes[MR_MEM_ACTS];
}

/* GELUs the fc GEMM's epilogue computed on emulated device 0 so far. */
static long gelus_fused(void)
{
#ifdef RECOMPUTE_CUDA_EMUL
	return mr_cuda_emul_gelu_fused(0);
#else
	return 0;
#endif
}

/* Runs cfg (the keys inside the braces, without steps and outputs) under
 * each mode (extra: more keys for the recomputing runs) and compares;
 * modes[3] is the emulated device's unfused run without recomputation. */
static void same_training(const char *cfg, const char *extra, int world, int tp, int pp,
			  int cp, int ep)
{
	const char *dir = mr_test_scratch("mr-recompute");
	char *log[4] = { NULL }, *wts[4] = { NULL }, path[2][512], json[2048];
	size_t nlog[4] = { 0 }, nw[4] = { 0 }, acts[4] = { 0 };
	double planned[4] = { 0 };
	long fused[4] = { 0, 0, 0, 0 };
	int runs = 3, ref[3] = { 0, 0, 0 };

	cr_assert_not_null(dir);
	if (EMUL) {
		char gpus[8];
		snprintf(gpus, sizeof(gpus), "%d", world);
		setenv("MR_CUDA_EMUL_DEVICES", gpus, 1);
	}
	for (int k = 0; k < runs; k++) {
		struct job j = { .cfg = json, .world = world, .tp = tp, .pp = pp, .cp = cp,
				 .ep = ep, .steps = 3 };
		long fused0 = gelus_fused();
		snprintf(path[0], sizeof(path[0]), "%s/loss-%d.log", dir, k);
		snprintf(path[1], sizeof(path[1]), "%s/w-%d.bin", dir, k);
		snprintf(json, sizeof(json),
			 "{%s,\"steps\":3,\"recompute\":\"%s\"%s,\"loss_log\":\"%s\","
			 "\"save_weights\":\"%s\"}",
			 cfg, modes[k], k % 3 ? extra : "", path[0], path[1]);
		if (k == 3)
			setenv("MESHRUN_FUSED_GELU", "0", 1); /* read when a model is made */
		run_job(&j);
		unsetenv("MESHRUN_FUSED_GELU");
		fused[k] = gelus_fused() - fused0;
		acts[k] = j.st[0].mem_bytes[MR_MEM_ACTS];
		planned[k] = planned_acts(&j);
		json_decref(j.json);
		log[k] = slurp(path[0], &nlog[k]);
		wts[k] = slurp(path[1], &nw[k]);
		if (k == 2 && fused[0] > fused[1]) { /* selective kept dense GELUs apart */
			runs = 4;
			ref[1] = 3;
		}
	}
	if (runs == 4)
		cr_expect_eq(fused[3], fused[1], "%s: unfused none fused %ld GELUs, selective %ld",
			     cfg, fused[3], fused[1]);
	if (EMUL && !strstr(cfg, "llama")) /* every case's dense blocks are GELU blocks */
		cr_expect(runs == 4, "%s: without recomputation %ld GELUs fused, selective %ld: "
			  "the dense blocks did not fuse", cfg, fused[0], fused[1]);
	for (int k = 1; k < 3; k++) {
		int r = ref[k];
		const char *rname = r == 3 ? "none unfused" : modes[r];
		cr_expect(nlog[k] == nlog[r] && !memcmp(log[k], log[r], nlog[r]),
			  "%s: recompute %s's loss log differs:\n%s\n%s:\n%s", cfg, modes[k],
			  log[k], rname, log[r]);
		cr_expect(nw[k] == nw[r] && !memcmp(wts[k], wts[r], nw[r]),
			  "%s: recompute %s's final weights differ from %s's", cfg, modes[k],
			  rname);
	}
	cr_log_info("%s%s: activation bytes none %zu selective %zu full %zu (planned %.0f %.0f "
		    "%.0f)",
		    cfg, extra, acts[0], acts[1], acts[2], planned[0], planned[1], planned[2]);
	cr_expect(acts[1] < acts[0] && acts[2] < acts[1],
		  "%s: activation bytes none %zu selective %zu full %zu", cfg, acts[0], acts[1],
		  acts[2]);
	for (int k = 0; k < 3; k++) /* the planner models this layout: to the byte */
		cr_expect_eq((double)acts[k], planned[k], "%s: recompute %s: ledger %zu, planned %.0f",
			     cfg, modes[k], acts[k], planned[k]);
	for (int k = 0; k < runs; k++) {
		free(log[k]);
		free(wts[k]);
	}
}

static void same(const char *cfg, int world, int tp, int pp, int cp, int ep)
{
	same_training(cfg, "", world, tp, pp, cp, ep);
}

Test(recompute, one_rank_dense) { same(BASE, 1, 1, 1, 1, 1); }
Test(recompute, one_rank_moe, CPU_ONLY) { same(BASE MOE, 1, 1, 1, 1, 1); }
Test(recompute, llama_one_rank) { same(BASE LLAMA, 1, 1, 1, 1, 1); }
Test(recompute, llama_moe_one_rank, CPU_ONLY) { same(BASE LLAMA MOE, 1, 1, 1, 1, 1); }
Test(recompute, dp2_zero3_moe) { same(BASE MOE ",\"zero\":3", 2, 1, 1, 1, 1); }
Test(recompute, tp2_sp_moe) { same(BASE MOE ",\"sequence_parallel\":true", 2, 2, 1, 1, 1); }
Test(recompute, llama_tp2_sp_zero3)
{
	same(BASE LLAMA ",\"sequence_parallel\":true,\"zero\":3", 4, 2, 1, 1, 1);
}
Test(recompute, llama_cp2_ring, CPU_ONLY) { same(BASE LLAMA, 2, 1, 1, 2, 1); }
Test(recompute, llama_cp2_ulysses) { same(BASE LLAMA ",\"cp_algo\":\"ulysses\"", 2, 1, 1, 2, 1); }
Test(recompute, ep2_capacity_drops) { same(BASE MOE, 2, 1, 1, 1, 2); }
Test(recompute, llama_moe_ep2_tp2, CPU_ONLY) { same(BASE LLAMA MOE, 4, 2, 1, 1, 2); }
Test(recompute, pp2_1f1b, CPU_ONLY) { same(BASE MOE ",\"grad_accum\":4", 2, 1, 2, 1, 1); }
Test(recompute, pp2_interleaved, CPU_ONLY)
{
	same(BASE ",\"grad_accum\":4,\"pp_schedule\":\"interleaved\"", 2, 1, 2, 1, 1);
}
Test(recompute, pp2_zbh1_moe)
{
	same(BASE MOE ",\"grad_accum\":4,\"pp_schedule\":\"zb-h1\"", 2, 1, 2, 1, 1);
}
Test(recompute, llama_pp2_zbh1_tp2_sp, CPU_ONLY)
{
	same(BASE LLAMA ",\"grad_accum\":4,\"pp_schedule\":\"zb-h1\",\"sequence_parallel\":true", 4,
	     2, 2, 1, 1);
}
/* only the first block of each chunk recomputes */
Test(recompute, first_layers_only, CPU_ONLY)
{
	same_training(BASE MOE ",\"grad_accum\":2", ",\"recompute_layers\":1", 2, 1, 2, 1, 1);
}

/* A checkpoint written under full recomputation resumes (the run goes on
 * under selective) to what an uninterrupted run without recomputation
 * trains: the same loss log, the same final weights. */
Test(recompute, checkpoint_resume, CPU_ONLY)
{
	const char *dir = mr_test_scratch("mr-recompute-ckpt");
	char json[2048], log[2][256], wts[2][256], *b[4];
	size_t n[4];
	struct job j;

	cr_assert_not_null(dir);
	for (int k = 0; k < 2; k++) {
		snprintf(log[k], sizeof(log[k]), "%s/loss-%d.log", dir, k);
		snprintf(wts[k], sizeof(wts[k]), "%s/w-%d.bin", dir, k);
	}
	/* straight: 4 steps, no recomputation */
	snprintf(json, sizeof(json), "{" BASE MOE ",\"steps\":4,\"loss_log\":\"%s\","
		 "\"save_weights\":\"%s\"}", log[0], wts[0]);
	j = (struct job){ .cfg = json, .world = 2, .tp = 1, .pp = 1, .cp = 1, .ep = 2, .steps = 4 };
	run_job(&j);
	json_decref(j.json);
	/* 2 steps under full, checkpointed; then resumed to 4 under selective */
	for (int k = 0; k < 2; k++) {
		snprintf(json, sizeof(json),
			 "{" BASE MOE ",\"steps\":4,\"recompute\":\"%s\",\"ckpt_dir\":\"%s/ckpt\","
			 "\"ckpt_every\":2,\"ckpt_async\":false,\"loss_log\":\"%s\","
			 "\"save_weights\":\"%s\"}",
			 k ? "selective" : "full", dir, log[1], wts[1]);
		j = (struct job){ .cfg = json, .world = 2, .tp = 1, .pp = 1, .cp = 1, .ep = 2,
				  .steps = 2 };
		run_job(&j);
		json_decref(j.json);
	}
	b[0] = slurp(log[0], &n[0]);
	b[1] = slurp(log[1], &n[1]);
	b[2] = slurp(wts[0], &n[2]);
	b[3] = slurp(wts[1], &n[3]);
	cr_expect(n[0] == n[1] && !memcmp(b[0], b[1], n[0]), "loss logs differ:\n%s\nresumed:\n%s",
		  b[0], b[1]);
	cr_expect(n[2] == n[3] && !memcmp(b[2], b[3], n[2]), "final weights differ");
	for (int k = 0; k < 4; k++)
		free(b[k]);
}
