/*
 * test_http.c - meshrun-agent's health server: /healthz, /readyz before
 * and while workers run, and /metrics checked by `promtool check metrics`
 * and for the rank placement, state and heartbeat series.
 */
#include "harness.h"

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
			       "dp=\"0\",cp=\"0\",ep=\"0\"} 1"),
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
