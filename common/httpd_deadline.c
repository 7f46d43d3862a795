/*
 * httpd_deadline.c - the deadlines that bound slow clients of the HTTP
 * server (see mr_httpd.h; modelled on Apache's mod_reqtimeout).
 *
 * libmicrohttpd's idle timeout restarts with every byte received, so a
 * client sending one byte every few seconds ("slowloris") holds its
 * connection for as long as it likes. Here each connection that is reading
 * a request carries a deadline for the phase it is in:
 *
 *   header   the request headers, within header_ms of the accept or of the
 *            end of the previous request on a keep-alive connection;
 *   body     the body, within body_ms of the end of the headers plus one
 *            second for every body_min_rate bytes received (the bytes
 *            counted up to max_body, so a body without end is cut too);
 *   reserve  on a reserve slot, the whole request within reserve_req_ms
 *            of the accept, so slow clients cannot hold the slots kept for
 *            the probes.
 *
 * A connection whose handler runs, whose request is suspended (long-poll)
 * or whose reply is being sent has no deadline: libmicrohttpd's idle
 * timeout alone applies, as before.
 *
 * The armed connections sit in a binary min-heap by deadline (an array of
 * record pointers, each record knowing its index), so arming, disarming
 * and the check of one loop pass cost O(log n) and O(1) when nothing is
 * due, whatever the number of connections (the controller holds 100,000
 * long-polls). A body deadline is kept at its lower bound and moved on
 * lazily: when it falls due, the bytes received since then extend it and
 * the record sinks back into the heap; only a connection still behind is
 * closed.
 *
 * Closing: the socket belongs to libmicrohttpd, so it is only shut down
 * (shutdown(2) both ways, which also wakes libmicrohttpd's epoll); its
 * next read sees the end and it closes the connection through its normal
 * path (completion and close notifications, the counts of
 * httpd_accept.c). The client sees the end of the stream, or a reset.
 *
 * One warn line per class of dropped client (header, body, reserve), at
 * most every 10 s, with the count since the last line and the total (event
 * httpd_slow_client). A keep-alive connection closed before the next
 * request line came is class keepalive, a debug line: mostly a client
 * whose pooled connection sat idle (libmicrohttpd's idle timeout closes
 * those without a line too), though a request line trickled after a first
 * request looks the same from here.
 *
 * Non-goals: slow readers of a reply (the idle timeout bounds a stalled
 * one), per-address accounting.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "httpd_int.h"
#include "mr_log.h"

#define SLOW_LOG_MS 10000 /* at most one line per class per 10 s */
#define NOT_ARMED ((size_t)-1)

/* Classes of dropped clients: srv->slow[] and the log lines. */
enum { SLOW_HEADER, SLOW_BODY, SLOW_RESERVE, SLOW_KEEPALIVE, SLOW_N };
static const char *const class_name[SLOW_N] = {"header", "body", "reserve", "keepalive"};

uint64_t mr__httpd_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- the heap --------------------------------------------------------------- */

static void heap_set(struct mr_httpd *srv, size_t i, struct mr__httpd_conn *c)
{
	srv->dl_heap[i] = c;
	c->heap_idx = i;
}

static void sift_up(struct mr_httpd *srv, size_t i)
{
	struct mr__httpd_conn *c = srv->dl_heap[i];

	while (i > 0) {
		size_t parent = (i - 1) / 2;

		if (srv->dl_heap[parent]->deadline_ms <= c->deadline_ms)
			break;
		heap_set(srv, i, srv->dl_heap[parent]);
		i = parent;
	}
	heap_set(srv, i, c);
}

static void sift_down(struct mr_httpd *srv, size_t i)
{
	struct mr__httpd_conn *c = srv->dl_heap[i];

	for (;;) {
		size_t l = 2 * i + 1, m = l;

		if (l >= srv->dl_n)
			break;
		if (l + 1 < srv->dl_n &&
		    srv->dl_heap[l + 1]->deadline_ms < srv->dl_heap[l]->deadline_ms)
			m = l + 1;
		if (c->deadline_ms <= srv->dl_heap[m]->deadline_ms)
			break;
		heap_set(srv, i, srv->dl_heap[m]);
		i = m;
	}
	heap_set(srv, i, c);
}

static void heap_remove(struct mr_httpd *srv, struct mr__httpd_conn *c)
{
	size_t i = c->heap_idx;
	struct mr__httpd_conn *last = srv->dl_heap[--srv->dl_n];

	c->heap_idx = NOT_ARMED;
	if (last == c)
		return;
	heap_set(srv, i, last);
	sift_up(srv, i);
	sift_down(srv, last->heap_idx);
}

/* 0, or MR_ENOMEM (the connection then goes without a deadline, bounded by
 * the idle timeout only: better than refusing it). */
static int heap_insert(struct mr_httpd *srv, struct mr__httpd_conn *c)
{
	if (srv->dl_n == srv->dl_cap) {
		size_t cap = srv->dl_cap ? srv->dl_cap * 2 : 64;
		struct mr__httpd_conn **h = realloc(srv->dl_heap, cap * sizeof(*h));

		if (!h)
			return MR_ENOMEM;
		srv->dl_heap = h;
		srv->dl_cap = cap;
	}
	heap_set(srv, srv->dl_n++, c);
	sift_up(srv, c->heap_idx);
	return 0;
}

