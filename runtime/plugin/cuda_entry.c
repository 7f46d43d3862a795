/*
 * cuda_entry.c - the table of the CUDA side (see cuda_entry.h), built into
 * meshrun-cuda.so (with MR_HAVE_NCCL where NCCL was found) and into the
 * programs that link the CUDA side in (the CPU emulation: no NCCL).
 */
#include "cuda/mr_cuda.h"
#include "plugin/cuda_entry.h"

const struct mr__cuda_entry mr__cuda_table = {
	.device_count = mr_cuda_device_count,
	.dev_open = mr__dev_cuda_open,
#ifdef MR_HAVE_NCCL
	.nccl_init = mr__nccl_init,
#endif
};
