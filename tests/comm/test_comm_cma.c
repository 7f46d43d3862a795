/*
 * test_comm_cma.c - single-copy transfers between shared-memory ranks
 * (runtime/comm/host_cma.c): results of every large-message path with
 * single copy forced down to small sizes (ranks as threads: memcpy from
 * the peer; as processes: process_vm_readv), an unexpected single-copy
 * message (stashed), user send/recv larger than the ring, a sender killed
 * with its buffer posted (MR_EPEER, never its data), and an aborted sender
 * whose posted buffer is freed before the receiver looks (the receive
 * fails, nothing reads the freed buffer - ASan checks that).
 * Registered buffers (host_mem.c) between processes: every operation and
 * size read through a mapping of the sender's buffer, buffers freed and
 * allocated again (never a stale mapping), more buffers than the mapping
 * cache holds, and a killed sender whose buffer is already mapped.
 *
 * Non-goals: speed (bench/comm.c), the ring path (test_comm.c).
 */
#include <criterion/criterion.h>

#include "checks.h"
#include "comm/host_int.h"
#include "proc.h"

#define PER 8192 /* elements per rank block: 32 KiB of fp32 */

/* Forces single copy from 4 KiB, user messages from 64 KiB (the ring). */
static void force_cma(void)
{
	setenv("MR_COMM_CMA_MIN", "4096", 1);
	setenv("MR_COMM_CMA_VM_MIN", "4096", 1);
	setenv("MR_COMM_SHM_RING", "65536", 1);
}

static unsigned long cma_count(struct mr_comm *c)
{
	struct mr__hcomm *h = (struct mr__hcomm *)c;
	unsigned long k = 0;

	for (int i = 0; i < h->n; i++)
		k += h->ch[i].cma_rx;
	return k;
}

static unsigned long mem_count(struct mr_comm *c)
{
	struct mr__hcomm *h = (struct mr__hcomm *)c;
	unsigned long k = 0;

	for (int i = 0; i < h->n; i++)
		k += h->ch[i].mem_rx;
	return k;
}

static int check(const char *what, int me, size_t i, double got, double want)
{
	if (got == want)
		return 0;
	fprintf(stderr, "rank %d: %s[%zu] = %g, want %g\n", me, what, i, got, want);
	return -1;
}

static int collectives(struct mr_comm *c, int me, int n)
{
	size_t all = (size_t)PER * (size_t)n;
	float *in = malloc(all * sizeof(float)), *out = malloc(all * sizeof(float));
	int rc = MR_ENOMEM, bad = 0;

	if (!in || !out)
		goto out;
	/* allreduce, sum and max: the ring reduces straight from the peer */
	for (int op = 0; op < 2 && !bad; op++) {
		int redop = op ? MR_COMM_MAX : MR_COMM_SUM;

		for (size_t i = 0; i < all; i++)
			in[i] = (float)val(me, i, 1 + op);
		if ((rc = mr_comm_allreduce(c, in, out, all, MR_COMM_F32, redop)))
			goto out;
		for (size_t i = 0; i < all && !bad; i++)
			bad = check("allreduce", me, i, out[i], ref_red(n, i, 1 + op, redop, 0));
	}
	/* small allreduce: recursive doubling (odd n folds by a plain send) */
	for (size_t i = 0; i < 2048; i++)
		in[i] = (float)val(me, i, 3);
	if ((rc = mr_comm_allreduce(c, in, out, 2048, MR_COMM_F32, MR_COMM_SUM)))
		goto out;
	for (size_t i = 0; i < 2048 && !bad; i++)
		bad = check("allreduce_small", me, i, out[i], ref_red(n, i, 3, MR_COMM_SUM, 0));
	for (size_t i = 0; i < PER; i++)
		in[i] = (float)val(me, i, 4);
	if ((rc = mr_comm_allgather(c, in, out, PER, MR_COMM_F32)))
		goto out;
	for (size_t i = 0; i < all && !bad; i++)
		bad = check("allgather", me, i, out[i], val((int)(i / PER), i % PER, 4));
	for (size_t i = 0; i < all; i++)
		in[i] = (float)val(me, i, 5);
	if ((rc = mr_comm_reduce_scatter(c, in, out, PER, MR_COMM_F32, MR_COMM_SUM)))
		goto out;
	for (size_t i = 0; i < PER && !bad; i++)
		bad = check("reduce_scatter", me, i, out[i],
			    ref_red(n, (size_t)me * PER + i, 5, MR_COMM_SUM, 0));
	/* alltoall: block j of rank r carries (r, j) */
	for (size_t i = 0; i < all; i++)
		in[i] = (float)val(me * n + (int)(i / PER), i % PER, 6);
	if ((rc = mr_comm_alltoall(c, in, out, PER, MR_COMM_F32)))
		goto out;
	for (size_t i = 0; i < all && !bad; i++)
		bad = check("alltoall", me, i, out[i], val((int)(i / PER) * n + me, i % PER, 6));
	rc = bad ? -4000 : 0;
out:
	free(in);
	free(out);
	return rc;
}

