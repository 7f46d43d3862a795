/*
 * mr_device.h - the device layer: one table of operations under the model,
 * the parallel layers and the step, so they are written once for every
 * device. A backend implements the table: `cpu` (device/cpu.c: the kernels
 * of kernels/, OpenBLAS and the rank's thread pool, fp32) and `cuda`
 * (device/cuda.c: runtime/cuda's kernels, cuBLASLt, a stream; built into
 * meshrun-cuda.so, reached through plugin/cuda_entry.h). The device is
 * chosen once, when a rank is built; nothing above this header asks which
 * one it is.
 *
 * Memory: every buffer comes from mr_dev_alloc, accounted in the rank's
 * ledger (struct mr_mem) by category; device pointers are only handed to
 * operations (upload/download move bytes to and from the host).
 *
 * Types: parameters' master copy, gradients, optimizer state, LayerNorm
 * statistics, attention lse and losses are fp32 (float *). Activations,
 * their gradients and the weights' compute copy the kernels read are in
 * the device's activation type (mr_act: fp32 on cpu; bf16 on cuda with
 * "precision" "bf16"). mr_act is an incomplete type on purpose: the host
 * can neither dereference nor step an activation pointer, so a size in
 * elements becomes a pointer only through mr_dev_at().
 *
 * Order: operations run in the order they are issued. A backend with its
 * own queue (cuda) runs them asynchronously; ops->sync waits for them,
 * download waits too. A collective on device memory follows
 * mr_dev_comm_sync (device/mr_dev_comm.h): a sync, unless the
 * communicator is stream-ordered on the device (nccl: an event orders
 * its stream after ours, and our stream waits for it through
 * stream_wait). The cpu backend runs every operation before it returns.
 *
 * Shapes follow llm.c's notation (B batch, T time, C channels, N = B*T
 * rows, V vocabulary, NH heads); every operation says what it writes (=)
 * and what it accumulates (+=) as its cpu twin in kernels/ does.
 *
 * Errors: 0 or a negative MR_E* code (a backend's launch or allocation
 * failure); the cpu backend cannot fail after allocation.
 *
 * Graphs (graph_run; cuda only): a piece of device work - a micro-batch's
 * forward and backward, the optimizer step - captured once and launched
 * again without the host code that enqueued it. Whatever such a piece
 * reads that changes from one launch to the next sits in device memory
 * written before the launch (the batch's tokens, adamw_args' scalars), and
 * everything it reads back is read after it.
 *
 * Non-goals: more than one device per rank, unified memory, fp16/fp8.
 */
#ifndef MR_DEVICE_H
#define MR_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "core/mr_dtype.h"
#include "core/mr_mem.h"
#include "cpu/mr_pool.h"
#include "mr_err.h"

/* An element of the device's activation type; see the header. */
typedef struct mr_act mr_act;

struct mr_dev;
struct mr_comm_fence; /* comm/mr_comm.h */
struct mr_moe_shape;
struct mr_moe_acts;
struct mr_moe_xchg;

/* Attention of a query slice against a key/value slice, each at its
 * absolute sequence positions (context parallel): every (batch, head);
 * head h of batch b's query i at q + b*q_batch + i*q_row + h*hs elements
 * (k, v likewise with kv_*, of key/value head h / (NH/NKV)). As
 * kernels/mr_attention.h's mr_attn_slice. */
struct mr_dev_attn {
	const mr_act *q, *k, *v;
	size_t q_row, q_batch, kv_row, kv_batch;
	int B, NH, hs;
	int NKV;      /* key/value heads (grouped-query attention); 0: NH */
	int tq, q_pos0, tk, k_pos0;
	int causal;
	float scale;
};

/* AdamW's settings for one step (optim/mr_adamw.h's arithmetic). */
struct mr_dev_adamw {
	float lr, beta1, beta2, eps;
	float weight_decay; /* applied to the ranges with decay */
	long t;             /* step number after the increment (1-based) */
	float grad_scale;   /* multiplies each gradient first (clipping); 1: none */
};

/* Device graphs a device keeps at once (graph_run's keys 0..). */
#define MR_DEV_GRAPHS 4

/* One range of AdamW's update: n elements of the fp32 master p, its
 * gradient g and moments m, v; pc (may be NULL) gets p's new compute copy
 * (an fp32 device's may be p itself). */
