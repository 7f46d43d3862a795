/*
 * test_parity.c - every data/tensor-parallel configuration against the
 * single-rank run (BRIEF §6), as real jobs: `meshrun local` starts an
 * embedded controller and agent processes on loopback, ranks bootstrap
 * their communicators through the controller's KV and train 10 steps.
 *
 * A parallel job with dp data-parallel ranks, each on micro-batch b, is
 * compared with ONE rank running the same dp micro-batches through
 * gradient accumulation (grad_accum = dp): the same tokens, the same
 * per-micro-batch MoE capacity, the same averaged gradient. Both write the
 * loss of every step (loss_log) and the gathered final weights
 * (save_weights), which are compared here:
 *   - loss at each of the 10 steps within relative 1e-5: parallel runs
 *     differ only in the order of float sums (~1e-7 relative per step);
 *   - final weights: per-tensor relative L2 <= 1e-4 (tests/support/parity.h
 *     says why an element-wise bound would test AdamW's rounding instead).
 *
 * Built a second and third time with PARITY_EMUL_PRECISION (the Makefile's
 * gpu-emul/test_parity_fp32 and _bf16): the parallel runs then train on
 * the emulated cuda device ($MESHRUN_BUILD/emul binaries, linked with
 * tests/gpu/cuda_emul.c), through the device layer's cuda backend and the
 * communicators' staging of device buffers:
 *   - fp32: the parallel run on the emulated device must equal the same
 *     parallel run on the cpu device bit for bit (loss log and weights
 *     file): the device layer, the staging and the backend change
 *     nothing - except with capacity MoE, whose sync-free expert GEMMs
 *     run over whole cap blocks (padded rows zero: the same values, but
 *     another summation shape than the cpu's kept rows), so there the
 *     losses agree within 1e-5 per step, as parallel runs do (measured:
 *     dp2 1.2e-7, pp2 zb-h1 with 8 layers 1.4e-6 by step 10). And both
 *     against the cpu single-rank run: loss 1e-5 per
 *     step, weights 2e-4 - the device's attention needs head sizes of at
 *     least 32, so this model is 4x wider than the cpu matrix's, and the
 *     q/v biases' near-zero gradients walk further under AdamW (tp4 MoE:
 *     1.27e-4 on the cpu device itself);
 *   - bf16 is compared with the emulated single-rank bf16 run. bf16
 *     rounds every activation (8 bits of mantissa: 2^-9 = 2e-3 relative
 *     per rounding), and a parallel run rounds at other points (a
 *     row-parallel GEMM's partial sums are all-reduced in bf16; a dp
 *     rank's micro-batch sums over fewer rows), so the runs differ by a
 *     few roundings per layer. Bounds, with what the matrix measured
 *     (every tolerance set to 0, 2026-11-25): loss 1e-2 relative per step
 *     (worst 5.4e-3, tp4 MoE); weights 5e-2 relative L2 per tensor (worst
 *     4.2e-2: q/v biases, which start at 0 and are all AdamW walk). Since
 *     the MLP's GELU gradient is applied before the GEMM's one rounding
 *     (the DGELU epilogue, 2026-11-29) the trajectories run elsewhere:
 *     grad norm 0.102 (tp4 MoE, step 8: a routing tie) and weights 5.2e-2
 *     (tp2 sp with accumulation, ln2.b), so 0.15 and 7e-2; a
 *     MoE model's tensors 0.25 (worst 0.138, the experts' biases: a token
 *     whose two experts' gate probabilities tie to bf16 precision picks
 *     another expert, and its whole contribution moves, downstream layers
 *     included). dp2 runs are bit-identical to one rank. A missing
 *     compute-copy refresh moved the loss by 3.5% at step 2 and the
 *     weights by 0.3 to 1.1.
 *
 * Built twice more with PARITY_GPU_PRECISION for `make test-gpu`
 * (tests/gpu/test_parity_fp32 and _bf16): the matrix, pipeline included,
 * on the machine's real GPUs, each configuration against the single rank
 * on the same GPU in the same precision. With a GPU per rank the ranks
 * are one node's processes and the communicators NCCL; with fewer GPUs
 * than ranks every rank is a node of its own on GPU 0 and the
 * communicators are the host's, staging through host memory (NCCL refuses
 * two ranks on one GPU). Skipped without a GPU. Measured on one H100
 * (2026-11-25, MR_PARITY_VERBOSE=1 prints every step's deltas):
 *   - fp32 dense: within the emulated device's bounds (loss 1e-5, weights
 *     2e-4). fp32 MoE: every pipeline run is bit-identical to every other
 *     (all schedules, pp2 and pp4), and equal to the single rank to the
 *     last digit for 4 steps; then a 1e-6 difference in the gradient
 *     norm (a sum order: the tied embedding's gradient, for one, is
 *     summed per stage, then across stages) grows about 10x a step
 *     through the 8-layer model's routing: loss 1.3e-4 and weights 4.5e-3
 *     by step 10; dense runs stay within 2e-6. So MoE on a GPU: loss 1e-3, grad norm
 *     1e-2, weights 2e-2.
 *   - bf16: tensor parallelism rounds at other points from the first step
 *     (loss 1e-5..4e-5 relative at step 1), and the 8-layer models
 *     amplify it to 1e-3 by step 6 and 3 % by step 7 with MoE (grad norms
 *     10-17 %): after that the runs are different trajectories. So bf16 on
 *     a GPU compares the first 3 steps' losses (1e-2) and grad norms
 *     (1e-1); the trained weights are not compared. A wrong gradient moves
 *     step 2's loss by percents (the compute-copy bug above: 3.5 %).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "device/mr_device.h"
#include "model/mr_weights.h"
#include "mr_gpt_worker.h"
#include "parity.h"
#include "proc.h"

#define STEPS 10
/* rows per micro-batch: the emulated device's wider model learns in 10
 * steps only with more rows per step */
#define BATCH (ON_DEVICE ? 4 : 2)

#if defined(PARITY_EMUL_PRECISION)
#define EMUL 1
#define GPU 0
#define PRECISION PARITY_EMUL_PRECISION
#elif defined(PARITY_GPU_PRECISION)
#define EMUL 0
#define GPU 1
#define PRECISION PARITY_GPU_PRECISION
#else
#define EMUL 0
#define GPU 0
#define PRECISION "fp32"
#endif
#define ON_DEVICE (EMUL || GPU) /* the parallel runs train on a cuda device */

