/*
 * test_offload.c - "offload" (ZeRO-Offload, parallel/mr_dp.h): the AdamW
 * moments (optimizer) and the fp32 master (optimizer+master) in host
 * memory, the step run by the cpu AdamW, on the emulated cuda device:
 * ranks as threads, rank r on emulated GPU r (MR_CUDA_EMUL_DEVICES),
 * host communicators staging device buffers (mr_comm_set_device), the
 * step driver - as tests/gpu/test_cuda_parallel.c.
 *
 * What it checks, each against the same run without offload:
 *   - the losses of every step and the final weights are BIT-identical
 *     (the emulated device's adamw is optim/mr_adamw.h's
 *     mr_adamw_update_range, the very code the offloaded step runs on the
 *     host; a real GPU's kernel may contract to FMA: within tolerance
 *     there), with DDP and ZeRO-1/2/3 at dp 2, fp32 and bf16 activations;
 *   - the ledger: the device's MR_MEM_OPTIM becomes 0, MR_MEM_HOST holds
 *     the moments and the host copies of the owned grads and params
 *     (twice the moments' bytes), the gradients unchanged, and with
 *     optimizer+master no fp32 weights on the device (fp32 activations
 *     and the master: refused);
 *   - a checkpoint written with offload resumes, with and without
 *     offload, to the same losses and weights as the run that went on;
 *     one written without offload resumes with it;
 *   - on the cpu device the option changes nothing: the same bits and the
 *     same ledger (MR_MEM_HOST 0);
 *   - mr_dev_host_alloc on both devices: zeroed host memory, counted.
 *
 * Emulation only (Makefile): several emulated GPUs in one process.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/harness.h"
#include "ckpt/mr_ckpt.h"
#include "data/mr_synth.h"
#include "device/dev_int.h"
#include "device/mr_dev_comm.h"
#include "mr_step.h"
#include "proc.h"

#define STEPS 5
#define SEED 7
#define B 2
#define T 16
#define DP 2

struct run {
	const char *dev;    /* "cuda" (emulated) or "cpu" */
	int f32;            /* cuda: fp32 activations (else bf16) */
	int zero, offload;  /* enum mr_dp_offload */
	const char *ckpt;   /* checkpoint directory or NULL */
	int save_at;        /* save after this many steps (0: never) */
	int resume;         /* resume from ckpt first */
	long first;         /* the first step run (the resumed one) */
	int host_threads;   /* offload: the host AdamW's pool (0: none) */
	float loss[STEPS];
	float *params;      /* full table, from rank 0 */
	size_t nparams;
	struct mr_mem mem;  /* rank 0's ledger after the steps */
};

static const struct mr_gpt_config cfg = { .vocab = 64, .max_seq = 16, .n_layer = 2,
					  .d_model = 128, .n_head = 4 };
static const struct mr_adamw_config ocfg = { 3e-3f, 0.1f, 2, STEPS, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f, MR_LR_COSINE, 0.0f };

static int open_ckpt(struct run *r, struct mr_ckpt **c, struct mr_step *st, struct mr_comm *world)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_ckpt_opts o = { .dir = r->ckpt, .keep = 2, .timeout_ms = 30000 };
	struct mr_ckpt_job job = { 0 };
	long step = 0;
	int rc;

	job.rank = mr_comm_rank(world);
	job.world = DP;
	job.tp = job.cp = job.pp = job.ep = 1;
	job.dp = DP;
	job.zero = r->zero;
	job.batch_size = B;
	job.seq_len = T;
	job.grad_accum = 1;
	job.seed = SEED;
	job.total_steps = STEPS;
	job.opt = mr_dp_adamw(st->dp);
	job.m = st->m;
	job.dp_state = st->dp;
	job.world_comm = world;
	if ((rc = mr_ckpt_create(c, &o, &job, &eb)) < 0 ||
	    (r->resume && (rc = mr_ckpt_resume(*c, &step, &eb)) < 0)) {
		fprintf(stderr, "rank %d: checkpoint: %s\n", job.rank, eb.msg);
		return rc;
	}
	if (job.rank == 0)
		r->first = step;
	return 0;
}

/* Trains (the rest of) STEPS steps on d as a rank of world; rank 0 keeps
 * the losses, the gathered weights and its ledger in r. */
