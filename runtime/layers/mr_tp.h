/*
 * mr_tp.h - tensor and sequence parallelism (Megatron-LM) as layers the
 * model calls unconditionally: each is the single-rank operation when the
 * tp group has one rank (no copy, no collective).
 *
 * Rows: the model works on N = B*T rows. Without sequence parallelism
 * every tp rank holds all N rows of the residual stream ("local" ==
 * "full"); with it a rank holds Nl = N/tp local rows, the sequence chunk
 * t in [r*T/tp, (r+1)*T/tp) of every batch row b, in (b, t) order.
 *
 *   column-parallel linear: gather the input rows (sp: all-gather), then a
 *     GEMM into this rank's slice of output features;
 *   row-parallel linear: a GEMM over this rank's slice of input features
 *     into a partial (N, C) sum, reduced over tp (all-reduce, or
 *     reduce-scatter into the local rows under sp), then the bias;
 *   vocab-parallel embedding and cross-entropy: each rank holds ceil(V/tp)
 *     rows of the token embedding / LM head (the last rank's rows past V
 *     are padding, masked out of the softmax); the loss needs only a max
 *     and two sums over tp, never the whole logits.
 * Backward runs the conjugate collectives; LayerNorm gradients, computed
 * on local rows under sp, are summed over tp.
 *
 * Sequence order: an all-gather of the ranks' local rows arrives as
 * [rank][b][t_local]; the model works in [b][t], so gathers permute after
 * the collective and reduce-scatters before it (one strided copy).
 *
 * Buffers are device memory of the model's device (device/mr_device.h):
 * rows in its activation type (mr_act), the loss pieces fp32.
 *
 * Ownership: struct mr_tp is the model's (in its struct mr_layers,
 * mr_layers.h); the device and comm are borrowed, tmp and ce are the
 * model's workspace when size > 1.
 * Every function returns 0 or the communicator's negative MR_E* code.
 * Non-goals: the parameter table's tp splits (model/gpt_table.c).
 */
#ifndef MR_TP_H
#define MR_TP_H

#include <stddef.h>

#include "device/mr_device.h"

struct mr_comm;

struct mr_tp {
	struct mr_dev *dev;   /* the model's device */
	int size, rank;       /* tp degree (1: every call is the identity), index */
	int sp;               /* sequence parallel (size > 1) */
	struct mr_comm *comm; /* NULL when size == 1 */
	int B, T, C, V;       /* batch, sequence, model width, vocabulary */
	mr_act *tmp;          /* scratch (N,C) when size > 1 (sp permutations) */
	float *ce;            /* scratch 3N fp32 when size > 1 (loss pieces) */
	float *norm_g;        /* scratch 2C fp32 under sp: one pass's LayerNorm
			       * weight and bias gradients (mr_tp_norm_grads) */
	int cp, cp_rank;      /* context parallel (layers/mr_cp.h): T is the local
			       * rows, two chunks at their global positions */
	struct mr_comm *kv;   /* replicated key/value heads: the tp ranks sharing
			       * this rank's (mr_tp_kv_grads_*); NULL otherwise */
	float *kv_g;          /* scratch kv_n fp32 with kv: the gradients
			       * accumulated before a pass */
	size_t kv_n;          /* a layer's k and v weights here (2 hs C) */
};

void mr_tp_init(struct mr_tp *tp, struct mr_dev *dev, int size, int rank, int sp,
		struct mr_comm *comm, int B, int T, int C, int V);

/* Rows this rank holds of the residual stream, and the position t of
 * local row i. */
int mr_tp_local_rows(const struct mr_tp *tp);
int mr_tp_local_pos(const struct mr_tp *tp, int i);
/* Buffer choice without branches in the model: scratch under sp (or with
 * size > 1), else plain, so a gather or reduce into plain is a no-op. */
mr_act *mr_tp_if_sp(const struct mr_tp *tp, mr_act *plain, mr_act *scratch);
mr_act *mr_tp_if_split(const struct mr_tp *tp, mr_act *plain, mr_act *scratch);

/* In-place sum (or max) of n fp32 over the tp group. */
int mr_tp_allreduce(struct mr_tp *tp, float *buf, size_t n, int max);
/* out (Nl,C) = sum over tp of partial (N,C); partial may be clobbered;
 * out == partial with one rank is a no-op. */
