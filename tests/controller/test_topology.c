/*
 * test_topology.c - rank_order "topology" on a real controller: 64 pods
 * in 4 racks (2 blocks) whose pod indexes are shuffled join a job of
 * tp 8 x pp 4 x dp 16 (8 ranks a node); every dp group lands inside one
 * rack and every pp group crosses both blocks, the node ranks equal the
 * planner's placement for the same paths (`meshrun plan
 * --topology-file`), and both survive a controller restart (journal).
 * The same pods under rank_order "index" scatter dp groups over racks,
 * which is what makes the first assertion able to fail. Bad paths and
 * orders are refused naming the field.
 */
#include <stdlib.h>

#include "ctl_test.h"
#include "mr_mesh.h"
#include "mr_topo.h"
#include "plan/mr_plan.h"

#define NODES 64
#define PER_NODE 8

static char paths[NODES][64]; /* by node k: block-(k/32)/rack-(k/16)/node-k */
static int pod_of[NODES];     /* node k's pod index: a fixed shuffle */

static void make_pods(void)
{
	unsigned s = 12345;

	for (int k = 0; k < NODES; k++) {
		snprintf(paths[k], sizeof(paths[k]), "block-%d/rack-%d/node-%d", k / 32, k / 16,
			 k);
		pod_of[k] = k;
	}
	for (int k = NODES - 1; k > 0; k--) { /* Fisher-Yates, an LCG's draws */
		int j, t;

		s = s * 1103515245u + 12345u;
		j = (int)((s >> 8) % (unsigned)(k + 1));
		t = pod_of[k];
		pod_of[k] = pod_of[j];
		pod_of[j] = t;
	}
}

static void join_all(struct ctlp *c, const char *job, const char *order)
{
	struct mr_test_resp r;
	char body[512];

	snprintf(body, sizeof(body),
		 "{\"name\":\"%s\",\"min_nodes\":%d,\"nproc_per_node\":%d,"
		 "\"mesh\":{\"tp\":8,\"pp\":4},\"rank_order\":\"%s\"}",
		 job, NODES, PER_NODE, order);
	ctl_call(c, &r, "POST", body, NULL, "/v1/jobs");
	cr_assert_eq(r.status, 201, "%s", r.body);
	for (int k = 0; k < NODES; k++) {
		snprintf(body, sizeof(body),
			 "{\"node_id\":\"pod-%d\",\"host\":\"10.0.%d.%d\",\"pod_index\":%d,"
			 "\"topology\":\"%s\"}",
			 k, k / 16, k, pod_of[k], paths[k]);
		ctl_call(c, &r, "POST", body, NULL, "/v1/jobs/%s/join", job);
		cr_assert_eq(r.status, 200, "join %d: %s", k, r.body);
	}
}

/* node_rank of every node k, and its topology as the controller lists it */
static void ranks_of(struct ctlp *c, const char *job, int *rank)
{
	struct mr_test_resp r;
	json_t *o, *ms;

	for (int k = 0; k < NODES; k++)
		rank[k] = -1;
	ctl_call(c, &r, "GET", NULL, NULL, "/v1/jobs/%s?members=1&limit=1000", job);
	cr_assert_eq(r.status, 200, "%s", r.body);
	o = resp_json(&r);
	ms = json_object_get(o, "member_list");
	cr_assert_eq(json_array_size(ms), NODES);
	for (size_t i = 0; i < json_array_size(ms); i++) {
		json_t *m = json_array_get(ms, i);
		int k = atoi(json_string_value(json_object_get(m, "node_id")) + 4);

		cr_assert(k >= 0 && k < NODES);
		rank[k] = (int)json_integer_value(json_object_get(m, "node_rank"));
		cr_expect_str_eq(json_string_value(json_object_get(m, "topology")), paths[k]);
	}
	json_decref(o);
}

/* The widest level (0 block, 1 rack, 2 node) at which any group of kind
 * g spans more than one domain; 3: every group inside one node. */
static int widest_split(const int *rank, enum mr_mesh_group g)
{
	struct mr_mesh mesh;
	int node_at[NODES], widest = 3;

	for (int k = 0; k < NODES; k++)
		node_at[rank[k]] = k;
	cr_assert_eq(mr_mesh_init(&mesh, NODES * PER_NODE, 8, 4, 1, 1, 0, NULL), 0);
	for (int id = 0; id < mr_mesh_group_count(&mesh, g); id++) {
		int first = node_at[mr_mesh_group_member(&mesh, g, id, 0) / PER_NODE];

		for (int i = 1; i < mr_mesh_group_size(&mesh, g); i++) {
			int k = node_at[mr_mesh_group_member(&mesh, g, id, i) / PER_NODE];
			int shared = mr_topo_shared(paths[first], paths[k]);

			widest = shared < widest ? shared : widest;
		}
	}
	return widest;
}

