/*
 * api_int.h - internals shared by routes.c (routing, auth, dispatch) and
 * handlers.c (one handler per route); see docs/API.md.
 */
#ifndef MR_API_INT_H
#define MR_API_INT_H

#include <stdint.h>

#include "server.h"

#define LIST_MAX 1000

struct call {
	struct mr_controller *c;
	struct mr_http_req *req;
	int route;
	int64_t t0;
	char job[128];      /* "ns/name" */
	char key[CTL_MAX_KEY + 2]; /* KV key: the segments after "kv" */
	const char *path;   /* decoded path, valid for the request */
	const char *bad_seg; /* a job part that is not a DNS label (404) */
	int bad_idx;        /* its segment index */
	struct ctl_res res;
};

/* Fills k->res with a 4xx/5xx {"error": ...}; fmt has one %s (arg). */
void mr__api_fail(struct call *k, int status, const char *code, const char *field,
		  const char *fmt, const char *arg);

/* Route handlers: each validates its query/body and calls the core. */
void mr__api_jobs_post(struct call *k);
void mr__api_jobs_get(struct call *k);
void mr__api_job_get(struct call *k);
void mr__api_join(struct call *k);
void mr__api_member_call(struct call *k);
void mr__api_wait(struct call *k);
void mr__api_diagnosis(struct call *k);
void mr__api_kv(struct call *k, enum mr_http_method method);

#endif
