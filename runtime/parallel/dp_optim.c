/*
 * dp_optim.c - the optimizer side of data parallelism (see mr_dp.h), what
 * the step driver (mr_step.h) calls around the micro-batches: begin and
 * finish a step, the norm and mean loss over the job, the first
 * non-finite tensor, clipping + AdamW on this rank's owned range and the
 * parameter all-gather after it; and gathering the parameters for checks
 * and checkpoints.
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

void mr_dp_begin(struct mr_dp *d)
{
	memset(&d->st, 0, sizeof(d->st));
	d->t_first = d->t_last = 0.0;
	if (d->zero == 0)
		mr_gpt_zero_grad(d->m);
	if (d->zero == 1)
		memset(d->G, 0, d->np * sizeof(float));
	if (d->zero >= 1)
		memset(d->gshard, 0, d->nshard * sizeof(float));
}

void mr_dp_micro_batch(struct mr_dp *d, int final)
{
	d->final = final;
}

const char *mr_dp_first_nonfinite(struct mr_dp *d, int grads)
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

struct sumsq_args {
	struct mr_dp *d;
	double *part; /* (nseg) */
};

/* Segment i goes to the thread whose range of the owned array holds its
 * first element (segments are in increasing offset order). */
static void sumsq_range(void *ctxp, size_t e0, size_t e1, int tid)
{
	const struct sumsq_args *a = ctxp;
	const float *g = owned_grads(a->d);
	int i;

	(void)tid;
	for (i = 0; i < a->d->nseg; i++) {
		const struct dp_seg *s = &a->d->seg[i];
		if (s->count && s->so >= e0 && s->so < e1)
			a->part[i] = mr_grad_sumsq(g + s->so, s->n);
	}
}

/* Each segment's sum is one mr_grad_sumsq call wherever it runs and the
 * sums are added in segment order: the same value for any thread count. */
static double owned_sumsq(struct mr_dp *d)
{
	struct sumsq_args a = { d, d->part };
	double s = 0.0;
	int i;

	memset(d->part, 0, (size_t)d->nseg * sizeof(double));
	mr_pool_run(d->m->pool, d->nshard, 1 << 16, sumsq_range, &a);
	for (i = 0; i < d->nseg; i++)
		s += d->part[i];
	return s;
}

/*
 * v[0] = this rank's sum of squares; v[1], v[2] this rank's mean loss
 * and aux loss. Every rank's doubles are all-gathered bit for bit (as
 * I64) and added in rank order, so the result is identical everywhere and
 * has no fp32 rounding.
 */
int mr_dp_reduce_stats(struct mr_dp *d, double v[3])
{
	double all[3 * DP_MAX_WORLD];
	int r, k, rc;

	v[0] = owned_sumsq(d);
	if (d->W == 1)
		return 0;
	if (d->W > DP_MAX_WORLD)
		return MR_ELIMIT;
	v[1] /= d->W;
	v[2] /= d->W;
	rc = mr_comm_allgather(d->c.world, v, all, 3, MR_COMM_I64);
	if (rc < 0)
		return rc;
	v[0] = v[1] = v[2] = 0.0;
	for (r = 0; r < d->W; r++)
		for (k = 0; k < 3; k++)
			v[k] += all[3 * r + k];
	return 0;
}

long mr_dp_steps(const struct mr_dp *d)
{
	return d->o.t;
}

const struct mr_adamw_config *mr_dp_adamw(const struct mr_dp *d)
{
	return &d->o.cfg;
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

int mr_dp_update(struct mr_dp *d, double norm, float lr)
{
	long t;
	int i, u, rc = 0;

	mr_grad_clip(owned_grads(d), d->nshard, norm, d->o.cfg.grad_clip);
	if (d->zero == 0) {
		mr_adamw_step(&d->o, d->m, lr);
		return 0;
	}
	t = ++d->o.t;
	for (i = 0; i < d->nseg; i++) {
		const struct dp_seg *s = &d->seg[i];
		mr_adamw_update_range(&d->o.cfg, t, lr, seg_params(d, s), d->gshard + s->so,
				      d->o.m + s->so, d->o.v + s->so, s->n, s->decay);
	}
	if (d->zero == 1 || d->zero == 2)
		rc = gather_updated(d);
	for (u = 0; u < 4 && d->zero == 3; u++) {
		mr__dp_wait(d, &d->ps[u].req, 0);
		d->ps[u].unit = -1; /* stale: re-gathered on next use */
	}
	return rc;
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
