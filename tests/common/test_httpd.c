/*
 * test_httpd.c - mr_httpd against real clients on loopback: libcurl for
 * ordinary requests, raw sockets for slow and limit-probing clients.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "mr_httpd.h"
#include "proc.h"

/* ---- client helpers ------------------------------------------------------- */

struct buf {
	char data[65536];
	size_t len;
};

static size_t on_write(char *p, size_t sz, size_t n, void *ud)
{
	struct buf *b = ud;
	size_t k = sz * n;

	if (k > sizeof(b->data) - 1 - b->len)
		k = sizeof(b->data) - 1 - b->len;
	memcpy(b->data + b->len, p, k);
	b->len += k;
	b->data[b->len] = '\0';
	return sz * n;
}

static void setup_easy(CURL *c, const char *method, int port, const char *path,
		       const char *body, struct curl_slist *hdrs, struct buf *out)
{
	char url[512];

	snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
	out->len = 0;
	out->data[0] = '\0';
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	if (body) {
		curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
	} else {
		curl_easy_setopt(c, CURLOPT_HTTPGET, 1L);
		curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
	}
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, out);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
}

/* One request on a fresh handle; returns the status, 0 on transport error. */
static long http(const char *method, int port, const char *path, const char *body,
		 const char *hdr, struct buf *out)
{
	CURL *c = curl_easy_init();
	struct curl_slist *h = NULL;
	long status = 0;

	h = curl_slist_append(h, "Expect:");
	if (hdr)
		h = curl_slist_append(h, hdr);
	setup_easy(c, method, port, path, body, h, out);
	if (curl_easy_perform(c) == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	return status;
}

/* Waits up to ms for fd to be readable; returns recv()'s result, or -2 on
 * timeout. */
static ssize_t raw_recv(int fd, char *buf, size_t n, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};

	if (poll(&p, 1, ms) <= 0)
		return -2;
	return recv(fd, buf, n, 0);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- server under test ------------------------------------------------------ */

#define MAXW 256

struct state {
	atomic_int handled;
	atomic_int suspended_n;
	atomic_int release; /* tick replies to all waiters once set */
	double wait_until;  /* tick replies once now_s() passes this (0 = off) */
	struct mr_http_req *waiters[MAXW];
	int nw;
	pthread_t loop_tid;
	atomic_int loop_tid_set;
	atomic_int posted_ran_on_loop;
};

static struct state st;

static void handler(struct mr_http_req *req, void *user)
{
	struct state *s = user;
	const char *path = mr_http_req_path(req);
	size_t len;
	const char *body = mr_http_req_body(req, &len);

	atomic_fetch_add(&s->handled, 1);
	if (!atomic_load(&s->loop_tid_set)) {
		s->loop_tid = pthread_self();
		atomic_store(&s->loop_tid_set, 1);
	}
	if (strcmp(path, "/echo") == 0) {
		char out[4096];
		int n = snprintf(out, sizeof(out), "%s %zu %s", mr_http_req_method_str(req), len,
				 body);

		if (n >= (int)sizeof(out))
			n = (int)sizeof(out) - 1;
		mr_http_add_header(req, "ETag", "\"7\"");
		mr_http_reply(req, 200, NULL, out, (size_t)n);
	} else if (strncmp(path, "/q/", 3) == 0) {
		const char *a = mr_http_req_query(req, "a");
		const char *b = mr_http_req_query(req, "b");
		const char *c = mr_http_req_query(req, "c");
		const char *h = mr_http_req_header(req, "x-test");

		mr_http_reply_json(req, 200,
				   json_pack("{s:s,s:s?,s:s?,s:s?,s:s?,s:s?,s:s}", "path", path,
					     "a", a, "b", b, "c", c, "missing",
					     mr_http_req_query(req, "zz"), "hdr", h, "peer",
					     mr_http_req_peer(req)));
	} else if (strcmp(path, "/json") == 0) {
		struct mr_errbuf eb = {0};
		json_t *o;

		if (mr_http_req_json(req, &o, &eb) != 0) {
			mr_http_reply_error(req, 400, "invalid_json", eb.field, NULL, "%s", eb.msg);
			return;
		}
		mr_http_reply_json(req, 200, o);
	} else if (strcmp(path, "/wait") == 0) {
		cr_assert_lt(s->nw, MAXW);
		s->waiters[s->nw++] = req;
		mr_http_req_set_user(req, (void *)(intptr_t)s->nw);
		mr_http_suspend(req);
		atomic_fetch_add(&s->suspended_n, 1);
	} else if (strcmp(path, "/suspend-and-reply") == 0) {
		mr_http_suspend(req);
		mr_http_reply(req, 200, NULL, "now", 3);
	} else if (strcmp(path, "/noreply") == 0) {
		/* deliberately nothing */
	} else {
		mr_http_reply_error(req, 404, "not_found", "path", json_pack("{s:i}", "generation", 7),
				    "no route for '%s'", path);
	}
}

static void tick(void *user)
{
	struct state *s = user;
	int i;

	if (!atomic_load(&s->release) && !(s->wait_until > 0 && now_s() >= s->wait_until))
		return;
	for (i = 0; i < s->nw; i++) {
		char out[64];
		int n = snprintf(out, sizeof(out), "w%d",
				 (int)(intptr_t)mr_http_req_user(s->waiters[i]));

		mr_http_reply(s->waiters[i], 200, NULL, out, (size_t)n);
	}
	s->nw = 0;
}

static struct mr_httpd *start(struct mr_httpd_opts *o)
{
	struct mr_httpd *srv = NULL;
	struct mr_errbuf eb = {0};

	memset(&st, 0, sizeof(st));
	o->bind_addr = o->bind_addr ? o->bind_addr : "127.0.0.1";
	o->handler = handler;
	o->tick = tick;
	o->user = &st;
	if (!o->tick_ms)
		o->tick_ms = 20;
	cr_assert_eq(mr_httpd_start(&srv, o, &eb), 0, "start: %s", eb.msg);
	cr_assert_gt(mr_httpd_port(srv), 0);
	return srv;
}

/* ---- tests ------------------------------------------------------------------ */

Test(httpd, get_and_post_echo)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	struct buf b;

	cr_assert_eq(http("GET", mr_httpd_port(srv), "/echo", NULL, NULL, &b), 200);
	cr_assert_str_eq(b.data, "GET 0 ");
	cr_assert_eq(http("POST", mr_httpd_port(srv), "/echo", "hello body", NULL, &b), 200);
	cr_assert_str_eq(b.data, "POST 10 hello body");
	cr_assert_eq(http("PUT", mr_httpd_port(srv), "/echo", "x", NULL, &b), 200);
	cr_assert_str_eq(b.data, "PUT 1 x");
	cr_assert_eq(atomic_load(&st.handled), 3);
	mr_httpd_stop(srv);
}

