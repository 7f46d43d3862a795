/*
 * routes.c - HTTP routes of the controller (docs/API.md): routing, bearer
 * token checks, query/body validation, then a call into the core
 * (core/ctl.h).
 *
 * Every rejection is a 4xx with {"error":{"code","message","field"}}.
 * Route templates (not raw paths) label the metrics.
 *
 * This file: routing, auth and dispatch; handlers.c validates each
 * route's query/body and calls the core.
 *
 * Non-goals: state changes (core/), replies after group commit
 * (server.c).
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_jobname.h"
#include "mr_json.h"
#include "mr_log.h"
#include "api_int.h"


void mr__api_fail(struct call *k, int status, const char *code, const char *field,
		 const char *fmt, const char *arg)
{
	mr__res_err(&k->res, status, code, field, fmt, arg);
}

/* ---- auth ---- */

static int ct_equal(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned char d = (unsigned char)(la != lb);

	for (size_t i = 0; i < lb; i++)
		d |= (unsigned char)(a[i % (la ? la : 1)] ^ b[i]);
	return d == 0 && la == lb;
}

static int authorized(struct call *k, int write)
{
	const char *h, *tok;
	int ok, ok_w, ok_r;

	if (!k->c->token[0] && !k->c->read_token[0])
		return 1;
	if (!write && !k->c->read_token[0])
		return 1;
	if (write && !k->c->token[0])
		return 1;
	h = mr_http_req_header(k->req, "Authorization");
	if (!h || strncasecmp(h, "Bearer ", 7) != 0) {
		mr__api_fail(k, 401, "unauthorized", "Authorization", "%s",
		     "a bearer token is required");
		mr_http_add_header(k->req, "WWW-Authenticate", "Bearer");
		return 0;
	}
	tok = h + 7;
	/* both comparisons always run, so timing does not tell which token matched */
	ok_w = k->c->token[0] ? ct_equal(tok, k->c->token) : 0;
	ok_r = k->c->read_token[0] ? ct_equal(tok, k->c->read_token) : 0;
	ok = ok_w || (!write && ok_r);
	if (!ok)
		mr__api_fail(k, 403, "forbidden", "Authorization", "%s", "the bearer token is not valid");
	return ok;
}

/* ---- routing ---- */

/* Joins seg[0..n) with '/' into k->key; a key longer than CTL_MAX_KEY is
 * cut at CTL_MAX_KEY + 1 bytes, so the core still refuses it. */
static void join_key(struct call *k, const char *const *seg, size_t n)
{
	size_t o = 0;

	for (size_t i = 0; i < n && o <= CTL_MAX_KEY; i++) {
		if (i)
			k->key[o++] = '/';
		for (const char *c = seg[i]; *c && o <= CTL_MAX_KEY; c++)
			k->key[o++] = *c;
	}
	k->key[o] = 0;
}

/* k->job = "ns/name" of two valid job parts (at most 63 bytes each, so it
 * fits; no snprintf on every request). */
static void set_job(struct call *k, const char *ns, const char *name)
{
	size_t a = strlen(ns), b = strlen(name);

	memcpy(k->job, ns, a);
	k->job[a] = '/';
	memcpy(k->job + a + 1, name, b + 1);
}

/*
 * Routes on the decoded segments (mr_http_req_segments), never on the
 * joined path, so a "%2F" inside a job part does not become a separator.
 * /v1/jobs/{ns}/{name}/... : segments 2 and 3 name the job; a KV key is
 * every segment after "kv" joined by '/' (kv/a/b and kv/a%2Fb name the
 * same key "a/b"); POST .../kv/{key}/add is an add only when "add" is a
 * segment of its own.
 */
static int route(struct call *k, const char **allow)
{
	const char *p = k->path;
	size_t n;
	const char *const *s = mr_http_req_segments(k->req, &n);
	const char *op;

	if (!strcmp(p, "/healthz"))
		return *allow = "GET", RT_HEALTHZ;
	if (!strcmp(p, "/readyz"))
		return *allow = "GET", RT_READYZ;
	if (!strcmp(p, "/metrics"))
		return *allow = "GET", RT_METRICS;
	if (n < 2 || strcmp(s[0], "v1") || strcmp(s[1], "jobs"))
		return RT_OTHER;
	if (n == 2 || (n == 3 && !s[2][0]))
		return *allow = "GET, POST", RT_JOBS;
	if (n < 4)
		return RT_OTHER;
	for (int i = 2; i < 4; i++) {
		if (!mr_job_part_valid(s[i])) {
			k->bad_seg = s[i];
			k->bad_idx = i;
			return RT_OTHER;
		}
	}
	set_job(k, s[2], s[3]);
	if (n == 4 || (n == 5 && !s[4][0]))
		return *allow = "GET, DELETE", RT_JOB;
	op = s[4];
	if (strcmp(op, "kv") != 0) {
		if (n != 5)
			return RT_OTHER;
		if (!strcmp(op, "join"))
			return *allow = "POST", RT_JOIN;
		if (!strcmp(op, "wait"))
			return *allow = "GET", RT_WAIT;
		if (!strcmp(op, "heartbeat"))
			return *allow = "POST", RT_HEARTBEAT;
		if (!strcmp(op, "leave"))
			return *allow = "POST", RT_LEAVE;
		if (!strcmp(op, "fail"))
			return *allow = "POST", RT_FAIL;
		if (!strcmp(op, "complete"))
			return *allow = "POST", RT_COMPLETE;
		if (!strcmp(op, "diagnosis"))
			return *allow = "GET", RT_DIAGNOSIS;
		return RT_OTHER;
	}
	if (n == 5 || (n == 6 && !s[5][0]))
		return *allow = "GET", RT_KV_LIST;
	if (n > 6 && !strcmp(s[n - 1], "add") && s[5][0] &&
	    mr_http_req_method(k->req) == MR_HTTP_POST) {
		join_key(k, s + 5, n - 6);
		return *allow = "GET, PUT, DELETE, POST", RT_KV_ADD;
	}
	join_key(k, s + 5, n - 5);
	return *allow = "GET, PUT, DELETE, POST", RT_KV;
}

