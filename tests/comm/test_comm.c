/*
 * test_comm.c - correctness of the host communicator backend: every
 * operation x dtype x size x world size 1-8, over shared memory, TCP and
 * both at once, ranks as threads and as forked processes; mesh process
 * groups and custom groups; many asynchronous operations in flight on
 * several communicators.
 *
 * Non-goals: failures (test_comm_fault.c), speed (bench/comm.c).
 */
#include <criterion/criterion.h>

#include "checks.h"

static int all_ops(struct mr_comm *c, void *arg)
{
	(void)arg;
	return check_everything(c);
}

#define OPS_TEST(name, n, hosts) \
	Test(comm, name, .timeout = 120) { cr_assert_eq(run_threads(n, hosts, all_ops, NULL), 0); }

// cppcheck-suppress unknownMacro
OPS_TEST(ops_world1, 1, HOSTS_SAME)
OPS_TEST(ops_shm_world2, 2, HOSTS_SAME)
OPS_TEST(ops_shm_world3, 3, HOSTS_SAME)
OPS_TEST(ops_shm_world4, 4, HOSTS_SAME)
OPS_TEST(ops_shm_world5, 5, HOSTS_SAME)
OPS_TEST(ops_shm_world6, 6, HOSTS_SAME)
OPS_TEST(ops_shm_world7, 7, HOSTS_SAME)
OPS_TEST(ops_shm_world8, 8, HOSTS_SAME)
OPS_TEST(ops_tcp_world2, 2, HOSTS_DISTINCT)
OPS_TEST(ops_tcp_world3, 3, HOSTS_DISTINCT)
OPS_TEST(ops_tcp_world5, 5, HOSTS_DISTINCT)
OPS_TEST(ops_tcp_world8, 8, HOSTS_DISTINCT)
OPS_TEST(ops_mixed_world4, 4, HOSTS_HALF)
OPS_TEST(ops_mixed_world7, 7, HOSTS_HALF)

Test(comm, ops_processes_shm, .timeout = 120)
{
	cr_assert_eq(run_procs(4, HOSTS_SAME, 20000, all_ops, NULL, -1), 0);
}

Test(comm, ops_processes_tcp, .timeout = 120)
{
	cr_assert_eq(run_procs(3, HOSTS_DISTINCT, 20000, all_ops, NULL, -1), 0);
}

Test(comm, ops_processes_mixed, .timeout = 120)
{
	cr_assert_eq(run_procs(4, HOSTS_HALF, 20000, all_ops, NULL, -1), 0);
}

/* ---- large messages: the ring / scatter-allgather paths ---- */

#define BIG ((size_t)4 << 20) /* elements: 16 MiB of fp32 */

static int big_ops(struct mr_comm *c, void *arg)
{
	int rc, n = mr_comm_size(c);

	(void)arg;
	if ((rc = check_allreduce(c, MR_COMM_F32, MR_COMM_SUM, BIG, 0)))
		return rc;
	if ((rc = check_allreduce(c, MR_COMM_F32, MR_COMM_MAX, BIG + 3, 1)))
		return rc;
	if ((rc = check_allreduce(c, MR_COMM_BF16, MR_COMM_AVG, BIG / 2 + 1, 0)))
		return rc;
	if ((rc = check_reduce_scatter(c, MR_COMM_F32, MR_COMM_SUM, BIG / (size_t)n + 1)))
		return rc;
	if ((rc = check_allgather(c, MR_COMM_F32, BIG / (size_t)n + 1, 1)))
		return rc;
	if ((rc = check_alltoall(c, MR_COMM_I32, BIG / (size_t)n + 1, 0)))
		return rc;
	if ((rc = check_broadcast(c, MR_COMM_F32, BIG + 1, 1 % n)))
		return rc;
	if ((rc = check_sendrecv(c, MR_COMM_I64, BIG / 2 + 5, XCHG_ISEND_IRECV)))
		return rc;
	return check_sendrecv(c, MR_COMM_I64, BIG / 2 + 5, XCHG_MIXED);
}

Test(comm, large_shm_world2, .timeout = 120)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, big_ops, NULL), 0);
}

Test(comm, large_shm_world3, .timeout = 120)
{
	cr_assert_eq(run_threads(3, HOSTS_SAME, big_ops, NULL), 0);
}

