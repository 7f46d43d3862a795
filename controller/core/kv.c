/*
 * kv.c - the per-job, per-generation key/value store of the controller.
 *
 * Values are opaque bytes; every write takes the next version of the job
 * (job->kv_seq), which is the ETag used by compare-and-set. A generation
 * bump clears the store (mr__ctl_kv_clear). Waiters for an absent key are
 * queued per key, so a put wakes only the waiters of its own key.
 *
 * Non-goals: persistence (records.c records what apply does), listing
 * faster than O(keys of the job) (list is an operator/debug call).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

static void kv_free(void *p)
{
	free(p);
}

void mr__ctl_kv_clear(struct ctl *ctl, struct ctl_job *job)
{
	ctl->kv_bytes -= job->kv_bytes;
	job->kv_bytes = 0;
	mr_dict_release(&job->kv, kv_free);
}

int mr__ctl_apply_kv_put(struct ctl *ctl, struct ctl_job *job, const char *key, const void *val,
			 size_t len, uint64_t version)
{
	size_t klen = strlen(key);
	struct ctl_kv *e = malloc(sizeof(*e) + len + klen + 1);
	struct ctl_kv *old;

	if (!e)
		return MR_ENOMEM;
	e->version = version;
	e->len = (uint32_t)len;
	if (len)
		memcpy(e->data, val, len);
	e->key = (char *)e->data + len;
	memcpy(e->key, key, klen + 1);
	old = mr_dict_del(&job->kv, key); /* the dict borrows the old key: drop it first */
	if (mr_dict_put(&job->kv, e->key, e, NULL)) {
		if (old && mr_dict_put(&job->kv, old->key, old, NULL) == 0)
			old = NULL;
		free(old);
		free(e);
		return MR_ENOMEM;
	}
	if (old) {
		job->kv_bytes -= old->len + klen;
		ctl->kv_bytes -= old->len + klen;
		free(old);
	}
	job->kv_bytes += len + klen;
	ctl->kv_bytes += len + klen;
	if (version > job->kv_seq)
		job->kv_seq = version;
	mr__rec_kv_put(ctl, job, e);
	mr__ctl_waiters_kv(ctl, job, e);
	return 0;
}

void mr__ctl_apply_kv_del(struct ctl *ctl, struct ctl_job *job, const char *key)
{
	struct ctl_kv *e = mr_dict_del(&job->kv, key);
	size_t klen = strlen(key);

	if (!e)
		return;
	job->kv_bytes -= e->len + klen;
	ctl->kv_bytes -= e->len + klen;
	mr__rec_kv_del(ctl, job, key);
	free(e);
}

static int check_key(const char *key, struct ctl_res *res)
{
	if (!mr__ctl_valid_key(key, strlen(key))) {
		mr__res_err(res, 400, "invalid_key", "key",
			    "key '%.64s' must be 1..256 bytes of [A-Za-z0-9._/-]", key);
		return 0;
	}
	return 1;
}

static void put(struct ctl *ctl, struct ctl_job *job, const char *key, const void *val,
		size_t len, struct ctl_res *res)
{
	uint64_t v = job->kv_seq + 1;

	if (!mr_dict_get(&job->kv, key) && mr_dict_len(&job->kv) >= ctl->lim.max_keys) {
		mr__res_err(res, 429, "too_many_keys", "key", "job '%s' holds %u keys", job->name,
			    ctl->lim.max_keys);
		return;
	}
	if (mr__ctl_apply_kv_put(ctl, job, key, val, len, v)) {
		mr__res_err(res, 503, "out_of_memory", NULL, "out of memory");
		return;
	}
	mr__res_ok(res, json_pack("{sI}", "version", (json_int_t)v));
	res->etag = v;
}

void mr__ctl_kv_put(struct ctl *ctl, struct ctl_job *job, const char *key,
		    const struct ctl_put *p, struct ctl_res *res)
{
	const struct ctl_kv *e;

	if (!check_key(key, res))
		return;
	if (p->len > ctl->lim.max_value) {
		mr__res_err(res, 413, "value_too_large", "value",
			    "value of %zu bytes is above the limit of %zu", p->len,
			    ctl->lim.max_value);
		return;
	}
	e = mr_dict_get(&job->kv, key);
	if ((p->if_none_match && e) || (p->if_match >= 0 && (!e || e->version != (uint64_t)p->if_match))) {
		mr__res_err(res, 412, "precondition_failed", p->if_none_match ? "If-None-Match" : "If-Match",
			    "key '%s' is at version %llu", key,
			    (unsigned long long)(e ? e->version : 0));
		json_decref(res->body);
		res->body = json_pack("{sI}", "version", (json_int_t)(e ? e->version : 0));
		return;
	}
	put(ctl, job, key, p->val, p->len, res);
}

void mr__ctl_kv_get(struct ctl *ctl, struct ctl_job *job, const char *key, int64_t wait_ms,
		    void *req, struct ctl_res *res)
{
	mr__ctl_kv_get_as(ctl, job, key, wait_ms, NULL, req, res);
}

