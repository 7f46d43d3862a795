/*
 * test_mesh.c - rank <-> coordinates <-> process groups (common/mesh.c).
 *
 * Exhaustive over small shapes: bijection, every group kind a partition of
 * the world into equal groups whose members differ only in the group's own
 * coordinates; plus Megatron-Core's published worked example and the
 * validation messages.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mr_mesh.h"

/* Which coordinates vary inside a group of each kind (others are equal). */
struct varies {
	int tp, cp, dp, pp, ep, edp;
};

static struct varies kind_varies(enum mr_mesh_group g)
{
	switch (g) {
	case MR_GROUP_WORLD: return (struct varies){1, 1, 1, 1, 1, 1};
	case MR_GROUP_TP: return (struct varies){1, 0, 0, 0, 0, 0};
	case MR_GROUP_CP: return (struct varies){0, 1, 0, 0, 1, 1};
	case MR_GROUP_DP: return (struct varies){0, 0, 1, 0, 1, 1};
	case MR_GROUP_PP: return (struct varies){0, 0, 0, 1, 0, 0};
	case MR_GROUP_EP: return (struct varies){0, 1, 1, 0, 1, 0};
	case MR_GROUP_EDP: return (struct varies){0, 1, 1, 0, 0, 1};
	case MR_GROUP_DP_CP: return (struct varies){0, 1, 1, 0, 1, 1};
	case MR_GROUP_TP_CP: return (struct varies){1, 1, 0, 0, 1, 1};
	case MR_GROUP_MP: return (struct varies){1, 0, 0, 1, 0, 0};
	case MR_GROUP_TP_EP_PP: return (struct varies){1, 1, 1, 1, 1, 0};
	default: return (struct varies){0, 0, 0, 0, 0, 0};
	}
}

/* Expected size of each kind, from the sizes alone. */
static int kind_size(const struct mr_mesh *m, enum mr_mesh_group g)
{
	switch (g) {
	case MR_GROUP_WORLD: return m->world;
	case MR_GROUP_TP: return m->tp;
	case MR_GROUP_CP: return m->cp;
	case MR_GROUP_DP: return m->dp;
	case MR_GROUP_PP: return m->pp;
	case MR_GROUP_EP: return m->ep;
	case MR_GROUP_EDP: return m->edp;
	case MR_GROUP_DP_CP: return m->dp * m->cp;
	case MR_GROUP_TP_CP: return m->tp * m->cp;
	case MR_GROUP_MP: return m->tp * m->pp;
	case MR_GROUP_TP_EP_PP: return m->tp * m->ep * m->pp;
	default: return -1;
	}
}

/* Coordinates a and b agree on every coordinate the kind holds fixed. A
 * "varying" flag on a derived coordinate (ep, edp, cp, dp) only relaxes the
 * check; the fixed ones must be equal. */
static int same_fixed(const struct mr_mesh_coord *a, const struct mr_mesh_coord *b,
		      struct varies v)
{
	return (v.tp || a->tp == b->tp) && (v.cp || a->cp == b->cp) &&
	       (v.dp || a->dp == b->dp) && (v.pp || a->pp == b->pp) &&
	       (v.ep || a->ep == b->ep) && (v.edp || a->edp == b->edp);
}

