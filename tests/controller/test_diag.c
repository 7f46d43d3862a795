/*
 * test_diag.c - hang diagnosis and straggler detection in the controller
 * core (core/progress.c, diag/diag.c), fed with heartbeats as agents send them: the
 * culprit of a collective, the end of a chain across groups, a pipeline
 * p2p whose peer never comes, ranks in different collectives, a group
 * where everyone is in and nothing completes, a rank that never reported,
 * the hang timer (reported once, cleared by progress), a straggler flagged
 * and cleared and no other rank flagged, bad reports, and a generation
 * bump that forgets progress.
 *
 * Progress tuples are [kind, id, size, entered, op, peer, completed] with
 * kinds of common/mr_mesh.h (0 world, 1 tp, 3 dp, 4 pp) and ops of
 * runtime/comm/mr_comm.h (1 allreduce, 3 allgather, 6 send, 7 recv).
 *
 * Non-goals: real agents (tests/agent/test_diagnosis.c does that).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "core/ctl.h"
#include "diag/diag.h"

static void setup(struct ctl *ctl)
{
	struct ctl_limits lim = { .max_value = 1024, .max_keys = 100, .max_members = 1000,
				  .max_jobs = 10 };

	lim.defaults.heartbeat_timeout_ms = 60000;
	mr__ctl_init(ctl, &lim);
}

/* A running job "ns/job" of n nodes "n0".."n<n-1>" (pod index = node
 * rank), one rank each, mesh tp x pp (dp derived). */
static struct ctl_job *running(struct ctl *ctl, int n, int tp, int pp, int32_t hang_ms,
			       int32_t strag_pct)
{
	struct ctl_spec sp = { .min_nodes = n, .max_nodes = n, .nproc_per_node = 1, .tp = tp,
			       .pp = pp, .cp = 1, .ep = 1, .heartbeat_timeout_ms = 60000,
			       .max_restarts = 3, .hang_timeout_ms = hang_ms,
			       .straggler_pct = strag_pct };
	struct ctl_job *job;

	setup(ctl);
	for (int i = 0; i < n; i++) {
		char id[8];
		struct ctl_join j = { .node_id = id, .pod_index = i, .spec = &sp, .host = "h" };
		struct ctl_res res;

		snprintf(id, sizeof(id), "n%d", i);
		memset(&res, 0, sizeof(res));
		mr__ctl_join(ctl, "ns/job", &j, &res);
		cr_assert_eq(res.status, 200, "join: %s", res.msg);
		mr__res_release(&res);
	}
	job = mr__ctl_job(ctl, "ns/job");
	cr_assert_eq(job->state, CTL_JOB_RUNNING);
	return job;
}

/* Heartbeat of node n<node> with progress text; returns the status. */
static int beat_status(struct ctl *ctl, int node, const char *progress, char *msg, size_t cap)
{
	json_error_t je;
	json_t *p = json_loads(progress, 0, &je);
	struct ctl_res res;
	char id[8];
	int st;

	cr_assert(p, "bad test json: %s", je.text);
	snprintf(id, sizeof(id), "n%d", node);
	memset(&res, 0, sizeof(res));
	if (mr__ctl_progress_check(p, 1024, &res) == 0)
		mr__ctl_heartbeat(ctl, "ns/job", id, -1, p, &res);
	st = res.status;
	if (msg)
		snprintf(msg, cap, "%s: %s", res.field ? res.field : "", res.msg);
	mr__res_release(&res);
	json_decref(p);
	return st;
}

static void beat(struct ctl *ctl, int node, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void beat(struct ctl *ctl, int node, const char *fmt, ...)
{
	char text[1024], msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	cr_assert_eq(beat_status(ctl, node, text, msg, sizeof(msg)), 200, "beat n%d: %s", node,
		     msg);
}

static json_t *diagnose(struct ctl *ctl)
{
	char msg[1024];
	json_t *d = mr__ctl_diagnose(ctl, mr__ctl_job(ctl, "ns/job"), msg, sizeof(msg));

	cr_assert(d);
	cr_assert_str_eq(json_string_value(json_object_get(d, "message")), msg);
	return d;
}

static const char *str(const json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));

	return s ? s : "";
}

