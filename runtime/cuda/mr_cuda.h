/*
 * mr_cuda.h - the CUDA device backend's C interface: device context, device
 * memory, cuBLASLt/cuBLAS GEMMs and the own kernels of the GPT runtime.
 *
 * Every kernel here has a CPU twin in kernels/mr_kernels.h,
 * kernels/mr_attention.h, optim/mr_adamw.h, kernels/mr_moe.h or (a few
 * loops) the cpu device (device/cpu.c), with the same shapes
 * (llm.c notation: B batch, T time, C channels, N = B*T rows, V vocab) and
 * the same accumulate (+=) / write (=) rule, and tests/gpu/ compares each
 * against its twin.
 *
 * Precision: activations, activation gradients and the weight copies
 * the kernels read are stored in the context's ACTIVATION TYPE
 * (mr_cuda_set_act): bf16 by default (llm.c's mixed-precision path), or
 * fp32 ("precision": "fp32": fp32 throughout). Every activation argument
 * is a `void *` of that type; arguments typed float are fp32 whatever the
 * activation type:
 *   - master weights, parameter gradients, AdamW m/v, LayerNorm mean/rstd,
 *     attention lse/delta, losses, MoE router probabilities and gates are
 *     fp32;
 *   - every reduction (GEMM accumulation, LayerNorm statistics, softmax
 *     sums, bias/weight gradient sums, grad norm) runs in fp32 (the grad
 *     norm's last pass and the MoE aux loss in double); the activation
 *     type is only a storage format: loads convert to fp32, bf16 stores
 *     round to nearest even once;
 *   - parameter gradients (dw, dbias, LayerNorm dw/db, embedding
 *     dwte/dwpe) accumulate (+=) across micro-batches.
 * With fp32 activations the GEMMs are plain fp32 (cuBLASLt/cuBLAS with
 * CUBLAS_COMPUTE_32F and the default math mode: no TF32; the environment
 * variable NVIDIA_TF32_OVERRIDE=1 would force TF32 behind our back, so
 * do not set it), and the kernels are the bf16 ones instantiated for
 * float (C++ templates over the storage type), so both types share one
 * code path.
 * Where context parallelism needs more precision (partial attention outputs
 * being merged, dq/dk/dv summed over ring steps) an fp32 variant exists.
 *
 * Determinism: no kernel uses float atomics. Sums over rows (bias, LayerNorm
 * dw/db, embedding gradients, grad norm) go through fixed-shape partials
 * summed in a fixed order; attention backward computes dq and dk/dv in two
 * passes instead of atomics; the layer backward through cuDNN is the graph
 * cuDNN's frontend builds for its deterministic algorithm on Hopper (dQ
 * written by its matmul, no fp32 accumulator: the dP-workspace
 * decomposition; tests/gpu checks it bit for bit on a GPU).
 * Same inputs + same device = same bits.
 *
 * Calls are asynchronous on the context's stream unless they say otherwise;
 * a kernel entry returns 0 or a negative MR_E* code when the launch itself
 * failed (bad shape: MR_EINVAL; CUDA error: MR_ESYS), with the reason in
 * mr_cuda_errmsg(). Errors of a running kernel surface at mr_cuda_sync().
 *
 * Ownership: the caller owns struct mr_cuda (mr_cuda_create/mr_cuda_free)
 * and every device buffer it allocates (mr_cuda_alloc/mr_cuda_dfree); all
 * tensor arguments are device pointers unless named *_host. The context
 * owns its stream, cuBLAS/cuBLASLt handles, GEMM workspace, the scratch
 * it uses for partial sums, and its cuDNN handle, plans and workspace.
 *
 * Non-goals: multi-GPU in one context (one context per rank and device),
 * fp16, fp8, dropout, kernels other than the GPT runtime's.
 */
#ifndef MR_CUDA_H
#define MR_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "mr_err.h"

/* bf16 as stored: the high 16 bits of an IEEE fp32. */
typedef uint16_t mr_bf16;

/* Host-side conversions (round to nearest even; NaN stays NaN). */
static inline mr_bf16 mr_bf16_from_f32(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (mr_bf16)((u >> 16) | 0x40u); /* quiet NaN */
	u += 0x7fffu + ((u >> 16) & 1u);
	return (mr_bf16)(u >> 16);
}

