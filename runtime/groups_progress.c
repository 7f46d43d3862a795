/*
 * groups_progress.c - what a rank's communicators are doing, for hang
 * diagnosis (see mr_groups.h, mr_groups_progress): each distinct
 * communicator once, named by a group kind and id every member of it
 * agrees on, with the last operation entered and completed there.
 *
 * Non-goals: deciding who is stuck (the controller compares ranks).
 */
#include <string.h>

#include "mr_groups.h"

_Static_assert(MR_WORKER_COMM_OPS == MR_COMM_OP__COUNT, "mr_worker.h's count of operations");

/* Most specific first: a communicator shared by dp and world (a pure
 * data-parallel mesh) is reported as dp. */
static const enum mr_mesh_group prefer[MR_GROUP__COUNT] = {
	MR_GROUP_TP,    MR_GROUP_CP,    MR_GROUP_DP, MR_GROUP_PP,       MR_GROUP_EP,
	MR_GROUP_EDP,   MR_GROUP_DP_CP, MR_GROUP_TP_CP, MR_GROUP_MP,    MR_GROUP_TP_EP_PP,
	MR_GROUP_WORLD,
};

static int listed(struct mr_comm *const *seen, int n, const struct mr_comm *c)
{
	for (int i = 0; i < n; i++)
		if (seen[i] == c)
			return 1;
	return 0;
}

/* The lowest world rank of rank's HSDP shard (replica: 0) group. */
static int hsdp_id(const struct mr_groups *g, int replica)
{
	struct mr_mesh_coord c = g->me;
	int s = g->hsdp_shard;

	c.dp = replica ? c.dp % s : (c.dp / s) * s;
	return mr_mesh_rank(&g->mesh, &c);
}

static void fill(struct mr_worker_group_progress *p, const struct mr_comm *c, int kind, int id)
{
	struct mr_comm_progress cp;

	mr_comm_progress(c, &cp);
	p->kind = kind;
	p->id = id;
	p->size = mr_comm_size(c);
	p->entered = cp.entered;
	p->completed = cp.completed;
	p->entered_op = cp.entered_op;
	p->completed_op = cp.completed_op;
	p->peer = cp.peer;
	memcpy(p->wait_s, cp.wait_op_s, sizeof(p->wait_s));
}

int mr_groups_progress(const struct mr_groups *g, struct mr_worker_group_progress *out, int cap,
		       double *wait_s)
{
	struct mr_comm *seen[MR_GROUP__COUNT + 4] = { 0 };
	struct mr_mesh_coord first = g->me;
	struct mr_comm_progress cp;
	double wait = 0.0;
	int n = 0, k;

	for (int i = 0; i < MR_GROUP__COUNT; i++) {
		struct mr_comm *c = g->group[prefer[i]];

		if (!c || listed(seen, n, c))
			continue;
		seen[n] = c;
		if (n < cap)
			fill(&out[n], c, prefer[i], mr_mesh_group_id(&g->mesh, prefer[i], g->rank));
		n++;
	}
	for (k = 0; k < 2; k++) {
		struct mr_comm *c = k ? g->replica : g->shard;

		if (!c || listed(seen, n, c))
			continue;
		seen[n] = c;
		if (n < cap)
			fill(&out[n], c, k ? MR_WORKER_GROUP_HSDP_REPLICA : MR_WORKER_GROUP_HSDP_SHARD,
			     hsdp_id(g, k));
		n++;
	}
	if (g->embed && !listed(seen, n, g->embed)) {
		seen[n] = g->embed;
		first.pp = 0;
		if (n < cap)
			fill(&out[n], g->embed, MR_WORKER_GROUP_EMBED, mr_mesh_rank(&g->mesh, &first));
		n++;
	}
	if (g->kv && !listed(seen, n, g->kv)) {
		seen[n] = g->kv;
		if (n < cap) /* its first member: the same place, tp index rounded down */
			fill(&out[n], g->kv, MR_WORKER_GROUP_KV,
			     g->rank - g->me.tp % mr_comm_size(g->kv));
		n++;
	}
	for (k = 0; k < n; k++) {
		mr_comm_progress(seen[k], &cp);
		wait += cp.wait_s;
	}
	if (wait_s)
		*wait_s = wait;
	return n < cap ? n : cap;
}
