/*
 * k8s_node.c - the agent's topology path from its Node's labels, read
 * from the Kubernetes API server over mr_httpc; see k8s_node.h.
 *
 * One call: check the labels list and the node name, find the API and
 * the service account, read the token, GET the Node (own retry loop:
 * mr_httpc retries only 502/503/504, the API server also answers 500 and
 * 429 when it is busy), then join the label values.
 *
 * Non-goals: a Kubernetes client (one GET of one object), caching (the
 * caller asks once at start).
 */
#include "k8s_node.h"

#include "mr_file.h"
#include "mr_httpc.h"
#include "mr_json.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SA_DIR_DEFAULT "/var/run/secrets/kubernetes.io/serviceaccount"
#define TOKEN_MAX (64 * 1024)
#define BODY_MAX ((size_t)1 << 20)
#define NODE_NAME_MAX 253
#define TRIES 3
#define BACKOFF_MS 200 /* before the 2nd try; doubled before the 3rd */
#define URL_MAX 1024

struct label_keys {
	int n;
	char key[MR_K8S_NODE_MAX_LABELS][MR_K8S_NODE_KEY_MAX + 1];
};

static int is_segment_char(int ch)
{
	return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
	       ch == '.' || ch == '_' || ch == '-';
}

/* labels -> keys: 1..8 non-empty keys of [A-Za-z0-9._/-], spaces around
 * each trimmed. */
static int parse_labels(const char *labels, struct label_keys *lk, struct mr_errbuf *eb)
{
	const char *p = labels;

	lk->n = 0;
	if (!labels || !labels[0])
		return mr_errf_field(eb, MR_EINVAL, "labels",
				     "labels: the list is empty (want label keys, widest domain "
				     "first, e.g. 'example.com/block,example.com/rack')");
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);

		while (len && *p == ' ') {
			p++;
			len--;
		}
		while (len && p[len - 1] == ' ')
			len--;
		if (len == 0)
			return mr_errf_field(eb, MR_EINVAL, "labels",
					     "labels: empty key at position %d in '%s'", lk->n + 1,
					     labels);
		if (lk->n == MR_K8S_NODE_MAX_LABELS)
			return mr_errf_field(eb, MR_EINVAL, "labels",
					     "labels: more than %d keys in '%s'",
					     MR_K8S_NODE_MAX_LABELS, labels);
		if (len > MR_K8S_NODE_KEY_MAX)
			return mr_errf_field(eb, MR_EINVAL, "labels",
					     "labels: key %d is %zu characters (at most %d)",
					     lk->n + 1, len, MR_K8S_NODE_KEY_MAX);
		for (size_t i = 0; i < len; i++)
			if (!is_segment_char((unsigned char)p[i]) && p[i] != '/')
				return mr_errf_field(eb, MR_EINVAL, "labels",
						     "labels: key '%.*s' has a character outside "
						     "[A-Za-z0-9._/-]",
						     (int)len, p);
		memcpy(lk->key[lk->n], p, len);
		lk->key[lk->n][len] = '\0';
		lk->n++;
		if (!end)
			return 0;
		p = end + 1;
	}
}

static int check_node_name(const char *node, struct mr_errbuf *eb)
{
	size_t len = node ? strlen(node) : 0;

	if (len == 0)
		return mr_errf_field(eb, MR_EINVAL, "node",
				     "node: the name is empty (set it from spec.nodeName with the "
				     "downward API)");
	if (len > NODE_NAME_MAX)
		return mr_errf_field(eb, MR_EINVAL, "node", "node: the name is %zu characters "
				     "(at most %d)", len, NODE_NAME_MAX);
	for (size_t i = 0; i < len; i++)
		if (!is_segment_char((unsigned char)node[i]))
			return mr_errf_field(eb, MR_EINVAL, "node",
					     "node: '%s' is not a node name (a character outside "
					     "[A-Za-z0-9._-])",
					     node);
	return 0;
}

