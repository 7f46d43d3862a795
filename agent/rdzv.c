/*
 * rdzv.c - rendezvous client over mr_httpc; see rdzv.h and docs/API.md.
 *
 * Two clients: one for the supervisor's calls, one owned by the heartbeat
 * thread, so a long-poll never delays a beat.
 *
 * This file: the calls of the supervisor (join, wait, leave, fail,
 * complete, KV); rdzv_hb.c is the heartbeat thread.
 *
 * Non-goals: deciding what to do with an answer (supervisor.c).
 */
#include "rdzv_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mr_httpc.h"
#include "mr_json.h"
#include "mr_log.h"



static void encode(const char *in, char *out, size_t cap)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t o = 0;

	for (; *in && o + 4 < cap; in++) {
		unsigned char ch = (unsigned char)*in;

		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		    (ch >= '0' && ch <= '9') || ch == '-' || ch == '.' || ch == '_' || ch == '~') {
			out[o++] = (char)ch;
		} else {
			out[o++] = '%';
			out[o++] = hex[ch >> 4];
			out[o++] = hex[ch & 15];
		}
	}
	out[o] = '\0';
}

static int init_client(struct mr_httpc *c, const struct mr_rdzv_opts *o, long timeout,
		       struct mr_errbuf *eb)
{
	struct mr_httpc_opts ho = {.base_url = o->controller,
				   .token = o->token && o->token[0] ? o->token : NULL,
				   .connect_timeout_ms = 2000,
				   .timeout_ms = timeout,
				   .max_retries = 3,
				   .backoff_initial_ms = 50,
				   .backoff_max_ms = 1000,
				   .max_response = 1 << 20};

	return mr_httpc_init(c, &ho, eb);
}

/* Frees what mr_rdzv_new() allocated besides the HTTP clients, and r. */
static void free_fields(struct mr_rdzv *r)
{
	free(r->node_id);
	free(r->host);
	free(r->host_id);
	free(r->topology);
	json_decref(r->spec);
	pthread_mutex_destroy(&r->hb_lock);
	pthread_cond_destroy(&r->hb_cond);
	pthread_mutex_destroy(&r->end_lock);
	pthread_mutex_destroy(&r->note_lock);
	free(r);
}

int mr_rdzv_new(struct mr_rdzv **out, const struct mr_rdzv_opts *o, struct mr_errbuf *eb)
{
	struct mr_rdzv *r = calloc(1, sizeof(*r));
	int err;

	*out = NULL;
	if (!r)
		return MR_ENOMEM;
	r->call_timeout_ms = o->call_timeout_ms > 0 ? o->call_timeout_ms : 5000;
	snprintf(r->base, sizeof(r->base), "/v1/jobs/%s", o->job);
	encode(o->node_id, r->node_q, sizeof(r->node_q));
	r->node_id = strdup(o->node_id);
	r->host = strdup(o->host ? o->host : "");
	r->host_id = strdup(o->host_id ? o->host_id : "");
	r->topology = strdup(o->topology ? o->topology : "");
	r->spec = o->spec ? json_deep_copy(o->spec) : NULL;
	r->pod_index = o->pod_index;
	r->agent_port = o->agent_port;
	atomic_init(&r->stale_restarts, -1);
	atomic_init(&r->last_answer_ms, mr__rdzv_now_ms());
	pthread_mutex_init(&r->hb_lock, NULL);
	pthread_cond_init(&r->hb_cond, NULL);
	pthread_mutex_init(&r->end_lock, NULL);
	pthread_mutex_init(&r->note_lock, NULL);
	if (!r->node_id || !r->host || !r->host_id || !r->topology || (o->spec && !r->spec)) {
		err = MR_ENOMEM;
		goto fail;
	}
	err = init_client(&r->c, o, r->call_timeout_ms, eb);
	if (err)
		goto fail;
	err = init_client(&r->hbc, o, HB_TIMEOUT_MS, eb);
	if (err) {
		mr_httpc_release(&r->c);
		goto fail;
	}
	*out = r;
	return 0;
fail:
	free_fields(r);
	return err;
}

void mr_rdzv_free(struct mr_rdzv *r)
{
	if (!r)
		return;
	mr_rdzv_hb_stop(r);
	mr_httpc_release(&r->c);
	mr_httpc_release(&r->hbc);
	free_fields(r);
}

