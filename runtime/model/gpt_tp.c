/*
 * gpt_tp.c - the collectives of tensor and sequence parallelism (see
 * gpt_int.h): row reductions and gathers with the sequence permutation,
 * vocabulary-local token ids and the vocab-parallel cross-entropy.
 *
 * Sequence order: an all-gather of the ranks' local rows arrives as
 * [rank][b][t_local]; the model works in [b][t], so gathers permute after
 * the collective and reduce-scatters permute before it (one strided copy).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mr_comm.h"
#include "gpt_int.h"
#include "kernels/mr_kernels.h"

int mr__gpt_local_rows(const struct mr_gpt *m)
{
	return m->par.sp ? m->B * m->T / m->par.tp : m->B * m->T;
}

int mr__gpt_local_pos(const struct mr_gpt *m, int i)
{
	int Tl;

	if (!m->par.sp)
		return i % m->T;
	Tl = m->T / m->par.tp;
	return m->par.tp_rank * Tl + i % Tl;
}

int mr__gpt_tp_allreduce(struct mr_gpt *m, float *buf, size_t n, int max)
{
	if (m->par.tp == 1 || n == 0)
		return 0;
	return mr_comm_allreduce(m->par.tp_comm, buf, buf, n, MR_COMM_F32,
				 max ? MR_COMM_MAX : MR_COMM_SUM);
}

/* [b][t] <-> [rank][b][t_local] row blocks of C floats. */
static void permute(const struct mr_gpt *m, float *dst, const float *src, int to_ranks)
{
	int tp = m->par.tp, Tl = m->T / tp, r, b;
	size_t C = (size_t)m->cfg.d_model, blk = (size_t)Tl * C;

	for (r = 0; r < tp; r++)
		for (b = 0; b < m->B; b++) {
			size_t full = ((size_t)b * m->T + (size_t)r * Tl) * C;
			size_t rk = ((size_t)r * m->B + b) * blk;
			if (to_ranks)
				memcpy(dst + rk, src + full, blk * sizeof(float));
			else
				memcpy(dst + full, src + rk, blk * sizeof(float));
		}
}

int mr__gpt_reduce_rows(struct mr_gpt *m, float *out, float *partial)
{
	size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model;

	if (m->par.tp == 1) {
		if (out != partial)
			memcpy(out, partial, N * C * sizeof(float));
		return 0;
	}
	if (!m->par.sp)
		return mr_comm_allreduce(m->par.tp_comm, partial, out, N * C, MR_COMM_F32,
					 MR_COMM_SUM);
	permute(m, m->sp_tmp, partial, 1);
	return mr_comm_reduce_scatter(m->par.tp_comm, m->sp_tmp, out, N * C / (size_t)m->par.tp,
				      MR_COMM_F32, MR_COMM_SUM);
}

int mr__gpt_gather_rows(struct mr_gpt *m, float *full, const float *local)
{
	size_t N = (size_t)m->B * m->T, C = (size_t)m->cfg.d_model;
	int rc;

	if (!m->par.sp) {
		if (full != local)
			memcpy(full, local, N * C * sizeof(float));
		return 0;
	}
	rc = mr_comm_allgather(m->par.tp_comm, local, m->sp_tmp, N * C / (size_t)m->par.tp,
			       MR_COMM_F32);
	if (rc == 0)
		permute(m, full, m->sp_tmp, 0);
	return rc;
}

int mr__gpt_vocab_local_n(const struct mr_gpt *m)
{
	return (m->cfg.vocab + m->par.tp - 1) / m->par.tp;
}

void mr__gpt_mask_vocab_pad(struct mr_gpt *m, float value)
{
	int N = m->B * m->T, Vl = mr__gpt_vocab_local_n(m), lo = m->par.tp_rank * Vl;
	int valid = m->cfg.vocab - lo, i, v;

	if (valid >= Vl)
		return;
	if (valid < 0)
		valid = 0;
	for (i = 0; i < N; i++)
		for (v = valid; v < Vl; v++)
			m->logits[(size_t)i * Vl + v] = value;
}

void mr__gpt_vocab_local(const struct mr_gpt *m, int *out, const int *tok, int n)
{
	int Vl = mr__gpt_vocab_local_n(m), lo = m->par.tp_rank * Vl, i;

	for (i = 0; i < n; i++)
		out[i] = tok[i] >= lo && tok[i] < lo + Vl ? tok[i] - lo : -1;
}

int mr__gpt_ce_fwd_vp(struct mr_gpt *m)
{
	int N = m->B * m->T, Vl = mr__gpt_vocab_local_n(m), i, rc;
	float *mx = m->sp_tmp, *sum = mx + N, *tl = sum + N;

	mr_crossentropy_rowmax(m->pool, mx, m->logits, N, Vl);
	if ((rc = mr__gpt_tp_allreduce(m, mx, (size_t)N, 1)) < 0)
		return rc;
	mr_crossentropy_sumexp(m->pool, sum, tl, m->logits, mx, m->tgt_tp, N, Vl);
	/* sums and target logits travel together: one all-reduce of 2N */
	if ((rc = mr__gpt_tp_allreduce(m, sum, 2 * (size_t)N, 0)) < 0)
		return rc;
	for (i = 0; i < N; i++) {
		m->ce_lse[i] = mx[i] + logf(sum[i] > 0.0f ? sum[i] : 1.0f);
		m->losses[i] = m->ce_lse[i] - tl[i];
	}
	return 0;
}

int mr__gpt_moe_reduce(void *ctx, float *buf, size_t n)
{
	return mr__gpt_tp_allreduce(ctx, buf, n, 0);
}

size_t mr_gpt_full_nparams(const struct mr_gpt *m)
{
	size_t n = 0;
	int i;

	for (i = 0; i < m->ntensors; i++)
		n += mr_gpt_tensor_full_n(&m->tensors[i]);
	return n;
}

int mr_gpt_gather_full(const struct mr_gpt *m, const float *local, float **full)
{
	int tp = m->par.tp, r = m->par.tp_rank, i, q, rc = 0;
	size_t off = 0, most = 0;
	float *buf = NULL, *out = NULL;

	*full = NULL;
	for (i = 0; i < m->ntensors; i++)
		if (m->tensors[i].n > most)
			most = m->tensors[i].n;
	if (r == 0 && !(out = malloc(sizeof(float) * mr_gpt_full_nparams(m))))
		rc = MR_ENOMEM;
	if (tp > 1 && !(buf = malloc(sizeof(float) * most * (size_t)tp)))
		rc = MR_ENOMEM;
	/* a local failure stops this rank; its peers get the communicator's
	 * timeout (or abort) on their next all-gather */
	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		const float *src = local + t->off;
		if (tp > 1) {
			int crc = buf ? mr_comm_allgather(m->par.tp_comm, src, buf, t->n,
							  MR_COMM_F32)
				      : MR_ENOMEM;
			if (crc < 0) {
				rc = crc;
				break;
			}
		}
		if (out && rc == 0)
			for (q = 0; q < tp; q++)
				mr_gpt_tensor_slice(t, tp, q, out + off,
						    tp > 1 ? buf + (size_t)q * t->n : (float *)src, 1);
		off += mr_gpt_tensor_full_n(t);
	}
	free(buf);
	if (rc < 0) {
		free(out);
		return rc;
	}
	*full = out;
	return 0;
}
