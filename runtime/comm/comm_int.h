/*
 * comm_int.h - internals shared by the communicator front end (comm.c) and
 * its backends (host_*.c, nccl.c). Not part of the public API.
 *
 * A backend fills a struct mr__comm_ops and embeds struct mr_comm as the
 * first member of its own communicator; its requests start with struct
 * mr_comm_req. The front end validates arguments, builds a struct
 * mr__comm_op (copying v-variant arrays) and hands it to start().
 */
#ifndef MR_COMM_INT_H
#define MR_COMM_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "mr_comm.h"

enum mr__op_kind {
	MR__OP_ALLREDUCE,
	MR__OP_REDUCE_SCATTER,
	MR__OP_ALLGATHERV,
	MR__OP_ALLTOALLV,
	MR__OP_BROADCAST,
	MR__OP_SEND,
	MR__OP_RECV,
	MR__OP_SENDRECV,
	MR__OP_BARRIER,
};

/* One operation; the v arrays (n entries each) are owned by the op. */
struct mr__comm_op {
	int kind;
	const void *sbuf;
	void *rbuf;
	size_t count; /* allreduce/bcast/send/recv: total; reduce_scatter: per rank */
	int dtype, redop;
	int peer;     /* send/recv peer (sendrecv: sent to), broadcast root */
	int src;      /* sendrecv: received from */
	int tag;
	size_t *scounts, *sdispls, *rcounts, *rdispls;
};

#define MR__STAGE_CACHE 8

struct mr__comm_ops {
	const char *name;
	int device_memory; /* reads and writes device memory itself (nccl) */
	/* A communicator of size ranks, this one being rank, bootstrapped
	 * under KV namespace id (the front end derives it: mr_comm_split). */
	int (*split)(struct mr_comm *c, const char *id, int rank, int size, struct mr_comm **out,
		     struct mr_errbuf *eb);
	/* Takes ownership of op (and its arrays) on success and failure. */
	int (*start)(struct mr_comm *c, struct mr__comm_op *op, struct mr_comm_req **req);
	/* Optional: runs a blocking collective in the caller's thread when
	 * nothing is queued; MR_EAGAIN-like 1 means "not now, use start". */
	int (*run_now)(struct mr_comm *c, struct mr__comm_op *op);
	int (*test)(struct mr_comm_req *req, int *done);
	int (*wait)(struct mr_comm_req *req);
	void (*abort)(struct mr_comm *c);
	void (*free)(struct mr_comm *c);
	/* Optional (NULL: consecutive send/recv already progress together):
	 * the send/recv started between them run as one group. */
	int (*group_start)(struct mr_comm *c);
	int (*group_end)(struct mr_comm *c);
	/* Optional: moves queued send/recv work once in the caller's thread. */
	void (*kick)(struct mr_comm *c);
	/* Optional (a backend on its own stream, nccl): the backend's half
	 * of a stream-ordered wait (mr_comm_stream_ordered). Frees req and
	 * hands over the event recorded behind its operation (*ev) and its
	 * deadline; or fails with the communicator's error. */
	int (*detach)(struct mr_comm_req *req, void **ev, long long *deadline_ms);
	/* struct mr_comm_fence's check and fail (optional: healthy; abort) */
	int (*health)(struct mr_comm *c);
	void (*fail)(struct mr_comm *c, int rc);
};

struct mr_comm {
	const struct mr__comm_ops *ops;
	int rank, size;
	long timeout_ms;
	char id[MR_COMM_ID_MAX];
	char host_id[MR_COMM_HOST_ID_MAX];
	char addr[64];
	int transport, device;
	/* unnamed splits so far, per ranks-list hash (comm.c; a backend that
	 * copies a template communicator gets them reset by the front end) */
	struct mr__split_seen *splits;
	unsigned nsplits, capsplits;
	/* device buffers (mr_comm_set_device; inherited by splits): a backend
	 * without device_memory stages them through these host buffers */
	const struct mr_comm_device *dev;
	int fenced; /* a stream-ordered wait left a fence with dev (comm.c) */
	struct { void *p; size_t cap; } stage_cache[MR__STAGE_CACHE];
	uint64_t stage_allocs; /* stand-ins allocated (stage.c's pool missed) */
	const _Atomic int *cancel; /* bootstrap cancel flag, may be NULL */
	/* progress (comm.c): number << 8 | enum mr_comm_op, written by the
	 * issuing thread with relaxed stores; a backend that copies a
	 * template communicator gets them reset by the front end */
	_Atomic uint64_t entered, completed;
	_Atomic int peer;          /* of the entered operation, -1 */
	/* blocked in blocking forms and mr_comm_wait, by enum mr_comm_op */
	_Atomic uint64_t wait_ns[MR_COMM_OP__COUNT];
};

/* The front end tags a request with its operation (number << 8 | kind)
 * after the backend's start(); backends leave the tag alone. */
struct mr__stage;

struct mr_comm_req {
	struct mr_comm *comm;
	uint64_t tag;
	struct mr__stage *stage; /* host stand-ins of device buffers (stage.c) */
};

void mr__op_free(struct mr__comm_op *op);

/* stage.c: replaces op's device buffers by host ones (*st NULL when none
 * are); stage_out uploads the received data when rc == 0 and frees st,
 * returning rc or the upload's error; release frees the cache. */
int mr__stage_in(struct mr_comm *c, struct mr__comm_op *op, struct mr__stage **st);
int mr__stage_out(struct mr_comm *c, struct mr__stage *st, int rc);
void mr__stage_release(struct mr_comm *c);

int mr__host_init(struct mr_comm **out, const struct mr_comm_config *cfg,
		  const struct mr_kv *kv, struct mr_errbuf *eb);
/* The NCCL backend's (nccl.c) is an entry of the CUDA side:
 * mr__nccl_init in plugin/cuda_entry.h. */

/* Reductions (reduce.c): dst[i] = dst[i] op src[i]; dtype never bf16 here
 * (bf16 travels as fp32 inside the host backend). */
void mr__reduce(void *dst, const void *src, size_t n, int dtype, int redop);
/* dst[i] = a[i] op b[i]. */
void mr__reduce3(void *dst, const void *a, const void *b, size_t n, int dtype, int redop);
/* dst[i] /= div (avg finish). */
void mr__scale_div(void *buf, size_t n, int dtype, int div);
void mr__bf16_to_f32(float *dst, const uint16_t *src, size_t n);
void mr__f32_to_bf16(uint16_t *dst, const float *src, size_t n);
/* memcpy with non-temporal stores (reduce.c): for large receive buffers
 * nobody reads right away, so the copy writes memory without first reading
 * every destination line into the cache. Ordered (sfence) on return. */
void mr__copy_stream(void *dst, const void *src, size_t n);
uint64_t mr__hash(const void *p, size_t n, uint64_t h);
long long mr__now_ms(void);

#endif
