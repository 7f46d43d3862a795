/*
 * test_reliability.c - the agent's promises when things go wrong
 * (docs/RELIABILITY.md), each against the real binaries on loopback:
 * success is only claimed once the controller recorded it (a SIGTERM
 * while the job re-forms is "stopped", exit 143; training that ends while
 * the controller is down is not "succeeded"), an unreachable controller
 * is given up on after controller_timeout naming it (before the round,
 * while training, after training), a token mounted as a file is read,
 * a missing data file fails at once with exit 2 instead of being
 * retried, and a rank that cannot start stops its node's other ranks at
 * once instead of leaving them to wait out the communicator's timeout.
 */
#include "harness.h"
#include "proc.h"

Test(reliability, token_file_is_read_by_the_agent)
{
	char *cenv[] = {"MESHRUN_TOKEN=s3cret-token", NULL};
	struct h_ctl c = {.env = cenv};
	char la[300], lb[300], tok[300], fenv[400];
	char *cmd[] = {"sh", "-c", "echo RAN $RANK", NULL};
	FILE *f;
	pid_t a;

	h_logs(la, lb, sizeof(la), "tokfile");
	h_path(tok, sizeof(tok), "token");
	f = fopen(tok, "w");
	cr_assert_not_null(f);
	fputs("s3cret-token\n", f); /* as `kubectl create secret --from-file` keeps it */
	fclose(f);
	h_ctl_start(&c, 0);
	{
		char *extra[] = {"--token-file", tok, NULL};

		a = h_agent(&c, "t/tokfile", 0, extra, cmd, NULL, la);
		h_expect_exit(a, 0, 60000, la, &c);
		cr_expect_eq(h_count(la, "RAN 0"), 1);
	}
	/* the same through the environment, as a Deployment would set it */
	snprintf(fenv, sizeof(fenv), "MESHRUN_TOKEN_FILE=%s", tok);
	{
		char *env[] = {fenv, NULL};

		a = h_agent(&c, "t/tokfile2", 0, NULL, cmd, env, lb);
		h_expect_exit(a, 0, 60000, lb, &c);
		cr_expect_eq(h_count(lb, "RAN 0"), 1);
	}
	h_kill(c.pid);
}

/* Node drain during a restart: the survivor of a lost pod is re-forming
 * (waiting at generation 2) when it gets SIGTERM. The job is far from
 * succeeded, so the pod must not look Succeeded. */
Test(reliability, sigterm_while_the_job_re_forms_is_stopped_not_succeeded)
{
	struct h_ctl c = {0};
	char la[300], lb[300];
	char *extra[] = {"--nnodes", "2", "--heartbeat-timeout", "2s", "--grace-period", "500ms",
			 NULL};
	char *cmd[] = {"sh", "-c", "echo RUN gen=$MESHRUN_GENERATION; exec sleep 60", NULL};
	char *st;
	pid_t a, b;

	h_logs(la, lb, sizeof(la), "reform");
	h_ctl_start(&c, 0);
	a = h_agent(&c, "t/reform", 0, extra, cmd, NULL, la);
	b = h_agent(&c, "t/reform", 1, extra, cmd, NULL, lb);
	cr_assert_eq(h_wait_log(la, "RUN gen=1", 1, 30000), 0);
	kill(-b, SIGKILL); /* the pod is gone, no goodbye */
	h_wait(b, 5000);
	/* a notices, restarts and waits for a round that cannot close */
	cr_assert_eq(h_wait_log(la, "event=restarting", 1, 30000), 0);
	cr_assert_eq(h_wait_log(la, "state=waiting", 2, 30000), 0);
	kill(a, SIGTERM);
	h_expect_exit(a, 128 + SIGTERM, 60000, la, &c);
	cr_expect_eq(h_count(la, "event=exit code=143 state=stopped"), 1);
	cr_expect_eq(h_count(la, "state=succeeded"), 0);
	st = h_status(&c, "t/reform", "reform-status.log");
	cr_expect(strstr(st, "succeeded") == NULL, "%s", st);
	free(st);
	h_kill(c.pid);
}

Test(reliability, unreachable_controller_is_given_up_naming_it)
{
	struct h_ctl c = {0};
	char la[300], lb[300], want[128];
	char *extra[] = {"--controller-timeout", "1s", NULL};
	char *cmd[] = {"true", NULL};
	pid_t a;

	h_logs(la, lb, sizeof(la), "noctl");
	/* nobody listens there */
	snprintf(c.url, sizeof(c.url), "http://127.0.0.1:%d", h_free_port());
	a = h_agent(&c, "t/noctl", 0, extra, cmd, NULL, la);
	h_expect_exit(a, 1, 60000, la, NULL);
	snprintf(want, sizeof(want), "controller '%s' did not answer for", c.url);
	cr_expect_geq(h_count(la, want), 1);
	cr_expect_geq(h_count(la, "(controller_timeout 1000 ms)"), 1);
}

