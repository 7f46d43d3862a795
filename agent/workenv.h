/*
 * workenv.h - the environment of an exec-mode worker process.
 *
 * A struct mr_workenv is a growable "KEY=VALUE" array, started from a base
 * environment (usually environ) and overridden key by key, ready for
 * execve(). mr_workenv_torchrun() applies torchrun's contract for one local
 * rank (RANK, LOCAL_RANK, WORLD_SIZE, ..., MASTER_ADDR/PORT,
 * TORCHELASTIC_*), plus meshrun's own MESHRUN_* mesh variables, so a script
 * written for torchrun runs unchanged under meshrun-agent.
 *
 * Ownership: the struct owns every string and the array; release with
 * mr_workenv_release(). Bounds: MR_WORKENV_MAX entries, each at most
 * MR_WORKENV_ENTRY_MAX bytes (MR_ELIMIT past either).
 *
 * Non-goals: process creation (exec.c), shell quoting.
 */
#ifndef MR_WORKENV_H
#define MR_WORKENV_H

#include <stddef.h>

#include "mr_err.h"
#include "mr_worker.h"

#define MR_WORKENV_MAX 4096
#define MR_WORKENV_ENTRY_MAX 65536

struct mr_workenv {
	char **v; /* NULL-terminated, n entries */
	size_t n, cap;
};

/* What torchrun's contract needs beyond struct mr_worker_env. */
struct mr_workenv_extra {
	const char *role;        /* ROLE_NAME, e.g. "default" */
	int max_restarts;        /* TORCHELASTIC_MAX_RESTARTS */
	const char *master_addr; /* MASTER_ADDR */
	int master_port;         /* MASTER_PORT */
};

/* Copies base (NULL-terminated, may be NULL) into e. */
int mr_workenv_init(struct mr_workenv *e, char *const *base);
void mr_workenv_release(struct mr_workenv *e);
/* Sets or replaces key; value is formatted. */
int mr_workenv_set(struct mr_workenv *e, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Removes key if present. */
void mr_workenv_unset(struct mr_workenv *e, const char *key);
/* Value of key, or NULL. Points into e. */
const char *mr_workenv_get(const struct mr_workenv *e, const char *key);

/*
 * Applies the torchrun variables and MESHRUN_* for rank w->rank:
 *   RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE
 *   ROLE_NAME ROLE_RANK ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT
 *   TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID
 *   OMP_NUM_THREADS=1 when local_world_size > 1 and not already set
 *   MESHRUN_JOB MESHRUN_GENERATION MESHRUN_NODE_RANK MESHRUN_HOST_ID
 *   MESHRUN_TP MESHRUN_PP MESHRUN_CP MESHRUN_EP MESHRUN_DP (sizes) and
 *   MESHRUN_{TP,PP,CP,DP,EP}_RANK (this rank's coordinates).
 */
int mr_workenv_torchrun(struct mr_workenv *e, const struct mr_worker_env *w,
			const struct mr_workenv_extra *x);

#endif