Test(comm, large_tcp_world2, .timeout = 120)
{
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, big_ops, NULL), 0);
}

Test(comm, large_mixed_world4, .timeout = 120)
{
	cr_assert_eq(run_threads(4, HOSTS_HALF, big_ops, NULL), 0);
}

/* Between processes large messages go through the rings: a ring's steps
 * run chained (a send forwards what the previous receive has so far) and
 * big receives are copied out with streaming stores. */
Test(comm, large_processes_shm_world4, .timeout = 120)
{
	cr_assert_eq(run_procs(4, HOSTS_SAME, 60000, big_ops, NULL, -1), 0);
}

/* The same chains through a 4 KiB ring (many wraps, every forward in
 * small pieces) with single copy off, as threads and as processes:
 * streaming copies of a few bytes at wrap points, allreduce chunks of
 * 40000 bytes per segment (not a multiple of the element or ring size). */
Test(comm, large_small_ring_world3, .timeout = 120)
{
	setenv("MR_COMM_CMA", "0", 1);
	setenv("MR_COMM_SHM_RING", "4096", 1);
	setenv("MR_COMM_STREAM_MIN", "4096", 1);
	setenv("MR_COMM_CHUNK", "40000", 1);
	cr_assert_eq(run_threads(3, HOSTS_SAME, big_ops, NULL), 0);
	cr_assert_eq(run_procs(3, HOSTS_SAME, 60000, big_ops, NULL, -1), 0);
}

/* ---- mesh groups and custom groups ---- */

/* 2x2x2 mesh, tp fastest, then dp, then pp: rank = tp + 2*dp + 4*pp. */
static int mesh_groups(struct mr_comm *w, void *arg)
{
	int me = mr_comm_rank(w), tp = me & 1, dp = (me >> 1) & 1, pp = me >> 2, rc = 0;
	int g[3][2] = { { me - tp, me - tp + 1 },               /* tp */
			{ tp + 4 * pp, tp + 2 + 4 * pp },       /* dp */
			{ tp + 2 * dp, tp + 2 * dp + 4 } };     /* pp */
	const char *names[3] = { "tp", "dp", "pp" };
	struct mr_comm *c[3] = { 0 };
	struct mr_comm_req *req[3];
	float buf[3][1009];
	struct mr_errbuf eb = { { 0 }, { 0 } };

	(void)arg;
	for (int k = 0; k < 3; k++) {
		rc = mr_comm_split(w, g[k], 2, names[k], &c[k], &eb);
		if (rc) {
			fprintf(stderr, "split %s: %s\n", names[k], eb.msg);
			goto out;
		}
		if (mr_comm_rank(c[k]) != (g[k][0] == me ? 0 : 1) || mr_comm_size(c[k]) != 2) {
			rc = -1001;
			goto out;
		}
	}
	/* all three groups at once, then each must hold the sum of its pair */
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < 1009; i++)
			buf[k][i] = (float)(me * 100 + i % 7 + k);
		if ((rc = mr_comm_iallreduce(c[k], buf[k], buf[k], 1009, MR_COMM_F32,
					     MR_COMM_SUM, &req[k])))
			goto out;
	}
	for (int k = 0; k < 3; k++)
		if ((rc = mr_comm_wait(req[k])))
			goto out;
	for (int k = 0; k < 3; k++)
		for (int i = 0; i < 1009; i++) {
			float want = (float)((g[k][0] + g[k][1]) * 100 + 2 * (i % 7) + 2 * k);

			if (buf[k][i] != want) {
				fprintf(stderr, "mesh %s rank %d [%d] %g want %g\n", names[k], me, i,
					buf[k][i], want);
				rc = -1002;
				goto out;
			}
		}
	for (int k = 0; k < 3 && !rc; k++)
		rc = check_everything(c[k]);
out:
	for (int k = 0; k < 3; k++)
		mr_comm_free(c[k]);
	return rc;
}

Test(comm, mesh_2x2x2_groups, .timeout = 120)
{
	cr_assert_eq(run_threads(8, HOSTS_SAME, mesh_groups, NULL), 0);
}

Test(comm, mesh_2x2x2_groups_mixed, .timeout = 120)
{
	cr_assert_eq(run_threads(8, HOSTS_HALF, mesh_groups, NULL), 0);
}

