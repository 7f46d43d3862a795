/*
 * test_groups.c - a rank's communicators and placement (runtime/groups.c)
 * for meshes with every axis: ranks are threads with real host
 * communicators bootstrapped through an in-memory KV.
 *
 * Each rank checks, for every group kind of common/mr_mesh.h: no
 * communicator for a group of one, else one whose size is the kind's and
 * whose all-reduce of the members' world ranks equals the sum of the
 * members mr_mesh_group lists (so it holds exactly those ranks); kinds
 * with the same members share one communicator; and the placement's
 * sizes, indices and communicators match the mesh.
 */
#include <criterion/criterion.h>
#include <pthread.h>

#include "../comm/kv_mem.h"
#include "mr_groups.h"

#define MAXW 16

struct case_ {
	int world, tp, pp, cp, ep;
	struct mr_kv kv;
	int fails[MAXW];
	char why[MAXW][256];
};

struct arg {
	struct case_ *c;
	int rank;
};

static void fail(struct case_ *c, int rank, const char *what, int kind)
{
	c->fails[rank]++;
	snprintf(c->why[rank], sizeof(c->why[rank]), "%s (group %s)", what,
		 mr_mesh_group_name((enum mr_mesh_group)kind));
}

static void check_rank(struct case_ *c, int rank, struct mr_groups *g)
{
	int members[MAXW], k, j, n;

	for (k = 0; k < MR_GROUP__COUNT; k++) {
		float sum = (float)rank, want = 0.0f;

		n = mr_mesh_group(&g->mesh, (enum mr_mesh_group)k, rank, members, NULL);
		for (j = 0; j < n; j++)
			want += (float)members[j];
		if (n == 1) {
			if (g->group[k])
				fail(c, rank, "a group of one has a communicator", k);
			continue;
		}
		if (!g->group[k] || mr_comm_size(g->group[k]) != n) {
			fail(c, rank, "missing or wrong-sized communicator", k);
			continue;
		}
		if (mr_comm_allreduce(g->group[k], &sum, &sum, 1, MR_COMM_F32, MR_COMM_SUM) < 0 ||
		    sum != want)
			fail(c, rank, "the communicator does not hold the mesh's members", k);
		/* the same members: the same communicator */
		for (j = 0; j < k; j++) {
			int mj[MAXW], nj = mr_mesh_group(&g->mesh, (enum mr_mesh_group)j, rank, mj,
							 NULL);
			int same = nj == n && !memcmp(mj, members, (size_t)n * sizeof(int));
			if (same != (g->group[j] == g->group[k]) && nj > 1)
				fail(c, rank, "communicators are not shared exactly by equal groups",
				     k);
		}
	}
	if (mr_place_size(&g->place, MR_AXIS_TP) != g->mesh.tp ||
	    mr_place_size(&g->place, MR_AXIS_CP) != g->mesh.cp ||
	    mr_place_size(&g->place, MR_AXIS_PP) != g->mesh.pp ||
	    mr_place_size(&g->place, MR_AXIS_EP) != g->mesh.ep ||
	    mr_place_size(&g->place, MR_AXIS_DP) != g->mesh.dp ||
	    mr_place_index(&g->place, MR_AXIS_TP) != g->me.tp ||
	    mr_place_index(&g->place, MR_AXIS_PP) != g->me.pp ||
	    mr_place_index(&g->place, MR_AXIS_EP) != g->me.ep ||
	    g->place.comm[MR_AXIS_TP] != g->group[MR_GROUP_TP] ||
	    g->place.comm[MR_AXIS_EP] != g->group[MR_GROUP_EP] ||
	    g->place.comm[MR_AXIS_PP] != g->group[MR_GROUP_PP])
		fail(c, rank, "the placement does not match the mesh", MR_GROUP_WORLD);
}

static void *rank_main(void *p)
{
	struct arg *a = p;
	struct case_ *c = a->c;
	struct mr_worker_env env = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_groups g;
	int rc;

	env.rank = a->rank;
	env.world_size = c->world;
	env.tp = c->tp;
	env.pp = c->pp;
	env.cp = c->cp;
	env.ep = c->ep;
	env.kv = &c->kv;
	env.host = "127.0.0.1";
	env.host_id = "test-host";
	rc = mr_groups_create(&g, &env, 0, 0, 20000, NULL, NULL, &eb);
	if (rc < 0) {
		c->fails[a->rank]++;
		snprintf(c->why[a->rank], sizeof(c->why[a->rank]), "create: %.200s", eb.msg);
		return NULL;
	}
	check_rank(c, a->rank, &g);
	mr_groups_release(&g);
	return NULL;
}

static void run(int world, int tp, int pp, int cp, int ep)
{
	struct case_ c = { .world = world, .tp = tp, .pp = pp, .cp = cp, .ep = ep };
	struct kv_mem *m = kv_mem_new(&c.kv);
	pthread_t t[MAXW];
	struct arg a[MAXW];
	int r;

	cr_assert_not_null(m);
	for (r = 0; r < world; r++) {
		a[r].c = &c;
		a[r].rank = r;
		cr_assert_eq(pthread_create(&t[r], NULL, rank_main, &a[r]), 0);
	}
	for (r = 0; r < world; r++)
		pthread_join(t[r], NULL);
	for (r = 0; r < world; r++)
		cr_expect_eq(c.fails[r], 0, "rank %d: %s", r, c.why[r]);
	kv_mem_free(m);
}

Test(groups, tp_and_dp_only_share_the_rest) { run(4, 2, 1, 1, 1); }
Test(groups, every_axis_tp2_pp2_dp2) { run(8, 2, 2, 1, 1); }
Test(groups, context_and_expert_groups) { run(8, 2, 1, 2, 2); }
Test(groups, expert_across_dp_pp2) { run(8, 1, 2, 1, 2); }
