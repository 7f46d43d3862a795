/*
 * cuda.c - the cuda device (see mr_device.h): one CUDA context per rank
 * (runtime/cuda's kernels, cuBLASLt, one stream; cuda/mr_cuda.h) behind
 * the device table. Host C only: the kernels are reached through
 * mr_cuda.h, so the CPU emulation of that header (tests/gpu/cuda_emul.c)
 * runs this file on a machine without a GPU.
 *
 * Precision: "bf16" (the default) keeps activations, their gradients and
 * the weights' compute copy in bf16 with fp32 master weights, gradients
 * and optimizer state; "fp32" keeps everything fp32 (no TF32 GEMMs). The
 * context's activation type is set once at open and every kernel is the
 * same template either way.
 *
 * Order: every operation is queued on the context's stream and returns at
 * once, except those whose result the host needs: upload and download
 * (they wait for the stream), sync and sumsq (its result is on the host)
 * - the ones a graph capture refuses (graph_run: the kernel layer's
 * stream capture; a refusal is kept as the capture's reason, not logged
 * as a failure, and the step driver turns graphs off).
 * The MoE forward and backward with capacity routing read nothing on the
 * host (sync-free, kernels/mr_moe.h): padded rows of each expert's cap
 * block are zeroed, the expert GEMMs are strided-batched over whole
 * blocks, the exchange gets no counts, and the aux loss and dropped count
 * stay in the acts' stat for the model's read with the forward's results.
 * With context parallelism the routed counts are summed over the
 * sequence split in device memory and the aux loss formed there. Dropless
 * routing keeps the host path - the forward and backward wait once each
 * for the per-expert counts, which a capture refuses too - counted in
 * moe_host_counts and logged once (event moe_host_counts).
 * Before a MoE exchange or reduce callback (a collective) the stream is
 * synced, as mr_device.h asks. Memory is cudaMalloc'd, zeroed on the
 * stream and accounted in the caller's ledger; free waits for the stream.
 * Host memory for offloaded state (host_alloc) is cudaHostAlloc'd
 * (pinned), zeroed on the host; its free waits for the stream too.
 * Collectives of a stream-ordered communicator (nccl) need no sync: the
 * stream waits for them (stream_wait), and each such wait stays pending
 * until the stream has passed it; every wait of the host for the stream
 * listed here first polls the pending ones (fences_drain), so a lost peer
 * or a deadline passed fails the host's wait instead of hanging it.
 *
 * Errors: an operation returns the kernel layer's code (MR_EINVAL for a
 * shape the kernels do not support, such as a head size that is not a
 * multiple of 32; MR_ESYS for CUDA errors); the table has no error buffer,
 * so the reason is logged (event cuda_op_failed) where it happened.
 *
 * The stream is the device's .stream: NCCL's stream waits on it through an
 * event before each collective (comm/nccl.c), so a fresh buffer's zeroing
 * here is done before NCCL writes it; it waits on NCCL's in turn through
 * stream_wait.
 *
 * Timing (time_ops/time_take, the breakdown of a step by kind): while on,
 * every kernel-layer call is bracketed by two timing events on the stream
 * (mr_cuda_mark), so an operation's time is its own on the GPU and the
 * gaps between operations - the host late to launch, a wait for the host
 * or for NCCL's stream - are idle. An expert GEMM inside the MoE forward
 * counts as a GEMM (a strided-batched one over all experts too). Off, it
 * costs one branch per call. A graph's operations are not timed (a mark
 * cannot be read inside one), so the worker's profiled step runs eagerly.
 *
 * Non-goals: a caching allocator, more than one stream, overlapping copy
 * regions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/mr_comm.h"
#include "cuda/mr_cuda.h"
#include "device/dev_int.h"
#include "device/mr_peak.h"
#include "kernels/mr_moe.h"
#include "mr_log.h"

/* A stream-ordered wait the stream has not passed yet (stream_wait): the
 * communicator's fence and the event the stream waits on (handed over;
 * NULL: the stream's idleness alone tells it passed). */
struct fence {
	struct mr_comm_fence f;
	void *ev;
};

#define FENCE_POLL_US 100 /* a host wait's look at pending fences, every */

/* A timed operation: its two marks (mr_cuda_mark) and its kind. */
struct timed_op {
	int begin, end;
	enum mr_dev_kind kind;
};

struct cuda_state {
	struct mr_cuda *cu;
	long lt_fallbacks; /* GEMM fallbacks seen at the last sync */
	int *counts;     /* (E) the MoE layer's kept rows per expert, on the host */
	size_t ncounts;
	const char *moe_host_why; /* the MoE host path's reason last logged */
	struct mr_cuda_adamw_range *ranges; /* (nranges) adamw's, as the kernels take them */
	int nranges;
	struct mr_cuda_graph *graphs[MR_DEV_GRAPHS]; /* graph_run's, by key */
	char refused[160]; /* the first operation the capture under way refused */
	/* timing (time_ops): room for `room` operations per time_take */
	int room, ntimed, open_kind, open_mark;
	long untimed;
	struct timed_op *timed;
	double *mark_ms; /* (2 room) */
	struct fence *fences; /* (nfences of capfences) pending stream-ordered waits */
	int nfences, capfences;
};

static struct mr_cuda *cu_of(const struct mr_dev *d)
{
	return ((const struct cuda_state *)d->impl)->cu;
}

/* The kind an operation's time counts as, by its name; -1: not an
 * operation on the stream (sync, pinned host memory, stream-ordered
 * waits). */
static int kind_of(const char *op)
{
	static const char *const copies[] = { "upload", "download", "copy", "copy2d",
					      "zero",   "alloc",    "to_act", "to_f32" };
	size_t i;

	if (!strncmp(op, "attn", 4))
		return MR_DEV_ATTENTION;
	if (!strncmp(op, "matmul", 6))
		return MR_DEV_GEMM;
	if (!strcmp(op, "adamw") || !strcmp(op, "sumsq") || !strcmp(op, "scale"))
		return MR_DEV_OPTIMIZER;
	for (i = 0; i < sizeof(copies) / sizeof(copies[0]); i++)
		if (!strcmp(op, copies[i]))
			return MR_DEV_COPY;
	if (!strcmp(op, "sync") || !strncmp(op, "host_", 5) || !strncmp(op, "stream_", 7))
		return -1;
	return MR_DEV_OTHER;
}

/* Before a kernel-layer call, while timing: its first mark. */
static void mark_begin(const struct mr_dev *d, const char *op)
{
	struct cuda_state *s = d->impl;

	s->open_mark = -1;
	if (!s->room || (s->open_kind = kind_of(op)) < 0 || mr_cuda_capturing(s->cu))
		return;
	if (s->ntimed >= s->room || (s->open_mark = mr_cuda_mark(s->cu)) < 0)
		s->untimed++;
}

/* After it: its second mark, and the operation joins the timed ones. */
static void mark_end(const struct mr_dev *d)
{
	struct cuda_state *s = d->impl;
	int end;

	if (s->open_mark < 0)
		return;
	if ((end = mr_cuda_mark(s->cu)) < 0) {
		s->untimed++;
	} else {
		s->timed[s->ntimed].begin = s->open_mark;
		s->timed[s->ntimed].end = end;
		s->timed[s->ntimed].kind = (enum mr_dev_kind)s->open_kind;
		s->ntimed++;
	}
	s->open_mark = -1;
}

