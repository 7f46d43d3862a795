/*
 * test_log.c - logfmt logging (common/log.c): quoting, level filter, the
 * fixed keys of a line, per-thread rank, the signal-safe path.
 *
 * stderr is captured through a pipe with dup2(), so what is checked is what
 * a Kubernetes log collector would read.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "mr_log.h"

struct capture {
	int pipe[2];
	int saved;
};

static void capture_start(struct capture *c)
{
	cr_assert_eq(pipe(c->pipe), 0);
	fcntl(c->pipe[0], F_SETFL, O_NONBLOCK);
	c->saved = dup(STDERR_FILENO);
	cr_assert_geq(c->saved, 0);
	cr_assert_geq(dup2(c->pipe[1], STDERR_FILENO), 0);
}

/* Restores stderr and returns what was written (malloc'd). */
static char *capture_end(struct capture *c)
{
	size_t cap = 65536, n = 0;
	char *buf = malloc(cap + 1);
	ssize_t k;

	dup2(c->saved, STDERR_FILENO);
	close(c->saved);
	close(c->pipe[1]);
	while ((k = read(c->pipe[0], buf + n, cap - n)) > 0)
		n += (size_t)k;
	close(c->pipe[0]);
	buf[n] = '\0';
	return buf;
}

Test(log, quote_rules)
{
	const char *plain = "node-1/ok:7";
	char long_value[2000];
	const char *q;

	cr_assert_eq(mr_log_q(plain), plain, "plain values are returned as they are");
	cr_assert_str_eq(mr_log_q(""), "\"\"");
	cr_assert_str_eq(mr_log_q(NULL), "\"\"");
	cr_assert_str_eq(mr_log_q("a b"), "\"a b\"");
	cr_assert_str_eq(mr_log_q("a=b"), "\"a=b\"");
	cr_assert_str_eq(mr_log_q("say \"hi\""), "\"say \\\"hi\\\"\"");
	cr_assert_str_eq(mr_log_q("c:\\x"), "\"c:\\\\x\"");
	cr_assert_str_eq(mr_log_q("two\nlines\r\tend"), "\"two lines  end\"");
	/* long values are cut but stay one closed quoted value */
	memset(long_value, 'x', sizeof(long_value) - 1);
	long_value[sizeof(long_value) - 1] = '\0';
	long_value[5] = ' ';
	q = mr_log_q(long_value);
	cr_assert_lt(strlen(q), 512);
	cr_assert_gt(strlen(q), 500);
	cr_assert_eq(q[0], '"');
	cr_assert_eq(q[strlen(q) - 1], '"');
	/* a string of quotes: every escape pair is complete */
	memset(long_value, '"', sizeof(long_value) - 1);
	q = mr_log_q(long_value);
	cr_assert_lt(strlen(q), 512);
	cr_assert_eq(q[strlen(q) - 1], '"');
	cr_assert_eq(q[strlen(q) - 2], '"');
	cr_assert_eq(q[strlen(q) - 3], '\\');
}

Test(log, eight_quoted_values_per_line)
{
	const char *v[8];
	char want[16];

	for (int i = 0; i < 8; i++) {
		snprintf(want, sizeof(want), "v %d", i);
		v[i] = mr_log_q(want);
	}
	for (int i = 0; i < 8; i++) {
		snprintf(want, sizeof(want), "\"v %d\"", i);
		cr_assert_str_eq(v[i], want);
	}
}

static int evaluated;

static int side_effect(void)
{
	evaluated++;
	return 42;
}

Test(log, level_filter_writes_nothing_when_disabled)
{
	struct capture c;
	char *out;

	mr_log_init("test", MR_LOG_WARN);
	capture_start(&c);
	mr_log_debug("hidden_debug", "x=%d", side_effect());
	mr_log_info("hidden_info", "x=%d", side_effect());
	mr_log_warn("shown_warn", "x=%d", side_effect());
	mr_log_error("shown_error", "%s", "");
	mr_log_set_level(MR_LOG_OFF);
	mr_log_error("hidden_error", "x=%d", side_effect());
	out = capture_end(&c);
	cr_assert_eq(evaluated, 1, "arguments of disabled lines must not be evaluated");
	cr_assert_null(strstr(out, "hidden"), "%s", out);
	cr_assert(strstr(out, "lvl=warn comp=test event=shown_warn x=42\n"), "%s", out);
	cr_assert(strstr(out, "lvl=error comp=test event=shown_error\n"), "%s", out);
	cr_assert_eq(strchr(strchr(out, '\n') + 1, '\n')[1], '\0', "two lines: %s", out);
	free(out);
}

Test(log, line_format)
{
	struct capture c;
	char *out;
	int y, mo, d, h, mi, s, ms, used = 0;

	mr_log_init("controller", MR_LOG_DEBUG);
	mr_log_set_job("ns/a");
	mr_log_set_rank(3);
	capture_start(&c);
	mr_log_debug("round_closed", "gen=%d world=%d name=%s", 2, 8, mr_log_q("a b"));
	out = capture_end(&c);
	cr_assert_eq(sscanf(out, "ts=%4d-%2d-%2dT%2d:%2d:%2d.%3dZ %n", &y, &mo, &d, &h, &mi, &s, &ms,
			    &used),
		     7, "%s", out);
	cr_assert_eq(used, 28, "%s", out);
	cr_assert(y >= 2024 && mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && h < 24 && mi < 60);
	cr_assert_str_eq(out + used, "lvl=debug comp=controller job=ns/a rank=3 event=round_closed "
				     "gen=2 world=8 name=\"a b\"\n");
	free(out);

	/* job with a space is quoted; rank -1 and job NULL drop the keys */
	mr_log_set_job("odd job");
	capture_start(&c);
	mr_log_info("e1", "%s", "");
	mr_log_set_job(NULL);
	mr_log_set_rank(-1);
	mr_log_info("e2", "k=v");
	out = capture_end(&c);
	cr_assert(strstr(out, "lvl=info comp=controller job=\"odd job\" rank=3 event=e1\n"), "%s",
		  out);
	cr_assert(strstr(out, "lvl=info comp=controller event=e2 k=v\n"), "%s", out);
	free(out);
}

