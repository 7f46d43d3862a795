/*
 * http.c - /healthz, /readyz and /metrics of meshrun-agent; see http.h.
 */
#include "http.h"

#include <stdlib.h>
#include <string.h>

static void handle(struct mr_http_req *req, void *user)
{
	struct mr_supervisor *sv = user;
	const char *path = mr_http_req_path(req);
	enum mr_http_method m = mr_http_req_method(req);
	char *text = NULL;
	size_t len = 0;

	if (strcmp(path, "/healthz") && strcmp(path, "/readyz") && strcmp(path, "/metrics")) {
		mr_http_reply_error(req, 404, "not_found", NULL, NULL, "no route '%s'", path);
		return;
	}
	if (m != MR_HTTP_GET && m != MR_HTTP_HEAD) {
		mr_http_reply_error(req, 405, "method_not_allowed", NULL, NULL,
				    "'%s' is read-only", path);
		return;
	}
	if (!strcmp(path, "/healthz")) {
		mr_http_reply(req, 200, NULL, "ok\n", 3);
	} else if (!strcmp(path, "/readyz")) {
		const char *st = mr_agent_state_name(atomic_load(&sv->state));
		char body[64];
		int n = snprintf(body, sizeof(body), "%s\n", st);

		mr_http_reply(req, atomic_load(&sv->ready) ? 200 : 503, NULL, body, (size_t)n);
	} else if (mr_metrics_render(sv->metrics.reg, &text, &len) == 0) {
		mr_http_reply(req, 200, MR_METRICS_CONTENT_TYPE, text, len);
		free(text);
	} else {
		mr_http_reply_error(req, 500, "internal", NULL, NULL, "out of memory");
	}
}

int mr_agent_http_start(struct mr_httpd **out, struct mr_supervisor *sv, const char *addr,
			int port, struct mr_errbuf *eb)
{
	struct mr_httpd_opts o = {.bind_addr = addr, .port = port, .max_connections = 64,
				  .max_body = 4096, .idle_timeout_s = 30, .handler = handle,
				  .user = sv};

	return mr_httpd_start(out, &o, eb);
}
