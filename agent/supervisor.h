/*
 * supervisor.h - the agent's lifecycle state machine:
 *
 *   INIT -> JOINING -> WAITING -> RUNNING -> SUCCEEDED
 *                 ^                  |  \-> FAILED
 *                 +--- RESTARTING <--+
 *   (any state) -> STOPPED on SIGTERM/SIGINT
 *
 * JOINING/WAITING: join the controller's forming round and long-poll until
 * it closes (join_timeout bounds both; an unreachable controller is
 * retried with backoff). RUNNING: node rank 0 picks MASTER_PORT and
 * publishes master_addr/master_port in the round's KV, the workers start
 * (exec mode: the command after `--`), heartbeats run on their own thread.
 * RESTARTING: a worker failed with a retryable code, or the controller
 * answered 409 (the generation moved on: a member was lost or added);
 * local workers get SIGTERM, SIGKILL after grace_period, the agent reports
 * the failure and joins again - at most max_restarts times, then FAILED
 * with the reason.
 *
 * Exit-code policy (docs/internals/agent.md): all workers exit 0 ->
 * SUCCEEDED after an exit barrier with the other nodes, once the
 * controller has recorded this node's completion; a code in
 * permanent_exit_codes (default 2, 126, 127: usage error, not executable,
 * not found) -> FAILED at once and exit 2; any other non-zero code or
 * death by signal -> retryable. A job failed by another node or by
 * exhausted restarts exits 1.
 *
 * An unreachable controller (no answer below 500 to any call, heartbeats
 * included) is waited out for controller_timeout; past it the agent stops
 * its workers and FAILS (exit 1) naming the controller. Workers keep
 * running through shorter outages.
 *
 * SIGTERM/SIGINT on the agent (mr_supervisor_stop): workers get the signal
 * (in-process workers are aborted), SIGKILL after grace_period; the agent
 * leaves the rendezvous and exits 0 (SUCCEEDED) only if the controller has
 * recorded the job as succeeded; otherwise it is STOPPED and exits
 * 128 + sig (143 for SIGTERM), so a pod drained mid-job is restarted by
 * its Job/Volcano policy instead of being marked Succeeded.
 *
 * Threading: mr_supervisor_run() on the main thread (it forks the
 * workers); mr_supervisor_stop() is async-signal-safe; the state, ready
 * flag and metrics are readable from any thread (health server).
 *
 * Non-goals: configuration parsing (config.c), HTTP (rdzv.c, http.c).
 */
#ifndef MR_SUPERVISOR_H
#define MR_SUPERVISOR_H

#include <signal.h>
#include <stdatomic.h>

#include "agent_metrics.h"
#include "config.h"
#include "exec.h"
#include "inproc.h"
#include "progress.h"
#include "rdzv.h"

enum mr_agent_state {
	MR_AGENT_INIT = 0,
	MR_AGENT_JOINING,
	MR_AGENT_WAITING,
	MR_AGENT_RUNNING,
	MR_AGENT_RESTARTING,
	MR_AGENT_SUCCEEDED,
	MR_AGENT_FAILED,
	MR_AGENT_STOPPED, /* left on SIGTERM/SIGINT before the job succeeded */
};

/* Process exit codes of meshrun-agent (docs/RELIABILITY.md); a stop by
 * signal N exits 128 + N. */
#define MR_AGENT_EXIT_OK 0
#define MR_AGENT_EXIT_FAILED 1
#define MR_AGENT_EXIT_USAGE 2 /* bad configuration, or a permanent failure here */

struct mr_supervisor {
	const struct mr_agent_config *cfg;
	struct mr_rdzv *rdzv;
	struct mr_exec exec;     /* exec mode workers */
	struct mr_inproc inproc; /* inproc mode workers */
	struct mr_rdzv_opts ropts; /* for per-rank KV clients (inproc) */
	struct mr_agent_metrics metrics;
	struct mr_agent_progress progress; /* inproc ranks' progress for the beats */
	struct mr_worker_stats rank0; /* global rank 0's latest stats, when it is here */
	int have_rank0;
	int64_t shown_step;      /* the progress line's last step, and since when */
	long long shown_since_ms;
	struct mr_rdzv_round round;
	atomic_int state;       /* enum mr_agent_state */
	atomic_int ready;       /* round closed and workers running */
	atomic_int generation;
	atomic_int restarts;
	volatile sig_atomic_t stop_sig; /* signal to forward, 0 = none */
	int health_port;        /* advertised in join; set before run */
	char reason[1024];       /* why FAILED (or what the last restart was for) */
	json_t *plan_json;       /* --mesh auto on an elastic job: this round's planned
				  * workload config (the workers borrow it); owned */
};

const char *mr_agent_state_name(int state);

/* cfg must outlive the supervisor. */
int mr_supervisor_init(struct mr_supervisor *sv, const struct mr_agent_config *cfg,
		       struct mr_errbuf *eb);
void mr_supervisor_release(struct mr_supervisor *sv);
/* Runs the lifecycle to the end; returns the process exit code. */
int mr_supervisor_run(struct mr_supervisor *sv);
/* The job's end for people (event=job_summary, shown at every log level
 * but off): logged by the agent that ran global rank 0 (or, when no rank
 * ran, node 0 of the last round): its state and reason, the steps, the
 * agent's seconds, final and best losses, tokens/s, restarts, checkpoints
 * and where. */
void mr_supervisor_log_summary(const struct mr_supervisor *sv, double seconds);
/* Async-signal-safe: asks the running supervisor to stop with sig. */
void mr_supervisor_stop(struct mr_supervisor *sv, int sig);

#endif
