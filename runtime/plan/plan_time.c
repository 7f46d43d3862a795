/*
 * plan_time.c - the step time of a mesh: each stage's passes (compute at
 * the cluster's mfu plus the communication inside them that the runtime
 * does not hide), the pipeline's makespan under its schedule, and the
 * data-parallel reduction that ends the step.
 *
 * FLOPs as the runtime counts them (model/gpt_params.c: 6N + 6LCT per
 * token in all, a third of it forward): per token and layer 2 x 12C^2/tp
 * for the GEMMs (MoE: 8C^2 for attention, 2CE for the router, top_k x
 * 16C^2 for the experts a token visits) and 2sC/tp for causal attention
 * over s positions; 2CV/tp for the LM head. Llama's block (the same
 * convention, the runtime's count of its own tensors): 2 x (C (NH + 2 NKV)
 * hs + C NH hs + 3 F C)/tp for q, k, v, o and SwiGLU's gate, up and down
 * GEMMs (MoE: 2CE for the router and top_k x 6FC/tp for the SwiGLU
 * experts a token visits) - grouped-query attention shrinks k and v's GEMMs, not the
 * attention itself (2sC/tp: every query head still scores s keys). So a
 * model's total is 6N + 6LCT per token with N its matrices - the
 * Chinchilla-style count (Hoffmann et al. 2022) with causal attention's
 * half (their 12LCT counts every key for every query), as the runtime's
 * mr_gpt_flops_per_token counts it for its mfu. Backward costs twice the
 * forward; recomputation adds to it (passes(): Megatron's full a forward,
 * selective the attention core; meshrun's full a forward of the blocks
 * that recompute, twice under zb-h1, selective only element-wise work).
 *
 * What each mode issues per micro-batch and layer, and what hides it:
 *   tp  2 all-reduces forward and 2 backward (sp: 2 all-gathers and 2
 *       reduce-scatters each way) of the (b s/cp, C) rows, the embedding
 *       and LM head's and the vocab-parallel loss's; never hidden;
 *   cp  per algorithm (plan_cp.c): the ring's hops hidden behind the
 *       attention blocks they feed, allgather's and ulysses' not;
 *   ep  a dispatch and a combine all-to-all each way of the routed rows;
 *       not hidden;
 *   pp  the residual rows to the next stage and their gradient back:
 *       posted ahead, only the fill and drain's 2(p-1) transfers count;
 *   dp  per step (mr_dp.h): DDP all-reduces the gradients from the last
 *       backward (hidden behind it where the runtime overlaps: no
 *       pipeline, no expert parallelism); ZeRO-1 reduce-scatters them and
 *       all-gathers the parameters after the update; ZeRO-2 reduce-
 *       scatters every micro-batch's, behind its backward; ZeRO-3 also
 *       all-gathers the parameters before each forward and backward,
 *       prefetched behind the pass; HSDP all-reduces the shards across
 *       replicas; experts' gradients reduce over the expert-data group.
 *
 * Hiding needs hardware that moves data while the cores compute (a GPU's
 * copy engines and NIC); the cluster's overlap (1 on GPUs, 0 for CPU
 * ranks, whose cores do the copies) scales what compute can hide.
 *
 * The optimizer reads and writes what a rank owns (its parameters, or its
 * ZeRO shard) once a step: the precision row's bytes per parameter at the
 * GPU's memory bandwidth, or offloaded at the host's plus the PCIe
 * transfers (optim_time).
 *
 * Non-goals: kernel launch overheads, stragglers, contention for cores.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mr_mesh.h"
#include "plan_int.h"

struct ctx {
	const struct mr_plan_input *in;
	const struct mr_plan_mesh *m;
	const struct mr_plan_cluster *c;
	double act, tok, C, rate;
	int inter[MR_GROUP__COUNT];
};

/* Forward FLOPs per token of `dense` dense and `moe` MoE blocks on a rank
 * of mesh m. */
