/*
 * test_metrics.c - Prometheus registry and text format (common/metrics.c).
 *
 * Expected texts are written by hand from the exposition format 0.0.4
 * (HELP/TYPE lines, label escaping, cumulative le buckets + _sum + _count),
 * and promtool (Debian package prometheus) checks a full render.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mr_metrics.h"

static char *render(struct mr_metrics *reg)
{
	char *out = NULL;
	size_t len = 0;

	cr_assert_eq(mr_metrics_render(reg, &out, &len), 0);
	cr_assert_eq(strlen(out), len);
	return out;
}

Test(metrics, counter_and_gauge_text)
{
	struct mr_metrics *reg = mr_metrics_new();
	struct mr_metric_family *req =
		mr_metrics_counter(reg, "meshrun_http_requests_total", "HTTP requests handled.",
				   "route,status");
	struct mr_metric_family *mem = mr_metrics_gauge(reg, "meshrun_members", "Members.", NULL);
	struct mr_counter *ok;
	char *text;

	cr_assert(req && mem);
	ok = mr_metric_counter_child(req, "join", "200");
	mr_counter_inc(ok);
	mr_counter_inc(ok);
	mr_counter_add(mr_metric_counter_child(req, "kv_get", "404"), 2.5);
	/* the same label values give the same child */
	cr_assert_eq(mr_metric_counter_child(req, "join", "200"), ok);
	mr_counter_inc(mr_metric_counter_childv(req, (const char *[]){"join", "200"}));
	mr_counter_add(ok, -5);  /* ignored: counters only go up */
	mr_counter_add(ok, NAN); /* ignored */
	cr_assert_eq(mr_counter_value(ok), 3);
	mr_gauge_set(mr_metric_gauge_child(mem), 9);
	mr_gauge_dec(mr_metric_gauge_child(mem));
	mr_gauge_add(mr_metric_gauge_child(mem), -1);
	text = render(reg);
	cr_assert_str_eq(text,
			 "# HELP meshrun_http_requests_total HTTP requests handled.\n"
			 "# TYPE meshrun_http_requests_total counter\n"
			 "meshrun_http_requests_total{route=\"join\",status=\"200\"} 3\n"
			 "meshrun_http_requests_total{route=\"kv_get\",status=\"404\"} 2.5\n"
			 "# HELP meshrun_members Members.\n"
			 "# TYPE meshrun_members gauge\n"
			 "meshrun_members 7\n");
	free(text);
	mr_metrics_free(reg);
}

Test(metrics, escaping)
{
	struct mr_metrics *reg = mr_metrics_new();
	struct mr_metric_family *f =
		mr_metrics_gauge(reg, "meshrun_path_info", "line1\nback\\slash \"q\"", "path");
	char *text;

	mr_gauge_set(mr_metric_gauge_child(f, "a\\b\"c\nd"), 1);
	text = render(reg);
	/* HELP escapes backslash and newline only; label values also quotes */
	cr_assert_str_eq(text, "# HELP meshrun_path_info line1\\nback\\\\slash \"q\"\n"
			       "# TYPE meshrun_path_info gauge\n"
			       "meshrun_path_info{path=\"a\\\\b\\\"c\\nd\"} 1\n");
	free(text);
	mr_metrics_free(reg);
}

Test(metrics, histogram_text)
{
	static const double b[] = {0.125, 0.5, 1};
	struct mr_metrics *reg = mr_metrics_new();
	struct mr_metric_family *f =
		mr_metrics_histogram(reg, "req_seconds", "Latency.", "route", b, 3);
	struct mr_histogram *h = mr_metric_histogram_child(f, "a");
	char *text;

	cr_assert(h);
	mr_histogram_observe(h, 0.0625);
	mr_histogram_observe(h, 0.125); /* le is inclusive */
	mr_histogram_observe(h, 0.25);
	mr_histogram_observe(h, 2);
	mr_histogram_observe(h, NAN); /* ignored */
	cr_assert_eq(mr_histogram_count(h), 4);
	cr_assert_eq(mr_histogram_sum(h), 2.4375);
	text = render(reg);
	cr_assert_str_eq(text, "# HELP req_seconds Latency.\n"
			       "# TYPE req_seconds histogram\n"
			       "req_seconds_bucket{route=\"a\",le=\"0.125\"} 2\n"
			       "req_seconds_bucket{route=\"a\",le=\"0.5\"} 3\n"
			       "req_seconds_bucket{route=\"a\",le=\"1\"} 3\n"
			       "req_seconds_bucket{route=\"a\",le=\"+Inf\"} 4\n"
			       "req_seconds_sum{route=\"a\"} 2.4375\n"
			       "req_seconds_count{route=\"a\"} 4\n");
	free(text);
	mr_metrics_free(reg);
}