Test(reliability, controller_lost_while_training_stops_the_workers)
{
	struct h_ctl c = {0};
	char la[300], lb[300], pidf[300], want[128];
	char *extra[] = {"--controller-timeout", "2s", "--heartbeat-interval", "200ms",
			 "--grace-period", "500ms", NULL};
	char cmdline[400];
	char *cmd[] = {"sh", "-c", cmdline, NULL};
	char *pidtext;
	int wpid;

	h_logs(la, lb, sizeof(la), "lostctl");
	h_path(pidf, sizeof(pidf), "lostctl.pid");
	snprintf(cmdline, sizeof(cmdline), "echo $$ > %s; echo UP; exec sleep 60", pidf);
	h_ctl_start(&c, 0);
	{
		pid_t a = h_agent(&c, "t/lostctl", 0, extra, cmd, NULL, la);

		cr_assert_eq(h_wait_log(la, "UP", 1, 30000), 0);
		h_kill(c.pid); /* and it never comes back */
		h_expect_exit(a, 1, 60000, la, NULL);
	}
	snprintf(want, sizeof(want), "controller '%s' did not answer for", c.url);
	cr_expect_geq(h_count(la, want), 1);
	cr_expect_eq(h_count(la, "state=succeeded"), 0);
	/* the worker did not outlive its agent */
	pidtext = h_read(pidf);
	wpid = atoi(pidtext);
	free(pidtext);
	cr_assert_gt(wpid, 0);
	cr_expect(kill(wpid, 0) != 0, "worker %d still runs", wpid);
}

/* The workers finish while the controller is down: the completion cannot
 * be recorded, so the agent must not report success (before, it skipped
 * the exit barrier after exit_barrier_timeout and exited 0). */
Test(reliability, training_ending_while_the_controller_is_down_is_not_success)
{
	struct h_ctl c = {0};
	char la[300], lb[300];
	char *extra[] = {"--controller-timeout", "3s", "--exit-barrier-timeout", "500ms", NULL};
	char *cmd[] = {"sh", "-c", "echo UP; sleep 1; echo DONE", NULL};
	pid_t a;

	h_logs(la, lb, sizeof(la), "donedown");
	h_ctl_start(&c, 0);
	a = h_agent(&c, "t/donedown", 0, extra, cmd, NULL, la);
	cr_assert_eq(h_wait_log(la, "UP", 1, 30000), 0);
	h_kill(c.pid);
	h_expect_exit(a, 1, 60000, la, NULL);
	cr_expect_eq(h_count(la, "DONE"), 1);
	cr_expect_eq(h_count(la, "state=succeeded"), 0);
	cr_expect_geq(h_count(la, "did not answer for"), 1);
}

/* ... and when the controller comes back in time, the same agent finishes
 * and reports success once it is recorded. */
Test(reliability, training_ending_during_a_short_outage_succeeds_once_recorded)
{
	struct h_ctl c = {0};
	char la[300], lb[300];
	char *extra[] = {"--controller-timeout", "60s", NULL};
	char *cmd[] = {"sh", "-c", "echo UP; sleep 1; echo DONE", NULL};
	char *st;
	int port;
	pid_t a;

	h_logs(la, lb, sizeof(la), "shortdown");
	h_ctl_start(&c, 0);
	port = c.port;
	a = h_agent(&c, "t/shortdown", 0, extra, cmd, NULL, la);
	cr_assert_eq(h_wait_log(la, "UP", 1, 30000), 0);
	h_kill(c.pid);
	cr_assert_eq(h_wait_log(la, "DONE", 1, 30000), 0);
	usleep(500 * 1000); /* the agent retries against nothing */
	h_ctl_start(&c, port);
	h_expect_exit(a, 0, 60000, la, &c);
	st = h_status(&c, "t/shortdown", "shortdown-status.log");
	cr_expect(strstr(st, "state:       succeeded\n"), "%s", st);
	free(st);
	h_kill(c.pid);
}

Test(reliability, missing_data_file_fails_at_once_with_exit_2)
{
	struct h_ctl c = {0};
	char la[300], lb[300];
	char *extra[] = {"--max-restarts", "3", "--workload-config",
			 "{\"steps\": 5, \"d_model\": 32, \"n_layer\": 1, \"seq_len\": 16, "
			 "\"batch_size\": 4, \"threads\": 1, "
			 "\"train_data\": \"/nonexistent/meshrun/train.bin\"}",
			 NULL};
	char *st;
	pid_t a;

	h_logs(la, lb, sizeof(la), "nodata");
	h_ctl_start(&c, 0);
	a = h_agent(&c, "t/nodata", 0, extra, NULL, NULL, la);
	h_expect_exit(a, 2, 60000, la, &c);
	cr_expect_geq(h_count(la, "unable to open shard '/nonexistent/meshrun/train.bin'"), 1);
	cr_expect_eq(h_count(la, "event=restarting"), 0);
	/* the agent's last word carries the worker's reason, not only a code */
	cr_expect_geq(h_count(la, "event=failed reason=\"rank 0 exited with code 2: unable to "
				  "open shard"),
		      1, "the failure does not say why");
	st = h_status(&c, "t/nodata", "nodata-status.log");
	cr_expect(strstr(st, "state:       failed\n"), "%s", st);
	free(st);
	h_kill(c.pid);
}