static double blocks_flops(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			   int dense_n, int moe_n)
{
	const struct mr_plan_model *md = &in->model;
	struct mr__plan_dims d;
	double C = md->d_model, t = m->tp, s = md->seq_len;
	double attn = 2 * s * C / t, dense = 24 * C * C / t + attn;
	double moe = 8 * C * C / t + attn + 2 * C * md->n_experts + md->top_k * 16 * C * C / t;

	mr__plan_dims(md, &d);
	if (d.llama) { /* q k v, o; gate, up, down (top_k experts' of E: the router) */
		/* q k v as a rank computes them: replicated key/value heads on
		 * every rank sharing them */
		double qkv = mr__plan_qkv_local(md, m->tp) * t;
		dense = 2 * (C * qkv + C * C + 3 * d.ffn * C) / t + attn;
		moe = 2 * (C * qkv + C * C) / t + attn + 2 * C * md->n_experts +
		      md->top_k * 2 * 3 * d.ffn * C / t;
	}
	return dense_n * dense + moe_n * moe;
}

/* A dense block's MLP output GEMM, forward FLOPs per token on a rank: a
 * recomputation stops before it (model/gpt.c). */
static double mlp_out_flops(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	struct mr__plan_dims d;

	mr__plan_dims(&in->model, &d);
	return 2.0 * in->model.d_model * d.ffn / m->tp;
}

double mr__plan_fwd_flops(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			  const struct mr__plan_stage *st)
{
	const struct mr_plan_model *md = &in->model;
	double f = blocks_flops(in, m, st->layers - st->moe_layers, st->moe_layers);

	if (st->last)
		f += 2.0 * md->d_model * md->vocab / m->tp;
	return (double)m->micro_batch * md->seq_len / m->cp * f;
}

/* One collective, counted under mode a: its time (count times). */
static double coll(struct ctx *x, struct mr_plan_time *t, int a, enum mr__plan_op op, int n,
		   int inter, double bytes, double count)
{
	double sent, s = mr__plan_coll(x->c, op, n, inter, bytes, &sent);

	if (op != MR__OP_P2P && n <= 1)
		return 0;
	t->comm[a].bytes += sent * count;
	t->comm[a].time_s += s * count;
	t->comm[a].ops += (long)count;
	t->comm[a].inter |= inter;
	return s * count;
}

/* Tensor parallel in one micro-batch's forward and backward on stage st
 * (cnt micro-batches): per layer 2 all-reduces each way (sp: 2
 * all-gathers and 2 reduce-scatters each way); the embedding's sum and
 * the LM head's input, each way; the vocab-parallel loss's 3 row sums. */
/* llama with tp above n_kv_head: each block's backward sums its k and v
 * weight gradients (2 C hs fp32) over the rep = tp / n_kv_head ranks
 * sharing the heads (layers/tp.c's mr_tp_kv_grads_end), inside the tp
 * group. */
static double kv_sum(struct ctx *x, struct mr_plan_time *t, const struct mr__plan_stage *st,
		     double cnt)
{
	const struct mr_plan_model *md = &x->in->model;
	struct mr__plan_dims d;
	int rep;

	mr__plan_dims(md, &d);
	rep = d.llama && d.kv_heads < x->m->tp ? x->m->tp / d.kv_heads : 1;
	if (rep <= 1)
		return 0;
	return coll(x, t, MR_AXIS_TP, MR__OP_ALLREDUCE, rep, x->inter[MR_GROUP_TP],
		    2.0 * md->d_model * (md->d_model / md->n_head) * 4.0, st->layers * cnt);
}

static double tp_pass(struct ctx *x, struct mr_plan_time *t, const struct mr__plan_stage *st,
		      double cnt)
{
	const struct mr_plan_mesh *m = x->m;
	int n = m->tp, in = x->inter[MR_GROUP_TP];
	double rows = x->tok * x->C * x->act, s = 0, ends = st->first + st->last;

	if (n <= 1)
		return 0;
	if (m->sp) {
		s += coll(x, t, MR_AXIS_TP, MR__OP_ALLGATHER, n, in, rows,
			  (4.0 * st->layers + ends) * cnt);
		s += coll(x, t, MR_AXIS_TP, MR__OP_REDUCE_SCATTER, n, in, rows,
			  (4.0 * st->layers + ends) * cnt);
	} else {
		s += coll(x, t, MR_AXIS_TP, MR__OP_ALLREDUCE, n, in, rows,
			  (4.0 * st->layers + 2 * ends) * cnt);
	}
	if (st->last)
		s += coll(x, t, MR_AXIS_TP, MR__OP_ALLREDUCE, n, in, x->tok * 4, 3 * cnt);
	return s + kv_sum(x, t, st, cnt);
}

