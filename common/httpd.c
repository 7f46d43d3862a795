/*
 * httpd.c - HTTP server wrapper on libmicrohttpd (see mr_httpd.h).
 *
 * libmicrohttpd runs in "external epoll" mode without a listen socket: it
 * owns an epoll fd with its connections and its inter-thread channel, and
 * does no waiting of its own. Our loop thread waits on a second epoll set
 * holding {that epoll fd, a wake eventfd, our listen socket} with timeout
 * min(MHD_get_timeout, tick), accepts (handing sockets to libmicrohttpd),
 * then runs MHD_run(), the tick callback and the posted work. Everything
 * touching libmicrohttpd or a request happens on this one thread.
 *
 * Per request we keep one small struct (struct mr_http_req) and the body.
 * Suspended requests sit in an intrusive list so stop can answer them;
 * suspend, reply and resume are O(1) here (libmicrohttpd itself walks its
 * suspended list once per loop pass that has resumes, not per request).
 *
 * The listen socket is ours (httpd_accept.c: accept, connection limit,
 * reserve slots); libmicrohttpd gets each accepted socket. The request
 * target is taken raw from the URI log callback, before libmicrohttpd
 * decodes it, and split and decoded by httpd_path.c; a bad path, query or
 * framing (Content-Length, Transfer-Encoding) is answered here before the
 * handler runs.
 *
 * This file is the daemon, its loop and the libmicrohttpd callbacks;
 * httpd_req.c reads a request and replies to it.
 *
 * Non-goals: TLS, HTTP/2, routing; see mr_httpd.h.
 */
#include "httpd_int.h"
#include "mr_json.h"
#include "mr_log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define STOP_DRAIN_MS 2000 /* how long stop waits for 503s to go out */
#define RESERVE_IDLE_S 5   /* idle timeout of a connection on a reserve slot */

/* ---- small helpers ------------------------------------------------------ */

static void wake(struct mr_httpd *srv)
{
	uint64_t one = 1;

	/* EAGAIN means the counter is already non-zero: awake anyway. */
	if (write(srv->wakefd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		mr_log_warn("httpd_wake_failed", "errno=%d", errno);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	struct mr_httpd *srv = cls;
	size_t n;

	vsnprintf(srv->last_log, sizeof(srv->last_log), fmt, ap);
	n = strlen(srv->last_log);
	while (n && (srv->last_log[n - 1] == '\n' || srv->last_log[n - 1] == '.'))
		srv->last_log[--n] = '\0';
	/* Per-connection noise (resets, limits) under load: debug only. */
	mr_log_debug("httpd_mhd", "msg=%s", mr_log_q(srv->last_log));
}

void mr__httpd_susp_unlink(struct mr_httpd *srv, struct mr_http_req *req)
{
	if (req->prev)
		req->prev->next = req->next;
	else
		srv->susp_head = req->next;
	if (req->next)
		req->next->prev = req->prev;
	req->prev = req->next = NULL;
	req->suspended = 0;
	srv->n_suspended--;
}

void mr__httpd_free_hdrs(struct mr_http_req *req)
{
	while (req->hdrs) {
		struct hdr *h = req->hdrs;

		req->hdrs = h->next;
		free(h);
	}
}

/* ---- libmicrohttpd callbacks ---------------------------------------------- */

static unsigned char parse_method(const char *m)
{
	if (strcmp(m, "GET") == 0)
		return MR_HTTP_GET;
	if (strcmp(m, "HEAD") == 0)
		return MR_HTTP_HEAD;
	if (strcmp(m, "POST") == 0)
		return MR_HTTP_POST;
	if (strcmp(m, "PUT") == 0)
		return MR_HTTP_PUT;
	if (strcmp(m, "DELETE") == 0)
		return MR_HTTP_DELETE;
	return MR_HTTP_OTHER;
}

/* URI log callback: runs once per request, before libmicrohttpd decodes
 * the target; the request record it returns becomes *con_cls. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *conn)
{
	struct mr_httpd *srv = cls;
	/* the record and the raw target in one block; malloc + memset:
	 * glibc's calloc skips the thread cache, and this runs per request */
	size_t ulen = uri ? strlen(uri) : 0;
	struct mr_http_req *req = malloc(sizeof(*req) + ulen + 1);
	struct mr__httpd_conn *c = mr__httpd_conn_of(conn);

	if (!req)
		return NULL;
	memset(req, 0, sizeof(*req));
	req->raw = (char *)(req + 1);
	memcpy(req->raw, uri ? uri : "", ulen + 1);
	req->srv = srv;
	req->conn = conn;
	req->url = req->raw;
	req->c = c;
	if (c) {
		if (c->open) { /* the previous request was never reported done */
			mr_log_debug("httpd_request_dropped", "where=next_request");
			mr__httpd_req_free(srv, c->open);
		}
		c->open = req;
		req->reserve = (unsigned char)c->reserve;
		/* no deadline when the last request ended unreported: the
		 * headers get header_ms from here */
		if (c->phase == MR__HTTPD_PH_NONE)
			mr__httpd_dl_arm(srv, c, MR__HTTPD_PH_HEADER, mr__httpd_now_ms());
	}
	return req;
}

struct framing {
	const char *cl, *cl_other, *te;
	int n_te;
};

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key,
				   const char *value)
{
	struct framing *f = cls;

	(void)kind;
	if (!key || !value)
		return MHD_YES;
	if (!strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH)) {
		if (!f->cl)
			f->cl = value;
		else if (strcmp(f->cl, value) != 0 && !f->cl_other)
			f->cl_other = value;
	} else if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) {
		f->te = value;
		f->n_te++;
	}
	return MHD_YES;
}