static long long num(const json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

static const json_t *culprit(const json_t *d, size_t i)
{
	return json_array_get(json_object_get(d, "culprits"), i);
}

static size_t nculprits(const json_t *d)
{
	return json_array_size(json_object_get(d, "culprits"));
}

Test(diag, the_rank_that_has_not_entered_the_collective)
{
	struct ctl ctl;
	json_t *d;
	const json_t *c;

	running(&ctl, 4, 1, 1, 0, 0);
	for (int r = 0; r < 4; r++) /* rank 2 finished #9 and never entered #10 */
		beat(&ctl, r, "[{\"rank\":%d,\"step\":7,\"micro\":0,\"g\":[[3,0,4,%d,1,-1,9]]}]", r,
		     r == 2 ? 9 : 10);
	d = diagnose(&ctl);
	cr_assert_str_eq(str(d, "verdict"), "progressing"); /* no hang timeout */
	cr_assert_eq(nculprits(d), 1, "%s", str(d, "message"));
	c = culprit(d, 0);
	cr_assert_eq(num(c, "rank"), 2);
	cr_assert_str_eq(str(c, "node"), "n2");
	cr_assert_str_eq(str(c, "reason"), "not_entered");
	cr_assert_str_eq(str(c, "group"), "dp");
	cr_assert_str_eq(str(c, "op"), "allreduce");
	cr_assert_eq(num(c, "seq"), 10);
	cr_assert_eq(num(c, "waiting"), 3);
	cr_assert(strstr(str(d, "message"),
			 "rank 2 (node n2, tp 0 cp 0 dp 2 pp 0) has not entered allreduce #10 on "
			 "group dp; 3 other ranks are waiting in it since"),
		  "%s", str(d, "message"));
	cr_assert(strstr(str(d, "message"), "outside communication"), "%s", str(d, "message"));
	/* a snapshot of a job that moves, not a hang verdict */
	cr_assert(!strncmp(str(d, "message"), "not stuck: the last progress was ", 33), "%s",
		  str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

/* tp=2 x dp=2: rank 3 computes; rank 2 waits for it in tp, ranks 0 and 1
 * wait in dp for ranks 2 and 3. Rank 2 is a link of the chain, not a
 * culprit. */
Test(diag, the_end_of_a_chain_across_groups)
{
	struct ctl ctl;
	json_t *d;
	const json_t *c;
	static const char *const g[4] = {
		"[1,0,2,5,1,-1,5],[3,0,2,7,1,-1,6],[0,0,4,2,1,-1,2]",
		"[1,0,2,5,1,-1,5],[3,1,2,7,1,-1,6],[0,0,4,2,1,-1,2]",
		"[1,1,2,5,1,-1,4],[3,0,2,6,1,-1,6],[0,0,4,2,1,-1,2]",
		"[1,1,2,4,1,-1,4],[3,1,2,6,1,-1,6],[0,0,4,2,1,-1,2]",
	};

	running(&ctl, 4, 2, 1, 0, 0);
	for (int r = 0; r < 4; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":3,\"micro\":1,\"g\":[%s]}]", r, g[r]);
	d = diagnose(&ctl);
	cr_assert_eq(nculprits(d), 1, "%s", str(d, "message"));
	c = culprit(d, 0);
	cr_assert_eq(num(c, "rank"), 3);
	cr_assert_eq(num(c, "waiting"), 2); /* rank 2 in tp, rank 1 in dp */
	cr_assert(json_is_false(json_object_get(c, "in_communication")));
	cr_assert(!strcmp(str(c, "group"), "tp[dp=1]") || !strcmp(str(c, "group"), "dp[tp=1]"),
		  "%s", str(c, "group"));
	cr_assert_eq(num(json_object_get(c, "coords"), "dp"), 1);
	cr_assert_eq(num(json_object_get(c, "coords"), "tp"), 1);
	json_decref(d);
	mr__ctl_release(&ctl);
}

/* pp=4: stage 3 waits for stage 2's send, stage 2 for stage 1's; stage 1
 * is computing. */
Test(diag, a_pipeline_p2p_whose_peer_never_sends)
{
	struct ctl ctl;
	json_t *d;
	const json_t *c;
	static const char *const g[4] = {
		"[4,0,4,3,6,1,3]", /* its sends done */
		"[4,0,4,3,7,0,3]", /* received, computing */
		"[4,0,4,2,7,1,1]", /* in recv #2 from stage 1 */
		"[4,0,4,1,7,2,0]", /* in recv #1 from stage 2 */
	};

	running(&ctl, 4, 1, 4, 0, 0);
	for (int r = 0; r < 4; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":0,\"micro\":2,\"g\":[%s]}]", r, g[r]);
	d = diagnose(&ctl);
	cr_assert_eq(nculprits(d), 1, "%s", str(d, "message"));
	c = culprit(d, 0);
	cr_assert_eq(num(c, "rank"), 1);
	cr_assert_str_eq(str(c, "reason"), "p2p_peer");
	cr_assert_str_eq(str(c, "group"), "pp");
	cr_assert_str_eq(str(c, "op"), "recv");
	cr_assert(strstr(str(d, "message"),
			 "rank 1 (node n1, tp 0 cp 0 dp 0 pp 1) has not entered the send that rank 2 "
			 "(node n2, tp 0 cp 0 dp 0 pp 2) waits for in recv #2 on group pp since"),
		  "%s", str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

Test(diag, p2p_ranks_stuck_with_each_other)
{
	struct ctl ctl;
	json_t *d;

	running(&ctl, 2, 1, 2, 0, 0);
	beat(&ctl, 0, "[{\"rank\":0,\"step\":0,\"g\":[[4,0,2,1,6,1,0]]}]");
	beat(&ctl, 1, "[{\"rank\":1,\"step\":0,\"g\":[[4,0,2,1,6,0,0]]}]");
	d = diagnose(&ctl);
	cr_assert_eq(nculprits(d), 0, "%s", str(d, "message"));
	cr_assert_str_eq(str(json_array_get(json_object_get(d, "groups"), 0), "type"), "p2p_both");
	cr_assert(strstr(str(d, "message"), "wait for each other on group pp"), "%s",
		  str(d, "message"));
	/* no hang timeout: the job progresses, the waits are a snapshot of a
	 * healthy pipeline and no cause is named */
	cr_assert_str_eq(str(d, "verdict"), "progressing");
	cr_assert_null(strstr(str(d, "message"), "neither completes"), "%s", str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

/* The same waits past the hang timeout: now the cause is named. */
Test(diag, p2p_ranks_hung_with_each_other_name_the_cause)
{
	struct ctl ctl;
	json_t *d;

	running(&ctl, 2, 1, 2, 1000, 0);
	beat(&ctl, 0, "[{\"rank\":0,\"step\":0,\"g\":[[4,0,2,1,6,1,0]]}]");
	beat(&ctl, 1, "[{\"rank\":1,\"step\":0,\"g\":[[4,0,2,1,6,0,0]]}]");
	mr__ctl_tick(&ctl);
	ctl.skew_ms = 1500; /* no progress for 1.5 s > hang_timeout 1 s */
	mr__ctl_tick(&ctl);
	d = diagnose(&ctl);
	cr_assert_str_eq(str(d, "verdict"), "stuck");
	cr_assert(strstr(str(d, "message"), "and neither completes: both send or both receive"),
		  "%s", str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

Test(diag, ranks_in_different_collectives)
{
	struct ctl ctl;
	json_t *d;
	const json_t *c;

	running(&ctl, 4, 1, 1, 0, 0);
	for (int r = 0; r < 4; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":1,\"g\":[[3,0,4,12,%d,-1,11]]}]", r,
		     r == 1 ? 3 : 1);
	d = diagnose(&ctl);
	cr_assert_eq(nculprits(d), 1, "%s", str(d, "message"));
	c = culprit(d, 0);
	cr_assert_eq(num(c, "rank"), 1);
	cr_assert_str_eq(str(c, "reason"), "mismatch");
	cr_assert(strstr(str(d, "message"), "is in allgather #12 on group dp while 3 other ranks "
					    "are in allreduce #12"),
		  "%s", str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

Test(diag, everyone_in_and_nothing_completes)
{
	struct ctl ctl;
	json_t *d;

	running(&ctl, 4, 1, 1, 0, 0);
	for (int r = 0; r < 4; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":1,\"g\":[[3,0,4,12,1,-1,11]]}]", r);
	d = diagnose(&ctl);
	cr_assert_eq(nculprits(d), 0);
	cr_assert(strstr(str(d, "message"), "all 4 ranks of group dp are in allreduce #12"), "%s",
		  str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

Test(diag, a_rank_that_never_reported)
{
	struct ctl ctl;
	json_t *d;
	const json_t *c;

	running(&ctl, 4, 1, 1, 0, 0);
	for (int r = 0; r < 3; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":1,\"g\":[[3,0,4,3,1,-1,2]]}]", r);
	d = diagnose(&ctl);
	cr_assert_eq(num(d, "ranks_not_reporting"), 1);
	cr_assert_eq(nculprits(d), 1, "%s", str(d, "message"));
	c = culprit(d, 0);
	cr_assert_eq(num(c, "rank"), 3);
	cr_assert_str_eq(str(c, "reason"), "no_report");
	cr_assert(strstr(str(d, "message"), "it reports no progress"), "%s", str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

/* Rank 1 still has allreduce #9 unfinished (asynchronous, or its report
 * is older than it), but everyone entered #9: it waits for nobody, and the
 * others wait for it in #10. */
Test(diag, an_unfinished_operation_nobody_holds_up_is_not_a_wait)
{
	struct ctl ctl;
	json_t *d;
	const json_t *c;

	running(&ctl, 3, 1, 1, 0, 0);
	for (int r = 0; r < 3; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":7,\"g\":[[3,0,3,%d,1,-1,%d]]}]", r,
		     r == 1 ? 9 : 10, r == 1 ? 8 : 9);
	d = diagnose(&ctl);
	cr_assert_eq(nculprits(d), 1, "%s", str(d, "message"));
	c = culprit(d, 0);
	cr_assert_eq(num(c, "rank"), 1);
	cr_assert(json_is_false(json_object_get(c, "in_communication")));
	cr_assert(strstr(str(d, "message"), "waiting for no other rank"), "%s", str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

/* Everyone is in #10, but node n1 stopped beating half a heartbeat
 * timeout ago: its report is older than it, and it holds the group up. */
Test(diag, a_silent_node_holds_up_a_group_that_is_all_in)
{
	struct ctl ctl;
	struct ctl_job *job = running(&ctl, 3, 1, 1, 0, 0);
	struct ctl_member *m;
	json_t *d;
	const json_t *c;

	for (int r = 0; r < 3; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":7,\"g\":[[3,0,3,10,1,-1,9]]}]", r);
	d = diagnose(&ctl);
	cr_assert_eq(nculprits(d), 0, "%s", str(d, "message"));
	json_decref(d);
	m = mr_dict_get(&job->members, "n1");
	m->last_seen_ms -= 40000; /* heartbeat timeout 60 s: silent past 30 s */
	d = diagnose(&ctl);
	cr_assert_eq(nculprits(d), 1, "%s", str(d, "message"));
	c = culprit(d, 0);
	cr_assert_eq(num(c, "rank"), 1);
	cr_assert_str_eq(str(c, "reason"), "silent");
	cr_assert(json_number_value(json_object_get(c, "node_silent_s")) >= 40.0);
	cr_assert(strstr(str(d, "message"), "is in allreduce #10 on group dp with 2 other ranks"),
		  "%s", str(d, "message"));
	cr_assert(strstr(str(d, "message"), "node n1 silent for 40 s"), "%s", str(d, "message"));
	json_decref(d);
	mr__ctl_release(&ctl);
}

Test(diag, the_hang_is_reported_once_and_cleared_by_progress)
{
	struct ctl ctl;
	struct ctl_job *job = running(&ctl, 2, 1, 1, 1000, 0);
	json_t *h, *d;

	for (int r = 0; r < 2; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":4,\"g\":[[3,0,2,%d,1,-1,5]]}]", r,
		     r ? 5 : 6);
	mr__ctl_tick(&ctl);
	cr_assert_eq(job->diag->stuck_ms, 0);
	ctl.skew_ms = 1500; /* no progress for 1.5 s > hang_timeout 1 s */
	mr__ctl_tick(&ctl);
	cr_assert_neq(job->diag->stuck_ms, 0);
	cr_assert_eq(ctl.stats.hangs, 1);
	cr_assert_eq(job->diag->stuck_rank, 1);
	cr_assert_str_eq(job->diag->stuck_group, "dp");
	h = mr__ctl_health_json(&ctl, job);
	cr_assert(json_is_true(json_object_get(h, "stuck")));
	cr_assert_eq(num(h, "stuck_rank"), 1);
	json_decref(h);
	d = diagnose(&ctl);
	cr_assert_str_eq(str(d, "verdict"), "stuck");
	json_decref(d);
	ctl.skew_ms = 3000;
	mr__ctl_tick(&ctl);
	cr_assert_eq(ctl.stats.hangs, 1, "reported once per hang");
	/* the same report again is no progress; a new one is */
	beat(&ctl, 1, "[{\"rank\":1,\"step\":4,\"g\":[[3,0,2,5,1,-1,5]]}]");
	cr_assert_neq(job->diag->stuck_ms, 0);
	beat(&ctl, 1, "[{\"rank\":1,\"step\":4,\"g\":[[3,0,2,6,1,-1,5]]}]");
	cr_assert_eq(job->diag->stuck_ms, 0);
	cr_assert_eq(job->diag->stuck_rank, -1);
	mr__ctl_release(&ctl);
}

/* Four ranks, one three times slower: flagged after three reports in a
 * row, nobody else; cleared after three reports at the median. */
Test(diag, a_straggler_is_flagged_and_cleared_and_nobody_else)
{
	struct ctl ctl;
	struct ctl_job *job = running(&ctl, 4, 1, 1, 0, 150);
	int step = 0;

	for (int round = 0; round < 6; round++, step++) {
		for (int r = 0; r < 4; r++)
			beat(&ctl, r, "[{\"rank\":%d,\"step\":%d,\"busy_ms\":%d,\"step_ms\":310}]", r,
			     step, r == 3 ? 300 : 100 + r);
		ctl.skew_ms += 300;
		mr__ctl_tick(&ctl);
		cr_assert_eq(job->diag->nstragglers, round >= 2 ? 1 : 0, "round %d", round);
	}
	cr_assert_eq(job->diag->nlisted, 1);
	cr_assert_eq(job->diag->strag[0].rank, 3);
	cr_assert_str_eq(job->diag->strag[0].m->node_id, "n3");
	cr_assert(job->diag->median_ms > 95 && job->diag->median_ms < 106, "median %f",
		  (double)job->diag->median_ms);
	for (int round = 0; round < 3; round++, step++)
		for (int r = 0; r < 4; r++)
			beat(&ctl, r, "[{\"rank\":%d,\"step\":%d,\"busy_ms\":100}]", r, step);
	cr_assert_eq(job->diag->nstragglers, 0);
	cr_assert_eq(job->diag->nlisted, 0);
	cr_assert_eq(ctl.stats.stragglers, 1);
	mr__ctl_release(&ctl);
}

Test(diag, bad_reports_name_the_element)
{
	struct ctl ctl;
	char msg[512];

	running(&ctl, 2, 1, 1, 0, 0);
	cr_assert_eq(beat_status(&ctl, 0, "{}", msg, sizeof(msg)), 400);
	cr_assert(strstr(msg, "progress:"), "%s", msg);
	cr_assert_eq(beat_status(&ctl, 0, "[{\"rank\":0}]", msg, sizeof(msg)), 400);
	cr_assert(strstr(msg, "progress[0].step"), "%s", msg);
	cr_assert_eq(beat_status(&ctl, 0, "[{\"rank\":0,\"step\":1,\"x\":1}]", msg, sizeof(msg)),
		     400);
	cr_assert_eq(beat_status(&ctl, 0, "[{\"rank\":0,\"step\":1,\"g\":[[3,0,2,1,1,-1]]}]", msg,
				 sizeof(msg)), 400);
	cr_assert(strstr(msg, "progress[0].g[0]"), "%s", msg);
	cr_assert_eq(beat_status(&ctl, 0, "[{\"rank\":0,\"step\":1,\"g\":[[3,0,2,1,1,-1,2]]}]",
				 msg, sizeof(msg)), 400);
	cr_assert(strstr(msg, "'completed' is above 'entered'"), "%s", msg);
	cr_assert_eq(beat_status(&ctl, 0, "[{\"rank\":0,\"step\":1,\"g\":[[3,0,2,1,6,2,1]]}]",
				 msg, sizeof(msg)), 400);
	cr_assert_eq(beat_status(&ctl, 0, "[{\"rank\":1,\"step\":1}]", msg, sizeof(msg)), 400);
	cr_assert(strstr(msg, "progress[0].rank: rank 1 is not one of node 'n0''s ranks 0..0"),
		  "%s", msg);
	cr_assert_eq(beat_status(&ctl, 0, "[{\"rank\":0,\"step\":1},{\"rank\":0,\"step\":1}]", msg,
				 sizeof(msg)), 400);
	cr_assert_eq(beat_status(&ctl, 0, "[{\"rank\":0,\"step\":1,\"micro\":-1,\"busy_ms\":2.5}]",
				 msg, sizeof(msg)), 200, "%s", msg);
	mr__ctl_release(&ctl);
}

Test(diag, a_new_generation_forgets_progress)
{
	struct ctl ctl;
	struct ctl_job *job = running(&ctl, 2, 1, 1, 1000, 150);
	struct ctl_res res;
	json_t *d;

	for (int r = 0; r < 2; r++)
		beat(&ctl, r, "[{\"rank\":%d,\"step\":4,\"busy_ms\":5,\"g\":[[3,0,2,3,1,-1,3]]}]", r);
	cr_assert_eq(job->diag->ranks, 2);
	memset(&res, 0, sizeof(res));
	mr__ctl_leave(&ctl, "ns/job", "n1", -1, 1, &res);
	mr__res_release(&res);
	cr_assert_eq(job->state, CTL_JOB_FORMING);
	cr_assert_eq(job->diag->ranks, 0);
	cr_assert_eq(job->diag->hist_n, 0);
	cr_assert_eq(job->diag->progress_ms, 0);
	d = diagnose(&ctl);
	cr_assert_str_eq(str(d, "verdict"), "not_running");
	json_decref(d);
	mr__ctl_release(&ctl);
}
