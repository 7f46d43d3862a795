/*
 * tsan_comm.c - ThreadSanitizer driver for the host backend (built and run
 * by scripts/tsan-comm.sh). Criterion's shared arena cannot live under
 * TSan, so this plain main() runs the threaded scenarios of test_comm.c:
 * every operation over shm, TCP and both, mesh groups (three
 * communicators in flight at once), many async operations, abort; then
 * the same with single-copy transfers forced down to 4 KiB; last, rings
 * of 4 KiB without single copy, so ring steps run chained through tiny
 * pieces (a send forwarding a receive that another thread's ring feeds).
 *
 * Non-goals: forked-process scenarios (no threads to race across).
 */
#include "checks.h"

static int all_ops(struct mr_comm *c, void *arg)
{
	(void)arg;
	return check_everything(c);
}

static int groups(struct mr_comm *w, void *arg)
{
	int me = mr_comm_rank(w), tp = me & 1, rc = 0;
	int g[2][2] = { { me - tp, me - tp + 1 }, { tp, tp + 2 } };
	struct mr_comm *c[2] = { 0 };
	struct mr_comm_req *req[4];
	float a[2][5000], b[2][3000];
	struct mr_errbuf eb = { { 0 }, { 0 } };

	(void)arg;
	if (me >= 4)
		return 0;
	for (int k = 0; k < 2 && !rc; k++)
		rc = mr_comm_split(w, g[k], 2, k ? "dp" : "tp", &c[k], &eb);
	for (int k = 0; k < 2 && !rc; k++) {
		for (int i = 0; i < 5000; i++)
			a[k][i] = (float)(me + i);
		for (int i = 0; i < 3000; i++)
			b[k][i] = (float)me;
		rc = mr_comm_iallreduce(c[k], a[k], a[k], 5000, MR_COMM_F32, MR_COMM_SUM, &req[2 * k]);
		if (!rc)
			rc = mr_comm_iallreduce(c[k], b[k], b[k], 3000, MR_COMM_F32, MR_COMM_MAX,
						&req[2 * k + 1]);
	}
	for (int k = 0; k < 4 && !rc; k++)
		rc = mr_comm_wait(req[k]);
	for (int k = 0; !rc && k < 2; k++)
		if (a[k][10] != (float)(g[k][0] + g[k][1] + 20) || b[k][7] != (float)g[k][1])
			rc = -1;
	for (int k = 0; k < 2; k++)
		mr_comm_free(c[k]);
	return rc;
}

/* Sizes whose ring steps and chunks do not divide evenly. */
static int chained(struct mr_comm *c, void *arg)
{
	int rc, n = mr_comm_size(c);
	size_t big = 200003;

	(void)arg;
	if ((rc = check_allreduce(c, MR_COMM_F32, MR_COMM_SUM, big, 0)))
		return rc;
	if ((rc = check_allreduce(c, MR_COMM_I32, MR_COMM_MAX, big, 1)))
		return rc;
	if ((rc = check_reduce_scatter(c, MR_COMM_F32, MR_COMM_SUM, big / (size_t)n)))
		return rc;
	if ((rc = check_allgather(c, MR_COMM_F32, big / (size_t)n, 0)))
		return rc;
	if ((rc = check_alltoall(c, MR_COMM_I32, big / (size_t)n, 0)))
		return rc;
	return check_sendrecv(c, MR_COMM_I32, big, XCHG_MIXED);
}

static void *abort_later(void *p)
{
	usleep(100000);
	mr_comm_abort(p);
	return NULL;
}

static int aborts(struct mr_comm *c, void *arg)
{
	int x, rc;
	pthread_t t;

	(void)arg;
	if (mr_comm_rank(c) == 0) {
		pthread_create(&t, NULL, abort_later, c);
		rc = mr_comm_recv(c, &x, 1, MR_COMM_I32, 1, 1);
		pthread_join(t, NULL);
		return rc == MR_EABORTED ? 0 : -1;
	}
	rc = mr_comm_recv(c, &x, 1, MR_COMM_I32, 0, 1);
	return rc == MR_EPEER ? 0 : -1;
}

int main(void)
{
	struct { const char *name; int n, hosts; rank_fn fn; } cases[] = {
		{ "ops shm 4", 4, HOSTS_SAME, all_ops },
		{ "ops tcp 3", 3, HOSTS_DISTINCT, all_ops },
		{ "ops mixed 4", 4, HOSTS_HALF, all_ops },
		{ "groups shm 4", 4, HOSTS_SAME, groups },
		{ "groups mixed 4", 4, HOSTS_HALF, groups },
		{ "abort shm 2", 2, HOSTS_SAME, aborts },
		{ "abort tcp 2", 2, HOSTS_DISTINCT, aborts },
		/* from here on single copy (host_cma.c) from 4 KiB, p2p beyond a
		 * 64 KiB ring: the reader copies from the writer thread's buffer */
		{ "cma ops shm 3", 3, HOSTS_SAME, all_ops },
		{ "cma ops mixed 4", 4, HOSTS_HALF, all_ops },
		{ "cma groups shm 4", 4, HOSTS_SAME, groups },
		{ "chain shm 3", 3, HOSTS_SAME, chained },
		{ "chain mixed 4", 4, HOSTS_HALF, chained },
	};
	int bad = 0;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc;

		if (!strncmp(cases[i].name, "cma ", 4)) {
			setenv("MR_COMM_CMA_MIN", "4096", 1);
			setenv("MR_COMM_SHM_RING", "65536", 1);
		}
		if (!strncmp(cases[i].name, "chain ", 6)) {
			setenv("MR_COMM_CMA", "0", 1);
			setenv("MR_COMM_SHM_RING", "4096", 1);
			setenv("MR_COMM_CHUNK", "40000", 1);
			setenv("MR_COMM_STREAM_MIN", "4096", 1);
		}
		rc = run_threads(cases[i].n, cases[i].hosts, cases[i].fn, NULL);

		printf("tsan-comm: %-16s %s\n", cases[i].name, rc ? "FAIL" : "ok");
		bad += rc != 0;
	}
	return bad ? 1 : 0;
}