/* The sanitizer pass of make test (MR_SANITIZED) runs one job per mode,
 * schedule and pairing - every code path, not every degree and model:
 * the full matrix runs in the first pass; on the emulated device it runs
 * one job per mode. */
#ifdef MR_SANITIZED
#define NOT_UNDER_SAN .disabled = 1
#define NOT_UNDER_SAN_EMUL .disabled = EMUL
#else
#define NOT_UNDER_SAN .disabled = 0
#define NOT_UNDER_SAN_EMUL .disabled = 0
#endif
#define BF16 (ON_DEVICE && strcmp(PRECISION, "bf16") == 0)
#define LOSS_TOL (BF16 ? 1e-2 : 1e-5)
/* the gradient norm, a sum of squares over every gradient: worst 7.1e-6
 * relative on the cpu matrix (2026-11-25) */
#define NORM_TOL (BF16 ? 1.5e-1 : ON_DEVICE ? 1e-4 : 1e-5)
#define WEIGHT_TOL (BF16 ? 7e-2 : ON_DEVICE ? 2e-4 : MR_PARITY_WEIGHT_TOL)
#define MOE_BF16_TOL 0.25 /* a MoE model's tensors in bf16: see the header */
/* a real GPU's bounds (the header): fp32 MoE, and bf16's compared steps */
#define GPU_MOE_LOSS_TOL 1e-3
#define GPU_MOE_NORM_TOL 1e-2
#define GPU_MOE_WEIGHT_TOL 2e-2
#define GPU_BF16_STEPS 3

static char tmp[256];

static void scratch(void)
{
	const char *d = mr_test_scratch("mr-parity");

	cr_assert_not_null(d);
	snprintf(tmp, sizeof(tmp), "%s", d);
}

struct job {
	int nodes, nproc, tp;
	int zero, hsdp, sp, moe;
	int accum;
	const char *extra; /* more workload config keys, for both runs */
	int vocab;         /* vocab_size; 0 = 64 */
	int pp;            /* pipeline stages; 0 = 1 */
	const char *sched; /* pp_schedule (pp > 1) */
	int layers;        /* n_layer; 0 = 2 */
	const char *pp_extra; /* more keys for the parallel run only ("pp_layers") */
	int ep;            /* expert parallel degree (the parallel run); 0 = 1 */
	int cp;            /* context parallel degree (the parallel run); 0 = 1 */
};

/* The model's keys (a key given twice is an error in workload_config). */
static const char *model_json(const struct job *j)
{
	static char buf[256];

	/* small enough for seconds on 2 cores; the MoE capacity drops tokens.
	 * The device's attention takes head sizes of 32 to 128: d_model 128
	 * with 4 heads there (tp 4 still divides the heads). */
	snprintf(buf, sizeof(buf),
		 "\"n_layer\": %d, \"d_model\": %d, \"n_head\": 4, \"vocab_size\": %d%s",
		 j->layers ? j->layers : 2, ON_DEVICE ? 128 : 32, j->vocab ? j->vocab : 64,
		 j->moe ? ", \"moe_every\": 2, \"n_experts\": 4, \"top_k\": 2, "
			  "\"capacity_factor\": 0.75, \"aux_coef\": 0.01"
			: "");
	return buf;
}

/* GPUs of this machine (the real-GPU build; 0 elsewhere). */
/* The GPUs of a GPU build's run (0: none, the test skips); a GPU the
 * CUDA side cannot use fails the test (never a skip). */
static int gpus(void)
{
	struct mr_errbuf eb = { "", "" };
	int n = GPU ? mr_dev_cuda_count(&eb) : 0;

	cr_assert_geq(n, 0, "%s", eb.msg);
	return n;
}

/* Runs the job with outputs tag.loss / tag.bin in tmp; returns the exit
 * code, the log in tmp/tag.out. dev = 1: on the cuda device - emulated,
 * with the build's emul/ binaries, or this machine's GPUs, one node per
 * rank on GPU 0 and host communicators when there are fewer GPUs than
 * ranks (see the header). */
