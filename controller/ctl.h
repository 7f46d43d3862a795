/*
 * ctl.h - the controller core: jobs, members, rounds, generations, the
 * per-job KV store, suspended waiters and the journal hooks.
 *
 * Everything here runs on one thread (the mr_httpd loop thread), Redis
 * style, so nothing is locked. The core knows nothing about HTTP: an
 * operation fills a struct ctl_res (status, error code/field/message or a
 * JSON body or raw bytes) and, for long-polls, registers a struct
 * ctl_waiter holding an opaque request pointer; when a waiter is woken
 * later the core calls ctl->wake(ctl, req, res) and the API layer replies.
 *
 * Every mutation is applied in memory and recorded in the journal batch
 * (records.c encodes, journal.h frames); the server writes and fsyncs the
 * batch before any reply that shows it leaves (group commit). Replay
 * decodes the records through records.c's table and calls the same apply
 * functions with ctl->replaying set, so live and replayed state
 * transitions cannot drift apart.
 *
 * Ownership: struct ctl owns every job and its journal (ctl->jr); a job
 * owns its members, KV entries and waiter records; a waiter does not own
 * its request.
 *
 * Non-goals: sockets, parsing HTTP, authentication (api.c), metrics
 * rendering (server.c).
 */
#ifndef MR_CTL_H
#define MR_CTL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "mr_dict.h"
#include "mr_err.h"

#define CTL_MAX_KEY 256
#define CTL_MAX_NODE_ID 253
#define CTL_MAX_HOST 253
#define CTL_MAX_PORTS_JSON 1024
#define CTL_MAX_WAIT_MS 300000
#define CTL_MAX_REASON 1024 /* bytes of a terminal job's reason, NUL included */

/* FAILED and SUCCEEDED are terminal: only GET and DELETE of the job work. */
enum ctl_job_state { CTL_JOB_FORMING, CTL_JOB_RUNNING, CTL_JOB_FAILED, CTL_JOB_SUCCEEDED };
enum ctl_member_state {
	CTL_M_WAITING, /* joined the forming round */
	CTL_M_RUNNING, /* in the closed round: has a node rank */
	CTL_M_STANDBY, /* joined a full running job: enters the next round */
	CTL_M_STALE,   /* member of an older generation that has not rejoined */
	CTL_M_DONE,    /* was running, reported completion (no bump) */
	CTL_M_NSTATES
};
enum ctl_waiter_kind { CTL_W_ROUND, CTL_W_KV };

struct ctl_spec {
	int32_t min_nodes, max_nodes, nproc_per_node;
	int32_t tp, pp, cp, ep, dp; /* dp 0 = derived */
	int32_t last_call_ms, heartbeat_timeout_ms, max_restarts;
	int32_t hang_timeout_ms;    /* no progress this long: stuck (0 = never) */
	int32_t straggler_pct;      /* busy time above this % of the median: a
				     * straggler (0 = never) */
	int32_t rank_order;         /* enum ctl_rank_order */
};

/* How a closing round numbers its nodes (mr_topo.h). */
enum ctl_rank_order {
	CTL_ORDER_INDEX = 0,    /* pod index when every member has one, else node id */
	CTL_ORDER_TOPOLOGY = 1, /* topology path first, then as INDEX */
};

struct ctl_job;
struct ctl_member;

/* ---- progress of the ranks (progress.c): volatile, never journaled ---- */
#define CTL_MAX_PGROUPS 16    /* communicators per rank in a report */
#define CTL_MAX_STRAGGLERS 16 /* flagged ranks listed per job (all are counted) */
#define CTL_HIST_BINS 480     /* busy-time histogram: 5 % bins from 10 us */
#define CTL_STRAGGLER_REPORTS 3 /* consecutive reports above (below) the limit
				 * to flag (clear) a straggler */
#define CTL_STRAGGLER_MIN_MS 1.0 /* and at least this much above the median:
				  * scheduler noise on sub-ms steps is no straggler */

/* One communicator of a rank: the last operation entered and how many of
 * them are still unfinished (entered - completed, saturated). */
struct ctl_pgroup {
	uint64_t entered;
	uint32_t gap;
	int32_t id;   /* group id among its kind (mesh), or lowest rank (hsdp) */
	int32_t peer; /* entered p2p: the peer's index in the group, else -1 */
	uint8_t kind; /* enum mr_mesh_group, or MR_WORKER_GROUP_* (mr_names.h) */
	uint8_t op;   /* enum mr_comm_op (mr_names.h) of the entered operation */
};

struct ctl_prank {
	int64_t step;
	int64_t changed_ms; /* when its progress last changed, controller clock */
	int32_t rank, micro;
	float busy_ms;      /* mean busy time per step (step minus comm wait), < 0 unknown */
	float step_ms;      /* mean step time, < 0 unknown */
	uint16_t goff;      /* its groups: member's g[goff .. goff + ngroups) */
	uint16_t hbin;      /* histogram bin it is counted in, CTL_HIST_BINS = none */
	uint8_t ngroups;
	uint8_t streak;     /* consecutive reports across the straggler limit */
	uint8_t flagged;    /* a straggler */
};

