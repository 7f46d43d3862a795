/*
 * test_nccl_ops.c - the NCCL backend on real devices (make test-gpu): every
 * operation x dtype x size of tests/comm/checks.h against the locally
 * computed reference, on one process per device; a split into
 * non-contiguous groups; 64 MiB allreduce and reduce-scatter; kill -9 of a
 * rank and abort of a blocked receive must end in an error within the
 * timeout, never a hang; stream-ordered collectives on the cuda device
 * (correct results, and a device sync behind a lost peer's all-reduce
 * fails within the timeout).
 *
 * Buffers are CUDA managed memory: the checks write inputs and read
 * results from the host, NCCL reads and writes them on the device. The
 * Criterion process never touches CUDA (a CUDA context does not survive
 * fork): the device count comes from a forked probe, every rank opens its
 * own context. Skipped, not failed, without a device (this build machine).
 *
 * Non-goals: the host backend (tests/comm), speed.
 */
#include <criterion/criterion.h>
#include <cuda_runtime.h>
#include <pthread.h>

#include "../comm/checks.h"
#include "device/mr_dev_comm.h"
#include "device/mr_device.h"
#include "proc.h"

#define TIMEOUT_MS 8000

static void *managed_alloc(size_t len)
{
	void *p = NULL;

	if (cudaMallocManaged(&p, len ? len : 1, cudaMemAttachGlobal) != cudaSuccess)
		return NULL;
	memset(p, 0, len ? len : 1);
	return p;
}

static void managed_free(void *p)
{
	cudaFree(p);
}

/* Devices, counted in a child so that this process stays CUDA-free. */
static int device_count(void)
{
	int st = 0;
	pid_t pid = fork();

	if (pid == 0) {
		int n = 0;

		_exit(cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? (n > 8 ? 8 : n) : 0);
	}
	if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st))
		return 0;
	return WEXITSTATUS(st);
}

/* World size for a test that wants at least min ranks (one per device). */
static int world_or_skip(int min)
{
	int n = device_count();

	if (n < min)
		cr_skip_test("needs %d CUDA device(s), found %d", min, n);
	run_backend = "nccl";
	check_alloc = managed_alloc;
	check_free = managed_free;
	return n;
}

static int everything(struct mr_comm *w, void *arg)
{
	(void)arg;
	return check_everything(w);
}

// cppcheck-suppress unknownMacro
Test(nccl, every_op_dtype_and_size, .timeout = 300)
{
	int n = world_or_skip(1);

	cr_assert_eq(run_procs(n, HOSTS_SAME, 60000, everything, NULL, -1), 0);
}

/* Even ranks and odd ranks in reverse order: groups that are neither
 * contiguous nor in world order. */
static int split_groups(struct mr_comm *w, void *arg)
{
	int me = mr_comm_rank(w), n = mr_comm_size(w), g[8], k = 0, rc;
	struct mr_comm *c = NULL;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	(void)arg;
	for (int r = n - 1; r >= 0; r--)
		if (r % 2 == me % 2)
			g[k++] = r;
	if ((rc = mr_comm_split(w, g, k, me % 2 ? "odd" : "even", &c, &eb))) {
		fprintf(stderr, "split: %s\n", eb.msg);
		return rc;
	}
	for (int i = 0; i < k; i++)
		if (g[i] == me && mr_comm_rank(c) != i)
			rc = -1003;
	if (!rc)
		rc = check_everything(c);
	mr_comm_free(c);
	return rc;
}

Test(nccl, noncontiguous_groups, .timeout = 300)
{
	int n = world_or_skip(4);

	cr_assert_eq(run_procs(n, HOSTS_SAME, 60000, split_groups, NULL, -1), 0);
}

static int huge(struct mr_comm *w, void *arg)
{
	size_t count = ((size_t)64 << 20) / sizeof(float);
	int rc;

	(void)arg;
	if ((rc = check_allreduce(w, MR_COMM_F32, MR_COMM_SUM, count, 0)))
		return rc;
	return check_reduce_scatter(w, MR_COMM_F32, MR_COMM_SUM, count / (size_t)mr_comm_size(w));
}

Test(nccl, allreduce_reduce_scatter_64mib, .timeout = 300)
{
	int n = world_or_skip(1);

	cr_assert_eq(run_procs(n, HOSTS_SAME, 60000, huge, NULL, -1), 0);
}

