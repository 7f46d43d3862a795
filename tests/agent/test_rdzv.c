/*
 * test_rdzv.c - the agent's rendezvous client (agent/rdzv.c) and its KV
 * (agent/kv_http.c) against a real meshrun-controller: a round of two
 * members, KV put/get/add and wait semantics, 409 -> MR_ESTALE with the
 * new generation, the heartbeat thread noticing a bump, and a member the
 * controller carried into the next round learning it from the 409
 * (mr_rdzv_carried: waiting, or running with its rank).
 */
#include "harness.h"

#include "kv_http.h"
#include "rdzv.h"

static struct mr_rdzv *member_of(const struct h_ctl *c, const char *job, const char *node,
				 int pod, int min, int max, int hb_ms)
{
	json_t *spec = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "name", job, "min_nodes", min,
				 "max_nodes", max, "nproc_per_node", 2, "heartbeat_timeout_ms",
				 hb_ms, "last_call_ms", 1000);
	struct mr_rdzv_opts o = {.controller = c->url, .job = job, .node_id = node,
				 .host = "127.0.0.1", .host_id = "h", .pod_index = pod,
				 .spec = spec};
	struct mr_errbuf eb = {0};
	struct mr_rdzv *r = NULL;

	cr_assert_eq(mr_rdzv_new(&r, &o, &eb), 0, "%s", eb.msg);
	json_decref(spec);
	return r;
}

static struct mr_rdzv *member(const struct h_ctl *c, const char *node, int pod, int nnodes)
{
	return member_of(c, "t/rdzv", node, pod, nnodes, nnodes, 1000);
}

