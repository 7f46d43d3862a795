/*
 * workers.c - the local workers of one round (see supervisor_int.h): the
 * master endpoint agreed through the round's KV, starting them (exec mode:
 * processes with torchrun's environment; in-process: one thread per rank
 * running the workload), polling, signalling, stopping, exit codes, and the
 * in-process stats turned into metrics and progress lines.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mesh_auto.h"
#include "mr_gpt_worker.h"
#include "mr_log.h"
#include "mr_port.h"
#include "supervisor_int.h"
#include "workenv.h"

extern char **environ;

/* Reads key of the round, long-polling in slices; 0, MR_ESTALE, MR_EABORTED,
 * MR_ETIMEDOUT or another error. */
int mr__sv_kv_wait(struct mr_supervisor *sv, const char *key, char *buf, size_t cap,
		   long timeout_ms)
{
	long long deadline = mr__sv_now_ms() + timeout_ms;
	int gen = sv->round.generation;

	for (;;) {
		struct mr_errbuf eb = {0};
		long left = (long)(deadline - mr__sv_now_ms());
		size_t len = 0;
		int err;

		if (sv->stop_sig)
			return MR_EABORTED;
		if (mr_rdzv_ended(sv->rdzv, NULL, 0))
			return MR_ECLOSED;
		if (mr_rdzv_hb_stale(sv->rdzv))
			return MR_ESTALE;
		if (left <= 0)
			return MR_ETIMEDOUT;
		err = mr_rdzv_kv_get(sv->rdzv, gen, key, buf, cap - 1, &len,
				     left < SLICE_MS ? left : SLICE_MS, &eb);
		if (err == 0) {
			buf[len < cap - 1 ? len : cap - 1] = '\0';
			return 0;
		}
		if (err == MR_ETIMEDOUT || err == MR_ENOTFOUND)
			continue;
		if (err == MR_ECONN) {
			if (mr__sv_controller_lost(sv))
				return err;
			if (mr__sv_nap(sv, 200))
				return MR_EABORTED;
			continue;
		}
		return err;
	}
}

/* MASTER_ADDR/MASTER_PORT: chosen by node rank 0, read by the others. */
int mr__sv_master_endpoint(struct mr_supervisor *sv, char *addr, size_t cap, int *port)
{
	const struct mr_agent_config *cfg = sv->cfg;
	int gen = sv->round.generation;
	char text[32];
	int err;

	if (sv->round.node_rank == 0) {
		struct mr_errbuf eb = {0};

		/* rank 0's store binds it later: outside the ephemeral range */
		*port = mr_port_free();
		if (*port <= 0)
			return MR_ESYS;
		snprintf(addr, cap, "%s", cfg->host);
		snprintf(text, sizeof(text), "%d", *port);
		err = mr_rdzv_kv_put(sv->rdzv, gen, KEY_MASTER_ADDR, addr, strlen(addr), &eb);
		if (!err)
			err = mr_rdzv_kv_put(sv->rdzv, gen, KEY_MASTER_PORT, text, strlen(text),
					     &eb);
		if (err)
			mr_log_warn("master_publish_failed", "err=%s msg=%s", mr_err_name(err),
				    mr_log_q(eb.msg));
		return err;
	}
	err = mr__sv_kv_wait(sv, KEY_MASTER_ADDR, addr, cap, cfg->join_timeout_ms);
	if (!err)
		err = mr__sv_kv_wait(sv, KEY_MASTER_PORT, text, sizeof(text), cfg->join_timeout_ms);
	if (!err)
		*port = atoi(text);
	return err;
}

/* Whether in-process ranks run as worker processes (inproc.h). */
static int rank_processes(const struct mr_agent_config *cfg, const json_t *config)
{
	const char *dev = json_string_value(json_object_get(config, "device"));

	if (cfg->rank_process != MR_AGENT_RANK_AUTO)
		return cfg->rank_process == MR_AGENT_RANK_PROCESS;
	return dev && !strcmp(dev, "cuda");
}

int mr__sv_inproc_mode(const struct mr_supervisor *sv)
{
	return sv->cfg->mode == MR_AGENT_MODE_INPROC;
}

