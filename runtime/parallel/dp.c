/*
 * dp.c - data parallelism (see mr_dp.h): layout of the padded and sharded
 * buffers, the owned segments, DDP buckets, allocation, init and free.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dp_int.h"
#include "mr_log.h"

#define DP_DEFAULT_BUCKET ((size_t)1 << 20)
#define DP_STAGE_CHUNK ((size_t)1 << 22) /* the planner's MR_PLAN_STAGE_CHUNK */

unsigned mr_dp_model_flags(int zero)
{
	return zero >= 3   ? MR_GPT_EXT_PARAMS | MR_GPT_EXT_GRADS | MR_GPT_EXT_COMPUTE
	       : zero >= 1 ? MR_GPT_EXT_PARAMS | MR_GPT_EXT_GRADS
			   : 0;
}

/* Whether offload runs with the master on the host and bf16 weights alone
 * on the device (MASTER on a device whose memory is not host memory). */
static int master_on_host(const struct mr_dev *dev, int offload)
{
	return offload == MR_DP_OFFLOAD_MASTER && dev->ops->is_device;
}

unsigned mr_dp_model_flags_on(const struct mr_dev *dev, int zero, int offload)
{
	if (!master_on_host(dev, offload))
		return mr_dp_model_flags(zero);
	/* no fp32 weights on the device: zero 1/2 bind the compute views into
	 * their padded bf16 gather target (zero 3 already does) */
	return zero == 0 ? MR_GPT_EXT_PARAMS
			 : MR_GPT_EXT_PARAMS | MR_GPT_EXT_GRADS | MR_GPT_EXT_COMPUTE;
}

/* Zeroed device memory (host = 0) or the device's host memory (host = 1:
 * offloaded state) in the model's ledger, freed by mr_dp_free. */
static void *alloc_in(struct mr_dp *d, int kind, size_t bytes, int host)
{
	struct dp_alloc *a;

	if (d->nal == DP_MAX_ALLOCS)
		return NULL;
	a = &d->al[d->nal];
	a->bytes = bytes ? bytes : 1;
	a->kind = kind;
	a->host = host;
	a->p = host ? mr_dev_host_alloc(d->dev, &d->m->mem, (enum mr_mem_kind)kind, a->bytes)
		    : mr_dev_alloc(d->dev, &d->m->mem, (enum mr_mem_kind)kind, a->bytes);
	if (a->p)
		d->nal++;
	return a->p;
}

static void *dalloc_bytes(struct mr_dp *d, int kind, size_t bytes)
{
	return alloc_in(d, kind, bytes, 0);
}

static float *dalloc(struct mr_dp *d, int kind, size_t nfloats)
{
	return dalloc_bytes(d, kind, nfloats * sizeof(float));
}

/* Offloaded state: host memory under MR_MEM_HOST. */
static float *halloc(struct mr_dp *d, size_t nfloats)
{
	return alloc_in(d, MR_MEM_HOST, nfloats * sizeof(float), 1);
}

static int comm_size(struct mr_comm *c)
{
	return c ? mr_comm_size(c) : 1;
}

static int comm_rank(struct mr_comm *c)
{
	return c ? mr_comm_rank(c) : 0;
}

/* Appends unit u's piece of tensors [t0, t1), sharded over comm. */
static void add_piece(struct mr_dp *d, int u, int t0, int t1, int experts, struct mr_comm *comm,
		      size_t *np, size_t *ns)
{
	const struct mr_gpt *m = d->m;
	struct dp_piece *P = &d->pc[d->npieces++];
	const struct mr_gpt_tensor *z = &m->tensors[t1 - 1];

	P->unit = u;
	P->t0 = t0;
	P->t1 = t1;
	P->experts = experts;
	P->off = m->tensors[t0].off;
	P->n = z->off + z->n - P->off;
	P->comm = comm;
	P->S = comm_size(comm);
	P->srank = comm_rank(comm);
	P->sn = d->zero ? (P->n + (size_t)P->S - 1) / (size_t)P->S : P->n;
	P->pn = d->zero ? P->sn * (size_t)P->S : P->n;
	P->poff = *np;
	P->loff = *np - d->pc[d->pfirst[u]].poff;
	P->soff = *ns;
	*np += P->pn;
	*ns += P->sn;
}

