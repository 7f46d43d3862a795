/*
 * host_algo.c - collective algorithms of the host backend, built on the
 * transfer engine (mr__hx_sendrecv / mr__hx_run).
 *
 * Choices (n = group size, B = message bytes):
 *   allreduce       B <= 64 KiB or count < n: recursive doubling (log2 n
 *                   steps; non-powers of two fold the first 2*(n-p) ranks
 *                   in pairs first). Larger: ring reduce-scatter + ring
 *                   all-gather (2(n-1) steps of B/n, bandwidth-optimal),
 *                   in chunks of n x 1 MiB (MR_COMM_CHUNK): a reduced
 *                   segment is forwarded while still in cache, in few
 *                   enough steps (each a wake-up, over TCP, or a
 *                   single-copy handshake, from registered memory).
 *                   Every rank ends with bit-identical results (pairwise
 *                   sums are commutative; the ring distributes one copy).
 *   reduce_scatter  ring (n-1 steps of B/n), received data is reduced as
 *                   it streams in (64 KiB bounce), no temporary of size B;
 *                   the last step reduces straight into the output.
 *   allgather(v)    ring (n-1 steps), received blocks land in place.
 *   alltoall(v)     pairwise schedule (step s: to me+s, from me-s), every
 *                   step at once.
 *   (both copy their own block in pieces while the exchanges wait)
 *   broadcast       B <= 256 KiB or n <= 2: binomial tree; larger: scatter
 *                   from the root + ring all-gather (~2B per rank).
 *   barrier         dissemination, ceil(log2 n) rounds of empty messages.
 * A ring's steps are one batch of the transfer engine: step s+1's send
 * forwards what step s's receive has brought so far, so a step never waits
 * for the whole previous one. Large transfers are pipelined by the
 * transports themselves: a shm ring (1 MiB, MR_COMM_SHM_RING) or a TCP
 * socket streams while the other side drains, and reduction happens per
 * 64 KiB piece as it arrives. An operation whose input and output
 * outgrow this rank's share of the L3 (host.c) writes its receives with
 * streaming stores, except those a send forwards. bf16 is widened to fp32 for the
 * whole algorithm (wire bytes doubled, one rounding at the end).
 *
 * Non-goals: topology awareness (hierarchical shm+TCP algorithms).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "host_int.h"

#define RD_MAX_BYTES (64 << 10)
#define BCAST_TREE_MAX (256 << 10)

static size_t seg_count(size_t count, int n, int i)
{
	return count / (size_t)n + ((size_t)i < count % (size_t)n);
}

static size_t seg_off(size_t count, int n, int i)
{
	size_t q = count / (size_t)n, r = count % (size_t)n;

	return q * (size_t)i + ((size_t)i < r ? (size_t)i : r);
}

static int mod(int a, int n)
{
	return ((a % n) + n) % n;
}

/* Whether [a, a+al) and [b, b+bl) share a byte. */
static int overlaps(const void *a, size_t al, const void *b, size_t bl)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return x < y + bl && y < x + al;
}

/* Bytes from base to the end of the last block of counts/displs. */
static size_t extent(const size_t *cnt, const size_t *displ, int n, size_t esz)
{
	size_t e = 0;

	for (int i = 0; i < n; i++)
		if (cnt[i] && (displ[i] + cnt[i]) * esz > e)
			e = (displ[i] + cnt[i]) * esz;
	return e;
}

/* A batch of transfers the engine runs as one (mr__hx_run). The steps of a
 * ring go in together, chained: a send that forwards what an earlier
 * receive brings (gate) streams each piece on as soon as it has arrived,
 * while it is still in cache, and no step waits for the slowest transfer
 * of the step before. Capacity is fixed at creation. */
struct batch {
	struct mr__xfer *x;
	int n, cap;
	int stream;        /* receives and local copies use streaming stores */
};

/* touched: bytes the operation reads and writes on this rank, input and
 * output (streaming stores from h->stream_min up) */
