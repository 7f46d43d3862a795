/*
 * dp_optim.c - the optimizer side of data parallelism (see mr_dp.h), what
 * the step driver (mr_step.h) calls around the micro-batches: begin and
 * finish a step, the norm and mean loss over the job, the first
 * non-finite tensor, clipping + AdamW on this rank's owned range and the
 * parameter all-gather after it; and gathering the parameters for checks
 * and checkpoints. With offload (mr_dp.h) AdamW runs on the host copies.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dp_int.h"

/* The params this rank updates for segment s. */
static float *seg_params(struct mr_dp *d, const struct dp_seg *s)
{
	const struct dp_piece *P = &d->pc[s->piece];

	if (d->zero == 0)
		return d->m->params + s->so;
	if (d->zero == 3)
		return d->pshard + s->so;
	return d->P + P->poff + (size_t)P->srank * P->sn + (s->so - P->soff);
}

static float *owned_grads(struct mr_dp *d)
{
	return d->zero ? d->gshard : d->m->grads;
}

void mr_dp_begin(struct mr_dp *d)
{
	memset(&d->st, 0, sizeof(d->st));
	d->t_first = d->t_last = 0.0;
	if (d->zero == 0)
		mr_gpt_zero_grad(d->m);
	if (d->zero == 1)
		d->dev->ops->zero(d->dev, d->G, d->np * sizeof(float));
	if (d->zero >= 1)
		d->dev->ops->zero(d->dev, d->gshard, d->nshard * sizeof(float));
}

void mr_dp_micro_batch(struct mr_dp *d, int final)
{
	d->final = final;
}

/* The failure path: each owned segment downloaded and scanned. */
const char *mr_dp_first_nonfinite(struct mr_dp *d, int grads)
{
	const char *name = NULL;
	size_t mx = 0, j;
	float *h;
	int i;

	for (i = 0; i < d->nseg; i++)
		if (d->seg[i].n > mx)
			mx = d->seg[i].n;
	if (!(h = malloc(mx * sizeof(float))))
		return NULL;
	for (i = 0; i < d->nseg && !name; i++) {
		const struct dp_seg *s = &d->seg[i];
		if (!grads && mr__dp_mb(d))
			memcpy(h, d->hp + s->so, s->n * sizeof(float)); /* the host master */
		else if (d->dev->ops->download(d->dev, h,
					       grads ? owned_grads(d) + s->so : seg_params(d, s),
					       s->n * sizeof(float)) < 0)
			break;
		for (j = 0; j < s->n && !name; j++)
			if (!isfinite(h[j]))
				name = d->m->tensors[s->tensor].name;
	}
	free(h);
	return name;
}

/*
 * v[0] = this rank's sum of squares (each counted segment one sum in
 * element order, added in segment order: the same value on any device
 * thread count); v[1], v[2] this rank's mean loss and aux loss, v[3] its
 * flag. Every rank's doubles are all-gathered bit for bit (as I64) and
 * added in rank order, so the result is identical everywhere and has no
 * fp32 rounding.
 */
int mr_dp_reduce_stats(struct mr_dp *d, double v[MR_DP_NSTATS])
{
	double all[MR_DP_NSTATS * DP_MAX_WORLD];
	int r, k, rc;

	rc = d->dev->ops->sumsq(d->dev, owned_grads(d), d->cnt_off, d->cnt_n, d->ncnt, d->part);
	if (rc < 0)
		return rc;
	v[0] = 0.0;
	for (k = 0; k < d->ncnt; k++)
		v[0] += d->part[k];
	if (d->W == 1)
		return 0;
	if (d->W > DP_MAX_WORLD)
		return MR_ELIMIT;
	v[1] /= d->W;
	v[2] /= d->W;
	rc = mr_comm_allgather(d->c.world, v, all, MR_DP_NSTATS, MR_COMM_I64);
	if (rc < 0)
		return rc;
	for (k = 0; k < MR_DP_NSTATS; k++)
		v[k] = 0.0;
	for (r = 0; r < d->W; r++)
		for (k = 0; k < MR_DP_NSTATS; k++)
			v[k] += all[MR_DP_NSTATS * r + k];
	return 0;
}

