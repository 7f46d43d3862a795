/*
 * llama.c - the Llama family's transformer block, forward and backward
 * (Touvron et al. 2023, "LLaMA"; Dubey et al. 2024, "The Llama 3 Herd of
 * Models"): RMSNorm, grouped-query attention with rotary positions, a
 * SwiGLU MLP, no biases; and its table of tensors (no position table, an
 * untied head unless tie_embeddings). Embedding, head, loss, hooks,
 * the micro-batch state and recomputation are the model's (gpt.c), so
 * this file is what a family adds (gpt_family.h).
 *
 * Layout: the QKV GEMM reads q, k and v's weights as one (their local
 * slices are back to back in the table) and writes rows of
 * [q (NH/tp heads) | k (NKV/tp) | v (NKV/tp)], the layout the attention
 * kernels take; rotary positions turn q and k in place (one call: k's
 * heads follow q's), so the attention's saved input is the rotated one.
 * The MLP's first GEMM writes [gate | up] (F/tp each), SwiGLU makes the
 * hidden rows from it. Tensor parallel as gpt2's block: column-parallel
 * q/k/v and gate/up, row-parallel o and down, sp through the model's norm
 * pieces. With tp above n_kv_head the key/value heads are replicated
 * (mr_gpt_kv_rep): a rank's NKV is the one head its query heads use, and
 * the weight gradient of k and v is summed over the ranks sharing it
 * (mr_tp_kv_grads_begin/end around the QKV GEMM's weight gradient).
 *
 * A MoE layer's MLP is SwiGLU experts (Mixtral; kernels/mr_moe.h with
 * swiglu set), routed and exchanged as gpt2's.
 *
 * Backward phases as gpt2's (gpt2.c block_bwd): the input phase keeps the
 * four GEMMs' output gradients in the layer's stash, the weight phase adds
 * their weight gradients later (a MoE MLP's backward runs whole in the
 * input phase).
 */
#include <math.h>
#include <stdio.h>

#include "gpt_family.h"
#include "layers/mr_tp.h"

/* llama: the same units, no biases. q, k and v are three tensors split
 * whole (a rank's query heads and its key/value heads), back to back so
 * their local slices are one GEMM's weight; with tp above n_kv_head, k
 * and v are replicated key/value heads (mr_gpt_kv_rep: every rank holds
 * the one head its query heads use); gate and up likewise (in a
 * MoE layer one tensor per expert of [gate | up] rows). An untied head
 * closes the last unit. Init: every matrix ~ normal(0, 0.02),
 * the residual projections 0.02 / sqrt(2 L) (as gpt2), norms 1. */
