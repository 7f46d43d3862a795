/*
 * gpt.c - GPT forward and backward passes over the buffers of struct
 * mr_gpt (see mr_gpt.h). Each step is one kernel from kernels/ or one
 * OpenBLAS GEMM over all B*T rows at once.
 *
 * Tensor parallel (Megatron-LM's f/g pairs): a column-parallel GEMM reads
 * the full input rows (gathered from the sequence shards with sp) and
 * writes this rank's slice of outputs; a row-parallel GEMM writes a
 * partial (N,C) sum that is all-reduced (reduce-scattered with sp) before
 * its replicated bias and the residual add. Backward runs the conjugates:
 * the activation gradient entering a column-parallel GEMM's backward is a
 * partial sum and is reduced the same way. Replicated parameters get
 * identical gradients on every tp rank, except the LayerNorms under sp,
 * which see only local rows and are summed across tp at the end of their
 * unit. With tp == 1 every collective is skipped and the passes are the
 * single-rank ones.
 *
 * Non-goals: allocation and init (gpt_params.c), the optimizer (optim/).
 */
#include <string.h>

#include "gpt_int.h"
#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"

#define HOOK(m, fn, u)                                                   \
	((m)->hooks && (m)->hooks->fn ? (m)->hooks->fn((m)->hooks->ctx, (u)) : 0)

int mr_gpt_check_tokens(const int *tok, int n, int V, const char *what, struct mr_errbuf *eb)
{
	int i;

	for (i = 0; i < n; i++)
		if (tok[i] < 0 || tok[i] >= V)
			return mr_errf_field(eb, MR_ERANGE, what,
					     "%s token %d at position %d is outside [0, %d)", what,
					     tok[i], i, V);
	return 0;
}

/* rows (n,C) += bias (C) */
static void add_bias(float *rows, const float *bias, int n, int C)
{
	int i, c;

	for (i = 0; i < n; i++)
		for (c = 0; c < C; c++)
			rows[(size_t)i * C + c] += bias[c];
}

/* A row-parallel GEMM: out (Nl,C) = sum_tp(inp (N,IC) @ w^T) + bias. */
static int row_parallel_fwd(struct mr_gpt *m, float *out, const float *inp, const float *w,
			    const float *bias, int IC)
{
	int N = m->B * m->T, C = m->cfg.d_model, rc;

	if (m->par.tp == 1) {
		mr_matmul_fwd(m->pool, out, inp, w, bias, N, IC, C);
		return 0;
	}
	mr_matmul_fwd(m->pool, m->dln, inp, w, NULL, N, IC, C);
	if ((rc = mr__gpt_reduce_rows(m, out, m->dln)) < 0)
		return rc;
	add_bias(out, bias, mr__gpt_local_rows(m), C);
	return 0;
}

static int moe_fwd(struct mr_gpt *m, int l, float *out)
{
	const struct mr_gpt_layer_w *w = &m->w.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_moe_shape s = mr_gpt_moe_shape(m);
	float *y = m->par.tp == 1 ? out : m->dln;
	int rc;

	rc = mr_moe_fwd(m->pool, &s, &a->moe, &m->xchg, y, a->ln2, w->routerw, w->fcw, w->fcb,
			w->fcprojw, m->par.tp_rank == 0 ? w->fcprojb : NULL);
	if (rc == 0 && m->par.tp > 1)
		rc = mr__gpt_reduce_rows(m, out, m->dln);
	m->aux_loss += a->moe.aux;
	return rc;
}

