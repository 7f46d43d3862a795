/*
 * server.c - the controller process core: start (token files, the data
 * dir's lock, journal replay and compaction, metrics, HTTP server), the
 * loop tick (timers, then group commit), and stop.
 *
 * Group commit is pipelined: the tick hands the mutations collected so far
 * to the journal's writer thread (one write + fdatasync for all of them)
 * and the loop keeps serving while the disk syncs, collecting the next
 * batch. A reply showing state of a batch is queued with that batch and
 * leaves when the writer reports it durable, so nothing is acknowledged
 * before it would survive kill -9, and a slow fsync never stalls the loop.
 * When the journal has outgrown its live state, the hand-off is a
 * compaction instead (journal/commit.c): the batch's replies wait for it the same
 * way.
 *
 * Non-goals: routes (routes.c), state machine (core/), flags (../options.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/json_write.h"
#include "journal/journal.h"
#include "mr_json.h"
#include "mr_log.h"
#include "mr_token.h"
#include "server.h"

const char *const mr__ctl_route_names[RT_COUNT] = {
	"/healthz", "/readyz", "/metrics", "/v1/jobs", "/v1/jobs/{job}",
	"/v1/jobs/{job}/join", "/v1/jobs/{job}/wait", "/v1/jobs/{job}/heartbeat",
	"/v1/jobs/{job}/leave", "/v1/jobs/{job}/fail", "/v1/jobs/{job}/complete",
	"/v1/jobs/{job}/diagnosis", "/v1/jobs/{job}/kv",
	"/v1/jobs/{job}/kv/{key}", "/v1/jobs/{job}/kv/{key}/add", "other",
};

static const int statuses[CTL_NSTATUS] = { 200, 201, 400, 401, 403, 404, 405, 409,
					   410, 412, 413, 429, 500, 503, 0, 0 };

int64_t mr__now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void mr__ctl_observe(struct mr_controller *c, int route, int status, int64_t t0_us)
{
	int si = CTL_NSTATUS - 1;
	char st[16];

	for (int i = 0; i < CTL_NSTATUS - 2; i++) {
		if (statuses[i] == status) {
			si = i;
			break;
		}
	}
	if (!c->c_req[route][si]) {
		snprintf(st, sizeof(st), "%d", si == CTL_NSTATUS - 1 ? status : statuses[si]);
		c->c_req[route][si] = mr_metric_counter_child(c->f_requests,
							      mr__ctl_route_names[route], st);
	}
	mr_counter_inc(c->c_req[route][si]);
	if (!c->h_dur[route])
		c->h_dur[route] = mr_metric_histogram_child(c->f_duration,
							    mr__ctl_route_names[route]);
	mr_histogram_observe(c->h_dur[route], (double)(mr__now_us() - t0_us) / 1e6);
}

/* Builds the body of res (malloc'd): error JSON, the text written
 * already (taken from res), raw bytes or the JSON body. */
static char *res_body(struct ctl_res *res, size_t *len, int *json)
{
	char *out = NULL;

	*json = 1;
	if (res->code) {
		out = mr__json_write_error(res, len);
	} else if (res->text) {
		out = res->text;
		*len = res->text_len;
		res->text = NULL;
		res->text_len = 0;
	} else if (res->raw || !res->body) {
		*json = 0;
		out = malloc(res->raw_len ? res->raw_len : 1);
		if (out && res->raw_len)
			memcpy(out, res->raw, res->raw_len);
		*len = res->raw_len;
	} else {
		out = mr__json_write(res->body, len);
	}
	return out;
}

/* Replies with body (malloc'd; taken). */
static void reply_now(struct mr_controller *c, struct mr_http_req *req, int route, int status,
		      int json, char *body, size_t len, uint64_t etag, int64_t t0)
{
	if (etag) {
		char tag[32];

		snprintf(tag, sizeof(tag), "\"%llu\"", (unsigned long long)etag);
		mr_http_add_header(req, "ETag", tag);
	}
	mr_http_reply_take(req, status, json ? "application/json" : "application/octet-stream",
			   body, len);
	mr__ctl_observe(c, route, status, t0);
}