struct mr_dev_adamw_range {
	float *p;
	mr_act *pc;
	const float *g;
	float *m, *v;
	size_t n;
	int decay; /* weight decay applies (not to biases and norms) */
};

/* The kinds of operation a step's device time is broken down by
 * (mr_dev_kind_name); the time between them is idle. */
enum mr_dev_kind {
	MR_DEV_ATTENTION, /* attn_* */
	MR_DEV_GEMM,      /* matmul_* (the experts' too) */
	MR_DEV_OPTIMIZER, /* adamw, sumsq, scale */
	MR_DEV_COPY,      /* upload, download, copy, zero, to_act/to_f32 */
	MR_DEV_OTHER,     /* every other kernel: norms, activations, loss, MoE routing */
	MR_DEV_KINDS
};

/* Where the device's time went between two time_take calls. */
struct mr_dev_times {
	double ms[MR_DEV_KINDS]; /* the operations' own time, by kind */
	double span_ms;          /* the first timed operation's start to the last one's end */
	long ops;                /* operations timed */
	long untimed;            /* operations issued past the room for marks */
};

struct mr_dev_ops {
	const char *name;
	void (*close)(struct mr_dev *d);
	/* ---- memory: zeroed, accounted in mem under kind ---- */
	void *(*alloc)(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind, size_t bytes);
	void (*free)(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind, void *p,
		     size_t bytes);
	int (*upload)(struct mr_dev *d, void *dst, const void *src_host, size_t bytes);
	int (*download)(struct mr_dev *d, void *dst_host, const void *src, size_t bytes);
	int (*copy)(struct mr_dev *d, void *dst, const void *src, size_t bytes);
	/* rows blocks of width bytes, from src every spitch bytes to dst every
	 * dpitch bytes (the sequence-parallel permutation) */
	int (*copy2d)(struct mr_dev *d, void *dst, size_t dpitch, const void *src, size_t spitch,
		      size_t width, size_t rows);
	int (*zero)(struct mr_dev *d, void *p, size_t bytes);
	/* n elements between fp32 and the activation type (a weight's compute
	 * copy, a gathered tensor) */
	int (*to_act)(struct mr_dev *d, mr_act *dst, const float *src, size_t n);
	int (*to_f32)(struct mr_dev *d, float *dst, const mr_act *src, size_t n);
	/* waits for every operation issued so far */
	int (*sync)(struct mr_dev *d);
	/* whether p is this device's memory, which the host cannot read
	 * (NULL: the device's memory is host memory) */
	int (*is_device)(struct mr_dev *d, const void *p);
	/* host memory for state a device rank keeps off the device ("offload"):
	 * zeroed, accounted in mem under kind, page-locked where the backend
	 * can (cuda: cudaHostAlloc, so its upload and download run at full
	 * bandwidth); the host reads and writes it directly. NULL: plain
	 * host memory (mr_dev_host_alloc falls back to it) */
	void *(*host_alloc)(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind,
			    size_t bytes);
	void (*host_free)(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind, void *p,
			  size_t bytes);
	/* the stream everything above is queued on (a cudaStream_t), so a
	 * communicator on another stream can wait for it; NULL op or NULL
	 * result: none (the cpu device; the CUDA emulation) */
	void *(*stream)(struct mr_dev *d);
	/* stream-ordered waits of collectives (NULL: the device has none,
	 * as the cpu device): the stream waits for event ev (a cudaEvent_t
	 * recorded behind the collective on another stream, handed over;
	 * NULL: nothing to wait for) without the host, and f stays pending
	 * until the stream has passed it. Every host wait for the stream
	 * (sync, upload, download, sumsq, free, ...) polls the pending ones
	 * instead of blocking: one past its deadline or whose owner failed
	 * is aborted (f->fail, so the stream drains), logged once
	 * (stream_wait_failed) and dropped, and the host wait fails with its
	 * error. stream_forget returns once no fence of owner is pending. */
	int (*stream_wait)(struct mr_dev *d, void *ev, const struct mr_comm_fence *f);
	void (*stream_forget)(struct mr_dev *d, const void *owner);
	/* timing (NULL: the device has none, as the cpu device): time_ops(d,
	 * n) times every operation issued from now on, with room for n of
	 * them per time_take (0: stop timing); time_take waits for the timed
	 * operations and gives where their time went since the last call */
	int (*time_ops)(struct mr_dev *d, int n);
	int (*time_take)(struct mr_dev *d, struct mr_dev_times *t);
	/* device graphs (both NULL: none, as the cpu device - the caller runs
	 * fn itself): runs the work fn(ctx) enqueues as graph key (0 ..
	 * MR_DEV_GRAPHS-1). The first call captures it and launches it, later
	 * calls launch it without calling fn: fn must enqueue the same
	 * operations on the same buffers with the same arguments every time
	 * and leave no host state a later call needs. While capturing, every
	 * operation that needs the host (sync, upload, download, sumsq,
	 * alloc, free, a MoE layer's counts, a collective's sync) fails with
	 * MR_ENEEDHOST; a capture that fails (so, or otherwise) is discarded,
	 * nothing has run, and graph_run returns 1 with the reason (naming
	 * the operation) in eb - the caller runs fn itself. 0: launched
	 * (graph_launches counts it); < 0: the launch failed (eb says why).
	 * graph_drop forgets graph key (before the buffers it uses go away;
	 * a closed device: nothing) */
	int (*graph_run)(struct mr_dev *d, int key, int (*fn)(void *ctx), void *ctx,
			 struct mr_errbuf *eb);
	void (*graph_drop)(struct mr_dev *d, int key);