Test(topology, dp_groups_stay_in_a_rack_as_the_planner_places_them, .timeout = 120)
{
	struct ctlp c = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_plan_topo t;
	const char *by_pod[NODES];
	int rank[NODES], again[NODES];

	make_pods();
	ctlp_start(&c, 0, NULL);
	join_all(&c, "t/topo", "topology");
	ranks_of(&c, "t/topo", rank);
	cr_expect_eq(widest_split(rank, MR_GROUP_DP), 2, "a dp group spans racks");
	cr_expect_eq(widest_split(rank, MR_GROUP_TP), 3, "a tp group spans nodes");
	cr_expect_eq(widest_split(rank, MR_GROUP_PP), 0, "pp does not cross the blocks");

	/* the planner, given the same paths in pod-index order, places alike */
	for (int k = 0; k < NODES; k++)
		by_pod[pod_of[k]] = paths[k];
	cr_assert_eq(mr_plan_topo_init(&t, by_pod, NODES, &eb), 0, "%s", eb.msg);
	cr_expect_eq(t.domains, 4);
	for (int k = 0; k < NODES; k++)
		cr_expect_eq(t.order[rank[k]], pod_of[k], "node rank %d: planner pod %d, ours %d",
			     rank[k], t.order[rank[k]], pod_of[k]);
	mr_plan_topo_release(&t);

	/* pod indexes alone scatter the same pods' dp groups over racks */
	join_all(&c, "t/index", "index");
	ranks_of(&c, "t/index", again);
	cr_expect_lt(widest_split(again, MR_GROUP_DP), 2, "index order kept racks by chance");
	for (int k = 0; k < NODES; k++)
		cr_expect_eq(again[k], pod_of[k]);

	/* meshrun status shows the order and each node's path */
	{
		char *out = NULL;

		cr_assert_eq(mr_test_sh(c.dir, &out,
					"'%s/meshrun' status --controller http://127.0.0.1:%d t/topo",
					mr_proc_build_dir(), c.port),
			     0, "%s", out);
		cr_expect(strstr(out, "rank order:  topology") && strstr(out, "TOPOLOGY") &&
				  strstr(out, "  block-1/rack-3/node-63"),
			  "%s", out);
		free(out);
	}

	/* a restarted controller replays the order and the paths */
	mr_proc_stop(&c.proc);
	ctlp_start(&c, 0, NULL);
	ranks_of(&c, "t/topo", again);
	for (int k = 0; k < NODES; k++)
		cr_expect_eq(again[k], rank[k], "node %d: rank %d after the restart, %d before", k,
			     again[k], rank[k]);
	ctlp_stop(&c, 1);
}

Test(topology, bad_paths_and_orders_name_the_field)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	char field[64];

	ctlp_start(&c, 0, NULL);
	ctl_call(&c, &r, "POST", "{\"name\":\"t/j\",\"min_nodes\":1,\"rank_order\":\"racks\"}",
		 NULL, "/v1/jobs");
	cr_expect_eq(r.status, 400);
	cr_expect_str_eq(jerr(&r, "field", field, sizeof(field)), "rank_order");
	ctl_call(&c, &r, "POST", "{\"name\":\"t/j\",\"min_nodes\":2,\"rank_order\":\"topology\"}",
		 NULL, "/v1/jobs");
	cr_assert_eq(r.status, 201, "%s", r.body);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"a\",\"topology\":\"rack 1/a\"}", NULL,
		 "/v1/jobs/t/j/join");
	cr_expect_eq(r.status, 400);
	cr_expect_str_eq(jerr(&r, "field", field, sizeof(field)), "topology");
	cr_expect(strstr(r.body, "at byte 4"), "%s", r.body);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"a\",\"topology\":\"rack-1//a\"}", NULL,
		 "/v1/jobs/t/j/join");
	cr_expect_eq(r.status, 400);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"a\",\"topology\":7}", NULL, "/v1/jobs/t/j/join");
	cr_expect_eq(r.status, 400);
	cr_expect_str_eq(jerr(&r, "field", field, sizeof(field)), "topology");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/t/j");
	cr_expect(strstr(r.body, "\"rank_order\": \"topology\"") ||
			  strstr(r.body, "\"rank_order\":\"topology\""),
		  "%s", r.body);
	ctlp_stop(&c, 1);
}
