/*
 * host_chan.c - byte channels of the host backend: per peer a
 * shared-memory ring pair or a TCP connection pair, read and written
 * without blocking; the doorbell futex; the stash of messages nobody waits
 * for yet; and reads that reduce into a receive as the data comes in.
 *
 * The transfer engine (host_xfer.c) decides what moves when; everything
 * here moves as much as it can at once and returns.
 *
 * Non-goals: blocking I/O (the engine sleeps, channels never do).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "host_int.h"

#define MAX_STASH ((size_t)1 << 32)

static void futex_wake(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static void futex_wait(_Atomic uint32_t *w, uint32_t val, long ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };

	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, val, &ts, NULL, 0);
}

void mr__ring_bell(struct mr__inbox_hdr *ib)
{
	atomic_fetch_add(&ib->bell, 1);
	if (atomic_load(&ib->sleeping))
		futex_wake(&ib->bell);
}

void mr__wake_self(struct mr__hcomm *h)
{
	uint64_t one = 1;

	if (h->inbox)
		mr__ring_bell(h->inbox);
	if (h->wake_fd >= 0 && write(h->wake_fd, &one, sizeof(one)) < 0) {
		/* EAGAIN: the counter is full, a wake-up is pending anyway */
	}
}

/* Sleeps on this rank's doorbell for at most ms while it still reads bell. */
void mr__inbox_sleep(struct mr__hcomm *h, uint32_t bell, long ms)
{
	atomic_store(&h->inbox->sleeping, 1);
	futex_wait(&h->inbox->bell, bell, ms);
	atomic_store(&h->inbox->sleeping, 0);
}

static char *ring_data(struct mr__ring *r)
{
	return (char *)(r + 1);
}

/* >= 0 bytes written, or MR_EPEER. */
long mr__chan_write(struct mr__hcomm *h, struct mr__chan *ch, const void *p, size_t n)
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
		mr__ring_bell(ch->peer_inbox);
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
long mr__chan_read(struct mr__hcomm *h, struct mr__chan *ch, void *p, size_t n, int stream)
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
		mr__ring_bell(ch->peer_inbox);
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
	mr__mem_unmap_peers(ch);
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

struct mr__stash *mr__chan_new_stash(int tag, size_t len, int *rc)
{
	struct mr__stash *s;

	*rc = MR_EPROTO;
	if (len > MAX_STASH)
		return NULL;
	*rc = MR_ENOMEM;
	s = calloc(1, sizeof(*s));
	if (!s || !(s->data = malloc(len ? len : 1))) {
		free(s);
		return NULL;
	}
	s->tag = tag;
	s->len = len;
	return s;
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
int mr__chan_match_stash(struct mr__chan *ch, struct mr__xfer *x)
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
	got = mr__chan_read(h, ch, ch->bounce + ch->bounce_fill, want < room ? want : room, 0);
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
	mr__ring_bell(ch->peer_inbox);
	x->pos += n;
	return (long)n;
}

long mr__chan_read_reduce(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *x)
{
	long got = 0;

	if (x->pos < x->len && ch->shm && !ch->bounce_fill)
		got = reduce_ring(h, ch, x);
	if (x->pos < x->len && !got)
		got = read_reduce(h, ch, x);
	return got;
}

/* Peeks a whole message at the head of an shm channel for x, else 0. */
int mr__chan_try_recv(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *x)
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
	mr__chan_read(h, ch, &hdr, sizeof(hdr), 0);
	if (x->len && mr__chan_read(h, ch, x->buf, x->len, 0) != (long)x->len)
		return MR_EPROTO;
	x->pos = x->len;
	x->done = 1;
	return 1;
}
