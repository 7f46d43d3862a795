/*
 * nccl.c - the NCCL communicator backend (built only when CUDA and nccl.h
 * are found; see the Makefile's MR_HAVE_NCCL).
 *
 * One ncclComm per communicator, created with ncclCommInitRankConfig in
 * non-blocking mode: group rank 0 makes the unique id and puts it under
 * comm/<id>/nccl in the bootstrap KV, the others wait for it. Splits make
 * a fresh communicator the same way (no ncclCommSplit, so any list of
 * ranks works without the parent's participation). Operations run on
 * the communicator's own CUDA stream; a request is a CUDA event recorded
 * after the operation. test/wait poll the event and
 * ncclCommGetAsyncError; on timeout or abort the communicator is
 * ncclCommAbort-ed by the thread that notices and every later operation
 * fails with the same code.
 *
 * Buffers are device pointers. Tags of send/recv are ignored (NCCL has
 * none): messages between a pair match in issue order. mr_comm_group_start/
 * end wrap ncclGroupStart/End; the requests started inside record their
 * events after ncclGroupEnd, when the group is on the stream. allgatherv with
 * unequal counts is a group of broadcasts; all-to-all(v) and send/recv are
 * ncclGroupStart/End of ncclSend/ncclRecv, and so is sendrecv.
 *
 * Each operation first makes the communicator's stream wait (an event,
 * not the host) for what the device's compute stream holds
 * (mr_comm_device.stream): the kernels that wrote its buffers and the
 * zeroing of a freshly allocated one. On a device with a stream and
 * stream-ordered waits the communicator is stream-ordered
 * (mr_comm_stream_ordered): waiting for an operation on device buffers
 * hands its event to the device (detach), whose compute stream waits on
 * it; the device keeps the wait's deadline and checks it, with
 * ncclCommGetAsyncError and the abort flag (health), whenever its host
 * waits for the stream, calling ncclCommAbort (fail) so NCCL's kernels
 * return and the stream drains instead of hanging.
 *
 * Non-goals: CUDA graphs, user streams.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_int.h"
#include "plugin/cuda_entry.h"

#define GROUP_MAX 16 /* send/recv in one mr_comm_group_start/end */

struct ncomm {
	struct mr_comm base;
	ncclComm_t nc;
	cudaStream_t stream;
	cudaEvent_t ready;        /* recorded on the compute stream, waited on ours */
	const struct mr_kv *kv;
	_Atomic int aborted;
	int broken;
	int dead;                 /* ncclCommAbort done */
	void *one;                /* device int for barrier */
	int grouped;              /* inside mr_comm_group_start/end */
	struct nreq *grp[GROUP_MAX]; /* its requests: their events wait for the end */
	int ngrp;
};

struct nreq {
	struct mr_comm_req base;
	cudaEvent_t ev;
	long long deadline;
};

static const struct mr__comm_ops nccl_ops;

static ncclDataType_t ndt(int dt)
{
	switch (dt) {
	case MR_COMM_BF16: return ncclBfloat16;
	case MR_COMM_I32: return ncclInt32;
	case MR_COMM_I64: return ncclInt64;
	default: return ncclFloat32;
	}
}

static ncclRedOp_t nop(int op)
{
	return op == MR_COMM_MAX ? ncclMax : op == MR_COMM_AVG ? ncclAvg : ncclSum;
}

static void sleep_us(long us)
{
	struct timespec ts = { 0, us * 1000 };

	nanosleep(&ts, NULL);
}

static void kill_comm(struct ncomm *n, int rc)
{
	if (!n->broken)
		n->broken = rc;
	if (!n->dead && n->nc) {
		ncclCommAbort(n->nc);
		n->dead = 1;
	}
}

/* Waits for a non-blocking NCCL call on the communicator to settle. */
static int settle(struct ncomm *n, ncclResult_t r, long long deadline)
{
	ncclResult_t st = r;

	while (st == ncclInProgress) {
		if (atomic_load(&n->aborted))
			return MR_EABORTED;
		if (mr__now_ms() > deadline)
			return MR_ETIMEDOUT;
		sleep_us(200);
		if (ncclCommGetAsyncError(n->nc, &st) != ncclSuccess)
			return MR_EPEER;
	}
	return st == ncclSuccess ? 0 : MR_EPEER;
}

