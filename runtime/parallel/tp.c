/*
 * tp.c - tensor and sequence parallelism (see mr_tp.h): row reductions and
 * gathers with the sequence permutation, the row-parallel linear layer,
 * the vocab-parallel embedding and cross-entropy.
 */
#include "mr_tp.h"

#include <math.h>
#include <string.h>

#include "comm/mr_comm.h"
#include "kernels/mr_kernels.h"

void mr_tp_init(struct mr_tp *tp, int size, int rank, int sp, struct mr_comm *comm, int B,
		int T, int C, int V)
{
	memset(tp, 0, sizeof(*tp));
	tp->size = size > 1 ? size : 1;
	tp->rank = tp->size > 1 ? rank : 0;
	tp->sp = tp->size > 1 && sp;
	tp->comm = tp->size > 1 ? comm : NULL;
	tp->B = B;
	tp->T = T;
	tp->C = C;
	tp->V = V;
}

int mr_tp_local_rows(const struct mr_tp *tp)
{
	return tp->sp ? tp->B * tp->T / tp->size : tp->B * tp->T;
}

int mr_tp_local_pos(const struct mr_tp *tp, int i)
{
	int Tl;

	if (!tp->sp)
		return i % tp->T;
	Tl = tp->T / tp->size;
	return tp->rank * Tl + i % Tl;
}

float *mr_tp_if_sp(const struct mr_tp *tp, float *plain, float *scratch)
{
	return tp->sp ? scratch : plain;
}

float *mr_tp_if_split(const struct mr_tp *tp, float *plain, float *scratch)
{
	return tp->size > 1 ? scratch : plain;
}

int mr_tp_allreduce(struct mr_tp *tp, float *buf, size_t n, int max)
{
	if (tp->size == 1 || n == 0)
		return 0;
	return mr_comm_allreduce(tp->comm, buf, buf, n, MR_COMM_F32,
				 max ? MR_COMM_MAX : MR_COMM_SUM);
}

/* [b][t] <-> [rank][b][t_local] row blocks of C floats. */
static void permute(const struct mr_tp *tp, float *dst, const float *src, int to_ranks)
{
	int Tl = tp->T / tp->size, r, b;
	size_t C = (size_t)tp->C, blk = (size_t)Tl * C;

	for (r = 0; r < tp->size; r++)
		for (b = 0; b < tp->B; b++) {
			size_t full = ((size_t)b * tp->T + (size_t)r * Tl) * C;
			size_t rk = ((size_t)r * tp->B + b) * blk;
			if (to_ranks)
				memcpy(dst + rk, src + full, blk * sizeof(float));
			else
				memcpy(dst + full, src + rk, blk * sizeof(float));
		}
}

int mr_tp_reduce_rows(struct mr_tp *tp, float *out, float *partial)
{
	size_t N = (size_t)tp->B * tp->T, C = (size_t)tp->C;

	if (tp->size == 1) {
		if (out != partial)
			memcpy(out, partial, N * C * sizeof(float));
		return 0;
	}
	if (!tp->sp)
		return mr_comm_allreduce(tp->comm, partial, out, N * C, MR_COMM_F32, MR_COMM_SUM);
	permute(tp, tp->tmp, partial, 1);
	return mr_comm_reduce_scatter(tp->comm, tp->tmp, out, N * C / (size_t)tp->size,
				      MR_COMM_F32, MR_COMM_SUM);
}

int mr_tp_gather_rows(struct mr_tp *tp, float *full, const float *local)
{
	size_t N = (size_t)tp->B * tp->T, C = (size_t)tp->C;
	int rc;

	if (!tp->sp) {
		if (full != local)
			memcpy(full, local, N * C * sizeof(float));
		return 0;
	}
	rc = mr_comm_allgather(tp->comm, local, tp->tmp, N * C / (size_t)tp->size, MR_COMM_F32);
	if (rc == 0)
		permute(tp, full, tp->tmp, 0);
	return rc;
}

/* rows (n,C) += bias (C) */
static void add_bias(float *rows, const float *bias, int n, int C)
{
	int i, c;

	for (i = 0; i < n; i++)
		for (c = 0; c < C; c++)
			rows[(size_t)i * C + c] += bias[c];
}

int mr_tp_row_linear_fwd(struct mr_tp *tp, struct mr_pool *p, float *out, const float *inp,
			 const float *w, const float *bias, int IC, float *scratch)
{
	int N = tp->B * tp->T, rc;

	if (tp->size == 1) {
		mr_matmul_fwd(p, out, inp, w, bias, N, IC, tp->C);
		return 0;
	}
	mr_matmul_fwd(p, scratch, inp, w, NULL, N, IC, tp->C);
	if ((rc = mr_tp_reduce_rows(tp, out, scratch)) < 0)
		return rc;
	add_bias(out, bias, mr_tp_local_rows(tp), tp->C);
	return 0;
}