static int run_job(const struct job *j, const char *tag, const char *extra, int dev)
{
	char cmd[4096], *bin = realpath(mr_proc_build_dir(), NULL), dir[1100], keys[160] = "";
	char ppkeys[256] = "";
	int st, nodes = j->nodes, nproc = j->nproc, pp = j->pp > 1 ? j->pp : 1;

	snprintf(dir, sizeof(dir), "%s%s", bin ? bin : "build", dev && EMUL ? "/emul" : "");
	if (dev && ON_DEVICE)
		snprintf(keys, sizeof(keys), ", \"device\": \"cuda\", \"precision\": \"%s\"%s",
			 PRECISION, GPU && nodes * nproc > gpus() ? ", \"comm_backend\": \"host\"" : "");
	if (dev && GPU && nodes * nproc > gpus()) {
		nodes *= nproc;
		nproc = 1;
	}
	if (pp > 1)
		snprintf(ppkeys, sizeof(ppkeys), ", \"pp_schedule\": \"%s\", \"pp_virtual\": %d%s",
			 j->sched, strcmp(j->sched, "interleaved") ? 1 : 2,
			 j->pp_extra ? j->pp_extra : "");
	snprintf(cmd, sizeof(cmd),
		 "cd '%s' && MR_CUDA_EMUL_DEVICES=4 timeout 300 '%s/meshrun' local --nodes %d --nproc-per-node %d "
		 "--tp %d --pp %d --ep %d --cp %d --workload-config '{%s, \"steps\": %d, \"batch_size\": %d, "
		 "\"seq_len\": 16, \"grad_accum\": %d, \"lr\": 0.003, \"warmup_steps\": 2, "
		 "\"threads\": 1, \"peak_flops\": 1e9, \"seed\": 11, \"zero\": %d, "
		 "\"hsdp_shard\": %d, \"sequence_parallel\": %s, \"comm_timeout_ms\": 30000, "
		 "\"loss_log\": \"%s.loss\", \"save_weights\": \"%s.bin\"%s%s%s}' >'%s.out' 2>&1",
		 tmp, dir, nodes, nproc, j->tp, pp, j->ep > 1 ? j->ep : 1,
		 j->cp > 1 ? j->cp : 1, model_json(j), STEPS, BATCH, j->accum, j->zero,
		 j->hsdp, j->sp ? "true" : "false", tag, tag, extra ? extra : "", keys, ppkeys, tag);
	free(bin);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The last lines of tmp/tag.out, for failure messages (static buffer). */
static const char *tail_of(const char *tag)
{
	static char buf[3000];
	char path[512];

	snprintf(path, sizeof(path), "%s/%s.out", tmp, tag);
	mr_test_tail(path, buf, sizeof(buf));
	return buf;
}

/* Each step's loss and gradient norm (before clipping) of tmp/tag.loss. */
static void read_losses(const char *tag, double *loss, double *norm)
{
	char path[512], head[128];
	FILE *f;
	int i;

	snprintf(path, sizeof(path), "%s/%s.loss", tmp, tag);
	f = fopen(path, "r");
	cr_assert_not_null(f, "no loss log %s", path);
	cr_assert(fgets(head, sizeof(head), f) && !strcmp(head, MR_LOSS_LOG_HEADER "\n"),
		  "%s: no header line", path);
	for (i = 0; i < STEPS; i++) {
		long long step;
		cr_assert_eq(fscanf(f, "%lld %lf %*g %lf %*g %*s", &step, &loss[i], &norm[i]), 3,
			     "%s: line %d unreadable", path, i + 2);
		cr_assert_eq(step, i + 1);
	}
	fclose(f);
}

static void load_weights(const char *tag, struct mr_gpt *m)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt_config c;
	char path[512];

	snprintf(path, sizeof(path), "%s/%s.bin", tmp, tag);
	cr_assert_eq(mr_weights_read_config(path, &c, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_create(m, &c, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_weights_load(m, path, &eb), 0, "%s", eb.msg);
}

/* Whether tmp/a and tmp/b hold the same bytes. */
static int same_file(const char *a, const char *b)
{
	char pa[512], pb[512];
	FILE *fa, *fb;
	int ca, cb, same = 1;

	snprintf(pa, sizeof(pa), "%s/%s", tmp, a);
	snprintf(pb, sizeof(pb), "%s/%s", tmp, b);
	fa = fopen(pa, "rb");
	fb = fopen(pb, "rb");
	if (!fa || !fb) {
		same = 0;
	} else {
		do {
			ca = getc(fa);
			cb = getc(fb);
		} while (ca == cb && ca != EOF);
		same = ca == cb;
	}
	if (fa)
		fclose(fa);
	if (fb)
		fclose(fb);
	return same;
}

/* The emulated fp32 run against the same job on the cpu device (lp:
 * the emulated run's losses): the same bytes, or with capacity MoE (the
 * sync-free path's other summation shape, see the header) the losses
 * within LOSS_TOL of each other every step. */
static void emul_same_as_cpu(const struct job *j, const double *lp)
{
	double lc[STEPS], nc[STEPS];
	int s;

	if (!j->moe || (j->extra && strstr(j->extra, "dropless"))) {
		cr_expect(same_file("par.loss", "cpu.loss") && same_file("par.bin", "cpu.bin"),
			  "the emulated device's run differs from the cpu device's");
		return;
	}
	read_losses("cpu", lc, nc);
	for (s = 0; s < STEPS; s++)
		cr_expect(fabs(lp[s] - lc[s]) <= LOSS_TOL * fabs(lc[s]),
			  "step %d: loss %.9g on the emulated device, %.9g on the cpu device",
			  s + 1, lp[s], lc[s]);
}

static void check(const struct job *j)
{
	struct job ref = { 1, 1, 1, 0, 0, 0, j->moe, 0, NULL, j->vocab, 0, NULL, j->layers, NULL, 0, 0 };
	int dp = j->nodes * j->nproc / (j->tp * (j->pp > 1 ? j->pp : 1) * (j->cp > 1 ? j->cp : 1));
	int s, i;
	double lp[STEPS], lr[STEPS], np[STEPS], nr[STEPS];
	int gpu_moe = GPU && !BF16 && j->moe;
	double loss_tol = gpu_moe ? GPU_MOE_LOSS_TOL : LOSS_TOL;
	double norm_tol = gpu_moe ? GPU_MOE_NORM_TOL : NORM_TOL;
	struct mr_gpt a, b;
	char why[192];

	if (GPU && gpus() < 1)
		cr_skip_test("no CUDA device, test skipped");
	scratch();
	ref.accum = dp * j->accum;
	/* bf16's reference is the emulated device's own single rank; on a real
	 * GPU every reference is the GPU's */
	cr_assert_eq(run_job(&ref, "ref", j->extra, BF16 || GPU), 0, "reference run failed:\n%s",
		     tail_of("ref"));
	cr_assert_eq(run_job(j, "par", j->extra, ON_DEVICE), 0, "parallel run failed:\n%s",
		     tail_of("par"));
	read_losses("ref", lr, nr);
	read_losses("par", lp, np);
	if (EMUL && !BF16) {
		cr_assert_eq(run_job(j, "cpu", j->extra, 0), 0, "cpu run failed:\n%s",
			     tail_of("cpu"));
		emul_same_as_cpu(j, lp);
	}
	for (s = 0; getenv("MR_PARITY_VERBOSE") && s < STEPS; s++)
		cr_log_info("step %d: loss rel %.2e, grad norm rel %.2e", s + 1,
			    fabs(lp[s] - lr[s]) / fabs(lr[s]), fabs(np[s] - nr[s]) / fabs(nr[s]));
	for (s = 0; s < (GPU && BF16 ? GPU_BF16_STEPS : STEPS); s++) {
		cr_expect(fabs(lp[s] - lr[s]) <= loss_tol * fabs(lr[s]),
			  "step %d: loss %.9g vs single rank %.9g", s + 1, lp[s], lr[s]);
		/* every parameter counted once across tp, pp and dp */
		cr_expect(fabs(np[s] - nr[s]) <= norm_tol * fabs(nr[s]),
			  "step %d: grad norm %.9g vs single rank %.9g", s + 1, np[s], nr[s]);
	}
	cr_expect(lr[STEPS - 1] < lr[0], "the reference must learn (%g -> %g)", lr[0],
		  lr[STEPS - 1]);
	if (GPU && BF16)
		return;
	load_weights("ref", &b);
	load_weights("par", &a);
	for (i = 0; i < b.ntensors; i++) {
		const struct mr_gpt_tensor *t = &b.tensors[i];
		double tol = BF16 && j->moe ? MOE_BF16_TOL : gpu_moe ? GPU_MOE_WEIGHT_TOL : WEIGHT_TOL;
		cr_expect(!mr_parity_tensor(t, a.params + t->off, b.params + t->off, tol, why,
					    sizeof(why)),
			  "%s", why);
	}
	mr_gpt_release(&a);
	mr_gpt_release(&b);
}

/* One configuration, dense or MoE, one micro-batch per rank and step:
 * nodes x nproc-per-node agents' ranks, tp, zero stage, hsdp shard, sp. */
static void parity(int nodes, int nproc, int tp, int zero, int hsdp, int sp, int moe)
{
	struct job j = { nodes, nproc, tp, zero, hsdp, sp, moe, 1, NULL, 0, 0, NULL, 0, NULL, 0, 0 };

	check(&j);
}

Test(parity, dp2_dense, NOT_UNDER_SAN) { parity(1, 2, 1, 0, 0, 0, 0); }
Test(parity, dp2_moe) { parity(1, 2, 1, 0, 0, 0, 1); }
Test(parity, dp4_dense, NOT_UNDER_SAN) { parity(2, 2, 1, 0, 0, 0, 0); }
Test(parity, dp4_moe, NOT_UNDER_SAN) { parity(2, 2, 1, 0, 0, 0, 1); }
Test(parity, zero1_dp2_dense, NOT_UNDER_SAN) { parity(1, 2, 1, 1, 0, 0, 0); }
Test(parity, zero1_dp2_moe, NOT_UNDER_SAN_EMUL) { parity(1, 2, 1, 1, 0, 0, 1); }
Test(parity, zero1_dp4_dense, NOT_UNDER_SAN) { parity(2, 2, 1, 1, 0, 0, 0); }
Test(parity, zero1_dp4_moe, NOT_UNDER_SAN) { parity(2, 2, 1, 1, 0, 0, 1); }
Test(parity, zero2_dp2_dense, NOT_UNDER_SAN) { parity(1, 2, 1, 2, 0, 0, 0); }
Test(parity, zero2_dp2_moe, NOT_UNDER_SAN_EMUL) { parity(1, 2, 1, 2, 0, 0, 1); }
Test(parity, zero2_dp4_dense, NOT_UNDER_SAN) { parity(2, 2, 1, 2, 0, 0, 0); }
Test(parity, zero2_dp4_moe, NOT_UNDER_SAN) { parity(2, 2, 1, 2, 0, 0, 1); }
Test(parity, zero3_dp2_dense, NOT_UNDER_SAN) { parity(1, 2, 1, 3, 0, 0, 0); }
Test(parity, zero3_dp2_moe) { parity(1, 2, 1, 3, 0, 0, 1); }
Test(parity, zero3_dp4_dense, NOT_UNDER_SAN) { parity(2, 2, 1, 3, 0, 0, 0); }
Test(parity, zero3_dp4_moe, NOT_UNDER_SAN) { parity(2, 2, 1, 3, 0, 0, 1); }
Test(parity, hsdp_2x2_dense, NOT_UNDER_SAN) { parity(2, 2, 1, 3, 2, 0, 0); }
Test(parity, hsdp_2x2_moe, NOT_UNDER_SAN_EMUL) { parity(2, 2, 1, 3, 2, 0, 1); }
Test(parity, tp2_dense, NOT_UNDER_SAN) { parity(1, 2, 2, 0, 0, 0, 0); }
Test(parity, tp2_moe, NOT_UNDER_SAN_EMUL) { parity(1, 2, 2, 0, 0, 0, 1); }
Test(parity, tp4_dense, NOT_UNDER_SAN) { parity(1, 4, 4, 0, 0, 0, 0); }
Test(parity, tp4_moe, NOT_UNDER_SAN) { parity(1, 4, 4, 0, 0, 0, 1); }
Test(parity, tp2_sp_dense, NOT_UNDER_SAN) { parity(1, 2, 2, 0, 0, 1, 0); }
Test(parity, tp2_sp_moe) { parity(1, 2, 2, 0, 0, 1, 1); }
Test(parity, tp2_dp2_zero3_sp_dense, NOT_UNDER_SAN_EMUL) { parity(2, 2, 2, 3, 0, 1, 0); }
Test(parity, tp2_dp2_zero3_sp_moe, NOT_UNDER_SAN) { parity(2, 2, 2, 3, 0, 1, 1); }

/* a vocabulary tp does not divide: padded on the tp ranks, exact */
Test(parity, tp2_dp2_padded_vocab, NOT_UNDER_SAN_EMUL)
{
	struct job j = { 2, 2, 2, 1, 0, 1, 0, 1, NULL, 63, 0, NULL, 0, NULL, 0, 0 };

	check(&j);
}

Test(parity, dp2_with_accumulation, NOT_UNDER_SAN_EMUL)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 0, 2, NULL, 0, 0, NULL, 0, NULL, 0, 0 };

	check(&j);
}

