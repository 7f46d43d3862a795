/*
 * comm.c - communicator front end: argument checks, backend dispatch,
 * blocking wrappers, waits (on the host, or stream-ordered on the device:
 * mr_comm_stream_ordered), progress (entered / completed operation, time
 * blocked) and the host id.
 *
 * Non-goals: moving bytes (host_*.c, nccl.c do that).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm_int.h"
#include "plugin/cuda_entry.h"

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

long long mr__now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t mr__hash(const void *p, size_t n, uint64_t h)
{
	const unsigned char *b = p;

	if (!h)
		h = 1469598103934665603ULL;
	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ULL;
	}
	return h;
}

size_t mr_comm_dtype_size(int dtype)
{
	switch (dtype) {
	case MR_COMM_F32: return 4;
	case MR_COMM_BF16: return 2;
	case MR_COMM_I32: return 4;
	case MR_COMM_I64: return 8;
	default: return 0;
	}
}

static int read_line(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	int rc = MR_EIO;

	if (!f)
		return MR_EIO;
	if (fgets(buf, (int)cap, f)) {
		buf[strcspn(buf, "\n")] = 0;
		rc = 0;
	}
	fclose(f);
	return rc;
}

int mr_comm_host_id(char *buf, size_t cap)
{
	char boot[64], ns[64];
	ssize_t n;
	int w;

	if (read_line("/proc/sys/kernel/random/boot_id", boot, sizeof(boot)) < 0)
		return MR_EIO;
	n = readlink("/proc/self/ns/ipc", ns, sizeof(ns) - 1);
	if (n < 0)
		return MR_EIO;
	ns[n] = 0;
	w = snprintf(buf, cap, "%s/%s", boot, ns);
	return (w < 0 || (size_t)w >= cap) ? MR_ERANGE : 0;
}

/* ---- progress ---- */

static int public_op(int kind)
{
	switch (kind) {
	case MR__OP_ALLREDUCE: return MR_COMM_OP_ALLREDUCE;
	case MR__OP_REDUCE_SCATTER: return MR_COMM_OP_REDUCE_SCATTER;
	case MR__OP_ALLGATHERV: return MR_COMM_OP_ALLGATHER;
	case MR__OP_ALLTOALLV: return MR_COMM_OP_ALLTOALL;
	case MR__OP_BROADCAST: return MR_COMM_OP_BROADCAST;
	case MR__OP_SEND: return MR_COMM_OP_SEND;
	case MR__OP_RECV: return MR_COMM_OP_RECV;
	case MR__OP_SENDRECV: return MR_COMM_OP_SENDRECV;
	case MR__OP_BARRIER: return MR_COMM_OP_BARRIER;
	default: return MR_COMM_OP_NONE;
	}
}

struct mr__split_seen {
	uint64_t list; /* hash of the ranks list */
	unsigned n;    /* unnamed splits of it so far */
};

/*
 * The KV namespace of a split, the same on every member and for both
 * backends: "<name or g>.<hash>" of the parent's id, the ranks list, the
 * name, and for an unnamed split how many unnamed splits of the same list
 * this communicator made before (so splitting one list twice gives two
 * communicators).
 */
static int split_id(struct mr_comm *c, const int *ranks, int n, const char *name, char *id,
		    size_t cap)
{
	uint64_t lh = mr__hash(ranks, sizeof(int) * (size_t)n, 0), full;
	unsigned k = 0, i;

	if (!name) {
		for (i = 0; i < c->nsplits && c->splits[i].list != lh; i++)
			;
		if (i == c->nsplits) {
			if (c->nsplits == c->capsplits) {
				unsigned ncap = c->capsplits ? 2 * c->capsplits : 8;
				void *p = realloc(c->splits, ncap * sizeof(*c->splits));
				if (!p)
					return MR_ENOMEM;
				c->splits = p;
				c->capsplits = ncap;
			}
			c->splits[c->nsplits++] = (struct mr__split_seen){ lh, 0 };
		}
		k = c->splits[i].n++;
	}
	full = mr__hash(c->id, strlen(c->id), lh);
	full = mr__hash(&k, sizeof(k), full);
	if (name)
		full = mr__hash(name, strlen(name), full);
	snprintf(id, cap, "%.40s.%016llx", name ? name : "g", (unsigned long long)full);
	return 0;
}

