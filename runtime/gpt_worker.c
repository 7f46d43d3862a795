/*
 * gpt_worker.c - struct mr_worker_ops for GPT training on one rank (see
 * mr_gpt_worker.h): create, the step loop, stats (tokens/s, MFU, memory by
 * category), validation loss, the loss log, the TensorBoard event file and
 * gathered weights, abort.
 * Building the pieces is gpt_worker_setup.c.
 */
#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/mr_synth.h"
#include "device/mr_peak.h"
#include "gpt_worker_int.h"
#include "model/mr_weights.h"
#include "mr_json.h"
#include "mr_log.h"

static void gw_destroy(void *state)
{
	struct gw *w = state;

	if (!w)
		return;
	mr_ckpt_free(w->ckpt); /* before the state it snapshots */
	mr_tb_close(&w->tb);
	mr_step_release(&w->step_drv);
	if (w->have_model)
		mr_gpt_release(&w->model);
	mr_groups_release(&w->groups); /* before the device: stand-ins live there */
	if (w->have_dev)
		mr_dev_close(&w->dev);
	mr_pool_free(w->pool);
	if (w->have_train)
		mr_shard_close(&w->train);
	if (w->have_val)
		mr_shard_close(&w->val);
	free(w->inputs);
	free(w->full_in);
	free(w->full_tg);
	free(w->targets);
	free(w->pp_layers);
	free(w);
}

/* One line per pipeline stage: which blocks it holds, under which schedule. */
static void log_stage(const struct gw *w)
{
	const struct mr_place *p = &w->model.place;
	char layers[256] = "";
	size_t n = 0;
	int c, lo, hi;

	for (c = 0; c < mr_place_chunks(p) && n < sizeof(layers); c++) {
		mr_place_chunk(p, w->mc.n_layer, c, &lo, &hi);
		n += (size_t)snprintf(layers + n, sizeof(layers) - n, "%s%d-%d", c ? "," : "", lo,
				      hi - 1);
	}
	mr_log_info("pipeline_stage",
		    "stage=%d stages=%d schedule=%s chunks=%d layers=%s embedding=%d "
		    "head=%d",
		    mr_place_index(p, MR_AXIS_PP), mr_place_size(p, MR_AXIS_PP),
		    mr_pp_kind_name(w->pp_kind), mr_place_chunks(p), layers, w->model.first_stage,
		    w->model.last_stage);
}

/* One line per expert-parallel rank: its experts and the MoE policy. */
static void log_experts(const struct gw *w)
{
	const struct mr_ep *ep = &w->model.par.ep;

	mr_log_info("expert_parallel",
		    "ep=%d ep_rank=%d edp=%d experts=%d-%d of=%d policy=%s capacity_factor=%g",
		    ep->size, ep->rank, w->groups.mesh.edp, mr_ep_first_expert(ep, ep->rank),
		    mr_ep_first_expert(ep, ep->rank) + ep->El - 1, ep->E,
		    w->mc.moe_dropless ? "dropless" : "capacity", (double)w->mc.capacity_factor);
}

