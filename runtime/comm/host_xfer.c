/*
 * host_xfer.c - the transfer engine of the host backend.
 *
 * mr__hx_run() takes a set of transfers (send or receive, one peer each)
 * and progresses all of them at once without blocking on any single one,
 * over the channels of host_chan.c: sends to one peer go out in list
 * order, a send may forward what an earlier receive of the batch has
 * brought so far (xfer.gate), received messages are matched to pending
 * receives by (peer, tag) in order or stashed. When nothing moves it spins
 * briefly (sched_yield), then sleeps on the doorbell futex (shared memory
 * only) or in poll() (TCP involved) for at most a few milliseconds,
 * checking abort, the deadline and peer liveness each time.
 *
 * Large messages between shared-memory peers go by single copy instead
 * (host_cma.c): the ring carries only a descriptor.
 *
 * Non-goals: wildcard receives.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "host_int.h"

/* Idle passes spent busy-polling (small-message latency), then yielding,
 * then sleeping on the doorbell / poll(); the first two only while some
 * thread waits on the communicator (host_int.h: waiters). MR_COMM_SPIN
 * overrides the first. */
#define SPIN_HOT 1000
#define SPIN_YIELD 200
#define LOCAL_PIECE ((size_t)256 << 10)
#define TCP_FORWARD_MIN ((size_t)256 << 10)


static int spin_hot(void)
{
	static _Atomic int v = -1;
	int x = atomic_load(&v);

	if (x < 0) {
		const char *e = getenv("MR_COMM_SPIN");

		x = e ? atoi(e) : SPIN_HOT;
		if (x < 0 || x > 1000000)
			x = SPIN_HOT;
		atomic_store(&v, x);
	}
	return x;
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static int has_pending_recv(struct mr__xfer *xs, int nx, int peer)
{
	for (int i = 0; i < nx; i++)
		if (!xs[i].done && !xs[i].send && xs[i].peer == peer)
			return 1;
	return 0;
}

/* A single-copy message whose header was just read: its descriptor follows
 * (written with the header in one go); copy into the matching receive or a
 * stash right away, the sender waits for it. */
static long rx_cma(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *xs, int nx,
		   int peer)
{
	struct mr__cma_desc d;
	struct mr__xfer *x = NULL;
	struct mr__stash *s = NULL;
	size_t len = ch->hdr.len;
	int rc;

	if (mr__chan_read(h, ch, &d, sizeof(d), 0) != (long)sizeof(d))
		return MR_EPROTO;
	for (int i = 0; i < nx && !x; i++)
		if (!xs[i].done && !xs[i].send && xs[i].peer == peer && xs[i].tag == ch->hdr.tag)
			x = &xs[i];
	if (x && x->len != len)
		return MR_EPROTO;
	if (!x && !(s = mr__chan_new_stash(ch->hdr.tag, len, &rc)))
		return rc;
	rc = mr__cma_recv(ch, x, s ? s->data : NULL, &d, len);
	mr__ring_bell(ch->peer_inbox);
	if (rc < 0) {
		if (s)
			free(s->data);
		free(s);
		return rc;
	}
	ch->cma_rx++;
	if (x) {
		x->pos = x->len;
		x->done = 1;
	} else {
		*ch->stash_tail = s;
		ch->stash_tail = &s->next;
	}
	return (long)(sizeof(d) + len);
}

/* Single-copy send: post the descriptor, complete when the reader is done. */
static long tx_cma(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *x)
{
	struct {
		struct mr__wire_hdr h;
		struct mr__cma_desc d;
	} m = { { x->tag, MR__HDR_CMA, x->len },
		{ (uint64_t)(uintptr_t)x->buf, (uint64_t)(uintptr_t)&ch->cma_sync, 0, 0, 0, 0, 0 } };
	struct mr__ring *r = ch->tx;

	if (!x->cma) {
		uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
		uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);

		/* header and descriptor become visible together (one head store) */
		if (h->ring_cap - (size_t)(head - tail) < sizeof(m))
			return 0;
		/* a registered buffer: the reader maps it (host_mem.c) */
		if (ch->cma == MR__CMA_VM)
			mr__mem_find(x->buf, x->len, &m.d);
		atomic_store_explicit(&r->cma, MR__CMA_POSTED, memory_order_relaxed);
		atomic_fetch_add_explicit(&ch->cma_sync, 1, memory_order_release);
		if (mr__chan_write(h, ch, &m, sizeof(m)) != (long)sizeof(m))
			return MR_EPROTO;
		x->cma = 1;
		return (long)sizeof(m);
	}
	if (atomic_load_explicit(&r->cma, memory_order_acquire) != MR__CMA_DONE)
		return 0;
	(void)atomic_load_explicit(&ch->cma_sync, memory_order_acquire);
	atomic_store_explicit(&r->cma, MR__CMA_IDLE, memory_order_relaxed);
	x->pos = x->len + sizeof(m.h);
	x->done = 1;
	return (long)x->len;
}

