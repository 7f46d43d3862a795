/*
 * mem.c - accounted allocation of host memory for the devices that keep
 * their buffers there (the cpu device), counted in the rank's ledger
 * (core/mr_mem.h); declared in device/dev_int.h.
 *
 * What ranks exchange (parameters, gradients, activations, workspace)
 * comes from the communicator's registered memory (mr_comm_mem_alloc):
 * shared-memory peers read it with one copy. Optimizer state and state a
 * device rank offloads to the host (MR_MEM_HOST) stay private. Sanitizer
 * builds keep every buffer on the heap, where the sanitizer watches it.
 *
 * mr_dev_host_alloc (mr_device.h): a device's host memory, through its
 * host_alloc op (pinned on cuda) or, without one, mr_mem_alloc.
 */
#include <stdlib.h>
#include <string.h>

#include "comm/mr_comm.h"
#include "core/mr_mem.h"
#include "device/dev_int.h"

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif

static int registered(enum mr_mem_kind kind)
{
#ifdef SANITIZED
	(void)kind;
	return 0;
#else
	return kind != MR_MEM_OPTIM && kind != MR_MEM_HOST;
#endif
}

void *mr_mem_alloc(struct mr_mem *m, enum mr_mem_kind kind, size_t n)
{
	size_t rounded = (n + 63) & ~(size_t)63;
	void *p;

	if (rounded < n || rounded == 0)
		return NULL;
	if (registered(kind)) {
		if (!(p = mr_comm_mem_alloc(rounded)))
			return NULL;
	} else {
		if (!(p = aligned_alloc(64, rounded)))
			return NULL;
		memset(p, 0, rounded);
	}
	mr_mem_count(m, kind, n);
	return p;
}

void mr_mem_free(struct mr_mem *m, enum mr_mem_kind kind, void *p, size_t n)
{
	if (!p)
		return;
	mr_mem_uncount(m, kind, n);
	if (registered(kind))
		mr_comm_mem_free(p);
	else
		free(p);
}

void *mr_dev_host_alloc(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind,
			size_t bytes)
{
	if (d->ops->host_alloc)
		return d->ops->host_alloc(d, mem, kind, bytes);
	return mr_mem_alloc(mem, kind, bytes);
}

void mr_dev_host_free(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind, void *p,
		      size_t bytes)
{
	if (!p)
		return;
	if (d->ops->host_free)
		d->ops->host_free(d, mem, kind, p, bytes);
	else
		mr_mem_free(mem, kind, p, bytes);
}
