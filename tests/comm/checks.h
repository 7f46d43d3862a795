/*
 * checks.h - per-rank checks of every communicator operation against
 * references computed locally (each rank can compute every rank's input).
 * Each returns 0, an MR_E* code from the operation, or -1000 - k on a
 * wrong value (printed to stderr).
 *
 * Non-goals: timing (bench/comm.c measures).
 */
#ifndef MR_TEST_COMM_CHECKS_H
#define MR_TEST_COMM_CHECKS_H

#include "harness.h"

#define BAD(what, i, got, want)                                                        \
	do {                                                                            \
		fprintf(stderr, "%s: rank %d/%d dt %d count %zu: [%zu] = %g, want %g\n", \
			(what), me, n, dt, count, (size_t)(i), (got), (want));          \
		rc = -1000;                                                             \
		goto out;                                                               \
	} while (0)

/* Where the checks' buffers come from: malloc, or check_alloc /
 * check_free when set (zeroed memory: registered memory in
 * test_comm_cma.c, CUDA managed memory in tests/gpu) - before the ranks
 * start, so forked ranks inherit the choice. */
static void *(*check_alloc)(size_t len);
static void (*check_free)(void *p);

static inline void *buf_alloc(size_t len)
{
	return check_alloc ? check_alloc(len) : calloc(1, len);
}

static inline void buf_free(void *p)
{
	if (check_free)
		check_free(p);
	else
		free(p);
}

static inline int check_allreduce(struct mr_comm *c, int dt, int op, size_t count, int inplace)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), salt = (int)count + op, rc;
	size_t esz = mr_comm_dtype_size(dt);
	char *s = buf_alloc((count + 1) * esz), *r = inplace ? s : buf_alloc((count + 1) * esz);

	for (size_t i = 0; i < count; i++)
		put_el(s, dt, i, val(me, i, salt));
	rc = mr_comm_allreduce(c, s, r, count, dt, op);
	if (rc)
		goto out;
	for (size_t i = 0; i < count; i++) {
		double want = ref_red(n, i, salt, op, dt), got = get_el(r, dt, i);

		if (!close_enough(got, want, dt))
			BAD("allreduce", i, got, want);
	}
out:
	if (!inplace)
		buf_free(r);
	buf_free(s);
	return rc;
}

static inline int check_reduce_scatter(struct mr_comm *c, int dt, int op, size_t count)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), salt = 3 + op, rc;
	size_t esz = mr_comm_dtype_size(dt);
	char *s = buf_alloc(count * (size_t)n * esz + 1), *r = buf_alloc(count * esz + 1);

	for (size_t i = 0; i < count * (size_t)n; i++)
		put_el(s, dt, i, val(me, i, salt));
	rc = mr_comm_reduce_scatter(c, s, r, count, dt, op);
	if (rc)
		goto out;
	for (size_t i = 0; i < count; i++) {
		double want = ref_red(n, (size_t)me * count + i, salt, op, dt);
		double got = get_el(r, dt, i);

		if (!close_enough(got, want, dt))
			BAD("reduce_scatter", i, got, want);
	}
out:
	buf_free(s);
	buf_free(r);
	return rc;
}

/* v = 1: allgatherv with counts count + rank and a one-element gap. */
static inline int check_allgather(struct mr_comm *c, int dt, size_t count, int v)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), salt = 5, rc;
	size_t esz = mr_comm_dtype_size(dt), cnt[16] = { 0 }, dsp[16] = { 0 }, total = 0;
	char *s, *r;

	for (int i = 0; i < n; i++) {
		cnt[i] = count + (v ? (size_t)i : 0);
		dsp[i] = total;
		total += cnt[i] + (v ? 1 : 0);
	}
	s = buf_alloc(cnt[me] * esz + 1);
	r = buf_alloc((total + 1) * esz);
	for (size_t i = 0; i < cnt[me]; i++)
		put_el(s, dt, i, val(me, i, salt));
	rc = v ? mr_comm_allgatherv(c, s, r, cnt, dsp, dt) : mr_comm_allgather(c, s, r, count, dt);
	if (rc)
		goto out;
	for (int p = 0; p < n; p++)
		for (size_t i = 0; i < cnt[p]; i++) {
			double got = get_el(r, dt, dsp[p] + i), want = val(p, i, salt);

			if (got != want)
				BAD(v ? "allgatherv" : "allgather", dsp[p] + i, got, want);
		}
out:
	buf_free(s);
	buf_free(r);
	return rc;
}

static inline int check_alltoall(struct mr_comm *c, int dt, size_t count, int v)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), salt = 7, rc;
	size_t esz = mr_comm_dtype_size(dt), sc[16] = { 0 }, sd[16] = { 0 }, rcn[16] = { 0 };
	size_t rd[16] = { 0 }, st = 0, rt = 0;
	char *s, *r;

	for (int p = 0; p < n; p++) {
		sc[p] = count + (v ? (size_t)((me + p) % 3) : 0);
		rcn[p] = count + (v ? (size_t)((p + me) % 3) : 0);
		sd[p] = st;
		rd[p] = rt;
		st += sc[p];
		rt += rcn[p];
	}
	s = buf_alloc(st * esz + 1);
	r = buf_alloc(rt * esz + 1);
	for (int p = 0; p < n; p++)
		for (size_t i = 0; i < sc[p]; i++)
			put_el(s, dt, sd[p] + i, val(me * 16 + p, i, salt));
	rc = v ? mr_comm_alltoallv(c, s, sc, sd, r, rcn, rd, dt) : mr_comm_alltoall(c, s, r, count, dt);
	if (rc)
		goto out;
	for (int p = 0; p < n; p++)
		for (size_t i = 0; i < rcn[p]; i++) {
			double got = get_el(r, dt, rd[p] + i), want = val(p * 16 + me, i, salt);

			if (got != want)
				BAD(v ? "alltoallv" : "alltoall", rd[p] + i, got, want);
		}