static int nccl_create(struct ncomm **out, const struct mr_comm *tmpl, const char *id, int me,
		       int size, const struct mr_kv *kv, struct mr_errbuf *eb)
{
	struct ncomm *n = calloc(1, sizeof(*n));
	ncclConfig_t conf = NCCL_CONFIG_INITIALIZER;
	ncclUniqueId uid;
	long long deadline = mr__now_ms() + tmpl->timeout_ms;
	char key[160];
	size_t len = 0;
	int rc = 0, ndev = 0;

	*out = NULL;
	if (!n)
		return MR_ENOMEM;
	n->base = *tmpl;
	n->base.ops = &nccl_ops;
	n->base.rank = me;
	n->base.size = size;
	snprintf(n->base.id, sizeof(n->base.id), "%s", id);
	n->kv = kv;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
		rc = mr_errf(eb, MR_ENOTSUP, "no cuda device for backend 'nccl'");
		goto fail;
	}
	if (cudaSetDevice(tmpl->device) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking) != cudaSuccess ||
	    cudaEventCreateWithFlags(&n->ready, cudaEventDisableTiming) != cudaSuccess ||
	    cudaMalloc(&n->one, sizeof(int)) != cudaSuccess) {
		rc = mr_errf(eb, MR_ESYS, "unable to set up cuda device %d", tmpl->device);
		goto fail;
	}
	snprintf(key, sizeof(key), "comm/%s/nccl", id);
	if (me == 0) {
		if (ncclGetUniqueId(&uid) != ncclSuccess) {
			rc = mr_errf(eb, MR_ESYS, "ncclGetUniqueId failed");
			goto fail;
		}
		rc = mr_kv_put(kv, key, &uid, sizeof(uid));
	} else {
		rc = mr_kv_get(kv, key, &uid, sizeof(uid), &len, tmpl->timeout_ms);
		if (rc == 0 && len != sizeof(uid))
			rc = MR_EPROTO;
	}
	if (rc < 0) {
		mr_errf(eb, rc, "unable to exchange nccl id '%s'", key);
		goto fail;
	}
	conf.blocking = 0;
	rc = settle(n, ncclCommInitRankConfig(&n->nc, size, uid, me, &conf), deadline);
	if (rc < 0) {
		mr_errf(eb, rc, "ncclCommInitRank of '%s' failed", id);
		goto fail;
	}
	*out = n;
	return 0;
fail:
	kill_comm(n, rc);
	if (n->ready)
		cudaEventDestroy(n->ready);
	if (n->stream)
		cudaStreamDestroy(n->stream);
	if (n->one)
		cudaFree(n->one);
	free(n);
	return rc;
}

int mr__nccl_init(struct mr_comm **out, const struct mr_comm_config *cfg,
		  const struct mr_kv *kv, struct mr_errbuf *eb)
{
	struct mr_comm t = { 0 };
	struct ncomm *n;
	int rc;

	t.timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 60000;
	t.device = cfg->device;
	rc = nccl_create(&n, &t, cfg->id, cfg->rank, cfg->world_size, kv, eb);
	if (rc < 0)
		return rc;
	*out = &n->base;
	return 0;
}

static int nccl_split(struct mr_comm *c, const char *id, int me, int size, struct mr_comm **out,
		      struct mr_errbuf *eb)
{
	struct ncomm *n = (struct ncomm *)c, *s;
	int rc = nccl_create(&s, c, id, me, size, n->kv, eb);

	if (rc < 0)
		return rc;
	*out = &s->base;
	return 0;
}

/* Ends a group opened for one operation: the first failure of its calls,
 * else ncclGroupEnd's own result (ncclInProgress on a non-blocking
 * communicator while the group is still being enqueued). */
static ncclResult_t group_end(ncclResult_t calls)
{
	ncclResult_t r = ncclGroupEnd();

	return calls != ncclSuccess ? calls : r;
}