/* 1 if the reply may show state not yet on disk: it waits for a batch.
 * While a batch is collected or in flight, a reply that says what it
 * shows (dep_set) waits only if that batch is not durable yet; any other
 * waits. */
static int must_wait(const struct ctl_journal *jr, const struct ctl_res *res)
{
	if (!mr__jr_pending(jr) && !mr__jr_inflight(jr))
		return 0;
	return !res->dep_set || res->dep_seq > mr__jr_durable(jr);
}

/* 1 if the batch in flight is the one the reply waits for; else it waits
 * for the batch being collected. */
static int wait_inflight(const struct ctl_journal *jr, const struct ctl_res *res)
{
	if (res->dep_set && mr__jr_inflight(jr))
		return res->dep_seq <= mr__jr_inflight_seq(jr);
	return !mr__jr_pending(jr);
}

void mr__ctl_send(struct mr_controller *c, struct mr_http_req *req, int route, int64_t t0_us,
		  struct ctl_res *res)
{
	size_t len = 0;
	int json;
	char *body = res_body(res, &len, &json);
	int status = res->status ? res->status : 200;

	if (!body) {
		mr__res_release(res);
		mr_http_reply_error(req, 503, "out_of_memory", NULL, NULL, "out of memory");
		mr__ctl_observe(c, route, 503, t0_us);
		return;
	}
	if (must_wait(c->ctl.jr, res)) {
		struct ctl_pending *p = malloc(sizeof(*p));

		if (p) {
			p->req = req;
			p->status = status;
			p->route = (uint8_t)route;
			p->json = (uint8_t)json;
			p->t0_us = t0_us;
			p->etag = res->etag;
			p->len = len;
			p->body = body;
			if (!wait_inflight(c->ctl.jr, res)) { /* its state is in the next batch */
				p->next = NULL;
				if (c->pend_tail)
					c->pend_tail->next = p;
				else
					c->pend_head = p;
				c->pend_tail = p;
			} else { /* it shows state of the batch being synced */
				p->next = c->infl_head;
				c->infl_head = p;
			}
			c->pending++;
			if (!mr_http_req_user(req)) {
				mr_http_suspend(req);
				mr_http_req_set_user(req, mr__ctl_reqtag(t0_us, route));
			}
			mr__res_release(res);
			return;
		}
		/* no memory to wait: reply now, durability of this one is best effort */
	}
	reply_now(c, req, route, status, json, body, len, res->etag, t0_us);
	mr__res_release(res);
}

/* ctl->wake: a parked request is answered (from any core path). */
static void on_wake(struct ctl *ctl, void *reqp, struct ctl_res *res)
{
	struct mr_controller *c = ctl->user;
	struct mr_http_req *req = reqp;
	int64_t t0;
	int route;

	/* the tag stays set, so send() knows the request is already suspended */
	mr__ctl_reqtag_get(mr_http_req_user(req), &t0, &route);
	mr__ctl_send(c, req, route, t0, res);
}

/* Answers a list of queued replies (the journal batch they waited for is
 * durable, or failed: then 503) and frees it. */
static void flush_list(struct mr_controller *c, struct ctl_pending *p, int err)
{
	while (p) {
		struct ctl_pending *next = p->next;

		if (err) {
			mr_http_reply_error(p->req, 503, "journal_unavailable", NULL, NULL,
					    "the journal could not be written: %s",
					    mr_strerror(err));
			mr__ctl_observe(c, p->route, 503, p->t0_us);
			free(p->body);
		} else {
			reply_now(c, p->req, p->route, p->status, p->json, p->body, p->len,
				  p->etag, p->t0_us);
		}
		c->pending--;
		free(p);
		p = next;
	}
}

static void free_list(struct ctl_pending *p)
{
	while (p) {
		struct ctl_pending *next = p->next;

		free(p->body);
		free(p);
		p = next;
	}
}

static void commit_done(void *arg);

/* Hands the collected batch to the journal writer, with the replies that
 * wait for it, unless a batch is still in flight. */
