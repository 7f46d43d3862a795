/*
 * test_json_write.c - the controller's own JSON fast paths agree with
 * jansson: mr__json_write() writes the bytes json_dumps(JSON_COMPACT |
 * JSON_ENCODE_ANY) writes, mr__json_write_error() the error object the
 * server built before, and mr__json_read_object() either declines a body
 * or builds exactly what json_loadb(JSON_REJECT_DUPLICATES) builds - never
 * taking a body jansson refuses; the replies the core writes directly (a
 * rank, a state, a 409's extra fields with and without "member") are the
 * bytes json_dumps writes for the objects docs/API.md describes. Bodies
 * come from a list of cases and from random mutations of agent bodies.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "api/json_read.h"
#include "core/ctl.h"
#include "core/json_write.h"

static void same_text(json_t *v)
{
	size_t len = 0;
	char *mine = mr__json_write(v, &len);
	char *ref = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

	cr_assert_not_null(mine);
	cr_assert_not_null(ref);
	cr_expect_str_eq(mine, ref);
	cr_expect_eq(len, strlen(ref));
	free(mine);
	free(ref);
}

Test(json_write, writes_what_json_dumps_writes)
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

Test(json_write, error_bodies_are_what_jansson_built)
{
	struct ctl_res res;
	size_t len = 0;
	char *mine;
	json_t *o;
	char *ref;

	memset(&res, 0, sizeof(res));
	mr__res_err(&res, 409, "stale_generation", "generation", "node \"%s\" is \\ late", "n\t1");
	res.body = json_pack("{sI si}", "generation", (json_int_t)7, "restarts", 2);
	mine = mr__json_write_error(&res, &len);
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
	mine = mr__json_write_error(&res, &len);
	cr_expect_str_eq(mine, "{\"error\":{\"code\":\"not_found\",\"message\":\"no \\u0001 "
			       "route\",\"field\":null}}");
	free(mine);
}

/* text (len bytes) is what json_dumps writes for ref (stolen). */
static void is_dump_of(char *text, size_t len, json_t *ref)
{
	char *want = json_dumps(ref, JSON_COMPACT | JSON_ENCODE_ANY);

	cr_assert_not_null(text);
	cr_assert_not_null(want);
	cr_expect_str_eq(text, want);
	cr_expect_eq(len, strlen(want));
	free(want);
	free(text);
	json_decref(ref);
}

static json_t *rank_ref(const struct ctl_job *job, const struct ctl_member *m)
{
	return json_pack("{ss sI si si si si sI si s{si si si si si}}", "state", "running",
			 "generation", (json_int_t)job->generation, "num_nodes", job->num_nodes,
			 "node_rank", m->node_rank, "nproc_per_node", job->spec.nproc_per_node,
			 "world_size", job->world_size, "rank_base",
			 (json_int_t)m->node_rank * job->spec.nproc_per_node, "restarts",
			 job->restarts, "mesh", "tp", job->spec.tp, "pp", job->spec.pp, "cp",
			 job->spec.cp, "ep", job->spec.ep, "dp", job->dp);
}

Test(json_write, direct_replies_are_what_json_dumps_writes)
{
	struct ctl_job job;
	struct ctl_member m;
	size_t len = 0;
	char *t;

	memset(&job, 0, sizeof(job));
	memset(&m, 0, sizeof(m));
	job.spec = (struct ctl_spec){ .min_nodes = 2, .max_nodes = 100000, .nproc_per_node = 8,
				      .tp = 8, .pp = 4, .cp = 2, .ep = 2, .dp = 0 };
	job.generation = 12345678901ULL;
	job.restarts = 7;
	job.state = CTL_JOB_RUNNING;
	job.num_nodes = 99999;
	job.world_size = 799992;
	job.dp = 12499;
	m.node_rank = 4321;
	m.state = CTL_M_RUNNING;
	t = mr__json_write_round(&job, &m, &len);
	is_dump_of(t, len, rank_ref(&job, &m));
	t = mr__json_write_state(&job, "waiting", &len);
	is_dump_of(t, len, json_pack("{sI ss}", "generation", (json_int_t)job.generation, "state",
				     "waiting"));
	/* a 409's extra fields, as an object */
	t = mr__json_write_stale(&job, NULL, &len);
	cr_assert_not_null(t);
	cr_expect_str_eq(t, "\"generation\":12345678901,\"restarts\":7");
	free(t);
	t = mr__json_write_stale(&job, &m, &len);
	{
		size_t n = len + 2;
		char *o = malloc(n + 1);
		json_t *ref = json_pack("{sI si so}", "generation", (json_int_t)job.generation,
					"restarts", job.restarts, "member", rank_ref(&job, &m));

		snprintf(o, n + 1, "{%s}", t);
		free(t);
		is_dump_of(o, n, ref);
	}
	m.state = CTL_M_WAITING;
	job.state = CTL_JOB_FORMING;
	t = mr__json_write_stale(&job, &m, &len);
	cr_expect_str_eq(t, "\"generation\":12345678901,\"restarts\":7,\"member\":"
			    "{\"generation\":12345678901,\"state\":\"waiting\"}");
	free(t);
	/* and inside an error reply */
	{
		struct ctl_res res;
		char *e;

		memset(&res, 0, sizeof(res));
		mr__res_stale(&res, &job);
		e = mr__json_write_error(&res, &len);
		cr_expect_str_eq(e, "{\"error\":{\"code\":\"stale_generation\",\"message\":"
				    "\"generation is stale, the current one is 12345678901\","
				    "\"field\":\"generation\"},\"generation\":12345678901,"
				    "\"restarts\":7}");
		free(e);
		mr__res_release(&res);
	}
}

/* mr__json_read_object(text) is NULL, or equal to jansson's parse; and never
 * non-NULL where jansson refuses. */
static void agrees(const char *text, size_t len)
{
	json_error_t err;
	json_t *ref = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
	json_t *mine = mr__json_read_object(text, len);

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

Test(json_read, takes_agent_bodies_as_jansson_does)
{
	static const char *const bodies[] = {
		join_body,
		beat_body,
		" \t\r\n{ \"a\" : [ ] , \"b\" : { } , \"c\" : true , \"d\" : null } \n",
		"{\"permanent\":false,\"reason\":\"exit 3\"}",
		"{}", "{\"\":0}", "{\"a\":-0}", "{\"a\":999999999999999999}",
	};

	for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
		json_t *mine = mr__json_read_object(bodies[i], strlen(bodies[i]));

		cr_expect_not_null(mine, "declined: %s", bodies[i]);
		json_decref(mine);
		agrees(bodies[i], strlen(bodies[i]));
	}
}

Test(json_read, leaves_everything_else_to_jansson)
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
		json_t *mine = mr__json_read_object(bodies[i], strlen(bodies[i]));

		cr_expect_null(mine, "taken: %s", bodies[i]);
		json_decref(mine);
		agrees(bodies[i], strlen(bodies[i]));
	}
	cr_expect_null(mr__json_read_object("{\"a\":1}\0", 8), "a NUL after the object");
	cr_expect_null(mr__json_read_object(NULL, 0));
}

Test(json_read, random_mutations_agree_with_jansson)
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
