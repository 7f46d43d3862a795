/*
 * test_api.c - the controller's HTTP API against a real process: KV wait
 * timeout and wake-up, compare-and-set, add, list by prefix with paging,
 * job isolation, bearer tokens (401/403, read token), body and value
 * limits (413), malformed JSON and wrong types (400 naming the field),
 * 404/405, metrics, a slowloris client dropped after the idle timeout
 * while normal clients are served, the job's end (permanent fail,
 * complete) answering parked and later calls 410 across a restart, percent
 * escapes in paths and queries (%00 cannot reach another key or job, %2F
 * is no separator), conflicting Content-Length, and the connection limit
 * (503 "overloaded" at once while /healthz, /readyz, /metrics answer).
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ctl_test.h"

static void mkjob(struct ctlp *c, const char *name)
{
	struct mr_test_resp r;
	char body[256];

	snprintf(body, sizeof(body), "{\"name\":\"%s\",\"min_nodes\":1}", name);
	ctl_call(c, &r, "POST", body, NULL, "/v1/jobs");
	cr_assert_eq(r.status, 201, "%s", r.body);
}

/* A long-poll GET run on its own thread: its status, duration, body and
 * error code. */
struct parkarg {
	struct ctlp *c;
	const char *path;
	long status;
	long long ms;
	char body[64];
	char code[64];
};

static void *park(void *arg)
{
	struct parkarg *p = arg;
	struct mr_test_resp *r = malloc(sizeof(*r));
	long long t0 = mr_test_now_ms();
	size_t n;

	p->status = ctl_call(p->c, r, "GET", NULL, NULL, "%s", p->path);
	p->ms = mr_test_now_ms() - t0;
	n = r->len < sizeof(p->body) - 1 ? r->len : sizeof(p->body) - 1;
	memcpy(p->body, r->body, n);
	p->body[n] = 0;
	if (p->status >= 400)
		jerr(r, "code", p->code, sizeof(p->code));
	free(r);
	return NULL;
}

Test(api, kv_wait_timeout_wake_cas_add_list)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	struct parkarg w = { .c = &c, .path = "/v1/jobs/a/kv/kv/late?wait_ms=10000" };
	pthread_t th;
	long long t0;
	char code[64];

	ctlp_start(&c, 0, NULL);
	mkjob(&c, "a/kv");
	/* absent key: 404 at once, or wait_timeout after wait_ms */
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/kv/kv/nope");
	cr_assert_eq(r.status, 404);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "not_found");
	t0 = mr_test_now_ms();
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/kv/kv/nope?wait_ms=300");
	cr_assert_eq(r.status, 404);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "wait_timeout");
	cr_assert_geq(mr_test_now_ms() - t0, 250);
	/* a parked wait wakes on put */
	pthread_create(&th, NULL, park, &w);
	usleep(300000);
	ctl_call(&c, &r, "PUT", "hello", NULL, "/v1/jobs/a/kv/kv/late");
	cr_assert_eq(r.status, 200);
	pthread_join(th, NULL);
	cr_assert_eq(w.status, 200);
	cr_assert_str_eq(w.body, "hello");
	cr_assert_lt(w.ms, 5000);
	/* CAS */
	ctl_call(&c, &r, "PUT", "v1", "If-None-Match: *", "/v1/jobs/a/kv/kv/cas");
	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.etag, "\"2\"");
	ctl_call(&c, &r, "PUT", "v2", "If-None-Match: *", "/v1/jobs/a/kv/kv/cas");
	cr_assert_eq(r.status, 412);
	cr_assert_eq(jint(&r, "version"), 2);
	ctl_call(&c, &r, "PUT", "v2", "If-Match: \"1\"", "/v1/jobs/a/kv/kv/cas");
	cr_assert_eq(r.status, 412);
	ctl_call(&c, &r, "PUT", "v2", "If-Match: \"2\"", "/v1/jobs/a/kv/kv/cas");
	cr_assert_eq(r.status, 200);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/kv/kv/cas");
	cr_assert_str_eq(r.body, "v2");
	cr_assert_str_eq(r.etag, "\"3\"");
	/* add */
	ctl_call(&c, &r, "POST", "{\"delta\":5}", NULL, "/v1/jobs/a/kv/kv/ctr/add");
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert_eq(jint(&r, "value"), 5);
	ctl_call(&c, &r, "POST", "{\"delta\":-2}", NULL, "/v1/jobs/a/kv/kv/ctr/add");
	cr_assert_eq(jint(&r, "value"), 3);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/kv/kv/ctr");
	cr_assert_str_eq(r.body, "3");
	ctl_call(&c, &r, "POST", "{\"delta\":1}", NULL, "/v1/jobs/a/kv/kv/cas/add");
	cr_assert_eq(r.status, 409, "add on a non-integer value");
	ctl_call(&c, &r, "POST", "{\"delta\":\"x\"}", NULL, "/v1/jobs/a/kv/kv/ctr/add");
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "delta");
	/* list by prefix with paging */
	for (int i = 0; i < 5; i++) {
		char path[64];

		snprintf(path, sizeof(path), "/v1/jobs/a/kv/kv/peer/%d", i);
		ctl_call(&c, &r, "PUT", "x", NULL, "%s", path);
		cr_assert_eq(r.status, 200);
	}
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/kv/kv?prefix=peer/&limit=2");
	cr_assert_eq(r.status, 200);
	cr_assert_eq(jint(&r, "total"), 5);
	cr_assert_eq(jint(&r, "next"), 2);
	cr_assert(strstr(r.body, "\"peer/0\"") && strstr(r.body, "\"peer/1\"") &&
		  !strstr(r.body, "\"peer/2\""), "%s", r.body);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/kv/kv?prefix=peer/&offset=4&limit=2");
	cr_assert(strstr(r.body, "\"peer/4\"") && strstr(r.body, "\"next\":null"), "%s", r.body);
	ctl_call(&c, &r, "DELETE", NULL, NULL, "/v1/jobs/a/kv/kv/peer/4");
	cr_assert_eq(r.status, 200);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/kv/kv/peer/4");
	cr_assert_eq(r.status, 404);
	ctlp_stop(&c, 1);
}

