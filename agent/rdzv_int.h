/*
 * rdzv_int.h - the rendezvous client's state, shared by rdzv.c (the
 * supervisor's calls) and rdzv_hb.c (the heartbeat thread); see rdzv.h.
 */
#ifndef MR_RDZV_INT_H
#define MR_RDZV_INT_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>

#include "mr_httpc.h"
#include "rdzv.h"

#define PATH_MAX_LEN 1024
#define HB_TIMEOUT_MS 2000
#define WATCH_KEY "meshrun/watch" /* never written: a parked GET is a job watch */

struct mr_rdzv {
	struct mr_httpc c;   /* supervisor thread */
	struct mr_httpc hbc; /* heartbeat thread */
	char base[PATH_MAX_LEN]; /* "/v1/jobs/ns/name" */
	char node_q[768];        /* node_id percent-encoded */
	char *node_id, *host, *host_id, *topology;
	int pod_index, agent_port;
	json_t *spec;
	long call_timeout_ms;
	/* heartbeat thread */
	pthread_t hb;
	int hb_on;
	int hb_gen, hb_interval;
	pthread_mutex_t hb_lock;
	pthread_cond_t hb_cond;
	int hb_quit;
	atomic_int hb_stale;
	atomic_int stale_restarts; /* the job's restarts in the last 409; -1 unknown */
	atomic_int hb_failures;
	atomic_llong last_answer_ms; /* the controller's last answer below 500 */
	mr_rdzv_latency_fn on_latency;
	void *user;
	mr_rdzv_beat_fn beat_fn; /* extra body of each beat (progress), may be NULL */
	void *beat_user;
	int beat_off;            /* the controller refused the extra fields: stop */
	/* a 409 said this member is in a newer round (the controller carried
	 * it): its generation, state (enum mr_rdzv_carried) and, running,
	 * its rank; taken once by mr_rdzv_carried() */
	pthread_mutex_t note_lock;
	int note_gen, note_state;
	struct mr_rdzv_round note_round;
	/* the job is over (any thread may learn it first) */
	atomic_int ended; /* enum mr_rdzv_end */
	pthread_mutex_t end_lock;
	char end_reason[1024];
};

long long mr__rdzv_now_ms(void);
/* mr_httpc_request that notes when the controller last answered (any
 * status below 500): mr_rdzv_silent_ms() measures outages from it. */
int mr__rdzv_request(struct mr_rdzv *r, struct mr_httpc *c, const struct mr_httpc_req *rq,
		     struct mr_http_resp *resp, struct mr_errbuf *eb);
/* Maps a non-2xx answer to an MR_E* code; 409 fills *gen_out (and the
 * job's restart count); 410 records the end of the job. */
int mr__rdzv_map_status(struct mr_rdzv *r, long status, const char *body, size_t len,
			int *gen_out, struct mr_errbuf *eb);
/* POST .../members/<node>/<what> for generation gen (reason may be NULL)
 * on client c, with retries; 0 or an MR_E* code. */
int mr__rdzv_member_call(struct mr_rdzv *r, struct mr_httpc *c, const char *what, int gen,
			 const char *reason, int retries, int *gen_out, struct mr_errbuf *eb);
/* The same with extra body fields (an object, borrowed; may be NULL). */
int mr__rdzv_member_call_x(struct mr_rdzv *r, struct mr_httpc *c, const char *what, int gen,
			   const char *reason, json_t *extra, int retries, int *gen_out,
			   struct mr_errbuf *eb);

#endif