static int gw_create(void **state, const struct mr_worker_env *env, struct mr_errbuf *eb)
{
	struct gw *w = calloc(1, sizeof(*w));
	struct mr_gpt_config mc;
	struct mr_adamw_config oc;
	int B = 8, T = 64, rc;
	size_t n;

	*state = NULL;
	if (!w)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the gpt worker");
	atomic_init(&w->aborted, 0);
	atomic_init(&w->preempted, 0);
	rc = mr__gw_parse(env ? env->config : NULL, &mc, &oc, w, &B, &T, eb);
	if (rc == 0)
		rc = mr__gw_run_keys(env ? env->config : NULL, w, eb);
	/* before any communication: an unwritable directory fails the start */
	if (rc == 0 && w->tensorboard_dir && (!env || env->rank == 0))
		rc = mr_tb_open(&w->tb, w->tensorboard_dir, "tensorboard_dir", eb);
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
	rc = mr__gw_keep_global_batch(w, env, eb);
	B = w->B; /* a resume on another dp may split the micro-batch */
	if (rc == 0)
		rc = mr__gw_create_trainer(w, env, &oc, eb);
	if (rc < 0)
		goto fail;
	n = (size_t)B * T * (size_t)w->accum;
	w->inputs = malloc(n * sizeof(int));
	w->targets = malloc(n * sizeof(int));
	w->full_in = malloc((size_t)B * T * sizeof(int));
	w->full_tg = malloc((size_t)B * T * sizeof(int));
	if (!w->inputs || !w->targets || !w->full_in || !w->full_tg) {
		rc = mr_errf(eb, MR_ENOMEM, "unable to allocate the batch buffers");
		goto fail;
	}
	rc = mr__gw_open_data(w, env ? env->config : NULL, eb);
	if (rc == 0) {
		const char *train = NULL;
		if (env && env->config)
			mr_json_get_str(env->config, "train_data", 0, 255, &train, NULL);
		rc = mr__gw_open_ckpt(w, env, train, eb);
	}
	/* TensorBoard drops what earlier files hold for the steps trained
	 * again (a resume, or a fresh start in a used directory) */
	if (rc == 0 && w->tb.open)
		rc = mr_tb_session_start(&w->tb, w->step + 1, eb);
	if (rc < 0)
		goto fail;
	if (w->peak_flops <= 0.0)
		w->peak_flops = w->dev.ops->is_device ? w->dev.peak_flops
						      : mr_cpu_sgemm_peak() * w->threads;
	if (w->peak_flops <= 0.0)
		mr_log_warn("peak_flops_unknown",
			    "model=%s mfu=0 hint=\"set peak_flops in the workload config\"",
			    mr_log_q(w->dev.model));
	mr_log_info("gpt_worker_ready",
		    "device=%s model=%s precision=%s arch=%s params=%zu model_params=%zu "
		    "layers=%d d_model=%d "
		    "heads=%d kv_heads=%d moe_every=%d batch=%d seq=%d accum=%d threads=%d "
		    "peak_gflops=%.1f tp=%d "
		    "cp=%d pp=%d dp=%d ep=%d zero=%d",
		    w->dev.ops->name, mr_log_q(w->dev.model),
		    w->dev.act == MR_DT_BF16 ? "bf16" : "fp32",
		    mc.arch == MR_ARCH_LLAMA ? "llama" : "gpt2", w->model.nparams,
		    w->model.nparams_full, mc.n_layer,
		    mc.d_model, mc.n_head, mr_gpt_kv_heads(&mc), mc.moe_every, B, T,
		    w->accum, w->threads, w->peak_flops * 1e-9, w->groups.mesh.tp,
		    w->groups.mesh.cp, w->groups.mesh.pp, w->groups.mesh.dp, w->groups.mesh.ep,
		    w->zero);
	if (w->step_drv.pp)
		log_stage(w);
	if (w->model.par.ep.size > 1)
		log_experts(w);
	*state = w;
	return 0;
fail:
	gw_destroy(w);
	if (rc == MR_ENOMEM && env && eb) {
		/* everything is freed again: what did this rank need? (a
		 * process limit - ulimit -v, a container's - may be lower than
		 * what the machine has) */
		struct mr_gpt_worker_ranks me = { env->world_size, env->tp, env->pp, env->cp,
						  env->ep, env->rank, 1 };
		char was[sizeof(eb->msg)], what[400];
		if (mr_gpt_worker_need(env->config, &me, what, sizeof(what)) >= 0) {
			snprintf(was, sizeof(was), "%s", eb->msg);
			mr_errbuf_clear(eb);
			mr_errf(eb, rc, "%s: %s; a limit on this process (ulimit -v, a "
				"container's) may be lower", was, what);
		}
	}
	return rc;
}

/* The micro-batch of rows from `row` of the training (val 0) or the
 * validation data into slot k of the batch buffers; under context
 * parallelism only this rank's chunks of every sequence (mr_cp.h). */