static inline float mr_bf16_to_f32(mr_bf16 h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

struct mr_cuda;
struct mr_moe_shape; /* kernels/mr_moe.h */

/* Storage type of the activation arguments (void *) of a context. */
enum mr_cuda_dtype { MR_CUDA_BF16, MR_CUDA_F32 };

/* ---- device and context ------------------------------------------------ */
/* Number of usable devices; 0 (and a reason in eb) when there is no driver
 * or no device. Never fails otherwise. */
int mr_cuda_device_count(struct mr_errbuf *eb);
/* The driver's name of GPU `device` ("NVIDIA H100 80GB HBM3") into buf;
 * 0 or MR_ENOTSUP. */
int mr_cuda_device_name(int device, char *buf, size_t n);
/* Whether p is device memory (cudaMalloc'd; the host cannot read it). */
int mr_cuda_is_device_ptr(const void *p);
/* 1 where NCCL can move this build's device memory between ranks (a real
 * GPU); 0 in the CPU emulation, whose "device" memory NCCL cannot see. */
int mr_cuda_nccl_capable(void);
/* Context on device `device`: stream, cuBLAS(Lt) handles, 32 MiB GEMM
 * workspace; activation type bf16. MR_ENOTSUP when there is no such
 * device. */
int mr_cuda_create(struct mr_cuda **out, int device, struct mr_errbuf *eb);
void mr_cuda_free(struct mr_cuda *cu);
/* Sets the activation type every later call reads and writes (see the
 * header); set it once, before the first kernel. */
void mr_cuda_set_act(struct mr_cuda *cu, enum mr_cuda_dtype t);
/* The last error message of the context ("" if none). */
const char *mr_cuda_errmsg(const struct mr_cuda *cu);
/* The context's stream (a cudaStream_t) for another stream to wait on;
 * NULL in the CPU emulation. */
void *mr_cuda_stream(struct mr_cuda *cu);
/* Waits for the stream; reports errors of kernels that ran. */
int mr_cuda_sync(struct mr_cuda *cu);
/*
 * Stream-ordered waits (device/cuda.c, for collectives on another
 * stream): mr_cuda_stream_wait makes the stream wait for event ev (a
 * cudaEvent_t recorded on another stream; NULL: nothing to wait for)
 * without the host; mr_cuda_query asks without blocking whether ev (NULL:
 * everything queued on the stream so far) has completed: 1 yes, 0 not yet,
 * MR_ESYS on an error (cudaEventQuery / cudaStreamQuery);
 * mr_cuda_event_free destroys an event handed over to the context (NULL:
 * a no-op; one still pending is released when it completes). The CPU
 * emulation has no events and answers from its "busy" knob.
 */
int mr_cuda_stream_wait(struct mr_cuda *cu, void *ev);
int mr_cuda_query(struct mr_cuda *cu, void *ev);
void mr_cuda_event_free(struct mr_cuda *cu, void *ev);
/* 1 if GEMMs run through cuBLASLt, 0 if through the cuBLAS fallback. */
int mr_cuda_using_lt(const struct mr_cuda *cu);
/* GEMMs that fell back to cuBLAS although cuBLASLt is in use (it had no
 * algorithm for the shape, or failed); *why (may be NULL) gets the first
 * one's reason. */
long mr_cuda_lt_fallbacks(const struct mr_cuda *cu, const char **why);
/* Forces the cuBLAS fallback (tests; also set by MESHRUN_CUBLASLT=0). */
void mr_cuda_disable_lt(struct mr_cuda *cu);

/*
 * Timing marks (the device's breakdown of a step by kind of operation):
 * mr_cuda_marks makes room for n marks (0: none, and frees them);
 * mr_cuda_mark records one on the stream (a timing event) and returns its
 * index, -1 when there is no room left; mr_cuda_marks_read waits for the
 * stream, writes each mark's time after mark 0 in ms into ms[0..] (at most
 * n of them) and forgets them all, returning how many it wrote. The CPU
 * emulation stamps the host clock (its operations ran when they returned).
 */
int mr_cuda_marks(struct mr_cuda *cu, int n);
int mr_cuda_mark(struct mr_cuda *cu);
int mr_cuda_marks_read(struct mr_cuda *cu, double *ms, int n);

/*
 * Device graphs (CUDA graphs): the work a host function enqueues on the
 * stream, captured once and launched again without the host code.
 *
 * mr_cuda_graph_capture runs fn(ctx) with the stream capturing and, when
 * fn returns 0, instantiates what it enqueued into *out (not launched: the
 * work has not run). While capturing (mr_cuda_capturing) every call that
 * needs the host - sync, upload, download, alloc, dfree, host_alloc and
 * host_free, the grad norms (their result is on the host), the MoE
 * routing (its counts are), a scratch, bucket or AdamW table that would
 * grow or change - fails at once with MR_ENEEDHOST and its name in
 * mr_cuda_errmsg, without touching the stream; the capture then ends, is
 * discarded, the stream is usable again, and mr_cuda_graph_capture
 * returns fn's code (a capture or instantiation CUDA refused: MR_ESYS).
 * So fn's per-call inputs must already sit in device buffers, and
 * everything it uses must exist (a warm-up run of fn first allocates
 * them).
 *
 * mr_cuda_graph_launch queues graph g on the stream. On a GPU fn and ctx
 * are not called (the graph replays the captured arguments); the CPU
 * emulation re-runs fn and aborts when any call differs from the capture
 * in name, pointers, sizes or scalars - what would be a stale argument
 * on a GPU. mr_cuda_graph_free (g may be NULL) waits for the stream.
 */
struct mr_cuda_graph;
typedef int (*mr_cuda_work)(void *ctx);
int mr_cuda_graph_capture(struct mr_cuda *cu, mr_cuda_work fn, void *ctx,
			  struct mr_cuda_graph **out);
int mr_cuda_graph_launch(struct mr_cuda *cu, struct mr_cuda_graph *g, mr_cuda_work fn,
			 void *ctx);
void mr_cuda_graph_free(struct mr_cuda *cu, struct mr_cuda_graph *g);
/* 1 while mr_cuda_graph_capture runs its fn. */
int mr_cuda_capturing(const struct mr_cuda *cu);

/* ---- memory (device pointers; bytes) ----------------------------------- */
int mr_cuda_alloc(struct mr_cuda *cu, void **p, size_t bytes);
void mr_cuda_dfree(struct mr_cuda *cu, void *p); /* p may be NULL; waits */
int mr_cuda_memset0(struct mr_cuda *cu, void *p, size_t bytes);
/* Page-locked host memory (cudaHostAlloc): the host reads and writes it,
 * upload/download move it at full bandwidth. Not zeroed. host_free waits
 * for the stream first (a copy in flight may still read it); p may be
 * NULL. */
int mr_cuda_host_alloc(struct mr_cuda *cu, void **p, size_t bytes);
int mr_cuda_host_free(struct mr_cuda *cu, void *p);
/* Synchronous copies (they wait for the stream). */
int mr_cuda_upload(struct mr_cuda *cu, void *dst, const void *src_host, size_t bytes);
int mr_cuda_download(struct mr_cuda *cu, void *dst_host, const void *src, size_t bytes);
/* Device to device, on the stream; dst and src do not overlap (dst == src
 * is a no-op). copy2d: rows blocks of width bytes from src every spitch
 * bytes to dst every dpitch bytes. */
int mr_cuda_copy(struct mr_cuda *cu, void *dst, const void *src, size_t bytes);
int mr_cuda_copy2d(struct mr_cuda *cu, void *dst, size_t dpitch, const void *src, size_t spitch,
		   size_t width, size_t rows);
/* Device conversions of n elements (whatever the activation type). */
int mr_cuda_f32_to_bf16(struct mr_cuda *cu, mr_bf16 *dst, const float *src, size_t n);
int mr_cuda_bf16_to_f32(struct mr_cuda *cu, float *dst, const mr_bf16 *src, size_t n);

/* ---- GEMM (cuBLASLt, cuBLAS fallback; fp32 accumulate) ------------------ */
/* out (N,OC) = inp (N,IC) @ w^T (w is (OC,IC)) + bias (OC, may be NULL).
 * The bias rides in the cuBLASLt epilogue. Twin: mr_matmul_fwd. */
int mr_cuda_matmul_fwd(struct mr_cuda *cu, void *out, const void *inp, const void *w,
		       const void *bias, int N, int IC, int OC);
/* The GEMM before a GELU: pre (N,OC) = inp @ w^T + bias (bias may be
 * NULL) and out (N,OC) = gelu(pre). With bf16 activations both come from
 * the fp32 product, each rounded once (cuBLASLt's GELU_AUX_BIAS
 * epilogue), so out is not exactly mr_cuda_gelu_fwd of the rounded pre;
 * with fp32 activations, or where the epilogue has no algorithm (counted
 * in mr_cuda_lt_fallbacks), it is the GEMM then mr_cuda_gelu_fwd.
 * Twin: mr_matmul_fwd into fp32, then mr_gelu_fwd, each stored. */
int mr_cuda_matmul_gelu_fwd(struct mr_cuda *cu, void *out, void *pre, const void *inp,
			    const void *w, const void *bias, int N, int IC, int OC);
/* dinp (N,IC) = or += dout @ w (may be NULL), dw (OC,IC) += dout^T @ inp
 * (fp32; may be NULL), dbias (OC) += colsum(dout) (fp32; may be NULL;
 * with dw, from the weight GEMM's BGRADB epilogue). Twin: mr_matmul_bwd. */
int mr_cuda_matmul_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
		       const void *dout, const void *inp, const void *w, int N, int IC, int OC,
		       int accumulate_dinp);
