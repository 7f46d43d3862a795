/*
 * gpt.c - GPT forward and backward passes over the buffers of struct
 * mr_gpt (see mr_gpt.h). Each step is one kernel from kernels/ or one
 * OpenBLAS GEMM over all B*T rows at once.
 *
 * Tensor and sequence parallelism are layers from parallel/mr_tp.h that
 * the passes call unconditionally (each the single-rank operation with one
 * tp rank): a column-parallel GEMM reads the full input rows (gathered
 * from the sequence shards with sp) and writes this rank's slice of
 * outputs; a row-parallel GEMM's partial (N,C) sum is reduced before its
 * replicated bias and the residual add; the embedding and the loss are
 * vocab-parallel. Backward runs the conjugates: the activation gradient
 * entering a column-parallel GEMM's backward is a partial sum and is
 * reduced the same way; LayerNorm gradients under sp are summed over tp
 * at the end of their unit.
 *
 * Non-goals: allocation and init (gpt_params.c), the optimizer (optim/).
 */
#include <string.h>

#include "gpt_int.h"
#include "kernels/mr_attention.h"
#include "kernels/mr_kernels.h"
#include "parallel/mr_tp.h"

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

static int moe_fwd(struct mr_gpt *m, int l, float *out)
{
	const struct mr_gpt_layer_w *w = &m->w.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_moe_shape s = mr_gpt_moe_shape(m);
	float *y = mr_tp_if_split(&m->tp, out, m->dln);
	int rc;

	/* row-parallel experts: the bias once, on tp rank 0, before the sum */
	rc = mr_moe_fwd(m->pool, &s, &a->moe, &m->xchg, y, a->ln2, w->routerw, w->fcw, w->fcb,
			w->fcprojw, m->tp.rank == 0 ? w->fcprojb : NULL);
	if (rc == 0)
		rc = mr_tp_reduce_rows(&m->tp, out, y);
	m->aux_loss += a->moe.aux;
	return rc;
}

/* LayerNorm of the local rows into full (N,C) rows for a column-parallel
 * GEMM (sp: gathered; else written in place). */
static int norm_for_gemm(struct mr_gpt *m, float *full, float *mean, float *rstd,
			 const float *res, const float *w, const float *b)
{
	float *local = mr_tp_if_sp(&m->tp, full, m->dtmp);

	mr_layernorm_fwd(m->pool, local, mean, rstd, res, w, b, mr_tp_local_rows(&m->tp),
			 m->cfg.d_model);
	return mr_tp_gather_rows(&m->tp, full, local);
}

/* One transformer block: res (Nl,C) in, a->res3 (Nl,C) out. */
static int block_fwd(struct mr_gpt *m, int l, const float *res)
{
	const struct mr_gpt_config *c = &m->cfg;
	const struct mr_gpt_layer_w *w = &m->w.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_pool *p = m->pool;
	int tp = m->tp.size, N = m->B * m->T, Nl = mr_tp_local_rows(&m->tp);
	int C = c->d_model, Cl = C / tp, rc;

	if ((rc = norm_for_gemm(m, a->ln1, a->ln1_mean, a->ln1_rstd, res, w->ln1w, w->ln1b)) < 0)
		return rc;
	mr_matmul_fwd(p, a->qkv, a->ln1, w->qkvw, w->qkvb, N, C, 3 * Cl);
	mr_attn_layer_fwd(p, a->atty, a->att_lse, a->qkv, m->B, m->T, Cl, c->n_head / tp,
			  m->k_ws);
	rc = mr_tp_row_linear_fwd(&m->tp, p, a->res2, a->atty, w->attprojw, w->attprojb, Cl,
				  m->dln);
	if (rc < 0)
		return rc;
	mr_add_inplace(p, a->res2, res, (size_t)Nl * C);
	if ((rc = HOOK(m, pre_fwd, 2 * l + 2)) < 0 ||
	    (rc = norm_for_gemm(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, w->ln2w,
				w->ln2b)) < 0)
		return rc;
	if (mr_gpt_layer_is_moe(c, l)) {
		if ((rc = moe_fwd(m, l, a->res3)) < 0)
			return rc;
	} else {
		mr_matmul_fwd(p, a->fch, a->ln2, w->fcw, w->fcb, N, C, 4 * Cl);
		mr_gelu_fwd(p, a->fch_gelu, a->fch, (size_t)N * 4 * Cl);
		rc = mr_tp_row_linear_fwd(&m->tp, p, a->res3, a->fch_gelu, w->fcprojw, w->fcprojb,
					  4 * Cl, m->dln);
		if (rc < 0)
			return rc;
	}
	mr_add_inplace(p, a->res3, a->res2, (size_t)Nl * C);
	return 0;
}