/* The API base URL into buf; *https set when it is https. */
static int api_base(char *buf, size_t cap, int *https, struct mr_errbuf *eb)
{
	const char *api = getenv("MESHRUN_K8S_API");
	const char *host = getenv("KUBERNETES_SERVICE_HOST");
	const char *port = getenv("KUBERNETES_SERVICE_PORT");
	int n;

	if (api && api[0]) {
		if (strncmp(api, "http://", 7) && strncmp(api, "https://", 8))
			return mr_errf_field(eb, MR_EINVAL, "MESHRUN_K8S_API",
					     "MESHRUN_K8S_API: '%s' is not an http:// or https:// "
					     "URL", api);
		n = snprintf(buf, cap, "%s", api);
	} else {
		if (!host || !host[0])
			return mr_errf_field(eb, MR_EINVAL, "KUBERNETES_SERVICE_HOST",
					     "KUBERNETES_SERVICE_HOST is not set (nor "
					     "MESHRUN_K8S_API): not in a pod? set MESHRUN_TOPOLOGY "
					     "instead");
		if (!port || !port[0])
			return mr_errf_field(eb, MR_EINVAL, "KUBERNETES_SERVICE_PORT",
					     "KUBERNETES_SERVICE_PORT is not set (but "
					     "KUBERNETES_SERVICE_HOST is '%s')", host);
		if (strchr(host, ':') && host[0] != '[')
			n = snprintf(buf, cap, "https://[%s]:%s", host, port);
		else
			n = snprintf(buf, cap, "https://%s:%s", host, port);
	}
	if (n < 0 || (size_t)n >= cap)
		return mr_errf_field(eb, MR_ELIMIT, "MESHRUN_K8S_API",
				     "the API server URL is longer than %zu bytes", cap - 1);
	*https = strncmp(buf, "https://", 8) == 0;
	return 0;
}

/* The token file's text, trailing whitespace trimmed, into *tok (malloc'd). */
static int read_token(const char *path, char **tok, struct mr_errbuf *eb)
{
	struct mr_errbuf why = {0};
	size_t len = 0;
	char *t = NULL;
	int rc;

	*tok = NULL;
	rc = mr_file_read_small(path, "service-account token", TOKEN_MAX, &t, &len, &why);
	if (rc == MR_ELIMIT)
		return mr_errf_field(eb, MR_ELIMIT, "MESHRUN_K8S_SA_DIR",
				     "service-account token '%s' is over %d bytes", path, TOKEN_MAX);
	if (rc < 0)
		return mr_errf_field(eb, MR_EIO, "MESHRUN_K8S_SA_DIR",
				     "%s (is automountServiceAccountToken off?)", why.msg);
	while (len && (t[len - 1] == '\n' || t[len - 1] == '\r' || t[len - 1] == ' ' ||
		       t[len - 1] == '\t'))
		len--;
	t[len] = '\0';
	if (len == 0)
		rc = mr_errf_field(eb, MR_EIO, "MESHRUN_K8S_SA_DIR",
				   "service-account token '%s' is empty", path);
	for (size_t i = 0; rc == 0 && i < len; i++)
		if ((unsigned char)t[i] < 0x21 || (unsigned char)t[i] > 0x7e)
			rc = mr_errf_field(eb, MR_EIO, "MESHRUN_K8S_SA_DIR",
					   "service-account token '%s' holds a character a "
					   "bearer token cannot",
					   path);
	if (rc == 0) {
		*tok = t;
		return 0;
	}
	explicit_bzero(t, len);
	free(t);
	return rc;
}

