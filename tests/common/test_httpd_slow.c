/*
 * test_httpd_slow.c - the deadlines of mr_httpd against slow clients on
 * loopback (issue 26): headers trickled a byte at a time (slowloris) are
 * cut at the header deadline and the probes answer again, a reserve slot
 * must send its request at once, a trickled body is cut, a steady upload
 * above the minimum rate is not, an idle keep-alive connection gets the
 * header deadline from the end of its last request, and a long-poll
 * outlives every deadline.
 *
 * Bounds are generous (a busy 2-core machine, sanitizers): a test waits
 * "until it happens" up to many times the deadline it checks.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "mr_httpd.h"
#include "proc.h"

/* ---- server under test ---------------------------------------------------- */

static atomic_int handled;
static atomic_llong wait_until_ms; /* tick answers the parked request past it */
static struct mr_http_req *parked;

/* /wait parks the request until wait_until_ms; anything else gets
 * {"path":..., "body":<bytes>}. */
static void handler(struct mr_http_req *req, void *user)
{
	size_t len;

	(void)user;
	atomic_fetch_add(&handled, 1);
	if (!strcmp(mr_http_req_path(req), "/wait") && !parked) {
		parked = req;
		mr_http_suspend(req);
		return;
	}
	mr_http_req_body(req, &len);
	mr_http_reply_json(req, 200, json_pack("{s:s,s:I}", "path", mr_http_req_path(req),
					       "body", (json_int_t)len));
}

static void tick(void *user)
{
	(void)user;
	if (parked && mr_test_now_ms() >= atomic_load(&wait_until_ms)) {
		mr_http_reply(parked, 200, NULL, "woke", 4);
		parked = NULL;
	}
}

static struct mr_httpd *start(struct mr_httpd_opts *o)
{
	struct mr_httpd *srv = NULL;
	struct mr_errbuf eb = {0};

	atomic_store(&handled, 0);
	parked = NULL;
	o->bind_addr = "127.0.0.1";
	o->handler = handler;
	o->tick = tick;
	o->tick_ms = 20;
	cr_assert_eq(mr_httpd_start(&srv, o, &eb), 0, "start: %s", eb.msg);
	return srv;
}

/* ---- raw clients ------------------------------------------------------------- */

/* What a slow socket has seen so far. */
enum { OPEN, CLOSED_SILENT, CLOSED_AFTER_REPLY };

struct slow {
	int fd, state;
	size_t sent;      /* bytes of the request sent */
	int got_reply;    /* bytes came back before the end */
	char head[16];    /* the first bytes that came back */
};

/* Reads what is there without waiting (up to ms when ms > 0); updates
 * s->state: the end of the stream or a reset from the server closes it. */
static void slow_poll(struct slow *s, int ms)
{
	struct pollfd p = {.fd = s->fd, .events = POLLIN};
	char buf[4096];

	if (s->state != OPEN || poll(&p, 1, ms) <= 0)
		return;
	for (;;) {
		ssize_t n = recv(s->fd, buf, sizeof(buf), MSG_DONTWAIT);

		if (n > 0) {
			if (!s->got_reply)
				memcpy(s->head, buf, (size_t)n < sizeof(s->head) - 1 ? (size_t)n :
								sizeof(s->head) - 1);
			s->got_reply = 1;
			continue;
		}
		if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
			s->state = s->got_reply ? CLOSED_AFTER_REPLY : CLOSED_SILENT;
		return;
	}
}

/* Sends the next byte of req on s (nothing once all is sent); a failed
 * send means the server closed it. */
static void slow_send(struct slow *s, const char *req)
{
	if (s->state != OPEN || !req[s->sent])
		return;
	if (send(s->fd, req + s->sent, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1)
		s->sent++;
	else if (errno != EAGAIN && errno != EWOULDBLOCK)
		s->state = s->got_reply ? CLOSED_AFTER_REPLY : CLOSED_SILENT;
}

/* GET path with Connection: close on a fresh connection; the status. */
static int get(int port, const char *path)
{
	char req[256], buf[4096];

	snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
		 path);
	return mr_test_raw_request(port, req, buf, sizeof(buf));
}

/* Waits up to ms for the server to end the stream on fd: 1 if it did (end
 * or reset), 0 if fd is still open. Data that comes first is read into
 * buf (NUL-terminated). */
static int closed_within(int fd, int ms, char *buf, size_t cap)
{
	long long end = mr_test_now_ms() + ms;
	size_t got = 0;

	buf[0] = '\0';
	while (mr_test_now_ms() < end) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		ssize_t n;

		if (poll(&p, 1, 100) <= 0)
			continue;
		n = recv(fd, buf + got, cap - 1 - got, 0);
		if (n <= 0)
			return 1;
		got += (size_t)n;
		buf[got] = '\0';
		if (got == cap - 1)
			got = 0; /* keep reading, keep the tail */
	}
	return 0;
}

