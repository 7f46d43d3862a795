/*
 * httpc.c - HTTP client on libcurl (see mr_httpc.h).
 *
 * Each client owns one easy handle driven through its own multi handle:
 * the multi handle keeps the connection cache (keep-alive across calls)
 * and gives curl_multi_poll()/curl_multi_wakeup(), which is how another
 * thread's mr_httpc_abort() interrupts a transfer or a backoff sleep at
 * once instead of at libcurl's next progress tick.
 *
 * Non-goals: concurrency within one client (one request at a time), TLS
 * tuning, redirects.
 */
#include "mr_httpc.h"
#include "mr_json.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc;

static void global_init(void)
{
	global_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* xorshift64*: per-client, so threads never share RNG state. */
static uint64_t rng_next(struct mr_httpc *c)
{
	uint64_t x = c->rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	c->rng = x;
	return x * 0x2545F4914F6CDD1DULL;
}

int mr_httpc_init(struct mr_httpc *c, const struct mr_httpc_opts *o, struct mr_errbuf *eb)
{
	struct timespec ts;
	size_t n;
	int rc;

	memset(c, 0, sizeof(*c));
	if (!o || !o->base_url || !o->base_url[0])
		return mr_errf_field(eb, MR_EINVAL, "base_url", "httpc: 'base_url' is required");
	pthread_once(&global_once, global_init);
	if (global_rc != CURLE_OK)
		return mr_errf(eb, MR_ESYS, "httpc: curl_global_init failed: %s",
			       curl_easy_strerror(global_rc));
	c->o = *o;
	c->o.base_url = NULL;
	c->o.token = NULL;
	{
		const char *tls[3] = { o->tls_ca ? o->tls_ca : getenv("MESHRUN_TLS_CA"),
				       o->tls_cert ? o->tls_cert : getenv("MESHRUN_TLS_CERT"),
				       o->tls_key ? o->tls_key : getenv("MESHRUN_TLS_KEY") };

		for (int i = 0; i < 3; i++)
			if (tls[i] && tls[i][0] && !(c->tls[i] = strdup(tls[i])))
				goto nomem;
		c->o.tls_ca = c->o.tls_cert = c->o.tls_key = NULL;
	}
	if (!c->o.connect_timeout_ms)
		c->o.connect_timeout_ms = 2000;
	if (!c->o.timeout_ms)
		c->o.timeout_ms = 30000;
	if (c->o.max_retries < 0)
		c->o.max_retries = 5;
	if (!c->o.backoff_initial_ms)
		c->o.backoff_initial_ms = 50;
	if (!c->o.backoff_max_ms)
		c->o.backoff_max_ms = 2000;
	if (!c->o.max_response)
		c->o.max_response = (size_t)16 << 20;
	/* Strip a trailing '/' so base + "/v1/..." never doubles it. */
	c->base_url = strdup(o->base_url);
	if (!c->base_url)
		goto nomem;
	n = strlen(c->base_url);
	while (n && c->base_url[n - 1] == '/')
		c->base_url[--n] = '\0';
	if (o->token && o->token[0]) {
		size_t len = strlen(o->token) + sizeof("Authorization: Bearer ");

		c->auth = malloc(len);
		if (!c->auth)
			goto nomem;
		snprintf(c->auth, len, "Authorization: Bearer %s", o->token);
	}
	c->curl = curl_easy_init();
	c->multi = curl_multi_init();
	if (!c->curl || !c->multi)
		goto nomem;
	clock_gettime(CLOCK_REALTIME, &ts);
	c->rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ (uint64_t)(uintptr_t)c;
	if (!c->rng)
		c->rng = 0x9E3779B97F4A7C15ULL;
	atomic_init(&c->aborted, 0);
	return 0;
nomem:
	rc = mr_errf(eb, MR_ENOMEM, "httpc: out of memory");
	mr_httpc_release(c);
	return rc;
}

void mr_httpc_release(struct mr_httpc *c)
{
	if (!c)
		return;
	if (c->curl)
		curl_easy_cleanup(c->curl);
	if (c->multi)
		curl_multi_cleanup(c->multi);
	free(c->base_url);
	free(c->auth);
	for (int i = 0; i < 3; i++) {
		free(c->tls[i]);
		c->tls[i] = NULL;
	}
	c->curl = c->multi = NULL;
	c->base_url = c->auth = NULL;
}

void mr_httpc_abort(struct mr_httpc *c)
{
	atomic_store(&c->aborted, 1);
	if (c->multi)
		curl_multi_wakeup(c->multi);
}

void mr_httpc_clear_abort(struct mr_httpc *c)
{
	atomic_store(&c->aborted, 0);
}

void mr_http_resp_release(struct mr_http_resp *resp)
{
	if (!resp)
		return;
	free(resp->body);
	resp->body = NULL;
	resp->len = 0;
}

/* ---- one attempt ----------------------------------------------------------- */

struct xfer {
	struct mr_httpc *c;
	char *body;
	size_t len, cap;
	int too_big;
	char etag[128];
};

static size_t on_body(char *p, size_t sz, size_t nm, void *ud)
{
	struct xfer *x = ud;
	size_t n = sz * nm, cap;
	char *nb;

	if (n > x->c->o.max_response - x->len) {
		x->too_big = 1;
		return 0;
	}
	if (x->len + n + 1 > x->cap) {
		cap = x->cap ? x->cap : 1024;
		while (cap < x->len + n + 1)
			cap *= 2;
		nb = realloc(x->body, cap);
		if (!nb)
			return 0;
		x->body = nb;
		x->cap = cap;
	}
	memcpy(x->body + x->len, p, n);
	x->len += n;
	x->body[x->len] = '\0';
	return n;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *ud)
{
	struct xfer *x = ud;
	size_t n = sz * nm, vl;
	const char *v;

	if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
		x->etag[0] = '\0'; /* a new status line (after 100 Continue) */
	} else if (n > 5 && strncasecmp(p, "etag:", 5) == 0) {
		v = p + 5;
		vl = n - 5;
		while (vl && (*v == ' ' || *v == '\t')) {
			v++;
			vl--;
		}
		while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n' || v[vl - 1] == ' '))
			vl--;
		if (vl >= sizeof(x->etag))
			vl = sizeof(x->etag) - 1;
		memcpy(x->etag, v, vl);
		x->etag[vl] = '\0';
	}
	return n;
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	struct mr_httpc *c = ud;

	(void)dt;
	(void)dn;
	(void)ut;
	(void)un;
	return atomic_load(&c->aborted) ? 1 : 0;
}

