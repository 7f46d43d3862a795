/*
 * host_int.h - internals of the host communicator backend (shared memory
 * rings + TCP), shared by host.c (bootstrap), host_queue.c (progress
 * thread), host_chan.c (channels), host_xfer.c (the transfer engine),
 * host_cma.c (single copy), host_mem.c (registered buffers) and
 * host_algo.c (collectives).
 *
 * TCP peers keep two connections, one per direction; shared-memory peers
 * one, for liveness. Wire format, both transports: each message is a 16-byte header
 * {int32 tag, uint32 0, uint64 len} and len payload bytes. Collective
 * traffic uses tag MR__TAG_COLL; user send/recv tags are >= 0. A received
 * message nobody is waiting for yet is stashed (unexpected queue).
 *
 * Shared memory: every rank owns an "inbox" segment holding one
 * single-producer/single-consumer ring per group rank (ring j carries
 * j -> owner) and a doorbell futex word; a writer bumps the reader's
 * doorbell, a reader bumps the writer's (space freed). Liveness of a
 * shared-memory peer comes from a TCP socket kept open to it: the kernel
 * closes it when the peer process dies.
 *
 * Single copy (host_cma.c): a large message between shm peers travels as
 * a header flagged MR__HDR_CMA plus a descriptor (the sender's buffer
 * address, and the registered segment holding it if any, host_mem.c);
 * the receiver reads the sender's memory itself and the ring's cma word
 * (POSTED -> TAKEN -> DONE, or REVOKED) completes the send.
 */
#ifndef MR_HOST_INT_H
#define MR_HOST_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "comm_int.h"

#define MR__TAG_COLL (-1)
#define MR__BOUNCE 65536
#define MR__HDR_CMA 1u     /* wire_hdr.zero flag: a cma_desc follows, not the payload */

enum { MR__CMA_IDLE, MR__CMA_POSTED, MR__CMA_TAKEN, MR__CMA_DONE, MR__CMA_REVOKED };
enum { MR__CMA_OFF, MR__CMA_VM, MR__CMA_DIRECT }; /* chan.cma: process_vm_readv / memcpy */

struct mr__ring {
	_Atomic uint64_t head; /* bytes written, producer-owned */
	char pad1[56];
	_Atomic uint64_t tail; /* bytes read, consumer-owned */
	char pad2[56];
	_Atomic uint32_t cma;  /* single-copy handshake of the message in flight */
	char pad3[60];
	/* cap data bytes follow */
};

struct mr__inbox_hdr {
	_Atomic uint32_t bell;
	_Atomic uint32_t sleeping;
	int64_t cma_pid;       /* owner's pid, address and value of its cookie */
	uint64_t cma_addr;
	uint64_t cma_cookie;
	char pad[32];
};

struct mr__wire_hdr {
	int32_t tag;
	uint32_t zero;     /* 0, or MR__HDR_CMA */
	uint64_t len;
};

struct mr__cma_desc {
	uint64_t addr;     /* the sender's buffer, len bytes (wire_hdr.len) */
	uint64_t sync;     /* memcpy mode: the sender's chan.cma_sync (see there) */
	/* the buffer lies in a registered segment (host_mem.c; seq 0: not) */
	uint64_t mem_seq;  /* the sender's segment number, never reused */
	uint64_t mem_ino;  /* its memfd's inode */
	uint64_t mem_fd;   /* the sender's fd of it */
	uint64_t mem_off;  /* addr - segment start */
	uint64_t mem_len;  /* segment bytes */
};

struct mr__peer_map {      /* a peer's registered segment mapped here */
	uint64_t seq;
	char *base;
	size_t len;
};

struct mr__stash {
	int tag;
	size_t len;
	char *data;
	struct mr__stash *next;
};

struct mr__xfer {
	int peer;
	int send;          /* 1 send, 0 recv */
	int tag;
	char *buf;         /* const for sends */
	size_t len;
	size_t pos;        /* send: header+payload bytes out; recv: payload bytes in */
	int red_dtype;     /* recv: >= 0 reduces into buf instead of copying */
	int redop;
	const char *red_src;   /* recv reduce: buf = red_src op incoming (else buf op=) */
	int done;
	int cma;           /* send: descriptor posted, waiting for DONE */
	int reduced;       /* send: the receiver reduces it (no process_vm_readv) */
	int rendezvous;    /* send: may wait for the receive at any size (a
			    * sendrecv blocks on its own receive anyway), so
			    * single copy from cma_min as for collectives */
	int local;         /* a copy red_src -> buf of this rank (peer = me, send = 1),
			    * done in pieces while the real transfers wait */
	int gate;          /* send: 1 + batch index of the receive whose data it
			    * forwards; only bytes already received go out (0: none) */
	int stream;        /* recv, local copy: write with streaming stores (the
			    * operation outgrows this rank's cache share; never
			    * for data a send forwards) */
	void *user;        /* host.c: the request this p2p transfer belongs to */
};

