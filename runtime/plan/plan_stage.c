/*
 * plan_stage.c - a pipeline stage as the runtime builds it: which blocks
 * it holds (the runtime's own split, parallel/mr_pp_split.h), its
 * parameter units in table order (model/mr_gpt.h: the embeddings on the
 * first stage and, for the tied LM head, on the last; each block's
 * attention and MLP halves; the final norm on the last, with llama's
 * untied head), sliced by tp and ep as the table slices them (gpt2's
 * tables and llama's, model/gpt_table.c), and how many micro-batches it keeps
 * in flight under its schedule (counted on the schedule's action lists,
 * as parallel/pp.c assigns its slots).
 *
 * Non-goals: bytes (plan_mem.c).
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/mr_moe.h"
#include "parallel/mr_pp_split.h"
#include "plan_int.h"

void mr__plan_gpt_config(const struct mr_plan_model *m, struct mr_gpt_config *gc)
{
	memset(gc, 0, sizeof(*gc));
	gc->vocab = m->vocab;
	gc->max_seq = m->max_seq > 0 ? m->max_seq : m->seq_len;
	gc->n_layer = m->n_layer;
	gc->d_model = m->d_model;
	gc->n_head = m->n_head;
	gc->moe_every = m->moe_every;
	gc->n_experts = m->moe_every ? m->n_experts : 0;
	gc->top_k = m->moe_every ? m->top_k : 0;
	gc->capacity_factor = (float)m->capacity_factor;
	gc->moe_dropless = m->moe_every ? m->dropless : 0;
	gc->arch = m->arch;
	gc->n_kv_head = m->n_kv_head;
	gc->ffn_hidden = m->ffn_hidden;
	gc->tie_embeddings = m->tie_embeddings;
	gc->rope_theta = (float)m->rope_theta;
}

void mr__plan_dims(const struct mr_plan_model *m, struct mr__plan_dims *d)
{
	struct mr_gpt_config gc;
	double hs;

	mr__plan_gpt_config(m, &gc);
	hs = m->n_head > 0 ? (double)(m->d_model / m->n_head) : 0;
	d->llama = m->arch == MR_ARCH_LLAMA;
	d->kv_heads = mr_gpt_kv_heads(&gc);
	d->ffn = mr_gpt_ffn(&gc);
	d->fc = (d->llama ? 2 : 1) * d->ffn;
	d->qkv = (m->n_head + 2.0 * d->kv_heads) * hs;
	d->tied = mr_gpt_tied(&gc);
}

int mr__plan_kv_local(const struct mr_plan_model *m, int tp)
{
	struct mr_gpt_config gc;

	mr__plan_gpt_config(m, &gc);
	return mr_gpt_kv_local(&gc, tp);
}

double mr__plan_qkv_local(const struct mr_plan_model *m, int tp)
{
	double hs = m->n_head > 0 ? (double)(m->d_model / m->n_head) : 0;

	return ((double)(m->n_head / tp) + 2.0 * mr__plan_kv_local(m, tp)) * hs;
}

void mr__plan_moe_shape(const struct mr_plan_model *md, const struct mr_plan_mesh *m,
			struct mr_moe_shape *s)
{
	struct mr__plan_dims d;

	mr__plan_dims(md, &d);
	memset(s, 0, sizeof(*s));
	if (!md->moe_every)
		return;
	s->N = m->micro_batch * md->seq_len / m->cp;
	s->C = md->d_model;
	s->H = (int)d.ffn / m->tp;
	s->swiglu = d.llama;
	s->E = md->n_experts;
	s->k = md->top_k;
	s->cap = md->dropless ? s->N
			      : mr_moe_capacity(s->N, s->E, s->k, (float)md->capacity_factor);
}

int mr__plan_zero(const struct mr_plan_input *in, const struct mr_plan_mesh *m)
{
	return in->impl == MR_PLAN_MESHRUN && m->pp > 1 && m->zero > 1 ? 1 : m->zero;
}

int mr__plan_shard(const struct mr_plan_mesh *m)
{
	return m->hsdp_shard > 0 && m->hsdp_shard < m->dp ? m->hsdp_shard : m->dp * m->cp;
}

/* Parameters of a layer's halves on a rank (tp, ep slices as the table
 * cuts them: QKV and fc column-parallel, the projections row-parallel with
 * replicated biases, experts E/ep per rank, the router replicated): the
 * attention half, a dense MLP half and a MoE one. Llama's halves: the
 * RMSNorm weight, q (NH hs, C), k and v (NKV hs, C: one head a rank when
 * tp above NKV replicates them) and o (C, NH hs); the
 * RMSNorm weight, gate and up (F, C) and down (C, F); a MoE half the
 * RMSNorm weight, the router (E, C) and per expert gate | up (2F, C) and
 * down (C, F) (model/gpt_table.c's llama_table); no biases. */