void mr__sv_workers_poll(struct mr_supervisor *sv, struct mr_exec_status *st)
{
	if (mr__sv_inproc_mode(sv))
		mr_inproc_poll(&sv->inproc, st);
	else
		mr_exec_poll(&sv->exec, st);
}

void mr__sv_workers_signal(struct mr_supervisor *sv, int sig)
{
	if (mr__sv_inproc_mode(sv))
		mr_inproc_abort(&sv->inproc);
	else
		mr_exec_signal(&sv->exec, sig);
}

void mr__sv_workers_preempt(struct mr_supervisor *sv, int sig)
{
	if (mr__sv_inproc_mode(sv))
		mr_inproc_preempt(&sv->inproc, sv->cfg->grace_period_ms);
	else
		mr_exec_signal(&sv->exec, sig);
}

int mr__sv_workers_count(const struct mr_supervisor *sv)
{
	return mr__sv_inproc_mode(sv) ? sv->inproc.n : sv->exec.n;
}

const char *mr__sv_worker_reason(const struct mr_supervisor *sv, int rank)
{
	int i = rank - sv->round.rank_base;

	if (!mr__sv_inproc_mode(sv) || i < 0 || i >= sv->inproc.n ||
	    !atomic_load(&sv->inproc.rank[i].done))
		return "";
	return sv->inproc.rank[i].err;
}

/* Exit code of local rank i, -1 while it runs. */
static int worker_code(const struct mr_supervisor *sv, int i)
{
	if (mr__sv_inproc_mode(sv))
		return atomic_load(&sv->inproc.rank[i].done) ? sv->inproc.rank[i].code : -1;
	return sv->exec.child[i].running ? -1 : sv->exec.child[i].code;
}

void mr__sv_record_codes(struct mr_supervisor *sv)
{
	for (int i = 0; i < mr__sv_workers_count(sv); i++)
		if (worker_code(sv, i) >= 0)
			mr_agent_metrics_exit_code(&sv->metrics, i, worker_code(sv, i));
}

/* Stops the workers (grace for exec mode) and records their codes; the
 * in-process state stays readable until the next start. */
void mr__sv_workers_stop(struct mr_supervisor *sv, int grace_ms)
{
	if (mr__sv_inproc_mode(sv)) {
		/* a rank still running would wait in a collective for the one
		 * that stopped until the communicator's timeout: abort it (a
		 * no-op for ranks that are done) */
		mr_inproc_abort(&sv->inproc);
		mr_inproc_join(&sv->inproc);
	} else {
		mr_exec_stop(&sv->exec, grace_ms);
	}
	mr__sv_record_codes(sv);
}

int mr__sv_start_workers(struct mr_supervisor *sv, const char *maddr, int mport,
			 struct mr_errbuf *eb)
{
	const struct mr_agent_config *cfg = sv->cfg;
	struct mr_rdzv_round planned = sv->round;
	const struct mr_rdzv_round *rd = &planned;
	json_t *config = cfg->workload_json, *previous = NULL;
	int n = rd->nproc_per_node;
	struct mr_workenv *envs = calloc((size_t)n, sizeof(*envs));
	char ***ev = calloc((size_t)n, sizeof(*ev));
	int *ranks = calloc((size_t)n, sizeof(*ranks));
	struct mr_worker_env *wenv = calloc((size_t)n, sizeof(*wenv));
	struct mr_workenv_extra x = {.role = cfg->role, .max_restarts = cfg->max_restarts,
				     .master_addr = maddr, .master_port = mport};
	int err = 0;

