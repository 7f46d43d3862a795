/*
 * api.c - HTTP routes of the controller (docs/API.md): routing, bearer
 * token checks, query/body validation, then a call into the core (ctl.h).
 *
 * Every rejection is a 4xx with {"error":{"code","message","field"}}.
 * Route templates (not raw paths) label the metrics.
 *
 * Non-goals: state changes (job.c, kv.c), replies after group commit
 * (server.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal.h"
#include "mr_json.h"
#include "mr_log.h"
#include "server.h"

#define LIST_MAX 1000

struct call {
	struct mr_controller *c;
	struct mr_http_req *req;
	int route;
	int64_t t0;
	char job[128];      /* "ns/name" */
	const char *key;    /* KV key (points into path copy) */
	char path[1024];
	struct ctl_res res;
};

static void fail(struct call *k, int status, const char *code, const char *field,
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
		fail(k, 401, "unauthorized", "Authorization", "%s",
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
		fail(k, 403, "forbidden", "Authorization", "%s", "the bearer token is not valid");
	return ok;
}

/* ---- query and body helpers ---- */

static int q_int(struct call *k, const char *name, int64_t lo, int64_t hi, int64_t *out)
{
	const char *v = mr_http_req_query(k->req, name);
	char *end;
	long long x;

	if (!v)
		return 0;
	errno = 0;
	x = strtoll(v, &end, 10);
	if (!*v || *end || errno || x < lo || x > hi) {
		mr__res_err(&k->res, 400, "invalid_field", name,
			    "query '%s': '%.32s' is not an integer in [%lld, %lld]", name, v,
			    (long long)lo, (long long)hi);
		return MR_EINVAL;
	}
	*out = x;
	return 0;
}

static json_t *body_obj(struct call *k)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	size_t len = 0;
	const char *b = mr_http_req_body(k->req, &len);
	json_t *o = NULL;

	if (mr_json_parse_object(b ? b : "", len, &o, &eb)) {
		mr__res_err(&k->res, 400, "invalid_json", eb.field[0] ? eb.field : "body", "%s",
			    eb.msg);
		return NULL;
	}
	return o;
}

static int bad_field(struct call *k, const struct mr_errbuf *eb)
{
	mr__res_err(&k->res, 400, "invalid_field", eb->field[0] ? eb->field : "body", "%s",
		    eb->msg);
	return MR_EINVAL;
}

static int node_id_ok(struct call *k, const char *id)
{
	if (!id) {
		fail(k, 400, "invalid_field", "node_id", "%s", "'node_id' is required");
		return 0;
	}
	if (!mr__ctl_valid_node_id(id)) {
		fail(k, 400, "invalid_field", "node_id", "%s",
		     "'node_id' must be 1..253 printable characters without spaces");
		return 0;
	}
	return 1;
}

/* ---- handlers ---- */

static void h_jobs_post(struct call *k)
{
	json_t *o = body_obj(k);
	struct ctl_spec spec;
	const char *name;

	if (!o)
		return;
	if (!mr__ctl_parse_spec(o, &k->c->ctl.lim, &spec, &name, &k->res))
		mr__ctl_job_create(&k->c->ctl, name, &spec, &k->res);
	json_decref(o);
}

static int cmp_job(const void *a, const void *b)
{
	return strcmp((*(struct ctl_job *const *)a)->name, (*(struct ctl_job *const *)b)->name);
}

static void h_jobs_get(struct call *k)
{
	struct ctl *ctl = &k->c->ctl;
	int64_t off = 0, lim = 100;
	size_t n = 0, cur = 0;
	struct ctl_job **arr;
	json_t *jobs;
	void *v;

	if (q_int(k, "offset", 0, INT32_MAX, &off) || q_int(k, "limit", 1, LIST_MAX, &lim))
		return;
	arr = malloc((mr_dict_len(&ctl->jobs) + 1) * sizeof(*arr));
	if (!arr) {
		fail(k, 503, "out_of_memory", NULL, "%s", "out of memory");
		return;
	}
	while (mr_dict_next(&ctl->jobs, &cur, NULL, &v))
		arr[n++] = v;
	qsort(arr, n, sizeof(*arr), cmp_job);
	jobs = json_array();
	for (size_t i = (size_t)off; i < n && i < (size_t)(off + lim); i++)
		json_array_append_new(jobs, mr__ctl_job_json(arr[i]));
	mr__res_ok(&k->res, json_pack("{so sI}", "jobs", jobs, "total", (json_int_t)n));
	json_object_set_new(k->res.body, "next",
			    (size_t)(off + lim) < n ? json_integer(off + lim) : json_null());
	free(arr);
}

