/*
 * test_jtext.c - the controller's own JSON fast paths agree with jansson:
 * mr__jtext() writes the bytes json_dumps(JSON_COMPACT | JSON_ENCODE_ANY)
 * writes, mr__jtext_error() the error object the server built before, and
 * mr__jparse_object() either declines a body or builds exactly what
 * json_loadb(JSON_REJECT_DUPLICATES) builds - never taking a body jansson
 * refuses. Bodies come from a list of cases and from random mutations of
 * agent bodies.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"

static void same_text(json_t *v)
{
	size_t len = 0;
	char *mine = mr__jtext(v, &len);
	char *ref = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

	cr_assert_not_null(mine);
	cr_assert_not_null(ref);
	cr_expect_str_eq(mine, ref);
	cr_expect_eq(len, strlen(ref));
	free(mine);
	free(ref);
}

Test(jtext, writes_what_json_dumps_writes)
{
	static const char *const docs[] = {
		"{}", "[]", "{\"a\":1,\"b\":-2,\"c\":[true,false,null],\"d\":{\"e\":\"f\"}}",
		"{\"z\":0,\"a\":9223372036854775807,\"m\":-9223372036854775808}",
		"[\"quote \\\" back \\\\ slash / nl \\n cr \\r tab \\t bs \\b ff \\f\"]",
		"[\"\\u0001\\u001f\\u007f \\u00e9 \\u20ac \\ud83d\\ude00\"]",
		"{\"mesh\":{\"tp\":1,\"pp\":2},\"ports\":{\"agent\":29400},\"list\":[[1,2],[],{}]}",
		"[1.5, 2, {\"r\": 0.1}]", /* reals: jansson's own format, through the fallback */
	};

	for (size_t i = 0; i < sizeof(docs) / sizeof(docs[0]); i++) {
		json_t *v = json_loads(docs[i], JSON_DECODE_ANY, NULL);

		cr_assert_not_null(v, "%s", docs[i]);
		same_text(v);
		json_decref(v);
	}
}

Test(jtext, error_bodies_are_what_jansson_built)
{
	struct ctl_res res;
	size_t len = 0;
	char *mine;
	json_t *o;
	char *ref;

	memset(&res, 0, sizeof(res));
	mr__res_err(&res, 409, "stale_generation", "generation", "node \"%s\" is \\ late", "n\t1");
	res.body = json_pack("{sI si}", "generation", (json_int_t)7, "restarts", 2);
	mine = mr__jtext_error(&res, &len);
	o = json_pack("{s{ss ss ss}}", "error", "code", res.code, "message", res.msg, "field",
		      res.field);
	json_object_update(o, res.body);
	ref = json_dumps(o, JSON_COMPACT | JSON_ENCODE_ANY);
	cr_expect_str_eq(mine, ref);
	free(mine);
	free(ref);
	json_decref(o);
	mr__res_release(&res);

	mr__res_err(&res, 404, "not_found", NULL, "%s", "no \x01 route");
	mine = mr__jtext_error(&res, &len);
	cr_expect_str_eq(mine, "{\"error\":{\"code\":\"not_found\",\"message\":\"no \\u0001 "
			       "route\",\"field\":null}}");
	free(mine);
}

/* mr__jparse_object(text) is NULL, or equal to jansson's parse; and never
 * non-NULL where jansson refuses. */
static void agrees(const char *text, size_t len)
{
	json_error_t err;
	json_t *ref = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
	json_t *mine = mr__jparse_object(text, len);

	if (mine) {
		cr_assert_not_null(ref, "fast path took what jansson refuses: '%.*s'", (int)len,
				   text);
		cr_assert(json_is_object(ref));
		cr_assert(json_equal(mine, ref), "differs from jansson: '%.*s'", (int)len, text);
	}
	json_decref(mine);
	json_decref(ref);
}

/* what agent/rdzv.c sends with a join, and a beat with progress */
static const char join_body[] =
	"{\"node_id\":\"agent-7\",\"host\":\"127.0.0.1\",\"host_id\":\"b1c2\",\"ports\":"
	"{\"agent\":29400},\"pod_index\":7,\"spec\":{\"name\":\"a/b\",\"min_nodes\":2,"
	"\"max_nodes\":4,\"nproc_per_node\":1,\"mesh\":{\"tp\":1,\"pp\":1,\"cp\":1,"
	"\"ep\":1,\"dp\":0},\"last_call_ms\":500,\"heartbeat_timeout_ms\":30000,"
	"\"max_restarts\":3}}";
