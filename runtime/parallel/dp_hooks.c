/*
 * dp_hooks.c - the model hooks of data parallelism (see mr_dp.h): DDP
 * bucket all-reduces and ZeRO-1 reduce-scatters on the final micro-batch,
 * ZeRO-2/3 gradient slots reduce-scattered every micro-batch, ZeRO-3
 * parameter gathers with one-unit prefetch. On stream-ordered groups
 * (nccl: mr_comm_stream_ordered) nothing here waits on the host: the
 * reductions issued from the backward hooks run on the communicator's
 * stream beside the backward, and the gathers' and reductions' waits are
 * the compute stream's.
 *
 * Slots: 0 holds unit 0 (embeddings, also the LM head), 1 unit U-1 (final
 * LayerNorm), 2 and 3 the layers by parity, so the unit in use and the one
 * being prefetched (or reduced) never share a slot. Every rank issues the
 * same collectives in the same order because the hooks fire in the same
 * order everywhere.
 */
#include <string.h>
#include <time.h>

#include "dp_int.h"

double mr__dp_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int mr__dp_wait(struct mr_dp *d, struct mr_comm_req **req, int grad)
{
	double t0;
	int rc;

	if (!*req)
		return 0;
	t0 = mr__dp_now();
	rc = mr_comm_wait(*req);
	*req = NULL;
	d->st.comm_wait_s += mr__dp_now() - t0;
	if (grad)
		d->t_last = mr__dp_now();
	return rc;
}

/* Every group of one job has the same backend on the same device, so any
 * of them tells whether the host must sync before a collective. */
int mr__dp_sync(struct mr_dp *d)
{
	const struct mr_dp_comms *c = &d->c;
	struct mr_comm *any = c->world     ? c->world
			      : c->shard   ? c->shard
			      : c->replica ? c->replica
					   : c->expert;

	return mr_dev_comm_sync(d->dev, any);
}

/* Notes a gradient collective being issued (for the stats). */
static void grad_issued(struct mr_dp *d)
{
	if (d->st.grad_colls++ == 0)
		d->t_first = mr__dp_now();
}

int mr__dp_slot_of(const struct mr_dp *d, int u)
{
	return u == 0 ? 0 : u == d->nunits - 1 ? 1 : 2 + (u & 1);
}

int mr__dp_gather_unit_from(struct mr_dp *d, int u, const void *src, int act, void *dst,
			    struct mr_comm_req **req)
{
	size_t s0 = d->pc[d->pfirst[u]].soff;
	size_t el = act ? mr_dev_act_bytes(d->dev, 1) : sizeof(float);
	int k, rc = 0;

	d->st.param_colls++;
	for (k = d->pfirst[u]; k < d->pfirst[u + 1]; k++)
		req[k - d->pfirst[u]] = NULL;
	if ((rc = mr__dp_sync(d)) < 0)
		return rc;
	for (k = d->pfirst[u]; k < d->pfirst[u + 1] && rc == 0; k++) {
		const struct dp_piece *P = &d->pc[k];
		const char *from = (const char *)src + (P->soff - (act ? 0 : s0)) * el;
		char *to = (char *)dst + P->loff * el;
		if (P->S == 1)
			rc = d->dev->ops->copy(d->dev, to, from, P->sn * el);
		else
			rc = mr_comm_iallgather(P->comm, from, to, P->sn,
						act ? MR_COMM_BF16 : MR_COMM_F32,
						&req[k - d->pfirst[u]]);
	}
	return rc;
}

int mr__dp_gather_unit(struct mr_dp *d, int u, float *dst, struct mr_comm_req **req)
{
	return mr__dp_gather_unit_from(d, u, d->pshard + d->pc[d->pfirst[u]].soff, 0, dst, req);
}

