/*
 * local_int.h - internals of `meshrun local` shared by local.c (options,
 * set-up, the report) and local_pods.c (its processes, supervised as
 * Kubernetes supervises pods).
 *
 * Every process of the local job (the controller, one agent per node) is a
 * struct local_proc: one child in its own mr_exec group (so it can be
 * restarted alone), its command line and environment, its restart count
 * and backoff. Restart policy, as a Job with restartPolicy OnFailure and a
 * podFailurePolicy would have it, bounded per process by --max-restarts
 * with a doubling backoff (LOCAL_BACKOFF_MS up to LOCAL_BACKOFF_MAX_MS):
 *   agent exit 0              done (its part succeeded, recorded)
 *   agent exit 2              done: permanent (config, permanent failure)
 *   agent other exit/signal   restarted, unless the controller says the
 *                             job is over or the local job is stopping
 *   controller exit 2         done: it refuses its data dir (corrupt
 *                             journal, lock held) - the job cannot go on
 *   controller other          restarted on the same port and data dir
 *
 * Non-goals: remote nodes, containers, resource limits.
 */
#ifndef MR_CLI_LOCAL_INT_H
#define MR_CLI_LOCAL_INT_H

#include "exec.h"
#include "mr_err.h"
#include "mr_httpc.h"

#define LOCAL_BACKOFF_MS 250
#define LOCAL_BACKOFF_MAX_MS 8000

struct local_proc {
	struct mr_exec ex;       /* one child: the controller or one agent */
	char **argv;             /* borrowed */
	char **env;              /* borrowed */
	int id;                  /* node index; -1 for the controller */
	int err_fd;              /* where its prefixed stderr goes (-1 = ours) */
	int max_restarts;
	int restarts;            /* restarts so far */
	long backoff_ms;         /* next restart's delay */
	long long restart_at_ms; /* > 0: a restart is due then */
	int pid;                 /* of the last start (for the report line) */
	int code;                /* last exit code; -1 while running / never ran */
	int sig;                 /* the signal that ended it, 0 if it exited */
	int final;               /* will not run again */
};

/* What the controller last said about the job. */
struct local_job {
	const char *name;
	struct mr_httpc *hc;     /* NULL until the controller is known */
	long long generation;
	char state[32];          /* "" until the first answer */
	char reason[512];
};

long long mr__local_now_ms(void);
/* Starts p (again). 0 or an error in eb. */
int mr__local_start(struct local_proc *p, struct mr_errbuf *eb);
/* 1 if p's child exited since the last call (p->code is set), else 0. */
int mr__local_reaped(struct local_proc *p);
/* Decides what follows an exit of p: final, or a restart after backoff
 * (why says which). over: the job is over at the controller; stopping:
 * the local job is being stopped. Prints one line to fd. */
void mr__local_after_exit(struct local_proc *p, int over, int stopping, int fd);
/* Runs p's restart when it is due; a failed start makes p final. */
void mr__local_restart_due(struct local_proc *p, int fd);
/* Asks the controller about the job (timeout_ms per try); prints a line
 * to fd (-1 = none) when its generation or state changed. 0, or an error
 * when the controller did not answer. */
int mr__local_poll_job(struct local_job *j, long timeout_ms, int fd);
/* 1 if the job's last known state is failed or succeeded. */
int mr__local_job_over(const struct local_job *j);
/* "killed by signal 9" or "exited 1" for the last end of p. */
const char *mr__local_end_text(const struct local_proc *p, char *buf, size_t cap);

#endif