/* One transformer block: res (Nl,C) in, a->res3 (Nl,C) out. */
static int block_fwd(struct mr_gpt *m, int l, const float *res)
{
	const struct mr_gpt_config *c = &m->cfg;
	const struct mr_gpt_layer_w *w = &m->w.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_pool *p = m->pool;
	int tp = m->par.tp, N = m->B * m->T, Nl = mr__gpt_local_rows(m);
	int C = c->d_model, Cl = C / tp, rc;
	float *lnout = m->par.sp ? m->dtmp : NULL;

	mr_layernorm_fwd(p, lnout ? lnout : a->ln1, a->ln1_mean, a->ln1_rstd, res, w->ln1w,
			 w->ln1b, Nl, C);
	if (lnout && (rc = mr__gpt_gather_rows(m, a->ln1, lnout)) < 0)
		return rc;
	mr_matmul_fwd(p, a->qkv, a->ln1, w->qkvw, w->qkvb, N, C, 3 * Cl);
	mr_attn_layer_fwd(p, a->atty, a->att_lse, a->qkv, m->B, m->T, Cl, c->n_head / tp,
			  m->k_ws);
	if ((rc = row_parallel_fwd(m, a->res2, a->atty, w->attprojw, w->attprojb, Cl)) < 0)
		return rc;
	mr_add_inplace(p, a->res2, res, (size_t)Nl * C);
	if ((rc = HOOK(m, pre_fwd, 2 * l + 2)) < 0)
		return rc;
	mr_layernorm_fwd(p, lnout ? lnout : a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w,
			 w->ln2b, Nl, C);
	if (lnout && (rc = mr__gpt_gather_rows(m, a->ln2, lnout)) < 0)
		return rc;
	if (mr_gpt_layer_is_moe(c, l)) {
		if ((rc = moe_fwd(m, l, a->res3)) < 0)
			return rc;
	} else {
		mr_matmul_fwd(p, a->fch, a->ln2, w->fcw, w->fcb, N, C, 4 * Cl);
		mr_gelu_fwd(p, a->fch_gelu, a->fch, (size_t)N * 4 * Cl);
		rc = row_parallel_fwd(m, a->res3, a->fch_gelu, w->fcprojw, w->fcprojb, 4 * Cl);
		if (rc < 0)
			return rc;
	}
	mr_add_inplace(p, a->res3, a->res2, (size_t)Nl * C);
	return 0;
}

/* encoded (Nl,C) = wte[tok] (vocab-parallel, summed over tp) + wpe[t]. */
static int encoder_fwd(struct mr_gpt *m)
{
	int B = m->B, T = m->T, C = m->cfg.d_model, Nl = mr__gpt_local_rows(m), i, c, rc;

	if (m->par.tp == 1) {
		mr_encoder_fwd(m->pool, m->encoded, m->inputs, m->w.wte, m->w.wpe, B, T, C);
		return 0;
	}
	mr_encoder_fwd(m->pool, m->dln, m->tok_tp, m->w.wte, NULL, B, T, C);
	if ((rc = mr__gpt_reduce_rows(m, m->encoded, m->dln)) < 0)
		return rc;
	for (i = 0; i < Nl; i++) {
		const float *pe = m->w.wpe + (size_t)mr__gpt_local_pos(m, i) * C;
		float *o = m->encoded + (size_t)i * C;
		for (c = 0; c < C; c++)
			o[c] += pe[c];
	}
	return 0;
}

static int forward(struct mr_gpt *m, int has_targets)
{
	const struct mr_gpt_config *c = &m->cfg;
	struct mr_pool *p = m->pool;
	int N = m->B * m->T, Nl = mr__gpt_local_rows(m), C = c->d_model;
	int Vl = mr__gpt_vocab_local_n(m), l, rc;
	const float *res;

	if ((rc = HOOK(m, pre_fwd, 0)) < 0 || (rc = encoder_fwd(m)) < 0)
		return rc;
	res = m->encoded;
	m->aux_loss = 0.0f;
	for (l = 0; l < c->n_layer; l++) {
		if ((rc = HOOK(m, pre_fwd, 2 * l + 1)) < 0 || (rc = block_fwd(m, l, res)) < 0)
			return rc;
		res = m->la[l].res3;
	}
	if ((rc = HOOK(m, pre_fwd, m->nunits - 1)) < 0)
		return rc;
	mr_layernorm_fwd(p, m->par.sp ? m->dtmp : m->lnf, m->lnf_mean, m->lnf_rstd, res,
			 m->w.lnfw, m->w.lnfb, Nl, C);
	if (m->par.sp && (rc = mr__gpt_gather_rows(m, m->lnf, m->dtmp)) < 0)
		return rc;
	mr_matmul_fwd(p, m->logits, m->lnf, m->w.wte, NULL, N, C, Vl);
	mr__gpt_mask_vocab_pad(m, -1e30f);
	if (!has_targets)
		return 0;
	if (m->par.tp == 1)
		mr_crossentropy_fwd(p, m->losses, m->ce_lse, m->logits, m->targets, N, Vl);
	else if ((rc = mr__gpt_ce_fwd_vp(m)) < 0)
		return rc;
	return 0;
}