Test(metrics, unlabeled_histogram_and_order)
{
	static const double b[] = {1};
	struct mr_metrics *reg = mr_metrics_new();
	struct mr_metric_family *z = mr_metrics_counter(reg, "z_total", "Z.", NULL);
	struct mr_metric_family *l = mr_metrics_counter(reg, "l_total", "L.", "k");
	struct mr_metric_family *h = mr_metrics_histogram(reg, "a_seconds", "", NULL, b, 1);
	char *text;

	cr_assert(z && l && h);
	mr_histogram_observe(mr_metric_histogram_child(h), -3);
	mr_counter_inc(mr_metric_counter_child(l, "y"));
	mr_counter_inc(mr_metric_counter_child(l, "x"));
	text = render(reg);
	/* registration order of families, creation order of children; an
	 * unlabeled family renders 0 at once; no HELP line for empty help */
	cr_assert_str_eq(text, "# HELP z_total Z.\n"
			       "# TYPE z_total counter\n"
			       "z_total 0\n"
			       "# HELP l_total L.\n"
			       "# TYPE l_total counter\n"
			       "l_total{k=\"y\"} 1\n"
			       "l_total{k=\"x\"} 1\n"
			       "# TYPE a_seconds histogram\n"
			       "a_seconds_bucket{le=\"1\"} 1\n"
			       "a_seconds_bucket{le=\"+Inf\"} 1\n"
			       "a_seconds_sum -3\n"
			       "a_seconds_count 1\n");
	free(text);
	mr_metrics_free(reg);
}

Test(metrics, labeled_family_without_children_is_omitted)
{
	struct mr_metrics *reg = mr_metrics_new();
	char *text;

	cr_assert(mr_metrics_counter(reg, "never_total", "Never.", "a"));
	text = render(reg);
	cr_assert_str_eq(text, "");
	free(text);
	mr_metrics_free(reg);
}

Test(metrics, format_double)
{
	char buf[48];
	struct {
		double v;
		const char *s;
	} cases[] = {
		{0, "0"},         {-0.0, "0"},         {1, "1"},
		{-2.5, "-2.5"},   {123456789, "123456789"},
		{0.1, "0.1"},     {1.0 / 3, "0.3333333333333333"},
		{1e15, "1e+15"},  {1e-9, "1e-09"},     {INFINITY, "+Inf"},
		{-INFINITY, "-Inf"}, {NAN, "NaN"},     {4294967296.0, "4294967296"},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		mr_metrics_format_double(cases[i].v, buf, sizeof(buf));
		cr_assert_str_eq(buf, cases[i].s, "case %zu", i);
		if (isfinite(cases[i].v))
			cr_assert_eq(strtod(buf, NULL), cases[i].v);
	}
}

static void expect_add_error(struct mr_metrics *reg, enum mr_metric_type t, const char *name,
			     const char *labels, const double *b, size_t nb, int err,
			     const char *msg)
{
	struct mr_errbuf eb = {{0}, {0}};
	struct mr_metric_family *fam = NULL;

	cr_assert_eq(mr_metrics_add(reg, t, name, "h", labels, b, nb, &fam, &eb), err, "%s", name);
	cr_assert_null(fam);
	cr_assert_str_eq(eb.msg, msg);
}

