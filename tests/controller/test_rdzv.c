/*
 * test_rdzv.c - rendezvous against a real meshrun-controller process:
 * 8 agents (threads) meet and get ordered, distinct ranks; elastic
 * min/max with last-call; a late joiner waits on standby and enters the
 * next round; a silent member is declared dead and survivors learn at once
 * (409) and are carried into the next round (a 409 naming them says so,
 * later with their rank; an agent that joins anyway gets the same answer);
 * a restarted pod keeps its rank; the controller is killed with
 * SIGKILL mid-rendezvous and restarted on the same port and data dir, and
 * every agent still completes with no duplicate or missing rank.
 */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "ctl_test.h"

struct agent {
	struct ctlp *c;
	const char *job;
	char id[64];
	int pod;            /* -1 = none */
	int rank;           /* node rank when done */
	long long gen;
	long long nodes;
	int done;
	int joins;
};

static void create_job(struct ctlp *c, const char *spec_fmt, ...)
{
	struct mr_test_resp r;
	char body[1024];
	va_list ap;

	va_start(ap, spec_fmt);
	vsnprintf(body, sizeof(body), spec_fmt, ap);
	va_end(ap);
	ctl_call(c, &r, "POST", body, NULL, "/v1/jobs");
	cr_assert(r.status == 201 || r.status == 200, "create: %ld %s", r.status, r.body);
}

static long do_join(struct agent *a, struct mr_test_resp *r)
{
	char body[256];

	if (a->pod >= 0)
		snprintf(body, sizeof(body),
			 "{\"node_id\":\"%s\",\"host\":\"127.0.0.1\",\"pod_index\":%d,"
			 "\"ports\":{\"comm\":29500}}", a->id, a->pod);
	else
		snprintf(body, sizeof(body), "{\"node_id\":\"%s\",\"host\":\"127.0.0.1\"}", a->id);
	a->joins++;
	return ctl_call(a->c, r, "POST", body, NULL, "/v1/jobs/%s/join", a->job);
}

/* An agent: join, long-poll until the round closes; rejoin on 409/404;
 * retry through controller outages. Gives up after 60 s. */
static void *agent_main(void *arg)
{
	struct agent *a = arg;
	long long end = mr_test_now_ms() + 60000;
	struct mr_test_resp *r = malloc(sizeof(*r));

	while (!a->done && mr_test_now_ms() < end) {
		long st = do_join(a, r);

		if (st != 200) {
			usleep(50000);
			continue;
		}
		a->gen = jint(r, "generation");
		while (mr_test_now_ms() < end) {
			st = ctl_call(a->c, r, "GET", NULL, NULL,
				      "/v1/jobs/%s/wait?node_id=%s&generation=%lld&timeout_ms=2000",
				      a->job, a->id, a->gen);
			if (st == 0) { /* controller down: retry the wait */
				usleep(50000);
				continue;
			}
			if (st != 200)
				break; /* 409/404: join again */
			{
				json_t *o = resp_json(r);
				const char *s = json_string_value(json_object_get(o, "state"));

				if (s && !strcmp(s, "running")) {
					a->rank = (int)json_integer_value(json_object_get(o, "node_rank"));
					a->nodes = json_integer_value(json_object_get(o, "num_nodes"));
					a->gen = json_integer_value(json_object_get(o, "generation"));
					a->done = 1;
				}
				json_decref(o);
			}
			if (a->done)
				break;
		}
	}
	free(r);
	return NULL;
}

static void run_agents(struct agent *ag, int n, pthread_t *th)
{
	for (int i = 0; i < n; i++)
		cr_assert_eq(pthread_create(&th[i], NULL, agent_main, &ag[i]), 0);
}

static void join_agents(int n, pthread_t *th)
{
	for (int i = 0; i < n; i++)
		pthread_join(th[i], NULL);
}

