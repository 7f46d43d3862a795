/*
 * test_local.c - `meshrun local` end to end: an embedded controller and N
 * agents on loopback, merged prefixed output, the job's exit status as the
 * controller recorded it, config errors stopping it with exit 2 before
 * anything starts, and its processes supervised as Kubernetes would: a
 * killed agent or controller is restarted and the job still succeeds; a
 * controller that cannot come back is never reported as success.
 */
#include "harness.h"

/* Waits for local (2 min at most); its exit code, *out its output. */
static int finish_local(pid_t pid, const char *log, char **out)
{
	int code = h_wait(pid, 120000);

	if (code < 0)
		h_kill(pid);
	*out = h_read(log);
	return code;
}

static int run_local(char *const *args, char **out)
{
	char log[300], name[64];
	static int seq;

	snprintf(name, sizeof(name), "local-%d.log", seq++);
	return finish_local(h_local(args, NULL, log, sizeof(log), name), log, out);
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

/* The workload config from a file (a mounted ConfigMap); every rank of
 * the machine reports MFU against the same peak (measured once per
 * machine, not by each agent while the others train); no val_loss is
 * printed when none was evaluated. */
Test(local, workload_file_same_peak_on_every_rank_no_nan)
{
	char path[300], *out = NULL;
	char *args[] = {"--nodes", "2", "--workload-config", path, NULL};
	const char *p;
	char first[32] = "";
	int code, n = 0;
	FILE *f;

	h_path(path, sizeof(path), "local-workload.json");
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "{\"steps\": 6, \"d_model\": 32, \"n_layer\": 1, \"seq_len\": 16,\n"
		   " \"batch_size\": 4, \"threads\": 1}\n");
	fclose(f);
	code = run_local(args, &out);
	cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "event=worker_done rank=1 step=6/6 loss="), "%s", out);
	cr_expect_null(strstr(out, "nan"), "%s", out);
	for (p = out; (p = strstr(p, " peak_gflops=")); p++, n++) {
		char v[32];

		cr_assert_eq(sscanf(p, " peak_gflops=%31s", v), 1);
		if (!first[0])
			snprintf(first, sizeof(first), "%s", v);
		cr_expect_str_eq(v, first, "ranks report different peaks:\n%s", out);
	}
	cr_expect_eq(n, 2, "%s", out);
	free(out);
}

/* On a terminal (script(1) provides a pseudo-terminal) the progress lines
 * are folded into one status line redrawn in place, the steps and the
 * summary shown for people (tests/cli/test_local_view.c checks them),
 * the agents' lines kept in the log file. */
Test(local, terminal_shows_one_redrawn_progress_line)
{
	char cmd[2048], log[300], *out;
	char *argv[] = {"/usr/bin/script", "-qfec", cmd, "/dev/null", NULL};
	pid_t pid;
	int code;

	if (access("/usr/bin/script", X_OK))
		cr_skip_test("script(1) is not installed");
	snprintf(cmd, sizeof(cmd),
		 "%s/meshrun local --nodes 2 --health-port 0 --log-file %s/agents.log "
		 "--workload-config '{\"steps\": 4000, \"d_model\": 32, \"n_layer\": 1, "
		 "\"seq_len\": 16, \"batch_size\": 4, \"threads\": 1, \"peak_flops\": 1e9}'",
		 h_build(), h_tmpdir());
	snprintf(log, sizeof(log), "%s/tty.log", h_tmpdir());
	pid = h_spawn(argv, NULL, log);
	code = h_wait(pid, 60000);
	if (code < 0)
		h_kill(pid);
	out = h_read(log);
	cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "\r\033[Kstep "), "no redrawn status line:\n%s", out);
	cr_expect(!strstr(out, "event=progress"), "progress lines were not folded:\n%s", out);
	cr_expect(strstr(out, "step 4000/4000  loss "), "%s", out);
	cr_expect(strstr(out, "done: succeeded, 4000/4000 steps"), "%s", out);
	free(out);
	snprintf(log, sizeof(log), "%s/agents.log", h_tmpdir());
	out = h_read(log);
	cr_expect(out && strstr(out, "event=worker_done rank=1 step=4000/4000"), "%s", out);
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

	cr_assert_eq(code, 2, "exit %d:\n%s", code, out); /* node 1's: permanent */
	cr_expect_lt(h_now_ms() - t0, 8000);
	cr_expect(strstr(out, "rank 1 exited with code 127 (permanent"), "%s", out);
	/* node 0 stopped on the controller's word, not by the safety net */
	cr_expect(strstr(out, "job failed (controller): node 'local-1' failed permanently"),
		  "%s", out);
	cr_expect(!strstr(out, "stopping them"), "%s", out);
	free(out);
}