/* While capturing: op refused (the kernel layer's reason in its message,
 * which names the call it refused), kept as the capture's reason when it
 * is the first. */
static int refused(const struct mr_dev *d, const char *op)
{
	struct cuda_state *s = d->impl;
	const char *why = mr_cuda_errmsg(s->cu);

	if (!s->refused[0] && strstr(why, op))
		snprintf(s->refused, sizeof(s->refused), "%s", why);
	else if (!s->refused[0])
		snprintf(s->refused, sizeof(s->refused), "%s: %s", op, why);
	return MR_ENEEDHOST;
}

/* rc of a kernel-layer call; logs its reason when it failed and keeps
 * the first as the device's fault (a capture's refusal is neither). */
static int ck_op(const struct mr_dev *d, int rc, const char *op)
{
	struct mr_dev *w = (struct mr_dev *)d; /* const for the ops' sake */

	mark_end(d);
	if (rc == MR_ENEEDHOST)
		return refused(d, op);
	if (rc < 0) {
		mr_log_error("cuda_op_failed", "op=%s err=%s", op,
			     mr_log_q(mr_cuda_errmsg(cu_of(d))));
		if (!w->fault[0])
			snprintf(w->fault, sizeof(w->fault), "%s: %s", op,
				 mr_cuda_errmsg(cu_of(d)));
	}
	return rc;
}

/* Every kernel-layer call is checked through ck, and timed while the
 * device times its operations: the comma operator makes the first mark
 * before the call runs. */
#define ck(d, call, op) ck_op((d), (mark_begin((d), (op)), (call)), (op))

/* ---- stream-ordered waits ------------------------------------------------
 * (see mr_device.h's stream_wait) Every host wait for the stream below
 * first drains the pending fences: it polls them, and the stream, every
 * FENCE_POLL_US until each has passed, so it never blocks behind a
 * collective that cannot end - a lost peer or a deadline passed aborts the
 * communicator (its kernels return) and fails the host wait instead.
 */

static long long now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void fence_drop(struct cuda_state *s, int i)
{
	mr_cuda_event_free(s->cu, s->fences[i].ev);
	s->fences[i] = s->fences[--s->nfences];
}

/* Whether the stream has passed fence x: 1, 0, or the query's error. */
static int fence_passed(const struct mr_dev *d, const struct fence *x, int idle)
{
	if (idle || !x->ev)
		return idle;
	return ck_op(d, mr_cuda_query(cu_of(d), x->ev), "stream_query");
}

/* A fence that has not passed: 0 while its owner is sound and its
 * deadline ahead; else the owner is aborted, the failure logged and the
 * fence's error returned. */
static int fence_check(const struct fence *x)
{
	int rc = x->f.check(x->f.owner);

	if (rc == 0 && now_ms() > x->f.deadline_ms)
		rc = MR_ETIMEDOUT;
	if (rc < 0) {
		x->f.fail(x->f.owner, rc);
		mr_log_error("stream_wait_failed", "comm=%s err=%s deadline_in_ms=%lld",
			     mr_log_q(x->f.name), mr_err_name(rc), x->f.deadline_ms - now_ms());
	}
	return rc;
}

/* One look at the pending fences of owner (NULL: all): those passed are
 * dropped, the first that failed too (its error returned). 1 while some
 * are left, 0 when none is. */
static int fences_poll(const struct mr_dev *d, const void *owner)
{
	struct cuda_state *s = d->impl;
	int idle, left = 0, i = 0, rc;

	if (s->nfences == 0) /* no query: none is due, and a capture forbids it */
		return 0;
	if ((idle = ck_op(d, mr_cuda_query(s->cu, NULL), "stream_query")) < 0)
		return idle;
	while (i < s->nfences) {
		struct fence *x = &s->fences[i];

		if (owner && x->f.owner != owner) {
			i++;
			continue;
		}
		rc = fence_passed(d, x, idle);
		if (rc == 0 && (rc = fence_check(x)) == 0) {
			left = 1;
			i++;
			continue;
		}
		fence_drop(s, i);
		if (rc < 0)
			return rc;
	}
	return left;
}

/* Polls the fences of owner (NULL: all) until none is left: before every
 * host wait for the stream. 0, or the first failure. */
static int fences_drain(const struct mr_dev *d, const void *owner)
{
	struct timespec ts = { 0, FENCE_POLL_US * 1000 };
	int rc;

	while ((rc = fences_poll(d, owner)) == 1)
		nanosleep(&ts, NULL);
	return rc;
}

/* Drains while failures drop fences (each logged, its owner aborted):
 * before a host wait that cannot report an error (free, close). */
static void fences_clear(const struct mr_dev *d)
{
	struct cuda_state *s = d->impl;
	int n = s->nfences;

	while (fences_drain(d, NULL) < 0 && s->nfences < n)
		n = s->nfences;
}

static int cuda_stream_wait(struct mr_dev *d, void *ev, const struct mr_comm_fence *f)
{
	struct cuda_state *s = d->impl;
	int rc = 0;

	/* full: drop the ones passed before making room */
	if (s->nfences == s->capfences && (rc = fences_poll(d, NULL)) < 0)
		goto fail;
	if (s->nfences == s->capfences) {
		int cap = s->capfences ? 2 * s->capfences : 16;
		struct fence *g = realloc(s->fences, (size_t)cap * sizeof(*g));

		if (!g) {
			rc = MR_ENOMEM;
			goto fail;
		}
		s->fences = g;
		s->capfences = cap;
	}
	if ((rc = ck(d, mr_cuda_stream_wait(s->cu, ev), "stream_wait")) < 0)
		goto fail;
	s->fences[s->nfences++] = (struct fence){ *f, ev };
	return 0;
fail:
	mr_cuda_event_free(s->cu, ev);
	return rc;
}

static void cuda_stream_forget(struct mr_dev *d, const void *owner)
{
	struct cuda_state *s = d->impl;
	int i = 0;

	/* failures were logged; the fences that could not be polled go too */
	fences_drain(d, owner);
	while (i < s->nfences)
		if (s->fences[i].f.owner == owner)
			fence_drop(s, i);
		else
			i++;
}

/* An activation pointer's element n, and the MoE acts' float-typed
 * buffers that hold activations on this device. */
#define AT(d, p, n) mr_dev_at((d), (p), (n))
#define ACT(p) ((mr_act *)(void *)(p))

/* ---- memory and copies --------------------------------------------------- */

static void *cuda_alloc(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind,
			size_t bytes)
{
	void *p = NULL;

	if (ck(d, mr_cuda_alloc(cu_of(d), &p, bytes), "alloc") < 0)
		return NULL;
	if (ck(d, mr_cuda_memset0(cu_of(d), p, bytes), "alloc") < 0) {
		mr_cuda_dfree(cu_of(d), p);
		return NULL;
	}
	mr_mem_count(mem, kind, bytes);
	return p;
}

static void cuda_free(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind, void *p,
		      size_t bytes)
{
	if (mr_cuda_capturing(cu_of(d))) { /* kept: the capture fails */
		refused(d, "free");
		return;
	}
	fences_clear(d);
	mr_cuda_dfree(cu_of(d), p);
	mr_mem_uncount(mem, kind, bytes);
}