Test(rdzv, eight_agents_get_distinct_ranks_in_pod_order)
{
	struct ctlp c = { 0 };
	struct agent ag[8];
	pthread_t th[8];
	int seen[8] = { 0 };

	ctlp_start(&c, 0, NULL);
	create_job(&c, "{\"name\":\"t/r8\",\"min_nodes\":8,\"mesh\":{\"tp\":2}}");
	for (int i = 0; i < 8; i++) {
		memset(&ag[i], 0, sizeof(ag[i]));
		ag[i].c = &c;
		ag[i].job = "t/r8";
		ag[i].pod = 7 - i; /* ids sort the other way round than pod indexes */
		snprintf(ag[i].id, sizeof(ag[i].id), "worker-%c", 'a' + i);
	}
	run_agents(ag, 8, th);
	join_agents(8, th);
	for (int i = 0; i < 8; i++) {
		cr_assert(ag[i].done, "agent %s did not finish", ag[i].id);
		cr_assert_eq(ag[i].rank, ag[i].pod, "rank follows the pod index");
		cr_assert_eq(ag[i].nodes, 8);
		cr_assert_eq(ag[i].gen, 1);
		cr_assert_eq(seen[ag[i].rank]++, 0, "duplicate rank %d", ag[i].rank);
	}
	{
		struct mr_test_resp r;
		json_t *o;

		ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/t/r8");
		cr_assert_eq(r.status, 200);
		o = resp_json(&r);
		cr_assert_str_eq(json_string_value(json_object_get(o, "state")), "running");
		cr_assert_eq(json_integer_value(json_object_get(o, "world_size")), 8);
		cr_assert_eq(json_integer_value(json_object_get(o, "dp")), 4);
		json_decref(o);
	}
	ctlp_stop(&c, 1);
}

Test(rdzv, elastic_round_closes_after_last_call)
{
	struct ctlp c = { 0 };
	struct agent ag[3];
	pthread_t th[3];
	long long t0;

	ctlp_start(&c, 0, NULL);
	create_job(&c, "{\"name\":\"t/el\",\"min_nodes\":2,\"max_nodes\":4,\"last_call_ms\":700}");
	t0 = mr_test_now_ms();
	for (int i = 0; i < 3; i++) {
		memset(&ag[i], 0, sizeof(ag[i]));
		ag[i].c = &c;
		ag[i].job = "t/el";
		ag[i].pod = -1;
		snprintf(ag[i].id, sizeof(ag[i].id), "n%d", i);
	}
	run_agents(ag, 3, th);
	join_agents(3, th);
	cr_assert_geq(mr_test_now_ms() - t0, 600, "closed before the last call ended");
	for (int i = 0; i < 3; i++) {
		cr_assert(ag[i].done);
		cr_assert_eq(ag[i].nodes, 3, "3 of max 4 joined within the window");
		cr_assert_eq(ag[i].rank, i, "node id order");
	}
	ctlp_stop(&c, 1);
}

static void hb(struct ctlp *c, struct mr_test_resp *r, const char *job, const char *id,
	       long long gen)
{
	char body[128];

	snprintf(body, sizeof(body), "{\"node_id\":\"%s\",\"generation\":%lld}", id, gen);
	ctl_call(c, r, "POST", body, NULL, "/v1/jobs/%s/heartbeat", job);
}

Test(rdzv, late_joiner_waits_on_standby_and_enters_next_round)
{
	struct ctlp c = { 0 };
	struct agent ag[3];
	pthread_t th[3];
	struct mr_test_resp r;

	ctlp_start(&c, 0, NULL);
	create_job(&c, "{\"name\":\"t/late\",\"min_nodes\":2,\"max_nodes\":2}");
	for (int i = 0; i < 3; i++) {
		memset(&ag[i], 0, sizeof(ag[i]));
		ag[i].c = &c;
		ag[i].job = "t/late";
		ag[i].pod = i;
		snprintf(ag[i].id, sizeof(ag[i].id), "p%d", i);
	}
	run_agents(ag, 2, th);
	join_agents(2, th);
	cr_assert(ag[0].done && ag[1].done);
	/* the job is full: the third joins on standby */
	do_join(&ag[2], &r);
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.body, "\"standby\""), "%s", r.body);
	/* p0 leaves: generation bumps, p2 (standby) enters the new round */
	ctl_call(&c, &r, "POST", "{\"node_id\":\"p0\",\"generation\":1,\"reason\":\"scale\"}",
		 NULL, "/v1/jobs/t/late/leave");
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert_eq(jint(&r, "generation"), 2);
	hb(&c, &r, "t/late", "p1", 1);
	cr_assert_eq(r.status, 409, "survivor learns of the new generation");
	cr_assert_eq(jint(&r, "generation"), 2);
	ag[1].done = 0;
	pthread_create(&th[1], NULL, agent_main, &ag[1]);
	pthread_create(&th[2], NULL, agent_main, &ag[2]);
	pthread_join(th[1], NULL);
	pthread_join(th[2], NULL);
	cr_assert(ag[1].done && ag[2].done);
	cr_assert_eq(ag[1].gen, 2);
	cr_assert_eq(ag[1].rank, 0);
	cr_assert_eq(ag[2].rank, 1);
	ctlp_stop(&c, 1);
}

