/*
 * host_cma.c - single-copy transfers between shared-memory peers of the
 * host backend: the receiver reads the sender's buffer itself, with
 * process_vm_readv (cross-memory attach) between processes or memcpy when
 * both ranks are threads of one process.
 *
 * Protocol (host_int.h): the sender writes a header flagged MR__HDR_CMA and
 * a descriptor (its buffer's address) into the ring after setting the
 * ring's cma word to POSTED, and completes when the word turns DONE. The
 * receiver claims the buffer (POSTED -> TAKEN, compare-and-swap), copies or
 * reduces from it, stores DONE and rings the sender's doorbell. A sender
 * that fails (abort, dead peer, timeout) revokes an untaken descriptor
 * (POSTED -> REVOKED; the receiver then fails with MR_EPEER) and, when the
 * reader is a thread of this process, waits for a running copy to end
 * before its buffer may be freed. A sender process that dies before or
 * during the copy makes process_vm_readv fail (ESRCH, EFAULT): MR_EPEER.
 *
 * Bootstrap publishes {pid, cookie, &cookie} in the inbox header; a peer
 * uses single copy only when reading the cookie through process_vm_readv
 * works and returns the same value (so ptrace restrictions, seccomp or
 * another pid namespace fall back to the ring copy).
 * Between processes, a buffer from mr_comm_mem_alloc() (host_mem.c) is
 * read through a mapping of it, with memcpy or the reduction itself;
 * other buffers go through the ring unless MR_COMM_CMA_VM_MIN asks for
 * process_vm_readv.
 * MR_COMM_CMA=0 disables it; MR_COMM_CMA_MIN / MR_COMM_CMA_VM_MIN set the
 * smallest collective message that uses memcpy (threads, registered
 * buffers) / process_vm_readv (user send/recv: only messages that do not
 * fit the ring either, which would wait for the receiver anyway); data
 * the receiver reduces never goes by process_vm_readv.
 *
 * Non-goals: writes into the peer (process_vm_writev), iovec batching.
 */
#include <errno.h>
#include <stdint.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "host_int.h"

/* Measured on this 2-core VM (docs/PERFORMANCE.md): a memcpy from the peer
 * thread wins from 64 KiB; process_vm_readv (pages pinned per call) lost to
 * the ring's cache-resident double copy at every size for every op but
 * allgather (5-10 %), so between processes it is off unless
 * MR_COMM_CMA_VM_MIN asks for it */
#define CMA_MIN_DEFAULT (64 << 10)
#define CMA_VM_MIN_DEFAULT SIZE_MAX

static int cma_enabled(void)
{
	const char *e = getenv("MR_COMM_CMA");

	return !(e && !strcmp(e, "0"));
}

void mr__cma_publish(struct mr__hcomm *h)
{
	struct timespec ts;
	uint64_t seed;

	h->cma_min = mr__env_size("MR_COMM_CMA_MIN", CMA_MIN_DEFAULT);
	h->cma_vm_min = mr__env_size("MR_COMM_CMA_VM_MIN", CMA_VM_MIN_DEFAULT);
	if (!h->inbox || !cma_enabled())
		return;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)h;
	h->cma_cookie = mr__hash(&seed, sizeof(seed), (uint64_t)getpid()) | 1;
	h->inbox->cma_pid = (int64_t)getpid();
	h->inbox->cma_addr = (uint64_t)(uintptr_t)&h->cma_cookie;
	h->inbox->cma_cookie = h->cma_cookie;
}

void mr__cma_probe(struct mr__hcomm *h, int p)
{
	struct mr__inbox_hdr *ib = h->maps[p];
	struct mr__chan *ch = &h->ch[p];
	uint64_t got = 0;
	struct iovec l = { &got, sizeof(got) };
	struct iovec r = { (void *)(uintptr_t)ib->cma_addr, sizeof(got) };

	ch->cma = 0;
	if (!h->cma_cookie || !ib->cma_cookie || ib->cma_pid <= 0)
		return;
	if (process_vm_readv((pid_t)ib->cma_pid, &l, 1, &r, 1, 0) != (ssize_t)sizeof(got) ||
	    got != ib->cma_cookie)
		return;
	ch->cma_pid = (pid_t)ib->cma_pid;
	ch->cma = ch->cma_pid == getpid() ? MR__CMA_DIRECT : MR__CMA_VM;
}

/* The sender's liveness socket is still open: the kernel closes it when
 * the process exits, before its pid can be reused. */
static int alive(struct mr__chan *ch)
{
	struct pollfd pf = { .fd = ch->fd, .events = POLLIN };

	return poll(&pf, 1, 0) == 0;
}

/* Copies len bytes of the peer's buffer at addr into dst; direct: where
 * this process reads that buffer itself (NULL: process_vm_readv). */