/* A running member's ranks (one allocation). */
struct ctl_mprog {
	uint16_t nr, ng;
	struct ctl_pgroup *g; /* ng entries, after r[] */
	struct ctl_prank r[];
};

struct ctl_straggler {
	struct ctl_member *m;
	int32_t rank;
	float busy_ms, median_ms;
};

/* A job's diagnosis state (allocated at its first progress report). */
struct ctl_jdiag {
	int64_t progress_ms;   /* last change of any rank's progress; 0 = none yet */
	int64_t stuck_ms;      /* when the hang was reported; 0 = not stuck */
	uint32_t ranks;        /* ranks with progress */
	char stuck_group[64];  /* the primary culprit of the reported hang */
	int32_t stuck_rank;    /* -1: none named */
	uint32_t hist[CTL_HIST_BINS]; /* ranks by busy time */
	uint32_t hist_n;
	float median_ms;       /* lower median of hist; 0 = unknown */
	int64_t median_at_ms;
	uint8_t hist_dirty;
	uint32_t nstragglers;  /* flagged ranks (all of them) */
	uint32_t nlisted;
	struct ctl_straggler strag[CTL_MAX_STRAGGLERS];
};

struct ctl_waiter {
	void *req;                 /* opaque, owned by the API layer */
	struct ctl_job *job;
	struct ctl_member *member; /* CTL_W_ROUND */
	char *key;                 /* CTL_W_KV: owned copy (with node after it) */
	const char *node;          /* CTL_W_KV: the caller's node id (in key's
				    * allocation), or NULL */
	int64_t deadline_ms;
	size_t heap_idx;
	uint8_t kind;
	struct ctl_waiter *prev, *next;   /* all waiters of the job */
	struct ctl_waiter *kprev, *knext; /* waiters of one key */
};

struct ctl_member {
	char *node_id; /* owned; the members dict borrows it */
	char *host, *host_id, *ports; /* owned, may be NULL; ports is JSON */
	char *topology;               /* owned, may be NULL (mr_topo.h) */
	int32_t pod_index;            /* -1 = none */
	int32_t node_rank;            /* -1 until the round closes */
	uint8_t state;                /* enum ctl_member_state */
	uint8_t confirmed;            /* running, and told so (wait/heartbeat) */
	uint8_t heard;                /* last_seen is a call of it, not the grace
				       * every member gets at a controller start */
	int64_t last_seen_ms;
	struct ctl_member *lru_prev, *lru_next; /* ordered by last_seen */
	struct ctl_waiter *waiter;              /* suspended wait, or NULL */
	struct ctl_mprog *prog;                 /* running: its ranks' progress, or NULL */
};

struct ctl_kv {
	char *key; /* points into this allocation; the kv dict borrows it */
	uint64_t version;
	uint32_t len;
	unsigned char data[]; /* len bytes, then the key's bytes + NUL */
};

struct ctl_waitq { /* value of job->kvwait */
	struct ctl_waiter *head;
	char key[];
};

struct ctl_job {
	char *name; /* "ns/name", owned; the jobs dict borrows it */
	struct ctl_spec spec;
	uint64_t generation;
	uint8_t state; /* enum ctl_job_state */
	char *reason;  /* why the job is failed/succeeded, owned; NULL otherwise */
	int32_t restarts;
	uint64_t rounds;
	struct mr_dict members;
	struct ctl_member *lru_head, *lru_tail;
	uint32_t count[CTL_M_NSTATES];
	int64_t min_reached_ms; /* 0 = fewer than min_nodes waiting */
	int32_t num_nodes, world_size, dp; /* of the closed round */
	uint64_t gen_seq; /* journal batch of the last record of the job itself, its
			   * round close or bump: what a 409 or a rank shows */
	uint64_t member_seq; /* journal batch of the last member record of the job */
	struct mr_dict kv;
	uint64_t kv_seq;
	size_t kv_bytes;
	struct mr_dict kvwait; /* key -> struct ctl_waitq */
	struct ctl_waiter *waiters;
	struct ctl_jdiag *diag; /* progress, hang and stragglers; NULL until reported */
	uint8_t all_silent;     /* every running member silent: logged (round.c) */
};

struct ctl_limits {
	size_t max_value;        /* bytes per KV value */
	uint32_t max_keys;       /* KV keys per job */
	uint32_t max_members;    /* members per job */
	uint32_t max_jobs;
	struct ctl_spec defaults; /* last_call/heartbeat/max_restarts defaults */
};

