/*
 * test_diagnosis.c - hang diagnosis and straggler detection end to end
 * (docs/DIAGNOSIS.md), on real `meshrun local` jobs: a rank that stops
 * calling collectives (the documented debug_stall_* workload keys) is
 * named with its node, coordinates, group and operation - in the
 * controller's job_stuck event, `meshrun status --why` and the
 * meshrun_job_stuck metric; a node frozen with SIGSTOP is named; a rank
 * slowed with debug_slow_* is flagged as a straggler and no other rank is.
 * And a pipeline receive whose peer never sends, with real communicators,
 * the agent's progress reports and heartbeat thread against a real
 * controller (test_pipeline_faults.c runs whole pipeline jobs).
 *
 * No timing assertions: every wait is a bound on how long to wait for an
 * event, far above the configured hang timeout.
 */
#include <pthread.h>

#include "../comm/kv_mem.h"
#include "harness.h"
#include "mr_groups.h"
#include "mr_httpc.h"
#include "progress.h"
#include "rdzv.h"

/* "meshrun local: controller on URL, N node(s), job JOB" */
static void local_endpoint(const char *log, char *url, size_t ucap, char *job, size_t jcap)
{
	char *text;
	const char *p;

	cr_assert_eq(h_wait_log(log, "meshrun local: controller on ", 1, 30000), 0);
	text = h_read(log);
	p = strstr(text, "controller on ");
	cr_assert(p && sscanf(p, "controller on %63[^,]", url) == 1, "%s", text);
	(void)ucap;
	p = strstr(p, ", job ");
	cr_assert(p && sscanf(p, ", job %127s", job) == 1, "%s", text);
	(void)jcap;
	free(text);
}

/* `meshrun status [--why] JOB` against url; its output, malloc'd. */
static char *status(const char *url, const char *job, int why)
{
	char log[300];
	char *argv[] = {"meshrun", "status", "--controller", (char *)url,
			why ? "--why" : (char *)job, why ? (char *)job : NULL, NULL};
	pid_t p;

	h_path(log, sizeof(log), "status.log");
	unlink(log);
	p = h_spawn(argv, NULL, log);
	cr_assert_eq(h_wait(p, 15000), 0, "meshrun status failed:\n%s", h_read(log));
	return h_read(log);
}

/* GET path on url: the body (malloc'd, NUL-terminated), status 200. */
static char *http_get(const char *url, const char *path)
{
	struct mr_httpc_opts ho = {.base_url = url, .timeout_ms = 10000, .max_retries = 2};
	struct mr_httpc_req rq = {.method = "GET", .path = path};
	struct mr_errbuf eb = {0};
	struct mr_http_resp resp = {0};
	struct mr_httpc c;
	char *out;

	cr_assert_eq(mr_httpc_init(&c, &ho, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_httpc_request(&c, &rq, &resp, &eb), 0, "%s", eb.msg);
	cr_assert_eq(resp.status, 200, "GET %s: %ld", path, resp.status);
	out = strndup(resp.body ? resp.body : "", resp.len);
	mr_http_resp_release(&resp);
	mr_httpc_release(&c);
	return out;
}

static json_t *diagnosis(const char *url, const char *job)
{
	char path[256], *body;
	json_t *d;

	snprintf(path, sizeof(path), "/v1/jobs/%s/diagnosis", job);
	body = http_get(url, path);
	d = json_loads(body, 0, NULL);
	cr_assert(d, "%s", body);
	free(body);
	return d;
}

static void stop_local(pid_t local, const char *log)
{
	kill(local, SIGTERM);
	if (h_wait(local, 60000) < 0) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("meshrun local did not stop");
	}
}

/*
 * tp2 x dp2 on 2 nodes: rank 3 (node local-1, tp 1 dp 1) stops at the
 * start of step 2; rank 2 waits for it in their tp group, rank 1 in their
 * dp group, rank 0 in dp for rank 2. The culprit is rank 3 alone: rank 2
 * waits in turn.
 */
