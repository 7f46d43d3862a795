/*
 * groups.c - a rank's mesh communicators (see mr_groups.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_groups.h"

static int mesh_of(const struct mr_worker_env *env, struct mr_mesh *m, struct mr_errbuf *eb)
{
	return mr_mesh_init(m, env->world_size, env->tp > 0 ? env->tp : 1,
			    env->pp > 0 ? env->pp : 1, env->cp > 0 ? env->cp : 1,
			    env->ep > 0 ? env->ep : 1, 0, eb);
}

int mr_groups_check(const struct mr_worker_env *env, int hsdp_shard, struct mr_errbuf *eb)
{
	struct mr_mesh m;
	int rc = mesh_of(env, &m, eb);

	if (rc < 0)
		return rc;
	if (m.pp > 1 || m.cp > 1 || m.ep > 1)
		return mr_errf_field(eb, MR_EINVAL, m.pp > 1 ? "pp" : m.cp > 1 ? "cp" : "ep",
				     "the gpt runtime does not implement pp/cp/ep > 1 yet "
				     "(mesh pp=%d cp=%d ep=%d)", m.pp, m.cp, m.ep);
	if (hsdp_shard < 0 || (hsdp_shard > 0 && m.dp % hsdp_shard != 0))
		return mr_errf_field(eb, MR_EINVAL, "hsdp_shard",
				     "'hsdp_shard' (%d) must divide the data-parallel size dp=%d",
				     hsdp_shard, m.dp);
	return 0;
}

/* Splits world into the group of the given members (ascending world
 * ranks); NULL for a group of one. */
static int split(struct mr_groups *g, const int *members, int n, const char *name,
		 struct mr_comm **out, struct mr_errbuf *eb)
{
	*out = NULL;
	if (n <= 1)
		return 0;
	return mr_comm_split(g->world, members, n, name, out, eb);
}

static int hsdp_groups(struct mr_groups *g, const int *dpm, int D, struct mr_errbuf *eb)
{
	int s = g->hsdp_shard, me = g->me.dp, i, rc, *mem = calloc((size_t)D, sizeof(int));
	char name[48];

	if (!mem)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate group members");
	for (i = 0; i < s; i++)
		mem[i] = dpm[(me / s) * s + i];
	snprintf(name, sizeof(name), "hsdp-shard-%d", dpm[(me / s) * s]);
	rc = split(g, mem, s, name, &g->shard, eb);
	if (rc == 0) {
		for (i = 0; i < D / s; i++)
			mem[i] = dpm[i * s + me % s];
		snprintf(name, sizeof(name), "hsdp-replica-%d", mem[0]);
		rc = split(g, mem, D / s, name, &g->replica, eb);
	}
	free(mem);
	return rc;
}

int mr_groups_create(struct mr_groups *g, const struct mr_worker_env *env, int hsdp_shard,
		     long timeout_ms, const _Atomic int *cancel, struct mr_errbuf *eb)
{
	struct mr_comm_config cc;
	int *mem = NULL, n, rc;
	char id[64], name[48];

	memset(g, 0, sizeof(*g));
	if ((rc = mr_groups_check(env, hsdp_shard, eb)) < 0 ||
	    (rc = mesh_of(env, &g->mesh, eb)) < 0)
		return rc;
	g->rank = env->rank;
	g->hsdp_shard = hsdp_shard == g->mesh.dp ? 0 : hsdp_shard;
	if ((rc = mr_mesh_coord(&g->mesh, env->rank, &g->me)) < 0)
		return mr_errf(eb, rc, "rank %d is outside the mesh", env->rank);
	if (env->world_size <= 1)
		return 0;
	if (!env->kv)
		return mr_errf(eb, MR_EINVAL, "a job of %d ranks needs a bootstrap KV",
			       env->world_size);
	memset(&cc, 0, sizeof(cc));
	snprintf(id, sizeof(id), "rt%d", env->generation);
	cc.id = id;
	cc.rank = env->rank;
	cc.world_size = env->world_size;
	cc.host_id = env->host_id;
	cc.addr = env->host;
	cc.kv = env->kv;
	cc.timeout_ms = timeout_ms;
	cc.cancel = cancel;
	if ((rc = mr_comm_init(&g->world, &cc, eb)) < 0)
		goto fail;
	mem = calloc((size_t)env->world_size, sizeof(int));
	if (!mem) {
		rc = mr_errf(eb, MR_ENOMEM, "unable to allocate group members");
		goto fail;
	}
	n = mr_mesh_group(&g->mesh, MR_GROUP_TP, env->rank, mem, NULL);
	snprintf(name, sizeof(name), "tp-%d", mem[0]);
	if ((rc = split(g, mem, n, name, &g->tp, eb)) < 0)
		goto fail;
	n = mr_mesh_group(&g->mesh, MR_GROUP_DP, env->rank, mem, NULL);
	snprintf(name, sizeof(name), "dp-%d", mem[0]);
	if ((rc = split(g, mem, n, name, &g->dp, eb)) < 0)
		goto fail;
	if (g->hsdp_shard > 0)
		rc = hsdp_groups(g, mem, n, eb);
	else
		g->shard = g->dp;
	if (rc < 0)
		goto fail;
	free(mem);
	return 0;
fail:
	free(mem);
	mr_groups_release(g);
	return rc;
}

void mr_groups_abort(struct mr_groups *g)
{
	struct mr_comm *all[] = { g->world, g->tp, g->dp, g->replica,
				  g->shard != g->dp ? g->shard : NULL };
	size_t i;

	for (i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		if (all[i])
			mr_comm_abort(all[i]);
}

void mr_groups_release(struct mr_groups *g)
{
	if (g->shard != g->dp)
		mr_comm_free(g->shard);
	mr_comm_free(g->replica);
	mr_comm_free(g->dp);
	mr_comm_free(g->tp);
	mr_comm_free(g->world);
	g->world = g->tp = g->dp = g->shard = g->replica = NULL;
}
