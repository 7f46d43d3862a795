/*
 * mr_worker.h - the interface between the agent and an in-process workload.
 *
 * The agent runs one thread per local rank; each thread creates one worker
 * through a struct mr_worker_ops table, calls step() until it reports done
 * or fails, and reads its stats after every step for metrics and progress.
 * abort() may be called from any other thread (the agent's supervisor, on a
 * generation change or SIGTERM): every pending and future operation of that
 * worker, communication included, must then return MR_EABORTED promptly so
 * the thread can unwind and the agent can rejoin.
 *
 * Ownership: env and everything it points to stay valid until destroy();
 * the worker copies what it keeps longer. Stats are written by the worker
 * thread into the caller's struct.
 *
 * Non-goals: process management (exec mode lives in the agent), restarts
 * (the agent restarts by destroy + create at a new generation).
 */
#ifndef MR_WORKER_H
#define MR_WORKER_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "core/mr_mem.h"
#include "device/mr_device.h"
#include "mr_err.h"
#include "mr_kv.h"
#include "mr_names.h"

/* Where a rank sits. Mesh sizes follow BRIEF §4 (tp fastest, then cp, dp,
 * pp; world = tp*cp*dp*pp, ep carved from dp*cp). */
struct mr_worker_env {
	const char *job;          /* "namespace/name" */
	const char *run_id;       /* stable across restarts of one job */
	int generation;           /* rendezvous generation */
	int restart_count;        /* restarts so far (0 on the first run) */
	int rank, world_size;
	int local_rank, local_world_size;
	int node_rank, num_nodes;
	int tp, pp, cp, ep, dp;   /* mesh sizes */
	const char *host;         /* this agent's reachable address */
	const char *host_id;      /* boot id + ipc namespace: who can share memory */
	const struct mr_kv *kv;   /* bootstrap store of this job and generation */
	const json_t *config;     /* workload config (borrowed), may be NULL */
	const char *checkpoint_dir; /* may be NULL */
	/* the host's stop flag, may be NULL: create() gives up (MR_EABORTED)
	 * soon after it becomes non-zero - a rank bootstrapping its
	 * communicators has no state abort() could reach yet */
	const _Atomic int *cancel;
};

struct mr_worker_stats {
	int64_t step;            /* steps completed */
	int64_t total_steps;     /* planned, 0 if unknown */
	double loss, aux_loss, val_loss; /* val_loss NaN when not evaluated */
	double grad_norm, lr;
	double tokens_per_s, step_seconds, mfu;
	double comm_wait_s;      /* step time blocked on communication (any group:
				  * what compute did not hide), 0 if none */
	int64_t tokens;          /* processed so far */
	size_t mem_bytes[MR_MEM_KINDS];
	int pp, pp_stage;        /* pipeline stages and this rank's (1, 0 without) */
	double pp_bubble;        /* last step: idle / compute time of this stage, the
				  * idle time measured against the longest stage */
	double pp_wait_s;        /* last step: blocked on the pipeline's transfers */
	int64_t ckpt_step;       /* last checkpoint written or resumed from; 0 = none */
	int64_t resumed_step;    /* the step this run resumed from; 0 = from scratch */
	double ckpt_seconds;     /* the last checkpoint's snapshot + write time */
	double ckpt_stall_s;     /* training time its save took (snapshot, waiting) */
	uint64_t ckpt_bytes;     /* bytes this rank wrote for it */
	int64_t ckpt_failures;   /* checkpoints of this run that failed: the rank's own
				  * part, or (rank 0) any rank's */
	int64_t dev_fallbacks;   /* the device's slow paths taken so far (mr_dev.fallbacks) */
	int64_t dev_graph_launches; /* device graphs launched so far (mr_dev.graph_launches) */
	/* the step "profile_step" names: its device time by kind of operation
	 * (mr_dev_kind_name; [MR_DEV_KINDS]: idle between them) and its
	 * span, ms; zeros on every other step and on a device without timing */
	double dev_kind_ms[MR_DEV_KINDS + 1], dev_span_ms;
	/* this run so far, for the job's summary */
	double best_val_loss;    /* lowest validation loss, NaN when none ran */
	int64_t best_val_step;
	double train_seconds;    /* time in steps */
	double job_tokens_per_s; /* every data-parallel rank's tokens / train_seconds */
	int64_t ckpt_saves;      /* checkpoints written */
};

/*
 * Progress of a rank for hang diagnosis and straggler detection
 * (docs/DIAGNOSIS.md): the step and micro-batch it is in and, for each of
 * its communicators, which group of the mesh it is and the last operation
 * the rank entered and completed there (enum mr_comm_op, common/
 * mr_names.h). Group kinds are common/mr_mesh.h's enum mr_mesh_group, or
 * one of common/mr_names.h's MR_WORKER_GROUP_* for groups the mesh function
 * does not define. Numbers travel in heartbeats: append-only.
 */
#define MR_WORKER_PROGRESS_GROUPS 16
#define MR_WORKER_COMM_OPS 10 /* enum mr_comm_op's count */

struct mr_worker_group_progress {
	int kind;     /* enum mr_mesh_group or MR_WORKER_GROUP_* */
	int id;       /* mr_mesh_group_id() of the rank in that kind */
	int size;     /* members */
	uint64_t entered, completed; /* operation numbers, 0 = none yet */
	int entered_op, completed_op; /* enum mr_comm_op */
	int peer;     /* entered p2p operation: the peer's index in the group, else -1 */
	double wait_s[MR_WORKER_COMM_OPS]; /* seconds blocked here so far, by operation */
};

struct mr_worker_progress {
	int64_t step;        /* the step being run (0-based; = steps done between steps) */
	int micro;           /* micro-batch being run, -1 outside the micro-batch loop */
	double comm_wait_s;  /* seconds blocked in communication so far, every group */
	int ngroups;
	struct mr_worker_group_progress group[MR_WORKER_PROGRESS_GROUPS];
};

enum mr_worker_status {
	MR_WORKER_MORE = 0,    /* step() done, call again */
	MR_WORKER_DONE = 1,    /* training finished */
	MR_WORKER_STOPPED = 2, /* stopped as preempt() asked, its checkpoint written */
};

struct mr_worker_ops {
	const char *name;
	/* Builds the workload for this rank (communicators included). */
	int (*create)(void **state, const struct mr_worker_env *env, struct mr_errbuf *eb);
	/* One optimizer step: MR_WORKER_MORE, MR_WORKER_DONE or an MR_E* code. */
	int (*step)(void *state, struct mr_worker_stats *stats, struct mr_errbuf *eb);
	/* Thread-safe; makes step() return MR_EABORTED promptly. */
	void (*abort)(void *state);
	/* NULL is a no-op. */
	void (*destroy)(void *state);
	/* Optional (NULL: the workload reports none). Fills out; called from
	 * another thread while step() runs, so it only reads (atomics). */
	void (*progress)(void *state, struct mr_worker_progress *out);
	/* Optional (NULL: stop at once). Thread-safe: the rank is being
	 * preempted (its pod evicted): at the end of the current step every
	 * rank of the job writes a checkpoint, then this one's step() returns
	 * MR_WORKER_STOPPED (the others go on until their agents restart
	 * them). A workload without checkpoints stops at the step's end. */
	void (*preempt)(void *state);
};

#endif