static void llama_table(const struct mr_gpt_config *c, struct mr__gpt_table *tb)
{
	int C = c->d_model, hs = C / c->n_head, q = c->n_head * hs;
	int kv = mr_gpt_kv_heads(c) * hs, F = mr_gpt_ffn(c), E = c->n_experts, l;
	float sd = 0.02f, rsd = 0.02f / sqrtf(2.0f * (float)c->n_layer);
	char nm[32];

#define NAME(fmt) (snprintf(nm, sizeof(nm), "h.%d." fmt, l), nm)
	mr__gpt_table_unit(tb);
	mr__gpt_table_add(tb, "tok_emb", c->vocab, C, 0, MR_INIT_NORMAL, sd, 0, 1, -1, MV(wte));
	for (l = 0; l < c->n_layer; l++) {
		mr__gpt_table_unit(tb);
		mr__gpt_table_add(tb, NAME("attn_norm.w"), C, 0, 0, MR_INIT_ONE, 0, -1, 1, l,
				  LV(ln1w));
		mr__gpt_table_add(tb, NAME("attn.q.w"), q, C, 0, MR_INIT_NORMAL, sd, 0, 1, l,
				  LV(qkvw));
		tb->rep = mr_gpt_kv_rep(c, tb->tp);
		mr__gpt_table_add(tb, NAME("attn.k.w"), kv, C, 0, MR_INIT_NORMAL, sd, 0, 1, l,
				  LV(kw));
		mr__gpt_table_add(tb, NAME("attn.v.w"), kv, C, 0, MR_INIT_NORMAL, sd, 0, 1, l,
				  LV(vw));
		tb->rep = 0;
		mr__gpt_table_add(tb, NAME("attn.o.w"), C, q, 0, MR_INIT_NORMAL, rsd, 1, 1, l,
				  LV(attprojw));
		mr__gpt_table_unit(tb);
		mr__gpt_table_add(tb, NAME("mlp_norm.w"), C, 0, 0, MR_INIT_ONE, 0, -1, 1, l,
				  LV(ln2w));
		if (mr_gpt_layer_is_moe(c, l)) {
			/* SwiGLU experts (Mixtral): each expert's gate and up rows
			 * back to back, split by tp as two blocks; experts last */
			mr__gpt_table_add(tb, NAME("moe.router.w"), E, C, 0, MR_INIT_NORMAL, sd, -1,
					  1, l,
			    LV(routerw));
			tb->experts = 1;
			mr__gpt_table_add(tb, NAME("moe.gate_up.w"), E, 2 * F, C, MR_INIT_NORMAL,
					  sd, 1, 2, l,
			    LV(fcw));
			mr__gpt_table_add(tb, NAME("moe.down.w"), E, C, F, MR_INIT_NORMAL, rsd, 2,
					  1, l,
			    LV(fcprojw));
			tb->experts = 0;
			continue;
		}
		mr__gpt_table_add(tb, NAME("mlp.gate.w"), F, C, 0, MR_INIT_NORMAL, sd, 0, 1, l,
				  LV(fcw));
		mr__gpt_table_add(tb, NAME("mlp.up.w"), F, C, 0, MR_INIT_NORMAL, sd, 0, 1, l,
				  LV(upw));
		mr__gpt_table_add(tb, NAME("mlp.down.w"), C, F, 0, MR_INIT_NORMAL, rsd, 1, 1, l,
				  LV(fcprojw));
	}
#undef NAME
	mr__gpt_table_unit(tb);
	mr__gpt_table_add(tb, "norm.w", C, 0, 0, MR_INIT_ONE, 0, -1, 1, -1, MV(lnfw));
	if (!mr_gpt_tied(c))
		mr__gpt_table_add(tb, "output.w", c->vocab, C, 0, MR_INIT_NORMAL, sd, 0, 1, -1,
				  MV(head));
}

/* This rank's shapes of block l. */
struct shape {
	int N, C, hs, nh, nkv; /* rows, width, head size, local q and kv heads */
	size_t qkv, att, ffn;  /* local columns: qkv rows, attention out, SwiGLU hidden */
};

static struct shape shape_of(const struct mr_gpt *m)
{
	const struct mr_gpt_config *c = &m->cfg;
	struct shape s;

	s.N = m->B * m->T;
	s.C = c->d_model;
	s.hs = c->d_model / c->n_head;
	s.nh = c->n_head / m->par.tp.size;
	s.nkv = mr_gpt_kv_local(c, m->par.tp.size); /* 1 when replicated */
	s.qkv = mr__gpt_qkv_cols(m);
	s.att = (size_t)s.nh * (size_t)s.hs;
	s.ffn = mr__gpt_ffn_cols(m);
	return s;
}