/* Context parallel in one layer's forward (bwd 0) or backward (1): the
 * time not hidden behind the attention (attn_s its compute). */
static double cp_layer(struct ctx *x, struct mr_plan_time *t, int bwd, double attn_s,
		       double cnt)
{
	const struct mr_plan_mesh *m = x->m;
	const struct mr__plan_cp *alg = mr__plan_cp(m->cp_algo);
	struct mr__plan_cpx cx;
	struct mr__plan_xfer xf[4];
	int in = x->inter[MR_GROUP_CP], n;
	double s = 0;

	if (m->cp <= 1 || !alg)
		return 0;
	mr__plan_cpx(x->in, m, &cx);
	n = alg->xfers(&cx, bwd, xf);
	for (int i = 0; i < n; i++)
		s += coll(x, t, MR_AXIS_CP, xf[i].op, xf[i].op == MR__OP_P2P ? 2 : m->cp, in,
			  xf[i].bytes, xf[i].count * cnt);
	return alg->hides ? fmax(0, s - x->c->overlap * attn_s * cnt * (m->cp - 1) / m->cp) : s;
}

/* Expert parallel in one micro-batch's forward and backward: per MoE
 * layer four exchanges (dispatch and combine, each way), each the rows'
 * all-to-all after a counts' one. */
static double ep_pass(struct ctx *x, struct mr_plan_time *t, const struct mr__plan_stage *st,
		      double cnt)
{
	const struct mr_plan_model *md = &x->in->model;
	int n = x->m->ep, in = x->inter[MR_GROUP_EP];
	double routed = x->tok * md->top_k * (md->dropless ? 1.0 : fmin(1.0, md->capacity_factor));

	if (n <= 1 || !st->moe_layers)
		return 0;
	return coll(x, t, MR_AXIS_EP, MR__OP_ALLTOALL, n, in, routed * x->C * x->act,
		    4.0 * st->moe_layers * cnt) +
	       coll(x, t, MR_AXIS_EP, MR__OP_ALLTOALL, n, in, 4.0 * md->n_experts,
		    4.0 * st->moe_layers * cnt);
}

/* meshrun's recomputation in one micro-batch's backward (times n: zb-h1's
 * weight phase recomputes again): full re-runs the recomputing blocks'
 * forward collectives (tp's, ep's dispatch and combine, cp's exchanges),
 * selective under sp the norms' all-gathers. Seconds. */
static double recompute_comm(struct ctx *x, struct mr_plan_time *t,
			     const struct mr__plan_stage *st, double cnt, double n)
{
	const struct mr_plan_mesh *m = x->m;
	const struct mr_plan_model *md = &x->in->model;
	int tp = m->tp, tin = x->inter[MR_GROUP_TP], full = m->recompute == MR_PLAN_RC_FULL;
	double rows = x->tok * x->C * x->act, L = st->rc_layers * n * cnt, s = 0;
	/* reductions re-run: the attention output's, and a MoE MLP's (a dense
	 * block's recomputation stops before its MLP output) */
	double R = (st->rc_layers + st->rc_moe_layers) * n * cnt;
	double s_attn = x->tok * 2 * md->seq_len * x->C / m->tp / x->rate;

	if (tp > 1 && m->sp)
		s += coll(x, t, MR_AXIS_TP, MR__OP_ALLGATHER, tp, tin, rows, 2 * L);
	if (tp > 1 && m->sp && full)
		s += coll(x, t, MR_AXIS_TP, MR__OP_REDUCE_SCATTER, tp, tin, rows, R);
	if (tp > 1 && !m->sp && full)
		s += coll(x, t, MR_AXIS_TP, MR__OP_ALLREDUCE, tp, tin, rows, R);
	if (!full)
		return s;
	if (m->ep > 1 && st->rc_moe_layers) {
		double routed = x->tok * md->top_k *
				(md->dropless ? 1.0 : fmin(1.0, md->capacity_factor));
		double k = 2.0 * st->rc_moe_layers * n * cnt;
		s += coll(x, t, MR_AXIS_EP, MR__OP_ALLTOALL, m->ep, x->inter[MR_GROUP_EP],
			  routed * x->C * x->act, k) +
		     coll(x, t, MR_AXIS_EP, MR__OP_ALLTOALL, m->ep, x->inter[MR_GROUP_EP],
			  4.0 * md->n_experts, k);
	}
	return s + cp_layer(x, t, 0, s_attn, cnt) * st->rc_layers * n;
}