static int read_batch(struct gw *w, int val, uint64_t row, int k, struct mr_errbuf *eb)
{
	int cp = w->model.par.cp.size > 1 ? w->model.par.cp.size : 1;
	size_t Nl = (size_t)w->B * w->T / (size_t)cp;
	int *in = cp > 1 ? w->full_in : w->inputs + k * Nl;
	int *tg = cp > 1 ? w->full_tg : w->targets + k * Nl;
	int rc = 0;

	if (val ? w->have_val : w->have_train)
		rc = mr_shard_batch(val ? &w->val : &w->train, row, w->B, in, tg, eb);
	else
		mr_synth_batch(w->seed, (uint64_t)val, row, w->mc.vocab, w->B, w->T, in, tg);
	if (rc == 0 && cp > 1) {
		mr_cp_select(cp, w->model.par.cp.rank, in, w->B, w->T, w->inputs + k * Nl);
		mr_cp_select(cp, w->model.par.cp.rank, tg, w->B, w->T, w->targets + k * Nl);
	}
	return rc;
}

/* The mean loss over eval_batches validation batches, a buffer (accum
 * batches) at a time; a pipeline runs them through its stages. */
static double eval_loss(struct gw *w, struct mr_errbuf *eb, int *rc)
{
	double sum = 0.0, part;
	int i, k, n;

	*rc = 0;
	for (i = 0; i < w->eval_batches; i += n) {
		n = w->eval_batches - i < w->accum ? w->eval_batches - i : w->accum;
		for (k = 0; k < n && *rc == 0; k++)
			*rc = read_batch(w, 1, (uint64_t)(i + k) * w->B, k, eb);
		if (*rc == 0)
			*rc = mr_step_eval(&w->step_drv, w->inputs, w->targets, n, &part, eb);
		if (*rc < 0)
			return NAN;
		sum += part * n;
	}
	return sum / w->eval_batches;
}

/* Appends "step loss aux_loss grad_norm lr val_loss" (full precision;
 * val_loss "nan" where no validation ran) to loss_log, after the header
 * MR_LOSS_LOG_HEADER when the file is new or empty (a fresh run
 * truncates it; a resume keeps the one it has): what the parity tests
 * compare against the single-rank run and `meshrun plot` draws. */
static int log_loss(struct gw *w, const struct mr_worker_stats *st, struct mr_errbuf *eb)
{
	FILE *f = fopen(w->loss_log, st->step == 1 ? "w" : "a");
	char val[32] = "nan";

	if (!f)
		return mr_errf_field(eb, MR_EIO, "loss_log", "unable to open '%s'", w->loss_log);
	if (fseek(f, 0, SEEK_END) == 0 && ftell(f) == 0)
		fputs(MR_LOSS_LOG_HEADER "\n", f);
	if (isfinite(st->val_loss))
		snprintf(val, sizeof(val), "%.9g", st->val_loss);
	fprintf(f, "%lld %.9g %.9g %.9g %.9g %s\n", (long long)st->step, st->loss, st->aux_loss,
		st->grad_norm, st->lr, val);
	if (fclose(f) != 0)
		return mr_errf_field(eb, MR_EIO, "loss_log", "unable to write '%s'", w->loss_log);
	return 0;
}

/* Rank 0's line for people: every log_every steps, at every evaluation
 * and at the last step, the job's figures - its tokens/s (every
 * data-parallel rank's), MFU and the ETA from the mean step time since
 * the previous line, rank 0's memory. */