static int cmp_member(const void *a, const void *b)
{
	const struct ctl_member *x = *(struct ctl_member *const *)a;
	const struct ctl_member *y = *(struct ctl_member *const *)b;
	int64_t rx = x->node_rank >= 0 ? x->node_rank : INT32_MAX;
	int64_t ry = y->node_rank >= 0 ? y->node_rank : INT32_MAX;

	if (rx != ry)
		return rx < ry ? -1 : 1;
	return strcmp(x->node_id, y->node_id);
}

static void h_job_get(struct call *k)
{
	struct ctl_job *job = mr__ctl_job(&k->c->ctl, k->job);
	int64_t members = 0, off = 0, lim = 100;
	struct ctl_member **arr;
	size_t n = 0;
	json_t *ms;

	if (!job) {
		fail(k, 404, "job_not_found", "job", "job '%s' does not exist", k->job);
		return;
	}
	if (q_int(k, "members", 0, 1, &members) || q_int(k, "offset", 0, INT32_MAX, &off) ||
	    q_int(k, "limit", 1, LIST_MAX, &lim))
		return;
	mr__res_ok(&k->res, mr__ctl_job_json(job));
	if (!members)
		return;
	arr = malloc((mr_dict_len(&job->members) + 1) * sizeof(*arr));
	if (!arr) {
		fail(k, 503, "out_of_memory", NULL, "%s", "out of memory");
		return;
	}
	for (struct ctl_member *m = job->lru_head; m; m = m->lru_next)
		arr[n++] = m;
	qsort(arr, n, sizeof(*arr), cmp_member);
	ms = json_array();
	for (size_t i = (size_t)off; i < n && i < (size_t)(off + lim); i++) {
		json_t *mj = mr__ctl_member_json(arr[i]);

		json_object_set_new(mj, "last_seen_ms_ago",
				    json_integer(k->c->ctl.now_ms - arr[i]->last_seen_ms));
		json_array_append_new(ms, mj);
	}
	json_object_set_new(k->res.body, "member_list", ms);
	json_object_set_new(k->res.body, "next",
			    (size_t)(off + lim) < n ? json_integer(off + lim) : json_null());
	free(arr);
}