int mr_tp_sp_norm_grads(struct mr_tp *tp, float *w, float *b)
{
	int rc;

	if (!tp->sp)
		return 0;
	if ((rc = mr_tp_allreduce(tp, w, (size_t)tp->C, 0)) < 0)
		return rc;
	return mr_tp_allreduce(tp, b, (size_t)tp->C, 0);
}

int mr_tp_vocab_rows(const struct mr_tp *tp)
{
	return (tp->V + tp->size - 1) / tp->size;
}

const int *mr_tp_vocab_ids(const struct mr_tp *tp, int *out, const int *tok, int n)
{
	int Vl = mr_tp_vocab_rows(tp), lo = tp->rank * Vl, i;

	if (tp->size == 1)
		return tok;
	for (i = 0; i < n; i++)
		out[i] = tok[i] >= lo && tok[i] < lo + Vl ? tok[i] - lo : -1;
	return out;
}

void mr_tp_mask_vocab_pad(const struct mr_tp *tp, float *logits, float value)
{
	int N = tp->B * tp->T, Vl = mr_tp_vocab_rows(tp), valid = tp->V - tp->rank * Vl, i, v;

	if (valid >= Vl)
		return;
	if (valid < 0)
		valid = 0;
	for (i = 0; i < N; i++)
		for (v = valid; v < Vl; v++)
			logits[(size_t)i * Vl + v] = value;
}

int mr_tp_embedding_fwd(struct mr_tp *tp, struct mr_pool *p, float *out, const int *tok,
			const float *wte, const float *wpe, float *scratch)
{
	int C = tp->C, Nl = mr_tp_local_rows(tp), i, c, rc;

	if (tp->size == 1) {
		mr_encoder_fwd(p, out, tok, wte, wpe, tp->B, tp->T, C);
		return 0;
	}
	mr_encoder_fwd(p, scratch, tok, wte, NULL, tp->B, tp->T, C);
	if ((rc = mr_tp_reduce_rows(tp, out, scratch)) < 0)
		return rc;
	for (i = 0; i < Nl; i++) {
		const float *pe = wpe + (size_t)mr_tp_local_pos(tp, i) * C;
		float *o = out + (size_t)i * C;
		for (c = 0; c < C; c++)
			o[c] += pe[c];
	}
	return 0;
}

int mr_tp_embedding_bwd(struct mr_tp *tp, struct mr_pool *p, float *dwte, float *dwpe,
			float *dlocal, const int *tok, float *scratch)
{
	/* full rows: wte's slice from every token, wpe complete */
	float *dfull = mr_tp_if_sp(tp, dlocal, scratch);
	int rc = mr_tp_gather_rows(tp, dfull, dlocal);

	if (rc == 0)
		mr_encoder_bwd(p, dwte, dwpe, dfull, tok, tp->B, tp->T, tp->C);
	return rc;
}

int mr_tp_cross_entropy_fwd(struct mr_tp *tp, struct mr_pool *p, float *losses, float *lse,
			    const float *logits, const int *tgt)
{
	int N = tp->B * tp->T, Vl = mr_tp_vocab_rows(tp), i, rc;
	float *mx = tp->tmp, *sum, *tl;

	if (tp->size == 1) {
		mr_crossentropy_fwd(p, losses, lse, logits, tgt, N, Vl);
		return 0;
	}
	sum = mx + N;
	tl = sum + N;
	mr_crossentropy_rowmax(p, mx, logits, N, Vl);
	if ((rc = mr_tp_allreduce(tp, mx, (size_t)N, 1)) < 0)
		return rc;
	mr_crossentropy_sumexp(p, sum, tl, logits, mx, tgt, N, Vl);
	/* sums and target logits travel together: one all-reduce of 2N */
	if ((rc = mr_tp_allreduce(tp, sum, 2 * (size_t)N, 0)) < 0)
		return rc;
	for (i = 0; i < N; i++) {
		lse[i] = mx[i] + logf(sum[i] > 0.0f ? sum[i] : 1.0f);
		losses[i] = lse[i] - tl[i];
	}
	return 0;
}

int mr_tp_moe_reduce(void *ctx, float *buf, size_t n)
{
	return mr_tp_allreduce(ctx, buf, n, 0);
}