/* A pipeline's exchange: neighbours send and receive 16 MiB in opposite
 * orders, each pair in one group (mr_comm_group_start/end); without the
 * group the first ncclSend of both would wait for a receive queued behind
 * it on the other's stream. The requests of a group complete only after
 * it: the received values are checked after wait. */
static int opposite_orders(struct mr_comm *w, void *arg)
{
	size_t count = ((size_t)16 << 20) / sizeof(float);
	int me = mr_comm_rank(w), peer = me ^ 1, rc = 0, rc2;
	float *sb = managed_alloc(count * sizeof(float)), *rb = managed_alloc(count * sizeof(float));
	struct mr_comm_req *rs = NULL, *rr = NULL;

	(void)arg;
	if (!mr_comm_p2p_in_order(w))
		rc = -1011; /* nccl runs send/recv in issue order: the runner must know */
	if (rc || !sb || !rb || peer >= mr_comm_size(w))
		goto out;
	for (size_t i = 0; i < count; i++)
		sb[i] = (float)(me * 1000 + (int)(i % 997));
	if ((rc = mr_comm_group_start(w)) < 0)
		goto out;
	if (me % 2 == 0) {
		rc = mr_comm_isend(w, sb, count, MR_COMM_F32, peer, 1, &rs);
		if (rc == 0)
			rc = mr_comm_irecv(w, rb, count, MR_COMM_F32, peer, 2, &rr);
	} else {
		rc = mr_comm_irecv(w, rb, count, MR_COMM_F32, peer, 1, &rr);
		if (rc == 0)
			rc = mr_comm_isend(w, sb, count, MR_COMM_F32, peer, 2, &rs);
	}
	rc2 = mr_comm_group_end(w);
	rc = rc ? rc : rc2;
	if (rs && (rc2 = mr_comm_wait(rs)) < 0 && rc == 0)
		rc = rc2;
	if (rr && (rc2 = mr_comm_wait(rr)) < 0 && rc == 0)
		rc = rc2;
	for (size_t i = 0; rc == 0 && i < count; i++)
		if (rb[i] != (float)(peer * 1000 + (int)(i % 997)))
			rc = -1010;
out:
	managed_free(sb);
	managed_free(rb);
	return rc;
}

Test(nccl, grouped_exchange_in_opposite_orders, .timeout = 300)
{
	int n = world_or_skip(2);

	cr_assert_eq(run_procs(n & ~1, HOSTS_SAME, 60000, opposite_orders, NULL, -1), 0);
}

/* The last rank dies by SIGKILL after a barrier; every other rank's next
 * allreduce must fail (async error or timeout) within the timeout. */
static int die_or_detect(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), rc;
	float *buf = managed_alloc(1 << 20);
	long long t0;

	(void)arg;
	if (!buf)
		return MR_ENOMEM;
	if ((rc = mr_comm_barrier(c)))
		return rc;
	if (me == n - 1)
		raise(SIGKILL);
	t0 = mr_test_now_ms();
	rc = mr_comm_allreduce(c, buf, buf, (1 << 20) / sizeof(float), MR_COMM_F32, MR_COMM_SUM);
	fprintf(stderr, "rank %d: allreduce after kill: %s in %lld ms\n", me, mr_err_name(rc),
		mr_test_now_ms() - t0);
	if (rc >= 0 || mr_test_now_ms() - t0 > TIMEOUT_MS + 2000)
		return -2000;
	/* the communicator stays broken: the next operation fails at once */
	t0 = mr_test_now_ms();
	if (mr_comm_barrier(c) >= 0 || mr_test_now_ms() - t0 > 1000)
		return -2001;
	return 0;
}

Test(nccl, kill9_fails_survivors_within_timeout, .timeout = 120)
{
	int n = world_or_skip(2);

	cr_assert_eq(run_procs(n, HOSTS_SAME, TIMEOUT_MS, die_or_detect, NULL, n - 1), 0);
}

static void *abort_later(void *p)
{
	usleep(300000);
	mr_comm_abort(p);
	return NULL;
}

