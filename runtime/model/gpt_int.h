/*
 * gpt_int.h - internals of the model shared by gpt_params.c and
 * gpt_table.c.
 */
#ifndef MR_GPT_INT_H
#define MR_GPT_INT_H

#include "mr_gpt.h"

/* Builds m's parameter table for m->cfg and m->par.tp.size: tensors,
 * unit_first, ntensors, nunits, nparams (gpt_table.c). MR_ENOMEM. */
int mr__gpt_table_create(struct mr_gpt *m);
/* Points m->wc's views into m->params_c (table order). */
void mr__gpt_bind_compute(struct mr_gpt *m);

/* This tp rank's columns of a block's activations: the QKV GEMM's output
 * (gpt2 3C/tp; llama (NH/tp + 2 mr_gpt_kv_local) hs), the MLP's hidden (gpt2 4C/tp;
 * llama F/tp) and the first MLP GEMM's output (gpt2 the hidden; llama
 * gate and up, 2F/tp). */
static inline size_t mr__gpt_qkv_cols(const struct mr_gpt *m)
{
	const struct mr_gpt_config *c = &m->cfg;
	size_t hs = (size_t)(c->d_model / c->n_head);
	int tp = m->par.tp.size;

	return ((size_t)(c->n_head / tp) + 2 * (size_t)mr_gpt_kv_local(c, tp)) * hs;
}

static inline size_t mr__gpt_ffn_cols(const struct mr_gpt *m)
{
	return (size_t)mr_gpt_ffn(&m->cfg) / (size_t)m->par.tp.size;
}

static inline size_t mr__gpt_fc_cols(const struct mr_gpt *m)
{
	return (m->cfg.arch == MR_ARCH_LLAMA ? 2 : 1) * mr__gpt_ffn_cols(m);
}

#define HOOK(m, fn, u)                                                   \
	((m)->hooks && (m)->hooks->fn ? (m)->hooks->fn((m)->hooks->ctx, (u)) : 0)

/* Runs a device operation; returns its error. */
#define OP(m, name, ...) ((m)->dev->ops->name((m)->dev, __VA_ARGS__))
#define CK(call)                         \
	do {                             \
		if ((rc = (call)) < 0)   \
			return rc;       \
	} while (0)

/* The weight views the kernels read: the compute copy's where the
 * activation type is not fp32, else the master's (bound by hooks too). */
static inline const struct mr_gpt_weights *WV(const struct mr_gpt *m)
{
	return m->dev->act != MR_DT_F32 ? &m->wc : &m->w;
}

/* A view of WV as the activation type it holds. */
static inline const mr_act *CW(const float *view)
{
	return (const mr_act *)(const void *)view;
}

/* Where block l's forward writes its output: the kept a->res3, or while
 * a recomputation runs the scratch m->rc_out (a MoE block's; the kept one
 * stays as the forward left it). */
static inline mr_act *mr__gpt_block_out(struct mr_gpt *m, int l)
{
	return m->recomputing ? m->rc_out : m->la[l].res3;
}

/* The forward's hook before block l's MLP half (none while recomputing:
 * the backward asked for the unit already). */
static inline int mr__gpt_mlp_hook(struct mr_gpt *m, int l)
{
	return m->recomputing ? 0 : HOOK(m, pre_fwd, m->layer_unit[l] + 1);
}

/* The shared pieces a family's block uses (gpt.c): the norm of the local rows into
 * full rows for a column-parallel GEMM, and its backward from m->dln into
 * m->dres (added); b, gb NULL for RMSNorm. */
int mr__gpt_norm_fwd(struct mr_gpt *m, mr_act *full, float *mean, float *rstd,
		     const mr_act *res, const float *w, const float *b);
/* The residual add before it: res (local rows) += x, then the norm of
 * res as mr__gpt_norm_fwd - one pass where the device fuses the two
 * (add_layernorm_fwd), with the same bits. */
int mr__gpt_add_norm_fwd(struct mr_gpt *m, mr_act *full, float *mean, float *rstd, mr_act *res,
			 const mr_act *x, const float *w, const float *b);
/* Layer l's MoE MLP from its a->ln2 rows into out (the local rows; under
 * tp the partial sums reduced) (gpt.c). */
int mr__gpt_moe_fwd(struct mr_gpt *m, int l, mr_act *out);
int mr__gpt_norm_bwd(struct mr_gpt *m, float *gw, float *gb, const mr_act *res,
		     const float *w, const float *mean, const float *rstd);

#endif
