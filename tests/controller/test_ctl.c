/*
 * test_ctl.c - unit tests of the controller core without HTTP: rank
 * ordering, round close at max and after last-call, generation bumps
 * (the live members carried into the next round, what their 409s say,
 * their replay), KV semantics, journal encode/replay (including a torn
 * tail), and the terminal states (permanent fail, completion) with their
 * replay.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/ctl.h"
#include "journal/journal.h"

/* res's body as JSON, whichever way the core wrote it (a json_t, or text:
 * a success body, or an error's extra fields); kept in res->body. */
static json_t *body_json(struct ctl_res *res)
{
	if (!res->body && res->text) {
		char buf[4096];

		if (res->code)
			snprintf(buf, sizeof(buf), "{%.*s}", (int)res->text_len, res->text);
		else
			snprintf(buf, sizeof(buf), "%.*s", (int)res->text_len, res->text);
		res->body = json_loads(buf, 0, NULL);
		cr_assert_not_null(res->body, "reply text is not JSON: %s", buf);
	}
	return res->body;
}

struct woke {
	int n;
	int status[64];
	json_int_t rank[64];
	char member[64][16]; /* a 409's member.state, "" when absent */
	void *req[64];
};

static void on_wake(struct ctl *ctl, void *req, struct ctl_res *res)
{
	struct woke *w = ctl->user;
	json_t *b = body_json(res);
	json_t *r = b ? json_object_get(b, "node_rank") : NULL;
	json_t *m = b ? json_object_get(b, "member") : NULL;
	const char *ms = json_string_value(json_object_get(m, "state"));

	if (w->n < 64) {
		w->status[w->n] = res->status;
		w->rank[w->n] = r ? json_integer_value(r) : -1;
		snprintf(w->member[w->n], sizeof(w->member[0]), "%s", ms ? ms : "");
		w->req[w->n] = req;
	}
	w->n++;
}

static void setup(struct ctl *ctl, struct woke *w)
{
	struct ctl_limits lim = { .max_value = 1024, .max_keys = 100, .max_members = 1000,
				  .max_jobs = 10 };

	lim.defaults.last_call_ms = 0;
	lim.defaults.heartbeat_timeout_ms = 1000;
	lim.defaults.max_restarts = 1;
	mr__ctl_init(ctl, &lim);
	memset(w, 0, sizeof(*w));
	ctl->wake = on_wake;
	ctl->user = w;
}

static struct ctl_spec spec(int min, int max)
{
	struct ctl_spec s = { .min_nodes = min, .max_nodes = max, .nproc_per_node = 1, .tp = 1,
			      .pp = 1, .cp = 1, .ep = 1, .dp = 0, .last_call_ms = 0,
			      .heartbeat_timeout_ms = 1000, .max_restarts = 1 };
	return s;
}

static void join(struct ctl *ctl, const char *id, int pod, const struct ctl_spec *sp)
{
	struct ctl_join j = { .node_id = id, .pod_index = pod, .spec = sp, .host = "h" };
	struct ctl_res res;

	memset(&res, 0, sizeof(res));
	mr__ctl_join(ctl, "ns/job", &j, &res);
	cr_assert_eq(res.status, 200, "join %s: %d %s", id, res.status, res.msg);
	mr__res_release(&res);
}

static int rank_of(struct ctl *ctl, const char *id)
{
	struct ctl_member *m = mr_dict_get(&mr__ctl_job(ctl, "ns/job")->members, id);

	return m ? m->node_rank : -2;
}

Test(ctl, ranks_follow_pod_index_then_node_id)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(4, 4);
	const char *ids[] = { "d", "a", "c", "b" };
	int pods[] = { 0, 3, 1, 2 };

	setup(&ctl, &w);
	for (int i = 0; i < 4; i++) {
		struct ctl_res res;

		join(&ctl, ids[i], pods[i], &sp);
		memset(&res, 0, sizeof(res));
		/* park a wait for each (fake request pointer) */
		mr__ctl_wait(&ctl, "ns/job", ids[i], 1, 1000, (void *)(intptr_t)(i + 1), &res);
		if (i < 3)
			cr_assert(res.suspended);
		mr__res_release(&res);
	}
	/* the 4th wait came after the close: answered at once; 3 parked woken */
	cr_assert_eq(w.n, 3);
	cr_assert_eq(rank_of(&ctl, "d"), 0);
	cr_assert_eq(rank_of(&ctl, "c"), 1);
	cr_assert_eq(rank_of(&ctl, "b"), 2);
	cr_assert_eq(rank_of(&ctl, "a"), 3);
	mr__ctl_release(&ctl);

	/* without pod indexes: byte order of node ids */
	setup(&ctl, &w);
	for (int i = 0; i < 4; i++)
		join(&ctl, ids[i], -1, &sp);
	cr_assert_eq(rank_of(&ctl, "a"), 0);
	cr_assert_eq(rank_of(&ctl, "d"), 3);
	mr__ctl_release(&ctl);
}

