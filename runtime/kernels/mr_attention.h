/*
 * mr_attention.h - causal multi-head attention, block-wise with an online
 * softmax (FlashAttention-2 style) in forward and backward, fp32.
 *
 * The core works on ONE head and on any slice of queries against any block
 * of keys/values, each located by its absolute sequence position:
 *
 *   mr_attn_head_fwd   -> normalised partial out (Tq,hs) and its per-row
 *                         logsumexp lse (Tq); rows that see no key get
 *                         out = 0 and lse = -inf
 *   mr_attn_merge      -> combines two partials of the same queries over
 *                         disjoint key sets (exactly the softmax over the
 *                         union)
 *   mr_attn_head_bwd   -> given the FINAL (merged) lse and
 *                         delta = rowsum(dout * out), adds this key block's
 *                         contribution to dq, dk, dv
 *
 * so context parallelism (ring attention) calls fwd per arriving K/V block,
 * merges, and in backward calls bwd per block with the global lse/delta.
 * Memory is O(T) per head: only lse (and the output) are kept for backward;
 * scores are recomputed block by block.
 *
 * The layer entry points run every (batch, head) of a packed qkv buffer
 * (B,T,C+2*NKV*hs): NH query heads, then NKV key heads and NKV value heads
 * along channels, head h of each at [h*hs, (h+1)*hs) of its part; with
 * NKV = NH that is (B,T,3C) multi-head attention, with fewer key/value
 * heads grouped-query attention (Ainslie et al. 2023): query head h reads
 * key/value head h / (NH/NKV), and each key/value head's gradient sums its
 * group's. Tile products are single-threaded cblas_sgemm calls on the
 * strided rows (OpenBLAS must run one thread when the pool has several).
 *
 * Non-goals: dropout, attention bias, sliding windows.
 */
#ifndef MR_ATTENTION_H
#define MR_ATTENTION_H

#include <stddef.h>

#include "cpu/mr_pool.h"

/* Block sizes of the layer and slice entry points (a CPU twin that
 * must give the same bits uses them too): forward 64 queries x 128 keys, backward 64 keys x 128
 * queries (from the first query that sees them). Twice the 64x64 tiles
 * halves the sgemm calls, while every NN/NT tile product of head size 64
 * stays under OpenBLAS's small-matrix limit (M*N*K <= 100^3 on
 * SkylakeX-class kernels: no packing); 256-wide tiles cross it. */
#define MR_ATTN_FWD_BQ 64
#define MR_ATTN_FWD_BK 128
#define MR_ATTN_BWD_BQ 128
#define MR_ATTN_BWD_BK 64

struct mr_attn_head {
	const float *q;       /* (tq, hs) rows with stride q_stride */
	const float *k, *v;   /* (tk, hs) rows with stride kv_stride */
	size_t q_stride, kv_stride;
	int tq, q_pos0;       /* query count and absolute position of row 0 */
	int tk, k_pos0;       /* key count and absolute position of row 0 */
	int hs;               /* head size */
	int causal;           /* key j visible to query i iff kpos <= qpos */
	float scale;          /* usually 1/sqrt(hs) */
	int bq, bk;           /* block sizes (>= 1) */
};

/* Workspace floats for one call of fwd or bwd with these block sizes. */
size_t mr_attn_head_ws_floats(int bq, int bk, int hs);

/* out rows with stride out_stride (written); lse (tq) written. */
void mr_attn_head_fwd(const struct mr_attn_head *h, float *out, size_t out_stride,
		      float *lse, float *ws);

/* out_a/lse_a := merge(a, b); rows of hs floats with the given strides. */
void mr_attn_merge(float *out_a, size_t sa, float *lse_a, const float *out_b, size_t sb,
		   const float *lse_b, int tq, int hs);

/* dq (tq rows, stride dq_stride), dk/dv (tk rows, stride dkv_stride): +=. */
void mr_attn_head_bwd(const struct mr_attn_head *h, const float *dout, size_t dout_stride,
		      const float *lse, const float *delta, float *dq, size_t dq_stride,
		      float *dk, float *dv, size_t dkv_stride, float *ws);

/* ---- whole layer: qkv (B,T,C+2*NKV*hs) -> out (B,T,C), lse (B,NH,T) -------- */
/* C = NH*hs; NKV divides NH. */
size_t mr_attn_layer_ws_floats(const struct mr_pool *p, int T, int hs);
void mr_attn_layer_fwd(struct mr_pool *p, float *out, float *lse, const float *qkv,
		       int B, int T, int C, int NH, int NKV, float *ws);
/* dqkv (the qkv layout) written (=); out/lse from the forward. */
void mr_attn_layer_bwd(struct mr_pool *p, float *dqkv, const float *dout,
		       const float *qkv, const float *out, const float *lse, int B, int T,
		       int C, int NH, int NKV, float *ws);

/* ---- slices (context parallel): every (batch, head) of a query slice
 * against a key/value slice, each at its absolute positions; pointers and
 * strides in floats, head h of batch b's query i at q + b*q_batch +
 * i*q_row + h*hs (k, v likewise with kv_*). Outputs laid out as
 * out + b*o_batch + i*o_row + h*hs; lse and delta (B, NH, tq). ---------- */
struct mr_attn_slice {
	const float *q, *k, *v;
	size_t q_row, q_batch, kv_row, kv_batch;
	int B, NH, hs;
	int tq, q_pos0, tk, k_pos0;
	int causal;
	float scale;
	int NKV;  /* key/value heads (dividing NH; k and v hold NKV heads a row);
		   * 0: NH */
};
/* out (=, normalised) and lse of the slice; rows seeing no key: 0, -inf.
 * Returns MR_ENOMEM (workspace) or 0. */
int mr_attn_slice_fwd(struct mr_pool *p, const struct mr_attn_slice *a, float *out,
		      size_t o_row, size_t o_batch, float *lse);
/* out_a, lse_a := merge(a, b) over disjoint key sets. */
void mr_attn_slice_merge(struct mr_pool *p, float *out_a, float *lse_a, const float *out_b,
			 const float *lse_b, int B, int NH, int tq, int hs, size_t o_row,
			 size_t o_batch);
/* delta = rowsum(dout * out) per (b, head, row). */
void mr_attn_slice_delta(struct mr_pool *p, float *delta, const float *dout, const float *out,
			 int B, int NH, int tq, int hs, size_t o_row, size_t o_batch);
/* dq, dk, dv += this slice's contribution, from the FINAL lse and delta. */
int mr_attn_slice_bwd(struct mr_pool *p, const struct mr_attn_slice *a, const float *dout,
		      size_t o_row, size_t o_batch, const float *lse, const float *delta,
		      float *dq, size_t dq_row, size_t dq_batch, float *dk, float *dv,
		      size_t dkv_row, size_t dkv_batch);

#endif
