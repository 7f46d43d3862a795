/*
 * mr_comm.h - communicators: collectives and point-to-point between ranks.
 *
 * One interface, several backends behind a vtable: "host" (shared memory
 * between ranks with the same host id, TCP otherwise) and "nccl" (when
 * built with CUDA + NCCL). A world communicator is created from the rank,
 * world size, host id, reachable address and a bootstrap KV (mr_kv.h);
 * sub-communicators for any list of world ranks come from mr_comm_split.
 *
 * Every operation is asynchronous: mr_comm_i<op>() enqueues it and returns
 * a request; mr_comm_test() polls and mr_comm_wait() finishes and frees it.
 * The blocking forms are start + wait. On a stream-ordered communicator
 * (nccl on a GPU: mr_comm_stream_ordered) a wait is the device's: its
 * compute stream waits, the host does not. Operations on one communicator
 * execute in issue order; operations on different communicators run
 * concurrently. Consecutive send/recv operations on one communicator are
 * progressed together (like an NCCL group), so "isend then irecv" to the
 * same peer on both sides cannot deadlock.
 *
 * Failure: every operation has a timeout (mr_comm_config.timeout_ms,
 * counted from when the operation starts executing; for a batch of
 * send/recv, from its last progress) and fails with MR_ETIMEDOUT; a dead peer (socket closed/reset, shared-memory peer
 * process gone) fails with MR_EPEER; mr_comm_abort() from any thread makes
 * every pending and future operation fail with MR_EABORTED within a few
 * milliseconds. After any failure the communicator is broken: every later
 * operation fails with the same code (the byte streams are out of step);
 * free it and create a new one.
 *
 * Buffers: counts and displacements are in elements of dtype. Send and
 * receive buffers must stay valid until the request completes. In-place
 * is allowed where noted (sbuf == rbuf). The v-variant count/displacement
 * arrays are copied at start. bf16 is reduced in fp32 (converted once on
 * entry, rounded to nearest-even once on exit).
 *
 * Ownership: mr_comm_init/split allocate the communicator; mr_comm_free()
 * releases it (NULL is a no-op) and must not race with operations still in
 * flight except through abort. The KV in the config is borrowed and only
 * used inside init and split.
 *
 * Progress (hang diagnosis): every operation takes the next sequence
 * number of its communicator (1, 2, ...) when it is started, and the
 * communicator remembers the last one started ("entered": number, kind,
 * p2p peer) and the last one finished ("completed": the blocking form
 * returned, or mr_comm_wait/mr_comm_test saw it done). That costs a few
 * relaxed atomic stores per operation; mr_comm_progress() reads them from
 * any thread. Ranks of one communicator issue the same collectives in the
 * same order, so their numbers line up: a rank whose "entered" stays below
 * the others' is the one they wait for. Time spent blocked (blocking forms,
 * mr_comm_wait) is summed per communicator for the step-time breakdown.
 *
 * Non-goals: reductions other than sum/avg/max, MPI-style wildcards
 * (any-source/any-tag), message-size negotiation (recv count must match).
 */
#ifndef MR_COMM_H
#define MR_COMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "mr_err.h"
#include "mr_kv.h"
#include "mr_names.h"

enum mr_comm_dtype {
	MR_COMM_F32 = 0,
	MR_COMM_BF16 = 1,
	MR_COMM_I32 = 2,
	MR_COMM_I64 = 3,
};

enum mr_comm_redop {
	MR_COMM_SUM = 0,
	MR_COMM_AVG = 1,
	MR_COMM_MAX = 2,
};

enum mr_comm_transport {
	MR_COMM_AUTO = 0,     /* shm for same host id, TCP otherwise */
	MR_COMM_TCP_ONLY = 1, /* never shared memory (tests, benchmarks) */
};

#define MR_COMM_ID_MAX 96
#define MR_COMM_HOST_ID_MAX 128