/* A new communicator starts with no operation and no split (a backend may
 * have copied its parent's along with the rest of the template). */
static void progress_reset(struct mr_comm *c)
{
	c->splits = NULL;
	c->nsplits = c->capsplits = 0;
	memset(c->stage_cache, 0, sizeof(c->stage_cache));
	c->stage_allocs = 0;
	atomic_store_explicit(&c->entered, 0, memory_order_relaxed);
	atomic_store_explicit(&c->completed, 0, memory_order_relaxed);
	atomic_store_explicit(&c->peer, -1, memory_order_relaxed);
	for (int k = 0; k < MR_COMM_OP__COUNT; k++)
		atomic_store_explicit(&c->wait_ns[k], 0, memory_order_relaxed);
}

/* The next operation's tag (number << 8 | kind), recorded as entered.
 * One thread issues a communicator's operations, so load + store is
 * enough: no read-modify-write on the hot path. */
static uint64_t progress_enter(struct mr_comm *c, int kind, int peer)
{
	uint64_t seq = (atomic_load_explicit(&c->entered, memory_order_relaxed) >> 8) + 1;
	uint64_t tag = seq << 8 | (uint64_t)public_op(kind);

	atomic_store_explicit(&c->peer, peer, memory_order_relaxed);
	atomic_store_explicit(&c->entered, tag, memory_order_release);
	return tag;
}

/* Operations of one communicator finish in issue order: the highest tag
 * seen finished is the last completed one. */
static void progress_done(struct mr_comm *c, uint64_t tag)
{
	if (tag > atomic_load_explicit(&c->completed, memory_order_relaxed))
		atomic_store_explicit(&c->completed, tag, memory_order_release);
}

/* Time blocked on the operation tagged tag, under its kind. */
static void progress_wait(struct mr_comm *c, uint64_t t0, uint64_t tag)
{
	_Atomic uint64_t *w = &c->wait_ns[(tag & 0xff) % MR_COMM_OP__COUNT];

	atomic_store_explicit(w, atomic_load_explicit(w, memory_order_relaxed) + (now_ns() - t0),
			      memory_order_relaxed);
}

void mr_comm_progress(const struct mr_comm *c, struct mr_comm_progress *p)
{
	uint64_t e = atomic_load_explicit(&c->entered, memory_order_acquire);
	uint64_t d = atomic_load_explicit(&c->completed, memory_order_acquire);

	p->entered = e >> 8;
	p->entered_op = (int)(e & 0xff);
	p->completed = d >> 8;
	p->completed_op = (int)(d & 0xff);
	p->peer = mr_comm_op_is_p2p(p->entered_op)
			  ? atomic_load_explicit(&c->peer, memory_order_relaxed)
			  : -1;
	p->wait_s = 0.0;
	for (int k = 0; k < MR_COMM_OP__COUNT; k++) {
		p->wait_op_s[k] =
			(double)atomic_load_explicit(&c->wait_ns[k], memory_order_relaxed) * 1e-9;
		p->wait_s += p->wait_op_s[k];
	}
}

/* NCCL lives in the CUDA side (plugin/cuda_entry.h), loaded on first use. */
static int nccl_init(struct mr_comm **out, const struct mr_comm_config *cfg, struct mr_errbuf *eb)
{
	struct mr_errbuf why = { { 0 }, { 0 } };
	const struct mr__cuda_entry *e = mr__cuda_entry(&why);

	*out = NULL;
	if (!e || !e->nccl_init)
		return mr_errf_field(eb, MR_ENOTSUP, "backend", "backend 'nccl' not built in%s%s",
				     why.msg[0] ? ": " : "", why.msg);
	return e->nccl_init(out, cfg, cfg->kv, eb);
}

int mr_comm_init(struct mr_comm **out, const struct mr_comm_config *cfg,
		 struct mr_errbuf *eb)
{
	const char *be = cfg->backend ? cfg->backend : "host";
	int rc;

