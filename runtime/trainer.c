/*
 * trainer.c - one optimizer step (see mr_trainer.h).
 */
#include <math.h>
#include <stdlib.h>

#include "comm/mr_comm.h"
#include "mr_trainer.h"

struct sumsq_args {
	const struct mr_gpt *m;
	const float *g;
	double *part; /* (ntensors) */
};

/* Tensor i goes to the thread whose element range holds its first element
 * (the table is contiguous: its offset). */
static void sumsq_range(void *ctxp, size_t e0, size_t e1, int tid)
{
	const struct sumsq_args *a = ctxp;
	int i;

	(void)tid;
	for (i = 0; i < a->m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &a->m->tensors[i];
		if (t->off >= e0 && t->off < e1 && mr_gpt_tp_counts(a->m, t))
			a->part[i] = mr_grad_sumsq(a->g + t->off, t->n);
	}
}

/* Each tensor's sum is one mr_grad_sumsq call wherever it runs, and the
 * per-tensor sums are added in table order, so the result is the same as
 * the sequential loop's for any thread count. */
double mr_trainer_grad_sumsq(const struct mr_gpt *m, const float *g)
{
	double s = 0.0, stackpart[64], *part = stackpart;
	struct sumsq_args a;
	int i;

	if (m->ntensors > 64)
		part = malloc(sizeof(double) * (size_t)m->ntensors);
	if (part) {
		a.m = m;
		a.g = g;
		a.part = part;
		mr_pool_run(m->pool, m->nparams, 1 << 16, sumsq_range, &a);
	}
	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		if (mr_gpt_tp_counts(m, t))
			s += part ? part[i] : mr_grad_sumsq(g + t->off, t->n);
	}
	if (part != stackpart)
		free(part);
	return s;
}

/* The global gradient norm over the tp group (one rank: local). */
static int grad_norm(const struct mr_gpt *m, double *norm)
{
	double sd = mr_trainer_grad_sumsq(m, m->grads);
	float s = (float)sd;
	int rc;

	if (m->par.tp > 1 &&
	    (rc = mr_comm_allreduce(m->par.tp_comm, &s, &s, 1, MR_COMM_F32, MR_COMM_SUM)) < 0)
		return rc;
	*norm = m->par.tp > 1 ? sqrt((double)s) : sqrt(sd);
	return 0;
}

const char *mr_trainer_first_nonfinite(const struct mr_gpt *m, const float *buf)
{
	int i;
	size_t j;

	for (i = 0; i < m->ntensors; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i];
		for (j = 0; j < t->n; j++)
			if (!isfinite(buf[t->off + j]))
				return t->name;
	}
	return NULL;
}

static int nonfinite_loss(const struct mr_gpt *m, long step, float loss,
			  struct mr_errbuf *eb)
{
	const char *p = mr_trainer_first_nonfinite(m, m->params);
	size_t i, n = (size_t)m->B * m->T * m->cfg.vocab;

	if (p)
		return mr_errf(eb, MR_ENONFINITE,
			       "loss is %g at step %ld: first non-finite tensor 'params.%s'",
			       (double)loss, step, p);
	for (i = 0; i < n; i++)
		if (!isfinite(m->logits[i]))
			return mr_errf(eb, MR_ENONFINITE,
				       "loss is %g at step %ld: first non-finite tensor 'logits'",
				       (double)loss, step);
	return mr_errf(eb, MR_ENONFINITE,
		       "loss is %g at step %ld: no non-finite parameter or logit", (double)loss,
		       step);
}

int mr_trainer_step(struct mr_gpt *m, struct mr_adamw *o, const int *inputs,
		    const int *targets, int accum, struct mr_step_result *r,
		    struct mr_errbuf *eb)
{
	size_t N = (size_t)m->B * m->T;
	double loss = 0.0, aux = 0.0, norm;
	long step = o->t;
	int i, rc;

	mr_gpt_zero_grad(m);
	for (i = 0; i < accum; i++) {
		rc = mr_gpt_forward(m, inputs + i * N, targets + i * N, eb);
		if (rc < 0)
			return rc;
		if (!isfinite(m->loss) || !isfinite(m->aux_loss))
			return nonfinite_loss(m, step, !isfinite(m->loss) ? m->loss : m->aux_loss,
					      eb);
		loss += m->loss;
		aux += m->aux_loss;
		rc = mr_gpt_backward(m, 1.0f / (float)accum);
		if (rc < 0)
			return mr_errf(eb, rc, "backward pass failed at step %ld: %s", step,
				       mr_strerror(rc));
	}
	if ((rc = grad_norm(m, &norm)) < 0)
		return mr_errf(eb, rc, "gradient norm all-reduce failed at step %ld: %s", step,
			       mr_strerror(rc));
	if (!isfinite(norm)) {
		const char *g = mr_trainer_first_nonfinite(m, m->grads);
		return mr_errf(eb, MR_ENONFINITE,
			       "gradient norm is %g at step %ld: first non-finite tensor 'grads.%s'",
			       norm, step, g ? g : "?");
	}
	mr_grad_clip(m->grads, m->nparams, norm, o->cfg.grad_clip);
	r->loss = (float)(loss / accum);
	r->aux_loss = (float)(aux / accum);
	r->grad_norm = (float)norm;
	r->lr = mr_lr_at(&o->cfg, step);
	mr_adamw_step(o, m, r->lr);
	return 0;
}
