/*
 * gpt2.c - the GPT-2 family's transformer block, forward and backward
 * (Radford et al. 2019; llm.c's layout): pre-LayerNorm, causal multi-head
 * attention with a bias on every projection, a GELU(tanh) MLP of 4
 * d_model, or a MoE MLP of GELU experts; and its table of tensors
 * (learned positions, the LM head tied to the token embedding). What
 * the model does around the blocks - embedding, head, loss, hooks,
 * the micro-batch state, recomputation - is gpt.c's; tensor, sequence,
 * context and expert parallel are the layers of layers/ the block calls.
 *
 * Init (GPT-2 / nanoGPT): every matrix and embedding ~ normal(0, 0.02);
 * the residual projections (attn.proj.w, mlp.proj.w, also per expert) use
 * 0.02 / sqrt(2 L); biases 0; LayerNorm weight 1, bias 0.
 */
#include <math.h>
#include <stdio.h>

#include "gpt_family.h"
#include "layers/mr_tp.h"

/* Fills the table (or only counts when tb->t is NULL). Splits follow
 * Megatron-LM: column-parallel (dim 0 of a (out, in) matrix) for QKV - as
 * three blocks, so each rank gets whole heads of q, k and v - and MLP fc;
 * row-parallel (the input dim) for the attention and MLP projections,
 * whose biases stay replicated; vocab-parallel rows of wte. */
static void gpt2_table(const struct mr_gpt_config *c, struct mr__gpt_table *tb)
{
	int C = c->d_model, E = c->n_experts, l;
	float sd = 0.02f, rsd = 0.02f / sqrtf(2.0f * (float)c->n_layer);
	char nm[32];

#define NAME(fmt) (snprintf(nm, sizeof(nm), "h.%d." fmt, l), nm)
	mr__gpt_table_unit(tb);
	mr__gpt_table_add(tb, "wte", c->vocab, C, 0, MR_INIT_NORMAL, sd, 0, 1, -1, MV(wte));
	mr__gpt_table_add(tb, "wpe", c->max_seq, C, 0, MR_INIT_NORMAL, sd, -1, 1, -1, MV(wpe));
	for (l = 0; l < c->n_layer; l++) {
		mr__gpt_table_unit(tb);
		mr__gpt_table_add(tb, NAME("ln1.w"), C, 0, 0, MR_INIT_ONE, 0, -1, 1, l, LV(ln1w));
		mr__gpt_table_add(tb, NAME("ln1.b"), C, 0, 0, MR_INIT_ZERO, 0, -1, 1, l, LV(ln1b));
		mr__gpt_table_add(tb, NAME("attn.qkv.w"), 3 * C, C, 0, MR_INIT_NORMAL, sd, 0, 3, l,
				  LV(qkvw));
		mr__gpt_table_add(tb, NAME("attn.qkv.b"), 3 * C, 0, 0, MR_INIT_ZERO, 0, 0, 3, l,
				  LV(qkvb));
		mr__gpt_table_add(tb, NAME("attn.proj.w"), C, C, 0, MR_INIT_NORMAL, rsd, 1, 1, l,
				  LV(attprojw));
		mr__gpt_table_add(tb, NAME("attn.proj.b"), C, 0, 0, MR_INIT_ZERO, 0, -1, 1, l,
				  LV(attprojb));
		mr__gpt_table_unit(tb);
		mr__gpt_table_add(tb, NAME("ln2.w"), C, 0, 0, MR_INIT_ONE, 0, -1, 1, l, LV(ln2w));
		mr__gpt_table_add(tb, NAME("ln2.b"), C, 0, 0, MR_INIT_ZERO, 0, -1, 1, l, LV(ln2b));
		if (mr_gpt_layer_is_moe(c, l)) {
			mr__gpt_table_add(tb, NAME("moe.router.w"), E, C, 0, MR_INIT_NORMAL, sd, -1,
					  1, l,
			    LV(routerw));
			/* the experts, last in the unit: one contiguous range
			 * the data-parallel layer reduces over expert-data ranks */
			tb->experts = 1;
			mr__gpt_table_add(tb, NAME("moe.fc.w"), E, 4 * C, C, MR_INIT_NORMAL, sd, 1,
					  1, l, LV(fcw));
			mr__gpt_table_add(tb, NAME("moe.fc.b"), E, 4 * C, 0, MR_INIT_ZERO, 0, 1, 1,
					  l, LV(fcb));
			mr__gpt_table_add(tb, NAME("moe.proj.w"), E, C, 4 * C, MR_INIT_NORMAL, rsd,
					  2, 1, l,
			    LV(fcprojw));
			mr__gpt_table_add(tb, NAME("moe.proj.b"), E, C, 0, MR_INIT_ZERO, 0, -1, 1,
					  l, LV(fcprojb));
			tb->experts = 0;
		} else {
			mr__gpt_table_add(tb, NAME("mlp.fc.w"), 4 * C, C, 0, MR_INIT_NORMAL, sd, 0,
					  1, l, LV(fcw));
			mr__gpt_table_add(tb, NAME("mlp.fc.b"), 4 * C, 0, 0, MR_INIT_ZERO, 0, 0, 1,
					  l, LV(fcb));
			mr__gpt_table_add(tb, NAME("mlp.proj.w"), C, 4 * C, 0, MR_INIT_NORMAL, rsd,
					  1, 1, l,
			    LV(fcprojw));
			mr__gpt_table_add(tb, NAME("mlp.proj.b"), C, 0, 0, MR_INIT_ZERO, 0, -1, 1,
					  l, LV(fcprojb));
		}
	}
#undef NAME
	mr__gpt_table_unit(tb);
	mr__gpt_table_add(tb, "lnf.w", C, 0, 0, MR_INIT_ONE, 0, -1, 1, -1, MV(lnfw));
	mr__gpt_table_add(tb, "lnf.b", C, 0, 0, MR_INIT_ZERO, 0, -1, 1, -1, MV(lnfb));
}

