/*
 * test_cuda_parallel.c - tensor (and sequence) parallelism and data
 * parallelism (DDP, ZeRO-1/2/3) on the cuda device: ranks as threads,
 * rank r on emulated GPU r (MR_CUDA_EMUL_DEVICES), host communicators
 * that stage device buffers through the device's download/upload
 * (mr_comm_set_device), the step driver, against the single-rank model on
 * the cpu device (the checks of tests/layers/test_tp.c and
 * tests/parallel/test_dp.c: loss rel 1e-5 every step, weights per tensor
 * by tests/support/parity.h). The single-rank reference of a dp run
 * accumulates the dp ranks' micro-batches.
 *
 * What it is for: the tp layers (layers/tp.c), the model's tp paths,
 * data parallelism (parallel/dp*.c) and the comm staging run with device
 * memory that faults on any host access (tests/gpu/cuda_emul.c), so host
 * code touching device memory in any of them crashes here. fp32 (an
 * emulated fp32 op is the cpu's own twin: only the order of the sums
 * across ranks differs, as in test_tp and test_dp).
 *
 * And stream-ordered collectives (check_stream_order): the same runs with
 * communicators whose waits take the device's stream-wait path make no
 * host sync and give the same bits.
 *
 * Emulation only (Makefile): several emulated GPUs in one process.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/harness.h"
#include "cuda_emul.h"
#include "data/mr_synth.h"
#include "device/dev_int.h"
#include "device/mr_dev_comm.h"
#include "mr_step.h"
#include "parity.h"

#define STEPS 5
#define SEED 7
#define B 2
#define T 16
#define MAX_DP 4

struct run {
	const struct mr_gpt_config *cfg;
	int tp, sp, dp, zero; /* ranks: tp x dp (one of them 1) */
	int ordered;          /* communicators claim stream order (claim_stream_order) */
	float loss[STEPS];
	float *params; /* full layout (single-rank table order), from rank 0 */
	size_t nparams;
	/* per rank, over the steps: host syncs and stream-ordered waits of
	 * its emulated device */
	long syncs[MAX_DP], stream_waits[MAX_DP];
};

static const struct mr_adamw_config ocfg = { 3e-3f, 0.1f, 2, STEPS, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f, MR_LR_COSINE, 0.0f };

/* ---- one rank -------------------------------------------------------------- */

/* Before (before = 1) and after a step of a rank of world (rank r on
 * emulated device r; NULL: the cpu reference, nothing to count): adds the
 * step's host syncs and stream-ordered waits to the rank's counts. */
static void count_device(struct run *r, struct mr_comm *world, int before)
{
	int rank = world ? mr_comm_rank(world) : 0, sign = before ? -1 : 1;

	if (world) {
		r->syncs[rank] += sign * mr_cuda_emul_syncs(rank);
		r->stream_waits[rank] += sign * mr_cuda_emul_stream_waits(rank);
	}
}

/* Trains STEPS steps on d as a rank of world (NULL: the single rank,
 * which runs a step's dp micro-batches with accumulation); rank 0 keeps
 * the losses and the gathered weights in r. */