int mr_gpt_forward(struct mr_gpt *m, const int *inputs, const int *targets,
		   struct mr_errbuf *eb)
{
	int N = m->B * m->T, V = m->cfg.vocab, i, rc;
	double sum = 0.0;

	rc = mr_gpt_check_tokens(inputs, N, V, "input", eb);
	if (rc == 0 && targets)
		rc = mr_gpt_check_tokens(targets, N, V, "target", eb);
	if (rc < 0)
		return rc;
	memcpy(m->inputs, inputs, sizeof(int) * (size_t)N);
	if (targets)
		memcpy(m->targets, targets, sizeof(int) * (size_t)N);
	if (m->par.tp > 1) {
		mr__gpt_vocab_local(m, m->tok_tp, m->inputs, N);
		if (targets)
			mr__gpt_vocab_local(m, m->tgt_tp, m->targets, N);
	}
	rc = forward(m, targets != NULL);
	if (rc < 0)
		return mr_errf(eb, rc, "forward pass failed: %s", mr_strerror(rc));
	if (!targets) {
		m->loss = 0.0f;
		return 0;
	}
	for (i = 0; i < N; i++)
		sum += m->losses[i];
	m->loss = (float)(sum / N);
	return 0;
}

void mr_gpt_zero_grad(struct mr_gpt *m)
{
	if (m->grads)
		memset(m->grads, 0, sizeof(float) * m->nparams);
}

/* Sums a unit's LayerNorm gradients over tp (sp: each rank saw its rows). */
static int ln_grads_allreduce(struct mr_gpt *m, float *w, float *b)
{
	int C = m->cfg.d_model, rc;

	if (!m->par.sp)
		return 0;
	if ((rc = mr__gpt_tp_allreduce(m, w, (size_t)C, 0)) < 0)
		return rc;
	return mr__gpt_tp_allreduce(m, b, (size_t)C, 0);
}

/* d(res3) in m->dres (Nl,C) -> d(res of the block) in m->dres. */
static int block_bwd(struct mr_gpt *m, int l, const float *res, float dscale)
{
	const struct mr_gpt_config *c = &m->cfg;
	const struct mr_gpt_layer_w *w = &m->w.layer[l];
	const struct mr_gpt_layer_w *g = &m->g.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_pool *p = m->pool;
	int tp = m->par.tp, N = m->B * m->T, Nl = mr__gpt_local_rows(m);
	int C = c->d_model, Cl = C / tp, rc;
	float *dfull = m->par.sp ? m->sp_full : m->dres;
	float *dlocal = m->par.sp ? m->dtmp : m->dln;

	/* the MLP branch (unit 2l+2): dres = d(res3) */
	if ((rc = HOOK(m, pre_bwd, 2 * l + 2)) < 0 ||
	    (rc = mr__gpt_gather_rows(m, dfull, m->dres)) < 0)
		return rc;
	if (mr_gpt_layer_is_moe(c, l)) {
		struct mr_moe_shape s = mr_gpt_moe_shape(m);
		rc = mr_moe_bwd(p, &s, &a->moe, &m->xchg, m->dln, dfull, a->ln2, w->routerw,
				w->fcw, w->fcprojw, g->routerw, g->fcw, g->fcb, g->fcprojw,
				g->fcprojb, c->aux_coef * dscale, m->k_ws, m->ones);
		if (rc < 0)
			return rc;
	} else {
		mr_matmul_bwd(p, m->dfch, g->fcprojw, g->fcprojb, dfull, a->fch_gelu, w->fcprojw, N,
			      4 * Cl, C, 0, m->ones);
		mr_gelu_bwd(p, m->dfch, a->fch, m->dfch, (size_t)N * 4 * Cl);
		mr_matmul_bwd(p, m->dln, g->fcw, g->fcb, m->dfch, a->ln2, w->fcw, N, C, 4 * Cl, 0,
			      m->ones);
	}
	if ((rc = mr__gpt_reduce_rows(m, dlocal, m->dln)) < 0)
		return rc;
	mr_layernorm_bwd(p, m->dres, g->ln2w, g->ln2b, dlocal, a->res2, w->ln2w, a->ln2_mean,
			 a->ln2_rstd, Nl, C, m->k_ws);
	if ((rc = ln_grads_allreduce(m, g->ln2w, g->ln2b)) < 0 ||
	    (rc = HOOK(m, post_bwd, 2 * l + 2)) < 0)
		return rc;
	/* the attention branch (unit 2l+1): dres = d(res2) */
	if ((rc = HOOK(m, pre_bwd, 2 * l + 1)) < 0 ||
	    (rc = mr__gpt_gather_rows(m, dfull, m->dres)) < 0)
		return rc;
	mr_matmul_bwd(p, m->datty, g->attprojw, g->attprojb, dfull, a->atty, w->attprojw, N, Cl,
		      C, 0, m->ones);
	mr_attn_layer_bwd(p, m->dqkv, m->datty, a->qkv, a->atty, a->att_lse, m->B, m->T, Cl,
			  c->n_head / tp, m->k_ws);
	mr_matmul_bwd(p, m->dln, g->qkvw, g->qkvb, m->dqkv, a->ln1, w->qkvw, N, C, 3 * Cl, 0,
		      m->ones);
	if ((rc = mr__gpt_reduce_rows(m, dlocal, m->dln)) < 0)
		return rc;
	mr_layernorm_bwd(p, m->dres, g->ln1w, g->ln1b, dlocal, res, w->ln1w, a->ln1_mean,
			 a->ln1_rstd, Nl, C, m->k_ws);
	if ((rc = ln_grads_allreduce(m, g->ln1w, g->ln1b)) < 0)
		return rc;
	return HOOK(m, post_bwd, 2 * l + 1);
}