struct ctl_res {
	int status;           /* HTTP status */
	const char *code;     /* error code, NULL on success */
	const char *field;    /* offending field (points at fieldbuf), may be NULL */
	char fieldbuf[128];
	char msg[256];
	json_t *body;         /* success body, or extra top-level error fields; owned */
	char *text;           /* instead of body, written directly (jtext.c): the
			       * success body, or the extra fields of an error
			       * without braces ("generation":2,...); owned */
	size_t text_len;
	const void *raw;      /* raw success body (KV value), borrowed */
	size_t raw_len;
	uint64_t etag;        /* 0 = none */
	int suspended;        /* the request was parked as a waiter */
	/* dep_set: the reply shows only state recorded in journal batches up
	 * to dep_seq (mr__jr_seq), so it leaves as soon as that batch is on
	 * disk; unset, it waits for every batch collected or in flight.
	 * mr__res_ok/mr__res_err clear it. */
	int dep_set;
	uint64_t dep_seq;
};

struct ctl_stats {
	uint64_t joins, rounds, dead, bumps;
	uint64_t hangs, stragglers; /* reported (events) */
};

struct ctl_journal;

struct ctl {
	struct ctl_limits lim;
	struct mr_dict jobs;
	struct ctl_waiter **heap; /* min-heap by deadline */
	size_t heap_len, heap_cap;
	struct ctl_journal *jr; /* NULL = no journal (tests, fuzzing); journal.h */
	int replaying;
	int64_t now_ms;
	int64_t last_scan_ms;
	int64_t skew_ms; /* added to the clock by tick (tests and fuzzing only) */
	size_t kv_bytes; /* over all jobs */
	struct ctl_stats stats;
	/* replies to a woken waiter; res->body is stolen */
	void (*wake)(struct ctl *ctl, void *req, struct ctl_res *res);
	void *user;
};

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

/* ---- results ---- */
void mr__res_err(struct ctl_res *res, int status, const char *code, const char *field,
		 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void mr__res_ok(struct ctl_res *res, json_t *body);
/* 200 with a body already written (owned by res from now on; NULL: 503
 * out_of_memory). */
void mr__res_text(struct ctl_res *res, char *text, size_t len);
void mr__res_release(struct ctl_res *res);
/* 409 stale_generation with the job's current generation. */
void mr__res_stale(struct ctl_res *res, const struct ctl_job *job);
/* A member of the job's current round (waiting, running or standby)
 * that called with an older generation: the 409 in res also carries
 * "member", what a wait would answer it now (docs/API.md). Nothing for
 * another member or reply; no state changes. */
void mr__ctl_stale_member(const struct ctl_job *job, const char *node_id,
			  struct ctl_res *res);
/* The reply shows only the job's generation, round and ranks (see
 * ctl_res.dep_set). */
void mr__res_dep_round(struct ctl_res *res, const struct ctl_job *job);

/* ---- reply text (jtext.c) ---- */
/* The compact JSON text of v (malloc'd, NUL-terminated, *len bytes): the
 * same bytes as json_dumps(JSON_COMPACT | JSON_ENCODE_ANY), written
 * without its per-container costs. NULL on OOM. */
char *mr__jtext(const json_t *v, size_t *len);
/* The text of an error reply: {"error":{"code","message","field"}} and
 * then res->body's fields (extra top-level fields). NULL on OOM. */
char *mr__jtext_error(const struct ctl_res *res, size_t *len);
/* The core's frequent replies, written without building a json_t (the
 * bytes mr__jtext would write for the objects the API describes); each
 * malloc'd, NUL-terminated, *len bytes, or NULL on OOM. A member's rank in
 * the closed round (the wait's "running" reply): */
char *mr__jtext_round(const struct ctl_job *job, const struct ctl_member *m, size_t *len);
/* {"generation":<the job's>,"state":state} */
char *mr__jtext_state(const struct ctl_job *job, const char *state, size_t *len);
/* The extra fields of a 409 stale_generation: the job's generation and
 * restarts and, m not NULL, "member": what a wait of m answers now. */
char *mr__jtext_stale(const struct ctl_job *job, const struct ctl_member *m, size_t *len);
/* A request body that is a plain object (jparse.c says which) as jansson
 * would parse it; NULL for anything else, which jansson then reads and
 * judges. */
json_t *mr__jparse_object(const char *buf, size_t len);

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
const char *mr__ctl_member_state_name(int st);
const char *mr__ctl_job_state_name(int st);
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
/* The 410 answer for a terminal job. */
void mr__res_over(struct ctl_res *res, const struct ctl_job *job);

/* ---- progress, hangs and stragglers (progress.c, diag.c) ---- */
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
/* The diagnosis (docs/DIAGNOSIS.md): O(ranks x groups) time and memory.
 * msg (may be NULL) gets the one-line verdict. NULL on OOM. */
json_t *mr__ctl_diagnose(struct ctl *ctl, struct ctl_job *job, char *msg, size_t cap);
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