static void layer_units(const struct mr_plan_model *md, const struct mr_plan_mesh *m,
			size_t *attn, size_t *dense, size_t *moe, size_t *experts)
{
	size_t C = (size_t)md->d_model, t = (size_t)m->tp, Cl = C / t;
	size_t E = (size_t)md->n_experts, El = m->ep > 0 ? E / (size_t)m->ep : E;
	struct mr__plan_dims d;

	mr__plan_dims(md, &d);
	if (d.llama) {
		size_t Ql = (size_t)mr__plan_qkv_local(md, m->tp), Fl = (size_t)d.ffn / t;
		*attn = C + Ql * C + C * Cl;
		*dense = C + 3 * Fl * C;
		*experts = El * 3 * Fl * C;
		*moe = C + E * C + *experts;
		return;
	}
	*attn = 2 * C + 3 * Cl * C + 3 * Cl + C * Cl + C;
	*dense = 2 * C + 4 * Cl * C + 4 * Cl + C * 4 * Cl + C;
	*experts = El * (4 * Cl * C + 4 * Cl + C * 4 * Cl + C);
	*moe = 2 * C + E * C + *experts;
}

/* Micro-batches (and micro-batch x chunk pairs) alive at once on a stage:
 * the schedule's own count (mr_pp_in_flight: the runtime's slots), which
 * repeats across a search (the ZeRO stage, sp, recomputation do not change
 * it): a small per-thread memo of the last ones. */
struct flight_memo {
	int kind, p, m, v, stage, slots, pairs;
};

#define MEMO 4096
static _Thread_local struct flight_memo memo[MEMO];

void mr__plan_pp_spec(const struct mr_plan_mesh *m, struct mr_pp_spec *sp)
{
	*sp = (struct mr_pp_spec){ (enum mr_pp_kind)m->schedule, m->pp, m->micro_batches, m->v };
}

static int in_flight(const struct mr_plan_mesh *m, int stage, int *slots, int *pairs,
		     struct mr_errbuf *eb)
{
	struct mr_pp_spec sp;
	int mc = m->micro_batches < 2 * m->pp * m->v ? m->micro_batches : 2 * m->pp * m->v;
	unsigned h = (unsigned)m->schedule;
	struct flight_memo *e;
	int rc;

	*slots = *pairs = 1;
	if (m->pp == 1)
		return 0;
	mr__plan_pp_spec(m, &sp);
	h = (h * 31u + (unsigned)m->pp) * 2654435761u;
	h = (h ^ (unsigned)mc) * 2246822519u;
	h = (h ^ (unsigned)m->v) * 3266489917u;
	h = ((h ^ (unsigned)stage) * 668265263u) >> 7;
	h %= MEMO;
	e = &memo[h];
	if (m->schedule != MR_PP_GPIPE && e->p == m->pp && e->kind == m->schedule && e->m == mc &&
	    e->v == m->v && e->stage == stage) {
		*slots = e->slots;
		*pairs = e->pairs;
		return 0;
	}
	if ((rc = mr_pp_in_flight(&sp, stage, slots, pairs, eb)) == 0)
		*e = (struct flight_memo){ m->schedule, m->pp, mc, m->v, stage, *slots, *pairs };
	return rc;
}

int mr__plan_split(const struct mr_plan_input *in, const struct mr_plan_mesh *m, int **split,
		   struct mr_errbuf *eb)
{
	struct mr_gpt_config gc;
	int rc;

	*split = NULL;
	if (m->pp == 1)
		return 0;
	if (!(*split = calloc((size_t)m->pp * (size_t)m->v, sizeof(int))))
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	mr__plan_gpt_config(&in->model, &gc);
	rc = mr_pp_split_model(&gc, in->model.seq_len, m->pp, m->v, NULL, 0, *split, eb);
	if (rc < 0) {
		free(*split);
		*split = NULL;
	}
	return rc;
}

