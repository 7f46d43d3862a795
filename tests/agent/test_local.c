/*
 * test_local.c - `meshrun local` end to end: an embedded controller and N
 * agents on loopback, merged prefixed output, the job's exit status, and
 * config errors stopping it with exit 2 before anything starts.
 */
#include "harness.h"

static int run_local(char *const *args, char **out)
{
	char log[300], *argv[H_MAX_ARGS];
	static int seq;
	int n = 0, code;
	pid_t pid;

	snprintf(log, sizeof(log), "%s/local-%d.log", h_tmpdir(), seq++);
	argv[n++] = "meshrun";
	argv[n++] = "local";
	for (int i = 0; args[i]; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	pid = h_spawn(argv, NULL, log);
	code = h_wait(pid, 60000);
	if (code < 0)
		h_kill(pid);
	*out = h_read(log);
	return code;
}

Test(local, demo_job_two_nodes)
{
	char *args[] = {"--demo", "--nodes", "2", "--nproc-per-node", "2", "--tp", "2", NULL};
	char *out = NULL;
	int code = run_local(args, &out);

	cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "[node 0] [rank 0] hello from rank 0 of 4"), "%s", out);
	cr_expect(strstr(out, "[node 1] [rank 3] hello from rank 3 of 4 (node 1, local rank 1; "
			      "tp=1 cp=0 dp=1 pp=0"),
		  "%s", out);
	cr_expect(strstr(out, "succeeded"), "%s", out);
	free(out);
}

Test(local, default_inprocess_runtime_trains)
{
	char *args[] = {"--nodes", "2", "--workload-config",
			"{\"steps\": 6, \"d_model\": 32, \"n_layer\": 1, \"seq_len\": 16, "
			"\"batch_size\": 4, \"threads\": 1, \"peak_flops\": 1e9}",
			NULL};
	char *out = NULL;
	int code = run_local(args, &out);

	cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "event=worker_done rank=0 step=6/6 loss="), "%s", out);
	cr_expect(strstr(out, "event=worker_done rank=1 step=6/6 loss="), "%s", out);
	cr_expect(strstr(out, "succeeded"), "%s", out);
	free(out);
}

/* On a terminal (script(1) provides a pseudo-terminal) the progress lines
 * are folded into one status line redrawn in place; other lines pass. */
Test(local, terminal_shows_one_redrawn_progress_line)
{
	char cmd[2048], log[300], *out;
	char *argv[] = {"/usr/bin/script", "-qfec", cmd, "/dev/null", NULL};
	pid_t pid;
	int code;

	if (access("/usr/bin/script", X_OK))
		cr_skip_test("script(1) is not installed");
	snprintf(cmd, sizeof(cmd),
		 "%s/meshrun local --nodes 2 --health-port 0 --workload-config "
		 "'{\"steps\": 4000, \"d_model\": 32, \"n_layer\": 1, \"seq_len\": 16, "
		 "\"batch_size\": 4, \"threads\": 1, \"peak_flops\": 1e9}'",
		 h_build());
	snprintf(log, sizeof(log), "%s/tty.log", h_tmpdir());
	pid = h_spawn(argv, NULL, log);
	code = h_wait(pid, 60000);
	if (code < 0)
		h_kill(pid);
	out = h_read(log);
	cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "\r\033[Knode 0: step="), "no redrawn status line:\n%s", out);
	cr_expect(!strstr(out, "event=progress"), "progress lines were not folded:\n%s", out);
	cr_expect(strstr(out, "event=worker_done rank=1 step=4000/4000"), "%s", out);
	cr_expect(strstr(out, "succeeded"), "%s", out);
	free(out);
}

Test(local, user_command_failure_is_the_exit_status)
{
	char *args[] = {"--nodes", "1", "--max-restarts", "1", "--", "sh", "-c",
			"echo attempt $TORCHELASTIC_RESTART_COUNT; exit 3", NULL};
	char *out = NULL;
	int code = run_local(args, &out);

	cr_assert_eq(code, 1, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "[node 0] [rank 0] attempt 1"), "%s", out);
	cr_expect(strstr(out, "restarts exhausted"), "%s", out);
	free(out);
}

Test(local, bad_mesh_exits_2_before_starting)
{
	char *args[] = {"--nodes", "3", "--tp", "2", NULL};
	char *out = NULL;

	cr_assert_eq(run_local(args, &out), 2, "%s", out);
	cr_expect(strstr(out, "divisible"), "%s", out);
	cr_expect_null(strstr(out, "controller on"), "%s", out);
	free(out);
}

Test(local, permanent_failure_of_one_node_stops_the_job)
{
	/* node 1's rank exits 127 (permanent): node 0 must not wait forever */
	char *args[] = {"--nodes", "2", "--join-timeout", "60s", "--", "sh", "-c",
			"if [ $RANK = 1 ]; then exit 127; fi; sleep 30", NULL};
	char *out = NULL;
	long long t0 = h_now_ms();
	int code = run_local(args, &out);

	cr_assert_eq(code, 1, "exit %d:\n%s", code, out);
	cr_expect_lt(h_now_ms() - t0, 8000);
	cr_expect(strstr(out, "rank 1 exited with code 127 (permanent"), "%s", out);
	/* node 0 stopped on the controller's word, not by the safety net */
	cr_expect(strstr(out, "job failed (controller): node 'local-1' failed permanently"),
		  "%s", out);
	cr_expect(!strstr(out, "stopping them"), "%s", out);
	free(out);
}