Test(rdzv, round_kv_and_stale_generation)
{
	struct h_ctl c = {0};
	struct mr_rdzv *a, *b;
	struct mr_rdzv_round ra, rb;
	struct mr_errbuf eb = {0};
	int ga = 0, gb = 0, sb = 0, newgen = 0;
	char buf[64];
	size_t len = 0;
	long long v = 0, t0;

	h_ctl_start(&c, 0);
	a = member(&c, "node-a", 1, 2);
	b = member(&c, "node-b", 0, 2);
	cr_assert_eq(mr_rdzv_join(a, &ga, &sb, &eb), 0, "%s", eb.msg);
	/* round still open: the long-poll times out */
	cr_assert_eq(mr_rdzv_wait(a, ga, 100, &ra, &newgen, &eb), MR_ETIMEDOUT, "%s", eb.msg);
	cr_assert_eq(mr_rdzv_join(b, &gb, &sb, &eb), 0, "%s", eb.msg);
	cr_assert_eq(ga, gb);
	cr_assert_eq(mr_rdzv_wait(a, ga, 2000, &ra, &newgen, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_rdzv_wait(b, gb, 2000, &rb, &newgen, &eb), 0, "%s", eb.msg);
	/* ranks ordered by pod index */
	cr_expect_eq(rb.node_rank, 0);
	cr_expect_eq(ra.node_rank, 1);
	cr_expect_eq(ra.rank_base, 2);
	cr_expect_eq(ra.world_size, 4);
	cr_expect_eq(ra.dp, 4);

	/* KV through the struct mr_kv of in-process mode */
	{
		struct mr_rdzv_opts o = {.controller = c.url, .job = "t/rdzv", .node_id = "kv",
					 .host = "127.0.0.1", .host_id = "h", .pod_index = -1};
		struct mr_kv_http kh;
		struct mr_kv kv;

		cr_assert_eq(mr_kv_http_open(&kh, &kv, &o, ra.generation, &eb), 0, "%s", eb.msg);
		cr_expect_eq(mr_kv_get(&kv, "peer/0", buf, sizeof(buf), &len, 0), MR_ENOTFOUND);
		t0 = h_now_ms();
		cr_expect_eq(mr_kv_get(&kv, "peer/0", buf, sizeof(buf), &len, 150), MR_ETIMEDOUT);
		cr_expect_geq(h_now_ms() - t0, 140);
		cr_expect_eq(mr_kv_put(&kv, "peer/0", "10.0.0.1:5", 10), 0);
		cr_expect_eq(mr_rdzv_kv_get(a, ra.generation, "peer/0", buf, sizeof(buf), &len, 0,
					    &eb),
			     0);
		cr_expect_eq(len, 10);
		cr_expect_eq(memcmp(buf, "10.0.0.1:5", 10), 0);
		cr_expect_eq(mr_kv_add(&kv, "count", 5, &v), 0);
		cr_expect_eq(mr_kv_add(&kv, "count", 2, &v), 0);
		cr_expect_eq(v, 7);
		mr_kv_http_close(&kh);
	}

	/* a's heartbeats run; b reports a failure: a's thread sees the bump */
	cr_assert_eq(mr_rdzv_hb_start(a, ra.generation, 50, NULL, NULL), 0);
	usleep(100 * 1000);
	cr_expect_eq(mr_rdzv_hb_stale(a), 0);
	t0 = h_now_ms();
	cr_assert_eq(mr_rdzv_fail(b, rb.generation, "test", &eb), 0, "%s", eb.msg);
	while (!mr_rdzv_hb_stale(a) && h_now_ms() - t0 < 2000)
		usleep(5000);
	cr_expect_gt(mr_rdzv_hb_stale(a), ra.generation);
	cr_expect_lt(h_now_ms() - t0, 500);
	mr_rdzv_hb_stop(a);
	/* every call with the old generation: 409 -> MR_ESTALE + the new one */
	newgen = 0;
	cr_expect_eq(mr_rdzv_heartbeat(a, ra.generation, &newgen, &eb), MR_ESTALE);
	cr_expect_gt(newgen, ra.generation);
	cr_expect_eq(mr_rdzv_kv_put(a, ra.generation, "x", "1", 1, &eb), MR_ESTALE);
	mr_rdzv_free(a);
	mr_rdzv_free(b);
	h_kill(c.pid);
}

Test(rdzv, unreachable_controller_is_econn)
{
	char url[64];
	struct mr_rdzv_opts o = {.controller = url, .job = "t/x", .node_id = "n",
				 .host = "127.0.0.1", .host_id = "h", .pod_index = -1};
	struct mr_errbuf eb = {0};
	struct mr_rdzv *r = NULL;
	int gen = 0;

	snprintf(url, sizeof(url), "http://127.0.0.1:%d", h_free_port());
	cr_assert_eq(mr_rdzv_new(&r, &o, &eb), 0);
	cr_expect_eq(mr_rdzv_heartbeat(r, 1, &gen, &eb), MR_ECONN, "%s", eb.msg);
	mr_rdzv_abort(r);
	cr_expect_eq(mr_rdzv_heartbeat(r, 1, &gen, &eb), MR_EABORTED);
	mr_rdzv_free(r);
}

Test(rdzv, a_carried_member_waits_or_has_its_rank_without_joining)
{
	struct h_ctl c = {0};
	struct mr_rdzv *m[3];
	struct mr_rdzv_round r[3], nr;
	struct mr_errbuf eb = {0};
	int gen = 0, sb = 0, newgen = 0, g = 0;
	long long t0;

	h_ctl_start(&c, 0);
	for (int i = 0; i < 3; i++) {
		char id[16];

		snprintf(id, sizeof(id), "n%d", i);
		m[i] = member_of(&c, "t/carry", id, i, 2, 3, 5000);
		cr_assert_eq(mr_rdzv_join(m[i], &gen, &sb, &eb), 0, "%s", eb.msg);
	}
	for (int i = 0; i < 3; i++)
		cr_assert_eq(mr_rdzv_wait(m[i], gen, 3000, &r[i], &newgen, &eb), 0, "%s", eb.msg);
	cr_assert_eq(r[1].node_rank, 1);
	/* n0 beats (its watch names it); n2 leaves: the generation ends */
	cr_assert_eq(mr_rdzv_hb_start(m[0], r[0].generation, 50, NULL, NULL), 0);
	usleep(100 * 1000);
	cr_assert_eq(mr_rdzv_leave(m[2], r[2].generation, "test", &eb), 0, "%s", eb.msg);
	t0 = h_now_ms();
	while (!mr_rdzv_hb_stale(m[0]) && h_now_ms() - t0 < 2000)
		usleep(5000);
	cr_assert_gt(mr_rdzv_hb_stale(m[0]), r[0].generation);
	mr_rdzv_hb_stop(m[0]);
	/* the 409 said n0 waits in the new round: no join, just the wait */
	cr_assert_eq(mr_rdzv_carried(m[0], r[0].generation, &g, &nr), MR_RDZV_CARRIED_WAITING);
	cr_assert_eq(g, r[0].generation + 1);
	cr_assert_eq(mr_rdzv_carried(m[0], r[0].generation, &g, &nr), MR_RDZV_NOT_CARRIED,
		     "a note is taken once");
	cr_assert_eq(mr_rdzv_wait(m[0], g, 5000, &nr, &newgen, &eb), 0, "%s", eb.msg);
	cr_assert_eq(nr.generation, g);
	cr_assert_eq(nr.node_rank, 0);
	cr_assert_eq(nr.num_nodes, 2);
	/* n1 calls with the old generation after the close: the 409 brings
	 * its whole rank */
	cr_assert_eq(mr_rdzv_heartbeat(m[1], r[1].generation, &newgen, &eb), MR_ESTALE);
	cr_assert_eq(newgen, g);
	cr_assert_eq(mr_rdzv_carried(m[1], g, &gen, &nr), MR_RDZV_NOT_CARRIED,
		     "a note of a generation already had is dropped");
	cr_assert_eq(mr_rdzv_kv_put(m[1], r[1].generation, "x", "1", 1, &eb), MR_ESTALE);
	memset(&nr, 0, sizeof(nr));
	cr_assert_eq(mr_rdzv_carried(m[1], r[1].generation, &gen, &nr), MR_RDZV_CARRIED_RUNNING);
	cr_assert_eq(gen, g);
	cr_assert_eq(nr.generation, g);
	cr_assert_eq(nr.node_rank, 1);
	cr_assert_eq(nr.num_nodes, 2);
	cr_assert_eq(nr.world_size, 4);
	cr_assert_eq(nr.rank_base, 2);
	cr_assert_eq(nr.dp, 4);
	cr_assert_eq(nr.restarts, 0, "a leave costs no restart");
	for (int i = 0; i < 3; i++)
		mr_rdzv_free(m[i]);
	h_kill(c.pid);
}

/* The agent's join carries its topology path: under rank_order
 * "topology" the node with the higher pod index but the earlier rack
 * gets node rank 0. */
Test(rdzv, topology_path_orders_the_ranks)
{
	struct h_ctl c = {0};
	json_t *spec = json_pack("{s:s, s:i, s:i, s:s}", "name", "t/topo", "min_nodes", 2,
				 "max_nodes", 2, "rank_order", "topology");
	struct mr_rdzv_opts o = {.controller = NULL, .job = "t/topo", .host = "127.0.0.1",
				 .host_id = "h", .spec = spec};
	struct mr_rdzv *r[2];
	struct mr_rdzv_round rr[2];
	struct mr_errbuf eb = {0};
	const char *paths[2] = { "rack-10/node-0", "rack-9/node-1" };
	int gen = 0, st = 0, newgen = 0;

	h_ctl_start(&c, 0);
	o.controller = c.url;
	for (int i = 0; i < 2; i++) {
		char id[16];

		snprintf(id, sizeof(id), "node-%d", i);
		o.node_id = id;
		o.pod_index = i;
		o.topology = paths[i];
		cr_assert_eq(mr_rdzv_new(&r[i], &o, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_rdzv_join(r[i], &gen, &st, &eb), 0, "%s", eb.msg);
	}
	for (int i = 0; i < 2; i++)
		cr_assert_eq(mr_rdzv_wait(r[i], gen, 5000, &rr[i], &newgen, &eb), 0, "%s", eb.msg);
	cr_expect_eq(rr[1].node_rank, 0, "rack-9 first (natural order)");
	cr_expect_eq(rr[0].node_rank, 1);
	for (int i = 0; i < 2; i++)
		mr_rdzv_free(r[i]);
	json_decref(spec);
	h_kill(c.pid);
}
