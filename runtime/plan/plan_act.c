/*
 * plan_act.c - activation memory: what a layer keeps for its backward, as
 * a table of tensors per implementation (Korthikanti et al. 2022, section
 * 4.1, for Megatron-LM; runtime/model/gpt_params.c's carve for meshrun),
 * each with its size per token, type, split under tp / sp and whether
 * recomputation drops it; and a stage's total over the micro-batches its
 * schedule keeps in flight.
 *
 * Korthikanti's count per layer (16-bit activations, s tokens, b
 * sequences, h hidden, a heads): attention 11sbh + 5as^2b (LayerNorm
 * output 2sbh, Q and K 4sbh, V 2sbh, the projection's input 2sbh, its
 * dropout mask sbh; softmax output 2as^2b, its dropout mask as^2b and
 * output 2as^2b), MLP 19sbh (input 2sbh, fc output 8sbh, GELU output
 * 8sbh, dropout mask sbh), two LayerNorm inputs 4sbh: sbh(34 + 5as/h).
 * Tensor parallel splits what lies between the column- and the
 * row-parallel GEMMs (24sbh and the scores) by t, sequence parallel the
 * rest (10sbh) too; selective recompute drops the attention core (the
 * as^2b terms); full recompute keeps the layer's input only.
 *
 * The llama family (Dubey et al. 2024) changes three of these: no
 * dropout (its masks go, and the softmax output is the one copy the
 * backward needs), grouped-query attention (Q, K and V are (NH + 2 NKV)
 * hs columns, not 3h), and a SwiGLU MLP (its first GEMM writes gate | up,
 * 2F columns, the SwiGLU output F: 3F in place of GELU's 8h). The table's
 * rows say it per token in units of the family's shapes (mr__plan_dims).
 *
 * meshrun keeps no dropout masks and no scores (block-wise attention
 * keeps a log-sum-exp per head and token instead), keeps both LayerNorm
 * outputs whole under sp (gathered for the GEMMs) with their mean and
 * rstd, and the residual after attention and after the MLP; each tensor
 * is a piece of the slot's arena rounded up to 256 bytes. Its
 * recomputation (model/mr_gpt.h) is per block: the first
 * recompute_layers blocks of each pipeline chunk (0: every block) keep,
 * per slot, what the table's keep bits say - selective drops the norms
 * (with their statistics) and the GELU / SwiGLU output, full everything
 * but the block's output - and the stage carves once, beside its slots,
 * one block's worth of the dropped tensors to recompute them into
 * (meshrun_scratch). zb-h1's stash is the same with or without.
 *
 * Megatron's recomputation is Korthikanti's, every layer recomputing
 * (plan_rules.c refuses recompute_layers for it).
 */
#include <math.h>
#include <string.h>

#include "kernels/mr_moe.h"
#include "plan_int.h"

/* per token: h, scores (a s), heads, 1, and the family's qkv, fc and ffn
 * columns (mr__plan_dims) */
enum { PER_H, PER_SCORES, PER_HEADS, PER_ONE, PER_QKV, PER_FC, PER_FFN };
enum { DT_ACT, DT_MASK, DT_F32, DT_INT };
enum { SPLIT_NONE, SPLIT_TP, SPLIT_SP };
/* which recompute modes keep a tensor, a bit per mode (keep_bit): kept
 * without recomputation only, by none and selective, by all three */
enum { KEEP_NONE = 1, KEEP_SEL = 2, KEEP_FULL = 4, KEEP_ALL = 7, KEEP_NS = 3 };

struct term {
	const char *name;
	double n;   /* elements per token, in units of `per` */
	int per, dt, split, keep;
	int dense;  /* part of a dense MLP (a MoE layer has its own) */
	int drop;   /* there for dropout only (none in llama) */
};

/* Q, K and V one row (Korthikanti's 4sbh + 2sbh for gpt2's 3h columns);
 * the fc and GELU outputs 4h each for gpt2, 2F and F for SwiGLU. */