/* Workers run until $MR_TEST_GO exists, so the test decides when the
 * training ends. */
#define WAIT_FOR_GO "echo UP $RANK gen=$MESHRUN_GENERATION; while [ ! -f $MR_TEST_GO ]; do sleep 0.05; done; echo DONE $RANK"

Test(local, killed_agent_and_controller_are_restarted_and_the_job_succeeds)
{
	char log[300], go[300], genv[400], msg[128], *out;
	char *env[] = {genv, NULL};
	char *args[] = {"--nodes", "2", "--max-restarts", "5", "--heartbeat-timeout", "2s",
			"--", "sh", "-c", WAIT_FOR_GO, NULL};
	pid_t local, victim;
	int code;
	FILE *f;

	h_path(go, sizeof(go), "go-restart");
	snprintf(genv, sizeof(genv), "MR_TEST_GO=%s", go);
	local = h_local(args, env, log, sizeof(log), "local-restart.log");
	cr_assert_eq(h_wait_log(log, "UP 1 gen=1", 1, 60000), 0);
	/* a pod dies: kill -9 of an agent (its worker dies with it) */
	victim = h_child(local, "meshrun-agent", 1);
	kill(victim, SIGKILL);
	snprintf(msg, sizeof(msg), "(pid %d) killed by signal 9: restart 1/5", (int)victim);
	cr_assert_eq(h_wait_log(log, msg, 1, 30000), 0, "%s", h_read(log));
	cr_assert_eq(h_wait_log(log, "] UP 0 gen=", 2, 60000), 0, "%s", h_read(log));
	cr_assert_eq(h_wait_log(log, "] UP 1 gen=", 2, 60000), 0, "%s", h_read(log));
	/* the controller dies: it comes back on the same port and data dir */
	victim = h_child(local, "meshrun-controller", 0);
	kill(victim, SIGKILL);
	snprintf(msg, sizeof(msg), "controller (pid %d) killed by signal 9: restart 1/5",
		 (int)victim);
	cr_assert_eq(h_wait_log(log, msg, 1, 30000), 0, "%s", h_read(log));
	cr_assert_eq(h_wait_log(log, "controller restarted", 1, 30000), 0, "%s", h_read(log));
	f = fopen(go, "w");
	cr_assert_not_null(f);
	fclose(f);
	code = finish_local(local, log, &out);
	cr_assert_eq(code, 0, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "DONE 0"), "%s", out);
	cr_expect(strstr(out, "DONE 1"), "%s", out);
	cr_expect(strstr(out, "succeeded\n"), "%s", out);
	free(out);
}

/* The controller dies for good (no restarts allowed) and the training ends
 * meanwhile: the agents cannot record success and give up after
 * --controller-timeout; local says so instead of "succeeded". */
