/*
 * gpt_int.h - internals shared by gpt.c and gpt_tp.c: the tensor-parallel
 * and sequence-parallel collectives of the GPT passes.
 *
 * Rows: N = B*T rows are "full"; with sequence parallelism a rank holds
 * Nl = N/tp "local" rows, the sequence chunk t in [r*T/tp, (r+1)*T/tp) of
 * every batch row b, in (b, t) order. Without sp, local == full.
 * Every function is a no-op (or a copy) when tp == 1 and returns 0 or the
 * communicator's negative MR_E* code.
 */
#ifndef MR_GPT_INT_H
#define MR_GPT_INT_H

#include "mr_gpt.h"

/* Builds m's parameter table for m->cfg and m->par.tp: tensors,
 * unit_first, ntensors, nunits, nparams (gpt_table.c). MR_ENOMEM. */
int mr__gpt_table_create(struct mr_gpt *m);

/* Rows this rank holds of the residual stream. */
int mr__gpt_local_rows(const struct mr_gpt *m);
/* Position t of local row i. */
int mr__gpt_local_pos(const struct mr_gpt *m, int i);
/* In-place sum (or max) over the tp group. */
int mr__gpt_tp_allreduce(struct mr_gpt *m, float *buf, size_t n, int max);
/* out (Nl,C) = sum over tp of partial (N,C); partial is clobbered. */
int mr__gpt_reduce_rows(struct mr_gpt *m, float *out, float *partial);
/* full (N,C) = the local rows (Nl,C) of every tp rank. */
int mr__gpt_gather_rows(struct mr_gpt *m, float *full, const float *local);
/* Rows of wte (columns of the logits) per tp rank: ceil(V / tp); the last
 * rank's rows past V are padding. */
int mr__gpt_vocab_local_n(const struct mr_gpt *m);
/* Sets the logit columns of padded vocabulary rows to value: -1e30 after
 * the forward GEMM (out of the softmax), 0 in dlogits (the padded rows of
 * wte get no gradient and never learn). */
void mr__gpt_mask_vocab_pad(struct mr_gpt *m, float value);
/* Token ids relative to this rank's vocabulary slice (-1 elsewhere). */
void mr__gpt_vocab_local(const struct mr_gpt *m, int *out, const int *tok, int n);
/* Vocab-parallel cross-entropy forward: m->losses and m->ce_lse over the
 * whole vocabulary from this rank's logit slice. */
int mr__gpt_ce_fwd_vp(struct mr_gpt *m);
/* struct mr_moe_xchg.reduce under tp (ctx = the model). */
int mr__gpt_moe_reduce(void *ctx, float *buf, size_t n);

#endif
