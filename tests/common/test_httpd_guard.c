/*
 * test_httpd_guard.c - what mr_httpd refuses before a handler runs, and
 * how it behaves when full, against a real server on loopback: paths
 * decoded per segment (%00, %2F, malformed escapes, control bytes), query
 * arguments checked the same way, conflicting Content-Length and
 * Transfer-Encoding, and the connection limit (503 "overloaded" at once,
 * /healthz and /metrics still served, a fixed 503 past the reserve).
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mr_httpd.h"
#include "proc.h"

/* ---- server under test ---------------------------------------------------- */

static atomic_int handled;

/* Replies {"path":..., "segs":[...], "a":...} for any path, so tests see
 * exactly what a handler gets. */
static void handler(struct mr_http_req *req, void *user)
{
	size_t n, len, i;
	const char *const *seg = mr_http_req_segments(req, &n);
	json_t *arr = json_array();

	(void)user;
	atomic_fetch_add(&handled, 1);
	for (i = 0; i < n; i++)
		json_array_append_new(arr, json_string(seg[i]));
	cr_assert_null(seg[n]);
	mr_http_req_body(req, &len);
	mr_http_reply_json(req, 200,
			   json_pack("{s:s,s:o,s:s?,s:I}", "path", mr_http_req_path(req), "segs", arr,
				     "a", mr_http_req_query(req, "a"), "body", (json_int_t)len));
}

static struct mr_httpd *start(struct mr_httpd_opts *o)
{
	struct mr_httpd *srv = NULL;
	struct mr_errbuf eb = {0};

	atomic_store(&handled, 0);
	o->bind_addr = "127.0.0.1";
	o->handler = handler;
	cr_assert_eq(mr_httpd_start(&srv, o, &eb), 0, "start: %s", eb.msg);
	return srv;
}

/* ---- raw client ------------------------------------------------------------- */

/* Sends req (NUL-free text) on a new connection and reads the whole reply
 * (every reply here closes the connection or is asked to). */
static int send_raw(int port, const char *req, char *buf, size_t cap)
{
	int status = mr_test_raw_request(port, req, buf, cap);

	cr_assert_geq(status, 0, "unable to connect to port %d", port);
	return status;
}

/* GET path with "Connection: close"; returns the status. */
static int get(int port, const char *path, char *buf, size_t cap)
{
	char req[1024];

	snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		 path);
	return send_raw(port, req, buf, cap);
}

/* The JSON body of a reply in buf. */
static json_t *body_json(const char *buf)
{
	const char *b = strstr(buf, "\r\n\r\n");
	json_t *j = b ? json_loads(b + 4, 0, NULL) : NULL;

	cr_assert_not_null(j, "no JSON body in: %s", buf);
	return j;
}

/* Asserts an error reply: code and field (NULL = null). */
static void expect_error(const char *buf, const char *code, const char *field)
{
	json_t *j = body_json(buf), *e = json_object_get(j, "error");

	cr_assert_str_eq(json_string_value(json_object_get(e, "code")), code, "%s", buf);
	if (field)
		cr_assert_str_eq(json_string_value(json_object_get(e, "field")), field, "%s", buf);
	else
		cr_assert(json_is_null(json_object_get(e, "field")), "%s", buf);
	json_decref(j);
}

/* ---- paths -------------------------------------------------------------------- */

Test(httpd_guard, nul_escape_in_a_segment_is_400_naming_it)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	char buf[4096];

	/* libmicrohttpd alone hands the handler "/kv/victimkey" here */
	cr_assert_eq(get(mr_httpd_port(srv), "/kv/victimkey%00.evil", buf, sizeof(buf)), 400,
		     "%s", buf);
	expect_error(buf, "bad_path", "path[1]");
	cr_assert(strstr(buf, "path segment 1 'victimkey%00.evil'"), "%s", buf);
	cr_assert_eq(get(mr_httpd_port(srv), "/v1/jobs/nul/victim%00zzz", buf, sizeof(buf)), 400);
	expect_error(buf, "bad_path", "path[3]");
	cr_assert_eq(atomic_load(&handled), 0, "the handler ran for a bad path");
	mr_httpd_stop(srv);
}

Test(httpd_guard, each_segment_is_decoded_once_and_2f_stays_inside)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	char buf[4096];
	json_t *j, *segs;

	cr_assert_eq(get(mr_httpd_port(srv), "/kv/a%2Fb/c%20d/%2541/", buf, sizeof(buf)), 200,
		     "%s", buf);
	j = body_json(buf);
	segs = json_object_get(j, "segs");
	cr_assert_eq(json_array_size(segs), 5, "%s", buf);
	cr_assert_str_eq(json_string_value(json_array_get(segs, 0)), "kv");
	cr_assert_str_eq(json_string_value(json_array_get(segs, 1)), "a/b");
	cr_assert_str_eq(json_string_value(json_array_get(segs, 2)), "c d");
	cr_assert_str_eq(json_string_value(json_array_get(segs, 3)), "%41", "decoded once only");
	cr_assert_str_eq(json_string_value(json_array_get(segs, 4)), "");
	cr_assert_str_eq(json_string_value(json_object_get(j, "path")), "/kv/a/b/c d/%41/");
	json_decref(j);
	cr_assert_eq(get(mr_httpd_port(srv), "/", buf, sizeof(buf)), 200);
	j = body_json(buf);
	cr_assert_eq(json_array_size(json_object_get(j, "segs")), 1);
	json_decref(j);
	mr_httpd_stop(srv);
}

