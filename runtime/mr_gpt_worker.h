/*
 * mr_gpt_worker.h - the GPT training workload behind struct mr_worker_ops
 * (mr_worker.h): one rank of a job, placed in the mesh by env (tp and pp
 * from the mesh, dp = world / (tp * pp)).
 *
 * env->config is a flat JSON object; every key is optional and unknown keys
 * are rejected naming the nearest valid one. Every key - type, range,
 * default, meaning - is in one table (gpt_worker_keys.c), printed as
 * docs/WORKLOAD.md (`meshrun local --help-workload`).
 *
 * Data: train_data, val_data are llm.c token shards (data/mr_shard.h);
 * without them the synthetic task (data/mr_synth.h): training rows from
 * stream 0, validation rows from stream 1. Step s of a job with dp
 * data-parallel ranks uses micro-batches j = (s*dp + dp_rank)*grad_accum +
 * a, rows j*batch_size..: the same rows one rank reads with grad_accum*dp.
 *
 * The debug_* keys exercise hang diagnosis, straggler detection and
 * failed checkpoints on purpose (docs/DIAGNOSIS.md, docs/CHECKPOINTS.md);
 * never set them in a real job.
 *
 * Every device and mode runs one code path: the model on the rank's
 * device, placed in the mesh, under the step driver (gpt_worker_setup.c).
 *
 * Bad input (unknown key, out-of-range value, tp not dividing the heads,
 * sequence parallel with a seq_len tp does not divide, hsdp_shard not
 * dividing dp) fails create() before any communication, naming the field.
 * A vocabulary tp does not divide is padded, not rejected.
 */
#ifndef MR_GPT_WORKER_H
#define MR_GPT_WORKER_H

#include <stdio.h>

#include "mr_worker.h"

extern const struct mr_worker_ops mr_gpt_worker;

/* The first line of a loss_log: its columns, one line per step after it
 * ("nan" for val_loss where no validation ran). */
#define MR_LOSS_LOG_HEADER "step loss aux_loss grad_norm lr val_loss"

/* Every config key - type, range, default, meaning - as the markdown of
 * docs/WORKLOAD.md (`meshrun local --help-workload`). */
void mr_gpt_worker_keys_doc(FILE *f);

/* Checks what create() checks before it knows the mesh: every key known,
 * of its type and in its bounds (the message names the key). 0 or an
 * MR_E* code; config may be NULL (all defaults). For the agent, so a bad
 * workload config exits 2 before the job starts. */
int mr_gpt_worker_check_config(const json_t *config, struct mr_errbuf *eb);

/* Ranks first .. first + n - 1 of a job of `world` ranks in the mesh
 * tp x pp x cp x ep (dp derived): those of one machine. */
struct mr_gpt_worker_ranks {
	int world, tp, pp, cp, ep;
	int first, n;
};

/* Whether ranks r of config's job fit this machine's host memory
 * (MemAvailable, within the memory cgroup's limit) by the planner's
 * ledger, before anything is allocated: 0 (also when it cannot tell: a
 * cuda device, a fixed pp_layers split), or MR_ELIMIT naming what they
 * need, what the machine has and what to change (gpt_worker_fit.c). */
int mr_gpt_worker_fits(const json_t *config, const struct mr_gpt_worker_ranks *r,
		       struct mr_errbuf *eb);
/* What ranks r need and the machine has, for people, into buf: 1 when it
 * does not fit, 0 when it does, -1 when the planner cannot tell. */
int mr_gpt_worker_need(const json_t *config, const struct mr_gpt_worker_ranks *r, char *buf,
		       size_t cap);

struct mr_plan_input;
struct mr_plan_mesh;
/*
 * The planner's inputs (plan/mr_plan.h) a job's workload config (this
 * worker's keys) describes on `world` ranks: the model, precision,
 * zero/sp/schedule/cp_algo/hsdp_shard/recompute/recompute_layers/offload
 * when the config sets them (else searched), the micro-batch size (batch_size) and the global batch of a
 * pure data-parallel job of this world (batch_size x grad_accum x world).
 * The cluster is left to the caller. Errors name the key
 * (gpt_worker_plan.c).
 */
int mr_plan_from_workload(const struct json_t *cfg, int world, struct mr_plan_input *in,
			  struct mr_errbuf *eb);
/* Writes the plan's keys into a workload config (batch_size, grad_accum,
 * zero, sequence_parallel, recompute (with recompute_layers when it
 * limits it), offload; pp_schedule and pp_virtual when pp > 1); 0 or
 * MR_ENOMEM. */
int mr_plan_to_workload(const struct mr_plan_mesh *m, struct json_t *cfg);
/* What a job runs where the workload leaves a choice open (-1, "any" in
 * in->fix): zero 0, no sp, 1f1b, no recomputation, no offload - the
 * worker's defaults, for pricing a given config as it will run. */
void mr_plan_mesh_worker_defaults(struct mr_plan_mesh *m);

struct mr_place;
/*
 * Where create() would place env->rank, without a device, a model or any
 * communication: config read as create() reads it (defaults, bounds), the
 * rank's coordinates in the mesh of env's sizes (rank, world_size, tp,
 * pp, cp, ep; nothing else of env is read) and the pipeline split (the
 * balanced one, or "pp_layers"), checked against the model and the
 * schedule as create() checks them. *where gets the blocks the rank
 * holds: where->chunks ranges [layer_lo, layer_hi), or chunks 0 for the
 * whole model; *n_layer (may be NULL) the model's block count. Errors
 * name the field. For `meshrun mesh`.
 */
int mr_gpt_worker_place(const json_t *config, const struct mr_worker_env *env,
			struct mr_place *where, int *n_layer, struct mr_errbuf *eb);
/*
 * Every rank of the job placed as its worker will place it
 * (mr_gpt_worker_place: the model against the mesh, the pipeline split,
 * the schedule), before any rank starts: 0, or the first refusal with
 * the rank and the worker's reason (field kept). Ranks r->first ..
 * r->first + r->n - 1 of a world of r->world. For `meshrun local` and the
 * agent, which refuse a job no rank could run before launching it.
 */
int mr_gpt_worker_check_mesh(const json_t *config, const struct mr_gpt_worker_ranks *r,
			     struct mr_errbuf *eb);

#endif
