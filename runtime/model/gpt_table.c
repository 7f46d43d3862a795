/*
 * gpt_table.c - the GPT parameter table (see mr_gpt.h), built by the
 * family's table (gpt2.c, llama.c) through the builder here: every
 * tensor's name, full and local shape, tensor-parallel split, offset,
 * weight-decay flag and init; the units (embeddings, attention and MLP
 * half of each layer, final LayerNorm); copying between a tensor's whole
 * values and a tp rank's slice, and gathering every rank's slices into
 * the single-rank layout; and binding the weight/gradient views of a unit and of the
 * weights' compute copy, which it refreshes.
 */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/mr_comm.h"
#include "gpt_family.h"

void mr__gpt_table_unit(struct mr__gpt_table *tb)
{
	tb->held = !tb->hold || tb->hold[tb->gunit];
	tb->gunit++;
	if (!tb->held)
		return;
	if (tb->t)
		tb->unit_first[tb->unit] = tb->n;
	tb->unit++;
}

void mr__gpt_table_add(struct mr__gpt_table *tb, const char *name, int d0, int d1, int d2,
		       enum mr_gpt_init init, float std, int split, int parts, int layer,
		       size_t view)
{
	int full[3] = { d0, d1, d2 }, shape[3] = { d0, d1, d2 }, k, id = tb->gi++;
	int rep = split >= 0 && tb->rep > 1 ? tb->rep : 1, slices = tb->tp / rep;
	size_t n = 1, fn = 1, full_off = tb->full_off;

	for (k = 0; k < 3; k++)
		fn *= (size_t)(full[k] ? full[k] : 1);
	tb->full_off += fn;
	if (!tb->held)
		return; /* another pipeline stage's */
	/* a split dim not divisible by tp (only the vocabulary can be) is
	 * padded: every rank holds ceil(d / tp) rows, the last ones zero;
	 * replicated key/value heads are cut into tp / rep slices (one: the
	 * whole tensor on every rank, not split) */
	if (split >= 0)
		shape[split] = (shape[split] + slices - 1) / slices;
	if (tb->experts)
		shape[0] /= tb->ep;
	for (k = 0; k < 3; k++)
		n *= (size_t)(shape[k] ? shape[k] : 1);
	if (tb->t && tb->n < tb->cap) {
		struct mr_gpt_tensor *t = &tb->t[tb->n];
		memset(t, 0, sizeof(*t));
		snprintf(t->name, sizeof(t->name), "%s", name);
		memcpy(t->shape, shape, sizeof(shape));
		memcpy(t->full, full, sizeof(full));
		t->ndim = d2 ? 3 : d1 ? 2 : 1;
		for (int a = 0; a < MR_AXIS__COUNT; a++)
			t->split[a] = -1;
		t->split[MR_AXIS_TP] = slices > 1 ? split : -1;
		t->tp_dim = split;
		t->tp_rep = rep;
		t->expert = tb->experts;
		t->split[MR_AXIS_EP] = tb->experts && tb->ep > 1 ? 0 : -1;
		t->split_parts = parts;
		t->layer = layer;
		t->view = view;
		t->n = n;
		t->off = tb->off;
		t->id = id;
		t->full_off = full_off;
		t->init = init;
		t->std = std;
		t->decay = init == MR_INIT_NORMAL;
	}
	tb->off += n;
	tb->n++;
}

const struct mr__gpt_family *mr__gpt_family_of(const struct mr_gpt_config *c)
{
	return c->arch == MR_ARCH_LLAMA ? &mr__llama_family : &mr__gpt2_family;
}

static void build_table(const struct mr_gpt_config *c, struct mr__gpt_table *tb)
{
	tb->unit = tb->gunit = tb->gi = 0;
	tb->full_off = 0;
	mr__gpt_family_of(c)->table(c, tb);
	if (tb->t)
		tb->unit_first[tb->unit] = tb->n;
}