Test(httpd, query_header_and_decoded_path)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	struct buf b;
	json_t *j;

	cr_assert_eq(http("GET", mr_httpd_port(srv), "/q/a%20b?a=1&b&c=x%20y", NULL,
			  "X-Test: hi", &b),
		     200);
	j = json_loads(b.data, 0, NULL);
	cr_assert_not_null(j, "body: %s", b.data);
	cr_assert_str_eq(json_string_value(json_object_get(j, "path")), "/q/a b");
	cr_assert_str_eq(json_string_value(json_object_get(j, "a")), "1");
	cr_assert_str_eq(json_string_value(json_object_get(j, "b")), "");
	cr_assert_str_eq(json_string_value(json_object_get(j, "c")), "x y");
	cr_assert(json_is_null(json_object_get(j, "missing")));
	cr_assert_str_eq(json_string_value(json_object_get(j, "hdr")), "hi");
	cr_assert_str_eq(json_string_value(json_object_get(j, "peer")), "127.0.0.1");
	json_decref(j);
	mr_httpd_stop(srv);
}

Test(httpd, json_body_helper)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	struct buf b;
	json_t *j;

	cr_assert_eq(http("POST", mr_httpd_port(srv), "/json", "{\"k\":[1,2]}", NULL, &b), 200);
	cr_assert_str_eq(b.data, "{\"k\":[1,2]}");
	cr_assert_eq(http("POST", mr_httpd_port(srv), "/json", "{\"k\":", NULL, &b), 400);
	j = json_loads(b.data, 0, NULL);
	cr_assert_not_null(j, "body: %s", b.data);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
			 "invalid_json");
	json_decref(j);
	mr_httpd_stop(srv);
}