/*
 * First call for a request (headers read, body not yet): decodes and
 * checks the target, the framing headers and the connection's slot.
 * When it replies, the handler is not called (an early reply makes
 * libmicrohttpd skip the body and close the connection).
 */
static void begin(struct mr_httpd *srv, struct mr_http_req *req)
{
	struct mr_errbuf eb = {{0}, {0}};
	const char *q = strchr(req->raw, '?');
	size_t plen = q ? (size_t)(q - req->raw) : strlen(req->raw);
	struct framing f = {0};
	int rc;

	req->begun = 1;
	req->meth = parse_method(req->method);
	rc = mr__http_target_parse(&req->tgt, req->raw, plen, &eb);
	if (rc == 0)
		req->url = req->tgt.path;
	if (rc == MR_ENOMEM)
		mr_http_reply_error(req, 503, "out_of_memory", NULL, NULL, "out of memory");
	else if (rc)
		mr_http_reply_error(req, 400, "bad_path", eb.field, NULL, "%s", eb.msg);
	else if ((rc = q ? mr__http_query_check(q + 1, strlen(q + 1), &eb) : 0) != 0)
		mr_http_reply_error(req, rc == MR_ENOMEM ? 503 : 400,
				    rc == MR_ENOMEM ? "out_of_memory" : "bad_query", eb.field, NULL,
				    "%s", eb.msg);
	if (req->replied)
		return;
	MHD_get_connection_values(req->conn, MHD_HEADER_KIND, scan_header, &f);
	if (f.cl_other) {
		mr_http_reply_error(req, 400, "bad_request", MHD_HTTP_HEADER_CONTENT_LENGTH, NULL,
				    "conflicting Content-Length headers '%.32s' and '%.32s'", f.cl,
				    f.cl_other);
	} else if (f.n_te > 1) {
		mr_http_reply_error(req, 400, "bad_request", MHD_HTTP_HEADER_TRANSFER_ENCODING, NULL,
				    "more than one Transfer-Encoding header");
	} else if (f.te && f.cl) {
		mr_http_reply_error(req, 400, "bad_request", MHD_HTTP_HEADER_TRANSFER_ENCODING, NULL,
				    "both Transfer-Encoding and Content-Length are set");
	} else if (f.te && strcasecmp(f.te, "chunked") != 0) {
		mr_http_reply_error(req, 501, "not_implemented", MHD_HTTP_HEADER_TRANSFER_ENCODING,
				    NULL, "Transfer-Encoding '%.32s' is not supported (only chunked)",
				    f.te);
	} else if (req->reserve && !mr__httpd_reserved_path(req->url)) {
		srv->n_overload++;
		mr_http_add_header(req, "Retry-After", "1");
		mr_http_reply_error(req, 503, "overloaded", NULL, NULL,
				    "the server is at its connection limit (%u)", srv->max_conns);
	} else if (f.cl) {
		unsigned long long n = strtoull(f.cl, NULL, 10);

		if (n > srv->max_body) {
			req->too_large = 1;
			mr_http_reply_error(req, 413, "body_too_large", NULL, NULL,
					    "request body exceeds %zu bytes", srv->max_body);
		} else {
			req->expect = (size_t)n;
		}
	}
	/* The headers are in: a body now has its own deadline; without one
	 * the handler runs next. A reserve slot keeps its deadline for the
	 * whole request, an early reply the one it has (the connection
	 * closes after it). */
	if (!req->reserve && !req->replied)
		mr__httpd_dl_arm(srv, req->c,
				 f.te || req->expect ? MR__HTTPD_PH_BODY : MR__HTTPD_PH_NONE,
				 mr__httpd_now_ms());
}