	*out = NULL;
	if (cfg->world_size < 1 || cfg->rank < 0 || cfg->rank >= cfg->world_size)
		return mr_errf_field(eb, MR_EINVAL, "rank", "rank %d out of world %d",
				     cfg->rank, cfg->world_size);
	if (!cfg->id || !*cfg->id || strlen(cfg->id) > 64)
		return mr_errf_field(eb, MR_EINVAL, "id", "communicator id missing or too long");
	if (!cfg->kv && cfg->world_size > 1)
		return mr_errf_field(eb, MR_EINVAL, "kv", "bootstrap kv missing");
	if (!strcmp(be, "host"))
		rc = mr__host_init(out, cfg, cfg->kv, eb);
	else if (!strcmp(be, "nccl"))
		rc = nccl_init(out, cfg, eb);
	else
		return mr_errf_field(eb, MR_EINVAL, "backend", "unknown backend '%s'", be);
	if (rc == 0)
		progress_reset(*out);
	return rc;
}

int mr_comm_split(struct mr_comm *c, const int *ranks, int n, const char *name,
		  struct mr_comm **out, struct mr_errbuf *eb)
{
	char id[MR_COMM_ID_MAX];
	int me = -1, rc;

	*out = NULL;
	if (n < 1 || n > c->size)
		return mr_errf(eb, MR_EINVAL, "group size %d out of range", n);
	for (int i = 0; i < n; i++) {
		if (ranks[i] < 0 || ranks[i] >= c->size)
			return mr_errf(eb, MR_EINVAL, "group rank %d out of range", ranks[i]);
		for (int j = 0; j < i; j++)
			if (ranks[j] == ranks[i])
				return mr_errf(eb, MR_EINVAL, "group rank %d repeated", ranks[i]);
		if (ranks[i] == c->rank)
			me = i;
	}
	if (me < 0)
		return mr_errf(eb, MR_EINVAL, "rank %d is not in the group", c->rank);
	if (name && strlen(name) > 24)
		return mr_errf(eb, MR_EINVAL, "group name '%s' too long", name);
	if (split_id(c, ranks, n, name, id, sizeof(id)) < 0)
		return mr_errf(eb, MR_ENOMEM, "unable to split a communicator: out of memory");
	rc = c->ops->split(c, id, me, n, out, eb);
	if (rc == 0)
		progress_reset(*out);
	return rc;
}

int mr_comm_rank(const struct mr_comm *c) { return c->rank; }
int mr_comm_size(const struct mr_comm *c) { return c->size; }
const char *mr_comm_backend(const struct mr_comm *c) { return c->ops->name; }
uint64_t mr_comm_stage_allocs(const struct mr_comm *c) { return c->stage_allocs; }
void mr_comm_set_timeout(struct mr_comm *c, long ms) { c->timeout_ms = ms > 0 ? ms : 60000; }
void mr_comm_set_device(struct mr_comm *c, const struct mr_comm_device *d) { c->dev = d; }
void mr_comm_abort(struct mr_comm *c) { if (c) c->ops->abort(c); }

int mr_comm_group_start(struct mr_comm *c)
{
	return c->ops->group_start ? c->ops->group_start(c) : 0;
}

int mr_comm_group_end(struct mr_comm *c)
{
	return c->ops->group_end ? c->ops->group_end(c) : 0;
}

void mr_comm_kick(struct mr_comm *c)
{
	if (c->ops->kick)
		c->ops->kick(c);
}

int mr_comm_p2p_in_order(const struct mr_comm *c)
{
	return c->ops->group_start != NULL;
}

void mr_comm_free(struct mr_comm *c)
{
	if (!c)
		return;
	if (c->fenced && c->dev) /* the device's fences of c go first */
		c->dev->stream_forget(c->dev->ctx, c);
	free(c->splits);
	mr__stage_release(c);
	c->ops->free(c);
}

void mr__op_free(struct mr__comm_op *op)
{
	if (!op)
		return;
	free(op->scounts);
	free(op->sdispls);
	free(op->rcounts);
	free(op->rdispls);
	free(op);
}

static size_t *dup_arr(const size_t *a, int n, int *err)
{
	size_t *p;

	if (!a)
		return NULL;
	p = malloc(sizeof(*p) * (size_t)n);
	if (!p) {
		*err = MR_ENOMEM;
		return NULL;
	}
	memcpy(p, a, sizeof(*p) * (size_t)n);
	return p;
}

static int is_p2p_kind(int kind)
{
	return kind == MR__OP_SEND || kind == MR__OP_RECV || kind == MR__OP_SENDRECV;
}

static int bad_peer(const struct mr_comm *c, int peer)
{
	return peer < 0 || peer >= c->size || peer == c->rank;
}

