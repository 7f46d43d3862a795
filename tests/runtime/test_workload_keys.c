/*
 * test_workload_keys.c - the gpt worker's key table (runtime/
 * gpt_worker_keys.c) is what the worker accepts and what the docs say:
 * docs/WORKLOAD.md is the table printed, byte for byte (it cannot drift);
 * every number key is refused just outside its documented range, naming
 * the key, and not refused for range at its ends; every choice key takes
 * each documented choice and refuses another, listing them; an unknown
 * key names the nearest valid one.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_worker_int.h"

/* The config {"ckpt_dir": "/tmp/x", key: v} checked (on device cuda when
 * the key is its precision); its error into eb. */
static int check(const char *key, json_t *v, struct mr_errbuf *eb)
{
	json_t *c = json_pack("{s:s}", "ckpt_dir", "/tmp/mr-keys");
	int rc;

	if (!strcmp(key, "precision"))
		json_object_set_new(c, "device", json_string("cuda"));
	json_object_set_new(c, key, v);
	memset(eb, 0, sizeof(*eb));
	rc = mr_gpt_worker_check_config(c, eb);
	json_decref(c);
	return rc;
}

static json_t *number(const struct mr__gw_key *k, double v)
{
	return k->type == GWK_INT ? json_integer((json_int_t)v) : json_real(v);
}

Test(workload_keys, docs_workload_md_is_the_table_printed)
{
	char *got = NULL, *want;
	size_t n = 0, len;
	FILE *f = open_memstream(&got, &n);

	cr_assert_not_null(f);
	mr_gpt_worker_keys_doc(f);
	fclose(f);
	cr_assert_not_null(f = fopen("docs/WORKLOAD.md", "r"), "docs/WORKLOAD.md is missing");
	want = malloc(1 << 20);
	len = fread(want, 1, (1 << 20) - 1, f);
	want[len] = '\0';
	fclose(f);
	cr_expect_str_eq(got, want,
			 "docs/WORKLOAD.md is out of date: build/meshrun local --help-workload "
			 "> docs/WORKLOAD.md");
	free(got);
	free(want);
}

Test(workload_keys, numbers_are_refused_outside_their_documented_range)
{
	struct mr_errbuf eb;
	int n = 0;

	for (const struct mr__gw_key *k = mr__gw_keys; k->name; k++) {
		double lo = k->lo, hi = k->hi;
		double below = lo == 0 ? -1 : lo < 0 ? lo * 2 : k->type == GWK_INT ? lo - 1 : lo / 2;
		double above = k->type == GWK_INT ? hi + 1 : hi * 2;

		if (k->type != GWK_INT && k->type != GWK_NUM)
			continue;
		n++;
		cr_expect_lt(check(k->name, number(k, below), &eb), 0, "%s = %g accepted", k->name,
			     below);
		cr_expect_str_eq(eb.field, k->name, "%s = %g: %s", k->name, below, eb.msg);
		cr_expect_lt(check(k->name, number(k, above), &eb), 0, "%s = %g accepted", k->name,
			     above);
		cr_expect_str_eq(eb.field, k->name, "%s = %g: %s", k->name, above, eb.msg);
		for (int end = 0; end < 2; end++) {
			double v = end ? hi : lo;
			/* another check may object to the combination; not the range */
			if (check(k->name, number(k, v), &eb) < 0)
				cr_expect(strcmp(eb.field, k->name) || !strstr(eb.msg, "range"),
					  "%s = %g refused for its range: %s", k->name, v, eb.msg);
		}
	}
	cr_expect_gt(n, 30);
}

Test(workload_keys, choices_are_the_documented_ones)
{
	struct mr_errbuf eb;

	for (const struct mr__gw_key *k = mr__gw_keys; k->name; k++) {
		char one[64];

		if (k->type != GWK_CHOICE)
			continue;
		for (const char *p = k->choices; *p;) {
			size_t len = strcspn(p, "|");
			snprintf(one, sizeof(one), "%.*s", (int)len, p);
			if (check(k->name, json_string(one), &eb) < 0)
				cr_expect_str_neq(eb.field, k->name, "%s \"%s\" refused: %s", k->name,
						  one, eb.msg);
			p += len + (p[len] == '|');
		}
		cr_expect_lt(check(k->name, json_string("no-such-choice"), &eb), 0, "%s", k->name);
		cr_expect_str_eq(eb.field, k->name);
		snprintf(one, sizeof(one), "%.*s", (int)strcspn(k->choices, "|"), k->choices);
		cr_expect(strstr(eb.msg, one), "%s: the message lists no choice: %s", k->name,
			  eb.msg);
	}
}

Test(workload_keys, unknown_key_names_the_nearest)
{
	struct mr_errbuf eb;

	cr_expect_lt(check("lrr", json_real(0.1), &eb), 0);
	cr_expect_str_eq(eb.field, "lrr");
	cr_expect(strstr(eb.msg, "did you mean 'lr'"), "%s", eb.msg);
	cr_expect_lt(check("eval_evry", json_integer(5), &eb), 0);
	cr_expect(strstr(eb.msg, "did you mean 'eval_every'"), "%s", eb.msg);
	cr_expect_lt(check("completely_unrelated_name", json_integer(5), &eb), 0);
	cr_expect(strstr(eb.msg, "docs/WORKLOAD.md"), "%s", eb.msg);
}