void mr__ctl_kv_get_as(struct ctl *ctl, struct ctl_job *job, const char *key, int64_t wait_ms,
		       const char *node_id, void *req, struct ctl_res *res)
{
	const struct ctl_kv *e;
	struct ctl_waitq *q;
	struct ctl_waiter *w;
	char *kc;
	size_t klen, nlen = node_id ? strlen(node_id) + 1 : 0;

	if (!check_key(key, res))
		return;
	e = mr_dict_get(&job->kv, key);
	if (e) {
		res->status = 200;
		res->raw = e->data;
		res->raw_len = e->len;
		res->etag = e->version;
		return;
	}
	if (wait_ms <= 0 || !req) {
		mr__res_err(res, 404, "not_found", "key", "key '%s' is not set", key);
		return;
	}
	klen = strlen(key);
	q = mr_dict_get(&job->kvwait, key);
	if (!q) {
		q = calloc(1, sizeof(*q) + klen + 1);
		if (!q)
			goto oom;
		memcpy(q->key, key, klen + 1);
		if (mr_dict_put(&job->kvwait, q->key, q, NULL)) {
			free(q);
			goto oom;
		}
	}
	kc = malloc(klen + 1 + nlen); /* the key, then the node id */
	if (kc) {
		memcpy(kc, key, klen + 1);
		if (nlen)
			memcpy(kc + klen + 1, node_id, nlen);
	}
	w = kc ? mr__ctl_waiter_add(ctl, job, req, CTL_W_KV, wait_ms) : NULL;
	if (!w) {
		free(kc);
		if (!q->head) {
			mr_dict_del(&job->kvwait, q->key);
			free(q);
		}
		goto oom;
	}
	w->key = kc;
	w->node = nlen ? kc + klen + 1 : NULL;
	w->knext = q->head;
	if (q->head)
		q->head->kprev = w;
	q->head = w;
	res->suspended = 1;
	return;
oom:
	mr__res_err(res, 503, "out_of_memory", NULL, "out of memory");
}

void mr__ctl_kv_add(struct ctl *ctl, struct ctl_job *job, const char *key, int64_t delta,
		    struct ctl_res *res)
{
	const struct ctl_kv *e;
	long long cur = 0, nv;
	char buf[32];
	int n;

	if (!check_key(key, res))
		return;
	e = mr_dict_get(&job->kv, key);
	if (e) {
		char *end;

		if (e->len == 0 || e->len >= sizeof(buf)) {
			mr__res_err(res, 409, "not_integer", "key",
				    "value of key '%s' is not a decimal integer", key);
			return;
		}
		memcpy(buf, e->data, e->len);
		buf[e->len] = 0;
		errno = 0;
		cur = strtoll(buf, &end, 10);
		if (errno || *end) {
			mr__res_err(res, 409, "not_integer", "key",
				    "value of key '%s' is not a decimal integer", key);
			return;
		}
	}
	if (__builtin_add_overflow(cur, (long long)delta, &nv)) {
		mr__res_err(res, 400, "invalid_field", "delta", "'delta' overflows the counter");
		return;
	}
	n = snprintf(buf, sizeof(buf), "%lld", nv);
	put(ctl, job, key, buf, (size_t)n, res);
	if (res->status == 200)
		json_object_set_new(res->body, "value", json_integer(nv));
}

void mr__ctl_kv_delete(struct ctl *ctl, struct ctl_job *job, const char *key,
		       struct ctl_res *res)
{
	if (!check_key(key, res))
		return;
	if (!mr_dict_get(&job->kv, key)) {
		mr__res_err(res, 404, "not_found", "key", "key '%s' is not set", key);
		return;
	}
	mr__ctl_apply_kv_del(ctl, job, key);
	mr__res_ok(res, json_pack("{sb}", "deleted", 1));
}

static int cmp_kv(const void *a, const void *b)
{
	return strcmp((*(struct ctl_kv *const *)a)->key, (*(struct ctl_kv *const *)b)->key);
}

void mr__ctl_kv_list(struct ctl *ctl, struct ctl_job *job, const char *prefix, size_t offset,
		     size_t limit, struct ctl_res *res)
{
	size_t plen = strlen(prefix), n = 0, cur = 0;
	struct ctl_kv **arr = NULL;
	json_t *keys;
	void *v;

	(void)ctl;
	if (mr_dict_len(&job->kv)) {
		arr = malloc(mr_dict_len(&job->kv) * sizeof(*arr));
		if (!arr) {
			mr__res_err(res, 503, "out_of_memory", NULL, "out of memory");
			return;
		}
	}
	while (mr_dict_next(&job->kv, &cur, NULL, &v)) {
		struct ctl_kv *e = v;

		if (strncmp(e->key, prefix, plen) == 0)
			arr[n++] = e;
	}
	if (n)
		qsort(arr, n, sizeof(*arr), cmp_kv);
	keys = json_array();
	for (size_t i = offset; i < n && i < offset + limit; i++)
		json_array_append_new(keys, json_pack("{ss sI sI}", "key", arr[i]->key, "size",
						      (json_int_t)arr[i]->len, "version",
						      (json_int_t)arr[i]->version));
	mr__res_ok(res, json_pack("{so sI sI}", "keys", keys, "total", (json_int_t)n,
				  "generation", (json_int_t)job->generation));
	json_object_set_new(res->body, "next",
			    offset + limit < n ? json_integer((json_int_t)(offset + limit))
					       : json_null());
	free(arr);
}