static int backward(struct mr_gpt *m, float dscale)
{
	const struct mr_gpt_config *c = &m->cfg;
	struct mr_pool *p = m->pool;
	int N = m->B * m->T, Nl = mr__gpt_local_rows(m), C = c->d_model, L = c->n_layer;
	int Vl = mr__gpt_vocab_local_n(m), last = m->nunits - 1, l, rc;
	const float *res_last = m->la[L - 1].res3;
	float *dlocal = m->par.sp ? m->dtmp : m->dln;

	if ((rc = HOOK(m, pre_bwd, last)) < 0)
		return rc;
	mr_crossentropy_bwd_inplace(p, m->logits, m->ce_lse,
				    m->par.tp == 1 ? m->targets : m->tgt_tp, N, Vl,
				    dscale / (float)N);
	mr__gpt_mask_vocab_pad(m, 0.0f);
	mr_matmul_bwd(p, m->dln, m->g.wte, NULL, m->logits, m->lnf, m->w.wte, N, C, Vl, 0,
		      m->ones);
	if ((rc = mr__gpt_reduce_rows(m, dlocal, m->dln)) < 0)
		return rc;
	memset(m->dres, 0, sizeof(float) * (size_t)Nl * C);
	mr_layernorm_bwd(p, m->dres, m->g.lnfw, m->g.lnfb, dlocal, res_last, m->w.lnfw,
			 m->lnf_mean, m->lnf_rstd, Nl, C, m->k_ws);
	if ((rc = ln_grads_allreduce(m, m->g.lnfw, m->g.lnfb)) < 0 ||
	    (rc = HOOK(m, post_bwd, last)) < 0)
		return rc;
	for (l = L - 1; l >= 0; l--) {
		const float *res = l == 0 ? m->encoded : m->la[l - 1].res3;
		if ((rc = block_bwd(m, l, res, dscale)) < 0)
			return rc;
	}
	if ((rc = HOOK(m, pre_bwd, 0)) < 0)
		return rc;
	if (m->par.tp == 1) {
		mr_encoder_bwd(p, m->g.wte, m->g.wpe, m->dres, m->inputs, m->B, m->T, C);
	} else {
		/* full rows: wte's slice from every token, wpe complete */
		float *dfull = m->par.sp ? m->sp_full : m->dres;
		if ((rc = mr__gpt_gather_rows(m, dfull, m->dres)) < 0)
			return rc;
		mr_encoder_bwd(p, m->g.wte, m->g.wpe, dfull, m->tok_tp, m->B, m->T, C);
	}
	return HOOK(m, post_bwd, 0);
}

int mr_gpt_backward(struct mr_gpt *m, float dscale)
{
	return backward(m, dscale);
}