static void start_commit(struct mr_controller *c)
{
	struct ctl_pending *p;
	int rc;

	if (mr__jr_inflight(c->ctl.jr))
		return;
	p = c->pend_head;
	rc = mr__jr_commit_start(c->ctl.jr, commit_done, c);
	if (rc == 0 && !p)
		return;
	c->pend_head = c->pend_tail = NULL;
	if (rc == 1) {
		c->infl_head = p; /* order within a batch does not matter */
		return;
	}
	flush_list(c, p, rc < 0 ? rc : 0);
}

/* On the loop thread: ends the batch in flight once the writer is through
 * with it (its replies leave) and hands over the next. Posted by the
 * writer, and called after every request too (mr__ctl_pump), so a stale
 * post finds nothing to end - or a later batch already done. */
static void commit_finished(void *arg)
{
	struct mr_controller *c = arg;
	struct ctl_pending *p;
	int err;

	if (!mr__jr_writer_done(c->ctl.jr))
		return;
	err = mr__jr_commit_finish(c->ctl.jr);
	p = c->infl_head;
	c->infl_head = NULL;
	flush_list(c, p, err);
	start_commit(c);
}

void mr__ctl_pump(struct mr_controller *c)
{
	mr__ctl_tick(&c->ctl); /* cheap unless a timer is due */
	if (mr__jr_inflight(c->ctl.jr))
		commit_finished(c);
	else if (mr__jr_pending(c->ctl.jr))
		start_commit(c);
}

/* On the writer thread. */
static void commit_done(void *arg)
{
	struct mr_controller *c = arg;

	/* once the server stops, its stop answers what waited (503) */
	pthread_mutex_lock(&c->post_mu);
	if (c->srv_live)
		(void)mr_httpd_post(c->srv, commit_finished, c);
	pthread_mutex_unlock(&c->post_mu);
}

static void on_tick(void *user)
{
	struct mr_controller *c = user;

	mr__ctl_tick(&c->ctl);
	start_commit(c);
}

/* ---- metrics ---- */

static void light(struct mr_controller *c, struct mr_gauge *g, double v)
{
	if (!g)
		return;
	if (c->nlit == c->caplit) {
		size_t cap = c->caplit ? 2 * c->caplit : 16;
		struct mr_gauge **n = realloc(c->lit, cap * sizeof(*n));

		if (!n)
			return; /* not remembered: stays set until the next change */
		c->lit = n;
		c->caplit = cap;
	}
	mr_gauge_set(g, v);
	c->lit[c->nlit++] = g;
}

/* Per job: stuck (with the culprit's group and rank), stragglers (each
 * listed one with its ratio), seconds without progress, median busy time.
 * Series of an earlier collect drop to 0 before the current ones are set. */
static void collect_diag(struct mr_controller *c, const struct ctl_job *job)
{
	const struct ctl_jdiag *d = job->diag;
	char rank[16];

	if (!d || job->state != CTL_JOB_RUNNING)
		return;
	if (d->stuck_ms) {
		snprintf(rank, sizeof(rank), "%d", d->stuck_rank);
		light(c, mr_metric_gauge_child(c->f_stuck, job->name, d->stuck_group,
					       d->stuck_rank >= 0 ? rank : ""), 1.0);
	}
	light(c, mr_metric_gauge_child(c->f_stragglers, job->name), (double)d->nstragglers);
	for (uint32_t i = 0; i < d->nlisted; i++) {
		snprintf(rank, sizeof(rank), "%d", d->strag[i].rank);
		light(c, mr_metric_gauge_child(c->f_straggler, job->name, rank,
					       d->strag[i].m->node_id),
		      d->strag[i].median_ms > 0 ? d->strag[i].busy_ms / d->strag[i].median_ms : 0.0);
	}
	if (d->progress_ms)
		light(c, mr_metric_gauge_child(c->f_stalled, job->name),
		      (double)(c->ctl.now_ms - d->progress_ms) / 1e3);
	light(c, mr_metric_gauge_child(c->f_median, job->name), d->median_ms / 1e3);
}