static void *cuda_host_alloc(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind,
			     size_t bytes)
{
	void *p = NULL;

	if (ck(d, mr_cuda_host_alloc(cu_of(d), &p, bytes), "host_alloc") < 0)
		return NULL;
	memset(p, 0, bytes ? bytes : 1);
	mr_mem_count(mem, kind, bytes);
	return p;
}

static void cuda_host_free(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind, void *p,
			   size_t bytes)
{
	fences_clear(d);
	ck(d, mr_cuda_host_free(cu_of(d), p), "host_free");
	mr_mem_uncount(mem, kind, bytes);
}

static int cuda_upload(struct mr_dev *d, void *dst, const void *src_host, size_t bytes)
{
	int rc = fences_drain(d, NULL);

	if (rc < 0)
		return rc;
	return ck(d, mr_cuda_upload(cu_of(d), dst, src_host, bytes), "upload");
}

static int cuda_download(struct mr_dev *d, void *dst_host, const void *src, size_t bytes)
{
	int rc = fences_drain(d, NULL);

	if (rc < 0)
		return rc;
	return ck(d, mr_cuda_download(cu_of(d), dst_host, src, bytes), "download");
}

static int cuda_copy(struct mr_dev *d, void *dst, const void *src, size_t bytes)
{
	return ck(d, mr_cuda_copy(cu_of(d), dst, src, bytes), "copy");
}

static int cuda_copy2d(struct mr_dev *d, void *dst, size_t dpitch, const void *src,
		       size_t spitch, size_t width, size_t rows)
{
	return ck(d, mr_cuda_copy2d(cu_of(d), dst, dpitch, src, spitch, width, rows), "copy2d");
}

static int cuda_zero(struct mr_dev *d, void *p, size_t bytes)
{
	return ck(d, mr_cuda_memset0(cu_of(d), p, bytes), "zero");
}

static int cuda_to_act(struct mr_dev *d, mr_act *dst, const float *src, size_t n)
{
	if (d->act == MR_DT_F32)
		return cuda_copy(d, dst, src, n * sizeof(float));
	return ck(d, mr_cuda_f32_to_bf16(cu_of(d), (mr_bf16 *)(void *)dst, src, n), "to_act");
}

static int cuda_to_f32(struct mr_dev *d, float *dst, const mr_act *src, size_t n)
{
	if (d->act == MR_DT_F32)
		return cuda_copy(d, dst, src, n * sizeof(float));
	return ck(d, mr_cuda_bf16_to_f32(cu_of(d), dst, (const mr_bf16 *)(const void *)src, n),
		  "to_f32");
}

static void *cuda_stream(struct mr_dev *d)
{
	return mr_cuda_stream(cu_of(d));
}

static int cuda_sync(struct mr_dev *d)
{
	struct cuda_state *s = d->impl;
	const char *why = "";
	long n = mr_cuda_lt_fallbacks(cu_of(d), &why);
	int rc = fences_drain(d, NULL);

	if (n > 0 && s->lt_fallbacks == 0) /* once; the count rides in the stats */
		mr_log_warn("gemm_fallback", "reason=%s", mr_log_q(why));
	s->lt_fallbacks = n;
	/* attention's own are logged by the kernel layer, once per shape */
	d->fallbacks = n + mr_cuda_attn_fallbacks(cu_of(d), NULL);
	return rc < 0 ? rc : ck(d, mr_cuda_sync(cu_of(d)), "sync");
}

static int cuda_is_device(struct mr_dev *d, const void *p)
{
	(void)d;
	return mr_cuda_is_device_ptr(p);
}

/* ---- the GPT's kernels ---------------------------------------------------- */

static int cuda_matmul_fwd(struct mr_dev *d, mr_act *out, const mr_act *inp, const mr_act *w,
			   const mr_act *bias, int N, int IC, int OC)
{
	return ck(d, mr_cuda_matmul_fwd(cu_of(d), out, inp, w, bias, N, IC, OC), "matmul_fwd");
}

static int cuda_matmul_gelu_fwd(struct mr_dev *d, mr_act *out, mr_act *pre, const mr_act *inp,
				const mr_act *w, const mr_act *bias, int N, int IC, int OC)
{
	return ck(d, mr_cuda_matmul_gelu_fwd(cu_of(d), out, pre, inp, w, bias, N, IC, OC),
		  "matmul_gelu_fwd");
}

static int cuda_matmul_bwd(struct mr_dev *d, mr_act *dinp, float *dw, float *dbias,
			   const mr_act *dout, const mr_act *inp, const mr_act *w, int N, int IC,
			   int OC, int acc)
{
	return ck(d,
		  mr_cuda_matmul_bwd(cu_of(d), dinp, dw, dbias, dout, inp, w, N, IC, OC, acc),
		  "matmul_bwd");
}

static int cuda_matmul_dgelu_bwd(struct mr_dev *d, mr_act *dinp, float *dw, float *dbias,
				 const mr_act *dout, const mr_act *inp, const mr_act *w,
				 const mr_act *pre, int N, int IC, int OC)
{
	return ck(d,
		  mr_cuda_matmul_dgelu_bwd(cu_of(d), dinp, dw, dbias, dout, inp, w, pre, N, IC, OC),
		  "matmul_dgelu_bwd");
}

static int cuda_layernorm_fwd(struct mr_dev *d, mr_act *out, float *mean, float *rstd,
			      const mr_act *inp, const mr_act *w, const mr_act *b, int N, int C)
{
	return ck(d, mr_cuda_layernorm_fwd(cu_of(d), out, mean, rstd, inp, w, b, N, C),
		  "layernorm_fwd");
}

static int cuda_add_layernorm_fwd(struct mr_dev *d, mr_act *y, mr_act *out, float *mean,
				  float *rstd, const mr_act *x, const mr_act *w, const mr_act *b,
				  int N, int C)
{
	return ck(d, mr_cuda_add_layernorm_fwd(cu_of(d), y, out, mean, rstd, x, w, b, N, C),
		  "add_layernorm_fwd");
}

static int cuda_layernorm_bwd(struct mr_dev *d, mr_act *dinp, float *dw, float *db,
			      const mr_act *dout, const mr_act *inp, const mr_act *w,
			      const float *mean, const float *rstd, int N, int C, void *ws)
{
	(void)ws; /* the context's scratch holds the partial sums */
	return ck(d, mr_cuda_layernorm_bwd(cu_of(d), dinp, dw, db, dout, inp, w, mean, rstd, N, C),
		  "layernorm_bwd");
}

static int cuda_gelu_fwd(struct mr_dev *d, mr_act *out, const mr_act *inp, size_t n)
{
	return ck(d, mr_cuda_gelu_fwd(cu_of(d), out, inp, n), "gelu_fwd");
}

static int cuda_gelu_bwd(struct mr_dev *d, mr_act *dinp, const mr_act *inp, const mr_act *dout,
			 size_t n)
{
	return ck(d, mr_cuda_gelu_bwd(cu_of(d), dinp, inp, dout, n), "gelu_bwd");
}

static int cuda_add(struct mr_dev *d, mr_act *y, const mr_act *x, size_t n)
{
	return ck(d, mr_cuda_add_inplace(cu_of(d), y, x, n), "add");
}