static void step_line(struct gw *w, const struct mr_worker_stats *st)
{
	double now = mr__gw_now(), per, rank_tps;
	char val[32] = "";
	size_t mem = 0;

	if (st->step % w->log_every && st->step < w->steps && !isfinite(st->val_loss))
		return;
	per = st->step > w->log_step ? (now - w->log_t) / (double)(st->step - w->log_step) : 0.0;
	rank_tps = per > 0 ? (double)w->B * w->model.T * w->accum / per : 0.0;
	if (isfinite(st->val_loss))
		snprintf(val, sizeof(val), " val_loss=%.4f", st->val_loss);
	for (int k = 0; k < MR_MEM_HOST; k++) /* the device's memory */
		mem += st->mem_bytes[k];
	mr_log_info("step",
		    "step=%lld/%lld loss=%.4f%s grad_norm=%.3f lr=%.3e tokens_per_s=%.0f mfu=%.3f "
		    "mem_mib=%.1f eta_s=%.0f",
		    (long long)st->step, (long long)st->total_steps, st->loss, val, st->grad_norm,
		    st->lr, per > 0 ? (double)w->B * w->T * w->accum * w->dp_size / per : 0.0,
		    w->peak_flops > 0 ? (double)mr_gpt_flops_per_token(&w->model) * rank_tps /
						w->peak_flops
				      : 0.0,
		    (double)mem / (1 << 20), per * (double)(st->total_steps - st->step));
	w->log_t = now;
	w->log_step = st->step;
}

/* The step's scalars into the TensorBoard event file (rank 0), flushed so
 * a live TensorBoard sees them; tags are the stats' names. A failed write
 * is logged and ends the file: training goes on without it. */
static void tb_step(struct gw *w, const struct mr_worker_stats *st)
{
	const struct {
		const char *tag;
		double v;
		int on;
	} s[] = {
		{ "loss", st->loss, 1 },
		{ "aux_loss", st->aux_loss, w->mc.moe_every > 0 },
		{ "val_loss", st->val_loss, isfinite(st->val_loss) },
		{ "lr", st->lr, 1 },
		{ "grad_norm", st->grad_norm, 1 },
		{ "tokens_per_s", st->tokens_per_s, 1 },
		{ "mfu", st->mfu, 1 },
	};
	struct mr_errbuf eb = { "", "" };
	int rc = 0;

	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]) && rc == 0; i++)
		if (s[i].on)
			rc = mr_tb_scalar(&w->tb, st->step, s[i].tag, (float)s[i].v, &eb);
	if (rc == 0)
		rc = mr_tb_flush(&w->tb, &eb);
	if (rc < 0) {
		mr_log_warn("tensorboard_failed", "step=%lld err=%s msg=%s", (long long)st->step,
			    mr_err_name(rc), mr_log_q(eb.msg));
		mr_tb_close(&w->tb);
	}
}

/* Gathers the whole model (tp slices of data-parallel replica 0, then
 * the pipeline stages: each holds its tensors in place and zeros
 * elsewhere, so a sum over the stages assembles it) and writes it on rank
 * 0 as a weights file (model/mr_weights.h). */
static int save_weights(struct gw *w, struct mr_errbuf *eb)
{
	struct mr_gpt *m = &w->model;
	float *local = malloc(sizeof(float) * m->nparams), *full = NULL;
	struct mr_comm *pp = w->groups.group[MR_GROUP_PP];
	struct mr_comm *ep = m->place.comm[MR_AXIS_EP];
	int rc;

	if (!local)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the gathered weights");
	/* to the host; collective over the shard group under ZeRO-3 */
	rc = mr_dp_gather_params(w->step_drv.dp, local);
	/* under expert parallelism the ep group of dp rank 0 gathers: each
	 * member's experts, summed into dp rank 0's copy */
	if (rc == 0 && (ep ? w->groups.me.edp == 0 : w->dp_rank == 0))
		rc = mr_gpt_gather_full(m, local, &full);
	if (rc == 0 && full && ep)
		rc = mr_comm_allreduce(ep, full, full, mr_gpt_full_nparams(m), MR_COMM_F32,
				       MR_COMM_SUM);
	if (w->dp_rank != 0) {
		free(full);
		full = NULL;
	}
	if (rc == 0 && full && pp)
		rc = mr_comm_allreduce(pp, full, full, mr_gpt_full_nparams(m), MR_COMM_F32,
				       MR_COMM_SUM);
	if (rc < 0)
		rc = mr_errf(eb, rc, "unable to gather the weights: %s", mr_strerror(rc));
	else if (full && m->first_stage)
		rc = mr_weights_write_buf(&m->cfg, m->ntensors_full, full, mr_gpt_full_nparams(m),
					  w->save_weights, eb);
	free(full);
	free(local);
	return rc;
}