static int block_fwd(struct mr_gpt *m, int l, const mr_act *res)
{
	const struct mr_gpt_layer_w *w = &WV(m)->layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct shape s = shape_of(m);
	size_t nl = (size_t)mr_tp_local_rows(&m->par.tp) * (size_t)s.C;
	int att = (int)s.att, ffn = (int)s.ffn, rc;
	mr_act *out = mr__gpt_block_out(m, l);

	CK(mr__gpt_norm_fwd(m, a->ln1, NULL, a->ln1_rstd, res, w->ln1w, NULL));
	CK(OP(m, matmul_fwd, a->qkv, a->ln1, CW(w->qkvw), NULL, s.N, s.C, (int)s.qkv));
	CK(OP(m, rope, a->qkv, s.qkv, s.N, s.nh + s.nkv, s.hs, m->rope_pos, m->rope_freq, 1));
	if (m->par.cp.size > 1)
		CK(mr_cp_attn_fwd(&m->par.cp, a->atty, a->att_lse, a->qkv));
	else
		CK(OP(m, attn_fwd, a->atty, a->att_lse, a->qkv, m->B, m->T, att, s.nh, s.nkv,
		      m->k_ws));
	CK(mr_tp_row_linear_fwd(&m->par.tp, a->res2, a->atty, CW(w->attprojw), NULL, att, m->dln));
	CK(mr__gpt_mlp_hook(m, l));
	CK(mr__gpt_add_norm_fwd(m, a->ln2, NULL, a->ln2_rstd, a->res2, res, w->ln2w, NULL));
	if (mr_gpt_layer_is_moe(&m->cfg, l)) {
		CK(mr__gpt_moe_fwd(m, l, out)); /* SwiGLU experts (mr_moe.h) */
	} else {
		CK(OP(m, matmul_fwd, a->fch, a->ln2, CW(w->fcw), NULL, s.N, s.C, 2 * ffn));
		CK(OP(m, swiglu_fwd, a->fch_gelu, a->fch, s.N, ffn));
		if (m->recomputing)
			return 0; /* the backward reads no output (gpt.c) */
		CK(mr_tp_row_linear_fwd(&m->par.tp, out, a->fch_gelu, CW(w->fcprojw), NULL, ffn,
					m->dln));
	}
	return OP(m, add, out, a->res2, nl);
}

/* The dense MLP's activation of block l: SwiGLU of [gate | up]. */
static int mlp_act(struct mr_gpt *m, int l)
{
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct shape s = shape_of(m);

	return OP(m, swiglu_fwd, a->fch_gelu, a->fch, s.N, (int)s.ffn);
}

/* The four GEMMs' weight gradients from their output gradients (the
 * weight phase of a split backward); a MoE MLP's ran in the input phase. */
static int weight_grads(struct mr_gpt *m, int l, const struct mr_gpt_layer_stash *st)
{
	const struct mr_gpt_layer_w *w = &WV(m)->layer[l];
	const struct mr_gpt_layer_w *g = &m->g.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct shape s = shape_of(m);
	int att = (int)s.att, ffn = (int)s.ffn, rc;

	if (!mr_gpt_layer_is_moe(&m->cfg, l)) {
		CK(OP(m, matmul_bwd, NULL, g->fcprojw, NULL, st->dproj2, a->fch_gelu,
		      CW(w->fcprojw), s.N, ffn, s.C, 0));
		CK(OP(m, matmul_bwd, NULL, g->fcw, NULL, st->dfc, a->ln2, CW(w->fcw), s.N, s.C,
		      2 * ffn, 0));
	}
	CK(HOOK(m, post_bwd, m->layer_unit[l] + 1));
	CK(OP(m, matmul_bwd, NULL, g->attprojw, NULL, st->dproj1, a->atty, CW(w->attprojw), s.N,
	      att, s.C, 0));
	CK(mr_tp_kv_grads_begin(&m->par.tp, g->kw));
	CK(OP(m, matmul_bwd, NULL, g->qkvw, NULL, st->dqkv, a->ln1, CW(w->qkvw), s.N, s.C,
	      (int)s.qkv, 0));
	CK(mr_tp_kv_grads_end(&m->par.tp, g->kw));
	return HOOK(m, post_bwd, m->layer_unit[l]);
}