/* ---- tests -------------------------------------------------------------------- */

/* 40 sockets trickle headers, one byte per second each, against 8 slots
 * and 4 reserve slots: the server must close the ones it holds (header
 * deadline 2 s, reserve 2 s) so that /healthz answers 200 again. */
Test(httpd_slow, slowloris_headers_are_cut_and_probes_answer_again)
{
	enum { N = 40 };
	static const char req[] = "GET /slow HTTP/1.1\r\nHost: x\r\nX-Slow: "
				  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
				  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
	struct mr_httpd_opts o = {.max_connections = 8, .reserve_connections = 4,
				  .header_timeout_s = 2};
	struct mr_httpd *srv = start(&o);
	int port = mr_httpd_port(srv), open_n = N, silent = 0, healthz = 0;
	long long t0 = mr_test_now_ms(), t_ok = 0;
	struct slow s[N];

	memset(s, 0, sizeof(s));
	for (int i = 0; i < N; i++)
		s[i].fd = mr_test_connect_ok(port);
	/* up to 60 s (the deadlines are 2 s): one byte per socket per second */
	while (mr_test_now_ms() - t0 < 60000 && (open_n || !t_ok)) {
		long long next = mr_test_now_ms() + 1000;

		for (int i = 0; i < N; i++) {
			slow_poll(&s[i], 0);
			slow_send(&s[i], req);
		}
		if (!t_ok && (healthz = get(port, "/healthz")) == 200)
			t_ok = mr_test_now_ms();
		while (mr_test_now_ms() < next)
			for (int i = 0; i < N; i++)
				slow_poll(&s[i], 10);
		open_n = 0;
		for (int i = 0; i < N; i++)
			open_n += s[i].state == OPEN;
	}
	for (int i = 0; i < N; i++) {
		silent += s[i].state == CLOSED_SILENT;
		/* those refused at accept got the fixed 503 first */
		if (s[i].state == CLOSED_AFTER_REPLY)
			cr_assert(!strncmp(s[i].head, "HTTP/1.1 503", 12), "socket %d got '%s'", i,
				  s[i].head);
		close(s[i].fd);
	}
	cr_assert_eq(open_n, 0, "%d slow sockets still open after %.1f s", open_n,
		     (mr_test_now_ms() - t0) / 1e3);
	/* the 8 ordinary and 4 reserve slots were taken by slow sockets, and
	 * the server closed them without a reply */
	cr_assert_geq(silent, 8, "only %d slow sockets were closed at a deadline", silent);
	cr_assert(t_ok, "/healthz never answered 200 (last status %d)", healthz);
	/* and the slots serve ordinary requests again */
	cr_assert_eq(get(port, "/after"), 200);
	mr_httpd_stop(srv);
}

/* A reserve slot is for probes that send their request at once: one that
 * trickles it is closed within the reserve deadline, long before its
 * request is complete, while the ordinary slot's idle client (header
 * deadline 60 s) stays. */
Test(httpd_slow, a_reserve_slot_must_send_its_request_at_once)
{
	static const char req[] = "GET /healthz?pad=xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx "
				  "HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
	struct mr_httpd_opts o = {.max_connections = 1, .reserve_connections = 1,
				  .header_timeout_s = 60};
	struct mr_httpd *srv = start(&o);
	int port = mr_httpd_port(srv), idle = mr_test_connect_ok(port);
	struct pollfd p = {.fd = idle, .events = POLLIN};
	struct slow s = {0};

	usleep(200000); /* the idle one holds the ordinary slot */
	s.fd = mr_test_connect_ok(port);
	/* one byte per 250 ms: the whole request would take over 20 s */
	while (s.state == OPEN && req[s.sent]) {
		slow_send(&s, req);
		slow_poll(&s, 250);
	}
	cr_assert_eq(s.state, CLOSED_SILENT, "the slow reserve client was %s (got '%s')",
		     s.state == OPEN ? "served to the end" : "answered", s.head);
	cr_assert_lt(s.sent, strlen(req), "the whole request went through");
	close(s.fd);
	/* the freed reserve slot serves a probe */
	for (int i = 0; i < 50 && get(port, "/healthz") != 200; i++)
		usleep(100000);
	cr_assert_eq(get(port, "/healthz"), 200);
	cr_assert_eq(poll(&p, 1, 0), 0, "the ordinary idle connection was closed too");
	close(idle);
	mr_httpd_stop(srv);
}

/* A body trickled at 4 B/s against a minimum of 100 B/s is cut soon after
 * body_timeout_s, the handler never called. */