/* Non-contiguous groups in a given order: {7,2,5} and {0,3,6}, {1,4}. */
static int custom_groups(struct mr_comm *w, void *arg)
{
	static const int a[] = { 7, 2, 5 }, b[] = { 0, 3, 6 }, d[] = { 1, 4 };
	const int *g;
	int n, me = mr_comm_rank(w), rc;
	struct mr_comm *c = NULL;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	(void)arg;
	if (me == 7 || me == 2 || me == 5) {
		g = a;
		n = 3;
	} else if (me % 3 == 0) {
		g = b;
		n = 3;
	} else {
		g = d;
		n = 2;
	}
	rc = mr_comm_split(w, g, n, NULL, &c, &eb);
	if (rc)
		return rc;
	for (int i = 0; i < n; i++)
		if (g[i] == me && mr_comm_rank(c) != i)
			rc = -1003;
	if (!rc)
		rc = check_everything(c);
	/* the world still works while the group exists */
	if (!rc)
		rc = check_allreduce(w, MR_COMM_I64, MR_COMM_SUM, 1009, 0);
	mr_comm_free(c);
	return rc;
}

Test(comm, custom_noncontiguous_groups, .timeout = 120)
{
	cr_assert_eq(run_threads(8, HOSTS_SAME, custom_groups, NULL), 0);
}

/* Unnamed splits of one list, many times over (more than any fixed table
 * of seen lists holds): each is its own communicator, so all of them work
 * at once, each reducing its own value. */
#define MANY_SPLITS 40
static int many_splits(struct mr_comm *w, void *arg)
{
	const int all[2] = { 0, 1 };
	struct mr_comm *c[MANY_SPLITS] = { 0 };
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int k, rc = 0;

	(void)arg;
	for (k = 0; k < MANY_SPLITS && !rc; k++)
		rc = mr_comm_split(w, all, 2, NULL, &c[k], &eb);
	/* newest first: a split that took an older one's place would pair up
	 * with the wrong peer communicator and see the wrong value */
	for (k = MANY_SPLITS - 1; k >= 0 && !rc; k--) {
		int64_t x = k, y = 0;
		rc = mr_comm_allreduce(c[k], &x, &y, 1, MR_COMM_I64, MR_COMM_SUM);
		if (!rc && y != 2 * k)
			rc = -1100 - k;
	}
	for (k = 0; k < MANY_SPLITS; k++)
		mr_comm_free(c[k]);
	return rc;
}

Test(comm, every_unnamed_split_of_one_list_is_its_own_communicator, .timeout = 120)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, many_splits, NULL), 0);
}

Test(comm, split_rejects_bad_groups)
{
	struct mr_kv kv;
	struct kv_mem *m = kv_mem_new(&kv);
	struct mr_comm_config cfg = { .id = "solo", .rank = 0, .world_size = 1, .kv = &kv,
				      .host_id = "h" };
	struct mr_comm *w, *s = NULL;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int not_me[] = { 1 }, dup[] = { 0, 0 };

	cr_assert_eq(mr_comm_init(&w, &cfg, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_comm_split(w, not_me, 1, NULL, &s, &eb), MR_EINVAL);
	cr_assert_eq(mr_comm_split(w, dup, 2, NULL, &s, &eb), MR_EINVAL);
	cr_assert_null(s);
	cfg.backend = "carrier-pigeon";
	cr_assert_eq(mr_comm_init(&s, &cfg, &eb), MR_EINVAL);
	mr_comm_free(w);
	kv_mem_free(m);
}

/* Point-to-point arguments: peers out of range or this rank, tags < 0. */
static int p2p_bad_args(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), other = 1 - me, v = 0, w = 0;
	struct mr_comm_req *r = NULL;

	(void)arg;
	if (mr_comm_sendrecv(c, &v, &w, 1, MR_COMM_I32, me, other, 0) != MR_EINVAL ||
	    mr_comm_sendrecv(c, &v, &w, 1, MR_COMM_I32, other, me, 0) != MR_EINVAL ||
	    mr_comm_sendrecv(c, &v, &w, 1, MR_COMM_I32, 2, other, 0) != MR_EINVAL ||
	    mr_comm_sendrecv(c, &v, &w, 1, MR_COMM_I32, other, -1, 0) != MR_EINVAL ||
	    mr_comm_isendrecv(c, &v, &w, 1, MR_COMM_I32, other, other, -3, &r) != MR_EINVAL ||
	    r != NULL || mr_comm_send(c, &v, 1, MR_COMM_I32, me, 0) != MR_EINVAL ||
	    mr_comm_recv(c, &w, 1, MR_COMM_I32, other, -1) != MR_EINVAL)
		return -1;
	/* nothing was sent: the next exchange still pairs up */
	v = 10 + me;
	if (mr_comm_sendrecv(c, &v, &w, 1, MR_COMM_I32, other, other, 0))
		return -2;
	return w == 10 + other ? 0 : -3;
}