Test(httpd_guard, malformed_escapes_and_control_bytes_are_400)
{
	static const struct {
		const char *path, *field, *says;
	} bad[] = {
		{"/a/b%G1", "path[1]", "malformed escape '%G1'"},
		{"/a%4", "path[0]", "malformed escape '%4'"},
		{"/a/%", "path[1]", "malformed escape '%'"},
		{"/x/%1fy", "path[1]", "control character '%1f'"},
		{"/x/y/%7F", "path[2]", "control character '%7F'"},
		{"/x/%0a", "path[1]", "control character"},
		{"/x/a\x01z", "path[1]", "raw control character 0x01"},
		{"http://host/x", "path", "not a path"},
	};
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	char buf[4096];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert_eq(get(mr_httpd_port(srv), bad[i].path, buf, sizeof(buf)), 400,
			     "%s: %s", bad[i].path, buf);
		expect_error(buf, "bad_path", bad[i].field);
		cr_assert(strstr(buf, bad[i].says), "%s: %s", bad[i].path, buf);
	}
	cr_assert_eq(atomic_load(&handled), 0);
	/* a well-formed escape of a printable byte is fine */
	cr_assert_eq(get(mr_httpd_port(srv), "/x/%41%7e", buf, sizeof(buf)), 200);
	cr_assert(strstr(buf, "\"path\":\"/x/A~\""), "%s", buf);
	mr_httpd_stop(srv);
}

Test(httpd_guard, query_arguments_are_checked_the_same_way)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	char buf[4096];

	cr_assert_eq(get(mr_httpd_port(srv), "/q?b=1&a=x%00y", buf, sizeof(buf)), 400, "%s", buf);
	expect_error(buf, "bad_query", "a");
	cr_assert_eq(get(mr_httpd_port(srv), "/q?a=%zz", buf, sizeof(buf)), 400);
	expect_error(buf, "bad_query", "a");
	cr_assert_eq(get(mr_httpd_port(srv), "/q?a%00b=1", buf, sizeof(buf)), 400);
	expect_error(buf, "bad_query", "query");
	cr_assert_eq(get(mr_httpd_port(srv), "/q?=%00", buf, sizeof(buf)), 400);
	expect_error(buf, "bad_query", "query"); /* an empty name is no field */
	cr_assert_eq(get(mr_httpd_port(srv), "/q?a=1%1b", buf, sizeof(buf)), 400);
	cr_assert_eq(atomic_load(&handled), 0);
	cr_assert_eq(get(mr_httpd_port(srv), "/q?a=x+y%2B%26", buf, sizeof(buf)), 200);
	cr_assert(strstr(buf, "\"a\":\"x y+&\""), "%s", buf);
	mr_httpd_stop(srv);
}

/* ---- framing ------------------------------------------------------------------- */

Test(httpd_guard, conflicting_content_length_is_400)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	char buf[4096];

	cr_assert_eq(send_raw(mr_httpd_port(srv),
			      "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
			      "Content-Length: 5\r\n\r\nabcde",
			      buf, sizeof(buf)),
		     400, "%s", buf);
	expect_error(buf, "bad_request", "Content-Length");
	cr_assert(strstr(buf, "Connection: close"), "%s", buf);
	cr_assert_eq(atomic_load(&handled), 0);
	/* identical repeats are one value (RFC 9112 section 6.3) */
	cr_assert_eq(send_raw(mr_httpd_port(srv),
			      "PUT /k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			      "Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
			      buf, sizeof(buf)),
		     200, "%s", buf);
	cr_assert(strstr(buf, "\"body\":3"), "%s", buf);
	mr_httpd_stop(srv);
}

