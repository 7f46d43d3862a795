/*
 * json_write.c - the compact JSON text of a reply, written directly.
 *
 * json_dumps() costs far more than the bytes it writes: a callback per
 * fragment, and per object or array a "%p" snprintf and a hashtable insert
 * and delete for its loop check. Every reply of the controller goes through
 * here instead: the same bytes as json_dumps(JSON_COMPACT | JSON_ENCODE_ANY)
 * (keys in insertion order, "\uXXXX" with upper-case hex for the control
 * characters without a short escape, UTF-8 passed through) for objects,
 * arrays, strings, integers, booleans and null. A value holding a real
 * falls back to json_dumps(), whose number format is its own.
 *
 * Non-goals: pretty printing, sorted keys, ASCII-only output.
 */
#include <stdlib.h>
#include <string.h>

#include "json_write.h"
#include "mr_json.h"
#include "state/names.h"

#define JT_DEPTH 64 /* deeper values (none in a reply) go to json_dumps */

/* Written into the stack buffer first (a reply of the core fits), then
 * into the heap as it grows; jt_end() hands out exactly the bytes written,
 * so a reply that waits for the journal or for its send holds no slack
 * (10,000 of them wait at once when a round closes). */
struct jt {
	char *p;
	size_t len, cap;
	int bad; /* out of memory, or a value this writer leaves to jansson */
	char small[512];
};

#define JT_INIT(t) ((t)->p = (t)->small, (t)->len = 0, (t)->cap = sizeof((t)->small), (t)->bad = 0)

static void jt_need(struct jt *t, size_t n)
{
	char *np;
	size_t cap;

	if (t->bad || t->len + n < t->cap)
		return;
	cap = t->cap * 2;
	while (t->len + n >= cap)
		cap *= 2;
	np = t->p == t->small ? malloc(cap) : realloc(t->p, cap);
	if (!np) {
		t->bad = 1;
		return;
	}
	if (t->p == t->small)
		memcpy(np, t->small, t->len);
	t->p = np;
	t->cap = cap;
}

static void jt_put(struct jt *t, const char *s, size_t n)
{
	jt_need(t, n);
	if (t->bad)
		return;
	memcpy(t->p + t->len, s, n);
	t->len += n;
}

static void jt_str(struct jt *t, const char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t i, run = 0;

	jt_need(t, n + 2);
	jt_put(t, "\"", 1);
	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		char esc[6];
		size_t el = 2;

		if (ch >= 0x20 && ch != '"' && ch != '\\')
			continue;
		jt_put(t, s + run, i - run);
		run = i + 1;
		esc[0] = '\\';
		switch (ch) {
		case '"': esc[1] = '"'; break;
		case '\\': esc[1] = '\\'; break;
		case '\b': esc[1] = 'b'; break;
		case '\f': esc[1] = 'f'; break;
		case '\n': esc[1] = 'n'; break;
		case '\r': esc[1] = 'r'; break;
		case '\t': esc[1] = 't'; break;
		default:
			memcpy(esc + 1, "u00", 3);
			esc[4] = hex[ch >> 4];
			esc[5] = hex[ch & 15];
			el = 6;
		}
		jt_put(t, esc, el);
	}
	jt_put(t, s + run, n - run);
	jt_put(t, "\"", 1);
}

/* An integer in decimal, as "%lld" writes it. */
static void jt_int(struct jt *t, json_int_t v)
{
	char num[24], *p = num + sizeof(num);
	unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;

	do {
		*--p = (char)('0' + u % 10);
		u /= 10;
	} while (u);
	if (v < 0)
		*--p = '-';
	jt_put(t, p, (size_t)(num + sizeof(num) - p));
}