/* The GEMM before a GELU, backward: dinp (N,IC) = (dout @ w) * gelu'(pre)
 * (=), pre (N,IC) the GELU's input; with bf16 activations one rounding
 * (cuBLASLt's DGELU epilogue); dw, dbias (may be NULL) as
 * mr_cuda_matmul_bwd. With fp32 activations, or without the epilogue
 * (then counted in mr_cuda_lt_fallbacks): the two apart.
 * Twin: mr_matmul_bwd into fp32, then mr_gelu_bwd. */
int mr_cuda_matmul_dgelu_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
			     const void *dout, const void *inp, const void *w, const void *pre,
			     int N, int IC, int OC);
/* Strided-batched twins of the four above (the MoE experts' GEMMs, one
 * call for all of them): batch items of contiguous tensors - out (batch,
 * N,OC), inp (batch,N,IC), w (batch,OC,IC), bias and dbias (batch,OC), dw
 * (batch,OC,IC), the forward's pre as out, the backward's pre and dinp as
 * inp - item b computing the call above on
 * its slices; dinp is written (=). Twin: per item, the twin above. */
int mr_cuda_matmul_fwd_batched(struct mr_cuda *cu, void *out, const void *inp, const void *w,
			       const void *bias, int batch, int N, int IC, int OC);