Test(api, jobs_are_isolated)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;

	ctlp_start(&c, 0, NULL);
	mkjob(&c, "team-a/j");
	mkjob(&c, "team-b/j");
	ctl_call(&c, &r, "PUT", "secret", NULL, "/v1/jobs/team-a/j/kv/nccl/id");
	cr_assert_eq(r.status, 200);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/team-b/j/kv/nccl/id");
	cr_assert_eq(r.status, 404);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/team-b/j/kv?prefix=");
	cr_assert_eq(jint(&r, "total"), 0);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/team-a/j/kv/nccl/id");
	cr_assert_str_eq(r.body, "secret");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/team-c/j/kv/nccl/id");
	cr_assert_eq(r.status, 404);
	ctlp_stop(&c, 1);
}

Test(api, bearer_tokens)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	char tf[400], rf[400], code[64];
	const char *extra[] = { "--token-file", tf, "--read-token-file", rf, NULL };
	FILE *f;

	cr_assert_eq(mr_test_tmpdir(c.dir, sizeof(c.dir), "mr-ctl"), 0);
	snprintf(c.port_file, sizeof(c.port_file), "%s/port", c.dir);
	snprintf(c.log, sizeof(c.log), "%s/controller.log", c.dir);
	snprintf(tf, sizeof(tf), "%s/token", c.dir);
	snprintf(rf, sizeof(rf), "%s/rtoken", c.dir);
	f = fopen(tf, "w");
	fputs("s3cret-write\n", f);
	fclose(f);
	f = fopen(rf, "w");
	fputs("s3cret-read", f);
	fclose(f);
	ctlp_start(&c, 0, extra);
	ctl_call(&c, &r, "POST", "{\"name\":\"a/b\",\"min_nodes\":1}", NULL, "/v1/jobs");
	cr_assert_eq(r.status, 401);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "unauthorized");
	snprintf(c.token, sizeof(c.token), "wrong");
	ctl_call(&c, &r, "POST", "{\"name\":\"a/b\",\"min_nodes\":1}", NULL, "/v1/jobs");
	cr_assert_eq(r.status, 403);
	snprintf(c.token, sizeof(c.token), "s3cret-read");
	ctl_call(&c, &r, "POST", "{\"name\":\"a/b\",\"min_nodes\":1}", NULL, "/v1/jobs");
	cr_assert_eq(r.status, 403, "the read token cannot write");
	snprintf(c.token, sizeof(c.token), "s3cret-write");
	ctl_call(&c, &r, "POST", "{\"name\":\"a/b\",\"min_nodes\":1}", NULL, "/v1/jobs");
	cr_assert_eq(r.status, 201);
	snprintf(c.token, sizeof(c.token), "s3cret-read");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/b");
	cr_assert_eq(r.status, 200);
	c.token[0] = 0;
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/b");
	cr_assert_eq(r.status, 401);
	ctl_call(&c, &r, "GET", NULL, NULL, "/healthz");
	cr_assert_eq(r.status, 200, "health needs no token");
	ctlp_stop(&c, 1);
}