static int train(struct run *r, struct mr_dev *d, struct mr_comm *world)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_dp_config dc = { r->zero, 0, 1, r->offload };
	struct mr_dp_comms dpc = { world, NULL, world, NULL };
	struct mr_ckpt *ck = NULL;
	struct mr_place where;
	struct mr_step_result res;
	struct mr_step st;
	struct mr_gpt m;
	int rank = mr_comm_rank(world), rc;
	int in[B * T], tg[B * T];
	float *local = NULL;
	struct mr_pool *pool = NULL;
	long s;

	mr_place_tp(&where, 1, 0, NULL, 0);
	if ((rc = mr_gpt_create_on(&m, &cfg, B, T, d, &where,
				   mr_dp_model_flags_on(d, r->zero, r->offload), &eb)) < 0) {
		fprintf(stderr, "rank %d: create: %s\n", rank, eb.msg);
		return rc;
	}
	rc = mr_step_init(&st, &m, &ocfg, &dc, &dpc, SEED, &eb);
	if (rc < 0) {
		fprintf(stderr, "rank %d: step init: %s\n", rank, eb.msg);
		goto out_model;
	}
	if (r->host_threads > 0 && (rc = mr_pool_create(&pool, r->host_threads)) < 0)
		goto out_step;
	mr_dp_host_threads(st.dp, pool);
	if (r->ckpt && (rc = open_ckpt(r, &ck, &st, world)) < 0)
		goto out_step;
	for (s = mr_dp_steps(st.dp); s < STEPS && rc == 0; s++) {
		mr_synth_batch(SEED, 0, ((uint64_t)s * DP + (uint64_t)rank) * B, cfg.vocab, B, T,
			       in, tg);
		rc = mr_step_run(&st, in, tg, 1, &res, &eb);
		if (rc < 0)
			fprintf(stderr, "rank %d step %ld: %s\n", rank, s, eb.msg);
		else if (rank == 0)
			r->loss[s] = res.loss;
		if (rc == 0 && ck && s + 1 == r->save_at &&
		    ((rc = mr_ckpt_save(ck, s + 1, &eb)) < 0 || (rc = mr_ckpt_wait(ck, &eb)) < 0))
			fprintf(stderr, "rank %d: save: %s\n", rank, eb.msg);
	}
	if (rc == 0 && !(local = malloc(sizeof(float) * m.nparams)))
		rc = MR_ENOMEM;
	if (rc == 0)
		rc = mr_dp_gather_params(st.dp, local);
	if (rc == 0 && rank == 0) {
		r->params = local;
		r->nparams = m.nparams;
		r->mem = m.mem;
		local = NULL;
	}
	free(local);
	mr_ckpt_free(ck);
out_step:
	mr_pool_free(pool);
	mr_step_release(&st);
out_model:
	mr_gpt_release(&m);
	return rc;
}

static int offload_rank(struct mr_comm *world, void *arg)
{
	struct run *r = arg;
	struct mr_errbuf eb = { "", "" };
	struct mr_dev_comm dc;
	struct mr_dev d;
	int rc, rank = mr_comm_rank(world);

	if (!strcmp(r->dev, "cpu"))
		rc = mr_dev_open(&d, "cpu", 0, NULL, NULL, &eb);
	else
		rc = mr__dev_cuda_open(&d, rank, r->f32 ? MR_DT_F32 : MR_DT_BF16, &eb);
	if (rc < 0) {
		fprintf(stderr, "rank %d: %s device: %s\n", rank, r->dev, eb.msg);
		return rc;
	}
	if (strcmp(r->dev, "cpu"))
		mr_comm_set_device(world, mr_dev_comm_init(&dc, &d));
	rc = train(r, &d, world);
	mr_dev_close(&d);
	return rc;
}

static void run(struct run *r)
{
	setenv("MR_CUDA_EMUL_DEVICES", "2", 1);
	cr_assert_eq(run_threads(DP, HOSTS_SAME, offload_rank, r), 0, "%s zero %d offload %d",
		     r->dev, r->zero, r->offload);
	unsetenv("MR_CUDA_EMUL_DEVICES");
	cr_assert_not_null(r->params);
}

/* The same losses from step `from` on and the same weights, bit for bit. */
static void same_bits(const struct run *a, const struct run *b, long from, const char *what)
{
	long s;

	for (s = from; s < STEPS; s++)
		cr_expect(!memcmp(&a->loss[s], &b->loss[s], sizeof(float)),
			  "%s: step %ld loss %.9g vs %.9g", what, s, (double)a->loss[s],
			  (double)b->loss[s]);
	cr_assert_eq(a->nparams, b->nparams);
	cr_expect(!memcmp(a->params, b->params, a->nparams * sizeof(float)),
		  "%s: the final weights differ", what);
}

/* Trains with and without offload (its host AdamW on `threads` pool
 * threads; 0: none); the bits and the ledger. */