struct kvwait {
	struct ctlp *c;
	long status;
	long long ms;
	long long gen;
};

static void *kv_waiter(void *arg)
{
	struct kvwait *w = arg;
	struct mr_test_resp *r = malloc(sizeof(*r));
	long long t0 = mr_test_now_ms();

	w->status = ctl_call(w->c, r, "GET", NULL, NULL,
			     "/v1/jobs/t/dead/kv/never?generation=1&wait_ms=20000");
	w->ms = mr_test_now_ms() - t0;
	if (w->status == 409)
		w->gen = jint(r, "generation");
	free(r);
	return NULL;
}

Test(rdzv, silent_member_dies_and_survivors_get_409_at_once)
{
	struct ctlp c = { 0 };
	struct agent ag[3];
	pthread_t th[3], wt;
	struct kvwait kw = { .c = &c };
	struct mr_test_resp r;
	long long t0;

	ctlp_start(&c, 0, NULL);
	create_job(&c, "{\"name\":\"t/dead\",\"min_nodes\":3,\"heartbeat_timeout_ms\":800}");
	for (int i = 0; i < 3; i++) {
		memset(&ag[i], 0, sizeof(ag[i]));
		ag[i].c = &c;
		ag[i].job = "t/dead";
		ag[i].pod = -1;
		snprintf(ag[i].id, sizeof(ag[i].id), "m%d", i);
	}
	run_agents(ag, 3, th);
	join_agents(3, th);
	pthread_create(&wt, NULL, kv_waiter, &kw);
	/* m0 and m1 heartbeat, m2 is silent */
	t0 = mr_test_now_ms();
	for (;;) {
		hb(&c, &r, "t/dead", "m0", 1);
		if (r.status != 200)
			break;
		hb(&c, &r, "t/dead", "m1", 1);
		cr_assert_lt(mr_test_now_ms() - t0, 5000, "m2 was never declared dead");
		usleep(100000);
	}
	cr_assert_eq(r.status, 409);
	cr_assert_eq(jint(&r, "generation"), 2);
	pthread_join(wt, NULL);
	cr_assert_eq(kw.status, 409, "parked KV wait answered 409");
	cr_assert_eq(kw.gen, 2);
	cr_assert_lt(kw.ms, 5000, "answered at once, not after wait_ms");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/t/dead?members=1");
	cr_assert(strstr(r.body, "\"restarts\":1"), "%s", r.body);
	cr_assert(!strstr(r.body, "\"m2\""), "the dead member is gone: %s", r.body);
	ctl_call(&c, &r, "GET", NULL, NULL, "/metrics");
	cr_assert(strstr(r.body, "meshrun_controller_dead_members_total 1"), "%s", r.body);
	ctlp_stop(&c, 1);
}

struct watch {
	struct ctlp *c;
	const char *id;
	long status;
	struct mr_test_resp r;
};

/* The agent's heartbeat watch: a parked GET of a key nobody writes,
 * naming its node. */
static void *watcher(void *arg)
{
	struct watch *w = arg;

	w->status = ctl_call(w->c, &w->r, "GET", NULL, NULL,
			     "/v1/jobs/t/carry/kv/meshrun/watch?generation=1&wait_ms=20000"
			     "&node_id=%s", w->id);
	return NULL;
}

/* The "member" of a 409 reply: its state and (running) node rank and
 * number of nodes; -1 where absent. */
static void member_of_409(const struct mr_test_resp *r, long long gen, char *state,
			  size_t cap, long long *rank, long long *nodes)
{
	json_t *o = resp_json(r), *m = json_object_get(o, "member");

	cr_assert_eq(r->status, 409, "%s", r->body);
	cr_assert(json_is_object(m), "no member in %s", r->body);
	cr_assert_eq(json_integer_value(json_object_get(m, "generation")), gen, "%s", r->body);
	snprintf(state, cap, "%s", json_string_value(json_object_get(m, "state")));
	*rank = json_is_integer(json_object_get(m, "node_rank"))
			? json_integer_value(json_object_get(m, "node_rank")) : -1;
	*nodes = json_is_integer(json_object_get(m, "num_nodes"))
			 ? json_integer_value(json_object_get(m, "num_nodes")) : -1;
	json_decref(o);
}