static const struct term megatron_layer[] = {
	{ "layer input (LayerNorm 1 input)", 1, PER_H, DT_ACT, SPLIT_SP, KEEP_ALL, 0, 0 },
	{ "QKV input (LayerNorm 1 output)", 1, PER_H, DT_ACT, SPLIT_SP, KEEP_NS, 0, 0 },
	{ "Q, K, V", 1, PER_QKV, DT_ACT, SPLIT_TP, KEEP_NS, 0, 0 },
	{ "softmax output", 1, PER_SCORES, DT_ACT, SPLIT_TP, KEEP_NONE, 0, 0 },
	{ "softmax dropout mask", 1, PER_SCORES, DT_MASK, SPLIT_TP, KEEP_NONE, 0, 1 },
	{ "softmax dropout output", 1, PER_SCORES, DT_ACT, SPLIT_TP, KEEP_NONE, 0, 1 },
	{ "projection input", 1, PER_H, DT_ACT, SPLIT_TP, KEEP_NS, 0, 0 },
	{ "attention dropout mask", 1, PER_H, DT_MASK, SPLIT_SP, KEEP_NS, 0, 1 },
	{ "LayerNorm 2 input", 1, PER_H, DT_ACT, SPLIT_SP, KEEP_NS, 0, 0 },
	{ "MLP input (LayerNorm 2 output)", 1, PER_H, DT_ACT, SPLIT_SP, KEEP_NS, 0, 0 },
	{ "fc output (GELU / SwiGLU input)", 1, PER_FC, DT_ACT, SPLIT_TP, KEEP_NS, 1, 0 },
	{ "GELU / SwiGLU output", 1, PER_FFN, DT_ACT, SPLIT_TP, KEEP_NS, 1, 0 },
	{ "MLP dropout mask", 1, PER_H, DT_MASK, SPLIT_SP, KEEP_NS, 0, 1 },
};

/* gpt_params.c's carve_acts (llama carves the same pieces: its unused
 * mean too, qkv of (NH + 2 NKV) hs, fc as gate | up, the SwiGLU output).
 * The keep bits are the runtime's recomputation (model/mr_gpt.h, enum
 * mr_gpt_recompute) for a block that recomputes:
 *   KEEP_ALL  kept under none, selective and full: the block's output
 *             (res3), the one tensor full recompute keeps;
 *   KEEP_NS   kept under none and selective, dropped by full: the GEMM
 *             outputs (qkv, fc), the attention's output and log-sum-exp
 *             and the residual after attention;
 *   KEEP_NONE kept only without recomputation, dropped by selective too:
 *             the two norms' outputs with their mean and rstd, the GELU /
 *             SwiGLU output (element-wise work to recompute).
 * A MoE layer's acts (moe_bytes) are kept by none and selective. */
static const struct term meshrun_layer[] = {
	{ "ln1", 1, PER_H, DT_ACT, SPLIT_NONE, KEEP_NONE, 0, 0 },
	{ "ln1 mean", 1, PER_ONE, DT_F32, SPLIT_SP, KEEP_NONE, 0, 0 },
	{ "ln1 rstd", 1, PER_ONE, DT_F32, SPLIT_SP, KEEP_NONE, 0, 0 },
	{ "qkv", 1, PER_QKV, DT_ACT, SPLIT_TP, KEEP_NS, 0, 0 },
	{ "attention output", 1, PER_H, DT_ACT, SPLIT_TP, KEEP_NS, 0, 0 },
	{ "attention lse", 1, PER_HEADS, DT_F32, SPLIT_TP, KEEP_NS, 0, 0 },
	{ "residual after attention", 1, PER_H, DT_ACT, SPLIT_SP, KEEP_NS, 0, 0 },
	{ "ln2", 1, PER_H, DT_ACT, SPLIT_NONE, KEEP_NONE, 0, 0 },
	{ "ln2 mean", 1, PER_ONE, DT_F32, SPLIT_SP, KEEP_NONE, 0, 0 },
	{ "ln2 rstd", 1, PER_ONE, DT_F32, SPLIT_SP, KEEP_NONE, 0, 0 },
	{ "fc output", 1, PER_FC, DT_ACT, SPLIT_TP, KEEP_NS, 1, 0 },
	{ "GELU / SwiGLU output", 1, PER_FFN, DT_ACT, SPLIT_TP, KEEP_NONE, 1, 0 },
	{ "residual after the MLP", 1, PER_H, DT_ACT, SPLIT_SP, KEEP_ALL, 0, 0 },
};

#define NTERMS(t) (sizeof(t) / sizeof((t)[0]))

struct shape {
	double tok;      /* tokens of the micro-batch on this rank (b * s / cp) */
	double h, a, s;  /* hidden, heads, scores per head per token */
	int t, sp;
	double act;      /* bytes per activation element */
	int round;       /* meshrun: each tensor a 256-byte piece */
	double qkv, fc, ffn; /* the family's columns (mr__plan_dims) */
	int nodrop;      /* llama: no dropout */
};

static double dt_bytes(const struct shape *sh, int dt)
{
	return dt == DT_ACT ? sh->act : dt == DT_MASK ? 1.0 : 4.0;
}

static double piece(const struct shape *sh, double bytes)
{
	return sh->round ? ceil(bytes / 256.0) * 256.0 : bytes;
}

