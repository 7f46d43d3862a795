/*
 * supervisor.c - the agent's lifecycle state machine; see supervisor.h.
 *
 * One thread (the caller's) drives everything: rendezvous calls, forking
 * workers, polling them every POLL_MS, reacting to the heartbeat thread's
 * findings and to the stop flag set by signal handlers.
 *
 * The local workers of a round (start in either mode, poll, signal, stop,
 * stats) are workers.c.
 *
 * Non-goals: HTTP details (rdzv.c), process mechanics (exec.c).
 */
#include "supervisor_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mr_gpt_worker.h"
#include "mr_log.h"
#include "workenv.h"


static const char *const state_names[MR_AGENT_NSTATES] = {
	"init", "joining", "waiting", "running", "restarting", "succeeded", "failed", "stopped",
};

enum outcome {
	OUT_DONE,    /* every local worker exited 0 */
	OUT_FAILED,  /* a worker exited non-zero */
	OUT_STALE,   /* the generation moved on */
	OUT_STOP,    /* SIGTERM/SIGINT on the agent */
	OUT_ENDED,   /* the controller says the job is over (410) */
	OUT_LOST,    /* the controller did not answer for controller_timeout */
};

const char *mr_agent_state_name(int state)
{
	return state >= 0 && state < MR_AGENT_NSTATES ? state_names[state] : "unknown";
}

long long mr__sv_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void set_state(struct mr_supervisor *sv, int st)
{
	if (atomic_exchange(&sv->state, st) == st)
		return;
	mr_agent_metrics_state(&sv->metrics, st);
	mr_log_info("state", "state=%s gen=%d restarts=%d", state_names[st],
		    atomic_load(&sv->generation), atomic_load(&sv->restarts));
}