Test(rdzv, survivors_are_carried_into_the_next_round)
{
	struct ctlp c = { 0 };
	struct agent ag[3];
	pthread_t th[3], wt;
	struct watch *w = calloc(1, sizeof(*w));
	struct mr_test_resp r;
	long long t0, rank, nodes;
	char st[32];

	ctlp_start(&c, 0, NULL);
	create_job(&c, "{\"name\":\"t/carry\",\"min_nodes\":2,\"max_nodes\":3,"
		       "\"heartbeat_timeout_ms\":1000,\"last_call_ms\":300,\"max_restarts\":5}");
	for (int i = 0; i < 3; i++) {
		memset(&ag[i], 0, sizeof(ag[i]));
		ag[i].c = &c;
		ag[i].job = "t/carry";
		ag[i].pod = i;
		snprintf(ag[i].id, sizeof(ag[i].id), "m%d", i);
	}
	run_agents(ag, 3, th);
	join_agents(3, th);
	for (int i = 0; i < 3; i++)
		cr_assert(ag[i].done && ag[i].rank == i);
	w->c = &c;
	w->id = "m0";
	pthread_create(&wt, NULL, watcher, w);
	/* m0 and m1 beat, m2 is silent: declared dead, the generation bumps */
	t0 = mr_test_now_ms();
	for (;;) {
		hb(&c, &r, "t/carry", "m1", 1);
		if (r.status != 200)
			break;
		hb(&c, &r, "t/carry", "m0", 1);
		cr_assert_lt(mr_test_now_ms() - t0, 5000, "m2 was never declared dead");
		usleep(100000);
	}
	/* m1's beat and m0's parked watch: 409, and each is waiting in
	 * generation 2 already: no join needed */
	member_of_409(&r, 2, st, sizeof(st), &rank, &nodes);
	cr_assert_str_eq(st, "waiting");
	pthread_join(wt, NULL);
	cr_assert_lt(mr_test_now_ms() - t0, 5000);
	member_of_409(&w->r, 2, st, sizeof(st), &rank, &nodes);
	cr_assert_str_eq(st, "waiting");
	/* m0 just waits: the round closes after its last call with m0 and m1 */
	ctl_call(&c, &r, "GET", NULL, NULL,
		 "/v1/jobs/t/carry/wait?node_id=m0&generation=2&timeout_ms=5000");
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert(strstr(r.body, "\"state\":\"running\""), "%s", r.body);
	cr_assert_eq(jint(&r, "node_rank"), 0);
	cr_assert_eq(jint(&r, "num_nodes"), 2);
	cr_assert_eq(jint(&r, "restarts"), 1);
	/* m1's watch of generation 1, sent after the close: 409 with its rank */
	w->id = "m1";
	watcher(w);
	member_of_409(&w->r, 2, st, sizeof(st), &rank, &nodes);
	cr_assert_str_eq(st, "running");
	cr_assert_eq(rank, 1);
	cr_assert_eq(nodes, 2);
	/* an agent that ignores "member" joins anyway: the same rank, no bump */
	ag[1].done = 0;
	agent_main(&ag[1]);
	cr_assert(ag[1].done);
	cr_assert_eq(ag[1].gen, 2);
	cr_assert_eq(ag[1].rank, 1);
	/* m2's pod comes back: an elastic scale-up (no restart); m0 and m1 are
	 * carried again, so its join fills the round and closes it */
	do_join(&ag[2], &r);
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert_eq(jint(&r, "generation"), 3);
	cr_assert(strstr(r.body, "\"running\""), "%s", r.body);
	cr_assert_eq(jint(&r, "node_rank"), 2);
	hb(&c, &r, "t/carry", "m0", 2);
	member_of_409(&r, 3, st, sizeof(st), &rank, &nodes);
	cr_assert_str_eq(st, "running");
	cr_assert_eq(rank, 0);
	cr_assert_eq(nodes, 3);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/t/carry");
	cr_assert(strstr(r.body, "\"restarts\":1"), "the scale-up costs no restart: %s", r.body);
	free(w);
	ctlp_stop(&c, 1);
}

