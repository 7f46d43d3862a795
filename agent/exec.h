/*
 * exec.h - exec-mode workers: a group of child processes, one per local
 * rank, started from the same command line with per-rank environments.
 *
 * Every child runs in its own process group (so a signal reaches whatever
 * it forks), dies with the agent (PR_SET_PDEATHSIG), and has its stdout
 * and stderr piped back through one pump thread that prefixes every line
 * with "[rank N] " and writes it to the agent's own stdout / stderr with a
 * single write(2). Lines longer than MR_EXEC_LINE_MAX are cut into pieces,
 * each prefixed.
 *
 * Exit codes: a child that exits gets its status; one killed by signal S
 * gets 128 + S (the shell convention); one that could not be executed 127
 * (not found) or 126 (not executable).
 *
 * Threading: start/poll/signal/stop are called from one thread (the
 * supervisor, which should also be the thread that forked: the death
 * signal follows the forking thread). The pump thread is internal.
 *
 * Ownership: the caller owns the struct; mr_exec_stop() reaps everything,
 * joins the pump and closes every descriptor; after it the struct may be
 * started again.
 *
 * Non-goals: environment contents (workenv.h), restart policy
 * (supervisor.c), resource limits, cgroups.
 */
#ifndef MR_EXEC_H
#define MR_EXEC_H

#include <pthread.h>
#include <sys/types.h>

#include "mr_err.h"

#define MR_EXEC_MAX_LOCAL 256
#define MR_EXEC_LINE_MAX 8192

struct mr_exec_child {
	pid_t pid;      /* also the process group id; 0 when not started */
	int rank;       /* global rank, used for the prefix */
	int running;    /* 1 until reaped */
	int code;       /* exit code once reaped (128+sig when signalled) */
	int signal;     /* the signal that killed it once reaped, 0 if it exited */
	int fds[2];     /* read ends of stdout / stderr pipes, -1 when closed */
	char *buf[2];   /* partial line per stream */
	size_t len[2];
};

struct mr_exec {
	int n;
	struct mr_exec_child child[MR_EXEC_MAX_LOCAL];
	pthread_t pump;
	int pump_on;
	int wake[2];  /* wakes the pump: one byte = "finish draining and exit" */
	int out_fd, err_fd; /* where prefixed lines go (default 1, 2) */
	int started;  /* wake pipe exists */
	int signalled; /* a stop signal was already sent (mr_exec_signal) */
	char label[16]; /* prefix word: "rank" by default */
};

/* Summary of mr_exec_poll(). */
struct mr_exec_status {
	int running;     /* children still running */
	int exited;      /* children reaped */
	int failed;      /* reaped with a non-zero code */
	int first_failed_rank;  /* rank of the first failure seen, -1 if none */
	int first_failed_code;
};

/*
 * Starts n children running argv (argv[0] searched in PATH of the agent)
 * with envs[i] as the environment of local rank i and ranks[i] as its
 * global rank. label names the prefix ("[<label> <rank>] "; NULL = "rank";
 * a negative rank prints "[<label>] "). out_fd/err_fd: destinations of the prefixed output (-1 =
 * the agent's 1 / 2). On error every child already started is killed and
 * reaped; eb says which step failed.
 */
int mr_exec_start(struct mr_exec *ex, char *const *argv, int n, char **const *envs,
		  const int *ranks, const char *label, int out_fd, int err_fd, struct mr_errbuf *eb);
/*
 * fork(2) for a child that will execute a worker: the parent's signal
 * mask is full across the fork, and the child resets every handler to its
 * default before it unblocks. Without it a stop signal sent to the new
 * process group before the child had reset its handlers ran the agent's
 * own handler in the child: the agent then read it as its own SIGTERM and
 * the worker lived on. After fork in the child: async-signal-safe calls
 * only.
 */
pid_t mr_exec_fork(void);
/* Reaps children that exited (non-blocking) and summarises. */
void mr_exec_poll(struct mr_exec *ex, struct mr_exec_status *st);
/* Sends sig to the process group of every running child. */
void mr_exec_signal(struct mr_exec *ex, int sig);
/*
 * Stops the group: SIGTERM (unless every child already exited, or
 * mr_exec_signal already sent a signal since start), waits up to grace_ms
 * for all to exit, then SIGKILL; reaps all, kills stragglers
 * left in their process groups, drains and joins the pump. Safe to call on
 * a struct that was never started (zeroed) or already stopped.
 */
void mr_exec_stop(struct mr_exec *ex, int grace_ms);
/* Waits up to timeout_ms (-1 = forever) for every child to exit on its
 * own; returns 0 when all exited, MR_ETIMEDOUT otherwise. Reaps. */
int mr_exec_wait(struct mr_exec *ex, int timeout_ms);

/* 128+sig / exit status for a wait status. */
int mr_exec_code(int wstatus);

#endif