void mr_dp_unit_grads(struct mr_dp *d, int u, float **g, size_t *n)
{
	const struct dp_piece *P = &d->pc[d->pfirst[u]];

	*g = d->zero ? d->gshard + P->soff : d->m->grads + P->off;
	*n = d->zero ? mr__dp_unit_shard(d, u) : P->n;
}

long mr_dp_steps(const struct mr_dp *d)
{
	return d->t;
}

const struct mr_adamw_config *mr_dp_adamw(const struct mr_dp *d)
{
	return &d->oc;
}

/* zero 1/2: every rank's updated shard back into the full params (the
 * grad shard, spent, carries this rank's part). */
static int gather_updated(struct mr_dp *d)
{
	int k, rc = 0;

	for (k = d->npieces - 1; k >= 0 && rc == 0; k--) {
		const struct dp_piece *P = &d->pc[k];
		if (P->S == 1)
			continue; /* updated in place */
		rc = d->dev->ops->copy(d->dev, d->gshard + P->soff,
				       d->P + P->poff + (size_t)P->srank * P->sn,
				       P->sn * sizeof(float));
		if (rc == 0)
			rc = mr__dp_sync(d);
		if (rc < 0)
			break;
		d->st.param_colls++;
		rc = mr_comm_iallgather(P->comm, d->gshard + P->soff, d->P + P->poff, P->sn,
					MR_COMM_F32, &d->req[k]);
	}
	for (k = d->npieces - 1; k >= 0; k--) {
		int w = mr__dp_wait(d, &d->req[k], 0);
		if (rc == 0)
			rc = w;
	}
	return rc;
}

/* OPTIM: the device's fp32 copy of the owned parameters to d->hp (up =
 * 0) or d->hp to it (up = 1), piece by piece. */
static int owned_params(struct mr_dp *d, int up)
{
	struct mr_dev *dev = d->dev;
	int k, rc = 0;

	if (d->zero == 0 || d->zero == 3) { /* the owned arrays themselves */
		float *p = d->zero == 0 ? d->m->params : d->pshard;
		size_t bytes = d->nshard * sizeof(float);
		return up ? dev->ops->upload(dev, p, d->hp, bytes)
			  : dev->ops->download(dev, d->hp, p, bytes);
	}
	for (k = 0; k < d->npieces && rc == 0; k++) { /* each piece's part of the padded copy */
		const struct dp_piece *P = &d->pc[k];
		float *p = d->P + P->poff + (size_t)P->srank * P->sn;
		size_t bytes = P->sn * sizeof(float);
		rc = up ? dev->ops->upload(dev, p, d->hp + P->soff, bytes)
			: dev->ops->download(dev, d->hp + P->soff, p, bytes);
	}
	return rc;
}

/* n floats of host src onto the device as dst's activation type, through
 * the fp32 staging buffer. */
static int publish_range(struct mr_dp *d, mr_act *dst, const float *src, size_t n)
{
	struct mr_dev *dev = d->dev;
	size_t at, k;
	int rc = 0;

	for (at = 0; at < n && rc == 0; at += k) {
		k = n - at < d->nstage ? n - at : d->nstage;
		rc = dev->ops->upload(dev, d->stage, src + at, k * sizeof(float));
		if (rc == 0)
			rc = dev->ops->to_act(dev, mr_dev_at(dev, dst, at), d->stage, k);
	}
	return rc;
}