static int forward(struct mr_gpt *m, int has_targets)
{
	const struct mr_gpt_config *c = &m->cfg;
	struct mr_pool *p = m->pool;
	int N = m->B * m->T, C = c->d_model, Vl = mr_tp_vocab_rows(&m->tp), l, rc;
	const float *res;

	if ((rc = HOOK(m, pre_fwd, 0)) < 0 ||
	    (rc = mr_tp_embedding_fwd(&m->tp, p, m->encoded, m->tok_local, m->w.wte, m->w.wpe,
				      m->dln)) < 0)
		return rc;
	res = m->encoded;
	m->aux_loss = 0.0f;
	for (l = 0; l < c->n_layer; l++) {
		if ((rc = HOOK(m, pre_fwd, 2 * l + 1)) < 0 || (rc = block_fwd(m, l, res)) < 0)
			return rc;
		res = m->la[l].res3;
	}
	if ((rc = HOOK(m, pre_fwd, m->nunits - 1)) < 0 ||
	    (rc = norm_for_gemm(m, m->lnf, m->lnf_mean, m->lnf_rstd, res, m->w.lnfw,
				m->w.lnfb)) < 0)
		return rc;
	/* the LM head: column-parallel over the vocabulary */
	mr_matmul_fwd(p, m->logits, m->lnf, m->w.wte, NULL, N, C, Vl);
	mr_tp_mask_vocab_pad(&m->tp, m->logits, -1e30f);
	if (!has_targets)
		return 0;
	return mr_tp_cross_entropy_fwd(&m->tp, p, m->losses, m->ce_lse, m->logits,
				       m->tgt_local);
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
	m->tok_local = mr_tp_vocab_ids(&m->tp, m->tok_tp, m->inputs, N);
	m->tgt_local = targets ? mr_tp_vocab_ids(&m->tp, m->tgt_tp, m->targets, N) : NULL;
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

/*
 * Backward of a column-parallel GEMM's input: m->dln holds this rank's
 * partial (N,C) gradient of the LayerNorm output; summed over tp into the
 * local rows and through the LayerNorm into m->dres (added).
 */
static int norm_bwd(struct mr_gpt *m, float *gw, float *gb, const float *res, const float *w,
		    const float *mean, const float *rstd)
{
	float *dlocal = mr_tp_if_sp(&m->tp, m->dln, m->dtmp);
	int rc = mr_tp_reduce_rows(&m->tp, dlocal, m->dln);

	if (rc < 0)
		return rc;
	mr_layernorm_bwd(m->pool, m->dres, gw, gb, dlocal, res, w, mean, rstd,
			 mr_tp_local_rows(&m->tp), m->cfg.d_model, m->k_ws);
	return mr_tp_sp_norm_grads(&m->tp, gw, gb);
}

/* d(res3) in m->dres (Nl,C) -> d(res of the block) in m->dres. */
static int block_bwd(struct mr_gpt *m, int l, const float *res, float dscale)
{
	const struct mr_gpt_config *c = &m->cfg;
	const struct mr_gpt_layer_w *w = &m->w.layer[l];
	const struct mr_gpt_layer_w *g = &m->g.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_pool *p = m->pool;
	int tp = m->tp.size, N = m->B * m->T, C = c->d_model, Cl = C / tp, rc;
	float *dfull = mr_tp_if_sp(&m->tp, m->dres, m->sp_full);

	/* the MLP branch (unit 2l+2): dres = d(res3) */
	if ((rc = HOOK(m, pre_bwd, 2 * l + 2)) < 0 ||
	    (rc = mr_tp_gather_rows(&m->tp, dfull, m->dres)) < 0)
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
	if ((rc = norm_bwd(m, g->ln2w, g->ln2b, a->res2, w->ln2w, a->ln2_mean, a->ln2_rstd)) < 0 ||
	    (rc = HOOK(m, post_bwd, 2 * l + 2)) < 0)
		return rc;
	/* the attention branch (unit 2l+1): dres = d(res2) */
	if ((rc = HOOK(m, pre_bwd, 2 * l + 1)) < 0 ||
	    (rc = mr_tp_gather_rows(&m->tp, dfull, m->dres)) < 0)
		return rc;
	mr_matmul_bwd(p, m->datty, g->attprojw, g->attprojb, dfull, a->atty, w->attprojw, N, Cl,
		      C, 0, m->ones);
	mr_attn_layer_bwd(p, m->dqkv, m->datty, a->qkv, a->atty, a->att_lse, m->B, m->T, Cl,
			  c->n_head / tp, m->k_ws);
	mr_matmul_bwd(p, m->dln, g->qkvw, g->qkvb, m->dqkv, a->ln1, w->qkvw, N, C, 3 * Cl, 0,
		      m->ones);
	if ((rc = norm_bwd(m, g->ln1w, g->ln1b, res, w->ln1w, a->ln1_mean, a->ln1_rstd)) < 0)
		return rc;
	return HOOK(m, post_bwd, 2 * l + 1);
}

static int backward(struct mr_gpt *m, float dscale)
{
	const struct mr_gpt_config *c = &m->cfg;
	struct mr_pool *p = m->pool;
	int N = m->B * m->T, Nl = mr_tp_local_rows(&m->tp), C = c->d_model, L = c->n_layer;
	int Vl = mr_tp_vocab_rows(&m->tp), last = m->nunits - 1, l, rc;

	if ((rc = HOOK(m, pre_bwd, last)) < 0)
		return rc;
	mr_crossentropy_bwd_inplace(p, m->logits, m->ce_lse, m->tgt_local, N, Vl,
				    dscale / (float)N);
	mr_tp_mask_vocab_pad(&m->tp, m->logits, 0.0f);
	mr_matmul_bwd(p, m->dln, m->g.wte, NULL, m->logits, m->lnf, m->w.wte, N, C, Vl, 0,
		      m->ones);
	memset(m->dres, 0, sizeof(float) * (size_t)Nl * C);
	if ((rc = norm_bwd(m, m->g.lnfw, m->g.lnfb, m->la[L - 1].res3, m->w.lnfw, m->lnf_mean,
			   m->lnf_rstd)) < 0 ||
	    (rc = HOOK(m, post_bwd, last)) < 0)
		return rc;
	for (l = L - 1; l >= 0; l--) {
		const float *res = l == 0 ? m->encoded : m->la[l - 1].res3;
		if ((rc = block_bwd(m, l, res, dscale)) < 0)
			return rc;
	}
	if ((rc = HOOK(m, pre_bwd, 0)) < 0 ||
	    (rc = mr_tp_embedding_bwd(&m->tp, p, m->g.wte, m->g.wpe, m->dres, m->tok_local,
				      m->sp_full)) < 0)
		return rc;
	return HOOK(m, post_bwd, 0);
}

int mr_gpt_backward(struct mr_gpt *m, float dscale)
{
	return backward(m, dscale);
}