int mr_tp_reduce_rows(struct mr_tp *tp, mr_act *out, mr_act *partial);
/* full (N,C) = every rank's local rows (Nl,C); a no-op without sp when
 * full == local. */
int mr_tp_gather_rows(struct mr_tp *tp, mr_act *full, const mr_act *local);
/* Row-parallel linear: out (Nl,C) = sum_tp(inp (N,IC) @ w^T) + bias;
 * scratch (N,C) holds the partial sum when size > 1. */
int mr_tp_row_linear_fwd(struct mr_tp *tp, mr_act *out, const mr_act *inp, const mr_act *w,
			 const mr_act *bias, int IC, mr_act *scratch);
/* A LayerNorm backward's weight and bias gradient targets: w and b
 * themselves, or under sp tp->norm_g (zeroed) and norm_g + C, because a
 * rank's rows give only part of this pass's gradient. 0 or the device's
 * error. */
int mr_tp_norm_grads(struct mr_tp *tp, float *w, float *b, float **gw, float **gb);
/* Under sp: the pass's partial gradients in tp->norm_g summed over tp and
 * added into w and b (the gradients accumulated so far stay out of the
 * sum); a no-op otherwise. */
int mr_tp_sp_norm_grads(struct mr_tp *tp, float *w, float *b);

/* Replicated key/value heads (tp above n_kv_head, model/mr_gpt.h's
 * mr_gpt_kv_rep): every rank of tp->kv holds the same key/value head and
 * adds to its weight gradient only what its own query heads give, so a
 * pass's gradient of those weights is summed over tp->kv. The input's
 * gradient needs nothing: its tp sum already counts every rank's part
 * once. begin stashes the gradients accumulated so far, g (tp->kv_n fp32:
 * the layer's k and v weights, back to back), in tp->kv_g and zeroes g
 * for the pass; end sums the pass's g over tp->kv and adds the stash
 * back, so earlier passes stay out of the sum. No-ops without tp->kv. */
int mr_tp_kv_grads_begin(struct mr_tp *tp, float *g);
int mr_tp_kv_grads_end(struct mr_tp *tp, float *g);

/* Rows of wte (columns of the logits) per rank: ceil(V / size). */
int mr_tp_vocab_rows(const struct mr_tp *tp);
/* Token ids relative to this rank's vocabulary slice (-1 elsewhere) in
 * out; returns tok itself with one rank. */
const int *mr_tp_vocab_ids(const struct mr_tp *tp, int *out, const int *tok, int n);
/* Sets the logit columns of padded vocabulary rows to value: -1e30 after
 * the forward GEMM (out of the softmax), 0 in dlogits (the padded rows of
 * wte get no gradient and never learn). logits (N, vocab_rows). */
int mr_tp_mask_vocab_pad(const struct mr_tp *tp, mr_act *logits, float value);
/* Vocab-parallel embedding: out (Nl,C) = wte[tok] summed over tp + wpe[t]
 * (wpe NULL: no position rows; dwpe NULL below likewise); tok are
 * mr_tp_vocab_ids on the device; scratch (N,C) when size > 1. */
int mr_tp_embedding_fwd(struct mr_tp *tp, mr_act *out, const int *tok, const mr_act *wte,
			const mr_act *wpe, mr_act *scratch);
/* Its backward: dwte (this rank's rows) and dwpe from dlocal (Nl,C);
 * tok_host the same ids on the host; scratch (N,C) for the gathered rows
 * under sp. */
int mr_tp_embedding_bwd(struct mr_tp *tp, float *dwte, float *dwpe, mr_act *dlocal,
			const int *tok, const int *tok_host, mr_act *scratch);
/* Vocab-parallel cross-entropy forward: losses and lse (N) over the whole
 * vocabulary from this rank's logits (N, vocab_rows); tgt are
 * mr_tp_vocab_ids of the targets, on the device. */
int mr_tp_cross_entropy_fwd(struct mr_tp *tp, float *losses, float *lse,
			    const mr_act *logits, const int *tgt);
/* struct mr_moe_xchg.reduce over tp (ctx = the struct mr_tp). */
int mr_tp_moe_reduce(void *ctx, float *buf, size_t n);

#endif
