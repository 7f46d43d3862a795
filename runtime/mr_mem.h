/*
 * mr_mem.h - the runtime's allocator with accounting by category.
 *
 * Every large buffer of a rank (parameters, gradients, optimizer state,
 * activations, workspace) is allocated through mr_mem_alloc, which records
 * its size under an enum mr_mem_kind (from mr_worker.h). The totals are what
 * the worker reports and what the planner is checked against, so they come
 * from the allocator itself, not from a formula.
 *
 * Buffers are 64-byte aligned and zero-filled; all but optimizer state
 * are registered with the communicator (mr_comm_mem_alloc), so peers on
 * this host read them with one copy.
 *
 * Ownership: the caller frees with mr_mem_free on the same struct mr_mem.
 * Device memory another allocator hands out (the cuda device) is recorded
 * with mr_mem_count / mr_mem_uncount, so one ledger covers both.
 *
 * Non-goals: pooling.
 */
#ifndef MR_MEM_H
#define MR_MEM_H

#include <stddef.h>

#include "mr_worker.h"

struct mr_mem {
	size_t bytes[MR_MEM_KINDS]; /* live bytes per kind */
	size_t peak[MR_MEM_KINDS];  /* high-water mark per kind */
};

/* Returns zeroed, 64-byte aligned memory of n bytes, or NULL. */
void *mr_mem_alloc(struct mr_mem *m, enum mr_mem_kind kind, size_t n);
/* p may be NULL; n and kind must match the allocation. */
void mr_mem_free(struct mr_mem *m, enum mr_mem_kind kind, void *p, size_t n);
/* Accounting alone: n bytes under kind allocated (peak updated) or freed
 * elsewhere. */
void mr_mem_count(struct mr_mem *m, enum mr_mem_kind kind, size_t n);
void mr_mem_uncount(struct mr_mem *m, enum mr_mem_kind kind, size_t n);
const char *mr_mem_kind_name(enum mr_mem_kind kind);

#endif
