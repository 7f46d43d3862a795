/*
 * test_comm_stage.c - device buffers on the host backend (mr_comm_set_device,
 * comm/stage.c). The "device" here is host memory behind tagged pointers:
 * a device pointer has bit 62 set, which no x86-64 or arm64 address has,
 * so any read or write of one by the communicator (instead of a download
 * or upload through the device's table) faults and fails the test. Every
 * operation kind, in place and not, mixed host and device buffers, several
 * asynchronous operations in flight on one communicator, and a split that
 * inherits the device, against values computed on the host; and a step
 * repeated allocates its stand-ins once.
 */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "harness.h"

#define TAG ((uintptr_t)1 << 62)

static _Atomic long copies; /* downloads + uploads, every rank */

static void *untag(const void *p)
{
	return (void *)((uintptr_t)p & ~TAG);
}

static int is_device(void *ctx, const void *p)
{
	(void)ctx;
	return ((uintptr_t)p & TAG) != 0;
}

static int download(void *ctx, void *host, const void *dev, size_t bytes)
{
	(void)ctx;
	if (!is_device(NULL, dev) || is_device(NULL, host))
		return MR_EINVAL;
	memcpy(host, untag(dev), bytes);
	atomic_fetch_add(&copies, 1);
	return 0;
}

static int upload(void *ctx, void *dev, const void *host, size_t bytes)
{
	(void)ctx;
	if (!is_device(NULL, dev) || is_device(NULL, host))
		return MR_EINVAL;
	memcpy(untag(dev), host, bytes);
	atomic_fetch_add(&copies, 1);
	return 0;
}

static void *dalloc(void *ctx, size_t bytes)
{
	void *p = calloc(1, bytes);

	(void)ctx;
	/* cppcheck-suppress memleak ; the tagged pointer is the allocation */
	return p ? (void *)((uintptr_t)p | TAG) : NULL;
}

static void dfree(void *ctx, void *p, size_t bytes)
{
	(void)ctx;
	(void)bytes;
	free(untag(p));
}

static const struct mr_comm_device fake_dev = { NULL, is_device, download, upload,
						dalloc, dfree, NULL, NULL, NULL, 0 };

/* n floats of device memory holding f(rank, i). */
static float *dev_fill(int rank, size_t n, float base)
{
	float *d = dalloc(NULL, n * sizeof(float)), *h = untag(d);

	for (size_t i = 0; i < n; i++)
		h[i] = base + (float)rank * 1000.0f + (float)i;
	return d;
}

static float at(const float *dev, size_t i)
{
	return ((const float *)untag(dev))[i];
}

#define FAIL(...)                                          \
	do {                                               \
		fprintf(stderr, "rank %d: ", me);          \
		fprintf(stderr, __VA_ARGS__);              \
		fputc('\n', stderr);                       \
		rc = -1;                                   \
		goto out;                                  \
	} while (0)

static int collectives(struct mr_comm *w, void *arg)
{
	int me = mr_comm_rank(w), n = mr_comm_size(w), rc = 0, k;
	const size_t N = 3000; /* a few pages: the shared-memory path */
	float *a = dev_fill(me, N, 0.0f), *b = dalloc(NULL, N * sizeof(float));
	float *rs = dalloc(NULL, N * sizeof(float)), *ag = dalloc(NULL, 8 * n * sizeof(float));
	float host[8] = { 0 }, hsum[8];
	struct mr_comm *sub = NULL;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	(void)arg;
	mr_comm_set_device(w, &fake_dev);
	/* out of place, device to device */
	if ((rc = mr_comm_allreduce(w, a, b, N, MR_COMM_F32, MR_COMM_SUM)))
		FAIL("allreduce: %s", mr_err_name(rc));
	for (size_t i = 0; i < N; i++)
		if (at(b, i) != (float)n * (float)i + 1000.0f * (float)(n * (n - 1) / 2))
			FAIL("allreduce [%zu] = %g", i, (double)at(b, i));
	/* in place */
	if ((rc = mr_comm_allreduce(w, a, a, N, MR_COMM_F32, MR_COMM_SUM)))
		FAIL("allreduce in place: %s", mr_err_name(rc));
	if (memcmp(untag(a), untag(b), N * sizeof(float)))
		FAIL("in-place allreduce differs from out-of-place");
	/* host buffers on a communicator with a device pass through */
	for (k = 0; k < 8; k++)
		host[k] = (float)(me + k);
	if ((rc = mr_comm_allreduce(w, host, hsum, 8, MR_COMM_F32, MR_COMM_SUM)))
		FAIL("host allreduce: %s", mr_err_name(rc));
	for (k = 0; k < 8; k++)
		if (hsum[k] != (float)(n * (n - 1) / 2 + n * k))
			FAIL("host allreduce [%d] = %g", k, (double)hsum[k]);
	/* reduce-scatter: rank r gets chunk r of the (equal) buffers' mean */
	if ((rc = mr_comm_reduce_scatter(w, b, rs, N / n, MR_COMM_F32, MR_COMM_AVG)))
		FAIL("reduce_scatter: %s", mr_err_name(rc));
	for (size_t i = 0; i < N / n; i++)
		if (at(rs, i) != at(b, me * (N / n) + i))
			FAIL("reduce_scatter [%zu] = %g", i, (double)at(rs, i));
	/* allgather from a host send buffer into device memory (mixed) */
	for (k = 0; k < 8; k++)
		host[k] = (float)(100 * me + k);
	if ((rc = mr_comm_allgather(w, host, ag, 8, MR_COMM_F32)))
		FAIL("allgather: %s", mr_err_name(rc));
	for (int r = 0; r < n; r++)
		for (k = 0; k < 8; k++)
			if (at(ag, r * 8 + k) != (float)(100 * r + k))
				FAIL("allgather [%d][%d]", r, k);
	/* broadcast in place from the last rank */
	if ((rc = mr_comm_broadcast(w, a, N, MR_COMM_F32, n - 1)))
		FAIL("broadcast: %s", mr_err_name(rc));
	/* a split inherits the device */
	{
		int all[8];
		for (k = 0; k < n; k++)
			all[k] = n - 1 - k;
		if ((rc = mr_comm_split(w, all, n, "rev", &sub, &eb)))
			FAIL("split: %s", eb.msg);
		if ((rc = mr_comm_allreduce(sub, a, b, N, MR_COMM_F32, MR_COMM_MAX)))
			FAIL("split allreduce: %s", mr_err_name(rc));
		if (memcmp(untag(a), untag(b), N * sizeof(float)))
			FAIL("max of equal broadcast buffers differs");
	}
out:
	mr_comm_free(sub);
	dfree(NULL, a, 0);
	dfree(NULL, b, 0);
	dfree(NULL, rs, 0);
	dfree(NULL, ag, 0);
	return rc;
}