static int train(struct run *r, struct mr_dev *d, struct mr_comm *world)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_dp_config dc = { r->zero, 0, 1, MR_DP_OFFLOAD_NONE };
	struct mr_dp_comms dpc = { world, NULL, world, NULL };
	struct mr_place where;
	struct mr_step_result res;
	struct mr_step st;
	struct mr_gpt m;
	int rank = world ? mr_comm_rank(world) : 0, accum = world ? 1 : r->dp, s, j, rc;
	int dpr = r->dp > 1 ? rank : 0; /* this rank's index on dp (tp ranks share data) */
	int in[MAX_DP * B * T], tg[MAX_DP * B * T];
	float *local = NULL, *full = NULL;

	mr_place_tp(&where, r->tp, r->tp > 1 ? rank : 0, r->tp > 1 ? world : NULL, r->sp);
	if ((rc = mr_gpt_create_on(&m, r->cfg, B, T, d, &where, mr_dp_model_flags(r->zero),
				   &eb)) < 0) {
		fprintf(stderr, "rank %d: create: %s\n", rank, eb.msg);
		return rc;
	}
	rc = mr_step_init(&st, &m, &ocfg, &dc, world && r->dp > 1 ? &dpc : NULL, SEED, &eb);
	if (rc < 0) {
		fprintf(stderr, "rank %d: step init: %s\n", rank, eb.msg);
		goto out_model;
	}
	for (s = 0; s < STEPS && rc == 0; s++) {
		/* micro-batch s*dp + k is dp rank k's, or the k-th accumulated */
		for (j = 0; j < accum; j++)
			mr_synth_batch(SEED, 0, ((uint64_t)s * r->dp + (world ? dpr : j)) * B,
				       r->cfg->vocab, B, T, in + j * B * T, tg + j * B * T);
		count_device(r, world, 1);
		rc = mr_step_run(&st, in, tg, accum, &res, &eb);
		count_device(r, world, 0);
		if (rc < 0)
			fprintf(stderr, "rank %d step %d: %s\n", rank, s, eb.msg);
		else if (rank == 0)
			r->loss[s] = res.loss;
	}
	/* this rank's slices to the host, then every slice into the
	 * single-rank layout (a collective over tp) */
	if (rc == 0 && !(local = malloc(sizeof(float) * m.nparams)))
		rc = MR_ENOMEM;
	if (rc == 0)
		rc = mr_dp_gather_params(st.dp, local);
	if (rc == 0)
		rc = mr_gpt_gather_full(&m, local, &full);
	if (rc == 0 && rank == 0) {
		r->params = full;
		r->nparams = mr_gpt_full_nparams(&m);
	} else {
		free(full);
	}
	free(local);
	mr_step_release(&st);
out_model:
	mr_gpt_release(&m);
	return rc;
}

static int parallel_rank(struct mr_comm *world, void *arg)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_dev_comm dc;
	struct mr_dev d;
	int rc, rank = mr_comm_rank(world);

	if ((rc = mr__dev_cuda_open(&d, rank, MR_DT_F32, &eb)) < 0) {
		fprintf(stderr, "rank %d: cuda device %d: %s\n", rank, rank, eb.msg);
		return rc;
	}
	mr_dev_comm_init(&dc, &d);
	dc.cd.claim_stream_order = ((struct run *)arg)->ordered;
	mr_comm_set_device(world, &dc.cd);
	rc = train(arg, &d, world);
	/* the device goes first (its pending waits drained), the communicator
	 * after, without it */
	mr_comm_set_device(world, NULL);
	mr_dev_close(&d);
	return rc;
}