static ncclResult_t enqueue(struct ncomm *n, const struct mr__comm_op *op)
{
	size_t esz = mr_comm_dtype_size(op->dtype);
	ncclDataType_t dt = ndt(op->dtype);
	int size = n->base.size, equal = 1;
	ncclResult_t r = ncclSuccess;

	switch (op->kind) {
	case MR__OP_ALLREDUCE:
		return ncclAllReduce(op->sbuf, op->rbuf, op->count, dt, nop(op->redop), n->nc,
				     n->stream);
	case MR__OP_REDUCE_SCATTER:
		return ncclReduceScatter(op->sbuf, op->rbuf, op->count, dt, nop(op->redop), n->nc,
					 n->stream);
	case MR__OP_ALLGATHERV:
		for (int i = 0; i < size; i++)
			equal &= op->rcounts[i] == op->rcounts[0] &&
				 op->rdispls[i] == op->rcounts[0] * (size_t)i;
		if (equal)
			return ncclAllGather(op->sbuf, op->rbuf, op->rcounts[0], dt, n->nc, n->stream);
		ncclGroupStart();
		for (int i = 0; i < size && r == ncclSuccess; i++)
			r = ncclBroadcast(i == n->base.rank ? op->sbuf
							   : (char *)op->rbuf + op->rdispls[i] * esz,
					  (char *)op->rbuf + op->rdispls[i] * esz, op->rcounts[i], dt,
					  i, n->nc, n->stream);
		return group_end(r);
	case MR__OP_ALLTOALLV:
		ncclGroupStart();
		for (int i = 0; i < size && r == ncclSuccess; i++) {
			r = ncclSend((const char *)op->sbuf + op->sdispls[i] * esz, op->scounts[i], dt,
				     i, n->nc, n->stream);
			if (r == ncclSuccess)
				r = ncclRecv((char *)op->rbuf + op->rdispls[i] * esz, op->rcounts[i], dt,
					     i, n->nc, n->stream);
		}
		return group_end(r);
	case MR__OP_BROADCAST:
		return ncclBroadcast(op->rbuf, op->rbuf, op->count, dt, op->peer, n->nc, n->stream);
	case MR__OP_SEND:
		return ncclSend(op->sbuf, op->count, dt, op->peer, n->nc, n->stream);
	case MR__OP_RECV:
		return ncclRecv(op->rbuf, op->count, dt, op->peer, n->nc, n->stream);
	case MR__OP_SENDRECV:
		ncclGroupStart();
		r = ncclSend(op->sbuf, op->count, dt, op->peer, n->nc, n->stream);
		if (r == ncclSuccess)
			r = ncclRecv(op->rbuf, op->count, dt, op->src, n->nc, n->stream);
		return group_end(r);
	case MR__OP_BARRIER:
		return ncclAllReduce(n->one, n->one, 1, ncclInt32, ncclSum, n->nc, n->stream);
	default:
		return ncclInvalidArgument;
	}
}

/* Orders our stream after the device's compute stream (if the comm has a
 * device that names one). */
static int after_compute(struct ncomm *n)
{
	const struct mr_comm_device *d = n->base.dev;
	cudaStream_t compute = d && d->stream ? (cudaStream_t)d->stream(d->ctx) : NULL;

	if (!compute)
		return 0;
	if (cudaEventRecord(n->ready, compute) != cudaSuccess ||
	    cudaStreamWaitEvent(n->stream, n->ready, 0) != cudaSuccess)
		return MR_ESYS;
	return 0;
}

static int nccl_start(struct mr_comm *c, struct mr__comm_op *op, struct mr_comm_req **req)
{
	struct ncomm *n = (struct ncomm *)c;
	struct nreq *r = calloc(1, sizeof(*r));
	ncclResult_t nr;
	int rc = 0;

	if (!r) {
		rc = MR_ENOMEM;
		goto out;
	}
	r->base.comm = c;
	r->deadline = mr__now_ms() + c->timeout_ms;
	if (atomic_load(&n->aborted))
		kill_comm(n, MR_EABORTED);
	if (n->broken) {
		rc = n->broken;
		goto out;
	}
	if (n->grouped && n->ngrp == GROUP_MAX) {
		rc = MR_ELIMIT;
		goto out;
	}
	/* whatever the compute stream holds before this operation - the
	 * kernels that wrote its send buffer, the zeroing of a fresh receive
	 * buffer - runs first: an event, not a host wait */
	if ((rc = after_compute(n)) < 0)
		goto out;
	nr = enqueue(n, op);
	/* a non-blocking communicator may still be enqueueing: the event must
	 * go on the stream behind the operation, not before it */
	if (nr == ncclInProgress && !n->grouped)
		rc = settle(n, nr, r->deadline);
	else if (nr != ncclSuccess && nr != ncclInProgress)
		rc = MR_EPEER;
	if (rc < 0) {
		kill_comm(n, rc);
		goto out;
	}
	if (cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming) != cudaSuccess ||
	    (!n->grouped && cudaEventRecord(r->ev, n->stream) != cudaSuccess)) {
		rc = MR_ESYS;
		goto out;
	}
	/* inside a group nothing is on the stream before ncclGroupEnd */
	if (n->grouped)
		n->grp[n->ngrp++] = r;
	*req = &r->base;
	r = NULL;
out:
	mr__op_free(op);
	if (r) {
		if (r->ev)
			cudaEventDestroy(r->ev);
		free(r);
	}
	return rc;
}

/* 0 while the communicator is sound; else its error (an abort from
 * another thread, a peer's failure seen by NCCL), after ncclCommAbort. */
