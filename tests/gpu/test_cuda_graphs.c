/*
 * test_cuda_graphs.c - device graphs (CUDA graphs) on the cuda device: the
 * kernel layer's capture and launch, and the step driver's two graphs (a
 * micro-batch's forward + backward, the AdamW update; mr_step.h).
 *
 * The emulation records every call while capturing (computing nothing)
 * and re-runs the captured function at each launch, aborting when a call
 * differs from the capture's; so a run with graphs that gives the same
 * bits as a run without them has its per-launch inputs (tokens, AdamW's
 * scalars) outside the graphs and its loss read after them, and every
 * captured call took the same arguments on every launch.
 *
 * Config: the dense GPT of test_cuda_model (L2, d_model 64, 2 heads,
 * vocab 96), B 2, T 16, 2 micro-batches a step, new batches every step,
 * 6 steps of a cosine schedule with warm-up, weight decay and clipping at
 * 1.0 (the clip factor changes from step to step), fp32 and bf16.
 *
 * Built twice (Makefile): against the emulation and against the real
 * kernels (skips without a device), where the graphs must give the bits
 * of eager too (the kernels are deterministic); the stale-argument cases
 * are the emulation's only - on a GPU a stale argument is silent, which
 * is what the emulation exists to catch.
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/mr_synth.h"
#include "device/dev_int.h"
#include "gpu_harness.h"
#include "model/mr_gpt.h"
#include "mr_step.h"

#define STEPS 6
#define ACCUM 2
#define SEED 11
#define BATCH 2
#define SEQ 16
#define ROWS (ACCUM * BATCH * SEQ)
#define EAGER_STEP (STEPS - 2) /* past the warm-up, with graphs on both sides */
/* the launches of a run with graphs: every micro-batch and update after
 * the warm-up, but the eager step's */
#define LAUNCHES ((long)(STEPS - MR_STEP_WARMUP - 1) * (ACCUM + 1))

static const struct mr_gpt_config dense = { .vocab = 96, .max_seq = 16, .n_layer = 2, .d_model = 64,
					    .n_head = 2 };
/* a MoE layer under capacity routing: sync-free, nothing read on the
 * host until the results */
static const struct mr_gpt_config moe = { .vocab = 96, .max_seq = 16, .n_layer = 2, .d_model = 64,
					  .n_head = 2, .moe_every = 2, .n_experts = 4, .top_k = 2,
					  .capacity_factor = 1.0f, .aux_coef = 0.01f };
/* the same, dropless: its routing counts go to the host */
static const struct mr_gpt_config dropless = { .vocab = 96, .max_seq = 16, .n_layer = 2,
					       .d_model = 64, .n_head = 2, .moe_every = 2,
					       .n_experts = 4, .top_k = 2, .moe_dropless = 1,
					       .capacity_factor = 1.0f,
					       .aux_coef = 0.01f };
/* lr, min_lr_frac, warmup, total, beta1, beta2, eps, weight_decay, clip */
static const struct mr_adamw_config ocfg = { 1e-2f, 0.1f, 2, STEPS, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f, MR_LR_COSINE, 0.0f };

/* What a run leaves to compare. */
struct run {
	float loss[STEPS], aux[STEPS], lr[STEPS], norm[STEPS];
	float *final; /* the weights after the last step (nparams) */
	size_t n;
	long launches;
};

/* A model of cfg on a fresh emulated cuda device and its step driver,
 * graphs as asked. */
struct job {
	struct mr_dev d;
	struct mr_gpt m;
	struct mr_step st;
};

static void job_open(struct job *j, const struct mr_gpt_config *cfg, int bf16, int graphs)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };

#ifdef MR_CUDA_EMUL
	cr_assert_eq(mr__dev_cuda_open(&j->d, 0, bf16 ? MR_DT_BF16 : MR_DT_F32, &eb), 0, "%s",
		     eb.msg);
