/*
 * test_jobname.c - common/mr_jobname.h: the job-name grammar the
 * controller and the CLI share ("namespace/name", each part a Kubernetes
 * DNS label), on names at and past each edge of the rule.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "mr_jobname.h"

Test(jobname, names_at_each_edge_of_the_rule)
{
	char long_part[80];
	const char *good[] = { "t/a", "default/gpt2-124m", "team-1/run.3", "a/0", "9x/y9" };
	const char *bad[] = {
		"",         "a",        "/a",       "a/",       "a//b",     "a/b/c",
		"A/b",      "a/B",      "-a/b",     "a-/b",     "a/.b",     "a/b.",
		"a/..",     "./a",      "a/b c",    "a/b?x",    "a/b#x",    "a/b%20",
		"a/b_c",    "a/b\n",
	};

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		cr_expect(mr_job_name_valid(good[i]), "'%s' refused", good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect(!mr_job_name_valid(bad[i]), "'%s' taken", bad[i]);

	/* 63 bytes is the longest part */
	memset(long_part, 'a', 63);
	long_part[63] = '\0';
	cr_expect(mr_job_part_valid(long_part), "a 63-byte part refused");
	long_part[63] = 'a';
	long_part[64] = '\0';
	cr_expect(!mr_job_part_valid(long_part), "a 64-byte part taken");
	cr_expect(!mr_job_part_valid(""), "an empty part taken");
}
