/*
 * host_int.h - internals of the host communicator backend (shared memory
 * rings + TCP), shared by host.c (bootstrap, progress thread), host_chan.c
 * (channels and the transfer engine) and host_algo.c (collectives).
 *
 * Wire format, both transports: each message is a 16-byte header
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
 */
#ifndef MR_HOST_INT_H
#define MR_HOST_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "comm_int.h"

#define MR__TAG_COLL (-1)
#define MR__BOUNCE 65536

struct mr__ring {
	_Atomic uint64_t head; /* bytes written, producer-owned */
	char pad1[56];
	_Atomic uint64_t tail; /* bytes read, consumer-owned */
	char pad2[56];
	/* cap data bytes follow */
};

struct mr__inbox_hdr {
	_Atomic uint32_t bell;
	_Atomic uint32_t sleeping;
	char pad[56];
};

struct mr__wire_hdr {
	int32_t tag;
	uint32_t zero;
	uint64_t len;
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
	void *user;        /* host.c: the request this p2p transfer belongs to */
};

struct mr__chan {
	int fd;                    /* data (TCP) or liveness (shm) socket */
	int shm;
	struct mr__ring *tx, *rx;  /* rings: me -> peer (in its inbox), peer -> me */
	struct mr__inbox_hdr *peer_inbox;
	/* receive state */
	struct mr__wire_hdr hdr;
	size_t hdr_got;
	struct mr__xfer *cur;
	long cur_idx;              /* cur as an index while the batch may move */
	struct mr__stash *cur_stash;
	size_t stash_got;
	struct mr__stash *stash, **stash_tail;
	char *bounce;
	size_t bounce_fill;
};

struct mr__hcomm;
struct mr__hreq {
	struct mr_comm_req base;
	struct mr__comm_op *op;
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
	int oversubscribed;        /* more shm ranks than CPUs: yield, never spin */
	/* threads blocked on this communicator (host_wait, blocking calls):
	 * only then is spinning worth a core - an operation running behind
	 * the caller's compute sleeps until data arrives instead */
	atomic_int waiters;
	/* progress thread */
	pthread_t thr;
	int thr_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;         /* queue changed or a request finished */
	struct mr__hreq *qhead, *qtail;
	int stop;
	int broken;
	_Atomic int aborted;
	long long deadline;
	int busy;                  /* an operation is executing (thread or inline) */
	char *scratch;             /* grow-only working buffer of the executor */
	size_t scratch_cap;
	unsigned seen_n;
	uint64_t seen[32];         /* ranks-list hashes of unnamed splits */
};

/* host_chan.c */
/* Moves every transfer to completion; 0 or MR_ETIMEDOUT/EPEER/EABORTED/
 * EPROTO/ENOMEM. refill, when set, is called while waiting and may append
 * transfers (returns the new count); *xs may be reallocated by it. */
typedef int (*mr__refill_fn)(struct mr__hcomm *h, struct mr__xfer **xs, int nx, int *cap);
int mr__hx_run(struct mr__hcomm *h, struct mr__xfer **xs, int *nx, int *cap,
	       mr__refill_fn refill);
int mr__hx_sendrecv(struct mr__hcomm *h, int to, const void *sbuf, size_t slen, int from,
		    void *rbuf, size_t rlen, int red_dtype, int redop);
/* The same with buf = red_src op incoming for the receive. */
int mr__hx_sendrecv3(struct mr__hcomm *h, int to, const void *sbuf, size_t slen, int from,
		     void *rbuf, size_t rlen, int red_dtype, int redop, const void *red_src);
void mr__chan_release(struct mr__chan *ch);
void mr__wake_self(struct mr__hcomm *h);

/* host_algo.c */
int mr__host_exec(struct mr__hcomm *h, const struct mr__comm_op *op);

#endif
