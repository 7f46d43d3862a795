/*
 * progress.c - this node's ranks' progress for the heartbeat; see
 * progress.h and docs/API.md ("Progress") for the wire form.
 */
#include "progress.h"

#include <stdlib.h>
#include <string.h>

void mr_agent_progress_init(struct mr_agent_progress *p)
{
	memset(p, 0, sizeof(*p));
	pthread_mutex_init(&p->lock, NULL);
}

void mr_agent_progress_release(struct mr_agent_progress *p)
{
	mr_agent_progress_detach(p);
	pthread_mutex_destroy(&p->lock);
}

int mr_agent_progress_attach(struct mr_agent_progress *p, struct mr_inproc *ip)
{
	struct mr_agent_prank *r = calloc((size_t)(ip->n > 0 ? ip->n : 1), sizeof(*r));

	if (!r)
		return MR_ENOMEM;
	for (int i = 0; i < ip->n; i++)
		r[i].rank = ip->rank[i].env.rank;
	pthread_mutex_lock(&p->lock);
	free(p->r);
	p->r = r;
	p->n = ip->n;
	p->ip = ip;
	pthread_mutex_unlock(&p->lock);
	return 0;
}

void mr_agent_progress_detach(struct mr_agent_progress *p)
{
	pthread_mutex_lock(&p->lock);
	free(p->r);
	p->r = NULL;
	p->n = 0;
	p->ip = NULL;
	pthread_mutex_unlock(&p->lock);
}

void mr_agent_progress_step(struct mr_agent_progress *p, int i, const struct mr_worker_stats *st)
{
	pthread_mutex_lock(&p->lock);
	if (i >= 0 && i < p->n && st->step > p->r[i].step_seen) {
		struct mr_agent_prank *r = &p->r[i];
		double busy = st->step_seconds - st->comm_wait_s;

		r->step_seen = st->step;
		r->sum_step_s += st->step_seconds;
		r->sum_busy_s += busy > 0.0 ? busy : 0.0;
		r->nsteps++;
	}
	pthread_mutex_unlock(&p->lock);
}

/* 1 when what the controller compares differs from the last report. */
static int differs(const struct mr_worker_progress *a, const struct mr_worker_progress *b)
{
	if (a->step != b->step || a->micro != b->micro || a->ngroups != b->ngroups)
		return 1;
	for (int j = 0; j < a->ngroups; j++) {
		const struct mr_worker_group_progress *x = &a->group[j], *y = &b->group[j];

		if (x->kind != y->kind || x->id != y->id || x->size != y->size ||
		    x->entered != y->entered || x->completed != y->completed ||
		    x->entered_op != y->entered_op || x->peer != y->peer)
			return 1;
	}
	return 0;
}

/* [kind, id, size, entered, op, peer, completed] */
static json_t *group_json(const struct mr_worker_group_progress *g)
{
	return json_pack("[i i i I i i I]", g->kind, g->id, g->size, (json_int_t)g->entered,
			 g->entered_op, g->peer, (json_int_t)g->completed);
}

static json_t *rank_json(struct mr_agent_prank *r, const struct mr_worker_progress *now)
{
	json_t *o = json_pack("{si sI si}", "rank", r->rank, "step", (json_int_t)now->step,
			      "micro", now->micro);
	json_t *g = json_array();

	if (!o || !g) {
		json_decref(o);
		json_decref(g);
		return NULL;
	}
	for (int j = 0; j < now->ngroups; j++)
		json_array_append_new(g, group_json(&now->group[j]));
	json_object_set_new(o, "g", g);
	if (r->nsteps > 0) {
		json_object_set_new(o, "step_ms", json_real(r->sum_step_s * 1e3 / r->nsteps));
		json_object_set_new(o, "busy_ms", json_real(r->sum_busy_s * 1e3 / r->nsteps));
	}
	return o;
}

json_t *mr_agent_progress_json(struct mr_agent_progress *p, int full)
{
	struct mr_worker_progress *now = NULL;
	json_t *arr = NULL;
	int send = full, got = 0;

	pthread_mutex_lock(&p->lock);
	if (!p->ip || p->n < 1)
		goto out;
	now = calloc((size_t)p->n, sizeof(*now));
	if (!now)
		goto out;
	for (int i = 0; i < p->n; i++) {
		struct mr_agent_prank *r = &p->r[i];

		now[i].micro = -1;
		if (mr_inproc_progress(p->ip, i, &now[i]) == 0)
			got++;
		send |= !r->have_sent || r->nsteps > 0 || differs(&now[i], &r->sent);
	}
	if (!got || !send)
		goto out; /* nothing created yet, or nothing new */
	arr = json_array();
	for (int i = 0; arr && i < p->n; i++) {
		struct mr_agent_prank *r = &p->r[i];

		json_array_append_new(arr, rank_json(r, &now[i]));
		r->sent = now[i];
		r->have_sent = 1;
		r->sum_step_s = r->sum_busy_s = 0.0;
		r->nsteps = 0;
	}
out:
	pthread_mutex_unlock(&p->lock);
	free(now);
	return arr;
}
