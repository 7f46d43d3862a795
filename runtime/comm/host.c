/*
 * host.c - the host communicator backend: bootstrap (KV, TCP mesh, shared
 * memory inboxes), split, free and the backend's ops table.
 *
 * Bootstrap of a group of n: each rank listens on an ephemeral TCP port,
 * creates its shared-memory inbox (unless TCP only), publishes
 * "<addr> <port> <host id> <shm name>" under comm/<id>/addr/<rank> and
 * reads the n-1 peers' entries (O(group size)). Rank j connects to every
 * i < j and accepts from every i > j; peers with the same host id map each
 * other's inboxes and keep the socket only for liveness. Between TCP peers
 * the lower rank connects a second time: each direction has its own
 * connection (up to 1.3x the throughput of one shared by both directions,
 * measured on loopback here). After a one-byte
 * "ready" exchange on every socket the inbox name is unlinked, so a crash
 * leaves nothing in /dev/shm.
 *
 * Progress (host_queue.c): one thread per communicator pops requests in
 * issue order and runs them (host_algo.c).
 *
 * Non-goals: lazy connection setup (the mesh is complete per group),
 * reusing the parent's connections in a split.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host_int.h"
#include "mr_log.h"

#define HELLO_MAGIC 0x6d72636du
#define DEFAULT_RING ((size_t)1 << 20)
/* Ring allreduce segment, measured on this 2-core VM (host_algo.c,
 * docs/PERFORMANCE.md): 1 MiB beat 256 KiB at 8-64 MiB over TCP (fewer
 * steps, each a wake-up) and from registered memory (fewer single-copy
 * handshakes), and was within noise on malloc memory over shm. */
#define DEFAULT_CHUNK ((size_t)1 << 20)
#define DEFAULT_L3 ((size_t)32 << 20)
#define DEFAULT_TCP_SNDBUF (512 << 10)

struct hello {
	uint32_t magic;
	int32_t rank;
	uint64_t idhash;
};

static const struct mr__comm_ops host_ops;

static size_t ring_cap(void)
{
	const char *e = getenv("MR_COMM_SHM_RING");
	size_t v = e ? strtoull(e, NULL, 0) : DEFAULT_RING;

	if (v < 4096 || v > ((size_t)1 << 28) || (v & (v - 1)))
		v = DEFAULT_RING;
	return v;
}

/* The L3 cache's size (sysfs; sysconf reports the whole host's in a VM). An
 * operation whose input and output together outgrow this rank's share of
 * it (L3 / ranks on the host) evicts its own first bytes anyway: it writes
 * with streaming stores, without reading every destination line first.
 * Measured here, 2 ranks, best of 10 interleaved runs: 8 MiB alltoall
 * (16 MiB touched) 955 -> 801 us, sendrecv 1382 -> 1229 us, but allgather
 * (12 MiB) 718 -> 791 us; 4 ranks 8-16 MiB up to 1.4x faster. */
static size_t l3_bytes(void)
{
	FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
	unsigned long kib = 0;

	if (f) {
		if (fscanf(f, "%luK", &kib) != 1)
			kib = 0;
		fclose(f);
	}
	return kib >= 1024 ? (size_t)kib << 10 : DEFAULT_L3;
}

/* A byte-size tunable from the environment; below 4 KiB means def. */
size_t mr__env_size(const char *name, size_t def)
{
	const char *e = getenv(name);
	size_t v = e ? strtoull(e, NULL, 0) : def;

	return v < 4096 ? def : v;
}

static int set_sock_opts(int fd)
{
	int one = 1;

	/* receive buffers stay under the kernel's autotuning (tcp_rmem) */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* The send socket's buffer: MR_COMM_TCP_SNDBUF bytes (the kernel doubles
 * it), 0 for the kernel's autotuning. Measured on loopback here, 2 and 4
 * ranks: 512 KiB moved 8-64 MiB up to 2x faster than autotuning or 4 MiB
 * (the data the peer copies out is still in cache; docs/PERFORMANCE.md).
 * A link whose bandwidth x RTT exceeds 1 MiB wants more, or 0. */
static void set_sndbuf(int fd)
{
	const char *e = getenv("MR_COMM_TCP_SNDBUF");
	long v = e ? strtol(e, NULL, 0) : DEFAULT_TCP_SNDBUF;

	if (v > 0 && v <= INT_MAX / 2) {
		int b = (int)v;

		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &b, sizeof(b));
	}
}

