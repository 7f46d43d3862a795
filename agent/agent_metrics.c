/*
 * agent_metrics.c - registration and updates of the agent's metrics; see
 * agent_metrics.h.
 */
#include "agent_metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mr_comm.h"
#include "mr_groups.h"
#include "mr_mesh.h"
#include "mr_worker.h"

/* Heartbeat round trips: 1 ms .. 10 s. */
static const double hb_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
				    0.25,  0.5,    1,     2.5,  5,     10};

int mr_agent_metrics_init(struct mr_agent_metrics *m, const char *const *state_names)
{
	struct mr_metric_family *f;

	memset(m, 0, sizeof(*m));
	m->reg = mr_metrics_new();
	if (!m->reg)
		return MR_ENOMEM;
	f = mr_metrics_gauge(m->reg, "meshrun_agent_state",
			     "Lifecycle state of the agent: 1 for the current state.", "state");
	for (int i = 0; i < MR_AGENT_NSTATES; i++)
		m->state[i] = mr_metric_gauge_child(f, state_names[i]);
	m->generation = mr_metric_gauge_child(
		mr_metrics_gauge(m->reg, "meshrun_agent_generation",
				 "Rendezvous generation of the current round.", NULL));
	m->restarts = mr_metric_counter_child(
		mr_metrics_counter(m->reg, "meshrun_agent_restarts_total",
				   "Restarts of the local workers.", NULL));
	m->hb_latency = mr_metric_histogram_child(mr_metrics_histogram(
		m->reg, "meshrun_agent_heartbeat_latency_seconds",
		"Round trip of heartbeats to the controller.", NULL, hb_buckets,
		sizeof(hb_buckets) / sizeof(hb_buckets[0])));
	m->hb_failures = mr_metric_counter_child(
		mr_metrics_counter(m->reg, "meshrun_agent_heartbeat_failures_total",
				   "Heartbeats that did not reach the controller.", NULL));
	m->world_size = mr_metric_gauge_child(mr_metrics_gauge(
		m->reg, "meshrun_agent_world_size", "World size of the current round.", NULL));
	m->node_rank = mr_metric_gauge_child(mr_metrics_gauge(
		m->reg, "meshrun_agent_node_rank", "Node rank of this agent.", NULL));
	m->running = mr_metric_gauge_child(mr_metrics_gauge(
		m->reg, "meshrun_agent_workers_running", "Local workers alive.", NULL));
	m->exit_code = mr_metrics_gauge(m->reg, "meshrun_agent_worker_exit_code",
					"Last exit code of each local worker (-1 while running; "
					"128+N when killed by signal N).",
					"local_rank");
	m->rank_info = mr_metrics_gauge(m->reg, "meshrun_rank_info",
					"Placement of each local rank: its mesh coordinates and "
					"pipeline stage (the pp coordinate). 1 for the ranks of the "
					"current round, 0 for those of an earlier one.",
					"rank,node_rank,tp,pp,dp,cp,ep,stage");
	m->w_step = mr_metrics_gauge(m->reg, "meshrun_worker_step",
				     "Optimizer steps completed by an in-process worker.", "rank");
	m->w_loss = mr_metrics_gauge(m->reg, "meshrun_worker_loss",
				     "Training loss of the last step of an in-process worker.",
				     "rank");
	m->w_val_loss = mr_metrics_gauge(m->reg, "meshrun_worker_val_loss",
					 "Mean loss over the validation batches at the last "
					 "evaluation (every eval_every steps and the last step).",
					 "rank");
	m->w_tps = mr_metrics_gauge(m->reg, "meshrun_worker_tokens_per_second",
				    "Training throughput of an in-process worker.", "rank");
	m->w_grad_norm = mr_metrics_gauge(m->reg, "meshrun_worker_grad_norm",
					  "Global gradient norm of the last step (before clipping).",
					  "rank");
	m->w_lr = mr_metrics_gauge(m->reg, "meshrun_worker_learning_rate",
				   "Learning rate of the last step.", "rank");
	m->w_mfu = mr_metrics_gauge(m->reg, "meshrun_worker_mfu",
				    "Model FLOPs utilisation of the last step: 6N + 6LCT FLOPs per "
				    "token x tokens/s over the rank's peak, which is peak_flops of the "
				    "workload config, else one thread's sgemm FLOP/s measured once per "
				    "machine (cached in /dev/shm/meshrun-sgemm-peak) x the rank's "
				    "threads.", "rank");
	m->w_step_s = mr_metrics_gauge(m->reg, "meshrun_worker_step_seconds",
				       "Wall time of the last optimizer step.", "rank");
	m->w_comm_wait = mr_metrics_gauge(m->reg, "meshrun_worker_comm_wait_seconds",
					  "Time the last step waited on gradient/parameter "
					  "communication that was not hidden behind compute.", "rank");
	m->w_comm_op = mr_metrics_counter(m->reg, "meshrun_worker_comm_wait_seconds_total",
					  "Seconds a rank was blocked in communication, by "
					  "process group kind (tp, dp, ..., hsdp_shard) and "
					  "operation, over every run of the workers.",
					  "rank,group,op");
	m->w_mem = mr_metrics_gauge(m->reg, "meshrun_worker_memory_bytes",
				    "Bytes held by an in-process worker, by category "
				    "(params, grads, optim, acts, workspace).", "rank,kind");
	m->pp_bubble = mr_metrics_gauge(m->reg, "meshrun_pipeline_bubble_fraction",
					"Pipeline bubble of the rank's stage in the last optimizer "
					"step: (makespan - busy) / busy, busy the seconds the stage "
					"computed its passes and makespan the longest schedule of any "
					"stage in that step (Megatron's bubble time fraction; it can "
					"exceed 1). 0 without a pipeline.", "rank");
	m->pp_wait = mr_metrics_gauge(m->reg, "meshrun_pipeline_p2p_wait_seconds",
				      "Seconds the rank's pipeline stage was blocked on its "
				      "point-to-point sends and receives (activations and their "
				      "gradients) in the last optimizer step. 0 without a "
				      "pipeline.", "rank");
	m->ck_s = mr_metrics_gauge(m->reg, "meshrun_checkpoint_seconds",
				   "Snapshot and write time of the rank's last checkpoint (the "
				   "write runs beside training when ckpt_async).", "rank");
	m->ck_stall = mr_metrics_gauge(m->reg, "meshrun_checkpoint_stall_seconds",
				       "Training time the rank's last checkpoint took: its "
				       "snapshot, and waiting for the previous write.", "rank");
	m->ck_step = mr_metrics_gauge(m->reg, "meshrun_checkpoint_last_step",
				      "Step of the rank's last checkpoint written or resumed "
				      "from (0: none).", "rank");
	m->ck_bytes = mr_metrics_gauge(m->reg, "meshrun_checkpoint_bytes",
				       "Bytes the rank wrote for its last checkpoint.", "rank");
	m->ck_failed = mr_metrics_gauge(m->reg, "meshrun_checkpoint_failures",
					"Checkpoints that failed in the rank's current run (its own "
					"part; rank 0: any rank's part): the previous step is the "
					"newest, training goes on.", "rank");
	m->dev_fallbacks = mr_metrics_gauge(m->reg, "meshrun_worker_device_fallbacks",
					    "Operations the rank's device ran on a slow path it "
					    "should not need (cuda: a GEMM cuBLASLt did not run, "
					    "a layer attention cuDNN did not run; the agent's log "
					    "names why).", "rank");
	m->dev_graphs = mr_metrics_gauge(m->reg, "meshrun_worker_device_graph_launches",
					 "Device graphs (CUDA graphs: a micro-batch's forward and "
					 "backward, an AdamW update) the rank has launched; 0 while "
					 "they are off (the log's cuda_graph_off says why).",
					 "rank");
	m->restart_cause = mr_metrics_counter(m->reg, "meshrun_agent_restarts_by_cause_total",
					      "Restarts of the local workers by cause: member_lost "
					      "(a member of the job died or failed), worker_failed "
					      "(here), scale_up (a member joined an elastic job).",
					      "cause");
	m->lost_total = mr_metric_counter_child(mr_metrics_counter(
		m->reg, "meshrun_agent_restart_steps_lost_total",
		"Optimizer steps trained again after restarts: the step reached before "
		"each minus the step the next run resumed from (its checkpoint).", NULL));
	m->lost_last = mr_metric_gauge_child(mr_metrics_gauge(
		m->reg, "meshrun_agent_restart_steps_lost",
		"Optimizer steps the last restart cost (see _total).", NULL));
	mr_gauge_set(m->node_rank, -1);
	return 0;
}