static void *ranked_thread(void *arg)
{
	(void)arg;
	mr_log_set_rank(5);
	mr_log_info("from_thread", "%s", "");
	return NULL;
}

Test(log, rank_is_per_thread)
{
	struct capture c;
	pthread_t t;
	char *out;

	mr_log_init("agent", MR_LOG_INFO);
	capture_start(&c);
	pthread_create(&t, NULL, ranked_thread, NULL);
	pthread_join(t, NULL);
	mr_log_info("from_main", "%s", "");
	out = capture_end(&c);
	cr_assert(strstr(out, "comp=agent rank=5 event=from_thread\n"), "%s", out);
	cr_assert(strstr(out, "comp=agent event=from_main\n"), "%s", out);
	free(out);
}

Test(log, long_line_is_capped_and_terminated)
{
	struct capture c;
	char *big = malloc(10000), *out;

	memset(big, 'z', 9999);
	big[9999] = '\0';
	mr_log_init("t", MR_LOG_INFO);
	capture_start(&c);
	mr_log_info("big", "v=%s", big);
	out = capture_end(&c);
	cr_assert_leq(strlen(out), 4096);
	cr_assert_eq(out[strlen(out) - 1], '\n');
	cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line");
	free(out);
	free(big);
}

Test(log, signal_path_and_levels)
{
	struct capture c;
	char *out;

	mr_log_init(NULL, MR_LOG_INFO);
	capture_start(&c);
	mr_log_signal("sigterm");
	out = capture_end(&c);
	cr_assert_str_eq(out, "lvl=warn comp=meshrun event=sigterm\n");
	free(out);
	cr_assert_eq(mr_log_parse_level("debug"), MR_LOG_DEBUG);
	cr_assert_eq(mr_log_parse_level("warn"), MR_LOG_WARN);
	cr_assert_eq(mr_log_parse_level("off"), MR_LOG_OFF);
	cr_assert_eq(mr_log_parse_level("verbose"), -1);
	cr_assert_eq(mr_log_parse_level(NULL), -1);
}

Test(log, json_format_is_one_object_per_line_with_numbers_as_numbers)
{
	struct capture c;
	json_error_t je;
	json_t *o;
	char *out, *nl;

	mr_log_init("agent", MR_LOG_INFO);
	mr_log_set_job("ns/a b");
	mr_log_set_rank(2);
	mr_log_set_format(MR_LOG_JSON);
	capture_start(&c);
	mr_log_info("step", "step=%d/%d loss=%.4f lr=%.2e neg=-3 lead=007 msg=%s flag", 10, 30,
		    4.5, 3e-4, mr_log_q("say \"hi\" = \\ there"));
	mr_log_warn("second", "%s", "");
	out = capture_end(&c);
	mr_log_set_format(MR_LOG_LOGFMT);
	mr_log_set_job(NULL);
	mr_log_set_rank(-1);
	nl = strchr(out, '\n');
	cr_assert_not_null(nl, "%s", out);
	*nl = '\0';
	o = json_loads(out, 0, &je);
	cr_assert_not_null(o, "not JSON (%s): %s", je.text, out);
	cr_assert_str_eq(json_string_value(json_object_get(o, "lvl")), "info");
	cr_assert_str_eq(json_string_value(json_object_get(o, "comp")), "agent");
	cr_assert_str_eq(json_string_value(json_object_get(o, "job")), "ns/a b");
	cr_assert_eq(json_integer_value(json_object_get(o, "rank")), 2);
	cr_assert_str_eq(json_string_value(json_object_get(o, "event")), "step");
	cr_assert_str_eq(json_string_value(json_object_get(o, "step")), "10/30");
	cr_assert_float_eq(json_number_value(json_object_get(o, "loss")), 4.5, 1e-12);
	cr_assert_float_eq(json_number_value(json_object_get(o, "lr")), 3e-4, 1e-12);
	cr_assert_eq(json_integer_value(json_object_get(o, "neg")), -3);
	cr_assert_str_eq(json_string_value(json_object_get(o, "lead")), "007",
			 "not a JSON number: a string");
	cr_assert_str_eq(json_string_value(json_object_get(o, "msg")), "say \"hi\" = \\ there");
	cr_assert(json_is_true(json_object_get(o, "flag")));
	cr_assert_eq(strlen(json_string_value(json_object_get(o, "ts"))), 24);
	json_decref(o);
	o = json_loads(nl + 1, 0, &je);
	cr_assert_not_null(o, "second line not JSON (%s): %s", je.text, nl + 1);
	cr_assert_str_eq(json_string_value(json_object_get(o, "event")), "second");
	json_decref(o);
	free(out);
}

Test(log, always_lines_pass_every_level_but_off)
{
	struct capture c;
	char *out;

	mr_log_init("agent", MR_LOG_ERROR);
	capture_start(&c);
	mr_log_info("hidden", "%s", "");
	mr_log_always("job_summary", "state=%s", "succeeded");
	mr_log_set_level(MR_LOG_OFF);
	mr_log_always("off_hides_it", "%s", "");
	out = capture_end(&c);
	cr_assert_null(strstr(out, "hidden"), "%s", out);
	cr_assert_null(strstr(out, "off_hides_it"), "%s", out);
	cr_assert(strstr(out, "lvl=info comp=agent event=job_summary state=succeeded\n"), "%s", out);
	free(out);
}