int mr__dp_publish(struct mr_dp *d)
{
	int k, u, rc = 0;

	if (d->zero == 0)
		return publish_range(d, mr_gpt_compute_at(d->m, 0), d->hp, d->nshard);
	if (d->zero == 3) {
		rc = publish_range(d, d->pshard_c, d->hp, d->nshard);
		for (u = 0; u < 4; u++) {
			for (k = 0; k < DP_MAX_PIECES; k++)
				mr__dp_wait(d, &d->ps[u].req[k], 0);
			d->ps[u].unit = -1; /* stale: re-gathered on next use */
		}
		return rc;
	}
	/* zero 1/2: each piece's shard, then every rank's gathered into Pc */
	for (k = 0; k < d->npieces && rc == 0; k++) {
		const struct dp_piece *P = &d->pc[k];
		mr_act *own = P->S == 1 ? mr_dev_at(d->dev, d->Pc, P->poff)
					: mr_dev_at(d->dev, d->sc, P->soff);
		rc = publish_range(d, own, d->hp + P->soff, P->sn);
	}
	if (rc == 0)
		rc = mr__dp_sync(d);
	for (k = d->npieces - 1; k >= 0 && rc == 0; k--) {
		const struct dp_piece *P = &d->pc[k];
		if (P->S == 1)
			continue;
		d->st.param_colls++;
		rc = mr_comm_iallgather(P->comm, mr_dev_at(d->dev, d->sc, P->soff),
					mr_dev_at(d->dev, d->Pc, P->poff), P->sn, MR_COMM_BF16,
					&d->req[k]);
	}
	for (k = d->npieces - 1; k >= 0; k--) {
		int w = mr__dp_wait(d, &d->req[k], 0);
		if (rc == 0)
			rc = w;
	}
	return rc;
}

/*
 * Offload: the (clipped) owned grads down to the host, AdamW there over
 * each segment with the device's arithmetic (mr_dev_adamw's weight decay
 * rule: decay where the tensor decays and the rate is positive), the
 * owned params back up into the device's fp32 copy. OPTIM downloads that
 * copy first (it is the master); MASTER's host copy is the master, which
 * is published (mr__dp_publish) instead.
 */
struct host_step {
	struct mr_dp *d;
	float lr;
};

/* Elements [i0, i1) of the host shard: each segment's part of it (a
 * segment's weight decay is its own; the arithmetic is per element, so
 * any split gives the same bits). */
static void host_adamw(void *ctx, size_t i0, size_t i1, int tid)
{
	const struct host_step *h = ctx;
	struct mr_dp *d = h->d;

	(void)tid;
	for (int i = 0; i < d->nseg; i++) {
		const struct dp_seg *s = &d->seg[i];
		size_t a = s->so > i0 ? s->so : i0, b = s->so + s->n < i1 ? s->so + s->n : i1;
		if (a < b)
			mr_adamw_update_range(&d->oc, d->t, h->lr, d->hp + a, d->hg + a, d->om + a,
					      d->ov + a, b - a, s->decay && d->oc.weight_decay > 0.0f);
	}
}

static int update_on_host(struct mr_dp *d, float lr)
{
	struct host_step h = { d, lr };
	int rc;

	rc = d->dev->ops->download(d->dev, d->hg, owned_grads(d), d->nshard * sizeof(float));
	if (rc == 0 && d->off == MR_DP_OFFLOAD_OPTIM)
		rc = owned_params(d, 0);
	if (rc < 0)
		return rc;
	/* the segments tile the shard (its padding past them is untouched) */
	mr_pool_run(d->host_pool, d->nshard, 1 << 14, host_adamw, &h);
	return mr__dp_mb(d) ? mr__dp_publish(d) : owned_params(d, 1);
}

void mr_dp_host_threads(struct mr_dp *d, struct mr_pool *pool)
{
	d->host_pool = pool;
}

int mr_dp_update_args(struct mr_dp *d, double norm, float lr)
{
	struct mr_dev_adamw o = { lr, d->oc.beta1, d->oc.beta2, d->oc.eps, d->oc.weight_decay, 0,
				  1.0f };

	d->clip = mr_grad_clip_factor(norm, d->oc.grad_clip);
	d->lr = lr;
	o.t = ++d->t;
	if (d->off)
		return 0; /* the host's AdamW (update_on_host) */
	o.grad_scale = d->clip; /* the clipping inside AdamW: the gradients stay */
	return d->dev->ops->adamw_args(d->dev, &o);
}