/* Waits for every piece's request of the slot. */
static int slot_wait(struct mr_dp *d, struct dp_slot *sl, int grad)
{
	int k, rc = 0;

	for (k = 0; k < DP_MAX_PIECES; k++) {
		int w = mr__dp_wait(d, &sl->req[k], grad);
		rc = rc ? rc : w;
	}
	return rc;
}

/* ---- zero 3: parameter slots ---- */

static int pslot_issue(struct mr_dp *d, int u)
{
	struct dp_slot *sl = &d->ps[mr__dp_slot_of(d, u)];
	int rc;

	if (sl->unit == u)
		return 0; /* present or in flight */
	if ((rc = slot_wait(d, sl, 0)) < 0)
		return rc;
	sl->unit = u;
	if (mr__dp_mb(d)) /* bf16 weights alone: straight into the compute copy */
		return mr__dp_gather_unit_from(d, u, d->pshard_c, 1, sl->cbuf, sl->req);
	return mr__dp_gather_unit(d, u, sl->buf, sl->req);
}

static int pslot_ready(struct mr_dp *d, int u)
{
	struct dp_slot *sl = &d->ps[mr__dp_slot_of(d, u)];
	int rc;

	if ((rc = pslot_issue(d, u)) < 0 || (rc = slot_wait(d, sl, 0)) < 0)
		return rc;
	if (mr__dp_mb(d)) {
		mr_gpt_bind_compute_unit(d->m, u, sl->cbuf);
		return 0;
	}
	mr__dp_bind_unit(d, u, sl->buf, 0);
	if (sl->cbuf) /* a bf16 device: the unit's compute copy lives here too */
		mr_gpt_bind_compute_unit(d->m, u, sl->cbuf);
	return mr_gpt_refresh_unit(d->m, u);
}

/* ---- zero >= 2: gradient slots ---- */

/* Waits for the slot's reduce-scatters and adds their output to the shard
 * (the unit's shard span is contiguous: one add). */
static int gslot_settle(struct mr_dp *d, struct dp_slot *sl)
{
	int rc;

	if ((rc = slot_wait(d, sl, 1)) < 0)
		return rc;
	if (!sl->pending)
		return 0;
	sl->pending = 0;
	return d->dev->ops->add_f32(d->dev, d->gshard + d->pc[d->pfirst[sl->unit]].soff, sl->out,
				    mr__dp_unit_shard(d, sl->unit));
}

static int gslot_acquire(struct mr_dp *d, int u)
{
	struct dp_slot *sl = &d->gs[mr__dp_slot_of(d, u)];
	int rc;

	if ((rc = gslot_settle(d, sl)) < 0 ||
	    (rc = d->dev->ops->zero(d->dev, sl->buf, mr__dp_unit_padded(d, u) * sizeof(float))) < 0)
		return rc;
	sl->unit = u;
	mr__dp_bind_unit(d, u, sl->buf, 1);
	return 0;
}

static int gslot_release(struct mr_dp *d, int u)
{
	struct dp_slot *sl = &d->gs[mr__dp_slot_of(d, u)];
	size_t s0 = d->pc[d->pfirst[u]].soff;
	int k, rc;

	grad_issued(d);
	sl->pending = 1;
	if ((rc = mr__dp_sync(d)) < 0)
		return rc;
	for (k = d->pfirst[u]; k < d->pfirst[u + 1] && rc == 0; k++) {
		const struct dp_piece *P = &d->pc[k];
		float *out = sl->out + (P->soff - s0);
		if (P->S == 1)
			rc = d->dev->ops->copy(d->dev, out, sl->buf + P->loff, P->sn * sizeof(float));
		else
			rc = mr_comm_ireduce_scatter(P->comm, sl->buf + P->loff, out, P->sn,
						     MR_COMM_F32, MR_COMM_AVG,
						     &sl->req[k - d->pfirst[u]]);
	}
	if (rc == 0 && !d->cfg.overlap)
		rc = gslot_settle(d, sl);
	return rc;
}

/* ---- DDP buckets and ZeRO-1 units (final micro-batch only) ---- */

