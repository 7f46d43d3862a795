/*
 * gpt_worker_setup.c - building a gpt worker (see mr_gpt_worker.h): data
 * files, the rank's device, its place in the mesh (communicators on the
 * backend that suits the device) and the trainer: the model placed there
 * under the step driver - one code path for every device and mode; and
 * the placement alone (mr_gpt_worker_place), for `meshrun mesh`. The
 * config's keys and bounds: gpt_worker_config.c.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_worker_int.h"
#include "mr_json.h"
#include "mr_log.h"

#include "plugin/cuda_entry.h"

double mr__gw_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * The validation the config asks for, hard to miss (rank 0 logs a choice
 * it made once): val_data without eval_every is evaluated every max(1,
 * steps/10) steps and at the last; train_data without val_data has
 * nothing to be evaluated on - the synthetic task's validation stream
 * says nothing about real data - so none, with a warning.
 */
static void pick_eval(struct gw *w)
{
	int asked = w->eval_every;

	if (w->eval_every < 0)
		w->eval_every = w->have_val ? (w->steps / 10 > 1 ? w->steps / 10 : 1) : 0;
	if (w->have_train && !w->have_val && w->eval_every > 0) {
		w->eval_every = 0;
		if (w->rank == 0)
			mr_log_warn("no_validation",
				    "eval_every=%d msg=%s", asked,
				    mr_log_q("train_data without val_data: no validation loss (the "
					     "synthetic task's would say nothing about this data); "
					     "set val_data"));
	} else if (asked < 0 && w->eval_every > 0 && w->rank == 0) {
		mr_log_info("eval_interval", "eval_every=%d steps=%d why=%s", w->eval_every,
			    w->steps, mr_log_q("val_data without eval_every: max(1, steps/10)"));
	}
}

/* Opens train_data / val_data when the config names them, then settles
 * eval_every (pick_eval). */
int mr__gw_open_data(struct gw *w, const json_t *c, struct mr_errbuf *eb)
{
	const char *tp = NULL, *vp = NULL;
	int rc;

	if (c && ((rc = mr_json_get_str(c, "train_data", 0, 255, &tp, eb)) < 0 ||
		  (rc = mr_json_get_str(c, "val_data", 0, 255, &vp, eb)) < 0))
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
	pick_eval(w);
	return 0;
}

/*
 * The communicators' backend. "auto": nccl when the device is a GPU NCCL
 * can reach, this build has NCCL and every rank of the node has a GPU of
 * its own; else host, which stages device buffers through host memory.
 */
static const char *pick_backend(const struct gw *w, const struct mr_worker_env *env,
				const char **why)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int local = env->local_world_size > 0 ? env->local_world_size : 1;
	const struct mr__cuda_entry *e;

	if (w->comm_backend && strcmp(w->comm_backend, "auto")) {
		*why = "configured";
		return w->comm_backend;
	}
	if (!w->dev.ops->is_device) {
		*why = "host_memory";
		return "host";
	}
	if (!w->dev.nccl) {
		*why = "device_not_reachable_by_nccl";
		return "host";
	}
	e = mr__cuda_entry(&eb);
	if (!e || !e->nccl_init) {
		*why = "no_nccl_in_build";
		return "host";
	}
	if (e->device_count(&eb) < local) {
		*why = "fewer_gpus_than_local_ranks";
		return "host";
	}
	*why = "gpu_per_rank";
	return "nccl";
}

/* A pipeline's schedule against the mesh and the micro-batch count
 * (fields "pp_schedule", "pp_virtual", "grad_accum"). */
static int check_schedule(const struct gw *w, const struct mr_place *where,
			  struct mr_errbuf *eb)
{
	struct mr_pp_spec sp = { w->pp_kind, mr_place_size(where, MR_AXIS_PP), w->accum,
				 w->pp_virtual };

	if (sp.p == 1 && sp.v == 1)
		return 0;
	if (sp.p == 1)
		return mr_errf_field(eb, MR_EINVAL, "pp_virtual",
				     "'pp_virtual' %d needs pipeline parallelism (pp > 1)", sp.v);
	return mr_pp_check(&sp, eb);
}