static void jt_value(struct jt *t, const json_t *v, int depth)
{
	if (depth > JT_DEPTH) {
		t->bad = 1;
		return;
	}
	switch (json_typeof(v)) {
	case JSON_OBJECT: {
		void *it = json_object_iter((json_t *)v);
		int first = 1;

		jt_put(t, "{", 1);
		for (; it && !t->bad; it = json_object_iter_next((json_t *)v, it)) {
			const char *k = json_object_iter_key(it);

			if (!first)
				jt_put(t, ",", 1);
			first = 0;
			jt_str(t, k, strlen(k));
			jt_put(t, ":", 1);
			jt_value(t, json_object_iter_value(it), depth + 1);
		}
		jt_put(t, "}", 1);
		break;
	}
	case JSON_ARRAY:
		jt_put(t, "[", 1);
		for (size_t i = 0; i < json_array_size(v) && !t->bad; i++) {
			if (i)
				jt_put(t, ",", 1);
			jt_value(t, json_array_get(v, i), depth + 1);
		}
		jt_put(t, "]", 1);
		break;
	case JSON_STRING:
		jt_str(t, json_string_value(v), json_string_length(v));
		break;
	case JSON_INTEGER:
		jt_int(t, json_integer_value(v));
		break;
	case JSON_TRUE:
		jt_put(t, "true", 4);
		break;
	case JSON_FALSE:
		jt_put(t, "false", 5);
		break;
	case JSON_NULL:
		jt_put(t, "null", 4);
		break;
	default: /* JSON_REAL: jansson's own number format */
		t->bad = 1;
	}
}

/* 1 if s[0..n) is UTF-8 as jansson accepts it in a string (no overlong
 * forms, no surrogates, nothing above U+10FFFF). */
static int utf8_ok(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s, *end = p + n;

	while (p < end) {
		unsigned c = *p, need, v, i;

		if (c < 0x80) {
			p++;
			continue;
		}
		if (c < 0xc2 || c > 0xf4)
			return 0;
		need = c < 0xe0 ? 1 : c < 0xf0 ? 2 : 3;
		if ((size_t)(end - p) <= need)
			return 0;
		v = c & (0x3f >> need);
		for (i = 1; i <= need; i++) {
			if ((p[i] & 0xc0) != 0x80)
				return 0;
			v = (v << 6) | (p[i] & 0x3f);
		}
		if ((need == 2 && v < 0x800) || (need == 3 && v < 0x10000) ||
		    (v >= 0xd800 && v <= 0xdfff) || v > 0x10ffff)
			return 0;
		p += need + 1;
	}
	return 1;
}

/* A C string of the error object: must be text jansson would take. */
static void jt_cstr(struct jt *t, const char *s)
{
	size_t n = strlen(s);

	if (!utf8_ok(s, n))
		t->bad = 1;
	else
		jt_str(t, s, n);
}

/* Ends t: its text (malloc'd, exactly len + 1 bytes, NUL-terminated, *len
 * bytes), or NULL. */
static char *jt_end(struct jt *t, size_t *len)
{
	char *out;

	jt_need(t, 1);
	if (t->bad) {
		if (t->p != t->small)
			free(t->p);
		return NULL;
	}
	t->p[t->len] = '\0';
	if (t->p != t->small) {
		out = realloc(t->p, t->len + 1); /* shrinks in place */
		out = out ? out : t->p;
	} else if ((out = malloc(t->len + 1)) != NULL) {
		memcpy(out, t->small, t->len + 1);
	}
	*len = t->len;
	return out;
}

char *mr__json_write(const json_t *v, size_t *len)
{
	struct jt t;
	char *s;

	JT_INIT(&t);
	if (!v)
		return NULL;
	jt_value(&t, v, 0);
	s = jt_end(&t, len);
	return s ? s : mr_json_dump(v, len);
}

/* ---- the core's frequent replies ---- */

#define JT_LIT(t, s) jt_put((t), (s), sizeof(s) - 1)
/* a literal (the key and what comes before it), then an integer */
#define JT_KINT(t, s, v) (JT_LIT(t, s), jt_int((t), (json_int_t)(v)))

static void jt_state(struct jt *t, const struct ctl_job *job, const char *state)
{
	JT_KINT(t, "{\"generation\":", job->generation);
	JT_LIT(t, ",\"state\":");
	jt_str(t, state, strlen(state));
	JT_LIT(t, "}");
}

