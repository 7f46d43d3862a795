/*
 * test_comm_progress.c - a communicator's progress (mr_comm_progress):
 * operation numbers that line up across ranks, "completed" only once an
 * operation finished, the peer a blocked receive waits for as seen from
 * another thread, fresh numbers for a split, nothing counted for a call
 * rejected before it started, and time blocked.
 *
 * Non-goals: hang diagnosis itself (tests/controller/test_diag.c).
 */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "harness.h"

struct shared {
	struct mr_comm *comm[4];
	atomic_int ready[4];
};

static int expect(int cond, const char *what, int rank)
{
	if (!cond)
		fprintf(stderr, "rank %d: expected %s\n", rank, what);
	return cond ? 0 : -1;
}

static int in_order(struct mr_comm *c, void *arg)
{
	struct mr_comm_progress p;
	struct mr_comm_req *req;
	struct mr_comm *sub = NULL;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	int me = mr_comm_rank(c), all[2] = { 0, 1 }, rc = 0;
	float x = 1.0f, y[2];

	(void)arg;
	mr_comm_progress(c, &p);
	rc |= expect(p.entered == 0 && p.completed == 0 && p.entered_op == MR_COMM_OP_NONE,
		     "nothing entered on a new communicator", me);
	if (mr_comm_allreduce(c, &x, &x, 1, MR_COMM_F32, MR_COMM_SUM))
		return -1;
	mr_comm_progress(c, &p);
	rc |= expect(p.entered == 1 && p.completed == 1 && p.entered_op == MR_COMM_OP_ALLREDUCE &&
			     p.completed_op == MR_COMM_OP_ALLREDUCE && p.peer == -1,
		     "allreduce #1 entered and completed", me);
	/* an asynchronous operation is entered at issue, completed at wait */
	if (mr_comm_ibarrier(c, &req))
		return -1;
	mr_comm_progress(c, &p);
	rc |= expect(p.entered == 2 && p.entered_op == MR_COMM_OP_BARRIER && p.completed == 1,
		     "barrier #2 entered, not yet completed", me);
	if (mr_comm_wait(req))
		return -1;
	mr_comm_progress(c, &p);
	rc |= expect(p.completed == 2 && p.completed_op == MR_COMM_OP_BARRIER,
		     "barrier #2 completed after wait", me);
	/* a call rejected before it starts takes no number */
	rc |= expect(mr_comm_send(c, &x, 1, MR_COMM_F32, me, 0) == MR_EINVAL, "send to self refused",
		     me);
	if (mr_comm_allgather(c, &x, y, 1, MR_COMM_F32))
		return -1;
	mr_comm_progress(c, &p);
	rc |= expect(p.entered == 3 && p.completed == 3 && p.entered_op == MR_COMM_OP_ALLGATHER,
		     "allgather is #3 on every rank", me);
	if (mr_comm_split(c, all, 2, "sub", &sub, &eb))
		return -1;
	mr_comm_progress(sub, &p);
	rc |= expect(p.entered == 0 && p.completed == 0, "a split starts at 0", me);
	mr_comm_free(sub);
	return rc;
}

// cppcheck-suppress unknownMacro
Test(comm_progress, numbers_line_up_and_complete_in_order, .timeout = 60)
{
	cr_assert_eq(run_threads(2, HOSTS_SAME, in_order, NULL), 0);
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, in_order, NULL), 0);
}

/* Rank 1 blocks in a receive from rank 0; rank 0 reads rank 1's progress
 * from its own thread (as the agent does), then sends. */
static int blocked_recv(struct mr_comm *c, void *arg)
{
	struct shared *s = arg;
	struct mr_comm_progress p;
	int me = mr_comm_rank(c), rc = 0;
	float x = 3.0f;

	s->comm[me] = c;
	atomic_store(&s->ready[me], 1);
	if (me == 1) {
		if (mr_comm_recv(c, &x, 1, MR_COMM_F32, 0, 7))
			return -1;
		mr_comm_progress(c, &p);
		rc |= expect(x == 5.0f, "the value sent", me);
		rc |= expect(p.entered == 1 && p.completed == 1 && p.completed_op == MR_COMM_OP_RECV,
			     "recv #1 completed", me);
		rc |= expect(p.wait_s > 0.0, "time blocked counted", me);
		return rc;
	}
	while (!atomic_load(&s->ready[1]))
		usleep(1000);
	for (;;) { /* until rank 1 is inside its receive */
		mr_comm_progress(s->comm[1], &p);
		if (p.entered_op == MR_COMM_OP_RECV)
			break;
		usleep(1000);
	}
	rc |= expect(p.entered == 1 && p.completed == 0 && p.peer == 0,
		     "rank 1 in recv #1 from rank 0, not completed", me);
	x = 5.0f;
	if (mr_comm_send(c, &x, 1, MR_COMM_F32, 1, 7))
		return -1;
	mr_comm_progress(c, &p);
	rc |= expect(p.entered == 1 && p.entered_op == MR_COMM_OP_SEND && p.peer == 1,
		     "send #1 to rank 1", me);
	return rc;
}

Test(comm_progress, a_blocked_receive_names_its_peer, .timeout = 60)
{
	struct shared s;

	memset(&s, 0, sizeof(s));
	cr_assert_eq(run_threads(2, HOSTS_SAME, blocked_recv, &s), 0);
	memset(&s, 0, sizeof(s));
	cr_assert_eq(run_threads(2, HOSTS_DISTINCT, blocked_recv, &s), 0);
}

/* sendrecv in a ring of 3: the peer is the rank received from. */
static int ring(struct mr_comm *c, void *arg)
{
	struct mr_comm_progress p;
	int me = mr_comm_rank(c), n = mr_comm_size(c);
	int32_t out = me, in = -1;

	(void)arg;
	if (mr_comm_sendrecv(c, &out, &in, 1, MR_COMM_I32, (me + 1) % n, (me + n - 1) % n, 3))
		return -1;
	mr_comm_progress(c, &p);
	return expect(in == (me + n - 1) % n && p.entered_op == MR_COMM_OP_SENDRECV &&
			      p.peer == (me + n - 1) % n && p.completed == 1,
		      "sendrecv #1 from the previous rank", me);
}

Test(comm_progress, sendrecv_names_the_rank_it_receives_from, .timeout = 60)
{
	cr_assert_eq(run_threads(3, HOSTS_SAME, ring, NULL), 0);
}

Test(comm_progress, op_names)
{
	cr_assert_str_eq(mr_comm_op_name(MR_COMM_OP_ALLREDUCE), "allreduce");
	cr_assert_str_eq(mr_comm_op_name(MR_COMM_OP_SENDRECV), "sendrecv");
	cr_assert_str_eq(mr_comm_op_name(99), "?");
	cr_assert(mr_comm_op_is_p2p(MR_COMM_OP_RECV));
	cr_assert(!mr_comm_op_is_p2p(MR_COMM_OP_BROADCAST));
}