static int batch_init(struct mr__hcomm *h, struct batch *b, int cap, size_t touched)
{
	b->n = 0;
	b->cap = cap;
	b->stream = touched >= h->stream_min;
	b->x = calloc(cap > 0 ? (size_t)cap : 1, sizeof(*b->x));
	return b->x ? 0 : MR_ENOMEM;
}

static int batch_run(struct mr__hcomm *h, struct batch *b)
{
	int rc = mr__hx_run(h, &b->x, &b->n, &b->cap, NULL);

	free(b->x);
	b->x = NULL;
	return rc;
}

/* A send of len bytes at buf; gate >= 0: the index of the receive that
 * fills buf (only what it has received goes out). */
static void add_send(struct batch *b, int peer, const char *buf, size_t len, int gate,
		     int reduced)
{
	b->x[b->n++] = (struct mr__xfer){ .peer = peer, .send = 1, .tag = MR__TAG_COLL,
					  .buf = (char *)buf, .len = len, .red_dtype = -1,
					  .gate = gate + 1, .reduced = reduced };
	if (gate >= 0)
		b->x[gate].stream = 0; /* read again at once: keep it in cache */
}

/* A receive into buf (dt >= 0: buf = [red_src or buf] op incoming); returns
 * its index. */
static int add_recv(struct batch *b, int peer, char *buf, size_t len, int dt, int redop,
		    const char *red_src)
{
	b->x[b->n] = (struct mr__xfer){ .peer = peer, .send = 0, .tag = MR__TAG_COLL, .buf = buf,
					.len = len, .red_dtype = dt, .redop = redop,
					.red_src = red_src, .stream = b->stream && dt < 0 };
	return b->n++;
}

/* A copy src -> dst of this rank, done in pieces while the transfers wait. */
static void add_local(struct batch *b, int me, char *dst, const char *src, size_t len)
{
	b->x[b->n++] = (struct mr__xfer){ .peer = me, .send = 1, .local = 1, .tag = MR__TAG_COLL,
					  .buf = dst, .len = len, .red_src = src,
					  .red_dtype = -1, .stream = b->stream };
}

/* Ring reduce-scatter over segments given by counts/offsets (elements):
 * rank me ends with the full reduction of segment me, in work or, with
 * last, in last. With src (not NULL, not work) the input is read from src
 * and work need not hold a copy of it: each received piece becomes
 * work = src op incoming. Appends 2(n-1) transfers; returns the index of
 * the receive that completes segment me (-1 for one rank). */
static int ring_rs(struct mr__hcomm *h, struct batch *b, char *work, const char *src,
		   const size_t *cnt, const size_t *off, int dt, int redop, char *last)
{
	int n = h->n, me = h->me, right = mod(me + 1, n), left = mod(me - 1, n), prev = -1;
	size_t esz = mr_comm_dtype_size(dt);

	for (int s = 0; s < n - 1; s++) {
		int si = mod(me - s - 1, n), ri = mod(me - s - 2, n);
		const char *in = src ? src : work;
		char *dst = s == n - 2 && last ? last : work + off[ri] * esz;

		/* step s > 0 forwards the segment step s-1 reduced */
		add_send(b, right, (s == 0 ? in : work) + off[si] * esz, cnt[si] * esz, prev, 1);
		prev = add_recv(b, left, dst, cnt[ri] * esz, dt, redop,
				src || dst != work + off[ri] * esz ? in + off[ri] * esz : NULL);
	}
	return prev;
}

/* Ring all-gather: rank me owns block me, everyone ends with all blocks.
 * With own, block me is still at own (not yet in buf): the first step
 * sends it from there and copies it into buf meanwhile. gate >= 0: block
 * me is being filled by that receive of the batch. Appends 2(n-1)+1
 * transfers at most. */
static void ring_ag(struct mr__hcomm *h, struct batch *b, char *buf, const size_t *cnt,
		    const size_t *off, size_t esz, const char *own, int gate)
{
	int n = h->n, me = h->me, right = mod(me + 1, n), left = mod(me - 1, n), prev = gate;

	for (int s = 0; s < n - 1; s++) {
		int si = mod(me - s, n), ri = mod(me - s - 1, n);

		/* step s > 0 forwards the block step s-1 received */
		add_send(b, right, s == 0 && own ? own : buf + off[si] * esz, cnt[si] * esz, prev,
			 0);
		prev = add_recv(b, left, buf + off[ri] * esz, cnt[ri] * esz, -1, 0, NULL);
	}
	/* last: the engine tries transfers in order, peers first */
	if (own && n > 1)
		add_local(b, me, buf + off[me] * esz, own, cnt[me] * esz);
}