Test(httpd, oversized_body_is_413_without_handler)
{
	struct mr_httpd_opts o = {.max_body = 100};
	struct mr_httpd *srv = start(&o);
	char big[201];
	struct buf b;
	json_t *j;

	memset(big, 'x', 200);
	big[200] = '\0';
	cr_assert_eq(http("POST", mr_httpd_port(srv), "/echo", big, NULL, &b), 413);
	j = json_loads(b.data, 0, NULL);
	cr_assert_not_null(j, "body: %s", b.data);
	cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
			 "body_too_large");
	json_decref(j);
	cr_assert_eq(atomic_load(&st.handled), 0);
	big[100] = '\0'; /* exactly the limit is fine */
	cr_assert_eq(http("POST", mr_httpd_port(srv), "/echo", big, NULL, &b), 200);
	cr_assert_eq(atomic_load(&st.handled), 1);
	mr_httpd_stop(srv);
}

Test(httpd, chunked_oversized_body_is_413)
{
	struct mr_httpd_opts o = {.max_body = 100};
	struct mr_httpd *srv = start(&o);
	char buf[1024];
	const char *req = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
			  "50\r\n"
			  "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
			  "\r\n50\r\n"
			  "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
			  "\r\n0\r\n\r\n";
	int fd = mr_test_connect_ok(mr_httpd_port(srv));
	ssize_t n;

	cr_assert_eq(send(fd, req, strlen(req), 0), (ssize_t)strlen(req));
	n = raw_recv(fd, buf, sizeof(buf) - 1, 5000);
	cr_assert_gt(n, 0);
	buf[n] = '\0';
	cr_assert(strncmp(buf, "HTTP/1.1 413", 12) == 0, "got: %s", buf);
	cr_assert_eq(atomic_load(&st.handled), 0);
	close(fd);
	mr_httpd_stop(srv);
}

Test(httpd, error_shape_404)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	struct buf b;
	json_t *j, *e;

	cr_assert_eq(http("GET", mr_httpd_port(srv), "/nope", NULL, NULL, &b), 404);
	j = json_loads(b.data, 0, NULL);
	cr_assert_not_null(j, "body: %s", b.data);
	e = json_object_get(j, "error");
	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "not_found");
	cr_assert_str_eq(json_string_value(json_object_get(e, "message")), "no route for '/nope'");
	cr_assert_str_eq(json_string_value(json_object_get(e, "field")), "path");
	cr_assert_eq(json_integer_value(json_object_get(j, "generation")), 7);
	json_decref(j);
	mr_httpd_stop(srv);
}

Test(httpd, handler_without_reply_gets_500)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	struct buf b;

	cr_assert_eq(http("GET", mr_httpd_port(srv), "/noreply", NULL, NULL, &b), 500);
	cr_assert(strstr(b.data, "did not reply") != NULL, "body: %s", b.data);
	cr_assert_eq(http("GET", mr_httpd_port(srv), "/suspend-and-reply", NULL, NULL, &b), 200);
	cr_assert_str_eq(b.data, "now");
	mr_httpd_stop(srv);
}