Test(comm, p2p_rejects_bad_arguments)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, p2p_bad_args, NULL), 0);
}

/* ---- many asynchronous operations in flight on several communicators ---- */

#define NASYNC 24

static int many_async(struct mr_comm *w, void *arg)
{
	int me = mr_comm_rank(w), n = mr_comm_size(w), rc = 0;
	int half[4], nh = 0;
	struct mr_comm *h = NULL;
	struct mr_comm_req *req[2 * NASYNC];
	int32_t *buf[2 * NASYNC];
	struct mr_errbuf eb = { { 0 }, { 0 } };

	(void)arg;
	for (int i = 0; i < n; i++)
		if (i % 2 == me % 2)
			half[nh++] = i;
	if ((rc = mr_comm_split(w, half, nh, "half", &h, &eb)))
		return rc;
	for (int k = 0; k < 2 * NASYNC; k++) {
		struct mr_comm *c = k % 2 ? h : w;
		size_t cnt = (size_t)(1 + k * 997 % 40000);

		buf[k] = malloc(cnt * sizeof(int32_t));
		for (size_t i = 0; i < cnt; i++)
			buf[k][i] = (int32_t)(me + (int)i + k);
		if ((rc = mr_comm_iallreduce(c, buf[k], buf[k], cnt, MR_COMM_I32, MR_COMM_SUM,
					     &req[k])))
			return rc;
	}
	/* wait in reverse order: completion must not depend on wait order */
	for (int k = 2 * NASYNC - 1; k >= 0; k--) {
		int r = mr_comm_wait(req[k]);
		struct mr_comm *c = k % 2 ? h : w;
		int m = mr_comm_size(c), rsum = 0;
		size_t cnt = (size_t)(1 + k * 997 % 40000);

		for (int i = 0; i < m; i++)
			rsum += c == h ? half[i] : i;
		if (r && !rc)
			rc = r;
		for (size_t i = 0; !rc && i < cnt; i++)
			if (buf[k][i] != rsum + m * ((int)i + k)) {
				fprintf(stderr, "async %d [%zu] = %d\n", k, i, buf[k][i]);
				rc = -1004;
			}
		free(buf[k]);
	}
	mr_comm_free(h);
	return rc;
}

Test(comm, many_async_ops_two_comms, .timeout = 120)
{
	cr_assert_eq(run_threads(4, HOSTS_SAME, many_async, NULL), 0);
	cr_assert_eq(run_threads(4, HOSTS_HALF, many_async, NULL), 0);
}

/* Tags: messages to one peer are matched by tag, not arrival order. */
static int tag_order(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), a[3] = { 1, 2, 3 }, b[3] = { 0 }, rc = 0;
	struct mr_comm_req *r[3];

	(void)arg;
	if (me == 0) {
		for (int t = 0; t < 3 && !rc; t++)
			rc = mr_comm_send(c, &a[t], 1, MR_COMM_I32, 1, 10 + t);
		return rc;
	}
	for (int t = 2; t >= 0; t--)
		if ((rc = mr_comm_irecv(c, &b[t], 1, MR_COMM_I32, 0, 10 + t, &r[t])))
			return rc;
	for (int t = 0; t < 3; t++)
		if ((rc = mr_comm_wait(r[t])))
			return rc;
	return (b[0] == 1 && b[1] == 2 && b[2] == 3) ? 0 : -1005;
}

Test(comm, recv_matches_by_tag, .timeout = 60)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, tag_order, NULL), 0);
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, tag_order, NULL), 0);
}

/* A small receive posted before its message is left for the thread that
 * waits on it (host.c): polling with mr_comm_test alone must finish it,
 * and a later large receive on the same peer still completes in order. */