Test(local, a_controller_that_stays_dead_is_never_reported_as_success)
{
	char log[300], go[300], genv[400], *out;
	char *env[] = {genv, NULL};
	char *args[] = {"--nodes", "2", "--max-restarts", "0", "--controller-timeout", "2s",
			"--exit-barrier-timeout", "500ms", "--", "sh", "-c", WAIT_FOR_GO, NULL};
	pid_t local;
	int code;
	FILE *f;

	h_path(go, sizeof(go), "go-dead");
	snprintf(genv, sizeof(genv), "MR_TEST_GO=%s", go);
	local = h_local(args, env, log, sizeof(log), "local-dead.log");
	cr_assert_eq(h_wait_log(log, "UP 1 gen=1", 1, 60000), 0);
	kill(h_child(local, "meshrun-controller", 0), SIGKILL);
	cr_assert_eq(h_wait_log(log, "restart limit reached", 1, 30000), 0, "%s", h_read(log));
	f = fopen(go, "w");
	cr_assert_not_null(f);
	fclose(f);
	code = finish_local(local, log, &out);
	cr_assert_eq(code, 1, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "DONE 1"), "%s", out);
	cr_expect(strstr(out, "did not answer for"), "%s", out);
	cr_expect(strstr(out, "unable to read its status from the controller"), "%s", out);
	cr_expect_null(strstr(out, "succeeded\n"), "%s", out); /* the report line */
	free(out);
}

Test(local, sigterm_stops_the_job_with_143)
{
	char log[300], go[300], genv[400], *out;
	char *env[] = {genv, NULL};
	char *args[] = {"--nodes", "2", "--", "sh", "-c", WAIT_FOR_GO, NULL};
	pid_t local;
	int code;

	h_path(go, sizeof(go), "go-never");
	snprintf(genv, sizeof(genv), "MR_TEST_GO=%s", go);
	local = h_local(args, env, log, sizeof(log), "local-term.log");
	cr_assert_eq(h_wait_log(log, "UP 1 gen=1", 1, 60000), 0);
	kill(local, SIGTERM);
	code = finish_local(local, log, &out);
	cr_assert_eq(code, 128 + SIGTERM, "exit %d:\n%s", code, out);
	cr_expect(strstr(out, "stopped by signal 15"), "%s", out);
	cr_expect_null(strstr(out, "restart 1/"), "%s", out);
	cr_expect_null(strstr(out, "succeeded\n"), "%s", out); /* the report line */
	free(out);
}

/* 48 layers of d_model 6144 on CPU ranks: about 320 GiB a rank */
#define HUGE_MODEL "{\"n_layer\": 48, \"d_model\": 6144, \"n_head\": 48, \"steps\": 2}"

Test(local, a_model_the_machine_cannot_hold_exits_2_before_starting)
{
	char *args[] = {"--nodes", "1", "--nproc-per-node", "2", "--workload-config", HUGE_MODEL,
			NULL};
	char *out = NULL;

	cr_assert_eq(run_local(args, &out), 2, "%s", out);
	cr_expect(strstr(out, "the model does not fit: 2 rank(s) here need") &&
			  strstr(out, "parameters 81.0"),
		  "no sizes named:\n%s", out);
	cr_expect_null(strstr(out, "controller on"), "%s", out);
	free(out);
}

/* A limit lower than what the machine has (ulimit -v): the planner lets
 * the job start, its allocation fails, and that is permanent - exit 2,
 * not retried - with what the rank needed. */
Test(local, a_model_a_process_limit_cannot_hold_is_not_retried)
{
	char cmd[1024], log[300];
	char *out;
	int st;

#ifdef MR_SANITIZED
	cr_skip_test("ASan reserves more address space than the limit allows");
#endif
	h_path(log, sizeof(log), "ulimit.log");
	snprintf(cmd, sizeof(cmd),
		 "ulimit -v 3000000 && '%s/meshrun' local --nodes 1 --nproc-per-node 1 "
		 "--workload-config '{\"n_layer\": 24, \"d_model\": 1024, \"n_head\": 16, "
		 "\"steps\": 2, \"threads\": 1}' >'%s' 2>&1",
		 h_build(), log);
	st = system(cmd);
	out = h_read(log);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d:\n%s", st, out);
	cr_expect(strstr(out, "err=MR_ENOMEM") && strstr(out, "1 rank(s) here need") &&
			  strstr(out, "ulimit -v"),
		  "no sizes named:\n%s", out);
	cr_expect_null(strstr(out, "event=restarting"), "retried:\n%s", out);
	free(out);
}
