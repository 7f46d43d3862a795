/*
 * mr_httpd.h - HTTP server wrapper on libmicrohttpd.
 *
 * One loop thread per server runs libmicrohttpd in epoll mode together with
 * a wake eventfd and a periodic tick. Every callback (handler, tick, posted
 * work) runs on that loop thread, so state owned by the server's user needs
 * no locks as long as only those callbacks touch it (the controller works
 * like this, Redis-style).
 *
 * A handler is called once per request, after the whole body has arrived
 * (bounded by max_body: larger bodies are answered 413 without calling the
 * handler). The handler either replies before returning, or calls
 * mr_http_suspend() and replies later from the loop thread (long-poll,
 * group commit). A suspended request costs no thread, only its connection.
 *
 * Paths: the raw request target is split on '/' and each segment is
 * percent-decoded exactly once, so "%2F" stays inside its segment and
 * "%00" cannot cut a name short. A target that does not start with '/',
 * an escape that is not '%' and two hex digits, and a raw or decoded
 * control byte (0x00-0x1f, 0x7f) are answered 400 "bad_path" before the
 * handler runs; the error's field is "path[i]", i the 0-based index of
 * the bad segment ("/v1/jobs/ns/a" has segments 0 "v1" .. 3 "a"), or
 * "path" for a target that is not a path. Query names and values follow
 * the same rules ('+' is a space): 400 "bad_query", field the argument's
 * decoded name ("query" when the name itself is bad).
 *
 * Framing (RFC 9112 section 6): two Content-Length headers with different
 * values, Transfer-Encoding together with Content-Length, or more than
 * one Transfer-Encoding header: 400 "bad_request" naming the header;
 * a Transfer-Encoding other than chunked: 501 "not_implemented".
 * Identical repeated Content-Length headers are accepted as one. These
 * replies (and 413 from the header) go out before the body is read, and
 * the connection closes after them.
 *
 * Connection limit: the server accepts every connection itself. Up to
 * max_connections they are served as usual. Past it, up to
 * reserve_connections more go to reserve slots (idle timeout
 * min(idle_timeout_s, 5 s), and the whole request due within
 * reserve_request_s of the accept): a request for /healthz, /readyz or
 * /metrics is served there, anything else gets 503 "overloaded" with
 * Retry-After: 1; either way the connection closes after that one reply.
 * Past the reserve too (or when the process is out of file descriptors),
 * the connection gets a fixed 503 "overloaded" JSON reply at once, without
 * its request being read, and is closed. So probes keep answering while
 * the server is full, and nobody waits in the listen backlog.
 *
 * Slow clients (slowloris; as Apache's mod_reqtimeout
 * "header=20 body=20,MinRate=500"): the idle timeout restarts with every
 * byte, so a request also has deadlines. Its headers must be complete
 * within header_timeout_s (default 20 s) of the accept, or of the end of
 * the previous request on a keep-alive connection (so an idle keep-alive
 * connection closes after min(idle_timeout_s, header_timeout_s)). Its
 * body must be complete within body_timeout_s (default 20 s) of the end
 * of the headers plus 1 s for every body_min_rate bytes received (default
 * 500 B/s; counted up to max_body): a steady upload above that rate is
 * never cut, a trickle is. On a reserve slot the whole request is due
 * within reserve_request_s (default 2 s). A connection past its deadline
 * is closed without a reply (the client sees the end of the stream or a
 * reset) and counted; one warn line per class (header, body, reserve) at
 * most every 10 s: event httpd_slow_client with the counts (an idle
 * keep-alive connection closed so is class keepalive, at debug). A request
 * whose handler runs, that is suspended, or whose reply is being sent has
 * no deadline (the idle timeout still applies, except to suspended ones).
 * The deadlines cost O(log n) per request and nothing per idle connection
 * and loop pass (a heap by deadline).
 *
 * Other limits: per-IP connections (extra ones are closed at once, by
 * libmicrohttpd), body size (413 JSON error), header memory per
 * connection (431 from libmicrohttpd), and an idle timeout per connection
 * (silent clients are dropped; keep-alive connections too).
 *
 * TLS (httpd_tls.c): with tls_cert and tls_key the server speaks HTTPS
 * only (a plain-HTTP request fails its handshake and is never read), and
 * reads the files again within a second of a change, so a rotated
 * certificate serves the next handshake while open connections and
 * suspended requests carry on. With tls_client_ca every request but
 * /healthz and /readyz (kubelet probes carry no certificate) needs a
 * client certificate that CA signed: 401 "client_certificate_required".
 * One TLS server per process. The fixed 503 at accept is skipped on a
 * TLS server (it cannot be spoken before a handshake): the socket closes.
 *
 * Non-goals: HTTP/2, chunked uploads beyond max_body, routing tables (the
 * user matches paths).
 */