static int ddp_issue(struct mr_dp *d, int b)
{
	int rc;

	grad_issued(d);
	if (d->S == 1)
		return 0;
	if ((rc = mr__dp_sync(d)) < 0)
		return rc;
	return mr_comm_iallreduce(d->c.shard, d->m->grads + d->boff[b], d->m->grads + d->boff[b],
				  d->bn[b], MR_COMM_F32, MR_COMM_AVG, &d->req[b]);
}

static int z1_issue(struct mr_dp *d, int u)
{
	int k, rc;

	grad_issued(d);
	if ((rc = mr__dp_sync(d)) < 0)
		return rc;
	for (k = d->pfirst[u]; k < d->pfirst[u + 1] && rc == 0; k++) {
		const struct dp_piece *P = &d->pc[k];
		if (P->S == 1)
			rc = d->dev->ops->copy(d->dev, d->gshard + P->soff, d->G + P->poff,
					       P->sn * sizeof(float));
		else
			rc = mr_comm_ireduce_scatter(P->comm, d->G + P->poff, d->gshard + P->soff,
						     P->sn, MR_COMM_F32, MR_COMM_AVG, &d->req[k]);
	}
	return rc;
}

/*
 * Expert parallel, DDP: the dense ranges averaged over the data-parallel
 * group; each expert range over the expert-data-parallel group, then
 * divided by ep. An expert's grad here already sums the ep ranks'
 * micro-batches (their tokens came to it), so the mean over all dp
 * micro-batches is (sum over edp of the sums over ep) / dp = (mean over
 * edp) / ep.
 */
static int finish_ep(struct mr_dp *d)
{
	int i, rc = 0;

	grad_issued(d);
	if ((rc = mr__dp_sync(d)) < 0)
		return rc;
	for (i = 0; i < d->nrange && rc == 0; i++) {
		const struct dp_range *r = &d->range[i];
		float *g = d->m->grads + r->off;
		struct mr_comm *c = r->experts ? d->c.expert : d->c.shard;
		if (c)
			rc = mr_comm_allreduce(c, g, g, r->n, MR_COMM_F32, MR_COMM_AVG);
		if (rc == 0 && r->experts)
			rc = d->dev->ops->scale(d->dev, g, r->n, 1.0f / (float)d->ep);
	}
	return rc;
}

/* ZeRO with expert parallel: the expert shards, averaged over the
 * expert-data-parallel group, divided by ep (as finish_ep says why). */
static int scale_experts(struct mr_dp *d)
{
	int k, rc = 0;

	for (k = 0; k < d->npieces && rc == 0; k++)
		if (d->pc[k].experts)
			rc = d->dev->ops->scale(d->dev, d->gshard + d->pc[k].soff, d->pc[k].sn,
						1.0f / (float)d->ep);
	return rc;
}

/* The gradient reductions of the step, done (see mr_dp.h). */
static int finish(struct mr_dp *d)
{
	int b, u, k, rc = 0;

	if (d->ep > 1 && d->zero == 0)
		return finish_ep(d);
	if (d->zero == 0) {
		if (!d->cfg.overlap && d->S > 1) {
			grad_issued(d);
			if ((rc = mr__dp_sync(d)) == 0)
				rc = mr_comm_iallreduce(d->c.shard, d->m->grads, d->m->grads,
							d->m->nparams, MR_COMM_F32, MR_COMM_AVG,
							&d->req[0]);
		} else if (!d->cfg.overlap) {
			grad_issued(d);
		}
		for (b = 0; b < d->nbuckets && rc == 0; b++)
			rc = mr__dp_wait(d, &d->req[b], 1);
	} else if (d->zero == 1) {
		for (u = d->nunits - 1; u >= 0 && rc == 0; u--) {
			if (!d->cfg.overlap)
				rc = z1_issue(d, u);
			for (k = d->pfirst[u]; k < d->pfirst[u + 1] && rc == 0; k++)
				rc = mr__dp_wait(d, &d->req[k], 1);
		}
	} else {
		for (b = 0; b < 4 && rc == 0; b++)
			rc = gslot_settle(d, &d->gs[b]);
	}
	if (rc == 0 && d->zero && d->ep > 1)
		rc = scale_experts(d);
	if (rc < 0 || d->R == 1)
		return rc;
	grad_issued(d);
	if ((rc = mr__dp_sync(d)) < 0)
		return rc;
	if (d->zero == 0)
		rc = mr_comm_iallreduce(d->c.replica, d->m->grads, d->m->grads, d->m->nparams,
					MR_COMM_F32, MR_COMM_AVG, &d->req[0]);
	else
		rc = mr_comm_iallreduce(d->c.replica, d->gshard, d->gshard, d->nshard,
					MR_COMM_F32, MR_COMM_AVG, &d->req[0]);
	if (rc == 0)
		rc = mr__dp_wait(d, &d->req[0], 1);
	return rc;
}