static void check_parity(const struct mr_gpt_config *cfg, int tp, int sp, int dp, int zero)
{
	struct run ref = { cfg, 1, 0, dp, 0, 0, { 0 }, NULL, 0, { 0 }, { 0 } };
	struct run par = { cfg, tp, sp, dp, zero, 0, { 0 }, NULL, 0, { 0 }, { 0 } };
	struct mr_errbuf eb = { "", "" };
	struct mr_dev cpu;
	struct mr_gpt shape;
	char devices[8];
	int s, i;

	cr_assert((tp == 1 || dp == 1) && dp <= MAX_DP);
	cr_assert_eq(mr_dev_open(&cpu, "cpu", 0, NULL, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(train(&ref, &cpu, NULL), 0);
	mr_dev_close(&cpu);
	snprintf(devices, sizeof(devices), "%d", tp * dp);
	setenv("MR_CUDA_EMUL_DEVICES", devices, 1);
	cr_assert_eq(run_threads(tp * dp, HOSTS_SAME, parallel_rank, &par), 0);
	unsetenv("MR_CUDA_EMUL_DEVICES");
	cr_assert_eq(par.nparams, ref.nparams);
	for (s = 0; s < STEPS; s++)
		cr_expect(fabsf(par.loss[s] - ref.loss[s]) <= 1e-5f * fabsf(ref.loss[s]),
			  "tp%d sp%d dp%d zero %d step %d: loss %.8f vs single rank %.8f", tp, sp,
			  dp, zero, s, (double)par.loss[s], (double)ref.loss[s]);
	cr_expect(ref.loss[STEPS - 1] < ref.loss[0], "the reference run must learn");
	cr_assert_eq(mr_gpt_create(&shape, cfg, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	for (i = 0; i < shape.ntensors; i++) {
		const struct mr_gpt_tensor *t = &shape.tensors[i];
		char why[160];
		cr_expect(!mr_parity_tensor(t, par.params + t->off, ref.params + t->off,
					    MR_PARITY_WEIGHT_TOL, why, sizeof(why)),
			  "tp%d sp%d dp%d zero %d: %s", tp, sp, dp, zero, why);
	}
	mr_gpt_release(&shape);
	free(ref.params);
	free(par.params);
}

/* vocab, max_seq, L, C, NH, moe_every, E, top_k, capacity, aux; head size
 * 32, the device attention's minimum */
static const struct mr_gpt_config dense = { .vocab = 64, .max_seq = 16, .n_layer = 2,
					    .d_model = 128, .n_head = 4 };
static const struct mr_gpt_config moe = { .vocab = 64, .max_seq = 16, .n_layer = 2, .d_model = 128,
					  .n_head = 4, .moe_every = 2, .n_experts = 4, .top_k = 2,
					  .capacity_factor = 0.75f, .aux_coef = 0.01f };
/* a vocabulary tp does not divide: padded rows */
static const struct mr_gpt_config dense_v65 = { .vocab = 65, .max_seq = 16, .n_layer = 2,
						.d_model = 128, .n_head = 4 };

/* The same parallel run with host communicators claiming stream order
 * (claim_stream_order: their waits go to the device's stream-wait path,
 * which the synchronous emulation may take) and without: the claiming run
 * makes no host sync in its steps - forward, backward and optimizer
 * (the normal one makes some: the test can fail) - every wait of its
 * collectives is the device's, and both give the same bits (losses and
 * final weights). */
static void check_stream_order(const struct mr_gpt_config *cfg, int tp, int sp, int dp,
			       int zero)
{
	struct run host = { cfg, tp, sp, dp, zero, 0, { 0 }, NULL, 0, { 0 }, { 0 } };
	struct run ord = { cfg, tp, sp, dp, zero, 1, { 0 }, NULL, 0, { 0 }, { 0 } };
	char devices[8];
	int i;

	snprintf(devices, sizeof(devices), "%d", tp * dp);
	setenv("MR_CUDA_EMUL_DEVICES", devices, 1);
	cr_assert_eq(run_threads(tp * dp, HOSTS_SAME, parallel_rank, &host), 0);
	cr_assert_eq(run_threads(tp * dp, HOSTS_SAME, parallel_rank, &ord), 0);
	unsetenv("MR_CUDA_EMUL_DEVICES");
	for (i = 0; i < tp * dp; i++) {
		cr_expect_gt(host.syncs[i], 0, "rank %d: the normal run made no host sync", i);
		cr_expect_eq(ord.syncs[i], 0, "rank %d: %ld host syncs in stream order", i,
			     ord.syncs[i]);
		cr_expect_eq(host.stream_waits[i], 0);
		cr_expect_gt(ord.stream_waits[i], 0, "rank %d: no wait went to the device", i);
	}
	cr_assert_eq(ord.nparams, host.nparams);
	cr_expect(!memcmp(ord.loss, host.loss, sizeof(host.loss)), "losses differ");
	cr_expect(!memcmp(ord.params, host.params, sizeof(float) * host.nparams),
		  "weights differ");
	free(host.params);
	free(ord.params);
}

Test(cuda_parallel, dense_tp2) { check_parity(&dense, 2, 0, 1, 0); }
Test(cuda_parallel, dense_tp2_sp) { check_parity(&dense, 2, 1, 1, 0); }
Test(cuda_parallel, moe_tp2_sp) { check_parity(&moe, 2, 1, 1, 0); }
Test(cuda_parallel, padded_vocab_tp2) { check_parity(&dense_v65, 2, 0, 1, 0); }
Test(cuda_parallel, ddp2) { check_parity(&dense, 1, 0, 2, 0); }
Test(cuda_parallel, zero1_dp2) { check_parity(&dense, 1, 0, 2, 1); }
Test(cuda_parallel, zero2_dp2) { check_parity(&dense, 1, 0, 2, 2); }
Test(cuda_parallel, zero3_dp2) { check_parity(&dense, 1, 0, 2, 3); }
Test(cuda_parallel, moe_zero3_dp2) { check_parity(&moe, 1, 0, 2, 3); }
Test(cuda_parallel, stream_ordered_tp2_sp) { check_stream_order(&dense, 2, 1, 1, 0); }
Test(cuda_parallel, stream_ordered_ddp2) { check_stream_order(&dense, 1, 0, 2, 0); }
Test(cuda_parallel, stream_ordered_zero3_dp2) { check_stream_order(&dense, 1, 0, 2, 3); }