Test(ctl, death_bumps_generation_and_answers_waiters)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(3, 3);
	struct ctl_res res;
	struct ctl_job *job;

	setup(&ctl, &w);
	join(&ctl, "a", -1, &sp);
	join(&ctl, "b", -1, &sp);
	join(&ctl, "c", -1, &sp);
	job = mr__ctl_job(&ctl, "ns/job");
	cr_assert_eq(job->state, CTL_JOB_RUNNING);
	cr_assert_eq(job->generation, 1);
	/* a and b keep heartbeating (KV waits), c goes silent */
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_get(&ctl, job, "x", 100000, (void *)1, &res);
	cr_assert(res.suspended);
	ctl.now_ms += 2000;
	mr__ctl_heartbeat(&ctl, "ns/job", "a", 1, NULL, &res);
	mr__ctl_heartbeat(&ctl, "ns/job", "b", 1, NULL, &res);
	mr__res_release(&res);
	ctl.last_scan_ms = -100000;
	/* run the scan at the mocked time */
	{
		int64_t keep = ctl.now_ms;
		struct ctl_member *m;

		/* make a, b fresh relative to real time used by tick */
		ctl.now_ms = mr__ctl_now_ms() + 5000;
		for (m = job->lru_head; m; m = m->lru_next)
			if (strcmp(m->node_id, "c") != 0)
				m->last_seen_ms = ctl.now_ms;
		(void)keep;
	}
	/* expire c directly through the timer path */
	job->lru_head->last_seen_ms = -100000;
	mr__ctl_tick(&ctl);
	cr_assert_eq(job->generation, 2, "generation %llu", (unsigned long long)job->generation);
	cr_assert_eq(job->restarts, 1);
	cr_assert_eq(job->state, CTL_JOB_FORMING);
	cr_assert_eq(ctl.stats.dead, 1);
	cr_assert_eq(w.n, 1);
	cr_assert_eq(w.status[0], 409);
	/* an old-generation heartbeat is 409, with the job's restart count:
	 * a lost member counts (an elastic scale-up would not) */
	memset(&res, 0, sizeof(res));
	mr__ctl_heartbeat(&ctl, "ns/job", "a", 1, NULL, &res);
	cr_assert_eq(res.status, 409);
	cr_expect_eq(json_integer_value(json_object_get(body_json(&res), "generation")), 2);
	cr_expect_eq(json_integer_value(json_object_get(body_json(&res), "restarts")), 1);
	mr__res_release(&res);
	mr__ctl_release(&ctl);
}

Test(ctl, kv_cas_add_and_list)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(1, 1);
	struct ctl_res res;
	struct ctl_job *job;
	struct ctl_put p = { .val = "v1", .len = 2, .if_match = -1, .if_none_match = 1 };

	setup(&ctl, &w);
	join(&ctl, "a", -1, &sp);
	job = mr__ctl_job(&ctl, "ns/job");
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_put(&ctl, job, "k", &p, &res);
	cr_assert_eq(res.status, 200);
	cr_assert_eq(res.etag, 1);
	mr__res_release(&res);
	mr__ctl_kv_put(&ctl, job, "k", &p, &res); /* If-None-Match: * on a present key */
	cr_assert_eq(res.status, 412);
	mr__res_release(&res);
	p.if_none_match = 0;
	p.if_match = 7;
	mr__ctl_kv_put(&ctl, job, "k", &p, &res);
	cr_assert_eq(res.status, 412);
	mr__res_release(&res);
	p.if_match = 1;
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_put(&ctl, job, "k", &p, &res);
	cr_assert_eq(res.status, 200);
	cr_assert_eq(res.etag, 2);
	mr__res_release(&res);
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_add(&ctl, job, "k", 1, &res);
	cr_assert_eq(res.status, 409, "add on a non-number");
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_add(&ctl, job, "n", 5, &res);
	cr_assert_eq(json_integer_value(json_object_get(body_json(&res), "value")), 5);
	mr__res_release(&res);
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_add(&ctl, job, "n", -7, &res);
	cr_assert_eq(json_integer_value(json_object_get(body_json(&res), "value")), -2);
	mr__res_release(&res);
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_list(&ctl, job, "", 0, 1, &res);
	cr_assert_eq(json_array_size(json_object_get(body_json(&res), "keys")), 1);
	cr_assert_eq(json_integer_value(json_object_get(body_json(&res), "total")), 2);
	cr_assert_eq(json_integer_value(json_object_get(body_json(&res), "next")), 1);
	cr_assert_str_eq(json_string_value(json_object_get(
		json_array_get(json_object_get(body_json(&res), "keys"), 0), "key")), "k");
	mr__res_release(&res);
	mr__ctl_release(&ctl);
}

/* Removes dir and the journal files in it. */
static void remove_journal_dir(const char *dir)
{
	static const char *const names[] = { "journal", "journal.tmp", "lock" };
	char path[256];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		unlink(path);
	}
	rmdir(dir);
}

static int jopen(struct ctl *ctl, const char *dir, struct ctl_journal_info *ji,
		 struct mr_errbuf *eb)
{
	struct ctl_journal_opts o = { .dir = dir };

	return mr__ctl_journal_open(ctl, &o, ji, eb);
}