void mr_rdzv_set_agent_port(struct mr_rdzv *r, int port)
{
	r->agent_port = port;
}

void mr_rdzv_abort(struct mr_rdzv *r)
{
	mr_httpc_abort(&r->c);
	mr_httpc_abort(&r->hbc);
}

void mr_rdzv_resume(struct mr_rdzv *r)
{
	mr_httpc_clear_abort(&r->c);
}

long long mr__rdzv_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int mr__rdzv_request(struct mr_rdzv *r, struct mr_httpc *c, const struct mr_httpc_req *rq,
		     struct mr_http_resp *resp, struct mr_errbuf *eb)
{
	int err = mr_httpc_request(c, rq, resp, eb);

	if (!err && resp->status < 500)
		atomic_store(&r->last_answer_ms, mr__rdzv_now_ms());
	return err;
}

long long mr_rdzv_silent_ms(struct mr_rdzv *r)
{
	long long d = mr__rdzv_now_ms() - atomic_load(&r->last_answer_ms);

	return d > 0 ? d : 0;
}

/* Records the end of the job (first one wins). */
static void set_ended(struct mr_rdzv *r, int end, const char *reason)
{
	pthread_mutex_lock(&r->end_lock);
	if (!atomic_load(&r->ended)) {
		snprintf(r->end_reason, sizeof(r->end_reason), "%s", reason ? reason : "");
		atomic_store(&r->ended, end);
	}
	pthread_mutex_unlock(&r->end_lock);
}

int mr_rdzv_ended(struct mr_rdzv *r, char *reason, size_t cap)
{
	int end = atomic_load(&r->ended);

	if (end && reason && cap) {
		size_t n;

		pthread_mutex_lock(&r->end_lock);
		n = strnlen(r->end_reason, cap - 1);
		memcpy(reason, r->end_reason, n);
		reason[n] = '\0';
		pthread_mutex_unlock(&r->end_lock);
	}
	return end;
}

static int get_int(json_t *j, const char *k, int *out)
{
	json_t *v = json_object_get(j, k);

	if (!json_is_integer(v))
		return MR_EPROTO;
	*out = (int)json_integer_value(v);
	return 0;
}

/* A wait's "running" reply (or a 409's "member" of that state) into
 * round: 0, or MR_EPROTO when a field is missing. */
static int parse_round(json_t *reply, struct mr_rdzv_round *round)
{
	json_t *mesh = json_object_get(reply, "mesh");

	memset(round, 0, sizeof(*round));
	if (get_int(reply, "generation", &round->generation) ||
	    get_int(reply, "num_nodes", &round->num_nodes) ||
	    get_int(reply, "node_rank", &round->node_rank) ||
	    get_int(reply, "nproc_per_node", &round->nproc_per_node) ||
	    get_int(reply, "world_size", &round->world_size) ||
	    get_int(reply, "rank_base", &round->rank_base) || get_int(mesh, "tp", &round->tp) ||
	    get_int(mesh, "pp", &round->pp) || get_int(mesh, "cp", &round->cp) ||
	    get_int(mesh, "ep", &round->ep) || get_int(mesh, "dp", &round->dp))
		return MR_EPROTO;
	if (get_int(reply, "restarts", &round->restarts))
		round->restarts = -1; /* an older controller */
	return 0;
}

/* A 409's "member" (docs/API.md): the controller carried this member into
 * a newer round. Kept unless a note of a newer generation, or of the same
 * one and running, is there already. */
static void note_member(struct mr_rdzv *r, json_t *member)
{
	const char *st = json_string_value(json_object_get(member, "state"));
	struct mr_rdzv_round round;
	int gen = 0, state;

	if (!st || get_int(member, "generation", &gen))
		return;
	if (!strcmp(st, "running") && !parse_round(member, &round))
		state = MR_RDZV_CARRIED_RUNNING;
	else if (!strcmp(st, "waiting") || !strcmp(st, "standby"))
		state = MR_RDZV_CARRIED_WAITING;
	else
		return;
	pthread_mutex_lock(&r->note_lock);
	if (gen > r->note_gen || (gen == r->note_gen && state > r->note_state)) {
		r->note_gen = gen;
		r->note_state = state;
		if (state == MR_RDZV_CARRIED_RUNNING)
			r->note_round = round;
	}
	pthread_mutex_unlock(&r->note_lock);
}