/* sequence parallel with accumulation: a LayerNorm's gradient summed over
 * tp must be this micro-batch's only (the sum once multiplied the earlier
 * micro-batches' by tp) */
Test(parity, tp2_sp_with_accumulation, NOT_UNDER_SAN_EMUL)
{
	struct job j = { 1, 2, 2, 0, 0, 1, 0, 2, NULL, 0, 0, NULL, 0, NULL, 0, 0 };

	check(&j);
}

/*
 * Pipeline parallel: pp stages of an 8-layer model (so pp4 x 2 chunks
 * still gives every virtual stage a block; MoE on every second layer),
 * 4 micro-batches per step (interleaved needs a multiple of pp), against
 * one rank accumulating the same micro-batches: every schedule must give
 * the single-rank losses and weights. nodes x nproc ranks, tp, zero.
 */
static void pipeline(int nodes, int nproc, int tp, int pp, const char *sched, int zero, int sp,
		     int moe)
{
	struct job j = { nodes, nproc, tp, zero, 0, sp, moe, 4, NULL, 0, pp, sched, 8, NULL, 0, 0 };

	check(&j);
}

Test(parity, pp2_1f1b_dense, NOT_UNDER_SAN_EMUL) { pipeline(1, 2, 1, 2, "1f1b", 0, 0, 0); }
Test(parity, pp2_zbh1_moe) { pipeline(1, 2, 1, 2, "zb-h1", 0, 0, 1); }
#if !EMUL /* the rest on the cpu and on a real GPU; the emulation is slow */
Test(parity, pp2_1f1b_moe, NOT_UNDER_SAN) { pipeline(1, 2, 1, 2, "1f1b", 0, 0, 1); }
Test(parity, pp2_gpipe_dense, NOT_UNDER_SAN_EMUL) { pipeline(1, 2, 1, 2, "gpipe", 0, 0, 0); }
Test(parity, pp2_gpipe_moe, NOT_UNDER_SAN) { pipeline(1, 2, 1, 2, "gpipe", 0, 0, 1); }
Test(parity, pp2_interleaved_dense, NOT_UNDER_SAN) { pipeline(1, 2, 1, 2, "interleaved", 0, 0, 0); }
Test(parity, pp2_interleaved_moe, NOT_UNDER_SAN_EMUL) { pipeline(1, 2, 1, 2, "interleaved", 0, 0, 1); }
Test(parity, pp2_zbh1_dense, NOT_UNDER_SAN) { pipeline(1, 2, 1, 2, "zb-h1", 0, 0, 0); }
Test(parity, pp4_1f1b_dense, NOT_UNDER_SAN) { pipeline(1, 4, 1, 4, "1f1b", 0, 0, 0); }
Test(parity, pp4_1f1b_moe, NOT_UNDER_SAN) { pipeline(1, 4, 1, 4, "1f1b", 0, 0, 1); }
Test(parity, pp4_gpipe_dense, NOT_UNDER_SAN) { pipeline(1, 4, 1, 4, "gpipe", 0, 0, 0); }
Test(parity, pp4_gpipe_moe, NOT_UNDER_SAN) { pipeline(1, 4, 1, 4, "gpipe", 0, 0, 1); }
Test(parity, pp4_interleaved_dense, NOT_UNDER_SAN) { pipeline(2, 2, 1, 4, "interleaved", 0, 0, 0); }
Test(parity, pp4_interleaved_moe, NOT_UNDER_SAN) { pipeline(2, 2, 1, 4, "interleaved", 0, 0, 1); }
Test(parity, pp4_zbh1_dense, NOT_UNDER_SAN) { pipeline(1, 4, 1, 4, "zb-h1", 0, 0, 0); }
Test(parity, pp4_zbh1_moe, NOT_UNDER_SAN) { pipeline(1, 4, 1, 4, "zb-h1", 0, 0, 1); }
Test(parity, pp2_dp2_zero1_dense, NOT_UNDER_SAN) { pipeline(2, 2, 1, 2, "1f1b", 1, 0, 0); }
Test(parity, pp2_dp2_zero1_moe, NOT_UNDER_SAN) { pipeline(2, 2, 1, 2, "1f1b", 1, 0, 1); }
Test(parity, pp2_dp2_zero3_dense, NOT_UNDER_SAN) { pipeline(2, 2, 1, 2, "zb-h1", 3, 0, 0); }
Test(parity, pp2_dp2_zero3_moe, NOT_UNDER_SAN_EMUL) { pipeline(2, 2, 1, 2, "interleaved", 3, 0, 1); }
Test(parity, pp2_tp2_sp_dense, NOT_UNDER_SAN) { pipeline(1, 4, 2, 2, "1f1b", 0, 1, 0); }
Test(parity, pp2_tp2_sp_moe, NOT_UNDER_SAN_EMUL) { pipeline(1, 4, 2, 2, "zb-h1", 0, 1, 1); }
Test(parity, pp2_tp2_dp2_dense, NOT_UNDER_SAN) { pipeline(2, 4, 2, 2, "1f1b", 1, 1, 0); }
Test(parity, pp2_tp2_dp2_moe, NOT_UNDER_SAN) { pipeline(2, 4, 2, 2, "interleaved", 0, 0, 1); }

