/*
 * stage.c - buffers in the other memory (see mr_comm_set_device): a
 * backend that reads host memory (host) gets host stand-ins for device
 * buffers, one that reads device memory (nccl) device stand-ins for host
 * buffers. Before an operation starts, each buffer in the other memory is
 * replaced by a stand-in (the send side copied into it); when the
 * operation has finished (mr_comm_wait, or the blocking form) the receive
 * side is copied back and the stand-ins return to a small per-communicator
 * pool: MR__STAGE_CACHE buffers in power-of-two sizes (at least 4 KiB),
 * the largest kept when it is full, so a step's mix of message sizes
 * allocates in its first step and not again (mr_comm_stage_allocs
 * counts): no malloc/mmap, no cudaMalloc, per operation.
 *
 * The buffers an operation reads and writes follow its kind (counts in
 * elements of its dtype): allreduce count/count, reduce-scatter
 * size*count/count, allgather(v) and alltoall(v) their counts and
 * displacements, broadcast count in place, send/recv count.
 *
 * Threading: a staged operation is started and waited by one thread at a
 * time per communicator (the rank's), so the cache takes no lock.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm_int.h"

struct mr__stage {
	void *sp, *rp;         /* stand-ins (rp == sp in place), or NULL */
	size_t scap, rcap;     /* their sizes */
	size_t rbytes;
	void *rorig;           /* the caller's receive buffer, or NULL */
};

/* Stand-ins are device memory when the backend reads device memory. */
static int dev_standins(const struct mr_comm *c)
{
	return c->ops->device_memory;
}

/* The pool's size class of a request: a power of two, at least 4 KiB. */
static size_t size_class(size_t bytes)
{
	size_t cap = 4096;

	while (cap < bytes && cap <= SIZE_MAX / 2)
		cap <<= 1;
	return cap < bytes ? bytes : cap;
}

static void *take(struct mr_comm *c, size_t bytes, size_t *cap)
{
	const struct mr_comm_device *d = c->dev;
	int best = -1;
	void *p;

	for (int i = 0; i < MR__STAGE_CACHE; i++)
		if (c->stage_cache[i].p && c->stage_cache[i].cap >= bytes &&
		    (best < 0 || c->stage_cache[i].cap < c->stage_cache[best].cap))
			best = i;
	if (best >= 0) {
		p = c->stage_cache[best].p;
		*cap = c->stage_cache[best].cap;
		c->stage_cache[best].p = NULL;
		return p;
	}
	*cap = size_class(bytes);
	p = dev_standins(c) ? d->alloc(d->ctx, *cap) : malloc(*cap);
	if (p)
		c->stage_allocs++;
	return p;
}

static void drop(struct mr_comm *c, void *p, size_t cap)
{
	if (dev_standins(c))
		c->dev->free(c->dev->ctx, p, cap);
	else
		free(p);
}

/* Back to the pool; a full pool keeps its largest buffers. */
static void give(struct mr_comm *c, void *p, size_t cap)
{
	int small = 0;

	if (!p)
		return;
	for (int i = 0; i < MR__STAGE_CACHE; i++) {
		if (!c->stage_cache[i].p) {
			c->stage_cache[i].p = p;
			c->stage_cache[i].cap = cap;
			return;
		}
		if (c->stage_cache[i].cap < c->stage_cache[small].cap)
			small = i;
	}
	if (c->stage_cache[small].cap < cap) {
		drop(c, c->stage_cache[small].p, c->stage_cache[small].cap);
		c->stage_cache[small].p = p;
		c->stage_cache[small].cap = cap;
		return;
	}
	drop(c, p, cap);
}

void mr__stage_release(struct mr_comm *c)
{
	for (int i = 0; i < MR__STAGE_CACHE; i++) {
		if (c->stage_cache[i].p)
			drop(c, c->stage_cache[i].p, c->stage_cache[i].cap);
		c->stage_cache[i].p = NULL;
	}
}