int mr_rdzv_carried(struct mr_rdzv *r, int after_gen, int *gen, struct mr_rdzv_round *round)
{
	int state;

	pthread_mutex_lock(&r->note_lock);
	state = r->note_gen > after_gen ? r->note_state : MR_RDZV_NOT_CARRIED;
	if (state) {
		*gen = r->note_gen;
		if (state == MR_RDZV_CARRIED_RUNNING)
			*round = r->note_round;
	}
	r->note_gen = 0;
	r->note_state = MR_RDZV_NOT_CARRIED;
	pthread_mutex_unlock(&r->note_lock);
	return state;
}

/* Maps a non-2xx answer to an MR_E* code; 409 fills *gen_out (and notes a
 * carried member); 410 records the end of the job. */
int mr__rdzv_map_status(struct mr_rdzv *r, long status, const char *body, size_t len,
		      int *gen_out, struct mr_errbuf *eb)
{
	json_t *j = body && len ? json_loadb(body, len, 0, NULL) : NULL;
	const char *code = NULL, *msg = NULL;
	json_t *e = j ? json_object_get(j, "error") : NULL;
	int err;

	if (e) {
		code = json_string_value(json_object_get(e, "code"));
		msg = json_string_value(json_object_get(e, "message"));
	}
	if (status == 409) {
		json_t *g = j ? json_object_get(j, "generation") : NULL;
		json_t *rs = j ? json_object_get(j, "restarts") : NULL;
		json_t *mem = j ? json_object_get(j, "member") : NULL;

		if (gen_out && json_is_integer(g))
			*gen_out = (int)json_integer_value(g);
		if (json_is_integer(rs))
			atomic_store(&r->stale_restarts, (int)json_integer_value(rs));
		if (json_is_object(mem))
			note_member(r, mem);
		err = MR_ESTALE;
	} else if (status == 404 && code && !strcmp(code, "wait_timeout")) {
		err = MR_ETIMEDOUT;
	} else if (status == 410) {
		json_t *why = j ? json_object_get(j, "reason") : NULL;
		int end = MR_RDZV_DELETED;

		if (code && !strcmp(code, "job_failed"))
			end = MR_RDZV_FAILED;
		else if (code && !strcmp(code, "job_succeeded"))
			end = MR_RDZV_SUCCEEDED;
		set_ended(r, end, json_is_string(why) ? json_string_value(why)
				  : msg ? msg : "the job was deleted");
		err = MR_ECLOSED;
	} else if (status == 404) {
		err = MR_ENOTFOUND;
	} else if (status == 412) {
		err = MR_ECONFLICT;
	} else if (status == 401 || status == 403) {
		err = MR_EAUTH;
	} else if (status >= 500) {
		err = MR_ECONN;
	} else {
		err = MR_EPROTO;
	}
	mr_errf(eb, err, "controller answered %ld %s: %s", status, code ? code : "",
		msg ? msg : "no message");
	json_decref(j);
	return err;
}

/* JSON call; *reply (may be NULL) gets the parsed 2xx body. */
static int call_json(struct mr_rdzv *r, struct mr_httpc *c, const char *method,
		     const char *path, json_t *body, long timeout_ms, int max_retries,
		     json_t **reply, int *gen_out, struct mr_errbuf *eb)
{
	struct mr_httpc_req rq = {.method = method, .path = path, .timeout_ms = timeout_ms,
				  .max_retries = max_retries};
	struct mr_http_resp resp = {0};
	char *text = NULL;
	int err;

	if (reply)
		*reply = NULL;
	if (body) {
		text = json_dumps(body, JSON_COMPACT);
		if (!text)
			return MR_ENOMEM;
		rq.body = text;
		rq.body_len = strlen(text);
		rq.content_type = "application/json";
	}
	err = mr__rdzv_request(r, c, &rq, &resp, eb);
	free(text);
	if (err)
		return err;
	if (resp.status >= 200 && resp.status < 300) {
		if (reply) {
			*reply = json_loadb(resp.body, resp.len, 0, NULL);
			if (!*reply)
				err = mr_errf(eb, MR_EPROTO, "controller sent a body that is not "
							     "JSON");
		}
	} else {
		err = mr__rdzv_map_status(r, resp.status, resp.body, resp.len, gen_out, eb);
	}
	mr_http_resp_release(&resp);
	return err;
}