static int cuda_add_bias(struct mr_dev *d, mr_act *rows, const mr_act *bias, int n, int C)
{
	return ck(d, mr_cuda_add_bias(cu_of(d), rows, bias, n, C), "add_bias");
}

static int cuda_embed_fwd(struct mr_dev *d, mr_act *out, const int *tok, const mr_act *wte,
			  const mr_act *wpe, int B, int T, int C)
{
	return ck(d, mr_cuda_encoder_fwd(cu_of(d), out, tok, wte, wpe, B, T, C), "embed_fwd");
}

static int cuda_embed_bwd(struct mr_dev *d, float *dwte, float *dwpe, const mr_act *dout,
			  const int *tok, const int *tok_host, int B, int T, int C)
{
	int V = 1, i;

	/* the kernel buckets positions by token on the host (in a graph, a
	 * host node reading tok_host when it runs) */
	(void)tok;
	for (i = 0; i < B * T; i++)
		if (tok_host[i] >= V)
			V = tok_host[i] + 1;
	return ck(d, mr_cuda_encoder_bwd(cu_of(d), dwte, dwpe, dout, tok_host, B, T, C, V),
		  "embed_bwd");
}

static int cuda_add_pos(struct mr_dev *d, mr_act *out, const mr_act *wpe, int n, int C,
			int period, int off)
{
	return ck(d, mr_cuda_add_pos(cu_of(d), out, wpe, n, C, period, off), "add_pos");
}

static int cuda_ce_fwd(struct mr_dev *d, float *losses, float *lse, const mr_act *logits,
		       const int *tgt, int N, int V)
{
	return ck(d, mr_cuda_crossentropy_fwd(cu_of(d), losses, lse, logits, tgt, N, V), "ce_fwd");
}

static int cuda_ce_rowmax(struct mr_dev *d, float *mx, const mr_act *logits, int N, int V)
{
	return ck(d, mr_cuda_crossentropy_rowmax(cu_of(d), mx, logits, N, V), "ce_rowmax");
}

static int cuda_ce_sumexp(struct mr_dev *d, float *sum, float *tl, const mr_act *logits,
			  const float *mx, const int *tgt, int N, int V)
{
	return ck(d, mr_cuda_crossentropy_sumexp(cu_of(d), sum, tl, logits, mx, tgt, N, V),
		  "ce_sumexp");
}

static int cuda_ce_finish(struct mr_dev *d, float *losses, float *lse, const float *mx,
			  const float *sum, const float *tl, int N)
{
	return ck(d, mr_cuda_crossentropy_finish(cu_of(d), losses, lse, mx, sum, tl, N),
		  "ce_finish");
}

static int cuda_ce_bwd(struct mr_dev *d, mr_act *logits, const float *lse, const int *tgt, int N,
		       int V, float dscale)
{
	return ck(d, mr_cuda_crossentropy_bwd_inplace(cu_of(d), logits, lse, tgt, N, V, dscale),
		  "ce_bwd");
}

static int cuda_fill_cols(struct mr_dev *d, mr_act *x, int N, int V, int from, float value)
{
	return ck(d, mr_cuda_fill_cols(cu_of(d), x, N, V, from, value), "fill_cols");
}

static int cuda_attn_fwd(struct mr_dev *d, mr_act *out, float *lse, const mr_act *qkv, int B,
			 int T, int C, int NH, int NKV, void *ws)
{
	(void)ws;
	return ck(d, mr_cuda_attn_layer_fwd(cu_of(d), out, lse, qkv, B, T, C, NH, NKV),
		  "attn_fwd");
}

static struct mr_cuda_attn cuda_slice(const struct mr_dev_attn *a)
{
	struct mr_cuda_attn s = { a->q, a->k, a->v, a->q_row, a->q_batch, a->kv_row,
				  a->kv_batch, a->B, a->NH, a->hs, a->tq, a->q_pos0,
				  a->tk, a->k_pos0, a->causal, a->scale, a->NKV };
	return s;
}

static int cuda_attn_part_fwd(struct mr_dev *d, const struct mr_dev_attn *a, float *out,
			      size_t o_row, size_t o_batch, float *lse)
{
	struct mr_cuda_attn s = cuda_slice(a);

	return ck(d, mr_cuda_attn_fwd_f32(cu_of(d), &s, out, o_row, o_batch, lse),
		  "attn_part_fwd");
}

static int cuda_attn_merge(struct mr_dev *d, float *out_a, float *lse_a, const float *out_b,
			   const float *lse_b, int B, int NH, int tq, int hs, size_t o_row,
			   size_t o_batch)
{
	return ck(d,
		  mr_cuda_attn_merge(cu_of(d), out_a, lse_a, out_b, lse_b, B, NH, tq, hs, o_row,
				     o_batch),
		  "attn_merge");
}

static int cuda_attn_delta(struct mr_dev *d, float *delta, const mr_act *dout,
			   const mr_act *out, int B, int NH, int tq, int hs, size_t o_row,
			   size_t o_batch)
{
	return ck(d,
		  mr_cuda_attn_delta(cu_of(d), delta, dout, out, B, NH, tq, hs, o_row, o_batch),
		  "attn_delta");
}

static int cuda_attn_part_bwd(struct mr_dev *d, const struct mr_dev_attn *a, const mr_act *dout,
			      size_t o_row, size_t o_batch, const float *lse, const float *delta,
			      float *dq, size_t dq_row, size_t dq_batch, float *dk, float *dv,
			      size_t dkv_row, size_t dkv_batch)
{
	struct mr_cuda_attn s = cuda_slice(a);

	return ck(d,
		  mr_cuda_attn_bwd_f32(cu_of(d), &s, dout, o_row, o_batch, lse, delta, dq, dq_row,
				       dq_batch, dk, dv, dkv_row, dkv_batch),
		  "attn_part_bwd");
}

static int cuda_attn_bwd(struct mr_dev *d, mr_act *dqkv, const mr_act *dout, const mr_act *qkv,
			 const mr_act *out, const float *lse, int B, int T, int C, int NH,
			 int NKV, void *ws)
{
	(void)ws; /* delta lives in the context's scratch */
	return ck(d, mr_cuda_attn_layer_bwd(cu_of(d), dqkv, dout, qkv, out, lse, B, T, C, NH, NKV),
		  "attn_bwd");
}

static int cuda_rmsnorm_fwd(struct mr_dev *d, mr_act *out, float *rstd, const mr_act *inp,
			    const mr_act *w, int N, int C, float eps)
{
	return ck(d, mr_cuda_rmsnorm_fwd(cu_of(d), out, rstd, inp, w, N, C, eps), "rmsnorm_fwd");
}

static int cuda_rmsnorm_bwd(struct mr_dev *d, mr_act *dinp, float *dw, const mr_act *dout,
			    const mr_act *inp, const mr_act *w, const float *rstd, int N, int C,
			    void *ws)
{
	(void)ws; /* the column sums' chunks live in the context's scratch */
	return ck(d, mr_cuda_rmsnorm_bwd(cu_of(d), dinp, dw, dout, inp, w, rstd, N, C),
		  "rmsnorm_bwd");
}