/* Copies between a caller's buffer and its stand-in. */
static int to_standin(struct mr_comm *c, void *standin, const void *orig, size_t bytes)
{
	const struct mr_comm_device *d = c->dev;

	return dev_standins(c) ? d->upload(d->ctx, standin, orig, bytes)
			       : d->download(d->ctx, standin, orig, bytes);
}

static int from_standin(struct mr_comm *c, void *orig, const void *standin, size_t bytes)
{
	const struct mr_comm_device *d = c->dev;

	return dev_standins(c) ? d->download(d->ctx, orig, standin, bytes)
			       : d->upload(d->ctx, orig, standin, bytes);
}

/* Whether p is in the memory the backend does not read. */
static int foreign(const struct mr_comm *c, const void *p)
{
	return p && (c->dev->is_device(c->dev->ctx, p) ? 1 : 0) != dev_standins(c);
}

static size_t span(const size_t *counts, const size_t *displs, int n)
{
	size_t end = 0;

	for (int i = 0; i < n; i++)
		if (counts[i] && displs[i] + counts[i] > end)
			end = displs[i] + counts[i];
	return end;
}

/* Elements op reads from sbuf and writes to rbuf. */
static void extents(const struct mr_comm *c, const struct mr__comm_op *op, size_t *s, size_t *r)
{
	*s = *r = 0;
	switch (op->kind) {
	case MR__OP_ALLREDUCE:
	case MR__OP_BROADCAST:
	case MR__OP_SENDRECV:
		*s = *r = op->count;
		break;
	case MR__OP_REDUCE_SCATTER:
		*s = op->count * (size_t)c->size;
		*r = op->count;
		break;
	case MR__OP_ALLGATHERV:
		*s = op->rcounts[c->rank];
		*r = span(op->rcounts, op->rdispls, c->size);
		break;
	case MR__OP_ALLTOALLV:
		*s = span(op->scounts, op->sdispls, c->size);
		*r = span(op->rcounts, op->rdispls, c->size);
		break;
	case MR__OP_SEND:
		*s = op->count;
		break;
	case MR__OP_RECV:
		*r = op->count;
		break;
	default:
		break;
	}
}

int mr__stage_in(struct mr_comm *c, struct mr__comm_op *op, struct mr__stage **out)
{
	struct mr__stage st = { 0 };
	const void *sorig = op->sbuf;
	size_t esz = mr_comm_dtype_size(op->dtype), s, r, sbytes;
	int sf, rf, rc = MR_ENOMEM;

	*out = NULL;
	extents(c, op, &s, &r);
	sf = s && foreign(c, op->sbuf);
	rf = r && foreign(c, op->rbuf);
	if (!sf && !rf)
		return 0;
	sbytes = s * esz;
	st.rbytes = r * esz;
	if (sf) {
		if (!(st.sp = take(c, sbytes, &st.scap)))
			goto fail;
		if ((rc = to_standin(c, st.sp, sorig, sbytes)) < 0)
			goto fail;
		op->sbuf = st.sp;
	}
	if (rf) {
		st.rorig = op->rbuf;
		if (sf && op->rbuf == sorig) { /* in place */
			st.rp = st.sp;
			st.rcap = st.scap;
		} else if (!(st.rp = take(c, st.rbytes, &st.rcap))) {
			rc = MR_ENOMEM;
			goto fail;
		}
		op->rbuf = st.rp;
	}
	if (!(*out = malloc(sizeof(st)))) {
		rc = MR_ENOMEM;
		goto fail;
	}
	**out = st;
	return 0;
fail:
	op->sbuf = sorig;
	if (st.rorig)
		op->rbuf = st.rorig;
	if (st.rp && st.rp != st.sp)
		give(c, st.rp, st.rcap);
	give(c, st.sp, st.scap);
	return rc;
}

int mr__stage_out(struct mr_comm *c, struct mr__stage *st, int rc)
{
	if (!st)
		return rc;
	if (rc == 0 && st->rorig)
		rc = from_standin(c, st->rorig, st->rp, st->rbytes);
	if (st->rp != st->sp)
		give(c, st->rp, st->rcap);
	give(c, st->sp, st->scap);
	free(st);
	return rc;
}
