/*
 * json_read.c - the fast path of reading a request body into jansson values.
 *
 * json_loadb() reads through a per-byte callback and a string buffer:
 * about 160 instructions per byte, most of a join's cost (an agent sends
 * its whole job spec with every join). The bodies agents send are small
 * objects of plain strings and integers, and this parser takes exactly
 * those: objects and arrays (nested at most JP_DEPTH deep), strings of
 * printable ASCII without escapes, integers without a fraction or an
 * exponent (at most 18 digits), true, false, null and JSON whitespace. On
 * what it takes it builds what json_loadb(JSON_REJECT_DUPLICATES) builds.
 * Anything else - an escape, a byte outside printable ASCII, a real, a
 * long integer, a duplicate key, a syntax error, bytes after the value -
 * it leaves to jansson, whose verdict and messages stay the only ones a
 * client sees.
 *
 * Non-goals: being a JSON parser (it only says "mine" or "not mine").
 */
#include <string.h>

#include "json_read.h"

#define JP_DEPTH 16
#define JP_KEY_MAX 256 /* longer keys go to jansson (no field name is that long) */

struct jp {
	const char *p, *end;
};

static void jp_ws(struct jp *j)
{
	while (j->p < j->end &&
	       (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
		j->p++;
}

/* A plain string at j->p (the opening quote): its bytes; NULL if it is
 * not one this parser takes. */
static const char *jp_str(struct jp *j, size_t *n)
{
	const char *s = ++j->p;

	while (j->p < j->end && *j->p != '"') {
		unsigned char c = (unsigned char)*j->p;

		if (c < 0x20 || c > 0x7e || c == '\\')
			return NULL;
		j->p++;
	}
	if (j->p == j->end)
		return NULL;
	*n = (size_t)(j->p++ - s);
	return s;
}

static json_t *jp_value(struct jp *j, int depth);

/* After a member of an object or array: 1 past a ',' (another follows),
 * 0 past the closing bracket, -1 at anything else. */
static int jp_after_member(struct jp *j, char close)
{
	jp_ws(j);
	if (j->p < j->end && *j->p == ',') {
		j->p++;
		jp_ws(j);
		return 1;
	}
	if (j->p < j->end && *j->p == close) {
		j->p++;
		return 0;
	}
	return -1;
}

static json_t *jp_object(struct jp *j, int depth)
{
	json_t *o = json_object();
	char key[JP_KEY_MAX + 1];

	j->p++;
	jp_ws(j);
	if (j->p < j->end && *j->p == '}') {
		j->p++;
		return o;
	}
	while (o) {
		const char *k;
		size_t kn;
		json_t *v;
		int more;

		if (j->p == j->end || *j->p != '"' || !(k = jp_str(j, &kn)) || kn > JP_KEY_MAX)
			break;
		memcpy(key, k, kn);
		key[kn] = '\0';
		jp_ws(j);
		if (j->p == j->end || *j->p++ != ':')
			break;
		jp_ws(j);
		if (json_object_get(o, key) || !(v = jp_value(j, depth + 1)))
			break; /* a duplicate: jansson says so */
		if (json_object_set_new_nocheck(o, key, v))
			break;
		if ((more = jp_after_member(j, '}')) == 0)
			return o;
		if (more < 0)
			break;
	}
	json_decref(o);
	return NULL;
}

static json_t *jp_array(struct jp *j, int depth)
{
	json_t *a = json_array();

	j->p++;
	jp_ws(j);
	if (j->p < j->end && *j->p == ']') {
		j->p++;
		return a;
	}
	while (a) {
		json_t *v = jp_value(j, depth + 1);
		int more;

		if (!v || json_array_append_new(a, v))
			break;
		if ((more = jp_after_member(j, ']')) == 0)
			return a;
		if (more < 0)
			break;
	}
	json_decref(a);
	return NULL;
}

/* -?(0|[1-9][0-9]*) of at most 18 digits, then no '.', 'e' or digit. */
static json_t *jp_int(struct jp *j)
{
	json_int_t v = 0;
	int neg = 0, nd = 0;

	if (*j->p == '-') {
		neg = 1;
		j->p++;
	}
	while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
		if (++nd > 18 || (nd == 2 && j->p[-1] == '0'))
			return NULL;
		v = v * 10 + (*j->p++ - '0');
	}
	if (!nd || (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')))
		return NULL;
	return json_integer(neg ? -v : v);
}

/* true, false or null spelled out (what follows is checked by the caller:
 * "truex" ends up as a syntax error there). */
static json_t *jp_word(struct jp *j)
{
	size_t left = (size_t)(j->end - j->p);

	if (left >= 4 && !memcmp(j->p, "true", 4)) {
		j->p += 4;
		return json_true();
	}
	if (left >= 5 && !memcmp(j->p, "false", 5)) {
		j->p += 5;
		return json_false();
	}
	if (left >= 4 && !memcmp(j->p, "null", 4)) {
		j->p += 4;
		return json_null();
	}
	return NULL;
}

static json_t *jp_value(struct jp *j, int depth)
{
	const char *s;
	size_t n;

	if (j->p == j->end || depth > JP_DEPTH)
		return NULL;
	switch (*j->p) {
	case '{':
		return jp_object(j, depth);
	case '[':
		return jp_array(j, depth);
	case '"':
		s = jp_str(j, &n);
		return s ? json_stringn_nocheck(s, n) : NULL;
	case '-': case '0': case '1': case '2': case '3': case '4':
	case '5': case '6': case '7': case '8': case '9':
		return jp_int(j);
	default:
		return jp_word(j);
	}
}

json_t *mr__json_read_object(const char *buf, size_t len)
{
	struct jp j;
	json_t *o;

	if (!buf)
		return NULL;
	j.p = buf;
	j.end = buf + len;
	jp_ws(&j);
	if (j.p == j.end || *j.p != '{')
		return NULL;
	o = jp_object(&j, 0);
	jp_ws(&j);
	if (o && j.p != j.end) { /* bytes after the object: jansson's error */
		json_decref(o);
		o = NULL;
	}
	return o;
}
