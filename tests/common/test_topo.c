/*
 * test_topo.c - topology paths (common/topo.c): what a path may be, the
 * natural order of segments, shared prefixes, and the rank order of
 * nodes that the controller and the planner both use.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "mr_topo.h"

/* mr_errf keeps the first message: a fresh buffer per check */
#define CHECK(path) (memset(&eb, 0, sizeof(eb)), mr_topo_check((path), "topology", &eb))

Test(topo, paths_are_checked_naming_the_field)
{
	struct mr_errbuf eb;
	char long_seg[80], deep[64] = "a";

	cr_expect_eq(CHECK("block-2/rack-7/node-31"), 0);
	cr_expect_eq(CHECK("node.a_b-1"), 0);
	cr_expect_lt(CHECK(""), 0);
	cr_expect_str_eq(eb.field, "topology");
	cr_expect_lt(CHECK("a//b"), 0);
	cr_expect(strstr(eb.msg, "empty segment"), "%s", eb.msg);
	cr_expect_lt(CHECK("/a"), 0);
	cr_expect_lt(CHECK("a/"), 0);
	cr_expect_lt(CHECK("rack 1/n"), 0);
	cr_expect(strstr(eb.msg, "' ' at byte 4"), "%s", eb.msg);
	memset(long_seg, 'x', 64);
	long_seg[64] = 0;
	cr_expect_lt(CHECK(long_seg), 0);
	cr_expect(strstr(eb.msg, "longer than 63"), "%s", eb.msg);
	long_seg[63] = 0;
	cr_expect_eq(CHECK(long_seg), 0);
	for (int i = 1; i < 9; i++)
		strcat(deep, "/a");
	cr_expect_lt(CHECK(deep), 0);
	cr_expect(strstr(eb.msg, "more than 8 levels"), "%s", eb.msg);
	deep[strlen(deep) - 2] = 0;
	cr_expect_eq(CHECK(deep), 0);
}

Test(topo, segments_compare_in_natural_order)
{
	cr_expect_lt(mr_topo_cmp("rack-9/n", "rack-10/n"), 0);
	cr_expect_gt(mr_topo_cmp("rack-10", "rack-9"), 0);
	cr_expect_eq(mr_topo_cmp("rack-007/n-1", "rack-7/n-1"), 0);
	/* the widest level decides first, whatever the rest */
	cr_expect_lt(mr_topo_cmp("b-1/r-9/n-9", "b-2/r-0/n-0"), 0);
	/* a segment that is a prefix of another sorts first, per segment */
	cr_expect_lt(mr_topo_cmp("b/r", "b/r-1"), 0);
	cr_expect_lt(mr_topo_cmp("b-1/z", "b-1x/a"), 0);
	cr_expect_lt(mr_topo_cmp("b", "b/r"), 0);
	cr_expect_lt(mr_topo_cmp(NULL, "a"), 0);
	cr_expect_eq(mr_topo_cmp(NULL, ""), 0);
}

Test(topo, shared_levels)
{
	cr_expect_eq(mr_topo_shared("b-1/r-2/n-3", "b-1/r-2/n-4"), 2);
	cr_expect_eq(mr_topo_shared("b-1/r-2/n-3", "b-1/r-20/n-3"), 1);
	cr_expect_eq(mr_topo_shared("b-1/r-2", "b-1/r-2"), 2);
	cr_expect_eq(mr_topo_shared("b-1", "b-2"), 0);
	cr_expect_eq(mr_topo_shared(NULL, "b-2"), 0);
}

Test(topo, nodes_order_by_path_then_pod_index_then_id)
{
	const struct mr_topo_node n[] = {
		{ "r-2/n-0", 0, "e" }, { "r-10/n-0", 1, "d" }, { "r-2/n-1", 2, "c" },
		{ "r-1/n-5", 3, "b" }, { "r-2/n-1", 4, "a" },
	};
	const struct mr_topo_node no_pod[] = { { "r-1", 5, "z" }, { "r-1", -1, "y" } };
	int order[5], want[] = { 3, 0, 2, 4, 1 }, want_index[] = { 0, 1, 2, 3, 4 };

	cr_assert_eq(mr_topo_order(n, 5, 1, order), 0);
	for (int i = 0; i < 5; i++)
		cr_expect_eq(order[i], want[i], "node rank %d: %d, want %d", i, order[i], want[i]);
	/* rank_order "index": paths play no part */
	cr_assert_eq(mr_topo_order(n, 5, 0, order), 0);
	for (int i = 0; i < 5; i++)
		cr_expect_eq(order[i], want_index[i]);
	/* a node without a pod index: ids decide among equal paths */
	cr_assert_eq(mr_topo_order(no_pod, 2, 1, order), 0);
	cr_expect(order[0] == 1 && order[1] == 0);
}