static int run_ring_ag(struct mr__hcomm *h, char *buf, const size_t *cnt, const size_t *off,
		       size_t esz, const char *own)
{
	struct batch b;
	int rc = batch_init(h, &b, 2 * h->n, extent(cnt, off, h->n, esz) + cnt[h->me] * esz);

	if (rc < 0)
		return rc;
	ring_ag(h, &b, buf, cnt, off, esz, own, -1);
	return batch_run(h, &b);
}

static int real_rank(int nr, int rem)
{
	return nr < rem ? nr * 2 + 1 : nr + rem;
}

static int recursive_doubling(struct mr__hcomm *h, char *work, size_t count, int dt,
			      int redop)
{
	int n = h->n, me = h->me, p = 1, rem, nr, rc = 0;
	size_t bytes = count * mr_comm_dtype_size(dt);
	char *tmp = malloc(bytes ? bytes : 1);

	if (!tmp)
		return MR_ENOMEM;
	while (p * 2 <= n)
		p *= 2;
	rem = n - p;
	if (me < 2 * rem) {
		if (me % 2 == 0) {
			rc = mr__hx_sendrecv(h, me + 1, work, bytes, -1, NULL, 0, -1, 0);
			nr = -1;
		} else {
			rc = mr__hx_sendrecv(h, -1, NULL, 0, me - 1, work, bytes, dt, redop);
			nr = me / 2;
		}
	} else {
		nr = me - rem;
	}
	for (int mask = 1; rc == 0 && nr >= 0 && mask < p; mask <<= 1) {
		int partner = real_rank(nr ^ mask, rem);

		rc = mr__hx_sendrecv(h, partner, work, bytes, partner, tmp, bytes, -1, 0);
		if (rc == 0)
			mr__reduce(work, tmp, count, dt, redop);
	}
	if (rc == 0 && me < 2 * rem) {
		if (me % 2 == 0)
			rc = mr__hx_sendrecv(h, -1, NULL, 0, me + 1, work, bytes, -1, 0);
		else
			rc = mr__hx_sendrecv(h, me - 1, work, bytes, -1, NULL, 0, -1, 0);
	}
	free(tmp);
	return rc;
}

/* Reduce-scatter and all-gather of count elements as one chained batch:
 * the first all-gather send forwards segment me while its last reduction
 * arrives. */
static int ring_allreduce_once(struct mr__hcomm *h, char *work, const char *src, size_t count,
			       int dt, int redop, size_t *cnt, size_t touched)
{
	int n = h->n, rc, last;
	size_t *off = cnt + n;
	struct batch b;

	for (int i = 0; i < n; i++) {
		cnt[i] = seg_count(count, n, i);
		off[i] = seg_off(count, n, i);
	}
	if ((rc = batch_init(h, &b, 4 * n, touched)) < 0)
		return rc;
	last = ring_rs(h, &b, work, src, cnt, off, dt, redop, NULL);
	ring_ag(h, &b, work, cnt, off, mr_comm_dtype_size(dt), NULL, last);
	return batch_run(h, &b);
}

/* Ring allreduce in chunks of n segments of h->chunk bytes: a segment a
 * rank has just reduced goes on to its neighbour while still in cache,
 * instead of after the whole reduce-scatter (B/n bytes later). */
