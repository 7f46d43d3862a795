/*
 * dp_step.c - one data-parallel optimizer step (see mr_dp.h): micro-batch
 * loop, gradient reduction (dp_hooks.c), global norm and loss over the
 * world, clipping, AdamW on this rank's owned range, parameter all-gather;
 * and the parameter gather for checks and checkpoints.
 */
#include <math.h>
#include <string.h>

#include "dp_int.h"

/* The params this rank updates for segment s. */
static float *seg_params(struct mr_dp *d, const struct dp_seg *s)
{
	const struct dp_unit *U = &d->u[s->unit];

	if (d->zero == 0)
		return d->m->params + s->so;
	if (d->zero == 3)
		return d->pshard + s->so;
	return d->P + U->poff + (size_t)d->srank * U->sn + (s->so - U->soff);
}

static float *owned_grads(struct mr_dp *d)
{
	return d->zero ? d->gshard : d->m->grads;
}

/* Name of the first tensor with a non-finite value in this rank's owned
 * params (grads = 0) or grads (grads = 1), or NULL. */
static const char *first_nonfinite(struct mr_dp *d, int grads)
{
	int i;
	size_t j;

	for (i = 0; i < d->nseg; i++) {
		const struct dp_seg *s = &d->seg[i];
		const float *x = grads ? owned_grads(d) + s->so : seg_params(d, s);
		for (j = 0; j < s->n; j++)
			if (!isfinite(x[j]))
				return d->m->tensors[s->tensor].name;
	}
	return NULL;
}

static int nonfinite_loss(struct mr_dp *d, long step, double loss, struct mr_errbuf *eb)
{
	const struct mr_gpt *m = d->m;
	const char *p = first_nonfinite(d, 0);
	size_t i, n = (size_t)m->B * m->T * m->cfg.vocab / (size_t)m->par.tp;

	if (p)
		return mr_errf(eb, MR_ENONFINITE,
			       "loss is %g at step %ld: first non-finite tensor 'params.%s'", loss,
			       step, p);
	for (i = 0; i < n; i++)
		if (!isfinite(m->logits[i]))
			return mr_errf(eb, MR_ENONFINITE,
				       "loss is %g at step %ld: first non-finite tensor 'logits'",
				       loss, step);
	return mr_errf(eb, MR_ENONFINITE,
		       "loss is %g at step %ld: no non-finite parameter or logit on this rank",
		       loss, step);
}

/*
 * Sums (sumsq, loss, aux) over the world exactly: every rank's doubles are
 * all-gathered bit for bit (as I64) and added in rank order, so the result
 * is identical everywhere and has no fp32 rounding.
 */
static int world_sum(struct mr_dp *d, double v[3])
{
	double all[3 * 64];
	int r, k, rc;

	if (d->W == 1)
		return 0;
	if (d->W > 64)
		return MR_ELIMIT;
	rc = mr_comm_allgather(d->c.world, v, all, 3, MR_COMM_I64);
	if (rc < 0)
		return rc;
	v[0] = v[1] = v[2] = 0.0;
	for (r = 0; r < d->W; r++)
		for (k = 0; k < 3; k++)
			v[k] += all[3 * r + k];
	return 0;
}

/* zero 1/2: every rank's updated shard back into the full params. */
static int gather_updated(struct mr_dp *d)
{
	int u, rc = 0;

	if (d->S == 1)
		return 0;
	for (u = d->nunits - 1; u >= 0 && rc == 0; u--) {
		const struct dp_unit *U = &d->u[u];
		memcpy(d->gshard + U->soff, d->P + U->poff + (size_t)d->srank * U->sn,
		       U->sn * sizeof(float));
		d->st.param_colls++;
		rc = mr_comm_iallgather(d->c.shard, d->gshard + U->soff, d->P + U->poff, U->sn,
					MR_COMM_F32, &d->req[u]);
	}
	for (u = d->nunits - 1; u >= 0; u--) {
		int w = mr__dp_wait(d, &d->req[u], 0);
		if (rc == 0)
			rc = w;
	}
	return rc;
}

static void update(struct mr_dp *d, float lr)
{
	long t;
	int i;

	if (d->zero == 0) {
		mr_adamw_step(&d->o, d->m, lr);
		return;
	}
	t = ++d->o.t;
	for (i = 0; i < d->nseg; i++) {
		const struct dp_seg *s = &d->seg[i];
		mr_adamw_update_range(&d->o.cfg, t, lr, seg_params(d, s), d->gshard + s->so,
				      d->o.m + s->so, d->o.v + s->so, s->n, s->decay);
	}
}

static void zero_grads(struct mr_dp *d)
{
	if (d->zero == 0)
		mr_gpt_zero_grad(d->m);
	if (d->zero == 1)
		memset(d->G, 0, d->np * sizeof(float));
	if (d->zero >= 1)
		memset(d->gshard, 0, d->nshard * sizeof(float));
}

