/*
 * rdzv.h - the agent's rendezvous client: join, wait, heartbeat, leave,
 * fail and the per-generation KV store of the controller (docs/API.md),
 * over mr_httpc.
 *
 * Every call maps the controller's answer to an MR_E* code:
 *   2xx -> 0;  409 stale_generation -> MR_ESTALE with *gen_out set to the
 *   job's current generation (and, when the 409 says the controller
 *   carried this member into the new round, a note for
 *   mr_rdzv_carried());  404 -> MR_ENOTFOUND;  412 -> MR_ECONFLICT;
 *   410 (job_failed, job_succeeded, job_deleted) -> MR_ECLOSED, and the end
 *   of the job is recorded for mr_rdzv_ended() (first one wins);
 *   401/403 -> MR_EAUTH;  other 4xx -> MR_EPROTO (message in eb);
 *   transport failures and 5xx -> MR_ECONN after mr_httpc's retries.
 * mr_rdzv_abort() makes every pending and later call return MR_EABORTED
 * (SIGTERM path) until mr_rdzv_resume().
 *
 * The heartbeat thread (mr_rdzv_hb_start) beats every interval_ms for one
 * generation; between beats it parks a KV GET of a key nobody writes
 * ("meshrun/watch"), which the controller answers at once when the
 * generation ends or the job is over, so both are seen within a round
 * trip. It records the outcome: a 409 stores the new generation
 * (read with mr_rdzv_hb_stale), an unreachable controller is only counted
 * and logged - running workers keep running and the thread keeps trying.
 * on_latency (may be NULL) gets the round-trip of every answered beat.
 *
 * Thread safety: calls may come from the supervisor and the heartbeat
 * thread at once (each uses its own connection).
 *
 * Ownership: opts strings are copied; spec is copied (json_deep_copy).
 * Non-goals: retry policy beyond one call (the supervisor decides),
 * rank maths.
 */
#ifndef MR_RDZV_H
#define MR_RDZV_H

#include <stddef.h>
#include <jansson.h>

#include "mr_err.h"

struct mr_rdzv;

struct mr_rdzv_opts {
	const char *controller;  /* base URL, "http://127.0.0.1:29400" */
	const char *job;         /* "ns/name" */
	const char *node_id;
	const char *host;
	const char *host_id;
	int pod_index;           /* -1 = none */
	const char *topology;    /* mr_topo.h path, NULL/"" = none */
	int agent_port;          /* health port, advertised in "ports" if > 0 */
	const char *token;       /* bearer token, NULL/"" = none */
	const json_t *spec;      /* job spec sent with join (creates the job) */
	long call_timeout_ms;    /* per request, besides long-poll time; 0 = 5000 */
};

/* A closed round, as seen by this member. */
struct mr_rdzv_round {
	int generation;
	int num_nodes, node_rank;
	int nproc_per_node, world_size, rank_base;
	int tp, pp, cp, ep, dp;
	int restarts;           /* the job's restarts so far; -1 if not sent */
};

int mr_rdzv_new(struct mr_rdzv **out, const struct mr_rdzv_opts *o, struct mr_errbuf *eb);
/* Stops the heartbeat thread if running. NULL is a no-op. */
void mr_rdzv_free(struct mr_rdzv *r);

/* Joins the forming round; *gen gets its generation, *standby 1 if the
 * job was full and this member waits for the next round. */
int mr_rdzv_join(struct mr_rdzv *r, int *gen, int *standby, struct mr_errbuf *eb);
/*
 * One long-poll of at most timeout_ms: 0 with *round filled when the round
 * of gen closed, MR_ETIMEDOUT while it is still open, MR_ESTALE (*gen_out)
 * when the generation moved on.
 */
int mr_rdzv_wait(struct mr_rdzv *r, int gen, long timeout_ms, struct mr_rdzv_round *round,
		 int *gen_out, struct mr_errbuf *eb);
int mr_rdzv_heartbeat(struct mr_rdzv *r, int gen, int *gen_out, struct mr_errbuf *eb);
int mr_rdzv_leave(struct mr_rdzv *r, int gen, const char *reason, struct mr_errbuf *eb);
int mr_rdzv_fail(struct mr_rdzv *r, int gen, const char *reason, struct mr_errbuf *eb);
/* "fail" with "permanent": true - the whole job fails at once. */
int mr_rdzv_fail_job(struct mr_rdzv *r, const char *reason, struct mr_errbuf *eb);
/* This member's workers all succeeded (no generation bump); the job
 * succeeds when every member of the round completed. */