	/* ---- the GPT's kernels ---- */
	/* out (N,OC) = inp (N,IC) @ w^T + bias (OC, may be NULL) */
	int (*matmul_fwd)(struct mr_dev *d, mr_act *out, const mr_act *inp, const mr_act *w,
			  const mr_act *bias, int N, int IC, int OC);
	/* matmul_fwd of the GEMM before a GELU, the GELU with it: pre =
	 * inp @ w^T + bias, out = gelu(pre); on a bf16 device both from the
	 * unrounded product (cuda: cuBLASLt's GELU_AUX_BIAS epilogue), so out
	 * is not gelu_fwd of the stored pre bit for bit - a block whose
	 * recomputation runs gelu_fwd again must not use it. NULL: the device
	 * has no fusion (the model calls matmul_fwd, then gelu_fwd) */
	int (*matmul_gelu_fwd)(struct mr_dev *d, mr_act *out, mr_act *pre, const mr_act *inp,
			       const mr_act *w, const mr_act *bias, int N, int IC, int OC);
	/* dinp = (acc: +=) dout @ w (may be NULL); dw += dout^T @ inp; dbias +=
	 * colsum(dout) (fp32, each may be NULL) */
	int (*matmul_bwd)(struct mr_dev *d, mr_act *dinp, float *dw, float *dbias,
			  const mr_act *dout, const mr_act *inp, const mr_act *w, int N, int IC,
			  int OC, int acc);
	/* matmul_bwd of the GEMM after a GELU, the GELU's backward with it:
	 * dinp = (dout @ w) * gelu'(pre) (written; pre (N,IC) the GELU's
	 * input), rounded once on a bf16 device (cuda: cuBLASLt's DGELU
	 * epilogue). NULL: the device has no fusion (the model calls
	 * matmul_bwd, then gelu_bwd) */
	int (*matmul_dgelu_bwd)(struct mr_dev *d, mr_act *dinp, float *dw, float *dbias,
				const mr_act *dout, const mr_act *inp, const mr_act *w,
				const mr_act *pre, int N, int IC, int OC);
	int (*layernorm_fwd)(struct mr_dev *d, mr_act *out, float *mean, float *rstd,
			     const mr_act *inp, const mr_act *w, const mr_act *b, int N, int C);
	/* the residual add and the next LayerNorm in one pass: y (N,C) += x,
	 * then out, mean, rstd as layernorm_fwd of the new y - the norm reads
	 * y as stored (rounded), so the bits are add's and layernorm_fwd's.
	 * NULL: the device has no fusion (the model calls the two) */
	int (*add_layernorm_fwd)(struct mr_dev *d, mr_act *y, mr_act *out, float *mean,
				 float *rstd, const mr_act *x, const mr_act *w, const mr_act *b,
				 int N, int C);
	/* dinp +=, dw, db +=; ws as for attn_* */
	int (*layernorm_bwd)(struct mr_dev *d, mr_act *dinp, float *dw, float *db,
			     const mr_act *dout, const mr_act *inp, const mr_act *w,
			     const float *mean, const float *rstd, int N, int C, void *ws);
	int (*gelu_fwd)(struct mr_dev *d, mr_act *out, const mr_act *inp, size_t n);
	/* dinp = dout * gelu'(inp) (may alias dout) */
	int (*gelu_bwd)(struct mr_dev *d, mr_act *dinp, const mr_act *inp, const mr_act *dout,
			size_t n);
	/* y += x */
	int (*add)(struct mr_dev *d, mr_act *y, const mr_act *x, size_t n);
	/* rows (n,C) += bias (C) */
	int (*add_bias)(struct mr_dev *d, mr_act *rows, const mr_act *bias, int n, int C);
	/* out (B,T,C) = wte[tok] + wpe[t]; tok < 0: no wte part; wpe NULL: no
	 * position part */
	int (*embed_fwd)(struct mr_dev *d, mr_act *out, const int *tok, const mr_act *wte,
			 const mr_act *wpe, int B, int T, int C);
	/* dwte += (rows tok >= 0), dwpe += (may be NULL); tok_host: the same ids
	 * on the host (a backend may bucket positions by token there) */
	int (*embed_bwd)(struct mr_dev *d, float *dwte, float *dwpe, const mr_act *dout,
			 const int *tok, const int *tok_host, int B, int T, int C);
	/* out row i (n rows, C) += wpe[off + i % period] */
	int (*add_pos)(struct mr_dev *d, mr_act *out, const mr_act *wpe, int n, int C, int period,
		       int off);
	/* losses, lse (N) = the cross-entropy of logits (N,V) rows at tgt */
	int (*ce_fwd)(struct mr_dev *d, float *losses, float *lse, const mr_act *logits,
		      const int *tgt, int N, int V);
	/* vocab-parallel pieces: mx (N) = row max; sum (N) = sum exp(row - mx),
	 * tl (N) = row[tgt] (0 for tgt < 0); then lse = mx + log sum and
	 * losses = lse - tl */
	int (*ce_rowmax)(struct mr_dev *d, float *mx, const mr_act *logits, int N, int V);
	int (*ce_sumexp)(struct mr_dev *d, float *sum, float *tl, const mr_act *logits,
			 const float *mx, const int *tgt, int N, int V);
	int (*ce_finish)(struct mr_dev *d, float *losses, float *lse, const float *mx,
			 const float *sum, const float *tl, int N);
	/* logits becomes (softmax - onehot(tgt >= 0)) * dscale, in place */
	int (*ce_bwd)(struct mr_dev *d, mr_act *logits, const float *lse, const int *tgt, int N,
		      int V, float dscale);
	/* columns [from, V) of every row of (N,V) := value */
	int (*fill_cols)(struct mr_dev *d, mr_act *x, int N, int V, int from, float value);
	/* causal attention of a layer: qkv (B,T,C+2*NKV*hs) -> out (B,T,C), lse
	 * (B,NH,T), C = NH*hs; NKV key/value heads (dividing NH: grouped-query
	 * attention, query head h reads key/value head h / (NH/NKV); NH: plain
	 * multi-head). ws: ws_bytes(T, C, NH) of kernel workspace */
	int (*attn_fwd)(struct mr_dev *d, mr_act *out, float *lse, const mr_act *qkv, int B,
			int T, int C, int NH, int NKV, void *ws);
	/* dqkv (the qkv layout) = (written) */
	int (*attn_bwd)(struct mr_dev *d, mr_act *dqkv, const mr_act *dout, const mr_act *qkv,
			const mr_act *out, const float *lse, int B, int T, int C, int NH, int NKV,
			void *ws);
	/* workspace bytes attn_* and layernorm_bwd need for these shapes */
	size_t (*ws_bytes)(struct mr_dev *d, int T, int C, int NH);
	/* context parallel pieces (struct mr_dev_attn): a slice's fp32 partial
	 * out (rows at out + b*o_batch + i*o_row + h*hs) and lse (B,NH,tq);
	 * merge of two partials over disjoint keys into a; delta = rowsum(dout
	 * * out) (B,NH,tq); the slice's dq, dk, dv (fp32, +=) from the final
	 * lse and delta */
	int (*attn_part_fwd)(struct mr_dev *d, const struct mr_dev_attn *a, float *out,
			     size_t o_row, size_t o_batch, float *lse);
	int (*attn_merge)(struct mr_dev *d, float *out_a, float *lse_a, const float *out_b,
			  const float *lse_b, int B, int NH, int tq, int hs, size_t o_row,
			  size_t o_batch);
	int (*attn_delta)(struct mr_dev *d, float *delta, const mr_act *dout, const mr_act *out,
			  int B, int NH, int tq, int hs, size_t o_row, size_t o_batch);
	int (*attn_part_bwd)(struct mr_dev *d, const struct mr_dev_attn *a, const mr_act *dout,
			     size_t o_row, size_t o_batch, const float *lse, const float *delta,
			     float *dq, size_t dq_row, size_t dq_batch, float *dk, float *dv,
			     size_t dkv_row, size_t dkv_batch);
	/* ---- the Llama family's kernels (kernels/rmsnorm.c, rope.c, swiglu.c) ---- */
	/* out (N,C) = inp * rstd * w, rstd (N) = 1 / sqrt(mean(inp^2) + eps) */
	int (*rmsnorm_fwd)(struct mr_dev *d, mr_act *out, float *rstd, const mr_act *inp,
			   const mr_act *w, int N, int C, float eps);
	/* dinp +=, dw +=; ws as for attn_* */
	int (*rmsnorm_bwd)(struct mr_dev *d, mr_act *dinp, float *dw, const mr_act *dout,
			   const mr_act *inp, const mr_act *w, const float *rstd, int N, int C,
			   void *ws);
	/* rotary positions in place on nheads heads of size D at the start of
	 * N rows stride elements apart, row n at position pos[n] (device ints),
	 * inv_freq (D/2, device fp32); dir 1 forward, -1 the gradient */
	int (*rope)(struct mr_dev *d, mr_act *x, size_t stride, int N, int nheads, int D,
		    const int *pos, const float *inv_freq, int dir);
	/* out (N,F) = silu(a) * b, ab (N,2F) = [a | b] per row */
	int (*swiglu_fwd)(struct mr_dev *d, mr_act *out, const mr_act *ab, int N, int F);
	/* dab (N,2F) = (written; may alias ab) */
	int (*swiglu_bwd)(struct mr_dev *d, mr_act *dab, const mr_act *ab, const mr_act *dout,
			  int N, int F);
	/* the MoE MLP of kernels/mr_moe.h (NULL: this device has none yet) */
	int (*moe_fwd)(struct mr_dev *d, const struct mr_moe_shape *s, struct mr_moe_acts *a,
		       const struct mr_moe_xchg *xg, mr_act *y, const mr_act *x,
		       const mr_act *routerw, const mr_act *fcw, const mr_act *fcb,
		       const mr_act *fcprojw, const mr_act *fcprojb);
	int (*moe_bwd)(struct mr_dev *d, const struct mr_moe_shape *s, const struct mr_moe_acts *a,
		       const struct mr_moe_xchg *xg, mr_act *dx, const mr_act *dy, const mr_act *x,
		       const mr_act *routerw, const mr_act *fcw, const mr_act *fcprojw,
		       float *drouterw, float *dfcw, float *dfcb, float *dfcprojw, float *dfcprojb,
		       float aux_scale, void *ws, const mr_act *ones);

