/*
 * agent_metrics.h - the agent's Prometheus metrics: lifecycle state,
 * generation, restarts, heartbeat latency and failures, rank placement and
 * worker exit codes. The supervisor updates them; http.c renders them.
 *
 *   meshrun_agent_state{state}                     1 for the current state
 *   meshrun_agent_generation                       rendezvous generation
 *   meshrun_agent_restarts_total                   worker restarts
 *   meshrun_agent_restarts_by_cause_total{cause}   every restart of the workers:
 *                                  member_lost, worker_failed, scale_up
 *   meshrun_agent_restart_steps_lost_total, meshrun_agent_restart_steps_lost
 *                                  optimizer steps trained again after
 *                                  restarts (the step reached before one
 *                                  minus the step the next run resumed
 *                                  from), in all and at the last one
 *   meshrun_agent_heartbeat_latency_seconds        histogram of beats
 *   meshrun_agent_heartbeat_failures_total         beats that got no answer
 *   meshrun_agent_world_size, meshrun_agent_node_rank
 *   meshrun_agent_workers_running                  local workers alive
 *   meshrun_agent_worker_exit_code{local_rank}     last exit code (-1 running)
 *   meshrun_rank_info{rank,node_rank,tp,pp,dp,cp,ep,stage}
 *                                  1 for each local rank of the current
 *                                  round; stage: its pipeline stage (the
 *                                  pp coordinate, "0" without a pipeline)
 *
 *   meshrun_worker_step{rank}, meshrun_worker_loss{rank},
 *   meshrun_worker_tokens_per_second{rank}, ...   in-process workers' stats
 *   meshrun_worker_comm_wait_seconds_total{rank,group,op}
 *                                  time blocked in communication, by group
 *                                  kind and operation (every run of the
 *                                  workers adds to it)
 *   meshrun_checkpoint_seconds{rank}, meshrun_checkpoint_stall_seconds{rank},
 *   meshrun_checkpoint_last_step{rank}, meshrun_checkpoint_bytes{rank}
 *                                  the rank's last checkpoint: write time,
 *                                  training time it took, its step, bytes
 *   meshrun_pipeline_bubble_fraction{rank}, meshrun_pipeline_p2p_wait_seconds{rank}
 *                                  the last step's bubble of the rank's
 *                                  pipeline stage and its time blocked on
 *                                  the pipeline's sends and receives (0
 *                                  without a pipeline)
 *
 * Thread safety: every update is an atomic store (mr_metrics).
 * Ownership: the struct owns the registry; release frees it.
 * Non-goals: per-layer metrics.
 */
#ifndef MR_AGENT_METRICS_H
#define MR_AGENT_METRICS_H

#include <stdint.h>

#include "mr_metrics.h"

#define MR_AGENT_NSTATES 8

struct mr_agent_metrics {
	struct mr_metrics *reg;
	struct mr_gauge *state[MR_AGENT_NSTATES];
	struct mr_gauge *generation, *world_size, *node_rank, *running;
	struct mr_counter *restarts, *hb_failures;
	struct mr_histogram *hb_latency;
	struct mr_metric_family *exit_code, *rank_info;
	struct mr_metric_family *w_step, *w_loss, *w_val_loss, *w_tps, *w_grad_norm, *w_lr, *w_mfu;
	struct mr_metric_family *w_step_s, *w_comm_wait, *w_mem, *w_comm_op;
	struct mr_metric_family *pp_bubble, *pp_wait;
	struct mr_metric_family *ck_s, *ck_stall, *ck_step, *ck_bytes, *ck_failed, *dev_fallbacks,
		*dev_graphs, *restart_cause;
	struct mr_counter *lost_total;
	struct mr_gauge *lost_last;
	int64_t run_step;       /* highest step the current run's workers reported */
	int64_t prev_run_step;  /* the run before the last restart's */
	int resume_seen;        /* the current run's first stats were counted */
	struct mr_agent_comm_seen *seen; /* last wait per (rank, group, op) */
	int nseen, capseen;
	struct mr_gauge *info[256]; /* rank_info children of the current round */
	int ninfo;
};

/* state_names: MR_AGENT_NSTATES names, label values of meshrun_agent_state. */
int mr_agent_metrics_init(struct mr_agent_metrics *m, const char *const *state_names);
void mr_agent_metrics_release(struct mr_agent_metrics *m);
void mr_agent_metrics_state(struct mr_agent_metrics *m, int state);
/* Replaces the rank_info children (old ones drop to 0). */
void mr_agent_metrics_ranks(struct mr_agent_metrics *m, const int *ranks, int n, int node_rank,
			    int tp, int pp, int cp, int ep, int dp);
void mr_agent_metrics_exit_code(struct mr_agent_metrics *m, int local_rank, int code);
struct mr_worker_stats;
/* A restart of the workers for `cause` (member_lost, worker_failed,
 * scale_up): counted, and the steps the next run trains again measured
 * from its first stats. Not thread-safe: the supervisor's thread. */
void mr_agent_metrics_restart(struct mr_agent_metrics *m, const char *cause);
/* Copies an in-process worker's stats into the meshrun_worker_* gauges. */
void mr_agent_metrics_worker(struct mr_agent_metrics *m, int rank,
			     const struct mr_worker_stats *st);
struct mr_worker_progress;
/* Adds what a rank's communicators waited since the last call to
 * meshrun_worker_comm_wait_seconds_total. Not thread-safe: one caller. */
void mr_agent_metrics_comm(struct mr_agent_metrics *m, int rank,
			   const struct mr_worker_progress *p);
/* New workers: their waits count from zero. */
void mr_agent_metrics_comm_restart(struct mr_agent_metrics *m);

#endif
