/*
 * jobname.c - the grammar of job names; see mr_jobname.h.
 */
#include "mr_jobname.h"

#include <string.h>

/* n bytes of s form a part. */
static int part_ok(const char *s, size_t n)
{
	if (n < 1 || n > MR_JOB_PART_MAX)
		return 0;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		int alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');

		if (!alnum && !((c == '-' || c == '.') && i > 0 && i + 1 < n))
			return 0;
	}
	return 1;
}

int mr_job_part_valid(const char *s)
{
	return part_ok(s, strlen(s));
}

int mr_job_name_valid(const char *name)
{
	const char *slash = strchr(name, '/');

	/* the second part holds no '/': part_ok refuses it */
	return slash && part_ok(name, (size_t)(slash - name)) && mr_job_part_valid(slash + 1);
}
