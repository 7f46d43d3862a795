/*
 * rdzv_hb.c - the rendezvous client's heartbeat thread (see rdzv.h): a
 * beat every interval on its own HTTP client, and between beats a parked
 * watch GET so a generation change (409) or the end of the job (410) is
 * learned at once; latency callback, stale generation and failure counts.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "mr_httpc.h"
#include "mr_log.h"
#include "rdzv_int.h"

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Parks a GET of a key nobody writes for up to ms: the controller answers
 * it at once when the generation ends (409) or the job is over (410), so
 * the agent learns of both without waiting for the next beat. 0 when the
 * wait ran out, else the error (MR_ESTALE with *newgen set). */
static int hb_watch(struct mr_rdzv *r, long ms, int *newgen)
{
	char path[PATH_MAX_LEN + 1024];
	struct mr_httpc_req rq = {.method = "GET", .path = path,
				  .timeout_ms = ms + r->call_timeout_ms, .max_retries = 0};
	struct mr_http_resp resp = {0};
	struct mr_errbuf eb = {0};
	int err;

	/* naming the node: a 409 then says whether it was carried (rdzv.h) */
	snprintf(path, sizeof(path), "%s/kv/" WATCH_KEY "?generation=%d&wait_ms=%ld&node_id=%s",
		 r->base, r->hb_gen, ms, r->node_q);
	err = mr__rdzv_request(r, &r->hbc, &rq, &resp, &eb);
	if (err)
		return err;
	if (resp.status != 200)
		err = mr__rdzv_map_status(r, resp.status, resp.body, resp.len, newgen, &eb);
	mr_http_resp_release(&resp);
	return err == MR_ETIMEDOUT ? 0 : err;
}

/* Sleeps until the next beat is due (or hb_stop); 1 = quit. */
static int hb_sleep(struct mr_rdzv *r, double due)
{
	double left = due - mono_s();
	struct timespec until;
	int quit;

	pthread_mutex_lock(&r->hb_lock);
	clock_gettime(CLOCK_REALTIME, &until);
	if (left > 0) {
		long long ns = (long long)(left * 1e9);

		until.tv_sec += (time_t)(ns / 1000000000LL);
		until.tv_nsec += (long)(ns % 1000000000LL);
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		while (!r->hb_quit &&
		       pthread_cond_timedwait(&r->hb_cond, &r->hb_lock, &until) == 0)
			;
	}
	quit = r->hb_quit;
	pthread_mutex_unlock(&r->hb_lock);
	return quit;
}

/* One beat, with the extra fields when there are any; a 400 on them turns
 * them off and beats again without. */
static int beat(struct mr_rdzv *r, int full, int *newgen, struct mr_errbuf *eb)
{
	json_t *extra = r->beat_fn && !r->beat_off ? r->beat_fn(r->beat_user, full) : NULL;
	int err = mr__rdzv_member_call_x(r, &r->hbc, "heartbeat", r->hb_gen, NULL, extra, 0,
					 newgen, eb);

	if (extra && err == MR_EPROTO) {
		mr_log_warn("progress_refused", "gen=%d msg=%s", r->hb_gen, mr_log_q(eb->msg));
		r->beat_off = 1;
		memset(eb, 0, sizeof(*eb));
		err = mr__rdzv_member_call(r, &r->hbc, "heartbeat", r->hb_gen, NULL, 0, newgen, eb);
	}
	json_decref(extra);
	return err;
}

static void *hb_main(void *arg)
{
	struct mr_rdzv *r = arg;
	unsigned beats = 0;
	int failed = 1; /* the first beat of a generation is full */

	for (;;) {
		struct mr_errbuf eb = {0};
		double t0 = mono_s(), due = t0 + r->hb_interval / 1000.0;
		int newgen = 0, err;

		err = beat(r, failed || beats++ % MR_RDZV_FULL_EVERY == 0, &newgen, &eb);
		failed = err != 0;
		if (err == 0 || err == MR_ESTALE) {
			if (r->on_latency)
				r->on_latency(r->user, mono_s() - t0);
		}
		if (err == 0) { /* watch until the next beat is due */
			long ms = (long)((due - mono_s()) * 1000);

			if (ms > 0)
				err = hb_watch(r, ms, &newgen);
			if (err != MR_ESTALE && err != MR_ECLOSED)
				err = 0; /* a blip or a stop: plain sleep below */
		}
		if (err == MR_ESTALE) {
			atomic_store(&r->hb_stale, newgen > r->hb_gen ? newgen : r->hb_gen + 1);
			mr_log_info("generation_changed", "gen=%d new_gen=%d", r->hb_gen, newgen);
			break;
		}
		if (err == MR_ECLOSED) {
			char why[256];
			int end = mr_rdzv_ended(r, why, sizeof(why));

			mr_log_info("job_over", "gen=%d end=%d reason=%s", r->hb_gen, end,
				    mr_log_q(why));
			break;
		}
		if (err && err != MR_EABORTED) {
			atomic_fetch_add(&r->hb_failures, 1);
			mr_log_warn("heartbeat_failed", "gen=%d err=%s msg=%s", r->hb_gen,
				    mr_err_name(err), mr_log_q(eb.msg));
		}
		if (hb_sleep(r, due))
			break;
	}
	return NULL;
}

void mr_rdzv_hb_set_beat(struct mr_rdzv *r, mr_rdzv_beat_fn fn, void *user)
{
	r->beat_fn = fn;
	r->beat_user = user;
}

int mr_rdzv_hb_start(struct mr_rdzv *r, int gen, int interval_ms, mr_rdzv_latency_fn on_latency,
		     void *user)
{
	mr_rdzv_hb_stop(r);
	mr_httpc_clear_abort(&r->hbc);
	r->hb_gen = gen;
	r->hb_interval = interval_ms > 0 ? interval_ms : 1000;
	r->hb_quit = 0;
	r->on_latency = on_latency;
	r->user = user;
	r->beat_off = 0;
	atomic_store(&r->hb_stale, 0);
	atomic_store(&r->stale_restarts, -1);
	if (pthread_create(&r->hb, NULL, hb_main, r) != 0)
		return MR_ESYS;
	r->hb_on = 1;
	return 0;
}

void mr_rdzv_hb_stop(struct mr_rdzv *r)
{
	if (!r->hb_on)
		return;
	pthread_mutex_lock(&r->hb_lock);
	r->hb_quit = 1;
	pthread_cond_signal(&r->hb_cond);
	pthread_mutex_unlock(&r->hb_lock);
	mr_httpc_abort(&r->hbc);
	pthread_join(r->hb, NULL);
	r->hb_on = 0;
}

int mr_rdzv_hb_stale(struct mr_rdzv *r)
{
	return atomic_load(&r->hb_stale);
}

int mr_rdzv_stale_restarts(struct mr_rdzv *r)
{
	return atomic_load(&r->stale_restarts);
}

int mr_rdzv_hb_failures(struct mr_rdzv *r)
{
	return atomic_load(&r->hb_failures);
}