	if (!envs || !ev || !ranks || !wenv || n < 1 || n > MR_EXEC_MAX_LOCAL) {
		err = mr_errf(eb, MR_ENOMEM, "unable to prepare %d workers", n);
		goto out;
	}
	if (cfg->mesh[0] && cfg->min_nodes != cfg->max_nodes) {
		/* --mesh auto, elastic: the plan for the world this round has */
		struct mr_agent_mesh m;
		json_t *j;
		if ((err = mr_agent_mesh_auto(cfg, rd->world_size, &m, &j, eb)) < 0)
			goto out;
		planned.tp = m.tp;
		planned.pp = m.pp;
		planned.cp = m.cp;
		planned.ep = m.ep;
		planned.dp = m.dp;
		previous = sv->plan_json;
		sv->plan_json = config = j;
	}
	for (int i = 0; i < n; i++) {
		struct mr_worker_env w = {
			.job = cfg->job, .run_id = cfg->run_id, .generation = rd->generation,
			.restart_count = atomic_load(&sv->restarts), .rank = rd->rank_base + i,
			.world_size = rd->world_size, .local_rank = i, .local_world_size = n,
			.node_rank = rd->node_rank, .num_nodes = rd->num_nodes, .tp = rd->tp,
			.pp = rd->pp, .cp = rd->cp, .ep = rd->ep, .dp = rd->dp,
			.host = cfg->host, .host_id = cfg->host_id};

		ranks[i] = w.rank;
		w.config = config;
		wenv[i] = w;
		if (mr__sv_inproc_mode(sv))
			continue;
		err = mr_workenv_init(&envs[i], environ);
		if (!err)
			err = mr_workenv_torchrun(&envs[i], &w, &x);
		if (err) {
			mr_errf(eb, err, "unable to build the environment of rank %d: %s", w.rank,
				mr_strerror(err));
			goto out;
		}
		ev[i] = envs[i].v;
	}
	if (mr__sv_inproc_mode(sv)) {
		/* the heartbeat thread reads the workers: not while they change */
		mr_agent_progress_detach(&sv->progress);
		mr_inproc_stop(&sv->inproc); /* the previous run's threads and state */
		json_decref(previous);        /* the config they borrowed */
		previous = NULL;
		mr_agent_metrics_comm_restart(&sv->metrics);
		err = mr_gpt_worker_fits(config,
					 &(struct mr_gpt_worker_ranks){ rd->world_size, rd->tp, rd->pp,
									rd->cp, rd->ep, rd->rank_base,
									n },
					 eb);
		if (!err) {
			struct mr_inproc_opts io = { rank_processes(cfg, config),
						     cfg->grace_period_ms };

			err = mr_inproc_start(&sv->inproc, &mr_gpt_worker, wenv, n, &sv->ropts,
					      &io, eb);
		}
		if (!err && mr_agent_progress_attach(&sv->progress, &sv->inproc))
			mr_log_warn("progress_off", "reason=%s", "out of memory");
	} else {
		err = mr_exec_start(&sv->exec, cfg->cmd, n, ev, ranks, NULL, -1, -1, eb);
	}
	if (!err) {
		mr_agent_metrics_ranks(&sv->metrics, ranks, n, rd->node_rank, rd->tp, rd->pp,
				       rd->cp, rd->ep, rd->dp);
		for (int i = 0; i < n; i++)
			mr_agent_metrics_exit_code(&sv->metrics, i, -1);
	}
out:
	if (previous) { /* not reached the stop: the old workers may still read it */
		json_decref(sv->plan_json);
		sv->plan_json = previous;
	}
	for (int i = 0; envs && i < n; i++)
		if (envs[i].v)
			mr_workenv_release(&envs[i]);
	free(envs);
	free(ev);
	free(ranks);
	free(wenv);
	return err;
}

/* In-process stats into metrics; a progress line per second (rank 0 of
 * this node), so `meshrun local` shows training. */