static const char beat_body[] =
	"{\"node_id\":\"a\",\"generation\":3,\"progress\":[{\"rank\":6,\"step\":120,"
	"\"micro\":-1,\"g\":[[1,3,2,4521,1,-1,4521],[3,0,4,812,1,-1,811]]}]}";

Test(jparse, takes_agent_bodies_as_jansson_does)
{
	static const char *const bodies[] = {
		join_body,
		beat_body,
		" \t\r\n{ \"a\" : [ ] , \"b\" : { } , \"c\" : true , \"d\" : null } \n",
		"{\"permanent\":false,\"reason\":\"exit 3\"}",
		"{}", "{\"\":0}", "{\"a\":-0}", "{\"a\":999999999999999999}",
	};

	for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		json_t *mine = mr__jparse_object(bodies[i], strlen(bodies[i]));

		cr_expect_not_null(mine, "declined: %s", bodies[i]);
		json_decref(mine);
		agrees(bodies[i], strlen(bodies[i]));
	}
}

Test(jparse, leaves_everything_else_to_jansson)
{
	static const char *const bodies[] = {
		"", " ", "[]", "3", "\"s\"", "{", "}", "{\"a\"}", "{\"a\":}", "{\"a\":1,}",
		"{\"a\":1 \"b\":2}", "{\"a\":1}x", "{\"a\":1}{}", "{\"a\":01}", "{\"a\":1.0}",
		"{\"a\":1e3}", "{\"a\":-}", "{\"a\":1234567890123456789}", "{\"a\":\"\\n\"}",
		"{\"a\":\"\xc3\xa9\"}", "{\"a\":\"\x01\"}", "{\"a\":1,\"a\":2}", "{\"a\":tru}",
		"{\"a\":truex}", "{\"a\":nul}", "{\"a\":[1,]}", "{\"a\":[1 2]}", "{'a':1}",
		"{\"a\":[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]}",
	};

	for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		json_t *mine = mr__jparse_object(bodies[i], strlen(bodies[i]));

		cr_expect_null(mine, "taken: %s", bodies[i]);
		json_decref(mine);
		agrees(bodies[i], strlen(bodies[i]));
	}
	cr_expect_null(mr__jparse_object("{\"a\":1}\0", 8), "a NUL after the object");
	cr_expect_null(mr__jparse_object(NULL, 0));
}

Test(jparse, random_mutations_agree_with_jansson)
{
	static const char seed[] =
		"{\"node_id\":\"agent-12\",\"host\":\"10.0.0.1\",\"ports\":{\"agent\":29400},"
		"\"pod_index\":12,\"spec\":{\"mesh\":{\"tp\":2,\"dp\":0}},\"x\":[1,-2,true,"
		"null,[]],\"generation\":7}";
	static const char alphabet[] = "{}[]\":,-0123456789 truefalsn.eE\\x\t\n\x01\xc3";
	char buf[sizeof(seed) + 8];
	unsigned r = 12345;

	for (int it = 0; it < 20000; it++) {
		size_t len = sizeof(seed) - 1;
		int edits = 1 + it % 3;

		memcpy(buf, seed, len);
		for (int e = 0; e < edits; e++) {
			size_t at;

			r = r * 1103515245u + 12345u;
			at = (r >> 8) % len;
			r = r * 1103515245u + 12345u;
			switch ((r >> 16) % 3) {
			case 0: /* replace */
				buf[at] = alphabet[(r >> 4) % (sizeof(alphabet) - 1)];
				break;
			case 1: /* delete */
				memmove(buf + at, buf + at + 1, len - at - 1);
				len--;
				break;
			default: /* insert */
				if (len + 1 < sizeof(buf)) {
					memmove(buf + at + 1, buf + at, len - at);
					buf[at] = alphabet[(r >> 4) % (sizeof(alphabet) - 1)];
					len++;
				}
			}
		}
		agrees(buf, len);
	}
}