static int ring_allreduce(struct mr__hcomm *h, char *work, const char *src, size_t count, int dt,
			  int redop)
{
	int n = h->n, rc = 0;
	size_t esz = mr_comm_dtype_size(dt), step = h->chunk / esz * (size_t)n;
	size_t *cnt = malloc(sizeof(size_t) * (size_t)n * 2);

	if (!cnt)
		return MR_ENOMEM;
	/* fewer than four chunks fit the caches anyway: one batch, fewer
	 * messages (TCP pays per message) */
	if (count < 4 * step)
		step = count;
	for (size_t at = 0; rc == 0 && at < count; at += step) {
		size_t k = count - at;

		/* the tail goes with the last full chunk */
		if (k >= 2 * step)
			k = step;
		rc = ring_allreduce_once(h, work + at * esz, src ? src + at * esz : NULL, k, dt,
					 redop, cnt, count * esz * (src ? 2 : 1));
		if (k != step)
			break;
	}
	free(cnt);
	return rc;
}

/* The communicator's grow-only scratch buffer (no page faults per call). */
static char *scratch(struct mr__hcomm *h, size_t need)
{
	if (!need)
		need = 1;
	if (need > h->scratch_cap) {
		free(h->scratch);
		h->scratch = malloc(need);
		h->scratch_cap = h->scratch ? need : 0;
	}
	return h->scratch;
}

/* A working copy of src in the reduction dtype (fp32 for bf16). */
static char *widen(struct mr__hcomm *h, const void *src, size_t count, int dtype, int *wdt,
		   int *rc)
{
	size_t esz = mr_comm_dtype_size(dtype == MR_COMM_BF16 ? MR_COMM_F32 : dtype);
	char *w = scratch(h, count * esz);

	*wdt = dtype == MR_COMM_BF16 ? MR_COMM_F32 : dtype;
	if (!w) {
		*rc = MR_ENOMEM;
		return NULL;
	}
	if (dtype == MR_COMM_BF16)
		mr__bf16_to_f32((void *)w, src, count);
	else
		memcpy(w, src, count * esz);
	return w;
}

static int allreduce(struct mr__hcomm *h, const struct mr__comm_op *op)
{
	size_t count = op->count, esz = mr_comm_dtype_size(op->dtype);
	int wdt = op->dtype, rc = 0, redop = op->redop == MR_COMM_MAX ? MR_COMM_MAX : MR_COMM_SUM;
	char *work = op->rbuf, *own = NULL;

	if (!count)
		return 0;
	if (op->dtype == MR_COMM_BF16) {
		own = work = widen(h, op->sbuf, count, op->dtype, &wdt, &rc);
		if (!own)
			return rc;
	}
	if (h->n > 1 && count * mr_comm_dtype_size(wdt) > RD_MAX_BYTES && count >= (size_t)h->n) {
		/* the ring reads sbuf directly: no copy of the input */
		rc = ring_allreduce(h, work, own || op->sbuf == op->rbuf ? NULL : op->sbuf, count,
				    wdt, redop);
	} else {
		if (!own && op->sbuf != op->rbuf)
			memcpy(work, op->sbuf, count * esz);
		if (h->n > 1)
			rc = recursive_doubling(h, work, count, wdt, redop);
	}
	if (rc == 0 && op->redop == MR_COMM_AVG)
		mr__scale_div(work, count, wdt, h->n);
	if (rc == 0 && own)
		mr__f32_to_bf16(op->rbuf, (void *)own, count);
	return rc;
}