static void build_state(struct ctl *ctl, const char *dir, int torn)
{
	struct woke w;
	struct ctl_journal_info ji;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct ctl_spec sp = spec(3, 3);
	struct ctl_put p = { .val = "addr", .len = 4, .if_match = -1 };
	struct ctl_res res;

	(void)torn;
	setup(ctl, &w);
	cr_assert_eq(jopen(ctl, dir, &ji, &eb), 0, "%s", eb.msg);
	join(ctl, "x", 2, &sp);
	join(ctl, "y", 0, &sp);
	join(ctl, "z", 1, &sp);
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_put(ctl, mr__ctl_job(ctl, "ns/job"), "peer/0", &p, &res);
	mr__res_release(&res);
	cr_assert_eq(mr__jr_commit(ctl->jr), 0);
}

Test(ctl, journal_replay_restores_state_and_drops_torn_tail)
{
	char dir[] = "/tmp/mr-ctl-test-XXXXXX", path[256];
	struct ctl a, b;
	struct woke w;
	struct ctl_journal_info ji;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct ctl_job *job;
	struct ctl_kv *e;
	FILE *f;
	long size;

	cr_assert(mkdtemp(dir));
	build_state(&a, dir, 0);
	mr__ctl_journal_close(&a);
	mr__ctl_release(&a);

	setup(&b, &w);
	cr_assert_eq(jopen(&b, dir, &ji, &eb), 0, "%s", eb.msg);
	cr_assert_eq(ji.dropped, 0);
	job = mr__ctl_job(&b, "ns/job");
	cr_assert_not_null(job);
	cr_assert_eq(job->state, CTL_JOB_RUNNING);
	cr_assert_eq(job->generation, 1);
	cr_assert_eq(rank_of(&b, "y"), 0);
	cr_assert_eq(rank_of(&b, "z"), 1);
	cr_assert_eq(rank_of(&b, "x"), 2);
	e = mr_dict_get(&job->kv, "peer/0");
	cr_assert_not_null(e);
	cr_assert_eq(e->len, 4);
	cr_assert_eq(memcmp(e->data, "addr", 4), 0);
	/* one more record, then tear it */
	{
		struct ctl_put p = { .val = "more", .len = 4, .if_match = -1 };
		struct ctl_res res;

		memset(&res, 0, sizeof(res));
		mr__ctl_kv_put(&b, job, "peer/1", &p, &res);
		mr__res_release(&res);
		cr_assert_eq(mr__jr_commit(b.jr), 0);
	}
	mr__ctl_journal_close(&b);
	mr__ctl_release(&b);
	snprintf(path, sizeof(path), "%s/journal", dir);
	f = fopen(path, "rb");
	cr_assert(f);
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fclose(f);
	cr_assert_eq(truncate(path, size - 3), 0);

	setup(&b, &w);
	cr_assert_eq(jopen(&b, dir, &ji, &eb), 0, "%s", eb.msg);
	cr_assert_gt(ji.dropped, 0);
	job = mr__ctl_job(&b, "ns/job");
	cr_assert_not_null(mr_dict_get(&job->kv, "peer/0"));
	cr_assert_null(mr_dict_get(&job->kv, "peer/1"), "the torn record must be dropped");
	cr_assert_eq(rank_of(&b, "x"), 2);
	mr__ctl_journal_close(&b);
	mr__ctl_release(&b);
	remove_journal_dir(dir);
}

static json_t *member_in(struct ctl_res *res);

Test(ctl, failures_past_max_restarts_fail_the_job)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(2, 2); /* max_restarts 1 */
	struct ctl_res res;
	struct ctl_job *job;

	setup(&ctl, &w);
	join(&ctl, "a", -1, &sp);
	join(&ctl, "b", -1, &sp);
	job = mr__ctl_job(&ctl, "ns/job");
	memset(&res, 0, sizeof(res));
	mr__ctl_leave(&ctl, "ns/job", "a", 1, 1, &res); /* fail: restart 1 of 1 */
	cr_assert_eq(res.status, 200);
	mr__res_release(&res);
	cr_assert_eq(job->generation, 2);
	cr_assert_eq(job->state, CTL_JOB_FORMING);
	/* a failure report carries nobody (its cause may be a peer that does
	 * not look lost yet): both join again, and b's 409 says nothing */
	cr_assert_eq(job->count[CTL_M_WAITING], 0);
	cr_assert_eq(job->count[CTL_M_STALE], 2);
	memset(&res, 0, sizeof(res));
	mr__ctl_heartbeat(&ctl, "ns/job", "b", 1, NULL, &res);
	cr_assert_null(member_in(&res));
	mr__res_release(&res);
	join(&ctl, "a", -1, &sp);
	join(&ctl, "b", -1, &sp);
	cr_assert_eq(job->state, CTL_JOB_RUNNING);
	memset(&res, 0, sizeof(res));
	mr__ctl_wait(&ctl, "ns/job", "b", 2, 0, NULL, &res);
	cr_assert_eq(res.status, 200);
	mr__res_release(&res);
	memset(&res, 0, sizeof(res));
	mr__ctl_leave(&ctl, "ns/job", "b", 2, 1, &res); /* restart 2 > 1 */
	mr__res_release(&res);
	cr_assert_eq(job->state, CTL_JOB_FAILED);
	memset(&res, 0, sizeof(res));
	mr__ctl_heartbeat(&ctl, "ns/job", "a", 3, NULL, &res);
	cr_assert_eq(res.status, 410);
	cr_assert_str_eq(res.code, "job_failed");
	cr_assert(strstr(res.msg, "max_restarts (1) exceeded: fail of node 'b'"), "%s", res.msg);
	mr__res_release(&res);
	mr__ctl_release(&ctl);
}

