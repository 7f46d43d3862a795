/*
 * mem.c - the ledger's accounting by category (see mr_mem.h).
 */
#include "core/mr_mem.h"

void mr_mem_count(struct mr_mem *m, enum mr_mem_kind kind, size_t n)
{
	m->bytes[kind] += n;
	if (m->bytes[kind] > m->peak[kind])
		m->peak[kind] = m->bytes[kind];
}

void mr_mem_uncount(struct mr_mem *m, enum mr_mem_kind kind, size_t n)
{
	m->bytes[kind] -= n;
}

const char *mr_mem_kind_name(enum mr_mem_kind kind)
{
	static const char *const names[MR_MEM_KINDS] = {
		"params", "grads", "optim", "acts", "workspace", "host",
	};
	return (unsigned)kind < MR_MEM_KINDS ? names[kind] : "unknown";
}