Test(httpd, long_poll_reply_from_tick_survives_idle_timeout)
{
	struct mr_httpd_opts o = {.idle_timeout_s = 1};
	struct mr_httpd *srv = start(&o);
	struct buf b;
	double t0 = now_s(), dt;

	st.wait_until = t0 + 2.2; /* longer than the idle timeout */
	cr_assert_eq(http("GET", mr_httpd_port(srv), "/wait", NULL, NULL, &b), 200);
	dt = now_s() - t0;
	cr_assert_str_eq(b.data, "w1");
	cr_assert_geq(dt, 2.1, "replied after %.2fs", dt);
	cr_assert_lt(dt, 4.0, "replied after %.2fs", dt);
	mr_httpd_stop(srv);
}

Test(httpd, keep_alive_across_long_poll)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	CURL *c = curl_easy_init();
	struct curl_slist *h = curl_slist_append(NULL, "Expect:");
	struct buf b;
	long status = 0, connects = 0, total = 0;
	int i;

	for (i = 0; i < 4; i++) {
		if (i == 1)
			st.wait_until = now_s() + 0.2;
		setup_easy(c, i == 2 ? "POST" : "GET", mr_httpd_port(srv),
			   i == 1 ? "/wait" : "/echo", i == 2 ? "kv" : NULL, h, &b);
		cr_assert_eq(curl_easy_perform(c), CURLE_OK);
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
		cr_assert_eq(status, 200);
		curl_easy_getinfo(c, CURLINFO_NUM_CONNECTS, &connects);
		total += connects;
	}
	cr_assert_eq(total, 1, "%ld connections for 4 requests", total);
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	mr_httpd_stop(srv);
}

Test(httpd, many_suspended_resumed_at_once)
{
	enum { N = 200 };
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	CURLM *m = curl_multi_init();
	CURL *e[N];
	static struct buf bufs[N];
	struct curl_slist *h = curl_slist_append(NULL, "Expect:");
	int i, running = 1, ok = 0;
	double t0;

	for (i = 0; i < N; i++) {
		e[i] = curl_easy_init();
		setup_easy(e[i], "GET", mr_httpd_port(srv), "/wait", NULL, h, &bufs[i]);
		curl_easy_setopt(e[i], CURLOPT_PRIVATE, (void *)(intptr_t)i);
		curl_multi_add_handle(m, e[i]);
	}
	t0 = now_s();
	while (atomic_load(&st.suspended_n) < N && now_s() - t0 < 20) {
		curl_multi_perform(m, &running);
		curl_multi_poll(m, NULL, 0, 20, NULL);
	}
	cr_assert_eq(atomic_load(&st.suspended_n), N);
	atomic_store(&st.release, 1);
	while (running && now_s() - t0 < 30) {
		curl_multi_perform(m, &running);
		curl_multi_poll(m, NULL, 0, 20, NULL);
	}
	cr_assert_eq(running, 0);
	{
		/* every client got a reply, and all replies are distinct */
		static char seen[N + 1];
		CURLMsg *msg;
		int left;

		while ((msg = curl_multi_info_read(m, &left))) {
			long status = 0;
			intptr_t idx;
			int w;

			cr_assert_eq(msg->data.result, CURLE_OK);
			curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
			curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&idx);
			cr_assert_eq(status, 200);
			cr_assert_eq(sscanf(bufs[idx].data, "w%d", &w), 1);
			cr_assert(w >= 1 && w <= N && !seen[w], "reply %s", bufs[idx].data);
			seen[w] = 1;
			ok++;
		}
	}
	cr_assert_eq(ok, N);
	for (i = 0; i < N; i++) {
		curl_multi_remove_handle(m, e[i]);
		curl_easy_cleanup(e[i]);
	}
	curl_multi_cleanup(m);
	curl_slist_free_all(h);
	mr_httpd_stop(srv);
}