struct mr_comm_config {
	const char *backend;      /* "host" (default when NULL) or "nccl" */
	const char *id;           /* KV namespace, e.g. "g3"; <= 64 chars */
	int rank, world_size;
	const char *host_id;      /* NULL: mr_comm_host_id() of this process */
	const char *addr;         /* reachable address; NULL: 127.0.0.1 */
	const struct mr_kv *kv;   /* bootstrap store (borrowed) */
	long timeout_ms;          /* per operation and for bootstrap; 0: 60000 */
	int transport;            /* enum mr_comm_transport */
	int device;               /* CUDA device (nccl backend) */
	/* Optional: bootstrap (init, and split of this communicator) gives up
	 * with MR_EABORTED within ~100 ms once *cancel != 0 (the worker's
	 * abort flag: a peer that never shows up must not pin create()). */
	const _Atomic int *cancel;
};

struct mr_comm;
struct mr_comm_req;

/*
 * A stream-ordered wait as a device keeps it (struct mr_comm_device's
 * stream_wait) until its compute stream has passed it: the communicator
 * that owns it, its name (the communicator's id) and the operation's
 * deadline. check (from the device's thread, the rank's) answers 0 while
 * the owner is healthy, else the error it failed with (another thread
 * aborted it: MR_EABORTED; a peer is lost: MR_EPEER); fail aborts the
 * owner with rc (nccl: ncclCommAbort, so its kernels return and the
 * stream drains; idempotent). Valid until the owner is freed.
 */
struct mr_comm_fence {
	void *owner;
	const char *name;
	long long deadline_ms; /* CLOCK_MONOTONIC, milliseconds */
	int (*check)(void *owner);
	void (*fail)(void *owner, int rc);
};

/*
 * Device memory (runtime/device): the host backend reads host memory, the
 * nccl backend device memory. With a device set, a communicator accepts
 * both in every operation and stages buffers in the other memory through
 * stand-ins (comm/stage.c): a device buffer costs the host backend a
 * download before and an upload after the operation, a host buffer costs
 * nccl the reverse. Copies are synchronous; unless the communicator is
 * stream-ordered (mr_comm_stream_ordered), the device's queued work must
 * be done before an operation on its memory starts (the caller syncs:
 * mr_dev_comm_sync in device/mr_dev_comm.h).
 * Set once, before the first operation and before splitting (splits
 * inherit it); the struct is borrowed and must outlive the communicator
 * and its splits. Staged operations are started and waited by one thread
 * at a time per communicator.
 */
struct mr_comm_device {
	void *ctx;
	int (*is_device)(void *ctx, const void *p);
	int (*download)(void *ctx, void *host, const void *dev, size_t bytes);
	int (*upload)(void *ctx, void *dev, const void *host, size_t bytes);
	void *(*alloc)(void *ctx, size_t bytes); /* device stand-ins (nccl) */
	void (*free)(void *ctx, void *p, size_t bytes);
	/* The device's compute stream (a cudaStream_t), or NULL: a backend on
	 * a stream of its own (nccl) makes it wait for the work queued there
	 * before each operation - a fresh buffer's zeroing included. May be
	 * NULL. */
	void *(*stream)(void *ctx);
	/* Stream-ordered waits (may be NULL: the device has none): the
	 * compute stream waits for event ev (a cudaEvent_t recorded behind
	 * the operation on the backend's stream, handed over; NULL: nothing
	 * to wait for) without the host, and the device keeps f pending
	 * until the stream has passed it (see struct mr_comm_fence);
	 * stream_forget returns once no fence of owner is pending (called
	 * by mr_comm_free). */
	int (*stream_wait)(void *ctx, void *ev, const struct mr_comm_fence *f);
	void (*stream_forget)(void *ctx, const void *owner);
	/* Tests only: a backend that stages device buffers through host
	 * memory (host) claims to be stream-ordered, so its waits finish on
	 * the host and then take the device's stream-wait path. Right only
	 * on a device that runs every operation before it returns (the CUDA
	 * emulation, tests/gpu/cuda_emul.c); set before the first operation. */
	int claim_stream_order;
};

/* enum mr_comm_op, mr_comm_op_name() and mr_comm_op_is_p2p() are in
 * common/mr_names.h (the controller names them too). */

/* A communicator's progress (see the header). A sequence number of 0
 * means "none yet". */
struct mr_comm_progress {
	uint64_t entered;   /* number of the last operation started */
	uint64_t completed; /* number of the last operation finished */
	int entered_op, completed_op; /* enum mr_comm_op */
	int peer;           /* entered p2p: the peer (recv and sendrecv: the
			     * rank received from; send: sent to), else -1 */
	double wait_s;      /* seconds callers spent blocked on it, in total */
	double wait_op_s[MR_COMM_OP__COUNT]; /* wait_s by the kind of operation */
};