int mr_gpt_norm_counts(const struct mr_gpt *m, const struct mr_gpt_tensor *t)
{
	if (m->tied_replica && t - m->tensors < m->unit_first[1])
		return 0; /* the embeddings: counted on the first stage */
	if (t->split[MR_AXIS_TP] < 0)
		return m->par.tp.rank == 0;
	return t->tp_rep <= 1 || m->par.tp.rank % t->tp_rep == 0; /* a shared slice: its first */
}

int mr_gpt_tensor_tp_slices(const struct mr_gpt_tensor *t, int tp)
{
	if (t->split[MR_AXIS_TP] < 0 || tp <= 1)
		return 1;
	return t->tp_rep > 1 ? tp / t->tp_rep : tp;
}

int mr_gpt_tensor_tp_slice(const struct mr_gpt_tensor *t, int tp, int r)
{
	if (mr_gpt_tensor_tp_slices(t, tp) == 1)
		return -1;
	return t->tp_rep > 1 ? r / t->tp_rep : r;
}

size_t mr_gpt_tensor_full_n(const struct mr_gpt_tensor *t)
{
	size_t n = 1;
	int k;

	for (k = 0; k < t->ndim; k++)
		n *= (size_t)t->full[k];
	return n;
}

void mr_gpt_tensor_slice(const struct mr_gpt_tensor *t, int tp, int tp_rank, int ep_rank,
			 float *full, float *local, int to_full)
{
	size_t outer = 1, inner = 1, D, pd, ld, lo, have, o, q;
	int k, s = t->split[MR_AXIS_TP];

	if (t->split[MR_AXIS_EP] >= 0) {
		/* this rank's experts: a contiguous block of the full tensor,
		 * whose own shape is the full one with shape[0] experts */
		size_t per = 1;
		for (k = 1; k < t->ndim; k++)
			per *= (size_t)t->full[k];
		full += (size_t)ep_rank * (size_t)t->shape[0] * per;
	}
	if (s >= 0 && t->tp_rep > 1) { /* replicated key/value heads: shared slices */
		tp /= t->tp_rep;
		tp_rank /= t->tp_rep;
	}
	if (s < 0 || tp <= 1) {
		if (to_full)
			memcpy(full, local, sizeof(float) * t->n);
		else
			memcpy(local, full, sizeof(float) * t->n);
		return;
	}
	for (k = 0; k < s; k++) /* an expert tensor's dim 0: this rank's experts */
		outer *= (size_t)(k == 0 && t->split[MR_AXIS_EP] >= 0 ? t->shape[0] : t->full[k]);
	for (k = s + 1; k < t->ndim; k++)
		inner *= (size_t)t->full[k];
	D = (size_t)t->full[s];
	pd = D / (size_t)t->split_parts;           /* one block of the split dim */
	ld = (pd + (size_t)tp - 1) / (size_t)tp;   /* this rank's rows of a block */
	lo = (size_t)tp_rank * ld;                 /* its first row */
	have = lo >= pd ? 0 : pd - lo < ld ? pd - lo : ld; /* rows that exist */
	for (o = 0; o < outer; o++)
		for (q = 0; q < (size_t)t->split_parts; q++) {
			float *f = full + ((o * D) + q * pd + lo) * inner;
			float *l = local + ((o * (size_t)t->shape[s]) + q * ld) * inner;
			if (to_full) {
				memcpy(f, l, sizeof(float) * have * inner);
			} else {
				memcpy(l, f, sizeof(float) * have * inner);
				memset(l + have * inner, 0, sizeof(float) * (ld - have) * inner);
			}
		}
}

void mr_gpt_unit_range(const struct mr_gpt *m, int u, size_t *off, size_t *n)
{
	const struct mr_gpt_tensor *a = &m->tensors[m->unit_first[u]];
	const struct mr_gpt_tensor *z = &m->tensors[m->unit_first[u + 1] - 1];

	*off = a->off;
	*n = z->off + z->n - a->off;
}

