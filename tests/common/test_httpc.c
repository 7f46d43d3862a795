/*
 * test_httpc.c - mr_httpc against a real mr_httpd server on loopback:
 * round trips, retries with backoff, status handling, timeouts, abort.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mr_httpc.h"
#include "mr_httpd.h"
#include "mr_port.h"

static atomic_int flaky_left; /* /flaky answers 503 while > 0 */
static atomic_int hits;

static void handler(struct mr_http_req *req, void *user)
{
	const char *path = mr_http_req_path(req);
	size_t len;
	const char *body = mr_http_req_body(req, &len);

	(void)user;
	atomic_fetch_add(&hits, 1);
	if (strcmp(path, "/echo") == 0) {
		const char *auth = mr_http_req_header(req, "Authorization");
		const char *im = mr_http_req_header(req, "If-Match");
		const char *ct = mr_http_req_header(req, "Content-Type");

		mr_http_add_header(req, "ETag", "\"3\"");
		mr_http_reply_json(req, 200,
				   json_pack("{s:s,s:s%,s:s?,s:s?,s:s?,s:s?}", "method",
					     mr_http_req_method_str(req), "body", body, len, "auth",
					     auth, "if_match", im, "ct", ct, "q",
					     mr_http_req_query(req, "q")));
	} else if (strcmp(path, "/flaky") == 0) {
		if (atomic_fetch_sub(&flaky_left, 1) > 0)
			mr_http_reply_error(req, 503, "unavailable", NULL, NULL, "try later");
		else
			mr_http_reply(req, 200, NULL, "ok", 2);
	} else if (strcmp(path, "/slow") == 0) {
		mr_http_suspend(req); /* answered 503 by stop */
	} else {
		mr_http_reply_error(req, 404, "not_found", NULL, NULL, "no route");
	}
}

static struct mr_httpd *start_on(int port)
{
	struct mr_httpd_opts o = {.bind_addr = "127.0.0.1", .port = port, .handler = handler};
	struct mr_httpd *srv = NULL;
	struct mr_errbuf eb = {0};

	cr_assert_eq(mr_httpd_start(&srv, &o, &eb), 0, "start: %s", eb.msg);
	return srv;
}

/* A loopback port nobody listens on (bound then released). */
/* A port for a server started later (mr_port.h). */
static int free_port(void)
{
	int port = mr_port_free();

	cr_assert_gt(port, 0, "no free port");
	return port;
}

static void client(struct mr_httpc *c, int port, const char *token, int retries)
{
	char base[64];
	struct mr_httpc_opts o = {.base_url = base, .token = token, .max_retries = retries,
				  .backoff_initial_ms = 20, .backoff_max_ms = 200,
				  .timeout_ms = 5000};
	struct mr_errbuf eb = {0};

	snprintf(base, sizeof(base), "http://127.0.0.1:%d/", port);
	cr_assert_eq(mr_httpc_init(c, &o, &eb), 0, "init: %s", eb.msg);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

Test(httpc, roundtrip_headers_and_etag)
{
	struct mr_httpd *srv = start_on(0);
	struct mr_httpc c;
	const char *extra[] = {"If-Match: \"3\"", NULL};
	struct mr_httpc_req req = {.method = "PUT", .path = "/echo?q=a%20b", .body = "val",
				   .body_len = 3, .content_type = "text/plain",
				   .headers = extra, .max_retries = -1};
	struct mr_http_resp resp;
	struct mr_errbuf eb = {0};
	json_t *j;

	client(&c, mr_httpd_port(srv), "s3cret", -1);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), 0, "%s", eb.msg);
	cr_assert_eq(resp.status, 200);
	cr_assert_str_eq(resp.etag, "\"3\"");
	cr_assert_eq(resp.attempts, 1);
	cr_assert_eq(resp.connects, 1);
	j = json_loadb(resp.body, resp.len, 0, NULL);
	cr_assert_not_null(j, "body %s", resp.body);
	cr_assert_str_eq(json_string_value(json_object_get(j, "method")), "PUT");
	cr_assert_str_eq(json_string_value(json_object_get(j, "body")), "val");
	cr_assert_str_eq(json_string_value(json_object_get(j, "auth")), "Bearer s3cret");
	cr_assert_str_eq(json_string_value(json_object_get(j, "if_match")), "\"3\"");
	cr_assert_str_eq(json_string_value(json_object_get(j, "ct")), "text/plain");
	cr_assert_str_eq(json_string_value(json_object_get(j, "q")), "a b");
	json_decref(j);
	mr_http_resp_release(&resp);
	mr_httpc_release(&c);
	mr_httpd_stop(srv);
}

