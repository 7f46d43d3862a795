/*
 * test_http.c - meshrun-agent's health server: /healthz, /readyz before
 * and while workers run, and /metrics checked by `promtool check metrics`
 * and for the rank placement, state and heartbeat series; and the
 * pipeline series of a real `meshrun local` pp2 job, scraped while it
 * trains.
 */
#include "harness.h"

#include <math.h>

#include "mr_httpc.h"

static long get(struct mr_httpc *hc, const char *path, char **body)
{
	struct mr_httpc_req rq = {.method = "GET", .path = path, .timeout_ms = 2000,
				  .max_retries = 0};
	struct mr_http_resp resp = {0};
	struct mr_errbuf eb = {0};
	long status;

	if (mr_httpc_request(hc, &rq, &resp, &eb))
		return -1;
	status = resp.status;
	if (body)
		*body = strdup(resp.body);
	mr_http_resp_release(&resp);
	return status;
}

Test(agent_http, health_ready_and_metrics)
{
	struct h_ctl c = {0};
	struct mr_httpc hc;
	struct mr_errbuf eb = {0};
	char la[300], url[64], port_s[16], mfile[300], cmdline[700];
	char *extra[] = {"--health-port", port_s, "--health-addr", "127.0.0.1",
			 "--nproc-per-node", "2", "--tp", "2", "--heartbeat-interval", "100ms",
			 NULL};
	char *cmd[] = {"sh", "-c", "echo UP; sleep 3", NULL};
	struct mr_httpc_opts ho = {.base_url = url, .max_retries = 0};
	char *body = NULL;
	long st = -1;
	FILE *f;
	pid_t a;
	int port = h_free_port();

	snprintf(port_s, sizeof(port_s), "%d", port);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	h_path(la, sizeof(la), "http-a.log");
	h_path(mfile, sizeof(mfile), "metrics.txt");
	h_ctl_start(&c, 0);
	a = h_agent(&c, "t/http", 0, extra, cmd, NULL, la);
	cr_assert_eq(mr_httpc_init(&hc, &ho, &eb), 0);
	for (int i = 0; i < 200 && st != 200; i++) {
		st = get(&hc, "/readyz", NULL);
		if (st != 200)
			usleep(20 * 1000);
	}
	cr_assert_eq(st, 200, "never ready");
	cr_expect_eq(get(&hc, "/healthz", NULL), 200);
	cr_expect_eq(get(&hc, "/nope", NULL), 404);
	usleep(400 * 1000); /* a few heartbeats */
	cr_assert_eq(get(&hc, "/metrics", &body), 200);
	f = fopen(mfile, "w");
	cr_assert_not_null(f);
	fputs(body, f);
	fclose(f);
	snprintf(cmdline, sizeof(cmdline), "/usr/bin/promtool check metrics < %s", mfile);
	cr_expect_eq(system(cmdline), 0, "promtool rejected:\n%s", body);
	cr_expect(strstr(body, "meshrun_agent_state{state=\"running\"} 1"), "%s", body);
	cr_expect(strstr(body, "meshrun_agent_state{state=\"waiting\"} 0"), "%s", body);
	cr_expect(strstr(body, "meshrun_rank_info{rank=\"1\",node_rank=\"0\",tp=\"1\",pp=\"0\","
			       "dp=\"0\",cp=\"0\",ep=\"0\",stage=\"0\"} 1"),
		  "%s", body);
	cr_expect(strstr(body, "meshrun_agent_worker_exit_code{local_rank=\"0\"} -1"), "%s", body);
	cr_expect(strstr(body, "meshrun_agent_restarts_total 0"), "%s", body);
	cr_expect(strstr(body, "meshrun_agent_heartbeat_latency_seconds_count "), "%s", body);
	cr_expect_null(strstr(body, "meshrun_agent_heartbeat_latency_seconds_count 0\n"), "%s",
		       body);
	free(body);
	cr_assert_eq(h_wait(a, 10000), 0);
	mr_httpc_release(&hc);
	h_kill(c.pid);
}

/* The value of the sample `series` (name and labels, as exposed) in a
 * /metrics body; NAN when it is not there. */
static double sample(const char *body, const char *series)
{
	size_t n = strlen(series);
	const char *p = body;

	while (p && *p) {
		if (!strncmp(p, series, n) && p[n] == ' ')
			return strtod(p + n + 1, NULL);
		p = strchr(p, '\n');
		if (p)
			p++;
	}
	return NAN;
}

/* promtool's verdict on a /metrics body. */
static int promtool_ok(const char *body, const char *name)
{
	char path[300], cmd[400];
	FILE *f;

	h_path(path, sizeof(path), name);
	f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(body, f);
	fclose(f);
	snprintf(cmd, sizeof(cmd), "/usr/bin/promtool check metrics < %s", path);
	return system(cmd) == 0;
}