int mr_comm_stream_ordered(const struct mr_comm *c)
{
	const struct mr_comm_device *d = c->dev;

	if (!d || !d->stream_wait)
		return 0;
	return d->claim_stream_order || (c->ops->detach && d->stream && d->stream(d->ctx));
}

/* struct mr_comm_fence's callbacks over the backend's. */
static int fence_check(void *owner)
{
	struct mr_comm *c = owner;

	return c->ops->health ? c->ops->health(c) : 0;
}

static void fence_fail(void *owner, int rc)
{
	struct mr_comm *c = owner;

	if (c->ops->fail)
		c->ops->fail(c, rc);
	else
		c->ops->abort(c);
}

/* Finishes req for the host: the backend's wait, then the copy back of
 * staged buffers (part of the wait). Frees req. */
static int wait_host(struct mr_comm *c, struct mr_comm_req *req)
{
	struct mr__stage *st = req->stage;

	return mr__stage_out(c, st, c->ops->wait(req));
}

/* Finishes req for the device's compute stream (see
 * mr_comm_stream_ordered): the stream waits for the operation's event, or
 * (claim_stream_order) the host has finished it and the stream's wait
 * has nothing left to wait for; the device keeps the fence. An operation
 * with a staged buffer (a host buffer on nccl) waits on the host. */
static int wait_ordered(struct mr_comm *c, struct mr_comm_req *req)
{
	struct mr_comm_fence f = { c, c->id, 0, fence_check, fence_fail };
	void *ev = NULL;
	int rc;

	if (!c->ops->detach || c->dev->claim_stream_order) {
		f.deadline_ms = mr__now_ms() + c->timeout_ms;
		rc = wait_host(c, req);
	} else if (req->stage) {
		return wait_host(c, req);
	} else {
		rc = c->ops->detach(req, &ev, &f.deadline_ms);
	}
	if (rc < 0)
		return rc;
	c->fenced = 1;
	return c->dev->stream_wait(c->dev->ctx, ev, &f);
}

/* The wait mr_comm_wait and the blocking forms do; a barrier is the
 * host's whatever the backend. Frees req. */
static int finish(struct mr_comm *c, struct mr_comm_req *req)
{
	if ((req->tag & 0xff) != MR_COMM_OP_BARRIER && mr_comm_stream_ordered(c))
		return wait_ordered(c, req);
	return wait_host(c, req);
}

/* src: the peer a sendrecv receives from (ignored by the other kinds) */
static int start(struct mr_comm *c, int kind, const void *sbuf, void *rbuf, size_t count,
		 int dtype, int redop, int peer, int src, int tag, const size_t *sc,
		 const size_t *sd, const size_t *rc, const size_t *rd, struct mr_comm_req **req)
{
	struct mr__comm_op *op;
	struct mr__stage *st = NULL;
	uint64_t ptag;
	int err = 0;

	if (req)
		*req = NULL;
	if (!mr_comm_dtype_size(dtype) || redop < MR_COMM_SUM || redop > MR_COMM_MAX)
		return MR_EINVAL;
	if (kind == MR__OP_BROADCAST && (peer < 0 || peer >= c->size))
		return MR_EINVAL;
	if (is_p2p_kind(kind) && (tag < 0 || bad_peer(c, peer)))
		return MR_EINVAL;
	if (kind == MR__OP_SENDRECV && bad_peer(c, src))
		return MR_EINVAL;
	op = calloc(1, sizeof(*op));
	if (!op)
		return MR_ENOMEM;
	*op = (struct mr__comm_op){ .kind = kind, .sbuf = sbuf, .rbuf = rbuf, .count = count,
				    .dtype = dtype, .redop = redop, .peer = peer, .src = src,
				    .tag = tag };
	op->scounts = dup_arr(sc, c->size, &err);
	op->sdispls = dup_arr(sd, c->size, &err);
	op->rcounts = dup_arr(rc, c->size, &err);
	op->rdispls = dup_arr(rd, c->size, &err);
	if (err) {
		mr__op_free(op);
		return err;
	}
	if (c->dev && (err = mr__stage_in(c, op, &st)) < 0) {
		mr__op_free(op);
		return err;
	}
	ptag = progress_enter(c, kind, kind == MR__OP_SENDRECV ? src : is_p2p_kind(kind) ? peer : -1);
	if (!req) {
		/* blocking: run in this thread when the queue is idle */
		uint64_t t0 = now_ns();
		struct mr_comm_req *r;
		int rc = 1;

		if (c->ops->run_now && kind != MR__OP_SEND && kind != MR__OP_RECV &&
		    !mr_comm_stream_ordered(c))
			rc = c->ops->run_now(c, op);
		if (rc == 1 && (rc = c->ops->start(c, op, &r)) == 0) {
			r->tag = ptag;
			r->stage = st; /* the wait copies it back */
			st = NULL;
			rc = finish(c, r);
		}
		rc = mr__stage_out(c, st, rc);
		/* failed or not, the rank is out of the operation */
		progress_done(c, ptag);
		progress_wait(c, t0, ptag);
		return rc;
	}
	err = c->ops->start(c, op, req);
	if (err == 0) {
		(*req)->tag = ptag;
		(*req)->stage = st;
	} else {
		progress_done(c, ptag); /* never started: nothing to wait for */
		mr__stage_out(c, st, err);
	}
	return err;
}

