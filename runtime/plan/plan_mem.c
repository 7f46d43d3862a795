/*
 * plan_mem.c - the memory of a rank: model states by precision and ZeRO
 * stage, activations (plan_act.c), workspace; per pipeline stage.
 *
 * Model states follow the precision table (plan_presets.c): each part's
 * bytes per parameter, its ledger kind and the ZeRO stage from which it
 * is sharded. Two layouts:
 *   the ZeRO paper's (Rajbhandari et al. 2020, section 5): a part is
 *     psi x bytes on every rank, divided by Nd from its stage on - used
 *     for Megatron-LM and by mr_plan_states;
 *   meshrun's (runtime/parallel/mr_dp.h), which its ledger reports: every
 *     unit (embeddings, each block's attention and MLP half, the final
 *     LayerNorm) padded to a multiple of the shard size S, so the shard
 *     is s = sum(ceil(u / S)) and the padded whole S s; ZeRO-1 keeps full
 *     padded gradients beside the reduced shard; ZeRO-2/3 keep four unit
 *     slots (the first and last unit, two of the largest block half) of
 *     what they shard, and ZeRO-2/3's reduce-scatter outputs (a slot / S)
 *     are workspace. bf16's weight copy is whole, except at ZeRO-3: it
 *     lives in the four parameter slots, beside their fp32 gather.
 * Offload (offload_states) moves the owned optimizer state to MR_MEM_HOST
 * (which the device's total leaves out), and with optimizer+master leaves
 * the device its bf16 weights alone; on cpu ranks it moves nothing.
 *
 * Non-goals: allocator fragmentation, the CUDA context (the cluster's
 * reserve_bytes stands for both).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/mr_attention.h"
#include "kernels/mr_moe.h"
#include "plan_int.h"

void mr_plan_states(double psi, int prec, int zero, int nd, double out[3])
{
	const struct mr__plan_prec *p = mr__plan_prec(prec);

	out[0] = out[1] = out[2] = 0;
	for (int i = 0; i < p->nparts; i++) {
		double b = p->part[i].bytes * psi;
		if (zero >= p->part[i].shard_from && nd > 0)
			b /= nd;
		out[p->part[i].kind] += b;
	}
}

static double pad(size_t n, size_t S)
{
	return (double)((n + S - 1) / S * S);
}

/* A unit's pieces under meshrun's ZeRO (mr_dp.h): the unit whole over
 * the shard group of S; with ep a MoE half's experts apart over the
 * expert-data group of Se. Its padded size and its shard. */
static void unit_layout(const struct mr__plan_stage *st, int u, size_t S, size_t Se,
			double *padded, double *shard)
{
	size_t e = Se ? st->expert[u] : 0, d = st->unit[u] - e;

	*padded = pad(d, S) + (e ? pad(e, Se) : 0);
	*shard = pad(d, S) / (double)S + (e ? pad(e, Se) / (double)Se : 0);
}

/* mr_dp.h's staging chunk at ZeRO-0 (floats). */
#define MR_PLAN_STAGE_CHUNK 4194304.0

/* A stage's unit sizes under its ZeRO layout: the padded whole, the
 * shard, the four slots' padded spans and shards (ZeRO-2/3), and the
 * largest unit's shard (a unit's own size at ZeRO-0). */
struct layout {
	double padded, shard, slots, outs, unit_shard;
};

/*
 * ZeRO-Offload on a GPU rank (runtime/parallel/mr_dp.h), owning `owned`
 * parameters (all of its stage's N at ZeRO-0, else its shard):
 *   optimizer         the AdamW moments leave the device (all of
 *                     MR_MEM_OPTIM) for host memory, beside host copies of
 *                     the owned gradients and parameters: 16 bytes per
 *                     owned parameter under MR_MEM_HOST;
 *   optimizer+master  the same host bytes, the host copy being the master,
 *                     and the device keeps no fp32 weights (a precision
 *                     with a separate compute copy: bf16) - its PARAMS are
 *                     the bf16 copy alone: ZeRO-0 the model's (2 N),
 *                     ZeRO-1/2 the padded gather target (2 padded), ZeRO-3
 *                     the bf16 shard and the slots' bf16 copies (2 shard + 2
 *                     slots); the workspace gains the fp32 staging the
 *                     master is published through (the largest unit's
 *                     shard; ZeRO-0 publishes in chunks of at most
 *                     MR_PLAN_STAGE_CHUNK) and at ZeRO-1/2 the bf16 shard
 *                     the gather reads (2 shard).
 * The gradients stay on the device. fp32 has no separate master
 * (plan_rules.c refuses optimizer+master on GPUs).
 */
static void offload_states(const struct mr__plan_prec *p, int off, int z, double N,
			   const struct layout *l, double *bytes, double *ws)
{
	double owned = z ? l->shard : N;
	int copy = 0;

	bytes[MR_MEM_OPTIM] = 0;
	bytes[MR_MEM_HOST] += 16.0 * owned;
	for (int i = 0; i < p->nparts; i++)
		copy |= p->part[i].shard_from == MR__PLAN_SLOTS;
	if (off != MR_PLAN_OFF_MASTER || !copy)
		return;
	bytes[MR_MEM_PARAMS] = 2.0 * (z == 0 ? N : z < 3 ? l->padded : l->shard + l->slots);
	*ws += 4.0 * l->unit_shard + (z == 1 || z == 2 ? 2.0 * l->shard : 0);
}