/* Forward (F) and backward (B) of one micro-batch on stage st, with the
 * communication they do not hide; Fc, Bc the compute alone, Wc the part
 * of Bc the schedule's W action runs (zb-h1). Volumes are counted into t
 * only when count > 0 (m micro-batches of the critical stage).
 *
 * Recomputation: Megatron's as Korthikanti prices it (full a forward,
 * selective the attention core). meshrun's full recompute re-runs the
 * recomputing blocks' forward (their FLOPs but a dense block's MLP
 * output GEMM, which a recomputation skips; not the head's) in B, and
 * under zb-h1 again in W (whose weight gradients need the block's
 * inputs, dropped again after B); selective recomputes element-wise
 * work (norms, GELU / SwiGLU: counted as no time, the model has no
 * memory-bound term) and under sp re-gathers the norms. */
static void passes(struct ctx *x, struct mr_plan_time *t, const struct mr__plan_stage *st,
		   double count, double *F, double *B, double *Fc, double *Bc, double *Wc)
{
	const struct mr_plan_mesh *m = x->m;
	struct mr_plan_time scratch = { 0 };
	struct mr_plan_time *tt = count > 0 ? t : &scratch;
	double cnt = count > 0 ? count : 1;
	double s = x->in->model.seq_len, attn_f = x->tok * 2 * s * x->C / m->tp / x->rate;
	double f = mr__plan_fwd_flops(x->in, m, st) / x->rate, cf, cb, rcx = 0;
	double share = m->pp > 1 ? mr_pp_weight_share((enum mr_pp_kind)m->schedule) : 0;
	int meshrun = x->in->impl == MR_PLAN_MESHRUN;

	*Fc = f;
	if (meshrun) {
		double n = share > 0 ? 2 : 1; /* zb-h1's weight phase recomputes again */
		if (m->recompute == MR_PLAN_RC_FULL)
			rcx = x->tok *
			      (blocks_flops(x->in, m, st->rc_layers - st->rc_moe_layers,
					    st->rc_moe_layers) -
			       (st->rc_layers - st->rc_moe_layers) * mlp_out_flops(x->in, m)) /
			      x->rate;
		*Bc = 2 * f + n * rcx;
		*Wc = share * 2 * f + (share > 0 ? rcx : 0);
	} else {
		*Bc = 2 * f + (m->recompute == MR_PLAN_RC_FULL	    ? f
			       : m->recompute == MR_PLAN_RC_SELECTIVE ? attn_f * st->layers
								      : 0);
		*Wc = share * *Bc;
	}
	cf = (tp_pass(x, tt, st, cnt) + ep_pass(x, tt, st, cnt)) / cnt / 2;
	cb = cf;
	if (meshrun && m->recompute != MR_PLAN_RC_NONE)
		cb += recompute_comm(x, tt, st, cnt, share > 0 ? 2 : 1) / cnt;
	cf += cp_layer(x, tt, 0, attn_f, cnt) / cnt * st->layers;
	cb += cp_layer(x, tt, 1, 2 * attn_f, cnt) / cnt * st->layers;
	*F = *Fc + cf;
	*B = *Bc + cb;
}

/* One ZeRO stage's collectives for n gradient elements over a group of S
 * ranks (mr_dp.h): exposed seconds, what compute (Fc, Bc: one
 * micro-batch's passes, already scaled by the overlap) can hide taken off
 * where the runtime overlaps. */
static double zero_colls(struct ctx *x, struct mr_plan_time *t, int z, double n, int S,
			 int inter, double Fc, double Bc, int overlap)
{
	const struct mr__plan_prec *p = mr__plan_prec(x->in->prec);
	double G = n * p->grad_comm, P = n * p->param_comm, mb = x->m->micro_batches, rs, ag;

	switch (z) {
	case 0:
		rs = coll(x, t, MR_AXIS_DP, MR__OP_ALLREDUCE, S, inter, G, 1);
		return overlap ? fmax(0, rs - Bc) : rs;
	case 1:
		rs = coll(x, t, MR_AXIS_DP, MR__OP_REDUCE_SCATTER, S, inter, G, 1);
		ag = coll(x, t, MR_AXIS_DP, MR__OP_ALLGATHER, S, inter, P, 1);
		return (overlap ? fmax(0, rs - Bc) : rs) + ag;
	case 2: /* every micro-batch's, behind its backward */
		rs = coll(x, t, MR_AXIS_DP, MR__OP_REDUCE_SCATTER, S, inter, G, mb) / mb;
		ag = coll(x, t, MR_AXIS_DP, MR__OP_ALLGATHER, S, inter, P, 1);
		return mb * fmax(0, rs - Bc) + ag;
	default: /* and the parameters before each pass, prefetched */
		ag = coll(x, t, MR_AXIS_DP, MR__OP_ALLGATHER, S, inter, P, 2 * mb) / (2 * mb);
		rs = coll(x, t, MR_AXIS_DP, MR__OP_REDUCE_SCATTER, S, inter, G, mb) / mb;
		return mb * (fmax(0, ag - Fc) + fmax(0, ag + rs - Bc));
	}
}