/* A dense MLP's first GEMM and its GELU: a->fch, a->fch_gelu from a->ln2.
 * One fused call where the device has it, unless the block's selective
 * recomputation runs the GELU again from the stored a->fch (the fused
 * GELU is of the unrounded product: the two would differ). */
static int fc_gelu_fwd(struct mr_gpt *m, int l, struct mr_gpt_layer_acts *a, const mr_act *w,
		       const mr_act *b, int N, int C, int H)
{
	int rc;

	if (m->fuse_gelu && mr_gpt_layer_recompute(m, l) != MR_GPT_RC_SELECTIVE)
		return OP(m, matmul_gelu_fwd, a->fch_gelu, a->fch, a->ln2, w, b, N, C, H);
	CK(OP(m, matmul_fwd, a->fch, a->ln2, w, b, N, C, H));
	return OP(m, gelu_fwd, a->fch_gelu, a->fch, (size_t)N * H);
}

/* One transformer block: res (Nl,C) in, a->res3 (Nl,C) out. A
 * recomputation stops before a dense MLP's output GEMM (nothing in the
 * backward reads its output); a MoE MLP's output goes to m->rc_out. */
static int block_fwd(struct mr_gpt *m, int l, const mr_act *res)
{
	const struct mr_gpt_config *c = &m->cfg;
	const struct mr_gpt_layer_w *w = &WV(m)->layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	int tp = m->par.tp.size, N = m->B * m->T, Nl = mr_tp_local_rows(&m->par.tp);
	int C = c->d_model, Cl = C / tp, rc;
	size_t nl = (size_t)Nl * C;
	mr_act *out = mr__gpt_block_out(m, l);

	CK(mr__gpt_norm_fwd(m, a->ln1, a->ln1_mean, a->ln1_rstd, res, w->ln1w, w->ln1b));
	CK(OP(m, matmul_fwd, a->qkv, a->ln1, CW(w->qkvw), CW(w->qkvb), N, C, 3 * Cl));
	if (m->par.cp.size > 1)
		CK(mr_cp_attn_fwd(&m->par.cp, a->atty, a->att_lse, a->qkv));
	else
		CK(OP(m, attn_fwd, a->atty, a->att_lse, a->qkv, m->B, m->T, Cl, c->n_head / tp,
		      c->n_head / tp, m->k_ws));
	CK(mr_tp_row_linear_fwd(&m->par.tp, a->res2, a->atty, CW(w->attprojw), CW(w->attprojb), Cl,
				m->dln));
	CK(mr__gpt_mlp_hook(m, l));
	CK(mr__gpt_add_norm_fwd(m, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, res, w->ln2w,
				w->ln2b));
	if (mr_gpt_layer_is_moe(c, l)) {
		CK(mr__gpt_moe_fwd(m, l, out));
	} else {
		CK(fc_gelu_fwd(m, l, a, CW(w->fcw), CW(w->fcb), N, C, 4 * Cl));
		if (m->recomputing)
			return 0; /* the backward reads no output */
		CK(mr_tp_row_linear_fwd(&m->par.tp, out, a->fch_gelu, CW(w->fcprojw), CW(w->fcprojb),
					4 * Cl, m->dln));
	}
	return OP(m, add, out, a->res2, nl);
}

