/*
 * mr_jobname.h - the grammar of job names, one implementation for the
 * controller (which answers any other name 400) and the CLI (which refuses
 * it before it builds a URL).
 *
 * A job is named "namespace/name": two parts joined by one '/', each a
 * Kubernetes DNS label of 1-63 bytes, lower-case letters, digits, '-' and
 * '.', starting and ending with a letter or a digit
 * ([a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?). So a name is always exactly two
 * path segments as written: no "." or ".." part, no '?', '#', '%', space or
 * further '/' that a URL would read otherwise.
 *
 * Non-goals: the Kubernetes length limit of a whole object name (253).
 */
#ifndef MR_JOBNAME_H
#define MR_JOBNAME_H

#include <stddef.h>

/* Longest part (namespace or name) in bytes. */
#define MR_JOB_PART_MAX 63
/* The rule, for error messages. */
#define MR_JOB_NAME_RULE                                                               \
	"a job name is 'namespace/name', each part 1-63 lower-case letters, digits, '-' " \
	"or '.', starting and ending with a letter or a digit"

/* 1 if the NUL-terminated s is a valid part (namespace or name), else 0. */
int mr_job_part_valid(const char *s);
/* 1 if name is "namespace/name" of two valid parts, else 0. */
int mr_job_name_valid(const char *name);

#endif
