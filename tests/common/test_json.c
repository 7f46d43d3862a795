/*
 * test_json.c - mr_json getters: success, missing, wrong type, range,
 * length, unknown keys, malformed input; every error names its field.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "mr_json.h"

static json_t *parse(const char *text)
{
	struct mr_errbuf eb = {0};
	json_t *o = NULL;
	int rc = mr_json_parse_object(text, strlen(text), &o, &eb);

	cr_assert_eq(rc, 0, "parse '%s': %s", text, eb.msg);
	return o;
}

Test(json, parse_object_ok_and_not_nul_terminated)
{
	const char buf[] = "{\"a\":1}garbage";
	struct mr_errbuf eb = {0};
	json_t *o = NULL;

	cr_assert_eq(mr_json_parse_object(buf, 7, &o, &eb), 0, "%s", eb.msg);
	cr_assert_eq(json_integer_value(json_object_get(o, "a")), 1);
	json_decref(o);
}

Test(json, malformed_gives_line_and_column)
{
	const char *text = "{\n  \"a\": 1,\n  \"b\": }";
	struct mr_errbuf eb = {0};
	json_t *o = (json_t *)1;

	cr_assert_eq(mr_json_parse_object(text, strlen(text), &o, &eb), MR_EPARSE);
	cr_assert_null(o);
	cr_assert(strstr(eb.msg, "line 3") != NULL, "msg: %s", eb.msg);
	cr_assert(strstr(eb.msg, "column") != NULL, "msg: %s", eb.msg);
}

Test(json, empty_and_duplicate_keys_rejected)
{
	struct mr_errbuf eb = {0};
	json_t *o = NULL;

	cr_assert_eq(mr_json_parse_object("", 0, &o, &eb), MR_EPARSE);
	cr_assert(strstr(eb.msg, "empty") != NULL, "msg: %s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_parse_object("{\"a\":1,\"a\":2}", 13, &o, &eb), MR_EPARSE);
	cr_assert(strstr(eb.msg, "duplicate") != NULL, "msg: %s", eb.msg);
}

Test(json, non_object_top_level)
{
	struct mr_errbuf eb = {0};
	json_t *o = NULL;

	cr_assert_eq(mr_json_parse_object("[1,2]", 5, &o, &eb), MR_EINVAL);
	cr_assert_null(o);
	cr_assert_str_eq(eb.msg, "invalid json: expected an object, got array");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_parse_object("42", 2, &o, &eb), MR_EPARSE);
}

Test(json, int_ok_missing_type_range)
{
	json_t *o = parse("{\"n\":5,\"s\":\"x\",\"z\":0,\"f\":3.0,\"h\":3.5,\"nul\":null}");
	struct mr_errbuf eb = {0};
	int64_t v = -1;

	cr_assert_eq(mr_json_get_int(o, "n", 1, 1, 10, &v, &eb), 0);
	cr_assert_eq(v, 5);
	cr_assert_eq(mr_json_get_int(o, "f", 1, 1, 10, &v, &eb), 0);
	cr_assert_eq(v, 3);

	v = 77;
	cr_assert_eq(mr_json_get_int(o, "absent", 0, 1, 10, &v, &eb), 0);
	cr_assert_eq(v, 77, "absent optional must leave *out alone");
	cr_assert_eq(mr_json_get_int(o, "nul", 0, 1, 10, &v, &eb), 0);
	cr_assert_eq(v, 77, "null optional counts as absent");

	cr_assert_eq(mr_json_get_int(o, "min_nodes", 1, 1, 10, &v, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "min_nodes");
	cr_assert_str_eq(eb.msg, "'min_nodes': required field is missing");

	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_get_int(o, "s", 1, 1, 10, &v, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "s");
	cr_assert_str_eq(eb.msg, "'s': expected an integer, got string");

	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_get_int(o, "h", 1, 1, 10, &v, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "'h': expected an integer, got number");

	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_get_int(o, "z", 1, 1, 100000, &v, &eb), MR_ERANGE);
	cr_assert_str_eq(eb.field, "z");
	cr_assert_str_eq(eb.msg, "'z': 0 is out of range [1, 100000]");
	cr_assert_eq(v, 77);
	json_decref(o);
}

Test(json, double_ok_type_range)
{
	json_t *o = parse("{\"d\":0.5,\"i\":2,\"b\":true}");
	struct mr_errbuf eb = {0};
	double d = 0;

	cr_assert_eq(mr_json_get_double(o, "d", 1, 0, 1, &d, &eb), 0);
	cr_assert_float_eq(d, 0.5, 1e-12);
	cr_assert_eq(mr_json_get_double(o, "i", 1, 0, 10, &d, &eb), 0);
	cr_assert_float_eq(d, 2.0, 1e-12);
	cr_assert_eq(mr_json_get_double(o, "b", 1, 0, 1, &d, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "'b': expected a number, got boolean");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_get_double(o, "i", 1, 0, 1, &d, &eb), MR_ERANGE);
	cr_assert_str_eq(eb.field, "i");
	cr_assert_str_eq(eb.msg, "'i': 2 is out of range [0, 1]");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_get_double(o, "x", 1, 0, 1, &d, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "x");
	json_decref(o);
}

Test(json, bool_ok_and_type)
{
	json_t *o = parse("{\"t\":true,\"f\":false,\"n\":1}");
	struct mr_errbuf eb = {0};
	int b = -1;

	cr_assert_eq(mr_json_get_bool(o, "t", 1, &b, &eb), 0);
	cr_assert_eq(b, 1);
	cr_assert_eq(mr_json_get_bool(o, "f", 1, &b, &eb), 0);
	cr_assert_eq(b, 0);
	cr_assert_eq(mr_json_get_bool(o, "n", 1, &b, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "'n': expected a boolean, got number");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_get_bool(o, "m", 1, &b, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "m");
	json_decref(o);
}

Test(json, str_ok_type_length_nul)
{
	json_t *o = parse("{\"s\":\"hello\",\"n\":[1]}");
	struct mr_errbuf eb = {0};
	const char *s = NULL;

	cr_assert_eq(mr_json_get_str(o, "s", 1, 5, &s, &eb), 0);
	cr_assert_str_eq(s, "hello");
	cr_assert_eq(mr_json_get_str(o, "s", 1, 4, &s, &eb), MR_ELIMIT);
	cr_assert_str_eq(eb.field, "s");
	cr_assert_str_eq(eb.msg, "'s': string is too long (5 bytes, max 4)");
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_json_get_str(o, "n", 1, 5, &s, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "'n': expected a string, got array");
	mr_errbuf_clear(&eb);
	/* the parser refuses \u0000; a built object may still carry one */
	json_object_set_new(o, "z", json_stringn("a\0b", 3));
	cr_assert_eq(mr_json_get_str(o, "z", 1, 5, &s, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "z");
	cr_assert(strstr(eb.msg, "NUL") != NULL, "msg: %s", eb.msg);
	mr_errbuf_clear(&eb);
	s = "keep";
	cr_assert_eq(mr_json_get_str(o, "q", 0, 5, &s, &eb), 0);
	cr_assert_str_eq(s, "keep");
	cr_assert_eq(mr_json_get_str(o, "q", 1, 5, &s, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "'q': required field is missing");
	json_decref(o);
}

Test(json, obj_ok_and_type)
{
	json_t *o = parse("{\"mesh\":{\"tp\":2},\"x\":\"y\"}");
	struct mr_errbuf eb = {0};
	json_t *m = NULL;
	int64_t tp = 0;

	cr_assert_eq(mr_json_get_obj(o, "mesh", 1, &m, &eb), 0);
	cr_assert_eq(mr_json_get_int(m, "tp", 1, 1, 8, &tp, &eb), 0);
	cr_assert_eq(tp, 2);
	cr_assert_eq(mr_json_get_obj(o, "x", 1, &m, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.msg, "'x': expected an object, got string");
	json_decref(o);
}

Test(json, check_keys_names_unknown)
{
	static const char *const allowed[] = {"a", "b", NULL};
	json_t *o = parse("{\"a\":1,\"b\":2}");
	json_t *p = parse("{\"a\":1,\"bogus\":2}");
	struct mr_errbuf eb = {0};

	cr_assert_eq(mr_json_check_keys(o, allowed, &eb), 0);
	cr_assert_eq(mr_json_check_keys(p, allowed, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "bogus");
	cr_assert_str_eq(eb.msg, "'bogus': unknown field");
	json_decref(o);
	json_decref(p);
}

Test(json, first_error_wins)
{
	json_t *o = parse("{\"a\":\"x\",\"b\":\"y\"}");
	struct mr_errbuf eb = {0};
	int64_t v;

	cr_assert_eq(mr_json_get_int(o, "a", 1, 0, 1, &v, &eb), MR_EINVAL);
	cr_assert_eq(mr_json_get_int(o, "b", 1, 0, 1, &v, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "a");
	json_decref(o);
}

Test(json, dump_compact)
{
	json_t *o = json_pack("{s:i,s:[s,b]}", "a", 1, "b", "x", 1);
	size_t len = 0;
	char *s = mr_json_dump(o, &len);

	cr_assert_str_eq(s, "{\"a\":1,\"b\":[\"x\",true]}");
	cr_assert_eq(len, strlen(s));
	free(s);
	json_decref(o);
	cr_assert_null(mr_json_dump(NULL, &len));
}