#else
	cr_assert_eq(mr_dev_open(&j->d, "cuda", 0, bf16 ? "bf16" : "fp32", NULL, &eb), 0, "%s",
		     eb.msg);
#endif
	cr_assert_eq(mr_gpt_create_on(&j->m, cfg, BATCH, SEQ, &j->d, NULL, mr_dp_model_flags(0),
				      &eb),
		     0, "%s", eb.msg);
	cr_assert_eq(mr_step_init(&j->st, &j->m, &ocfg, NULL, NULL, SEED, &eb), 0, "%s", eb.msg);
	if (!graphs)
		j->st.graphs = MR_STEP_GRAPHS_OFF;
}

static void job_close(struct job *j)
{
	mr_step_release(&j->st);
	mr_gpt_release(&j->m);
	mr_dev_close(&j->d);
}

/* Step s of a job of cfg: its own batches. */
static void job_step(struct job *j, const struct mr_gpt_config *cfg, int s,
		     struct mr_step_result *res)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int in[ROWS], tg[ROWS], a;

	for (a = 0; a < ACCUM; a++)
		mr_synth_batch(SEED, 0, (uint64_t)(s * ACCUM + a) * BATCH, cfg->vocab, BATCH, SEQ,
			       in + a * BATCH * SEQ, tg + a * BATCH * SEQ);
	cr_assert_eq(mr_step_run(&j->st, in, tg, ACCUM, res, &eb), 0, "step %d: %s", s, eb.msg);
}

static void train(const struct mr_gpt_config *cfg, int bf16, int graphs, struct run *r)
{
	struct mr_step_result res;
	struct job j;
	int s;

	job_open(&j, cfg, bf16, graphs);
	for (s = 0; s < STEPS; s++) {
		/* one step between launches runs eagerly, as a profiled one */
		j.st.eager = s == EAGER_STEP;
		job_step(&j, cfg, s, &res);
		r->loss[s] = res.loss;
		r->aux[s] = res.aux_loss;
		r->lr[s] = res.lr;
		r->norm[s] = res.grad_norm;
	}
	r->n = j.m.nparams;
	r->final = xmalloc(r->n * sizeof(float));
	cr_assert_eq(mr_dp_gather_params(j.st.dp, r->final), 0);
	r->launches = j.d.graph_launches;
	job_close(&j);
}

/* Bit for bit: losses, norms and the final weights. */
static void same_bits(const struct run *g, const struct run *e, const char *what)
{
	int s;

	for (s = 0; s < STEPS; s++)
		cr_assert(!memcmp(&g->loss[s], &e->loss[s], sizeof(float)) &&
				  !memcmp(&g->aux[s], &e->aux[s], sizeof(float)) &&
				  !memcmp(&g->norm[s], &e->norm[s], sizeof(float)),
			  "%s step %d: loss %.9g vs %.9g, aux %.9g vs %.9g, norm %.9g vs %.9g",
			  what, s, g->loss[s], e->loss[s], g->aux[s], e->aux[s], g->norm[s],
			  e->norm[s]);
	cr_assert_eq(g->n, e->n);
	cr_assert(!memcmp(g->final, e->final, g->n * sizeof(float)),
		  "%s: the final weights differ", what);
}

Test(cuda_graphs, training_with_graphs_gives_the_bits_of_eager)
{
	int bf16;

	need_gpu();
	for (bf16 = 0; bf16 <= 1; bf16++) {
		struct run g, e;

		memset(&g, 0, sizeof(g));
		memset(&e, 0, sizeof(e));
		train(&dense, bf16, 1, &g);
		train(&dense, bf16, 0, &e);
		same_bits(&g, &e, bf16 ? "bf16" : "fp32");
		/* the schedule moves: a scalar baked at capture would show */
		cr_assert_neq(g.lr[MR_STEP_WARMUP], g.lr[STEPS - 1]);
		cr_assert(e.loss[STEPS - 1] < e.loss[0], "did not learn");
		/* after the warm-up every micro-batch and every update a launch */
		cr_assert_eq(g.launches, LAUNCHES, "%s: %ld launches", bf16 ? "bf16" : "fp32",
			     g.launches);
		cr_assert_eq(e.launches, 0);
		free(g.final);
		free(e.final);
	}
	gpu_teardown();
}