// cppcheck-suppress unknownMacro
Test(diagnosis, a_rank_that_stops_calling_collectives_is_named, .timeout = 240)
{
	char *args[] = {"--nodes", "2", "--nproc-per-node", "2", "--tp", "2",
			"--heartbeat-timeout", "60s", "--heartbeat-interval", "250ms",
			"--hang-timeout", "2s", "--workload-config",
			"{\"steps\": 200, \"d_model\": 32, \"n_head\": 2, \"n_layer\": 1, "
			"\"seq_len\": 16, \"batch_size\": 2, \"threads\": 1, \"peak_flops\": 1e9, "
			"\"comm_timeout_ms\": 300000, \"debug_stall_rank\": 3, "
			"\"debug_stall_step\": 2}",
			NULL};
	char log[300], url[64], job[128], *out, *why, *metrics;
	pid_t local = h_local(args, NULL, log, sizeof(log), "stall.log");
	json_t *d, *c;

	local_endpoint(log, url, sizeof(url), job, sizeof(job));
	if (h_wait_log(log, "event=job_stuck", 1, 120000)) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("no job_stuck event");
	}
	out = h_read(log);
	cr_assert(strstr(out, "event=debug_stall rank=3 step=2"), "%s", out);
	cr_assert(strstr(out, "event=job_stuck job=") && strstr(out, " rank=3 group="), "%s", out);
	cr_assert(strstr(out, "rank 3 (node local-1, tp 1 cp 0 dp 1 pp 0) has not entered "),
		  "%s", out);
	cr_assert_eq(h_count(log, "event=job_stuck"), 1, "logged once per hang");
	free(out);

	d = diagnosis(url, job);
	cr_assert_str_eq(json_string_value(json_object_get(d, "verdict")), "stuck");
	cr_assert_eq(json_array_size(json_object_get(d, "culprits")), 1, "%s",
		     json_string_value(json_object_get(d, "message")));
	c = json_array_get(json_object_get(d, "culprits"), 0);
	cr_assert_eq(json_integer_value(json_object_get(c, "rank")), 3);
	cr_assert_str_eq(json_string_value(json_object_get(c, "node")), "local-1");
	cr_assert_str_eq(json_string_value(json_object_get(c, "reason")), "not_entered");
	cr_assert_str_eq(json_string_value(json_object_get(c, "op")), "allreduce");
	cr_assert_eq(json_integer_value(json_object_get(c, "step")), 2);
	cr_assert_eq(json_integer_value(json_object_get(c, "waiting")), 2);
	cr_assert(json_is_false(json_object_get(c, "in_communication")));
	{
		const char *g = json_string_value(json_object_get(c, "group"));

		cr_assert(g && (!strcmp(g, "tp[dp=1]") || !strcmp(g, "dp[tp=1]")), "%s", g);
	}

	why = status(url, job, 1);
	cr_assert(strstr(why, "verdict:     stuck"), "%s", why);
	cr_assert(strstr(why, "why:         rank 3 (node local-1, tp 1 cp 0 dp 1 pp 0) has not "
			      "entered "),
		  "%s", why);
	free(why);
	why = status(url, job, 0);
	cr_assert(strstr(why, "health:      STUCK: no progress for"), "%s", why);
	free(why);
	metrics = http_get(url, "/metrics");
	cr_assert(strstr(metrics, "meshrun_job_stuck{job=\"") && strstr(metrics, ",rank=\"3\"} 1"),
		  "%s", metrics);
	free(metrics);
	json_decref(d);
	/* rank 0's progress line stops promising an ETA: it says how long the
	 * steps have stalled */
	cr_expect_eq(h_wait_log(log, "event=progress rank=0 step=2/200", 1, 60000), 0);
	cr_expect_eq(h_wait_log(log, "stalled_s=", 1, 60000), 0, "no stalled progress line");
	stop_local(local, log);
}

/* The pid of local's agent of node local-<node> (its environment says). */
static pid_t agent_of_node(pid_t local, int node)
{
	char want[32], path[64], buf[8192];
	pid_t kids[16];
	int n = 0;

	snprintf(want, sizeof(want), "MESHRUN_NODE_ID=local-%d", node);
	for (int tries = 0; tries < 500 && n < 3; tries++) {
		n = h_children(local, "meshrun-agent", kids, 16);
		if (n < 3)
			usleep(20 * 1000);
	}
	for (int i = 0; i < n; i++) {
		FILE *f;
		size_t len;

		snprintf(path, sizeof(path), "/proc/%d/environ", (int)kids[i]);
		if (!(f = fopen(path, "r")))
			continue;
		len = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		for (size_t k = 0; k < len; k += strlen(buf + k) + 1) {
			buf[len] = '\0';
			if (!strcmp(buf + k, want))
				return kids[i];
		}
	}
	cr_assert_fail("no agent of node local-%d", node);
	return -1;
}