int mr_rdzv_complete(struct mr_rdzv *r, int gen, struct mr_errbuf *eb);

enum mr_rdzv_end { MR_RDZV_LIVE = 0, MR_RDZV_FAILED, MR_RDZV_SUCCEEDED, MR_RDZV_DELETED };
/* How the job ended (a 410 seen by any call or the heartbeat thread), or
 * MR_RDZV_LIVE; reason (may be NULL) gets the controller's reason.
 * Thread-safe. */
int mr_rdzv_ended(struct mr_rdzv *r, char *reason, size_t cap);

/* KV of the job at generation gen (mr_kv.h semantics). */
int mr_rdzv_kv_put(struct mr_rdzv *r, int gen, const char *key, const void *val, size_t len,
		   struct mr_errbuf *eb);
int mr_rdzv_kv_get(struct mr_rdzv *r, int gen, const char *key, void *buf, size_t cap,
		   size_t *len, long wait_ms, struct mr_errbuf *eb);
int mr_rdzv_kv_add(struct mr_rdzv *r, int gen, const char *key, long long delta,
		   long long *out, struct mr_errbuf *eb);

/* The health port once known (bound to port 0); before the first join. */
void mr_rdzv_set_agent_port(struct mr_rdzv *r, int port);
void mr_rdzv_abort(struct mr_rdzv *r);
void mr_rdzv_resume(struct mr_rdzv *r);

/*
 * At a generation bump the controller carries the live members of the
 * round into the new one (docs/API.md): the 409 a member then gets names
 * it as waiting there, or - once the new round closed - running with its
 * rank. Such a member need not join again. mr_rdzv_carried() takes that
 * note (once; thread-safe): MR_RDZV_CARRIED_WAITING with *gen set (wait
 * for that round, join if the wait says 409 or 404), or
 * MR_RDZV_CARRIED_RUNNING with *round filled (the round is closed: no
 * join, no wait). Notes of generations <= after_gen are dropped.
 */
enum mr_rdzv_carried { MR_RDZV_NOT_CARRIED = 0, MR_RDZV_CARRIED_WAITING, MR_RDZV_CARRIED_RUNNING };
int mr_rdzv_carried(struct mr_rdzv *r, int after_gen, int *gen, struct mr_rdzv_round *round);

/* ---- heartbeat thread ---- */
typedef void (*mr_rdzv_latency_fn)(void *user, double seconds);
/* Extra fields of every beat's body (the progress report, docs/API.md):
 * an object to merge, owned by the caller of the hook, or NULL for none.
 * full = 1 asks for everything even when unchanged: the first beat of a
 * generation, the beat after a failed one and every
 * MR_RDZV_FULL_EVERY-th. Runs on the heartbeat thread. A controller that
 * answers such a beat 400 (it does not know the fields) is beaten without
 * them from then on, once it is logged. */
typedef json_t *(*mr_rdzv_beat_fn)(void *user, int full);
#define MR_RDZV_FULL_EVERY 8
/* Before mr_rdzv_hb_start. */
void mr_rdzv_hb_set_beat(struct mr_rdzv *r, mr_rdzv_beat_fn fn, void *user);
int mr_rdzv_hb_start(struct mr_rdzv *r, int gen, int interval_ms, mr_rdzv_latency_fn on_latency,
		     void *user);
/* Stops and joins the thread; no-op when not running. */
void mr_rdzv_hb_stop(struct mr_rdzv *r);
/* The newer generation a beat was told about (409), or 0. */
int mr_rdzv_hb_stale(struct mr_rdzv *r);
/* The job's restart count carried by the last 409 (stale generation), or
 * -1: equal to the round's restarts, the generation ended without a
 * restart being counted (a membership change such as a scale-up). */
int mr_rdzv_stale_restarts(struct mr_rdzv *r);
/* Beats so far that did not reach the controller (total). */
int mr_rdzv_hb_failures(struct mr_rdzv *r);
/* Milliseconds since the controller last answered any call of this
 * client (supervisor or heartbeat thread) with a status below 500; from
 * mr_rdzv_new() until the first answer. The supervisor gives up on an
 * unreachable controller by it (controller_timeout). Thread-safe. */
long long mr_rdzv_silent_ms(struct mr_rdzv *r);

#endif