	/* ---- optimizer and gradients (fp32) ---- */
	/* AdamW's per-step settings every later adamw call reads (cuda: a
	 * device block, uploaded on the stream, so a graph's adamw reads the
	 * step it is launched in) */
	int (*adamw_args)(struct mr_dev *d, const struct mr_dev_adamw *o);
	/* AdamW of k ranges in one call (cuda: one launch for them all) with
	 * the last adamw_args; each element's arithmetic is the same
	 * whichever range or thread */
	int (*adamw)(struct mr_dev *d, const struct mr_dev_adamw_range *r, int k);
	/* out[i] = sum of g[off[i] .. off[i]+n[i])^2 in double, each range
	 * summed in element order, for k ranges (synchronous: out is host) */
	int (*sumsq)(struct mr_dev *d, const float *g, const size_t *off, const size_t *n, int k,
		     double *out);
	/* g *= s */
	int (*scale)(struct mr_dev *d, float *g, size_t n, float s);
	/* y += x */
	int (*add_f32)(struct mr_dev *d, float *y, const float *x, size_t n);
};

struct mr_dev {
	const struct mr_dev_ops *ops;
	enum mr_dtype act;      /* activations and the weights' compute copy */
	size_t act_bytes;       /* sizeof one mr_act */
	struct mr_pool *pool;   /* cpu: the rank's threads (borrowed) */
	int nccl;               /* NCCL can move this device's memory */
	char model[64];         /* the hardware: "cpu", "NVIDIA H100 80GB HBM3" */
	double peak_flops;      /* dense peak at act's precision, FLOP/s; 0: unknown */
	/* the attention kernels' limits (0: none): head size a multiple of
	 * attn_hs_align up to attn_hs_max, batch rows x local heads at most
	 * attn_bh_max - checked when a model is created on the device */
	int attn_hs_align, attn_hs_max, attn_bh_max;
	/* attn_fwd/bwd take fewer key/value heads than query heads */
	int attn_gqa;
	/* moe_fwd/bwd take SwiGLU experts (mr_moe_shape.swiglu) */
	int moe_swiglu;
	/* the first error the backend reported, "" while none: on a GPU a
	 * sticky one (an illegal address) fails every later call of the
	 * process, allocations included - the reason to name, not "out of
	 * memory" */
	char fault[160];
	/* fast paths the backend did not take although it should have (cuda:
	 * a GEMM cuBLASLt did not run, a layer attention cuDNN did not run -
	 * fp32 activations included), counted as of the last sync */
	long fallbacks;
	long graph_launches;    /* graph_run's launches so far */
	/* MoE forwards that read the expert counts on the host (cuda:
	 * dropless routing; kernels/mr_moe.h) */
	long moe_host_counts;
	void *impl;             /* the backend's state */
};