Test(api, limits_and_bad_requests)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	const char *extra[] = { "--max-body", "4096", "--max-value", "1024", NULL };
	char big[8192], code[64];

	ctlp_start(&c, 0, extra);
	mkjob(&c, "l/j");
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	ctl_call(&c, &r, "PUT", big, NULL, "/v1/jobs/l/j/kv/big");
	cr_assert_eq(r.status, 413, "body above --max-body");
	big[2000] = 0;
	ctl_call(&c, &r, "PUT", big, NULL, "/v1/jobs/l/j/kv/big");
	cr_assert_eq(r.status, 413, "value above --max-value");
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "value_too_large");
	/* malformed JSON and wrong types name the field */
	ctl_call(&c, &r, "POST", "{\"node_id\": ", NULL, "/v1/jobs/l/j/join");
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "invalid_json");
	ctl_call(&c, &r, "POST", "{\"node_id\": 7}", NULL, "/v1/jobs/l/j/join");
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "node_id");
	ctl_call(&c, &r, "POST", "{\"node_id\": \"a b\"}", NULL, "/v1/jobs/l/j/join");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "node_id");
	ctl_call(&c, &r, "POST", "{\"node_id\": \"n\", \"pod_index\": \"3\"}", NULL,
		 "/v1/jobs/l/j/join");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "pod_index");
	ctl_call(&c, &r, "POST", "{\"node_id\": \"n\", \"ports\": {\"comm\": 70000}}", NULL,
		 "/v1/jobs/l/j/join");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "ports");
	ctl_call(&c, &r, "POST", "{\"name\":\"x/y\",\"min_nodes\":4,\"max_nodes\":2}", NULL,
		 "/v1/jobs");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "max_nodes");
	ctl_call(&c, &r, "POST", "{\"name\":\"x/y\",\"min_nodes\":3,\"mesh\":{\"tp\":2}}", NULL,
		 "/v1/jobs");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "mesh");
	ctl_call(&c, &r, "POST", "{\"name\":\"x/y\",\"min_nodes\":1,\"mesh\":{\"tp\":\"2\"}}",
		 NULL, "/v1/jobs");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "mesh.tp");
	ctl_call(&c, &r, "POST", "{\"name\":\"X_Y/z\",\"min_nodes\":1}", NULL, "/v1/jobs");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "name");
	ctl_call(&c, &r, "POST", "{\"name\":\"x/y\",\"min_nodes\":1,\"bogus\":1}", NULL,
		 "/v1/jobs");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "bogus");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/l/j/wait?node_id=n&timeout_ms=abc");
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "timeout_ms");
	ctl_call(&c, &r, "PUT", "x", NULL, "/v1/jobs/l/j/kv/bad%%20key");
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "key");
	/* 404 and 405 */
	ctl_call(&c, &r, "GET", NULL, NULL, "/nope");
	cr_assert_eq(r.status, 404);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/l/missing");
	cr_assert_eq(r.status, 404);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "job_not_found");
	ctl_call(&c, &r, "DELETE", NULL, NULL, "/v1/jobs/l/j/join");
	cr_assert_eq(r.status, 405);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "method_not_allowed");
	ctl_call(&c, &r, "PUT", "{}", NULL, "/healthz");
	cr_assert_eq(r.status, 405);
	/* still alive and counting by route template */
	ctl_call(&c, &r, "GET", NULL, NULL, "/metrics");
	cr_assert_eq(r.status, 200);
	cr_assert(strstr(r.body, "route=\"/v1/jobs/{job}/join\",status=\"400\""), "%.2000s",
		  r.body);
	ctlp_stop(&c, 1);
}