static int test_polls(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), x = 0, y = 0, rc, done = 0;
	size_t big = 1 << 20;
	float *b = calloc(big, sizeof(float));
	struct mr_comm_req *r, *rb;

	(void)arg;
	if (!b)
		return MR_ENOMEM;
	if (me == 1) {
		usleep(50 * 1000);
		x = 42;
		for (size_t i = 0; i < big; i++)
			b[i] = (float)(i % 7);
		rc = mr_comm_send(c, &x, 1, MR_COMM_I32, 0, 5);
		if (!rc)
			rc = mr_comm_send(c, b, big, MR_COMM_F32, 0, 6);
		free(b);
		return rc;
	}
	usleep(10 * 1000); /* the progress thread is idle by now */
	if ((rc = mr_comm_irecv(c, &y, 1, MR_COMM_I32, 1, 5, &r))) {
		free(b);
		return rc;
	}
	for (int i = 0; i < 50000 && !done; i++) {
		if ((rc = mr_comm_test(r, &done)) < 0)
			break;
		usleep(100);
	}
	rc = mr_comm_wait(r);
	if (!rc && !(rc = mr_comm_irecv(c, b, big, MR_COMM_F32, 1, 6, &rb)))
		rc = mr_comm_wait(rb);
	for (size_t i = 0; !rc && i < big; i++)
		if (b[i] != (float)(i % 7))
			rc = -1006;
	free(b);
	return rc ? rc : !done ? -1007 : y == 42 ? 0 : -1008;
}

Test(comm, small_recv_finished_by_test, .timeout = 60)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, test_polls, NULL), 0);
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, test_polls, NULL), 0);
	cr_assert_eq(run_procs(2, HOSTS_SAME, 20000, test_polls, NULL, -1), 0);
}

/* allgather whose input lives inside the output: in place (own slot) and
 * in the next rank's slot (the own block must be copied before the ring
 * overwrites it); blocks larger than the piece the copy moves at a time. */
static int allgather_aliased(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), n = mr_comm_size(c), rc = 0;
	size_t per = 100000;
	float *r = malloc(per * (size_t)n * sizeof(float));

	(void)arg;
	if (!r)
		return MR_ENOMEM;
	for (int mode = 0; mode < 2 && !rc; mode++) {
		float *s = r + per * (size_t)(mode ? (me + 1) % n : me);

		for (size_t i = 0; i < per; i++)
			s[i] = (float)val(me, i, 20 + mode);
		rc = mr_comm_allgather(c, s, r, per, MR_COMM_F32);
		for (size_t i = 0; !rc && i < per * (size_t)n; i++)
			if (r[i] != (float)val((int)(i / per), i % per, 20 + mode)) {
				fprintf(stderr, "rank %d: mode %d: r[%zu] = %g\n", me, mode, i, r[i]);
				rc = -1009;
			}
	}
	free(r);
	return rc;
}

Test(comm, allgather_input_inside_output, .timeout = 60)
{
	cr_assert_eq(run_threads(3, HOSTS_SAME, allgather_aliased, NULL), 0);
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, allgather_aliased, NULL), 0);
}

Test(comm, host_id_has_boot_id_and_ipc_ns)
{
	char id[MR_COMM_HOST_ID_MAX], boot[64] = { 0 };
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");

	cr_assert_eq(mr_comm_host_id(id, sizeof(id)), 0);
	cr_assert_not_null(f);
	cr_assert_not_null(fgets(boot, sizeof(boot), f));
	fclose(f);
	boot[strcspn(boot, "\n")] = 0;
	cr_assert(strstr(id, boot) == id, "%s", id);
	cr_assert(strstr(id, "ipc:[") != NULL, "%s", id);
	cr_assert_eq(mr_comm_host_id(id, 8), MR_ERANGE);
}

/* Pipeline-style traffic: many isend/irecv in flight both ways at once,
 * more than one batch's worth, large enough to be mid-stream while new
 * ones are appended; receives posted in reverse tag order. */
#define NP2P 20