int mr__plan_stage(const struct mr_plan_input *in, const struct mr_plan_mesh *m,
		   const int *split, int stage, int flight, struct mr__plan_stage *st,
		   struct mr_errbuf *eb)
{
	const struct mr_plan_model *md = &in->model;
	struct mr_gpt_config gc;
	struct mr__plan_dims d;
	int L = md->n_layer, c, l, u = 0, rc = 0;
	size_t C = (size_t)md->d_model, Vl, maxT, attn, dense, moe, experts;

	memset(st, 0, sizeof(*st));
	mr__plan_gpt_config(md, &gc);
	mr__plan_dims(md, &d);
	layer_units(md, m, &attn, &dense, &moe, &experts);
	st->first = stage == 0;
	st->last = stage == m->pp - 1;
	st->chunks = m->pp > 1 ? m->v : 1;
	if (m->pp > 1 && !split)
		return mr_errf(eb, MR_EINVAL, "a pipeline stage needs the split");
	st->unit = calloc(2 * (2 * (size_t)L + 2), sizeof(size_t));
	if (!st->unit)
		return mr_errf(eb, MR_ENOMEM, "out of memory");
	st->expert = st->unit + 2 * (size_t)L + 2;
	st->lo[0] = 0;
	st->hi[0] = L;
	for (c = 0; m->pp > 1 && c < m->v; c++)
		mr_pp_split_range(split, m->pp, stage, c, &st->lo[c], &st->hi[c]);
	Vl = ((size_t)md->vocab + (size_t)m->tp - 1) / (size_t)m->tp;
	maxT = d.llama ? 0 : (size_t)(md->max_seq > 0 ? md->max_seq : md->seq_len);
	if (st->first || (st->last && d.tied)) /* the last's: the tied head's replica */
		st->unit[u++] = Vl * C + maxT * C;
	/* the chunks ascend: their blocks in order are the table's; the
	 * first recompute_layers of each chunk recompute (0: all) */
	for (c = 0; c < st->chunks; c++)
		for (l = st->lo[c]; l < st->hi[c]; l++) {
			int is_moe = mr_gpt_layer_is_moe(&gc, l);
			int rc = m->recompute > MR_PLAN_RC_NONE &&
				 (m->recompute_layers <= 0 || l - st->lo[c] < m->recompute_layers);
			st->unit[u++] = attn;
			st->expert[u] = is_moe ? experts : 0;
			st->experts += st->expert[u];
			st->unit[u++] = is_moe ? moe : dense;
			st->layers++;
			st->moe_layers += is_moe;
			st->rc_layers += rc;
			st->rc_moe_layers += rc && is_moe;
		}
	if (st->last) /* gpt2's LayerNorm; llama's RMSNorm and untied head */
		st->unit[u++] = d.llama ? C + (d.tied ? 0 : Vl * C) : 2 * C;
	st->nunits = u;
	for (u = 0; u < st->nunits; u++)
		st->params += st->unit[u];
	st->slots = st->pairs = 1;
	if (flight && (rc = in_flight(m, stage, &st->slots, &st->pairs, eb)) < 0)
		mr__plan_stage_release(st);
	return flight ? rc : 0;
}

void mr__plan_stage_release(struct mr__plan_stage *st)
{
	free(st->unit); /* expert[] is its second half */
	st->unit = st->expert = NULL;
}

double mr_plan_params(const struct mr_plan_model *md)
{
	struct mr_plan_mesh one = { .tp = 1, .cp = 1, .pp = 1, .dp = 1, .ep = 1, .v = 1 };
	struct mr_gpt_config gc;
	struct mr__plan_dims d;
	size_t attn, dense, moe, experts;
	double n = (double)md->vocab * md->d_model;

	mr__plan_gpt_config(md, &gc);
	mr__plan_dims(md, &d);
	if (d.llama) /* the final RMSNorm, an untied head */
		n += md->d_model + (d.tied ? 0 : (double)md->vocab * md->d_model);
	else /* the position table, the final LayerNorm */
		n += (double)(md->max_seq > 0 ? md->max_seq : md->seq_len) * md->d_model +
		     2.0 * md->d_model;
	layer_units(md, &one, &attn, &dense, &moe, &experts);
	for (int l = 0; l < md->n_layer; l++)
		n += (double)attn + (double)(mr_gpt_layer_is_moe(&gc, l) ? moe : dense);
	return n;
}