Test(metrics, validation)
{
	static const double unsorted[] = {1, 0.5};
	static const double inf[] = {1, INFINITY};
	struct mr_metrics *reg = mr_metrics_new();

	cr_assert(mr_metrics_valid_name("a:b_c9"));
	cr_assert(mr_metrics_valid_name(":x"));
	cr_assert_not(mr_metrics_valid_name("9a"));
	cr_assert_not(mr_metrics_valid_name("a-b"));
	cr_assert_not(mr_metrics_valid_name(""));
	cr_assert(mr_metrics_valid_label("_a1"));
	cr_assert_not(mr_metrics_valid_label("__name"));
	cr_assert_not(mr_metrics_valid_label("a:b"));
	expect_add_error(reg, MR_METRIC_COUNTER, "bad-name", NULL, NULL, 0, MR_EINVAL,
			 "metric name 'bad-name' is not valid");
	expect_add_error(reg, MR_METRIC_COUNTER, "c_total", "a,__b", NULL, 0, MR_EINVAL,
			 "metric 'c_total': label name '__b' is not valid");
	expect_add_error(reg, MR_METRIC_COUNTER, "c_total", "a,", NULL, 0, MR_EINVAL,
			 "metric 'c_total': label name '' is not valid");
	expect_add_error(reg, MR_METRIC_COUNTER, "c_total", "a, b ,a", NULL, 0, MR_EINVAL,
			 "metric 'c_total': label 'a' is repeated");
	expect_add_error(reg, MR_METRIC_HISTOGRAM, "h_seconds", "route,le", NULL, 0, MR_EINVAL,
			 "histogram 'h_seconds' may not use label 'le'");
	expect_add_error(reg, MR_METRIC_HISTOGRAM, "h_seconds", NULL, unsorted, 2, MR_EINVAL,
			 "histogram 'h_seconds': buckets are not strictly increasing at 1");
	expect_add_error(reg, MR_METRIC_HISTOGRAM, "h_seconds", NULL, inf, 2, MR_EINVAL,
			 "histogram 'h_seconds': bucket 1 is not finite");
	cr_assert(mr_metrics_counter(reg, "c_total", "C.", " a , b "));
	cr_assert_eq(mr_metric_label_count(mr_metrics_find(reg, "c_total")), 2);
	expect_add_error(reg, MR_METRIC_GAUGE, "c_total", NULL, NULL, 0, MR_EEXISTS,
			 "metric 'c_total' is already registered");
	cr_assert_null(mr_metrics_gauge(reg, "c_total", "dup", NULL));
	cr_assert_null(mr_metrics_find(reg, "nope"));
	mr_metrics_free(reg);
}

Test(metrics, child_lookup_limits_and_null_safety)
{
	struct mr_metrics *reg = mr_metrics_new();
	struct mr_metric_family *c = mr_metrics_counter(reg, "c_total", "C.", "k");
	char *big = malloc(MR_METRICS_MAX_VALUE + 2);

	memset(big, 'x', MR_METRICS_MAX_VALUE + 1);
	big[MR_METRICS_MAX_VALUE + 1] = '\0';
	cr_assert_null(mr_metric_counter_child(c, big));
	big[MR_METRICS_MAX_VALUE] = '\0';
	cr_assert_not_null(mr_metric_counter_child(c, big));
	cr_assert_null(mr_metric_gauge_child(c, "v"), "wrong type");
	cr_assert_null(mr_metric_counter_child(c, (const char *)NULL));
	cr_assert_null(mr_metric_counter_child(NULL, "v"));
	/* every update on NULL is a no-op */
	mr_counter_inc(NULL);
	mr_gauge_set(NULL, 1);
	mr_histogram_observe(NULL, 1);
	cr_assert_eq(mr_counter_value(NULL), 0);
	cr_assert_eq(mr_histogram_count(NULL), 0);
	free(big);
	mr_metrics_free(reg);
	mr_metrics_free(NULL);
}

struct hook_state {
	struct mr_gauge *g;
	int calls;
};

static void hook(struct mr_metrics *reg, void *user)
{
	struct hook_state *st = user;

	(void)reg;
	mr_gauge_set(st->g, ++st->calls);
}

Test(metrics, collect_hook_runs_before_render)
{
	struct mr_metrics *reg = mr_metrics_new();
	struct hook_state st = {NULL, 0};
	char *text;

	st.g = mr_metric_gauge_child(mr_metrics_gauge(reg, "renders", "Renders.", NULL));
	cr_assert_eq(mr_metrics_on_collect(reg, hook, &st), 0);
	text = render(reg);
	cr_assert(strstr(text, "\nrenders 1\n"), "%s", text);
	free(text);
	text = render(reg);
	cr_assert(strstr(text, "\nrenders 2\n"), "%s", text);
	free(text);
	mr_metrics_free(reg);
}

#define THREADS 4
#define ITERS 100000

static void *hammer(void *arg)
{
	struct mr_metrics *reg = arg;
	struct mr_metric_family *c = mr_metrics_find(reg, "ops_total");
	struct mr_metric_family *g = mr_metrics_find(reg, "inflight");
	struct mr_metric_family *h = mr_metrics_find(reg, "op_seconds");
	/* each thread looks the children up itself: creation races too */
	struct mr_counter *cc = mr_metric_counter_child(c, "x");
	struct mr_gauge *gg = mr_metric_gauge_child(g);
	struct mr_histogram *hh = mr_metric_histogram_child(h);

	for (int i = 0; i < ITERS; i++) {
		mr_counter_inc(cc);
		mr_gauge_inc(gg);
		mr_histogram_observe(hh, (i % 4) * 0.5); /* 0, 0.5, 1, 1.5 */
		mr_gauge_dec(gg);
		if (i % 10000 == 0)
			mr_counter_inc(mr_metric_counter_child(c, "y"));
	}
	return NULL;
}