static void check_offload_on(const char *dev, int f32, int zero, int offload, int threads)
{
	struct run ref = { .dev = dev, .f32 = f32, .zero = zero };
	struct run off = ref;
	char what[96];
	int k;

	off.offload = offload;
	off.host_threads = threads;
	run(&ref);
	run(&off);
	snprintf(what, sizeof(what), "%s %s zero %d offload %d", dev, f32 ? "fp32" : "bf16", zero,
		 offload);
	same_bits(&off, &ref, 0, what);
	cr_expect(ref.loss[STEPS - 1] < ref.loss[0], "%s: the run must learn", what);
	cr_assert_gt(ref.mem.bytes[MR_MEM_OPTIM], 0);
	cr_expect_eq(ref.mem.bytes[MR_MEM_HOST], 0, "%s: host bytes without offload", what);
	if (!strcmp(dev, "cpu")) { /* accepted, changes nothing */
		for (k = 0; k < MR_MEM_KINDS; k++)
			cr_expect_eq(off.mem.bytes[k], ref.mem.bytes[k], "%s: %s %zu vs %zu", what,
				     mr_mem_kind_name((enum mr_mem_kind)k), off.mem.bytes[k],
				     ref.mem.bytes[k]);
	} else {
		/* m, v (the device's optim bytes) and the owned grads and params
		 * (as many again) on the host; the gradients as before; the
		 * master's fp32 weights off the device (zero 0: the whole table,
		 * the bf16 copy staying; the exact figure of every stage is the
		 * planner's, test_plan_ledger's emulated build) */
		cr_expect_eq(off.mem.bytes[MR_MEM_OPTIM], 0, "%s: device optim bytes", what);
		cr_expect_eq(off.mem.bytes[MR_MEM_HOST], 2 * ref.mem.bytes[MR_MEM_OPTIM],
			     "%s: host %zu, device optim without offload %zu", what,
			     off.mem.bytes[MR_MEM_HOST], ref.mem.bytes[MR_MEM_OPTIM]);
		cr_expect_eq(off.mem.bytes[MR_MEM_GRADS], ref.mem.bytes[MR_MEM_GRADS]);
		if (offload == MR_DP_OFFLOAD_OPTIM)
			cr_expect_eq(off.mem.bytes[MR_MEM_PARAMS], ref.mem.bytes[MR_MEM_PARAMS],
				     "%s: params", what);
		else if (zero == 0)
			cr_expect_eq(off.mem.bytes[MR_MEM_PARAMS],
				     ref.mem.bytes[MR_MEM_PARAMS] - 4 * ref.nparams,
				     "%s: params %zu vs %zu", what, off.mem.bytes[MR_MEM_PARAMS],
				     ref.mem.bytes[MR_MEM_PARAMS]);
		else /* at least the fp32 shard (ZeRO-1: the whole padded table) */
			cr_expect_leq(off.mem.bytes[MR_MEM_PARAMS] + 4 * ref.nparams / DP,
				      ref.mem.bytes[MR_MEM_PARAMS], "%s: params %zu vs %zu", what,
				      off.mem.bytes[MR_MEM_PARAMS], ref.mem.bytes[MR_MEM_PARAMS]);
	}
	free(ref.params);
	free(off.params);
}

static void check_offload(const char *dev, int f32, int zero, int offload)
{
	check_offload_on(dev, f32, zero, offload, 0);
}

Test(offload, cuda_ddp_optimizer) { check_offload("cuda", 1, 0, MR_DP_OFFLOAD_OPTIM); }
Test(offload, cuda_ddp_master_bf16) { check_offload("cuda", 0, 0, MR_DP_OFFLOAD_MASTER); }
Test(offload, cuda_zero1_optimizer_bf16) { check_offload("cuda", 0, 1, MR_DP_OFFLOAD_OPTIM); }
Test(offload, cuda_zero1_master_bf16) { check_offload("cuda", 0, 1, MR_DP_OFFLOAD_MASTER); }
Test(offload, cuda_zero2_master_bf16) { check_offload("cuda", 0, 2, MR_DP_OFFLOAD_MASTER); }
Test(offload, cuda_zero3_optimizer) { check_offload("cuda", 1, 3, MR_DP_OFFLOAD_OPTIM); }
Test(offload, cuda_zero3_master_bf16) { check_offload("cuda", 0, 3, MR_DP_OFFLOAD_MASTER); }
/* the host AdamW split over 3 threads: the same bits */
Test(offload, cuda_zero1_master_host_threads)
{
	check_offload_on("cuda", 0, 1, MR_DP_OFFLOAD_MASTER, 3);
}
Test(offload, cpu_ddp) { check_offload("cpu", 1, 0, MR_DP_OFFLOAD_MASTER); }
Test(offload, cpu_zero1) { check_offload("cpu", 1, 1, MR_DP_OFFLOAD_OPTIM); }