Test(ctl, retried_join_before_the_rank_was_seen_is_idempotent)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(2, 2);
	struct ctl_res res;
	struct ctl_job *job;

	setup(&ctl, &w);
	join(&ctl, "a", -1, &sp);
	join(&ctl, "b", -1, &sp); /* closes the round */
	job = mr__ctl_job(&ctl, "ns/job");
	cr_assert_eq(job->state, CTL_JOB_RUNNING);
	join(&ctl, "b", -1, &sp); /* the reply was lost: retried */
	cr_assert_eq(job->generation, 1, "no restart for a retried join");
	memset(&res, 0, sizeof(res));
	mr__ctl_wait(&ctl, "ns/job", "a", 1, 1000, (void *)1, &res);
	cr_assert_eq(res.status, 200);
	cr_assert_eq(json_integer_value(json_object_get(body_json(&res), "node_rank")), 0);
	mr__res_release(&res);
	join(&ctl, "a", -1, &sp); /* a knew its rank: this is a restarted pod */
	cr_assert_eq(job->generation, 2);
	cr_assert_eq(job->restarts, 1);
	mr__ctl_release(&ctl);
}

/* Reopens the journal of dir into b (after a's state was committed). */
static void reopen(struct ctl *b, struct woke *w, const char *dir)
{
	struct ctl_journal_info ji;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	setup(b, w);
	cr_assert_eq(jopen(b, dir, &ji, &eb), 0, "%s", eb.msg);
	cr_assert_eq(ji.dropped, 0);
}

static void expect_over(struct ctl *ctl, const char *id, const char *code, const char *reason)
{
	struct ctl_res res;
	const char *r;

	memset(&res, 0, sizeof(res));
	mr__ctl_heartbeat(ctl, "ns/job", id, -1, NULL, &res);
	cr_assert_eq(res.status, 410, "heartbeat: %d %s", res.status, res.msg);
	cr_assert_str_eq(res.code, code);
	r = json_string_value(json_object_get(body_json(&res), "reason"));
	cr_assert(r && strstr(r, reason), "reason '%s' lacks '%s'", r ? r : "", reason);
	cr_assert(strstr(res.msg, reason), "message '%s' lacks '%s'", res.msg, reason);
	mr__res_release(&res);
}

Test(ctl, permanent_fail_ends_the_job_and_survives_restart)
{
	char dir[] = "/tmp/mr-ctl-test-XXXXXX";
	struct ctl_journal_info ji;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct ctl ctl, b;
	struct woke w, wb;
	struct ctl_spec sp = spec(2, 2);
	struct ctl_res res;
	struct ctl_job *job;
	struct ctl_join j = { .node_id = "late", .pod_index = -1 };
	int tag1, tag2;

	cr_assert(mkdtemp(dir));
	setup(&ctl, &w);
	cr_assert_eq(jopen(&ctl, dir, &ji, &eb), 0, "%s", eb.msg);
	join(&ctl, "a", -1, &sp);
	join(&ctl, "b", -1, &sp);
	job = mr__ctl_job(&ctl, "ns/job");
	cr_assert_eq(job->state, CTL_JOB_RUNNING);
	/* parked: a KV wait of b and the wait of a standby member */
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_get(&ctl, job, "never", 60000, &tag1, &res);
	cr_assert(res.suspended);
	join(&ctl, "c", -1, &sp);
	memset(&res, 0, sizeof(res));
	mr__ctl_wait(&ctl, "ns/job", "c", 1, 60000, &tag2, &res);
	cr_assert(res.suspended);
	cr_assert_eq(w.n, 0);

	memset(&res, 0, sizeof(res));
	mr__ctl_fail_job(&ctl, "ns/job", "a", "rank 0 exited with code 2", &res);
	cr_assert_eq(res.status, 200, "%d %s", res.status, res.msg);
	cr_assert_str_eq(json_string_value(json_object_get(body_json(&res), "state")), "failed");
	mr__res_release(&res);
	cr_assert_eq(job->state, CTL_JOB_FAILED);
	cr_assert_eq(job->generation, 1, "a permanent failure does not bump");
	cr_assert_eq(w.n, 2, "both parked calls are answered at once");
	cr_assert_eq(w.status[0], 410);
	cr_assert_eq(w.status[1], 410);
	expect_over(&ctl, "b", "job_failed", "node 'a' failed permanently: rank 0 exited");
	memset(&res, 0, sizeof(res));
	mr__ctl_join(&ctl, "ns/job", &j, &res);
	cr_assert_eq(res.status, 410);
	cr_assert_str_eq(res.code, "job_failed");
	mr__res_release(&res);
	memset(&res, 0, sizeof(res));
	cr_assert_null(mr__ctl_job_for(&ctl, "ns/job", 1, &res)); /* every KV call */
	cr_assert_eq(res.status, 410);
	mr__res_release(&res);
	cr_assert_eq(mr__jr_commit(ctl.jr), 0);
	mr__ctl_journal_close(&ctl);
	mr__ctl_release(&ctl);

	/* replayed (and compacted), then replayed again from the snapshot */
	for (int round = 0; round < 2; round++) {
		reopen(&b, &wb, dir);
		job = mr__ctl_job(&b, "ns/job");
		cr_assert_not_null(job);
		cr_assert_eq(job->state, CTL_JOB_FAILED, "round %d", round);
		cr_assert_eq(job->generation, 1);
		expect_over(&b, "b", "job_failed", "node 'a' failed permanently");
		mr__ctl_journal_close(&b);
		mr__ctl_release(&b);
	}
	remove_journal_dir(dir);
}