static int cuda_rope(struct mr_dev *d, mr_act *x, size_t stride, int N, int nheads, int D,
		     const int *pos, const float *inv_freq, int dir)
{
	if (dir > 0)
		return ck(d, mr_cuda_rope_fwd(cu_of(d), x, stride, N, nheads, D, pos, inv_freq),
			  "rope_fwd");
	return ck(d, mr_cuda_rope_bwd(cu_of(d), x, stride, N, nheads, D, pos, inv_freq),
		  "rope_bwd");
}

static int cuda_swiglu_fwd(struct mr_dev *d, mr_act *out, const mr_act *ab, int N, int H)
{
	return ck(d, mr_cuda_swiglu_fwd(cu_of(d), out, ab, N, H), "swiglu_fwd");
}

static int cuda_swiglu_bwd(struct mr_dev *d, mr_act *dab, const mr_act *ab, const mr_act *dout,
			   int N, int H)
{
	return ck(d, mr_cuda_swiglu_bwd(cu_of(d), dab, ab, dout, N, H), "swiglu_bwd");
}

static size_t cuda_ws_bytes(struct mr_dev *d, int T, int C, int NH)
{
	(void)d;
	(void)T;
	(void)C;
	(void)NH;
	return 0; /* the kernels use the context's own scratch */
}

/* ---- mixture of experts ----------------------------------------------------
 * The layer's routing tensors and expert rows are the model's struct
 * mr_moe_acts in device memory; its float-typed expert buffers (xin, h,
 * hg, yo) hold activations of this device's type (they have room for
 * fp32). The exchange callback gets those rows as they are: on a bf16
 * device its `row` elements are bf16; on the sync-free path it gets no
 * counts (whole cap blocks). Each forward picks its path
 * (host_counts_reason) and records it in the acts (stat_on_dev) for the
 * backward.
 */

/* The host copy of the per-expert counts, grown to E. */
static int *counts_for(struct mr_dev *d, int E)
{
	struct cuda_state *s = d->impl;

	if ((size_t)E > s->ncounts) {
		int *c = realloc(s->counts, (size_t)E * sizeof(int));
		if (!c)
			return NULL;
		s->counts = c;
		s->ncounts = (size_t)E;
	}
	return s->counts;
}

/* Context parallel (mr_moe.h count_reduce) on the host path: routed
 * summed over the ranks of the sequence split, and the aux loss from the
 * sums - through the host, E ints and the (N,E) router probabilities. */
static int sum_routed(struct mr_dev *d, const struct mr_moe_xchg *xg,
		      const struct mr_moe_shape *s, struct mr_moe_acts *a)
{
	size_t np = (size_t)s->N * s->E;
	int *routed = malloc(sizeof(int) * (size_t)s->E);
	float *probs = malloc(sizeof(float) * np);
	int rc = routed && probs ? 0 : MR_ENOMEM;

	if (rc == 0)
		rc = cuda_download(d, routed, a->routed, sizeof(int) * (size_t)s->E);
	if (rc == 0)
		rc = xg->count_reduce(xg->count_ctx, routed, s->E);
	if (rc == 0)
		rc = cuda_upload(d, a->routed, routed, sizeof(int) * (size_t)s->E);
	if (rc == 0)
		rc = cuda_download(d, probs, a->probs, sizeof(float) * np);
	if (rc == 0)
		a->aux = mr_moe_aux(s, probs, routed, xg->count_ranks);
	free(routed);
	free(probs);
	return rc;
}

/* The same on the sync-free path: routed summed in device memory (the
 * callback's communicator takes device buffers: NCCL in place, the host
 * backend staged), after a sync as every collective callback; the aux
 * loss from the sums into stat on the device. */
static int sum_routed_on_device(struct mr_dev *d, const struct mr_moe_xchg *xg,
				const struct mr_moe_shape *s, struct mr_moe_acts *a)
{
	int rc;

	if ((rc = cuda_sync(d)) < 0 || (rc = xg->count_reduce(xg->count_ctx, a->routed, s->E)) < 0)
		return rc;
	return ck(d,
		  mr_cuda_moe_aux(cu_of(d), s, a->stat, a->probs, a->routed, xg->count_ranks),
		  "moe_aux");
}

/* The exchange of one phase (none without a callback), after a sync. */
static int exchange(struct mr_dev *d, const struct mr_moe_xchg *xg, enum mr_moe_phase ph,
		    mr_act *rows, const int *counts, const struct mr_moe_shape *s)
{
	int rc;

	if (!xg || !xg->fn)
		return 0;
	if ((rc = cuda_sync(d)) < 0)
		return rc;
	return xg->fn(xg->ctx, ph, (float *)(void *)rows, counts, s->E, s->cap, (size_t)s->C);
}

#define TRY(call)                        \
	do {                             \
		if ((rc = (call)) < 0)   \
			return rc;       \
	} while (0)

/* Why this MoE forward reads the expert counts on the host; NULL: it
 * need not, the sync-free path runs (kernels/mr_moe.h). */
static const char *host_counts_reason(const struct mr_moe_shape *s, const struct mr_moe_acts *a)
{
	if (s->dropless)
		return "dropless routing: expert row counts are read on the host";
	if (!a->stat)
		return "no device array for the aux loss (mr_moe_acts.stat)";
	return NULL;
}

/* A forward on the host path: counted, its reason logged once (again
 * when it changes). */
static void note_host_counts(struct mr_dev *d, const char *why)
{
	struct cuda_state *s = d->impl;

	d->moe_host_counts++;
	if (s->moe_host_why != why) {
		s->moe_host_why = why;
		mr_log_info("moe_host_counts", "reason=%s", mr_log_q(why));
	}
}

/* The host path's experts: one GEMM per expert over its v->counts[e]
 * kept rows. */
static int experts_fwd_each(struct mr_dev *d, const struct mr_moe_shape *s,
			    const struct mr_moe_view *v, const struct mr_moe_acts *a,
			    const mr_act *fcw, const mr_act *fcb, const mr_act *fcprojw,
			    const mr_act *fcprojb)
{
	mr_act *xin = ACT(a->xin), *h = ACT(a->h), *hg = ACT(a->hg), *yo = ACT(a->yo);
	size_t C = (size_t)s->C, H = (size_t)s->H, F = (size_t)mr_moe_fc_cols(s);
	int e, rc;

	for (e = 0; e < v->E; e++) {
		size_t r0 = (size_t)e * (size_t)v->cap, m = (size_t)v->counts[e];
		if (m == 0)
			continue;
		const mr_act *w1 = AT(d, fcw, e * F * C), *b1 = fcb ? AT(d, fcb, e * F) : NULL;
		if (s->swiglu) { /* h (m, 2H) = [gate | up] */
			TRY(cuda_matmul_fwd(d, AT(d, h, r0 * F), AT(d, xin, r0 * C), w1, b1, (int)m,
					    (int)C, (int)F));
			TRY(cuda_swiglu_fwd(d, AT(d, hg, r0 * H), AT(d, h, r0 * F), (int)m,
					    (int)H));
		} else {
			TRY(cuda_matmul_gelu_fwd(d, AT(d, hg, r0 * H), AT(d, h, r0 * H),
						 AT(d, xin, r0 * C), w1, b1, (int)m, (int)C,
						 (int)F));
		}
		TRY(cuda_matmul_fwd(d, AT(d, yo, r0 * C), AT(d, hg, r0 * H),
				    AT(d, fcprojw, e * C * H),
				    fcprojb ? AT(d, fcprojb, e * C) : NULL, (int)m, (int)H, (int)C));
	}
	return 0;
}

