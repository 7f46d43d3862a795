/*
 * dev_int.h - the backends' open functions, shared by device.c (which
 * parses the name and precision) and the backends (cpu.c, cuda.c), and
 * the host memory the cpu backend allocates (mem.c). The cuda backend's
 * open function is the CUDA side's entry (plugin/cuda_entry.h); tests of
 * the cuda backend over the CPU emulation (tests/gpu/cuda_emul.c) open it
 * directly.
 */
#ifndef MR_DEV_INT_H
#define MR_DEV_INT_H

#include "device/mr_device.h"
#include "plugin/cuda_entry.h"

/* Host memory counted in the ledger m (core/mr_mem.h, device/mem.c):
 * zeroed, 64-byte aligned n bytes, or NULL. */
void *mr_mem_alloc(struct mr_mem *m, enum mr_mem_kind kind, size_t n);
/* p may be NULL; n and kind must match the allocation. */
void mr_mem_free(struct mr_mem *m, enum mr_mem_kind kind, void *p, size_t n);

/* The cpu device over pool (borrowed); MR_ENOMEM. */
int mr__dev_cpu_open(struct mr_dev *d, struct mr_pool *pool);

#endif
