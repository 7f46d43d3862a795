/*
 * dp.c - data parallelism (see mr_dp.h): layout of the padded and sharded
 * buffers, the owned segments, DDP buckets, allocation, init and free.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp_int.h"

#define DP_DEFAULT_BUCKET ((size_t)1 << 20)

unsigned mr_dp_model_flags(int zero)
{
	return zero >= 1 ? MR_GPT_EXT_PARAMS | MR_GPT_EXT_GRADS : 0;
}

/* Zeroed device memory in the model's ledger, freed by mr_dp_free. */
static float *dalloc(struct mr_dp *d, int kind, size_t nfloats)
{
	struct dp_alloc *a;

	if (d->nal == DP_MAX_ALLOCS)
		return NULL;
	a = &d->al[d->nal];
	a->bytes = (nfloats ? nfloats : 1) * sizeof(float);
	a->kind = kind;
	a->p = mr_dev_alloc(d->dev, &d->m->mem, (enum mr_mem_kind)kind, a->bytes);
	if (a->p)
		d->nal++;
	return a->p;
}

static int comm_size(struct mr_comm *c)
{
	return c ? mr_comm_size(c) : 1;
}

static int comm_rank(struct mr_comm *c)
{
	return c ? mr_comm_rank(c) : 0;
}

/* Units, padded offsets and shard offsets. */
static int layout(struct mr_dp *d)
{
	struct mr_gpt *m = d->m;
	size_t np = 0, ns = 0;
	int u;

	d->nunits = m->nunits;
	d->u = calloc((size_t)d->nunits, sizeof(*d->u));
	if (!d->u)
		return MR_ENOMEM;
	for (u = 0; u < d->nunits; u++) {
		struct dp_unit *U = &d->u[u];
		mr_gpt_unit_range(m, u, &U->off, &U->n);
		U->sn = d->zero ? (U->n + (size_t)d->S - 1) / (size_t)d->S : U->n;
		U->poff = np;
		U->soff = ns;
		np += d->zero ? U->sn * (size_t)d->S : U->n;
		ns += U->sn;
	}
	d->np = np;
	d->nshard = d->zero ? ns : m->nparams;
	return 0;
}

/* The owned pieces of every tensor and whether they count in the norm:
 * one rank of the data-parallel replicas counts a tensor, for experts one
 * of the expert-data-parallel ones (every ep rank holds other experts). */
static int segments(struct mr_dp *d)
{
	struct mr_gpt *m = d->m;
	int lead = d->zero ? d->rrank == 0 : d->srank == 0 && d->rrank == 0;
	int elead = d->erank == 0 && d->rrank == 0;
	int u, i;

	d->seg = calloc((size_t)m->ntensors, sizeof(*d->seg));
	d->part = calloc((size_t)m->ntensors, sizeof(*d->part));
	d->cnt_off = calloc((size_t)m->ntensors, sizeof(*d->cnt_off));
	d->cnt_n = calloc((size_t)m->ntensors, sizeof(*d->cnt_n));
	if (!d->seg || !d->part || !d->cnt_off || !d->cnt_n)
		return MR_ENOMEM;
	for (u = 0; u < d->nunits; u++) {
		const struct dp_unit *U = &d->u[u];
		size_t lo = d->zero ? (size_t)d->srank * U->sn : 0, hi = lo + U->sn;
		for (i = m->unit_first[u]; i < m->unit_first[u + 1]; i++) {
			const struct mr_gpt_tensor *t = &m->tensors[i];
			size_t a = t->off - U->off, b = a + t->n;
			struct dp_seg *s = &d->seg[d->nseg];
			if (a < lo)
				a = lo;
			if (b > hi)
				b = hi;
			if (a >= b)
				continue;
			s->so = d->zero ? U->soff + (a - lo) : t->off;
			s->n = b - a;
			s->unit = u;
			s->tensor = i;
			s->decay = t->decay;
			s->count = (t->split[MR_AXIS_EP] >= 0 ? elead : lead) &&
				   mr_gpt_norm_counts(m, t);
			if (s->count) {
				d->cnt_off[d->ncnt] = s->so;
				d->cnt_n[d->ncnt++] = s->n;
			}
			d->nseg++;
		}
	}
	return 0;
}

/* Expert parallel: the table as maximal ranges of dense or expert tensors. */
static int ranges(struct mr_dp *d)
{
	const struct mr_gpt *m = d->m;
	int i;

	if (d->ep <= 1)
		return 0;
	if (!(d->range = calloc((size_t)m->ntensors, sizeof(*d->range))))
		return MR_ENOMEM;
	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		int ex = t->split[MR_AXIS_EP] >= 0;
		struct dp_range *r = d->nrange > 0 ? &d->range[d->nrange - 1] : NULL;
		if (r && r->experts == ex && r->off + r->n == t->off) {
			r->n += t->n;
			continue;
		}
		d->range[d->nrange++] = (struct dp_range){ t->off, t->n, ex };
	}
	return 0;
}