struct mr__chan {
	int fd;                    /* the pair's first connection: liveness (shm) */
	int fd2;                   /* TCP peers: a second one, one per direction */
	int tx_fd, rx_fd;          /* TCP peers: the socket this rank connected
				    * carries its sends, the accepted one its
				    * receives (no socket lock shared between
				    * the two directions) */
	int shm;
	struct mr__ring *tx, *rx;  /* rings: me -> peer (in its inbox), peer -> me */
	struct mr__inbox_hdr *peer_inbox;
	/* receive state */
	struct mr__wire_hdr hdr;
	size_t hdr_got;
	struct mr__xfer *cur;
	long cur_idx;              /* grow_batch: cur as an index while the batch moves */
	struct mr__stash *cur_stash;
	size_t stash_got;
	struct mr__stash *stash, **stash_tail;
	char *bounce;
	size_t bounce_fill;
	int cma;                   /* MR__CMA_OFF/VM/DIRECT */
	int cma_pid;
	unsigned long cma_rx;      /* messages received by single copy (tests) */
	unsigned long mem_rx;      /* of them, read from a registered buffer */
	struct mr__peer_map *pmaps; /* the peer's registered buffers mapped here */
	int npmaps;
	/* memcpy mode: the two ranks' views of a ring are two mappings of one
	 * page, so their atomics order nothing for ThreadSanitizer; this word
	 * in process memory carries the same release/acquire edges */
	_Atomic uint32_t cma_sync;
};

struct mr__hcomm;
struct mr__hreq {
	struct mr_comm_req base;
	struct mr__comm_op *op;
	size_t pos0;       /* send: bytes already sent at issue (mr__hx_try) */
	int done, rc;
	struct mr__hreq *next;
};

struct mr__hcomm {
	struct mr_comm base;
	const struct mr_kv *kv;
	int n, me;
	struct mr__chan *ch;
	size_t ring_cap;
	struct mr__inbox_hdr *inbox;
	size_t map_size;
	void **maps;               /* inbox mappings: maps[me] own, maps[p] shm peers */
	char shm_name[64];
	int has_shm, has_tcp;
	int wake_fd;               /* TCP peers: eventfd that interrupts poll() */
	int oversubscribed;        /* more shm ranks than CPUs: yield, never spin */
	/* threads blocked on this communicator (host_wait, blocking calls):
	 * only then is spinning worth a core - an operation running behind
	 * the caller's compute sleeps until data arrives instead */
	atomic_int waiters;
	/* progress thread */
	pthread_t thr;
	int thr_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;         /* progress thread: work queued and !busy, or stop */
	pthread_cond_t done_cv;    /* host_wait: a request finished, or work to help with */
	struct mr__hreq *qhead, *qtail;
	int stop;
	int broken;
	_Atomic int aborted;
	long long deadline;
	int busy;                  /* an operation is executing (thread or inline) */
	/* a send/recv batch one executor left running (host_queue.c): a waiter
	 * runs a batch only until its own request is done; the next executor
	 * resumes the rest, transfers mid-flight included */
	struct mr__xfer *bxs;
	int bnx, bcap;
	struct mr__hreq *yield_for; /* the executor's own request, or NULL */
	char *scratch;             /* grow-only working buffer of the executor */
	size_t scratch_cap;
	uint64_t cma_cookie;       /* read by peers to verify single copy works */
	size_t cma_min;            /* smallest collective message by memcpy single copy */
	size_t cma_vm_min;         /* the same by process_vm_readv */
	size_t stream_min;         /* operations whose input + output reach this
				    * size write with streaming stores: this rank's
				    * share of the L3 cache (host.c, MR_COMM_STREAM_MIN) */
	size_t chunk;              /* ring allreduce segment bytes per chunk */
};

/* host.c */
size_t mr__env_size(const char *name, size_t def);

/* host_chan.c: non-blocking channel I/O; each returns bytes moved (>= 0)
 * or MR_EPEER / MR_EPROTO / MR_ENOMEM. */