/* Whether device `name` ("cpu" when NULL) computes in `precision` (NULL:
 * its default): cpu fp32 only, cuda bf16 or fp32; 0 or MR_EINVAL naming
 * "precision". What mr_dev_open checks first, without opening anything. */
int mr_dev_check_precision(const char *name, const char *precision, struct mr_errbuf *eb);

/*
 * Opens device `name` ("cpu" or "cuda") for a rank: index picks the GPU of
 * a multi-GPU node, precision is "fp32" or "bf16" (NULL: the device's
 * default). An unknown or unavailable device or precision fails naming
 * the field ("device", "precision").
 */
int mr_dev_open(struct mr_dev *d, const char *name, int index, const char *precision,
		struct mr_pool *pool, struct mr_errbuf *eb);
void mr_dev_close(struct mr_dev *d);

/* GPUs this process can use through the cuda device; 0 with the reason
 * in why when the machine has none (no NVIDIA device node); a negative
 * code, why naming the device node and the reason (the plugin's path and
 * dlerror, the driver's error), when it has one the CUDA side cannot load
 * or count - an error for every GPU entry point, never a skip. Loads the
 * CUDA side on first use (plugin/cuda_entry.h). */
int mr_dev_cuda_count(struct mr_errbuf *why);
/* The machine's first NVIDIA device node (/dev/nvidia0 ...), or NULL
 * when it has none; MESHRUN_NVIDIA_DEV names another path to stand for
 * it (tests). */