out:
	buf_free(s);
	buf_free(r);
	return rc;
}

static inline int check_broadcast(struct mr_comm *c, int dt, size_t count, int root)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), salt = 11, rc;
	size_t esz = mr_comm_dtype_size(dt);
	char *b = buf_alloc(count * esz + 1);

	for (size_t i = 0; i < count; i++)
		put_el(b, dt, i, me == root ? val(root, i, salt) : 99);
	rc = mr_comm_broadcast(c, b, count, dt, root);
	if (rc)
		goto out;
	for (size_t i = 0; i < count; i++)
		if (get_el(b, dt, i) != val(root, i, salt))
			BAD("broadcast", i, get_el(b, dt, i), val(root, i, salt));
out:
	buf_free(b);
	return rc;
}

enum { XCHG_ISEND_IRECV, XCHG_SENDRECV, XCHG_ISENDRECV, XCHG_MIXED, XCHG_MODES };

/* One ring exchange (to me+1, from me-1) the way mode says: isend/irecv
 * posted in the order that deadlocks a naive blocking implementation
 * (everyone sends first), sendrecv, isendrecv, or even ranks sendrecv
 * while odd ranks isend/irecv (the two must match each other). */
static inline int exchange(struct mr_comm *c, int mode, const char *s, char *r, size_t count,
			   int dt, int to, int from)
{
	struct mr_comm_req *a, *b;
	int rc, rc2;

	if (mode == XCHG_MIXED)
		mode = mr_comm_rank(c) % 2 ? XCHG_ISEND_IRECV : XCHG_SENDRECV;
	if (mode == XCHG_SENDRECV)
		return mr_comm_sendrecv(c, s, r, count, dt, to, from, 7);
	if (mode == XCHG_ISENDRECV) {
		if ((rc = mr_comm_isendrecv(c, s, r, count, dt, to, from, 7, &a)))
			return rc;
		return mr_comm_wait(a);
	}
	if ((rc = mr_comm_isend(c, s, count, dt, to, 7, &a)))
		return rc;
	rc = mr_comm_irecv(c, r, count, dt, from, 7, &b);
	rc2 = mr_comm_wait(a);
	if (rc)
		return rc;
	rc = mr_comm_wait(b);
	return rc ? rc : rc2;
}

static inline int check_sendrecv(struct mr_comm *c, int dt, size_t count, int mode)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), salt = 13 + mode, rc = 0;
	int to = (me + 1) % n, from = (me + n - 1) % n;
	size_t esz = mr_comm_dtype_size(dt);
	char *s = buf_alloc(count * esz + 1), *r = buf_alloc(count * esz + 1);

	if (n == 1)
		goto out;
	for (size_t i = 0; i < count; i++)
		put_el(s, dt, i, val(me, i, salt));
	if ((rc = exchange(c, mode, s, r, count, dt, to, from)))
		goto out;
	for (size_t i = 0; i < count; i++)
		if (get_el(r, dt, i) != val(from, i, salt))
			BAD("sendrecv", i, get_el(r, dt, i), val(from, i, salt));
out:
	buf_free(s);
	buf_free(r);
	return rc;
}

static const size_t small_sizes[] = { 0, 1, 1009 };

/* Every operation x dtype x small size on communicator c. */
static inline int check_everything(struct mr_comm *c)
{
	int rc = 0;

	for (int dt = 0; dt < 4; dt++)
		for (size_t k = 0; k < sizeof(small_sizes) / sizeof(small_sizes[0]); k++) {
			size_t cnt = small_sizes[k];

			for (int op = 0; op < 3; op++) {
				if ((rc = check_allreduce(c, dt, op, cnt, op == 1)))
					return rc;
				if ((rc = check_reduce_scatter(c, dt, op, cnt)))
					return rc;
			}
			if ((rc = check_allgather(c, dt, cnt, 0)) || (rc = check_allgather(c, dt, cnt, 1)))
				return rc;
			if ((rc = check_alltoall(c, dt, cnt, 0)) || (rc = check_alltoall(c, dt, cnt, 1)))
				return rc;
			if ((rc = check_broadcast(c, dt, cnt, 0)) ||
			    (rc = check_broadcast(c, dt, cnt, mr_comm_size(c) - 1)))
				return rc;
			for (int mode = 0; mode < XCHG_MODES; mode++)
				if ((rc = check_sendrecv(c, dt, cnt, mode)))
					return rc;
			if ((rc = mr_comm_barrier(c)))
				return rc;
		}
	return 0;
}

#endif
