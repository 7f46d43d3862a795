/*
 * test_cuda_tp.c - tensor (and sequence) parallelism on the cuda device:
 * tp ranks as threads, rank r on emulated GPU r (MR_CUDA_EMUL_DEVICES),
 * host communicators that stage device buffers through the device's
 * download/upload (mr_comm_set_device), the step driver, against the
 * single-rank model on the cpu device (tests/runtime/test_tp.c's checks:
 * loss rel 1e-5 every step, weights per tensor by tests/support/parity.h).
 *
 * What it is for: the tp layers (parallel/tp.c), the model's tp paths and
 * the comm staging run with device memory that faults on any host access
 * (tests/gpu/cuda_emul.c), so host code touching device memory in any of
 * them crashes here. fp32 (an emulated fp32 op is the cpu's own twin:
 * only the order of the cross-rank sums differs, as in test_tp).
 *
 * Emulation only (Makefile): which pointer is a device pointer is read
 * from the emulation's tag, the comm layer's is_device for this device.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/harness.h"
#include "data/mr_synth.h"
#include "device/dev_int.h"
#include "mr_step.h"
#include "parity.h"

#define STEPS 5
#define SEED 7
#define B 2
#define T 16

struct run {
	const struct mr_gpt_config *cfg;
	int tp, sp;
	float loss[STEPS];
	float *params; /* full layout (single-rank table order), tp rank 0 */
	size_t nparams;
};

static const struct mr_adamw_config ocfg = { 3e-3f, 0.1f, 2, STEPS, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f };

/* ---- the comm layer's view of the device ---------------------------------- */

static int is_device(void *ctx, const void *p)
{
	(void)ctx;
	return ((uintptr_t)p >> 62 & 1) != 0; /* the emulation's tag */
}

static int download(void *ctx, void *host, const void *dev, size_t bytes)
{
	struct mr_dev *d = ctx;

	return d->ops->download(d, host, dev, bytes);
}

static int upload(void *ctx, void *dev, const void *host, size_t bytes)
{
	struct mr_dev *d = ctx;

	return d->ops->upload(d, dev, host, bytes);
}

/* ---- one rank -------------------------------------------------------------- */

/* Trains STEPS steps on d placed at tp rank `rank` of tpc (NULL: one
 * rank); tp rank 0 keeps the losses and the gathered weights in r. */
static int train(struct run *r, struct mr_dev *d, struct mr_comm *tpc)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_place where;
	struct mr_step_result res;
	struct mr_step st;
	struct mr_gpt m;
	int in[B * T], tg[B * T], s, rc, rank = tpc ? mr_comm_rank(tpc) : 0;
	float *local = NULL, *full = NULL;

	mr_place_tp(&where, r->tp, rank, tpc, r->sp);
	if ((rc = mr_gpt_create_on(&m, r->cfg, B, T, d, &where, 0, &eb)) < 0) {
		fprintf(stderr, "rank %d: create: %s\n", rank, eb.msg);
		return rc;
	}
	if ((rc = mr_step_init(&st, &m, &ocfg, NULL, NULL, SEED, &eb)) < 0) {
		fprintf(stderr, "rank %d: step init: %s\n", rank, eb.msg);
		goto out_model;
	}
	for (s = 0; s < STEPS && rc == 0; s++) {
		mr_synth_batch(SEED, 0, (uint64_t)s * B, r->cfg->vocab, B, T, in, tg);
		rc = mr_step_run(&st, in, tg, 1, &res, &eb);
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

static int tp_rank_fn(struct mr_comm *world, void *arg)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_comm_device cd = { NULL, is_device, download, upload, NULL, NULL };
	struct mr_dev d;
	int rc, rank = mr_comm_rank(world);

	if ((rc = mr__dev_cuda_open(&d, rank, MR_DT_F32, &eb)) < 0) {
		fprintf(stderr, "rank %d: cuda device %d: %s\n", rank, rank, eb.msg);
		return rc;
	}
	cd.ctx = &d;
	mr_comm_set_device(world, &cd);
	rc = train(arg, &d, world);
	mr_dev_close(&d);
	return rc;
}

static void check_parity(const struct mr_gpt_config *cfg, int tp, int sp)
{
	struct run ref = { cfg, 1, 0, { 0 }, NULL, 0 };
	struct run par = { cfg, tp, sp, { 0 }, NULL, 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_dev cpu;
	struct mr_gpt shape;
	char devices[8];
	int s, i;

	cr_assert_eq(mr_dev_open(&cpu, "cpu", 0, NULL, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(train(&ref, &cpu, NULL), 0);
	mr_dev_close(&cpu);
	snprintf(devices, sizeof(devices), "%d", tp);
	setenv("MR_CUDA_EMUL_DEVICES", devices, 1);
	cr_assert_eq(run_threads(tp, HOSTS_SAME, tp_rank_fn, &par), 0);
	unsetenv("MR_CUDA_EMUL_DEVICES");
	cr_assert_eq(par.nparams, ref.nparams);
	for (s = 0; s < STEPS; s++)
		cr_expect(fabsf(par.loss[s] - ref.loss[s]) <= 1e-5f * fabsf(ref.loss[s]),
			  "tp%d sp%d step %d: loss %.8f vs single rank %.8f", tp, sp, s,
			  (double)par.loss[s], (double)ref.loss[s]);
	cr_expect(ref.loss[STEPS - 1] < ref.loss[0], "the reference run must learn");
	cr_assert_eq(mr_gpt_create(&shape, cfg, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	for (i = 0; i < shape.ntensors; i++) {
		const struct mr_gpt_tensor *t = &shape.tensors[i];
		char why[160];
		cr_expect(!mr_parity_tensor(t, par.params + t->off, ref.params + t->off, why,
					    sizeof(why)), "tp%d sp%d: %s", tp, sp, why);
	}
	mr_gpt_release(&shape);
	free(ref.params);
	free(par.params);
}

/* vocab, max_seq, L, C, NH, moe_every, E, top_k, capacity, aux; head size
 * 32, the device attention's minimum */
static const struct mr_gpt_config dense = { 64, 16, 2, 128, 4, 0, 0, 0, 0.0f, 0.0f };
static const struct mr_gpt_config moe = { 64, 16, 2, 128, 4, 2, 4, 2, 0.75f, 0.01f };
/* a vocabulary tp does not divide: padded rows */
static const struct mr_gpt_config dense_v65 = { 65, 16, 2, 128, 4, 0, 0, 0, 0.0f, 0.0f };

Test(cuda_tp, dense_tp2) { check_parity(&dense, 2, 0); }
Test(cuda_tp, dense_tp2_sp) { check_parity(&dense, 2, 1); }
Test(cuda_tp, moe_tp2_sp) { check_parity(&moe, 2, 1); }
Test(cuda_tp, padded_vocab_tp2) { check_parity(&dense_v65, 2, 0); }
