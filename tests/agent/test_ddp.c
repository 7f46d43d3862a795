/*
 * test_ddp.c - the PyTorch exec test: Debian's python3-torch running a
 * gloo DDP script (ddp_gloo.py) under 2 agents x 2 processes on loopback.
 * Checks the all-reduced values, that the loss falls on every rank, and
 * that a worker killed with SIGKILL restarts the whole job at a new
 * generation which then finishes; and that a worker killed on every run
 * exhausts max_restarts and fails the job with a clear reason. Skipped
 * when /usr/bin/python3 has no torch.
 */
#include "harness.h"
#include "proc.h"

#include <limits.h>

static const char *script(void)
{
	return mr_test_repo_file("tests/agent/ddp_gloo.py");
}

static int have_torch(void)
{
	return system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

/* loss of rank at step from the log, or -1. */
static double loss_at(const char *log, int rank, int step)
{
	char *s = h_read(log), needle[64], *p;
	double v = -1;

	snprintf(needle, sizeof(needle), "LOSS rank=%d step=%d loss=", rank, step);
	p = s;
	/* the last occurrence: after a restart, the final run */
	for (char *q; (q = strstr(p, needle)); p = q + 1)
		v = atof(q + strlen(needle));
	free(s);
	return v;
}

static void run_job(const char *name, char *const *env, int want_restart)
{
	struct h_ctl c = {0};
	char la[300], lb[300], n[64], job[64];
	char *extra[] = {"--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "2",
			 "--grace-period", "2s", NULL};
	char *cmd[] = {"/usr/bin/python3", (char *)script(), NULL};
	const char *logs[2] = {la, lb};
	pid_t a, b;
	int ca, cb, ok, reduced[4], done[4];
	double l0[4], l7[4];

	snprintf(n, sizeof(n), "%s-a.log", name);
	h_path(la, sizeof(la), n);
	snprintf(n, sizeof(n), "%s-b.log", name);
	h_path(lb, sizeof(lb), n);
	snprintf(job, sizeof(job), "t/%s", name);
	h_ctl_start(&c, 0);
	a = h_agent(&c, job, 0, extra, cmd, env, la);
	b = h_agent(&c, job, 1, extra, cmd, env, lb);
	ca = h_wait(a, 120000);
	cb = h_wait(b, 120000);
	h_kill(a);
	h_kill(b);
	ok = ca == 0 && cb == 0;
	for (int r = 0; r < 4; r++) {
		const char *log = logs[r / 2];
		char needle[96];

		l0[r] = loss_at(log, r, 0);
		l7[r] = loss_at(log, r, 7);
		snprintf(needle, sizeof(needle), "[rank %d] ALLREDUCE rank=%d value=10 expected=10",
			 r, r);
		reduced[r] = h_count(log, needle);
		snprintf(needle, sizeof(needle), "[rank %d] DONE rank=%d restart=%d", r, r,
			 want_restart);
		done[r] = h_count(log, needle);
		ok = ok && reduced[r] == want_restart + 1 && done[r] == 1 && l0[r] > 0 &&
		     l7[r] < l0[r] * 0.8;
	}
	/* whatever went wrong, both agents' whole story */
	if (!ok) {
		h_dump(c.log);
		h_dump(la);
		h_dump(lb);
	}
	h_kill(c.pid);
	cr_assert_eq(ca, 0);
	cr_assert_eq(cb, 0);
	for (int r = 0; r < 4; r++) {
		/* every generation all-reduced correctly */
		cr_expect_eq(reduced[r], want_restart + 1, "rank %d all-reduced in %d generations, "
			     "not %d", r, reduced[r], want_restart + 1);
		cr_expect_eq(done[r], 1, "rank %d did not finish run %d", r, want_restart);
		cr_expect_gt(l0[r], 0);
		cr_expect_lt(l7[r], l0[r] * 0.8, "rank %d loss %g -> %g does not fall", r, l0[r],
			     l7[r]);
	}
}

/*
 * One run covers both: the first generation all-reduces and trains until
 * rank 3 kills itself with SIGKILL at step 2; every node restarts at a new
 * generation, which all-reduces, trains to the end (loss falling) and
 * finishes. (Each run costs ~10 s of torch start-up on 2 cores, so both
 * tests stay out of the sanitizer pass: torch does the work here, and the
 * agent's exec paths run under ASan in test_exec and test_lifecycle.)
 */
Test(ddp, gloo_two_agents_two_procs_survive_sigkill, MR_NOT_UNDER_SAN)
{
	char *env[] = {"MESHRUN_TEST_CRASH_RANK=3", "MESHRUN_TEST_CRASH_RESTART=0", NULL};

	if (!have_torch())
		cr_skip_test("/usr/bin/python3 has no torch");
	run_job("ddp-crash", env, 1);
}

/* Rank 3 dies on every run: with --max-restarts 1 the first death restarts
 * the job, the second fails it; both agents exit non-zero and the log says
 * why (restarts exhausted, naming the rank and its exit). */
Test(ddp, gloo_worker_dying_every_run_exhausts_restarts, MR_NOT_UNDER_SAN)
{
	char *env[] = {"MESHRUN_TEST_CRASH_RANK=3", "MESHRUN_TEST_CRASH_RESTART=-1", NULL};
	char *extra[] = {"--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "1",
			 "--grace-period", "2s", NULL};
	char *cmd[] = {"/usr/bin/python3", (char *)script(), NULL};
	struct h_ctl c = {0};
	char la[300], lb[300];
	pid_t a, b;
	int ca, cb;

	if (!have_torch())
		cr_skip_test("/usr/bin/python3 has no torch");
	h_path(la, sizeof(la), "ddp-exhaust-a.log");
	h_path(lb, sizeof(lb), "ddp-exhaust-b.log");
	h_ctl_start(&c, 0);
	a = h_agent(&c, "t/ddp-exhaust", 0, extra, cmd, env, la);
	b = h_agent(&c, "t/ddp-exhaust", 1, extra, cmd, env, lb);
	ca = h_wait(a, 120000);
	cb = h_wait(b, 120000);
	h_kill(a);
	h_kill(b);
	h_kill(c.pid);
	cr_assert_gt(ca, 0, "agent a exit %d", ca);
	cr_assert_gt(cb, 0, "agent b exit %d", cb);
	/* node 1 holds rank 3: it saw the deaths and names them; node 0
	 * learns the job failed from the controller, with its reason */
	cr_expect_geq(h_count(lb, "reason=\"restarts exhausted (max_restarts 1); last: rank 3 "
				  "exited with code 137\""), 1,
		      "no clear reason in the log of the failing node");
	cr_expect_geq(h_count(la, "reason=\"job failed (controller): max_restarts (1) exceeded"),
		      1, "node 0 does not say why the job failed");
	/* the first death restarted the job once: both runs all-reduced */
	cr_expect_eq(h_count(la, "[rank 0] ALLREDUCE rank=0 value=10 expected=10"), 2);
	cr_expect_eq(h_count(la, "DONE rank=0"), 0, "the job must not finish");
}