/*
 * dp3 on 3 nodes: node local-1 (rank 1) is frozen with SIGSTOP, threads
 * and heartbeats included, while the others wait for it. The heartbeat
 * timeout is long, so the job is not restarted while we look; the
 * diagnosis names rank 1 from its last report (or, when that report
 * caught it inside the collective, once its node has been silent for half
 * the heartbeat timeout).
 */
Test(diagnosis, a_frozen_node_is_named, .timeout = 240)
{
	char *args[] = {"--nodes", "3", "--heartbeat-timeout", "60s", "--heartbeat-interval",
			"250ms", "--hang-timeout", "2s", "--workload-config",
			"{\"steps\": 100000, \"d_model\": 32, \"n_head\": 2, \"n_layer\": 1, "
			"\"seq_len\": 16, \"batch_size\": 2, \"threads\": 1, \"peak_flops\": 1e9, "
			"\"comm_timeout_ms\": 300000}",
			NULL};
	char log[300], url[64], job[128];
	pid_t local = h_local(args, NULL, log, sizeof(log), "sigstop.log"), victim;
	long long end;
	json_t *d = NULL;
	int named = 0;

	local_endpoint(log, url, sizeof(url), job, sizeof(job));
	cr_assert_eq(h_wait_log(log, "event=progress rank=2 step=", 1, 60000), 0, "no training");
	victim = agent_of_node(local, 1);
	cr_assert_eq(kill(victim, SIGSTOP), 0);
	end = h_now_ms() + 60000;
	while (!named && h_now_ms() < end) {
		const json_t *c;

		usleep(500 * 1000);
		json_decref(d);
		d = diagnosis(url, job);
		c = json_array_get(json_object_get(d, "culprits"), 0);
		named = !strcmp(json_string_value(json_object_get(d, "verdict")), "stuck") && c &&
			json_integer_value(json_object_get(c, "rank")) == 1;
	}
	kill(victim, SIGCONT);
	cr_assert(named, "last diagnosis: %s", d ? json_dumps(d, 0) : "none");
	{
		const json_t *c = json_array_get(json_object_get(d, "culprits"), 0);

		cr_assert_str_eq(json_string_value(json_object_get(c, "node")), "local-1");
		const char *op = json_string_value(json_object_get(c, "op"));

		cr_assert_str_eq(json_string_value(json_object_get(c, "group")), "dp");
		/* the signal lands anywhere in the step: in the gradient
		 * all-reduces or in the all-gather of the loss and norm */
		cr_assert(op && (!strcmp(op, "allreduce") || !strcmp(op, "allgather")),
			  "op %s", op ? op : "(none)");
	}
	cr_assert_eq(json_array_size(json_object_get(d, "culprits")), 1);
	json_decref(d);
	stop_local(local, log);
}

/* dp4 on 2 nodes: rank 2 sleeps 250 ms in every step (its busy time is
 * 30 to 150 times the others' here). It is flagged as a straggler (event,
 * job view) at 5 times the median; no other rank is, ever. */