/* A checkpoint when one is due or a rank asked for one (`requested`: a
 * preemption). A failed write is logged by the checkpoint (on the ranks
 * that failed it and rank 0) and training goes on from the previous one;
 * at the last step and when requested the write is waited for, so a job
 * that succeeds, or a rank that stops, has its checkpoint - or fails on
 * every rank. The stats carry the last one's figures. */
static int checkpoint(struct gw *w, int requested, struct mr_worker_stats *st,
		      struct mr_errbuf *eb)
{
	struct mr_ckpt_stats cs;
	struct mr_errbuf ce = { "", "" };

	if (!w->ckpt)
		return 0;
	if (requested || mr_ckpt_due(w->ckpt, w->step))
		mr_ckpt_save(w->ckpt, w->step, NULL); /* a failure is logged there */
	if ((requested || w->step >= w->steps) && mr_ckpt_wait(w->ckpt, &ce) < 0)
		return mr_errf(eb, MR_EIO, "%s", ce.msg);
	/* a rank that stops now leaves the job when it returns: not before
	 * the step is published (a publish after the generation ended is
	 * fenced off); rank 0 logs a publish that failed */
	if (requested && atomic_load(&w->preempted) &&
	    mr_ckpt_wait_published(w->ckpt, w->step, 60000, &ce) < 0)
		mr_log_warn("checkpoint_not_published", "step=%ld why=%s", w->step,
			    mr_log_q(ce.msg));
	mr_ckpt_stats(w->ckpt, &cs);
	st->ckpt_step = cs.last_step;
	st->resumed_step = cs.resumed_step;
	st->ckpt_seconds = cs.last_seconds;
	st->ckpt_stall_s = cs.stall_seconds;
	st->ckpt_bytes = cs.last_bytes;
	st->ckpt_failures = cs.failures;
	st->ckpt_saves = cs.saves;
	return 0;
}

/* Seconds blocked in communication so far, every group of the rank. */
static double comm_wait(const struct gw *w)
{
	double s = 0.0;

	if (atomic_load(&w->groups_ready))
		mr_groups_progress(&w->groups, NULL, 0, &s);
	return s;
}

/* Testing and debugging (mr_gpt_worker.h): debug_slow_* sleeps in every
 * step of one rank (a straggler); debug_stall_* stops one rank at the start
 * of a step, calling no collective, until the worker is aborted (a hung
 * rank, for hang diagnosis). */
static int debug_hooks(struct gw *w, long step, struct mr_errbuf *eb)
{
	int stall = w->rank == w->stall_rank && step == w->stall_step;
	long left = w->rank == w->slow_rank ? w->slow_ms : 0;

	if (stall)
		mr_log_warn("debug_stall", "rank=%d step=%ld", w->rank, step);
	while ((stall || left > 0) && !atomic_load(&w->aborted)) {
		usleep(10000);
		left -= 10;
	}
	if (atomic_load(&w->aborted))
		return mr_errf(eb, MR_EABORTED, "gpt worker aborted at step %ld", step);
	return 0;
}

/* Operations a profiled step has room to time (a 1B llama's step issues
 * a few thousand; past the room they are counted as untimed). */
#define PROFILE_OPS (1 << 16)

/* Starts timing the device's operations for step `step` (0-based) when
 * "profile_step" names it; 1 if timing. A device without timing, or
 * timing that cannot start, is logged and the step runs untimed. */
static int profile_begin(struct gw *w, long step)
{
	struct mr_dev *d = w->model.dev;
	int rc;

	if (w->profile_step != step + 1)
		return 0;
	if (!d->ops->time_ops) {
		mr_log_warn("step_kinds_unavailable", "rank=%d device=%s", w->rank, d->ops->name);
		return 0;
	}
	if ((rc = d->ops->time_ops(d, PROFILE_OPS)) < 0) {
		mr_log_warn("step_kinds_unavailable", "rank=%d device=%s err=%d", w->rank,
			    d->ops->name, rc);
		return 0;
	}
	return 1;
}