/* Progresses the receive side of one channel; returns bytes moved or error. */
static long rx_progress(struct mr__hcomm *h, int peer, struct mr__xfer *xs, int nx)
{
	struct mr__chan *ch = &h->ch[peer];
	long moved = 0, got;

	for (;;) {
		if (!ch->cur && !ch->cur_stash) {
			if (!has_pending_recv(xs, nx, peer))
				return moved;
			got = mr__chan_read(h, ch, (char *)&ch->hdr + ch->hdr_got,
					    sizeof(ch->hdr) - ch->hdr_got, 0);
			if (got < 0)
				return got;
			ch->hdr_got += (size_t)got;
			moved += got;
			if (ch->hdr_got < sizeof(ch->hdr))
				return moved;
			if (ch->hdr.zero & MR__HDR_CMA) {
				got = rx_cma(h, ch, xs, nx, peer);
				if (got < 0)
					return got;
				moved += got;
				ch->hdr_got = 0;
				continue;
			}
			for (int i = 0; i < nx; i++) {
				struct mr__xfer *x = &xs[i];

				if (x->done || x->send || x->peer != peer || x->tag != ch->hdr.tag)
					continue;
				if (x->len != ch->hdr.len)
					return MR_EPROTO;
				ch->cur = x;
				break;
			}
			if (!ch->cur) {
				int rc;

				ch->cur_stash = mr__chan_new_stash(ch->hdr.tag, ch->hdr.len, &rc);
				if (!ch->cur_stash)
					return rc;
				ch->stash_got = 0;
			}
		}
		if (ch->cur) {
			struct mr__xfer *x = ch->cur;

			if (x->red_dtype < 0)
				got = mr__chan_read(h, ch, x->buf + x->pos, x->len - x->pos,
						    x->stream);
			else
				got = mr__chan_read_reduce(h, ch, x);
			if (got < 0)
				return got;
			if (x->red_dtype < 0)
				x->pos += (size_t)got;
			moved += got;
			if (x->pos < x->len)
				return moved;
			x->done = 1;
			ch->cur = NULL;
		} else {
			struct mr__stash *s = ch->cur_stash;

			got = mr__chan_read(h, ch, s->data + ch->stash_got, s->len - ch->stash_got,
					    0);
			if (got < 0)
				return got;
			ch->stash_got += (size_t)got;
			moved += got;
			if (ch->stash_got < s->len)
				return moved;
			s->next = NULL;
			*ch->stash_tail = s;
			ch->stash_tail = &s->next;
			ch->cur_stash = NULL;
		}
		ch->hdr_got = 0;
	}
}

/* A piece of a local copy: fills the time the transfers wait for peers. */
static long local_progress(struct mr__xfer *x)
{
	size_t n = x->len - x->pos < LOCAL_PIECE ? x->len - x->pos : LOCAL_PIECE;

	if (x->stream)
		mr__copy_stream(x->buf + x->pos, x->red_src + x->pos, n);
	else
		memcpy(x->buf + x->pos, x->red_src + x->pos, n);
	x->pos += n;
	x->done = x->pos == x->len;
	return n ? (long)n : 1;
}

