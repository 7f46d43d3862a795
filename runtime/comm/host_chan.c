/*
 * host_chan.c - byte channels (shared-memory ring or TCP socket) and the
 * transfer engine of the host backend.
 *
 * mr__hx_run() takes a set of transfers (send or receive, one peer each)
 * and progresses all of them at once without blocking on any single one:
 * sends to one peer go out in list order, received messages are matched
 * to pending receives by (peer, tag) in order or stashed. When nothing
 * moves it spins briefly (sched_yield), then sleeps on the doorbell futex
 * (shared memory only) or in poll() (TCP involved) for at most a few
 * milliseconds, checking abort, the deadline and peer liveness each time.
 *
 * Large messages between shared-memory peers go by single copy instead
 * (host_cma.c): the ring carries only a descriptor.
 *
 * Non-goals: wildcard receives.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "host_int.h"

/* Idle passes spent busy-polling (small-message latency), then yielding,
 * then sleeping on the doorbell / poll(); the first two only while some
 * thread waits on the communicator (host_int.h: waiters). MR_COMM_SPIN
 * overrides the first. */
#define SPIN_HOT 1000
#define SPIN_YIELD 200

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
#define MAX_STASH ((size_t)1 << 32)
#define LOCAL_PIECE ((size_t)256 << 10)
#define TCP_FORWARD_MIN ((size_t)256 << 10)

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static void futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void futex_wait(_Atomic uint32_t *w, uint32_t val, long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

static void ring_bell(struct mr__inbox_hdr *ib)
{
	atomic_fetch_add(&ib->bell, 1);
	if (atomic_load(&ib->sleeping))
		futex_wake(&ib->bell);
}

void mr__wake_self(struct mr__hcomm *h)
{
	uint64_t one = 1;

	if (h->inbox)
		ring_bell(h->inbox);
	if (h->wake_fd >= 0 && write(h->wake_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, a wake-up is pending anyway */
	}
}

static char *ring_data(struct mr__ring *r)
{
	return (char *)(r + 1);
}

/* >= 0 bytes written, or MR_EPEER. */
static long chan_write(struct mr__hcomm *h, struct mr__chan *ch, const void *p, size_t n)
{
	if (ch->shm) {
		struct mr__ring *r = ch->tx;
		uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
		uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
		size_t space = h->ring_cap - (size_t)(head - tail), off, first;

		if (n > space)
			n = space;
		if (!n)
			return 0;
		off = (size_t)(head & (h->ring_cap - 1));
		first = h->ring_cap - off < n ? h->ring_cap - off : n;
		memcpy(ring_data(r) + off, p, first);
		memcpy(ring_data(r), (const char *)p + first, n - first);
		atomic_store_explicit(&r->head, head + n, memory_order_release);
		ring_bell(ch->peer_inbox);
		return (long)n;
	}
	for (;;) {
		ssize_t w = send(ch->tx_fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (w >= 0)
			return (long)w;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return MR_EPEER;
	}
}

/* >= 0 bytes read, or MR_EPEER; stream: copy out of an shm ring with
 * streaming stores (a large receive buffer). */
static long chan_read_to(struct mr__hcomm *h, struct mr__chan *ch, void *p, size_t n, int stream)
{
	if (ch->shm) {
		struct mr__ring *r = ch->rx;
		uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
		uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
		size_t avail = (size_t)(head - tail), off, first;

		if (n > avail)
			n = avail;
		if (!n)
			return 0;
		off = (size_t)(tail & (h->ring_cap - 1));
		first = h->ring_cap - off < n ? h->ring_cap - off : n;
		if (stream) {
			mr__copy_stream(p, ring_data(r) + off, first);
			mr__copy_stream((char *)p + first, ring_data(r), n - first);
		} else {
			memcpy(p, ring_data(r) + off, first);
			memcpy((char *)p + first, ring_data(r), n - first);
		}
		atomic_store_explicit(&r->tail, tail + n, memory_order_release);
		ring_bell(ch->peer_inbox);
		return (long)n;
	}
	if (!n)
		return 0;
	for (;;) {
		ssize_t got = recv(ch->rx_fd, p, n, MSG_DONTWAIT);

		if (got > 0)
			return (long)got;
		if (got == 0)
			return MR_EPEER;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return MR_EPEER;
	}
}

static long chan_read(struct mr__hcomm *h, struct mr__chan *ch, void *p, size_t n)
{
	return chan_read_to(h, ch, p, n, 0);
}

void mr__chan_release(struct mr__chan *ch)
{
	struct mr__stash *s = ch->stash;

	while (s) {
		struct mr__stash *nx = s->next;

		free(s->data);
		free(s);
		s = nx;
	}
	ch->stash = NULL;
	free(ch->cur_stash ? ch->cur_stash->data : NULL);
	free(ch->cur_stash);
	ch->cur_stash = NULL;
	free(ch->bounce);
	ch->bounce = NULL;
	if (ch->fd >= 0)
		close(ch->fd);
	if (ch->fd2 >= 0)
		close(ch->fd2);
	ch->fd = ch->fd2 = ch->tx_fd = ch->rx_fd = -1;
}

void mr__chan_shutdown(struct mr__hcomm *h)
{
	for (int i = 0; i < h->n; i++) {
		if (h->ch[i].fd >= 0)
			shutdown(h->ch[i].fd, SHUT_RDWR);
		if (h->ch[i].fd2 >= 0)
			shutdown(h->ch[i].fd2, SHUT_RDWR);
	}
}

static void deliver(struct mr__xfer *x, const char *src, size_t n)
{
	if (x->red_dtype >= 0 && x->red_src)
		mr__reduce3(x->buf, x->red_src, src, n / mr_comm_dtype_size(x->red_dtype),
			    x->red_dtype, x->redop);
	else if (x->red_dtype >= 0)
		mr__reduce(x->buf, src, n / mr_comm_dtype_size(x->red_dtype), x->red_dtype,
			   x->redop);
	else
		memcpy(x->buf, src, n);
}

/* Matches pending receives against already stashed messages. */
static int match_stash(struct mr__chan *ch, struct mr__xfer *x)
{
	struct mr__stash **pp = &ch->stash;

	for (; *pp; pp = &(*pp)->next) {
		struct mr__stash *s = *pp;

		if (s->tag != x->tag)
			continue;
		if (s->len != x->len)
			return MR_EPROTO;
		deliver(x, s->data, s->len);
		x->pos = x->len;
		x->done = 1;
		*pp = s->next;
		if (!*pp)
			ch->stash_tail = pp;
		free(s->data);
		free(s);
		return 1;
	}
	return 0;
}

/* Reads payload into a reduce-mode receive through the bounce buffer. */
static long read_reduce(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *x)
{
	size_t esz = mr_comm_dtype_size(x->red_dtype);
	size_t want = x->len - x->pos - ch->bounce_fill, room = MR__BOUNCE - ch->bounce_fill;
	long got;
	size_t whole;

	if (!ch->bounce && !(ch->bounce = malloc(MR__BOUNCE)))
		return MR_ENOMEM;
	got = chan_read(h, ch, ch->bounce + ch->bounce_fill, want < room ? want : room);
	if (got <= 0)
		return got;
	ch->bounce_fill += (size_t)got;
	whole = ch->bounce_fill / esz * esz;
	if (x->red_src)
		mr__reduce3(x->buf + x->pos, x->red_src + x->pos, ch->bounce, whole / esz,
			    x->red_dtype, x->redop);
	else
		mr__reduce(x->buf + x->pos, ch->bounce, whole / esz, x->red_dtype, x->redop);
	x->pos += whole;
	memmove(ch->bounce, ch->bounce + whole, ch->bounce_fill - whole);
	ch->bounce_fill -= whole;
	return got;
}

/* Reduces straight out of an shm ring (no bounce copy): whole elements up
 * to the ring's wrap point, 64 KiB at a time so the writer refills early.
 * 0 when nothing fits (no data, an element straddles the wrap, or the
 * data is misaligned): the bounce buffer takes it then. */
static long reduce_ring(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *x)
{
	struct mr__ring *r = ch->rx;
	size_t esz = mr_comm_dtype_size(x->red_dtype);
	uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
	uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
	size_t off = (size_t)(tail & (h->ring_cap - 1)), n = (size_t)(head - tail);
	const char *src = ring_data(r) + off;

	if (n > x->len - x->pos)
		n = x->len - x->pos;
	if (n > h->ring_cap - off)
		n = h->ring_cap - off;
	if (n > MR__BOUNCE)
		n = MR__BOUNCE;
	n = n / esz * esz;
	/* odd-sized earlier messages can leave the ring unaligned for esz */
	if (!n || (uintptr_t)src % esz)
		return 0;
	if (x->red_src)
		mr__reduce3(x->buf + x->pos, x->red_src + x->pos, src, n / esz, x->red_dtype,
			    x->redop);
	else
		mr__reduce(x->buf + x->pos, src, n / esz, x->red_dtype, x->redop);
	atomic_store_explicit(&r->tail, tail + n, memory_order_release);
	ring_bell(ch->peer_inbox);
	x->pos += n;
	return (long)n;
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

	if (chan_read(h, ch, &d, sizeof(d)) != (long)sizeof(d))
		return MR_EPROTO;
	for (int i = 0; i < nx && !x; i++)
		if (!xs[i].done && !xs[i].send && xs[i].peer == peer && xs[i].tag == ch->hdr.tag)
			x = &xs[i];
	if (x && x->len != len)
		return MR_EPROTO;
	if (!x) {
		if (len > MAX_STASH)
			return MR_EPROTO;
		s = calloc(1, sizeof(*s));
		if (!s || !(s->data = malloc(len ? len : 1))) {
			free(s);
			return MR_ENOMEM;
		}
		s->tag = ch->hdr.tag;
		s->len = len;
	}
	rc = mr__cma_recv(ch, x, s ? s->data : NULL, &d, len);
	ring_bell(ch->peer_inbox);
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
		{ (uint64_t)(uintptr_t)x->buf, (uint64_t)(uintptr_t)&ch->cma_sync } };
	struct mr__ring *r = ch->tx;

	if (!x->cma) {
		uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
		uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);

		/* header and descriptor become visible together (one head store) */
		if (h->ring_cap - (size_t)(head - tail) < sizeof(m))
			return 0;
		atomic_store_explicit(&r->cma, MR__CMA_POSTED, memory_order_relaxed);
		atomic_fetch_add_explicit(&ch->cma_sync, 1, memory_order_release);
		if (chan_write(h, ch, &m, sizeof(m)) != (long)sizeof(m))
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
			got = chan_read(h, ch, (char *)&ch->hdr + ch->hdr_got,
					sizeof(ch->hdr) - ch->hdr_got);
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
				struct mr__stash *s;

				if (ch->hdr.len > MAX_STASH)
					return MR_EPROTO;
				s = calloc(1, sizeof(*s));
				if (!s || !(s->data = malloc(ch->hdr.len ? ch->hdr.len : 1))) {
					free(s);
					return MR_ENOMEM;
				}
				s->tag = ch->hdr.tag;
				s->len = ch->hdr.len;
				ch->cur_stash = s;
				ch->stash_got = 0;
			}
		}
		if (ch->cur) {
			struct mr__xfer *x = ch->cur;

			if (x->red_dtype < 0) {
				got = chan_read_to(h, ch, x->buf + x->pos, x->len - x->pos,
						   x->stream);
			} else {
				got = 0;
				if (x->pos < x->len && ch->shm && !ch->bounce_fill)
					got = reduce_ring(h, ch, x);
				if (x->pos < x->len && !got)
					got = read_reduce(h, ch, x);
			}
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

			got = chan_read(h, ch, s->data + ch->stash_got, s->len - ch->stash_got);
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

/* Payload bytes of send x that exist so far: all, or for a forwarding send
 * what its receive has brought. Over TCP a forwarding send waits for
 * TCP_FORWARD_MIN new bytes (or the rest): every send() is a segment, and
 * 64 KiB pieces made a 2-rank 1 MiB allreduce 1.4x slower than steps. */
static size_t send_avail(const struct mr__hcomm *h, const struct mr__xfer *xs,
			 const struct mr__xfer *x)
{
	size_t hdr = sizeof(struct mr__wire_hdr), sent = x->pos > hdr ? x->pos - hdr : 0;
	size_t have = x->gate ? xs[x->gate - 1].pos : x->len;

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
		w = chan_write(h, ch, (char *)&hdr + x->pos, sizeof(hdr) - x->pos);
		if (w < 0)
			return w;
		x->pos += (size_t)w;
		moved += w;
		if (x->pos < sizeof(hdr))
			return moved;
	}
	w = chan_write(h, ch, x->buf + (x->pos - sizeof(hdr)), avail + sizeof(hdr) - x->pos);
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
	size_t hdr = sizeof(struct mr__wire_hdr);

	return x->gate && x->pos >= hdr && send_avail(h, xs, x) <= x->pos - hdr;
}

/* Sleeps until something may have changed; checks liveness of shm peers. */
static int wait_some(struct mr__hcomm *h, struct mr__xfer *xs, int nx, uint32_t bell)
{
	struct pollfd live[64], tcp[65];
	int nl = 0, nt = 0;

	for (int i = 0; i < nx; i++) {
		struct mr__chan *ch = &h->ch[xs[i].peer];

		if (xs[i].done)
			continue;
		if (ch->shm && nl < 64)
			live[nl++] = (struct pollfd){ .fd = ch->fd, .events = POLLIN };
		else if (!ch->shm && nt < 64 && !(xs[i].send && starved(h, xs, &xs[i])))
			tcp[nt++] = (struct pollfd){ .fd = xs[i].send ? ch->tx_fd : ch->rx_fd,
						     .events = xs[i].send ? POLLOUT : POLLIN };
	}
	if (nl && poll(live, (nfds_t)nl, 0) > 0) {
		/* an shm peer's socket only turns readable or hung up when it dies */
		for (int i = 0; i < nl; i++) {
			char b;

			if (live[i].revents & (POLLHUP | POLLERR | POLLNVAL))
				return MR_EPEER;
			if (live[i].revents & POLLIN) {
				ssize_t r = recv(live[i].fd, &b, 1, MSG_DONTWAIT | MSG_PEEK);

				if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
					return MR_EPEER;
			}
		}
	}
	if (!nt && !h->inbox) {
		poll(NULL, 0, 1);
		return 0;
	}
	if (!nt) {
		atomic_store(&h->inbox->sleeping, 1);
		futex_wait(&h->inbox->bell, bell, 5);
		atomic_store(&h->inbox->sleeping, 0);
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
				m = match_stash(ch, x);
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
			continue;
		}
		if (refill) {
			int n2;

			/* refill may move the array: keep in-progress receives by index */
			for (int i = 0; i < h->n; i++)
				h->ch[i].cur_idx = h->ch[i].cur ? (long)(h->ch[i].cur - xs) : -1;
			n2 = refill(h, xsp, nx, cap);
			for (int i = 0; i < h->n; i++)
				h->ch[i].cur = h->ch[i].cur_idx >= 0 ? *xsp + h->ch[i].cur_idx : NULL;
			if (n2 < 0)
				return n2;
			*nxp = n2;
			if (n2 != nx)
				continue;
			if (!left)
				return 0;
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

/* Peeks a whole message at the head of an shm channel for x, else 0. */
static int try_recv_shm(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *x)
{
	struct mr__ring *r = ch->rx;
	uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
	uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
	size_t off = (size_t)(tail & (h->ring_cap - 1)), first;
	struct mr__wire_hdr hdr;

	if (ch->cur || ch->cur_stash || ch->hdr_got || head - tail < sizeof(hdr))
		return 0;
	first = h->ring_cap - off < sizeof(hdr) ? h->ring_cap - off : sizeof(hdr);
	memcpy(&hdr, ring_data(r) + off, first);
	memcpy((char *)&hdr + first, ring_data(r), sizeof(hdr) - first);
	if (hdr.zero || hdr.tag != x->tag || hdr.len != x->len ||
	    head - tail < sizeof(hdr) + hdr.len)
		return 0;
	chan_read(h, ch, &hdr, sizeof(hdr));
	if (x->len && chan_read(h, ch, x->buf, x->len) != (long)x->len)
		return MR_EPROTO;
	x->pos = x->len;
	x->done = 1;
	return 1;
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
	if ((m = match_stash(ch, x)) != 0)
		return (int)m;
	return ch->shm ? try_recv_shm(h, ch, x) : 0;
}

int mr__hx_sendrecv(struct mr__hcomm *h, int to, const void *sbuf, size_t slen, int from,
		    void *rbuf, size_t rlen, int red_dtype, int redop)
{
	return mr__hx_sendrecv3(h, to, sbuf, slen, from, rbuf, rlen, red_dtype, redop, NULL);
}

int mr__hx_sendrecv3(struct mr__hcomm *h, int to, const void *sbuf, size_t slen, int from,
		     void *rbuf, size_t rlen, int red_dtype, int redop, const void *red_src)
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
					    .redop = redop, .red_src = red_src };
	return mr__hx_run(h, &xs, &n, &cap, NULL);
}