/* The dense MLP's activation of block l: GELU of the fc output. */
static int mlp_act(struct mr_gpt *m, int l)
{
	struct mr_gpt_layer_acts *a = &m->la[l];

	return OP(m, gelu_fwd, a->fch_gelu, a->fch, (size_t)m->B * m->T * mr__gpt_ffn_cols(m));
}

/* d(fc output) (N,H) from d(MLP output) through the output GEMM and the
 * GELU: one fused call where the device has it, else the two; dw, db
 * (may be NULL) the output GEMM's gradients. */
static int proj_gelu_bwd(struct mr_gpt *m, mr_act *dfc, float *dw, float *db, const mr_act *dout,
			 const struct mr_gpt_layer_acts *a, const mr_act *w, int N, int H, int C)
{
	const struct mr_dev_ops *ops = m->dev->ops;
	int rc;

	if (ops->matmul_dgelu_bwd)
		return OP(m, matmul_dgelu_bwd, dfc, dw, db, dout, a->fch_gelu, w, a->fch, N, H, C);
	CK(OP(m, matmul_bwd, dfc, dw, db, dout, a->fch_gelu, w, N, H, C, 0));
	return OP(m, gelu_bwd, dfc, a->fch, dfc, (size_t)N * H);
}

/* The four dense GEMMs' weight gradients of layer l from their output
 * gradients (the weight phase of a split backward). */