/*
 * Registered buffers (host backend): memory from mr_comm_mem_alloc() is
 * read directly by shared-memory peers in other processes, so a large
 * send or collective from it costs the receiver one memcpy (or one pass
 * of its reduction) instead of two copies through the shared ring. Any
 * operation takes any memory; these buffers are only faster. Page-aligned
 * and zeroed; NULL when out of memory. Free only with mr_comm_mem_free()
 * (NULL is a no-op), and not while an operation uses the buffer. The
 * mapping is shared: a child forked without exec shares it with its
 * parent instead of getting a copy.
 */
void *mr_comm_mem_alloc(size_t len);
void mr_comm_mem_free(void *p);

/* "<boot id>/<ipc namespace>": equal strings can share memory. */
int mr_comm_host_id(char *buf, size_t cap);

size_t mr_comm_dtype_size(int dtype);

int mr_comm_init(struct mr_comm **out, const struct mr_comm_config *cfg,
		 struct mr_errbuf *eb);
/*
 * Collective over the n members of ranks[] (ranks of c, any order; the
 * new communicator's rank i is ranks[i]); every member calls it with the
 * same list and name (name may be NULL: a counter per list is used). Not a
 * collective over c: non-members simply do not call it.
 */
int mr_comm_split(struct mr_comm *c, const int *ranks, int n, const char *name,
		  struct mr_comm **out, struct mr_errbuf *eb);
int mr_comm_rank(const struct mr_comm *c);
int mr_comm_size(const struct mr_comm *c);
const char *mr_comm_backend(const struct mr_comm *c);
void mr_comm_set_timeout(struct mr_comm *c, long timeout_ms);
/* See struct mr_comm_device; NULL: every buffer is in the backend's memory. */
void mr_comm_set_device(struct mr_comm *c, const struct mr_comm_device *d);
/* Stand-ins this communicator has allocated for buffers in the other
 * memory (its pool's misses; a steady step makes none). */
uint64_t mr_comm_stage_allocs(const struct mr_comm *c);
/* Thread-safe (relaxed atomic loads): may run while another thread has
 * an operation in flight. The peer may belong to a newer operation than
 * the number while the rank is progressing; a stuck rank's view is exact. */
void mr_comm_progress(const struct mr_comm *c, struct mr_comm_progress *p);
/* Thread-safe, idempotent, async-signal-unsafe. */
void mr_comm_abort(struct mr_comm *c);
void mr_comm_free(struct mr_comm *c);

/* ---- asynchronous operations ---- */
/* In-place allowed (sbuf == rbuf). */
int mr_comm_iallreduce(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		       int dtype, int op, struct mr_comm_req **req);
/* sbuf holds size*count elements; rbuf gets this rank's count. */
int mr_comm_ireduce_scatter(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
			    int dtype, int op, struct mr_comm_req **req);
/* rbuf gets size*count elements, rank i's at i*count. */
int mr_comm_iallgather(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		       int dtype, struct mr_comm_req **req);
/* sbuf has rcounts[rank] elements; rank i's land at rbuf + rdispls[i]. */
int mr_comm_iallgatherv(struct mr_comm *c, const void *sbuf, void *rbuf,
			const size_t *rcounts, const size_t *rdispls, int dtype,
			struct mr_comm_req **req);
/* count elements to and from every rank, blocks in rank order. */
int mr_comm_ialltoall(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		      int dtype, struct mr_comm_req **req);
int mr_comm_ialltoallv(struct mr_comm *c, const void *sbuf, const size_t *scounts,
		       const size_t *sdispls, void *rbuf, const size_t *rcounts,
		       const size_t *rdispls, int dtype, struct mr_comm_req **req);
int mr_comm_ibroadcast(struct mr_comm *c, void *buf, size_t count, int dtype, int root,
		       struct mr_comm_req **req);
/* tag >= 0; a recv matches the oldest unmatched message (peer, tag). */
int mr_comm_isend(struct mr_comm *c, const void *buf, size_t count, int dtype, int peer,
		  int tag, struct mr_comm_req **req);
int mr_comm_irecv(struct mr_comm *c, void *buf, size_t count, int dtype, int peer,
		  int tag, struct mr_comm_req **req);