static void check_mesh(const struct mr_mesh *m)
{
	int n = m->world;
	int *seen = calloc((size_t)n, sizeof(int));
	int *members = malloc((size_t)n * sizeof(int));
	int *other = malloc((size_t)n * sizeof(int));
	struct mr_mesh_coord c, d;

	cr_assert(seen && members && other);
	/* bijection and the documented formulas */
	for (int r = 0; r < n; r++) {
		cr_assert_eq(mr_mesh_coord(m, r, &c), 0);
		cr_assert_eq(r, c.tp + m->tp * (c.cp + m->cp * (c.dp + m->dp * c.pp)));
		int j = c.dp * m->cp + c.cp;
		cr_assert_eq(c.ep, j % m->ep);
		cr_assert_eq(c.edp, j / m->ep);
		cr_assert_eq(r, c.tp + m->tp * (c.ep + m->ep * (c.edp + m->edp * c.pp)));
		cr_assert_eq(mr_mesh_rank(m, &c), r);
	}
	for (int g = 0; g < MR_GROUP__COUNT; g++) {
		int size = mr_mesh_group_size(m, g);
		int count = mr_mesh_group_count(m, g);
		struct varies v = kind_varies(g);

		cr_assert_eq(size, kind_size(m, g), "kind %s", mr_mesh_group_name(g));
		cr_assert_eq(size * count, n);
		memset(seen, 0, (size_t)n * sizeof(int));
		for (int id = 0; id < count; id++) {
			cr_assert_eq(mr_mesh_group_members(m, g, id, members), size);
			mr_mesh_coord(m, members[0], &c);
			for (int k = 0; k < size; k++) {
				int idx = -1;
				cr_assert(k == 0 || members[k] > members[k - 1], "ascending");
				seen[members[k]]++;
				cr_assert_eq(mr_mesh_group_id(m, g, members[k]), id);
				cr_assert_eq(mr_mesh_group(m, g, members[k], other, &idx), size);
				cr_assert_eq(idx, k);
				cr_assert_eq(memcmp(other, members, (size_t)size * sizeof(int)), 0);
				mr_mesh_coord(m, members[k], &d);
				cr_assert(same_fixed(&c, &d, v), "%s group %d: rank %d vs %d",
					  mr_mesh_group_name(g), id, members[0], members[k]);
			}
			if (id > 0) {
				int prev[1];
				/* ids in order of each group's lowest rank */
				mr_mesh_group_members(m, g, id - 1, other);
				prev[0] = other[0];
				cr_assert_gt(members[0], prev[0]);
			}
		}
		for (int r = 0; r < n; r++)
			cr_assert_eq(seen[r], 1, "%s: rank %d in %d groups", mr_mesh_group_name(g),
				     r, seen[r]);
	}
	/* a group has exactly the ranks with the same fixed coordinates */
	for (int g = 0; g < MR_GROUP__COUNT; g++) {
		if (g == MR_GROUP_CP || g == MR_GROUP_DP || g == MR_GROUP_TP_CP ||
		    g == MR_GROUP_DP_CP || g == MR_GROUP_TP_EP_PP)
			continue; /* derived ep/edp vary with cp/dp there */
		int r0 = n / 2;
		int size = mr_mesh_group(m, g, r0, members, NULL);
		struct varies v = kind_varies(g);
		int cnt = 0;
		mr_mesh_coord(m, r0, &c);
		for (int r = 0; r < n; r++) {
			mr_mesh_coord(m, r, &d);
			if (same_fixed(&c, &d, v)) {
				cr_assert_lt(cnt, size);
				cr_assert_eq(members[cnt], r);
				cnt++;
			}
		}
		cr_assert_eq(cnt, size, "kind %s", mr_mesh_group_name(g));
	}
	free(seen);
	free(members);
	free(other);
}

/* mr_mesh_group_member agrees with the member lists. */
static void check_member(const struct mr_mesh *m)
{
	int out[64];

	for (int g = 0; g < MR_GROUP__COUNT; g++) {
		int n = mr_mesh_group_size(m, (enum mr_mesh_group)g);

		for (int id = 0; id < m->world / n; id++) {
			cr_assert_eq(mr_mesh_group_members(m, (enum mr_mesh_group)g, id, out), n);
			for (int k = 0; k < n; k++)
				cr_assert_eq(mr_mesh_group_member(m, (enum mr_mesh_group)g, id, k),
					     out[k], "kind %s id %d index %d",
					     mr_mesh_group_name((enum mr_mesh_group)g), id, k);
			cr_assert_eq(mr_mesh_group_member(m, (enum mr_mesh_group)g, id, n),
				     MR_ERANGE);
		}
	}
}