static int map_curl(CURLcode cc, const struct xfer *x, const char *url, struct mr_errbuf *eb)
{
	switch (cc) {
	case CURLE_OK:
		return 0;
	case CURLE_OPERATION_TIMEDOUT:
		return mr_errf(eb, MR_ETIMEDOUT, "request to '%s' timed out", url);
	case CURLE_ABORTED_BY_CALLBACK:
		return mr_errf(eb, MR_EABORTED, "request to '%s' aborted", url);
	case CURLE_OUT_OF_MEMORY:
		return mr_errf(eb, MR_ENOMEM, "request to '%s': out of memory", url);
	case CURLE_WRITE_ERROR:
		if (x->too_big)
			return mr_errf(eb, MR_ELIMIT, "response from '%s' exceeds %zu bytes", url,
				       x->c->o.max_response);
		return mr_errf(eb, MR_ENOMEM, "request to '%s': out of memory", url);
	case CURLE_PEER_FAILED_VERIFICATION:
		if (x->c->tls[0])
			return mr_errf(eb, MR_EPROTO,
				       "request to '%s': the server's certificate does not verify "
				       "against the CA file '%s' (%s)",
				       url, x->c->tls[0], x->c->err);
		return mr_errf(eb, MR_EPROTO,
			       "request to '%s': the server's certificate does not verify against "
			       "the system's CAs (%s)",
			       url, x->c->err);
	case CURLE_SSL_CACERT_BADFILE:
	case CURLE_SSL_CERTPROBLEM:
	case CURLE_SSL_CONNECT_ERROR:
		return mr_errf(eb, MR_EPROTO, "request to '%s': TLS failed: %s (%s)", url,
			       curl_easy_strerror(cc), x->c->err);
	case CURLE_UNSUPPORTED_PROTOCOL:
	case CURLE_WEIRD_SERVER_REPLY:
		return mr_errf(eb, MR_EPROTO,
			       "request to '%s' failed: %s (%s)%s", url, curl_easy_strerror(cc),
			       x->c->err,
			       strncmp(url, "http://", 7) ? ""
			       : "; does the server speak HTTPS? use an https:// URL and --tls-ca");
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
		return mr_errf(eb, MR_ECONN, "request to '%s' failed: %s%s", url,
			       curl_easy_strerror(cc),
			       cc == CURLE_GOT_NOTHING && !strncmp(url, "http://", 7)
				       ? " (a TLS server answers plain HTTP with nothing: use "
					 "https:// and --tls-ca)"
				       : "");
	default:
		return mr_errf(eb, MR_EPROTO, "request to '%s' failed: %s", url,
			       curl_easy_strerror(cc));
	}
}