void mr__sv_report_stats(struct mr_supervisor *sv, long long *last, int final)
{
	int print = last && mr__sv_now_ms() - *last >= 1000;

	for (int i = 0; i < sv->inproc.n; i++) {
		struct mr_worker_stats ws;
		struct mr_worker_progress wp;

		if (mr_inproc_stats(&sv->inproc, i, &ws))
			continue;
		mr_agent_metrics_worker(&sv->metrics, sv->inproc.rank[i].env.rank, &ws);
		if (mr_inproc_progress(&sv->inproc, i, &wp) == 0)
			mr_agent_metrics_comm(&sv->metrics, sv->inproc.rank[i].env.rank, &wp);
		mr_agent_progress_step(&sv->progress, i, &ws);
		if (sv->inproc.rank[i].env.rank == 0 && ws.total_steps > 0) {
			sv->rank0 = ws;
			sv->have_rank0 = 1;
		}
		if (final) {
			/* losses only where there are some: the last step
			 * evaluated; a finished job run again trained none */
			char loss[32] = "", val[32] = "";

			if (isfinite(ws.loss))
				snprintf(loss, sizeof(loss), " loss=%.4f", ws.loss);
			if (isfinite(ws.val_loss))
				snprintf(val, sizeof(val), " val_loss=%.4f", ws.val_loss);
			mr_log_info("worker_done",
				    "rank=%d step=%lld/%lld%s%s tokens=%lld tokens_per_s=%.0f "
				    "mfu=%.3f",
				    sv->inproc.rank[i].env.rank, (long long)ws.step,
				    (long long)ws.total_steps, loss, val, (long long)ws.tokens,
				    ws.tokens_per_s, ws.mfu);
		} else if (print && i == 0 && ws.step > 0) {
			/* no ETA while the steps stall (past 3 steps' time and 10 s
			 * with no new one): how long it has stalled instead */
			long long now = mr__sv_now_ms(), idle;
			char eta[48];

			if (ws.step != sv->shown_step) {
				sv->shown_step = ws.step;
				sv->shown_since_ms = now;
			}
			idle = now - sv->shown_since_ms;
			if (idle > 10000 && idle > 3000 * ws.step_seconds)
				snprintf(eta, sizeof(eta), "stalled_s=%lld", idle / 1000);
			else
				snprintf(eta, sizeof(eta), "eta_s=%.0f",
					 ws.total_steps > ws.step
						 ? (double)(ws.total_steps - ws.step) *
							   ws.step_seconds
						 : 0.0);
			mr_log_info("progress",
				    "rank=%d step=%lld/%lld loss=%.4f tokens_per_s=%.0f mfu=%.3f %s",
				    sv->inproc.rank[i].env.rank, (long long)ws.step,
				    (long long)ws.total_steps, ws.loss, ws.tokens_per_s, ws.mfu, eta);
		}
	}
	if (print && last)
		*last = mr__sv_now_ms();
}

void mr_supervisor_log_summary(const struct mr_supervisor *sv, double seconds)
{
	const struct mr_worker_stats *s = &sv->rank0;
	const char *dir = NULL;
	char losses[160] = "", steps[48] = "";

	if (!sv->have_rank0 && !(sv->round.generation > 0 && sv->round.node_rank == 0))
		return;
	if (sv->cfg->workload_json)
		dir = json_string_value(json_object_get(sv->cfg->workload_json, "ckpt_dir"));
	if (sv->have_rank0) {
		size_t n = 0;

		snprintf(steps, sizeof(steps), " steps=%lld/%lld", (long long)s->step,
			 (long long)s->total_steps);
		if (isfinite(s->loss))
			n += (size_t)snprintf(losses + n, sizeof(losses) - n, " loss=%.4f", s->loss);
		if (isfinite(s->val_loss) && n < sizeof(losses))
			n += (size_t)snprintf(losses + n, sizeof(losses) - n, " val_loss=%.4f",
					      s->val_loss);
		if (isfinite(s->best_val_loss) && n < sizeof(losses))
			snprintf(losses + n, sizeof(losses) - n,
				 " best_val_loss=%.4f best_val_step=%lld", s->best_val_loss,
				 (long long)s->best_val_step);
	}
	mr_log_always("job_summary",
		      "state=%s%s seconds=%.1f%s tokens_per_s=%.0f restarts=%d checkpoints=%lld "
		      "ckpt_dir=%s reason=%s",
		      mr_agent_state_name(atomic_load(&sv->state)), steps, seconds, losses,
		      sv->have_rank0 ? s->job_tokens_per_s : 0.0, atomic_load(&sv->restarts),
		      sv->have_rank0 ? (long long)s->ckpt_saves : 0LL, mr_log_q(dir ? dir : ""),
		      mr_log_q(sv->reason));
}
