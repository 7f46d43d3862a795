/*
 * gpt_worker.c - struct mr_worker_ops for GPT training on one rank (see
 * mr_gpt_worker.h): config parsing and validation, the step loop, stats
 * (tokens/s, MFU, memory by category), abort.
 */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cpu/mr_pool.h"
#include "data/mr_shard.h"
#include "data/mr_synth.h"
#include "gpt_cuda.h"
#include "kernels/mr_kernels.h"
#include "mr_gpt_worker.h"
#include "model/mr_weights.h"
#include "mr_groups.h"
#include "parallel/mr_dp.h"
#include "mr_json.h"
#include "mr_log.h"
#include "mr_trainer.h"

struct gw {
	struct mr_gpt_config mc;
	int B, T;               /* micro-batch shape */
	struct mr_gpt_cuda *cuda; /* "device": "cuda": the device trainer, no CPU model */
	struct mr_gpt model;
	struct mr_adamw opt;
	struct mr_pool *pool;
	int have_model, have_opt;
	int steps, accum, eval_every, eval_batches, threads;
	/* placement: mesh communicators, this rank's data-parallel slice */
	struct mr_groups groups;
	atomic_int groups_ready;
	int rank, dp_rank, dp_size;
	int sp, zero, hsdp_shard, overlap;
	float bucket_mb;
	struct mr_dp *dp;       /* data parallel / ZeRO; NULL: one replica */
	long comm_timeout_ms;
	const char *loss_log, *save_weights; /* borrowed from env->config */
	uint64_t seed;
	double peak_flops;
	int *inputs, *targets;  /* accum x (B,T) */
	struct mr_shard train, val; /* llm.c shards, when configured */
	int have_train, have_val;
	int64_t tokens;
	long step;              /* optimizer steps completed */
	atomic_int aborted;
};