// cppcheck-suppress unknownMacro
Test(comm_stage, every_collective_on_device_buffers, .timeout = 120)
{
	atomic_store(&copies, 0);
	cr_assert_eq(run_threads(2, HOSTS_SAME, collectives, NULL), 0);
	cr_assert_eq(run_threads(3, HOSTS_DISTINCT, collectives, NULL), 0);
	cr_assert_gt(atomic_load(&copies), 0, "nothing was staged");
}

/* Several asynchronous operations in flight on one communicator, each
 * staged into its own host buffer, waited in order; then p2p. */
#define INFLIGHT 6
static int inflight(struct mr_comm *w, void *arg)
{
	int me = mr_comm_rank(w), n = mr_comm_size(w), rc = 0, k;
	const size_t N = 1000;
	float *buf[INFLIGHT] = { 0 }, *x = NULL, *y = NULL;
	struct mr_comm_req *req[INFLIGHT] = { 0 };

	(void)arg;
	mr_comm_set_device(w, &fake_dev);
	for (k = 0; k < INFLIGHT; k++) {
		buf[k] = dev_fill(me, N, (float)k);
		if ((rc = mr_comm_iallreduce(w, buf[k], buf[k], N, MR_COMM_F32, MR_COMM_SUM,
					     &req[k])))
			FAIL("iallreduce %d: %s", k, mr_err_name(rc));
	}
	for (k = 0; k < INFLIGHT; k++) {
		rc = mr_comm_wait(req[k]);
		req[k] = NULL;
		if (rc)
			FAIL("wait %d: %s", k, mr_err_name(rc));
		for (size_t i = 0; i < N; i++)
			if (at(buf[k], i) != (float)n * ((float)k + (float)i) +
						     1000.0f * (float)(n * (n - 1) / 2))
				FAIL("op %d [%zu] = %g", k, i, (double)at(buf[k], i));
	}
	/* a ring of sendrecv between device buffers */
	x = dev_fill(me, N, 0.5f);
	y = dalloc(NULL, N * sizeof(float));
	if ((rc = mr_comm_sendrecv(w, x, y, N, MR_COMM_F32, (me + 1) % n, (me + n - 1) % n, 3)))
		FAIL("sendrecv: %s", mr_err_name(rc));
	for (size_t i = 0; i < N; i++)
		if (at(y, i) != 0.5f + (float)((me + n - 1) % n) * 1000.0f + (float)i)
			FAIL("sendrecv [%zu]", i);
out:
	for (k = 0; k < INFLIGHT; k++) {
		if (req[k])
			mr_comm_wait(req[k]);
		dfree(NULL, buf[k], 0);
	}
	dfree(NULL, x, 0);
	dfree(NULL, y, 0);
	return rc;
}

Test(comm_stage, async_operations_in_flight_and_p2p, .timeout = 120)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, inflight, NULL), 0);
	cr_assert_eq(run_threads(3, HOSTS_HALF, inflight, NULL), 0);
}

/* A step's mix of message sizes - more distinct sizes than the pool has
 * buffers, rising, as a model's collectives are - repeated: the stand-ins
 * are allocated in the first step, none after (stage.c's pool). */
static int steady(struct mr_comm *w, void *arg)
{
	static const size_t sizes[] = { 100, 900, 5000, 20000, 70000, 250000, 600000, 1000 };
	enum { NS = sizeof(sizes) / sizeof(sizes[0]) };
	int me = mr_comm_rank(w), rc = 0;
	float *buf[NS] = { 0 };
	uint64_t first = 0;

	(void)arg;
	mr_comm_set_device(w, &fake_dev);
	for (int k = 0; k < NS; k++)
		buf[k] = dev_fill(me, sizes[k], 0.0f);
	for (int step = 0; step < 4; step++) {
		for (int k = 0; k < NS; k++)
			if ((rc = mr_comm_allreduce(w, buf[k], buf[k], sizes[k], MR_COMM_F32,
						    MR_COMM_SUM)))
				FAIL("step %d allreduce of %zu: %s", step, sizes[k],
				     mr_err_name(rc));
		if (step == 0)
			first = mr_comm_stage_allocs(w);
	}
	if (first == 0)
		FAIL("nothing was staged");
	if (mr_comm_stage_allocs(w) != first)
		FAIL("%llu stand-ins allocated after the first step (%llu in it)",
		     (unsigned long long)(mr_comm_stage_allocs(w) - first),
		     (unsigned long long)first);
out:
	for (int k = 0; k < NS; k++)
		dfree(NULL, buf[k], 0);
	return rc;
}

Test(comm_stage, a_repeated_step_allocates_no_stand_ins_after_the_first, .timeout = 120)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, steady, NULL), 0);
}
