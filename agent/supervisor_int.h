/*
 * supervisor_int.h - internals shared by supervisor.c (the lifecycle state
 * machine) and workers.c (the local workers of a round).
 */
#ifndef MR_SUPERVISOR_INT_H
#define MR_SUPERVISOR_INT_H

#include <stddef.h>

#include "supervisor.h"

#define POLL_MS 20
#define SLICE_MS 1000     /* long-poll slice: stop requests are seen this fast */
#define BACKOFF_MAX_MS 2000
#define KEY_MASTER_ADDR "master_addr"
#define KEY_MASTER_PORT "master_port"
#define KEY_EXIT_COUNT "meshrun/exit_barrier"
#define KEY_EXIT_DONE "meshrun/exit_done"

/* Monotonic milliseconds. */
long long mr__sv_now_ms(void);
/* 1 once the controller has not answered for controller_timeout (the
 * reason then names it), else 0. */
int mr__sv_controller_lost(struct mr_supervisor *sv);
/* Sleeps ms, waking early on a stop request; 1 if stopping. */
int mr__sv_nap(struct mr_supervisor *sv, long ms);

/* Reads key of the round, long-polling in slices; 0, MR_ESTALE,
 * MR_EABORTED, MR_ETIMEDOUT or another error. */
int mr__sv_kv_wait(struct mr_supervisor *sv, const char *key, char *buf, size_t cap,
		   long timeout_ms);
/* MASTER_ADDR/MASTER_PORT: chosen by node rank 0, read by the others. */
int mr__sv_master_endpoint(struct mr_supervisor *sv, char *addr, size_t cap, int *port);
/* 1 when the workers are in-process threads (no command). */
int mr__sv_inproc_mode(const struct mr_supervisor *sv);
/* Starts this round's local workers; master endpoint from node rank 0. */
int mr__sv_start_workers(struct mr_supervisor *sv, const char *maddr, int mport,
			 struct mr_errbuf *eb);
void mr__sv_workers_poll(struct mr_supervisor *sv, struct mr_exec_status *st);
void mr__sv_workers_signal(struct mr_supervisor *sv, int sig);
/* The agent is being stopped (pod eviction): in-process ranks write a
 * checkpoint with the whole job and stop, within the grace period; exec
 * workers get sig. */
void mr__sv_workers_preempt(struct mr_supervisor *sv, int sig);
int mr__sv_workers_count(const struct mr_supervisor *sv);
/* Why in-process rank `rank` (global) failed, "" when unknown (exec mode,
 * not this node's, still running). */
const char *mr__sv_worker_reason(const struct mr_supervisor *sv, int rank);
/* Records every local worker's exit code in the metrics. */
void mr__sv_record_codes(struct mr_supervisor *sv);
/* Stops the workers (grace for exec mode) and records their codes; the
 * in-process state stays readable until the next start. */
void mr__sv_workers_stop(struct mr_supervisor *sv, int grace_ms);
/* In-process stats into metrics; a progress line per second (rank 0 of
 * this node), so `meshrun local` shows training. */
void mr__sv_report_stats(struct mr_supervisor *sv, long long *last, int final);

#endif