static void posted(void *arg)
{
	struct state *s = arg;

	atomic_store(&s->posted_ran_on_loop,
		     atomic_load(&s->loop_tid_set) && pthread_equal(s->loop_tid, pthread_self()) ? 1
											: -1);
}

static void *post_thread(void *arg)
{
	struct mr_httpd *srv = arg;

	cr_assert_eq(mr_httpd_post(srv, posted, &st), 0);
	return NULL;
}

Test(httpd, post_runs_on_loop_thread)
{
	struct mr_httpd_opts o = {.tick_ms = 5000}; /* the post must wake the loop */
	struct mr_httpd *srv = start(&o);
	struct buf b;
	pthread_t t;
	double t0;

	cr_assert_eq(http("GET", mr_httpd_port(srv), "/echo", NULL, NULL, &b), 200);
	cr_assert(atomic_load(&st.loop_tid_set));
	t0 = now_s();
	pthread_create(&t, NULL, post_thread, srv);
	pthread_join(t, NULL);
	while (atomic_load(&st.posted_ran_on_loop) == 0 && now_s() - t0 < 5)
		usleep(1000);
	cr_assert_eq(atomic_load(&st.posted_ran_on_loop), 1);
	cr_assert_lt(now_s() - t0, 1.0, "post took %.2fs", now_s() - t0);
	cr_assert(!pthread_equal(st.loop_tid, pthread_self()));
	mr_httpd_stop(srv);
}

Test(httpd, slowloris_dropped_after_idle_timeout)
{
	struct mr_httpd_opts o = {.idle_timeout_s = 1};
	struct mr_httpd *srv = start(&o);
	const char *part = "GET /echo HTTP/1.1\r\nHost: x\r\nX-Slow: ";
	int fd = mr_test_connect_ok(mr_httpd_port(srv));
	char buf[256];
	struct buf b;
	double t0 = now_s(), dt;
	ssize_t n;

	cr_assert_eq(send(fd, part, strlen(part), 0), (ssize_t)strlen(part));
	/* a normal client is served while the slow one dangles */
	cr_assert_eq(http("GET", mr_httpd_port(srv), "/echo", NULL, NULL, &b), 200);
	cr_assert_lt(now_s() - t0, 0.8);
	n = raw_recv(fd, buf, sizeof(buf), 5000);
	dt = now_s() - t0;
	cr_assert(n == 0 || (n < 0 && n != -2), "slow connection not closed (n=%zd)", n);
	cr_assert_geq(dt, 0.9, "closed after %.2fs", dt);
	cr_assert_lt(dt, 3.5, "closed after %.2fs", dt);
	close(fd);
	mr_httpd_stop(srv);
}

struct stop_ctx {
	struct mr_httpd *srv;
	double took;
};

Test(httpd, stop_answers_suspended_503)
{
	enum { N = 5 };
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	int fd[N], i;
	const char *req = "GET /wait HTTP/1.1\r\nHost: x\r\n\r\n";
	char buf[1024];
	double t0;

	for (i = 0; i < N; i++) {
		fd[i] = mr_test_connect_ok(mr_httpd_port(srv));
		cr_assert_eq(send(fd[i], req, strlen(req), 0), (ssize_t)strlen(req));
	}
	t0 = now_s();
	while (atomic_load(&st.suspended_n) < N && now_s() - t0 < 5)
		usleep(1000);
	cr_assert_eq(atomic_load(&st.suspended_n), N);
	t0 = now_s();
	mr_httpd_stop(srv);
	cr_assert_lt(now_s() - t0, 2.5, "stop took %.2fs", now_s() - t0);
	for (i = 0; i < N; i++) {
		ssize_t n = raw_recv(fd[i], buf, sizeof(buf) - 1, 1000);

		cr_assert_gt(n, 0, "client %d got no reply", i);
		buf[n] = '\0';
		cr_assert(strncmp(buf, "HTTP/1.1 503", 12) == 0, "got %s", buf);
		cr_assert(strstr(buf, "shutting_down") != NULL, "got %s", buf);
		close(fd[i]);
	}
}