/* The bootstrap running in this thread gives up when this turns non-zero. */
static _Thread_local const _Atomic int *boot_cancel;

static int cancelled(void)
{
	return boot_cancel && atomic_load(boot_cancel);
}

static int wait_fd(int fd, short ev, long long deadline)
{
	for (;;) {
		long long left = deadline - mr__now_ms();
		struct pollfd pf = { .fd = fd, .events = ev };
		int r;

		if (cancelled())
			return MR_EABORTED;
		if (left <= 0)
			return MR_ETIMEDOUT;
		r = poll(&pf, 1, left > 100 ? 100 : (int)left);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return MR_ESYS;
	}
}

static int io_full(int fd, void *p, size_t n, int wr, long long deadline)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = wr ? send(fd, (char *)p + done, n - done, MSG_NOSIGNAL)
			       : recv(fd, (char *)p + done, n - done, 0);

		if (r > 0) {
			done += (size_t)r;
			continue;
		}
		if (r == 0)
			return MR_EPEER;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			return MR_EPEER;
		r = wait_fd(fd, wr ? POLLOUT : POLLIN, deadline);
		if (r < 0)
			return (int)r;
	}
	return 0;
}

static int tcp_listen(const char *addr, int n, int *port)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	int fd;

	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		return MR_EINVAL;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return MR_ESYS;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, n + 8) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &sl) < 0) {
		close(fd);
		return MR_ESYS;
	}
	*port = ntohs(sa.sin_port);
	return fd;
}

static int tcp_connect(const char *addr, int port, long long deadline)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	int fd, err = 0;
	socklen_t el = sizeof(err);

	if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1)
		return MR_EINVAL;
	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return MR_ESYS;
	set_sock_opts(fd);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno != EINPROGRESS || wait_fd(fd, POLLOUT, deadline) < 0 ||
		    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
			close(fd);
			return MR_ECONN;
		}
	}
	return fd;
}

/* Where a connection accepted from rank r goes: ranks above connect once
 * (fd), TCP peers below a second time (fd2); NULL for anything else. */
static int *accepted_slot(struct mr__hcomm *h, int r)
{
	struct mr__chan *ch;

	if (r < 0 || r >= h->n || r == h->me)
		return NULL;
	ch = &h->ch[r];
	if (r > h->me)
		return ch->fd < 0 ? &ch->fd : NULL;
	return !ch->shm && ch->fd2 < 0 ? &ch->fd2 : NULL;
}

static void *map_inbox(const char *name, size_t size, int create)
{
	int fd = shm_open(name, create ? (O_RDWR | O_CREAT | O_EXCL) : O_RDWR, 0600);
	void *p;

	if (fd < 0)
		return NULL;
	/* reserve the pages now: a full /dev/shm (64 MiB in a default Docker
	 * container) must mean "use TCP", not SIGBUS on first touch */
	if (create && (ftruncate(fd, (off_t)size) < 0 || posix_fallocate(fd, 0, (off_t)size))) {
		close(fd);
		shm_unlink(name);
		return NULL;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

static struct mr__ring *inbox_ring(struct mr__hcomm *h, void *map, int slot)
{
	return (struct mr__ring *)((char *)map + sizeof(struct mr__inbox_hdr) +
				   (size_t)slot * (sizeof(struct mr__ring) + h->ring_cap));
}

/* Maps a ring's pages into this process now: otherwise the first pass
 * over a ring takes a minor fault per page on each side (the first 200
 * 4 KiB allreduces of 2 ranks here: 32 us each instead of 10 us; warm,
 * 1.2 us). The pages are allocated already (posix_fallocate). */
static void prefault_ring(struct mr__hcomm *h, struct mr__ring *r)
{
	size_t pg = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)r / pg * pg;
	uintptr_t hi = (uintptr_t)r + sizeof(*r) + h->ring_cap;

#ifdef MADV_POPULATE_WRITE
	if (madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE) == 0)
		return;
#endif
	/* older kernels: a read fault maps the (allocated) page as well */
	for (uintptr_t a = lo; a < hi; a += pg)
		(void)*(volatile const char *)a;
}