int mr_rdzv_join(struct mr_rdzv *r, int *gen, int *standby, struct mr_errbuf *eb)
{
	char path[PATH_MAX_LEN + 16];
	json_t *body, *reply = NULL;
	const char *state;
	int err;

	snprintf(path, sizeof(path), "%s/join", r->base);
	body = json_pack("{s:s, s:s, s:s}", "node_id", r->node_id, "host", r->host, "host_id",
			 r->host_id);
	if (!body)
		return MR_ENOMEM;
	if (r->agent_port > 0)
		json_object_set_new(body, "ports", json_pack("{s:i}", "agent", r->agent_port));
	if (r->pod_index >= 0)
		json_object_set_new(body, "pod_index", json_integer(r->pod_index));
	if (r->topology && r->topology[0])
		json_object_set_new(body, "topology", json_string(r->topology));
	if (r->spec)
		json_object_set(body, "spec", r->spec);
	err = call_json(r, &r->c, "POST", path, body, 0, -1, &reply, NULL, eb);
	json_decref(body);
	if (err)
		return err;
	if (get_int(reply, "generation", gen)) {
		json_decref(reply);
		return mr_errf(eb, MR_EPROTO, "join reply without 'generation'");
	}
	state = json_string_value(json_object_get(reply, "state"));
	*standby = state && !strcmp(state, "standby");
	json_decref(reply);
	return 0;
}

int mr_rdzv_wait(struct mr_rdzv *r, int gen, long timeout_ms, struct mr_rdzv_round *round,
		 int *gen_out, struct mr_errbuf *eb)
{
	char path[PATH_MAX_LEN + 1024];
	const char *state;
	json_t *reply = NULL;
	int err = 0;

	snprintf(path, sizeof(path), "%s/wait?node_id=%s&generation=%d&timeout_ms=%ld", r->base,
		 r->node_q, gen, timeout_ms);
	err = call_json(r, &r->c, "GET", path, NULL, timeout_ms + r->call_timeout_ms, -1,
			&reply, gen_out, eb);
	if (err)
		return err;
	state = json_string_value(json_object_get(reply, "state"));
	if (!state || strcmp(state, "running")) {
		json_decref(reply);
		return MR_ETIMEDOUT;
	}
	if (parse_round(reply, round))
		err = mr_errf(eb, MR_EPROTO, "wait reply misses a field of the round");
	json_decref(reply);
	return err;
}

int mr__rdzv_member_call(struct mr_rdzv *r, struct mr_httpc *c, const char *what, int gen,
		       const char *reason, int retries, int *gen_out, struct mr_errbuf *eb)
{
	return mr__rdzv_member_call_x(r, c, what, gen, reason, NULL, retries, gen_out, eb);
}

int mr__rdzv_member_call_x(struct mr_rdzv *r, struct mr_httpc *c, const char *what, int gen,
			   const char *reason, json_t *extra, int retries, int *gen_out,
			   struct mr_errbuf *eb)
{
	char path[PATH_MAX_LEN + 32];
	json_t *body = json_pack("{s:s}", "node_id", r->node_id);
	int err;

	if (!body)
		return MR_ENOMEM;
	if (extra)
		json_object_update(body, extra);
	if (gen >= 0)
		json_object_set_new(body, "generation", json_integer(gen));
	if (reason)
		json_object_set_new(body, "reason", json_string(reason));
	if (!strcmp(what, "fail/permanent")) {
		json_object_set_new(body, "permanent", json_true());
		what = "fail";
	}
	snprintf(path, sizeof(path), "%s/%s", r->base, what);
	err = call_json(r, c, "POST", path, body, 0, retries, NULL, gen_out, eb);
	json_decref(body);
	return err;
}