/* meshrun's model states on a rank of stage st (mr_dp.h's layout). */
static void meshrun_states(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			   const struct mr__plan_stage *st, double *bytes, double *ws)
{
	const struct mr__plan_prec *p = mr__plan_prec(in->prec);
	int z = mr__plan_zero(in, m), U = st->nunits;
	size_t S = (size_t)mr__plan_shard(m);
	size_t Se = z && m->ep > 1 ? (size_t)(m->dp * m->cp / m->ep) : 0;
	double N = (double)st->params, pm = 0, sm = 0;
	double up[2] = { 0, 0 }, us[2] = { 0, 0 };
	struct layout l = { 0 };

	for (int u = 0; u < U; u++) {
		double pu, su;
		unit_layout(st, u, S, Se, &pu, &su);
		l.padded += pu;
		l.shard += su;
		/* the staging: a unit's shard (ZeRO-0: its whole, chunked) */
		su = z ? su : fmin((double)st->unit[u], MR_PLAN_STAGE_CHUNK);
		l.unit_shard = su > l.unit_shard ? su : l.unit_shard;
		if (u == 0 || u == U - 1) {
			up[u != 0] = pu;
			us[u != 0] = su;
		} else {
			pm = pu > pm ? pu : pm;
			sm = su > sm ? su : sm;
		}
	}
	if (z >= 2) { /* four slots: the first unit, the last, two of the largest half */
		l.slots = up[0] + up[1] + 2 * pm;
		l.outs = us[0] + us[1] + 2 * sm;
	}
	for (int i = 0; i < p->nparts; i++) {
		const struct mr__plan_part *q = &p->part[i];
		double n;
		if (q->shard_from == MR__PLAN_SLOTS)
			n = z >= 3 ? l.slots : N;
		else if (z == 0)
			n = N;
		else if (z >= q->shard_from) /* the shard, and a stage's worth of slots */
			n = l.shard + (q->shard_from >= 2 ? l.slots : 0);
		else /* whole but padded; ZeRO-1's gradients also have the shard */
			n = l.padded + (q->kind == MR_MEM_GRADS ? l.shard : 0);
		bytes[q->kind] += q->bytes * n;
	}
	*ws = l.outs * 4.0;
	if (m->offload != MR_PLAN_OFF_NONE && !in->cluster.cpu)
		offload_states(p, m->offload, z, N, &l, bytes, ws);
}

double mr__plan_attn_ws(int threads, double T, double hs, double C)
{
	double f = (double)mr_attn_head_ws_floats(MR_ATTN_FWD_BQ, MR_ATTN_FWD_BK, (int)hs);
	double b = (double)mr_attn_head_ws_floats(MR_ATTN_BWD_BQ, MR_ATTN_BWD_BK, (int)hs);
	double a = threads * ((f > b ? f : b) + T) * 4, l = threads * 2 * C * 4;

	return a > l ? a : l;
}

/* Megatron-LM's: the ZeRO paper's count on the stage's parameters. */
static void paper_states(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			 const struct mr__plan_stage *st, double *bytes)
{
	double s[3], e[3], Ne = m->ep > 1 ? (double)st->experts : 0;

	/* experts shard over the dp cp / ep ranks that hold the same ones */
	mr_plan_states((double)st->params - Ne, in->prec, m->zero, mr__plan_shard(m), s);
	mr_plan_states(Ne, in->prec, m->zero, m->dp * m->cp / m->ep, e);
	for (int k = 0; k < 3; k++)
		bytes[k] += s[k] + e[k];
}

/* meshrun's workspace (gpt_params.c's carve_ws, cp.c's buffers, the ep
 * exchange's scratch), 256-byte pieces where the model carves them;
 * the MoE layers' device scalars (gpt_params.c's moe_stat), llama's
 * SwiGLU output gradient behind dfch, and its rotary tables (a
 * position per local row, hs/2 frequencies: allocations of their own). */