int mr_cuda_matmul_gelu_fwd_batched(struct mr_cuda *cu, void *out, void *pre, const void *inp,
				    const void *w, const void *bias, int batch, int N, int IC,
				    int OC);
int mr_cuda_matmul_bwd_batched(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
			       const void *dout, const void *inp, const void *w, int batch, int N,
			       int IC, int OC);
int mr_cuda_matmul_dgelu_bwd_batched(struct mr_cuda *cu, void *dinp, float *dw, float *dbias,
				     const void *dout, const void *inp, const void *w,
				     const void *pre, int batch, int N, int IC, int OC);
/* All-fp32 variant of the forward (no TF32), whatever the activation
 * type. */
int mr_cuda_matmul_fwd_f32(struct mr_cuda *cu, float *out, const float *inp, const float *w,
			   const float *bias, int N, int IC, int OC);

/* ---- embedding ----------------------------------------------------------- */
/* out (B,T,C) = wte[tok] + wpe[t] (=); tok (B*T) device ints, tok < 0:
 * no wte part (another rank's vocabulary slice); wpe NULL: no position
 * part. Twin: mr_encoder_fwd. */
int mr_cuda_encoder_fwd(struct mr_cuda *cu, void *out, const int *tok, const void *wte,
			const void *wpe, int B, int T, int C);
/* dwte (V,C) += ..., dwpe (T,C) += ... (fp32; either may be NULL) from dout
 * (B,T,C). The tokens are read on the HOST (tok_host, B*T ids < V; rows
 * with a negative id add nothing to dwte) to bucket the positions of each
 * distinct token, so every dwte row is summed by one thread per channel
 * in position order: deterministic, no atomics. An id >= V is MR_ERANGE.
 * Captured into a graph, the bucketing is a host node that reads tok_host
 * when the graph runs: from the launch until the stream has run it, the
 * buffer must hold that launch's tokens (ids checked < V before; V is not
 * read then); one token buffer per context. Twin: mr_encoder_bwd. */
int mr_cuda_encoder_bwd(struct mr_cuda *cu, float *dwte, float *dwpe, const void *dout,
			const int *tok_host, int B, int T, int C, int V);
/* out rows i in [0, n) (width C) += wpe[off + i % period] (the positions
 * of a sequence-parallel shard). Twin: the loop of the cpu device's
 * add_pos (device/cpu.c). */
int mr_cuda_add_pos(struct mr_cuda *cu, void *out, const void *wpe, int n, int C, int period,
		    int off);