/* User messages larger than the ring; tag 8 is received before tag 7, so
 * the single-copy tag-7 message arrives unexpected and is stashed. */
static int p2p(struct mr_comm *c, int me, int n)
{
	size_t cnt = 4 * PER;
	float *a = malloc(cnt * sizeof(float)), *b = malloc(cnt * sizeof(float));
	int rc = MR_ENOMEM, bad = 0, right = (me + 1) % n, left = (me + n - 1) % n;
	struct mr_comm_req *s7, *s8;

	if (!a || !b)
		goto out;
	for (size_t i = 0; i < cnt; i++)
		a[i] = (float)val(me, i, 7);
	if ((rc = mr_comm_isend(c, a, cnt, MR_COMM_F32, right, 7, &s7)))
		goto out;
	if ((rc = mr_comm_isend(c, a, cnt / 2, MR_COMM_F32, right, 8, &s8))) {
		mr_comm_wait(s7);
		goto out;
	}
	rc = mr_comm_recv(c, b, cnt / 2, MR_COMM_F32, left, 8);
	for (size_t i = 0; !rc && i < cnt / 2 && !bad; i++)
		bad = check("recv8", me, i, b[i], val(left, i, 7));
	if (!rc)
		rc = mr_comm_recv(c, b, cnt, MR_COMM_F32, left, 7);
	for (size_t i = 0; !rc && i < cnt && !bad; i++)
		bad = check("recv7", me, i, b[i], val(left, i, 7));
	if (mr_comm_wait(s7) || mr_comm_wait(s8))
		bad = 1;
	rc = rc ? rc : bad ? -4001 : 0;
out:
	free(a);
	free(b);
	return rc;
}

static int all_paths(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), rc;

	(void)arg;
	if ((rc = collectives(c, me, n)) || (rc = p2p(c, me, n)))
		return rc;
	if (cma_count(c) == 0) {
		fprintf(stderr, "rank %d: no message went by single copy\n", me);
		return -4002;
	}
	return mr_comm_barrier(c);
}

// cppcheck-suppress unknownMacro
Test(comm_cma, threads_world2, .timeout = 60)
{
	force_cma();
	cr_assert_eq(run_threads(2, HOSTS_SAME, all_paths, NULL), 0);
}

Test(comm_cma, threads_world3, .timeout = 60)
{
	force_cma();
	cr_assert_eq(run_threads(3, HOSTS_SAME, all_paths, NULL), 0);
}

Test(comm_cma, threads_mixed_world4, .timeout = 60)
{
	force_cma();
	cr_assert_eq(run_threads(4, HOSTS_HALF, all_paths, NULL), 0);
}