#ifdef MR_CUDA_EMUL

/* A job whose micro-batch graph would replay a stale input pointer:
 * after the capture, the model's token buffer moves (a test-only path),
 * so the next launch's embedding reads another pointer than the graph
 * holds - the emulated launch aborts. */
Test(cuda_graphs, a_stale_argument_fails_the_launch, .signal = SIGABRT)
{
	struct mr_step_result res;
	struct job j;
	int s;

	job_open(&j, &dense, 1, 1);
	for (s = 0; s <= MR_STEP_WARMUP; s++)
		job_step(&j, &dense, s, &res);
	cr_assert_gt(j.d.graph_launches, 0);
	j.m.tok_dev = mr_dev_alloc(&j.d, &j.m.mem, MR_MEM_ACTS, sizeof(int) * BATCH * SEQ);
	cr_assert_not_null(j.m.tok_dev);
	job_step(&j, &dense, s, &res);
	cr_assert_fail("the launch with a moved token buffer did not abort");
}
#endif

/* Runs a job of cfg with stderr into a file; its text in log. */
static void train_logged(const struct mr_gpt_config *cfg, struct run *r, char *log, size_t cap)
{
	char path[] = "/tmp/mr_graphs_log_XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	ssize_t n;

	cr_assert(fd >= 0 && saved >= 0);
	fflush(stderr);
	dup2(fd, 2);
	train(cfg, 1, 1, r);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	n = pread(fd, log, cap - 1, 0);
	log[n > 0 ? n : 0] = 0;
	close(fd);
	unlink(path);
}

/* Sync-free MoE (capacity routing) is captured too: its aux loss and
 * dropped counts wait on the device for the results' read. */
Test(cuda_graphs, capacity_moe_in_graphs_gives_the_bits_of_eager)
{
	struct run g, e;
	int s;

	need_gpu();
	memset(&g, 0, sizeof(g));
	memset(&e, 0, sizeof(e));
	train(&moe, 1, 1, &g);
	train(&moe, 1, 0, &e);
	same_bits(&g, &e, "moe");
	for (s = 0; s < STEPS; s++)
		cr_assert(g.aux[s] > 0.0f, "step %d: no aux loss read (%g)", s, g.aux[s]);
	cr_assert_eq(g.launches, LAUNCHES, "%ld launches", g.launches);
	free(g.final);
	free(e.final);
	gpu_teardown();
}

/* A dropless MoE layer reads its routing counts on the host: the first
 * capture is refused there, its work runs eagerly, graphs stay off for
 * the job, said once naming the operation - and the run is the eager run. */
Test(cuda_graphs, a_host_read_in_a_capture_turns_graphs_off_once)
{
	static char log[1 << 16];
	struct run g, e;
	const char *at;
	int lines = 0;

	need_gpu();
	memset(&g, 0, sizeof(g));
	memset(&e, 0, sizeof(e));
	train_logged(&dropless, &g, log, sizeof(log));
	train(&dropless, 1, 0, &e);
	same_bits(&g, &e, "dropless moe");
	cr_assert_eq(g.launches, 0);
	for (at = log; (at = strstr(at, "event=cuda_graph_off")); at++)
		lines++;
	cr_assert_eq(lines, 1, "cuda_graph_off said %d times: %s", lines, log);
	cr_assert_not_null(strstr(log, "moe_route"), "the reason names no operation: %s", log);
	free(g.final);
	free(e.final);
	gpu_teardown();
}

/* ---- the kernel layer's capture and launch --------------------------------- */

struct adds {
	float *y, *x;
	size_t n;
	float s;
};

