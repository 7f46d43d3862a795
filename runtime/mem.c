/*
 * mem.c - accounted allocation (see mr_mem.h).
 */
#include <stdlib.h>
#include <string.h>

#include "mr_mem.h"

void *mr_mem_alloc(struct mr_mem *m, enum mr_mem_kind kind, size_t n)
{
	size_t rounded = (n + 63) & ~(size_t)63;
	void *p;

	if (rounded < n || rounded == 0)
		return NULL;
	p = aligned_alloc(64, rounded);
	if (!p)
		return NULL;
	memset(p, 0, rounded);
	m->bytes[kind] += n;
	if (m->bytes[kind] > m->peak[kind])
		m->peak[kind] = m->bytes[kind];
	return p;
}

void mr_mem_free(struct mr_mem *m, enum mr_mem_kind kind, void *p, size_t n)
{
	if (!p)
		return;
	m->bytes[kind] -= n;
	free(p);
}

const char *mr_mem_kind_name(enum mr_mem_kind kind)
{
	static const char *const names[MR_MEM_KINDS] = {
		"params", "grads", "optim", "acts", "workspace",
	};
	return (unsigned)kind < MR_MEM_KINDS ? names[kind] : "unknown";
}