/* Payload bytes send x has written (pos also counts the header). */
static size_t sent_payload(const struct mr__xfer *x)
{
	size_t hdr = sizeof(struct mr__wire_hdr);

	return x->pos > hdr ? x->pos - hdr : 0;
}

/* Payload bytes of send x that exist so far: all, or for a forwarding send
 * what its receive has brought. Over TCP a forwarding send waits for
 * TCP_FORWARD_MIN new bytes (or the rest): every send() is a segment, and
 * 64 KiB pieces made a 2-rank 1 MiB allreduce 1.4x slower than steps. */
static size_t send_avail(const struct mr__hcomm *h, const struct mr__xfer *xs,
			 const struct mr__xfer *x)
{
	size_t sent = sent_payload(x), have = x->gate ? xs[x->gate - 1].pos : x->len;

	if (have < x->len && !h->ch[x->peer].shm && have - sent < TCP_FORWARD_MIN)
		return sent;
	return have;
}

/* Sends what it can of x; avail: payload bytes that exist so far
 * (send_avail). */
static long tx_progress(struct mr__hcomm *h, struct mr__xfer *x, size_t avail)
{
	struct mr__chan *ch = &h->ch[x->peer];
	struct mr__wire_hdr hdr = { .tag = x->tag, .zero = 0, .len = x->len };
	long moved = 0, w;

	/* user messages only when they do not fit the ring: a smaller send
	 * completes before its receive is posted, and callers may rely on it;
	 * single copy hands over the whole buffer, so it waits for all of it */
	if (x->cma || mr__cma_use(h, ch, x))
		return avail == x->len ? tx_cma(h, ch, x) : 0;
	if (!ch->shm && x->pos < sizeof(hdr)) {
		/* header and payload in one segment: one syscall, and the
		 * receiver never wakes for a header alone (small-message latency) */
		struct iovec iov[2] = { { (char *)&hdr + x->pos, sizeof(hdr) - x->pos },
					{ x->buf, avail } };
		struct msghdr mh = { .msg_iov = iov, .msg_iovlen = avail ? 2 : 1 };
		ssize_t sw;

		while ((sw = sendmsg(ch->tx_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL)) < 0 &&
		       errno == EINTR)
			;
		if (sw < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : MR_EPEER;
		x->pos += (size_t)sw;
		if (x->pos == x->len + sizeof(hdr))
			x->done = 1;
		return (long)sw;
	}
	if (x->pos < sizeof(hdr)) {
		w = mr__chan_write(h, ch, (char *)&hdr + x->pos, sizeof(hdr) - x->pos);
		if (w < 0)
			return w;
		x->pos += (size_t)w;
		moved += w;
		if (x->pos < sizeof(hdr))
			return moved;
	}
	w = mr__chan_write(h, ch, x->buf + (x->pos - sizeof(hdr)), avail + sizeof(hdr) - x->pos);
	if (w < 0)
		return w;
	x->pos += (size_t)w;
	moved += w;
	if (x->pos == x->len + sizeof(hdr))
		x->done = 1;
	return moved;
}

/* A forwarding send that may not send more yet: a writable socket is no
 * reason to wake (the receive's data is). */
static int starved(const struct mr__hcomm *h, const struct mr__xfer *xs, const struct mr__xfer *x)
{
	return x->gate && x->pos >= sizeof(struct mr__wire_hdr) &&
	       send_avail(h, xs, x) <= sent_payload(x);
}

/* Sleeps until something may have changed; checks liveness of shm peers. */
static int wait_some(struct mr__hcomm *h, struct mr__xfer *xs, int nx, uint32_t bell)
{
	struct pollfd live[64], tcp[65];
	struct mr__chan *lch[64];
	int nl = 0, nt = 0;

	for (int i = 0; i < nx; i++) {
		struct mr__chan *ch = &h->ch[xs[i].peer];

		if (xs[i].done)
			continue;
		if (ch->shm && nl < 64) {
			lch[nl] = ch;
			live[nl++] = (struct pollfd){ .fd = ch->fd, .events = POLLIN };
		}
		else if (!ch->shm && nt < 64 && !(xs[i].send && starved(h, xs, &xs[i])))
			tcp[nt++] = (struct pollfd){ .fd = xs[i].send ? ch->tx_fd : ch->rx_fd,
						     .events = xs[i].send ? POLLOUT : POLLIN };
	}
	if (nl && poll(live, (nfds_t)nl, 0) > 0) {
		/* an shm peer's socket only turns readable or hung up when it dies */
		for (int i = 0; i < nl; i++) {
			const struct mr__ring *rx = lch[i]->rx;
			int dead = 0;
			char b;

			if (live[i].revents & (POLLHUP | POLLERR | POLLNVAL))
				dead = 1;
			else if (live[i].revents & POLLIN) {
				ssize_t r = recv(live[i].fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);

				dead = r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR);
			}
			/* what it wrote before it exited (after our last pass over
			 * the rings) is still ours to read if a receive here wants
			 * it: fail once that is read */
			if (dead && (!has_pending_recv(xs, nx, (int)(lch[i] - h->ch)) ||
				     atomic_load_explicit(&rx->head, memory_order_acquire) ==
					     atomic_load_explicit(&rx->tail, memory_order_relaxed)))
				return MR_EPEER;
		}
	}
	if (!nt && !h->inbox) {
		poll(NULL, 0, 1);
		return 0;
	}
	if (!nt) {
		mr__inbox_sleep(h, bell, 5);
		return 0;
	}
	tcp[nt++] = (struct pollfd){ .fd = h->wake_fd, .events = POLLIN };
	if (poll(tcp, (nfds_t)nt, nl ? 1 : 10) > 0 && (tcp[nt - 1].revents & POLLIN)) {
		uint64_t v;

		if (read(h->wake_fd, &v, sizeof(v)) < 0) {
			/* EAGAIN: another thread drained it */
		}
	}
	return 0;
}

