/*
 * cuda_emul.h - what the CPU emulation of mr_cuda.h (cuda_emul.c) offers
 * tests beyond that header: counters of host syncs, host reads,
 * stream-ordered waits and fused GELU forwards, and a switch that keeps
 * a device's stream "busy".
 */
#ifndef MR_TEST_CUDA_EMUL_H
#define MR_TEST_CUDA_EMUL_H

/* mr_cuda_sync calls of emulated device `device` in this process. */
long mr_cuda_emul_syncs(int device);
/* Reads of device results by the host (downloads, the MoE routing's
 * counts, the gradient norm's sums) of emulated device `device`. */
long mr_cuda_emul_host_reads(int device);
/* mr_cuda_stream_wait calls of emulated device `device` in this process. */
long mr_cuda_emul_stream_waits(int device);
/* mr_cuda_matmul_gelu_fwd calls of emulated device `device` that
 * computed the GELU from the unrounded product (bf16: the epilogue's
 * rounding, not the separate kernels'). */
long mr_cuda_emul_gelu_fused(int device);
/* on != 0: mr_cuda_query of the device answers 0 (not ready) until it is
 * cleared - the stream of a GPU waiting on a collective that never ends. */
void mr_cuda_emul_set_busy(int device, int on);

#endif