/* Pieces, padded offsets and shard offsets: one piece per unit, two for a
 * MoE unit under ZeRO with expert parallelism (its experts, last in the
 * unit, shard over the expert-data-parallel group). */
static int layout(struct mr_dp *d)
{
	struct mr_gpt *m = d->m;
	size_t np = 0, ns = 0;
	int u;

	d->nunits = m->nunits;
	d->pc = calloc((size_t)d->nunits * DP_MAX_PIECES, sizeof(*d->pc));
	d->pfirst = calloc((size_t)d->nunits + 1, sizeof(*d->pfirst));
	if (!d->pc || !d->pfirst)
		return MR_ENOMEM;
	for (u = 0; u < d->nunits; u++) {
		int t0 = m->unit_first[u], t1 = m->unit_first[u + 1], te = t1;
		d->pfirst[u] = d->npieces;
		if (d->zero && d->ep > 1)
			for (te = t0; te < t1 && m->tensors[te].split[MR_AXIS_EP] < 0; te++)
				;
		if (te > t0)
			add_piece(d, u, t0, te, 0, d->c.shard, &np, &ns);
		if (te < t1)
			add_piece(d, u, te, t1, 1, d->c.expert, &np, &ns);
	}
	d->pfirst[d->nunits] = d->npieces;
	d->np = np;
	d->nshard = d->zero ? ns : m->nparams;
	return 0;
}

size_t mr__dp_unit_padded(const struct mr_dp *d, int u)
{
	const struct dp_piece *z = &d->pc[d->pfirst[u + 1] - 1];

	return z->loff + z->pn;
}

size_t mr__dp_unit_shard(const struct mr_dp *d, int u)
{
	const struct dp_piece *z = &d->pc[d->pfirst[u + 1] - 1];

	return z->soff + z->sn - d->pc[d->pfirst[u]].soff;
}

void mr__dp_bind_unit(struct mr_dp *d, int u, float *buf, int grads)
{
	int k;

	for (k = d->pfirst[u]; k < d->pfirst[u + 1]; k++) {
		const struct dp_piece *P = &d->pc[k];
		mr_gpt_bind_tensors(d->m, P->t0, P->t1, grads ? NULL : buf + P->loff,
				    grads ? buf + P->loff : NULL);
	}
}

/* The owned pieces of every tensor and whether they count in the norm:
 * under DDP one rank of the data-parallel replicas counts a tensor, for
 * experts one of the expert-data-parallel ones (every ep rank holds other
 * experts); a ZeRO shard is this rank's alone (one replica counts it). */