void mr_agent_metrics_restart(struct mr_agent_metrics *m, const char *cause)
{
	mr_counter_inc(mr_metric_counter_child(m->restart_cause, cause));
	if (m->resume_seen) /* else the run trained nothing: the earlier stands */
		m->prev_run_step = m->run_step;
	m->run_step = 0;
	m->resume_seen = 0;
}

void mr_agent_metrics_release(struct mr_agent_metrics *m)
{
	mr_metrics_free(m->reg);
	free(m->seen);
	memset(m, 0, sizeof(*m));
}

void mr_agent_metrics_state(struct mr_agent_metrics *m, int state)
{
	for (int i = 0; i < MR_AGENT_NSTATES; i++)
		mr_gauge_set(m->state[i], i == state ? 1 : 0);
}

void mr_agent_metrics_ranks(struct mr_agent_metrics *m, const int *ranks, int n, int node_rank,
			    int tp, int pp, int cp, int ep, int dp)
{
	struct mr_mesh mesh;
	int world = tp * pp * cp * dp;

	for (int i = 0; i < m->ninfo; i++)
		mr_gauge_set(m->info[i], 0);
	m->ninfo = 0;
	if (mr_mesh_init(&mesh, world, tp, pp, cp, ep, dp, NULL))
		return;
	for (int i = 0; i < n && i < (int)(sizeof(m->info) / sizeof(m->info[0])); i++) {
		struct mr_mesh_coord c;
		char v[8][16];
		const char *vals[8];

		if (mr_mesh_coord(&mesh, ranks[i], &c))
			continue;
		snprintf(v[0], 16, "%d", ranks[i]);
		snprintf(v[1], 16, "%d", node_rank);
		snprintf(v[2], 16, "%d", c.tp);
		snprintf(v[3], 16, "%d", c.pp);
		snprintf(v[4], 16, "%d", c.dp);
		snprintf(v[5], 16, "%d", c.cp);
		snprintf(v[6], 16, "%d", c.ep);
		snprintf(v[7], 16, "%d", c.pp); /* the stage: named for joins by stage */
		for (int k = 0; k < 8; k++)
			vals[k] = v[k];
		m->info[m->ninfo] = mr_metric_gauge_childv(m->rank_info, vals);
		mr_gauge_set(m->info[m->ninfo], 1);
		m->ninfo++;
	}
}