/* DDP buckets: whole units from the last down, closed at >= bucket_bytes. */
static int buckets(struct mr_dp *d)
{
	size_t cap = d->cfg.bucket_bytes, bytes = 0;
	int u, b = 0, n = d->nunits;

	d->bucket_of = calloc((size_t)n, sizeof(int));
	d->bucket_low = calloc((size_t)n, sizeof(int));
	d->boff = calloc((size_t)n, sizeof(size_t));
	d->bn = calloc((size_t)n, sizeof(size_t));
	d->req = calloc((size_t)n, sizeof(*d->req));
	if (!d->bucket_of || !d->bucket_low || !d->boff || !d->bn || !d->req)
		return MR_ENOMEM;
	for (u = n - 1; u >= 0; u--) {
		d->bucket_of[u] = b;
		d->bucket_low[b] = u;
		d->boff[b] = d->u[u].off;
		d->bn[b] += d->u[u].n;
		bytes += d->u[u].n * sizeof(float);
		if (bytes >= cap || u == 0) {
			b++;
			bytes = 0;
		}
	}
	d->nbuckets = b;
	return 0;
}

static size_t max_layer_padded(const struct mr_dp *d)
{
	size_t mx = 0;
	int u;

	for (u = 1; u < d->nunits - 1; u++)
		if (d->u[u].sn * (size_t)d->S > mx)
			mx = d->u[u].sn * (size_t)d->S;
	return mx;
}

static int alloc_slots(struct mr_dp *d, struct dp_slot *sl, int kind, int with_out)
{
	size_t cap[4], pm = max_layer_padded(d);
	int s, last = d->nunits - 1;

	cap[0] = d->u[0].sn * (size_t)d->S;
	cap[1] = d->u[last].sn * (size_t)d->S;
	cap[2] = cap[3] = pm;
	for (s = 0; s < 4; s++) {
		sl[s].unit = -1;
		if (cap[s] == 0)
			continue;
		if (!(sl[s].buf = dalloc(d, kind, cap[s])))
			return MR_ENOMEM;
		if (with_out && !(sl[s].out = dalloc(d, MR_MEM_WORKSPACE, cap[s] / (size_t)d->S)))
			return MR_ENOMEM;
	}
	return 0;
}

/* Parameters from seed: full (zero < 3) or this rank's shards (zero 3),
 * made on the host a unit at a time and uploaded. */
static int init_params(struct mr_dp *d, uint64_t seed)
{
	struct mr_gpt *m = d->m;
	float *tmp;
	size_t mx = 0, lo, n;
	int u, i, rc = 0;

	if (d->zero == 0)
		return mr_gpt_init_params(m, seed);
	for (u = 0; u < d->nunits; u++)
		if (d->u[u].n > mx)
			mx = d->u[u].n;
	if (!(tmp = malloc(mx * sizeof(float))))
		return MR_ENOMEM;
	for (u = 0; u < d->nunits && rc == 0; u++) {
		const struct dp_unit *U = &d->u[u];
		for (i = m->unit_first[u]; i < m->unit_first[u + 1] && rc == 0; i++)
			rc = mr_gpt_init_tensor(m, seed, i, tmp + (m->tensors[i].off - U->off));
		if (rc < 0)
			break;
		if (d->zero < 3) {
			rc = d->dev->ops->upload(d->dev, d->P + U->poff, tmp, U->n * sizeof(float));
			continue;
		}
		/* the shard's tail past the unit is padding: zero already */
		lo = (size_t)d->srank * U->sn;
		n = lo < U->n ? U->n - lo : 0;
		if (n > U->sn)
			n = U->sn;
		if (n)
			rc = d->dev->ops->upload(d->dev, d->pshard + U->soff, tmp + lo,
						 n * sizeof(float));
	}
	free(tmp);
	/* zero 1/2: the model reads the full parameters (a bf16 device: their
	 * compute copy); zero 3 refreshes a unit when its gather is bound */
	if (rc == 0 && d->zero < 3)
		rc = mr_gpt_refresh_compute(m);
	return rc;
}

static int alloc_all(struct mr_dp *d)
{
	int u;

	if (!(d->om = dalloc(d, MR_MEM_OPTIM, 2 * d->nshard)))
		return MR_ENOMEM;
	d->ov = d->om + d->nshard;
	if (d->zero == 0)
		return 0;
	if (!(d->gshard = dalloc(d, MR_MEM_GRADS, d->nshard)))
		return MR_ENOMEM;
	if (d->zero < 3 && !(d->P = dalloc(d, MR_MEM_PARAMS, d->np)))
		return MR_ENOMEM;
	if (d->zero == 1 && !(d->G = dalloc(d, MR_MEM_GRADS, d->np)))
		return MR_ENOMEM;
	if (d->zero == 3 && !(d->pshard = dalloc(d, MR_MEM_PARAMS, d->nshard)))
		return MR_ENOMEM;
	if (d->zero >= 2 && alloc_slots(d, d->gs, MR_MEM_GRADS, 1) < 0)
		return MR_ENOMEM;
	if (d->zero == 3 && alloc_slots(d, d->ps, MR_MEM_PARAMS, 0) < 0)
		return MR_ENOMEM;
	for (u = 0; u < d->nunits && d->zero < 3; u++)
		mr_gpt_bind_unit(d->m, u, d->P + d->u[u].poff,
				 d->zero == 1 ? d->G + d->u[u].poff : NULL);
	return 0;
}