Test(httpc, json_helper_and_no_token)
{
	struct mr_httpd *srv = start_on(0);
	struct mr_httpc c;
	struct mr_errbuf eb = {0};
	json_t *body = json_pack("{s:i}", "n", 5), *out = NULL;
	struct mr_httpc_req req = {.path = "/echo", .max_retries = -1};
	struct mr_http_resp resp;
	long status = 0;
	int i;

	client(&c, mr_httpd_port(srv), NULL, -1);
	for (i = 0; i < 3; i++) { /* the same client serves calls in a row */
		cr_assert_eq(mr_httpc_json(&c, "POST", "/echo", body, 0, &status, &out, &eb), 0,
			     "%s", eb.msg);
		cr_assert_eq(status, 200);
		cr_assert_str_eq(json_string_value(json_object_get(out, "body")), "{\"n\":5}");
		cr_assert_str_eq(json_string_value(json_object_get(out, "ct")), "application/json");
		cr_assert(json_is_null(json_object_get(out, "auth")));
		json_decref(out);
	}
	cr_assert_eq(mr_httpc_json(&c, "GET", "/echo", NULL, 0, &status, &out, &eb), 0);
	cr_assert_str_eq(json_string_value(json_object_get(out, "method")), "GET");
	json_decref(out);
	/* keep-alive: after all those calls, still no new connection */
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), 0);
	cr_assert_eq(resp.connects, 0, "connection was not kept alive");
	mr_http_resp_release(&resp);
	json_decref(body);
	mr_httpc_release(&c);
	mr_httpd_stop(srv);
}

struct later {
	int port;
	int delay_ms;
	struct mr_httpd *srv;
};

static void *start_later(void *arg)
{
	struct later *l = arg;

	usleep((useconds_t)l->delay_ms * 1000);
	l->srv = start_on(l->port);
	return NULL;
}

Test(httpc, retries_until_server_comes_up)
{
	struct later l = {.port = free_port(), .delay_ms = 300};
	struct mr_httpc c;
	struct mr_httpc_req req = {.path = "/echo", .max_retries = -1};
	struct mr_http_resp resp;
	struct mr_errbuf eb = {0};
	pthread_t t;

	client(&c, l.port, NULL, 30);
	pthread_create(&t, NULL, start_later, &l);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), 0, "%s", eb.msg);
	pthread_join(t, NULL);
	cr_assert_eq(resp.status, 200);
	cr_assert_gt(resp.attempts, 1, "server was down, yet %d attempt(s)", resp.attempts);
	mr_http_resp_release(&resp);
	mr_httpc_release(&c);
	mr_httpd_stop(l.srv);
}

Test(httpc, gives_up_after_max_retries)
{
	struct mr_httpc c;
	struct mr_httpc_req req = {.path = "/echo", .max_retries = 3};
	struct mr_http_resp resp;
	struct mr_errbuf eb = {0};
	double t0 = now_s();

	client(&c, free_port(), NULL, 30);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), MR_ECONN);
	cr_assert_eq(resp.attempts, 4);
	cr_assert_null(resp.body);
	cr_assert(strstr(eb.msg, "/echo") != NULL, "msg: %s", eb.msg);
	/* backoff caps are 20, 40, 80 ms: at most 140 ms of sleeping */
	cr_assert_lt(now_s() - t0, 2.0);
	mr_httpc_release(&c);
}

Test(httpc, status_503_retried_404_not)
{
	struct mr_httpd *srv = start_on(0);
	struct mr_httpc c;
	struct mr_httpc_req req = {.path = "/flaky", .max_retries = -1};
	struct mr_http_resp resp;
	struct mr_errbuf eb = {0};

	client(&c, mr_httpd_port(srv), NULL, 5);
	atomic_store(&flaky_left, 2);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), 0, "%s", eb.msg);
	cr_assert_eq(resp.status, 200);
	cr_assert_eq(resp.attempts, 3);
	cr_assert_str_eq(resp.body, "ok");
	mr_http_resp_release(&resp);

	/* retries exhausted on 503: the last answer comes back as is */
	atomic_store(&flaky_left, 100);
	req.max_retries = 1;
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), 0, "%s", eb.msg);
	cr_assert_eq(resp.status, 503);
	cr_assert_eq(resp.attempts, 2);
	cr_assert(strstr(resp.body, "unavailable") != NULL);
	mr_http_resp_release(&resp);

	atomic_store(&hits, 0);
	req.path = "/missing";
	req.max_retries = -1;
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), 0, "%s", eb.msg);
	cr_assert_eq(resp.status, 404);
	cr_assert_eq(resp.attempts, 1);
	cr_assert_eq(atomic_load(&hits), 1);
	mr_http_resp_release(&resp);
	mr_httpc_release(&c);
	mr_httpd_stop(srv);
}

