/*
 * api.c - HTTP routes of the controller (docs/API.md): routing, bearer
 * token checks, query/body validation, then a call into the core (ctl.h).
 *
 * Every rejection is a 4xx with {"error":{"code","message","field"}}.
 * Route templates (not raw paths) label the metrics.
 *
 * This file: routing, auth and dispatch; api_handlers.c validates each
 * route's query/body and calls the core.
 *
 * Non-goals: state changes (job.c, kv.c), replies after group commit
 * (server.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Splits "/v1/jobs/ns/name/rest"; returns the rest ("" if none) or NULL. */
static const char *parse_job(struct call *k, const char *p)
{
	const char *ns = p, *s1 = strchr(ns, '/'), *s2, *rest;
	char a[64], b[64];

	if (!s1 || s1 == ns || (size_t)(s1 - ns) >= sizeof(a))
		return NULL;
	s2 = strchr(s1 + 1, '/');
	rest = s2 ? s2 + 1 : s1 + 1 + strlen(s1 + 1);
	if ((size_t)((s2 ? s2 : rest) - (s1 + 1)) >= sizeof(b))
		return NULL;
	memcpy(a, ns, (size_t)(s1 - ns));
	a[s1 - ns] = 0;
	memcpy(b, s1 + 1, (size_t)((s2 ? s2 : rest) - (s1 + 1)));
	b[(s2 ? s2 : rest) - (s1 + 1)] = 0;
	if (!mr__ctl_valid_job_part(a) || !mr__ctl_valid_job_part(b))
		return NULL;
	snprintf(k->job, sizeof(k->job), "%s/%s", a, b);
	return rest;
}

static int route(struct call *k, const char **allow)
{
	const char *p = k->path, *rest;

	if (!strcmp(p, "/healthz"))
		return *allow = "GET", RT_HEALTHZ;
	if (!strcmp(p, "/readyz"))
		return *allow = "GET", RT_READYZ;
	if (!strcmp(p, "/metrics"))
		return *allow = "GET", RT_METRICS;
	if (!strcmp(p, "/v1/jobs") || !strcmp(p, "/v1/jobs/"))
		return *allow = "GET, POST", RT_JOBS;
	if (strncmp(p, "/v1/jobs/", 9) != 0)
		return RT_OTHER;
	rest = parse_job(k, p + 9);
	if (!rest)
		return RT_OTHER;
	if (!*rest)
		return *allow = "GET, DELETE", RT_JOB;
	if (!strcmp(rest, "join"))
		return *allow = "POST", RT_JOIN;
	if (!strcmp(rest, "wait"))
		return *allow = "GET", RT_WAIT;
	if (!strcmp(rest, "heartbeat"))
		return *allow = "POST", RT_HEARTBEAT;
	if (!strcmp(rest, "leave"))
		return *allow = "POST", RT_LEAVE;
	if (!strcmp(rest, "fail"))
		return *allow = "POST", RT_FAIL;
	if (!strcmp(rest, "complete"))
		return *allow = "POST", RT_COMPLETE;
	if (!strcmp(rest, "kv") || !strcmp(rest, "kv/"))
		return *allow = "GET", RT_KV_LIST;
	if (!strncmp(rest, "kv/", 3)) {
		size_t n = strlen(rest + 3);

		k->key = rest + 3;
		if (n > 4 && !strcmp(rest + 3 + n - 4, "/add") &&
		    mr_http_req_method(k->req) == MR_HTTP_POST) {
			k->path[(size_t)(rest + 3 + n - 4 - k->path)] = 0;
			return *allow = "GET, PUT, DELETE, POST", RT_KV_ADD;
		}
		return *allow = "GET, PUT, DELETE, POST", RT_KV;
	}
	return RT_OTHER;
}

static int method_ok(int rt, enum mr_http_method m)
{
	int get = m == MR_HTTP_GET || m == MR_HTTP_HEAD;

	switch (rt) {
	case RT_HEALTHZ: case RT_READYZ: case RT_METRICS: case RT_WAIT: case RT_KV_LIST:
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
	struct call *k = calloc(1, sizeof(*k));
	struct mr_controller *c = user;
	enum mr_http_method m = mr_http_req_method(req);
	const char *allow = NULL;
	int write = m == MR_HTTP_POST || m == MR_HTTP_PUT || m == MR_HTTP_DELETE;
	int64_t t0 = mr__now_us();

	if (!k) {
		mr_http_reply_error(req, 503, "out_of_memory", NULL, NULL, "out of memory");
		return;
	}
	k->c = c;
	k->req = req;
	k->t0 = t0;
	c->ctl.now_ms = t0 / 1000;
	snprintf(k->path, sizeof(k->path), "%s", mr_http_req_path(req));
	k->route = route(k, &allow);
	if (k->route == RT_OTHER) {
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
	free(k);
}