static int block_bwd(struct mr_gpt *m, int l, const mr_act *res, float dscale, int phase)
{
	const struct mr_gpt_layer_w *w = &WV(m)->layer[l];
	const struct mr_gpt_layer_w *g = &m->g.layer[l];
	struct mr_gpt_layer_acts *a = &m->la[l];
	struct mr_gpt_layer_stash *st = m->stash ? &m->stash[l] : NULL;
	struct shape s = shape_of(m);
	int all = phase == MR_GPT_BWD_ALL, att = (int)s.att, ffn = (int)s.ffn, rc;
	size_t nc = mr_dev_act_bytes(m->dev, (size_t)s.N * (size_t)s.C);
	mr_act *dfull = mr_tp_if_sp(&m->par.tp, m->dres, m->sp_full);
	/* the output gradients the weight phase needs: scratch when fused */
	mr_act *dproj2 = all ? dfull : st->dproj2, *dfc = all ? m->dfch : st->dfc;
	mr_act *dproj1 = all ? dfull : st->dproj1, *dqkv = all ? m->dqkv : st->dqkv;
	/* the SwiGLU output's gradient: behind dfc's room in the scratch */
	mr_act *dsw = mr_dev_at(m->dev, m->dfch, (size_t)s.N * 2 * s.ffn);

	if (phase == MR_GPT_BWD_WEIGHT)
		return weight_grads(m, l, st);
	/* the MLP branch (the layer's second unit): dres = d(res3) */
	CK(HOOK(m, pre_bwd, m->layer_unit[l] + 1));
	CK(mr_tp_gather_rows(&m->par.tp, dfull, m->dres));
	if (mr_gpt_layer_is_moe(&m->cfg, l)) {
		struct mr_moe_shape ms = mr_gpt_moe_shape(m);
		CK(OP(m, moe_bwd, &ms, &a->moe, &m->par.xchg, m->dln, dfull, a->ln2, CW(w->routerw),
		      CW(w->fcw), CW(w->fcprojw), g->routerw, g->fcw, NULL, g->fcprojw, NULL,
		      m->cfg.aux_coef * dscale, m->k_ws, m->ones));
	} else {
		if (dproj2 != dfull)
			CK(OP(m, copy, dproj2, dfull, nc));
		CK(OP(m, matmul_bwd, dsw, all ? g->fcprojw : NULL, NULL, dfull, a->fch_gelu,
		      CW(w->fcprojw), s.N, ffn, s.C, 0));
		CK(OP(m, swiglu_bwd, dfc, a->fch, dsw, s.N, ffn));
		CK(OP(m, matmul_bwd, m->dln, all ? g->fcw : NULL, NULL, dfc, a->ln2, CW(w->fcw),
		      s.N, s.C, 2 * ffn, 0));
	}
	CK(mr__gpt_norm_bwd(m, g->ln2w, NULL, a->res2, w->ln2w, NULL, a->ln2_rstd));
	if (all)
		CK(HOOK(m, post_bwd, m->layer_unit[l] + 1));
	/* the attention branch (the layer's first unit): dres = d(res2) */
	CK(HOOK(m, pre_bwd, m->layer_unit[l]));
	CK(mr_tp_gather_rows(&m->par.tp, dfull, m->dres));
	if (dproj1 != dfull)
		CK(OP(m, copy, dproj1, dfull, nc));
	CK(OP(m, matmul_bwd, m->datty, all ? g->attprojw : NULL, NULL, dfull, a->atty,
	      CW(w->attprojw), s.N, att, s.C, 0));
	if (m->par.cp.size > 1)
		CK(mr_cp_attn_bwd(&m->par.cp, dqkv, m->datty, a->qkv, a->atty, a->att_lse));
	else
		CK(OP(m, attn_bwd, dqkv, m->datty, a->qkv, a->atty, a->att_lse, m->B, m->T, att,
		      s.nh, s.nkv, m->k_ws));
	CK(OP(m, rope, dqkv, s.qkv, s.N, s.nh + s.nkv, s.hs, m->rope_pos, m->rope_freq, -1));
	if (all)
		CK(mr_tp_kv_grads_begin(&m->par.tp, g->kw));
	CK(OP(m, matmul_bwd, m->dln, all ? g->qkvw : NULL, NULL, dqkv, a->ln1, CW(w->qkvw), s.N,
	      s.C, (int)s.qkv, 0));
	if (all)
		CK(mr_tp_kv_grads_end(&m->par.tp, g->kw));
	CK(mr__gpt_norm_bwd(m, g->ln1w, NULL, res, w->ln1w, NULL, a->ln1_rstd));
	return all ? HOOK(m, post_bwd, m->layer_unit[l]) : 0;
}

const struct mr__gpt_family mr__llama_family = {
	.name = "llama",
	.table = llama_table,
	.block_fwd = block_fwd,
	.block_bwd = block_bwd,
	.mlp_act = mlp_act,
	.rms_norm = 1,
};