/* Rank 0 waits for a message rank 1 never sends; another thread aborts. */
static int abort_recv(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), rc;
	float *buf = managed_alloc(4096);
	struct mr_comm_req *r;
	long long t0 = mr_test_now_ms();
	pthread_t t;

	(void)arg;
	if (!buf)
		return MR_ENOMEM;
	if (me != 0) {
		usleep(1500000); /* alive and silent until rank 0 is done */
		managed_free(buf);
		return 0;
	}
	if ((rc = mr_comm_irecv(c, buf, 1024, MR_COMM_F32, 1, 3, &r)))
		return rc;
	pthread_create(&t, NULL, abort_later, c);
	rc = mr_comm_wait(r);
	pthread_join(t, NULL);
	managed_free(buf);
	fprintf(stderr, "rank 0: receive after abort: %s in %lld ms\n", mr_err_name(rc),
		mr_test_now_ms() - t0);
	return rc == MR_EABORTED && mr_test_now_ms() - t0 < 1400 ? 0 : -2002;
}

Test(nccl, abort_unblocks_receive, .timeout = 120)
{
	world_or_skip(2);
	cr_assert_eq(run_procs(2, HOSTS_SAME, 20000, abort_recv, NULL, -1), 0);
}

/* ---- stream-ordered collectives on the cuda device -------------------------
 * A communicator given the rank's cuda device (mr_dev_comm_init) is
 * stream-ordered: a blocking all-reduce on device buffers returns once the
 * device's stream waits for it, and a download (a host wait for the
 * stream) sees its result. silent (arg != NULL): the last rank never joins
 * the all-reduce; the others' device sync must fail with the deadline's
 * error, or the peer's, within the timeout - ncclCommAbort lets the stream
 * drain - and never hang. */
static int ordered_allreduce(struct mr_comm *w, void *arg)
{
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int me = mr_comm_rank(w), n = mr_comm_size(w), silent = arg != NULL, i, rc;
	struct mr_mem mem = { 0 };
	struct mr_dev_comm dc;
	struct mr_dev d;
	float h[256], *g = NULL;
	long long t0;

	if ((rc = mr_dev_open(&d, "cuda", me, "fp32", NULL, &eb)) < 0) {
		fprintf(stderr, "rank %d: cuda device: %s\n", me, eb.msg);
		return rc;
	}
	mr_comm_set_device(w, mr_dev_comm_init(&dc, &d));
	rc = mr_comm_stream_ordered(w) ? 0 : -2010;
	for (i = 0; i < 256; i++)
		h[i] = (float)(me + 1 + i);
	if (rc == 0 && !(g = mr_dev_alloc(&d, &mem, MR_MEM_ACTS, sizeof(h))))
		rc = MR_ENOMEM;
	if (rc == 0)
		rc = d.ops->upload(&d, g, h, sizeof(h));
	if (rc == 0 && silent && me == n - 1) {
		usleep((TIMEOUT_MS + 4000) * 1000); /* alive and silent */
	} else if (rc == 0 && silent) {
		t0 = mr_test_now_ms();
		rc = mr_comm_allreduce(w, g, g, 256, MR_COMM_F32, MR_COMM_SUM);
		if (rc == 0)
			rc = d.ops->sync(&d);
		fprintf(stderr, "rank %d: sync behind a lost all-reduce: %s in %lld ms\n", me,
			mr_err_name(rc), mr_test_now_ms() - t0);
		rc = (rc == MR_ETIMEDOUT || rc == MR_EPEER) &&
				     mr_test_now_ms() - t0 <= TIMEOUT_MS + 2000
			     ? 0
			     : -2011;
	} else if (rc == 0) {
		rc = mr_comm_allreduce(w, g, g, 256, MR_COMM_F32, MR_COMM_SUM);
		if (rc == 0)
			rc = d.ops->download(&d, h, g, sizeof(h));
		for (i = 0; rc == 0 && i < 256; i++)
			if (h[i] != (float)(n * (n + 1) / 2 + n * i))
				rc = -2012;
	}
	mr_dev_free(&d, &mem, MR_MEM_ACTS, g, sizeof(h));
	mr_comm_set_device(w, NULL); /* the device closes first */
	mr_dev_close(&d);
	return rc;
}

Test(nccl, stream_ordered_allreduce_on_the_cuda_device, .timeout = 120)
{
	int n = world_or_skip(1);

	cr_assert_eq(run_procs(n, HOSTS_SAME, 20000, ordered_allreduce, NULL, -1), 0);
}

Test(nccl, stream_ordered_wait_behind_a_lost_peer_fails_the_sync, .timeout = 120)
{
	int n = world_or_skip(2);

	cr_assert_eq(run_procs(n, HOSTS_SAME, TIMEOUT_MS, ordered_allreduce, "silent", -1), 0);
}