Test(ctl, completion_of_every_member_succeeds_without_a_bump)
{
	char dir[] = "/tmp/mr-ctl-test-XXXXXX";
	struct ctl_journal_info ji;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct ctl ctl, b;
	struct woke w, wb;
	struct ctl_spec sp = spec(2, 2);
	struct ctl_res res;
	struct ctl_job *job;
	int tag;

	cr_assert(mkdtemp(dir));
	setup(&ctl, &w);
	cr_assert_eq(jopen(&ctl, dir, &ji, &eb), 0, "%s", eb.msg);
	join(&ctl, "a", -1, &sp);
	join(&ctl, "b", -1, &sp);
	job = mr__ctl_job(&ctl, "ns/job");
	memset(&res, 0, sizeof(res));
	mr__ctl_complete(&ctl, "ns/job", "a", 1, &res);
	cr_assert_eq(res.status, 200, "%d %s", res.status, res.msg);
	cr_assert_str_eq(json_string_value(json_object_get(body_json(&res), "state")), "running");
	mr__res_release(&res);
	cr_assert_eq(job->count[CTL_M_DONE], 1);
	cr_assert_eq(job->generation, 1);
	/* a completed member going away is not a failure */
	memset(&res, 0, sizeof(res));
	mr__ctl_complete(&ctl, "ns/job", "a", 1, &res); /* retried: idempotent */
	cr_assert_eq(res.status, 200);
	mr__res_release(&res);
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_get(&ctl, job, "exit", 60000, &tag, &res);
	cr_assert(res.suspended);
	memset(&res, 0, sizeof(res));
	mr__ctl_complete(&ctl, "ns/job", "b", 1, &res);
	cr_assert_eq(res.status, 200);
	cr_assert_str_eq(json_string_value(json_object_get(body_json(&res), "state")), "succeeded");
	mr__res_release(&res);
	cr_assert_eq(job->state, CTL_JOB_SUCCEEDED);
	cr_assert_eq(job->generation, 1, "completion never bumps");
	cr_assert_eq(job->restarts, 0);
	cr_assert_eq(w.n, 1);
	cr_assert_eq(w.status[0], 410);
	expect_over(&ctl, "a", "job_succeeded", "all 2 nodes of generation 1 completed");
	cr_assert_eq(mr__jr_commit(ctl.jr), 0);
	mr__ctl_journal_close(&ctl);
	mr__ctl_release(&ctl);

	reopen(&b, &wb, dir);
	job = mr__ctl_job(&b, "ns/job");
	cr_assert_eq(job->state, CTL_JOB_SUCCEEDED);
	cr_assert_eq(job->generation, 1);
	expect_over(&b, "b", "job_succeeded", "completed");
	mr__ctl_journal_close(&b);
	mr__ctl_release(&b);
	remove_journal_dir(dir);
}

Test(ctl, complete_needs_a_running_member)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(2, 2);
	struct ctl_res res;

	setup(&ctl, &w);
	join(&ctl, "a", -1, &sp); /* round still forming */
	memset(&res, 0, sizeof(res));
	mr__ctl_complete(&ctl, "ns/job", "a", 1, &res);
	cr_assert_eq(res.status, 409);
	cr_assert_str_eq(res.code, "not_running");
	mr__res_release(&res);
	cr_assert_eq(mr__ctl_job(&ctl, "ns/job")->state, CTL_JOB_FORMING);
	mr__ctl_release(&ctl);
}

/* ---- carried members ---------------------------------------------------------- */

static struct ctl_member *member_of(struct ctl *ctl, const char *id)
{
	return mr_dict_get(&mr__ctl_job(ctl, "ns/job")->members, id);
}

/* The "member" of a 409 (NULL when absent). */
static json_t *member_in(struct ctl_res *res)
{
	cr_assert_eq(res->status, 409, "%d %s", res->status, res->msg);
	cr_assert_str_eq(res->code, "stale_generation");
	return json_object_get(body_json(res), "member");
}

/* m was last heard from ago_ms before now (call oldest first: this also
 * orders the expiry list). */