Test(mesh, exhaustive_small_shapes)
{
	int shapes = 0;

	for (int tp = 1; tp <= 8; tp++)
		for (int pp = 1; pp <= 8; pp++)
			for (int cp = 1; cp <= 4; cp++)
				for (int dp = 1; dp <= 8; dp++) {
					if (tp * pp * cp * dp > 64)
						continue;
					for (int ep = 1; ep <= dp * cp; ep++) {
						struct mr_mesh m;
						struct mr_errbuf eb = {0};
						if ((dp * cp) % ep)
							continue;
						cr_assert_eq(mr_mesh_init(&m, tp * pp * cp * dp, tp, pp,
									  cp, ep, 0, &eb),
							     0, "%s", eb.msg);
						cr_assert_eq(m.dp, dp);
						cr_assert_eq(m.edp, dp * cp / ep);
						check_mesh(&m);
						check_member(&m);
						shapes++;
					}
				}
	cr_assert_gt(shapes, 500, "only %d shapes", shapes);
}

/*
 * The worked example in Megatron-Core's initialize_model_parallel docstring
 * (megatron/core/parallel_state.py): 16 GPUs, tensor parallel 2, pipeline 4,
 * hence data parallel 2. Its groups follow the default RankGenerator order
 * "tp-cp-ep-dp-pp" (tp fastest, dp before pp), which is ours.
 */
Test(mesh, megatron_core_docstring_example)
{
	static const int dp_groups[8][2] = {{0, 2}, {1, 3}, {4, 6}, {5, 7},
					    {8, 10}, {9, 11}, {12, 14}, {13, 15}};
	static const int tp_groups[8][2] = {{0, 1}, {2, 3}, {4, 5}, {6, 7},
					    {8, 9}, {10, 11}, {12, 13}, {14, 15}};
	static const int pp_groups[4][4] = {
		{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}};
	struct mr_mesh m;
	int out[16];

	cr_assert_eq(mr_mesh_init(&m, 16, 2, 4, 1, 1, 0, NULL), 0);
	cr_assert_eq(m.dp, 2);
	cr_assert_eq(mr_mesh_group_count(&m, MR_GROUP_DP), 8);
	cr_assert_eq(mr_mesh_group_count(&m, MR_GROUP_TP), 8);
	cr_assert_eq(mr_mesh_group_count(&m, MR_GROUP_PP), 4);
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(mr_mesh_group_members(&m, MR_GROUP_DP, i, out), 2);
		cr_assert(out[0] == dp_groups[i][0] && out[1] == dp_groups[i][1], "dp %d", i);
		cr_assert_eq(mr_mesh_group_members(&m, MR_GROUP_TP, i, out), 2);
		cr_assert(out[0] == tp_groups[i][0] && out[1] == tp_groups[i][1], "tp %d", i);
	}
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(mr_mesh_group_members(&m, MR_GROUP_PP, i, out), 4);
		cr_assert_eq(memcmp(out, pp_groups[i], sizeof(pp_groups[i])), 0, "pp %d", i);
	}
}

/* Expert groups by hand: tp=2, cp=2, dp=2, pp=1, ep=2 (world 8). The dp*cp
 * ranks sharing tp=0 are 0,2,4,6 (j = 0..3); ep groups take consecutive j:
 * {0,2},{4,6}; edp groups stride by ep: {0,4},{2,6}. */
