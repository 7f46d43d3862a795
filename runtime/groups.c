/*
 * groups.c - a rank's mesh communicators and placement (see mr_groups.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_groups.h"
#include "parallel/mr_pp_split.h"

int mr_groups_mesh(const struct mr_worker_env *env, struct mr_mesh *m, struct mr_errbuf *eb)
{
	return mr_mesh_init(m, env->world_size > 0 ? env->world_size : 1,
			    env->tp > 0 ? env->tp : 1, env->pp > 0 ? env->pp : 1,
			    env->cp > 0 ? env->cp : 1, env->ep > 0 ? env->ep : 1, 0, eb);
}

int mr_groups_check(const struct mr_worker_env *env, int hsdp_shard, struct mr_errbuf *eb)
{
	struct mr_mesh m;
	int rc = mr_groups_mesh(env, &m, eb);

	if (rc < 0)
		return rc;
	if (hsdp_shard < 0 || (hsdp_shard > 0 && m.dp % hsdp_shard != 0))
		return mr_errf_field(eb, MR_EINVAL, "hsdp_shard",
				     "'hsdp_shard' (%d) must divide the data-parallel size dp=%d",
				     hsdp_shard, m.dp);
	if (hsdp_shard > 0 && hsdp_shard < m.dp && m.cp > 1)
		return mr_errf_field(eb, MR_ENOTSUP, "hsdp_shard",
				     "'hsdp_shard' with cp > 1 is not implemented yet (cp %d)", m.cp);
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
	return mr_comm_split(g->group[MR_GROUP_WORLD], members, n, name, out, eb);
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

/* Every group kind but the world, in enum order; a kind whose members
 * equal an earlier kind's shares its communicator (no second split). */
static int kinds(struct mr_groups *g, struct mr_errbuf *eb)
{
	int W = g->mesh.world, k, j, n[MR_GROUP__COUNT] = { 0 }, rc = 0;
	int *mem = calloc((size_t)MR_GROUP__COUNT * (size_t)W, sizeof(int));
	char name[48];

	if (!mem)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate group members");
	n[MR_GROUP_WORLD] = W;
	for (k = 0; k < W; k++)
		mem[k] = k;
	for (k = MR_GROUP_WORLD + 1; k < MR_GROUP__COUNT && rc == 0; k++) {
		int *mk = mem + (size_t)k * W;

		n[k] = mr_mesh_group(&g->mesh, (enum mr_mesh_group)k, g->rank, mk, NULL);
		if (n[k] < 0) {
			rc = mr_errf(eb, n[k], "unable to place rank %d in the %s groups", g->rank,
				     mr_mesh_group_name((enum mr_mesh_group)k));
			break;
		}
		for (j = 0; j < k; j++)
			if (n[j] == n[k] && !memcmp(mem + (size_t)j * W, mk, (size_t)n[k] * sizeof(int)))
				break;
		if (j < k) {
			g->group[k] = g->group[j];
			continue;
		}
		snprintf(name, sizeof(name), "%s-%d", mr_mesh_group_name((enum mr_mesh_group)k),
			 mk[0]);
		rc = split(g, mk, n[k], name, &g->group[k], eb);
	}
	if (rc == 0 && g->hsdp_shard > 0)
		rc = hsdp_groups(g, mem + (size_t)MR_GROUP_DP * W, n[MR_GROUP_DP], eb);
	else /* dense gradients average over dp x cp (the dp group when cp is 1) */
		g->shard = g->group[MR_GROUP_DP_CP];
	/* the first and last stage of this rank's pipeline */
	if (rc == 0 && g->mesh.pp > 1 && (g->me.pp == 0 || g->me.pp == g->mesh.pp - 1)) {
		int *pm = mem + (size_t)MR_GROUP_PP * W, two[2] = { pm[0], pm[g->mesh.pp - 1] };
		snprintf(name, sizeof(name), "embed-%d", two[0]);
		rc = split(g, two, 2, name, &g->embed, eb);
	}
	free(mem);
	return rc;
}

/* The placement of coordinate me in mesh m over the communicators of g
 * (NULL: none yet). */
static void fill_place(struct mr_place *p, const struct mr_mesh *m,
		       const struct mr_mesh_coord *me, const struct mr_groups *g, int sp)
{
	static const enum mr_mesh_group of[MR_AXIS__COUNT] = {
		[MR_AXIS_TP] = MR_GROUP_TP, [MR_AXIS_CP] = MR_GROUP_CP, [MR_AXIS_DP] = MR_GROUP_DP,
		[MR_AXIS_PP] = MR_GROUP_PP, [MR_AXIS_EP] = MR_GROUP_EP,
	};
	const int size[MR_AXIS__COUNT] = { m->tp, m->cp, m->dp, m->pp, m->ep };
	const int index[MR_AXIS__COUNT] = { me->tp, me->cp, me->dp, me->pp, me->ep };
	int a;

	mr_place_one(p);
	for (a = 0; a < MR_AXIS__COUNT; a++) {
		p->size[a] = size[a];
		p->index[a] = index[a];
		p->comm[a] = g ? g->group[of[a]] : NULL;
	}
	p->sp = sp;
}

int mr_groups_place_of(const struct mr_worker_env *env, int sp, struct mr_place *p,
		       struct mr_errbuf *eb)
{
	struct mr_mesh m;
	struct mr_mesh_coord me;
	int rc = mr_groups_mesh(env, &m, eb);