static void collect(struct mr_metrics *reg, void *user)
{
	struct mr_controller *c = user;
	struct ctl *ctl = &c->ctl;
	uint64_t by_state[CTL_M_NSTATES] = { 0 };
	size_t cur = 0;
	void *v;

	(void)reg;
	for (size_t i = 0; i < c->nlit; i++)
		mr_gauge_set(c->lit[i], 0.0);
	c->nlit = 0;
	while (mr_dict_next(&ctl->jobs, &cur, NULL, &v)) {
		struct ctl_job *job = v;

		collect_diag(c, job);
		for (int s = 0; s < CTL_M_NSTATES; s++)
			by_state[s] += job->count[s];
		mr_gauge_set(mr_metric_gauge_child(c->f_generation, job->name),
			     (double)job->generation);
	}
	for (int s = 0; s < CTL_M_NSTATES; s++)
		mr_gauge_set(mr_metric_gauge_child(c->f_members, mr__ctl_member_state_name(s)),
			     (double)by_state[s]);
	mr_gauge_set(c->g_jobs, (double)mr_dict_len(&ctl->jobs));
	mr_gauge_set(c->g_kv_bytes, (double)ctl->kv_bytes);
	mr_gauge_set(c->g_waiters, (double)ctl->heap_len);
	mr_gauge_set(c->g_journal, (double)mr__jr_size(ctl->jr));
	mr_counter_add(c->c_compactions, (double)(mr__jr_compactions(ctl->jr) -
						   c->reported_compactions));
	c->reported_compactions = mr__jr_compactions(ctl->jr);
	mr_counter_add(c->c_rounds, (double)(ctl->stats.rounds - c->reported.rounds));
	mr_counter_add(c->c_joins, (double)(ctl->stats.joins - c->reported.joins));
	mr_counter_add(c->c_dead, (double)(ctl->stats.dead - c->reported.dead));
	mr_counter_add(c->c_bumps, (double)(ctl->stats.bumps - c->reported.bumps));
	mr_counter_add(c->c_hangs, (double)(ctl->stats.hangs - c->reported.hangs));
	mr_counter_add(c->c_strag_total, (double)(ctl->stats.stragglers - c->reported.stragglers));
	c->reported = ctl->stats;
}

