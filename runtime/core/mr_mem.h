/*
 * mr_mem.h - the runtime's memory ledger: accounting by category.
 *
 * Every large buffer of a rank (parameters, gradients, optimizer state,
 * activations, workspace, state offloaded to host memory) is recorded under an enum mr_mem_kind (which
 * mr_worker.h reports). The totals are what the worker reports and what
 * the planner is checked against, so they come from the allocators
 * themselves, not from a formula.
 *
 * Host memory is allocated through mr_mem_alloc (device/dev_int.h, the
 * cpu device's memory): 64-byte aligned and zero-filled; all but
 * optimizer state are registered with the communicator
 * (mr_comm_mem_alloc), so peers on this host read them with one copy; the
 * caller frees with mr_mem_free on the same struct mr_mem.
 * Device memory another allocator hands out (the cuda device) is recorded
 * with mr_mem_count / mr_mem_uncount, so one ledger covers both.
 *
 * Non-goals: pooling.
 */
#ifndef MR_MEM_H
#define MR_MEM_H

#include <stddef.h>

/* Memory held per rank, by category, from the allocator itself. */
enum mr_mem_kind {
	MR_MEM_PARAMS,
	MR_MEM_GRADS,
	MR_MEM_OPTIM,
	MR_MEM_ACTS,
	MR_MEM_WORKSPACE,
	/* host memory a device rank holds state in ("offload": the AdamW
	 * moments and with them the fp32 master shard); the kinds before it
	 * are the device's own memory */
	MR_MEM_HOST,
	MR_MEM_KINDS,
};

struct mr_mem {
	size_t bytes[MR_MEM_KINDS]; /* live bytes per kind */
	size_t peak[MR_MEM_KINDS];  /* high-water mark per kind */
};

/* Accounting alone: n bytes under kind allocated (peak updated) or freed
 * elsewhere. */
void mr_mem_count(struct mr_mem *m, enum mr_mem_kind kind, size_t n);
void mr_mem_uncount(struct mr_mem *m, enum mr_mem_kind kind, size_t n);
const char *mr_mem_kind_name(enum mr_mem_kind kind);

#endif