int mr_dp_update_apply(struct mr_dp *d)
{
	int i, u, rc = 0;

	/* DDP updates the table in place: the device's adamw writes the
	 * model's compute copy too (a bf16 device); ZeRO refreshes it from
	 * the full parameters once they are gathered (1, 2) or when a unit's
	 * gather is bound (3, dp_hooks.c) */
	if (d->off) {
		if (d->clip != 1.0f &&
		    (rc = d->dev->ops->scale(d->dev, owned_grads(d), d->nshard, d->clip)) < 0)
			return rc;
		rc = update_on_host(d, d->lr);
		if (rc == 0 && d->zero == 0 && !mr__dp_mb(d)) /* DDP: the whole compute copy */
			rc = mr_gpt_refresh_compute(d->m);
		if (mr__dp_mb(d))
			return rc; /* published, gathered (zero 1/2), slots stale (zero 3) */
	}
	if (rc == 0 && !d->off) {
		for (i = 0; i < d->nseg; i++) {
			const struct dp_seg *s = &d->seg[i];
			d->ranges[i] = (struct mr_dev_adamw_range){
				seg_params(d, s), d->zero ? NULL : mr_gpt_compute_at(d->m, s->so),
				owned_grads(d) + s->so, d->om + s->so, d->ov + s->so, s->n, s->decay
			};
		}
		rc = d->dev->ops->adamw(d->dev, d->ranges, d->nseg);
	}
	if (rc == 0 && (d->zero == 1 || d->zero == 2) && (rc = gather_updated(d)) == 0)
		rc = mr_gpt_refresh_compute(d->m);
	for (u = 0; u < 4 && d->zero == 3; u++) {
		for (i = 0; i < DP_MAX_PIECES; i++)
			mr__dp_wait(d, &d->ps[u].req[i], 0);
		d->ps[u].unit = -1; /* stale: re-gathered on next use */
	}
	return rc;
}

int mr_dp_update(struct mr_dp *d, double norm, float lr)
{
	int rc = mr_dp_update_args(d, norm, lr);

	return rc < 0 ? rc : mr_dp_update_apply(d);
}

int mr_dp_graph_safe(const struct mr_dp *d, const char **why)
{
	*why = d->dpn > 1 ? "data parallel: the backward issues the gradient reductions"
	       : d->zero ? "ZeRO: its hooks gather and scatter around the passes"
	       : d->off ? "offload: AdamW runs on the host"
			: NULL;
	return *why == NULL;
}

int mr_dp_nslices(const struct mr_dp *d)
{
	return d->nseg;
}

/* Where slice s's `what` lives: the host copy (offloaded moments; MASTER's
 * parameters) or the device's. */
static float *slice_at(struct mr_dp *d, const struct dp_seg *s, int what, int *host)
{
	*host = d->off && (what != MR_DP_PARAM || d->off == MR_DP_OFFLOAD_MASTER);
	if (what == MR_DP_ADAM_M)
		return d->om + s->so;
	if (what == MR_DP_ADAM_V)
		return d->ov + s->so;
	return *host ? d->hp + s->so : seg_params(d, s);
}

void mr_dp_slice(struct mr_dp *d, int i, struct mr_dp_slice *out)
{
	const struct dp_seg *s = &d->seg[i];
	int host;

	out->tensor = s->tensor;
	out->at = s->at;
	out->n = s->n;
	out->owner = s->count;
	out->param = slice_at(d, s, MR_DP_PARAM, &host);
	out->m = d->om + s->so;
	out->v = d->ov + s->so;
}

int mr_dp_slice_read(struct mr_dp *d, int i, int what, float *dst)
{
	const struct dp_seg *s = &d->seg[i];
	int host;
	const float *src = slice_at(d, s, what, &host);

	if (!host)
		return d->dev->ops->download(d->dev, dst, src, s->n * sizeof(float));
	memcpy(dst, src, s->n * sizeof(float));
	return 0;
}