/* The sync-free path's experts: every expert over its whole cap block,
 * one strided-batched GEMM for them all (padded rows give the bias or
 * zero; nothing reads them but GEMMs whose other factor is zero there). */
static int experts_fwd_batched(struct mr_dev *d, const struct mr_moe_shape *s,
			       const struct mr_moe_view *v, const struct mr_moe_acts *a,
			       const mr_act *fcw, const mr_act *fcb, const mr_act *fcprojw,
			       const mr_act *fcprojb)
{
	struct mr_cuda *cu = cu_of(d);
	mr_act *xin = ACT(a->xin), *h = ACT(a->h), *hg = ACT(a->hg), *yo = ACT(a->yo);
	int C = s->C, H = s->H, F = mr_moe_fc_cols(s), rows = v->E * v->cap, rc;

	if (s->swiglu) {
		TRY(ck(d, mr_cuda_matmul_fwd_batched(cu, h, xin, fcw, fcb, v->E, v->cap, C, F),
		       "matmul_fwd_batched"));
		TRY(cuda_swiglu_fwd(d, hg, h, rows, H));
	} else {
		TRY(ck(d,
		       mr_cuda_matmul_gelu_fwd_batched(cu, hg, h, xin, fcw, fcb, v->E, v->cap, C,
						       F),
		       "matmul_gelu_fwd_batched"));
	}
	return ck(d, mr_cuda_matmul_fwd_batched(cu, yo, hg, fcprojw, fcprojb, v->E, v->cap, H, C),
		  "matmul_fwd_batched");
}

static int cuda_moe_fwd(struct mr_dev *d, const struct mr_moe_shape *s, struct mr_moe_acts *a,
			const struct mr_moe_xchg *xg, mr_act *y, const mr_act *x,
			const mr_act *routerw, const mr_act *fcw, const mr_act *fcb,
			const mr_act *fcprojw, const mr_act *fcprojb)
{
	struct mr_cuda *cu = cu_of(d);
	const char *why = host_counts_reason(s, a);
	int *counts = NULL, rc;
	struct mr_moe_view v;

	if (why) {
		note_host_counts(d, why);
		if (!(counts = counts_for(d, s->E)))
			return MR_ENOMEM;
	}
	a->stat_on_dev = !why;
	if (why)
		TRY(fences_drain(d, NULL)); /* the route waits for its counts */
	TRY(ck(d,
	       mr_cuda_moe_route(cu, s, a->probs, a->topi, a->gate, a->slot, a->count, a->routed,
				 a->stat, x, routerw, counts, &a->aux, &a->dropped),
	       "moe_route"));
	if (xg && xg->count_reduce)
		TRY(why ? sum_routed(d, xg, s, a) : sum_routed_on_device(d, xg, s, a));
	if (!why) /* padded rows: zero */
		TRY(cuda_zero(d, a->xin, mr_dev_act_bytes(d, (size_t)s->E * s->cap * s->C)));
	TRY(ck(d, mr_cuda_moe_dispatch(cu, s, ACT(a->xin), x, a->topi, a->slot), "moe_dispatch"));
	TRY(exchange(d, xg, MR_MOE_DISPATCH, ACT(a->xin), counts, s));
	v = mr_moe_view_of(xg, s, counts);
	if (why)
		TRY(experts_fwd_each(d, s, &v, a, fcw, fcb, fcprojw, fcprojb));
	else
		TRY(experts_fwd_batched(d, s, &v, a, fcw, fcb, fcprojw, fcprojb));
	TRY(exchange(d, xg, MR_MOE_COMBINE, ACT(a->yo), counts, s));
	return ck(d, mr_cuda_moe_combine(cu, s, y, ACT(a->yo), a->topi, a->slot, a->gate),
		  "moe_combine");
}

/* The expert gradients' buffers and weights of one backward. */
struct experts_grad {
	const mr_act *fcw, *fcprojw;
	float *dfcw, *dfcb, *dfcprojw, *dfcprojb;
};

/* The host path's expert backward: per expert over its kept rows. */
static int experts_bwd_each(struct mr_dev *d, const struct mr_moe_shape *s,
			    const struct mr_moe_view *v, const struct mr_moe_acts *a,
			    const struct mr_moe_ws *w, const struct experts_grad *g)
{
	size_t C = (size_t)s->C, H = (size_t)s->H, F = (size_t)mr_moe_fc_cols(s);
	mr_act *xin = ACT(a->xin), *h = ACT(a->h), *hg = ACT(a->hg), *dyo = ACT(w->dyo);
	mr_act *dh = ACT(w->dh), *dxin = ACT(w->dxin);
	int e, rc;

	for (e = 0; e < v->E; e++) {
		size_t r0 = (size_t)e * (size_t)v->cap, m = (size_t)v->counts[e];
		if (m == 0)
			continue;
		/* the hidden output's gradient: for GELU straight into dh with
		 * the GELU's gradient applied by the GEMM, for SwiGLU beside,
		 * its backward writing [dgate | dup] into dh */
		mr_act *dhg = s->swiglu ? AT(d, ACT(w->dhg), r0 * H) : AT(d, dh, r0 * H);

		if (s->swiglu) {
			TRY(cuda_matmul_bwd(d, dhg, g->dfcprojw + e * C * H,
					    g->dfcprojb ? g->dfcprojb + e * C : NULL,
					    AT(d, dyo, r0 * C), AT(d, hg, r0 * H),
					    AT(d, g->fcprojw, e * C * H), (int)m, (int)H, (int)C,
					    0));
			TRY(cuda_swiglu_bwd(d, AT(d, dh, r0 * F), AT(d, h, r0 * F), dhg, (int)m,
					    (int)H));
		} else {
			TRY(cuda_matmul_dgelu_bwd(d, dhg, g->dfcprojw + e * C * H,
						  g->dfcprojb ? g->dfcprojb + e * C : NULL,
						  AT(d, dyo, r0 * C), AT(d, hg, r0 * H),
						  AT(d, g->fcprojw, e * C * H), AT(d, h, r0 * H),
						  (int)m, (int)H, (int)C));
		}
		TRY(cuda_matmul_bwd(d, AT(d, dxin, r0 * C), g->dfcw + e * F * C,
				    g->dfcb ? g->dfcb + e * F : NULL, AT(d, dh, r0 * F),
				    AT(d, xin, r0 * C), AT(d, g->fcw, e * F * C), (int)m, (int)C,
				    (int)F, 0));
	}
	return 0;
}

/* The sync-free path's expert backward: strided-batched over whole cap
 * blocks, dyo's padded rows zero, so every gradient they reach is zero
 * there and adds exactly zero to the weight and bias gradients. */