/* transfers the way an in-order backend (NCCL) needs them: no receive
 * posted ahead, each send grouped with the next receive */
static void paired(int pp, const char *sched, int moe)
{
	struct job j = { 1, pp, 1, 0, 0, 0, moe, 4, NULL, 0, pp, sched, 8,
			 ", \"pp_p2p\": \"paired\"", 0, 0 };

	check(&j);
}

Test(parity, pp4_1f1b_paired_dense, NOT_UNDER_SAN) { paired(4, "1f1b", 0); }
Test(parity, pp4_gpipe_paired_moe, NOT_UNDER_SAN) { paired(4, "gpipe", 1); }
Test(parity, pp4_interleaved_paired_dense, NOT_UNDER_SAN) { paired(4, "interleaved", 0); }
Test(parity, pp4_zbh1_paired_moe, NOT_UNDER_SAN_EMUL) { paired(4, "zb-h1", 1); }

/* an explicit, uneven split: 6 blocks on the first stage, 2 on the last */
static void uneven(int moe)
{
	struct job j = { 1, 2, 1, 0, 0, 0, moe, 4, NULL, 0, 2, "1f1b", 8,
			 ", \"pp_layers\": [6, 2]", 0, 0 };

	check(&j);
}

Test(parity, pp2_uneven_split_dense, NOT_UNDER_SAN_EMUL) { uneven(0); }
Test(parity, pp2_uneven_split_moe, NOT_UNDER_SAN) { uneven(1); }
#endif

/*
 * Expert parallel: the MoE layers' 4 experts over ep ranks carved from
 * dp (layers/mr_ep.h), against one rank accumulating the dp
 * micro-batches with all 4 experts. Capacity 0.75 drops tokens per
 * source micro-batch, exactly as the single rank drops them; the dropless
 * runs compare with a dropless single rank. ep2 over dp4 has an
 * expert-data-parallel group of 2. nodes x nproc ranks, tp, pp.
 */
static void expert(int nodes, int nproc, int tp, int pp, int ep, int dropless, int zero)
{
	struct job j = { nodes, nproc, tp, zero, 0, 0, 1, pp > 1 ? 4 : 1, NULL, 0, pp,
			 pp > 1 ? "1f1b" : NULL, pp > 1 ? 8 : 0, NULL, ep, 0 };

	if (dropless)
		j.extra = ", \"moe_policy\": \"dropless\"";
	check(&j);
}

Test(parity, ep2_capacity) { expert(1, 2, 1, 1, 2, 0, 0); }
#if !EMUL
Test(parity, ep2_dropless, NOT_UNDER_SAN_EMUL) { expert(1, 2, 1, 1, 2, 1, 0); }
Test(parity, ep4_capacity, NOT_UNDER_SAN) { expert(2, 2, 1, 1, 4, 0, 0); }
Test(parity, ep4_dropless, NOT_UNDER_SAN) { expert(1, 4, 1, 1, 4, 1, 0); }
Test(parity, ep2_dp4_capacity, NOT_UNDER_SAN) { expert(2, 2, 1, 1, 2, 0, 0); }
Test(parity, ep2_tp2, NOT_UNDER_SAN_EMUL) { expert(1, 4, 2, 1, 2, 0, 0); }
Test(parity, ep2_pp2, NOT_UNDER_SAN_EMUL) { expert(1, 4, 1, 2, 2, 1, 0); }
/* ZeRO: the experts shard over the expert-data-parallel group (dp / ep
 * ranks; one rank at dp2 ep2), the rest over dp */