static int pull(struct mr__chan *ch, void *dst, uint64_t addr, const char *direct, size_t len,
		int stream)
{
	char *d = dst;

	if (direct) {
		if (stream)
			mr__copy_stream(dst, direct, len);
		else
			memcpy(dst, direct, len);
		return 0;
	}
	while (len) {
		struct iovec l = { d, len }, r = { (void *)(uintptr_t)addr, len };
		ssize_t n = process_vm_readv(ch->cma_pid, &l, 1, &r, 1, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return MR_EPEER; /* ESRCH: the sender is gone; EFAULT: unmapped */
		d += n;
		addr += (uint64_t)n;
		len -= (size_t)n;
	}
	return 0;
}

/* x (receive, reduce mode) = [red_src op] incoming, incoming read at addr. */
static int pull_reduce(struct mr__chan *ch, struct mr__xfer *x, uint64_t addr,
		       const char *direct)
{
	size_t esz = mr_comm_dtype_size(x->red_dtype), step = MR__BOUNCE / esz * esz;

	for (size_t off = 0; off < x->len; off += step) {
		size_t n = x->len - off < step ? x->len - off : step;
		const char *src = direct ? direct + off : NULL;
		int rc;

		if (!src || (uintptr_t)src % esz) {
			if (!ch->bounce && !(ch->bounce = malloc(MR__BOUNCE)))
				return MR_ENOMEM;
			if ((rc = pull(ch, ch->bounce, addr + off, src, n, 0)) < 0)
				return rc;
			src = ch->bounce;
		}
		if (x->red_src)
			mr__reduce3(x->buf + off, x->red_src + off, src, n / esz, x->red_dtype,
				    x->redop);
		else
			mr__reduce(x->buf + off, src, n / esz, x->red_dtype, x->redop);
	}
	return 0;
}

int mr__cma_recv(struct mr__chan *ch, struct mr__xfer *x, char *dst,
		 const struct mr__cma_desc *d, size_t len)
{
	_Atomic uint32_t *sync = (_Atomic uint32_t *)(uintptr_t)d->sync;
	uint32_t want = MR__CMA_POSTED;
	const char *direct;
	int rc;

	/* the sender revoked the buffer (it failed): the stream is lost */
	if (!ch->cma || !atomic_compare_exchange_strong(&ch->rx->cma, &want, MR__CMA_TAKEN))
		return MR_EPEER;
	if (ch->cma == MR__CMA_DIRECT) {
		(void)atomic_load_explicit(sync, memory_order_acquire);
		direct = (const char *)(uintptr_t)d->addr;
	} else {
		direct = mr__mem_peer(ch, d);
	}
	if (x && x->red_dtype >= 0)
		rc = pull_reduce(ch, x, d->addr, direct);
	else
		rc = pull(ch, x ? x->buf : dst, d->addr, direct, len, x && x->stream);
	if (ch->cma == MR__CMA_DIRECT)
		atomic_fetch_add_explicit(sync, 1, memory_order_release);
	atomic_store_explicit(&ch->rx->cma, MR__CMA_DONE, memory_order_release);
	/* process_vm_readv: the pid may since belong to another process;
	 * a mapping: the data is whole, but a dead sender fails like any */
	if (rc == 0 && ch->cma == MR__CMA_VM && !alive(ch))
		rc = MR_EPEER;
	return rc;
}

int mr__cma_use(const struct mr__hcomm *h, const struct mr__chan *ch, const struct mr__xfer *x)
{
	size_t min = h->cma_min;
	struct mr__cma_desc d;

	if (!ch->cma)
		return 0;
	if (x->tag != MR__TAG_COLL && !x->rendezvous && min < h->ring_cap)
		min = h->ring_cap;
	if (x->len < min)
		return 0;
	/* between processes: from a registered buffer (a plain memcpy or
	 * reduction by the peer), else by process_vm_readv when asked for */
	if (ch->cma == MR__CMA_VM && !mr__mem_find(x->buf, x->len, &d))
		return !x->reduced && x->len >= h->cma_vm_min;
	return 1;
}

void mr__cma_revoke(struct mr__hcomm *h, const struct mr__xfer *xs, int nx)
{
	for (int i = 0; i < nx; i++) {
		const struct mr__xfer *x = &xs[i];
		struct mr__chan *ch = &h->ch[x->peer];
		uint32_t want = MR__CMA_POSTED;

		if (!x->send || x->done || !x->cma)
			continue;
		if (atomic_compare_exchange_strong(&ch->tx->cma, &want, MR__CMA_REVOKED))
			continue;
		/* a thread of this process copies from the buffer right now:
		 * it finishes (no blocking inside a copy) before we may return */
		while (ch->cma == MR__CMA_DIRECT &&
		       atomic_load(&ch->tx->cma) == MR__CMA_TAKEN)
			sched_yield();
	}
}