static void host_free(struct mr_comm *c)
{
	struct mr__hcomm *h = (struct mr__hcomm *)c;

	if (h->thr_started) {
		pthread_mutex_lock(&h->mu);
		h->stop = 1;
		pthread_cond_broadcast(&h->cv);
		pthread_cond_broadcast(&h->done_cv);
		pthread_mutex_unlock(&h->mu);
		pthread_join(h->thr, NULL);
	}
	for (int i = 0; h->ch && i < h->n; i++)
		mr__chan_release(&h->ch[i]);
	for (int i = 0; h->maps && i < h->n; i++)
		if (h->maps[i])
			munmap(h->maps[i], h->map_size);
	if (h->shm_name[0])
		shm_unlink(h->shm_name);
	if (h->wake_fd >= 0)
		close(h->wake_fd);
	/* requests still queued are failed and left to their waiters */
	while (h->qhead) {
		struct mr__hreq *r = h->qhead;

		h->qhead = r->next;
		mr__op_free(r->op);
		r->op = NULL;
		r->rc = MR_EABORTED;
		r->done = 1;
	}
	pthread_mutex_destroy(&h->mu);
	pthread_cond_destroy(&h->cv);
	pthread_cond_destroy(&h->done_cv);
	free(h->ch);
	free(h->maps);
	free(h->scratch);
	free(h->bxs); /* a batch left by a failed run: its requests failed with it */
	free(h);
}

static int parse_entry(char *v, char *addr, int *port, char *hid, char *shm)
{
	return sscanf(v, "%63s %d %127s %63s", addr, port, hid, shm) == 4 ? 0 : MR_EPROTO;
}

