/*
 * ctl.h - the controller core: the operations on its state (state/
 * state.h) - jobs, members, rounds, generations, the per-job KV store,
 * suspended waiters, the ranks' progress - and the journal hooks.
 *
 * Everything here runs on one thread (the mr_httpd loop thread), Redis
 * style, so nothing is locked. The core knows nothing about HTTP: an
 * operation fills a struct ctl_res (reply.h: status, error
 * code/field/message or a JSON body or raw bytes) and, for long-polls,
 * registers a struct ctl_waiter holding an opaque request pointer; when a
 * waiter is woken later the core calls ctl->wake(ctl, req, res) and the
 * API layer replies.
 *
 * Every mutation is applied in memory and recorded in the journal batch
 * (records.c encodes, journal/journal.h frames); the server writes and
 * fsyncs the batch before any reply that shows it leaves (group commit).
 * Replay decodes the records through records.c's table and calls the same
 * apply functions with ctl->replaying set, so live and replayed state
 * transitions cannot drift apart.
 *
 * Ownership: struct ctl owns every job and its journal (ctl->jr); a job
 * owns its members, KV entries and waiter records; a waiter does not own
 * its request.
 *
 * Non-goals: sockets, parsing HTTP, authentication (api/routes.c),
 * metrics rendering (api/server.c), the diagnosis (diag/).
 */
#ifndef MR_CTL_H
#define MR_CTL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "mr_err.h"
#include "reply.h"
#include "state/names.h"
#include "state/state.h"

/* ---- lifecycle (job.c; tick and touch_all in round.c) ---- */
void mr__ctl_init(struct ctl *ctl, const struct ctl_limits *lim);
/* Frees every job; waiters are dropped without wake. */
void mr__ctl_release(struct ctl *ctl);
int64_t mr__ctl_now_ms(void);
/* Timers: last-call, heartbeat expiry, waiter deadlines. */
void mr__ctl_tick(struct ctl *ctl);
/* Gives every member a full heartbeat timeout (after restart), and
 * restarts the last-call window of forming rounds that reached min. */
void mr__ctl_touch_all(struct ctl *ctl);

/* ---- spec and names (parse.c) ---- */
int mr__ctl_valid_node_id(const char *s);
int mr__ctl_valid_key(const char *s, size_t len);
/* Fills spec from a JSON object (defaults from lim); 0 or error in res
 * (400 with the field). name gets the "ns/name" (borrowed from obj). */
int mr__ctl_parse_spec(const json_t *obj, const struct ctl_limits *lim,
		       struct ctl_spec *spec, const char **name, struct ctl_res *res);
/* 1 if the mesh fits n nodes. */
int mr__ctl_mesh_fits(const struct ctl_spec *s, int32_t n, int32_t *dp);
json_t *mr__ctl_spec_json(const struct ctl_spec *s);

/* ---- jobs (job.c) and rounds (round.c) ---- */
struct ctl_join {
	const char *node_id, *host, *host_id, *ports; /* ports: JSON text or NULL */
	const char *topology;                         /* or NULL */
	int32_t pod_index;
	const struct ctl_spec *spec; /* optional: create the job */
};

struct ctl_job *mr__ctl_job(struct ctl *ctl, const char *name);
void mr__ctl_job_create(struct ctl *ctl, const char *name, const struct ctl_spec *spec,
			struct ctl_res *res);
void mr__ctl_job_delete(struct ctl *ctl, const char *name, struct ctl_res *res);
json_t *mr__ctl_job_json(const struct ctl_job *job);
void mr__ctl_join(struct ctl *ctl, const char *name, const struct ctl_join *j,
		  struct ctl_res *res);
/* timeout_ms 0 = answer at once. */
void mr__ctl_wait(struct ctl *ctl, const char *name, const char *node_id, int64_t gen,
		  int64_t timeout_ms, void *req, struct ctl_res *res);
/* progress: the member's ranks (docs/API.md), NULL when not sent; checked
 * with mr__ctl_progress_check first. */
void mr__ctl_heartbeat(struct ctl *ctl, const char *name, const char *node_id, int64_t gen,
		       const json_t *progress, struct ctl_res *res);
/* failure: 1 = "fail" (counts a restart, member stays), 0 = "leave". */
void mr__ctl_leave(struct ctl *ctl, const char *name, const char *node_id, int64_t gen,
		   int failure, struct ctl_res *res);
/* "fail" with permanent: the job becomes failed at once (any member state,
 * any generation); reason may be NULL. */
void mr__ctl_fail_job(struct ctl *ctl, const char *name, const char *node_id,
		      const char *reason, struct ctl_res *res);
/* A running member finished: it becomes done (no bump); when no member of
 * the round is still running, the job becomes succeeded. */