/* ---- layernorm ------------------------------------------------------------ */
/* out (N,C); mean, rstd (N) fp32; w, b (C) weight copies.
 * Twin: mr_layernorm_fwd. */
int mr_cuda_layernorm_fwd(struct mr_cuda *cu, void *out, float *mean, float *rstd,
			  const void *inp, const void *w, const void *b, int N, int C);
/* y (N,C) += x, then out, mean, rstd = mr_cuda_layernorm_fwd of the
 * stored y, in one kernel whose norm is the same code over the same
 * rounded values: the bits of mr_cuda_add_inplace then
 * mr_cuda_layernorm_fwd. Twins: mr_residual_fwd, mr_layernorm_fwd. */
int mr_cuda_add_layernorm_fwd(struct mr_cuda *cu, void *y, void *out, float *mean, float *rstd,
			      const void *x, const void *w, const void *b, int N, int C);
/* dinp (N,C) +=, dw, db (C) += (fp32). Twin: mr_layernorm_bwd. */
int mr_cuda_layernorm_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *db, const void *dout,
			  const void *inp, const void *w, const float *mean, const float *rstd,
			  int N, int C);

/* ---- the Llama family: RMSNorm, rotary positions, SwiGLU (llama.cu) ------ */
/* out (N,C) = inp / sqrt(mean(inp^2) + eps) * w; rstd (N) fp32.
 * Twin: mr_rmsnorm_fwd. */
int mr_cuda_rmsnorm_fwd(struct mr_cuda *cu, void *out, float *rstd, const void *inp,
			const void *w, int N, int C, float eps);
/* dinp (N,C) +=, dw (C) += (fp32). Twin: mr_rmsnorm_bwd. */
int mr_cuda_rmsnorm_bwd(struct mr_cuda *cu, void *dinp, float *dw, const void *dout,
			const void *inp, const void *w, const float *rstd, int N, int C);
/* In place: nheads heads of size D (even) at the start of N rows stride
 * elements apart, row n rotated for position pos[n] (device ints) by
 * inv_freq (D/2, device floats). Twins: mr_rope_fwd, mr_rope_bwd. */
int mr_cuda_rope_fwd(struct mr_cuda *cu, void *x, size_t stride, int N, int nheads, int D,
		     const int *pos, const float *inv_freq);
int mr_cuda_rope_bwd(struct mr_cuda *cu, void *dx, size_t stride, int N, int nheads, int D,
		     const int *pos, const float *inv_freq);
/* out (N,F) = silu(a) * b, ab (N,2F) = [a | b]. Twin: mr_swiglu_fwd. */
int mr_cuda_swiglu_fwd(struct mr_cuda *cu, void *out, const void *ab, int N, int F);
/* dab (N,2F) = [da | db] (=; may alias ab). Twin: mr_swiglu_bwd. */
int mr_cuda_swiglu_bwd(struct mr_cuda *cu, void *dab, const void *ab, const void *dout, int N,
		       int F);

/* ---- elementwise (fp32 math) ---------------------------------------------- */
/* out = gelu(inp) (=). Twin: mr_gelu_fwd. */
int mr_cuda_gelu_fwd(struct mr_cuda *cu, void *out, const void *inp, size_t n);
/* dinp = dout * gelu'(inp) (=); dinp may alias dout. Twin: mr_gelu_bwd. */
int mr_cuda_gelu_bwd(struct mr_cuda *cu, void *dinp, const void *inp, const void *dout,
		     size_t n);
/* out = a + b (=, may alias). Twin: mr_residual_fwd. */
int mr_cuda_residual_fwd(struct mr_cuda *cu, void *out, const void *a, const void *b, size_t n);
/* y += x. Twin: mr_add_inplace. */
int mr_cuda_add_inplace(struct mr_cuda *cu, void *y, const void *x, size_t n);
/* rows (n,C) += bias (C). Twin: the cpu device's add_bias. */
int mr_cuda_add_bias(struct mr_cuda *cu, void *rows, const void *bias, int n, int C);
/* columns [from, V) of every row of x (N,V) := value (=). Twin: the cpu
 * device's fill_cols. */
int mr_cuda_fill_cols(struct mr_cuda *cu, void *x, int N, int V, int from, float value);
/* y += x, fp32 (n). Twin: the cpu device's add_f32. */
int mr_cuda_add_f32(struct mr_cuda *cu, float *y, const float *x, size_t n);