/* Builds a communicator of n ranks where this process is group rank me. */
static int host_create(struct mr__hcomm **out, const struct mr_comm *tmpl, const char *id,
		       int me, int n, const struct mr_kv *kv, struct mr_errbuf *eb)
{
	struct mr__hcomm *h = calloc(1, sizeof(*h));
	long long deadline = mr__now_ms() + tmpl->timeout_ms;
	uint64_t idh = mr__hash(id, strlen(id), 0);
	char key[160], val[320], paddr[64], phid[128], pshm[64];
	int lfd = -1, port = 0, rc = 0, peer_is_shm, expect = 0;
	size_t len;

	*out = NULL;
	if (!h)
		return MR_ENOMEM;
	boot_cancel = tmpl->cancel;
	h->base = *tmpl;
	h->base.ops = &host_ops;
	h->base.rank = me;
	h->base.size = n;
	snprintf(h->base.id, sizeof(h->base.id), "%s", id);
	h->kv = kv;
	h->n = n;
	h->me = me;
	h->ring_cap = ring_cap();
	h->chunk = mr__env_size("MR_COMM_CHUNK", DEFAULT_CHUNK);
	h->stream_min = mr__env_size("MR_COMM_STREAM_MIN", l3_bytes());
	h->map_size = sizeof(struct mr__inbox_hdr) +
		      (size_t)n * (sizeof(struct mr__ring) + h->ring_cap);
	h->wake_fd = -1;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	pthread_cond_init(&h->done_cv, NULL);
	h->ch = calloc((size_t)n, sizeof(*h->ch));
	h->maps = calloc((size_t)n, sizeof(*h->maps));
	/* before any exit: host_free closes what is >= 0 */
	for (int i = 0; h->ch && i < n; i++) {
		h->ch[i].fd = h->ch[i].fd2 = h->ch[i].tx_fd = h->ch[i].rx_fd = -1;
		h->ch[i].stash_tail = &h->ch[i].stash;
	}
	if (!h->ch || !h->maps) {
		rc = MR_ENOMEM;
		goto out;
	}
	if (n == 1)
		goto start;
	if (strchr(tmpl->host_id, ' ') || !tmpl->host_id[0]) {
		rc = mr_errf(eb, MR_EINVAL, "host id '%s' is empty or has spaces", tmpl->host_id);
		goto out;
	}
	lfd = tcp_listen(tmpl->addr, n, &port);
	if (lfd < 0) {
		rc = mr_errf(eb, lfd, "unable to listen on '%s'", tmpl->addr);
		goto out;
	}
	if (tmpl->transport == MR_COMM_AUTO) {
		static _Atomic unsigned seq;

		snprintf(h->shm_name, sizeof(h->shm_name), "/mr.%d.%u.%08x", (int)getpid(),
			 atomic_fetch_add(&seq, 1), (unsigned)(idh ^ (uint64_t)me));
		h->maps[me] = map_inbox(h->shm_name, h->map_size, 1);
		if (!h->maps[me]) {
			mr_log_warn("comm_shm_unavailable", "comm=%s size=%zu", id, h->map_size);
			h->shm_name[0] = 0; /* fall back to TCP for everyone */
		} else {
			h->inbox = h->maps[me];
		}
	}
	mr__cma_publish(h);
	snprintf(val, sizeof(val), "%s %d %s %s", tmpl->addr, port, tmpl->host_id,
		 h->shm_name[0] ? h->shm_name : "-");
	snprintf(key, sizeof(key), "comm/%s/addr/%d", id, me);
	rc = mr_kv_put(kv, key, val, strlen(val) + 1);
	if (rc < 0) {
		mr_errf(eb, rc, "unable to publish '%s'", key);
		goto out;
	}
	for (int p = 0; p < n; p++) {
		long long left = deadline - mr__now_ms();

		if (p == me)
			continue;
		snprintf(key, sizeof(key), "comm/%s/addr/%d", id, p);
		/* in slices, so a cancel is seen while a peer is missing */
		do {
			left = deadline - mr__now_ms();
			rc = mr_kv_get(kv, key, val, sizeof(val) - 1, &len,
				       left > 100 ? 100 : left > 1 ? left : 1);
			if (rc == MR_ETIMEDOUT && cancelled())
				rc = MR_EABORTED;
		} while (rc == MR_ETIMEDOUT && mr__now_ms() < deadline);
		if (rc < 0) {
			mr_errf(eb, rc, "unable to get peer address '%s'", key);
			goto out;
		}
		val[len < sizeof(val) ? len : sizeof(val) - 1] = 0;
		if (parse_entry(val, paddr, &port, phid, pshm) < 0) {
			rc = mr_errf(eb, MR_EPROTO, "malformed peer address '%s'", val);
			goto out;
		}
		peer_is_shm = h->inbox && strcmp(pshm, "-") && !strcmp(phid, tmpl->host_id);
		if (peer_is_shm) {
			h->maps[p] = map_inbox(pshm, h->map_size, 0);
			if (!h->maps[p]) {
				rc = mr_errf(eb, MR_ESYS, "unable to map '%s'", pshm);
				goto out;
			}
			h->ch[p].shm = 1;
			h->ch[p].tx = inbox_ring(h, h->maps[p], me);
			h->ch[p].rx = inbox_ring(h, h->maps[me], p);
			prefault_ring(h, h->ch[p].tx);
			prefault_ring(h, h->ch[p].rx);
			h->ch[p].peer_inbox = h->maps[p];
			h->has_shm = 1;
			mr__cma_probe(h, p);
		} else {
			h->has_tcp = 1;
		}
		if (p < me || !peer_is_shm) {
			struct hello hi = { HELLO_MAGIC, me, idh };
			int *fd = p < me ? &h->ch[p].fd : &h->ch[p].fd2;

			*fd = tcp_connect(paddr, port, deadline);
			if (*fd < 0) {
				rc = mr_errf(eb, *fd, "unable to connect to rank %d at '%s:%d'", p,
					     paddr, port);
				*fd = -1;
				goto out;
			}
			rc = io_full(*fd, &hi, sizeof(hi), 1, deadline);
			if (rc < 0) {
				mr_errf(eb, rc, "unable to greet rank %d", p);
				goto out;
			}
		}
		expect += p > me || !peer_is_shm;
	}
	for (int k = 0; k < expect; k++) {
		struct hello hi;
		int fd, *slot;

		rc = wait_fd(lfd, POLLIN, deadline);
		if (rc < 0) {
			mr_errf(eb, rc, "waiting for %d peer connections", expect - k);
			goto out;
		}
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0) {
			k--;
			continue;
		}
		set_sock_opts(fd);
		rc = io_full(fd, &hi, sizeof(hi), 0, deadline);
		slot = rc < 0 || hi.magic != HELLO_MAGIC || hi.idhash != idh ? NULL :
		       accepted_slot(h, hi.rank);
		if (!slot) {
			close(fd);
			k--;
			continue;
		}
		*slot = fd;
	}
	for (int p = 0; p < n; p++) {
		struct mr__chan *ch = &h->ch[p];

		if (p != me && !ch->shm) {
			ch->tx_fd = p < me ? ch->fd : ch->fd2;
			ch->rx_fd = p < me ? ch->fd2 : ch->fd;
			set_sndbuf(ch->tx_fd);
		}
	}
	for (int p = 0; p < n; p++) {
		char b = 'k';

		if (p != me && (rc = io_full(h->ch[p].fd, &b, 1, 1, deadline)) < 0)
			goto ready_fail;
	}
	for (int p = 0; p < n; p++) {
		char b = 0;

		if (p != me && (rc = io_full(h->ch[p].fd, &b, 1, 0, deadline)) < 0)
			goto ready_fail;
	}
	if (h->shm_name[0]) {
		shm_unlink(h->shm_name);
		h->shm_name[0] = 0;
	}
	{
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		int local = 1;

		for (int p = 0; p < n; p++)
			local += h->ch[p].shm;
		h->oversubscribed = ncpu > 0 && local > ncpu;
		/* which transport each peer got: shared memory inside a host
		 * (same boot id and IPC namespace), TCP across (rank 0's view) */
		if (me == 0)
			mr_log_info("comm_transport", "comm=%s size=%d shm_peers=%d tcp_peers=%d",
				    id, n, local - 1, n - local);
		h->stream_min = mr__env_size("MR_COMM_STREAM_MIN", l3_bytes() / (size_t)local);
	}
	/* a poll() on TCP peers must wake for work queued meanwhile (a receive
	 * posted after its send started) and for abort */
	if (h->has_tcp && (h->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		rc = mr_errf(eb, MR_ESYS, "eventfd");
		goto out;
	}
start:
	h->deadline = mr__now_ms() + h->base.timeout_ms;
	if (pthread_create(&h->thr, NULL, mr__host_progress_main, h) != 0) {
		rc = MR_ESYS;
		goto out;
	}
	h->thr_started = 1;
	rc = 0;
	goto out;
ready_fail:
	mr_errf(eb, rc, "peers of communicator '%s' not ready", id);
out:
	boot_cancel = NULL;
	if (lfd >= 0)
		close(lfd);
	if (rc < 0) {
		host_free(&h->base);
		return rc;
	}
	*out = h;
	return 0;
}