static void seen(struct ctl *ctl, const char *id, int64_t ago_ms)
{
	int64_t keep = ctl->now_ms;

	ctl->now_ms = mr__ctl_now_ms() - ago_ms;
	mr__ctl_member_touch(ctl, mr__ctl_job(ctl, "ns/job"), member_of(ctl, id));
	ctl->now_ms = keep;
}

static void wait_now(struct ctl *ctl, const char *id, int64_t gen, struct ctl_res *res)
{
	memset(res, 0, sizeof(*res));
	mr__ctl_wait(ctl, "ns/job", id, gen, 0, NULL, res);
}

/* Joins sp->max_nodes members (pods 0.., ids "a".."d") so that the round
 * closes with all of them, and lets each learn its rank; later rounds
 * close as soon as min_nodes wait (last call 0). */
static void run_round(struct ctl *ctl, const struct ctl_spec *sp, int n)
{
	static const char *const ids[] = { "a", "b", "c", "d" };
	struct ctl_spec first = *sp;
	struct ctl_res res;

	cr_assert_eq(n, sp->max_nodes);
	first.last_call_ms = 3600000;
	for (int i = 0; i < n; i++)
		join(ctl, ids[i], i, &first);
	cr_assert_eq(mr__ctl_job(ctl, "ns/job")->state, CTL_JOB_RUNNING);
	mr__ctl_job(ctl, "ns/job")->spec.last_call_ms = 0;
	for (int i = 0; i < n; i++) {
		wait_now(ctl, ids[i], -1, &res);
		cr_assert_eq(res.status, 200);
		cr_assert_eq(json_integer_value(json_object_get(body_json(&res), "node_rank")), i);
		mr__res_release(&res);
	}
}

Test(ctl, a_bump_carries_the_live_members_into_the_next_round)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(3, 4);
	struct ctl_res res;
	struct ctl_job *job;
	json_t *m;

	sp.max_restarts = 5;
	setup(&ctl, &w);
	run_round(&ctl, &sp, 4);
	job = mr__ctl_job(&ctl, "ns/job");
	/* b's watch is parked, naming b; c was last heard from 0.6 of the
	 * heartbeat timeout ago (two missed beats): not live */
	memset(&res, 0, sizeof(res));
	mr__ctl_kv_get_as(&ctl, job, "meshrun/watch", 60000, "b", (void *)7, &res);
	cr_assert(res.suspended);
	member_of(&ctl, "c")->last_seen_ms = ctl.now_ms - 600;
	/* d leaves (a deleted pod): the generation bumps without a restart */
	memset(&res, 0, sizeof(res));
	mr__ctl_leave(&ctl, "ns/job", "d", 1, 0, &res);
	cr_assert_eq(res.status, 200);
	mr__res_release(&res);
	cr_assert_eq(job->generation, 2);
	cr_assert_eq(job->restarts, 0);
	cr_assert_eq(job->state, CTL_JOB_FORMING);
	cr_assert_eq(member_of(&ctl, "a")->state, CTL_M_WAITING, "a is carried");
	cr_assert_eq(member_of(&ctl, "b")->state, CTL_M_WAITING, "b is carried");
	cr_assert_eq(member_of(&ctl, "c")->state, CTL_M_STALE, "c is not live: it must join");
	cr_assert_eq(job->count[CTL_M_WAITING], 2);
	/* the parked watch got 409 saying b waits in generation 2 */
	cr_assert_eq(w.n, 1);
	cr_assert_eq(w.status[0], 409);
	cr_assert_str_eq(w.member[0], "waiting");
	/* a's beat of generation 1: 409, and a is waiting in generation 2 */
	memset(&res, 0, sizeof(res));
	mr__ctl_heartbeat(&ctl, "ns/job", "a", 1, NULL, &res);
	m = member_in(&res);
	cr_assert_not_null(m, "a carried member's 409 says where it stands");
	cr_assert_eq(json_integer_value(json_object_get(m, "generation")), 2);
	cr_assert_str_eq(json_string_value(json_object_get(m, "state")), "waiting");
	cr_assert_eq(json_integer_value(json_object_get(body_json(&res), "restarts")), 0);
	mr__res_release(&res);
	/* c's 409 says nothing of it: c joins */
	memset(&res, 0, sizeof(res));
	mr__ctl_heartbeat(&ctl, "ns/job", "c", 1, NULL, &res);
	cr_assert_null(member_in(&res));
	mr__res_release(&res);
	memset(&res, 0, sizeof(res));
	cr_assert_null(mr__ctl_job_for_member(&ctl, "ns/job", 1, "c", &res));
	cr_assert_null(member_in(&res));
	mr__res_release(&res);
	/* a that joins anyway (an agent that ignores "member") changes nothing */
	join(&ctl, "a", 0, &sp);
	cr_assert_eq(job->generation, 2);
	cr_assert_eq(job->count[CTL_M_WAITING], 2);
	/* c joins: min_nodes (3) waiting, last call 0: the round closes, ranks
	 * in pod order as before */
	join(&ctl, "c", 2, &sp);
	cr_assert_eq(job->state, CTL_JOB_RUNNING);
	cr_assert_eq(job->num_nodes, 3);
	cr_assert_eq(rank_of(&ctl, "a"), 0);
	cr_assert_eq(rank_of(&ctl, "b"), 1);
	cr_assert_eq(rank_of(&ctl, "c"), 2);
	/* a late 409 of a call naming b brings b's whole rank */
	memset(&res, 0, sizeof(res));
	cr_assert_null(mr__ctl_job_for_member(&ctl, "ns/job", 1, "b", &res));
	m = member_in(&res);
	cr_assert_not_null(m);
	cr_assert_str_eq(json_string_value(json_object_get(m, "state")), "running");
	cr_assert_eq(json_integer_value(json_object_get(m, "generation")), 2);
	cr_assert_eq(json_integer_value(json_object_get(m, "node_rank")), 1);
	cr_assert_eq(json_integer_value(json_object_get(m, "world_size")), 3);
	cr_assert_eq(json_integer_value(json_object_get(json_object_get(m, "mesh"), "dp")), 3);
	mr__res_release(&res);
	/* ...which does not count as b having learned it: b's join now is a
	 * retried one (an agent that ignored the 409), not a restart */
	cr_assert_eq(member_of(&ctl, "b")->confirmed, 0);
	memset(&res, 0, sizeof(res));
	mr__ctl_join(&ctl, "ns/job", &(struct ctl_join){ .node_id = "b", .pod_index = 1 }, &res);
	cr_assert_eq(res.status, 200);
	cr_assert_eq(json_integer_value(json_object_get(body_json(&res), "node_rank")), 1);
	mr__res_release(&res);
	cr_assert_eq(job->generation, 2, "no bump for b's join");
	/* a KV call of the round naming a confirms a: its join is a restart */
	memset(&res, 0, sizeof(res));
	cr_assert_not_null(mr__ctl_job_for_member(&ctl, "ns/job", 2, "a", &res));
	cr_assert_eq(member_of(&ctl, "a")->confirmed, 1);
	join(&ctl, "a", 0, &sp);
	cr_assert_eq(job->generation, 3);
	cr_assert_eq(job->restarts, 1);
	mr__ctl_release(&ctl);
}