static int experts_bwd_batched(struct mr_dev *d, const struct mr_moe_shape *s,
			       const struct mr_moe_view *v, const struct mr_moe_acts *a,
			       const struct mr_moe_ws *w, const struct experts_grad *g)
{
	struct mr_cuda *cu = cu_of(d);
	int C = s->C, H = s->H, F = mr_moe_fc_cols(s), rows = v->E * v->cap, rc;
	mr_act *dyo = ACT(w->dyo), *dh = ACT(w->dh), *dhg = ACT(w->dhg);

	if (s->swiglu) {
		TRY(ck(d,
		       mr_cuda_matmul_bwd_batched(cu, dhg, g->dfcprojw, g->dfcprojb, dyo,
						  ACT(a->hg), g->fcprojw, v->E, v->cap, H, C),
		       "matmul_bwd_batched"));
		TRY(cuda_swiglu_bwd(d, dh, ACT(a->h), dhg, rows, H));
	} else {
		TRY(ck(d,
		       mr_cuda_matmul_dgelu_bwd_batched(cu, dh, g->dfcprojw, g->dfcprojb, dyo,
							ACT(a->hg), g->fcprojw, ACT(a->h), v->E,
							v->cap, H, C),
		       "matmul_dgelu_bwd_batched"));
	}
	return ck(d,
		  mr_cuda_matmul_bwd_batched(cu, ACT(w->dxin), g->dfcw, g->dfcb, dh, ACT(a->xin),
					     g->fcw, v->E, v->cap, C, F),
		  "matmul_bwd_batched");
}

static int cuda_moe_bwd(struct mr_dev *d, const struct mr_moe_shape *s,
			const struct mr_moe_acts *a, const struct mr_moe_xchg *xg, mr_act *dx,
			const mr_act *dy, const mr_act *x, const mr_act *routerw,
			const mr_act *fcw, const mr_act *fcprojw, float *drouterw, float *dfcw,
			float *dfcb, float *dfcprojw, float *dfcprojb, float aux_scale, void *ws,
			const mr_act *ones)
{
	struct mr_cuda *cu = cu_of(d);
	struct experts_grad g = { fcw, fcprojw, dfcw, dfcb, dfcprojw, dfcprojb };
	size_t N = (size_t)s->N;
	struct mr_moe_ws w;
	int *counts = NULL, rc;
	struct mr_moe_view v;

	(void)ones; /* the bias gradients are column sums */
	/* the cpu's pieces; the router's dlogits and the expert rows in the
	 * activation type */
	mr_moe_ws_bind(&w, s, ws);
	if (!a->stat_on_dev) {
		if (!(counts = counts_for(d, s->E)))
			return MR_ENOMEM;
		TRY(cuda_download(d, counts, a->count, sizeof(int) * (size_t)s->E));
	} else { /* padded rows: zero */
		TRY(cuda_zero(d, w.dyo, mr_dev_act_bytes(d, (size_t)s->E * s->cap * s->C)));
	}
	TRY(ck(d,
	       mr_cuda_moe_combine_bwd(cu, s, ACT(w.dyo), w.dgate, dy, ACT(a->yo), a->topi,
				       a->slot, a->gate),
	       "moe_combine_bwd"));
	if (xg && xg->reduce) {
		TRY(cuda_sync(d));
		TRY(xg->reduce(xg->reduce_ctx, w.dgate, N * (size_t)s->k));
	}
	TRY(exchange(d, xg, MR_MOE_DISPATCH_GRAD, ACT(w.dyo), counts, s));
	v = mr_moe_view_of(xg, s, counts);
	if (counts)
		TRY(experts_bwd_each(d, s, &v, a, &w, &g));
	else
		TRY(experts_bwd_batched(d, s, &v, a, &w, &g));
	TRY(exchange(d, xg, MR_MOE_COMBINE_GRAD, ACT(w.dxin), counts, s));
	TRY(ck(d, mr_cuda_moe_combine(cu, s, dx, ACT(w.dxin), a->topi, a->slot, NULL),
	       "moe_combine"));
	TRY(ck(d,
	       mr_cuda_moe_router_bwd(cu, s, ACT(w.dprobs), a->probs, a->topi, a->gate, w.dgate,
				      a->routed, mr_moe_aux_scale(xg, aux_scale)),
	       "moe_router_bwd"));
	return cuda_matmul_bwd(d, xg && xg->router_dx_off ? NULL : dx, drouterw, NULL,
			       ACT(w.dprobs), x, routerw, (int)N, (int)s->C, s->E, 1);
}

/* ---- optimizer and gradients (fp32) ---------------------------------------- */

static int cuda_adamw_args(struct mr_dev *d, const struct mr_dev_adamw *o)
{
	struct mr_cuda_adamw c = { o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->t,
				   o->grad_scale };

	return ck(d, mr_cuda_adamw_args(cu_of(d), &c), "adamw_args");
}

static int cuda_adamw(struct mr_dev *d, const struct mr_dev_adamw_range *r, int k)
{
	struct cuda_state *s = d->impl;
	int i;

	if (k > s->nranges) {
		struct mr_cuda_adamw_range *g = realloc(s->ranges, (size_t)k * sizeof(*g));
		if (!g)
			return MR_ENOMEM;
		s->ranges = g;
		s->nranges = k;
	}
	for (i = 0; i < k; i++) {
		s->ranges[i] = (struct mr_cuda_adamw_range){ r[i].p, r[i].pc, r[i].g, r[i].m,
							     r[i].v, r[i].n, r[i].decay };
		/* the compute copy of an fp32 device may be the master itself */
		if (s->ranges[i].pc == (void *)r[i].p)
			s->ranges[i].pc = NULL;
	}
	return ck(d, mr_cuda_adamw_multi(cu_of(d), s->ranges, k), "adamw");
}

static int cuda_sumsq(struct mr_dev *d, const float *g, const size_t *off, const size_t *n,
		      int k, double *out)
{
	int rc = fences_drain(d, NULL);

	if (rc < 0)
		return rc;
	return ck(d, mr_cuda_grad_sumsq_ranges(cu_of(d), g, off, n, k, out), "sumsq");
}

static int cuda_scale(struct mr_dev *d, float *g, size_t n, float s)
{
	return ck(d, mr_cuda_scale(cu_of(d), g, n, s), "scale");
}

static int cuda_add_f32(struct mr_dev *d, float *y, const float *x, size_t n)
{
	return ck(d, mr_cuda_add_f32(cu_of(d), y, x, n), "add_f32");
}

/* ---- timing ---------------------------------------------------------------- */

static int cuda_time_ops(struct mr_dev *d, int n)
{
	struct cuda_state *s = d->impl;
	int rc;

	free(s->timed);
	free(s->mark_ms);
	s->timed = NULL;
	s->mark_ms = NULL;
	s->room = s->ntimed = 0;
	s->untimed = 0;
	/* ck_op, not ck: the marks' own calls are not timed */
	if ((rc = ck_op(d, mr_cuda_marks(s->cu, n > 0 ? 2 * n : 0), "time_ops")) < 0 || n <= 0)
		return rc;
	s->timed = calloc((size_t)n, sizeof(*s->timed));
	s->mark_ms = calloc(2 * (size_t)n, sizeof(*s->mark_ms));
	if (!s->timed || !s->mark_ms) {
		cuda_time_ops(d, 0);
		return MR_ENOMEM;
	}
	s->room = n;
	return 0;
}