Test(comm_cma, processes_world2, .timeout = 60)
{
	force_cma();
	cr_assert_eq(run_procs(2, HOSTS_SAME, 20000, all_paths, NULL, -1), 0);
}

Test(comm_cma, processes_world3, .timeout = 60)
{
	force_cma();
	cr_assert_eq(run_procs(3, HOSTS_SAME, 20000, all_paths, NULL, -1), 0);
}

/* Rank 1 posts a single-copy send and dies by SIGKILL; rank 0 receives
 * afterwards: the descriptor is still in the ring, the copy must fail. */
static int killed_sender(struct mr_comm *c, void *arg)
{
	size_t cnt = 4 * PER;
	float *buf = calloc(cnt, sizeof(float));
	struct mr_comm_req *r;
	long long t0, dt;
	int rc;

	(void)arg;
	if (!buf || (rc = mr_comm_barrier(c)))
		return -4010;
	if (mr_comm_rank(c) == 1) {
		for (size_t i = 0; i < cnt; i++)
			buf[i] = 1.0f;
		if (mr_comm_isend(c, buf, cnt, MR_COMM_F32, 0, 3, &r))
			return -4011;
		usleep(200 * 1000); /* the progress thread posts it at once */
		raise(SIGKILL);
	}
	usleep(400 * 1000);
	t0 = mr_test_now_ms();
	rc = mr_comm_recv(c, buf, cnt, MR_COMM_F32, 1, 3);
	dt = mr_test_now_ms() - t0;
	fprintf(stderr, "cma: recv from a killed sender: %s in %lld ms (cma_rx %lu)\n",
		mr_err_name(rc), dt, cma_count(c));
	free(buf);
	return rc == MR_EPEER && dt < 2000 ? 0 : -4012;
}

Test(comm_cma, sender_killed_with_buffer_posted, .timeout = 60)
{
	force_cma();
	cr_assert_eq(run_procs(2, HOSTS_SAME, 4000, killed_sender, NULL, 1), 0);
}

/* Rank 1 posts a single-copy send, aborts, and frees the buffer; only then
 * does rank 0 receive. The receive must fail and never read the buffer. */
static int aborted_sender(struct mr_comm *c, void *arg)
{
	_Atomic int *freed = arg;
	size_t cnt = 4 * PER;
	float *buf = calloc(cnt, sizeof(float));
	struct mr_comm_req *r;
	long long t0, dt;
	int rc;

	if (!buf || mr_comm_barrier(c))
		return -4020;
	if (mr_comm_rank(c) == 1) {
		if (mr_comm_isend(c, buf, cnt, MR_COMM_F32, 0, 3, &r))
			return -4021;
		usleep(100 * 1000);
		mr_comm_abort(c);
		rc = mr_comm_wait(r);
		free(buf);
		atomic_store(freed, 1);
		return rc == MR_EABORTED ? 0 : -4022;
	}
	while (!atomic_load(freed))
		usleep(1000);
	t0 = mr_test_now_ms();
	rc = mr_comm_recv(c, buf, cnt, MR_COMM_F32, 1, 3);
	dt = mr_test_now_ms() - t0;
	fprintf(stderr, "cma: recv from an aborted sender: %s in %lld ms\n", mr_err_name(rc), dt);
	free(buf);
	return rc == MR_EPEER && dt < 2000 ? 0 : -4023;
}

Test(comm_cma, aborted_sender_buffer_never_read, .timeout = 60)
{
	_Atomic int freed = 0;

	force_cma();
	cr_assert_eq(run_threads_t(2, HOSTS_SAME, 10000, aborted_sender, &freed), 0);
}

/* ---- registered buffers ---- */