Test(mesh, expert_groups_by_hand)
{
	struct mr_mesh m;
	int out[8], idx;

	cr_assert_eq(mr_mesh_init(&m, 8, 2, 1, 2, 2, 0, NULL), 0);
	cr_assert_eq(m.edp, 2);
	cr_assert_eq(mr_mesh_group(&m, MR_GROUP_EP, 0, out, &idx), 2);
	cr_assert(out[0] == 0 && out[1] == 2 && idx == 0);
	cr_assert_eq(mr_mesh_group(&m, MR_GROUP_EP, 6, out, &idx), 2);
	cr_assert(out[0] == 4 && out[1] == 6 && idx == 1);
	cr_assert_eq(mr_mesh_group(&m, MR_GROUP_EDP, 2, out, &idx), 2);
	cr_assert(out[0] == 2 && out[1] == 6 && idx == 0);
	cr_assert_eq(mr_mesh_group(&m, MR_GROUP_CP, 4, out, &idx), 2);
	cr_assert(out[0] == 4 && out[1] == 6 && idx == 0);
	cr_assert_eq(mr_mesh_group(&m, MR_GROUP_DP, 3, out, &idx), 2);
	cr_assert(out[0] == 3 && out[1] == 7 && idx == 0);
	cr_assert_eq(mr_mesh_group(&m, MR_GROUP_DP_CP, 5, out, &idx), 4);
	cr_assert(out[0] == 1 && out[1] == 3 && out[2] == 5 && out[3] == 7 && idx == 2);
	cr_assert_eq(mr_mesh_group(&m, MR_GROUP_TP_EP_PP, 7, out, &idx), 4);
	cr_assert(out[0] == 4 && out[1] == 5 && out[2] == 6 && out[3] == 7 && idx == 3);
}

static void expect_init_error(int world, int tp, int pp, int cp, int ep, int dp,
			      const char *field, const char *msg)
{
	struct mr_mesh m;
	struct mr_errbuf eb = {0};

	cr_assert_lt(mr_mesh_init(&m, world, tp, pp, cp, ep, dp, &eb), 0, "%d %d %d %d %d %d", world, tp, pp, cp, ep, dp);
	cr_assert_str_eq(eb.field, field);
	cr_assert_str_eq(eb.msg, msg);
}

Test(mesh, invalid_configs_name_the_field)
{
	expect_init_error(8, 0, 1, 1, 1, 0, "tp", "tp 0 is less than 1");
	expect_init_error(8, 1, -1, 1, 1, 0, "pp", "pp -1 is less than 1");
	expect_init_error(8, 1, 1, 0, 1, 0, "cp", "cp 0 is less than 1");
	expect_init_error(8, 1, 1, 1, 0, 0, "ep", "ep 0 is less than 1");
	expect_init_error(-4, 1, 1, 1, 1, 0, "world", "world -4 is negative");
	expect_init_error(8, 1, 1, 1, 1, -2, "dp", "dp -2 is negative");
	expect_init_error(0, 1, 1, 1, 1, 0, "world",
			  "world and dp are both 0: one of them must be given");
	expect_init_error(12, 2, 4, 1, 1, 0, "world",
			  "world 12 is not divisible by tp*pp*cp = 8");
	expect_init_error(16, 2, 2, 1, 1, 3, "dp",
			  "dp 3 does not match world 16 / (tp*pp*cp = 4) = 4");
	expect_init_error(12, 1, 1, 1, 5, 0, "ep", "ep 5 does not divide dp*cp = 12");
	expect_init_error(0, 65536, 65536, 1, 1, 1, "world",
			  "world tp*pp*cp*dp = 4294967296 is too large");
}

Test(mesh, derive_world_from_dp_and_ranges)
{
	struct mr_mesh m;
	struct mr_mesh_coord c = {0};

	cr_assert_eq(mr_mesh_init(&m, 0, 2, 2, 2, 4, 2, NULL), 0);
	cr_assert_eq(m.world, 16);
	cr_assert_eq(m.edp, 1);
	cr_assert_eq(mr_mesh_coord(&m, 16, &c), MR_ERANGE);
	cr_assert_eq(mr_mesh_coord(&m, -1, &c), MR_ERANGE);
	c.pp = 2;
	cr_assert_eq(mr_mesh_rank(&m, &c), MR_ERANGE);
	cr_assert_eq(mr_mesh_group_size(&m, MR_GROUP__COUNT), MR_EINVAL);
	cr_assert_eq(mr_mesh_group_id(&m, MR_GROUP_TP, 99), MR_ERANGE);
	cr_assert_eq(mr_mesh_group_members(&m, MR_GROUP_TP, 8, NULL), MR_ERANGE);
	cr_assert_str_eq(mr_mesh_group_name(MR_GROUP_EDP), "edp");
	cr_assert_str_eq(mr_mesh_group_name(MR_GROUP__COUNT), "?");
}