Test(parity, ep2_zero1, NOT_UNDER_SAN) { expert(1, 2, 1, 1, 2, 0, 1); }
Test(parity, ep2_dp4_zero1, NOT_UNDER_SAN) { expert(2, 2, 1, 1, 2, 0, 1); }
Test(parity, ep2_dp4_zero2, NOT_UNDER_SAN) { expert(2, 2, 1, 1, 2, 1, 2); }
Test(parity, ep2_dp4_zero3, NOT_UNDER_SAN_EMUL) { expert(2, 2, 1, 1, 2, 0, 3); }
Test(parity, ep2_tp2_zero3, NOT_UNDER_SAN_EMUL) { expert(1, 4, 2, 1, 2, 0, 3); }
Test(parity, ep2_pp2_zero1, NOT_UNDER_SAN) { expert(1, 4, 1, 2, 2, 1, 1); }
#endif
#if EMUL
Test(parity, ep2_dp4_zero3, NOT_UNDER_SAN_EMUL) { expert(2, 2, 1, 1, 2, 0, 3); }
#endif
#if ON_DEVICE
/* llama with replicated key/value heads (2 over tp4, sp) on the device:
 * the kv group's gradient sum over device buffers; emulated, it must equal
 * the cpu device's run bit for bit */
Test(parity, llama_tp4_sp_kv_replicated_device, NOT_UNDER_SAN_EMUL)
{
	struct job j = { 1, 4, 4, 0, 0, 1, 0, 1,
			 ", \"arch\": \"llama\", \"ffn_hidden\": 128, \"n_kv_head\": 2",
			 0, 0, NULL, 0, NULL, 0, 0 };

	check(&j);
}
#endif

/*
 * Context parallel: every sequence split over cp ranks in 2*cp chunks
 * (rank r holds chunks r and 2cp-1-r; layers/mr_cp.h), against one
 * rank with the whole sequences. MoE models run dropless: capacity is per
 * micro-batch of the tokens a rank routes, and a cp rank routes 1/cp of
 * them. nodes x nproc ranks, tp (with sequence parallel), pp, ep, zero;
 * cp_algo "ring" (the default), "allgather" or "ulysses".
 */
static void context(int nodes, int nproc, int tp, int pp, int cp, int ep, int zero, int moe,
		    const char *algo)
{
	struct job j = { nodes, nproc, tp, zero, 0, tp > 1, moe, pp > 1 ? 4 : 1, NULL, 0, pp,
			 pp > 1 ? "1f1b" : NULL, pp > 1 ? 8 : 0, NULL, ep, cp };
	static char extra[128];

	snprintf(extra, sizeof(extra), ", \"cp_algo\": \"%s\"%s", algo,
		 moe ? ", \"moe_policy\": \"dropless\"" : "");
	j.extra = extra;
	check(&j);
}

#if EMUL
/* Context parallel with capacity routing on the emulated fp32 device: the
 * sync-free MoE sums the routed counts over cp in device memory and forms
 * the aux loss there. A cp rank routes 1/cp of the tokens, so no single
 * rank computes the same: the job against itself on the cpu device (as
 * emul_same_as_cpu), and no MoE layer took the host path. */
Test(parity, cp2_moe_capacity_on_device_as_on_cpu)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 1, 1, ", \"cp_algo\": \"ring\"", 0, 0, NULL, 0, NULL,
			 1, 2 };
	double lp[STEPS], np[STEPS];
	char path[512], *log;

	if (BF16)
		cr_skip_test("the cpu device computes fp32 only");
	scratch();
	cr_assert_eq(run_job(&j, "par", j.extra, 1), 0, "device run failed:\n%s", tail_of("par"));
	cr_assert_eq(run_job(&j, "cpu", j.extra, 0), 0, "cpu run failed:\n%s", tail_of("cpu"));
	read_losses("par", lp, np);
	emul_same_as_cpu(&j, lp);
	snprintf(path, sizeof(path), "%s/par.out", tmp);
	cr_assert_not_null(log = mr_test_slurp(path, NULL));
	cr_expect_null(strstr(log, "moe_host_counts"), "a MoE layer took the host path:\n%s",
		       tail_of("par"));
	free(log);
}
#endif

Test(parity, cp2_dense) { context(1, 2, 1, 1, 2, 1, 0, 0, "ring"); }
Test(parity, cp2_allgather, NOT_UNDER_SAN_EMUL) { context(1, 2, 1, 1, 2, 1, 0, 0, "allgather"); }
Test(parity, cp2_ulysses) { context(1, 2, 1, 1, 2, 1, 0, 0, "ulysses"); }
#if !EMUL
Test(parity, cp4_ulysses, NOT_UNDER_SAN) { context(1, 4, 1, 1, 4, 1, 0, 0, "ulysses"); }
Test(parity, cp2_tp2_sp_ulysses, NOT_UNDER_SAN) { context(1, 4, 2, 1, 2, 1, 0, 0, "ulysses"); }
Test(parity, cp2_pp2_ulysses, NOT_UNDER_SAN) { context(1, 4, 1, 2, 2, 1, 0, 1, "ulysses"); }
Test(parity, cp4_dense, NOT_UNDER_SAN) { context(1, 4, 1, 1, 4, 1, 0, 0, "ring"); }
Test(parity, cp4_allgather, NOT_UNDER_SAN) { context(1, 4, 1, 1, 4, 1, 0, 0, "allgather"); }
Test(parity, cp2_tp2_sp_allgather, NOT_UNDER_SAN) { context(1, 4, 2, 1, 2, 1, 0, 0, "allgather"); }
Test(parity, cp2_pp2_allgather, NOT_UNDER_SAN) { context(1, 4, 1, 2, 2, 1, 0, 1, "allgather"); }
Test(parity, cp2_moe_dropless, NOT_UNDER_SAN) { context(1, 2, 1, 1, 2, 1, 0, 1, "ring"); }
Test(parity, cp2_dp2, NOT_UNDER_SAN) { context(2, 2, 1, 1, 2, 1, 0, 0, "ring"); }
Test(parity, cp2_dp2_zero3, NOT_UNDER_SAN_EMUL) { context(2, 2, 1, 1, 2, 1, 3, 0, "ring"); }
Test(parity, cp2_tp2_sp, NOT_UNDER_SAN_EMUL) { context(1, 4, 2, 1, 2, 1, 0, 0, "ring"); }
Test(parity, cp2_pp2, NOT_UNDER_SAN_EMUL) { context(1, 4, 1, 2, 2, 1, 0, 1, "ring"); }
Test(parity, cp2_ep2, NOT_UNDER_SAN_EMUL) { context(1, 2, 1, 1, 2, 2, 0, 1, "ring"); }
/*
 * Every pair of modes at degree 2, dense and MoE where it applies (ep only
 * has MoE): dp x tp tp2_dp2_zero3_sp_*, dp x pp pp2_dp2_zero1_*, dp x cp
 * cp2_dp2 and cp2_dp2_moe, dp x ep ep2_capacity, tp x pp pp2_tp2_sp_*,
 * tp x cp cp2_tp2_sp and cp2_tp2_sp_moe, tp x ep ep2_tp2, pp x cp
 * cp2_pp2_dense and cp2_pp2, pp x ep ep2_pp2, cp x ep cp2_ep2.
 */