/* ---- softmax + cross-entropy (fused) -------------------------------------- */
/* logits (N,V); losses, lse (N) fp32 (=); targets (N) device ints in
 * [0, V) (out of range gives a NaN loss). Twin: mr_crossentropy_fwd. */
int mr_cuda_crossentropy_fwd(struct mr_cuda *cu, float *losses, float *lse, const void *logits,
			     const int *targets, int N, int V);
/* In place: logits becomes (softmax - onehot(target)) * dscale; a negative
 * target subtracts no one-hot (another rank's vocabulary slice).
 * Twin: mr_crossentropy_bwd_inplace. */
int mr_cuda_crossentropy_bwd_inplace(struct mr_cuda *cu, void *logits, const float *lse,
				     const int *targets, int N, int V, float dscale);
/* Vocab-parallel pieces over a (N,V) slice, each (=): mx (N) = row max;
 * sum (N) = sum exp(row - mx) and tlogit (N) = row[target] (0 for a
 * negative target); finish: lse = mx + log(sum) (sum 0 taken as 1),
 * losses = lse - tlogit. Twins: mr_crossentropy_rowmax,
 * mr_crossentropy_sumexp, the cpu device's ce_finish. */
int mr_cuda_crossentropy_rowmax(struct mr_cuda *cu, float *mx, const void *logits, int N, int V);
int mr_cuda_crossentropy_sumexp(struct mr_cuda *cu, float *sum, float *tlogit, const void *logits,
				const float *mx, const int *targets, int N, int V);
int mr_cuda_crossentropy_finish(struct mr_cuda *cu, float *losses, float *lse, const float *mx,
				const float *sum, const float *tlogit, int N);

/* ---- attention (block-wise, online softmax; see mr_attention.h) ----------
 * One call runs every (batch, head). Q of head h of batch b, query i is at
 * q + b*q_batch + i*q_row + h*hs (elements of the activation type); K and V
 * likewise with kv_*, of key/value head h / (NH/NKV) (grouped-query
 * attention; NKV = NH is multi-head); queries sit at absolute positions
 * q_pos0.., keys at k_pos0.. (context parallel slices). hs must be a
 * multiple of 32 and <= 128; NKV must divide NH. */
struct mr_cuda_attn {
	const void *q, *k, *v;
	size_t q_row, q_batch, kv_row, kv_batch;
	int B, NH, hs;
	int tq, q_pos0, tk, k_pos0;
	int causal;
	float scale;        /* usually 1/sqrt(hs) */
	int NKV;            /* key/value heads; 0: NH */
};
/* Output rows of (B, tq, NH*hs) at out + b*o_batch + i*o_row + h*hs;
 * lse (B,NH,tq) fp32. Rows that see no key: out 0, lse -inf.
 * Twin: mr_attn_head_fwd / mr_attn_layer_fwd. */
int mr_cuda_attn_fwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, void *out, size_t o_row,
		     size_t o_batch, float *lse);
/* The same with an fp32 output, for partials that will be merged. */
int mr_cuda_attn_fwd_f32(struct mr_cuda *cu, const struct mr_cuda_attn *a, float *out,
			 size_t o_row, size_t o_batch, float *lse);
/* out_a, lse_a := merge(a, b) over disjoint key sets (fp32, same layout).
 * Twin: mr_attn_merge. */
int mr_cuda_attn_merge(struct mr_cuda *cu, float *out_a, float *lse_a, const float *out_b,
		       const float *lse_b, int B, int NH, int tq, int hs, size_t o_row,
		       size_t o_batch);
/* delta (B,NH,tq) = rowsum(dout * out) over each head's hs channels;
 * dout/out laid out like the forward output. */
int mr_cuda_attn_delta(struct mr_cuda *cu, float *delta, const void *dout, const void *out,
		       int B, int NH, int tq, int hs, size_t o_row, size_t o_batch);
/* dq (like q, stride dq_row/dq_batch), dk, dv (like k/v, dkv_*): +=, from
 * dout (laid out like the output), the FINAL lse and delta. dq is computed
 * by one pass over key blocks, dk/dv by one over query blocks (no atomics):
 * the CTA that owns a key/value head's rows sums its NH/NKV query heads in
 * head order, so the result is deterministic.
 * Twin: mr_attn_head_bwd / mr_attn_layer_bwd (which zeroes dqkv first). */