Test(httpd_slow, a_trickled_body_is_cut)
{
	static const char head[] = "PUT /up HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
	struct mr_httpd_opts o = {.body_timeout_s = 1, .body_min_rate = 100};
	struct mr_httpd *srv = start(&o);
	struct slow s = {0};
	long long t0;
	int i;

	s.fd = mr_test_connect_ok(mr_httpd_port(srv));
	cr_assert_eq(send(s.fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
	t0 = mr_test_now_ms();
	/* the whole body at this pace would take 250 s; give it 20 */
	for (i = 0; i < 80 && s.state == OPEN; i++) {
		if (send(s.fd, "b", 1, MSG_NOSIGNAL) != 1)
			break;
		slow_poll(&s, 250);
	}
	slow_poll(&s, 1000);
	cr_assert_neq(s.state, OPEN, "a 4 B/s body still open after %.1f s",
		      (mr_test_now_ms() - t0) / 1e3);
	cr_assert(!strstr(s.head, "200"), "the trickled body was served: %s", s.head);
	cr_assert_eq(atomic_load(&handled), 0);
	close(s.fd);
	mr_httpd_stop(srv);
}

/* 2000 bytes at about 1000 B/s take twice body_timeout_s, but above the
 * minimum rate every byte earns time: the upload completes and is served. */
Test(httpd_slow, a_steady_slow_upload_is_not_cut)
{
	enum { LEN = 2000, STEP = 100 };
	static const char head[] = "PUT /up HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
				   "Content-Length: 2000\r\n\r\n";
	struct mr_httpd_opts o = {.body_timeout_s = 1, .body_min_rate = 100};
	struct mr_httpd *srv = start(&o);
	int fd = mr_test_connect_ok(mr_httpd_port(srv));
	char chunk[STEP], buf[4096];
	long long t0;

	memset(chunk, 'u', sizeof(chunk));
	cr_assert_eq(send(fd, head, strlen(head), MSG_NOSIGNAL), (ssize_t)strlen(head));
	t0 = mr_test_now_ms();
	for (int sent = 0; sent < LEN; sent += STEP) {
		cr_assert_eq(send(fd, chunk, STEP, MSG_NOSIGNAL), STEP,
			     "upload cut after %d bytes, %.1f s", sent,
			     (mr_test_now_ms() - t0) / 1e3);
		usleep(100000);
	}
	cr_assert_geq(mr_test_now_ms() - t0, 1900, "the upload was not slower than the deadline");
	mr_test_read_all(fd, buf, sizeof(buf));
	close(fd);
	cr_assert(!strncmp(buf, "HTTP/1.1 200", 12), "%s", buf);
	cr_assert(strstr(buf, "\"body\":2000"), "%s", buf);
	mr_httpd_stop(srv);
}

/* After a request on a keep-alive connection, the next one's headers are
 * due within header_timeout_s of the reply: an idle keep-alive connection
 * is closed then, though the idle timeout (30 s) is far. */
Test(httpd_slow, keep_alive_gets_the_header_deadline_from_its_last_reply)
{
	static const char req[] = "GET /one HTTP/1.1\r\nHost: x\r\n\r\n";
	struct mr_httpd_opts o = {.header_timeout_s = 1, .idle_timeout_s = 30};
	struct mr_httpd *srv = start(&o);
	int fd = mr_test_connect_ok(mr_httpd_port(srv));
	char buf[4096];

	cr_assert_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
	cr_assert(closed_within(fd, 15000, buf, sizeof(buf)),
		  "idle keep-alive connection open 15 s after its reply");
	cr_assert(!strncmp(buf, "HTTP/1.1 200", 12), "no reply first: '%s'", buf);
	cr_assert(!strstr(buf, "Connection: close"), "the reply closed it itself: %s", buf);
	close(fd);
	mr_httpd_stop(srv);
}

/* A parked request (long-poll) and a body sent in one go have no deadline
 * once handled: the reply 3 s later (three header deadlines) arrives. */
Test(httpd_slow, a_long_poll_outlives_the_deadlines)
{
	static const char req[] = "POST /wait HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
				  "Content-Length: 2\r\n\r\n{}";
	struct mr_httpd_opts o = {.header_timeout_s = 1, .body_timeout_s = 1,
				  .reserve_request_s = 1};
	struct mr_httpd *srv = start(&o);
	char buf[4096];

	atomic_store(&wait_until_ms, mr_test_now_ms() + 3000);
	cr_assert_eq(mr_test_raw_request(mr_httpd_port(srv), req, buf, sizeof(buf)), 200, "%s",
		     buf);
	cr_assert(strstr(buf, "\r\n\r\nwoke"), "%s", buf);
	cr_assert_geq(mr_test_now_ms(), atomic_load(&wait_until_ms));
	mr_httpd_stop(srv);
}