	if (rc == 0 && (rc = mr_mesh_coord(&m, env->rank, &me)) < 0)
		rc = mr_errf(eb, rc, "rank %d is outside the mesh", env->rank);
	if (rc == 0)
		fill_place(p, &m, &me, NULL, sp);
	return rc;
}

int mr_groups_place_layers(struct mr_place *p, const struct mr_gpt_config *mc, int T, int v,
			   const int *layers, int n_layers, struct mr_errbuf *eb)
{
	int P = mr_place_size(p, MR_AXIS_PP), c, rc, *split;

	p->chunks = 0;
	if (P == 1 && v == 1 && !layers)
		return 0;
	if (v < 1 || v > MR_PLACE_MAX_CHUNKS)
		return mr_errf_field(eb, MR_EINVAL, "pp_virtual",
				     "'pp_virtual' must be in [1, %d], got %d", MR_PLACE_MAX_CHUNKS,
				     v);
	if (!(split = calloc((size_t)P * (size_t)v, sizeof(int))))
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the pipeline split");
	rc = mr_pp_split_model(mc, T, P, v, layers, n_layers, split, eb);
	for (c = 0; c < v && rc == 0; c++)
		mr_pp_split_range(split, P, mr_place_index(p, MR_AXIS_PP), c, &p->layer_lo[c],
				  &p->layer_hi[c]);
	if (rc == 0)
		p->chunks = v;
	free(split);
	return rc;
}

int mr_groups_create(struct mr_groups *g, const struct mr_worker_env *env, int hsdp_shard,
		     int sp, long timeout_ms, const _Atomic int *cancel,
		     const struct mr_groups_comm *comm, struct mr_errbuf *eb)
{
	struct mr_comm_config cc;
	char id[64];
	int rc;

	memset(g, 0, sizeof(*g));
	if ((rc = mr_groups_check(env, hsdp_shard, eb)) < 0 ||
	    (rc = mr_groups_mesh(env, &g->mesh, eb)) < 0)
		return rc;
	g->rank = env->rank;
	g->hsdp_shard = hsdp_shard == g->mesh.dp ? 0 : hsdp_shard;
	if ((rc = mr_mesh_coord(&g->mesh, env->rank, &g->me)) < 0)
		return mr_errf(eb, rc, "rank %d is outside the mesh", env->rank);
	fill_place(&g->place, &g->mesh, &g->me, g, sp);
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
	if (comm) {
		cc.backend = comm->backend;
		cc.device = comm->gpu;
	}
	if ((rc = mr_comm_init(&g->group[MR_GROUP_WORLD], &cc, eb)) == 0 && comm)
		mr_comm_set_device(g->group[MR_GROUP_WORLD], comm->dev); /* splits inherit it */
	if (rc < 0 || (rc = kinds(g, eb)) < 0) {
		mr_groups_release(g);
		return rc;
	}
	fill_place(&g->place, &g->mesh, &g->me, g, sp);
	return 0;
}

int mr_groups_kv(struct mr_groups *g, int rep, struct mr_errbuf *eb)
{
	struct mr_comm *tpc = g->group[MR_GROUP_TP];
	int tp = g->mesh.tp, me = g->me.tp, first = me / rep * rep, i, rc;
	int mem[1024];
	char name[48];

	if (rep <= 1 || !tpc)
		return 0;
	if (tp % rep != 0 || rep > (int)(sizeof(mem) / sizeof(mem[0])))
		return mr_errf_field(eb, MR_EINVAL, "n_kv_head",
				     "%d tp ranks per key/value head do not divide tp (%d)", rep,
				     tp);
	for (i = 0; i < rep; i++) /* ranks of the tp communicator: its tp index */
		mem[i] = first + i;
	snprintf(name, sizeof(name), "kv-%d", g->rank - (me - first));
	if ((rc = mr_comm_split(tpc, mem, rep, name, &g->kv, eb)) < 0)
		return rc;
	g->place.kv = g->kv;
	return 0;
}

/* Every distinct communicator of g, once: into out (room for
 * MR_GROUP__COUNT + 4); returns how many. */
static int distinct(const struct mr_groups *g, struct mr_comm **out)
{
	struct mr_comm *all[MR_GROUP__COUNT + 4];
	int n = 0, i, j;

	for (i = 0; i < MR_GROUP__COUNT; i++)
		all[i] = g->group[i];
	all[MR_GROUP__COUNT] = g->shard;
	all[MR_GROUP__COUNT + 1] = g->replica;
	all[MR_GROUP__COUNT + 2] = g->embed;
	all[MR_GROUP__COUNT + 3] = g->kv;
	for (i = 0; i < MR_GROUP__COUNT + 4; i++) {
		if (!all[i])
			continue;
		for (j = 0; j < n && out[j] != all[i]; j++)
			;
		if (j == n)
			out[n++] = all[i];
	}
	return n;
}

void mr_groups_abort(struct mr_groups *g)
{
	struct mr_comm *c[MR_GROUP__COUNT + 4];
	int n = distinct(g, c), i;

	for (i = 0; i < n; i++)
		mr_comm_abort(c[i]);
}

void mr_groups_release(struct mr_groups *g)
{
	struct mr_comm *c[MR_GROUP__COUNT + 4];
	int n = distinct(g, c), i;

	/* the world last: the others were split from it */
	for (i = n - 1; i >= 0; i--)
		mr_comm_free(c[i]);
	memset(g->group, 0, sizeof(g->group));
	g->shard = g->replica = g->embed = g->kv = NULL;
	memset(&g->place, 0, sizeof(g->place));
}
