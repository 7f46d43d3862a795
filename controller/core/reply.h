/*
 * reply.h - what an operation of the core answers: struct ctl_res (an HTTP
 * status, an error code/field/message, or a JSON body, text or raw bytes)
 * and the helpers that fill it. The core fills it; the API (api/) sends it.
 *
 * Ownership: res owns body and text; mr__res_release frees them.
 *
 * Non-goals: sending (api/server.c), the JSON text (json_write.h).
 */
#ifndef MR_CTL_REPLY_H
#define MR_CTL_REPLY_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "state/state.h"

struct ctl_res {
	int status;           /* HTTP status */
	const char *code;     /* error code, NULL on success */
	const char *field;    /* offending field (points at fieldbuf), may be NULL */
	char fieldbuf[128];
	char msg[256];
	json_t *body;         /* success body, or extra top-level error fields; owned */
	char *text;           /* instead of body, written directly (json_write.c): the
			       * success body, or the extra fields of an error
			       * without braces ("generation":2,...); owned */
	size_t text_len;
	const void *raw;      /* raw success body (KV value), borrowed */
	size_t raw_len;
	uint64_t etag;        /* 0 = none */
	int suspended;        /* the request was parked as a waiter */
	/* dep_set: the reply shows only state recorded in journal batches up
	 * to dep_seq (mr__jr_seq), so it leaves as soon as that batch is on
	 * disk; unset, it waits for every batch collected or in flight.
	 * mr__res_ok/mr__res_err clear it. */
	int dep_set;
	uint64_t dep_seq;
};

void mr__res_err(struct ctl_res *res, int status, const char *code, const char *field,
		 const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void mr__res_ok(struct ctl_res *res, json_t *body);
/* 200 with a body already written (owned by res from now on; NULL: 503
 * out_of_memory). */
void mr__res_text(struct ctl_res *res, char *text, size_t len);
void mr__res_release(struct ctl_res *res);
/* 409 stale_generation with the job's current generation. */
void mr__res_stale(struct ctl_res *res, const struct ctl_job *job);
/* The reply shows only the job's generation, round and ranks (see
 * ctl_res.dep_set). */
void mr__res_dep_round(struct ctl_res *res, const struct ctl_job *job);
/* The 410 answer for a terminal job. */
void mr__res_over(struct ctl_res *res, const struct ctl_job *job);

#endif