int mr_comm_iallreduce(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		       int dtype, int op, struct mr_comm_req **req)
{
	return start(c, MR__OP_ALLREDUCE, sbuf, rbuf, count, dtype, op, 0, 0, 0,
		     NULL, NULL, NULL, NULL, req);
}

int mr_comm_ireduce_scatter(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
			    int dtype, int op, struct mr_comm_req **req)
{
	return start(c, MR__OP_REDUCE_SCATTER, sbuf, rbuf, count, dtype, op, 0, 0, 0,
		     NULL, NULL, NULL, NULL, req);
}

int mr_comm_iallgatherv(struct mr_comm *c, const void *sbuf, void *rbuf,
			const size_t *rcounts, const size_t *rdispls, int dtype,
			struct mr_comm_req **req)
{
	if (!rcounts || !rdispls)
		return MR_EINVAL;
	return start(c, MR__OP_ALLGATHERV, sbuf, rbuf, 0, dtype, 0, 0, 0, 0,
		     NULL, NULL, rcounts, rdispls, req);
}

/* counts (size) then displacements (size) of `count` elements per rank,
 * for the equal-count forms built on the v-variants; malloc'd. */
static size_t *equal_counts(const struct mr_comm *c, size_t count)
{
	size_t *cnt = malloc(sizeof(size_t) * (size_t)c->size * 2);

	for (int i = 0; cnt && i < c->size; i++) {
		cnt[i] = count;
		cnt[c->size + i] = count * (size_t)i;
	}
	return cnt;
}

int mr_comm_iallgather(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		       int dtype, struct mr_comm_req **req)
{
	size_t *cnt = equal_counts(c, count);
	int rc;

	if (!cnt)
		return MR_ENOMEM;
	rc = mr_comm_iallgatherv(c, sbuf, rbuf, cnt, cnt + c->size, dtype, req);
	free(cnt);
	return rc;
}

int mr_comm_ialltoallv(struct mr_comm *c, const void *sbuf, const size_t *scounts,
		       const size_t *sdispls, void *rbuf, const size_t *rcounts,
		       const size_t *rdispls, int dtype, struct mr_comm_req **req)
{
	if (!scounts || !sdispls || !rcounts || !rdispls)
		return MR_EINVAL;
	return start(c, MR__OP_ALLTOALLV, sbuf, rbuf, 0, dtype, 0, 0, 0, 0,
		     scounts, sdispls, rcounts, rdispls, req);
}

int mr_comm_ialltoall(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		      int dtype, struct mr_comm_req **req)
{
	size_t *cnt = equal_counts(c, count);
	int rc;

	if (!cnt)
		return MR_ENOMEM;
	rc = mr_comm_ialltoallv(c, sbuf, cnt, cnt + c->size, rbuf, cnt, cnt + c->size,
				dtype, req);
	free(cnt);
	return rc;
}

int mr_comm_ibroadcast(struct mr_comm *c, void *buf, size_t count, int dtype, int root,
		       struct mr_comm_req **req)
{
	return start(c, MR__OP_BROADCAST, buf, buf, count, dtype, 0, root, 0, 0,
		     NULL, NULL, NULL, NULL, req);
}

int mr_comm_isend(struct mr_comm *c, const void *buf, size_t count, int dtype, int peer,
		  int tag, struct mr_comm_req **req)
{
	return start(c, MR__OP_SEND, buf, NULL, count, dtype, 0, peer, 0, tag,
		     NULL, NULL, NULL, NULL, req);
}