Test(api, slowloris_is_dropped_and_others_served)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	const char *extra[] = { "--idle-timeout", "1s", NULL };
	struct timeval tv = { 5, 0 };
	long long t0;
	char buf[256];
	ssize_t n;
	int fd;

	ctlp_start(&c, 0, extra);
	fd = mr_test_connect(c.port);
	cr_assert_geq(fd, 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	cr_assert_gt(write(fd, "GET /healthz HTTP/1.1\r\nHost: x\r\n", 32), 0);
	t0 = mr_test_now_ms();
	ctl_call(&c, &r, "GET", NULL, NULL, "/healthz");
	cr_assert_eq(r.status, 200, "a normal client is served meanwhile");
	n = read(fd, buf, sizeof(buf));
	cr_assert_leq(n, 0, "the slow client was closed, not answered");
	cr_assert_lt(mr_test_now_ms() - t0, 4500, "closed after the idle timeout");
	close(fd);
	ctlp_stop(&c, 1);
}

static void read_all(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, cap - 1, f) : 0;

	buf[n] = 0;
	if (f)
		fclose(f);
}

Test(api, meshrun_status_prints_jobs_and_members)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	struct mr_proc p;
	char url[64], out[400], text[8192];
	const char *args_list[] = { "status", "--controller", url, NULL };
	const char *args_job[] = { "status", "--controller", url, "team-a/gpt", NULL };

	ctlp_start(&c, 0, NULL);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d", c.port);
	snprintf(out, sizeof(out), "%s/status.out", c.dir);
	mkjob(&c, "team-a/gpt");
	ctl_call(&c, &r, "POST", "{\"node_id\":\"gpt-0\",\"host\":\"10.0.0.1\",\"pod_index\":0}",
		 NULL, "/v1/jobs/team-a/gpt/join");
	cr_assert_eq(r.status, 200);
	cr_assert_eq(mr_proc_spawn(&p, "meshrun", args_list, NULL, out), 0);
	cr_assert_eq(mr_proc_reap(&p, 10000), 0);
	cr_assert(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0);
	read_all(out, text, sizeof(text));
	cr_assert(strstr(text, "JOB") && strstr(text, "team-a/gpt") && strstr(text, "running"),
		  "%s", text);
	unlink(out);
	cr_assert_eq(mr_proc_spawn(&p, "meshrun", args_job, NULL, out), 0);
	cr_assert_eq(mr_proc_reap(&p, 10000), 0);
	cr_assert(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0);
	read_all(out, text, sizeof(text));
	cr_assert(strstr(text, "NODE_RANK") && strstr(text, "gpt-0") && strstr(text, "10.0.0.1"),
		  "%s", text);
	ctlp_stop(&c, 1);
}

static void two_running(struct ctlp *c, const char *job, const char *a, const char *b)
{
	struct mr_test_resp r;
	char body[256];

	snprintf(body, sizeof(body), "{\"name\":\"%s\",\"min_nodes\":2}", job);
	ctl_call(c, &r, "POST", body, NULL, "/v1/jobs");
	cr_assert_eq(r.status, 201, "%s", r.body);
	snprintf(body, sizeof(body), "{\"node_id\":\"%s\"}", a);
	ctl_call(c, &r, "POST", body, NULL, "/v1/jobs/%s/join", job);
	cr_assert_eq(r.status, 200, "%s", r.body);
	snprintf(body, sizeof(body), "{\"node_id\":\"%s\"}", b);
	ctl_call(c, &r, "POST", body, NULL, "/v1/jobs/%s/join", job);
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert(strstr(r.body, "\"running\""), "%s", r.body);
}

static void job_state_is(struct ctlp *c, const char *job, const char *state, const char *reason)
{
	struct mr_test_resp r;

	ctl_call(c, &r, "GET", NULL, NULL, "/v1/jobs/%s", job);
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert(strstr(r.body, state), "%s", r.body);
	cr_assert(strstr(r.body, reason), "%s", r.body);
	cr_assert_eq(jint(&r, "generation"), 1, "%s", r.body);
}