static int any_tcp(struct mr__hcomm *h, const struct mr__xfer *xs, int nx)
{
	for (int i = 0; i < nx; i++)
		if (!xs[i].done && !h->ch[xs[i].peer].shm)
			return 1;
	return 0;
}

static int hx_loop(struct mr__hcomm *h, struct mr__xfer **xsp, int *nxp, int *cap,
		   mr__refill_fn refill)
{
	static char zbuf[16];
	int idle = 0, hot = h->oversubscribed ? 0 : spin_hot();

	for (;;) {
		struct mr__xfer *xs = *xsp;
		int nx = *nxp, left = 0, rc;
		uint32_t bell = h->inbox ? atomic_load(&h->inbox->bell) : 0;
		long moved = 0, m;

		if (atomic_load(&h->aborted))
			return MR_EABORTED;
		for (int i = 0; i < nx; i++)
			if (!xs[i].buf)
				xs[i].buf = zbuf; /* zero-length transfers */
		for (int i = 0; i < nx; i++) {
			struct mr__xfer *x = &xs[i];
			int first = 1;

			if (x->done)
				continue;
			if (x->send) {
				for (int j = 0; j < i && first; j++)
					if (xs[j].send && !xs[j].done && xs[j].peer == x->peer)
						first = 0;
				if (!first)
					continue;
				if (x->local)
					m = local_progress(x);
				else
					m = tx_progress(h, x, send_avail(h, xs, x));
			} else {
				struct mr__chan *ch = &h->ch[x->peer];

				if (ch->cur == x)
					continue;
				m = mr__chan_match_stash(ch, x);
				if (m == 0 && !ch->cur)
					m = rx_progress(h, x->peer, xs, nx);
			}
			if (m < 0)
				return (int)m;
			moved += m;
		}
		/* receives already being filled */
		for (int i = 0; i < nx; i++) {
			struct mr__chan *ch = &h->ch[xs[i].peer];

			if (!xs[i].done && !xs[i].send && ch->cur == &xs[i]) {
				m = rx_progress(h, xs[i].peer, xs, nx);
				if (m < 0)
					return (int)m;
				moved += m;
			}
		}
		for (int i = 0; i < nx; i++)
			left += !xs[i].done;
		if (!left && !refill)
			return 0;
		if (moved) {
			idle = 0;
			/* a p2p batch may live long: it times out only without progress */
			if (refill)
				h->deadline = mr__now_ms() + h->base.timeout_ms;
			/* a waiter checks after every move whether it may leave */
			if (!refill || !h->yield_for)
				continue;
		}
		if (refill) {
			int n2;

			/* refill may move the array; the channels follow it */
			n2 = refill(h, xsp, nx, cap);
			if (n2 < 0)
				return n2;
			*nxp = n2;
			if (n2 != nx)
				continue;
			if (!left)
				return 0;
			if (h->yield_for && h->yield_for->done)
				return MR__HX_YIELD;
			if (moved)
				continue;
			xs = *xsp;
		}
		if (mr__now_ms() > h->deadline)
			return MR_ETIMEDOUT;
		/* with a TCP peer involved poll() wakes on data: spinning on
		 * recv() syscalls would only burn the CPU the peer needs */
		if (idle == 0 && h->has_tcp && any_tcp(h, xs, nx))
			idle = hot;
		/* spin or yield only while a thread is blocked on this
		 * communicator; behind compute, sleep until data arrives */
		if (atomic_load(&h->waiters) > 0) {
			if (++idle < hot) {
				cpu_relax();
				continue;
			}
			if (idle < hot + SPIN_YIELD) {
				sched_yield();
				continue;
			}
		}
		rc = wait_some(h, xs, nx, bell);
		if (rc < 0)
			return rc;
	}
}