Test(rdzv, restarted_pod_keeps_its_rank)
{
	struct ctlp c = { 0 };
	struct agent ag[4];
	pthread_t th[4];
	int before[4];

	ctlp_start(&c, 0, NULL);
	create_job(&c, "{\"name\":\"t/rs\",\"min_nodes\":4,\"max_restarts\":5}");
	for (int i = 0; i < 4; i++) {
		memset(&ag[i], 0, sizeof(ag[i]));
		ag[i].c = &c;
		ag[i].job = "t/rs";
		ag[i].pod = (i * 3) % 4;
		snprintf(ag[i].id, sizeof(ag[i].id), "pod-%d", ag[i].pod);
	}
	run_agents(ag, 4, th);
	join_agents(4, th);
	for (int i = 0; i < 4; i++)
		before[i] = ag[i].rank;
	/* pod 2 restarts: same node id joins again; everybody rejoins */
	for (int i = 0; i < 4; i++)
		ag[i].done = 0;
	run_agents(ag, 4, th);
	join_agents(4, th);
	for (int i = 0; i < 4; i++) {
		cr_assert(ag[i].done);
		cr_assert_eq(ag[i].gen, 2);
		cr_assert_eq(ag[i].rank, before[i], "%s moved from rank %d to %d", ag[i].id,
			     before[i], ag[i].rank);
	}
	ctlp_stop(&c, 1);
}

Test(rdzv, controller_sigkill_mid_rendezvous_loses_nothing)
{
	struct ctlp c = { 0 };
	struct agent ag[6];
	pthread_t th[6];
	struct mr_test_resp r;
	int seen[6] = { 0 }, port;
	char portarg[16];

	ctlp_start(&c, 0, NULL);
	port = c.port;
	create_job(&c, "{\"name\":\"t/crash\",\"min_nodes\":6,\"heartbeat_timeout_ms\":20000}");
	ctl_call(&c, &r, "PUT", "keep-me", NULL, "/v1/jobs/t/crash/kv/boot/id");
	cr_assert_eq(r.status, 200);
	for (int i = 0; i < 6; i++) {
		memset(&ag[i], 0, sizeof(ag[i]));
		ag[i].c = &c;
		ag[i].job = "t/crash";
		ag[i].pod = -1;
		snprintf(ag[i].id, sizeof(ag[i].id), "crash-%d", i);
	}
	run_agents(ag, 3, th);
	usleep(500000); /* three joined and parked */
	mr_proc_kill(&c.proc, SIGKILL);
	mr_proc_reap(&c.proc, 5000);
	run_agents(ag + 3, 3, th + 3); /* these retry through the outage */
	usleep(300000);
	snprintf(portarg, sizeof(portarg), "%d", port);
	ctlp_start(&c, port, NULL);
	join_agents(6, th);
	for (int i = 0; i < 6; i++) {
		cr_assert(ag[i].done, "%s did not finish", ag[i].id);
		cr_assert_eq(seen[ag[i].rank]++, 0, "duplicate rank %d", ag[i].rank);
		cr_assert_eq(ag[i].rank, i, "node id order");
		cr_assert_eq(ag[i].gen, 1, "no generation bump across the restart");
	}
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/t/crash/kv/boot/id");
	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.body, "keep-me");
	ctlp_stop(&c, 1);
}

Test(rdzv, torn_journal_tail_is_dropped_on_restart)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	char path[400];
	FILE *f;
	long size;

	ctlp_start(&c, 0, NULL);
	create_job(&c, "{\"name\":\"t/torn\",\"min_nodes\":2}");
	ctl_call(&c, &r, "PUT", "v1", NULL, "/v1/jobs/t/torn/kv/a");
	ctl_call(&c, &r, "PUT", "v2", NULL, "/v1/jobs/t/torn/kv/b");
	cr_assert_eq(r.status, 200);
	mr_proc_kill(&c.proc, SIGKILL);
	mr_proc_reap(&c.proc, 5000);
	snprintf(path, sizeof(path), "%s/journal", c.dir);
	f = fopen(path, "rb");
	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fclose(f);
	cr_assert_eq(truncate(path, size - 2), 0); /* mid-record */
	ctlp_start(&c, 0, NULL);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/t/torn/kv/a");
	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.body, "v1");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/t/torn/kv/b");
	cr_assert_eq(r.status, 404, "the torn record is lost, and only it");
	ctl_call(&c, &r, "GET", NULL, NULL, "/readyz");
	cr_assert_eq(r.status, 200);
	ctlp_stop(&c, 1);
}