Test(comm_cma, mem_alloc_is_zeroed_aligned_and_freeable)
{
	long pg = sysconf(_SC_PAGESIZE);
	char *a = mr_comm_mem_alloc(0), *b = mr_comm_mem_alloc(100000);

	cr_assert(a && b);
	cr_assert_eq((uintptr_t)a % (uintptr_t)pg, 0);
	cr_assert_eq((uintptr_t)b % (uintptr_t)pg, 0);
	for (size_t i = 0; i < 100000; i++)
		cr_assert_eq(b[i], 0);
	memset(b, 7, 100000);
	mr_comm_mem_free(a);
	mr_comm_mem_free(b);
	mr_comm_mem_free(NULL);
}

/* Every operation, dtype and size of checks.h from registered buffers,
 * single copy from 4 KiB: collectives and user messages larger than the
 * ring are read through mappings (counted), reductions straight from them. */
static int registered_ops(struct mr_comm *c, void *arg)
{
	int rc, n = mr_comm_size(c);
	size_t big = (size_t)1 << 20;

	(void)arg;
	if ((rc = check_everything(c)) ||
	    (rc = check_allreduce(c, MR_COMM_F32, MR_COMM_SUM, big + 3, 0)) ||
	    (rc = check_allreduce(c, MR_COMM_BF16, MR_COMM_AVG, big / 2 + 1, 1)) ||
	    (rc = check_reduce_scatter(c, MR_COMM_F32, MR_COMM_MAX, big / (size_t)n + 1)) ||
	    (rc = check_allgather(c, MR_COMM_F32, big / (size_t)n + 1, 1)) ||
	    (rc = check_alltoall(c, MR_COMM_I64, big / (size_t)n + 1, 1)) ||
	    (rc = check_broadcast(c, MR_COMM_F32, big + 1, n - 1)) ||
	    (rc = check_sendrecv(c, MR_COMM_I32, big + 5, XCHG_ISEND_IRECV)) ||
	    (rc = check_sendrecv(c, MR_COMM_I32, big + 5, XCHG_MIXED)))
		return rc;
	if (mem_count(c) == 0) {
		fprintf(stderr, "rank %d: nothing was read from a registered buffer\n",
			mr_comm_rank(c));
		return -4030;
	}
	/* below the ring size an isend stays eager (through the ring), a
	 * sendrecv's send goes by single copy (it waits for its peer) */
	if (n > 1) {
		size_t small = 8000; /* 32 KB: >= MR_COMM_CMA_MIN, < the ring */
		const struct mr__hcomm *h = (const struct mr__hcomm *)c;
		int me = mr_comm_rank(c);
		/* one read if the sender (me - 1) shares memory with this rank */
		unsigned long want = h->ch[(me + n - 1) % n].cma ? 1 : 0, k0 = mem_count(c), k1;

		if ((rc = check_sendrecv(c, MR_COMM_I32, small, XCHG_ISEND_IRECV)))
			return rc;
		k1 = mem_count(c);
		if ((rc = check_sendrecv(c, MR_COMM_I32, small, XCHG_SENDRECV)))
			return rc;
		if (k1 != k0 || mem_count(c) != k1 + want) {
			fprintf(stderr, "rank %d: single-copy reads %lu -> %lu -> %lu\n", me, k0,
				k1, mem_count(c));
			return -4031;
		}
	}
	return mr_comm_barrier(c);
}

static void registered(void)
{
	check_alloc = mr_comm_mem_alloc; /* zeroed: a new memfd */
	check_free = mr_comm_mem_free;
	setenv("MR_COMM_CMA_MIN", "4096", 1);
	setenv("MR_COMM_SHM_RING", "65536", 1);
}

Test(comm_cma, registered_processes_world2, .timeout = 120)
{
	registered();
	cr_assert_eq(run_procs(2, HOSTS_SAME, 60000, registered_ops, NULL, -1), 0);
}

Test(comm_cma, registered_processes_world4, .timeout = 120)
{
	registered();
	cr_assert_eq(run_procs(4, HOSTS_SAME, 60000, registered_ops, NULL, -1), 0);
}