/* The data-parallel reduction of stage st's gradients: exposed seconds.
 * The dense parameters over the shard group; under expert parallelism the
 * experts over the expert-data group (dp cp / ep ranks holding the same
 * ones), sharded there too under ZeRO. */
static double dp_step(struct ctx *x, struct mr_plan_time *t, const struct mr__plan_stage *st,
		      double Fc, double Bc)
{
	const struct mr_plan_mesh *m = x->m;
	const struct mr__plan_prec *p = mr__plan_prec(x->in->prec);
	int z = mr__plan_zero(x->in, m), S = mr__plan_shard(m), R = m->dp * m->cp / S;
	int sin = S == m->dp * m->cp ? x->inter[MR_GROUP_DP_CP]
				     : m->tp * m->cp * S > x->c->gpus_per_node;
	double Ne = m->ep > 1 ? (double)st->experts : 0, Nd = (double)st->params - Ne, ex;
	/* DDP reduces from the backward's hooks without ep (with it, after the
	 * backward); ZeRO always; a pipeline stage once, after its last */
	int overlap = (m->ep == 1 || z > 0) && (m->pp == 1 || x->in->impl == MR_PLAN_MEGATRON);

	/* what the link can hide behind compute: all of it where the GPU's
	 * copy engines move it, none where the same cores copy (cpu ranks) */
	Fc *= x->c->overlap;
	Bc *= x->c->overlap;
	ex = zero_colls(x, t, z, Nd, S, sin, Fc, Bc, overlap);
	if (Ne > 0)
		ex += zero_colls(x, t, z, Ne, m->dp * m->cp / m->ep, x->inter[MR_GROUP_EDP], Fc,
				 Bc, overlap);
	if (R > 1) /* HSDP: the shards across the replicas */
		ex += coll(x, t, MR_AXIS_DP, MR__OP_ALLREDUCE, R, 1,
			   (z ? Nd / S : Nd) * p->grad_comm, 1);
	return ex;
}

/* The schedule's makespan for m micro-batches of F and B, W of B the
 * weight-gradient pass the schedule defers (zb-h1: passes' Wc, from the
 * schedule's own share, mr_pp_weight_share). */
static double makespan(const struct mr_plan_mesh *m, double F, double B, double W)
{
	struct mr_pp_spec sp;

	mr__plan_pp_spec(m, &sp);
	return mr_pp_makespan(&sp, F, B - W, W);
}

/* The optimizer's step over `owned` parameters: on the GPU at its
 * memory's pace; offloaded (meshrun on GPUs), on the host's cores at the
 * host memory's pace (the precision row's bytes per parameter) plus its
 * PCIe transfers, one after the other (no overlap with the next forward
 * is assumed): the fp32 gradient shard down, and the updated fp32
 * weights up (optimizer+master: the host's master, which the GPU turns
 * into its bf16 copy, with a refresh's rounding; optimizer: the GPU's
 * master, which also went down). */
static double optim_time(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			 double owned)
{
	const struct mr__plan_prec *p = mr__plan_prec(in->prec);
	const struct mr_plan_cluster *c = &in->cluster;
	double down, up;

	if (m->offload == MR_PLAN_OFF_NONE || c->cpu || c->host_bw <= 0 || c->pcie_bw <= 0)
		return owned * p->optim_touch / c->mem_bw;
	down = p->grad_comm + (m->offload == MR_PLAN_OFF_MASTER ? 0 : 4);
	up = 4;
	return owned * p->optim_touch / c->host_bw + owned * (down + up) / c->pcie_bw;
}