static int method_ok(int rt, enum mr_http_method m)
{
	int get = m == MR_HTTP_GET || m == MR_HTTP_HEAD;

	switch (rt) {
	case RT_HEALTHZ: case RT_READYZ: case RT_METRICS: case RT_WAIT: case RT_KV_LIST:
	case RT_DIAGNOSIS:
		return get;
	case RT_JOBS:
		return get || m == MR_HTTP_POST;
	case RT_JOB:
		return get || m == MR_HTTP_DELETE;
	case RT_JOIN: case RT_HEARTBEAT: case RT_LEAVE: case RT_FAIL: case RT_COMPLETE:
	case RT_KV_ADD:
		return m == MR_HTTP_POST;
	case RT_KV:
		return get || m == MR_HTTP_PUT || m == MR_HTTP_DELETE;
	default:
		return 0;
	}
}

static void ops_route(struct call *k)
{
	struct mr_controller *c = k->c;

	if (k->route == RT_METRICS) {
		char *txt = NULL;
		size_t len = 0;

		if (mr_metrics_render(c->reg, &txt, &len)) {
			mr__api_fail(k, 503, "out_of_memory", NULL, "%s", "out of memory");
			return;
		}
		mr_http_reply(k->req, 200, MR_METRICS_CONTENT_TYPE, txt, len);
		free(txt);
		mr__ctl_observe(c, k->route, 200, k->t0);
		k->res.suspended = 1; /* replied */
		return;
	}
	mr__res_ok(&k->res, k->route == RT_READYZ ? json_pack("{sb}", "ready", 1)
						   : json_pack("{ss}", "status", "ok"));
}

void mr__ctl_handle(struct mr_http_req *req, void *user)
{
	struct call kc, *k = &kc; /* per request: on the stack */
	struct mr_controller *c = user;
	enum mr_http_method m = mr_http_req_method(req);
	const char *allow = NULL;
	int write = m == MR_HTTP_POST || m == MR_HTTP_PUT || m == MR_HTTP_DELETE;
	int64_t t0 = mr__now_us();

	/* first: timers and the batches of earlier requests move on (this
	 * one's reply is in no list yet, so nothing resumes the connection
	 * being served) */
	mr__ctl_pump(c);
	memset(k, 0, offsetof(struct call, job)); /* the buffers are written before read */
	k->job[0] = k->key[0] = '\0';
	memset(&k->path, 0, sizeof(*k) - offsetof(struct call, path));
	k->c = c;
	k->req = req;
	k->t0 = t0;
	c->ctl.now_ms = t0 / 1000;
	k->path = mr_http_req_path(req);
	k->route = route(k, &allow);
	if (k->route == RT_OTHER && k->bad_seg) {
		mr__res_err(&k->res, 404, "not_found", "path",
			    "no route for '%.200s': path segment %d '%.64s' is not a DNS label",
			    k->path, k->bad_idx, k->bad_seg);
	} else if (k->route == RT_OTHER) {
		mr__api_fail(k, 404, "not_found", "path", "no route for '%.200s'", k->path);
	} else if (!method_ok(k->route, m)) {
		mr_http_add_header(req, "Allow", allow);
		mr__api_fail(k, 405, "method_not_allowed", "method", "method '%s' is not allowed here",
		     mr_http_req_method_str(req));
	} else if (k->route <= RT_METRICS) {
		ops_route(k);
	} else if (authorized(k, write)) {
		switch (k->route) {
		case RT_JOBS:
			if (m == MR_HTTP_POST)
				mr__api_jobs_post(k);
			else
				mr__api_jobs_get(k);
			break;
		case RT_JOB:
			if (m == MR_HTTP_DELETE)
				mr__ctl_job_delete(&c->ctl, k->job, &k->res);
			else
				mr__api_job_get(k);
			break;
		case RT_JOIN:
			mr__api_join(k);
			break;
		case RT_WAIT:
			mr__api_wait(k);
			break;
		case RT_HEARTBEAT: case RT_LEAVE: case RT_FAIL: case RT_COMPLETE:
			mr__api_member_call(k);
			break;
		case RT_DIAGNOSIS:
			mr__api_diagnosis(k);
			break;
		default:
			mr__api_kv(k, m);
			break;
		}
	}
	if (k->res.suspended) {
		if (k->route != RT_METRICS) {
			mr_http_suspend(req);
			mr_http_req_set_user(req, mr__ctl_reqtag(t0, k->route));
		}
		mr__res_release(&k->res);
	} else {
		mr__ctl_send(c, req, k->route, t0, &k->res);
	}
}