Test(httpd, bad_bind_address_is_an_error)
{
	struct mr_httpd_opts o = {.bind_addr = "not-an-ip", .handler = handler};
	struct mr_httpd *srv = (struct mr_httpd *)1;
	struct mr_errbuf eb = {0};

	cr_assert_eq(mr_httpd_start(&srv, &o, &eb), MR_EINVAL);
	cr_assert_null(srv);
	cr_assert_str_eq(eb.field, "bind_addr");
	mr_httpd_stop(NULL);
}

Test(httpd, port_in_use_is_an_error)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	struct mr_httpd_opts o2 = {.bind_addr = "127.0.0.1", .port = mr_httpd_port(srv),
				   .handler = handler};
	struct mr_httpd *srv2 = NULL;
	struct mr_errbuf eb = {0};

	cr_assert_eq(mr_httpd_start(&srv2, &o2, &eb), MR_EIO);
	cr_assert(strstr(eb.msg, "unable to listen") != NULL, "msg: %s", eb.msg);
	mr_httpd_stop(srv);
}

Test(httpd, per_ip_limit_closes_extra_connections)
{
	struct mr_httpd_opts o = {.per_ip_connections = 1};
	struct mr_httpd *srv = start(&o);
	int a = mr_test_connect_ok(mr_httpd_port(srv));
	int b;
	char buf[64];
	ssize_t n;

	usleep(100000);
	b = mr_test_connect_ok(mr_httpd_port(srv));
	n = raw_recv(b, buf, sizeof(buf), 2000);
	cr_assert(n == 0 || n == -1, "second connection from one ip not closed (n=%zd)", n);
	close(a);
	close(b);
	mr_httpd_stop(srv);
}

static void release_all(void *arg)
{
	struct state *s = arg;

	atomic_store(&s->release, 1);
	tick(s);
}

struct get_ctx {
	int port;
	long status;
	double done;
	struct buf b;
};

static void *get_wait(void *arg)
{
	struct get_ctx *g = arg;

	g->status = http("GET", g->port, "/wait", NULL, NULL, &g->b);
	g->done = now_s();
	return NULL;
}

/* A reply from posted work must go out at once, not at the next tick. */
Test(httpd, reply_from_post_is_sent_without_waiting_for_tick)
{
	struct mr_httpd_opts o = {.tick_ms = 5000};
	struct mr_httpd *srv = start(&o);
	struct get_ctx g = {.port = mr_httpd_port(srv)};
	pthread_t t;
	double t0 = now_s(), posted;

	pthread_create(&t, NULL, get_wait, &g);
	while (atomic_load(&st.suspended_n) < 1 && now_s() - t0 < 5)
		usleep(1000);
	cr_assert_eq(atomic_load(&st.suspended_n), 1);
	posted = now_s();
	cr_assert_eq(mr_httpd_post(srv, release_all, &st), 0);
	pthread_join(t, NULL);
	cr_assert_eq(g.status, 200);
	cr_assert_str_eq(g.b.data, "w1");
	cr_assert_lt(g.done - posted, 0.5, "reply took %.2fs after the post", g.done - posted);
	mr_httpd_stop(srv);
}

Test(httpd, large_body_arrives_whole)
{
	struct mr_httpd_opts o = {.conn_memory = 2048};
	struct mr_httpd *srv = start(&o);
	size_t n = 300000;
	char *big = malloc(n + 1);
	struct buf b;

	memset(big, 'y', n);
	big[n] = '\0';
	cr_assert_eq(http("POST", mr_httpd_port(srv), "/echo", big, NULL, &b), 200);
	cr_assert(strncmp(b.data, "POST 300000 yyyy", 16) == 0, "got %.40s", b.data);
	free(big);
	mr_httpd_stop(srv);
}
