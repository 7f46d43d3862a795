/*
 * gpt_worker_int.h - internals shared by gpt_worker.c (the worker ops and
 * the step loop) and gpt_worker_setup.c (config, placement, trainers).
 */
#ifndef MR_GPT_WORKER_INT_H
#define MR_GPT_WORKER_INT_H

#include <stdatomic.h>
#include <stdint.h>
#include <jansson.h>

#include "ckpt/mr_ckpt.h"
#include "cpu/mr_pool.h"
#include "data/mr_shard.h"
#include "device/mr_dev_comm.h"
#include "mr_gpt_worker.h"
#include "mr_groups.h"
#include "mr_step.h"
#include "mr_tb_events.h"

struct gw {
	struct mr_gpt_config mc;
	int B, T;               /* micro-batch shape */
	struct mr_dev dev;      /* the rank's device (model, gradients, optimizer) */
	struct mr_dev_comm devcomm; /* the communicators' view of it */
	int have_dev;
	const char *device, *precision, *comm_backend; /* borrowed from env->config */
	struct mr_gpt model;
	struct mr_step step_drv; /* the step driver (owns data parallel state) */
	struct mr_pool *pool;
	int have_model;
	int steps, accum, eval_batches, threads;
	int eval_every;         /* -1 unset until mr__gw_open_data settles it */
	int log_every;          /* rank 0's step lines */
	int checking;           /* a check before launch: no worker, say nothing */
	long log_step;          /* the last step line's step and time (ETA) */
	long log_first;         /* the step this run started at */
	double log_t;
	double train_s;         /* step time of this run */
	double best_val;        /* this run's lowest validation loss (NaN: none) */
	long best_val_step;
	/* placement: mesh communicators, this rank's data-parallel slice */
	struct mr_groups groups;
	atomic_int groups_ready;
	int rank, dp_rank, dp_size;
	int sp, zero, hsdp_shard, overlap;
	int cp_algo;            /* enum mr_cp_algo */
	int recompute, recompute_layers; /* enum mr_gpt_recompute; 0: every block */
	int offload;            /* enum mr_dp_offload */
	enum mr_pp_kind pp_kind; /* pipeline: schedule, chunks per stage, explicit split */
	int pp_virtual, n_pp_layers;
	int pp_p2p;              /* 1 paired, 0 ahead, -1 auto (mr_comm_p2p_in_order) */
	int *pp_layers;          /* (n_pp_layers) or NULL: balanced */
	float bucket_mb;
	long comm_timeout_ms;
	const char *loss_log, *save_weights; /* borrowed from env->config */
	const char *ckpt_dir;   /* borrowed; NULL: no checkpoints */
	int ckpt_every, ckpt_keep, ckpt_async, resume;
	struct mr_ckpt *ckpt;   /* with ckpt_dir */
	uint64_t seed;
	double peak_flops;
	int profile_step;       /* the step broken down by kind (0: none) */
	int *inputs, *targets;  /* accum x (B,T) (context parallel: x (B,T/cp)) */
	int *full_in, *full_tg; /* (B,T): one micro-batch before its cp chunks */
	struct mr_shard train, val; /* llm.c shards, when configured */
	int have_train, have_val;
	int64_t tokens;
	long step;              /* optimizer steps completed */
	_Atomic int64_t progress_step; /* the step being run, for progress reports */
	int stall_rank, stall_step; /* debug_stall_*: -1 = off */
	int slow_rank, slow_ms;     /* debug_slow_*: -1 = off */
	int ckpt_fail_rank, ckpt_fail_step, ckpt_fail_unmarked; /* debug_ckpt_fail_* */
	int ckpt_publish_delay_ms; /* debug_ckpt_publish_delay_ms */
	atomic_int aborted;
	atomic_int preempted;   /* preempt(): checkpoint at this step's end, then stop */
	const char *tensorboard_dir; /* borrowed; NULL: no event file */
	struct mr_tb tb;        /* rank 0 with tensorboard_dir: the event file */
};

/* Monotonic seconds. */
double mr__gw_now(void);
/* Reads every key of the config (NULL: all defaults) into mc, oc and w;
 * unknown keys and out-of-range values fail naming the key. */
int mr__gw_parse(const json_t *c, struct mr_gpt_config *mc, struct mr_adamw_config *oc,
		 struct gw *w, int *B, int *T, struct mr_errbuf *eb);
/* "device" ("cpu" when absent), "precision", "comm_backend" (NULL when
 * absent: the device's default, "auto") and "tensorboard_dir" (NULL when
 * absent or empty) into w; a value outside the choices fails naming the
 * key. */
int mr__gw_run_keys(const json_t *c, struct gw *w, struct mr_errbuf *eb);
/* Opens train_data / val_data when the config names them, and settles
 * eval_every: unset with val_data max(1, steps/10); 0 (logged once) with
 * train_data but no val_data - never the synthetic task's validation. */
int mr__gw_open_data(struct gw *w, const json_t *c, struct mr_errbuf *eb);

/* The config's keys (gpt_worker_keys.c): what the parser takes its bounds,
 * defaults and choices from, and what docs/WORKLOAD.md prints. */
enum mr__gw_key_type { GWK_INT, GWK_NUM, GWK_BOOL, GWK_STR, GWK_CHOICE, GWK_LIST };
struct mr__gw_key {
	const char *name;
	enum mr__gw_key_type type;
	double lo, hi;       /* INT, NUM: the value's bounds; LIST: its entries' */
	const char *def;     /* the default as a person reads it */
	const char *choices; /* CHOICE: "a|b|c" */
	const char *group, *help;
};
extern const struct mr__gw_key mr__gw_keys[]; /* ends with a NULL name */
/* The key named name, or NULL. */
const struct mr__gw_key *mr__gw_key(const char *name);
/* Fails on the first key of c the table lacks, naming the nearest valid
 * one (at most 3 edits away). */
int mr__gw_check_keys(const json_t *c, struct mr_errbuf *eb);
/* The rank's trainer: its device, its place in the mesh (communicators
 * on the backend chosen for the device), the model placed there and the
 * step driver. */
int mr__gw_create_trainer(struct gw *w, const struct mr_worker_env *env,
			  const struct mr_adamw_config *oc, struct mr_errbuf *eb);

/* Checkpoints (ckpt_dir): the writer, and with "resume" "auto" the newest
 * loadable checkpoint loaded (w->step, the loss log trimmed to it).
 * Collective over the job. */
int mr__gw_open_ckpt(struct gw *w, const struct mr_worker_env *env, const char *train_data,
		     struct mr_errbuf *eb);

/* Elastic resume: when the data-parallel size differs from the newest
 * checkpoint's, grad_accum becomes what keeps its global batch (the same
 * micro-batches every step, so the same losses), or, when dp cannot share
 * the micro-batches but can their rows, one micro-batch of rows / dp per
 * rank (batch_size changes: the same rows); fails naming grad_accum when
 * dp divides neither. Before the trainer is built. */
int mr__gw_keep_global_batch(struct gw *w, const struct mr_worker_env *env,
			     struct mr_errbuf *eb);

#endif
