/*
 * test_recovery.c - recovery inside a running job with checkpoints
 * (runtime/ckpt/mr_ckpt.h): a preempted pod checkpoints before it leaves
 * and the job resumes from that very step; an elastic job that loses a
 * node for good continues on the survivors with dp reduced and the global
 * batch kept; a killed controller does not disturb training; the agent's
 * metrics say what each restart cost.
 *
 * Every run under a fault is paced (debug_slow_ms: rank 0 sleeps in each
 * step, which changes no number) so the fault lands mid-training, and is
 * compared with an unpaced, uninterrupted run of the same job: the loss
 * log byte for byte where the mesh stays, within the parity bound
 * (relative 1e-5) where dp changes.
 */
#include "harness.h"
#include "mr_gpt_worker.h"

#include <math.h>

#include "proc.h"

#define STEPS 80

/* A job's workload config: loss log and checkpoint dir under the test's
 * temporary directory, named by tag; extra keys appended. */
static void config(char *buf, size_t cap, const char *tag, const char *extra)
{
	char loss[300], ck[300], name[64];

	snprintf(name, sizeof(name), "%s.loss", tag);
	h_path(loss, sizeof(loss), name);
	snprintf(name, sizeof(name), "%s-ckpt", tag);
	h_path(ck, sizeof(ck), name);
	snprintf(buf, cap,
		 "{\"steps\": %d, \"d_model\": 32, \"n_layer\": 2, \"n_head\": 4, \"seq_len\": 32, "
		 "\"batch_size\": 4, \"threads\": 1, \"peak_flops\": 1e9, \"seed\": 5, "
		 "\"comm_timeout_ms\": 60000, \"loss_log\": \"%s\", \"ckpt_dir\": \"%s\"%s%s}",
		 STEPS, loss, ck, extra ? ", " : "", extra ? extra : "");
}

/* Runs `meshrun local` to the end; 0 when the job succeeded. */
static int run_local(char *const *args, const char *name)
{
	char log[300];
	pid_t p = h_local(args, NULL, log, sizeof(log), name);
	int code = h_wait(p, 300000);

	if (code != 0)
		h_dump(log);
	return code;
}

/* Each step's loss of the test's tag.loss (STEPS of them). */
static void losses(const char *tag, double *out)
{
	char name[64], path[300], head[128];
	FILE *f;

	snprintf(name, sizeof(name), "%s.loss", tag);
	h_path(path, sizeof(path), name);
	f = fopen(path, "r");
	cr_assert_not_null(f, "no loss log %s", path);
	cr_assert(fgets(head, sizeof(head), f) && !strcmp(head, MR_LOSS_LOG_HEADER "\n"),
		  "%s: no header line", path);
	for (int i = 0; i < STEPS; i++) {
		long long s;
		cr_assert_eq(fscanf(f, "%lld %lf %*g %*g %*g %*s", &s, &out[i]), 2, "%s line %d",
			     path, i + 2);
		cr_assert_eq(s, i + 1, "%s: line %d is step %lld", path, i + 1, s);
	}
	fclose(f);
}

static int same_logs(const char *a, const char *b)
{
	char pa[300], pb[300], na[64], nb[64], *x, *y;
	int same;

	snprintf(na, sizeof(na), "%s.loss", a);
	snprintf(nb, sizeof(nb), "%s.loss", b);
	h_path(pa, sizeof(pa), na);
	h_path(pb, sizeof(pb), nb);
	x = h_read(pa);
	y = h_read(pb);
	same = x && y && !strcmp(x, y);
	free(x);
	free(y);
	return same;
}

/* The value after `key=` in the first line of log holding `event`, or -1. */
static long long logged_value(const char *log, const char *event, const char *key)
{
	char *text = h_read(log), *p = text ? strstr(text, event) : NULL, *k;
	long long v = -1;

	if (p && (k = strstr(p, key)) && (!strchr(p, '\n') || k < strchr(p, '\n')))
		v = atoll(k + strlen(key));
	free(text);
	return v;
}

/* The port of node 0's health server, from a meshrun local log. */
static int node0_port(const char *log)
{
	char *text = h_read(log), *p = text ? strstr(text, "[node 0] ") : NULL;
	int port = 0;

	while (p && !strstr(p, "event=health_listening"))
		p = strstr(p + 1, "[node 0] ");
	if (p && (p = strstr(p, "event=health_listening")) && (p = strstr(p, " port=")))
		port = atoi(p + 6);
	free(text);
	return port;
}