static void h_join(struct call *k)
{
	static const char *const keys[] = { "node_id", "host", "host_id", "ports", "pod_index",
					    "spec", NULL };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	json_t *o = body_obj(k), *ports = NULL, *spec = NULL;
	struct ctl_join j = { .pod_index = -1 };
	struct ctl_spec sp;
	char *ports_txt = NULL;
	int64_t pod = -1;

	if (!o)
		return;
	if (mr_json_check_keys(o, keys, &eb) ||
	    mr_json_get_str(o, "node_id", 1, CTL_MAX_NODE_ID, &j.node_id, &eb) ||
	    mr_json_get_str(o, "host", 0, CTL_MAX_HOST, &j.host, &eb) ||
	    mr_json_get_str(o, "host_id", 0, CTL_MAX_HOST, &j.host_id, &eb) ||
	    mr_json_get_int(o, "pod_index", 0, 0, 1000000000, &pod, &eb) ||
	    mr_json_get_obj(o, "ports", 0, &ports, &eb) ||
	    mr_json_get_obj(o, "spec", 0, &spec, &eb)) {
		bad_field(k, &eb);
		goto out;
	}
	if (!node_id_ok(k, j.node_id))
		goto out;
	j.pod_index = (int32_t)pod;
	if (ports) {
		const char *pk;
		json_t *pv;

		if (json_object_size(ports) > 16) {
			fail(k, 400, "invalid_field", "ports", "%s", "'ports' has more than 16 entries");
			goto out;
		}
		json_object_foreach(ports, pk, pv) {
			if (strlen(pk) > 32 || !json_is_integer(pv) || json_integer_value(pv) < 0 ||
			    json_integer_value(pv) > 65535) {
				fail(k, 400, "invalid_field", "ports",
				     "'ports.%.32s' must be an integer port in [0, 65535]", pk);
				goto out;
			}
		}
		ports_txt = mr_json_dump(ports, NULL);
		j.ports = ports_txt;
	}
	if (spec) {
		json_t *cp = json_copy(spec);
		const char *nm;

		if (!json_object_get(cp, "name"))
			json_object_set_new(cp, "name", json_string(k->job));
		if (mr__ctl_parse_spec(cp, &k->c->ctl.lim, &sp, &nm, &k->res)) {
			json_decref(cp);
			goto out;
		}
		if (strcmp(nm, k->job) != 0) {
			json_decref(cp);
			fail(k, 400, "invalid_field", "spec.name", "%s",
			     "'spec.name' differs from the job in the path");
			goto out;
		}
		json_decref(cp);
		j.spec = &sp;
	}
	mr__ctl_join(&k->c->ctl, k->job, &j, &k->res);
out:
	free(ports_txt);
	json_decref(o);
}

static void h_member_call(struct call *k)
{
	static const char *const keys[] = { "node_id", "generation", "reason", NULL };
	static const char *const fkeys[] = { "node_id", "generation", "reason", "permanent",
					     NULL };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	json_t *o = body_obj(k), *perm;
	const char *id = NULL, *reason = NULL;
	int64_t gen = -1;
	int permanent = 0;

	if (!o)
		return;
	perm = json_object_get(o, "permanent");
	if (mr_json_check_keys(o, k->route == RT_FAIL ? fkeys : keys, &eb) ||
	    mr_json_get_str(o, "node_id", 1, CTL_MAX_NODE_ID, &id, &eb) ||
	    mr_json_get_int(o, "generation", 0, 0, INT64_MAX, &gen, &eb) ||
	    mr_json_get_str(o, "reason", 0, 1024, &reason, &eb)) {
		bad_field(k, &eb);
	} else if (perm && !json_is_boolean(perm)) {
		fail(k, 400, "invalid_field", "permanent", "%s", "'permanent' must be a boolean");
	} else if (node_id_ok(k, id)) {
		permanent = json_is_true(perm);
		if (k->route == RT_HEARTBEAT)
			mr__ctl_heartbeat(&k->c->ctl, k->job, id, gen, &k->res);
		else if (k->route == RT_COMPLETE)
			mr__ctl_complete(&k->c->ctl, k->job, id, gen, &k->res);
		else if (permanent)
			mr__ctl_fail_job(&k->c->ctl, k->job, id, reason, &k->res);
		else
			mr__ctl_leave(&k->c->ctl, k->job, id, gen, k->route == RT_FAIL, &k->res);
		if ((k->route == RT_LEAVE || k->route == RT_FAIL) && !k->res.code)
			mr_log_info(k->route == RT_FAIL ? "member_failed" : "member_left",
				    "job=%s node=%s permanent=%d reason=%s", mr_log_q(k->job),
				    mr_log_q(id), permanent, mr_log_q(reason ? reason : ""));
	}
	json_decref(o);
}

static void h_wait(struct call *k)
{
	const char *id = mr_http_req_query(k->req, "node_id");
	int64_t gen = -1, timeout = 30000;

	if (!node_id_ok(k, id) || q_int(k, "generation", 0, INT64_MAX, &gen) ||
	    q_int(k, "timeout_ms", 0, CTL_MAX_WAIT_MS, &timeout))
		return;
	mr__ctl_wait(&k->c->ctl, k->job, id, gen, timeout, k->req, &k->res);
}