int mr_comm_irecv(struct mr_comm *c, void *buf, size_t count, int dtype, int peer,
		  int tag, struct mr_comm_req **req)
{
	return start(c, MR__OP_RECV, NULL, buf, count, dtype, 0, peer, 0, tag,
		     NULL, NULL, NULL, NULL, req);
}

int mr_comm_isendrecv(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count, int dtype,
		      int to, int from, int tag, struct mr_comm_req **req)
{
	return start(c, MR__OP_SENDRECV, sbuf, rbuf, count, dtype, 0, to, from, tag,
		     NULL, NULL, NULL, NULL, req);
}

int mr_comm_ibarrier(struct mr_comm *c, struct mr_comm_req **req)
{
	return start(c, MR__OP_BARRIER, NULL, NULL, 0, MR_COMM_I32, 0, 0, 0, 0,
		     NULL, NULL, NULL, NULL, req);
}

int mr_comm_test(struct mr_comm_req *req, int *done)
{
	int rc = req->comm->ops->test(req, done);

	if (*done)
		progress_done(req->comm, req->tag);
	return rc;
}

/* mr_comm_wait's and mr_comm_wait_host's bookkeeping around the wait. */
static int wait_req(struct mr_comm_req *req, int (*how)(struct mr_comm *, struct mr_comm_req *))
{
	struct mr_comm *c = req->comm;
	uint64_t tag = req->tag, t0 = now_ns();
	int rc = how(c, req); /* frees req */

	progress_done(c, tag);
	progress_wait(c, t0, tag);
	return rc;
}

int mr_comm_wait(struct mr_comm_req *req)
{
	return wait_req(req, finish);
}

int mr_comm_wait_host(struct mr_comm_req *req)
{
	return wait_req(req, wait_host);
}

/* A NULL request pointer means "blocking" inside this file. */
#define BLOCKING(call) return (call)

int mr_comm_allreduce(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		      int dtype, int op)
{
	BLOCKING(mr_comm_iallreduce(c, sbuf, rbuf, count, dtype, op, NULL));
}

int mr_comm_reduce_scatter(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
			   int dtype, int op)
{
	BLOCKING(mr_comm_ireduce_scatter(c, sbuf, rbuf, count, dtype, op, NULL));
}

int mr_comm_allgather(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		      int dtype)
{
	BLOCKING(mr_comm_iallgather(c, sbuf, rbuf, count, dtype, NULL));
}

int mr_comm_allgatherv(struct mr_comm *c, const void *sbuf, void *rbuf,
		       const size_t *rcounts, const size_t *rdispls, int dtype)
{
	BLOCKING(mr_comm_iallgatherv(c, sbuf, rbuf, rcounts, rdispls, dtype, NULL));
}

int mr_comm_alltoall(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		     int dtype)
{
	BLOCKING(mr_comm_ialltoall(c, sbuf, rbuf, count, dtype, NULL));
}

int mr_comm_alltoallv(struct mr_comm *c, const void *sbuf, const size_t *scounts,
		      const size_t *sdispls, void *rbuf, const size_t *rcounts,
		      const size_t *rdispls, int dtype)
{
	BLOCKING(mr_comm_ialltoallv(c, sbuf, scounts, sdispls, rbuf, rcounts, rdispls,
				    dtype, NULL));
}

int mr_comm_broadcast(struct mr_comm *c, void *buf, size_t count, int dtype, int root)
{
	BLOCKING(mr_comm_ibroadcast(c, buf, count, dtype, root, NULL));
}

int mr_comm_send(struct mr_comm *c, const void *buf, size_t count, int dtype, int peer,
		 int tag)
{
	BLOCKING(mr_comm_isend(c, buf, count, dtype, peer, tag, NULL));
}

int mr_comm_recv(struct mr_comm *c, void *buf, size_t count, int dtype, int peer, int tag)
{
	BLOCKING(mr_comm_irecv(c, buf, count, dtype, peer, tag, NULL));
}

int mr_comm_sendrecv(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count, int dtype,
		     int to, int from, int tag)
{
	BLOCKING(mr_comm_isendrecv(c, sbuf, rbuf, count, dtype, to, from, tag, NULL));
}

int mr_comm_barrier(struct mr_comm *c)
{
	BLOCKING(mr_comm_ibarrier(c, NULL));
}