Test(api, permanent_fail_and_completion_end_the_job)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	struct parkarg kv = { .c = &c, .path = "/v1/jobs/a/end/kv/never?wait_ms=20000" };
	pthread_t th;
	char code[64];

	ctlp_start(&c, 0, NULL);
	two_running(&c, "a/end", "n0", "n1");
	pthread_create(&th, NULL, park, &kv);
	usleep(200000);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"n0\",\"permanent\":\"yes\"}", NULL,
		 "/v1/jobs/a/end/fail");
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "permanent");
	ctl_call(&c, &r, "POST", "{\"node_id\":\"n0\",\"permanent\":true,\"reason\":\"exit 2\"}",
		 NULL, "/v1/jobs/a/end/fail");
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert(strstr(r.body, "\"failed\""), "%s", r.body);
	pthread_join(th, NULL);
	cr_assert_eq(kv.status, 410, "parked KV wait: %ld", kv.status);
	cr_assert_str_eq(kv.code, "job_failed");
	cr_assert_lt(kv.ms, 2000, "answered after %lld ms", kv.ms);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"n1\"}", NULL, "/v1/jobs/a/end/heartbeat");
	cr_assert_eq(r.status, 410);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "job_failed");
	cr_assert(strstr(r.body, "node 'n0' failed permanently: exit 2"), "%s", r.body);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/end/wait?node_id=n1&timeout_ms=0");
	cr_assert_eq(r.status, 410);
	ctl_call(&c, &r, "PUT", "x", NULL, "/v1/jobs/a/end/kv/k");
	cr_assert_eq(r.status, 410);
	job_state_is(&c, "a/end", "\"state\":\"failed\"", "failed permanently: exit 2");

	/* success: complete from every member, no bump */
	two_running(&c, "a/ok", "m0", "m1");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/a/ok/complete");
	cr_assert_eq(r.status, 405);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"m0\",\"generation\":1}", NULL,
		 "/v1/jobs/a/ok/complete");
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert(strstr(r.body, "\"running\""), "%s", r.body);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"m1\",\"generation\":1}", NULL,
		 "/v1/jobs/a/ok/complete");
	cr_assert_eq(r.status, 200, "%s", r.body);
	cr_assert(strstr(r.body, "\"succeeded\""), "%s", r.body);
	ctl_call(&c, &r, "POST", "{\"node_id\":\"m0\"}", NULL, "/v1/jobs/a/ok/heartbeat");
	cr_assert_eq(r.status, 410);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "job_succeeded");
	job_state_is(&c, "a/ok", "\"state\":\"succeeded\"", "\"done\":2");

	/* both verdicts survive a restart */
	ctlp_stop(&c, 0);
	ctlp_start(&c, 0, NULL);
	job_state_is(&c, "a/end", "\"state\":\"failed\"", "failed permanently: exit 2");
	job_state_is(&c, "a/ok", "\"state\":\"succeeded\"", "all 2 nodes of generation 1");
	ctlp_stop(&c, 1);
}

Test(api, percent_escapes_cannot_reach_another_key_or_job)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	char code[64];

	ctlp_start(&c, 0, NULL);
	mkjob(&c, "nul/victim");
	ctl_call(&c, &r, "PUT", "orig", NULL, "/v1/jobs/nul/victim/kv/victimkey");
	cr_assert_eq(r.status, 200);
	/* %00 used to cut the key to 'victimkey' and overwrite it */
	ctl_call(&c, &r, "PUT", "evil", NULL, "%s", "/v1/jobs/nul/victim/kv/victimkey%00.evil");
	cr_assert_eq(r.status, 400, "%s", r.body);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "bad_path");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "path[5]");
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/nul/victim/kv/victimkey");
	cr_assert_eq(r.status, 200);
	cr_assert_str_eq(r.body, "orig");
	/* ... and the job name to 'nul/victim' and delete it */
	ctl_call(&c, &r, "DELETE", NULL, NULL, "%s", "/v1/jobs/nul/victim%00zzz");
	cr_assert_eq(r.status, 400, "%s", r.body);
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "path[3]");
	ctl_call(&c, &r, "DELETE", NULL, NULL, "%s", "/v1/jobs/nul%2Fvictim");
	cr_assert_eq(r.status, 404, "%%2F is no separator: %s", r.body);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/nul/victim");
	cr_assert_eq(r.status, 200, "the job survived: %s", r.body);
	/* malformed escapes and control characters */
	ctl_call(&c, &r, "PUT", "x", NULL, "%s", "/v1/jobs/nul/victim/kv/a%G1");
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "bad_path");
	ctl_call(&c, &r, "PUT", "x", NULL, "%s", "/v1/jobs/nul/victim/kv/a/b%1F");
	cr_assert_eq(r.status, 400);
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "path[6]");
	/* a query value cannot be cut short either */
	ctl_call(&c, &r, "GET", NULL, NULL, "%s", "/v1/jobs/nul/victim/wait?node_id=n0%00x");
	cr_assert_eq(r.status, 400, "%s", r.body);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "bad_query");
	cr_assert_str_eq(jerr(&r, "field", code, sizeof(code)), "node_id");
	/* valid escapes work end to end; a key may spell '/' as %2F */
	ctl_call(&c, &r, "PUT", "dot", NULL, "%s", "/v1/jobs/nul/victim/kv/x%2Ey");
	cr_assert_eq(r.status, 200, "%s", r.body);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/nul/victim/kv/x.y");
	cr_assert_str_eq(r.body, "dot");
	ctl_call(&c, &r, "PUT", "slash", NULL, "%s", "/v1/jobs/nul/victim/kv/meshrun%2Fbarrier");
	cr_assert_eq(r.status, 200, "%s", r.body);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/nul/victim/kv/meshrun/barrier");
	cr_assert_str_eq(r.body, "slash");
	/* add is an operation only as a segment of its own */
	ctl_call(&c, &r, "POST", "{\"delta\":2}", NULL, "/v1/jobs/nul/victim/kv/ctr/add");
	cr_assert_eq(r.status, 200, "%s", r.body);
	ctl_call(&c, &r, "POST", "{\"delta\":2}", NULL, "%s", "/v1/jobs/nul/victim/kv/ctr%2Fadd");
	cr_assert_eq(r.status, 405, "%s", r.body);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/nul/victim/kv?prefix=");
	cr_assert_eq(jint(&r, "total"), 4, "%s", r.body);
	ctlp_stop(&c, 1);
}