static int nccl_health(struct mr_comm *c)
{
	struct ncomm *n = (struct ncomm *)c;
	ncclResult_t st = ncclSuccess;

	if (n->broken)
		return n->broken;
	if (atomic_load(&n->aborted)) {
		kill_comm(n, MR_EABORTED);
		return MR_EABORTED;
	}
	if (ncclCommGetAsyncError(n->nc, &st) != ncclSuccess ||
	    (st != ncclSuccess && st != ncclInProgress)) {
		kill_comm(n, MR_EPEER);
		return MR_EPEER;
	}
	return 0;
}

/* A stream-ordered wait's abort (a deadline the device saw pass). */
static void nccl_fail(struct mr_comm *c, int rc)
{
	kill_comm((struct ncomm *)c, rc);
}

static int nccl_test(struct mr_comm_req *req, int *done)
{
	struct ncomm *n = (struct ncomm *)req->comm;
	struct nreq *r = (struct nreq *)req;
	cudaError_t e;
	int rc;

	*done = 1;
	if ((rc = nccl_health(req->comm)) < 0)
		return rc;
	e = cudaEventQuery(r->ev);
	if (e == cudaSuccess)
		return 0;
	if (e != cudaErrorNotReady) {
		kill_comm(n, MR_ESYS);
		return MR_ESYS;
	}
	if (mr__now_ms() > r->deadline) {
		kill_comm(n, MR_ETIMEDOUT);
		return MR_ETIMEDOUT;
	}
	*done = 0;
	return 0;
}

static int nccl_wait(struct mr_comm_req *req)
{
	struct nreq *r = (struct nreq *)req;
	int done = 0, rc;

	while (!(rc = nccl_test(req, &done), done))
		sleep_us(50);
	cudaEventDestroy(r->ev);
	free(r);
	return rc;
}

/* The backend's half of a stream-ordered wait (comm.c): the compute
 * stream will wait on the request's event, so the device takes it over
 * (it destroys it once the stream has passed it); the request is freed.
 * Inside a group the event is not on the stream yet: not allowed. */
static int nccl_detach(struct mr_comm_req *req, void **ev, long long *deadline_ms)
{
	struct ncomm *n = (struct ncomm *)req->comm;
	struct nreq *r = (struct nreq *)req;
	int rc = n->grouped ? MR_ESTATE : nccl_health(req->comm);

	*ev = NULL;
	*deadline_ms = r->deadline;
	if (rc < 0)
		cudaEventDestroy(r->ev);
	else
		*ev = r->ev;
	free(r);
	return rc;
}

static void nccl_abort(struct mr_comm *c)
{
	/* the thread that next touches the communicator calls ncclCommAbort */
	atomic_store(&((struct ncomm *)c)->aborted, 1);
}

static void nccl_free(struct mr_comm *c)
{
	struct ncomm *n = (struct ncomm *)c;

	if (!n->dead && n->nc) {
		if (n->broken || atomic_load(&n->aborted))
			ncclCommAbort(n->nc);
		else
			ncclCommDestroy(n->nc);
	}
	if (n->ready)
		cudaEventDestroy(n->ready);
	if (n->stream)
		cudaStreamDestroy(n->stream);
	if (n->one)
		cudaFree(n->one);
	free(n);
}

static int nccl_group_start(struct mr_comm *c)
{
	struct ncomm *n = (struct ncomm *)c;

	if (n->grouped)
		return MR_ESTATE;
	if (ncclGroupStart() != ncclSuccess)
		return MR_EPEER;
	n->grouped = 1;
	n->ngrp = 0;
	return 0;
}

/* Launches the group, then records each request's event behind it. */
static int nccl_group_end(struct mr_comm *c)
{
	struct ncomm *n = (struct ncomm *)c;
	ncclResult_t nr;
	int i, rc = 0;

	if (!n->grouped)
		return MR_ESTATE;
	n->grouped = 0;
	nr = ncclGroupEnd();
	rc = nr == ncclInProgress ? settle(n, nr, mr__now_ms() + c->timeout_ms)
	     : nr == ncclSuccess ? 0 : MR_EPEER;
	if (rc < 0)
		kill_comm(n, rc);
	for (i = 0; i < n->ngrp; i++)
		if (cudaEventRecord(n->grp[i]->ev, n->stream) != cudaSuccess && rc == 0)
			rc = MR_ESYS;
	n->ngrp = 0;
	return rc;
}

static const struct mr__comm_ops nccl_ops = {
	.name = "nccl",
	.device_memory = 1,
	.split = nccl_split,
	.start = nccl_start,
	.test = nccl_test,
	.wait = nccl_wait,
	.abort = nccl_abort,
	.free = nccl_free,
	.group_start = nccl_group_start,
	.group_end = nccl_group_end,
	.detach = nccl_detach,
	.health = nccl_health,
	.fail = nccl_fail,
};
