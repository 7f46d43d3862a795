/*
 * diag.h - the diagnosis of a job (docs/DIAGNOSIS.md): who waits for whom
 * from its ranks' progress, and who holds them up. The API serves it
 * (GET /v1/jobs/{job}/diagnosis); the core's hang timer runs it once per
 * hang (core/progress.c).
 *
 * Non-goals: storing progress, straggler detection (core/progress.c).
 */
#ifndef MR_CTL_DIAG_H
#define MR_CTL_DIAG_H

#include <jansson.h>
#include <stddef.h>

#include "state/state.h"

/* The diagnosis (docs/DIAGNOSIS.md): O(ranks x groups) time and memory.
 * msg (may be NULL) gets the one-line verdict. NULL on OOM. */
json_t *mr__ctl_diagnose(struct ctl *ctl, struct ctl_job *job, char *msg, size_t cap);

#endif