/* Appends upload data; past max_body the rest is discarded and 413 sent. */
static void req_append(struct mr_http_req *req, const char *data, size_t n)
{
	size_t max = req->srv->max_body, need, cap;
	char *nb;

	if (req->too_large)
		return;
	if (n > max - req->body_len) {
		req->too_large = 1;
		return;
	}
	need = req->body_len + n + 1;
	if (need > req->body_cap) {
		cap = req->body_cap ? req->body_cap : req->expect ? req->expect + 1 : 256;
		while (cap < need)
			cap *= 2;
		if (cap > max + 1)
			cap = max + 1;
		nb = realloc(req->body, cap);
		if (!nb) {
			req->too_large = 1; /* answered as 413; nothing better to say */
			return;
		}
		req->body = nb;
		req->body_cap = cap;
	}
	memcpy(req->body + req->body_len, data, n);
	req->body_len += n;
	req->body[req->body_len] = '\0';
}

/* kubelet probes carry no client certificate */
static int is_probe(const struct mr_http_req *req)
{
	const char *p = mr_http_req_path(req);

	return p && (!strcmp(p, "/healthz") || !strcmp(p, "/readyz"));
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *conn, const char *url,
				 const char *method, const char *version,
				 const char *upload_data, size_t *upload_data_size,
				 void **con_cls)
{
	struct mr_httpd *srv = cls;
	struct mr_http_req *req = *con_cls;

	(void)url;
	(void)version;
	if (!req) /* on_uri ran out of memory */
		return MHD_NO;
	if (!req->begun) {
		req->method = method;
		begin(srv, req);
		return req->queue_failed ? MHD_NO : MHD_YES;
	}
	if (req->replied) { /* 413 already queued: swallow the rest */
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (*upload_data_size) {
		if (req->c) /* the rate that extends the body deadline */
			req->c->body_bytes += *upload_data_size;
		req_append(req, upload_data, *upload_data_size);
		*upload_data_size = 0;
		return MHD_YES;
	}
	/* the whole request is in: no deadline while it is handled,
	 * suspended or answered (the idle timeout still applies) */
	mr__httpd_dl_arm(srv, req->c, MR__HTTPD_PH_NONE, 0);
	if (req->too_large) {
		mr_http_reply_error(req, 413, "body_too_large", NULL, NULL,
				    "request body exceeds %zu bytes", srv->max_body);
	} else if (srv->stopping) {
		mr_http_reply_error(req, 503, "shutting_down", NULL, NULL,
				    "server is shutting down");
	} else if (!mr__httpd_tls_client_ok(srv->tls, conn) && !is_probe(req)) {
		mr_http_reply_error(req, 401, "client_certificate_required", NULL, NULL,
				    "this server needs a client certificate signed by its "
				    "--tls-client-ca");
	} else {
		req->in_handler = 1;
		srv->handler(req, srv->user);
		req->in_handler = 0;
		if (!req->replied && req->suspend_req && !srv->stopping) {
			MHD_suspend_connection(conn);
			req->suspended = 1;
			req->next = srv->susp_head;
			if (req->next)
				req->next->prev = req;
			srv->susp_head = req;
			srv->n_suspended++;
		} else if (!req->replied) {
			mr_log_error("httpd_no_reply", "method=%s path=%s", req->method,
				     mr_log_q(req->url));
			mr_http_reply_error(req, 500, "internal", NULL, NULL,
					    "handler did not reply");
		}
	}
	return req->queue_failed ? MHD_NO : MHD_YES;
}

void mr__httpd_req_free(struct mr_httpd *srv, struct mr_http_req *req)
{
	if (req->suspended) /* only possible if MHD tears down a suspended one */
		mr__httpd_susp_unlink(srv, req);
	if (req->resumed)
		srv->n_resumed--;
	mr__httpd_free_hdrs(req);
	mr__http_target_release(&req->tgt);
	free(req->body); /* raw is in req's block */
	free(req);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct mr_http_req *req = *con_cls;
	struct mr__httpd_conn *c = mr__httpd_conn_of(conn);

	(void)toe;
	/* the next request on a keep-alive connection must come in time */
	if (c) {
		c->served = 1;
		mr__httpd_dl_arm(cls, c, c->reserve ? MR__HTTPD_PH_RESERVE : MR__HTTPD_PH_HEADER,
				 mr__httpd_now_ms());
	}
	if (!req)
		return;
	*con_cls = NULL;
	if (c && c->open == req)
		c->open = NULL;
	mr__httpd_req_free(cls, req);
}

/* ---- the loop ------------------------------------------------------------- */

static void run_posts(struct mr_httpd *srv, int close_after)
{
	struct post_item *it;

	pthread_mutex_lock(&srv->lock);
	it = srv->post_head;
	srv->post_head = srv->post_tail = NULL;
	if (close_after)
		srv->closed = 1;
	pthread_mutex_unlock(&srv->lock);
	while (it) {
		struct post_item *next = it->next;

		it->fn(it->arg);
		free(it);
		it = next;
	}
}

static void begin_stop(struct mr_httpd *srv)
{
	size_t n = srv->n_suspended;

	run_posts(srv, 1);
	srv->stopping = 1;
	while (srv->susp_head)
		mr_http_reply_error(srv->susp_head, 503, "shutting_down", NULL, NULL,
				    "server is shutting down");
	if (n)
		mr_log_info("httpd_stopping", "suspended_answered=%zu", n);
}

static void *loop_main(void *arg)
{
	struct mr_httpd *srv = arg;
	struct epoll_event ev[4];
	uint64_t stop_deadline = 0;

	for (;;) {
		MHD_UNSIGNED_LONG_LONG mto;
		int timeout = (int)srv->tick_ms, n, i;

		if (MHD_get_timeout(srv->mhd, &mto) == MHD_YES && mto < (unsigned)timeout)
			timeout = (int)mto;
		if (srv->dl_n) { /* the next deadline (httpd_deadline.c) */
			uint64_t now = mr__httpd_now_ms(), d = srv->dl_heap[0]->deadline_ms;

			if (d <= now)
				timeout = 0;
			else if (d - now < (uint64_t)timeout)
				timeout = (int)(d - now);
		}
		if (srv->stopping && timeout > 10)
			timeout = 10;
		if (srv->resumed_since_run)
			timeout = 0;
		n = epoll_wait(srv->epfd, ev, 4, timeout);
		for (i = 0; i < n; i++) {
			if (ev[i].data.fd == srv->wakefd) {
				uint64_t v;

				if (read(srv->wakefd, &v, sizeof(v)) < 0 && errno != EAGAIN)
					mr_log_warn("httpd_wake_read_failed", "errno=%d", errno);
			} else if (ev[i].data.fd == srv->lfd) {
				mr__httpd_accept(srv);
			}
		}
		srv->resumed_since_run = 0;
		if (MHD_run(srv->mhd) != MHD_YES)
			mr_log_warn("httpd_run_failed", "msg=%s", mr_log_q(srv->last_log));
		mr__httpd_dl_expire(srv, mr__httpd_now_ms());
		if (srv->stopping) {
			if (srv->n_resumed == 0 || mr__httpd_now_ms() >= stop_deadline)
				break;
			continue;
		}
		mr__httpd_tls_check(srv->tls, mr__httpd_now_ms());
		if (srv->tick)
			srv->tick(srv->user);
		run_posts(srv, 0);
		if (atomic_load(&srv->stop_req)) {
			begin_stop(srv);
			stop_deadline = mr__httpd_now_ms() + STOP_DRAIN_MS;
		}
	}
	return NULL;
}

/* ---- start / stop / post ------------------------------------------------- */

static void srv_free(struct mr_httpd *srv)
{
	if (srv->mhd)
		MHD_stop_daemon(srv->mhd);
	mr__httpd_tls_close(srv->tls);
	mr__httpd_dl_release(srv); /* after the connections are gone */
	if (srv->epfd >= 0)
		close(srv->epfd);
	if (srv->wakefd >= 0)
		close(srv->wakefd);
	if (srv->lfd >= 0)
		close(srv->lfd);
	if (srv->spare_fd >= 0)
		close(srv->spare_fd);
	run_posts(srv, 1); /* nothing should be left; never leak an item */
	pthread_mutex_destroy(&srv->lock);
	free(srv);
}

int mr_httpd_start(struct mr_httpd **out, const struct mr_httpd_opts *o,
		   struct mr_errbuf *eb)
{
	struct mr_httpd *srv;
	struct MHD_OptionItem opts[20];
	struct epoll_event ev;
	const union MHD_DaemonInfo *di;
	unsigned flags = MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG |
			 MHD_USE_NO_LISTEN_SOCKET;
	size_t mem = o->conn_memory ? o->conn_memory : 8192;
	size_t incr = mem / 4 < 1024 ? mem / 4 : 1024;
	unsigned idle = o->idle_timeout_s ? o->idle_timeout_s : 30;
	int k = 0, rc;

	*out = NULL;
	if (!o->handler)
		return mr_errf_field(eb, MR_EINVAL, "handler", "httpd: 'handler' is required");
	if (o->port < 0 || o->port > 65535)
		return mr_errf_field(eb, MR_ERANGE, "port", "port %d is out of range [0, 65535]",
				     o->port);
	if (mem < 1024)
		return mr_errf_field(eb, MR_ERANGE, "conn_memory",
				     "conn_memory %zu is below the minimum 1024", mem);
	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return mr_errf(eb, MR_ENOMEM, "httpd: out of memory");
	srv->epfd = srv->wakefd = srv->lfd = srv->spare_fd = -1;
	pthread_mutex_init(&srv->lock, NULL);
	srv->handler = o->handler;
	srv->tick = o->tick;
	srv->user = o->user;
	srv->max_body = o->max_body ? o->max_body : (size_t)1 << 20;
	srv->tick_ms = o->tick_ms ? o->tick_ms : 100;
	srv->max_conns = o->max_connections ? o->max_connections : 1024;
	srv->reserve = o->reserve_connections ? o->reserve_connections : MR_HTTPD_RESERVE_DEFAULT;
	srv->reserve_timeout_s = idle < RESERVE_IDLE_S ? idle : RESERVE_IDLE_S;
	srv->header_ms = 1000ull * (o->header_timeout_s ? o->header_timeout_s : 20);
	srv->body_ms = 1000ull * (o->body_timeout_s ? o->body_timeout_s : 20);
	srv->body_min_rate = o->body_min_rate ? o->body_min_rate : 500;
	srv->reserve_req_ms = 1000ull * (o->reserve_request_s ? o->reserve_request_s : 2);
	srv->adding_fd = -1;

	if (o->tls_cert || o->tls_key) {
		if ((rc = mr__httpd_tls_open(&srv->tls, o, eb)) < 0)
			goto fail;
		flags |= MHD_USE_TLS;
		k += mr__httpd_tls_options(srv->tls, opts + k);
	}
	rc = mr__httpd_listen(srv, o->bind_addr, o->port, eb);
	if (rc)
		goto fail;
	/* libmicrohttpd's own limit has room for the reserve: our accept
	 * decides who gets a slot (httpd_accept.c) */
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
					    (intptr_t)srv->max_conns + srv->reserve, NULL};
	if (o->per_ip_connections)
		opts[k++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT,
						    o->per_ip_connections, NULL};
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT, idle, NULL};
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
					    (intptr_t)mem, NULL};
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_INCREMENT,
					    (intptr_t)incr, NULL};
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)on_uri, srv};
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION,
					    (intptr_t)mr__httpd_on_conn, srv};
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED,
					    (intptr_t)on_completed, srv};
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)on_mhd_log,
					    srv};
	opts[k++] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};

	srv->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_access, srv, MHD_OPTION_ARRAY,
				    opts, MHD_OPTION_END);
	if (!srv->mhd) {
		rc = mr_errf(eb, MR_EIO, "unable to start the http server on '%s:%d': %s",
			     o->bind_addr ? o->bind_addr : "*", o->port,
			     srv->last_log[0] ? srv->last_log : "libmicrohttpd failed");
		goto fail;
	}
	di = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	srv->epfd = epoll_create1(EPOLL_CLOEXEC);
	srv->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (!di || srv->epfd < 0 || srv->wakefd < 0) {
		rc = mr_errf(eb, MR_ESYS, "httpd: unable to set up the event loop: %s",
			     strerror(errno));
		goto fail;
	}
	ev = (struct epoll_event){.events = EPOLLIN, .data.fd = di->epoll_fd};
	if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, di->epoll_fd, &ev) != 0) {
		rc = mr_errf(eb, MR_ESYS, "httpd: epoll_ctl failed: %s", strerror(errno));
		goto fail;
	}
	ev = (struct epoll_event){.events = EPOLLIN, .data.fd = srv->wakefd};
	if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->wakefd, &ev) != 0) {
		rc = mr_errf(eb, MR_ESYS, "httpd: epoll_ctl failed: %s", strerror(errno));
		goto fail;
	}
	ev = (struct epoll_event){.events = EPOLLIN, .data.fd = srv->lfd};
	if (epoll_ctl(srv->epfd, EPOLL_CTL_ADD, srv->lfd, &ev) != 0) {
		rc = mr_errf(eb, MR_ESYS, "httpd: epoll_ctl failed: %s", strerror(errno));
		goto fail;
	}
	rc = pthread_create(&srv->thread, NULL, loop_main, srv);
	if (rc != 0) {
		rc = mr_errf(eb, MR_ESYS, "httpd: unable to start the loop thread: %s",
			     strerror(rc));
		goto fail;
	}
	srv->thread_started = 1;
	mr_log_debug("httpd_started", "port=%d", srv->port);
	*out = srv;
	return 0;