/* A running round of a, b and c (up to 5 restarts) in which c falls
 * silent for the heartbeat timeout and b was last heard 400 ms ago: the
 * tick declares c dead and carries a and b into generation 2. */
static struct ctl_job *lose_c(struct ctl *ctl, struct woke *w, struct ctl_spec *sp)
{
	sp->max_restarts = 5;
	setup(ctl, w);
	run_round(ctl, sp, 3);
	seen(ctl, "c", 2000);
	seen(ctl, "b", 400);
	seen(ctl, "a", 0);
	ctl->last_scan_ms = 0;
	mr__ctl_tick(ctl);
	return mr__ctl_job(ctl, "ns/job");
}

/* The controller's own link down: a, b and c fall silent together, their
 * last beats within a beat of each other (a quarter timeout). a past the
 * timeout while b and c are only a beat behind: nobody is declared dead;
 * all past it: members_all_silent, still nobody. b heard again (the link
 * back): a and c, whose beats come a little later, are not late either -
 * their silence counts from b's return. Silent a timeout past it while b
 * beats, a is declared dead, and c, carried into the next round and
 * silent too, is dropped from it. */
Test(ctl, members_falling_silent_together_are_not_declared_dead)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(3, 3);
	struct ctl_job *job;

	sp.max_restarts = 5;
	setup(&ctl, &w);
	run_round(&ctl, &sp, 3);
	job = mr__ctl_job(&ctl, "ns/job");
	seen(&ctl, "a", 1100);
	seen(&ctl, "b", 700);
	seen(&ctl, "c", 550);
	ctl.last_scan_ms = 0;
	mr__ctl_tick(&ctl);
	cr_assert_eq(job->generation, 1, "a declared dead while b and c were a beat behind");
	cr_assert_eq(job->all_silent, 0);
	seen(&ctl, "a", 1550);
	seen(&ctl, "b", 1150);
	seen(&ctl, "c", 1000);
	ctl.last_scan_ms = 0;
	mr__ctl_tick(&ctl);
	cr_assert_eq(job->generation, 1);
	cr_assert_eq(job->all_silent, 1);
	seen(&ctl, "b", 0);
	ctl.last_scan_ms = 0;
	mr__ctl_tick(&ctl);
	cr_assert_eq(job->all_silent, 0);
	cr_assert_eq(job->generation, 1, "a or c declared dead as b's beat came back first");
	cr_assert_eq(ctl.stats.dead, 0);
	seen(&ctl, "a", 1100);
	seen(&ctl, "c", 1050);
	seen(&ctl, "b", 0);
	ctl.last_scan_ms = 0;
	mr__ctl_tick(&ctl);
	cr_assert_eq(ctl.stats.dead, 1, "a, silent while b beats, is dead");
	cr_assert_eq(job->generation, 2);
	cr_assert_null(member_of(&ctl, "a"));
	cr_assert_null(member_of(&ctl, "c"));
	cr_assert_not_null(member_of(&ctl, "b"));
	mr__ctl_release(&ctl);
}