/* A sample of node 0's /metrics (the first line starting with name), or NAN. */
static double metric(int port, const char *name)
{
	struct mr_test_resp *r = malloc(sizeof(*r));
	char url[64];
	double v = NAN;

	cr_assert_not_null(r);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/metrics", port);
	if (mr_test_http(r, "GET", url, NULL, 0, NULL, 5000) == 200) {
		for (char *p = r->body; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
			if (!strncmp(p, name, strlen(name))) {
				v = atof(strchr(p, ' ') + 1);
				break;
			}
	}
	free(r);
	return v;
}

Test(recovery, preempted_pod_checkpoints_and_the_job_resumes_at_that_step, .timeout = 600)
{
	char ref[800], cfg[800], log[300];
	char *ra[] = { "--nodes", "2", "--nproc-per-node", "1", "--workload-config", ref, NULL };
	char *args[] = { "--nodes", "2", "--nproc-per-node", "1", "--heartbeat-timeout", "2s",
			 "--grace-period", "20s", "--workload-config", cfg, NULL };
	long long saved, resumed;
	char *out;
	pid_t local;
	int port;

	config(ref, sizeof(ref), "pre-ref", NULL);
	cr_assert_eq(run_local(ra, "pre-ref.log"), 0);
	/* checkpoints only when preempted */
	config(cfg, sizeof(cfg), "pre", "\"debug_slow_rank\": 0, \"debug_slow_ms\": 60");
	local = h_local(args, NULL, log, sizeof(log), "pre.log");
	cr_assert_eq(h_wait_log(log, "event=gpt_worker_ready", 2, 60000), 0);
	usleep(1500 * 1000);
	kill(h_child(local, "meshrun-agent", 1), SIGTERM);
	cr_assert_eq(h_wait_log(log, "event=checkpoint_resumed", 1, 60000), 0, "no resume");
	port = node0_port(log);
	cr_expect_gt(port, 0);
	/* the surviving node restarted (its ranks saw the peer go: a failed
	 * worker, or the generation first: a lost member) and lost no step */
	cr_expect_geq(metric(port, "meshrun_agent_restarts_by_cause_total{"), 1.0);
	cr_expect(!(metric(port, "meshrun_agent_restart_steps_lost_total") > 0.0),
		  "a preemption cost steps");
	cr_expect_eq(h_wait(local, 300000), 0, "the job did not succeed");
	saved = logged_value(log, "event=preempted", "checkpoint_step=");
	resumed = logged_value(log, "event=checkpoint_resumed", "step=");
	cr_expect_gt(saved, 0, "the preempted rank wrote no checkpoint");
	cr_expect_eq(resumed, saved, "resumed at %lld, preempted at %lld", resumed, saved);
	out = h_read(log);
	cr_expect(out && strstr(out, "exited 143: restart"), "the preempted agent's exit");
	free(out);
	cr_expect(same_logs("pre", "pre-ref"), "the losses differ from the uninterrupted run's");
}

Test(recovery, killed_pod_costs_at_most_the_steps_since_the_last_checkpoint, .timeout = 600)
{
	char ref[800], cfg[800], log[300];
	char *ra[] = { "--nodes", "2", "--nproc-per-node", "1", "--workload-config", ref, NULL };
	char *args[] = { "--nodes", "2", "--nproc-per-node", "1", "--heartbeat-timeout", "2s",
			 "--workload-config", cfg, NULL };
	long long resumed;
	double lost, ckstep;
	pid_t local;
	int port;

	config(ref, sizeof(ref), "kill-ref", "\"ckpt_every\": 5");
	cr_assert_eq(run_local(ra, "kill-ref.log"), 0);
	config(cfg, sizeof(cfg), "kill", "\"ckpt_every\": 5, \"debug_slow_rank\": 0, "
					 "\"debug_slow_ms\": 60");
	local = h_local(args, NULL, log, sizeof(log), "kill.log");
	cr_assert_eq(h_wait_log(log, "event=checkpoint_saved", 2, 60000), 0);
	usleep(700 * 1000);
	kill(h_child(local, "meshrun-agent", 1), SIGKILL);
	cr_assert_eq(h_wait_log(log, "event=checkpoint_resumed", 1, 60000), 0, "no resume");
	port = node0_port(log);
	/* the first stats of the resumed run carry what the restart cost */
	for (long long end = h_now_ms() + 30000; h_now_ms() < end; usleep(100 * 1000))
		if (metric(port, "meshrun_worker_step{rank=\"0\"}") >
		    (double)logged_value(log, "event=checkpoint_resumed", "step="))
			break;
	lost = metric(port, "meshrun_agent_restart_steps_lost_total");
	ckstep = metric(port, "meshrun_checkpoint_last_step{rank=\"0\"}");
	resumed = logged_value(log, "event=checkpoint_resumed", "step=");
	/* checkpoints are written beside training (ckpt_async, the default):
	 * the step-N checkpoint is published only once every part is written,
	 * at the latest when step N+5 snapshots, so a kill may cost up to
	 * 2 * 5 - 1 steps; the resumed one is at least the second published */
	cr_expect(lost >= 0.0 && lost <= 9.0, "a restart cost %g steps, checkpoints every 5", lost);
	cr_expect(resumed >= 10 && resumed % 5 == 0, "resumed at step %lld", resumed);
	cr_expect_geq(ckstep, 10.0, "no checkpoint step in the metrics");
	cr_expect_eq(h_wait(local, 300000), 0, "the job did not succeed");
	cr_expect(same_logs("kill", "kill-ref"), "the losses differ from the uninterrupted run's");
}

Test(recovery, killed_controller_does_not_disturb_training, .timeout = 600)
{
	char ref[800], cfg[800], log[300], *out;
	char *ra[] = { "--nodes", "2", "--nproc-per-node", "1", "--workload-config", ref, NULL };
	char *args[] = { "--nodes", "2", "--nproc-per-node", "1", "--workload-config", cfg, NULL };
	pid_t local;

	config(ref, sizeof(ref), "ctl-ref", "\"ckpt_every\": 10");
	cr_assert_eq(run_local(ra, "ctl-ref.log"), 0);
	config(cfg, sizeof(cfg), "ctl", "\"ckpt_every\": 10, \"debug_slow_rank\": 0, "
					"\"debug_slow_ms\": 60");
	local = h_local(args, NULL, log, sizeof(log), "ctl.log");
	cr_assert_eq(h_wait_log(log, "event=checkpoint_saved", 1, 60000), 0);
	kill(h_child(local, "meshrun-controller", 0), SIGKILL);
	cr_expect_eq(h_wait(local, 300000), 0, "the job did not succeed");
	out = h_read(log);
	cr_expect(strstr(out, "killed by signal 9: restart"), "the controller was not killed");
	cr_expect(!strstr(out, "event=restarting") && !strstr(out, "event=checkpoint_resumed"),
		  "training restarted:\n%s", out);
	free(out);
	cr_expect(same_logs("ctl", "ctl-ref"), "the losses differ from the uninterrupted run's");
}

/* 3 nodes, elastic down to 2: one is killed and never comes back. The
 * job's 6 micro-batches a step (dp 3 x grad_accum 2) become dp 2 x 3. */
Test(recovery, elastic_job_continues_on_fewer_nodes_with_the_global_batch, .timeout = 600)
{
	char ref[800], cfg[800], la[300], lb[300], lc[300];
	char *ra[] = { "--nodes", "1", "--nproc-per-node", "1", "--workload-config", ref, NULL };
	char *extra[] = { "--nnodes", "2:3", "--last-call", "500ms", "--heartbeat-timeout", "2s",
			  "--max-restarts", "5", "--workload-config", cfg, NULL };
	double want[STEPS], got[STEPS];
	struct h_ctl c = { 0 };
	pid_t a, b, d;

	config(ref, sizeof(ref), "el-ref", "\"grad_accum\": 6");
	cr_assert_eq(run_local(ra, "el-ref.log"), 0);
	config(cfg, sizeof(cfg), "el", "\"grad_accum\": 2, \"ckpt_every\": 5, "
				       "\"debug_slow_rank\": 0, \"debug_slow_ms\": 60");
	h_logs(la, lb, sizeof(la), "el");
	h_path(lc, sizeof(lc), "el-c.log");
	h_ctl_start(&c, 0);
	a = h_agent(&c, "t/elastic-ckpt", 0, extra, NULL, NULL, la);
	b = h_agent(&c, "t/elastic-ckpt", 1, extra, NULL, NULL, lb);
	d = h_agent(&c, "t/elastic-ckpt", 2, extra, NULL, NULL, lc);
	cr_assert_eq(h_wait_log(la, "event=checkpoint_saved", 2, 60000), 0);
	kill(d, SIGKILL); /* for good */
	h_wait(d, 10000);
	h_expect_exit(a, 0, 300000, la, &c);
	h_expect_exit(b, 0, 300000, lb, &c);
	cr_expect_geq(h_count(la, "event=elastic_batch dp_was=3 dp=2 grad_accum_was=2 "
				  "grad_accum=3"), 1, "no elastic batch");
	cr_expect_geq(h_count(la, "event=checkpoint_resumed"), 1, "no resume");
	losses("el-ref", want);
	losses("el", got);
	for (int s = 0; s < STEPS; s++)
		cr_expect(fabs(got[s] - want[s]) <= 1e-5 * fabs(want[s]),
			  "step %d: loss %.9g, one rank %.9g", s + 1, got[s], want[s]);
	h_kill(c.pid);
}