static int cuda_time_take(struct mr_dev *d, struct mr_dev_times *t)
{
	struct cuda_state *s = d->impl;
	int i, n = fences_drain(d, NULL);

	memset(t, 0, sizeof(*t));
	if (n == 0)
		n = ck_op(d, mr_cuda_marks_read(s->cu, s->mark_ms, 2 * s->room), "time_take");
	if (n < 0)
		return n;
	for (i = 0; i < s->ntimed; i++) {
		const struct timed_op *o = &s->timed[i];
		if (o->end >= n)
			continue; /* not read back */
		t->ms[o->kind] += s->mark_ms[o->end] - s->mark_ms[o->begin];
		if (s->mark_ms[o->end] > t->span_ms)
			t->span_ms = s->mark_ms[o->end];
	}
	t->ops = s->ntimed;
	t->untimed = s->untimed;
	s->ntimed = 0;
	s->untimed = 0;
	return 0;
}

/* ---- graphs ------------------------------------------------------------------ */

static void cuda_graph_drop(struct mr_dev *d, int key)
{
	struct cuda_state *s = d->impl;

	if (!s || key < 0 || key >= MR_DEV_GRAPHS) /* closed: nothing left */
		return;
	mr_cuda_graph_free(s->cu, s->graphs[key]);
	s->graphs[key] = NULL;
}

static int cuda_graph_run(struct mr_dev *d, int key, int (*fn)(void *ctx), void *ctx,
			  struct mr_errbuf *eb)
{
	struct cuda_state *s = d->impl;
	int rc;

	if (key < 0 || key >= MR_DEV_GRAPHS)
		return mr_errf(eb, MR_EINVAL, "device graph key %d is outside [0, %d)", key,
			       MR_DEV_GRAPHS);
	if (!s->graphs[key]) {
		s->refused[0] = 0;
		rc = mr_cuda_graph_capture(s->cu, fn, ctx, &s->graphs[key]);
		if (rc == 0 && s->refused[0]) /* a refusal fn did not pass on */
			cuda_graph_drop(d, key);
		if (rc < 0 || s->refused[0]) {
			mr_errf(eb, rc, "%s", s->refused[0] ? s->refused : mr_cuda_errmsg(s->cu));
			return 1;
		}
	}
	if ((rc = ck(d, mr_cuda_graph_launch(s->cu, s->graphs[key], fn, ctx), "graph_launch")) < 0)
		return mr_errf(eb, rc, "device graph %d: launch failed: %s", key,
			       mr_cuda_errmsg(s->cu));
	d->graph_launches++;
	return 0;
}

static void cuda_close(struct mr_dev *d)
{
	struct cuda_state *s = d->impl;
	int key;

	for (key = 0; s && key < MR_DEV_GRAPHS; key++)
		cuda_graph_drop(d, key);
	if (s) {
		fences_clear(d);
		while (s->nfences)
			fence_drop(s, 0);
		free(s->fences);
		mr_cuda_free(s->cu);
		free(s->counts);
		free(s->ranges);
		free(s->timed);
		free(s->mark_ms);
	}
	free(s);
	d->impl = NULL;
}

static const struct mr_dev_ops cuda_ops = {
	.name = "cuda",
	.close = cuda_close,
	.alloc = cuda_alloc,
	.stream = cuda_stream,
	.stream_wait = cuda_stream_wait,
	.stream_forget = cuda_stream_forget,
	.time_ops = cuda_time_ops,
	.time_take = cuda_time_take,
	.graph_run = cuda_graph_run,
	.graph_drop = cuda_graph_drop,
	.free = cuda_free,
	.host_alloc = cuda_host_alloc,
	.host_free = cuda_host_free,
	.upload = cuda_upload,
	.download = cuda_download,
	.copy = cuda_copy,
	.copy2d = cuda_copy2d,
	.zero = cuda_zero,
	.to_act = cuda_to_act,
	.to_f32 = cuda_to_f32,
	.sync = cuda_sync,
	.is_device = cuda_is_device,
	.matmul_fwd = cuda_matmul_fwd,
	.matmul_bwd = cuda_matmul_bwd,
	.matmul_gelu_fwd = cuda_matmul_gelu_fwd,
	.matmul_dgelu_bwd = cuda_matmul_dgelu_bwd,
	.layernorm_fwd = cuda_layernorm_fwd,
	.add_layernorm_fwd = cuda_add_layernorm_fwd,
	.layernorm_bwd = cuda_layernorm_bwd,
	.gelu_fwd = cuda_gelu_fwd,
	.gelu_bwd = cuda_gelu_bwd,
	.add = cuda_add,
	.add_bias = cuda_add_bias,
	.embed_fwd = cuda_embed_fwd,
	.embed_bwd = cuda_embed_bwd,
	.add_pos = cuda_add_pos,
	.ce_fwd = cuda_ce_fwd,
	.ce_rowmax = cuda_ce_rowmax,
	.ce_sumexp = cuda_ce_sumexp,
	.ce_finish = cuda_ce_finish,
	.ce_bwd = cuda_ce_bwd,
	.fill_cols = cuda_fill_cols,
	.attn_fwd = cuda_attn_fwd,
	.attn_part_fwd = cuda_attn_part_fwd,
	.attn_merge = cuda_attn_merge,
	.attn_delta = cuda_attn_delta,
	.attn_part_bwd = cuda_attn_part_bwd,
	.attn_bwd = cuda_attn_bwd,
	.ws_bytes = cuda_ws_bytes,
	.rmsnorm_fwd = cuda_rmsnorm_fwd,
	.rmsnorm_bwd = cuda_rmsnorm_bwd,
	.rope = cuda_rope,
	.swiglu_fwd = cuda_swiglu_fwd,
	.swiglu_bwd = cuda_swiglu_bwd,
	.moe_fwd = cuda_moe_fwd,
	.moe_bwd = cuda_moe_bwd,
	.adamw_args = cuda_adamw_args,
	.adamw = cuda_adamw,
	.sumsq = cuda_sumsq,
	.scale = cuda_scale,
	.add_f32 = cuda_add_f32,
};

int mr__dev_cuda_open(struct mr_dev *d, int index, enum mr_dtype act, struct mr_errbuf *eb)
{
	struct cuda_state *s = calloc(1, sizeof(*s));
	int rc;

	memset(d, 0, sizeof(*d));
	if (!s)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the cuda device");
	if ((rc = mr_cuda_create(&s->cu, index, eb)) < 0) {
		free(s);
		return rc;
	}
	mr_cuda_set_act(s->cu, act == MR_DT_F32 ? MR_CUDA_F32 : MR_CUDA_BF16);
	d->ops = &cuda_ops;
	d->act = act;
	d->act_bytes = act == MR_DT_F32 ? sizeof(float) : sizeof(mr_bf16);
	d->pool = NULL;
	d->nccl = mr_cuda_nccl_capable();
	mr_cuda_device_name(index, d->model, sizeof(d->model));
	d->peak_flops = mr_dev_peak_flops(d->model, act);
	d->attn_hs_align = 32; /* runtime/cuda/attention.cu: warps of 32 lanes */
	d->attn_hs_max = 128;
	d->attn_bh_max = 65535; /* one grid dimension per (batch row, head) */
	d->attn_gqa = 1;        /* grouped-query attention (attention.cu) */
	d->moe_swiglu = 1;      /* SwiGLU experts (moe_fwd/bwd over llama.cu's swiglu) */
	s->open_mark = -1;
	d->impl = s;
	return 0;
}
