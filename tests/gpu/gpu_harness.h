/*
 * gpu_harness.h - helpers shared by the tests/gpu Criterion tests: skip
 * when there is no CUDA device, context per test, bf16-rounded random
 * inputs (so the CPU twin sees exactly what the GPU sees), host<->device
 * copies (also in the context's activation type) and a tolerance check.
 *
 * Tolerance rule used everywhere: |gpu - cpu| <= rtol * |cpu| + atol * M,
 * M = max |cpu| over the tensor; each test states its (rtol, atol).
 *
 * Non-goals: benchmarking, multi-GPU.
 */
#ifndef MR_TEST_GPU_HARNESS_H
#define MR_TEST_GPU_HARNESS_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "core/mr_rng.h"
#include "cuda/mr_cuda.h"
#include "device/mr_device.h"

static struct mr_cuda *cu;
static struct mr_rng rng;

#ifdef MR_CUDA_EMUL
#include "cuda_emul.h"
#endif

/* Call first in every test that needs a device: skips the test on a
 * machine without a GPU; where one is (an NVIDIA device node) and CUDA
 * sees none, fails it - a GPU check never passes by skipping. */
static inline void need_gpu(void)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };

	if (mr_cuda_device_count(&eb) <= 0) {
		const char *node = mr_dev_gpu_node();
		cr_assert_null(node, "an NVIDIA GPU is present (%s) but CUDA sees none: %s", node,
			       eb.msg);
		cr_skip_test("no CUDA device, test skipped (%s)", eb.msg);
	}
	cr_assert_eq(mr_cuda_create(&cu, 0, &eb), 0, "cuda context: %s", eb.msg);
	mr_rng_seed(&rng, 1234, 0);
}

static inline void gpu_teardown(void)
{
	mr_cuda_free(cu);
	cu = NULL;
}

static inline void *xmalloc(size_t n)
{
	void *p = calloc(1, n ? n : 1);

	cr_assert_not_null(p);
	return p;
}

/* n normal(0, scale) floats, rounded to bf16 values. */
static inline float *rand_bf(size_t n, float scale)
{
	float *p = xmalloc(n * sizeof(float));
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = mr_bf16_to_f32(mr_bf16_from_f32((float)mr_rng_normal(&rng) * scale));
	return p;
}

static inline void *dev_alloc(size_t bytes)
{
	void *d = NULL;

	cr_assert_eq(mr_cuda_alloc(cu, &d, bytes), 0, "%s", mr_cuda_errmsg(cu));
	return d;
}

static inline float *up_f32(const float *h, size_t n)
{
	float *d = dev_alloc(n * sizeof(float));

	cr_assert_eq(mr_cuda_upload(cu, d, h, n * sizeof(float)), 0, "%s", mr_cuda_errmsg(cu));
	return d;
}

static inline int *up_int(const int *h, size_t n)
{
	int *d = dev_alloc(n * sizeof(int));

	cr_assert_eq(mr_cuda_upload(cu, d, h, n * sizeof(int)), 0, "%s", mr_cuda_errmsg(cu));
	return d;
}

static inline mr_bf16 *up_bf(const float *h, size_t n)
{
	mr_bf16 *t = xmalloc(n * sizeof(mr_bf16)), *d = dev_alloc(n * sizeof(mr_bf16));
	size_t i;

	for (i = 0; i < n; i++)
		t[i] = mr_bf16_from_f32(h[i]);
	cr_assert_eq(mr_cuda_upload(cu, d, t, n * sizeof(mr_bf16)), 0, "%s", mr_cuda_errmsg(cu));
	free(t);
	return d;
}

static inline float *down_f32(const float *d, size_t n)
{
	float *h = xmalloc(n * sizeof(float));

	cr_assert_eq(mr_cuda_download(cu, h, d, n * sizeof(float)), 0,
		     "%zu floats from %p: %s", n, (const void *)d, mr_cuda_errmsg(cu));
	return h;
}

static inline float *down_bf(const mr_bf16 *d, size_t n)
{
	mr_bf16 *t = xmalloc(n * sizeof(mr_bf16));
	float *h = xmalloc(n * sizeof(float));
	size_t i;

	cr_assert_eq(mr_cuda_download(cu, t, d, n * sizeof(mr_bf16)), 0, "%s",
		     mr_cuda_errmsg(cu));
	for (i = 0; i < n; i++)
		h[i] = mr_bf16_to_f32(t[i]);
	free(t);
	return h;
}

/* The activation type of the context (mr_cuda_set_act), and copies in
 * it: bf16 (the default) or fp32. */
static int act_f32;

static inline void use_act(int f32)
{
	act_f32 = f32;
	mr_cuda_set_act(cu, f32 ? MR_CUDA_F32 : MR_CUDA_BF16);
}

static inline void *up_act(const float *h, size_t n)
{
	return act_f32 ? (void *)up_f32(h, n) : (void *)up_bf(h, n);
}

static inline void *act_alloc(size_t n)
{
	return dev_alloc(n * (act_f32 ? sizeof(float) : sizeof(mr_bf16)));
}

static inline float *down_act(const void *d, size_t n)
{
	return act_f32 ? down_f32(d, n) : down_bf(d, n);
}

/* Kernel call returned 0 and the stream ran clean. */
#define CU_OK(call)                                                                   \
	do {                                                                          \
		cr_assert_eq((call), 0, "%s: %s", #call, mr_cuda_errmsg(cu));         \
		cr_assert_eq(mr_cuda_sync(cu), 0, "%s: %s", #call, mr_cuda_errmsg(cu)); \
	} while (0)

static inline void check_close(const char *what, const float *got, const float *want, size_t n,
			double rtol, double atol)
{
	double mx = 0.0;
	size_t i;

	for (i = 0; i < n; i++)
		if (fabs(want[i]) > mx)
			mx = fabs(want[i]);
	for (i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		cr_assert(isfinite(got[i]) && d <= rtol * fabs(want[i]) + atol * mx,
			  "%s[%zu]: gpu %.7g cpu %.7g (|d| %.3g > %.3g*|cpu| + %.3g*%.4g)", what,
			  i, got[i], want[i], d, rtol, atol, mx);
	}
}

/* ||a - b|| / ||b|| (||a - b|| when b is 0). */
static inline double rel_l2(const float *a, const float *b, size_t n)
{
	double d = 0.0, nb = 0.0;
	size_t i;

	for (i = 0; i < n; i++) {
		d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
		nb += (double)b[i] * b[i];
	}
	return nb > 0.0 ? sqrt(d / nb) : sqrt(d);
}

/* The CPU twin's inputs are already bf16-rounded; expected bf16 outputs
 * differ by the final rounding (<= 2^-9 relative) plus fp32 reordering. */
#define BF_RTOL 8e-3
#define BF_ATOL 1e-3

#endif