long mr__chan_write(struct mr__hcomm *h, struct mr__chan *ch, const void *p, size_t n);
/* stream: copy out of an shm ring with streaming stores */
long mr__chan_read(struct mr__hcomm *h, struct mr__chan *ch, void *p, size_t n, int stream);
/* Reads into a reduce-mode receive x, reducing as the data comes in. */
long mr__chan_read_reduce(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *x);
/* 1 (x done) when a stashed message matches receive x, 0 none, < 0 error. */
int mr__chan_match_stash(struct mr__chan *ch, struct mr__xfer *x);
/* 1 when a whole message for x sits at the head of an shm channel (taken). */
int mr__chan_try_recv(struct mr__hcomm *h, struct mr__chan *ch, struct mr__xfer *x);
/* A stash entry for a message of len bytes; NULL with *rc set. */
struct mr__stash *mr__chan_new_stash(int tag, size_t len, int *rc);
void mr__ring_bell(struct mr__inbox_hdr *ib);
void mr__inbox_sleep(struct mr__hcomm *h, uint32_t bell, long ms);

/* host_xfer.c */
/* Moves every transfer to completion; 0 or MR_ETIMEDOUT/EPEER/EABORTED/
 * EPROTO/ENOMEM. refill, when set, is called while waiting and may append
 * transfers (returns the new count); *xs may be reallocated by it. With
 * refill, MR__HX_YIELD when h->yield_for is done: the transfers left are
 * consistent (a later call continues them). */
#define MR__HX_YIELD 1
typedef int (*mr__refill_fn)(struct mr__hcomm *h, struct mr__xfer **xs, int nx, int *cap);
int mr__hx_run(struct mr__hcomm *h, struct mr__xfer **xs, int *nx, int *cap,
	       mr__refill_fn refill);
/* One non-blocking attempt at a small p2p transfer by the issuing thread
 * (exclusive use of the channels, like an executor): 1 done, 0 not (a send
 * may have advanced x->pos; a receive never takes part of a message),
 * < 0 error. */
int mr__hx_try(struct mr__hcomm *h, struct mr__xfer *x);
int mr__hx_sendrecv(struct mr__hcomm *h, int to, const void *sbuf, size_t slen, int from,
		    void *rbuf, size_t rlen, int red_dtype, int redop);
void mr__chan_release(struct mr__chan *ch);
/* Shuts every socket down: the peers see EOF at once. */
void mr__chan_shutdown(struct mr__hcomm *h);
void mr__wake_self(struct mr__hcomm *h);

/* host_mem.c */
/* 1 and d->mem_* filled when p..p+len lies in a registered buffer. */
int mr__mem_find(const void *p, size_t len, struct mr__cma_desc *d);
/* Where this process reads the registered buffer of descriptor d, mapped
 * on first use; NULL: not registered or not mappable (process_vm_readv). */
const char *mr__mem_peer(struct mr__chan *ch, const struct mr__cma_desc *d);
void mr__mem_unmap_peers(struct mr__chan *ch);

/* host_cma.c */
void mr__cma_publish(struct mr__hcomm *h);
void mr__cma_probe(struct mr__hcomm *h, int peer);
/* Claims and copies (or reduces into x) a posted buffer; 0 or MR_EPEER/ENOMEM. */
int mr__cma_recv(struct mr__chan *ch, struct mr__xfer *x, char *dst,
		 const struct mr__cma_desc *d, size_t len);
/* 1 when send x to its channel's peer goes by single copy */
int mr__cma_use(const struct mr__hcomm *h, const struct mr__chan *ch, const struct mr__xfer *x);
void mr__cma_revoke(struct mr__hcomm *h, const struct mr__xfer *xs, int nx);

/* host_algo.c */
int mr__host_exec(struct mr__hcomm *h, const struct mr__comm_op *op);

/* host_queue.c: the progress thread and the backend's request ops. */
void *mr__host_progress_main(void *arg);
int mr__host_start(struct mr_comm *c, struct mr__comm_op *op, struct mr_comm_req **req);
int mr__host_run_now(struct mr_comm *c, struct mr__comm_op *op);
int mr__host_test(struct mr_comm_req *req, int *done);
int mr__host_wait(struct mr_comm_req *req);
void mr__host_kick(struct mr_comm *c);
void mr__host_abort(struct mr_comm *c);
int mr__host_health(struct mr_comm *c);

#endif