/* The rank's place in the mesh and the blocks it holds, checked against
 * the model and the schedule: no communication, so bad input fails on
 * every rank at once (and `meshrun mesh` shows the same split). */
static int layout(const struct gw *w, const struct mr_worker_env *env,
		  const struct mr_gpt_config *mc, int T, struct mr_place *where,
		  struct mr_errbuf *eb)
{
	int rc;

	if ((rc = mr_groups_check(env, w->hsdp_shard, eb)) < 0 ||
	    (rc = mr_groups_place_of(env, w->sp, where, eb)) < 0 ||
	    (where->cp_algo = w->cp_algo, 0) ||
	    (rc = mr_groups_place_layers(where, mc, T, w->pp_virtual, w->pp_layers,
					 w->n_pp_layers, eb)) < 0 ||
	    (rc = mr_gpt_check_placement(mc, T, where, eb)) < 0)
		return rc;
	return check_schedule(w, where, eb);
}

int mr_gpt_worker_place(const json_t *config, const struct mr_worker_env *env,
			struct mr_place *where, int *n_layer, struct mr_errbuf *eb)
{
	struct gw *w = calloc(1, sizeof(*w));
	struct mr_adamw_config oc;
	int B, T, rc;

	if (!w)
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	rc = mr__gw_parse(config, &w->mc, &oc, w, &B, &T, eb);
	if (rc == 0)
		rc = layout(w, env, &w->mc, T, where, eb);
	if (rc == 0 && n_layer)
		*n_layer = w->mc.n_layer;
	free(w->pp_layers);
	free(w);
	return rc;
}

/* The newest readable manifest of ckpt_dir into *mf (the resume itself
 * verifies more): 1, or 0 when there is none. */
static int newest_manifest(const char *ckpt_dir, struct mr_ckpt_manifest *mf)
{
	char **dirs = NULL;
	int n = 0, found = 0;

	if (mr_ckpt_list(ckpt_dir, &dirs, &n, NULL) < 0)
		return 0;
	for (int i = 0; i < n && !found; i++)
		found = mr_ckpt_manifest_read(mf, dirs[i], NULL) == 0;
	mr_ckpt_list_free(dirs, n);
	return found;
}

/* Whether the newest checkpoint of ckpt_dir (when resuming) is this
 * model's and its step's micro-batches can be shared by this mesh's dp:
 * the resume's own refusals, before launch. */
static int check_resume(const json_t *config, const struct mr_worker_env *env,
			struct mr_errbuf *eb)
{
	struct gw *w = calloc(1, sizeof(*w));
	struct mr_ckpt_manifest mf;
	struct mr_adamw_config oc;
	const char *field = NULL;
	int B, T, rc;

	if (!w)
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	w->checking = 1;
	rc = mr__gw_parse(config, &w->mc, &oc, w, &B, &T, eb);
	if (rc == 0 && w->ckpt_dir && w->resume && newest_manifest(w->ckpt_dir, &mf)) {
		if ((field = mr_ckpt_model_diff(&mf.model, &w->mc)))
			rc = mr_errf_field(eb, MR_EINVAL, field,
					   "ckpt_dir '%s': the newest checkpoint, '%s', is of another "
					   "model: '%s' differs (n_layer %d d_model %d vocab_size %d "
					   "there); point ckpt_dir elsewhere, or set \"resume\": "
					   "\"never\" to start afresh over it",
					   w->ckpt_dir, mf.dir, field, mf.model.n_layer,
					   mf.model.d_model, mf.model.vocab);
		mr_ckpt_manifest_release(&mf);
	}
	if (rc == 0 && !field)
		rc = mr__gw_keep_global_batch(w, env, eb);
	free(w->pp_layers);
	free(w);
	return rc;
}

int mr_gpt_worker_check_mesh(const json_t *config, const struct mr_gpt_worker_ranks *r,
			     struct mr_errbuf *eb)
{
	struct mr_errbuf re = { "", "" };
	struct mr_worker_env env = { 0 };
	struct mr_place where;
	int rc;