/* Sends count elements of sbuf to `to` and receives count into rbuf from
 * `from`, both with tag, as one operation (MPI_Sendrecv; a pipeline
 * stage's exchange with its neighbours). It matches and is matched by
 * plain send/recv. Unlike isend, its send may wait until `to` is inside
 * an operation of this communicator at any size (it is then copied once,
 * straight from sbuf). The blocking form runs in the calling thread when
 * nothing else is queued: no hand-off to the progress thread. */
int mr_comm_isendrecv(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count, int dtype,
		      int to, int from, int tag, struct mr_comm_req **req);
int mr_comm_ibarrier(struct mr_comm *c, struct mr_comm_req **req);
/*
 * Send/recv groups (ncclGroupStart/End): the isend/irecv started between
 * them progress together, so a pair of neighbours exchanging in opposite
 * orders cannot deadlock. The host backend progresses consecutive
 * send/recv together anyway (no-ops there). Nothing but isend/irecv
 * between them; no nesting.
 */
int mr_comm_group_start(struct mr_comm *c);
int mr_comm_group_end(struct mr_comm *c);
/* Moves queued send/recv work one step in the calling thread, without
 * waiting: a send just started is handed to its peer now instead of when
 * the progress thread next gets a core (on a machine whose cores all
 * compute, a scheduler tick later). A no-op where nothing is queued or
 * another thread is executing, and on backends that need none (nccl). */
void mr_comm_kick(struct mr_comm *c);
/* 1 when the backend runs send/recv strictly in issue order on one stream
 * (nccl): a receive posted long before its message arrives holds up every
 * later operation of the communicator, so post receives only when needed,
 * grouped with the sends before them. 0 for the host backend. */
int mr_comm_p2p_in_order(const struct mr_comm *c);

/*
 * Stream-ordered (1): c's backend runs on a stream of its own that waits
 * for the device's compute stream before each operation (nccl on a
 * device with a stream and stream_wait; or claim_stream_order), so
 * nothing need sync the host before an operation on device memory, and
 * waiting for an operation whose buffers are all device memory makes
 * the compute stream wait for it instead of the host: mr_comm_wait and
 * the blocking forms (a barrier excepted: it is the host's) return once
 * that is queued, and the wait stays
 * pending on the device (its deadline and an abort included: struct
 * mr_comm_fence) until the stream has passed it. The host backend, and
 * an operation with a buffer in host memory (staged), wait on the host.
 * Host code that reads the result must first wait for the device's
 * stream (a download does).
 */
int mr_comm_stream_ordered(const struct mr_comm *c);

/* *done = 1 when finished (then call wait to get the result and free). */
int mr_comm_test(struct mr_comm_req *req, int *done);
/* Waits until finished - for the compute stream where c is stream-ordered
 * (see above), else for the host; returns its result and frees req. */
int mr_comm_wait(struct mr_comm_req *req);
/* Blocks the host until finished, whatever the backend; as mr_comm_wait
 * otherwise. */
int mr_comm_wait_host(struct mr_comm_req *req);

/* ---- blocking forms ---- */
int mr_comm_allreduce(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		      int dtype, int op);
int mr_comm_reduce_scatter(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
			   int dtype, int op);
int mr_comm_allgather(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		      int dtype);
int mr_comm_allgatherv(struct mr_comm *c, const void *sbuf, void *rbuf,
		       const size_t *rcounts, const size_t *rdispls, int dtype);
int mr_comm_alltoall(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count,
		     int dtype);
int mr_comm_alltoallv(struct mr_comm *c, const void *sbuf, const size_t *scounts,
		      const size_t *sdispls, void *rbuf, const size_t *rcounts,
		      const size_t *rdispls, int dtype);
int mr_comm_broadcast(struct mr_comm *c, void *buf, size_t count, int dtype, int root);
int mr_comm_send(struct mr_comm *c, const void *buf, size_t count, int dtype, int peer,
		 int tag);
int mr_comm_recv(struct mr_comm *c, void *buf, size_t count, int dtype, int peer, int tag);
int mr_comm_sendrecv(struct mr_comm *c, const void *sbuf, void *rbuf, size_t count, int dtype,
		     int to, int from, int tag);
int mr_comm_barrier(struct mr_comm *c);

#endif