static int retryable(int rc, long status)
{
	if (rc == 0)
		return status == 502 || status == 503 || status == 504;
	return rc == MR_ECONN || rc == MR_ETIMEDOUT;
}

/* Runs the configured easy handle to completion or abort. */
static CURLcode drive(struct mr_httpc *c)
{
	CURLcode cc = CURLE_OK;
	int running = 1, left;
	CURLMsg *m;

	if (curl_multi_add_handle(c->multi, c->curl) != CURLM_OK)
		return CURLE_FAILED_INIT;
	while (running) {
		if (atomic_load(&c->aborted)) {
			cc = CURLE_ABORTED_BY_CALLBACK;
			goto out;
		}
		if (curl_multi_perform(c->multi, &running) != CURLM_OK) {
			cc = CURLE_FAILED_INIT;
			goto out;
		}
		if (running)
			curl_multi_poll(c->multi, NULL, 0, 1000, NULL);
	}
	while ((m = curl_multi_info_read(c->multi, &left)))
		if (m->msg == CURLMSG_DONE && m->easy_handle == c->curl)
			cc = m->data.result;
out:
	curl_multi_remove_handle(c->multi, c->curl);
	return cc;
}

static int attempt(struct mr_httpc *c, const struct mr_httpc_req *req, const char *url,
		   long timeout_ms, struct mr_http_resp *resp, struct mr_errbuf *eb)
{
	struct curl_slist *h = NULL, *t;
	const char *method = req->method ? req->method : "GET";
	struct xfer x = {.c = c};
	char ct[160];
	CURLcode cc;
	int rc = 0;
	size_t i;

	CURL *e = c->curl;

	curl_easy_reset(e);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, c->o.connect_timeout_ms);
	c->err[0] = '\0';
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, c->err);
	if (c->tls[0])
		curl_easy_setopt(e, CURLOPT_CAINFO, c->tls[0]);
	if (c->tls[1])
		curl_easy_setopt(e, CURLOPT_SSLCERT, c->tls[1]);
	if (c->tls[2])
		curl_easy_setopt(e, CURLOPT_SSLKEY, c->tls[2]);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(e, CURLOPT_HEADERDATA, &x);
	curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(e, CURLOPT_XFERINFODATA, c);
	curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);

	if (strcmp(method, "HEAD") == 0) {
		curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
	} else if (req->body || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0) {
		curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, req->body ? req->body : "");
		if (strcmp(method, "POST") != 0)
			curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	} else if (strcmp(method, "GET") != 0) {
		curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	}

	/* An empty "Expect:" stops curl waiting for 100 Continue on bodies. */
	h = curl_slist_append(h, "Expect:");
	if (h && req->body) {
		snprintf(ct, sizeof(ct), "Content-Type: %s",
			 req->content_type ? req->content_type : "application/json");
		h = (t = curl_slist_append(h, ct)) ? t : (curl_slist_free_all(h), NULL);
	}
	if (h && c->auth)
		h = (t = curl_slist_append(h, c->auth)) ? t : (curl_slist_free_all(h), NULL);
	for (i = 0; h && req->headers && req->headers[i]; i++)
		h = (t = curl_slist_append(h, req->headers[i])) ? t : (curl_slist_free_all(h), NULL);
	if (!h) {
		rc = mr_errf(eb, MR_ENOMEM, "httpc: out of memory");
		goto out;
	}
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);

	cc = drive(c);
	{
		long nc = 0;

		curl_easy_getinfo(e, CURLINFO_NUM_CONNECTS, &nc);
		resp->connects += (int)nc;
	}
	if (cc != CURLE_OK) {
		rc = map_curl(cc, &x, url, eb);
		goto out;
	}
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &resp->status);
	if (!x.body) {
		x.body = calloc(1, 1);
		if (!x.body) {
			rc = mr_errf(eb, MR_ENOMEM, "httpc: out of memory");
			goto out;
		}
	}
	resp->body = x.body;
	resp->len = x.len;
	x.body = NULL;
	memcpy(resp->etag, x.etag, sizeof(resp->etag));