static double term_bytes(const struct shape *sh, const struct term *x)
{
	double per = x->per == PER_H	    ? sh->h
		     : x->per == PER_SCORES ? sh->a * sh->s
		     : x->per == PER_HEADS  ? sh->a
		     : x->per == PER_QKV    ? sh->qkv
		     : x->per == PER_FC     ? sh->fc
		     : x->per == PER_FFN    ? sh->ffn
					    : 1.0;
	double div = x->split == SPLIT_TP || (x->split == SPLIT_SP && sh->sp) ? sh->t : 1.0;

	return piece(sh, x->n * per * sh->tok * dt_bytes(sh, x->dt) / div);
}

static int keep_bit(int rc)
{
	return rc == MR_PLAN_RC_FULL ? KEEP_FULL : rc == MR_PLAN_RC_SELECTIVE ? KEEP_SEL : KEEP_NONE;
}

/* One layer's tensors kept under recompute rc (dense MLP unless moe). */
static double layer_bytes(int impl, const struct shape *sh, int rc, int moe)
{
	const struct term *tab = impl == MR_PLAN_MEGATRON ? megatron_layer : meshrun_layer;
	size_t n = impl == MR_PLAN_MEGATRON ? NTERMS(megatron_layer) : NTERMS(meshrun_layer);
	double sum = 0;

	for (size_t i = 0; i < n; i++)
		if ((tab[i].keep & keep_bit(rc)) && !(moe && tab[i].dense) &&
		    !(sh->nodrop && tab[i].drop))
			sum += term_bytes(sh, &tab[i]);
	return sum;
}

double mr_plan_act_layer(int impl, int prec, double s, double b, double h, double a, int t,
			 int sp, int recompute)
{
	struct shape sh = { s * b, h, a, s, t, sp, mr__plan_prec(prec)->act, 0,
			    3 * h, 4 * h, 4 * h, 0 };

	return layer_bytes(impl, &sh, recompute, 0);
}

/* A MoE layer's MLP tensors on a rank: meshrun's buffers (kernels/mr_moe.h:
 * router probabilities and gates, the dispatched rows in and out, the
 * experts' hidden pre and post GELU / SwiGLU, at the expert capacity;
 * the family's shape as mr_gpt_moe_shape builds it); Megatron's, counted
 * as a dense MLP's fc and GELU / SwiGLU outputs for each routed copy of a
 * token (top_k x capacity factor) plus the dispatched input and output. */
static double moe_bytes(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			const struct shape *sh)
{
	const struct mr_plan_model *md = &in->model;

	if (in->impl == MR_PLAN_MESHRUN) {
		struct mr_moe_shape ms;
		mr__plan_moe_shape(md, m, &ms);
		/* device memory: floats of the activation type's size on a
		 * bf16 device too (the MoE buffers are fp32) */
		return piece(sh, (double)mr_moe_act_floats(&ms) * 4.0) +
		       piece(sh, (double)mr_moe_act_ints(&ms) * 4.0);
	}
	return sh->tok * md->top_k * md->capacity_factor *
	       ((sh->fc + sh->ffn) / sh->t + 2.0 * sh->h) * sh->act;
}

/* meshrun: a slot's tensors outside the blocks (model/gpt_params.c). */
static double meshrun_ends(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			   const struct mr__plan_stage *st, const struct shape *sh)
{
	const struct term enc = { "encoded", 1, PER_H, DT_ACT, SPLIT_SP, KEEP_ALL, 0, 0 };
	const struct term lnf = { "lnf", 1, PER_H, DT_ACT, SPLIT_NONE, KEEP_ALL, 0, 0 };
	const struct term row = { "per row", 1, PER_ONE, DT_F32, SPLIT_NONE, KEEP_ALL, 0, 0 };
	const struct term lrow = { "per local row", 1, PER_ONE, DT_F32, SPLIT_SP, KEEP_ALL, 0,
				   0 };
	double Vl = ceil((double)in->model.vocab / m->tp), sum = 0;

	if (m->pp > 1) /* each chunk's received input and gradient */
		sum += 2.0 * st->chunks * term_bytes(sh, &enc);
	if (st->first)
		sum += term_bytes(sh, &enc) + term_bytes(sh, &row); /* token ids */
	if (st->last)
		sum += term_bytes(sh, &lnf) + 2 * term_bytes(sh, &lrow) +
		       piece(sh, sh->tok * Vl * sh->act) + /* logits */
		       3 * term_bytes(sh, &row);           /* lse, losses, targets */
	return sum;
}

/* Megatron: the embedding's dropout mask on the first stage; the final
 * LayerNorm's input and output and the fp32 logits on the last
 * (Korthikanti's 4sbh/t (1 + v/h) for 16-bit activations under sp). */