static int setup_metrics(struct mr_controller *c)
{
	struct mr_metrics *r = mr_metrics_new();

	if (!r)
		return MR_ENOMEM;
	c->reg = r;
	c->f_requests = mr_metrics_counter(r, "meshrun_controller_http_requests_total",
					   "HTTP requests answered, by route template and status.",
					   "route,status");
	c->f_duration = mr_metrics_histogram(r, "meshrun_controller_http_request_duration_seconds",
					     "Time from request to reply (long-polls included).",
					     "route", NULL, 0);
	c->f_members = mr_metrics_gauge(r, "meshrun_controller_members",
					"Members of all jobs by state.", "state");
	c->f_generation = mr_metrics_gauge(r, "meshrun_controller_generation",
					   "Current generation of each job.", "job");
	c->c_rounds = mr_metric_counter_child(mr_metrics_counter(r,
		"meshrun_controller_rounds_total", "Rendezvous rounds closed.", NULL));
	c->c_joins = mr_metric_counter_child(mr_metrics_counter(r,
		"meshrun_controller_joins_total", "Join calls accepted.", NULL));
	c->c_dead = mr_metric_counter_child(mr_metrics_counter(r,
		"meshrun_controller_dead_members_total",
		"Members declared dead by heartbeat timeout.", NULL));
	c->c_bumps = mr_metric_counter_child(mr_metrics_counter(r,
		"meshrun_controller_generation_bumps_total",
		"Generation bumps (deaths, leaves, failures, elastic joins).", NULL));
	c->g_jobs = mr_metric_gauge_child(mr_metrics_gauge(r, "meshrun_controller_jobs",
							   "Jobs known to the controller.", NULL));
	c->g_kv_bytes = mr_metric_gauge_child(mr_metrics_gauge(r, "meshrun_controller_kv_bytes",
		"Bytes of keys and values in all KV stores.", NULL));
	c->g_waiters = mr_metric_gauge_child(mr_metrics_gauge(r, "meshrun_controller_waiters",
		"Long-polls currently parked.", NULL));
	c->g_journal = mr_metric_gauge_child(mr_metrics_gauge(r,
		"meshrun_controller_journal_bytes", "Size of the journal file.", NULL));
	c->c_compactions = mr_metric_counter_child(mr_metrics_counter(r,
		"meshrun_controller_journal_compactions_total",
		"Compactions of the journal while running (a fresh snapshot replaced it).",
		NULL));
	c->f_stuck = mr_metrics_gauge(r, "meshrun_job_stuck",
		"1 while a running job is stuck (no progress past its hang timeout), with "
		"the group and rank the diagnosis names first.", "job,group,rank");
	c->f_stragglers = mr_metrics_gauge(r, "meshrun_job_stragglers",
		"Ranks of a running job flagged as stragglers.", "job");
	c->f_straggler = mr_metrics_gauge(r, "meshrun_job_straggler_ratio",
		"A flagged straggler's busy time per step over the job's median.",
		"job,rank,node");
	c->f_stalled = mr_metrics_gauge(r, "meshrun_job_progress_age_seconds",
		"Seconds since any rank of a running job made progress.", "job");
	c->f_median = mr_metrics_gauge(r, "meshrun_job_busy_median_seconds",
		"Median busy time per step (step time minus communication wait) of the "
		"job's ranks.", "job");
	c->c_hangs = mr_metric_counter_child(mr_metrics_counter(r,
		"meshrun_controller_hangs_total", "Hangs reported (job_stuck events).", NULL));
	c->c_strag_total = mr_metric_counter_child(mr_metrics_counter(r,
		"meshrun_controller_stragglers_total", "Stragglers flagged (straggler events).",
		NULL));
	return mr_metrics_on_collect(r, collect, c);
}

/* ---- start / stop ---- */

static int write_port_file(const char *path, int port, struct mr_errbuf *eb)
{
	char tmp[1100], buf[16];
	int fd, n = snprintf(buf, sizeof(buf), "%d\n", port);

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0 || write(fd, buf, (size_t)n) != n || close(fd) || rename(tmp, path)) {
		if (fd >= 0)
			close(fd);
		return mr_errf_field(eb, MR_EIO, "port_file", "unable to write '%s': %s", path,
				     strerror(errno));
	}
	return 0;
}

int mr_controller_start(struct mr_controller **out, const struct mr_controller_opts *o,
			struct mr_errbuf *eb)
{
	struct mr_controller *c = calloc(1, sizeof(*c));
	struct ctl_limits lim;
	struct ctl_journal_info ji;
	struct ctl_journal_opts jo;
	struct mr_httpd_opts ho;
	int err = 0;