/*
 * `meshrun local --pp 2` (1f1b, 4 micro-batches): rank 0 is stage 0 and
 * rank 1 stage 1 in meshrun_rank_info, and once both ranks have finished
 * steps each has a finite, non-negative bubble and pipeline wait. Some
 * rank waited on a transfer: stage 1 receives every activation it runs.
 */
Test(agent_http, pipeline_series_of_a_local_pp2_job, .timeout = 240)
{
	char *args[] = {"--nodes", "1", "--nproc-per-node", "2", "--pp", "2", "--health-port",
			"0", "--health-addr", "127.0.0.1", "--workload-config",
			"{\"n_layer\": 4, \"d_model\": 32, \"n_head\": 4, \"vocab_size\": 64, "
			"\"steps\": 1000000, \"batch_size\": 2, \"seq_len\": 16, \"grad_accum\": 4, "
			"\"threads\": 1, \"pp_schedule\": \"1f1b\", \"peak_flops\": 1e9}",
			NULL};
	struct mr_httpc_opts ho = {.max_retries = 0};
	struct mr_httpc hc;
	struct mr_errbuf eb = {0};
	char log[300], url[64], *text, *body = NULL;
	const char *p;
	pid_t local = h_local(args, NULL, log, sizeof(log), "pp2-metrics.log");
	double wait_max = 0.0;
	int port = 0;

	if (h_wait_log(log, "event=health_listening", 1, 60000)) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("the agent's health server never listened");
	}
	text = h_read(log);
	p = strstr(strstr(text, "event=health_listening"), " port=");
	cr_assert(p && sscanf(p, " port=%d", &port) == 1 && port > 0, "%s", text);
	free(text);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", port);
	ho.base_url = url;
	cr_assert_eq(mr_httpc_init(&hc, &ho, &eb), 0, "%s", eb.msg);
	/* both stages past a few steps (a step's stats land after it ends) */
	for (long long end = h_now_ms() + 120000; h_now_ms() < end; usleep(100 * 1000)) {
		free(body);
		body = NULL;
		if (get(&hc, "/metrics", &body) == 200 &&
		    sample(body, "meshrun_worker_step{rank=\"0\"}") >= 3 &&
		    sample(body, "meshrun_worker_step{rank=\"1\"}") >= 3)
			break;
	}
	if (!body || !(sample(body, "meshrun_worker_step{rank=\"1\"}") >= 3)) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("no steps of both ranks in /metrics:\n%s", body ? body : "");
	}
	cr_expect(promtool_ok(body, "pp2-metrics.txt"), "promtool rejected:\n%s", body);
	cr_expect(strstr(body, "meshrun_rank_info{rank=\"0\",node_rank=\"0\",tp=\"0\",pp=\"0\","
			       "dp=\"0\",cp=\"0\",ep=\"0\",stage=\"0\"} 1"),
		  "%s", body);
	cr_expect(strstr(body, "meshrun_rank_info{rank=\"1\",node_rank=\"0\",tp=\"0\",pp=\"1\","
			       "dp=\"0\",cp=\"0\",ep=\"0\",stage=\"1\"} 1"),
		  "%s", body);
	/* exported for every rank; a cpu pipeline launches no device graphs */
	cr_expect(sample(body, "meshrun_worker_device_graph_launches{rank=\"1\"}") == 0.0, "%s",
		  body);
	cr_expect(strstr(body, "# TYPE meshrun_pipeline_bubble_fraction gauge\n"), "%s", body);
	cr_expect(strstr(body, "# TYPE meshrun_pipeline_p2p_wait_seconds gauge\n"), "%s", body);
	for (int r = 0; r < 2; r++) {
		char s[96];
		double bubble, wait;

		snprintf(s, sizeof(s), "meshrun_pipeline_bubble_fraction{rank=\"%d\"}", r);
		bubble = sample(body, s);
		cr_expect(isfinite(bubble) && bubble >= 0.0, "%s = %g\n%s", s, bubble, body);
		snprintf(s, sizeof(s), "meshrun_pipeline_p2p_wait_seconds{rank=\"%d\"}", r);
		wait = sample(body, s);
		cr_expect(isfinite(wait) && wait >= 0.0, "%s = %g\n%s", s, wait, body);
		if (wait > wait_max)
			wait_max = wait;
	}
	cr_expect(wait_max > 0.0, "no rank waited on a pipeline transfer:\n%s", body);
	free(body);
	mr_httpc_release(&hc);
	kill(local, SIGTERM);
	if (h_wait(local, 60000) < 0) {
		h_dump(log);
		h_kill(local);
		cr_assert_fail("meshrun local did not stop");
	}
}