Test(parity, cp2_dp2_moe, NOT_UNDER_SAN) { context(2, 2, 1, 1, 2, 1, 0, 1, "ring"); }
Test(parity, cp2_tp2_sp_moe, NOT_UNDER_SAN) { context(1, 4, 2, 1, 2, 1, 0, 1, "ring"); }
Test(parity, cp2_pp2_dense, NOT_UNDER_SAN) { context(1, 4, 1, 2, 2, 1, 0, 0, "ring"); }
/* all five at once, the default job's mesh: tp2 (sp) x cp2 x pp2 x dp2 =
 * 16 ranks on 4 nodes, the experts over ep2, ZeRO-1 */
Test(parity, five_modes_16_ranks, .timeout = 600, NOT_UNDER_SAN) { context(4, 4, 2, 2, 2, 2, 1, 1, "ring"); }
#endif

#if !ON_DEVICE
/*
 * The llama family (model/llama.c) through the same matrix: grouped-query
 * attention (2 key/value heads of 4: tp2 splits them), an explicit SwiGLU
 * hidden size, the untied head (on the last pipeline stage alone, no
 * embedding group) or a tied one; context parallel with each algorithm.
 * nodes x nproc ranks, tp (with sp), pp (8 blocks, 1f1b or interleaved),
 * cp, zero.
 */
static void llama_job(int nodes, int nproc, int tp, int pp, int cp, int ep, int zero,
		      const char *sched, const char *family)
{
	struct job j = { nodes, nproc, tp, zero, 0, tp > 1, ep > 0, pp > 1 ? 4 : 1, NULL, 0, pp,
			 pp > 1 ? sched : NULL, pp > 1 ? 8 : 0, NULL, ep, cp };
	static char extra[192];

	snprintf(extra, sizeof(extra), ", \"arch\": \"llama\", \"ffn_hidden\": 64%s", family);
	j.extra = extra;
	check(&j);
}

static void llama(int nodes, int nproc, int tp, int pp, int cp, int zero, const char *sched,
		  const char *family)
{
	llama_job(nodes, nproc, tp, pp, cp, 0, zero, sched, family);
}

#define GQA ", \"n_kv_head\": 2"
#define MHA_TIED ", \"n_kv_head\": 4, \"tie_embeddings\": true"
Test(parity, llama_dp2_zero3) { llama(1, 2, 1, 1, 1, 3, NULL, GQA); }
Test(parity, llama_tp2_sp_gqa, NOT_UNDER_SAN) { llama(1, 2, 2, 1, 1, 0, NULL, GQA); }
Test(parity, llama_pp2_untied_head, NOT_UNDER_SAN) { llama(1, 2, 1, 2, 1, 0, "1f1b", GQA); }
Test(parity, llama_pp2_interleaved_tied_head, NOT_UNDER_SAN)
{
	llama(1, 2, 1, 2, 1, 0, "interleaved", MHA_TIED);
}
Test(parity, llama_cp2_ring_gqa) { llama(1, 2, 1, 1, 2, 0, NULL, GQA); }
Test(parity, llama_cp2_allgather_gqa, NOT_UNDER_SAN)
{
	llama(1, 2, 1, 1, 2, 0, NULL, GQA ", \"cp_algo\": \"allgather\"");
}
Test(parity, llama_cp2_ulysses_gqa, NOT_UNDER_SAN)
{
	llama(1, 2, 1, 1, 2, 0, NULL, GQA ", \"cp_algo\": \"ulysses\"");
}
Test(parity, llama_tp2_pp2_dp2_zero1, NOT_UNDER_SAN) { llama(2, 4, 2, 2, 1, 1, "1f1b", GQA); }
/* Replicated key/value heads (tp above n_kv_head, model/mr_gpt.h's
 * mr_gpt_kv_rep): each tp rank holds the one head its query heads use and
 * the ranks sharing a head sum its weight gradient; every one against the
 * single rank. 2 heads over tp4 (pairs share), 1 (MQA) over tp2 and tp4
 * with sp, with cp (ring and all-gather), with ZeRO-3 over dp2, and with
 * a pipeline. */
#define MQA ", \"n_kv_head\": 1"
Test(parity, llama_tp4_sp_kv_replicated) { llama(1, 4, 4, 1, 1, 0, NULL, GQA); }
Test(parity, llama_tp2_sp_mqa) { llama(1, 2, 2, 1, 1, 0, NULL, MQA); }
Test(parity, llama_tp4_sp_mqa, NOT_UNDER_SAN) { llama(1, 4, 4, 1, 1, 0, NULL, MQA); }
Test(parity, llama_tp2_cp2_mqa, NOT_UNDER_SAN) { llama(1, 4, 2, 1, 2, 0, NULL, MQA); }
Test(parity, llama_tp2_cp2_allgather_mqa, NOT_UNDER_SAN)
{
	llama(1, 4, 2, 1, 2, 0, NULL, MQA ", \"cp_algo\": \"allgather\"");
}
Test(parity, llama_tp4_dp2_zero3_kv_replicated, .timeout = 300, NOT_UNDER_SAN)
{
	llama(2, 4, 4, 1, 1, 3, NULL, GQA);
}
Test(parity, llama_tp2_dp2_zero2_mqa, NOT_UNDER_SAN) { llama(2, 2, 2, 1, 1, 2, NULL, MQA); }
Test(parity, llama_tp2_pp2_mqa, NOT_UNDER_SAN) { llama(1, 4, 2, 2, 1, 0, "1f1b", MQA); }
/* the split backward: k and v's weight gradients summed in the weight phase */
Test(parity, llama_tp2_pp2_zbh1_mqa, NOT_UNDER_SAN) { llama(1, 4, 2, 2, 1, 0, "zb-h1", MQA); }
/* SwiGLU experts every 2nd layer (the MoE keys of model_json: 4 experts,
 * top-2, capacity 0.75 dropping): over ep2, and split by tp2 with sp */