Test(ctl, a_carried_member_that_is_gone_is_dropped_or_declared_dead)
{
	struct ctl ctl;
	struct woke w;
	struct ctl_spec sp = spec(3, 3);
	struct ctl_job *job;

	/* c dies; a and b are carried, the round (min 3) forms */
	job = lose_c(&ctl, &w, &sp);
	cr_assert_eq(job->generation, 2);
	cr_assert_eq(job->restarts, 1);
	cr_assert_eq(job->count[CTL_M_WAITING], 2);
	/* b was carried but is gone too: silent for the timeout while the round
	 * forms, it is dropped - no bump */
	seen(&ctl, "b", 2000);
	seen(&ctl, "a", 0);
	ctl.last_scan_ms = 0;
	mr__ctl_tick(&ctl);
	cr_assert_null(member_of(&ctl, "b"));
	cr_assert_eq(job->generation, 2);
	cr_assert_eq(job->count[CTL_M_WAITING], 1);
	mr__ctl_release(&ctl);

	/* min 2: a and b carried, the round closes with both (last call 0) */
	sp = spec(2, 3);
	job = lose_c(&ctl, &w, &sp);
	cr_assert_eq(job->generation, 2);
	ctl.last_scan_ms = 0;
	mr__ctl_tick(&ctl);
	cr_assert_eq(job->state, CTL_JOB_RUNNING, "the carried members close the round");
	cr_assert_eq(job->num_nodes, 2);
	/* b was gone after all: declared dead, the generation bumps again */
	seen(&ctl, "b", 2000);
	seen(&ctl, "a", 0);
	ctl.last_scan_ms = 0;
	mr__ctl_tick(&ctl);
	cr_assert_null(member_of(&ctl, "b"));
	cr_assert_eq(job->generation, 3);
	cr_assert_eq(job->restarts, 2);
	cr_assert_eq(ctl.stats.dead, 2);
	mr__ctl_release(&ctl);
}

Test(ctl, a_bump_that_carried_members_replays_the_same)
{
	char dir[] = "/tmp/mr-ctl-test-XXXXXX";
	struct ctl a, b;
	struct woke w;
	struct ctl_journal_info ji;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct ctl_spec sp = spec(3, 4);
	struct ctl_res res;
	static const char *const ids[] = { "a", "b", "c" };

	cr_assert(mkdtemp(dir));
	sp.max_restarts = 5;
	setup(&a, &w);
	cr_assert_eq(jopen(&a, dir, &ji, &eb), 0, "%s", eb.msg);
	run_round(&a, &sp, 4);
	member_of(&a, "c")->last_seen_ms = a.now_ms - 600; /* not live */
	memset(&res, 0, sizeof(res));
	mr__ctl_leave(&a, "ns/job", "d", 1, 0, &res);
	mr__res_release(&res);
	cr_assert_eq(member_of(&a, "c")->state, CTL_M_STALE);
	cr_assert_null(member_of(&a, "d"));
	cr_assert_eq(mr__jr_commit(a.jr), 0);
	mr__ctl_journal_close(&a);

	reopen(&b, &w, dir);
	cr_assert_eq(mr__ctl_job(&b, "ns/job")->generation, 2);
	cr_assert_eq(mr__ctl_job(&b, "ns/job")->restarts, 0);
	for (size_t i = 0; i < 3; i++)
		cr_assert_eq(member_of(&b, ids[i])->state, member_of(&a, ids[i])->state,
			     "member %s", ids[i]);
	cr_assert_eq(mr__ctl_job(&b, "ns/job")->count[CTL_M_WAITING], 2);
	/* after a controller start nobody was heard from yet: a bump now
	 * carries only those who called since */
	mr__ctl_job(&b, "ns/job")->spec.last_call_ms = 0; /* as run_round left it */
	mr__ctl_touch_all(&b);
	memset(&res, 0, sizeof(res));
	mr__ctl_heartbeat(&b, "ns/job", "a", 2, NULL, &res);
	mr__res_release(&res);
	join(&b, "c", 2, &sp); /* c is back: the round (min 3) closes */
	cr_assert_eq(mr__ctl_job(&b, "ns/job")->state, CTL_JOB_RUNNING);
	mr__ctl_touch_all(&b);
	seen(&b, "b", 0);
	memset(&res, 0, sizeof(res));
	mr__ctl_leave(&b, "ns/job", "c", 2, 0, &res);
	mr__res_release(&res);
	cr_assert_eq(member_of(&b, "b")->state, CTL_M_WAITING, "b called: carried");
	cr_assert_eq(member_of(&b, "a")->state, CTL_M_STALE, "a did not, since the start");
	/* replayed again (from the snapshot the open compacted to, then this) */
	cr_assert_eq(mr__jr_commit(b.jr), 0);
	mr__ctl_journal_close(&b);
	mr__ctl_release(&b);
	reopen(&b, &w, dir);
	cr_assert_eq(member_of(&b, "a")->state, CTL_M_STALE);
	cr_assert_eq(member_of(&b, "b")->state, CTL_M_WAITING);
	cr_assert_eq(mr__ctl_job(&b, "ns/job")->count[CTL_M_WAITING], 1);
	mr__ctl_journal_close(&b);
	mr__ctl_release(&b);
	mr__ctl_release(&a);
	remove_journal_dir(dir);
}
