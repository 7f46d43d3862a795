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

int mr_gpt_set_batch(struct mr_gpt *m, const int *inputs, const int *targets,
		     struct mr_errbuf *eb)
{
	int N = m->B * m->T, V = m->cfg.vocab, rc = 0;

	if (inputs && (rc = mr_gpt_check_tokens(inputs, N, V, "input", eb)) < 0)
		return rc;
	if (targets && (rc = mr_gpt_check_tokens(targets, N, V, "target", eb)) < 0)
		return rc;
	if (inputs) {
		memcpy(m->inputs, inputs, sizeof(int) * (size_t)N);
		m->tok_local = mr_tp_vocab_ids(&m->tp, m->tok_tp, m->inputs, N);
	}
	m->tgt_local = NULL;
	if (targets) {
		memcpy(m->targets, targets, sizeof(int) * (size_t)N);
		m->tgt_local = mr_tp_vocab_ids(&m->tp, m->tgt_tp, m->targets, N);
	}
	return 0;
}

int mr_gpt_embed_fwd(struct mr_gpt *m)
{
	int rc = HOOK(m, pre_fwd, 0);

	m->aux_loss = 0.0f;
	if (rc < 0)
		return rc;
	return mr_tp_embedding_fwd(&m->tp, m->pool, m->encoded, m->tok_local, m->w.wte, m->w.wpe,
				   m->dln);
}

int mr_gpt_blocks_fwd(struct mr_gpt *m, int lo, int hi, const float *in)
{
	const float *res = in;
	int l, rc;

	for (l = lo; l < hi; l++) {
		if ((rc = HOOK(m, pre_fwd, 2 * l + 1)) < 0 || (rc = block_fwd(m, l, res)) < 0)
			return rc;
		res = m->la[l].res3;
	}
	return 0;
}

int mr_gpt_head_fwd(struct mr_gpt *m, const float *in)
{
	const struct mr_gpt_config *c = &m->cfg;
	struct mr_pool *p = m->pool;
	int N = m->B * m->T, Vl = mr_tp_vocab_rows(&m->tp), i, rc;
	double sum = 0.0;

	m->loss = 0.0f;
	if ((rc = HOOK(m, pre_fwd, m->nunits - 1)) < 0 ||
	    (rc = norm_for_gemm(m, m->lnf, m->lnf_mean, m->lnf_rstd, in, m->w.lnfw,
				m->w.lnfb)) < 0)
		return rc;
	/* the LM head: column-parallel over the vocabulary */
	mr_matmul_fwd(p, m->logits, m->lnf, m->w.wte, NULL, N, c->d_model, Vl);
	mr_tp_mask_vocab_pad(&m->tp, m->logits, -1e30f);
	if (!m->tgt_local)
		return 0;
	rc = mr_tp_cross_entropy_fwd(&m->tp, p, m->losses, m->ce_lse, m->logits, m->tgt_local);
	if (rc < 0)
		return rc;
	for (i = 0; i < N; i++)
		sum += m->losses[i];
	m->loss = (float)(sum / N);
	return 0;
}

int mr_gpt_forward(struct mr_gpt *m, const int *inputs, const int *targets,
		   struct mr_errbuf *eb)
{
	int L = m->cfg.n_layer, rc = mr_gpt_set_batch(m, inputs, targets, eb);

