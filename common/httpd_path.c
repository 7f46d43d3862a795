/*
 * httpd_path.c - the request target of the HTTP server (see mr_httpd.h):
 * the path split on '/' with each segment percent-decoded exactly once,
 * and the query string checked with the same rules.
 *
 * libmicrohttpd decodes the whole path in place, so "%00" ends the C
 * string early ("/kv/victim%00.evil" reads as "/kv/victim") and "%2F"
 * becomes a separator. Here the raw target (from the URI log callback,
 * before libmicrohttpd touches it) is split first and decoded after, so a
 * decoded '/' stays inside its segment, and every byte that decodes to a
 * control character (0x00-0x1f, 0x7f) or an escape that is not '%' plus two
 * hex digits is refused with the index of the segment (or the name of the
 * query argument) for the 400.
 *
 * Non-goals: UTF-8 validation (bytes >= 0x80 pass; users validate their
 * own names), dot-segment removal ("." and ".." are ordinary segments),
 * absolute-form targets ("http://host/x" is refused).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httpd_int.h"

#define SHOW 80 /* bytes of a raw segment quoted in a message */

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

static int is_ctl(unsigned char c)
{
	return c < 0x20 || c == 0x7f;
}

/*
 * Decodes s[0..n) into out (room for n + 1 bytes, NUL-terminated); plus
 * turns '+' into ' ' (query). Returns the decoded length, or -1 with why
 * set to a static reason and *at to the offending raw offset.
 */
static long decode(const char *s, size_t n, int plus, char *out, const char **why, size_t *at)
{
	size_t i = 0, o = 0;

	while (i < n) {
		unsigned char c = (unsigned char)s[i];

		if (c == '%') {
			int hi = i + 1 < n ? hexval(s[i + 1]) : -1;
			int lo = i + 2 < n ? hexval(s[i + 2]) : -1;

			if (hi < 0 || lo < 0) {
				*why = "malformed escape";
				*at = i;
				return -1;
			}
			c = (unsigned char)(hi << 4 | lo);
			if (is_ctl(c)) {
				*why = "escape decodes to a control character";
				*at = i;
				return -1;
			}
			i += 3;
		} else {
			if (is_ctl(c)) {
				*why = "raw control character";
				*at = i;
				return -1;
			}
			if (plus && c == '+')
				c = ' ';
			i++;
		}
		out[o++] = (char)c;
	}
	out[o] = '\0';
	return (long)o;
}

/* "'%G1'" for an escape, "0x01" for a raw byte: what the message quotes. */
static void quote_bad(const char *s, size_t n, size_t at, char *buf, size_t cap)
{
	if (s[at] == '%') {
		size_t k = n - at < 3 ? n - at : 3;

		snprintf(buf, cap, "'%.*s'", (int)k, s + at);
		for (char *p = buf; *p; p++) /* the escape itself may hold raw bytes */
			if (is_ctl((unsigned char)*p))
				*p = '?';
	} else {
		snprintf(buf, cap, "0x%02x", (unsigned char)s[at]);
	}
}

/* A copy of s[0..n) for a message: at most SHOW bytes, control bytes as '?'. */
static void show(const char *s, size_t n, char *buf, size_t cap)
{
	size_t k = n < SHOW ? n : SHOW, i;

	if (k > cap - 4)
		k = cap - 4;
	for (i = 0; i < k; i++)
		buf[i] = is_ctl((unsigned char)s[i]) ? '?' : s[i];
	if (k < n)
		buf[i++] = '.', buf[i++] = '.', buf[i++] = '.';
	buf[i] = '\0';
}

int mr__http_target_parse(struct mr__http_target *t, const char *raw, size_t len,
			  struct mr_errbuf *eb)
{
	size_t nsegs = 1, i, start, o = 0, k = 0;
	char *text, *path;
	char **segs;

	memset(t, 0, sizeof(*t));
	if (len == 0 || raw[0] != '/') {
		char s[SHOW + 4];

		show(raw, len, s, sizeof(s));
		return mr_errf_field(eb, MR_EINVAL, "path",
				     "request target '%s' is not a path starting with '/'", s);
	}
	for (i = 1; i < len; i++)
		nsegs += raw[i] == '/';
	/* one block: the segment pointers, the segment text, the joined path */
	segs = malloc((nsegs + 1) * sizeof(*segs) + 2 * (len + 1));
	if (!segs)
		return mr_errf_field(eb, MR_ENOMEM, "path", "out of memory");
	text = (char *)(segs + nsegs + 1);
	path = text + len + 1;
	path[o++] = '/';
	for (start = 1; k < nsegs; start = i + 1) {
		const char *why = NULL;
		size_t at = 0;
		long n;

		for (i = start; i < len && raw[i] != '/'; i++)
			;
		n = decode(raw + start, i - start, 0, text, &why, &at);
		if (n < 0) {
			char s[SHOW + 4], bad[16], field[32];

			show(raw + start, i - start, s, sizeof(s));
			quote_bad(raw + start, i - start, at, bad, sizeof(bad));
			snprintf(field, sizeof(field), "path[%zu]", k);
			free(segs);
			return mr_errf_field(eb, MR_EINVAL, field, "path segment %zu '%s': %s %s", k,
					     s, why, bad);
		}
		segs[k++] = text;
		if (k > 1)
			path[o++] = '/';
		memcpy(path + o, text, (size_t)n);
		o += (size_t)n;
		text += n + 1;
	}
	segs[nsegs] = NULL;
	path[o] = '\0';
	t->mem = segs;
	t->segs = segs;
	t->nsegs = nsegs;
	t->path = path;
	return 0;
}

void mr__http_target_release(struct mr__http_target *t)
{
	free(t->mem);
	memset(t, 0, sizeof(*t));
}

int mr__http_query_check(const char *q, size_t len, struct mr_errbuf *eb)
{
	char key[SHOW + 4], s[SHOW + 4], bad[16], small[512];
	char *tmp = len < sizeof(small) ? small : malloc(len + 1); /* most are short */
	const char *why = NULL;
	size_t i = 0, at = 0;
	int rc = 0;

	if (!tmp)
		return mr_errf_field(eb, MR_ENOMEM, "query", "out of memory");
	while (i < len && !rc) {
		size_t end = i, eq;
		long n;

		while (end < len && q[end] != '&')
			end++;
		for (eq = i; eq < end && q[eq] != '='; eq++)
			;
		n = decode(q + i, eq - i, 1, tmp, &why, &at);
		if (n < 0) {
			show(q + i, eq - i, s, sizeof(s));
			quote_bad(q + i, eq - i, at, bad, sizeof(bad));
			rc = mr_errf_field(eb, MR_EINVAL, "query", "query argument name '%s': %s %s",
					   s, why, bad);
		} else if (eq < end && decode(q + eq + 1, end - eq - 1, 1, tmp + n + 1, &why,
					      &at) < 0) {
			show(tmp, (size_t)n, key, sizeof(key));
			show(q + eq + 1, end - eq - 1, s, sizeof(s));
			quote_bad(q + eq + 1, end - eq - 1, at, bad, sizeof(bad));
			rc = mr_errf_field(eb, MR_EINVAL, n ? key : "query",
					   "query argument '%s' value '%s': %s %s", key, s, why, bad);
		}
		i = end + 1;
	}
	if (tmp != small)
		free(tmp);
	return rc;
}