static double megatron_ends(const struct mr_plan_input *in, const struct mr__plan_stage *st,
			    const struct shape *sh)
{
	const struct term mask = { "embedding dropout mask", 1, PER_H, DT_MASK, SPLIT_SP,
				   KEEP_ALL, 0, 1 };
	const struct term ln = { "final LayerNorm", 2, PER_H, DT_ACT, SPLIT_SP, KEEP_ALL, 0, 0 };
	double sum = 0;

	if (st->first && !sh->nodrop)
		sum += term_bytes(sh, &mask);
	if (st->last)
		sum += term_bytes(sh, &ln) + sh->tok * in->model.vocab * 4.0 / sh->t;
	return sum;
}

/* meshrun: the one recompute layer a stage carves beside its slots (as
 * MR_MEM_ACTS, once: one block recomputes at a time), holding what a
 * recomputing block dropped, each piece the size of a slot's: the
 * tensors rc drops (the dense MLP's only if a recomputing block is
 * dense), and under full, if a recomputing block is MoE, its MoE acts
 * and the output its recomputed forward writes, one (Nl, C) piece (a
 * dense block's recomputation stops before its output). */
static double meshrun_scratch(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			      const struct mr__plan_stage *st, const struct shape *sh, int rc)
{
	const struct term out = { "recomputed output", 1, PER_H, DT_ACT, SPLIT_SP, KEEP_ALL, 0,
				  0 };
	int dense = st->rc_layers > st->rc_moe_layers;
	double sum = 0;

	if (rc == MR_PLAN_RC_NONE || !st->rc_layers)
		return 0;
	for (size_t i = 0; i < NTERMS(meshrun_layer); i++)
		if (!(meshrun_layer[i].keep & keep_bit(rc)) && (dense || !meshrun_layer[i].dense))
			sum += term_bytes(sh, &meshrun_layer[i]);
	if (rc == MR_PLAN_RC_FULL && st->rc_moe_layers)
		sum += term_bytes(sh, &out) + moe_bytes(in, m, sh);
	return sum;
}

double mr__plan_acts(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		     const struct mr__plan_stage *st)
{
	const struct mr_plan_model *md = &in->model;
	struct mr__plan_dims d;
	struct shape sh;
	int dense = st->layers - st->moe_layers, rc = m->recompute;
	double layer, moe = 0, per;

	mr__plan_dims(md, &d);
	sh = (struct shape){ (double)m->micro_batch * md->seq_len / m->cp,
			     md->d_model,
			     md->n_head,
			     (double)md->seq_len / m->cp,
			     m->tp,
			     m->sp,
			     mr__plan_prec(in->prec)->act,
			     in->impl == MR_PLAN_MESHRUN,
			     /* split by tp below: the local columns times tp
			      * (replicated key/value heads: more than qkv / tp) */
			     mr__plan_qkv_local(md, m->tp) * m->tp,
			     d.fc,
			     d.ffn,
			     d.llama };
	if (in->impl == MR_PLAN_MESHRUN) {
		/* the blocks that recompute (recompute_layers: the first k of
		 * each chunk) keep what rc keeps, the others everything */
		int rd = st->rc_layers - st->rc_moe_layers, rm = st->rc_moe_layers;
		double C = md->d_model, stash = 0, mb = st->moe_layers ? moe_bytes(in, m, &sh) : 0;
		per = (dense - rd) * layer_bytes(in->impl, &sh, MR_PLAN_RC_NONE, 0) +
		      (st->moe_layers - rm) * (layer_bytes(in->impl, &sh, MR_PLAN_RC_NONE, 1) + mb) +
		      rd * layer_bytes(in->impl, &sh, rc, 0) +
		      rm * (layer_bytes(in->impl, &sh, rc, 1) + (rc == MR_PLAN_RC_FULL ? 0 : mb)) +
		      meshrun_ends(in, m, st, &sh);
		if (m->pp > 1 && m->schedule == MR_PP_ZBH1) /* the split backward's stash */
			stash = sh.tok * (sh.qkv / m->tp + C + d.fc / m->tp + C) * sh.act *
				st->layers;
		return st->slots * (per + stash) + meshrun_scratch(in, m, st, &sh, rc);
	}
	layer = layer_bytes(in->impl, &sh, rc, 0);
	if (st->moe_layers)
		moe = layer_bytes(in->impl, &sh, rc, 1) +
		      (rc == MR_PLAN_RC_FULL ? 0 : moe_bytes(in, m, &sh));
	/* Megatron frees a chunk's activations at its backward: pairs of
	 * (micro-batch, chunk) alive, each a chunk's share of the layers */
	per = (dense * layer + st->moe_layers * moe) / st->chunks;
	per = st->pairs * per + st->slots * megatron_ends(in, st, &sh);
	if (rc == MR_PLAN_RC_FULL) /* one layer's tensors while it is recomputed */
		per += layer_bytes(in->impl, &sh, MR_PLAN_RC_NONE, 0);
	return per;
}