static double meshrun_workspace(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
				const struct mr__plan_stage *st)
{
	const struct mr_plan_model *md = &in->model;
	double b = mr__plan_prec(in->prec)->act, N = (double)m->micro_batch * md->seq_len / m->cp;
	double C = md->d_model, Cl = C / m->tp, Nl = m->sp ? N / m->tp : N, hs = C / md->n_head;
	double ones = N, ws = 0, kws, mws = 0, T = (double)md->seq_len / m->cp;
	double pieces[13];
	struct mr__plan_dims d;
	struct mr_moe_shape ms;

	mr__plan_moe_shape(md, m, &ms);
	if (md->moe_every) {
		mws = (double)mr_moe_ws_floats(&ms) * 4;
		if (m->ep > 1 && (double)m->ep * ms.cap > ones)
			ones = (double)m->ep * ms.cap;
	}
	mr__plan_dims(md, &d);
	kws = mr__plan_attn_ws(in->threads, T, hs, C);
	pieces[0] = ones * b;
	pieces[1] = Nl * C * b;                  /* dres */
	pieces[2] = N * C * b;                   /* dln */
	pieces[3] = N * Cl * b;                  /* datty */
	pieces[4] = N * mr__plan_qkv_local(md, m->tp) * b; /* dqkv */
	pieces[5] = N * (d.fc + (d.llama ? d.ffn : 0)) / m->tp * b; /* dfch (| dswiglu) */
	pieces[6] = N * C * b;                   /* dtmp */
	pieces[7] = m->sp ? N * C * b : 0;       /* the sp gather */
	pieces[8] = m->tp > 1 ? N * C * b + 3 * N * 4 : 0; /* tp scratch, vocab-parallel CE */
	pieces[9] = m->sp ? 2 * C * 4 : 0;
	pieces[10] = kws > mws ? kws : mws;
	/* replicated key/value heads: a layer's k and v weight gradients */
	pieces[11] = d.llama && m->tp > d.kv_heads ? 2 * hs * C * 4 : 0;
	/* each MoE layer's aux loss and dropped count (the sync-free MoE's
	 * device scalars), for every layer of the model */
	pieces[12] = md->moe_every ? 2.0 * md->n_layer * 4 : 0;
	for (int i = 0; i < 13; i++)
		ws += pieces[i] > 0 ? ceil(pieces[i] / 256) * 256 : 0;
	if (m->cp > 1) { /* mr_cp.h's buffers, by algorithm */
		struct mr__plan_cpx x;
		mr__plan_cpx(in, m, &x);
		ws += mr__plan_cp(m->cp_algo)->workspace(&x);
	}
	if (m->ep > 1 && st->moe_layers) /* the exchange's send and receive scratch */
		ws += 2.0 * md->n_experts * ms.cap * C * b;
	if (d.llama) /* rope_pos, rope_freq */
		ws += N * 4 + floor(hs / 2) * 4;
	return ws;
}

/* Megatron-LM's: ZeRO-3's prefetched parameters (two block halves), the
 * MoE dispatch buffers, tensor parallel's gather buffer. */
static double megatron_workspace(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
				 const struct mr__plan_stage *st)
{
	const struct mr_plan_model *md = &in->model;
	const struct mr__plan_prec *p = mr__plan_prec(in->prec);
	double N = (double)m->micro_batch * md->seq_len / m->cp, ws = 0, big = 0;

	for (int u = 0; u < st->nunits; u++)
		if ((double)st->unit[u] > big)
			big = (double)st->unit[u];
	if (m->zero >= 3)
		ws += 2 * big * p->param_comm;
	if (m->tp > 1)
		ws += N * md->d_model * p->act;
	if (m->ep > 1 && st->moe_layers)
		ws += 2 * N * md->top_k * md->capacity_factor * md->d_model * p->act;
	return ws;
}

double mr__plan_workspace(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
			  const struct mr__plan_stage *st)
{
	return in->impl == MR_PLAN_MESHRUN ? meshrun_workspace(in, m, st)
					   : megatron_workspace(in, m, st);
}

int mr__plan_mem(const struct mr_plan_input *in, const struct mr_plan_mesh *mesh,
		 const int *split, int stage, struct mr_plan_mem *out, struct mr_errbuf *eb)
{
	struct mr__plan_stage st;
	double ws = 0;
	int rc;

	memset(out, 0, sizeof(*out));
	if ((rc = mr__plan_stage(in, mesh, split, stage, 1, &st, eb)) < 0)
		return rc;
	if (in->impl == MR_PLAN_MESHRUN)
		meshrun_states(in, mesh, &st, out->bytes, &ws);
	else
		paper_states(in, mesh, &st, out->bytes);
	out->bytes[MR_MEM_ACTS] = mr__plan_acts(in, mesh, &st);
	out->bytes[MR_MEM_WORKSPACE] = ws + mr__plan_workspace(in, mesh, &st);
	for (int k = 0; k < MR_MEM_HOST; k++) /* the device's memory */
		out->total += out->bytes[k];
	out->stage = stage;
	mr__plan_stage_release(&st);
	return 0;
}

int mr_plan_mem_stage(const struct mr_plan_input *in, const struct mr_plan_mesh *mesh,
		      int stage, struct mr_plan_mem *out, struct mr_errbuf *eb)
{
	int *split, rc;

	memset(out, 0, sizeof(*out));
	if (stage < 0 || stage >= mesh->pp)
		return mr_errf_field(eb, MR_ERANGE, "stage", "stage %d is outside [0, %d)", stage,
				     mesh->pp);
	if ((rc = mr__plan_split(in, mesh, &split, eb)) < 0)
		return rc;
	rc = mr__plan_mem(in, mesh, split, stage, out, eb);
	free(split);
	return rc;
}