int mr_dp_step(struct mr_dp *d, const int *inputs, const int *targets, int accum,
	       struct mr_step_result *r, struct mr_errbuf *eb)
{
	struct mr_gpt *m = d->m;
	size_t N = (size_t)m->B * m->T;
	long step = d->o.t;
	double v[3] = { 0.0, 0.0, 0.0 }, norm;
	const char *g;
	int i, u, rc;

	if (accum < 1)
		return mr_errf_field(eb, MR_EINVAL, "accum", "'accum' must be >= 1, got %d", accum);
	memset(&d->st, 0, sizeof(d->st));
	d->t_first = d->t_last = 0.0;
	zero_grads(d);
	for (i = 0; i < accum; i++) {
		d->final = i == accum - 1;
		rc = mr_gpt_forward(m, inputs + i * N, targets + i * N, eb);
		if (rc < 0)
			return rc;
		/* a non-finite loss is reported after the world reduction, so
		 * every rank fails the step together */
		v[1] += m->loss;
		v[2] += m->aux_loss;
		rc = mr_gpt_backward(m, 1.0f / (float)accum);
		if (rc < 0)
			return mr_errf(eb, rc, "backward pass failed at step %ld: %s", step,
				       mr_strerror(rc));
	}
	if ((rc = mr__dp_finish_grads(d)) < 0)
		return mr_errf(eb, rc, "gradient reduction failed at step %ld: %s", step,
			       mr_strerror(rc));
	if (d->st.grad_colls)
		d->st.comm_s = d->t_last > d->t_first ? d->t_last - d->t_first : 0.0;
	for (i = 0; i < d->nseg; i++)
		if (d->seg[i].count)
			v[0] += mr_grad_sumsq(owned_grads(d) + d->seg[i].so, d->seg[i].n);
	v[1] /= (double)accum * d->W;
	v[2] /= (double)accum * d->W;
	if ((rc = world_sum(d, v)) < 0)
		return mr_errf(eb, rc, "grad norm reduction failed at step %ld: %s", step,
			       mr_strerror(rc));
	if (!isfinite(v[1]) || !isfinite(v[2]))
		return nonfinite_loss(d, step, !isfinite(v[1]) ? v[1] : v[2], eb);
	norm = sqrt(v[0]);
	if (!isfinite(norm)) {
		g = first_nonfinite(d, 1);
		return mr_errf(eb, MR_ENONFINITE,
			       "gradient norm is %g at step %ld: first non-finite tensor "
			       "'grads.%s'", norm, step, g ? g : "? (on another rank)");
	}
	mr_grad_clip(owned_grads(d), d->nshard, norm, d->o.cfg.grad_clip);
	r->loss = (float)v[1];
	r->aux_loss = (float)v[2];
	r->grad_norm = (float)norm;
	r->lr = mr_lr_at(&d->o.cfg, step);
	update(d, r->lr);
	if (d->zero == 1 || d->zero == 2)
		rc = gather_updated(d);
	for (u = 0; u < 4 && d->zero == 3; u++) {
		mr__dp_wait(d, &d->ps[u].req, 0);
		d->ps[u].unit = -1; /* stale: re-gathered on next use */
	}
	if (rc < 0)
		return mr_errf(eb, rc, "parameter all-gather failed at step %ld: %s", step,
			       mr_strerror(rc));
	return 0;
}

int mr_dp_gather_params(struct mr_dp *d, float *dst)
{
	struct mr_gpt *m = d->m;
	struct mr_comm_req *req;
	size_t cap = 0;
	long pc = d->st.param_colls;
	float *tmp;
	int u, rc = 0;

	if (d->zero == 0) {
		memcpy(dst, m->params, m->nparams * sizeof(float));
		return 0;
	}
	if (d->zero < 3) {
		for (u = 0; u < d->nunits; u++)
			memcpy(dst + d->u[u].off, d->P + d->u[u].poff, d->u[u].n * sizeof(float));
		return 0;
	}
	for (u = 0; u < d->nunits; u++)
		if (d->u[u].sn * (size_t)d->S > cap)
			cap = d->u[u].sn * (size_t)d->S;
	tmp = mr_mem_alloc(&m->mem, MR_MEM_WORKSPACE, cap * sizeof(float));
	if (!tmp)
		return MR_ENOMEM;
	for (u = 0; u < d->nunits && rc == 0; u++) {
		rc = mr__dp_gather_unit(d, u, tmp, &req);
		if (rc == 0 && req)
			rc = mr_comm_wait(req);
		if (rc == 0)
			memcpy(dst + d->u[u].off, tmp, d->u[u].n * sizeof(float));
	}
	mr_mem_free(&m->mem, MR_MEM_WORKSPACE, tmp, cap * sizeof(float));
	d->st.param_colls = pc;
	return rc;
}
