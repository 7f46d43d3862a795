/*
 * state.h - what the controller's state is made of: jobs, members, rounds'
 * numbers, the per-job KV entries, suspended waiters, the ranks' progress
 * and the limits, in struct ctl. The core (core/ctl.h) changes it; the
 * diagnosis (diag/) reads it; both include this, which includes neither.
 *
 * Everything here lives on one thread (the mr_httpd loop thread), Redis
 * style, so nothing is locked. Ownership: struct ctl owns every job and
 * its journal (ctl->jr); a job owns its members, KV entries and waiter
 * records; a waiter does not own its request.
 *
 * Non-goals: the operations on it (core/ctl.h), replies (core/reply.h).
 */
#ifndef MR_CTL_STATE_H
#define MR_CTL_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "mr_dict.h"

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

/* ---- progress of the ranks (core/progress.c): volatile, never journaled ---- */
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
	uint8_t all_silent;     /* every running member silent: logged (core/round.c) */
};

struct ctl_limits {
	size_t max_value;        /* bytes per KV value */
	uint32_t max_keys;       /* KV keys per job */
	uint32_t max_members;    /* members per job */
	uint32_t max_jobs;
	struct ctl_spec defaults; /* last_call/heartbeat/max_restarts defaults */
};

struct ctl_stats {
	uint64_t joins, rounds, dead, bumps;
	uint64_t hangs, stragglers; /* reported (events) */
};

struct ctl_journal;
struct ctl_res; /* core/reply.h */

struct ctl {
	struct ctl_limits lim;
	struct mr_dict jobs;
	struct ctl_waiter **heap; /* min-heap by deadline */
	size_t heap_len, heap_cap;
	struct ctl_journal *jr; /* NULL = no journal (tests, fuzzing); journal/journal.h */
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

#endif