Test(diagnosis, a_slow_rank_is_flagged_and_no_other, .timeout = 240)
{
	char *args[] = {"--nodes", "2", "--nproc-per-node", "2", "--heartbeat-interval", "1s",
			"--straggler-factor", "5", "--workload-config",
			"{\"steps\": 400, \"d_model\": 64, \"n_head\": 2, \"n_layer\": 2, "
			"\"seq_len\": 32, \"batch_size\": 4, \"threads\": 1, \"peak_flops\": 1e9, "
			"\"debug_slow_rank\": 2, \"debug_slow_ms\": 250}",
			NULL};
	char log[300], url[64], job[128], *out, *st;
	pid_t local = h_local(args, NULL, log, sizeof(log), "straggler.log");
	const char *p;
	int flagged = 0;

	local_endpoint(log, url, sizeof(url), job, sizeof(job));
	if (h_wait_log(log, "event=straggler ", 1, 120000)) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("no straggler event");
	}
	st = status(url, job, 0);
	cr_assert(strstr(st, "stragglers:  1 (median busy"), "%s", st);
	cr_assert(strstr(st, "rank 2 (node local-1): busy "), "%s", st);
	free(st);
	/* a few more reports: still rank 2 alone */
	cr_assert_eq(h_wait_log(log, "event=progress rank=0 step=", 8, 60000), 0);
	stop_local(local, log);
	out = h_read(log);
	for (p = strstr(out, "event=straggler "); p; p = strstr(p + 1, "event=straggler ")) {
		cr_assert(strstr(p, " rank=2 node=local-1 ") &&
				  strstr(p, " rank=2 node=local-1 ") < strchr(p, '\n'),
			  "a straggler other than rank 2: %.300s", p);
		flagged++;
	}
	cr_assert_eq(flagged, 1, "%s", out);
	cr_assert(!strstr(out, "event=straggler_cleared"), "%s", out);
	free(out);
}

/* ---- a pipeline receive whose peer never sends ---- */

struct pp_rank {
	int rank;
	struct mr_worker_env env;
	struct mr_groups g;
	_Atomic int cancel;
	int rc;
	pthread_t t;
};

static void pp_progress(void *state, struct mr_worker_progress *out)
{
	struct pp_rank *r = state;

	memset(out, 0, sizeof(*out));
	out->step = 0;
	out->micro = 1;
	out->ngroups = mr_groups_progress(&r->g, out->group, MR_WORKER_PROGRESS_GROUPS,
					  &out->comm_wait_s);
}

static const struct mr_worker_ops pp_ops = {.name = "pp-test", .progress = pp_progress};

static void *pp_groups(void *arg)
{
	struct pp_rank *r = arg;
	struct mr_errbuf eb = {0};

	r->rc = mr_groups_create(&r->g, &r->env, 0, 0, 30000, &r->cancel, NULL, &eb);
	if (r->rc)
		fprintf(stderr, "rank %d: groups: %s\n", r->rank, eb.msg);
	return NULL;
}

/* Stage 1 of 2 receives the activations stage 0 never sends. */
static void *pp_recv(void *arg)
{
	struct pp_rank *r = arg;
	float x = 0;

	r->rc = mr_comm_recv(r->g.group[MR_GROUP_PP], &x, 1, MR_COMM_F32, 0, 5);
	return NULL;
}

struct pp_node {
	struct mr_inproc ip;
	struct mr_agent_progress prog;
	struct mr_rdzv *rdzv;
};

static json_t *pp_beat(void *user, int full)
{
	struct pp_node *n = user;
	json_t *p = mr_agent_progress_json(&n->prog, full);

	return p ? json_pack("{so}", "progress", p) : NULL;
}