/* The view pointer (in w) that tensor i of the table binds. */
static float **view_of(struct mr_gpt *m, struct mr_gpt_weights *w, int i)
{
	const struct mr_gpt_tensor *t = &m->tensors[i];
	char *base = t->layer >= 0 ? (char *)&w->layer[t->layer] : (char *)w;

	return (float **)(void *)(base + t->view);
}

void mr_gpt_bind_tensors(struct mr_gpt *m, int t0, int t1, float *pbase, float *gbase)
{
	size_t off0 = m->tensors[t0].off;
	int i;

	for (i = t0; i < t1; i++) {
		size_t d = m->tensors[i].off - off0;
		if (pbase)
			*view_of(m, &m->w, i) = pbase + d;
		if (gbase)
			*view_of(m, &m->g, i) = gbase + d;
	}
}

void mr_gpt_bind_unit(struct mr_gpt *m, int u, float *pbase, float *gbase)
{
	mr_gpt_bind_tensors(m, m->unit_first[u], m->unit_first[u + 1], pbase, gbase);
}

void mr__gpt_bind_compute(struct mr_gpt *m)
{
	int i;

	for (i = 0; i < m->ntensors; i++)
		*view_of(m, &m->wc, i) =
			(float *)(void *)mr_dev_at(m->dev, m->params_c, m->tensors[i].off);
}

mr_act *mr_gpt_compute_at(const struct mr_gpt *m, size_t off)
{
	return m->params_c ? mr_dev_at(m->dev, m->params_c, off) : NULL;
}

void mr_gpt_bind_compute_unit(struct mr_gpt *m, int u, mr_act *cbase)
{
	size_t first = m->tensors[m->unit_first[u]].off;

	for (int i = m->unit_first[u]; i < m->unit_first[u + 1]; i++)
		*view_of(m, &m->wc, i) =
			(float *)(void *)mr_dev_at(m->dev, cbase, m->tensors[i].off - first);
}

int mr_gpt_refresh_unit(struct mr_gpt *m, int u)
{
	int i = m->unit_first[u], end = m->unit_first[u + 1], rc = 0;

	if (m->dev->act == MR_DT_F32)
		return 0;
	/* one conversion per run of tensors bound back to back on both sides
	 * (a unit may be bound in pieces: mr_gpt_bind_tensors) */
	while (i < end && rc == 0) {
		const float *p = *view_of(m, &m->w, i);
		mr_act *c = (mr_act *)(void *)*view_of(m, &m->wc, i);
		size_t n = m->tensors[i].n;
		while (++i < end && *view_of(m, &m->w, i) == p + n &&
		       (mr_act *)(void *)*view_of(m, &m->wc, i) == mr_dev_at(m->dev, c, n))
			n += m->tensors[i].n;
		rc = m->dev->ops->to_act(m->dev, c, p, n);
	}
	return rc;
}

int mr_gpt_refresh_compute(struct mr_gpt *m)
{
	int u, rc;

	for (u = 0; u < m->nunits; u++)
		if ((rc = mr_gpt_refresh_unit(m, u)) < 0)
			return rc;
	return 0;
}

/* The units of the whole model this stage holds, 1 each (2L + 2 of them:
 * embeddings, two per block, final norm (and an untied head)): the
 * embeddings on the first stage and, for a tied LM head, the last; the
 * blocks of its chunks; the final norm on the last. *hold NULL: the whole model. */
static int stage_units(const struct mr_gpt *m, unsigned char **hold)
{
	int L = m->cfg.n_layer, c, l, lo, hi;
	unsigned char *h;

	*hold = NULL;
	if (m->place.chunks <= 0 && m->first_stage && m->last_stage)
		return 0;
	if (!(h = calloc((size_t)(2 * L + 2), 1)))
		return MR_ENOMEM;
	h[0] = (unsigned char)(m->first_stage || m->tied_replica);
	h[2 * L + 1] = (unsigned char)m->last_stage;
	for (c = 0; c < mr_place_chunks(&m->place); c++) {
		mr_place_chunk(&m->place, L, c, &lo, &hi);
		for (l = lo; l < hi; l++)
			h[1 + 2 * l] = h[2 + 2 * l] = 1;
	}
	*hold = h;
	return 0;
}