/*
 * Two in-process ranks on an emulated machine with one GPU: rank 1 cannot
 * open GPU 1 (permanent, exit 2) while rank 0 waits in the communicators'
 * bootstrap for it. The agent must abort rank 0 and exit at once, not
 * after comm_timeout_ms (10 minutes here; the test gives it 2).
 */
Test(reliability, a_rank_that_cannot_start_stops_the_others_at_once, .timeout = 240)
{
	struct h_ctl c = {0};
	char la[300], lb[300], bin[1024];
	char *env[] = {"MR_CUDA_EMUL_DEVICES=1", NULL};
	char *extra[] = {"--nproc-per-node", "2", "--workload-config",
			 "{\"steps\": 5, \"d_model\": 128, \"n_head\": 4, \"n_layer\": 1, "
			 "\"seq_len\": 16, \"batch_size\": 2, \"threads\": 1, "
			 "\"device\": \"cuda\", \"precision\": \"fp32\", "
			 "\"comm_timeout_ms\": 600000}",
			 NULL};
	pid_t a;

	snprintf(bin, sizeof(bin), "%s/emul/meshrun-agent", h_build());
	h_agent_bin = bin;
	h_logs(la, lb, sizeof(la), "nogpu");
	h_ctl_start(&c, 0);
	a = h_agent(&c, "t/nogpu", 0, extra, NULL, env, la);
	h_expect_exit(a, 2, 120000, la, &c);
	cr_expect_geq(h_count(la, "cuda device '1' not available"), 1);
	cr_expect_eq(h_count(la, "unable to get peer address"), 0,
		     "rank 0 waited out its bootstrap");
	h_kill(c.pid);
}

/*
 * No split brain: a checkpoint writer whose generation ended while it was
 * writing (held before its publish by debug_ckpt_publish_delay_ms; the
 * generation bumped meanwhile by a failure report) must not publish. Its
 * publish is fenced by the controller (`checkpoint_fenced`: the KV call
 * of the old generation is answered 409), the step never appears, and
 * the restarted job does not resume from it.
 */
Test(reliability, a_stale_checkpoint_writer_never_publishes, .timeout = 240)
{
	struct h_ctl c = {0};
	struct mr_test_resp r;
	char la[300], lb[300], ck[300], cfg[700], url[160], step[400];
	char *extra[] = {"--max-restarts", "3", "--workload-config", cfg, NULL};
	pid_t a;

	h_logs(la, lb, sizeof(la), "fence");
	h_path(ck, sizeof(ck), "fence-ckpt");
	snprintf(cfg, sizeof(cfg),
		 "{\"steps\": 10, \"d_model\": 32, \"n_layer\": 1, \"seq_len\": 16, "
		 "\"batch_size\": 4, \"threads\": 1, \"ckpt_dir\": \"%s\", \"ckpt_every\": 5, "
		 "\"debug_ckpt_publish_delay_ms\": 2000}",
		 ck);
	h_ctl_start(&c, 0);
	a = h_agent(&c, "t/fence", 0, extra, NULL, NULL, la);
	cr_assert_eq(h_wait_log(la, "event=debug_checkpoint_publish_delay step=5", 1, 60000), 0);
	/* the job moves on while the writer holds step 5 */
	snprintf(url, sizeof(url), "%s/v1/jobs/t/fence/fail", c.url);
	{
		static const char body[] = "{\"node_id\": \"node-0\", \"generation\": 1, "
					   "\"reason\": \"test\"}";

		cr_assert_eq(mr_test_http(&r, "POST", url, body, strlen(body), NULL, 10000), 200,
			     "%s", r.body);
	}
	h_expect_exit(a, 0, 120000, la, &c);
	cr_expect_eq(h_count(la, "event=checkpoint_fenced step=5"), 1, "the stale step was not "
								       "fenced");
	cr_expect_eq(h_count(la, "event=checkpoint_resumed step=5"), 0,
		     "the restart resumed from the stale step");
	/* the new generation published its own steps */
	snprintf(step, sizeof(step), "%s/step-00000010/manifest.json", ck);
	cr_expect_eq(access(step, F_OK), 0, "the new generation's last step is missing");
	h_kill(c.pid);
}
