/*
 * reply.c - filling struct ctl_res, what an operation of the core answers
 * (see reply.h): errors, bodies, text written already, and the answers
 * about a job every operation may give (409 stale generation, 410 over).
 *
 * Non-goals: sending it (api/server.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "json_write.h"
#include "reply.h"
#include "state/names.h"

void mr__res_err(struct ctl_res *res, int status, const char *code, const char *field,
		 const char *fmt, ...)
{
	va_list ap;

	free(res->text);
	res->text = NULL;
	res->text_len = 0;
	res->dep_set = 0;
	res->status = status;
	res->code = code;
	res->field = NULL;
	if (field) {
		snprintf(res->fieldbuf, sizeof(res->fieldbuf), "%s", field);
		res->field = res->fieldbuf;
	}
	va_start(ap, fmt);
	vsnprintf(res->msg, sizeof(res->msg), fmt, ap);
	va_end(ap);
}

void mr__res_ok(struct ctl_res *res, json_t *body)
{
	res->status = 200;
	res->code = NULL;
	res->dep_set = 0;
	json_decref(res->body);
	res->body = body;
	free(res->text);
	res->text = NULL;
	res->text_len = 0;
}

void mr__res_text(struct ctl_res *res, char *text, size_t len)
{
	if (!text) {
		mr__res_err(res, 503, "out_of_memory", NULL, "out of memory");
		return;
	}
	mr__res_ok(res, NULL);
	res->text = text;
	res->text_len = len;
}

void mr__res_dep_round(struct ctl_res *res, const struct ctl_job *job)
{
	res->dep_set = 1;
	res->dep_seq = job->gen_seq;
}

void mr__res_release(struct ctl_res *res)
{
	json_decref(res->body);
	res->body = NULL;
	free(res->text);
	res->text = NULL;
	res->text_len = 0;
}

void mr__res_stale(struct ctl_res *res, const struct ctl_job *job)
{
	mr__res_err(res, 409, "stale_generation", "generation",
		    "generation is stale, the current one is %llu",
		    (unsigned long long)job->generation);
	json_decref(res->body);
	res->body = NULL;
	res->text = mr__json_write_stale(job, NULL, &res->text_len); /* NULL: a plain 409 */
	mr__res_dep_round(res, job);
}

void mr__res_over(struct ctl_res *res, const struct ctl_job *job)
{
	int ok = job->state == CTL_JOB_SUCCEEDED;
	const char *why = job->reason ? job->reason : "";

	mr__res_err(res, 410, ok ? "job_succeeded" : "job_failed", "job", "job '%s' %s: %s",
		    job->name, ok ? "succeeded" : "failed", why);
	json_decref(res->body);
	res->body = json_pack("{sI ss ss}", "generation", (json_int_t)job->generation, "state",
			      mr__ctl_job_state_name(job->state), "reason", why);
}
