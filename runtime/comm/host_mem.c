/*
 * host_mem.c - registered buffers: memory that shared-memory peers in
 * other processes read directly, so a large transfer from it costs one
 * copy (the receiver's memcpy or reduction) instead of two through the
 * ring, and no page pinning as with process_vm_readv (like ncclMemAlloc).
 *
 * mr_comm_mem_alloc() backs each buffer with its own memfd, mapped shared
 * and kept in a process-wide registry. A send whose bytes lie inside one
 * names it in its single-copy descriptor (host_cma.c): the memfd's inode,
 * the sender's fd number, a per-process sequence number and the offset. The
 * receiver opens /proc/<pid>/fd/<fd> (the same ptrace access check as
 * process_vm_readv, which the channel already passed), checks the inode,
 * maps it read-only and keeps the mapping per channel, keyed by the
 * sequence number, which is never reused: a freed and reallocated buffer
 * is a new key, never a stale mapping. A mapping holds the memfd's pages,
 * so nothing the sender does (exit, free) can fault the reader.
 *
 * When a memfd cannot be had (no memfd_create, seccomp) the buffer is
 * ordinary anonymous memory and transfers from it take the usual path.
 *
 * Non-goals: registering memory the caller allocated elsewhere, device
 * memory (the NCCL backend has its own allocator).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host_int.h"

#define PEER_MAPS_MAX 32 /* per channel; the oldest is unmapped beyond */

struct seg {
	char *base;
	size_t len;        /* mapped bytes (page multiple) */
	int fd;            /* -1: anonymous memory, not registered */
	uint64_t ino, seq;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seg *reg;
static size_t reg_n, reg_cap;
static uint64_t reg_seq;

static size_t page_round(size_t len)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);

	return len ? (len + pg - 1) / pg * pg : pg;
}

/* A shared mapping of a new memfd of len bytes, or -1. */
static int memfd_segment(struct seg *s)
{
	struct stat st;

	s->fd = memfd_create("meshrun-mem", MFD_CLOEXEC);
	if (s->fd < 0)
		return -1;
	if (ftruncate(s->fd, (off_t)s->len) < 0 || fstat(s->fd, &st) < 0)
		goto fail;
	s->base = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
	if (s->base == MAP_FAILED)
		goto fail;
	s->ino = (uint64_t)st.st_ino;
	return 0;
fail:
	close(s->fd);
	s->fd = -1;
	return -1;
}

void *mr_comm_mem_alloc(size_t len)
{
	struct seg s = { .len = page_round(len), .fd = -1 };

	if (memfd_segment(&s) < 0) {
		s.base = mmap(NULL, s.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			      -1, 0);
		if (s.base == MAP_FAILED)
			return NULL;
	}
	pthread_mutex_lock(&reg_mu);
	if (reg_n == reg_cap) {
		size_t cap = reg_cap ? 2 * reg_cap : 16;
		struct seg *r = realloc(reg, cap * sizeof(*r));

		if (!r) {
			pthread_mutex_unlock(&reg_mu);
			munmap(s.base, s.len);
			if (s.fd >= 0)
				close(s.fd);
			return NULL;
		}
		reg = r;
		reg_cap = cap;
	}
	s.seq = ++reg_seq;
	reg[reg_n++] = s;
	pthread_mutex_unlock(&reg_mu);
	return s.base;
}

void mr_comm_mem_free(void *p)
{
	struct seg s = { .base = NULL };

	if (!p)
		return;
	pthread_mutex_lock(&reg_mu);
	for (size_t i = 0; i < reg_n; i++)
		if (reg[i].base == p) {
			s = reg[i];
			reg[i] = reg[--reg_n];
			break;
		}
	pthread_mutex_unlock(&reg_mu);
	if (!s.base)
		abort(); /* not from mr_comm_mem_alloc: like free() of a stray pointer */
	munmap(s.base, s.len);
	if (s.fd >= 0)
		close(s.fd);
}

int mr__mem_find(const void *p, size_t len, struct mr__cma_desc *d)
{
	const char *c = p;
	int found = 0;

	pthread_mutex_lock(&reg_mu);
	for (size_t i = 0; i < reg_n && !found; i++) {
		const struct seg *s = &reg[i];

		if (s->fd < 0 || c < s->base || (size_t)(c - s->base) > s->len ||
		    len > s->len - (size_t)(c - s->base))
			continue;
		d->mem_ino = s->ino;
		d->mem_seq = s->seq;
		d->mem_fd = (uint64_t)s->fd;
		d->mem_off = (uint64_t)(c - s->base);
		d->mem_len = s->len;
		found = 1;
	}
	pthread_mutex_unlock(&reg_mu);
	return found;
}

/* Maps the peer's registered buffer named by d; NULL when it cannot. */
static char *map_peer(struct mr__chan *ch, const struct mr__cma_desc *d)
{
	struct mr__peer_map *m;
	char path[64];
	struct stat st;
	void *p;
	int fd;

	snprintf(path, sizeof(path), "/proc/%d/fd/%d", ch->cma_pid, (int)d->mem_fd);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_ino != d->mem_ino ||
	    (uint64_t)st.st_size < d->mem_len) {
		close(fd);
		return NULL;
	}
	/* no MAP_POPULATE: it would allocate every page of the segment the
	 * owner has not touched yet (a shmem read fault fills a hole) */
	p = mmap(NULL, d->mem_len, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return NULL;
	if (ch->npmaps == PEER_MAPS_MAX) {
		munmap(ch->pmaps[0].base, ch->pmaps[0].len);
		memmove(ch->pmaps, ch->pmaps + 1, (PEER_MAPS_MAX - 1) * sizeof(*ch->pmaps));
		ch->npmaps--;
	}
	if (!ch->pmaps && !(ch->pmaps = calloc(PEER_MAPS_MAX, sizeof(*ch->pmaps)))) {
		munmap(p, d->mem_len);
		return NULL;
	}
	m = &ch->pmaps[ch->npmaps++];
	m->seq = d->mem_seq;
	m->base = p;
	m->len = d->mem_len;
	return p;
}

const char *mr__mem_peer(struct mr__chan *ch, const struct mr__cma_desc *d)
{
	char *base = NULL;

	if (!d->mem_seq)
		return NULL;
	for (int i = 0; i < ch->npmaps && !base; i++)
		if (ch->pmaps[i].seq == d->mem_seq && ch->pmaps[i].len == d->mem_len)
			base = ch->pmaps[i].base;
	if (!base && !(base = map_peer(ch, d)))
		return NULL;
	ch->mem_rx++;
	return base + d->mem_off;
}

void mr__mem_unmap_peers(struct mr__chan *ch)
{
	for (int i = 0; i < ch->npmaps; i++)
		munmap(ch->pmaps[i].base, ch->pmaps[i].len);
	free(ch->pmaps);
	ch->pmaps = NULL;
	ch->npmaps = 0;
}
