/*
 * tp.c - tensor and sequence parallelism (see mr_tp.h): row reductions and
 * gathers with the sequence permutation, the row-parallel linear layer,
 * the vocab-parallel embedding and cross-entropy, over the model's device.
 */
#include "mr_cp.h"
#include "mr_tp.h"

#include <string.h>

#include "comm/mr_comm.h"
#include "device/mr_dev_comm.h"

void mr_tp_init(struct mr_tp *tp, struct mr_dev *dev, int size, int rank, int sp,
		struct mr_comm *comm, int B, int T, int C, int V)
{
	memset(tp, 0, sizeof(*tp));
	tp->dev = dev;
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

mr_act *mr_tp_if_sp(const struct mr_tp *tp, mr_act *plain, mr_act *scratch)
{
	return tp->sp ? scratch : plain;
}

mr_act *mr_tp_if_split(const struct mr_tp *tp, mr_act *plain, mr_act *scratch)
{
	return tp->size > 1 ? scratch : plain;
}

/* The communicator's element type for the device's activations. */
static enum mr_comm_dtype act_dtype(const struct mr_tp *tp)
{
	return tp->dev->act == MR_DT_BF16 ? MR_COMM_BF16 : MR_COMM_F32;
}

int mr_tp_allreduce(struct mr_tp *tp, float *buf, size_t n, int max)
{
	if (tp->size == 1 || n == 0)
		return 0;
	return mr_comm_allreduce(tp->comm, buf, buf, n, MR_COMM_F32,
				 max ? MR_COMM_MAX : MR_COMM_SUM);
}

/* [b][t] <-> [rank][b][t_local] blocks of Tl rows (C elements each): one
 * strided copy per rank. */
static int permute(const struct mr_tp *tp, mr_act *dst, const mr_act *src, int to_ranks)
{
	struct mr_dev *d = tp->dev;
	int Tl = tp->T / tp->size, r, rc = 0;
	size_t blk = mr_dev_act_bytes(d, (size_t)Tl * tp->C);
	size_t row = mr_dev_act_bytes(d, (size_t)tp->T * tp->C);

	for (r = 0; r < tp->size && rc == 0; r++) {
		size_t full = (size_t)r * blk, rk = (size_t)r * tp->B * blk;
		if (to_ranks)
			rc = d->ops->copy2d(d, (char *)dst + rk, blk, (const char *)src + full, row,
					    blk, (size_t)tp->B);
		else
			rc = d->ops->copy2d(d, (char *)dst + full, row, (const char *)src + rk, blk,
					    blk, (size_t)tp->B);
	}
	return rc;
}

int mr_tp_reduce_rows(struct mr_tp *tp, mr_act *out, mr_act *partial)
{
	struct mr_dev *d = tp->dev;
	size_t NC = (size_t)tp->B * tp->T * tp->C;
	int rc;

	if (tp->size == 1)
		return out == partial ? 0 : d->ops->copy(d, out, partial, mr_dev_act_bytes(d, NC));
	if ((rc = mr_dev_comm_sync(d, tp->comm)) < 0)
		return rc;
	if (!tp->sp)
		return mr_comm_allreduce(tp->comm, partial, out, NC, act_dtype(tp), MR_COMM_SUM);
	if ((rc = permute(tp, tp->tmp, partial, 1)) < 0 || (rc = mr_dev_comm_sync(d, tp->comm)) < 0)
		return rc;
	return mr_comm_reduce_scatter(tp->comm, tp->tmp, out, NC / (size_t)tp->size,
				      act_dtype(tp), MR_COMM_SUM);
}

int mr_tp_gather_rows(struct mr_tp *tp, mr_act *full, const mr_act *local)
{
	struct mr_dev *d = tp->dev;
	size_t NC = (size_t)tp->B * tp->T * tp->C;
	int rc;

	if (!tp->sp)
		return full == local ? 0 : d->ops->copy(d, full, local, mr_dev_act_bytes(d, NC));
	if ((rc = mr_dev_comm_sync(d, tp->comm)) < 0)
		return rc;
	rc = mr_comm_allgather(tp->comm, local, tp->tmp, NC / (size_t)tp->size, act_dtype(tp));
	if (rc == 0)
		rc = permute(tp, full, tp->tmp, 0);
	return rc;
}

int mr_tp_row_linear_fwd(struct mr_tp *tp, mr_act *out, const mr_act *inp, const mr_act *w,
			 const mr_act *bias, int IC, mr_act *scratch)
{
	struct mr_dev *d = tp->dev;
	int N = tp->B * tp->T, rc;

	if (tp->size == 1)
		return d->ops->matmul_fwd(d, out, inp, w, bias, N, IC, tp->C);
	if ((rc = d->ops->matmul_fwd(d, scratch, inp, w, NULL, N, IC, tp->C)) < 0 ||
	    (rc = mr_tp_reduce_rows(tp, out, scratch)) < 0 || !bias)
		return rc;
	return d->ops->add_bias(d, out, bias, mr_tp_local_rows(tp), tp->C);
}

int mr_tp_norm_grads(struct mr_tp *tp, float *w, float *b, float **gw, float **gb)
{
	*gw = tp->sp ? tp->norm_g : w;
	*gb = tp->sp ? tp->norm_g + tp->C : b;
	return tp->sp ? tp->dev->ops->zero(tp->dev, tp->norm_g, 2 * sizeof(float) * (size_t)tp->C)
		      : 0;
}

int mr_tp_sp_norm_grads(struct mr_tp *tp, float *w, float *b)
{
	struct mr_dev *d = tp->dev;
	int rc;

	if (!tp->sp)
		return 0;
	if ((rc = mr_dev_comm_sync(d, tp->comm)) < 0 ||
	    (rc = mr_tp_allreduce(tp, tp->norm_g, 2 * (size_t)tp->C, 0)) < 0 ||
	    (rc = d->ops->add_f32(d, w, tp->norm_g, (size_t)tp->C)) < 0 || !b)
		return rc;
	return d->ops->add_f32(d, b, tp->norm_g + tp->C, (size_t)tp->C);
}

int mr_tp_kv_grads_begin(struct mr_tp *tp, float *g)
{
	struct mr_dev *d = tp->dev;
	size_t bytes = tp->kv_n * sizeof(float);
	int rc;

	if (!tp->kv)
		return 0;
	if ((rc = d->ops->copy(d, tp->kv_g, g, bytes)) < 0)
		return rc;
	return d->ops->zero(d, g, bytes);
}

int mr_tp_kv_grads_end(struct mr_tp *tp, float *g)
{
	struct mr_dev *d = tp->dev;
	int rc;

	if (!tp->kv)
		return 0;
	if ((rc = mr_dev_comm_sync(d, tp->kv)) < 0 ||
	    (rc = mr_comm_allreduce(tp->kv, g, g, tp->kv_n, MR_COMM_F32, MR_COMM_SUM)) < 0)
		return rc;
	return d->ops->add_f32(d, g, tp->kv_g, tp->kv_n);
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

int mr_tp_mask_vocab_pad(const struct mr_tp *tp, mr_act *logits, float value)
{
	int Vl = mr_tp_vocab_rows(tp), valid = tp->V - tp->rank * Vl;

	if (valid >= Vl)
		return 0;
	return tp->dev->ops->fill_cols(tp->dev, logits, tp->B * tp->T, Vl, valid > 0 ? valid : 0,
				       value);
}

/* Context parallel: the position rows of the local rows t in [t0, t1) of
 * every sequence (its two chunks at their global positions; under sp the
 * rank's slice of them) added to out, whose rows are those, or their
 * gradients from dout (full local rows) added to dwpe. */
static int cp_positions(struct mr_tp *tp, mr_act *out, const mr_act *wpe, float *dwpe,
			const mr_act *dout, const int *tok, const int *tok_host)
{
	struct mr_dev *d = tp->dev;
	int Tc = tp->T / 2, sp = out && tp->sp, n = sp ? tp->T / tp->size : tp->T;
	int t0 = sp ? tp->rank * n : 0, b, t, rc = 0;

	for (b = 0; b < tp->B && rc == 0; b++)
		for (t = t0; t < t0 + n && rc == 0;) {
			/* a run of rows inside one chunk */
			int k = t / Tc, len = (k + 1) * Tc < t0 + n ? (k + 1) * Tc - t : t0 + n - t;
			int p0 = mr_cp_pos0(tp->cp, Tc, tp->cp_rank, k) + t % Tc;
			size_t r = (size_t)b * n + (size_t)(t - t0), rf = (size_t)b * tp->T + t;
			if (out)
				rc = d->ops->add_pos(d, mr_dev_at(d, out, r * tp->C), wpe, len, tp->C,
						     len, p0);
			else
				rc = d->ops->embed_bwd(d, NULL, dwpe + (size_t)p0 * tp->C,
						       mr_dev_at(d, dout, rf * tp->C), tok + rf,
						       tok_host + rf, 1, len, tp->C);
			t += len;
		}
	return rc;
}

int mr_tp_embedding_fwd(struct mr_tp *tp, mr_act *out, const int *tok, const mr_act *wte,
			const mr_act *wpe, mr_act *scratch)
{
	struct mr_dev *d = tp->dev;
	int rc;

	/* wpe NULL: no learned positions (llama) */
	if (tp->size == 1 && (tp->cp > 1 || !wpe)) {
		if ((rc = d->ops->embed_fwd(d, out, tok, wte, NULL, tp->B, tp->T, tp->C)) < 0 ||
		    !wpe)
			return rc;
		return cp_positions(tp, out, wpe, NULL, NULL, NULL, NULL);
	}
	if (tp->size == 1)
		return d->ops->embed_fwd(d, out, tok, wte, wpe, tp->B, tp->T, tp->C);
	if ((rc = d->ops->embed_fwd(d, scratch, tok, wte, NULL, tp->B, tp->T, tp->C)) < 0 ||
	    (rc = mr_tp_reduce_rows(tp, out, scratch)) < 0 || !wpe)
		return rc;
	if (tp->cp > 1)
		return cp_positions(tp, out, wpe, NULL, NULL, NULL, NULL);
	/* the positions of the local rows: chunk rank of every sequence */
	return d->ops->add_pos(d, out, wpe, mr_tp_local_rows(tp), tp->C,
			       tp->sp ? tp->T / tp->size : tp->T,
			       tp->sp ? tp->rank * (tp->T / tp->size) : 0);
}

int mr_tp_embedding_bwd(struct mr_tp *tp, float *dwte, float *dwpe, mr_act *dlocal,
			const int *tok, const int *tok_host, mr_act *scratch)
{
	/* full rows: wte's slice from every token, wpe complete */
	mr_act *dfull = mr_tp_if_sp(tp, dlocal, scratch);
	int rc = mr_tp_gather_rows(tp, dfull, dlocal);

	if (rc < 0)
		return rc;
	if (tp->cp > 1 && dwpe) {
		if ((rc = tp->dev->ops->embed_bwd(tp->dev, dwte, NULL, dfull, tok, tok_host, tp->B,
						  tp->T, tp->C)) < 0)
			return rc;
		return cp_positions(tp, NULL, NULL, dwpe, dfull, tok, tok_host);
	}
	return tp->dev->ops->embed_bwd(tp->dev, dwte, dwpe, dfull, tok, tok_host, tp->B, tp->T,
				       tp->C);
}

int mr_tp_cross_entropy_fwd(struct mr_tp *tp, float *losses, float *lse,
			    const mr_act *logits, const int *tgt)
{
	struct mr_dev *d = tp->dev;
	int N = tp->B * tp->T, Vl = mr_tp_vocab_rows(tp), rc;
	float *mx = tp->ce, *sum, *tl;

	if (tp->size == 1)
		return d->ops->ce_fwd(d, losses, lse, logits, tgt, N, Vl);
	sum = mx + N;
	tl = sum + N;
	if ((rc = d->ops->ce_rowmax(d, mx, logits, N, Vl)) < 0 ||
	    (rc = mr_dev_comm_sync(d, tp->comm)) < 0 ||
	    (rc = mr_tp_allreduce(tp, mx, (size_t)N, 1)) < 0 ||
	    (rc = d->ops->ce_sumexp(d, sum, tl, logits, mx, tgt, N, Vl)) < 0 ||
	    (rc = mr_dev_comm_sync(d, tp->comm)) < 0)
		return rc;
	/* sums and target logits travel together: one all-reduce of 2N */
	if ((rc = mr_tp_allreduce(tp, sum, 2 * (size_t)N, 0)) < 0)
		return rc;
	return d->ops->ce_finish(d, losses, lse, mx, sum, tl, N);
}

int mr_tp_moe_reduce(void *ctx, float *buf, size_t n)
{
	struct mr_tp *tp = ctx;
	int rc = mr_dev_comm_sync(tp->dev, tp->comm);

	return rc < 0 ? rc : mr_tp_allreduce(tp, buf, n, 0);
}