int mr_dp_finish_grads(struct mr_dp *d)
{
	int rc = finish(d);

	d->st.comm_s = d->t_last > d->t_first ? d->t_last - d->t_first : 0.0;
	return rc;
}

/* ---- the hooks ---- */

static int pre_fwd(void *ctx, int u)
{
	struct mr_dp *d = ctx;
	int last = d->nunits - 1, rc;

	if (d->zero < 3)
		return 0;
	if (u == 0) {
		if ((rc = pslot_issue(d, 0)) < 0 || (rc = pslot_issue(d, last)) < 0 ||
		    (last > 1 && (rc = pslot_issue(d, 1)) < 0))
			return rc;
		return pslot_ready(d, 0);
	}
	if ((rc = pslot_ready(d, u)) < 0)
		return rc;
	if (u < last - 1)
		return pslot_issue(d, u + 1);
	return 0;
}

static int pre_bwd(void *ctx, int u)
{
	struct mr_dp *d = ctx;
	int last = d->nunits - 1, rc;

	if (d->zero >= 2 && u == last &&
	    ((rc = gslot_acquire(d, 0)) < 0 || (rc = gslot_acquire(d, last)) < 0))
		return rc;
	if (d->zero >= 2 && u > 0 && u < last && (rc = gslot_acquire(d, u)) < 0)
		return rc;
	if (d->zero < 3)
		return 0;
	if ((rc = pslot_ready(d, u)) < 0)
		return rc;
	if (u == last && last > 1)
		return pslot_issue(d, last - 1);
	if (u > 1 && u < last)
		return pslot_issue(d, u - 1);
	return 0;
}

/* A recomputation reads unit u's parameters again (mr_gpt.h): ZeRO-3
 * gathers them back into their slot if they left it. The rule: a
 * recomputed block's two units are present together, in the two layer
 * slots of different parity, from its recomputation to its backward;
 * the one-unit prefetch goes on as before. */
static int pre_recompute(void *ctx, int u)
{
	struct mr_dp *d = ctx;

	return d->zero < 3 ? 0 : pslot_ready(d, u);
}

static int post_bwd(void *ctx, int u)
{
	struct mr_dp *d = ctx;
	int b;

	if (d->zero >= 2)
		return gslot_release(d, u);
	if (!d->final || !d->cfg.overlap)
		return 0;
	if (d->zero == 1)
		return z1_issue(d, u);
	b = d->bucket_of[u];
	return d->bucket_low[b] == u ? ddp_issue(d, b) : 0;
}

void mr__dp_set_hooks(struct mr_dp *d)
{
	d->hooks.ctx = d;
	d->hooks.pre_fwd = pre_fwd;
	d->hooks.pre_bwd = pre_bwd;
	d->hooks.post_bwd = post_bwd;
	d->hooks.pre_recompute = pre_recompute;
	d->m->hooks = &d->hooks;
}