/* y += x, then y *= s. */
static int add_scale(void *ctx)
{
	struct adds *a = ctx;
	int rc = mr_cuda_add_f32(cu, a->y, a->x, a->n);

	return rc ? rc : mr_cuda_scale(cu, a->y, a->n, a->s);
}

/* ... and read y back: a host read. */
static int add_read(void *ctx)
{
	struct adds *a = ctx;
	float h[4];
	int rc = add_scale(ctx);

	return rc ? rc : mr_cuda_download(cu, h, a->y, sizeof(h));
}

static void put(float *d, float v, size_t n)
{
	float h[4];
	size_t i;

	for (i = 0; i < n; i++)
		h[i] = v;
	cr_assert_eq(mr_cuda_upload(cu, d, h, n * sizeof(float)), 0);
}

Test(cuda_graphs, capture_records_launch_runs_host_reads_refused)
{
	struct mr_cuda_graph *g = NULL;
	struct adds a = { NULL, NULL, 4, 2.0f };
	float h[4];

	need_gpu();
	cr_assert_eq(mr_cuda_alloc(cu, (void **)&a.y, sizeof(h)), 0);
	cr_assert_eq(mr_cuda_alloc(cu, (void **)&a.x, sizeof(h)), 0);
	put(a.y, 1.0f, 4);
	put(a.x, 3.0f, 4);
	/* captured: nothing ran yet */
	cr_assert_eq(mr_cuda_graph_capture(cu, add_scale, &a, &g), 0);
	cr_assert_not_null(g);
	cr_assert_eq(mr_cuda_capturing(cu), 0);
	cr_assert_eq(mr_cuda_download(cu, h, a.y, sizeof(h)), 0);
	cr_assert_eq(h[0], 1.0f);
	/* each launch runs it: (1 + 3) * 2, then (8 + 3) * 2 */
	cr_assert_eq(mr_cuda_graph_launch(cu, g, add_scale, &a), 0);
	cr_assert_eq(mr_cuda_download(cu, h, a.y, sizeof(h)), 0);
	cr_assert_eq(h[3], 8.0f);
	cr_assert_eq(mr_cuda_graph_launch(cu, g, add_scale, &a), 0);
	cr_assert_eq(mr_cuda_download(cu, h, a.y, sizeof(h)), 0);
	cr_assert_eq(h[3], 22.0f);
	mr_cuda_graph_free(cu, g);
	/* a host read inside: refused, nothing kept, the stream usable */
	g = NULL;
	cr_assert_eq(mr_cuda_graph_capture(cu, add_read, &a, &g), MR_ENEEDHOST);
	cr_assert_null(g);
	cr_assert_not_null(strstr(mr_cuda_errmsg(cu), "download"), "%s", mr_cuda_errmsg(cu));
	cr_assert_eq(mr_cuda_sync(cu), 0);
	cr_assert_eq(mr_cuda_download(cu, h, a.y, sizeof(h)), 0);
	cr_assert_eq(h[3], 22.0f, "the refused capture ran something");
	mr_cuda_dfree(cu, a.y);
	mr_cuda_dfree(cu, a.x);
	gpu_teardown();
}

#ifdef MR_CUDA_EMUL
/* A launch whose scalar differs from the capture's aborts. */
Test(cuda_graphs, a_changed_scalar_aborts_the_launch, .signal = SIGABRT)
{
	struct mr_cuda_graph *g = NULL;
	struct adds a = { NULL, NULL, 4, 2.0f };

	need_gpu();
	cr_assert_eq(mr_cuda_alloc(cu, (void **)&a.y, 4 * sizeof(float)), 0);
	cr_assert_eq(mr_cuda_alloc(cu, (void **)&a.x, 4 * sizeof(float)), 0);
	cr_assert_eq(mr_cuda_graph_capture(cu, add_scale, &a, &g), 0);
	a.s = 3.0f;
	mr_cuda_graph_launch(cu, g, add_scale, &a);
	cr_assert_fail("the launch with a changed scale did not abort");
}
#endif