#ifndef MR_HTTPD_H
#define MR_HTTPD_H

#include <stddef.h>
#include <jansson.h>

#include "mr_err.h"

struct mr_httpd;
struct mr_http_req;

enum mr_http_method {
	MR_HTTP_GET,
	MR_HTTP_HEAD,
	MR_HTTP_POST,
	MR_HTTP_PUT,
	MR_HTTP_DELETE,
	MR_HTTP_OTHER,
};

/* Must reply or suspend before returning. Runs on the loop thread. */
typedef void (*mr_http_handler)(struct mr_http_req *req, void *user);
/* Called after each loop iteration, and at least every tick_ms. */
typedef void (*mr_http_tick)(void *user);

/* Reserve slots when reserve_connections is 0 (a process sizing its file
 * descriptors counts them: each is an open socket). */
#define MR_HTTPD_RESERVE_DEFAULT 16

struct mr_httpd_opts {
	const char *bind_addr;       /* "127.0.0.1", "0.0.0.0"; NULL = any */
	int port;                    /* 0 = ephemeral, see mr_httpd_port() */
	unsigned max_connections;    /* 0 = 1024 */
	unsigned reserve_connections; /* past max_connections, for probes;
				       * 0 = MR_HTTPD_RESERVE_DEFAULT */
	unsigned per_ip_connections; /* 0 = unlimited */
	size_t max_body;             /* 0 = 1 MiB */
	unsigned idle_timeout_s;     /* 0 = 30; suspended requests are exempt */
	/* deadlines of slow clients (see the header comment); 0 = default */
	unsigned header_timeout_s;   /* headers, from accept or the last reply; 0 = 20 */
	unsigned body_timeout_s;     /* body, from the headers; 0 = 20 ... */
	unsigned body_min_rate;      /* ... plus 1 s per this many bytes; 0 = 500 */
	unsigned reserve_request_s;  /* a reserve slot's whole request; 0 = 2 */
	size_t conn_memory;          /* libmicrohttpd pool per connection (request
				      * line + headers + reply headers), 0 = 8 KiB,
				      * min 1 KiB; headers of up to about half of it
				      * fit, larger ones get 431. Bodies are not in
				      * it. ~2.8 KB RSS per idle connection at 2 KiB */
	unsigned tick_ms;            /* 0 = 100 */
	const char *tls_cert;        /* PEM chain; with tls_key: HTTPS (NULL = HTTP) */
	const char *tls_key;         /* PEM private key, unencrypted */
	const char *tls_client_ca;   /* PEM CA of client certificates, or NULL */
	mr_http_handler handler;
	mr_http_tick tick;           /* may be NULL */
	void *user;
};

/* Binds, listens and starts the loop thread. *out is freed by
 * mr_httpd_stop(). */
int mr_httpd_start(struct mr_httpd **out, const struct mr_httpd_opts *opts,
		   struct mr_errbuf *eb);
/* The bound port (useful with port 0). */
int mr_httpd_port(const struct mr_httpd *srv);
/* Stops the loop thread, answers every still-suspended request 503, closes
 * all connections and frees srv. NULL is a no-op. Not from the loop thread. */
void mr_httpd_stop(struct mr_httpd *srv);
/* Runs fn(arg) on the loop thread soon, in posting order. Thread-safe;
 * the only way other threads should touch loop-owned state. Work posted
 * before mr_httpd_stop() runs before stop returns; later posts fail with
 * MR_ECLOSED (fn is then not called and arg stays the caller's). */