int mr__plan_time(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		  const int *split, struct mr_plan_time *t, struct mr_errbuf *eb)
{
	struct ctx x = { in, m, &in->cluster, mr__plan_prec(in->prec)->act,
			 (double)m->micro_batch * in->model.seq_len / m->cp, in->model.d_model,
			 in->cluster.peak_flops * in->cluster.mfu, { 0 } };
	struct mr__plan_stage st, worst;
	double best = -1, F = 0, B = 0, Fc = 0, Bc = 0, Wc = 0, span, p2p = 0, dp;
	int s, g, rc, ws = 0;

	memset(t, 0, sizeof(*t));
	for (g = 0; g < MR_GROUP__COUNT; g++) /* the groups the modes use */
		if (g == MR_GROUP_TP || g == MR_GROUP_CP || g == MR_GROUP_PP || g == MR_GROUP_EP ||
		    g == MR_GROUP_EDP || g == MR_GROUP_DP_CP)
			x.inter[g] = mr_plan_group_link(in, m, g);
	/* the critical stage: the one whose passes take longest */
	for (s = 0; s < m->pp; s++) {
		double f, b, fc, bc, wc;
		if ((rc = mr__plan_stage(in, m, split, s, 0, &st, eb)) < 0)
			return rc;
		passes(&x, t, &st, 0, &f, &b, &fc, &bc, &wc);
		if (f + b > best) {
			best = f + b;
			ws = s;
		}
		mr__plan_stage_release(&st);
	}
	if ((rc = mr__plan_stage(in, m, split, ws, 0, &worst, eb)) < 0)
		return rc;
	passes(&x, t, &worst, m->micro_batches, &F, &B, &Fc, &Bc, &Wc);
	span = makespan(m, F, B, Wc);
	if (m->pp > 1) {
		double rows = x.tok / (m->sp ? m->tp : 1) * x.C * x.act;
		p2p = coll(&x, t, MR_AXIS_PP, MR__OP_P2P, 2, x.inter[MR_GROUP_PP], rows,
			   2.0 * (m->pp - 1));
		/* the rest of the stage's transfers overlap its passes */
		coll(&x, t, MR_AXIS_PP, MR__OP_P2P, 2, x.inter[MR_GROUP_PP], rows,
		     2.0 * m->micro_batches * m->v - 2.0 * (m->pp - 1) > 0
			     ? 2.0 * m->micro_batches * m->v - 2.0 * (m->pp - 1)
			     : 0);
		t->comm[MR_AXIS_PP].exposed_s = p2p;
	}
	dp = dp_step(&x, t, &worst, Fc, Bc);
	t->comm[MR_AXIS_DP].exposed_s = dp;
	for (int a = 0; a < MR_AXIS__COUNT; a++)
		if (a != MR_AXIS_DP && a != MR_AXIS_PP)
			t->comm[a].exposed_s = t->comm[a].time_s;
	/* cp's ring hides part of its time: what the passes carry */
	t->comm[MR_AXIS_CP].exposed_s =
		fmax(0, (F + B - Fc - Bc) * m->micro_batches - t->comm[MR_AXIS_TP].exposed_s -
				t->comm[MR_AXIS_EP].exposed_s);
	/* the optimizer's pass over what the rank owns (mr_dp.h: all of its
	 * parameters, or its ZeRO shard), at the memory's pace */
	{
		double Ne = m->ep > 1 ? (double)worst.experts : 0, Nd = (double)worst.params - Ne;
		double owned = mr__plan_zero(in, m)
				       ? Nd / mr__plan_shard(m) + Ne * m->ep / (m->dp * m->cp)
				       : Nd + Ne;
		t->optim_s = optim_time(in, m, owned);
	}
	t->compute_s = m->micro_batches * (Fc + Bc);
	t->bubble_s = span - m->micro_batches * (F + B);
	t->step_s = span + p2p + dp + t->optim_s;
	/* what is left is communication (rounding aside) */
	t->exposed_s = t->step_s - t->compute_s - t->bubble_s - t->optim_s;
	if (t->exposed_s < 1e-9 * t->step_s)
		t->exposed_s = 0;
	t->tokens_per_s = (double)in->global_batch * in->model.seq_len / t->step_s;
	mr__plan_stage_release(&worst);
	return 0;
}
