/*
 * host_queue.c - the host communicator's request queue and progress thread
 * (see host_int.h): requests run in issue order; a run of consecutive
 * send/recv requests, also ones enqueued while it runs, is progressed as
 * one batch; small transfers are tried at once by the issuing thread; a
 * waiting thread runs queued work itself instead of sleeping - a batch
 * only until its own request is done, leaving the rest to the next
 * executor. After a
 * failure the communicator is broken and later requests fail with the
 * same code.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host_int.h"
#include "mr_log.h"

#define TRY_MAX (64 << 10)  /* host_start: p2p tried inline up to this size */
#define WAIT_YIELDS 200    /* host_wait: yields before sleeping on the condition */

static int is_p2p(const struct mr__hreq *r)
{
	return r && (r->op->kind == MR__OP_SEND || r->op->kind == MR__OP_RECV);
}

/* Called with mu held by the executor. */
static void mark_broken(struct mr__hcomm *h, int rc)
{
	if (rc < 0 && !h->broken) {
		/* the streams are out of step: tell the peers now, not at their timeout */
		h->broken = rc;
		mr__chan_shutdown(h);
	}
}

static void finish(struct mr__hcomm *h, struct mr__hreq *r, int rc)
{
	mr__op_free(r->op);
	r->op = NULL;
	r->rc = rc;
	r->done = 1;
	mark_broken(h, rc);
}

/*
 * Doubles the batch array. A receive being filled is known to its channel
 * by address (ch->cur): where the array moves, the channel follows it. A
 * batch a waiter left running (h->bxs) can hold one, so this matters each
 * time that batch takes more requests.
 */
static int grow_batch(struct mr__hcomm *h, struct mr__xfer **xs, int *cap)
{
	int nc = *cap * 2;
	struct mr__xfer *g;

	for (int i = 0; i < h->n; i++)
		h->ch[i].cur_idx = h->ch[i].cur ? (long)(h->ch[i].cur - *xs) : -1;
	if (!(g = realloc(*xs, sizeof(**xs) * (size_t)nc)))
		return MR_ENOMEM;
	for (int i = 0; i < h->n; i++)
		if (h->ch[i].cur_idx >= 0)
			h->ch[i].cur = g + h->ch[i].cur_idx;
	*xs = g;
	*cap = nc;
	return 0;
}

/* Appends p2p requests waiting at the head of the queue to the batch. */
static int take_p2p(struct mr__hcomm *h, struct mr__xfer **xs, int nx, int *cap)
{
	pthread_mutex_lock(&h->mu);
	while (is_p2p(h->qhead)) {
		struct mr__hreq *r = h->qhead;
		const struct mr__comm_op *op = r->op;
		size_t esz = mr_comm_dtype_size(op->dtype);

		if (nx == *cap && grow_batch(h, xs, cap) < 0)
			break;
		h->qhead = r->next;
		if (!h->qhead)
			h->qtail = NULL;
		(*xs)[nx++] = (struct mr__xfer){ .peer = op->peer, .send = op->kind == MR__OP_SEND,
						 .tag = op->tag,
						 .buf = op->kind == MR__OP_SEND ? (char *)op->sbuf
										: op->rbuf,
						 .len = op->count * esz, .pos = r->pos0,
						 .red_dtype = -1, .user = r,
						 /* a p2p exchange sends about as much */
						 .stream = 2 * op->count * esz >= h->stream_min };
	}
	pthread_mutex_unlock(&h->mu);
	return nx;
}

/* Completes finished transfers' requests as soon as they are done. */
static int p2p_refill(struct mr__hcomm *h, struct mr__xfer **xs, int nx, int *cap)
{
	int n2;

	pthread_mutex_lock(&h->mu);
	for (int i = 0; i < nx; i++) {
		struct mr__hreq *r = (*xs)[i].user;

		if ((*xs)[i].done && r) {
			/* the waiter may free r at once: forget it here */
			(*xs)[i].user = NULL;
			finish(h, r, 0);
			pthread_cond_broadcast(&h->done_cv);
		}
	}
	pthread_mutex_unlock(&h->mu);
	n2 = take_p2p(h, xs, nx, cap);
	return n2;
}

/* Runs the p2p batch (the one left running, or a new one from the head of
 * the queue) until it is done - or, for a waiter (h->yield_for), until its
 * own request is: the rest stays in h->bxs for the next executor. */