/* ": <the API server's reason>" from a Status body ("message"), or "". */
static void status_message(const struct mr_http_resp *r, char *buf, size_t cap)
{
	json_t *j = json_loadb(r->body, r->len, 0, NULL);
	const char *m = json_is_object(j) ? json_string_value(json_object_get(j, "message")) : NULL;

	snprintf(buf, cap, "%s%.200s", m ? ": " : "", m ? m : "");
	json_decref(j);
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* GET path from the API server with retries; *obj the Node (new
 * reference) when 0. */
static int get_node(struct mr_httpc *c, const char *url, const char *path, const char *node,
		    const char *ca, json_t **obj, struct mr_errbuf *eb)
{
	struct mr_httpc_req rq = {.method = "GET", .path = path, .max_retries = 0,
				  .headers = (const char *const[]){"Accept: application/json",
								   NULL}};
	struct mr_http_resp r = {0};
	struct mr_errbuf why;
	char reason[256];
	int rc = 0;

	*obj = NULL;
	for (int k = 0;; k++) {
		memset(&why, 0, sizeof(why));
		rc = mr_httpc_request(c, &rq, &r, &why);
		if (rc == 0 && r.status != 429 && r.status < 500)
			break;
		if ((rc == 0 || rc == MR_ECONN || rc == MR_ETIMEDOUT) && k + 1 < TRIES) {
			mr_http_resp_release(&r);
			sleep_ms((long)BACKOFF_MS << k);
			continue;
		}
		if (rc == MR_EPROTO && ca && !strncmp(why.msg, "tls ", 4))
			return mr_errf_field(eb, rc, "MESHRUN_K8S_SA_DIR",
					     "%s (verified with CA '%s')", why.msg, ca);
		if (rc != 0 && k == 0)
			return mr_errf_field(eb, rc, "MESHRUN_K8S_API", "%s", why.msg);
		if (rc != 0)
			return mr_errf_field(eb, rc, "MESHRUN_K8S_API", "%s (%d tries)", why.msg,
					     k + 1);
		status_message(&r, reason, sizeof(reason));
		rc = mr_errf_field(eb, MR_EPROTO, "MESHRUN_K8S_API",
				   "API server answered GET '%s' with an error %d times (%ld%s)", url,
				   TRIES, r.status, reason);
		goto out;
	}
	status_message(&r, reason, sizeof(reason));
	if (r.status == 401 || r.status == 403) {
		rc = mr_errf_field(eb, MR_EAUTH, "node",
				   "API server refused to read node '%s' (%ld%s): the agent's "
				   "ServiceAccount needs 'get' on 'nodes' (a ClusterRole bound to "
				   "it with a ClusterRoleBinding)",
				   node, r.status, reason);
	} else if (r.status == 404) {
		rc = mr_errf_field(eb, MR_ENOTFOUND, "node",
				   "node '%s' not found at '%s' (404%s)", node, url, reason);
	} else if (r.status != 200) {
		rc = mr_errf_field(eb, MR_EPROTO, "MESHRUN_K8S_API",
				   "unexpected answer to GET '%s' (%ld%s)", url, r.status, reason);
	} else {
		json_error_t je;
		json_t *j = json_loadb(r.body, r.len, 0, &je);

		if (!json_is_object(j)) {
			rc = mr_errf_field(eb, MR_EPARSE, "MESHRUN_K8S_API",
					   "answer from '%s' is not a JSON object%s%s", url,
					   j ? "" : ": ", j ? "" : je.text);
			json_decref(j);
		} else {
			*obj = j;
		}
	}
out:
	mr_http_resp_release(&r);
	return rc;
}

/* The values of lk's labels in node object obj, joined by '/'. */
static int join_labels(const json_t *obj, const struct label_keys *lk, const char *node,
		       char *out, size_t cap, struct mr_errbuf *eb)
{
	const json_t *labels = json_object_get(json_object_get(obj, "metadata"), "labels");
	size_t used = 0;

	if (labels && !json_is_object(labels))
		return mr_errf_field(eb, MR_EPARSE, "labels",
				     "node '%s': metadata.labels is not an object", node);
	for (int i = 0; i < lk->n; i++) {
		const json_t *v = json_object_get(labels, lk->key[i]);
		const char *s = json_string_value(v);
		size_t len = s ? strlen(s) : 0;

		if (!v || (s && len == 0))
			return mr_errf_field(eb, MR_ENOTFOUND, lk->key[i],
					     "label '%s' is %s on node '%s'", lk->key[i],
					     v ? "empty" : "missing", node);
		if (!s)
			return mr_errf_field(eb, MR_EPARSE, lk->key[i],
					     "label '%s' on node '%s' is not a string", lk->key[i],
					     node);
		if (len > MR_K8S_NODE_SEGMENT_MAX)
			return mr_errf_field(eb, MR_EPARSE, lk->key[i],
					     "label '%s' on node '%s' is %zu characters (a path "
					     "segment is at most %d)",
					     lk->key[i], node, len, MR_K8S_NODE_SEGMENT_MAX);
		for (size_t k = 0; k < len; k++)
			if (!is_segment_char((unsigned char)s[k]))
				return mr_errf_field(eb, MR_EPARSE, lk->key[i],
						     "label '%s' on node '%s' is '%s': a path "
						     "segment is [A-Za-z0-9._-]",
						     lk->key[i], node, s);
		if (used + (i ? 1 : 0) + len + 1 > cap)
			return mr_errf(eb, MR_ELIMIT,
				       "topology path of node '%s' is longer than %zu bytes", node,
				       cap ? cap - 1 : 0);
		if (i)
			out[used++] = '/';
		memcpy(out + used, s, len);
		used += len;
		out[used] = '\0';
	}
	return 0;
}

int mr_k8s_node_topology(const char *node, const char *labels, char *out, size_t cap,
			 struct mr_errbuf *eb)
{
	struct mr_httpc c = {0};
	struct label_keys lk;
	const char *sa = getenv("MESHRUN_K8S_SA_DIR");
	char base[URL_MAX], path[NODE_NAME_MAX + 32], url[URL_MAX + sizeof(path)];
	char tokpath[4096], ca[4096];
	char *tok = NULL;
	json_t *obj = NULL;
	int https = 0, rc;

	if (out && cap)
		out[0] = '\0';
	if (!out || !cap)
		return mr_errf(eb, MR_EINVAL, "topology: no room for the path");
	if ((rc = parse_labels(labels, &lk, eb)) || (rc = check_node_name(node, eb)) ||
	    (rc = api_base(base, sizeof(base), &https, eb)))
		return rc;
	if (!sa || !sa[0])
		sa = SA_DIR_DEFAULT;
	if ((size_t)snprintf(tokpath, sizeof(tokpath), "%s/token", sa) >= sizeof(tokpath) ||
	    (size_t)snprintf(ca, sizeof(ca), "%s/ca.crt", sa) >= sizeof(ca))
		return mr_errf_field(eb, MR_ELIMIT, "MESHRUN_K8S_SA_DIR",
				     "MESHRUN_K8S_SA_DIR: the path is too long");
	if (https) {
		struct mr_errbuf why = {0};
		int fd = mr_file_open_regular(ca, "service-account CA", NULL, &why);

		if (fd < 0)
			return mr_errf_field(eb, MR_EIO, "MESHRUN_K8S_SA_DIR",
					     "%s (needed to verify '%s')", why.msg, base);
		close(fd);
	}
	if ((rc = read_token(tokpath, &tok, eb)))
		return rc;

	snprintf(path, sizeof(path), "/api/v1/nodes/%s", node);
	{
		struct mr_httpc_opts ho = {.base_url = base, .token = tok,
					   .connect_timeout_ms = 5000, .timeout_ms = 10000,
					   .max_retries = 0, .max_response = BODY_MAX,
					   .tls_ca = https ? ca : NULL};

		rc = mr_httpc_init(&c, &ho, eb);
	}
	explicit_bzero(tok, strlen(tok));
	free(tok);
	if (rc)
		return rc;
	snprintf(url, sizeof(url), "%s%s", c.base_url, path);
	rc = get_node(&c, url, path, node, https ? ca : NULL, &obj, eb);
	if (rc == 0)
		rc = join_labels(obj, &lk, node, out, cap, eb);
	if (rc)
		out[0] = '\0';
	json_decref(obj);
	mr_httpc_release(&c);
	return rc;
}