int mr_rdzv_heartbeat(struct mr_rdzv *r, int gen, int *gen_out, struct mr_errbuf *eb)
{
	return mr__rdzv_member_call(r, &r->c, "heartbeat", gen, NULL, -1, gen_out, eb);
}

int mr_rdzv_leave(struct mr_rdzv *r, int gen, const char *reason, struct mr_errbuf *eb)
{
	return mr__rdzv_member_call(r, &r->c, "leave", gen, reason, 1, NULL, eb);
}

int mr_rdzv_fail(struct mr_rdzv *r, int gen, const char *reason, struct mr_errbuf *eb)
{
	return mr__rdzv_member_call(r, &r->c, "fail", gen, reason, 1, NULL, eb);
}

int mr_rdzv_fail_job(struct mr_rdzv *r, const char *reason, struct mr_errbuf *eb)
{
	return mr__rdzv_member_call(r, &r->c, "fail/permanent", -1, reason, 1, NULL, eb);
}

int mr_rdzv_complete(struct mr_rdzv *r, int gen, struct mr_errbuf *eb)
{
	return mr__rdzv_member_call(r, &r->c, "complete", gen, NULL, 1, NULL, eb);
}

int mr_rdzv_kv_put(struct mr_rdzv *r, int gen, const char *key, const void *val, size_t len,
		   struct mr_errbuf *eb)
{
	char path[PATH_MAX_LEN + 1600];
	struct mr_httpc_req rq = {.method = "PUT", .path = path,
				  .content_type = "application/octet-stream", .body = val,
				  .body_len = len, .max_retries = -1};
	struct mr_http_resp resp = {0};
	int err;

	snprintf(path, sizeof(path), "%s/kv/%s?generation=%d&node_id=%s", r->base, key, gen,
		 r->node_q);
	err = mr__rdzv_request(r, &r->c, &rq, &resp, eb);
	if (err)
		return err;
	if (resp.status != 200)
		err = mr__rdzv_map_status(r, resp.status, resp.body, resp.len, NULL, eb);
	mr_http_resp_release(&resp);
	return err;
}

int mr_rdzv_kv_get(struct mr_rdzv *r, int gen, const char *key, void *buf, size_t cap,
		   size_t *len, long wait_ms, struct mr_errbuf *eb)
{
	char path[PATH_MAX_LEN + 1600];
	struct mr_httpc_req rq = {.method = "GET", .path = path,
				  .timeout_ms = wait_ms + r->call_timeout_ms, .max_retries = -1};
	struct mr_http_resp resp = {0};
	int err;

	if (wait_ms > 0)
		snprintf(path, sizeof(path), "%s/kv/%s?generation=%d&wait_ms=%ld&node_id=%s",
			 r->base, key, gen, wait_ms, r->node_q);
	else
		snprintf(path, sizeof(path), "%s/kv/%s?generation=%d&node_id=%s", r->base, key,
			 gen, r->node_q);
	err = mr__rdzv_request(r, &r->c, &rq, &resp, eb);
	if (err)
		return err;
	if (resp.status == 200) {
		*len = resp.len;
		memcpy(buf, resp.body, resp.len < cap ? resp.len : cap);
	} else {
		err = mr__rdzv_map_status(r, resp.status, resp.body, resp.len, NULL, eb);
	}
	mr_http_resp_release(&resp);
	return err;
}

int mr_rdzv_kv_add(struct mr_rdzv *r, int gen, const char *key, long long delta,
		   long long *out, struct mr_errbuf *eb)
{
	char path[PATH_MAX_LEN + 1600];
	json_t *body = json_pack("{s:I}", "delta", (json_int_t)delta), *reply = NULL;
	json_t *v;
	int err;

	if (!body)
		return MR_ENOMEM;
	snprintf(path, sizeof(path), "%s/kv/%s/add?generation=%d&node_id=%s", r->base, key, gen,
		 r->node_q);
	/* not idempotent: never resent */
	err = call_json(r, &r->c, "POST", path, body, 0, 0, &reply, NULL, eb);
	json_decref(body);
	if (err)
		return err;
	v = json_object_get(reply, "value");
	if (json_is_integer(v))
		*out = json_integer_value(v);
	else
		err = mr_errf(eb, MR_EPROTO, "add reply without 'value'");
	json_decref(reply);
	return err;
}