const char *mr_dev_gpu_node(void);

/* "attention", "gemm", "optimizer", "copy", "other" for an enum
 * mr_dev_kind; "idle" for MR_DEV_KINDS. */
const char *mr_dev_kind_name(int kind);

/* ---- helpers over the table ---- */
/* Zeroed device memory accounted in mem under kind; NULL on failure. */
static inline void *mr_dev_alloc(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind,
				 size_t bytes)
{
	return d->ops->alloc(d, mem, kind, bytes);
}

/* p may be NULL; bytes and kind must match the allocation. */
static inline void mr_dev_free(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind,
			       void *p, size_t bytes)
{
	if (p)
		d->ops->free(d, mem, kind, p, bytes);
}

/* Host memory through the device's host_alloc (pinned on cuda), or 64-byte
 * aligned host memory where it has none (device/mem.c); zeroed, accounted
 * in mem under kind; NULL on failure. Freed with mr_dev_host_free (p may
 * be NULL; bytes and kind as allocated). */
void *mr_dev_host_alloc(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind,
			size_t bytes);
void mr_dev_host_free(struct mr_dev *d, struct mr_mem *mem, enum mr_mem_kind kind, void *p,
		      size_t bytes);

/* The element n of an activation buffer. */
static inline mr_act *mr_dev_at(const struct mr_dev *d, const mr_act *p, size_t n)
{
	return (mr_act *)(uintptr_t)((const char *)p + n * d->act_bytes);
}

/* Bytes of n activation elements. */
static inline size_t mr_dev_act_bytes(const struct mr_dev *d, size_t n)
{
	return n * d->act_bytes;
}

#endif