/* ---- arming and expiry -------------------------------------------------------- */

void mr__httpd_dl_arm(struct mr_httpd *srv, struct mr__httpd_conn *c,
		      enum mr__httpd_phase phase, uint64_t now)
{
	uint64_t old;

	if (!c || c->fd < 0)
		return;
	if (c->phase == MR__HTTPD_PH_NONE)
		c->heap_idx = NOT_ARMED;
	c->phase = (unsigned char)phase;
	if (phase == MR__HTTPD_PH_NONE) {
		if (c->heap_idx != NOT_ARMED)
			heap_remove(srv, c);
		return;
	}
	old = c->deadline_ms;
	if (phase == MR__HTTPD_PH_HEADER) {
		c->deadline_ms = now + srv->header_ms;
	} else if (phase == MR__HTTPD_PH_BODY) {
		c->body_start_ms = now;
		c->body_bytes = 0;
		c->deadline_ms = now + srv->body_ms;
	} else {
		c->deadline_ms = now + srv->reserve_req_ms;
	}
	if (c->heap_idx == NOT_ARMED) {
		if (heap_insert(srv, c) != 0) {
			c->phase = MR__HTTPD_PH_NONE;
			mr_log_debug("httpd_deadline_unarmed", "err=out_of_memory");
		}
	} else if (c->deadline_ms < old) {
		sift_up(srv, c->heap_idx);
	} else {
		sift_down(srv, c->heap_idx);
	}
}

/* The body deadline earned so far: body_ms, plus 1 s per body_min_rate
 * bytes received (counted up to max_body). */
static uint64_t body_deadline(const struct mr_httpd *srv, const struct mr__httpd_conn *c)
{
	size_t bytes = c->body_bytes < srv->max_body ? c->body_bytes : srv->max_body;

	return c->body_start_ms + srv->body_ms + (uint64_t)bytes * 1000 / srv->body_min_rate;
}

static void log_slow(struct mr_httpd *srv, int cls, uint64_t now)
{
	struct mr__httpd_slow *s = &srv->slow[cls];
	enum mr_log_level lvl = cls == SLOW_KEEPALIVE ? MR_LOG_DEBUG : MR_LOG_WARN;
	uint64_t limit_ms = cls == SLOW_BODY ? srv->body_ms :
			    cls == SLOW_RESERVE ? srv->reserve_req_ms : srv->header_ms;

	if (s->dropped == s->logged || (s->logged_ms && now - s->logged_ms < SLOW_LOG_MS))
		return;
	if (cls == SLOW_BODY)
		mr_log(lvl, "httpd_slow_client",
		       "class=body dropped=%llu total=%llu deadline_ms=%llu min_rate=%u "
		       "connections=%zu",
		       s->dropped - s->logged, s->dropped, (unsigned long long)limit_ms,
		       srv->body_min_rate, srv->n_conns);
	else
		mr_log(lvl, "httpd_slow_client",
		       "class=%s dropped=%llu total=%llu deadline_ms=%llu connections=%zu",
		       class_name[cls], s->dropped - s->logged, s->dropped,
		       (unsigned long long)limit_ms, srv->n_conns);
	s->logged = s->dropped;
	s->logged_ms = now;
}

/* The class of a connection dropped in phase ph. */
static int slow_class(const struct mr__httpd_conn *c, int ph)
{
	if (ph == MR__HTTPD_PH_BODY)
		return SLOW_BODY;
	if (ph == MR__HTTPD_PH_RESERVE)
		return SLOW_RESERVE;
	return c->served && !c->open ? SLOW_KEEPALIVE : SLOW_HEADER;
}

void mr__httpd_dl_expire(struct mr_httpd *srv, uint64_t now)
{
	while (srv->dl_n && srv->dl_heap[0]->deadline_ms <= now) {
		struct mr__httpd_conn *c = srv->dl_heap[0];
		int ph = c->phase;

		if (ph == MR__HTTPD_PH_BODY) {
			uint64_t d = body_deadline(srv, c);

			if (d > now) { /* earned more time since it was set */
				c->deadline_ms = d;
				sift_down(srv, 0);
				continue;
			}
		}
		heap_remove(srv, c);
		c->phase = MR__HTTPD_PH_NONE;
		/* libmicrohttpd owns the descriptor: shut it down, never close
		 * it; its next read sees the end and closes the connection */
		if (shutdown(c->fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
			mr_log_debug("httpd_shutdown_failed", "errno=%d", errno);
		srv->slow[slow_class(c, ph)].dropped++;
	}
	for (int cls = 0; cls < SLOW_N; cls++)
		log_slow(srv, cls, now);
}

void mr__httpd_dl_release(struct mr_httpd *srv)
{
	free(srv->dl_heap);
	srv->dl_heap = NULL;
	srv->dl_n = srv->dl_cap = 0;
}