/* two hosts of two: the TCP pairs ignore registration */
Test(comm_cma, registered_processes_mixed_world4, .timeout = 120)
{
	registered();
	cr_assert_eq(run_procs(4, HOSTS_HALF, 60000, registered_ops, NULL, -1), 0);
}

/* Rank 1 sends from 40 registered buffers in turn (more than a channel
 * keeps mapped), freeing every other one at once so the next allocation
 * may get the same fd number and address: rank 0 must see each buffer's
 * own contents, never an older mapping's. */
static int buffers_come_and_go(struct mr_comm *c, void *arg)
{
	size_t cnt = 65536;
	float *keep[40] = { 0 };
	int rc = 0;

	(void)arg;
	for (int k = 0; k < 40 && !rc; k++) {
		float *b = mr_comm_mem_alloc(cnt * sizeof(float));

		if (!b)
			return MR_ENOMEM;
		if (mr_comm_rank(c) == 1) {
			for (size_t i = 0; i < cnt; i++)
				b[i] = (float)(k * 1000 + (int)(i % 1000));
			rc = mr_comm_send(c, b, cnt, MR_COMM_F32, 0, k);
		} else {
			rc = mr_comm_recv(c, b, cnt, MR_COMM_F32, 1, k);
			for (size_t i = 0; !rc && i < cnt; i++)
				if (b[i] != (float)(k * 1000 + (int)(i % 1000))) {
					fprintf(stderr, "buffer %d: [%zu] = %g\n", k, i, b[i]);
					rc = -4040;
				}
		}
		if (k % 2)
			mr_comm_mem_free(b);
		else
			keep[k] = b;
	}
	if (!rc && mr_comm_rank(c) == 0 && mem_count(c) != 40) {
		fprintf(stderr, "%lu of 40 messages read through a mapping\n", mem_count(c));
		rc = -4041;
	}
	for (int k = 0; k < 40; k++)
		mr_comm_mem_free(keep[k]);
	return rc ? rc : mr_comm_barrier(c);
}

Test(comm_cma, registered_buffers_freed_and_reallocated, .timeout = 60)
{
	setenv("MR_COMM_SHM_RING", "65536", 1);
	cr_assert_eq(run_procs(2, HOSTS_SAME, 20000, buffers_come_and_go, NULL, -1), 0);
}

/* Rank 1 sends once from a registered buffer (rank 0 maps it), then posts
 * a second send from it and dies: rank 0's mapping still holds the data,
 * but the receive fails like any from a dead peer. */
static int killed_registered_sender(struct mr_comm *c, void *arg)
{
	size_t cnt = 4 * PER;
	float *buf = mr_comm_mem_alloc(cnt * sizeof(float));
	struct mr_comm_req *r;
	int rc;

	(void)arg;
	if (!buf)
		return -4050;
	if (mr_comm_rank(c) == 1) {
		if (mr_comm_send(c, buf, cnt, MR_COMM_F32, 0, 2) ||
		    mr_comm_isend(c, buf, cnt, MR_COMM_F32, 0, 3, &r))
			return -4051;
		usleep(200 * 1000);
		raise(SIGKILL);
	}
	if ((rc = mr_comm_recv(c, buf, cnt, MR_COMM_F32, 1, 2)))
		return -4052;
	usleep(400 * 1000);
	rc = mr_comm_recv(c, buf, cnt, MR_COMM_F32, 1, 3);
	fprintf(stderr, "cma: recv from a killed registered sender: %s (mem_rx %lu)\n",
		mr_err_name(rc), mem_count(c));
	return rc == MR_EPEER && mem_count(c) >= 1 ? 0 : -4053;
}

Test(comm_cma, registered_sender_killed_after_mapping, .timeout = 60)
{
	setenv("MR_COMM_SHM_RING", "65536", 1);
	cr_assert_eq(run_procs(2, HOSTS_SAME, 4000, killed_registered_sender, NULL, 1), 0);
}