static int dense_weight_grads(struct mr_gpt *m, int l, const mr_act *dproj2, const mr_act *dfc,
			      const mr_act *dproj1, const mr_act *dqkv, int moe)
{
	const struct mr_gpt_layer_w *w = &WV(m)->layer[l];
	const struct mr_gpt_layer_w *g = &m->g.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	int N = m->B * m->T, C = m->cfg.d_model, Cl = C / m->par.tp.size, rc;

	if (!moe) {
		CK(OP(m, matmul_bwd, NULL, g->fcprojw, g->fcprojb, dproj2, a->fch_gelu,
		      CW(w->fcprojw), N, 4 * Cl, C, 0));
		CK(OP(m, matmul_bwd, NULL, g->fcw, g->fcb, dfc, a->ln2, CW(w->fcw), N, C, 4 * Cl, 0));
	}
	CK(HOOK(m, post_bwd, m->layer_unit[l] + 1));
	CK(OP(m, matmul_bwd, NULL, g->attprojw, g->attprojb, dproj1, a->atty, CW(w->attprojw), N,
	      Cl, C, 0));
	CK(OP(m, matmul_bwd, NULL, g->qkvw, g->qkvb, dqkv, a->ln1, CW(w->qkvw), N, C, 3 * Cl, 0));
	return HOOK(m, post_bwd, m->layer_unit[l]);
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
static int block_bwd(struct mr_gpt *m, int l, const mr_act *res, float dscale, int phase)
{
	const struct mr_gpt_config *c = &m->cfg;
	const struct mr_gpt_layer_w *w = &WV(m)->layer[l];
	const struct mr_gpt_layer_w *g = &m->g.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_gpt_layer_stash *st = m->stash ? &m->stash[l] : NULL;
	struct mr_dev *d = m->dev;
	int tp = m->par.tp.size, N = m->B * m->T, C = c->d_model, Cl = C / tp, rc;
	int moe = mr_gpt_layer_is_moe(c, l), all = phase == MR_GPT_BWD_ALL;
	size_t nc = mr_dev_act_bytes(d, (size_t)N * C);
	mr_act *dfull = mr_tp_if_sp(&m->par.tp, m->dres, m->sp_full);
	/* the output gradients the weight phase needs: scratch when fused */
	mr_act *dproj2 = all ? dfull : st->dproj2, *dfc = all ? m->dfch : st->dfc;
	mr_act *dproj1 = all ? dfull : st->dproj1, *dqkv = all ? m->dqkv : st->dqkv;

	if (phase == MR_GPT_BWD_WEIGHT)
		return dense_weight_grads(m, l, st->dproj2, st->dfc, st->dproj1, st->dqkv, moe);
	/* the MLP branch (the layer's second unit): dres = d(res3) */
	CK(HOOK(m, pre_bwd, m->layer_unit[l] + 1));
	CK(mr_tp_gather_rows(&m->par.tp, dfull, m->dres));
	if (moe) {
		struct mr_moe_shape s = mr_gpt_moe_shape(m);
		CK(OP(m, moe_bwd, &s, &a->moe, &m->par.xchg, m->dln, dfull, a->ln2, CW(w->routerw),
		      CW(w->fcw), CW(w->fcprojw), g->routerw, g->fcw, g->fcb, g->fcprojw,
		      g->fcprojb, c->aux_coef * dscale, m->k_ws, m->ones));
	} else {
		if (dproj2 != dfull)
			CK(OP(m, copy, dproj2, dfull, nc));
		CK(proj_gelu_bwd(m, dfc, all ? g->fcprojw : NULL, all ? g->fcprojb : NULL, dfull,
				 a, CW(w->fcprojw), N, 4 * Cl, C));
		CK(OP(m, matmul_bwd, m->dln, all ? g->fcw : NULL, all ? g->fcb : NULL, dfc, a->ln2,
		      CW(w->fcw), N, C, 4 * Cl, 0));
	}
	CK(mr__gpt_norm_bwd(m, g->ln2w, g->ln2b, a->res2, w->ln2w, a->ln2_mean, a->ln2_rstd));
	if (all)
		CK(HOOK(m, post_bwd, m->layer_unit[l] + 1));
	/* the attention branch (the layer's first unit): dres = d(res2) */
	CK(HOOK(m, pre_bwd, m->layer_unit[l]));
	CK(mr_tp_gather_rows(&m->par.tp, dfull, m->dres));
	if (dproj1 != dfull)
		CK(OP(m, copy, dproj1, dfull, nc));
	CK(OP(m, matmul_bwd, m->datty, all ? g->attprojw : NULL, all ? g->attprojb : NULL, dfull,
	      a->atty, CW(w->attprojw), N, Cl, C, 0));
	if (m->par.cp.size > 1)
		CK(mr_cp_attn_bwd(&m->par.cp, dqkv, m->datty, a->qkv, a->atty, a->att_lse));
	else
		CK(OP(m, attn_bwd, dqkv, m->datty, a->qkv, a->atty, a->att_lse, m->B, m->T, Cl,
		      c->n_head / tp, c->n_head / tp, m->k_ws));
	CK(OP(m, matmul_bwd, m->dln, all ? g->qkvw : NULL, all ? g->qkvb : NULL, dqkv, a->ln1,
	      CW(w->qkvw), N, C, 3 * Cl, 0));
	CK(mr__gpt_norm_bwd(m, g->ln1w, g->ln1b, res, w->ln1w, a->ln1_mean, a->ln1_rstd));
	return all ? HOOK(m, post_bwd, m->layer_unit[l]) : 0;
}

const struct mr__gpt_family mr__gpt2_family = {
	.name = "gpt2",
	.table = gpt2_table,
	.block_fwd = block_fwd,
	.block_bwd = block_bwd,
	.mlp_act = mlp_act,
	.rms_norm = 0,
};