Test(mesh, format_table)
{
	struct mr_mesh m;
	char *buf = NULL, desc[128];
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	cr_assert_eq(mr_mesh_init(&m, 8, 2, 2, 1, 2, 0, NULL), 0);
	mr_mesh_describe(&m, desc, sizeof(desc));
	cr_assert_str_eq(desc, "world=8 tp=2 cp=1 dp=2 pp=2 ep=2 edp=1");
	cr_assert_eq(mr_mesh_format_table(&m, f), 0);
	fclose(f);
	/* header, column line, 8 rank rows, footer */
	int lines = 0;
	for (char *p = buf; *p; p++)
		lines += *p == '\n';
	cr_assert_eq(lines, 11, "%s", buf);
	cr_assert(strstr(buf, "mesh world=8 tp=2 cp=1 dp=2 pp=2 ep=2 edp=1"));
	/* rank 5: tp=1, dp=0, pp=1; ep=0 edp=0; groups tp 2, cp 5, dp 3, pp 1,
	 * ep 3, edp 5, dp_cp 3, mp 0 */
	cr_assert(strstr(buf, "     5    1    0    0    1    0    0 |      2      5      3      1      3      5      3      0\n"),
		  "%s", buf);
	free(buf);
}

/* Labels name the kind and the coordinates the group's members share,
 * slowest first, without axes of size 1. */
Test(mesh, group_labels)
{
	struct mr_mesh m;
	char buf[64];
	int r;

	/* tp=2 pp=4 dp=2 (world 16): rank 13 = tp 1, dp 0, pp 3 */
	cr_assert_eq(mr_mesh_init(&m, 16, 2, 4, 1, 1, 0, NULL), 0);
	cr_assert_eq(mr_mesh_group_label(&m, MR_GROUP_DP, mr_mesh_group_id(&m, MR_GROUP_DP, 13),
					 buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "dp[pp=3,tp=1]");
	cr_assert_eq(mr_mesh_group_label(&m, MR_GROUP_TP, mr_mesh_group_id(&m, MR_GROUP_TP, 13),
					 buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "tp[pp=3,dp=0]");
	cr_assert_eq(mr_mesh_group_label(&m, MR_GROUP_PP, mr_mesh_group_id(&m, MR_GROUP_PP, 13),
					 buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "pp[dp=0,tp=1]");
	cr_assert_eq(mr_mesh_group_label(&m, MR_GROUP_WORLD, 0, buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "world");
	cr_assert_eq(mr_mesh_group_label(&m, MR_GROUP_DP, 8, buf, sizeof(buf)), MR_ERANGE);
	cr_assert_eq(mr_mesh_group_label(&m, MR_GROUP_DP, 0, buf, 4), MR_ERANGE);
	cr_assert_str_eq(buf, "dp[");
	/* pure data parallel: no coordinate to tell groups apart */
	cr_assert_eq(mr_mesh_init(&m, 4, 1, 1, 1, 1, 0, NULL), 0);
	cr_assert_eq(mr_mesh_group_label(&m, MR_GROUP_DP, 0, buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "dp");
	/* expert kinds use the expert digits: tp=2 cp=2 dp=2 ep=2 */
	cr_assert_eq(mr_mesh_init(&m, 8, 2, 1, 2, 2, 0, NULL), 0);
	r = 6; /* tp 0, cp 1, dp 1: j = 3, ep 1, edp 1 */
	cr_assert_eq(mr_mesh_group_label(&m, MR_GROUP_EP, mr_mesh_group_id(&m, MR_GROUP_EP, r),
					 buf, sizeof(buf)), 0);
	cr_assert_str_eq(buf, "ep[edp=1,tp=0]");
}