void mr__ctl_complete(struct ctl *ctl, const char *name, const char *node_id, int64_t gen,
		      struct ctl_res *res);
/* A member of the job's current round (waiting, running or standby)
 * that called with an older generation: the 409 in res also carries
 * "member", what a wait would answer it now (docs/API.md). Nothing for
 * another member or reply; no state changes. */
void mr__ctl_stale_member(const struct ctl_job *job, const char *node_id,
			  struct ctl_res *res);
/* 1 if the job is failed or succeeded. */
int mr__ctl_job_over(const struct ctl_job *job);
json_t *mr__ctl_member_json(const struct ctl_member *m);
/* Moves m to state st, keeping the job's counters and min_reached. */
void mr__ctl_set_state(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m, int st);
/* Starts/stops the last-call window from the number of waiting members. */
void mr__ctl_update_min(struct ctl *ctl, struct ctl_job *job);
/* last_seen = now (heard from), moved to the tail of the job's expiry
 * list. */
void mr__ctl_member_touch(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m);
/* Resolves the job for a per-generation call: 404/410/409 in res. gen < 0
 * means "not given". */
struct ctl_job *mr__ctl_job_for(struct ctl *ctl, const char *name, int64_t gen,
				struct ctl_res *res);
/* The same for a call naming a member (node_id may be NULL): a 409 also
 * says where that member stands (mr__ctl_stale_member); a running member
 * of the job's round that calls is confirmed (it knows its rank). */
struct ctl_job *mr__ctl_job_for_member(struct ctl *ctl, const char *name, int64_t gen,
				       const char *node_id, struct ctl_res *res);

/* apply functions shared by live paths and replay */
struct ctl_job *mr__ctl_apply_job(struct ctl *ctl, const char *name, const struct ctl_spec *spec,
				  uint64_t gen, int state, int32_t restarts, uint64_t rounds,
				  uint64_t kv_seq, int32_t num_nodes);
void mr__ctl_apply_job_delete(struct ctl *ctl, struct ctl_job *job);
/* Adds or updates the member `who` describes (its spec is ignored). */
struct ctl_member *mr__ctl_apply_member(struct ctl *ctl, struct ctl_job *job,
					const struct ctl_join *who, int state, int32_t node_rank);
void mr__ctl_apply_member_delete(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m);
void mr__ctl_apply_close(struct ctl *ctl, struct ctl_job *job, int32_t n);
/* failed: the bump exceeded max_restarts; reason (may be NULL) says why.
 * carry: the live running and standby members go on waiting in the new
 * round (live: a parked wait, or heard from within half the heartbeat
 * timeout; while replaying every one of them, and the records after the
 * bump make the others stale); the rest become stale. */
void mr__ctl_apply_bump(struct ctl *ctl, struct ctl_job *job, uint64_t gen, int32_t restarts,
			int failed, const char *reason, int carry);
/* Makes the job terminal (CTL_JOB_FAILED or CTL_JOB_SUCCEEDED) with a
 * reason (copied, truncated to CTL_MAX_REASON) and answers every parked
 * call of the job 410 job_failed / job_succeeded. */
void mr__ctl_apply_end(struct ctl *ctl, struct ctl_job *job, int state, const char *reason);
/* Sets job->reason (copy, truncated); NULL clears it. */
void mr__ctl_set_reason(struct ctl_job *job, const char *reason);

/* ---- progress, hangs and stragglers (progress.c; the diagnosis is diag/) ---- */
/* The shape of a heartbeat's "progress" (types, bounds, at most max_ranks
 * ranks): 0 or 400 invalid_field in res naming the element. */
int mr__ctl_progress_check(const json_t *p, int32_t max_ranks, struct ctl_res *res);
/* Stores a running member's report (ranks must be the member's): O(its
 * ranks x groups). 0, or 400 in res. */
int mr__ctl_progress_apply(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m,
			   const json_t *p, struct ctl_res *res);
/* Forgets m's progress (it left the running state or the job). */
void mr__ctl_progress_drop(struct ctl *ctl, struct ctl_job *job, struct ctl_member *m);
/* A new generation or the end: no progress, nothing stuck. */
void mr__ctl_diag_reset(struct ctl_job *job);
void mr__ctl_diag_free(struct ctl_job *job);
/* Timers of one running job: the median, the hang report. */
void mr__ctl_diag_tick(struct ctl *ctl, struct ctl_job *job);
/* Small summary for the job view: stuck, seconds without progress,
 * stragglers (bounded). NULL when the job has no progress state. */
json_t *mr__ctl_health_json(const struct ctl *ctl, const struct ctl_job *job);