	if (r->world < 1 || r->tp < 1 || r->pp < 1 || r->cp < 1 || r->ep < 1 ||
	    r->world % (r->tp * r->pp * r->cp))
		return 0; /* the mesh itself is refused by its own check */
	env.world_size = r->world;
	env.tp = r->tp;
	env.pp = r->pp;
	env.cp = r->cp;
	env.ep = r->ep;
	env.dp = r->world / (r->tp * r->pp * r->cp);
	for (env.rank = r->first; env.rank < r->first + r->n; env.rank++)
		if ((rc = mr_gpt_worker_place(config, &env, &where, NULL, &re)) < 0)
			return mr_errf_field(eb, rc, re.field, "rank %d of %d (tp %d, cp %d, pp %d, "
					     "dp %d, ep %d): %s", env.rank, r->world, r->tp, r->cp,
					     r->pp, env.dp, r->ep, re.msg);
	env.rank = r->first;
	return check_resume(config, &env, eb);
}

/*
 * Where this rank sits: checks the model against the mesh (layout, before
 * any communication), then builds the mesh communicators. A single rank
 * needs none.
 */
static int place(struct gw *w, const struct mr_worker_env *env, const struct mr_gpt_config *mc,
		 int T, struct mr_errbuf *eb)
{
	struct mr_worker_env one = { 0 };
	struct mr_groups_comm gc;
	struct mr_place where;
	const char *why;
	int rc;

	if (env)
		one = *env;
	if (one.world_size < 1)
		one.world_size = 1;
	env = &one;
	if ((rc = layout(w, env, mc, T, &where, eb)) < 0)
		return rc;
	gc.backend = pick_backend(w, env, &why);
	gc.gpu = env->local_rank;
	gc.dev = mr_dev_comm_init(&w->devcomm, &w->dev);
	if (env->world_size > 1)
		mr_log_info("comm_backend", "backend=%s reason=%s staging=%s", gc.backend, why,
			    gc.dev ? "per_buffer" : "none");
	rc = mr_groups_create(&w->groups, env, w->hsdp_shard, w->sp, w->comm_timeout_ms,
			      env->cancel ? env->cancel : &w->aborted, &gc, eb);
	if (rc == 0) /* replicated key/value heads: the ranks sharing one */
		rc = mr_groups_kv(&w->groups, mr_gpt_kv_rep(mc, w->groups.mesh.tp), eb);
	if (rc < 0)
		return rc;
	/* the groups' placement has the communicators, the checked one the
	 * stage's layers */
	w->groups.place.chunks = where.chunks;
	w->groups.place.cp_algo = where.cp_algo;
	memcpy(w->groups.place.layer_lo, where.layer_lo, sizeof(where.layer_lo));
	memcpy(w->groups.place.layer_hi, where.layer_hi, sizeof(where.layer_hi));
	atomic_store(&w->groups_ready, 1);
	if (atomic_load(&w->aborted))
		mr_groups_abort(&w->groups);
	w->rank = env->rank;
	w->dp_rank = w->groups.me.dp;
	w->dp_size = w->groups.mesh.dp;
	return 0;
}