	*out = NULL;
	if (!c)
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	c->opts = *o;
	pthread_mutex_init(&c->post_mu, NULL);
	memset(&lim, 0, sizeof(lim));
	lim.max_value = (size_t)o->max_value;
	lim.max_keys = (uint32_t)o->max_keys;
	lim.max_members = (uint32_t)o->max_members;
	lim.max_jobs = (uint32_t)o->max_jobs;
	lim.defaults.last_call_ms = (int32_t)o->last_call_ms;
	lim.defaults.heartbeat_timeout_ms = (int32_t)o->heartbeat_timeout_ms;
	lim.defaults.max_restarts = o->max_restarts;
	lim.defaults.hang_timeout_ms = (int32_t)o->hang_timeout_ms;
	lim.defaults.straggler_pct = (int32_t)(o->straggler_factor * 100.0 + 0.5);
	mr__ctl_init(&c->ctl, &lim);
	c->ctl.wake = on_wake;
	c->ctl.user = c;
	if (o->token[0])
		snprintf(c->token, sizeof(c->token), "%s", o->token);
	if (o->token_file[0])
		err = mr_token_read_file(o->token_file, c->token, sizeof(c->token), "token_file",
					 eb);
	if (!err && o->read_token_file[0])
		err = mr_token_read_file(o->read_token_file, c->read_token,
					 sizeof(c->read_token), "read_token_file", eb);
	if (err)
		goto fail;
	err = setup_metrics(c);
	if (err) {
		mr_errf(eb, err, "unable to set up metrics");
		goto fail;
	}
	memset(&jo, 0, sizeof(jo));
	jo.dir = o->data_dir;
	jo.fsync = o->fsync;
	jo.recover = o->journal_recover;
	jo.compact_factor = o->journal_compact_factor;
	jo.compact_min = (uint64_t)o->journal_compact_min;
	err = mr__ctl_journal_open(&c->ctl, &jo, &ji, eb);
	if (err)
		goto fail;
	mr__ctl_touch_all(&c->ctl);
	mr_log_info("journal_replayed",
		    "dir=%s records=%llu bytes=%llu dropped=%llu jobs=%zu journal_bytes=%llu",
		    mr_log_q(o->data_dir), (unsigned long long)ji.records,
		    (unsigned long long)ji.bytes, (unsigned long long)ji.dropped,
		    mr_dict_len(&c->ctl.jobs), (unsigned long long)mr__jr_size(c->ctl.jr));
	memset(&ho, 0, sizeof(ho));
	ho.bind_addr = o->listen[0] ? o->listen : NULL;
	ho.port = o->port;
	ho.max_connections = (unsigned)o->max_connections;
	ho.per_ip_connections = (unsigned)o->per_ip_connections;
	ho.max_body = (size_t)o->max_body;
	ho.idle_timeout_s = (unsigned)((o->idle_timeout_ms + 999) / 1000);
	ho.conn_memory = (size_t)o->conn_memory;
	ho.tick_ms = 10;
	ho.tls_cert = o->tls_cert[0] ? o->tls_cert : NULL;
	ho.tls_key = o->tls_key[0] ? o->tls_key : NULL;
	ho.tls_client_ca = o->tls_client_ca[0] ? o->tls_client_ca : NULL;
	ho.handler = mr__ctl_handle;
	ho.tick = on_tick;
	ho.user = c;
	err = mr_httpd_start(&c->srv, &ho, eb);
	if (err)
		goto fail;
	pthread_mutex_lock(&c->post_mu);
	c->srv_live = 1;
	pthread_mutex_unlock(&c->post_mu);
	mr_log_info("listening", "addr=%s port=%d data_dir=%s auth=%s tls=%s", mr_log_q(o->listen),
		    mr_httpd_port(c->srv), mr_log_q(o->data_dir), c->token[0] ? "on" : "off",
		    !o->tls_cert[0] ? "off" : o->tls_client_ca[0] ? "mutual" : "on");
	if (o->port_file[0]) {
		err = write_port_file(o->port_file, mr_httpd_port(c->srv), eb);
		if (err)
			goto fail;
	}
	*out = c;
	return 0;
fail:
	mr_controller_stop(c);
	return err;
}

int mr_controller_port(const struct mr_controller *c)
{
	return c && c->srv ? mr_httpd_port(c->srv) : -1;
}

void mr_controller_stop(struct mr_controller *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->post_mu);
	c->srv_live = 0;
	pthread_mutex_unlock(&c->post_mu);
	mr_httpd_stop(c->srv); /* answers parked and queued requests 503 */
	c->srv = NULL;
	/* their requests were answered 503 by the stop */
	free_list(c->pend_head);
	free_list(c->infl_head);
	c->pend_head = c->pend_tail = c->infl_head = NULL;
	mr__jr_free_writer(c->ctl.jr); /* a batch in flight finishes first */
	mr__jr_commit_finish(c->ctl.jr);
	mr__jr_commit(c->ctl.jr);
	c->ctl.wake = NULL;
	mr__ctl_release(&c->ctl);
	mr__ctl_journal_close(&c->ctl); /* releases the data dir's lock last */
	mr_metrics_free(c->reg);
	free(c->lit);
	pthread_mutex_destroy(&c->post_mu);
	free(c);
}