int mr__hx_run(struct mr__hcomm *h, struct mr__xfer **xsp, int *nxp, int *cap,
	       mr__refill_fn refill)
{
	int rc = hx_loop(h, xsp, nxp, cap, refill);

	/* no reader may start on (or still be in) a buffer we hand back */
	if (rc < 0)
		mr__cma_revoke(h, *xsp, *nxp);
	return rc;
}

int mr__hx_try(struct mr__hcomm *h, struct mr__xfer *x)
{
	struct mr__chan *ch = &h->ch[x->peer];
	static char zbuf[16];
	long m;

	if (!x->buf)
		x->buf = zbuf;
	if (x->send) {
		/* a single-copy send waits for its reader: leave it to the queue */
		if (mr__cma_use(h, ch, x))
			return 0;
		m = tx_progress(h, x, x->len);
		return m < 0 ? (int)m : x->done;
	}
	if ((m = mr__chan_match_stash(ch, x)) != 0)
		return (int)m;
	return ch->shm ? mr__chan_try_recv(h, ch, x) : 0;
}

int mr__hx_sendrecv(struct mr__hcomm *h, int to, const void *sbuf, size_t slen, int from,
		    void *rbuf, size_t rlen, int red_dtype, int redop)
{
	struct mr__xfer x[2], *xs = x;
	int n = 0, cap = 2;

	if (to >= 0)
		/* the collectives are symmetric: what we reduce, the peer reduces */
		x[n++] = (struct mr__xfer){ .peer = to, .send = 1, .tag = MR__TAG_COLL,
					    .buf = (char *)sbuf, .len = slen, .red_dtype = -1,
					    .reduced = red_dtype >= 0 };
	if (from >= 0)
		x[n++] = (struct mr__xfer){ .peer = from, .send = 0, .tag = MR__TAG_COLL,
					    .buf = rbuf, .len = rlen, .red_dtype = red_dtype,
					    .redop = redop };
	return mr__hx_run(h, &xs, &n, &cap, NULL);
}
