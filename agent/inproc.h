/*
 * inproc.h - in-process workers: one thread per local rank driving a
 * struct mr_worker_ops (runtime/mr_worker.h) - create, step until done,
 * destroy - with a KV of the round for communicator bootstrap.
 *
 * Process mode (rankproc.h): each rank's thread instead starts a worker
 * process of this program running the same loop, and relays its stats,
 * progress and exit code; abort and preempt travel to it over a socket,
 * and one that has not exited kill_ms after an abort is killed. A GPU rank
 * runs so (as torchrun's workers do): a sticky CUDA error poisons the
 * context for the life of the process, and only a fresh process gets a
 * fresh one.
 *
 * Exit codes per local rank mirror exec mode so the supervisor's policy is
 * the same: 0 when the workload finished, 1 when create or a step failed,
 * 128+SIGTERM when it was aborted (mr_inproc_abort).
 *
 * Threading: start/poll/abort/stop from the supervisor thread; abort is
 * also safe from any other thread. Stats are copied under a per-rank lock.
 * Ownership: envs are copied (their strings must outlive the workers:
 * they point into the agent's config); the config JSON is borrowed.
 * Non-goals: restarts (the supervisor stops and starts again).
 */
#ifndef MR_INPROC_H
#define MR_INPROC_H

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "exec.h"
#include "kv_http.h"
#include "mr_worker.h"

struct mr_inproc;

struct mr_inproc_rank {
	struct mr_inproc *owner;
	pthread_t thread;
	int started;
	atomic_int done;
	int code;
	pthread_mutex_t lock; /* state, stats, progress, sock */
	void *state;
	struct mr_worker_env env;
	struct mr_worker_stats stats;
	char err[MR_ERRBUF_SIZE];
	/* process mode */
	pid_t pid;            /* the worker process; 0 before it starts */
	int sock;             /* the agent's end of its socket; -1 when closed */
	int has_progress;     /* progress holds a report */
	struct mr_worker_progress progress;
};

struct mr_inproc_opts {
	int process;          /* 1: a worker process per rank */
	int kill_ms;          /* process mode: SIGKILL this long after an abort */
};

struct mr_inproc {
	const struct mr_worker_ops *ops;
	struct mr_rdzv_opts kvopts;
	int n;
	struct mr_inproc_rank *rank;
	atomic_int aborting;
	int process, kill_ms;
	char exe[4096];       /* process mode: this program */
};

/* Starts n threads; envs[i] describes local rank i (kv is filled here).
 * o may be NULL: threads. */
int mr_inproc_start(struct mr_inproc *ip, const struct mr_worker_ops *ops,
		    const struct mr_worker_env *envs, int n, const struct mr_rdzv_opts *kvopts,
		    const struct mr_inproc_opts *o, struct mr_errbuf *eb);
/* Same summary as exec mode. */
void mr_inproc_poll(struct mr_inproc *ip, struct mr_exec_status *st);
/* Makes every step return MR_EABORTED promptly. */
void mr_inproc_abort(struct mr_inproc *ip);
/* Preempts every rank (struct mr_worker_ops.preempt: a checkpoint at the
 * step's end, then stop; abort without it) and waits up to grace_ms for
 * them to finish. */
void mr_inproc_preempt(struct mr_inproc *ip, int grace_ms);
/* Aborts (if running) and joins every thread; codes and stats stay
 * readable until mr_inproc_stop(). */
void mr_inproc_join(struct mr_inproc *ip);
/* Joins and frees. Zeroed or stopped: no-op. Call before a new start. */
void mr_inproc_stop(struct mr_inproc *ip);
/* Copy of local rank i's latest stats; 0 or MR_ERANGE. */
int mr_inproc_stats(struct mr_inproc *ip, int i, struct mr_worker_stats *out);
/* Local rank i's progress now, read while it runs (mr_worker.h): 0, or
 * MR_ENOTFOUND while the worker is not created (or gone, or reports none),
 * MR_ERANGE for a bad i. */
int mr_inproc_progress(struct mr_inproc *ip, int i, struct mr_worker_progress *out);

/* Where one rank's run publishes its state (NULL once gone) and its stats
 * after each step. */
struct mr__rank_sink {
	void *arg;
	void (*state)(void *arg, void *state);
	void (*stats)(void *arg, const struct mr_worker_stats *st);
};

/* One rank's whole run, in a rank thread or a worker process: a KV client
 * of the round, create, step until done or failed, destroy. Returns its
 * exit code (above); err gets the reason of a failure. */
int mr__rank_run(const struct mr_worker_ops *ops, const struct mr_worker_env *env,
		 const struct mr_rdzv_opts *kvopts, const atomic_int *aborting,
		 const struct mr__rank_sink *sink, char *err, size_t cap);
long long mr__inproc_now_ms(void);

#endif