int mr__host_init(struct mr_comm **out, const struct mr_comm_config *cfg,
		  const struct mr_kv *kv, struct mr_errbuf *eb)
{
	struct mr_comm t = { 0 };
	struct mr__hcomm *h;
	int rc;

	t.timeout_ms = cfg->timeout_ms > 0 ? cfg->timeout_ms : 60000;
	t.transport = cfg->transport;
	t.device = cfg->device;
	t.cancel = cfg->cancel;
	snprintf(t.addr, sizeof(t.addr), "%s", cfg->addr ? cfg->addr : "127.0.0.1");
	if (cfg->host_id)
		snprintf(t.host_id, sizeof(t.host_id), "%s", cfg->host_id);
	else if ((rc = mr_comm_host_id(t.host_id, sizeof(t.host_id))) < 0)
		return mr_errf(eb, rc, "unable to read the host id");
	rc = host_create(&h, &t, cfg->id, cfg->rank, cfg->world_size, kv, eb);
	if (rc < 0)
		return rc;
	*out = &h->base;
	return 0;
}

static int host_split(struct mr_comm *c, const char *id, int me, int n, struct mr_comm **out,
		      struct mr_errbuf *eb)
{
	struct mr__hcomm *h = (struct mr__hcomm *)c, *s;
	/* a split gives up when the caller cancels or the parent is aborted */
	struct mr_comm t = *c;
	int rc;

	t.cancel = c->cancel ? c->cancel : &h->aborted;
	rc = host_create(&s, &t, id, me, n, h->kv, eb);
	if (rc < 0)
		return rc;
	*out = &s->base;
	return 0;
}

static const struct mr__comm_ops host_ops = {
	.name = "host",
	.split = host_split,
	.start = mr__host_start,
	.run_now = mr__host_run_now,
	.test = mr__host_test,
	.wait = mr__host_wait,
	.kick = mr__host_kick,
	.abort = mr__host_abort,
	.health = mr__host_health,
	.free = host_free,
};