int mr__gw_create_trainer(struct gw *w, const struct mr_worker_env *env,
			  const struct mr_adamw_config *oc, struct mr_errbuf *eb)
{
	struct mr_dp_config dc = { w->zero, (size_t)((double)w->bucket_mb * 1048576.0),
				   w->overlap, w->offload };
	struct mr_dp_comms cc;
	int rc = mr_dev_open(&w->dev, w->device, env ? env->local_rank : 0, w->precision, w->pool,
			     eb);

	if (rc < 0)
		return rc;
	w->have_dev = 1;
	if ((rc = place(w, env, &w->mc, w->T, eb)) < 0)
		return rc;
	rc = mr_gpt_create_on(&w->model, &w->mc, w->B, w->T, &w->dev, &w->groups.place,
			      mr_dp_model_flags_on(&w->dev, w->zero, w->offload), eb);
	if (rc < 0)
		return rc;
	w->have_model = 1;
	if ((rc = mr_gpt_set_recompute(&w->model, w->recompute, w->recompute_layers, eb)) < 0)
		return rc;
	cc.shard = w->groups.shard;
	cc.replica = w->groups.replica;
	cc.world = w->groups.group[MR_GROUP_WORLD];
	cc.expert = w->groups.group[MR_GROUP_EDP];
	if (w->groups.mesh.pp > 1) {
		struct mr_comm *ppc = w->groups.group[MR_GROUP_PP];
		/* an untied LM head has no replica of the embeddings to sum */
		struct mr_pp_config pc = { w->pp_kind, w->pp_virtual, ppc,
					   mr_gpt_tied(&w->mc) ? w->groups.embed : NULL,
					   w->pp_p2p >= 0 ? w->pp_p2p : mr_comm_p2p_in_order(ppc) };
		mr_pp_dp_config(&dc);
		if (dc.zero != w->zero)
			mr_log_info("pipeline_zero",
				    "zero=%d runs=%d why=\"a pipeline stage keeps its parameters "
				    "gathered and reduces gradients once per step "
				    "(parallel/mr_pp.h)\"",
				    w->zero, dc.zero);
		if ((rc = mr_step_init(&w->step_drv, &w->model, oc, &dc, &cc, w->seed, eb)) < 0 ||
		    (rc = mr_step_pipeline(&w->step_drv, &pc, eb)) < 0)
			return rc;
	} else if ((rc = mr_step_init(&w->step_drv, &w->model, oc, &dc, &cc, w->seed, eb)) < 0) {
		return rc;
	}
	mr_dp_host_threads(w->step_drv.dp, w->pool); /* offload's host AdamW */
	return 0;
}

/* Keeps the whole lines of the loss log up to `step` under one header
 * (rank 0 after a resume): the steps after it are trained again, and a
 * line a killed run left half-written goes. */
static void trim_loss_log(const char *path, long step)
{
	char tmp[4200], *line = NULL;
	size_t cap = 0;
	FILE *in = fopen(path, "r"), *out;

	if (!in)
		return;
	snprintf(tmp, sizeof(tmp), "%s.trim", path);
	if (!(out = fopen(tmp, "w"))) {
		fclose(in);
		return;
	}
	fputs(MR_LOSS_LOG_HEADER "\n", out); /* one, also over a log from before it */
	for (ssize_t n; (n = getline(&line, &cap, in)) > 0;)
		if (line[n - 1] == '\n' && line[0] >= '0' && line[0] <= '9' && atol(line) <= step)
			fputs(line, out);
	free(line);
	fclose(in);
	if (fclose(out) == 0)
		rename(tmp, path);
}

/* The checkpoint fence (mr_ckpt_opts): a KV call of this rank's
 * generation, which the controller answers 409 (MR_ESTALE) once the job
 * has moved on to a newer one. */
static int ckpt_fence(void *arg, struct mr_errbuf *eb)
{
	const struct mr_kv *kv = arg;
	long long n = 0;
	int rc = mr_kv_add(kv, "meshrun/ckpt-fence", 1, &n);

	if (rc == MR_ESTALE)
		return mr_errf(eb, rc, "this rank's generation ended: the job went on without "
				       "it (stale)");
	return rc < 0 ? mr_errf(eb, rc, "the controller could not confirm the generation: %s",
				mr_strerror(rc))
		      : 0;
}

int mr__gw_open_ckpt(struct gw *w, const struct mr_worker_env *env, const char *train_data,
		     struct mr_errbuf *eb)
{
	struct mr_ckpt_opts o = {
		.dir = w->ckpt_dir,
		.every = w->ckpt_every,
		.keep = w->ckpt_keep,
		.async = w->ckpt_async,
		.timeout_ms = w->comm_timeout_ms > 600000 ? w->comm_timeout_ms : 600000,
		.fail_step = w->ckpt_fail_rank == w->rank ? w->ckpt_fail_step : 0,
		.fail_unmarked = w->ckpt_fail_unmarked,
	};
	struct mr_ckpt_job job = { 0 };
	long step = 0;
	int rc;