static void run_p2p(struct mr__hcomm *h)
{
	int cap = h->bxs ? h->bcap : 8, nx = h->bxs ? h->bnx : 0, rc;
	struct mr__xfer *xs = h->bxs ? h->bxs : malloc(sizeof(*xs) * (size_t)cap);

	h->bxs = NULL;
	if (!xs)
		return;
	nx = take_p2p(h, &xs, nx, &cap);
	h->deadline = mr__now_ms() + h->base.timeout_ms;
	rc = h->broken ? h->broken : mr__hx_run(h, &xs, &nx, &cap, p2p_refill);
	pthread_mutex_lock(&h->mu);
	if (rc == MR__HX_YIELD) {
		h->bxs = xs;
		h->bnx = nx;
		h->bcap = cap;
		pthread_mutex_unlock(&h->mu);
		return;
	}
	for (int i = 0; i < nx; i++) {
		struct mr__hreq *r = xs[i].user;

		if (r)
			finish(h, r, xs[i].done ? 0 : rc);
	}
	pthread_cond_broadcast(&h->done_cv);
	pthread_mutex_unlock(&h->mu);
	free(xs);
}

/*
 * Runs the operation at the head of the queue (a whole p2p batch if it is
 * a send/recv). Called with mu held, a non-empty queue and !busy, by the
 * progress thread or by a thread waiting for a request (which saves the
 * hand-off); returns with mu held.
 */
static void exec_head(struct mr__hcomm *h)
{
	struct mr__hreq *r;
	int rc;

	h->busy = 1;
	if (h->bxs || is_p2p(h->qhead)) {
		pthread_mutex_unlock(&h->mu);
		run_p2p(h);
		pthread_mutex_lock(&h->mu);
	} else {
		r = h->qhead;
		h->qhead = r->next;
		if (!h->qhead)
			h->qtail = NULL;
		pthread_mutex_unlock(&h->mu);
		h->deadline = mr__now_ms() + h->base.timeout_ms;
		if (atomic_load(&h->aborted))
			rc = MR_EABORTED;
		else
			rc = h->broken ? h->broken : mr__host_exec(h, r->op);
		pthread_mutex_lock(&h->mu);
		finish(h, r, rc);
	}
	h->busy = 0;
	/* free unless a thread sleeps on it: the idle progress thread is
	 * woken only for queued work (a context switch per call) */
	pthread_cond_broadcast(&h->done_cv);
	if (h->qhead || h->bxs)
		pthread_cond_broadcast(&h->cv);
}

