/*
 * mr_httpc.h - HTTP client on libcurl for agents and tools talking to the
 * controller.
 *
 * One struct mr_httpc per thread: the caller allocates it, mr_httpc_init()
 * sets it up, mr_httpc_release() frees what it holds. It keeps its
 * connection open across calls (keep-alive), so an agent's join, wait, KV
 * and heartbeat calls share one TCP connection.
 *
 * Transport failures (refused, reset, timed out) and 502/503/504 answers
 * are retried with full-jitter exponential backoff: attempt k sleeps a
 * uniform random time in [0, min(backoff_max, backoff_initial * 2^k)].
 * Every other status is returned as is. Retries resend the request, so
 * the server must treat repeats of mutating calls as idempotent (the
 * controller does: joins carry a node id, KV writes are CAS or sets).
 *
 * mr_httpc_abort() may be called from any thread (or a signal-driven
 * shutdown path on another thread): the request in flight and every retry
 * stop promptly with MR_EABORTED, and so does every later call until
 * mr_httpc_clear_abort().
 *
 * TLS: peer and host are always verified (libcurl's defaults, never
 * turned off); ca_file names the CA bundle to verify with (a Kubernetes
 * service account's ca.crt) instead of the system's.
 *
 * Non-goals: other TLS options (client certificates, pinning), HTTP/2,
 * streaming bodies, cookies, redirects (never followed).
 */
#ifndef MR_HTTPC_H
#define MR_HTTPC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "mr_err.h"

struct mr_httpc_opts {
	const char *base_url;      /* "http://127.0.0.1:8080"; copied */
	const char *token;         /* bearer token or NULL; copied */
	long connect_timeout_ms;   /* 0 = 2000 */
	long timeout_ms;           /* per attempt, 0 = 30000 */
	int max_retries;           /* retries after the first attempt; -1 = 5 */
	long backoff_initial_ms;   /* 0 = 50 */
	long backoff_max_ms;       /* 0 = 2000 */
	size_t max_response;       /* body cap, 0 = 16 MiB (larger: MR_ELIMIT) */
	const char *ca_file;       /* PEM CA bundle for https, NULL = the system's; copied */
};

struct mr_httpc {
	void *curl;  /* CURL * */
	void *multi; /* CURLM * */
	char *base_url;
	char *auth;  /* "Authorization: Bearer ..." or NULL */
	char *ca_file; /* or NULL */
	struct mr_httpc_opts o;
	uint64_t rng;
	atomic_int aborted;
};

struct mr_httpc_req {
	const char *method;       /* "GET", "POST", ...; NULL = GET */
	const char *path;         /* appended to base_url, query included */
	const char *content_type; /* NULL = application/json when body set */
	const void *body;         /* may be NULL */
	size_t body_len;
	const char *const *headers; /* extra "Name: value" lines, NULL-ended */
	long timeout_ms;          /* 0 = the client's default */
	int max_retries;          /* -1 = the client's default */
};

struct mr_http_resp {
	long status;
	char *body;     /* malloc'd, NUL-terminated ("" when empty) */
	size_t len;
	char etag[128]; /* ETag header value as sent (quotes kept), "" if none */
	int attempts;   /* attempts made, for logs and tests */
	int connects;   /* new TCP connections opened (0 = kept-alive reuse) */
};

/* Sets c up; c->... fields are private. Returns MR_EINVAL naming the
 * field for a missing base_url, MR_ENOMEM on allocation failure. */
int mr_httpc_init(struct mr_httpc *c, const struct mr_httpc_opts *opts,
		  struct mr_errbuf *eb);
/* Frees what c holds (not c itself) and closes its connection. */
void mr_httpc_release(struct mr_httpc *c);

/* One request with retries. 0 when an HTTP answer arrived (any status,
 * in resp->status; resp must then be released); otherwise MR_ECONN,
 * MR_ETIMEDOUT, MR_EABORTED, MR_ELIMIT, MR_ENOMEM or MR_EPROTO with eb
 * set, and resp holds nothing to release. */
int mr_httpc_request(struct mr_httpc *c, const struct mr_httpc_req *req,
		     struct mr_http_resp *resp, struct mr_errbuf *eb);
void mr_http_resp_release(struct mr_http_resp *resp);

/* JSON convenience: body (borrowed, may be NULL) is sent as JSON; *out
 * gets the parsed reply (new reference, NULL when the reply body is
 * empty or not JSON) and *status the status. Same return codes as
 * mr_httpc_request. */
int mr_httpc_json(struct mr_httpc *c, const char *method, const char *path, json_t *body,
		  long timeout_ms, long *status, json_t **out, struct mr_errbuf *eb);

/* Thread-safe; sticky until mr_httpc_clear_abort(). */
void mr_httpc_abort(struct mr_httpc *c);
/* Owner thread only, with no request in flight. */
void mr_httpc_clear_abort(struct mr_httpc *c);

#endif