static int fail_with(struct mr_supervisor *sv, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static int fail_with(struct mr_supervisor *sv, const char *fmt, ...)
{
	char msg[sizeof(sv->reason)];
	va_list ap;

	va_start(ap, fmt); /* may format sv->reason itself: via a copy */
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	memcpy(sv->reason, msg, sizeof(msg));
	atomic_store(&sv->ready, 0);
	set_state(sv, MR_AGENT_FAILED);
	mr_log_error("failed", "reason=%s", mr_log_q(sv->reason));
	return MR_AGENT_EXIT_FAILED;
}

/* Tells the controller that the job cannot succeed (a permanent error or
 * exhausted restarts here), so every other agent stops at once. */
static void fail_job(struct mr_supervisor *sv, const char *why)
{
	struct mr_errbuf eb = {0};
	int err = mr_rdzv_fail_job(sv->rdzv, why, &eb);

	if (err && err != MR_ECLOSED)
		mr_log_warn("fail_report_failed", "err=%s msg=%s", mr_err_name(err),
			    mr_log_q(eb.msg));
}

int mr__sv_controller_lost(struct mr_supervisor *sv)
{
	long long silent = mr_rdzv_silent_ms(sv->rdzv);

	if (silent < sv->cfg->controller_timeout_ms)
		return 0;
	snprintf(sv->reason, sizeof(sv->reason),
		 "controller '%s' did not answer for %lld ms (controller_timeout %d ms)",
		 sv->cfg->controller, silent, sv->cfg->controller_timeout_ms);
	return 1;
}

/* Sleeps ms, waking early on a stop request; 1 if stopping. */
int mr__sv_nap(struct mr_supervisor *sv, long ms)
{
	long long end = mr__sv_now_ms() + ms;

	while (!sv->stop_sig && mr__sv_now_ms() < end)
		usleep(POLL_MS * 1000);
	return sv->stop_sig != 0;
}

static void on_latency(void *user, double seconds)
{
	struct mr_supervisor *sv = user;

	mr_histogram_observe(sv->metrics.hb_latency, seconds);
}

/* The heartbeat's progress report (heartbeat thread). */
static json_t *beat_extra(void *user, int full)
{
	struct mr_supervisor *sv = user;
	json_t *p = mr_agent_progress_json(&sv->progress, full);

	return p ? json_pack("{so}", "progress", p) : NULL;
}

static json_t *job_spec(const struct mr_agent_config *cfg)
{
	json_t *s = json_pack("{s:s, s:i, s:i, s:i, s:{s:i, s:i, s:i, s:i, s:i}, s:i, s:i, s:i}",
			      "name", cfg->job, "min_nodes", cfg->min_nodes, "max_nodes",
			      cfg->max_nodes, "nproc_per_node", cfg->nproc_per_node, "mesh", "tp",
			      cfg->tp, "pp", cfg->pp, "cp", cfg->cp, "ep", cfg->ep, "dp", cfg->dp,
			      "last_call_ms", cfg->last_call_ms, "heartbeat_timeout_ms",
			      cfg->heartbeat_timeout_ms, "max_restarts", cfg->max_restarts);

	/* unset: the controller's defaults */
	if (s && cfg->hang_timeout_ms > 0)
		json_object_set_new(s, "hang_timeout_ms", json_integer(cfg->hang_timeout_ms));
	if (s && cfg->straggler_factor > 0.0)
		json_object_set_new(s, "straggler_factor", json_real(cfg->straggler_factor));
	if (s && cfg->rank_order)
		json_object_set_new(s, "rank_order", json_string("topology"));
	return s;
}

int mr_supervisor_init(struct mr_supervisor *sv, const struct mr_agent_config *cfg,
		       struct mr_errbuf *eb)
{
	struct mr_rdzv_opts o = {0};
	json_t *spec;
	int err;

	memset(sv, 0, sizeof(*sv));
	sv->cfg = cfg;
	mr_agent_progress_init(&sv->progress);
	err = mr_agent_metrics_init(&sv->metrics, state_names);
	if (err)
		return mr_errf(eb, err, "unable to create the metrics registry");
	mr_agent_metrics_state(&sv->metrics, MR_AGENT_INIT);
	spec = job_spec(cfg);
	if (!spec)
		return mr_errf(eb, MR_ENOMEM, "unable to build the job spec");
	o.controller = cfg->controller;
	o.job = cfg->job;
	o.node_id = cfg->node_id;
	o.host = cfg->host;
	o.host_id = cfg->host_id;
	o.pod_index = cfg->pod_index;
	o.topology = cfg->topology;
	o.agent_port = cfg->health_port;
	o.token = cfg->token;
	o.spec = spec;
	sv->ropts = o;
	sv->ropts.spec = NULL;
	err = mr_rdzv_new(&sv->rdzv, &o, eb);
	json_decref(spec);
	if (!err)
		mr_rdzv_hb_set_beat(sv->rdzv, beat_extra, sv);
	return err;
}

void mr_supervisor_release(struct mr_supervisor *sv)
{
	mr_exec_stop(&sv->exec, 0);
	mr_agent_progress_detach(&sv->progress);
	mr_inproc_stop(&sv->inproc);
	json_decref(sv->plan_json); /* after the workers that borrowed it */
	sv->plan_json = NULL;
	mr_rdzv_free(sv->rdzv);
	sv->rdzv = NULL;
	mr_agent_progress_release(&sv->progress);
	mr_agent_metrics_release(&sv->metrics);
}

void mr_supervisor_stop(struct mr_supervisor *sv, int sig)
{
	sv->stop_sig = sig;
	if (sv->rdzv)
		mr_rdzv_abort(sv->rdzv);
}

/* JOINING + WAITING until the round closes: 0, MR_EABORTED (stop),
 * MR_ETIMEDOUT (join_timeout) or an error with the reason set (a
 * permanent one, or MR_ECONN past controller_timeout). A member the
 * controller carried into the new round (the 409 that ended the last one
 * said so) does not join: it waits, or already has its rank; should the
 * wait say otherwise (409, 404), it joins. */
static int rendezvous(struct mr_supervisor *sv, int *joined)
{
	const struct mr_agent_config *cfg = sv->cfg;
	long long deadline = mr__sv_now_ms() + cfg->join_timeout_ms;
	long backoff = 100;

	*joined = 0;
	for (;;) {
		struct mr_errbuf eb = {0};
		int gen = 0, standby = 0, err, carried;

		if (sv->stop_sig)
			return MR_EABORTED;
		if (mr__sv_now_ms() >= deadline)
			return MR_ETIMEDOUT;
		set_state(sv, MR_AGENT_JOINING);
		carried = mr_rdzv_carried(sv->rdzv, atomic_load(&sv->generation), &gen, &sv->round);
		if (carried == MR_RDZV_CARRIED_RUNNING) {
			*joined = 1;
			mr_log_info("carried", "gen=%d state=running", gen);
			return 0;
		}
		if (carried) {
			err = 0;
			mr_log_info("carried", "gen=%d state=waiting", gen);
		} else {
			err = mr_rdzv_join(sv->rdzv, &gen, &standby, &eb);
		}
		if (err == MR_ECONN) {
			if (mr__sv_controller_lost(sv))
				return err;
			mr_log_warn("join_retry", "err=%s msg=%s backoff_ms=%ld", mr_err_name(err),
				    mr_log_q(eb.msg), backoff);
			if (mr__sv_nap(sv, backoff))
				return MR_EABORTED;
			backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
			continue;
		}
		if (err == MR_EABORTED || err == MR_ECLOSED)
			return err;
		if (err) {
			snprintf(sv->reason, sizeof(sv->reason), "join failed: %s",
				 eb.msg[0] ? eb.msg : mr_strerror(err));
			return err;
		}
		*joined = 1;
		atomic_store(&sv->generation, gen);
		mr_gauge_set(sv->metrics.generation, gen);
		set_state(sv, MR_AGENT_WAITING);
		if (!carried)
			mr_log_info("joined", "gen=%d standby=%d", gen, standby);
		for (;;) {
			long left = (long)(deadline - mr__sv_now_ms());
			int newgen = 0;

			mr_errbuf_clear(&eb);
			if (sv->stop_sig)
				return MR_EABORTED;
			if (left <= 0)
				return MR_ETIMEDOUT;
			err = mr_rdzv_wait(sv->rdzv, gen, left < SLICE_MS ? left : SLICE_MS,
					   &sv->round, &newgen, &eb);
			if (err == 0)
				return 0;
			if (err == MR_ETIMEDOUT)
				continue;
			if (err == MR_ESTALE || err == MR_ENOTFOUND)
				break; /* join the newer round */
			if (err == MR_ECONN) {
				if (mr__sv_controller_lost(sv))
					return err;
				if (mr__sv_nap(sv, backoff))
					return MR_EABORTED;
				backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
								       : backoff * 2;
				continue;
			}
			if (err == MR_EABORTED || err == MR_ECLOSED)
				return err;
			snprintf(sv->reason, sizeof(sv->reason), "wait failed: %s",
				 eb.msg[0] ? eb.msg : mr_strerror(err));
			return err;
		}
	}
}

/* RUNNING: watches workers, heartbeats and the stop flag. */
static enum outcome monitor(struct mr_supervisor *sv, struct mr_exec_status *st)
{
	long long last_report = mr__sv_now_ms();
	int seen_failures = 0;

	for (;;) {
		int f;

		if (sv->stop_sig)
			return OUT_STOP;
		mr__sv_workers_poll(sv, st);
		mr_gauge_set(sv->metrics.running, st->running);
		if (mr__sv_inproc_mode(sv))
			mr__sv_report_stats(sv, &last_report, 0);
		f = mr_rdzv_hb_failures(sv->rdzv);
		if (f > seen_failures)
			mr_counter_add(sv->metrics.hb_failures, f - seen_failures);
		seen_failures = f;
		if (st->failed)
			return OUT_FAILED;
		if (mr_rdzv_ended(sv->rdzv, NULL, 0))
			return OUT_ENDED;
		if (mr_rdzv_hb_stale(sv->rdzv))
			return OUT_STALE;
		if (st->running == 0)
			return OUT_DONE;
		if (mr__sv_controller_lost(sv))
			return OUT_LOST;
		usleep(POLL_MS * 1000);
	}
}

/* After local success: wait for every node (KV counter + done key). 0 when
 * all arrived (or on timeout, logged), MR_ESTALE, MR_EABORTED, MR_ECLOSED,
 * MR_ECONN (controller lost, reason set). */
static int exit_barrier(struct mr_supervisor *sv)
{
	const struct mr_agent_config *cfg = sv->cfg;
	int gen = sv->round.generation;
	long long deadline = mr__sv_now_ms() + cfg->exit_barrier_timeout_ms;
	long long count = 0;
	char buf[16];
	int err;

	for (;;) {
		struct mr_errbuf eb = {0};

		err = mr_rdzv_kv_add(sv->rdzv, gen, KEY_EXIT_COUNT, 1, &count, &eb);
		if (err != MR_ECONN)
			break;
		if (mr__sv_controller_lost(sv))
			return err;
		if (mr__sv_nap(sv, 200))
			return MR_EABORTED;
	}
	if (err == MR_ESTALE || err == MR_EABORTED || err == MR_ECLOSED)
		return err;
	if (err) {
		mr_log_warn("exit_barrier_skipped", "err=%s", mr_err_name(err));
		return 0;
	}
	if (count >= sv->round.num_nodes) {
		struct mr_errbuf eb = {0};

		mr_rdzv_kv_put(sv->rdzv, gen, KEY_EXIT_DONE, "1", 1, &eb);
		return 0;
	}
	err = mr__sv_kv_wait(sv, KEY_EXIT_DONE, buf, sizeof(buf), (long)(deadline - mr__sv_now_ms()));
	if (err == MR_ETIMEDOUT) {
		mr_log_warn("exit_barrier_timeout", "arrived=%lld nodes=%d", count,
			    sv->round.num_nodes);
		return 0;
	}
	return err;
}

/* The controller answered 410 (job failed, succeeded or deleted): stop the
 * workers (workers: 1 if this round's were started) and exit with the
 * job's verdict and the controller's reason. */
static int job_ended(struct mr_supervisor *sv, int workers)
{
	char why[768] = "";
	int end = mr_rdzv_ended(sv->rdzv, why, sizeof(why));

	atomic_store(&sv->ready, 0);
	if (workers) {
		mr__sv_workers_signal(sv, SIGTERM);
		mr__sv_workers_stop(sv, sv->cfg->grace_period_ms);
	}
	mr_rdzv_hb_stop(sv->rdzv);
	if (end == MR_RDZV_SUCCEEDED) {
		mr_log_info("job_succeeded", "reason=%s", mr_log_q(why));
		snprintf(sv->reason, sizeof(sv->reason), "%s", "");
		set_state(sv, MR_AGENT_SUCCEEDED);
		return MR_AGENT_EXIT_OK;
	}
	return fail_with(sv, "job %s (controller): %s",
			 end == MR_RDZV_DELETED ? "deleted" : "failed", why);
}

/* Stops workers and heartbeats; counts the restart against max_restarts
 * unless !counted (a membership change). 0 = go again. */
static int restart(struct mr_supervisor *sv, const char *why, const char *cause, int report,
		   int counted)
{
	const struct mr_agent_config *cfg = sv->cfg;
	int gen = atomic_load(&sv->generation);
	int n;

	atomic_store(&sv->ready, 0);
	snprintf(sv->reason, sizeof(sv->reason), "%s", why);
	set_state(sv, MR_AGENT_RESTARTING);
	mr_log_warn("restarting", "gen=%d why=%s", gen, mr_log_q(why));
	mr__sv_workers_stop(sv, cfg->grace_period_ms);
	mr_gauge_set(sv->metrics.running, 0);
	mr_agent_metrics_restart(&sv->metrics, cause);
	mr_rdzv_hb_stop(sv->rdzv);
	if (report) {
		struct mr_errbuf eb = {0};

		mr_rdzv_fail(sv->rdzv, gen, why, &eb); /* 409: someone was faster */
	}
	n = atomic_load(&sv->restarts);
	if (counted && n >= cfg->max_restarts) {
		char msg[sizeof(sv->reason)];

		snprintf(msg, sizeof(msg), "restarts exhausted (max_restarts %d); last: %s",
			 cfg->max_restarts, why);
		fail_job(sv, msg);
		return fail_with(sv, "%s", msg);
	}
	if (mr_rdzv_ended(sv->rdzv, NULL, 0))
		return job_ended(sv, 0);
	if (counted) {
		atomic_store(&sv->restarts, n + 1);
		mr_counter_inc(sv->metrics.restarts);
	}
	return 0;
}

/*
 * The generation ended under running workers. If the controller counted a
 * restart for it (a lost pod, a worker failure elsewhere) this agent
 * counts one too; if the job's restart count did not move, a member was
 * added (elastic scale-up) and, as with torchrun, the membership change
 * costs no restart.
 */
static int stale_restart(struct mr_supervisor *sv, char *why, size_t cap)
{
	int now = mr_rdzv_stale_restarts(sv->rdzv);

	if (now >= 0 && sv->round.restarts >= 0 && now == sv->round.restarts) {
		snprintf(why, cap, "generation %d ended: a member was added",
			 sv->round.generation);
		return restart(sv, why, "scale_up", 0, 0);
	}
	snprintf(why, cap, "generation %d ended: a member was lost or failed",
		 sv->round.generation);
	return restart(sv, why, "member_lost", 0, 1);
}

/*
 * SIGTERM path: forward, wait grace, leave. workers: 1 when this round's
 * workers were started. Success is the controller's verdict, not the
 * workers' exit codes: a job stopped before it succeeded exits 128 + sig
 * (STOPPED), so the pod is restarted rather than marked Succeeded.
 */
static int stop_gracefully(struct mr_supervisor *sv, int joined, int workers)
{
	const struct mr_agent_config *cfg = sv->cfg;
	int sig = sv->stop_sig ? sv->stop_sig : SIGTERM;
	struct mr_errbuf eb = {0};

	atomic_store(&sv->ready, 0);
	mr_log_info("stopping", "signal=%d", sig);
	if (workers) {
		mr__sv_workers_preempt(sv, sig);
		mr__sv_workers_stop(sv, cfg->grace_period_ms);
	}
	mr_rdzv_hb_stop(sv->rdzv);
	mr_rdzv_resume(sv->rdzv);
	if (joined) /* a job that is over answers 410: mr_rdzv_ended() learns it */
		mr_rdzv_leave(sv->rdzv, atomic_load(&sv->generation), "agent stopped", &eb);
	if (mr_rdzv_ended(sv->rdzv, NULL, 0) == MR_RDZV_SUCCEEDED) {
		sv->reason[0] = '\0';
		set_state(sv, MR_AGENT_SUCCEEDED);
		return MR_AGENT_EXIT_OK;
	}
	snprintf(sv->reason, sizeof(sv->reason), "stopped by signal %d before the job succeeded",
		 sig);
	set_state(sv, MR_AGENT_STOPPED);
	return 128 + sig;
}

/* The controller is gone past controller_timeout (reason set): the
 * workers are stopped, nothing can be reported. */
static int controller_lost(struct mr_supervisor *sv, int workers)
{
	char why[sizeof(sv->reason)];

	memcpy(why, sv->reason, sizeof(why));
	atomic_store(&sv->ready, 0);
	if (workers) {
		mr__sv_workers_signal(sv, SIGTERM);
		mr__sv_workers_stop(sv, sv->cfg->grace_period_ms);
	}
	mr_rdzv_hb_stop(sv->rdzv);
	return fail_with(sv, "%s", why);
}

/* Reports this node's completion until the controller has recorded it:
 * 0, MR_ECLOSED (the job is over: mr_rdzv_ended), MR_ESTALE, MR_EABORTED,
 * MR_ECONN past controller_timeout (reason set) or another error. */
static int report_complete(struct mr_supervisor *sv)
{
	for (;;) {
		struct mr_errbuf eb = {0};
		int err = mr_rdzv_complete(sv->rdzv, sv->round.generation, &eb);

		if (err && err != MR_ECONN && err != MR_ECLOSED && err != MR_ESTALE)
			snprintf(sv->reason, sizeof(sv->reason), "unable to report completion: %s",
				 eb.msg[0] ? eb.msg : mr_strerror(err));
		if (err != MR_ECONN)
			return err;
		if (mr__sv_controller_lost(sv))
			return err;
		mr_log_warn("complete_retry", "err=%s msg=%s", mr_err_name(err), mr_log_q(eb.msg));
		if (mr__sv_nap(sv, 200))
			return MR_EABORTED;
	}
}

int mr_supervisor_run(struct mr_supervisor *sv)
{
	const struct mr_agent_config *cfg = sv->cfg;

	for (;;) {
		struct mr_exec_status st;
		struct mr_errbuf eb = {0};
		char maddr[256] = "", why[512];
		const char *reason;
		int joined = 0, mport = 0, err, rc;
		enum outcome out;

		err = rendezvous(sv, &joined);
		if (err == MR_EABORTED)
			return stop_gracefully(sv, joined, 0);
		if (err == MR_ECLOSED)
			return job_ended(sv, 0);
		if (err == MR_ETIMEDOUT)
			return fail_with(sv, "rendezvous did not complete within join_timeout "
					     "%d ms",
					 cfg->join_timeout_ms);
		if (err)
			return fail_with(sv, "%s", sv->reason);
		atomic_store(&sv->generation, sv->round.generation);
		mr_gauge_set(sv->metrics.generation, sv->round.generation);
		mr_gauge_set(sv->metrics.world_size, sv->round.world_size);
		mr_gauge_set(sv->metrics.node_rank, sv->round.node_rank);
		mr_log_info("round", "gen=%d node_rank=%d nodes=%d world=%d rank_base=%d",
			    sv->round.generation, sv->round.node_rank, sv->round.num_nodes,
			    sv->round.world_size, sv->round.rank_base);
		if (mr_rdzv_hb_start(sv->rdzv, sv->round.generation, cfg->heartbeat_interval_ms,
				     on_latency, sv))
			return fail_with(sv, "unable to start the heartbeat thread");
		err = mr__sv_master_endpoint(sv, maddr, sizeof(maddr), &mport);
		if (err == MR_EABORTED)
			return stop_gracefully(sv, 1, 0);
		if (err == MR_ECLOSED)
			return job_ended(sv, 0);
		if (err == MR_ECONN) {
			mr_rdzv_hb_stop(sv->rdzv);
			return controller_lost(sv, 0);
		}
		if (err) {
			/* the round ended before anything ran: not a restart */
			mr_log_warn("master_endpoint", "err=%s", mr_err_name(err));
			mr_rdzv_hb_stop(sv->rdzv);
			if (err != MR_ESTALE && mr__sv_nap(sv, 200))
				return stop_gracefully(sv, 1, 0);
			continue;
		}
		if ((err = mr__sv_start_workers(sv, maddr, mport, &eb))) {
			mr_rdzv_hb_stop(sv->rdzv);
			fail_job(sv, eb.msg);
			fail_with(sv, "%s", eb.msg);
			/* a job this machine cannot hold fails so on every run */
			return err == MR_ELIMIT ? MR_AGENT_EXIT_USAGE : MR_AGENT_EXIT_FAILED;
		}
		atomic_store(&sv->ready, 1);
		set_state(sv, MR_AGENT_RUNNING);
		mr_log_info("workers_started", "gen=%d n=%d master=%s:%d", sv->round.generation,
			    mr__sv_workers_count(sv), maddr, mport);
		out = monitor(sv, &st);
		mr__sv_record_codes(sv);
		switch (out) {
		case OUT_STOP:
			return stop_gracefully(sv, 1, 1);
		case OUT_ENDED:
			return job_ended(sv, 1);
		case OUT_LOST:
			return controller_lost(sv, 1);
		case OUT_DONE:
			if (mr__sv_inproc_mode(sv))
				mr__sv_report_stats(sv, NULL, 1);
			err = exit_barrier(sv);
			if (err == MR_EABORTED)
				return stop_gracefully(sv, 1, 1);
			if (err == MR_ECLOSED)
				return job_ended(sv, 1);
			if (err == MR_ECONN)
				return controller_lost(sv, 1);
			if (err == MR_ESTALE) {
				rc = stale_restart(sv, why, sizeof(why));
				if (rc)
					return rc;
				continue;
			}
			mr_rdzv_hb_stop(sv->rdzv);
			mr__sv_workers_stop(sv, 0);
			atomic_store(&sv->ready, 0);
			/* completion does not bump the generation: the job succeeds
			 * when every node of the round completed; success is only
			 * claimed once the controller recorded it */
			err = report_complete(sv);
			if (err == MR_ECLOSED)
				return job_ended(sv, 0);
			if (err == MR_EABORTED)
				return stop_gracefully(sv, 1, 0);
			if (err == MR_ECONN)
				return controller_lost(sv, 0);
			if (err == MR_ESTALE) {
				rc = stale_restart(sv, why, sizeof(why));
				if (rc)
					return rc;
				continue;
			}
			if (err)
				return fail_with(sv, "%s", sv->reason);
			sv->reason[0] = '\0';
			set_state(sv, MR_AGENT_SUCCEEDED);
			return MR_AGENT_EXIT_OK;
		case OUT_STALE:
			rc = stale_restart(sv, why, sizeof(why));
			break;
		case OUT_FAILED:
		default:
			reason = mr__sv_worker_reason(sv, st.first_failed_rank);
			snprintf(why, sizeof(why), "rank %d exited with code %d%s%s",
				 st.first_failed_rank, st.first_failed_code, reason[0] ? ": " : "",
				 reason);
			if (mr_agent_config_permanent(cfg, st.first_failed_code)) {
				char msg[sizeof(sv->reason)];

				mr__sv_workers_stop(sv, cfg->grace_period_ms);
				mr_rdzv_hb_stop(sv->rdzv);
				snprintf(msg, sizeof(msg), "%s (permanent: not retried)", why);
				fail_job(sv, msg);
				fail_with(sv, "%s", msg);
				return MR_AGENT_EXIT_USAGE;
			}
			rc = restart(sv, why, "worker_failed", 1, 1);
			break;
		}
		if (rc)
			return rc;
	}
}