static int segments(struct mr_dp *d)
{
	struct mr_gpt *m = d->m;
	int k, i;

	d->seg = calloc((size_t)m->ntensors, sizeof(*d->seg));
	d->ranges = calloc((size_t)m->ntensors, sizeof(*d->ranges));
	d->part = calloc((size_t)m->ntensors, sizeof(*d->part));
	d->cnt_off = calloc((size_t)m->ntensors, sizeof(*d->cnt_off));
	d->cnt_n = calloc((size_t)m->ntensors, sizeof(*d->cnt_n));
	if (!d->seg || !d->ranges || !d->part || !d->cnt_off || !d->cnt_n)
		return MR_ENOMEM;
	for (k = 0; k < d->npieces; k++) {
		const struct dp_piece *P = &d->pc[k];
		size_t lo = d->zero ? (size_t)P->srank * P->sn : 0, hi = lo + P->sn;
		for (i = P->t0; i < P->t1; i++) {
			const struct mr_gpt_tensor *t = &m->tensors[i];
			size_t a = t->off - P->off, b = a + t->n;
			struct dp_seg *s = &d->seg[d->nseg];
			int ex = t->split[MR_AXIS_EP] >= 0;
			if (a < lo)
				a = lo;
			if (b > hi)
				b = hi;
			if (a >= b)
				continue;
			s->so = d->zero ? P->soff + (a - lo) : t->off;
			s->n = b - a;
			s->at = a - (t->off - P->off);
			s->piece = k;
			s->tensor = i;
			s->decay = t->decay;
			s->count = d->rrank == 0 && (d->zero || (ex ? d->erank : d->srank) == 0) &&
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
	size_t cap = d->cfg.bucket_bytes, bytes = 0, off, un;
	int u, b = 0, n = d->nunits;

	d->bucket_of = calloc((size_t)n, sizeof(int));
	d->bucket_low = calloc((size_t)n, sizeof(int));
	d->boff = calloc((size_t)n, sizeof(size_t));
	d->bn = calloc((size_t)n, sizeof(size_t));
	d->req = calloc((size_t)d->npieces, sizeof(*d->req));
	if (!d->bucket_of || !d->bucket_low || !d->boff || !d->bn || !d->req)
		return MR_ENOMEM;
	for (u = n - 1; u >= 0; u--) {
		mr_gpt_unit_range(d->m, u, &off, &un);
		d->bucket_of[u] = b;
		d->bucket_low[b] = u;
		d->boff[b] = off;
		d->bn[b] += un;
		bytes += un * sizeof(float);
		if (bytes >= cap || u == 0) {
			b++;
			bytes = 0;
		}
	}
	d->nbuckets = b;
	return 0;
}

/* The largest padded (shard: shard = 1) span of the layers' units. */
static size_t max_layer_span(const struct mr_dp *d, int shard)
{
	size_t mx = 0, n;
	int u;

	for (u = 1; u < d->nunits - 1; u++) {
		n = shard ? mr__dp_unit_shard(d, u) : mr__dp_unit_padded(d, u);
		if (n > mx)
			mx = n;
	}
	return mx;
}

/* The four slots of grads (with their reduce-scatter outputs) or params
 * (on a bf16 device with their compute copy too: ZeRO-3 keeps no whole
 * one, mr_gpt.h's MR_GPT_EXT_COMPUTE). */
static int alloc_slots(struct mr_dp *d, struct dp_slot *sl, int kind, int with_out)
{
	int s, last = d->nunits - 1, unit[2] = { 0, last };
	size_t act = mr_dev_act_bytes(d->dev, 1);

	for (s = 0; s < 4; s++) {
		size_t cap = s < 2 ? mr__dp_unit_padded(d, unit[s]) : max_layer_span(d, 0);
		size_t out = s < 2 ? mr__dp_unit_shard(d, unit[s]) : max_layer_span(d, 1);
		sl[s].unit = -1;
		if (cap == 0)
			continue;
		if (!(mr__dp_mb(d) && !with_out) && !(sl[s].buf = dalloc(d, kind, cap)))
			return MR_ENOMEM; /* MASTER's parameter slots: the compute copy only */
		if (with_out && !(sl[s].out = dalloc(d, MR_MEM_WORKSPACE, out)))
			return MR_ENOMEM;
		if (!with_out && d->dev->act != MR_DT_F32 &&
		    !(sl[s].cbuf = dalloc_bytes(d, kind, cap * act)))
			return MR_ENOMEM;
	}
	return 0;
}

/* Each piece's parameters from seed, made whole on the host a piece at a
 * time, and what this rank keeps of them put in place: on the device the
 * whole padded piece (zero 1/2) or the owned part of its shard (zero 3);
 * on the host (host = 1, MASTER's master) the owned part, its padding 0
 * (zero 0: the whole piece). */
static int init_pieces(struct mr_dp *d, uint64_t seed, int host)
{
	struct mr_gpt *m = d->m;
	float *tmp;
	size_t mx = 0, lo, n;
	int k, i, rc = 0;

	for (k = 0; k < d->npieces; k++)
		if (d->pc[k].n > mx)
			mx = d->pc[k].n;
	if (!(tmp = malloc(mx * sizeof(float))))
		return MR_ENOMEM;
	for (k = 0; k < d->npieces && rc == 0; k++) {
		const struct dp_piece *P = &d->pc[k];
		for (i = P->t0; i < P->t1 && rc == 0; i++)
			rc = mr_gpt_init_tensor(m, seed, i, tmp + (m->tensors[i].off - P->off));
		if (rc < 0)
			break;
		if (!host && d->zero < 3) {
			rc = d->dev->ops->upload(d->dev, d->P + P->poff, tmp, P->n * sizeof(float));
			continue;
		}
		lo = d->zero ? (size_t)P->srank * P->sn : 0;
		n = lo < P->n ? P->n - lo : 0;
		if (n > P->sn)
			n = P->sn;
		if (host) {
			memset(d->hp + P->soff, 0, P->sn * sizeof(float));
			memcpy(d->hp + P->soff, tmp + lo, n * sizeof(float));
		} else if (n) { /* the shard's tail past the piece is padding: zero already */
			rc = d->dev->ops->upload(d->dev, d->pshard + P->soff, tmp + lo,
						 n * sizeof(float));
		}
	}
	free(tmp);
	return rc;
}

/* Parameters from seed: full (zero < 3) or this rank's shards (zero 3). */
static int init_params(struct mr_dp *d, uint64_t seed)
{
	int rc;

	if (d->zero == 0)
		return mr_gpt_init_params(d->m, seed);
	rc = init_pieces(d, seed, 0);
	/* zero 1/2: the model reads the full parameters (a bf16 device: their
	 * compute copy); zero 3 refreshes a unit when its gather is bound */
	if (rc == 0 && d->zero < 3)
		rc = mr_gpt_refresh_compute(d->m);
	return rc;
}

/* The parameters from seed, where the master lives. */
static int init_all(struct mr_dp *d, uint64_t seed)
{
	int rc;

	if (!mr__dp_mb(d))
		return init_params(d, seed);
	/* the host master, then the device's bf16 weights from it */
	return (rc = init_pieces(d, seed, 1)) < 0 ? rc : mr__dp_publish(d);
}

/* MASTER's device side: the fp32 staging the host master is published
 * through (a unit's shard: what mr_dp_gather_params stages; zero 0 at
 * most DP_STAGE_CHUNK floats, a chunk at a time), the weights in
 * the activation type - zero 1/2 the padded gather target Pc with the
 * shard sc it is gathered from, zero 3 the shard pshard_c (zero 0: the
 * model's own compute copy). */
static int alloc_master_on_host(struct mr_dp *d)
{
	size_t act = mr_dev_act_bytes(d->dev, 1);
	int u;

	for (u = 0; u < d->nunits; u++)
		if (mr__dp_unit_shard(d, u) > d->nstage)
			d->nstage = mr__dp_unit_shard(d, u);
	if (d->zero == 0 && d->nstage > DP_STAGE_CHUNK)
		d->nstage = DP_STAGE_CHUNK; /* published in chunks, never gathered */
	if (!(d->stage = dalloc(d, MR_MEM_WORKSPACE, d->nstage)))
		return MR_ENOMEM;
	if ((d->zero == 1 || d->zero == 2) &&
	    (!(d->Pc = dalloc_bytes(d, MR_MEM_PARAMS, d->np * act)) ||
	     !(d->sc = dalloc_bytes(d, MR_MEM_WORKSPACE, d->nshard * act))))
		return MR_ENOMEM;
	if (d->zero == 3 && !(d->pshard_c = dalloc_bytes(d, MR_MEM_PARAMS, d->nshard * act)))
		return MR_ENOMEM;
	return 0;
}

static int alloc_all(struct mr_dp *d)
{
	int u;

	if (d->off) {
		/* the moments, the grads' host copy and the params' (the master,
		 * or the staging of the device's master) */
		if (!(d->om = halloc(d, 2 * d->nshard)) || !(d->hg = halloc(d, d->nshard)) ||
		    !(d->hp = halloc(d, d->nshard)))
			return MR_ENOMEM;
	} else if (!(d->om = dalloc(d, MR_MEM_OPTIM, 2 * d->nshard))) {
		return MR_ENOMEM;
	}
	d->ov = d->om + d->nshard;
	if (mr__dp_mb(d) && alloc_master_on_host(d) < 0)
		return MR_ENOMEM;
	if (d->zero == 0)
		return 0;
	if (!(d->gshard = dalloc(d, MR_MEM_GRADS, d->nshard)))
		return MR_ENOMEM;
	if (d->zero < 3 && !mr__dp_mb(d) && !(d->P = dalloc(d, MR_MEM_PARAMS, d->np)))
		return MR_ENOMEM;
	if (d->zero == 1 && !(d->G = dalloc(d, MR_MEM_GRADS, d->np)))
		return MR_ENOMEM;
	if (d->zero == 3 && !mr__dp_mb(d) && !(d->pshard = dalloc(d, MR_MEM_PARAMS, d->nshard)))
		return MR_ENOMEM;
	if (d->zero >= 2 && alloc_slots(d, d->gs, MR_MEM_GRADS, 1) < 0)
		return MR_ENOMEM;
	if (d->zero == 3 && alloc_slots(d, d->ps, MR_MEM_PARAMS, 0) < 0)
		return MR_ENOMEM;
	for (u = 0; u < d->nunits && d->zero < 3; u++) {
		size_t poff = d->pc[d->pfirst[u]].poff;
		if (mr__dp_mb(d))
			mr_gpt_bind_compute_unit(d->m, u, mr_dev_at(d->dev, d->Pc, poff));
		else
			mr__dp_bind_unit(d, u, d->P + poff, 0);
		if (d->zero == 1)
			mr__dp_bind_unit(d, u, d->G + poff, 1);
	}
	return 0;
}

/* The offload that takes effect on dev: none where the device's memory
 * is host memory (the cpu device: the state is there already, said once
 * per process). */
static int offload_in_effect(struct mr_dev *dev, int offload)
{
	static atomic_int said;

	if (offload == MR_DP_OFFLOAD_NONE || dev->ops->is_device)
		return offload;
	if (atomic_exchange(&said, 1) == 0)
		mr_log_info("offload_noop",
			    "offload=%s device=%s reason=\"the optimizer state is in host memory "
			    "already\"",
			    offload == MR_DP_OFFLOAD_OPTIM ? "optimizer" : "optimizer+master",
			    dev->ops->name);
	return MR_DP_OFFLOAD_NONE;
}

int mr_dp_create(struct mr_dp **out, struct mr_gpt *m, const struct mr_adamw_config *oc,
		 const struct mr_dp_config *cfg, const struct mr_dp_comms *c, uint64_t seed,
		 struct mr_errbuf *eb)
{
	unsigned want = mr_dp_model_flags_on(m->dev, cfg->zero, cfg->offload);
	struct mr_dp *d;
	int rc;

	*out = NULL;
	if (cfg->zero < 0 || cfg->zero > 3)
		return mr_errf_field(eb, MR_EINVAL, "zero", "'zero' must be 0, 1, 2 or 3, got %d",
				     cfg->zero);
	if (cfg->offload < MR_DP_OFFLOAD_NONE || cfg->offload > MR_DP_OFFLOAD_MASTER)
		return mr_errf_field(eb, MR_EINVAL, "offload",
				     "'offload' must be none, optimizer or optimizer+master "
				     "(0, 1, 2), got %d", cfg->offload);
	if (master_on_host(m->dev, cfg->offload) && m->dev->act == MR_DT_F32)
		return mr_errf_field(eb, MR_EINVAL, "offload",
				     "'offload' optimizer+master needs bf16 weights on the device "
				     "('precision' bf16): in fp32 the device's weights are the master");
	if ((m->params == NULL) != !!(want & MR_GPT_EXT_PARAMS))
		return mr_errf_field(eb, MR_EINVAL, "ext_params",
				     "'ext_params' must be %d for zero %d (see mr_dp_model_flags_on)",
				     !!(want & MR_GPT_EXT_PARAMS), cfg->zero);
	if ((m->grads == NULL) != !!(want & MR_GPT_EXT_GRADS))
		return mr_errf_field(eb, MR_EINVAL, "ext_grads",
				     "'ext_grads' must be %d for zero %d (see mr_dp_model_flags_on)",
				     !!(want & MR_GPT_EXT_GRADS), cfg->zero);
	if (master_on_host(m->dev, cfg->offload) &&
	    (m->params_c == NULL) != !!(want & MR_GPT_EXT_COMPUTE))
		return mr_errf_field(eb, MR_EINVAL, "ext_compute",
				     "'ext_compute' must be %d for zero %d (see mr_dp_model_flags_on)",
				     !!(want & MR_GPT_EXT_COMPUTE), cfg->zero);
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
	d->off = offload_in_effect(d->dev, cfg->offload);
	d->S = comm_size(d->c.shard);
	d->srank = comm_rank(d->c.shard);
	d->R = comm_size(d->c.replica);
	d->rrank = comm_rank(d->c.replica);
	d->W = comm_size(d->c.world);
	d->dpn = d->S * d->R;
	d->ep = mr_place_size(&m->place, MR_AXIS_EP);
	d->erank = comm_rank(d->c.expert);
	if (d->ep > 1 && d->R > 1) {
		rc = mr_errf_field(eb, MR_ENOTSUP, "hsdp_shard",
				   "expert parallelism (ep %d) does not run with HSDP yet: "
				   "'hsdp_shard' must be unset (replicas %d)", d->ep, d->R);
		free(d);
		return rc;
	}
	/* DDP: the experts' grads reduce over another group than the rest,
	 * in one pass after the backward (no per-bucket overlap yet); ZeRO
	 * gives them pieces of their own */
	if (d->ep > 1 && d->zero == 0)
		d->cfg.overlap = 0;
	if ((rc = layout(d)) < 0 || (rc = segments(d)) < 0 || (rc = buckets(d)) < 0 ||
	    (rc = ranges(d)) < 0 ||
	    (rc = alloc_all(d)) < 0 || (rc = init_all(d, seed)) < 0) {
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
	for (i = 0; i < 4 * DP_MAX_PIECES; i++) {
		mr__dp_wait(d, &d->ps[i / DP_MAX_PIECES].req[i % DP_MAX_PIECES], 0);
		mr__dp_wait(d, &d->gs[i / DP_MAX_PIECES].req[i % DP_MAX_PIECES], 0);
	}
	for (i = 0; d->req && i < d->npieces; i++)
		mr__dp_wait(d, &d->req[i], 0);
	if (d->m->hooks == &d->hooks)
		d->m->hooks = NULL;
	for (i = 0; i < d->nal; i++)
		if (d->al[i].host)
			mr_dev_host_free(d->dev, &d->m->mem, (enum mr_mem_kind)d->al[i].kind,
					 d->al[i].p, d->al[i].bytes);
		else
			mr_dev_free(d->dev, &d->m->mem, (enum mr_mem_kind)d->al[i].kind,
				    d->al[i].p, d->al[i].bytes);
	free(d->pc);
	free(d->pfirst);
	free(d->seg);
	free(d->ranges);
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