void mr_agent_metrics_exit_code(struct mr_agent_metrics *m, int local_rank, int code)
{
	char lr[16];

	snprintf(lr, sizeof(lr), "%d", local_rank);
	mr_gauge_set(mr_metric_gauge_child(m->exit_code, lr), code);
}

void mr_agent_metrics_worker(struct mr_agent_metrics *m, int rank,
			     const struct mr_worker_stats *st)
{
	char r[16];

	snprintf(r, sizeof(r), "%d", rank);
	mr_gauge_set(mr_metric_gauge_child(m->w_step, r), (double)st->step);
	mr_gauge_set(mr_metric_gauge_child(m->w_loss, r), st->loss);
	if (isfinite(st->val_loss)) /* the last evaluation stands until the next one */
		mr_gauge_set(mr_metric_gauge_child(m->w_val_loss, r), st->val_loss);
	mr_gauge_set(mr_metric_gauge_child(m->w_tps, r), st->tokens_per_s);
	mr_gauge_set(mr_metric_gauge_child(m->w_grad_norm, r), st->grad_norm);
	mr_gauge_set(mr_metric_gauge_child(m->w_lr, r), st->lr);
	mr_gauge_set(mr_metric_gauge_child(m->w_mfu, r), st->mfu);
	mr_gauge_set(mr_metric_gauge_child(m->w_step_s, r), st->step_seconds);
	mr_gauge_set(mr_metric_gauge_child(m->w_comm_wait, r), st->comm_wait_s);
	mr_gauge_set(mr_metric_gauge_child(m->pp_bubble, r), st->pp > 1 ? st->pp_bubble : 0.0);
	mr_gauge_set(mr_metric_gauge_child(m->pp_wait, r), st->pp > 1 ? st->pp_wait_s : 0.0);
	mr_gauge_set(mr_metric_gauge_child(m->ck_s, r), st->ckpt_seconds);
	mr_gauge_set(mr_metric_gauge_child(m->ck_stall, r), st->ckpt_stall_s);
	mr_gauge_set(mr_metric_gauge_child(m->ck_step, r), (double)st->ckpt_step);
	mr_gauge_set(mr_metric_gauge_child(m->ck_bytes, r), (double)st->ckpt_bytes);
	mr_gauge_set(mr_metric_gauge_child(m->ck_failed, r), (double)st->ckpt_failures);
	mr_gauge_set(mr_metric_gauge_child(m->dev_fallbacks, r), (double)st->dev_fallbacks);
	mr_gauge_set(mr_metric_gauge_child(m->dev_graphs, r), (double)st->dev_graph_launches);
	if (st->step > 0 && !m->resume_seen) {
		/* the run's first stats: what the last restart cost */
		int64_t lost = m->prev_run_step - st->resumed_step;
		m->resume_seen = 1;
		if (m->prev_run_step > 0 && lost > 0) {
			mr_counter_add(m->lost_total, (double)lost);
			mr_gauge_set(m->lost_last, (double)lost);
		}
	}
	if (st->step > m->run_step)
		m->run_step = st->step;
	for (int k = 0; k < MR_MEM_KINDS; k++) {
		const char *vals[2] = { r, mr_mem_kind_name((enum mr_mem_kind)k) };
		mr_gauge_set(mr_metric_gauge_childv(m->w_mem, vals), (double)st->mem_bytes[k]);
	}
}