	if (!w->ckpt_dir)
		return 0;
	if (env && env->kv) { /* a job's rank: publish only while current */
		o.fence = ckpt_fence;
		o.fence_arg = (void *)env->kv;
	}
	o.publish_delay_ms = w->ckpt_publish_delay_ms;
	job.rank = w->rank;
	job.world = env && env->world_size > 0 ? env->world_size : 1;
	job.tp = w->groups.mesh.tp;
	job.cp = w->groups.mesh.cp;
	job.dp = w->groups.mesh.dp;
	job.pp = w->groups.mesh.pp;
	job.ep = w->groups.mesh.ep;
	job.zero = w->step_drv.pp && w->zero > 1 ? 1 : w->zero;
	job.batch_size = w->B;
	job.seq_len = w->T;
	job.grad_accum = w->accum;
	job.seed = w->seed;
	job.total_steps = w->steps;
	job.opt = mr_dp_adamw(w->step_drv.dp);
	job.m = &w->model;
	job.dp_state = w->step_drv.dp;
	job.world_comm = w->groups.group[MR_GROUP_WORLD];
	job.train_data = train_data;
	job.job_name = env ? env->job : NULL;
	job.run_id = env ? env->run_id : NULL;
	if ((rc = mr_ckpt_create(&w->ckpt, &o, &job, eb)) < 0)
		return rc;
	if (!w->resume || (rc = mr_ckpt_resume(w->ckpt, &step, eb)) < 0)
		return rc;
	if (step > w->steps)
		return mr_errf_field(eb, MR_EINVAL, "steps",
				     "the checkpoint is at step %ld, past 'steps' (%d)", step,
				     w->steps);
	w->step = step;
	w->tokens = (int64_t)step * w->B * w->model.T * w->accum;
	if (step > 0 && w->loss_log && w->rank == 0)
		trim_loss_log(w->loss_log, step);
	return 0;
}

/* The dp values up to 64 that share `rows` evenly, as "1, 2, 4". */
static void dividing_dps(long rows, char *buf, size_t cap)
{
	size_t len = 0;

	buf[0] = 0;
	for (int d = 1; d <= 64 && len + 8 < cap; d++)
		if (rows % d == 0)
			len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", d);
}

int mr__gw_keep_global_batch(struct gw *w, const struct mr_worker_env *env, struct mr_errbuf *eb)
{
	struct mr_ckpt_manifest mf;
	struct mr_mesh mesh;
	int found, global, dp, accum, B;
	long rows;

	if (!w->ckpt_dir || !w->resume || !env || mr_groups_mesh(env, &mesh, NULL) < 0 ||
	    !newest_manifest(w->ckpt_dir, &mf))
		return 0;
	dp = mf.dp;
	accum = mf.grad_accum;
	B = mf.batch_size;
	global = dp * accum;
	found = mr_ckpt_model_diff(&mf.model, &w->mc) == NULL;
	mr_ckpt_manifest_release(&mf);
	/* another model's: the resume refuses it, naming the field */
	if (!found || dp == mesh.dp || global == mesh.dp * w->accum)
		return 0;
	rows = (long)global * B;
	if (global % mesh.dp != 0 && rows % mesh.dp == 0 && rows / mesh.dp <= (1 << 16)) {
		/* the step's micro-batches cannot be shared, its rows can: one
		 * micro-batch of rows / dp each - the same rows, in order */
		if (env->rank == 0 && !w->checking)
			mr_log_info("elastic_batch",
				    "dp_was=%d dp=%d grad_accum_was=%d grad_accum=1 batch_size_was=%d "
				    "batch_size=%ld rows=%ld",
				    dp, mesh.dp, accum, B, rows / mesh.dp, rows);
		w->accum = 1;
		w->B = (int)(rows / mesh.dp);
		return 0;
	}
	if (global % mesh.dp != 0) {
		char dps[160];

		dividing_dps(rows, dps, sizeof(dps));
		return mr_errf_field(eb, MR_EINVAL, "grad_accum",
				     "the checkpoint's step is %d micro-batches of %d rows (dp %d x "
				     "grad_accum %d), which dp %d cannot share evenly: resume on a dp "
				     "that divides %ld rows (%s), or set \"resume\": \"never\" to "
				     "start afresh",
				     global, B, dp, accum, mesh.dp, rows, dps);
	}
	if (env->rank == 0 && !w->checking)
		mr_log_info("elastic_batch",
			    "dp_was=%d dp=%d grad_accum_was=%d grad_accum=%d micro_batches=%d",
			    dp, mesh.dp, w->accum, global / mesh.dp, global);
	w->accum = global / mesh.dp;
	return 0;
}