static void h_kv(struct call *k, enum mr_http_method method)
{
	struct ctl *ctl = &k->c->ctl;
	struct ctl_job *job;
	int64_t gen = -1;

	if (q_int(k, "generation", 0, INT64_MAX, &gen))
		return;
	job = mr__ctl_job_for(ctl, k->job, gen, &k->res);
	if (!job)
		return;
	if (k->route == RT_KV_LIST) {
		const char *prefix = mr_http_req_query(k->req, "prefix");
		int64_t off = 0, lim = 100;

		if (q_int(k, "offset", 0, INT32_MAX, &off) || q_int(k, "limit", 1, LIST_MAX, &lim))
			return;
		mr__ctl_kv_list(ctl, job, prefix ? prefix : "", (size_t)off, (size_t)lim, &k->res);
	} else if (k->route == RT_KV_ADD) {
		static const char *const keys[] = { "delta", NULL };
		struct mr_errbuf eb = { { 0 }, { 0 } };
		json_t *o = body_obj(k);
		int64_t delta = 0;

		if (!o)
			return;
		if (mr_json_check_keys(o, keys, &eb) ||
		    mr_json_get_int(o, "delta", 1, INT64_MIN, INT64_MAX, &delta, &eb))
			bad_field(k, &eb);
		else
			mr__ctl_kv_add(ctl, job, k->key, delta, &k->res);
		json_decref(o);
	} else if (method == MR_HTTP_PUT) {
		struct ctl_put p = { .if_match = -1 };
		const char *im = mr_http_req_header(k->req, "If-Match");
		const char *inm = mr_http_req_header(k->req, "If-None-Match");

		p.val = mr_http_req_body(k->req, &p.len);
		if (inm) {
			if (strcmp(inm, "*") != 0) {
				fail(k, 400, "invalid_field", "If-None-Match", "%s",
				     "only 'If-None-Match: *' is supported");
				return;
			}
			p.if_none_match = 1;
		}
		if (im) {
			char *end;
			const char *s = im[0] == '"' ? im + 1 : im;

			errno = 0;
			p.if_match = strtoll(s, &end, 10);
			if (s == end || errno || p.if_match < 0 ||
			    !((im[0] == '"' && end[0] == '"' && !end[1]) || (im[0] != '"' && !*end))) {
				fail(k, 400, "invalid_field", "If-Match", "%s",
				     "'If-Match' must be a version like \"3\"");
				return;
			}
		}
		mr__ctl_kv_put(ctl, job, k->key, &p, &k->res);
	} else if (method == MR_HTTP_DELETE) {
		mr__ctl_kv_delete(ctl, job, k->key, &k->res);
	} else {
		int64_t wait = 0;

		if (q_int(k, "wait_ms", 0, CTL_MAX_WAIT_MS, &wait))
			return;
		mr__ctl_kv_get(ctl, job, k->key, wait, k->req, &k->res);
	}
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
			fail(k, 503, "out_of_memory", NULL, "%s", "out of memory");
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
		fail(k, 404, "not_found", "path", "no route for '%.200s'", k->path);
	} else if (!method_ok(k->route, m)) {
		mr_http_add_header(req, "Allow", allow);
		fail(k, 405, "method_not_allowed", "method", "method '%s' is not allowed here",
		     mr_http_req_method_str(req));
	} else if (k->route <= RT_METRICS) {
		ops_route(k);
	} else if (authorized(k, write)) {
		switch (k->route) {
		case RT_JOBS:
			if (m == MR_HTTP_POST)
				h_jobs_post(k);
			else
				h_jobs_get(k);
			break;
		case RT_JOB:
			if (m == MR_HTTP_DELETE)
				mr__ctl_job_delete(&c->ctl, k->job, &k->res);
			else
				h_job_get(k);
			break;
		case RT_JOIN:
			h_join(k);
			break;
		case RT_WAIT:
			h_wait(k);
			break;
		case RT_HEARTBEAT: case RT_LEAVE: case RT_FAIL: case RT_COMPLETE:
			h_member_call(k);
			break;
		default:
			h_kv(k, m);
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