int mr_httpd_post(struct mr_httpd *srv, void (*fn)(void *arg), void *arg);

/* ---- request accessors: loop thread only, valid until the reply ---- */
enum mr_http_method mr_http_req_method(const struct mr_http_req *req);
const char *mr_http_req_method_str(const struct mr_http_req *req);
/* Decoded path without the query string, e.g. "/v1/jobs/ns/a": the
 * segments joined by '/' (so a decoded "%2F" reads as '/' here; route on
 * the segments). Never holds a NUL or control byte. */
const char *mr_http_req_path(const struct mr_http_req *req);
/* The path's segments after the leading '/', each decoded once:
 * "/v1/jobs/a%2Fb/" gives {"v1", "jobs", "a/b", ""} and *n = 4 ("/" gives
 * {""}). NULL-terminated; no NUL or control bytes inside. */
const char *const *mr_http_req_segments(const struct mr_http_req *req, size_t *n);
/* Decoded query argument, NULL if absent ("" if present without value);
 * the first one when repeated. Never holds a NUL or control byte. */
const char *mr_http_req_query(const struct mr_http_req *req, const char *key);
/* Request header (case-insensitive name), NULL if absent. */
const char *mr_http_req_header(const struct mr_http_req *req, const char *name);
/* The body, NUL-terminated for convenience (len excludes the NUL). */
const char *mr_http_req_body(const struct mr_http_req *req, size_t *len);
/* Parses the body as a JSON object (mr_json_parse_object); *out is a new
 * reference. On failure eb names the problem, ready for a 400. */
int mr_http_req_json(struct mr_http_req *req, json_t **out, struct mr_errbuf *eb);
/* Peer IP as text. */
const char *mr_http_req_peer(const struct mr_http_req *req);
/* One pointer of user data per request (e.g. a waiter record). */
void mr_http_req_set_user(struct mr_http_req *req, void *user);
void *mr_http_req_user(const struct mr_http_req *req);

/* ---- replies: exactly one per request; loop thread only ---- */
/* Adds a response header to the coming reply (e.g. "ETag"). Copied. */
void mr_http_add_header(struct mr_http_req *req, const char *name, const char *value);
/* Body is copied. content_type NULL = "text/plain; charset=utf-8". */
void mr_http_reply(struct mr_http_req *req, int status, const char *content_type,
		   const void *body, size_t len);
/* The same with a body from malloc() that the server frees once sent (no
 * copy); freed at once if the reply cannot be made. */
void mr_http_reply_take(struct mr_http_req *req, int status, const char *content_type,
			void *body, size_t len);
/* Steals the reference to obj; compact JSON, application/json. */
void mr_http_reply_json(struct mr_http_req *req, int status, json_t *obj);
/* {"error":{"code":code,"message":...,"field":field}}; field may be NULL.
 * extra (may be NULL) is merged into the top-level object and stolen
 * (e.g. {"generation":7} on a 409). */
void mr_http_reply_error(struct mr_http_req *req, int status, const char *code,
			 const char *field, json_t *extra, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));

/* Keep the request open after the handler returns; reply later from the
 * loop thread (from tick, posted work or another request's handler).
 * Replying resumes the connection; a reply from inside the handler that
 * suspended is allowed too (the suspension is then cancelled). Any number
 * of replies may resume connections in one loop iteration: libmicrohttpd
 * picks them all up in its next pass, which walks its whole suspended
 * list once (about 20 ns per suspended connection, so ~2 ms at 100,000):
 * wake waiters in batches (one tick) rather than one pass per waiter
 * where that matters.
 *
 * A suspended request is not watched for client disconnects, does not
 * time out, and stays valid until replied to. mr_httpd_stop() answers
 * the ones still open 503 itself: after stop the user must drop its
 * pointers to them without replying. */
void mr_http_suspend(struct mr_http_req *req);
/* Number of currently suspended requests (loop thread only). */
size_t mr_httpd_suspended(const struct mr_httpd *srv);

#endif
