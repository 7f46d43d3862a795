/*
 * rankproc.h - a rank in a worker process of its own (inproc.h's process
 * mode): the agent's side, run by the rank's thread, and the worker's
 * side, which is this program started again as
 *
 *   <program> __rank-worker     (fd 3: a socket to the agent)
 *
 * Protocol over the socket (one machine, one binary: structs travel as
 * bytes). The agent sends a u32 length and a JSON object - the workload's
 * name, the log level, the rank's env, its config and the KV client's
 * options - then single bytes: 'a' abort, 'p' preempt; its socket closing
 * is an abort too. The worker sends records, a u32 kind and a u32 length
 * then the payload: STATS after every step, PROGRESS five times a second
 * while the workload lives (empty: gone), END with its exit code and the
 * reason of a failure, then exits with that code. A worker that dies
 * without END (a signal, a crash) gets the shell's code (128 + signal).
 *
 * The worker runs in its own process group (the terminal's ^C reaches the
 * agent, which aborts it) and dies with its rank thread (PR_SET_PDEATHSIG).
 */
#ifndef MR_RANKPROC_H
#define MR_RANKPROC_H

#include "inproc.h"

#define MR_RANK_WORKER_ARG "__rank-worker"

/* Finds this program for the workers; fills ip->exe. */
int mr__rankproc_prepare(struct mr_inproc *ip, struct mr_errbuf *eb);
/* The rank thread's body: starts the worker, relays what it reports
 * into r until it exits; returns its exit code (r->err: the reason). */
int mr__rankproc_run(struct mr_inproc_rank *r);
/* Sends 'a' or 'p' to r's worker if it runs; call under r->lock. */
void mr__rankproc_tell(struct mr_inproc_rank *r, char what);

/* The worker's main (argv[1] is MR_RANK_WORKER_ARG): returns its exit
 * code. */
int mr_rank_worker_main(void);

#endif