Test(httpd_guard, transfer_encoding_rules)
{
	struct mr_httpd_opts o = {0};
	struct mr_httpd *srv = start(&o);
	char buf[4096];

	cr_assert_eq(send_raw(mr_httpd_port(srv),
			      "PUT /k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
			      "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			      buf, sizeof(buf)),
		     400, "%s", buf);
	expect_error(buf, "bad_request", "Transfer-Encoding");
	/* libmicrohttpd alone reads this body until the client closes */
	cr_assert_eq(send_raw(mr_httpd_port(srv),
			      "PUT /k HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc", buf,
			      sizeof(buf)),
		     501, "%s", buf);
	expect_error(buf, "not_implemented", "Transfer-Encoding");
	cr_assert_eq(atomic_load(&handled), 0);
	cr_assert_eq(send_raw(mr_httpd_port(srv),
			      "PUT /k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			      "Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			      buf, sizeof(buf)),
		     200, "%s", buf);
	cr_assert(strstr(buf, "\"body\":3"), "%s", buf);
	mr_httpd_stop(srv);
}

/* ---- connection limit ----------------------------------------------------------- */

/* Opens n idle connections and waits until the server holds them (a probe
 * request on a further connection only gets through after the loop has
 * accepted the ones before it). */
static void fill(int port, int *fds, int n)
{
	for (int i = 0; i < n; i++)
		fds[i] = mr_test_connect_ok(port);
	usleep(200000);
}

Test(httpd_guard, over_the_limit_503_at_once_and_probes_answer)
{
	struct mr_httpd_opts o = {.max_connections = 3};
	struct mr_httpd *srv = start(&o);
	int port = mr_httpd_port(srv), idle[3];
	char buf[4096];

	fill(port, idle, 3);
	/* an ordinary request: an immediate 503, not a wait in the backlog */
	cr_assert_eq(get(port, "/v1/jobs", buf, sizeof(buf)), 503, "%s", buf);
	expect_error(buf, "overloaded", NULL);
	cr_assert(strstr(buf, "Retry-After: 1\r\n"), "%s", buf);
	cr_assert_eq(atomic_load(&handled), 0);
	/* the operational paths are still served, on reserve slots */
	cr_assert_eq(get(port, "/healthz", buf, sizeof(buf)), 200, "%s", buf);
	cr_assert_eq(get(port, "/metrics", buf, sizeof(buf)), 200, "%s", buf);
	cr_assert_eq(get(port, "/readyz?verbose=1", buf, sizeof(buf)), 200, "%s", buf);
	cr_assert_eq(atomic_load(&handled), 3);
	/* the idle connections are real ones */
	cr_assert_eq(send(idle[0], "GET /x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 47, 0),
		     47);
	mr_test_read_all(idle[0], buf, sizeof(buf));
	cr_assert(strncmp(buf, "HTTP/1.1 200", 12) == 0, "%s", buf);
	close(idle[0]);
	/* and a freed slot serves ordinary requests again */
	usleep(200000);
	cr_assert_eq(get(port, "/v1/jobs", buf, sizeof(buf)), 200, "%s", buf);
	close(idle[1]);
	close(idle[2]);
	mr_httpd_stop(srv);
}

Test(httpd_guard, past_the_reserve_a_fixed_503_and_close)
{
	/* the idle reserve client must hold its slot for the whole test */
	struct mr_httpd_opts o = {.max_connections = 1, .reserve_connections = 1,
				  .reserve_request_s = 60};
	struct mr_httpd *srv = start(&o);
	int port = mr_httpd_port(srv), idle[2], fd;
	char buf[4096];

	fill(port, idle, 2); /* the one slot and the one reserve slot */
	/* nothing sent: the reply comes without the request being read */
	fd = mr_test_connect_ok(port);
	mr_test_read_all(fd, buf, sizeof(buf));
	close(fd);
	cr_assert(strncmp(buf, "HTTP/1.1 503", 12) == 0, "%s", buf);
	expect_error(buf, "overloaded", NULL);
	cr_assert(strstr(buf, "Retry-After: 1\r\n"), "%s", buf);
	/* a probe that did send gets the same */
	cr_assert_eq(get(port, "/healthz", buf, sizeof(buf)), 503, "%s", buf);
	/* a freed reserve slot serves probes again */
	close(idle[1]);
	usleep(200000);
	cr_assert_eq(get(port, "/healthz", buf, sizeof(buf)), 200, "%s", buf);
	close(idle[0]);
	mr_httpd_stop(srv);
}

Test(httpd_guard, an_idle_reserve_slot_is_reclaimed_first)
{
	struct mr_httpd_opts o = {.max_connections = 1, .reserve_connections = 1,
				  .idle_timeout_s = 60};
	struct mr_httpd *srv = start(&o);
	int port = mr_httpd_port(srv), idle[2];
	struct pollfd p = {.events = POLLIN};
	char buf[4096];

	fill(port, idle, 2);
	/* the reserve slot is closed after at most 5 s (idle) or 2 s (its
	 * request is due), the ordinary one not */
	p.fd = idle[1];
	cr_assert_eq(poll(&p, 1, 10000), 1, "idle reserve connection kept open");
	cr_assert_eq(recv(idle[1], buf, sizeof(buf), 0), 0);
	p.fd = idle[0];
	cr_assert_eq(poll(&p, 1, 0), 0, "the ordinary connection was closed too");
	close(idle[1]);
	usleep(200000);
	cr_assert_eq(get(port, "/healthz", buf, sizeof(buf)), 200, "%s", buf);
	close(idle[0]);
	mr_httpd_stop(srv);
}