Test(diagnosis, a_pipeline_recv_whose_peer_never_sends, .timeout = 120)
{
	struct h_ctl ctl = {0};
	struct pp_rank rk[2];
	struct pp_node node[2];
	struct mr_kv kv;
	struct kv_mem *mem = kv_mem_new(&kv);
	json_t *spec = json_pack("{ss si si s{si}}", "name", "t/pp", "min_nodes", 2, "nproc_per_node",
				 1, "mesh", "pp", 2);
	json_t *d = NULL;
	const json_t *c = NULL;
	const char *msg;
	long long end;

	h_ctl_start(&ctl, 0);
	memset(rk, 0, sizeof(rk));
	memset(node, 0, sizeof(node));
	for (int i = 0; i < 2; i++) {
		char id[8];
		struct mr_rdzv_opts o = {.controller = ctl.url, .job = "t/pp", .node_id = id,
					 .host = "127.0.0.1", .pod_index = i, .spec = spec};
		struct mr_errbuf eb = {0};
		int gen = 0, standby = 0;

		snprintf(id, sizeof(id), "p%d", i);
		cr_assert_eq(mr_rdzv_new(&node[i].rdzv, &o, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_rdzv_join(node[i].rdzv, &gen, &standby, &eb), 0, "%s", eb.msg);
		rk[i] = (struct pp_rank){.rank = i};
		rk[i].env = (struct mr_worker_env){.job = "t/pp", .generation = 1, .rank = i,
						   .world_size = 2, .pp = 2, .tp = 1, .cp = 1, .ep = 1,
						   .host = "127.0.0.1", .host_id = "test-host", .kv = &kv};
	}
	for (int i = 0; i < 2; i++) {
		struct mr_rdzv_round rd;
		struct mr_errbuf eb = {0};
		int g2 = 0;

		cr_assert_eq(mr_rdzv_wait(node[i].rdzv, 1, 10000, &rd, &g2, &eb), 0, "%s", eb.msg);
		cr_assert_eq(rd.rank_base, i);
	}
	/* real communicators: the world and its pp group (the same members) */
	for (int i = 0; i < 2; i++)
		pthread_create(&rk[i].t, NULL, pp_groups, &rk[i]);
	for (int i = 0; i < 2; i++) {
		pthread_join(rk[i].t, NULL);
		cr_assert_eq(rk[i].rc, 0);
	}
	/* each node: its rank as the agent's in-process worker, the agent's
	 * progress reports, the agent's heartbeat thread */
	for (int i = 0; i < 2; i++) {
		node[i].ip.ops = &pp_ops;
		node[i].ip.n = 1;
		node[i].ip.rank = calloc(1, sizeof(*node[i].ip.rank));
		pthread_mutex_init(&node[i].ip.rank[0].lock, NULL);
		node[i].ip.rank[0].state = &rk[i];
		node[i].ip.rank[0].env.rank = i;
		mr_agent_progress_init(&node[i].prog);
		cr_assert_eq(mr_agent_progress_attach(&node[i].prog, &node[i].ip), 0);
		mr_rdzv_hb_set_beat(node[i].rdzv, pp_beat, &node[i]);
		cr_assert_eq(mr_rdzv_hb_start(node[i].rdzv, 1, 100, NULL, NULL), 0);
	}
	pthread_create(&rk[1].t, NULL, pp_recv, &rk[1]);
	end = h_now_ms() + 30000;
	while (h_now_ms() < end) {
		usleep(200 * 1000);
		json_decref(d);
		d = diagnosis(ctl.url, "t/pp");
		c = json_array_get(json_object_get(d, "culprits"), 0);
		if (c)
			break;
	}
	cr_assert(c, "no culprit: %s", json_dumps(d, 0));
	msg = json_string_value(json_object_get(c, "message"));
	cr_assert_eq(json_integer_value(json_object_get(c, "rank")), 0);
	cr_assert_str_eq(json_string_value(json_object_get(c, "reason")), "p2p_peer");
	cr_assert_str_eq(json_string_value(json_object_get(c, "op")), "recv");
	cr_assert(strstr(msg, "rank 0 (node p0, tp 0 cp 0 dp 0 pp 0) has not entered the send that "
			      "rank 1 (node p1, tp 0 cp 0 dp 0 pp 1) waits for in recv #1 on group pp"),
		  "%s", msg);
	/* stage 0 sends at last: nothing waits any more */
	{
		float x = 1.0f;

		cr_assert_eq(mr_comm_send(rk[0].g.group[MR_GROUP_PP], &x, 1, MR_COMM_F32, 1, 5), 0);
		pthread_join(rk[1].t, NULL);
		cr_assert_eq(rk[1].rc, 0);
	}
	end = h_now_ms() + 30000;
	do {
		usleep(200 * 1000);
		json_decref(d);
		d = diagnosis(ctl.url, "t/pp");
	} while (json_array_size(json_object_get(d, "culprits")) && h_now_ms() < end);
	cr_assert_eq(json_array_size(json_object_get(d, "culprits")), 0, "%s", json_dumps(d, 0));
	cr_assert(strstr(json_string_value(json_object_get(d, "message")),
			 "no rank is waiting in communication"),
		  "%s", json_string_value(json_object_get(d, "message")));
	json_decref(d);
	for (int i = 0; i < 2; i++) {
		mr_rdzv_free(node[i].rdzv);
		mr_agent_progress_release(&node[i].prog);
		pthread_mutex_destroy(&node[i].ip.rank[0].lock);
		free(node[i].ip.rank);
		mr_groups_release(&rk[i].g);
	}
	kv_mem_free(mem);
	json_decref(spec);
	h_kill(ctl.pid);
}
