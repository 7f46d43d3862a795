/*
 * json.c - validating getters on jansson (see mr_json.h).
 *
 * Every failure names the field in eb->field and says what was expected
 * and what was found, e.g. "'min_nodes': expected an integer, got string".
 * A JSON null counts as absent: an optional field set to null keeps its
 * default, a required one is reported missing.
 *
 * Non-goals: schemas, nested paths, coercion of strings to numbers.
 */
#include "mr_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		return "object";
	case JSON_ARRAY:
		return "array";
	case JSON_STRING:
		return "string";
	case JSON_INTEGER:
	case JSON_REAL:
		return "number";
	case JSON_TRUE:
	case JSON_FALSE:
		return "boolean";
	case JSON_NULL:
		return "null";
	}
	return "unknown";
}

int mr_json_parse_object(const char *buf, size_t len, json_t **out, struct mr_errbuf *eb)
{
	json_error_t jerr;
	json_t *root;

	*out = NULL;
	if (!buf || len == 0)
		return mr_errf_field(eb, MR_EPARSE, "", "invalid json: empty body");
	root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		return mr_errf_field(eb, MR_EPARSE, "",
				     "invalid json at line %d, column %d: %s", jerr.line,
				     jerr.column, jerr.text);
	if (!json_is_object(root)) {
		mr_errf_field(eb, MR_EINVAL, "", "invalid json: expected an object, got %s",
			      type_name(root));
		json_decref(root);
		return MR_EINVAL;
	}
	*out = root;
	return 0;
}

int mr_json_check_keys(const json_t *obj, const char *const *allowed, struct mr_errbuf *eb)
{
	const char *key;
	json_t *val;

	/* json_object_foreach wants a non-const object; iteration does not
	 * modify it. */
	json_object_foreach((json_t *)obj, key, val) {
		const char *const *a;
		int found = 0;

		(void)val;
		for (a = allowed; a && *a; a++) {
			if (strcmp(*a, key) == 0) {
				found = 1;
				break;
			}
		}
		if (!found)
			return mr_errf_field(eb, MR_EINVAL, key, "'%s': unknown field", key);
	}
	return 0;
}

/* Looks field up; returns 1 if present (non-null), 0 if absent and not
 * required, an error if absent and required. */
static int lookup(const json_t *obj, const char *field, int required, json_t **v,
		  struct mr_errbuf *eb)
{
	*v = obj ? json_object_get(obj, field) : NULL;
	if (*v && !json_is_null(*v))
		return 1;
	if (required)
		return mr_errf_field(eb, MR_EINVAL, field, "'%s': required field is missing",
				     field);
	return 0;
}

static int wrong_type(const char *field, const char *want, const json_t *v,
		      struct mr_errbuf *eb)
{
	return mr_errf_field(eb, MR_EINVAL, field, "'%s': expected %s, got %s", field, want,
			     type_name(v));
}

int mr_json_get_int(const json_t *obj, const char *field, int required, int64_t min,
		    int64_t max, int64_t *out, struct mr_errbuf *eb)
{
	json_t *v;
	int64_t n;
	int rc = lookup(obj, field, required, &v, eb);

	if (rc <= 0)
		return rc;
	if (json_is_integer(v)) {
		n = (int64_t)json_integer_value(v);
	} else if (json_is_real(v)) {
		/* 3.0 is an integer written by a float-minded tool; 3.5 is not. */
		double d = json_real_value(v);

		if (d != floor(d) || d < -9.2e18 || d > 9.2e18)
			return wrong_type(field, "an integer", v, eb);
		n = (int64_t)d;
	} else {
		return wrong_type(field, "an integer", v, eb);
	}
	if (n < min || n > max)
		return mr_errf_field(eb, MR_ERANGE, field,
				     "'%s': %lld is out of range [%lld, %lld]", field,
				     (long long)n, (long long)min, (long long)max);
	*out = n;
	return 0;
}

int mr_json_get_double(const json_t *obj, const char *field, int required, double min,
		       double max, double *out, struct mr_errbuf *eb)
{
	json_t *v;
	double d;
	int rc = lookup(obj, field, required, &v, eb);

	if (rc <= 0)
		return rc;
	if (!json_is_number(v))
		return wrong_type(field, "a number", v, eb);
	d = json_number_value(v);
	if (!isfinite(d) || d < min || d > max)
		return mr_errf_field(eb, MR_ERANGE, field, "'%s': %g is out of range [%g, %g]",
				     field, d, min, max);
	*out = d;
	return 0;
}

int mr_json_get_bool(const json_t *obj, const char *field, int required, int *out,
		     struct mr_errbuf *eb)
{
	json_t *v;
	int rc = lookup(obj, field, required, &v, eb);

	if (rc <= 0)
		return rc;
	if (!json_is_boolean(v))
		return wrong_type(field, "a boolean", v, eb);
	*out = json_is_true(v);
	return 0;
}

int mr_json_get_str(const json_t *obj, const char *field, int required, size_t max_len,
		    const char **out, struct mr_errbuf *eb)
{
	json_t *v;
	size_t len;
	const char *s;
	int rc = lookup(obj, field, required, &v, eb);

	if (rc <= 0)
		return rc;
	if (!json_is_string(v))
		return wrong_type(field, "a string", v, eb);
	s = json_string_value(v);
	len = json_string_length(v);
	if (len > max_len)
		return mr_errf_field(eb, MR_ELIMIT, field,
				     "'%s': string is too long (%zu bytes, max %zu)", field, len,
				     max_len);
	if (strlen(s) != len)
		return mr_errf_field(eb, MR_EINVAL, field, "'%s': string contains a NUL byte",
				     field);
	*out = s;
	return 0;
}

int mr_json_get_obj(const json_t *obj, const char *field, int required, json_t **out,
		    struct mr_errbuf *eb)
{
	json_t *v;
	int rc = lookup(obj, field, required, &v, eb);

	if (rc <= 0)
		return rc;
	if (!json_is_object(v))
		return wrong_type(field, "an object", v, eb);
	*out = v;
	return 0;
}

char *mr_json_dump(const json_t *obj, size_t *len)
{
	char *s;

	if (!obj)
		return NULL;
	s = json_dumps(obj, JSON_COMPACT | JSON_ENCODE_ANY);
	if (s && len)
		*len = strlen(s);
	return s;
}
