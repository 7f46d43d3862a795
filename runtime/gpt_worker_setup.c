/*
 * gpt_worker_setup.c - building a gpt worker (see mr_gpt_worker.h): data
 * files, the rank's place in the mesh and the trainer it runs (one CPU
 * replica, data parallel / ZeRO around a tp-sliced CPU model, or the CUDA
 * device). The config's keys and bounds: gpt_worker_config.c.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_worker_int.h"
#include "mr_json.h"

double mr__gw_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
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
	struct mr_place where;
	int rc;

	if (env)
		one = *env;
	if (one.world_size < 1)
		one.world_size = 1;
	env = &one;
	if ((rc = mr_groups_check(env, w->hsdp_shard, eb)) < 0 ||
	    (rc = mr_groups_place_of(env, w->sp, &where, eb)) < 0 ||
	    (rc = mr_gpt_check_placement(mc, T, &where, eb)) < 0)
		return rc;
	rc = mr_groups_create(&w->groups, env, w->hsdp_shard, w->sp, w->comm_timeout_ms,
			      &w->aborted, eb);
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

/* The CPU model, placed in the mesh (tensor and data parallel), under the
 * step driver (which owns data parallelism, the identity for one replica). */
int mr__gw_create_cpu(struct gw *w, const struct mr_worker_env *env,
		      const struct mr_adamw_config *oc, struct mr_errbuf *eb)
{
	struct mr_dp_config dc = { w->zero, (size_t)((double)w->bucket_mb * 1048576.0),
				   w->overlap };
	struct mr_dp_comms cc;
	int rc = place(w, env, &w->mc, w->T, eb);

	if (rc < 0)
		return rc;
	rc = mr_gpt_create_placed(&w->model, &w->mc, w->B, w->T, w->pool, &w->groups.place,
				  mr_dp_model_flags(w->zero), eb);
	if (rc < 0)
		return rc;
	w->have_model = 1;
	cc.shard = w->groups.shard;
	cc.replica = w->groups.replica;
	cc.world = w->groups.group[MR_GROUP_WORLD];
	return mr_step_init(&w->step_drv, &w->model, oc, &dc, &cc, w->seed, eb);
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