/* Saves after step 3 with `saved`, resumes with each offload: the losses
 * of steps 4 and 5 and the weights of the run that went on. */
static void check_resume(int zero, int saved)
{
	const char *dir = mr_test_scratch("mr-offload");
	struct run full = { .dev = "cuda", .zero = zero, .offload = saved, .ckpt = dir,
			    .save_at = 3 }; /* bf16: optimizer+master needs it */
	int off;

	cr_assert_not_null(dir);
	run(&full);
	for (off = MR_DP_OFFLOAD_NONE; off <= MR_DP_OFFLOAD_MASTER; off++) {
		struct run res = { .dev = "cuda", .zero = zero, .offload = off, .ckpt = dir,
				   .resume = 1 };
		char what[96];
		run(&res);
		snprintf(what, sizeof(what), "zero %d saved with offload %d, resumed with %d",
			 zero, saved, off);
		cr_expect_eq(res.first, 3, "%s: resumed at step %ld", what, res.first);
		same_bits(&res, &full, 3, what);
		free(res.params);
	}
	free(full.params);
}

Test(offload, resume_zero1_master) { check_resume(1, MR_DP_OFFLOAD_MASTER); }
Test(offload, resume_zero3_master) { check_resume(3, MR_DP_OFFLOAD_MASTER); }
Test(offload, resume_zero3_optimizer) { check_resume(3, MR_DP_OFFLOAD_OPTIM); }
Test(offload, resume_ddp_none) { check_resume(0, MR_DP_OFFLOAD_NONE); }

/* optimizer+master with fp32 weights on the device: refused, naming the
 * key (the device's weights are the master there). */
Test(offload, master_needs_bf16)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_dp_config dc = { 0, 0, 1, MR_DP_OFFLOAD_MASTER };
	struct mr_gpt m;
	struct mr_step st;
	struct mr_place where;
	struct mr_dev d;

	setenv("MR_CUDA_EMUL_DEVICES", "1", 1);
	cr_assert_eq(mr__dev_cuda_open(&d, 0, MR_DT_F32, &eb), 0, "%s", eb.msg);
	mr_place_tp(&where, 1, 0, NULL, 0);
	cr_assert_eq(mr_gpt_create_on(&m, &cfg, B, T, &d, &where, mr_dp_model_flags(0), &eb), 0);
	cr_expect_eq(mr_step_init(&st, &m, &ocfg, &dc, NULL, SEED, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "offload");
	cr_expect(strstr(eb.msg, "bf16") != NULL, "%s", eb.msg);
	mr_gpt_release(&m);
	mr_dev_close(&d);
	unsetenv("MR_CUDA_EMUL_DEVICES");
}

/* mr_dev_host_alloc: the cuda device's pinned host memory (the emulation:
 * an untagged host buffer) and the cpu device's fallback are zeroed host
 * memory the host reads and writes, counted under the kind asked. */
static void check_host_alloc(struct mr_dev *d, const char *name)
{
	struct mr_mem mem;
	size_t n = 1000, i;
	float *p;

	memset(&mem, 0, sizeof(mem));
	p = mr_dev_host_alloc(d, &mem, MR_MEM_HOST, n * sizeof(float));
	cr_assert_not_null(p, "%s: host_alloc", name);
	cr_expect_eq(mem.bytes[MR_MEM_HOST], n * sizeof(float), "%s: counted", name);
	cr_expect(!d->ops->is_device || !d->ops->is_device(d, p), "%s: host memory", name);
	for (i = 0; i < n; i++)
		cr_assert_eq(p[i], 0.0f, "%s: element %zu not zeroed", name, i);
	for (i = 0; i < n; i++)
		p[i] = (float)i;
	mr_dev_host_free(d, &mem, MR_MEM_HOST, p, n * sizeof(float));
	cr_expect_eq(mem.bytes[MR_MEM_HOST], 0, "%s: uncounted", name);
	cr_expect_eq(mem.peak[MR_MEM_HOST], n * sizeof(float), "%s: peak", name);
}

Test(offload, host_alloc)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_dev d;

	cr_assert_eq(mr__dev_cuda_open(&d, 0, MR_DT_BF16, &eb), 0, "%s", eb.msg);
	check_host_alloc(&d, "cuda");
	mr_dev_close(&d);
	cr_assert_eq(mr_dev_open(&d, "cpu", 0, NULL, NULL, &eb), 0, "%s", eb.msg);
	check_host_alloc(&d, "cpu");
	mr_dev_close(&d);
}