Test(metrics, concurrent_updates_are_exact)
{
	static const double b[] = {0.5, 1};
	struct mr_metrics *reg = mr_metrics_new();
	pthread_t th[THREADS];
	struct mr_histogram *h;
	char *text;

	mr_metrics_counter(reg, "ops_total", "Ops.", "k");
	mr_metrics_gauge(reg, "inflight", "In flight.", NULL);
	mr_metrics_histogram(reg, "op_seconds", "Op time.", NULL, b, 2);
	for (int i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, hammer, reg);
	for (int i = 0; i < 3; i++) { /* renders race with updates */
		text = render(reg);
		free(text);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	cr_assert_eq(mr_counter_value(mr_metric_counter_child(mr_metrics_find(reg, "ops_total"),
								"x")),
		     THREADS * ITERS);
	cr_assert_eq(mr_gauge_value(mr_metric_gauge_child(mr_metrics_find(reg, "inflight"))), 0);
	h = mr_metric_histogram_child(mr_metrics_find(reg, "op_seconds"));
	cr_assert_eq(mr_histogram_count(h), THREADS * ITERS);
	cr_assert_eq(mr_histogram_sum(h), THREADS * (ITERS / 4) * 3.0);
	text = render(reg);
	cr_assert(strstr(text, "ops_total{k=\"x\"} 400000\n"), "%s", text);
	cr_assert(strstr(text, "ops_total{k=\"y\"} 40\n"), "%s", text);
	cr_assert(strstr(text, "op_seconds_bucket{le=\"0.5\"} 200000\n"), "%s", text);
	cr_assert(strstr(text, "op_seconds_bucket{le=\"1\"} 300000\n"), "%s", text);
	cr_assert(strstr(text, "op_seconds_bucket{le=\"+Inf\"} 400000\n"), "%s", text);
	cr_assert(strstr(text, "op_seconds_count 400000\n"), "%s", text);
	free(text);
	mr_metrics_free(reg);
}

/* Writes text to a temp file and runs promtool on it; returns its exit
 * status, or -1 if promtool is missing. */
static int promtool_check(const char *text, char *out, size_t outsz)
{
	char path[] = "/tmp/mr_metrics_XXXXXX";
	char cmd[256];
	int fd;
	FILE *p;
	size_t n;
	int st;

	if (access("/usr/bin/promtool", X_OK) != 0)
		return -1;
	fd = mkstemp(path);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	snprintf(cmd, sizeof(cmd), "/usr/bin/promtool check metrics < %s 2>&1", path);
	p = popen(cmd, "r");
	cr_assert_not_null(p);
	n = fread(out, 1, outsz - 1, p);
	out[n] = '\0';
	st = pclose(p);
	unlink(path);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

Test(metrics, promtool_accepts_render)
{
	struct mr_metrics *reg = mr_metrics_new();
	struct mr_metric_family *h =
		mr_metrics_histogram(reg, "meshrun_http_request_duration_seconds",
				     "Request latency.", "route,status", NULL, 0);
	struct mr_metric_family *c = mr_metrics_counter(reg, "meshrun_joins_total",
							"Joins \\ with \"odd\"\nhelp.", "job");
	struct mr_metric_family *g =
		mr_metrics_gauge(reg, "meshrun_rank_info", "Rank coordinates.", "rank,tp,pp");
	char *text, out[4096];
	int rc;

	mr_histogram_observe(mr_metric_histogram_child(h, "join", "200"), 0.003);
	mr_histogram_observe(mr_metric_histogram_child(h, "kv", "404"), 42);
	mr_counter_add(mr_metric_counter_child(c, "ns/a \"quoted\"\nx\\y"), 1e20);
	mr_gauge_set(mr_metric_gauge_child(g, "3", "1", "0"), 1);
	mr_gauge_set(mr_metric_gauge_child(g, "4", "0", "1"), -INFINITY);
	text = render(reg);
	rc = promtool_check(text, out, sizeof(out));
	if (rc == -1) {
		free(text);
		mr_metrics_free(reg);
		cr_skip_test("promtool not installed (Debian package prometheus): check skipped");
		return;
	}
	cr_assert_eq(rc, 0, "promtool exit %d: %s\n---\n%s", rc, out, text);
	free(text);
	/* and the check can fail: a counter without _total is a lint error */
	cr_assert(mr_metrics_counter(reg, "meshrun_bad", "Bad.", NULL));
	text = render(reg);
	rc = promtool_check(text, out, sizeof(out));
	cr_assert_neq(rc, 0, "promtool accepted a lint error");
	cr_assert(strstr(out, "meshrun_bad"), "%s", out);
	free(text);
	mr_metrics_free(reg);
}
