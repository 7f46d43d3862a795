/*
 * dev_int.h - the backends' open functions, shared by device.c (which
 * parses the name and precision) and the backends (cpu.c, cuda.c). Tests
 * of the cuda backend over the CPU emulation (tests/gpu/cuda_emul.c) open
 * it directly.
 */
#ifndef MR_DEV_INT_H
#define MR_DEV_INT_H

#include "device/mr_device.h"

/* The cpu device over pool (borrowed); MR_ENOMEM. */
int mr__dev_cpu_open(struct mr_dev *d, struct mr_pool *pool);
/* The cuda device on GPU index with activations of type act; the reason of
 * a failure (no such GPU, no memory) in eb. */
int mr__dev_cuda_open(struct mr_dev *d, int index, enum mr_dtype act, struct mr_errbuf *eb);

#endif