static const char *const keys[] = {
	"vocab_size", "max_seq", "n_layer", "d_model", "n_head", "moe_every", "n_experts",
	"top_k", "capacity_factor", "aux_coef", "batch_size", "seq_len", "steps",
	"grad_accum", "lr", "min_lr_frac", "warmup_steps", "beta1", "beta2", "eps",
	"weight_decay", "grad_clip", "seed", "threads", "peak_flops", "eval_every",
	"eval_batches", "train_data", "val_data", "sequence_parallel", "zero", "hsdp_shard",
	"comm_timeout_ms", "loss_log", "save_weights", "bucket_mb", "overlap_grad_reduce",
	"device", NULL,
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int geti(const json_t *c, const char *k, int64_t lo, int64_t hi, int def, int *out,
		struct mr_errbuf *eb)
{
	int64_t v = def;
	int rc = c ? mr_json_get_int(c, k, 0, lo, hi, &v, eb) : 0;

	*out = (int)v;
	return rc;
}

static int getf(const json_t *c, const char *k, double lo, double hi, double def, float *out,
		struct mr_errbuf *eb)
{
	double v = def;
	int rc = c ? mr_json_get_double(c, k, 0, lo, hi, &v, eb) : 0;

	*out = (float)v;
	return rc;
}

/*
 * Sustained single-thread sgemm FLOP/s, measured once per process (the
 * first rank to ask measures while the others wait, so in-process ranks
 * do not time it against each other); a rank's peak is this times its
 * threads. A machine shared by more threads than cores then shows a low
 * MFU rather than a wrong peak.
 */
static double thread_peak;
static pthread_once_t thread_peak_once = PTHREAD_ONCE_INIT;

static void measure_thread_peak(void)
{
	const int n = 512, reps = 3;
	float *a = calloc((size_t)n * n * 3, sizeof(float));
	double t0, best = 0.0;
	int r;

	if (!a)
		return;
	for (r = 0; r < n * n * 2; r++)
		a[r] = 0.001f * (float)(r % 97);
	mr_matmul_fwd(NULL, a + 2 * n * n, a, a + n * n, NULL, n, n, n);
	for (r = 0; r < reps; r++) {
		double dt;
		t0 = now_s();
		mr_matmul_fwd(NULL, a + 2 * n * n, a, a + n * n, NULL, n, n, n);
		dt = now_s() - t0;
		if (dt > 0 && 2.0 * n * n * n / dt > best)
			best = 2.0 * n * n * n / dt;
	}
	free(a);
	thread_peak = best;
}

static double measure_peak(int threads)
{
	pthread_once(&thread_peak_once, measure_thread_peak);
	return thread_peak * threads;
}

static int parse(const json_t *c, struct mr_gpt_config *mc, struct mr_adamw_config *oc,
		 struct gw *w, int *B, int *T, struct mr_errbuf *eb)
{
	int rc = 0, seed = 1337, tmo = 60000;
	float peak = 0.0f;

	if (c && (rc = mr_json_check_keys(c, keys, eb)) < 0)
		return rc;
	memset(mc, 0, sizeof(*mc));
	memset(oc, 0, sizeof(*oc));
	if ((rc = geti(c, "vocab_size", 2, 1 << 20, 256, &mc->vocab, eb)) < 0 ||
	    (rc = geti(c, "seq_len", 1, 1 << 16, 64, T, eb)) < 0 ||
	    (rc = geti(c, "max_seq", 1, 1 << 16, *T, &mc->max_seq, eb)) < 0 ||
	    (rc = geti(c, "n_layer", 1, 1024, 2, &mc->n_layer, eb)) < 0 ||
	    (rc = geti(c, "d_model", 1, 65536, 128, &mc->d_model, eb)) < 0 ||
	    (rc = geti(c, "n_head", 1, 65536, 4, &mc->n_head, eb)) < 0 ||
	    (rc = geti(c, "moe_every", 0, 1024, 0, &mc->moe_every, eb)) < 0 ||
	    (rc = geti(c, "n_experts", 1, 1024, 4, &mc->n_experts, eb)) < 0 ||
	    (rc = geti(c, "top_k", 1, 2, 1, &mc->top_k, eb)) < 0 ||
	    (rc = getf(c, "capacity_factor", -1e9, 1e9, 1.25, &mc->capacity_factor, eb)) < 0 ||
	    (rc = getf(c, "aux_coef", 0, 1e3, 0.01, &mc->aux_coef, eb)) < 0 ||
	    (rc = geti(c, "batch_size", 1, 1 << 16, 8, B, eb)) < 0 ||
	    (rc = geti(c, "steps", 1, 1 << 30, 100, &w->steps, eb)) < 0 ||
	    (rc = geti(c, "grad_accum", 1, 1 << 16, 1, &w->accum, eb)) < 0 ||
	    (rc = getf(c, "lr", 0, 10, 1e-3, &oc->lr, eb)) < 0 ||
	    (rc = getf(c, "min_lr_frac", 0, 1, 0.1, &oc->min_lr_frac, eb)) < 0 ||
	    (rc = geti(c, "warmup_steps", 0, 1 << 30, 10, &oc->warmup_steps, eb)) < 0 ||
	    (rc = getf(c, "beta1", 0, 0.999999, 0.9, &oc->beta1, eb)) < 0 ||
	    (rc = getf(c, "beta2", 0, 0.999999, 0.95, &oc->beta2, eb)) < 0 ||
	    (rc = getf(c, "eps", 1e-30, 1, 1e-8, &oc->eps, eb)) < 0 ||
	    (rc = getf(c, "weight_decay", 0, 10, 0.1, &oc->weight_decay, eb)) < 0 ||
	    (rc = getf(c, "grad_clip", 0, 1e9, 1.0, &oc->grad_clip, eb)) < 0 ||
	    (rc = geti(c, "seed", 0, 0x7fffffff, 1337, &seed, eb)) < 0 ||
	    (rc = geti(c, "threads", 0, 1024, 0, &w->threads, eb)) < 0 ||
	    (rc = getf(c, "peak_flops", 0, 1e20, 0, &peak, eb)) < 0 ||
	    (rc = geti(c, "eval_every", 0, 1 << 30, 0, &w->eval_every, eb)) < 0 ||
	    (rc = geti(c, "eval_batches", 1, 1 << 16, 4, &w->eval_batches, eb)) < 0 ||
	    (rc = geti(c, "zero", 0, 3, 0, &w->zero, eb)) < 0 ||
	    (rc = geti(c, "hsdp_shard", 0, 1 << 20, 0, &w->hsdp_shard, eb)) < 0 ||
	    (rc = geti(c, "comm_timeout_ms", 100, 1 << 30, 60000, &tmo, eb)) < 0 ||
	    (rc = getf(c, "bucket_mb", 0.001, 4096, 1, &w->bucket_mb, eb)) < 0)
		return rc;
	w->comm_timeout_ms = tmo;
	w->sp = 0;
	w->overlap = 1;
	if (c && ((rc = mr_json_get_bool(c, "sequence_parallel", 0, &w->sp, eb)) < 0 ||
		  (rc = mr_json_get_bool(c, "overlap_grad_reduce", 0, &w->overlap, eb)) < 0 ||
		  (rc = mr_json_get_str(c, "loss_log", 0, 4095, &w->loss_log, eb)) < 0 ||
		  (rc = mr_json_get_str(c, "save_weights", 0, 4095, &w->save_weights, eb)) < 0))
		return rc;
	oc->total_steps = w->steps;
	w->seed = (uint64_t)seed;
	w->peak_flops = peak;
	if (mc->moe_every == 0) {
		mc->n_experts = 0;
		mc->top_k = 0;
		mc->capacity_factor = 0.0f;
		mc->aux_coef = 0.0f;
	}
	return 0;
}

static void gw_destroy(void *state)
{
	struct gw *w = state;

	if (!w)
		return;
	mr_dp_free(w->dp);
	mr_gpt_cuda_free(w->cuda);
	if (w->have_opt)
		mr_adamw_release(&w->opt, &w->model.mem);
	if (w->have_model)
		mr_gpt_release(&w->model);
	mr_groups_release(&w->groups);
	mr_pool_free(w->pool);
	if (w->have_train)
		mr_shard_close(&w->train);
	if (w->have_val)
		mr_shard_close(&w->val);
	free(w->inputs);
	free(w->targets);
	free(w);
}

/* Opens train_data / val_data when the config names them. */
static int open_data(struct gw *w, const json_t *c, struct mr_errbuf *eb)
{
	const char *tp = NULL, *vp = NULL;
	int rc;

	if (!c)
		return 0;
	if ((rc = mr_json_get_str(c, "train_data", 0, 255, &tp, eb)) < 0 ||
	    (rc = mr_json_get_str(c, "val_data", 0, 255, &vp, eb)) < 0)
		return rc;
	if (tp) {
		rc = mr_shard_open(&w->train, tp, w->mc.vocab, w->T, w->seed, eb);
		if (rc < 0)
			return rc;
		w->have_train = 1;
	}
	if (vp) {
		rc = mr_shard_open(&w->val, vp, w->mc.vocab, w->T, w->seed, eb);
		if (rc < 0)
			return rc;
		w->have_val = 1;
	}
	return 0;
}

/*
 * Where this rank sits: checks the model against the mesh (before any
 * communication, so bad input fails on every rank at once), then builds
 * the mesh communicators. A single rank needs none.
 */
static int place(struct gw *w, const struct mr_worker_env *env, const struct mr_gpt_config *mc,
		 int T, struct mr_errbuf *eb)
{
	struct mr_worker_env one = { 0 };
	struct mr_gpt_par par = { 0 };
	int rc;

	if (env)
		one = *env;
	if (one.world_size < 1)
		one.world_size = 1;
	env = &one;
	par.tp = env->tp > 0 ? env->tp : 1;
	par.sp = w->sp;
	if ((rc = mr_groups_check(env, w->hsdp_shard, eb)) < 0 ||
	    (rc = mr_gpt_check_placement(mc, T, &par, eb)) < 0)
		return rc;
	rc = mr_groups_create(&w->groups, env, w->hsdp_shard, w->comm_timeout_ms, &w->aborted,
			      eb);
	if (rc < 0)
		return rc;
	atomic_store(&w->groups_ready, 1);
	if (atomic_load(&w->aborted))
		mr_groups_abort(&w->groups);
	w->rank = env->rank;
	w->dp_rank = w->groups.me.dp;
	w->dp_size = w->groups.mesh.dp;
	return 0;
}

/* One replica of the model: plain init and optimizer (mr_trainer_step). */
static int create_single(struct gw *w, const struct mr_adamw_config *oc, struct mr_errbuf *eb)
{
	int rc;

	if ((rc = mr_gpt_init_params(&w->model, w->seed)) < 0)
		return mr_errf(eb, rc, "unable to initialise the parameters");
	rc = mr_adamw_init(&w->opt, oc, w->model.nparams, &w->model.mem);
	if (rc < 0)
		return mr_errf(eb, rc, "unable to allocate the optimizer state");
	w->have_opt = 1;
	return 0;
}

/* Data parallel / ZeRO: runtime/parallel owns init, optimizer and step. */
static int create_dp(struct gw *w, const struct mr_adamw_config *oc, struct mr_errbuf *eb)
{
	struct mr_dp_config dc = { w->zero, (size_t)((double)w->bucket_mb * 1048576.0),
				   w->overlap };
	struct mr_dp_comms cc = { w->groups.shard, w->groups.replica, w->groups.world };

	return mr_dp_create(&w->dp, &w->model, oc, &dc, &cc, w->seed, eb);
}

/* The CPU model, placed in the mesh (tensor and data parallel). */
static int create_cpu(struct gw *w, const struct mr_worker_env *env,
		      const struct mr_adamw_config *oc, struct mr_errbuf *eb)
{
	struct mr_gpt_par par = { 0 };
	int rc = place(w, env, &w->mc, w->T, eb);

	if (rc < 0)
		return rc;
	par.tp = w->groups.mesh.tp;
	par.tp_rank = w->groups.me.tp;
	par.sp = w->sp;
	par.tp_comm = w->groups.tp;
	if (w->dp_size > 1 || w->zero > 0)
		mr_dp_model_par(w->zero, &par);
	rc = mr_gpt_create_par(&w->model, &w->mc, w->B, w->T, w->pool, &par, eb);
	if (rc < 0)
		return rc;
	w->have_model = 1;
	return w->dp_size > 1 || w->zero > 0 ? create_dp(w, oc, eb) : create_single(w, oc, eb);
}

/* One rank on one CUDA device (local_rank picks it). */
static int create_cuda(struct gw *w, const struct mr_worker_env *env,
		       const struct mr_adamw_config *oc, struct mr_errbuf *eb)
{
	int rc = mr_gpt_cuda_check(&w->mc, w->B, w->T, eb);

	if (rc < 0)
		return rc;
	if (env && env->world_size > 1)
		return mr_errf_field(eb, MR_ENOTSUP, "device",
				     "'device' \"cuda\" trains one rank per job for now "
				     "(world size %d); tensor and data parallelism run on cpu",
				     env->world_size);
	w->dp_size = 1;
	return mr_gpt_cuda_create(&w->cuda, env ? env->local_rank : 0, &w->mc, w->B, w->T, oc,
				  w->seed, eb);
}

static int gw_create(void **state, const struct mr_worker_env *env, struct mr_errbuf *eb)
{
	struct gw *w = calloc(1, sizeof(*w));
	struct mr_gpt_config mc;
	struct mr_adamw_config oc;
	const char *device = NULL;
	int B = 8, T = 64, rc;
	size_t n;

	*state = NULL;
	if (!w)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the gpt worker");
	atomic_init(&w->aborted, 0);
	rc = parse(env ? env->config : NULL, &mc, &oc, w, &B, &T, eb);
	if (rc == 0 && env && env->config)
		rc = mr_json_get_str(env->config, "device", 0, 16, &device, eb);
	if (rc == 0 && device && strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0)
		rc = mr_errf_field(eb, MR_EINVAL, "device",
				   "'device' must be \"cpu\" or \"cuda\", got \"%s\"", device);
	if (rc < 0)
		goto fail;
	if (w->threads == 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		int local = env && env->local_world_size > 0 ? env->local_world_size : 1;
		w->threads = cpus > local ? (int)(cpus / local) : 1;
	}
	rc = mr_pool_create(&w->pool, w->threads);
	if (rc < 0) {
		rc = mr_errf(eb, rc, "unable to start %d runtime threads", w->threads);
		goto fail;
	}
	/* The pool splits every GEMM into single-threaded sgemm calls
	 * (kernels/matmul.c), so OpenBLAS itself runs one thread. */
	openblas_set_num_threads(1);
	w->mc = mc;
	w->B = B;
	w->T = T;
	rc = device && strcmp(device, "cuda") == 0 ? create_cuda(w, env, &oc, eb)
						    : create_cpu(w, env, &oc, eb);
	if (rc < 0)
		goto fail;
	n = (size_t)B * T * (size_t)w->accum;
	w->inputs = malloc(n * sizeof(int));
	w->targets = malloc(n * sizeof(int));
	if (!w->inputs || !w->targets) {
		rc = mr_errf(eb, MR_ENOMEM, "unable to allocate the batch buffers");
		goto fail;
	}
	rc = open_data(w, env ? env->config : NULL, eb);
	if (rc < 0)
		goto fail;
	if (w->peak_flops <= 0.0 && !w->cuda)
		w->peak_flops = measure_peak(w->threads);
	mr_log_info("gpt_worker_ready",
		    "device=%s params=%zu layers=%d d_model=%d heads=%d moe_every=%d batch=%d "
		    "seq=%d accum=%d threads=%d peak_gflops=%.1f",
		    w->cuda ? "cuda" : "cpu", w->cuda ? (size_t)0 : w->model.nparams, mc.n_layer,
		    mc.d_model, mc.n_head, mc.moe_every, B, T, w->accum, w->threads,
		    w->peak_flops * 1e-9);
	*state = w;
	return 0;
fail:
	gw_destroy(w);
	return rc;
}

static double eval_loss(struct gw *w, struct mr_errbuf *eb, int *rc)
{
	double sum = 0.0;
	float loss = 0.0f;
	int i;

	*rc = 0;
	for (i = 0; i < w->eval_batches; i++) {
		if (w->have_val)
			*rc = mr_shard_batch(&w->val, (uint64_t)i * w->B, w->B, w->inputs,
					     w->targets, eb);
		else
			mr_synth_batch(w->seed, 1, (uint64_t)i * w->B, w->mc.vocab, w->B, w->T,
				       w->inputs, w->targets);
		if (*rc < 0)
			return NAN;
		if (w->cuda) {
			*rc = mr_gpt_cuda_eval(w->cuda, w->inputs, w->targets, &loss, eb);
		} else {
			*rc = mr_gpt_forward(&w->model, w->inputs, w->targets, eb);
			loss = w->model.loss;
		}
		if (*rc < 0)
			return NAN;
		sum += loss;
	}
	return sum / w->eval_batches;
}

/* Appends "step loss aux_loss grad_norm lr" (full precision) to loss_log:
 * what the parity tests compare against the single-rank run. */
static int log_loss(struct gw *w, const struct mr_worker_stats *st, struct mr_errbuf *eb)
{
	FILE *f = fopen(w->loss_log, st->step == 1 ? "w" : "a");

	if (!f)
		return mr_errf_field(eb, MR_EIO, "loss_log", "unable to open '%s'", w->loss_log);
	fprintf(f, "%lld %.9g %.9g %.9g %.9g\n", (long long)st->step, st->loss, st->aux_loss,
		st->grad_norm, st->lr);
	if (fclose(f) != 0)
		return mr_errf_field(eb, MR_EIO, "loss_log", "unable to write '%s'", w->loss_log);
	return 0;
}

/* Gathers the whole model (tp slices of data-parallel replica 0) and
 * writes it on rank 0 as a weights file (model/mr_weights.h). */
static int save_weights(struct gw *w, struct mr_errbuf *eb)
{
	struct mr_gpt *m = &w->model;
	float *local = m->params, *full = NULL;
	int rc = 0;

	if (w->cuda)
		return mr_gpt_cuda_save(w->cuda, w->save_weights, eb);
	if (w->dp) {
		/* collective over the shard group under ZeRO-3 */
		if (!(local = malloc(sizeof(float) * m->nparams)))
			return mr_errf(eb, MR_ENOMEM, "unable to allocate the gathered weights");
		rc = mr_dp_gather_params(w->dp, local);
	}
	if (rc == 0 && w->dp_rank == 0)
		rc = mr_gpt_gather_full(m, local, &full);
	if (rc < 0)
		rc = mr_errf(eb, rc, "unable to gather the weights: %s", mr_strerror(rc));
	else if (full)
		rc = mr_weights_write_buf(&m->cfg, m->ntensors, full, mr_gpt_full_nparams(m),
					  w->save_weights, eb);
	free(full);
	if (local != m->params)
		free(local);
	return rc;
}

static int gw_step(void *state, struct mr_worker_stats *st, struct mr_errbuf *eb)
{
	struct gw *w = state;
	struct mr_gpt *m = &w->model;
	struct mr_step_result r;
	size_t N = (size_t)w->B * w->T;
	long step = w->step;
	double t0, dt;
	int a, rc, k;

	if (atomic_load(&w->aborted))
		return mr_errf(eb, MR_EABORTED, "gpt worker aborted at step %ld", step);
	if (step >= w->steps)
		return MR_WORKER_DONE;
	t0 = now_s();
	for (a = 0; a < w->accum; a++) {
		/* micro-batch j = dp_rank * accum + a of the step's dp * accum */
		uint64_t j = ((uint64_t)step * w->dp_size + w->dp_rank) * w->accum + a;
		uint64_t row = j * (uint64_t)w->B;
		if (w->have_train) {
			rc = mr_shard_batch(&w->train, row, w->B, w->inputs + a * N,
					    w->targets + a * N, eb);
			if (rc < 0)
				return rc;
		} else {
			mr_synth_batch(w->seed, 0, row, w->mc.vocab, w->B, w->T,
				       w->inputs + a * N, w->targets + a * N);
		}
	}
	if (w->cuda)
		rc = mr_gpt_cuda_step(w->cuda, w->inputs, w->targets, w->accum, &r, eb);
	else if (w->dp)
		rc = mr_dp_step(w->dp, w->inputs, w->targets, w->accum, &r, eb);
	else
		rc = mr_trainer_step(m, &w->opt, w->inputs, w->targets, w->accum, &r, eb);
	if (rc < 0)
		return rc;
	w->step++;
	dt = now_s() - t0;
	w->tokens += (int64_t)(N * w->accum);
	memset(st, 0, sizeof(*st));
	st->step = w->step;
	st->total_steps = w->steps;
	st->loss = r.loss;
	st->aux_loss = r.aux_loss;
	st->grad_norm = r.grad_norm;
	st->lr = r.lr;
	st->val_loss = NAN;
	st->step_seconds = dt;
	st->tokens = w->tokens;
	st->tokens_per_s = dt > 0 ? (double)(N * w->accum) / dt : 0.0;
	st->mfu = w->peak_flops > 0
			  ? (double)(w->cuda ? mr_gpt_cuda_flops_per_token(w->cuda)
					     : mr_gpt_flops_per_token(m)) *
				    st->tokens_per_s / w->peak_flops
			  : 0.0;
	if (w->cuda)
		mr_gpt_cuda_mem(w->cuda, st->mem_bytes);
	else
		for (k = 0; k < MR_MEM_KINDS; k++)
			st->mem_bytes[k] = m->mem.bytes[k];
	if (w->dp) {
		struct mr_dp_stats ds;
		mr_dp_stats(w->dp, &ds);
		st->comm_wait_s = ds.comm_wait_s;
	}
	if (w->eval_every > 0 && (st->step % w->eval_every == 0 || st->step == w->steps)) {
		st->val_loss = eval_loss(w, eb, &rc);
		if (rc < 0)
			return rc;
	}
	if (w->loss_log && w->rank == 0 && (rc = log_loss(w, st, eb)) < 0)
		return rc;
	if (st->step >= w->steps && w->save_weights && (rc = save_weights(w, eb)) < 0)
		return rc;
	if (atomic_load(&w->aborted))
		return mr_errf(eb, MR_EABORTED, "gpt worker aborted at step %ld", step);
	return st->step >= w->steps ? MR_WORKER_DONE : MR_WORKER_MORE;
}

static void gw_abort(void *state)
{
	struct gw *w = state;

	if (!w)
		return;
	atomic_store(&w->aborted, 1);
	if (atomic_load(&w->groups_ready))
		mr_groups_abort(&w->groups);
}

const struct mr_worker_ops mr_gpt_worker = {
	.name = "gpt",
	.create = gw_create,
	.step = gw_step,
	.abort = gw_abort,
	.destroy = gw_destroy,
};