/* ---- KV (kv.c) ---- */
struct ctl_put {
	const void *val;
	size_t len;
	int64_t if_match;  /* -1 = none */
	int if_none_match; /* 1 = only if absent */
};
void mr__ctl_kv_put(struct ctl *ctl, struct ctl_job *job, const char *key,
		    const struct ctl_put *p, struct ctl_res *res);
void mr__ctl_kv_get(struct ctl *ctl, struct ctl_job *job, const char *key, int64_t wait_ms,
		    void *req, struct ctl_res *res);
/* The same for a caller naming its node (node_id may be NULL): a parked
 * GET answered 409 by a bump says where that member stands. */
void mr__ctl_kv_get_as(struct ctl *ctl, struct ctl_job *job, const char *key, int64_t wait_ms,
		       const char *node_id, void *req, struct ctl_res *res);
void mr__ctl_kv_add(struct ctl *ctl, struct ctl_job *job, const char *key, int64_t delta,
		    struct ctl_res *res);
void mr__ctl_kv_delete(struct ctl *ctl, struct ctl_job *job, const char *key,
		       struct ctl_res *res);
void mr__ctl_kv_list(struct ctl *ctl, struct ctl_job *job, const char *prefix, size_t offset,
		     size_t limit, struct ctl_res *res);
/* apply functions (also replay) */
int mr__ctl_apply_kv_put(struct ctl *ctl, struct ctl_job *job, const char *key,
			 const void *val, size_t len, uint64_t version);
void mr__ctl_apply_kv_del(struct ctl *ctl, struct ctl_job *job, const char *key);
void mr__ctl_kv_clear(struct ctl *ctl, struct ctl_job *job);

/* ---- waiters (waiter.c) ---- */
/* New waiter parked on job (and member/key); NULL on OOM. */
struct ctl_waiter *mr__ctl_waiter_add(struct ctl *ctl, struct ctl_job *job, void *req,
				      int kind, int64_t timeout_ms);
/* Unlinks and frees w after calling ctl->wake with res (res->body is
 * stolen). */
void mr__ctl_waiter_finish(struct ctl *ctl, struct ctl_waiter *w, struct ctl_res *res);
/* Answers every waiter of job with a copy of the given error. */
void mr__ctl_waiters_fail(struct ctl *ctl, struct ctl_job *job, int status, const char *code,
			  const char *field, json_t *extra, const char *msg);
void mr__ctl_waiters_expire(struct ctl *ctl);
/* Wakes waiters of job/key with the KV entry. */
void mr__ctl_waiters_kv(struct ctl *ctl, struct ctl_job *job, const struct ctl_kv *e);

/* ---- journal records (records.c): the state's side of the journal ---- */
struct ctl_jbuf;
struct ctl_jr_scan;
struct ctl_journal_opts;
struct ctl_journal_info;

/* Called by the apply functions: append a record of the change to the
 * journal's batch. No-ops when ctl->jr is NULL or ctl->replaying. */
void mr__rec_job(struct ctl *ctl, const struct ctl_job *job);
void mr__rec_job_delete(struct ctl *ctl, const char *name);
void mr__rec_member(struct ctl *ctl, const struct ctl_job *job, const struct ctl_member *m);
void mr__rec_member_delete(struct ctl *ctl, const struct ctl_job *job, const char *node_id);
void mr__rec_close(struct ctl *ctl, const struct ctl_job *job, int32_t n);
void mr__rec_bump(struct ctl *ctl, const struct ctl_job *job, int carry);
void mr__rec_end(struct ctl *ctl, const struct ctl_job *job);
/* The journal batch records go into now; 0 while replaying or without a
 * journal (state that is durable already). */
uint64_t mr__rec_seq(const struct ctl *ctl);
void mr__rec_kv_put(struct ctl *ctl, const struct ctl_job *job, const struct ctl_kv *e);
void mr__rec_kv_del(struct ctl *ctl, const struct ctl_job *job, const char *key);
/* Opens the journal of o->dir into ctl->jr: locks the dir, replays it
 * through the record table, compacts it (mr__jr_open; same errors). */
int mr__ctl_journal_open(struct ctl *ctl, const struct ctl_journal_opts *o,
			 struct ctl_journal_info *info, struct mr_errbuf *eb);
/* Frees ctl->jr (no commit; the lock is released) and sets it NULL. */
void mr__ctl_journal_close(struct ctl *ctl);
/* Replays framed records from memory into ctl (tests, fuzzing). */
void mr__ctl_replay(struct ctl *ctl, const unsigned char *buf, size_t len,
		    struct ctl_jr_scan *scan);
/* Appends the whole state as records (a snapshot) to out: 0 or
 * MR_ENOMEM. */
int mr__ctl_snapshot(struct ctl *ctl, struct ctl_jbuf *out);

#endif