int mr__gpt_table_create(struct mr_gpt *m)
{
	struct mr__gpt_table tb = { .tp = m->par.tp.size,
				    .ep = mr_place_size(&m->place, MR_AXIS_EP) };
	unsigned char *hold;
	int l, u = 0, rc = stage_units(m, &hold);

	if (rc < 0)
		return rc;
	tb.hold = hold;
	build_table(&m->cfg, &tb); /* count */
	m->nunits = tb.unit;
	m->ntensors_full = tb.gi;
	m->nparams_full = tb.full_off;
	m->tensors = calloc((size_t)tb.n, sizeof(*m->tensors));
	m->unit_first = calloc((size_t)m->nunits + 1, sizeof(int));
	m->layer_unit = calloc((size_t)m->cfg.n_layer, sizeof(int));
	if (!m->tensors || !m->unit_first || !m->layer_unit) {
		free(hold);
		return MR_ENOMEM;
	}
	/* the local unit of each block's attention half (-1: not here) */
	u = !hold || hold[0];
	for (l = 0; l < m->cfg.n_layer; l++) {
		m->layer_unit[l] = !hold || hold[1 + 2 * l] ? u : -1;
		u += m->layer_unit[l] >= 0 ? 2 : 0;
	}
	tb.t = m->tensors;
	tb.cap = tb.n;
	tb.n = 0;
	tb.off = 0;
	tb.unit_first = m->unit_first;
	build_table(&m->cfg, &tb);
	free(hold);
	m->ntensors = tb.n;
	m->nparams = tb.off;
	return 0;
}

size_t mr_gpt_full_nparams(const struct mr_gpt *m)
{
	return m->nparams_full;
}

int mr_gpt_gather_full(const struct mr_gpt *m, const float *local, float **full)
{
	int tp = m->par.tp.size, r = m->par.tp.rank, i, q, rc = 0;
	size_t most = 0;
	float *buf = NULL, *out = NULL;

	*full = NULL;
	for (i = 0; i < m->ntensors; i++)
		if (m->tensors[i].n > most)
			most = m->tensors[i].n;
	if (r == 0 && !(out = calloc(mr_gpt_full_nparams(m), sizeof(float))))
		rc = MR_ENOMEM;
	if (tp > 1 && !(buf = malloc(sizeof(float) * most * (size_t)tp)))
		rc = MR_ENOMEM;
	/* a local failure stops this rank; its peers get the communicator's
	 * timeout (or abort) on their next all-gather */
	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		const float *src = local + t->off;
		if (tp > 1) {
			int crc = buf ? mr_comm_allgather(m->par.tp.comm, src, buf, t->n,
							  MR_COMM_F32)
				      : MR_ENOMEM;
			if (crc < 0) {
				rc = crc;
				break;
			}
		}
		/* the tied replica of the embeddings is the first stage's to give;
		 * under expert parallelism every ep rank gives its experts, ep
		 * rank 0 the rest (the caller sums over the ep group) */
		if (out && rc == 0 && !(m->tied_replica && i < m->unit_first[1]) &&
		    (t->split[MR_AXIS_EP] >= 0 || m->par.ep.rank == 0))
			for (q = 0; q < tp; q++)
				mr_gpt_tensor_slice(t, tp, q, m->par.ep.rank, out + t->full_off,
						    tp > 1 ? buf + (size_t)q * t->n : (float *)src, 1);
	}
	free(buf);
	if (rc < 0) {
		free(out);
		return rc;
	}
	*full = out;
	return 0;
}