fail:
	srv_free(srv);
	return rc;
}

int mr_httpd_port(const struct mr_httpd *srv)
{
	return srv->port;
}

int mr_httpd_post(struct mr_httpd *srv, void (*fn)(void *arg), void *arg)
{
	struct post_item *it = malloc(sizeof(*it));
	int was_empty;

	if (!it)
		return MR_ENOMEM;
	it->next = NULL;
	it->fn = fn;
	it->arg = arg;
	pthread_mutex_lock(&srv->lock);
	if (srv->closed) {
		pthread_mutex_unlock(&srv->lock);
		free(it);
		return MR_ECLOSED;
	}
	was_empty = srv->post_head == NULL;
	if (srv->post_tail)
		srv->post_tail->next = it;
	else
		srv->post_head = it;
	srv->post_tail = it;
	pthread_mutex_unlock(&srv->lock);
	if (was_empty)
		wake(srv);
	return 0;
}

void mr_httpd_stop(struct mr_httpd *srv)
{
	if (!srv)
		return;
	if (srv->thread_started && pthread_equal(srv->thread, pthread_self())) {
		mr_log_error("httpd_stop_misuse", "msg=%s",
			     mr_log_q("mr_httpd_stop called from the loop thread"));
		return;
	}
	if (srv->thread_started) {
		atomic_store(&srv->stop_req, 1);
		wake(srv);
		pthread_join(srv->thread, NULL);
	}
	srv_free(srv);
}