/* The profiled step's device time by kind into st, and its line (with
 * the step's host time blocked on collectives beside it: on the device
 * a wait for communication is idle). */
static void profile_end(struct gw *w, struct mr_worker_stats *st)
{
	struct mr_dev *d = w->model.dev;
	struct mr_dev_times t;
	char line[512];
	double busy = 0.0;
	size_t n = 0;
	int k, rc = d->ops->time_take(d, &t);

	d->ops->time_ops(d, 0);
	if (rc < 0) {
		mr_log_warn("step_kinds_unavailable", "rank=%d device=%s err=%d", w->rank,
			    d->ops->name, rc);
		return;
	}
	for (k = 0; k < MR_DEV_KINDS; k++) {
		st->dev_kind_ms[k] = t.ms[k];
		busy += t.ms[k];
	}
	st->dev_kind_ms[MR_DEV_KINDS] = t.span_ms > busy ? t.span_ms - busy : 0.0;
	st->dev_span_ms = t.span_ms;
	for (k = 0; k <= MR_DEV_KINDS && n < sizeof(line); k++)
		n += (size_t)snprintf(line + n, sizeof(line) - n, "%s_ms=%.3f ", mr_dev_kind_name(k),
				      st->dev_kind_ms[k]);
	mr_log_info("step_kinds",
		    "rank=%d step=%lld %sspan_ms=%.3f comm_wait_ms=%.3f ops=%ld untimed=%ld", w->rank,
		    (long long)st->step, line, t.span_ms, st->comm_wait_s * 1e3, t.ops, t.untimed);
}

