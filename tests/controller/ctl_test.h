/*
 * ctl_test.h - shared helpers of the controller integration tests: start a
 * real meshrun-controller on an ephemeral loopback port with its own data
 * dir, and make API calls against it.
 *
 * Non-goals: an agent client (agent/ has the real one).
 */
#ifndef MR_CTL_TEST_H
#define MR_CTL_TEST_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "proc.h"

struct ctlp {
	struct mr_proc proc;
	char dir[256];
	char port_file[300];
	char log[300];
	int port;
	char token[64];
	const char *log_level; /* the controller's --log-level; NULL: warn */
};

/* Spawns the controller without waiting for it (ctlp_start waits). extra:
 * NULL-terminated extra flags (may be NULL). port 0 = ephemeral. */
static inline void ctlp_spawn(struct ctlp *c, int port, const char *const *extra)
{
	const char *args[48];
	char portbuf[16];
	int n = 0;

	if (!c->dir[0]) {
		cr_assert_eq(mr_test_tmpdir(c->dir, sizeof(c->dir), "mr-ctl"), 0);
		snprintf(c->port_file, sizeof(c->port_file), "%s/port", c->dir);
		snprintf(c->log, sizeof(c->log), "%s/controller.log", c->dir);
	}
	unlink(c->port_file);
	snprintf(portbuf, sizeof(portbuf), "%d", port);
	args[n++] = "--listen";
	args[n++] = "127.0.0.1";
	args[n++] = "--port";
	args[n++] = portbuf;
	args[n++] = "--port-file";
	args[n++] = c->port_file;
	args[n++] = "--data-dir";
	args[n++] = c->dir;
	args[n++] = "--log-level";
	args[n++] = c->log_level ? c->log_level : "warn";
	for (int i = 0; extra && extra[i] && n < 46; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	cr_assert_eq(mr_proc_spawn(&c->proc, "meshrun-controller", args, NULL, c->log), 0);
}

/* extra: NULL-terminated extra flags (may be NULL). port 0 = ephemeral. */
static inline void ctlp_start(struct ctlp *c, int port, const char *const *extra)
{
	ctlp_spawn(c, port, extra);
	c->port = mr_proc_wait_port(&c->proc, c->port_file, 10000);
	cr_assert_gt(c->port, 0, "controller did not start (log %s)", c->log);
}

/* Stops the controller and fails the test if its log shows a sanitizer
 * report (ASan, UBSan, LeakSanitizer at exit) or an unclean exit. */
static inline void ctlp_stop(struct ctlp *c, int rm)
{
	static char text[1 << 16];
	FILE *f;
	size_t n = 0;

	mr_proc_stop(&c->proc);
	f = fopen(c->log, "r");
	if (f) {
		n = fread(text, 1, sizeof(text) - 1, f);
		fclose(f);
	}
	text[n] = 0;
	cr_expect(!strstr(text, "Sanitizer") && !strstr(text, "runtime error"),
		  "controller log %s: %s", c->log, text);
	cr_expect(WIFEXITED(c->proc.status) && WEXITSTATUS(c->proc.status) == 0,
		  "controller exit status %d", c->proc.status);
	if (rm)
		mr_test_rmdir(c->dir);
}

/* Call path (printf-style) on the controller; body may be NULL. */
static inline long ctl_call(struct ctlp *c, struct mr_test_resp *r, const char *method,
			    const char *body, const char *hdr, const char *fmt, ...)
{
	char url[1024], auth[128];
	const char *hdrs[4];
	int n = 0, k;
	va_list ap;

	k = snprintf(url, sizeof(url), "http://127.0.0.1:%d", c->port);
	va_start(ap, fmt);
	vsnprintf(url + k, sizeof(url) - (size_t)k, fmt, ap);
	va_end(ap);
	if (c->token[0]) {
		snprintf(auth, sizeof(auth), "Authorization: Bearer %s", c->token);
		hdrs[n++] = auth;
	}
	if (hdr)
		hdrs[n++] = hdr;
	hdrs[n] = NULL;
	return mr_test_http(r, method, url, body, body ? strlen(body) : 0, hdrs, 30000);
}

static inline json_t *resp_json(const struct mr_test_resp *r)
{
	json_t *o = json_loadb(r->body, r->len, 0, NULL);

	cr_assert_not_null(o, "not JSON: %s", r->body);
	return o;
}

static inline long long jint(const struct mr_test_resp *r, const char *field)
{
	json_t *o = resp_json(r);
	long long v = json_integer_value(json_object_get(o, field));

	json_decref(o);
	return v;
}

/* error.code / error.field of an error reply, copied into buf. */
static inline const char *jerr(const struct mr_test_resp *r, const char *what, char *buf,
			       size_t cap)
{
	json_t *o = resp_json(r);
	json_t *e = json_object_get(json_object_get(o, "error"), what);

	snprintf(buf, cap, "%s", json_is_string(e) ? json_string_value(e) : "(null)");
	json_decref(o);
	return buf;
}

#endif