int mr_cuda_attn_bwd(struct mr_cuda *cu, const struct mr_cuda_attn *a, const void *dout,
		     size_t o_row, size_t o_batch, const float *lse, const float *delta, void *dq,
		     size_t dq_row, size_t dq_batch, void *dk, void *dv, size_t dkv_row,
		     size_t dkv_batch);
/* The same accumulating into fp32 gradients (ring attention). */
int mr_cuda_attn_bwd_f32(struct mr_cuda *cu, const struct mr_cuda_attn *a, const void *dout,
			 size_t o_row, size_t o_batch, const float *lse, const float *delta,
			 float *dq, size_t dq_row, size_t dq_batch, float *dk, float *dv,
			 size_t dkv_row, size_t dkv_batch);
/* A whole causal layer: qkv (B,T,C+2*NKV*hs) -> out (B,T,C) (=), lse
 * (B,NH,T), with hs = C/NH and a qkv row of NH query heads, then NKV key
 * heads, then NKV value heads (NKV = NH: (B,T,3C)); NKV divides NH.
 * Backward: dqkv (like qkv) = (written), from out and lse of the forward.
 * With bf16 activations both run as cuDNN's fused flash attention on
 * tensor cores (cudnn_attn.cu, cudnn_graph.cu: libcudnn.so.9 opened at
 * first use, a plan per shape; P rounded to bf16 before P V, so out is
 * within bf16 noise of the twin, not elementwise-tight), else - fp32
 * activations, cuDNN missing or older than 9.10.2, a shape or plan it
 * refuses, MESHRUN_CUDNN=0 - on the block-wise kernels above (delta in
 * the context's scratch). Which, is decided once per shape and logged
 * once (event attn_cudnn or attn_fallback with the reason).
 * Twins: mr_attn_layer_fwd, mr_attn_layer_bwd. */
int mr_cuda_attn_layer_fwd(struct mr_cuda *cu, void *out, float *lse, const void *qkv, int B,
			   int T, int C, int NH, int NKV);
int mr_cuda_attn_layer_bwd(struct mr_cuda *cu, void *dqkv, const void *dout, const void *qkv,
			   const void *out, const float *lse, int B, int T, int C, int NH,
			   int NKV);
/* Layer attention calls (forward or backward) cuDNN ran. */
long mr_cuda_attn_fast_calls(const struct mr_cuda *cu);
/* Layer attention calls the block-wise kernels ran although the cuDNN
 * path is on (not MESHRUN_CUDNN=0, not disabled): *why (may be NULL) gets
 * the first one's reason. */
long mr_cuda_attn_fallbacks(const struct mr_cuda *cu, const char **why);
/* Turns the cuDNN path off for this context (tests; also MESHRUN_CUDNN=0):
 * the layer entries run the block-wise kernels, uncounted. */
void mr_cuda_disable_cudnn(struct mr_cuda *cu);

/* ---- mixture of experts (kernels/mr_moe.h; twins there) ---------------------
 * Tensors as struct mr_moe_acts holds them, in device memory: probs (N,E),
 * gate (N,k) fp32; topi, slot (N,k), count, routed (E) ints; expert rows
 * (E,cap,width) of the activation type, row [e*cap + slot] for an
 * assignment kept by expert e. Deterministic: each output element is
 * written by one thread, sums run in a fixed order. */
/* Router and routing: probs = softmax(x (N,C) @ routerw (E,C)^T) (fp32
 * GEMM accumulation), top-k (ties to the lower expert), gates, capacity
 * slots in token order, count and routed. The load-balancing loss and the
 * dropped assignments: with count_host (the host path) synchronous,
 * count_host (E) gets count, *aux_host the loss and *dropped_host the
 * dropped count (stat unused, may be NULL); with count_host NULL nothing
 * is read back (aux_host, dropped_host unused) and stat (2 ints, device)
 * gets the loss's float bits and the dropped count. Twin: the router GEMM,
 * then mr_moe_route. */
int mr_cuda_moe_route(struct mr_cuda *cu, const struct mr_moe_shape *s, float *probs, int *topi,
		      float *gate, int *slot, int *count, int *routed, int *stat, const void *x,
		      const void *routerw, int *count_host, float *aux_host, int *dropped_host);
/* stat[0] (device) := the aux loss's float bits from probs and routed
 * summed over `ranks` ranks (context parallel, after the sum): no host
 * read. Twin: mr_moe_aux. */
int mr_cuda_moe_aux(struct mr_cuda *cu, const struct mr_moe_shape *s, int *stat,
		    const float *probs, const int *routed, int ranks);
