/*
 * waiter.c - suspended long-polls of the controller core.
 *
 * A waiter is linked into its job's list (so a generation bump answers all
 * of them), into a per-key list for KV waits (so a put wakes only the
 * waiters of that key) and into one min-heap by deadline (so timeouts cost
 * O(log n) each, whatever the number of waiters).
 *
 * Non-goals: replying (ctl->wake does that), request lifetime.
 */
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "json_write.h"

static void heap_swap(struct ctl *ctl, size_t a, size_t b)
{
	struct ctl_waiter *t = ctl->heap[a];

	ctl->heap[a] = ctl->heap[b];
	ctl->heap[b] = t;
	ctl->heap[a]->heap_idx = a;
	ctl->heap[b]->heap_idx = b;
}

static void heap_up(struct ctl *ctl, size_t i)
{
	while (i > 0) {
		size_t p = (i - 1) / 2;

		if (ctl->heap[p]->deadline_ms <= ctl->heap[i]->deadline_ms)
			break;
		heap_swap(ctl, i, p);
		i = p;
	}
}

static void heap_down(struct ctl *ctl, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;

		if (l < ctl->heap_len && ctl->heap[l]->deadline_ms < ctl->heap[m]->deadline_ms)
			m = l;
		if (r < ctl->heap_len && ctl->heap[r]->deadline_ms < ctl->heap[m]->deadline_ms)
			m = r;
		if (m == i)
			return;
		heap_swap(ctl, i, m);
		i = m;
	}
}

static void heap_remove(struct ctl *ctl, struct ctl_waiter *w)
{
	size_t i = w->heap_idx;

	ctl->heap_len--;
	if (i != ctl->heap_len) {
		ctl->heap[i] = ctl->heap[ctl->heap_len];
		ctl->heap[i]->heap_idx = i;
		heap_down(ctl, i);
		heap_up(ctl, i);
	}
}

struct ctl_waiter *mr__ctl_waiter_add(struct ctl *ctl, struct ctl_job *job, void *req, int kind,
				      int64_t timeout_ms)
{
	struct ctl_waiter *w;

	if (ctl->heap_len == ctl->heap_cap) {
		size_t ncap = ctl->heap_cap ? ctl->heap_cap * 2 : 64;
		struct ctl_waiter **nh = realloc(ctl->heap, ncap * sizeof(*nh));

		if (!nh)
			return NULL;
		ctl->heap = nh;
		ctl->heap_cap = ncap;
	}
	w = malloc(sizeof(*w)); /* not calloc: glibc's skips the thread cache */
	if (!w)
		return NULL;
	memset(w, 0, sizeof(*w));
	w->req = req;
	w->job = job;
	w->kind = (uint8_t)kind;
	w->deadline_ms = ctl->now_ms + timeout_ms;
	w->heap_idx = ctl->heap_len;
	ctl->heap[ctl->heap_len++] = w;
	heap_up(ctl, w->heap_idx);
	w->next = job->waiters;
	if (job->waiters)
		job->waiters->prev = w;
	job->waiters = w;
	return w;
}

static void unlink_waiter(struct ctl *ctl, struct ctl_waiter *w)
{
	struct ctl_job *job = w->job;

	heap_remove(ctl, w);
	if (w->prev)
		w->prev->next = w->next;
	else
		job->waiters = w->next;
	if (w->next)
		w->next->prev = w->prev;
	if (w->kind == CTL_W_ROUND && w->member && w->member->waiter == w)
		w->member->waiter = NULL;
	if (w->kind == CTL_W_KV) {
		struct ctl_waitq *q = mr_dict_get(&job->kvwait, w->key);

		if (w->kprev)
			w->kprev->knext = w->knext;
		else if (q)
			q->head = w->knext;
		if (w->knext)
			w->knext->kprev = w->kprev;
		if (q && !q->head) {
			mr_dict_del(&job->kvwait, q->key);
			free(q);
		}
	}
}

void mr__ctl_waiter_finish(struct ctl *ctl, struct ctl_waiter *w, struct ctl_res *res)
{
	void *req = w->req;

	unlink_waiter(ctl, w);
	free(w->key);
	free(w);
	if (ctl->wake)
		ctl->wake(ctl, req, res);
	mr__res_release(res);
}

void mr__ctl_waiters_fail(struct ctl *ctl, struct ctl_job *job, int status, const char *code,
			  const char *field, json_t *extra, const char *msg)
{
	while (job->waiters) {
		struct ctl_res res;

		memset(&res, 0, sizeof(res));
		mr__res_err(&res, status, code, field, "%s", msg);
		res.body = json_incref(extra); /* read only: shared by every reply */
		mr__ctl_waiter_finish(ctl, job->waiters, &res);
	}
	json_decref(extra);
}

void mr__ctl_waiters_kv(struct ctl *ctl, struct ctl_job *job, const struct ctl_kv *e)
{
	struct ctl_waitq *q = mr_dict_get(&job->kvwait, e->key);

	while (q) {
		struct ctl_waiter *w = q->head;
		struct ctl_res res;
		int last = w->knext == NULL;

		memset(&res, 0, sizeof(res));
		res.status = 200;
		res.raw = e->data;
		res.raw_len = e->len;
		res.etag = e->version;
		mr__ctl_waiter_finish(ctl, w, &res); /* frees q with the last one */
		if (last)
			break;
	}
}

void mr__ctl_waiters_expire(struct ctl *ctl)
{
	while (ctl->heap_len && ctl->heap[0]->deadline_ms <= ctl->now_ms) {
		struct ctl_waiter *w = ctl->heap[0];
		struct ctl_job *job = w->job;
		struct ctl_res res;

		memset(&res, 0, sizeof(res));
		if (w->kind == CTL_W_KV) {
			mr__res_err(&res, 404, "wait_timeout", "key",
				    "key '%.256s' did not appear before the wait ended", w->key);
		} else {
			struct ctl_member *m = w->member;
			size_t len = 0;
			char *t = mr__json_write_state(job, mr__ctl_member_state_name(m->state), &len);

			mr__res_text(&res, t, len);
			/* a member parked in a long-poll was alive all along */
			mr__ctl_member_touch(ctl, job, m);
		}
		mr__ctl_waiter_finish(ctl, w, &res);
	}
}
