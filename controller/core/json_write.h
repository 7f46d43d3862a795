/*
 * json_write.h - the compact JSON text of the controller's replies,
 * written directly (json_write.c says why and what it takes).
 *
 * Non-goals: reading JSON (api/json_read.h).
 */
#ifndef MR_CTL_JSON_WRITE_H
#define MR_CTL_JSON_WRITE_H

#include <jansson.h>
#include <stddef.h>

#include "reply.h"
#include "state/state.h"

/* The compact JSON text of v (malloc'd, NUL-terminated, *len bytes): the
 * same bytes as json_dumps(JSON_COMPACT | JSON_ENCODE_ANY), written
 * without its per-container costs. NULL on OOM. */
char *mr__json_write(const json_t *v, size_t *len);
/* The text of an error reply: {"error":{"code","message","field"}} and
 * then res->body's fields (extra top-level fields). NULL on OOM. */
char *mr__json_write_error(const struct ctl_res *res, size_t *len);
/* The core's frequent replies, written without building a json_t (the
 * bytes mr__json_write would write for the objects the API describes);
 * each malloc'd, NUL-terminated, *len bytes, or NULL on OOM. A member's
 * rank in the closed round (the wait's "running" reply): */
char *mr__json_write_round(const struct ctl_job *job, const struct ctl_member *m, size_t *len);
/* {"generation":<the job's>,"state":state} */
char *mr__json_write_state(const struct ctl_job *job, const char *state, size_t *len);
/* The extra fields of a 409 stale_generation: the job's generation and
 * restarts and, m not NULL, "member": what a wait of m answers now. */
char *mr__json_write_stale(const struct ctl_job *job, const struct ctl_member *m, size_t *len);

#endif