static int gw_step(void *state, struct mr_worker_stats *st, struct mr_errbuf *eb)
{
	struct gw *w = state;
	struct mr_gpt *m = &w->model;
	struct mr_step_result r;
	size_t N = (size_t)w->B * m->T; /* this rank's tokens of a micro-batch */
	long step = w->step;
	double t0, dt, wait0;
	int a, rc, k, profiling;

	if (atomic_load(&w->aborted))
		return mr_errf(eb, MR_EABORTED, "gpt worker aborted at step %ld", step);
	if (step >= w->steps) {
		/* resumed at the end (a finished job run again): nothing to
		 * train; the stats say where it stands, not zeros */
		st->step = step;
		st->total_steps = w->steps;
		st->resumed_step = step;
		st->ckpt_step = step;
		st->loss = st->val_loss = st->best_val_loss = NAN;
		if (w->rank == 0)
			mr_log_info("already_finished",
				    "step=%ld steps=%ld msg=%s", step, (long)w->steps,
				    mr_log_q("the newest checkpoint is the last step: nothing to "
					     "train (raise \"steps\" to continue)"));
		return MR_WORKER_DONE;
	}
	atomic_store_explicit(&w->progress_step, step, memory_order_relaxed);
	t0 = mr__gw_now();
	if (w->log_t == 0.0) { /* this run's first step */
		w->log_t = t0;
		w->log_step = w->log_first = step;
		w->best_val = NAN;
	}
	wait0 = comm_wait(w);
	if ((rc = debug_hooks(w, step, eb)) < 0)
		return rc;
	for (a = 0; a < w->accum; a++) {
		/* micro-batch j = dp_rank * accum + a of the step's dp * accum */
		uint64_t j = ((uint64_t)step * w->dp_size + w->dp_rank) * w->accum + a;
		if ((rc = read_batch(w, 0, j * (uint64_t)w->B, a, eb)) < 0)
			return rc;
	}
	if (atomic_load(&w->preempted))
		atomic_store(&w->step_drv.request, 1);
	profiling = profile_begin(w, step);
	/* a graph's operations cannot be timed: the profiled step runs eagerly */
	w->step_drv.eager = profiling;
	rc = mr_step_run(&w->step_drv, w->inputs, w->targets, w->accum, &r, eb);
	if (rc < 0) {
		if (profiling)
			m->dev->ops->time_ops(m->dev, 0);
		return rc;
	}
	w->step++;
	atomic_store_explicit(&w->progress_step, w->step, memory_order_relaxed);
	dt = mr__gw_now() - t0;
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
	st->mfu = w->peak_flops > 0 ? (double)mr_gpt_flops_per_token(m) * st->tokens_per_s /
					      w->peak_flops
				    : 0.0;
	for (k = 0; k < MR_MEM_KINDS; k++)
		st->mem_bytes[k] = m->mem.bytes[k];
	st->dev_fallbacks = m->dev->fallbacks;
	st->dev_graph_launches = m->dev->graph_launches;
	st->comm_wait_s = comm_wait(w) - wait0;
	if (profiling)
		profile_end(w, st);
	st->pp = w->groups.mesh.pp > 0 ? w->groups.mesh.pp : 1;
	st->pp_stage = mr_place_index(&m->place, MR_AXIS_PP);
	if (w->step_drv.pp) {
		struct mr_pp_stats ps;
		mr_pp_stats(w->step_drv.pp, &ps);
		st->pp_bubble = ps.bubble;
		st->pp_wait_s = ps.wait_s;
	}
	if (w->eval_every > 0 && (st->step % w->eval_every == 0 || st->step == w->steps)) {
		st->val_loss = eval_loss(w, eb, &rc);
		if (rc < 0)
			return rc;
	}
	if (w->loss_log && w->rank == 0 && (rc = log_loss(w, st, eb)) < 0)
		return rc;
	if (isfinite(st->val_loss) && !(st->val_loss >= w->best_val)) {
		w->best_val = st->val_loss;
		w->best_val_step = st->step;
	}
	w->train_s += dt;
	st->best_val_loss = w->best_val;
	st->best_val_step = w->best_val_step;
	st->train_seconds = w->train_s;
	st->job_tokens_per_s = w->train_s > 0 ? (double)w->B * w->T * w->accum * w->dp_size *
							 (double)(st->step - w->log_first) / w->train_s
					      : 0.0;
	if (w->rank == 0)
		step_line(w, st);
	if (w->tb.open)
		tb_step(w, st);
	if (st->step >= w->steps && w->save_weights && (rc = save_weights(w, eb)) < 0)
		return rc;
	if ((rc = checkpoint(w, r.requested, st, eb)) < 0)
		return rc;
	/* stopped at the step every rank agreed to checkpoint (the request
	 * may have come after this step's agreement: then at the next) */
	if (atomic_load(&w->preempted) && r.requested) {
		mr_log_info("preempted", "step=%lld checkpoint_step=%lld", (long long)st->step,
			    (long long)st->ckpt_step);
		return MR_WORKER_STOPPED;
	}
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
	mr_ckpt_abort(w->ckpt); /* a publish waiting for other ranks' parts */
	if (atomic_load(&w->groups_ready))
		mr_groups_abort(&w->groups);
}

static void gw_preempt(void *state)
{
	struct gw *w = state;

	if (w)
		atomic_store(&w->preempted, 1);
}

/* Another thread's view while step() runs: atomics and communicators
 * that live as long as the worker. */
static void gw_progress(void *state, struct mr_worker_progress *out)
{
	struct gw *w = state;

	memset(out, 0, sizeof(*out));
	out->step = atomic_load_explicit(&w->progress_step, memory_order_relaxed);
	out->micro = w->have_model ? atomic_load_explicit(&w->step_drv.micro, memory_order_relaxed)
				   : -1;
	if (atomic_load(&w->groups_ready))
		out->ngroups = mr_groups_progress(&w->groups, out->group, MR_WORKER_PROGRESS_GROUPS,
						  &out->comm_wait_s);
}

const struct mr_worker_ops mr_gpt_worker = {
	.name = "gpt",
	.create = gw_create,
	.step = gw_step,
	.abort = gw_abort,
	.destroy = gw_destroy,
	.progress = gw_progress,
	.preempt = gw_preempt,
};
