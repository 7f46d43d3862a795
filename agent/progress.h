/*
 * progress.h - this node's ranks' progress for the controller (hang
 * diagnosis and stragglers, docs/DIAGNOSIS.md): read from the in-process
 * workers at each heartbeat and sent as the beat's "progress" when it
 * changed, and in full on request (the first beat of a generation, after
 * a failed beat, every few beats) so a restarted controller learns it
 * again. A stuck job sends nothing new: its beats stay small.
 *
 * Per rank: the step and micro-batch it is in, each communicator's group
 * and last operation entered and completed (runtime/mr_worker.h), and the
 * mean step and busy time (step minus time blocked in communication) of
 * the steps finished since the last report - what straggler detection
 * compares. O(ranks x groups) per beat.
 *
 * Exec mode: nothing is attached and nothing is sent; worker processes
 * are opaque.
 *
 * Threading: attach, detach and step from the supervisor thread, json from
 * the heartbeat thread; one mutex. The workers are read only while
 * attached, so detach before stopping (freeing) them.
 * Ownership: the struct is the caller's; release frees what attach
 * allocated. The json is the caller's to decref.
 */
#ifndef MR_AGENT_PROGRESS_H
#define MR_AGENT_PROGRESS_H

#include <pthread.h>
#include <jansson.h>

#include "inproc.h"

struct mr_agent_prank {
	int rank;
	int64_t step_seen;           /* worker stats step already counted */
	double sum_step_s, sum_busy_s; /* steps finished since the last report */
	int nsteps;
	int have_sent;
	struct mr_worker_progress sent; /* as last reported */
};

struct mr_agent_progress {
	pthread_mutex_t lock;
	struct mr_inproc *ip; /* attached workers, or NULL */
	int n;
	struct mr_agent_prank *r;
};

void mr_agent_progress_init(struct mr_agent_progress *p);
void mr_agent_progress_release(struct mr_agent_progress *p);
/* Reads ip's workers from now on (a new round: nothing sent yet). */
int mr_agent_progress_attach(struct mr_agent_progress *p, struct mr_inproc *ip);
void mr_agent_progress_detach(struct mr_agent_progress *p);
/* Local rank i finished a step: st is its latest stats (repeats of a step
 * already seen are ignored). */
void mr_agent_progress_step(struct mr_agent_progress *p, int i, const struct mr_worker_stats *st);
/* The heartbeat's "progress" array: every attached rank, when any rank
 * changed or finished steps since the last call, or full is set; else
 * NULL (also when nothing is attached). */
json_t *mr_agent_progress_json(struct mr_agent_progress *p, int full);

#endif