/* xin rows of the kept assignments = x rows (C wide). Twin:
 * mr_moe_dispatch. */
int mr_cuda_moe_dispatch(struct mr_cuda *cu, const struct mr_moe_shape *s, void *xin,
			 const void *x, const int *topi, const int *slot);
/* y (N,C) = sum over token n's kept assignments j of gate[n,j] * rows[j]
 * (=; gate NULL: weight 1, the gather of dx). Twin: mr_moe_combine. */
int mr_cuda_moe_combine(struct mr_cuda *cu, const struct mr_moe_shape *s, void *y,
			const void *rows, const int *topi, const int *slot, const float *gate);
/* Combine's backward: dyo rows = gate * dy (=), dgate (N,k) = <dy, yo row>
 * (=; 0 when dropped). Twin: mr_moe_combine_bwd. */
int mr_cuda_moe_combine_bwd(struct mr_cuda *cu, const struct mr_moe_shape *s, void *dyo,
			    float *dgate, const void *dy, const void *yo, const int *topi,
			    const int *slot, const float *gate);
/* dlogits (N,E) (=) of the router from dgate (through the gates), the aux
 * loss weighted by aux_scale and the softmax. Twin: mr_moe_router_bwd. */
int mr_cuda_moe_router_bwd(struct mr_cuda *cu, const struct mr_moe_shape *s, void *dlogits,
			   const float *probs, const int *topi, const float *gate,
			   const float *dgate, const int *routed, float aux_scale);

/* ---- optimizer ------------------------------------------------------------- */
struct mr_cuda_adamw {
	float lr, beta1, beta2, eps;
	float weight_decay;  /* 0 for tensors without decay (biases, LayerNorm) */
	long t;              /* step number, 1-based, after increment */
	float grad_scale;    /* multiplies g first (clipping); 1 = none */
};
/* p (n) fp32 master, g, m, v (n) fp32; pc (n, activation type) may be
 * NULL, else gets the new p (rounded when bf16). Twin:
 * mr_adamw_update_range (one tensor's range). */
int mr_cuda_adamw_step(struct mr_cuda *cu, float *p, void *pc, const float *g, float *m,
		       float *v, size_t n, const struct mr_cuda_adamw *o);
/* One range of mr_cuda_adamw_multi: as mr_cuda_adamw_step's arguments. */
struct mr_cuda_adamw_range {
	float *p;
	void *pc;
	const float *g;
	float *m, *v;
	size_t n;
	int decay;           /* o->weight_decay applies (else none) */
};
/* The per-step scalars of o (lr, t, the decay and clip factors; the
 * bias corrections computed here in double) into the context's device
 * block that every later mr_cuda_adamw_multi reads - so a captured update
 * runs with the values of the step it is launched in. Queued on the
 * stream (the host copy is staged before the call returns). */
int mr_cuda_adamw_args(struct mr_cuda *cu, const struct mr_cuda_adamw *o);
/* AdamW of k ranges in ONE launch with the scalars of the last
 * mr_cuda_adamw_args (o->weight_decay for the ranges with decay), each
 * element as mr_cuda_adamw_step computes it (the same bits as a step per
 * range). The ranges' table goes to the device only when it differs from
 * the last call's (a training step passes the same one every time; while
 * capturing a changed table is MR_ENEEDHOST). Twin: mr_adamw_update_range
 * per range. */
int mr_cuda_adamw_multi(struct mr_cuda *cu, const struct mr_cuda_adamw_range *r, int k);
/* *sumsq_host = sum of g^2, two passes (fixed 512 partials, then one block
 * in double): deterministic. Synchronous. Twin: mr_grad_sumsq. */
int mr_cuda_grad_sumsq(struct mr_cuda *cu, const float *g, size_t n, double *sumsq_host);
/* out_host[i] = sum of g[off[i] .. off[i] + n[i])^2 for k ranges
 * (offsets and lengths on the host; a range may be empty; k <= 65535):
 * one launch, each range through the same fixed 512 partials, then one
 * thread per range in double, one read back for all. Deterministic.
 * Synchronous. Twin: mr_grad_sumsq of each range. */
int mr_cuda_grad_sumsq_ranges(struct mr_cuda *cu, const float *g, const size_t *off,
			      const size_t *n, int k, double *out_host);
/* g *= scale. */
int mr_cuda_scale(struct mr_cuda *cu, float *g, size_t n, float scale);

#ifdef __cplusplus
}
#endif

#endif