int mr_dp_slice_write(struct mr_dp *d, int i, int what, const float *src)
{
	const struct dp_seg *s = &d->seg[i];
	int host;
	float *dst = slice_at(d, s, what, &host);

	if (!host)
		return d->dev->ops->upload(d->dev, dst, src, s->n * sizeof(float));
	memcpy(dst, src, s->n * sizeof(float)); /* MASTER: mr_dp_restore publishes */
	return 0;
}

int mr_dp_restore(struct mr_dp *d, long t)
{
	int u, i, rc = 0;

	d->t = t;
	if (mr__dp_mb(d))
		return mr__dp_publish(d);
	if (d->zero == 1 || d->zero == 2)
		rc = gather_updated(d);
	for (u = 0; u < 4 && d->zero == 3; u++) {
		for (i = 0; i < DP_MAX_PIECES; i++)
			mr__dp_wait(d, &d->ps[u].req[i], 0);
		d->ps[u].unit = -1;
	}
	return rc == 0 && d->zero < 3 ? mr_gpt_refresh_compute(d->m) : rc;
}

/* Unit u's pieces from their padded span at src into dst's table places. */
static int download_unit(struct mr_dp *d, float *dst, const float *src, int u)
{
	int k, rc = 0;

	for (k = d->pfirst[u]; k < d->pfirst[u + 1] && rc == 0; k++)
		rc = d->dev->ops->download(d->dev, dst + d->pc[k].off, src + d->pc[k].loff,
					   d->pc[k].n * sizeof(float));
	return rc;
}

int mr_dp_gather_params(struct mr_dp *d, float *dst)
{
	struct mr_gpt *m = d->m;
	struct mr_comm_req *req[DP_MAX_PIECES];
	size_t cap = 0;
	long pc = d->st.param_colls;
	float *tmp;
	int u, k, rc = 0;

	if (d->zero == 0 && mr__dp_mb(d)) { /* the host master */
		memcpy(dst, d->hp, m->nparams * sizeof(float));
		return 0;
	}
	if (d->zero == 0)
		return d->dev->ops->download(d->dev, dst, m->params, m->nparams * sizeof(float));
	if (d->zero < 3 && !mr__dp_mb(d)) {
		for (u = 0; u < d->nunits && rc == 0; u++)
			rc = download_unit(d, dst, d->P + d->pc[d->pfirst[u]].poff, u);
		return rc;
	}
	for (u = 0; u < d->nunits; u++)
		if (mr__dp_unit_padded(d, u) > cap)
			cap = mr__dp_unit_padded(d, u);
	tmp = mr_dev_alloc(d->dev, &m->mem, MR_MEM_WORKSPACE, cap * sizeof(float));
	if (!tmp)
		return MR_ENOMEM;
	/* MASTER: each unit's host shard up into the staging first */
	for (u = 0; u < d->nunits && rc == 0; u++) {
		size_t s0 = d->pc[d->pfirst[u]].soff, sn = mr__dp_unit_shard(d, u);
		if (mr__dp_mb(d)) /* the staging holds a unit's shard */
			rc = d->dev->ops->upload(d->dev, d->stage, d->hp + s0, sn * sizeof(float));
		if (rc == 0)
			rc = mr__dp_mb(d) ? mr__dp_gather_unit_from(d, u, d->stage, 0, tmp, req)
				   : mr__dp_gather_unit(d, u, tmp, req);
		for (k = 0; k < d->pfirst[u + 1] - d->pfirst[u]; k++)
			if (req[k]) {
				int w = mr_comm_wait(req[k]);
				rc = rc ? rc : w;
			}
		if (rc == 0)
			rc = download_unit(d, dst, tmp, u);
	}
	mr_dev_free(d->dev, &m->mem, MR_MEM_WORKSPACE, tmp, cap * sizeof(float));
	d->st.param_colls = pc;
	return rc;
}