int mr_dp_create(struct mr_dp **out, struct mr_gpt *m, const struct mr_adamw_config *oc,
		 const struct mr_dp_config *cfg, const struct mr_dp_comms *c, uint64_t seed,
		 struct mr_errbuf *eb)
{
	unsigned want = mr_dp_model_flags(cfg->zero);
	struct mr_dp *d;
	int rc;

	*out = NULL;
	if (cfg->zero < 0 || cfg->zero > 3)
		return mr_errf_field(eb, MR_EINVAL, "zero", "'zero' must be 0, 1, 2 or 3, got %d",
				     cfg->zero);
	if ((m->params == NULL) != !!(want & MR_GPT_EXT_PARAMS))
		return mr_errf_field(eb, MR_EINVAL, "ext_params",
				     "'ext_params' must be %d for zero %d (see mr_dp_model_flags)",
				     !!(want & MR_GPT_EXT_PARAMS), cfg->zero);
	if ((m->grads == NULL) != !!(want & MR_GPT_EXT_GRADS))
		return mr_errf_field(eb, MR_EINVAL, "ext_grads",
				     "'ext_grads' must be %d for zero %d (see mr_dp_model_flags)",
				     !!(want & MR_GPT_EXT_GRADS), cfg->zero);
	d = calloc(1, sizeof(*d));
	if (!d)
		return mr_errf(eb, MR_ENOMEM, "unable to allocate the data-parallel state");
	d->m = m;
	d->dev = m->dev;
	d->oc = *oc;
	d->cfg = *cfg;
	if (!d->cfg.bucket_bytes)
		d->cfg.bucket_bytes = DP_DEFAULT_BUCKET;
	if (c)
		d->c = *c;
	d->zero = cfg->zero;
	d->S = comm_size(d->c.shard);
	d->srank = comm_rank(d->c.shard);
	d->R = comm_size(d->c.replica);
	d->rrank = comm_rank(d->c.replica);
	d->W = comm_size(d->c.world);
	d->dpn = d->S * d->R;
	d->ep = mr_place_size(&m->place, MR_AXIS_EP);
	d->erank = comm_rank(d->c.expert);
	if (d->ep > 1 && (d->zero > 0 || d->R > 1)) {
		rc = mr_errf_field(eb, MR_ENOTSUP, d->zero > 0 ? "zero" : "hsdp_shard",
				   "expert parallelism (ep %d) runs with DDP only so far: "
				   "'zero' must be 0 and 'hsdp_shard' unset (zero %d, replicas %d)",
				   d->ep, d->zero, d->R);
		free(d);
		return rc;
	}
	/* the experts' grads reduce over another group than the rest: one
	 * pass after the backward (no per-bucket overlap yet) */
	if (d->ep > 1)
		d->cfg.overlap = 0;
	if ((rc = layout(d)) < 0 || (rc = segments(d)) < 0 || (rc = buckets(d)) < 0 ||
	    (rc = ranges(d)) < 0 ||
	    (rc = alloc_all(d)) < 0 || (rc = init_params(d, seed)) < 0) {
		mr_dp_free(d);
		return mr_errf(eb, rc, "unable to set up data parallelism (zero %d): %s",
			       cfg->zero, mr_strerror(rc));
	}
	mr__dp_set_hooks(d);
	*out = d;
	return 0;
}

void mr_dp_free(struct mr_dp *d)
{
	int i;

	if (!d)
		return;
	/* a step that failed half-way may have left requests in flight */
	for (i = 0; i < 4; i++) {
		mr__dp_wait(d, &d->ps[i].req, 0);
		mr__dp_wait(d, &d->gs[i].req, 0);
	}
	for (i = 0; d->req && i < d->nunits; i++)
		mr__dp_wait(d, &d->req[i], 0);
	if (d->m->hooks == &d->hooks)
		d->m->hooks = NULL;
	for (i = 0; i < d->nal; i++)
		mr_dev_free(d->dev, &d->m->mem, (enum mr_mem_kind)d->al[i].kind, d->al[i].p,
			    d->al[i].bytes);
	free(d->u);
	free(d->seg);
	free(d->part);
	free(d->cnt_off);
	free(d->cnt_n);
	free(d->bucket_of);
	free(d->bucket_low);
	free(d->boff);
	free(d->bn);
	free(d->req);
	free(d->range);
	free(d);
}

void mr_dp_stats(const struct mr_dp *d, struct mr_dp_stats *st)
{
	*st = d->st;
}