out:
	/* the handle must not keep pointers to this frame's header list */
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, NULL);
	curl_slist_free_all(h);
	free(x.body);
	return rc;
}

/* Sleeps ms unless aborted first; returns MR_EABORTED if aborted. */
static int backoff_sleep(struct mr_httpc *c, long ms)
{
	uint64_t end = now_ms() + (uint64_t)ms;

	for (;;) {
		uint64_t now = now_ms();

		if (atomic_load(&c->aborted))
			return MR_EABORTED;
		if (now >= end)
			return 0;
		curl_multi_poll(c->multi, NULL, 0, (int)(end - now), NULL);
	}
}

int mr_httpc_request(struct mr_httpc *c, const struct mr_httpc_req *req,
		     struct mr_http_resp *resp, struct mr_errbuf *eb)
{
	struct mr_errbuf last;
	long timeout = req->timeout_ms > 0 ? req->timeout_ms : c->o.timeout_ms;
	int retries = req->max_retries >= 0 ? req->max_retries : c->o.max_retries;
	size_t ulen;
	char *url;
	int k, rc = 0;

	memset(resp, 0, sizeof(*resp));
	memset(&last, 0, sizeof(last));
	if (!req->path)
		return mr_errf_field(eb, MR_EINVAL, "path", "httpc: 'path' is required");
	ulen = strlen(c->base_url) + strlen(req->path) + 1;
	url = malloc(ulen);
	if (!url)
		return mr_errf(eb, MR_ENOMEM, "httpc: out of memory");
	snprintf(url, ulen, "%s%s", c->base_url, req->path);

	for (k = 0;; k++) {
		long cap, sleep_ms;

		if (atomic_load(&c->aborted)) {
			rc = mr_errf(eb, MR_EABORTED, "request to '%s' aborted", url);
			break;
		}
		mr_http_resp_release(resp);
		resp->status = 0;
		resp->etag[0] = '\0';
		mr_errbuf_clear(&last);
		resp->attempts = k + 1;
		rc = attempt(c, req, url, timeout, resp, &last);
		if (!retryable(rc, resp->status) || k >= retries)
			break;
		cap = c->o.backoff_initial_ms;
		for (int i = 0; i < k && cap < c->o.backoff_max_ms; i++)
			cap *= 2;
		if (cap > c->o.backoff_max_ms)
			cap = c->o.backoff_max_ms;
		sleep_ms = (long)(rng_next(c) % (uint64_t)(cap + 1));
		if (backoff_sleep(c, sleep_ms) != 0) {
			mr_http_resp_release(resp);
			resp->status = 0;
			rc = mr_errf(eb, MR_EABORTED, "request to '%s' aborted", url);
			goto out;
		}
	}
	if (rc != 0) {
		mr_http_resp_release(resp);
		if (rc != MR_EABORTED || last.msg[0])
			mr_errf(eb, rc, "%s%s", last.msg,
				resp->attempts > 1 ? " (after retries)" : "");
	}
out:
	free(url);
	return rc;
}

int mr_httpc_json(struct mr_httpc *c, const char *method, const char *path, json_t *body,
		  long timeout_ms, long *status, json_t **out, struct mr_errbuf *eb)
{
	struct mr_httpc_req req = {.method = method, .path = path, .timeout_ms = timeout_ms,
				   .max_retries = -1};
	struct mr_http_resp resp;
	char *s = NULL;
	int rc;

	if (out)
		*out = NULL;
	if (status)
		*status = 0;
	if (body) {
		s = mr_json_dump(body, &req.body_len);
		if (!s)
			return mr_errf(eb, MR_ENOMEM, "httpc: out of memory");
		req.body = s;
	}
	rc = mr_httpc_request(c, &req, &resp, eb);
	free(s);
	if (rc != 0)
		return rc;
	if (status)
		*status = resp.status;
	if (out && resp.len)
		*out = json_loadb(resp.body, resp.len, 0, NULL);
	mr_http_resp_release(&resp);
	return 0;
}
