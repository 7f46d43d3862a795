/*
 * server.h - internals shared by server.c (start/stop, tick, group commit,
 * metrics) and routes.c/handlers.c (routing and handlers).
 *
 * Non-goals: anything a user of mr_controller.h needs.
 */
#ifndef MR_CTL_SERVER_H
#define MR_CTL_SERVER_H

#include <pthread.h>
#include <stdint.h>

#include "core/ctl.h"
#include "mr_controller.h"
#include "mr_httpd.h"
#include "mr_metrics.h"

enum ctl_route {
	RT_HEALTHZ, RT_READYZ, RT_METRICS, RT_JOBS, RT_JOB, RT_JOIN, RT_WAIT, RT_HEARTBEAT,
	RT_LEAVE, RT_FAIL, RT_COMPLETE, RT_DIAGNOSIS, RT_KV_LIST, RT_KV, RT_KV_ADD, RT_OTHER,
	RT_COUNT
};

#define CTL_NSTATUS 16

struct ctl_pending {
	struct mr_http_req *req;
	struct ctl_pending *next;
	int status;
	uint8_t route;
	uint8_t json;
	int64_t t0_us;
	uint64_t etag;
	size_t len;
	char *body; /* len bytes, malloc'd, owned */
};

/* A suspended request's user pointer packs its start time and route (no
 * allocation, so nothing leaks when the server answers it 503 at stop). */
static inline void *mr__ctl_reqtag(int64_t t0_us, int route)
{
	return (void *)(uintptr_t)(((uint64_t)t0_us << 6) | (uint64_t)(route + 1));
}

static inline void mr__ctl_reqtag_get(const void *tag, int64_t *t0_us, int *route)
{
	uint64_t v = (uint64_t)(uintptr_t)tag;

	*route = v ? (int)(v & 63) - 1 : RT_OTHER;
	*t0_us = (int64_t)(v >> 6);
}

struct mr_controller {
	struct mr_controller_opts opts;
	struct ctl ctl;
	struct mr_httpd *srv;
	char token[256];
	char read_token[256];
	/* replies waiting for the batch being collected (next) and for the
	 * batch the journal writer is syncing (inflight) */
	struct ctl_pending *pend_head, *pend_tail;
	struct ctl_pending *infl_head;
	size_t pending;
	/* the journal writer posts to srv only while srv_live (under post_mu) */
	pthread_mutex_t post_mu;
	int srv_live;
	/* metrics */
	struct mr_metrics *reg;
	struct mr_metric_family *f_requests, *f_duration, *f_members, *f_generation;
	struct mr_counter *c_req[RT_COUNT][CTL_NSTATUS];
	struct mr_histogram *h_dur[RT_COUNT];
	struct mr_counter *c_rounds, *c_joins, *c_dead, *c_bumps;
	struct mr_gauge *g_jobs, *g_kv_bytes, *g_waiters, *g_journal;
	struct mr_counter *c_compactions;
	/* hang diagnosis and stragglers: the gauges set last time, zeroed
	 * first at the next collect (children cannot be removed) */
	struct mr_metric_family *f_stuck, *f_stragglers, *f_straggler, *f_stalled, *f_median;
	struct mr_counter *c_hangs, *c_strag_total;
	struct mr_gauge **lit;
	size_t nlit, caplit;
	struct ctl_stats reported;
	uint64_t reported_compactions;
};

extern const char *const mr__ctl_route_names[RT_COUNT];

int64_t mr__now_us(void);
/* The loop-thread request handler (routes.c). */
void mr__ctl_handle(struct mr_http_req *req, void *user);
/* Sends res for req now, or once the journal batch holding the state it
 * shows is durable. res->body is released. */
void mr__ctl_send(struct mr_controller *c, struct mr_http_req *req, int route, int64_t t0_us,
		  struct ctl_res *res);
/* Counts a finished request in the metrics. */
void mr__ctl_observe(struct mr_controller *c, int route, int status, int64_t t0_us);
/*
 * Group commit between two ticks. libmicrohttpd serves every ready
 * connection once per pass, and at tens of thousands of busy connections a
 * pass lasts a large part of a second, with the tick only between passes.
 * Before each request the pump runs the core's timers when due (a round
 * whose last call ran out closes then, not when the pass ends; waits time
 * out, silent members expire), ends the batch the writer is through with
 * (its replies leave) and hands the next one over, so a mutation waits for
 * an fsync rather than for the pass to end.
 */
void mr__ctl_pump(struct mr_controller *c);

#endif