Test(parity, llama_moe_ep2) { llama_job(1, 2, 1, 1, 1, 2, 0, NULL, GQA); }
Test(parity, llama_moe_tp2_sp, NOT_UNDER_SAN) { llama_job(1, 2, 2, 1, 1, 1, 0, NULL, GQA); }

/* Bad placement fails at start, on every rank, before any step. */
static void expect_rejected(const struct job *j, const char *extra, const char *field)
{
	char path[512], *log = NULL;
	size_t cap = 0;
	FILE *f;
	int found = 0;

	scratch();
	cr_expect_neq(run_job(j, "bad", extra, 0), 0, "the job must fail");
	snprintf(path, sizeof(path), "%s/bad.out", tmp);
	f = fopen(path, "r");
	cr_assert_not_null(f);
	while (getline(&log, &cap, f) > 0)
		if (strstr(log, field))
			found = 1;
	free(log);
	fclose(f);
	cr_expect(found, "no message naming '%s':\n%s", field, tail_of("bad"));
	snprintf(path, sizeof(path), "%s/bad.loss", tmp);
	cr_expect(access(path, F_OK) != 0, "a step was trained before the error");
}

Test(parity, tp_not_dividing_heads_is_rejected)
{
	struct job j = { 1, 3, 3, 0, 0, 0, 0, 1, NULL, 0, 0, NULL, 0, NULL, 0, 0 };

	expect_rejected(&j, NULL, "n_head");
}

/* Ulysses exchanges whole key/value heads over cp: a replicated head (one
 * per tp rank) cannot be cut */
Test(parity, ulysses_with_replicated_kv_heads_is_rejected)
{
	struct job j = { 1, 4, 2, 0, 0, 1, 0, 1,
			 ", \"arch\": \"llama\", \"ffn_hidden\": 64, \"n_kv_head\": 1, "
			 "\"cp_algo\": \"ulysses\"", 0, 0, NULL, 0, NULL, 0, 2 };

	expect_rejected(&j, j.extra, "n_kv_head");
}

Test(parity, unknown_zero_stage_is_rejected)
{
	struct job j = { 1, 2, 1, 4, 0, 0, 0, 1, NULL, 0, 0, NULL, 0, NULL, 0, 0 };

	expect_rejected(&j, NULL, "zero");
}

/* pipeline splits and schedules that cannot run */
Test(parity, pipeline_split_not_adding_up_is_rejected)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 0, 4, NULL, 0, 2, "1f1b", 8,
			 ", \"pp_layers\": [3, 3]", 0, 0 };

	expect_rejected(&j, NULL, "pp_layers");
}

Test(parity, pipeline_stage_without_a_layer_is_rejected)
{
	struct job j = { 1, 4, 1, 0, 0, 0, 0, 4, NULL, 0, 4, "interleaved", 6, NULL, 0, 0 };

	expect_rejected(&j, NULL, "pp_virtual"); /* 4 stages x 2 chunks, 6 layers */
}

Test(parity, interleaved_micro_batches_not_a_multiple_of_pp_are_rejected)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 0, 3, NULL, 0, 2, "interleaved", 8, NULL, 0, 0 };

	expect_rejected(&j, NULL, "grad_accum");
}

Test(parity, unknown_pipeline_schedule_is_rejected)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 0, 4, NULL, 0, 2, "2f2b", 8, NULL, 0, 0 };

	expect_rejected(&j, NULL, "pp_schedule");
}

/* context parallelism that cannot run */
Test(parity, cp_not_dividing_the_chunks_is_rejected)
{
	struct job j = { 1, 3, 1, 0, 0, 0, 0, 1, NULL, 0, 0, NULL, 0, NULL, 0, 3 };

	expect_rejected(&j, NULL, "seq_len"); /* 16 tokens in 2 * 3 chunks */
}

Test(parity, unknown_cp_algo_is_rejected)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 0, 1, NULL, 0, 0, NULL, 0, NULL, 0, 2 };

	expect_rejected(&j, ", \"cp_algo\": \"spiral\"", "cp_algo");
}

Test(parity, ulysses_heads_not_divisible_by_cp_is_rejected)
{
	/* 4 heads over tp 2 leave 2 per rank, cp 4 */
	struct job j = { 1, 8, 2, 0, 0, 0, 0, 1, NULL, 0, 0, NULL, 0, NULL, 0, 4 };

	expect_rejected(&j, ", \"cp_algo\": \"ulysses\"", "n_head");
}

/* expert parallelism that cannot run */
Test(parity, ep_not_dividing_experts_is_rejected)
{
	struct job j = { 1, 3, 1, 0, 0, 0, 1, 1, NULL, 0, 0, NULL, 0, NULL, 3, 0 };

	expect_rejected(&j, NULL, "does not divide 'n_experts'"); /* 4 over 3 */
}

Test(parity, ep_not_dividing_dp_cp_is_rejected)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 1, 1, NULL, 0, 0, NULL, 0, NULL, 4, 0 };

	expect_rejected(&j, NULL, "does not divide dp*cp"); /* ep 4 over 2 ranks */
}

Test(parity, ep_on_a_dense_model_is_rejected)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 0, 1, NULL, 0, 0, NULL, 0, NULL, 2, 0 };

	expect_rejected(&j, NULL, "moe_every");
}

Test(parity, ep_with_hsdp_is_rejected)
{
	struct job j = { 2, 2, 1, 3, 2, 0, 1, 1, NULL, 0, 0, NULL, 0, NULL, 2, 0 };

	expect_rejected(&j, NULL, "hsdp_shard");
}

Test(parity, unknown_moe_policy_is_rejected)
{
	struct job j = { 1, 2, 1, 0, 0, 0, 1, 1, NULL, 0, 0, NULL, 0, NULL, 0, 0 };

	expect_rejected(&j, ", \"moe_policy\": \"dropfree\"", "moe_policy");
}

Test(parity, hsdp_shard_not_dividing_dp_is_rejected)
{
	struct job j = { 1, 2, 1, 3, 3, 0, 0, 1, NULL, 0, 0, NULL, 0, NULL, 0, 0 };

	expect_rejected(&j, NULL, "hsdp_shard");
}
#endif