	if (rc < 0)
		return rc;
	if ((rc = mr_gpt_embed_fwd(m)) < 0 || (rc = mr_gpt_blocks_fwd(m, 0, L, m->encoded)) < 0 ||
	    (rc = mr_gpt_head_fwd(m, m->la[L - 1].res3)) < 0)
		return mr_errf(eb, rc, "forward pass failed: %s", mr_strerror(rc));
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

/*
 * A block's backward, d(res3) in m->dres (Nl,C) -> d(res of the block) in
 * m->dres. phase MR_GPT_BWD_ALL does it in one pass; MR_GPT_BWD_INPUT
 * does everything but the four dense GEMMs' weight and bias gradients,
 * keeping their output gradients in the layer's stash, and
 * MR_GPT_BWD_WEIGHT adds those from the stash later (a zero-bubble
 * pipeline schedule runs it when a stage would idle). A MoE MLP's whole
 * backward runs in the input phase. Hooks: the input phase calls the
 * layer's pre_bwd (it reads the parameters), the weight phase its
 * post_bwd (the gradients are complete only then).
 */
static int block_bwd(struct mr_gpt *m, int l, const float *res, float dscale, int phase)
{
	const struct mr_gpt_config *c = &m->cfg;
	const struct mr_gpt_layer_w *w = &m->w.layer[l];
	const struct mr_gpt_layer_w *g = &m->g.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_gpt_layer_stash *st = m->stash ? &m->stash[l] : NULL;
	struct mr_pool *p = m->pool;
	int tp = m->tp.size, N = m->B * m->T, C = c->d_model, Cl = C / tp, rc;
	int moe = mr_gpt_layer_is_moe(c, l), all = phase == MR_GPT_BWD_ALL;
	float *dfull = mr_tp_if_sp(&m->tp, m->dres, m->sp_full);
	/* the output gradients the weight phase needs: scratch when fused */
	float *dproj2 = all ? dfull : st->dproj2, *dfc = all ? m->dfch : st->dfc;
	float *dproj1 = all ? dfull : st->dproj1, *dqkv = all ? m->dqkv : st->dqkv;

	if (phase == MR_GPT_BWD_WEIGHT) {
		if (!moe) {
			mr_matmul_bwd(p, NULL, g->fcprojw, g->fcprojb, st->dproj2, a->fch_gelu,
				      w->fcprojw, N, 4 * Cl, C, 0, m->ones);
			mr_matmul_bwd(p, NULL, g->fcw, g->fcb, st->dfc, a->ln2, w->fcw, N, C, 4 * Cl,
				      0, m->ones);
		}
		if ((rc = HOOK(m, post_bwd, 2 * l + 2)) < 0)
			return rc;
		mr_matmul_bwd(p, NULL, g->attprojw, g->attprojb, st->dproj1, a->atty, w->attprojw,
			      N, Cl, C, 0, m->ones);
		mr_matmul_bwd(p, NULL, g->qkvw, g->qkvb, st->dqkv, a->ln1, w->qkvw, N, C, 3 * Cl, 0,
			      m->ones);
		return HOOK(m, post_bwd, 2 * l + 1);
	}
	/* the MLP branch (unit 2l+2): dres = d(res3) */
	if ((rc = HOOK(m, pre_bwd, 2 * l + 2)) < 0 ||
	    (rc = mr_tp_gather_rows(&m->tp, dfull, m->dres)) < 0)
		return rc;
	if (moe) {
		struct mr_moe_shape s = mr_gpt_moe_shape(m);
		rc = mr_moe_bwd(p, &s, &a->moe, &m->xchg, m->dln, dfull, a->ln2, w->routerw,
				w->fcw, w->fcprojw, g->routerw, g->fcw, g->fcb, g->fcprojw,
				g->fcprojb, c->aux_coef * dscale, m->k_ws, m->ones);
		if (rc < 0)
			return rc;
	} else {
		if (dproj2 != dfull)
			memcpy(dproj2, dfull, sizeof(float) * (size_t)N * C);
		mr_matmul_bwd(p, dfc, all ? g->fcprojw : NULL, all ? g->fcprojb : NULL, dfull,
			      a->fch_gelu, w->fcprojw, N, 4 * Cl, C, 0, m->ones);
		mr_gelu_bwd(p, dfc, a->fch, dfc, (size_t)N * 4 * Cl);
		mr_matmul_bwd(p, m->dln, all ? g->fcw : NULL, all ? g->fcb : NULL, dfc, a->ln2,
			      w->fcw, N, C, 4 * Cl, 0, m->ones);
	}
	if ((rc = norm_bwd(m, g->ln2w, g->ln2b, a->res2, w->ln2w, a->ln2_mean, a->ln2_rstd)) < 0 ||
	    (all && (rc = HOOK(m, post_bwd, 2 * l + 2)) < 0))
		return rc;
	/* the attention branch (unit 2l+1): dres = d(res2) */
	if ((rc = HOOK(m, pre_bwd, 2 * l + 1)) < 0 ||
	    (rc = mr_tp_gather_rows(&m->tp, dfull, m->dres)) < 0)
		return rc;
	if (dproj1 != dfull)
		memcpy(dproj1, dfull, sizeof(float) * (size_t)N * C);
	mr_matmul_bwd(p, m->datty, all ? g->attprojw : NULL, all ? g->attprojb : NULL, dfull,
		      a->atty, w->attprojw, N, Cl, C, 0, m->ones);
	mr_attn_layer_bwd(p, dqkv, m->datty, a->qkv, a->atty, a->att_lse, m->B, m->T, Cl,
			  c->n_head / tp, m->k_ws);
	mr_matmul_bwd(p, m->dln, all ? g->qkvw : NULL, all ? g->qkvb : NULL, dqkv, a->ln1, w->qkvw,
		      N, C, 3 * Cl, 0, m->ones);
	if ((rc = norm_bwd(m, g->ln1w, g->ln1b, res, w->ln1w, a->ln1_mean, a->ln1_rstd)) < 0)
		return rc;
	return all ? HOOK(m, post_bwd, 2 * l + 1) : 0;
}

int mr_gpt_head_bwd(struct mr_gpt *m, const float *in, float dscale)
{
	struct mr_pool *p = m->pool;
	int N = m->B * m->T, Nl = mr_tp_local_rows(&m->tp), C = m->cfg.d_model;
	int Vl = mr_tp_vocab_rows(&m->tp), last = m->nunits - 1, rc;

	if ((rc = HOOK(m, pre_bwd, last)) < 0)
		return rc;
	mr_crossentropy_bwd_inplace(p, m->logits, m->ce_lse, m->tgt_local, N, Vl,
				    dscale / (float)N);
	mr_tp_mask_vocab_pad(&m->tp, m->logits, 0.0f);
	mr_matmul_bwd(p, m->dln, m->g.wte, NULL, m->logits, m->lnf, m->w.wte, N, C, Vl, 0,
		      m->ones);
	memset(m->dres, 0, sizeof(float) * (size_t)Nl * C);
	if ((rc = norm_bwd(m, m->g.lnfw, m->g.lnfb, in, m->w.lnfw, m->lnf_mean,
			   m->lnf_rstd)) < 0)
		return rc;
	return HOOK(m, post_bwd, last);
}

int mr_gpt_blocks_bwd(struct mr_gpt *m, int lo, int hi, const float *in, float dscale,
		      int phase)
{
	int l, rc;

	if (phase != MR_GPT_BWD_ALL && !m->stash)
		return MR_ESTATE; /* mr_gpt_split_bwd first */
	for (l = hi - 1; l >= lo; l--) {
		const float *res = l == lo ? in : m->la[l - 1].res3;
		if ((rc = block_bwd(m, l, res, dscale, phase)) < 0)
			return rc;
	}
	return 0;
}

int mr_gpt_embed_bwd(struct mr_gpt *m)
{
	int rc;

	if ((rc = HOOK(m, pre_bwd, 0)) < 0 ||
	    (rc = mr_tp_embedding_bwd(&m->tp, m->pool, m->g.wte, m->g.wpe, m->dres, m->tok_local,
				      m->sp_full)) < 0)
		return rc;
	return HOOK(m, post_bwd, 0);
}

int mr_gpt_backward(struct mr_gpt *m, float dscale)
{
	int L = m->cfg.n_layer, rc;

	if ((rc = mr_gpt_head_bwd(m, m->la[L - 1].res3, dscale)) < 0 ||
	    (rc = mr_gpt_blocks_bwd(m, 0, L, m->encoded, dscale, MR_GPT_BWD_ALL)) < 0)
		return rc;
	return mr_gpt_embed_bwd(m);
}