/* In the order round.c's rank reply always had. */
static void jt_round(struct jt *t, const struct ctl_job *job, const struct ctl_member *m)
{
	const struct ctl_spec *s = &job->spec;

	JT_KINT(t, "{\"state\":\"running\",\"generation\":", job->generation);
	JT_KINT(t, ",\"num_nodes\":", job->num_nodes);
	JT_KINT(t, ",\"node_rank\":", m->node_rank);
	JT_KINT(t, ",\"nproc_per_node\":", s->nproc_per_node);
	JT_KINT(t, ",\"world_size\":", job->world_size);
	JT_KINT(t, ",\"rank_base\":", (json_int_t)m->node_rank * s->nproc_per_node);
	JT_KINT(t, ",\"restarts\":", job->restarts);
	JT_KINT(t, ",\"mesh\":{\"tp\":", s->tp);
	JT_KINT(t, ",\"pp\":", s->pp);
	JT_KINT(t, ",\"cp\":", s->cp);
	JT_KINT(t, ",\"ep\":", s->ep);
	JT_KINT(t, ",\"dp\":", job->dp);
	JT_LIT(t, "}}");
}

char *mr__json_write_round(const struct ctl_job *job, const struct ctl_member *m, size_t *len)
{
	struct jt t;

	JT_INIT(&t);
	jt_round(&t, job, m);
	return jt_end(&t, len);
}

char *mr__json_write_state(const struct ctl_job *job, const char *state, size_t *len)
{
	struct jt t;

	JT_INIT(&t);
	jt_state(&t, job, state);
	return jt_end(&t, len);
}

char *mr__json_write_stale(const struct ctl_job *job, const struct ctl_member *m, size_t *len)
{
	struct jt t;

	JT_INIT(&t);
	JT_KINT(&t, "\"generation\":", job->generation);
	JT_KINT(&t, ",\"restarts\":", job->restarts);
	if (m) {
		JT_LIT(&t, ",\"member\":");
		if (m->state == CTL_M_RUNNING && job->state == CTL_JOB_RUNNING)
			jt_round(&t, job, m);
		else
			jt_state(&t, job, mr__ctl_member_state_name(m->state));
	}
	return jt_end(&t, len);
}

char *mr__json_write_error(const struct ctl_res *res, size_t *len)
{
	struct jt t;
	char *s;

	JT_INIT(&t);
	jt_put(&t, "{\"error\":{\"code\":", 17);
	jt_cstr(&t, res->code);
	jt_put(&t, ",\"message\":", 11);
	jt_cstr(&t, res->msg);
	jt_put(&t, ",\"field\":", 9);
	if (res->field)
		jt_cstr(&t, res->field);
	else
		jt_put(&t, "null", 4);
	jt_put(&t, "}", 1);
	if (res->text && res->text_len) { /* extra fields, written already */
		jt_put(&t, ",", 1);
		jt_put(&t, res->text, res->text_len);
	} else if (json_is_object(res->body)) { /* extra top-level fields */
		void *it = json_object_iter(res->body);

		for (; it && !t.bad; it = json_object_iter_next(res->body, it)) {
			const char *k = json_object_iter_key(it);

			if (!strcmp(k, "error")) {
				t.bad = 1; /* it would replace the error object */
				break;
			}
			jt_put(&t, ",", 1);
			jt_str(&t, k, strlen(k));
			jt_put(&t, ":", 1);
			jt_value(&t, json_object_iter_value(it), 1);
		}
	}
	jt_put(&t, "}", 1);
	s = jt_end(&t, len);
	if (!s) { /* a real or an "error" among the extra fields, text jansson
		   * refuses, no memory: the way it always went */
		json_t *o = json_pack("{s{ss ss so}}", "error", "code", res->code, "message",
				      res->msg, "field",
				      res->field ? json_string(res->field) : json_null());

		if (o && res->body)
			json_object_update(o, res->body);
		if (o && res->text && res->text_len) {
			char *w = malloc(res->text_len + 2);
			json_t *x = NULL;

			if (w) {
				w[0] = '{';
				memcpy(w + 1, res->text, res->text_len);
				w[res->text_len + 1] = '}';
				x = json_loadb(w, res->text_len + 2, 0, NULL);
				free(w);
			}
			if (x)
				json_object_update(o, x);
			json_decref(x);
		}
		s = o ? mr_json_dump(o, len) : NULL;
		json_decref(o);
	}
	return s;
}