Test(api, conflicting_content_length_is_400)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	char buf[4096];

	ctlp_start(&c, 0, NULL);
	mkjob(&c, "cl/j");
	cr_assert_eq(mr_test_raw_request(c.port,
			      "PUT /v1/jobs/cl/j/kv/k HTTP/1.1\r\nHost: x\r\n"
			      "Content-Length: 1\r\nContent-Length: 5\r\n\r\nabcde",
			      buf, sizeof(buf)),
		     400, "%s", buf);
	cr_assert(strstr(buf, "\"field\":\"Content-Length\""), "%s", buf);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/cl/j/kv/k");
	cr_assert_eq(r.status, 404, "nothing was stored: %s", r.body);
	cr_assert_eq(mr_test_raw_request(c.port,
			      "PUT /v1/jobs/cl/j/kv/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			      "Content-Length: 5\r\nContent-Length: 5\r\n\r\nabcde",
			      buf, sizeof(buf)),
		     200, "identical repeats are one value: %s", buf);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs/cl/j/kv/k");
	cr_assert_str_eq(r.body, "abcde");
	ctlp_stop(&c, 1);
}

Test(api, over_the_connection_limit_probes_still_answer)
{
	struct ctlp c = { 0 };
	struct mr_test_resp r;
	const char *extra[] = { "--max-connections", "4", NULL };
	char url[128], code[64];
	int idle[4];

	ctlp_start(&c, 0, extra);
	for (int i = 0; i < 4; i++)
		cr_assert_geq(idle[i] = mr_test_connect(c.port), 0);
	usleep(300000);
	snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/jobs", c.port);
	mr_test_http(&r, "GET", url, NULL, 0, NULL, 10000);
	cr_assert_eq(r.status, 503, "an API call past the limit: %ld %s", r.status, r.body);
	cr_assert_str_eq(jerr(&r, "code", code, sizeof(code)), "overloaded");
	static const char *const probes[] = { "/healthz", "/readyz", "/metrics" };
	for (int i = 0; i < 3; i++) {
		snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", c.port, probes[i]);
		mr_test_http(&r, "GET", url, NULL, 0, NULL, 10000);
		cr_assert_eq(r.status, 200, "%s at the limit: %ld", probes[i], r.status);
	}
	cr_assert(strstr(r.body, "meshrun_controller_http_requests_total"), "%.200s", r.body);
	close(idle[0]);
	usleep(300000);
	ctl_call(&c, &r, "GET", NULL, NULL, "/v1/jobs");
	cr_assert_eq(r.status, 200, "a freed slot serves the API again");
	for (int i = 1; i < 4; i++)
		close(idle[i]);
	ctlp_stop(&c, 1);
}
