/*
 * gpt_worker_setup.c - building a gpt worker (see mr_gpt_worker.h): the
 * config keys and their bounds, the MFU denominator, data files, the
 * rank's place in the mesh and the trainer it runs (one CPU replica, data
 * parallel / ZeRO around a tp-sliced CPU model, or the CUDA device).
 */
#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_worker_int.h"
#include "kernels/mr_kernels.h"
#include "mr_json.h"

static const char *const keys[] = {
	"vocab_size", "max_seq", "n_layer", "d_model", "n_head", "moe_every", "n_experts",
	"top_k", "capacity_factor", "aux_coef", "batch_size", "seq_len", "steps",
	"grad_accum", "lr", "min_lr_frac", "warmup_steps", "beta1", "beta2", "eps",
	"weight_decay", "grad_clip", "seed", "threads", "peak_flops", "eval_every",
	"eval_batches", "train_data", "val_data", "sequence_parallel", "zero", "hsdp_shard",
	"comm_timeout_ms", "loss_log", "save_weights", "bucket_mb", "overlap_grad_reduce",
	"device", NULL,
};

double mr__gw_now(void)
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
		t0 = mr__gw_now();
		mr_matmul_fwd(NULL, a + 2 * n * n, a, a + n * n, NULL, n, n, n);
		dt = mr__gw_now() - t0;
		if (dt > 0 && 2.0 * n * n * n / dt > best)
			best = 2.0 * n * n * n / dt;
	}
	free(a);
	thread_peak = best;
}

double mr__gw_measure_peak(int threads)
{
	pthread_once(&thread_peak_once, measure_thread_peak);
	return thread_peak * threads;
}

int mr__gw_parse(const json_t *c, struct mr_gpt_config *mc, struct mr_adamw_config *oc,
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

/* Opens train_data / val_data when the config names them. */
int mr__gw_open_data(struct gw *w, const json_t *c, struct mr_errbuf *eb)
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
int mr__gw_create_cpu(struct gw *w, const struct mr_worker_env *env,
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
int mr__gw_create_cuda(struct gw *w, const struct mr_worker_env *env,
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

