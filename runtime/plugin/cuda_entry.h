/*
 * cuda_entry.h - the CUDA side's entry points, reached through one table.
 *
 * The cuda device (device/cuda.c over runtime/cuda's kernels, cuBLAS and
 * cudart) and the NCCL communicator (comm/nccl.c) are built into
 * meshrun-cuda.so, which the core loads on first use (cuda_load.c): a
 * process that never opens a GPU - the controller, the CLI, a CPU job -
 * does not load cuBLASLt, whose start-up alone costs ~0.35 s of CPU per
 * process. Builds that link the CUDA side in (the CPU emulation, the GPU
 * tests) define the table themselves, and it is used without loading
 * anything (see cuda_load.c).
 *
 * This room sits below comm/ and device/, which both reach the CUDA side
 * through it: it names their types only by declaration, and declares the
 * entry points the table holds (defined in device/cuda.c, comm/nccl.c and
 * cuda/; cuda_entry.c gathers them).
 */
#ifndef MR_CUDA_ENTRY_H
#define MR_CUDA_ENTRY_H

#include "core/mr_dtype.h"
#include "mr_err.h"

struct mr_comm;
struct mr_comm_config;
struct mr_dev;
struct mr_kv;

struct mr__cuda_entry {
	/* GPUs this process can use; 0 with the reason in eb */
	int (*device_count)(struct mr_errbuf *eb);
	/* the cuda device on GPU index (mr__dev_cuda_open below) */
	int (*dev_open)(struct mr_dev *d, int index, enum mr_dtype act, struct mr_errbuf *eb);
	/* the NCCL communicator (mr__nccl_init below); NULL without NCCL */
	int (*nccl_init)(struct mr_comm **out, const struct mr_comm_config *cfg,
			 const struct mr_kv *kv, struct mr_errbuf *eb);
};

/* The table of the plugin, or of the CUDA side linked into this program
 * (cuda_entry.c defines it under this name in both). */
extern const struct mr__cuda_entry mr__cuda_table;

/* The cuda device on GPU index with activations of type act; the reason of
 * a failure (no such GPU, no memory) in eb (device/cuda.c). */
int mr__dev_cuda_open(struct mr_dev *d, int index, enum mr_dtype act, struct mr_errbuf *eb);
/* The NCCL communicator (comm/nccl.c; comm/comm_int.h has the others). */
int mr__nccl_init(struct mr_comm **out, const struct mr_comm_config *cfg,
		  const struct mr_kv *kv, struct mr_errbuf *eb);

/* The table, loading meshrun-cuda.so the first time; NULL with the
 * reason in eb (MR_ENOTSUP: no CUDA in this build, or the plugin or one
 * of its libraries would not load). Thread-safe. */
const struct mr__cuda_entry *mr__cuda_entry(struct mr_errbuf *eb);

#endif