void *mr__host_progress_main(void *arg)
{
	struct mr__hcomm *h = arg;

	pthread_mutex_lock(&h->mu);
	for (;;) {
		while (!h->stop && ((!h->qhead && !h->bxs) || h->busy))
			pthread_cond_wait(&h->cv, &h->mu);
		if (h->stop)
			break;
		exec_head(h);
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

/*
 * A small send or receive tried once by the issuing thread (mu held, queue
 * empty, nothing executing): a send that fits the ring or socket buffer
 * and a receive whose message is already here complete without waking the
 * progress thread (small-message latency). 1 = done (mu released).
 */
static int try_now(struct mr__hcomm *h, struct mr__hreq *r)
{
	const struct mr__comm_op *op = r->op;
	struct mr__xfer x = { .peer = op->peer, .send = op->kind == MR__OP_SEND, .tag = op->tag,
			      .buf = op->kind == MR__OP_SEND ? (char *)op->sbuf : op->rbuf,
			      .len = op->count * mr_comm_dtype_size(op->dtype),
			      .red_dtype = -1 };
	int done;

	h->busy = 1;
	pthread_mutex_unlock(&h->mu);
	/* an error is left to the queued run, which reports it */
	done = mr__hx_try(h, &x) == 1;
	pthread_mutex_lock(&h->mu);
	h->busy = 0;
	if (!done) {
		r->pos0 = x.send ? x.pos : 0;
		return 0;
	}
	mr__op_free(r->op);
	r->op = NULL;
	r->done = 1;
	/* work queued meanwhile waited for !busy */
	if (h->qhead) {
		pthread_cond_broadcast(&h->cv);
		pthread_cond_broadcast(&h->done_cv);
	}
	pthread_mutex_unlock(&h->mu);
	return 1;
}

int mr__host_start(struct mr_comm *c, struct mr__comm_op *op, struct mr_comm_req **req)
{
	struct mr__hcomm *h = (struct mr__hcomm *)c;
	struct mr__hreq *r = calloc(1, sizeof(*r));

	if (!r) {
		mr__op_free(op);
		return MR_ENOMEM;
	}
	r->base.comm = c;
	r->op = op;
	*req = &r->base;
	pthread_mutex_lock(&h->mu);
	if (is_p2p(r) && !h->qhead && !h->bxs && !h->busy && !h->stop && !h->broken &&
	    !atomic_load(&h->aborted) && op->count * mr_comm_dtype_size(op->dtype) <= TRY_MAX) {
		if (try_now(h, r))
			return 0;
		/* still first in issue order: nothing ran meanwhile */
		r->next = h->qhead;
		h->qhead = r;
		if (!h->qtail)
			h->qtail = r;
		if (op->kind == MR__OP_RECV) {
			/* a small receive waits where it is (its sender is not
			 * held up): the progress thread is woken only when a
			 * thread waits on or tests it, or a later operation
			 * comes (one wake-up less when it finishes in try_now) */
			pthread_mutex_unlock(&h->mu);
			return 0;
		}
	} else {
		if (h->qtail)
			h->qtail->next = r;
		else
			h->qhead = r;
		h->qtail = r;
	}
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	mr__wake_self(h);
	return 0;
}

/* Blocking collective in the caller's thread: only when nothing is queued
 * or executing, so issue order holds; 1 = not now. */
int mr__host_run_now(struct mr_comm *c, struct mr__comm_op *op)
{
	struct mr__hcomm *h = (struct mr__hcomm *)c;
	int rc;

	pthread_mutex_lock(&h->mu);
	if (h->qhead || h->bxs || h->busy || h->stop) {
		pthread_mutex_unlock(&h->mu);
		return 1;
	}
	h->busy = 1;
	rc = h->broken;
	pthread_mutex_unlock(&h->mu);
	h->deadline = mr__now_ms() + h->base.timeout_ms;
	atomic_fetch_add(&h->waiters, 1);
	if (atomic_load(&h->aborted))
		rc = MR_EABORTED;
	else if (!rc)
		rc = mr__host_exec(h, op);
	atomic_fetch_sub(&h->waiters, 1);
	mr__op_free(op);
	pthread_mutex_lock(&h->mu);
	mark_broken(h, rc);
	h->busy = 0;
	/* only queued work waits for !busy (the progress thread, host_wait
	 * helpers): waking the idle progress thread after every blocking
	 * collective costs a context switch per call (small-message latency) */
	if (h->qhead) {
		pthread_cond_broadcast(&h->cv);
		pthread_cond_broadcast(&h->done_cv);
	}
	pthread_mutex_unlock(&h->mu);
	return rc;
}

int mr__host_test(struct mr_comm_req *req, int *done)
{
	struct mr__hcomm *h = (struct mr__hcomm *)req->comm;
	struct mr__hreq *r = (struct mr__hreq *)req;

	pthread_mutex_lock(&h->mu);
	*done = r->done;
	if (!r->done && (h->qhead || h->bxs) && !h->busy)
		pthread_cond_broadcast(&h->cv); /* a small receive left for its waiter */
	pthread_mutex_unlock(&h->mu);
	return *done ? r->rc : 0;
}

int mr__host_wait(struct mr_comm_req *req)
{
	struct mr__hcomm *h = (struct mr__hcomm *)req->comm;
	struct mr__hreq *r = (struct mr__hreq *)req;
	int rc, spins = 0;

	atomic_fetch_add(&h->waiters, 1);
	pthread_mutex_lock(&h->mu);
	while (!r->done) {
		/* help instead of sleeping: run queued work (in order) ourselves.
		 * A send/recv batch only until our own request is done: a
		 * pipeline posts receives long before it needs them, so the rest
		 * of the batch may wait on what we send next - the next executor
		 * (the progress thread, woken below) goes on with it. */
		if ((h->qhead || h->bxs) && !h->busy && !h->stop) {
			h->yield_for = r;
			exec_head(h);
			h->yield_for = NULL;
			continue;
		}
		if (spins++ < WAIT_YIELDS) {
			/* the progress thread runs it: a wake-up from the condition
			 * variable costs more than a small message (latency), and
			 * yielding lets it run when both share a core */
			pthread_mutex_unlock(&h->mu);
			sched_yield();
			pthread_mutex_lock(&h->mu);
		} else {
			pthread_cond_wait(&h->done_cv, &h->mu);
		}
	}
	rc = r->rc;
	pthread_mutex_unlock(&h->mu);
	atomic_fetch_sub(&h->waiters, 1);
	free(r);
	return rc;
}

void mr__host_kick(struct mr_comm *c)
{
	struct mr__hcomm *h = (struct mr__hcomm *)c;
	static struct mr__hreq one_pass = { .done = 1 }; /* yields after one pass */

	pthread_mutex_lock(&h->mu);
	if ((h->bxs || is_p2p(h->qhead)) && !h->busy && !h->stop) {
		h->yield_for = &one_pass;
		exec_head(h);
		h->yield_for = NULL;
	}
	pthread_mutex_unlock(&h->mu);
}

/* A stream-ordered wait's check (claim_stream_order, tests): an abort
 * from any thread is the failure the device's host wait reports. */
int mr__host_health(struct mr_comm *c)
{
	return atomic_load(&((struct mr__hcomm *)c)->aborted) ? MR_EABORTED : 0;
}

void mr__host_abort(struct mr_comm *c)
{
	struct mr__hcomm *h = (struct mr__hcomm *)c;

	if (atomic_exchange(&h->aborted, 1))
		return;
	/* peers learn at once: their reads see EOF / reset */
	mr__chan_shutdown(h);
	mr__wake_self(h);
	pthread_mutex_lock(&h->mu);
	pthread_cond_broadcast(&h->cv);
	pthread_cond_broadcast(&h->done_cv);
	pthread_mutex_unlock(&h->mu);
}