static int reduce_scatter(struct mr__hcomm *h, const struct mr__comm_op *op)
{
	int n = h->n, wdt, rc = 0, redop = op->redop == MR_COMM_MAX ? MR_COMM_MAX : MR_COMM_SUM;
	int direct;
	size_t rc_ = op->count, wesz;
	size_t *cnt;
	struct batch b;
	const char *src = NULL;
	char *work;

	if (!rc_)
		return 0;
	if (op->dtype == MR_COMM_BF16 || n == 1) {
		work = widen(h, op->sbuf, rc_ * (size_t)n, op->dtype, &wdt, &rc);
	} else {
		/* no copy of the input: the ring reads sbuf directly */
		wdt = op->dtype;
		work = scratch(h, rc_ * (size_t)n * mr_comm_dtype_size(wdt));
		src = op->sbuf;
		rc = MR_ENOMEM;
	}
	if (!work)
		return rc;
	wesz = mr_comm_dtype_size(wdt);
	cnt = malloc(sizeof(size_t) * (size_t)n * 2);
	if (!cnt)
		return MR_ENOMEM;
	for (int i = 0; i < n; i++) {
		cnt[i] = rc_;
		cnt[n + i] = rc_ * (size_t)i;
	}
	/* fp32/int: the last reduction lands in rbuf itself */
	direct = op->dtype != MR_COMM_BF16 && n > 1;
	/* (receives here reduce: regular stores) */
	if ((rc = batch_init(h, &b, 2 * n, 0)) == 0) {
		ring_rs(h, &b, work, src, cnt, cnt + n, wdt, redop, direct ? op->rbuf : NULL);
		rc = batch_run(h, &b);
	}
	if (rc == 0) {
		char *mine = direct ? op->rbuf : work + rc_ * (size_t)h->me * wesz;

		if (op->redop == MR_COMM_AVG)
			mr__scale_div(mine, rc_, wdt, n);
		if (op->dtype == MR_COMM_BF16)
			mr__f32_to_bf16(op->rbuf, (void *)mine, rc_);
		else if (mine != op->rbuf)
			memcpy(op->rbuf, mine, rc_ * wesz);
	}
	free(cnt);
	return rc;
}

static int allgatherv(struct mr__hcomm *h, const struct mr__comm_op *op)
{
	size_t esz = mr_comm_dtype_size(op->dtype), mine = op->rcounts[h->me] * esz;
	char *dst = (char *)op->rbuf + op->rdispls[h->me] * esz;

	if (op->sbuf == dst || !mine)
		return run_ring_ag(h, op->rbuf, op->rcounts, op->rdispls, esz, NULL);
	/* the own block's copy runs while the first step waits for peers,
	 * unless the buffers overlap (then it must come first) */
	if (h->n > 1 && !overlaps(op->sbuf, mine, op->rbuf,
				  extent(op->rcounts, op->rdispls, h->n, esz)))
		return run_ring_ag(h, op->rbuf, op->rcounts, op->rdispls, esz, op->sbuf);
	memmove(dst, op->sbuf, mine);
	return run_ring_ag(h, op->rbuf, op->rcounts, op->rdispls, esz, NULL);
}

/* All pairs at once: the exchange with me+s / me-s is step s of the
 * pairwise schedule, every step in one batch so no pair waits for the
 * slowest of the step before; the own block is copied meanwhile. */
static int alltoallv(struct mr__hcomm *h, const struct mr__comm_op *op)
{
	size_t esz = mr_comm_dtype_size(op->dtype), mine = op->rcounts[h->me] * esz;
	int n = h->n, me = h->me, rc;
	char *dst = (char *)op->rbuf + op->rdispls[me] * esz;
	const char *own = (const char *)op->sbuf + op->sdispls[me] * esz;
	struct batch b;

	/* overlapping buffers: the own block first */
	if (mine && (n == 1 || overlaps(op->sbuf, extent(op->scounts, op->sdispls, n, esz),
					op->rbuf, extent(op->rcounts, op->rdispls, n, esz)))) {
		memmove(dst, own, mine);
		mine = 0;
	}
	if (n == 1)
		return 0;
	if ((rc = batch_init(h, &b, 2 * n, extent(op->scounts, op->sdispls, n, esz) +
					      extent(op->rcounts, op->rdispls, n, esz))) < 0)
		return rc;
	for (int s = 1; s < n; s++) {
		int to = mod(me + s, n), from = mod(me - s, n);

		add_send(&b, to, (const char *)op->sbuf + op->sdispls[to] * esz,
			 op->scounts[to] * esz, -1, 0);
		add_recv(&b, from, (char *)op->rbuf + op->rdispls[from] * esz,
			 op->rcounts[from] * esz, -1, 0, NULL);
	}
	if (mine)
		add_local(&b, me, dst, own, mine);
	return batch_run(h, &b);
}

