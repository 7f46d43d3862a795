/*
 * httpd_req.c - one request of the HTTP server (see mr_httpd.h): its
 * method, path, query, headers, body and peer, and the replies (raw, JSON,
 * error), extra headers and suspension for long-polls. Loop thread only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "httpd_int.h"
#include "mr_json.h"
#include "mr_log.h"

/* ---- replies ------------------------------------------------------------- */

/* Queues resp (consumed) as the one reply to req; resumes it if suspended. */
static void reply_resp(struct mr_http_req *req, int status, struct MHD_Response *resp)
{
	struct mr_httpd *srv = req->srv;
	struct hdr *h;

	if (req->replied) {
		mr_log_error("httpd_double_reply", "path=%s status=%d", mr_log_q(req->url),
			     status);
		MHD_destroy_response(resp);
		return;
	}
	req->replied = 1;
	for (h = req->hdrs; h; h = h->next)
		MHD_add_response_header(resp, h->name, h->value);
	mr__httpd_free_hdrs(req);
	/* a reserve slot is freed as soon as its one reply is out */
	if (srv->stopping || req->reserve)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
	if (MHD_queue_response(req->conn, (unsigned)status, resp) != MHD_YES)
		req->queue_failed = 1;
	MHD_destroy_response(resp);
	if (req->suspended) {
		mr__httpd_susp_unlink(srv, req);
		req->resumed = 1;
		srv->n_resumed++;
		MHD_resume_connection(req->conn);
		/* In external-poll mode libmicrohttpd does not wake its epoll
		 * fd on resume: the loop must call MHD_run() again at once. */
		srv->resumed_since_run = 1;
	}
}

void mr_http_add_header(struct mr_http_req *req, const char *name, const char *value)
{
	size_t nl = strlen(name), vl = strlen(value);
	struct hdr *h;

	if (req->replied)
		return;
	h = malloc(sizeof(*h) + nl + vl + 2);
	if (!h)
		return;
	memcpy(h->name, name, nl + 1);
	h->value = h->name + nl + 1;
	memcpy(h->value, value, vl + 1);
	h->next = req->hdrs;
	req->hdrs = h;
}

void mr_http_reply(struct mr_http_req *req, int status, const char *content_type,
		   const void *body, size_t len)
{
	struct MHD_Response *resp;

	resp = MHD_create_response_from_buffer(len, (void *)(body ? body : ""),
					       MHD_RESPMEM_MUST_COPY);
	if (!resp) {
		/* Out of memory: an empty response needs no allocation of ours;
		 * if even that fails the connection is dropped at resume. */
		resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
		status = 500;
		if (!resp) {
			req->replied = 1;
			req->queue_failed = 1;
			return;
		}
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
				content_type ? content_type : "text/plain; charset=utf-8");
	reply_resp(req, status, resp);
}

void mr_http_reply_take(struct mr_http_req *req, int status, const char *content_type,
			void *body, size_t len)
{
	struct MHD_Response *resp = NULL;

	if (body && len)
		resp = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!resp) { /* empty, or no memory for the response: the copying way */
		mr_http_reply(req, status, content_type, body, len);
		free(body);
		return;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
				content_type ? content_type : "text/plain; charset=utf-8");
	reply_resp(req, status, resp);
}

void mr_http_reply_json(struct mr_http_req *req, int status, json_t *obj)
{
	struct MHD_Response *resp = NULL;
	size_t len = 0;
	char *s = obj ? mr_json_dump(obj, &len) : NULL;

	json_decref(obj);
	if (s)
		resp = MHD_create_response_from_buffer(len, s, MHD_RESPMEM_MUST_FREE);
	if (!resp) {
		static const char oom[] = "{\"error\":{\"code\":\"internal\","
					  "\"message\":\"out of memory\",\"field\":null}}";

		free(s);
		mr_http_reply(req, 500, "application/json", oom, sizeof(oom) - 1);
		return;
	}
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	reply_resp(req, status, resp);
}

void mr_http_reply_error(struct mr_http_req *req, int status, const char *code,
			 const char *field, json_t *extra, const char *fmt, ...)
{
	char msg[MR_ERRBUF_SIZE];
	json_t *o, *err;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	o = json_object();
	err = json_pack("{s:s,s:s,s:s?}", "code", code ? code : "error", "message", msg,
			"field", (field && field[0]) ? field : NULL);
	if (o && err && extra && json_is_object(extra))
		json_object_update(o, extra);
	json_decref(extra);
	if (!o || !err) {
		json_decref(err);
		json_decref(o);
		o = NULL;
	} else {
		json_object_set_new(o, "error", err);
	}
	mr_http_reply_json(req, status, o);
}

void mr_http_suspend(struct mr_http_req *req)
{
	if (!req->replied)
		req->suspend_req = 1;
}

size_t mr_httpd_suspended(const struct mr_httpd *srv)
{
	return srv->n_suspended;
}

/* ---- accessors ----------------------------------------------------------- */

enum mr_http_method mr_http_req_method(const struct mr_http_req *req)
{
	return (enum mr_http_method)req->meth;
}

const char *mr_http_req_method_str(const struct mr_http_req *req)
{
	return req->method;
}

const char *mr_http_req_path(const struct mr_http_req *req)
{
	return req->url;
}

const char *const *mr_http_req_segments(const struct mr_http_req *req, size_t *n)
{
	static const char *const none[] = {"", NULL};

	if (!req->tgt.segs) { /* not reached: the handler only sees parsed paths */
		*n = 1;
		return none;
	}
	*n = req->tgt.nsegs;
	return (const char *const *)req->tgt.segs;
}

const char *mr_http_req_query(const struct mr_http_req *req, const char *key)
{
	const char *v = NULL;
	size_t vl = 0;

	if (MHD_lookup_connection_value_n(req->conn, MHD_GET_ARGUMENT_KIND, key, strlen(key),
					  &v, &vl) != MHD_YES)
		return NULL;
	return v ? v : "";
}

const char *mr_http_req_header(const struct mr_http_req *req, const char *name)
{
	return MHD_lookup_connection_value(req->conn, MHD_HEADER_KIND, name);
}

const char *mr_http_req_body(const struct mr_http_req *req, size_t *len)
{
	if (len)
		*len = req->body_len;
	return req->body ? req->body : "";
}

int mr_http_req_json(struct mr_http_req *req, json_t **out, struct mr_errbuf *eb)
{
	return mr_json_parse_object(req->body, req->body_len, out, eb);
}

const char *mr_http_req_peer(const struct mr_http_req *req)
{
	struct mr_http_req *r = (struct mr_http_req *)req; /* filled once, when asked */
	const union MHD_ConnectionInfo *ci;
	const struct sockaddr *sa;

	if (r->peer_done)
		return r->peer;
	r->peer_done = 1;
	ci = MHD_get_connection_info(r->conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	sa = ci ? ci->client_addr : NULL;
	r->peer[0] = '\0';
	if (sa && sa->sa_family == AF_INET)
		inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, r->peer,
			  sizeof(r->peer));
	else if (sa && sa->sa_family == AF_INET6)
		inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, r->peer,
			  sizeof(r->peer));
	return r->peer;
}

void mr_http_req_set_user(struct mr_http_req *req, void *user)
{
	req->user = user;
}

void *mr_http_req_user(const struct mr_http_req *req)
{
	return req->user;
}