Test(httpc, timeout)
{
	struct mr_httpd *srv = start_on(0);
	struct mr_httpc c;
	struct mr_httpc_req req = {.path = "/slow", .timeout_ms = 300, .max_retries = 0};
	struct mr_http_resp resp;
	struct mr_errbuf eb = {0};
	double t0 = now_s(), dt;

	client(&c, mr_httpd_port(srv), NULL, 5);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), MR_ETIMEDOUT, "%s", eb.msg);
	dt = now_s() - t0;
	cr_assert(dt >= 0.25 && dt < 2.0, "timed out after %.2fs", dt);
	cr_assert(strstr(eb.msg, "timed out") != NULL, "msg: %s", eb.msg);
	mr_httpc_release(&c);
	mr_httpd_stop(srv);
}

struct abort_ctx {
	struct mr_httpc *c;
	int delay_ms;
};

static void *abort_later(void *arg)
{
	struct abort_ctx *a = arg;

	usleep((useconds_t)a->delay_ms * 1000);
	mr_httpc_abort(a->c);
	return NULL;
}

Test(httpc, abort_unblocks_long_request)
{
	struct mr_httpd *srv = start_on(0);
	struct mr_httpc c;
	struct mr_httpc_req req = {.path = "/slow", .timeout_ms = 20000, .max_retries = -1};
	struct mr_http_resp resp;
	struct mr_errbuf eb = {0};
	struct abort_ctx a = {.c = &c, .delay_ms = 200};
	pthread_t t;
	double t0 = now_s(), dt;

	client(&c, mr_httpd_port(srv), NULL, 5);
	pthread_create(&t, NULL, abort_later, &a);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), MR_EABORTED, "%s", eb.msg);
	dt = now_s() - t0;
	pthread_join(t, NULL);
	cr_assert(dt >= 0.15 && dt < 1.0, "abort took %.2fs", dt);
	/* sticky: later calls fail at once until cleared */
	req.path = "/echo";
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), MR_EABORTED);
	mr_httpc_clear_abort(&c);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), 0);
	cr_assert_eq(resp.status, 200);
	mr_http_resp_release(&resp);
	mr_httpc_release(&c);
	mr_httpd_stop(srv);
}

Test(httpc, abort_interrupts_backoff)
{
	struct mr_httpc c;
	char base[64];
	struct mr_httpc_opts o = {.base_url = base, .max_retries = 1000,
				  .backoff_initial_ms = 5000, .backoff_max_ms = 5000};
	struct mr_httpc_req req = {.path = "/echo", .max_retries = -1};
	struct mr_http_resp resp;
	struct mr_errbuf eb = {0};
	struct abort_ctx a = {.c = &c, .delay_ms = 300};
	pthread_t t;
	double t0 = now_s(), dt;

	snprintf(base, sizeof(base), "http://127.0.0.1:%d", free_port());
	cr_assert_eq(mr_httpc_init(&c, &o, &eb), 0);
	pthread_create(&t, NULL, abort_later, &a);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), MR_EABORTED, "%s", eb.msg);
	dt = now_s() - t0;
	pthread_join(t, NULL);
	cr_assert_lt(dt, 1.0, "abort took %.2fs", dt);
	mr_httpc_release(&c);
}

Test(httpc, response_size_cap)
{
	struct mr_httpd *srv = start_on(0);
	struct mr_httpc c;
	char base[64];
	struct mr_httpc_opts o = {.base_url = base, .max_response = 16};
	struct mr_httpc_req req = {.path = "/echo", .max_retries = -1};
	struct mr_http_resp resp;
	struct mr_errbuf eb = {0};

	snprintf(base, sizeof(base), "http://127.0.0.1:%d", mr_httpd_port(srv));
	cr_assert_eq(mr_httpc_init(&c, &o, &eb), 0);
	cr_assert_eq(mr_httpc_request(&c, &req, &resp, &eb), MR_ELIMIT, "%s", eb.msg);
	cr_assert_eq(resp.attempts, 1);
	mr_httpc_release(&c);
	mr_httpd_stop(srv);
}

Test(httpc, init_requires_base_url)
{
	struct mr_httpc c;
	struct mr_httpc_opts o = {0};
	struct mr_errbuf eb = {0};

	cr_assert_eq(mr_httpc_init(&c, &o, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "base_url");
	mr_httpc_release(&c);
}