static int bcast_tree(struct mr__hcomm *h, char *buf, size_t bytes, int root)
{
	int n = h->n, vr = mod(h->me - root, n), mask = 1, rc;

	while (mask < n) {
		if (vr & mask) {
			rc = mr__hx_sendrecv(h, -1, NULL, 0, mod(vr - mask + root, n), buf, bytes,
					     -1, 0);
			if (rc < 0)
				return rc;
			break;
		}
		mask <<= 1;
	}
	for (mask >>= 1; mask > 0; mask >>= 1) {
		if (vr + mask < n) {
			rc = mr__hx_sendrecv(h, mod(vr + mask + root, n), buf, bytes, -1, NULL, 0,
					     -1, 0);
			if (rc < 0)
				return rc;
		}
	}
	return 0;
}

static int bcast_scatter_ag(struct mr__hcomm *h, char *buf, size_t count, size_t esz,
			    int root)
{
	int n = h->n, rc;
	size_t *cnt = malloc(sizeof(size_t) * (size_t)n * 2);
	struct mr__xfer *xs = calloc((size_t)n, sizeof(*xs));
	int nx = 0, cap = n;

	if (!cnt || !xs) {
		free(cnt);
		free(xs);
		return MR_ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		cnt[i] = seg_count(count, n, i);
		cnt[n + i] = seg_off(count, n, i);
	}
	for (int i = 0; i < n; i++) {
		if (h->me == root && i != root)
			xs[nx++] = (struct mr__xfer){ .peer = i, .send = 1, .tag = MR__TAG_COLL,
						      .buf = buf + cnt[n + i] * esz,
						      .len = cnt[i] * esz, .red_dtype = -1 };
		else if (h->me != root && i == h->me)
			xs[nx++] = (struct mr__xfer){ .peer = root, .send = 0,
						      .tag = MR__TAG_COLL,
						      .buf = buf + cnt[n + i] * esz,
						      .len = cnt[i] * esz, .red_dtype = -1 };
	}
	rc = mr__hx_run(h, &xs, &nx, &cap, NULL);
	if (rc == 0)
		rc = run_ring_ag(h, buf, cnt, cnt + n, esz, NULL);
	free(cnt);
	free(xs);
	return rc;
}

static int barrier(struct mr__hcomm *h)
{
	for (int k = 1; k < h->n; k <<= 1) {
		int rc = mr__hx_sendrecv(h, mod(h->me + k, h->n), NULL, 0, mod(h->me - k, h->n),
					 NULL, 0, -1, 0);
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* A user exchange: its transfers carry the user's tag, so plain sends and
 * receives on the peers match them (and the same size rules apply). */
static int sendrecv(struct mr__hcomm *h, const struct mr__comm_op *op)
{
	size_t len = op->count * mr_comm_dtype_size(op->dtype);
	struct mr__xfer x[2], *xs = x;
	int n = 2, cap = 2;

	x[0] = (struct mr__xfer){ .peer = op->peer, .send = 1, .tag = op->tag,
				  .buf = (char *)op->sbuf, .len = len, .red_dtype = -1,
				  .rendezvous = 1 };
	x[1] = (struct mr__xfer){ .peer = op->src, .send = 0, .tag = op->tag, .buf = op->rbuf,
				  .len = len, .red_dtype = -1, .stream = 2 * len >= h->stream_min };
	return mr__hx_run(h, &xs, &n, &cap, NULL);
}

int mr__host_exec(struct mr__hcomm *h, const struct mr__comm_op *op)
{
	size_t esz = mr_comm_dtype_size(op->dtype);

	switch (op->kind) {
	case MR__OP_ALLREDUCE:
		return allreduce(h, op);
	case MR__OP_REDUCE_SCATTER:
		return reduce_scatter(h, op);
	case MR__OP_ALLGATHERV:
		return allgatherv(h, op);
	case MR__OP_ALLTOALLV:
		return alltoallv(h, op);
	case MR__OP_BROADCAST:
		if (h->n == 1 || !op->count)
			return 0;
		if (op->count * esz <= BCAST_TREE_MAX || h->n <= 2)
			return bcast_tree(h, op->rbuf, op->count * esz, op->peer);
		return bcast_scatter_ag(h, op->rbuf, op->count, esz, op->peer);
	case MR__OP_BARRIER:
		return barrier(h);
	case MR__OP_SENDRECV:
		return sendrecv(h, op);
	default:
		return MR_EINVAL;
	}
}