static int many_p2p(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), peer = 1 - me, rc = 0;
	struct mr_comm_req *sr[NP2P] = { 0 }, *rr[NP2P] = { 0 };
	int32_t *sb[NP2P], *rb[NP2P];

	(void)arg;
	for (int k = 0; k < NP2P; k++) {
		size_t cnt = (size_t)(1 + k * 7919 % 100000);

		sb[k] = malloc(cnt * 4);
		rb[k] = calloc(cnt, 4);
		for (size_t i = 0; i < cnt; i++)
			sb[k][i] = (int32_t)(me * 1000000 + k * 1000 + (int)(i % 1000));
	}
	for (int k = 0; k < NP2P && !rc; k++) {
		size_t cnt = (size_t)(1 + k * 7919 % 100000);
		int j = NP2P - 1 - k;
		size_t rcnt = (size_t)(1 + j * 7919 % 100000);

		rc = mr_comm_isend(c, sb[k], cnt, MR_COMM_I32, peer, k, &sr[k]);
		if (!rc)
			rc = mr_comm_irecv(c, rb[j], rcnt, MR_COMM_I32, peer, j, &rr[j]);
	}
	for (int k = 0; k < NP2P; k++) {
		int a = sr[k] ? mr_comm_wait(sr[k]) : MR_EINVAL;
		int b = rr[k] ? mr_comm_wait(rr[k]) : MR_EINVAL;
		size_t cnt = (size_t)(1 + k * 7919 % 100000);

		if (!rc)
			rc = a ? a : b;
		for (size_t i = 0; !rc && i < cnt; i++)
			if (rb[k][i] != (int32_t)(peer * 1000000 + k * 1000 + (int)(i % 1000)))
				rc = -1006;
		free(sb[k]);
		free(rb[k]);
	}
	return rc;
}

Test(comm, many_p2p_in_flight, .timeout = 60)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, many_p2p, NULL), 0);
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, many_p2p, NULL), 0);
}

/* A pipeline stage posts receives long before it needs them: a thread
 * waiting for one of them must get it back as soon as it is done, not
 * when the others of its batch are (rank 1 sends the second only after
 * rank 0, woken by the first, has sent it something). */
static int early_receives(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), a = 0, b = 0, x = 7, rc;
	struct mr_comm_req *ra, *rb;

	(void)arg;
	if (me == 1) {
		if ((rc = mr_comm_send(c, &x, 1, MR_COMM_I32, 0, 1)) < 0 ||
		    (rc = mr_comm_recv(c, &a, 1, MR_COMM_I32, 0, 3)) < 0)
			return rc;
		return mr_comm_send(c, &a, 1, MR_COMM_I32, 0, 2);
	}
	if ((rc = mr_comm_irecv(c, &a, 1, MR_COMM_I32, 1, 1, &ra)) < 0)
		return rc;
	if ((rc = mr_comm_irecv(c, &b, 1, MR_COMM_I32, 1, 2, &rb)) < 0)
		return rc;
	if ((rc = mr_comm_wait(ra)) < 0 ||
	    (rc = mr_comm_send(c, &(int){ a + 1 }, 1, MR_COMM_I32, 1, 3)) < 0 ||
	    (rc = mr_comm_wait(rb)) < 0)
		return rc;
	return a == 7 && b == 8 ? 0 : -1007;
}

/* The host backend progresses send/recv out of order (the pipeline posts
 * receives ahead there): not "in order", and its groups are no-ops around
 * the same exchange. */
static int host_groups(struct mr_comm *c, void *arg)
{
	int rc;

	if (mr_comm_p2p_in_order(c))
		return -1008;
	if ((rc = mr_comm_group_start(c)) < 0)
		return rc;
	if ((rc = mr_comm_group_end(c)) < 0)
		return rc;
	return early_receives(c, arg);
}

/* mr_comm_kick moves a send on in the caller's thread and returns at once,
 * even when the batch holds a receive that cannot complete yet (rank 1
 * answers only after rank 0's send arrived). */
static int kick_send(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), x = 41, y = 0, rc;
	struct mr_comm_req *rr, *rs;

	(void)arg;
	if (me == 1) {
		if ((rc = mr_comm_recv(c, &y, 1, MR_COMM_I32, 0, 6)) < 0)
			return rc;
		y++;
		return mr_comm_send(c, &y, 1, MR_COMM_I32, 0, 5);
	}
	if ((rc = mr_comm_irecv(c, &y, 1, MR_COMM_I32, 1, 5, &rr)) < 0 ||
	    (rc = mr_comm_isend(c, &x, 1, MR_COMM_I32, 1, 6, &rs)) < 0)
		return rc;
	mr_comm_kick(c);
	if ((rc = mr_comm_wait(rs)) < 0 || (rc = mr_comm_wait(rr)) < 0)
		return rc;
	return y == 42 ? 0 : -1009;
}