struct mr_agent_comm_seen {
	int rank, kind, op;
	double last;
	struct mr_counter *c;
};

static struct mr_agent_comm_seen *comm_seen(struct mr_agent_metrics *m, int rank, int kind,
					    int op)
{
	struct mr_agent_comm_seen *s;
	char r[16];

	for (int i = 0; i < m->nseen; i++)
		if (m->seen[i].rank == rank && m->seen[i].kind == kind && m->seen[i].op == op)
			return &m->seen[i];
	if (m->nseen == m->capseen) {
		int cap = m->capseen ? 2 * m->capseen : 16;
		void *p = realloc(m->seen, (size_t)cap * sizeof(*m->seen));
		if (!p)
			return NULL;
		m->seen = p;
		m->capseen = cap;
	}
	snprintf(r, sizeof(r), "%d", rank);
	s = &m->seen[m->nseen++];
	*s = (struct mr_agent_comm_seen){ rank, kind, op, 0.0,
					  mr_metric_counter_child(m->w_comm_op, r,
								  mr_groups_kind_name(kind),
								  mr_comm_op_name(op)) };
	return s;
}

void mr_agent_metrics_comm(struct mr_agent_metrics *m, int rank,
			   const struct mr_worker_progress *p)
{
	for (int g = 0; g < p->ngroups; g++) {
		const struct mr_worker_group_progress *gp = &p->group[g];

		if (!mr_groups_kind_name(gp->kind))
			continue;
		for (int op = 1; op < MR_WORKER_COMM_OPS; op++) {
			struct mr_agent_comm_seen *s;

			if (gp->wait_s[op] <= 0.0 || !(s = comm_seen(m, rank, gp->kind, op)))
				continue;
			if (gp->wait_s[op] > s->last)
				mr_counter_add(s->c, gp->wait_s[op] - s->last);
			s->last = gp->wait_s[op];
		}
	}
}

void mr_agent_metrics_comm_restart(struct mr_agent_metrics *m)
{
	for (int i = 0; i < m->nseen; i++)
		m->seen[i].last = 0.0;
}
