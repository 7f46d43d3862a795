/*
 * test_bench_rdzv.c - `make bench-rdzv`'s program (bench/rdzv.c) runs at a
 * small size against the controller of the same build and every reply it
 * checks is right: the rendezvous scenario (200 agents), and the recovery
 * scenario with 200 members, one of them declared dead by its heartbeat
 * timeout or leaving, until every survivor holds its rank in the new
 * generation (distinct, in pod order without the victim, world 199): the
 * survivors carried into the new round (each 409 names it waiting, or
 * running with its rank), on shared connections too, and survivors that
 * join again regardless (--rejoin). The
 * bench exits non-zero on any wrong reply, so a controller that answers
 * wrongly fails here. How fast it is is the benchmark's business, not this
 * test's: only correctness is asserted.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "proc.h"

/* Runs bench/rdzv with args against this build's controller; its output
 * (stdout + stderr) into out. The exit status, or -1. */
static int run_bench(const char *args, char *out, size_t cap)
{
	char cmd[2048];
	FILE *p;
	size_t n;
	int st;

	snprintf(cmd, sizeof(cmd),
		 "timeout 300 '%s/bench/rdzv' --controller-bin '%s/meshrun-controller' %s 2>&1",
		 mr_proc_build_dir(), mr_proc_build_dir(), args);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	n = fread(out, 1, cap - 1, p);
	out[n] = '\0';
	st = pclose(p);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* 1 if the last line of out starts with prefix. */
static int last_line_is(const char *out, const char *prefix)
{
	size_t n = strlen(out);
	const char *l;

	while (n && out[n - 1] == '\n')
		n--;
	for (l = out + n; l > out && l[-1] != '\n'; l--)
		;
	return strncmp(l, prefix, strlen(prefix)) == 0;
}

Test(bench_rdzv, rendezvous_of_200_agents, .timeout = 300)
{
	static char out[16384];

	cr_assert_eq(run_bench("--n 200", out, sizeof(out)), 0, "%s", out);
	cr_expect(last_line_is(out, "rdzv N=200 seconds="), "%s", out);
	cr_expect(strstr(out, "latency_ms type=kv_get count=200 ") != NULL, "%s", out);
}

Test(bench_rdzv, recovery_after_a_heartbeat_timeout, .timeout = 300)
{
	static char out[16384];

	cr_assert_eq(run_bench("--n 200 --recover timeout --heartbeat-timeout 4000", out,
			       sizeof(out)),
		     0, "%s", out);
	cr_expect(last_line_is(out, "rdzv_recover N=200 seconds="), "%s", out);
	cr_expect(strstr(out, "recover=timeout victim_pod=100 ") != NULL, "%s", out);
	cr_expect(strstr(out, "latency_ms type=rewait count=199 ") != NULL, "%s", out);
}

Test(bench_rdzv, recovery_after_the_first_pod_leaves, .timeout = 300)
{
	static char out[16384];

	cr_assert_eq(run_bench("--n 200 --recover leave --victim 0", out, sizeof(out)), 0, "%s",
		     out);
	cr_expect(last_line_is(out, "rdzv_recover N=200 seconds="), "%s", out);
	cr_expect(strstr(out, "recover=leave victim_pod=0 ") != NULL, "%s", out);
	cr_expect(strstr(out, "latency_ms type=leave count=1 ") != NULL, "%s", out);
}

Test(bench_rdzv, recovery_on_shared_connections_and_with_rejoins, .timeout = 300)
{
	static char out[16384];

	/* 5 agents a connection: the later ones' 409s come after the close and
	 * bring their ranks */
	cr_assert_eq(run_bench("--n 200 --conns 40 --recover timeout --heartbeat-timeout 4000",
			       out, sizeof(out)),
		     0, "%s", out);
	cr_expect(last_line_is(out, "rdzv_recover N=200 seconds="), "%s", out);
	cr_expect(strstr(out, "recover_carried waiting=") != NULL, "%s", out);
	/* agents that ignore "member" and join again get the same ranks */
	cr_assert_eq(run_bench("--n 200 --conns 40 --recover leave --rejoin", out, sizeof(out)), 0,
		     "%s", out);
	cr_expect(last_line_is(out, "rdzv_recover N=200 seconds="), "%s", out);
	cr_expect(strstr(out, "survivors=rejoin") != NULL, "%s", out);
	cr_expect(strstr(out, "latency_ms type=rejoin count=199 ") != NULL, "%s", out);
}

Test(bench_rdzv, bad_recovery_arguments_are_refused, .timeout = 60)
{
	static char out[4096];

	cr_expect_eq(run_bench("--n 200 --recover sometimes", out, sizeof(out)), 2, "%s", out);
	cr_expect_eq(run_bench("--n 200 --recover leave --victim 200", out, sizeof(out)), 2,
		     "%s", out);
}