Test(comm, kick_returns_with_receives_pending, .timeout = 60)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, kick_send, NULL), 0);
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, kick_send, NULL), 0);
}

/* A batch left running with a receive half filled (mr_comm_kick yields
 * after one pass; with a 4 KiB ring 32 KiB arrive in pieces) takes more
 * receives than its array holds: the array moves, and the half-filled
 * receive must be finished where it now is. A small receive queued first
 * does not wake the progress thread, so the kick runs the batch; the
 * progress thread may still resume it before the other receives are
 * queued (then they join it one by one): ROUNDS tries. */
#define HALF_N ((size_t)8 << 10)
#define SMALL_K 16
#define ROUNDS 50

static int moved_batch(struct mr_comm *c, void *arg)
{
	int me = mr_comm_rank(c), rc = 0, small[SMALL_K];
	int32_t half[HALF_N];
	struct mr_comm_req *rq[1 + SMALL_K];

	(void)arg;
	for (int round = 0; round < ROUNDS && rc == 0; round++) {
		for (size_t i = 0; i < HALF_N; i++)
			half[i] = me == 1 ? (int32_t)(i * 7 + (size_t)round) : -1;
		for (int k = 0; k < SMALL_K; k++)
			small[k] = me == 1 ? round * 100 + k : -1;
		if (me == 1) {
			rc = mr_comm_isend(c, half, HALF_N, MR_COMM_I32, 0, 1, &rq[0]);
			for (int k = 0; k < SMALL_K && rc == 0; k++)
				rc = mr_comm_isend(c, &small[k], 1, MR_COMM_I32, 0, 10 + k,
						   &rq[1 + k]);
		} else {
			rc = mr_comm_irecv(c, half, HALF_N, MR_COMM_I32, 1, 1, &rq[0]);
			usleep(5000); /* the sender filled the ring */
			mr_comm_kick(c);
			for (int k = 0; k < SMALL_K && rc == 0; k++)
				rc = mr_comm_irecv(c, &small[k], 1, MR_COMM_I32, 1, 10 + k,
						   &rq[1 + k]);
		}
		for (int k = 0; k < 1 + SMALL_K && rc == 0; k++)
			rc = mr_comm_wait(rq[k]);
		for (size_t i = 0; me == 0 && rc == 0 && i < HALF_N; i++)
			if (half[i] != (int32_t)(i * 7 + (size_t)round))
				rc = -1010;
		for (int k = 0; me == 0 && rc == 0 && k < SMALL_K; k++)
			if (small[k] != round * 100 + k)
				rc = -1011;
	}
	return rc;
}

Test(comm, half_filled_receive_follows_a_moved_batch, .timeout = 120)
{
	setenv("MR_COMM_SHM_RING", "4096", 1);
	setenv("MR_COMM_CMA", "0", 1);
	cr_assert_eq(run_threads(2, HOSTS_SAME, moved_batch, NULL), 0);
}

Test(comm, host_p2p_out_of_order_groups_no_op, .timeout = 60)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, host_groups, NULL), 0);
}

Test(comm, waiter_not_held_by_other_receives, .timeout = 60)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, early_receives, NULL), 0);
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, early_receives, NULL), 0);
}

/* 64 MiB per rank: slow on a shared 2-core machine, so only with
 * MR_TEST_SLOW=1 (the benchmark covers 64 MiB every run). */
static int huge_ops(struct mr_comm *c, void *arg)
{
	size_t cnt = (size_t)16 << 20; /* 64 MiB of fp32 */
	int rc;

	(void)arg;
	if ((rc = check_allreduce(c, MR_COMM_F32, MR_COMM_SUM, cnt, 0)))
		return rc;
	return check_reduce_scatter(c, MR_COMM_F32, MR_COMM_MAX, cnt / (size_t)mr_comm_size(c));
}

Test(comm, slow_64mib_allreduce_reduce_scatter, .timeout = 300)
{
	if (!getenv("MR_TEST_SLOW"))
		cr_skip_test("set MR_TEST_SLOW=1 to run the 64 MiB cases");
	cr_assert_eq(run_threads(2, HOSTS_SAME, huge_ops, NULL), 0);
	cr_assert_eq(run_threads(3, HOSTS_HALF, huge_ops, NULL), 0);
}
