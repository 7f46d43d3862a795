/*
 * handlers.c - the controller's route handlers (docs/API.md): query
 * and body validation (bounds, node ids, JSON fields), then one call into
 * the core (core/ctl.h) or the diagnosis (diag/diag.h) whose result
 * becomes the reply.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_int.h"
#include "core/json_write.h"
#include "diag/diag.h"
#include "json_read.h"
#include "mr_json.h"
#include "mr_log.h"
#include "mr_topo.h"

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
	json_t *o = mr__json_read_object(b, len);

	if (o)
		return o;
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
		mr__api_fail(k, 400, "invalid_field", "node_id", "%s", "'node_id' is required");
		return 0;
	}
	if (!mr__ctl_valid_node_id(id)) {
		mr__api_fail(k, 400, "invalid_field", "node_id", "%s",
		     "'node_id' must be 1..253 printable characters without spaces");
		return 0;
	}
	return 1;
}

/* ---- handlers ---- */

void mr__api_jobs_post(struct call *k)
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

void mr__api_jobs_get(struct call *k)
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
		mr__api_fail(k, 503, "out_of_memory", NULL, "%s", "out of memory");
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

void mr__api_job_get(struct call *k)
{
	struct ctl_job *job = mr__ctl_job(&k->c->ctl, k->job);
	int64_t members = 0, off = 0, lim = 100;
	struct ctl_member **arr;
	size_t n = 0;
	json_t *ms, *health;

	if (!job) {
		mr__api_fail(k, 404, "job_not_found", "job", "job '%s' does not exist", k->job);
		return;
	}
	if (q_int(k, "members", 0, 1, &members) || q_int(k, "offset", 0, INT32_MAX, &off) ||
	    q_int(k, "limit", 1, LIST_MAX, &lim))
		return;
	mr__res_ok(&k->res, mr__ctl_job_json(job));
	health = mr__ctl_health_json(&k->c->ctl, job);
	if (health && k->res.body)
		json_object_set_new(k->res.body, "health", health);
	else
		json_decref(health);
	if (!members)
		return;
	arr = malloc((mr_dict_len(&job->members) + 1) * sizeof(*arr));
	if (!arr) {
		mr__api_fail(k, 503, "out_of_memory", NULL, "%s", "out of memory");
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

void mr__api_join(struct call *k)
{
	static const char *const keys[] = { "node_id", "host", "host_id", "ports", "pod_index",
					    "topology", "spec", NULL };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	json_t *o = body_obj(k), *ports = NULL, *spec = NULL;
	struct ctl_join j = { .pod_index = -1 };
	struct ctl_spec sp;
	char *ports_txt = NULL;
	size_t ports_len = 0;
	int64_t pod = -1;

	if (!o)
		return;
	if (mr_json_check_keys(o, keys, &eb) ||
	    mr_json_get_str(o, "node_id", 1, CTL_MAX_NODE_ID, &j.node_id, &eb) ||
	    mr_json_get_str(o, "host", 0, CTL_MAX_HOST, &j.host, &eb) ||
	    mr_json_get_str(o, "host_id", 0, CTL_MAX_HOST, &j.host_id, &eb) ||
	    mr_json_get_int(o, "pod_index", 0, 0, 1000000000, &pod, &eb) ||
	    mr_json_get_str(o, "topology", 0, MR_TOPO_MAX_LEN, &j.topology, &eb) ||
	    (j.topology && mr_topo_check(j.topology, "topology", &eb)) ||
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
			mr__api_fail(k, 400, "invalid_field", "ports", "%s", "'ports' has more than 16 entries");
			goto out;
		}
		json_object_foreach(ports, pk, pv) {
			if (strlen(pk) > 32 || !json_is_integer(pv) || json_integer_value(pv) < 0 ||
			    json_integer_value(pv) > 65535) {
				mr__api_fail(k, 400, "invalid_field", "ports",
				     "'ports.%.32s' must be an integer port in [0, 65535]", pk);
				goto out;
			}
		}
		ports_txt = mr__json_write(ports, &ports_len);
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
			mr__api_fail(k, 400, "invalid_field", "spec.name", "%s",
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

void mr__api_member_call(struct call *k)
{
	static const char *const keys[] = { "node_id", "generation", "reason", NULL };
	static const char *const hkeys[] = { "node_id", "generation", "progress", NULL };
	static const char *const fkeys[] = { "node_id", "generation", "reason", "permanent",
					     NULL };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	json_t *o = body_obj(k), *perm, *progress;
	const char *id = NULL, *reason = NULL;
	int64_t gen = -1;
	int permanent = 0;

	if (!o)
		return;
	perm = json_object_get(o, "permanent");
	progress = json_object_get(o, "progress");
	if (mr_json_check_keys(o, k->route == RT_FAIL ? fkeys
				  : k->route == RT_HEARTBEAT ? hkeys : keys, &eb) ||
	    mr_json_get_str(o, "node_id", 1, CTL_MAX_NODE_ID, &id, &eb) ||
	    mr_json_get_int(o, "generation", 0, 0, INT64_MAX, &gen, &eb) ||
	    mr_json_get_str(o, "reason", 0, 1024, &reason, &eb)) {
		bad_field(k, &eb);
	} else if (perm && !json_is_boolean(perm)) {
		mr__api_fail(k, 400, "invalid_field", "permanent", "%s", "'permanent' must be a boolean");
	} else if (progress && mr__ctl_progress_check(progress, INT32_MAX, &k->res)) {
		/* res says which element */
	} else if (node_id_ok(k, id)) {
		permanent = json_is_true(perm);
		if (k->route == RT_HEARTBEAT)
			mr__ctl_heartbeat(&k->c->ctl, k->job, id, gen, progress, &k->res);
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

void mr__api_wait(struct call *k)
{
	const char *id = mr_http_req_query(k->req, "node_id");
	int64_t gen = -1, timeout = 30000;

	if (!node_id_ok(k, id) || q_int(k, "generation", 0, INT64_MAX, &gen) ||
	    q_int(k, "timeout_ms", 0, CTL_MAX_WAIT_MS, &timeout))
		return;
	mr__ctl_wait(&k->c->ctl, k->job, id, gen, timeout, k->req, &k->res);
}

void mr__api_kv(struct call *k, enum mr_http_method method)
{
	struct ctl *ctl = &k->c->ctl;
	const char *node = mr_http_req_query(k->req, "node_id"); /* the caller, optional */
	struct ctl_job *job;
	int64_t gen = -1;

	if (q_int(k, "generation", 0, INT64_MAX, &gen) || (node && !node_id_ok(k, node)))
		return;
	job = mr__ctl_job_for_member(ctl, k->job, gen, node, &k->res);
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
				mr__api_fail(k, 400, "invalid_field", "If-None-Match", "%s",
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
				mr__api_fail(k, 400, "invalid_field", "If-Match", "%s",
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
		mr__ctl_kv_get_as(ctl, job, k->key, wait, node, k->req, &k->res);
	}
}

void mr__api_diagnosis(struct call *k)
{
	struct ctl_job *job = mr__ctl_job(&k->c->ctl, k->job);
	json_t *d;

	if (!job) {
		mr__api_fail(k, 404, "job_not_found", "job", "job '%s' does not exist", k->job);
		return;
	}
	d = mr__ctl_diagnose(&k->c->ctl, job, NULL, 0);
	if (!d) {
		mr__api_fail(k, 503, "out_of_memory", NULL, "%s", "out of memory");
		return;
	}
	mr__res_ok(&k->res, d);
}
