/*
 * adamw.c - AdamW, LR schedule and gradient clipping (see mr_adamw.h).
 */
#include <math.h>

#include "mr_adamw.h"

int mr_adamw_init(struct mr_adamw *o, const struct mr_adamw_config *cfg, size_t n,
		  struct mr_mem *mem)
{
	o->cfg = *cfg;
	o->n = n;
	o->t = 0;
	o->m = mr_mem_alloc(mem, MR_MEM_OPTIM, 2 * n * sizeof(float));
	if (!o->m)
		return MR_ENOMEM;
	o->v = o->m + n;
	return 0;
}

void mr_adamw_release(struct mr_adamw *o, struct mr_mem *mem)
{
	mr_mem_free(mem, MR_MEM_OPTIM, o->m, 2 * o->n * sizeof(float));
	o->m = o->v = NULL;
}

float mr_lr_at(const struct mr_adamw_config *c, long step)
{
	double lr = c->lr, lo = c->lr * c->min_lr_frac, r;

	if (step < c->warmup_steps)
		return (float)(lr * (double)(step + 1) / (double)c->warmup_steps);
	if (c->total_steps <= c->warmup_steps || step >= c->total_steps)
		return (float)lo;
	r = (double)(step - c->warmup_steps) / (double)(c->total_steps - c->warmup_steps);
	return (float)(lo + 0.5 * (1.0 + cos(M_PI * r)) * (lr - lo));
}

void mr_adamw_step(struct mr_adamw *o, const struct mr_gpt *model, float lr)
{
	const struct mr_adamw_config *c = &o->cfg;
	double bc1, bc2;
	float step_size, bc2_sqrt, b1 = c->beta1, b2 = c->beta2;
	int ti;

	o->t++;
	bc1 = 1.0 - pow((double)c->beta1, (double)o->t);
	bc2 = 1.0 - pow((double)c->beta2, (double)o->t);
	step_size = (float)((double)lr / bc1);
	bc2_sqrt = (float)sqrt(bc2);
	for (ti = 0; ti < model->ntensors; ti++) {
		const struct mr_gpt_tensor *t = &model->tensors[ti];
		float *p = model->params + t->off, *g = model->grads + t->off;
		float *m = o->m + t->off, *v = o->v + t->off;
		float decay = t->decay ? 1.0f - lr * c->weight_decay : 1.0f;
		size_t i;

		for (i = 0; i < t->n; i++) {
			float gi = g[i], denom;
			p[i] *= decay;
			m[i] = m[i] * b1 + gi * (1.0f - b1);
			v[i] = v[i] * b2 + gi * gi * (1.0f - b2);
			denom = sqrtf(v[i]) / bc2_sqrt + c->eps;
			p[i] -= step_size * (m[i] / denom);
		}
	}
}

void mr_adamw_update_range(const struct mr_adamw_config *c, long t, float lr, float *p,
			   const float *g, float *m, float *v, size_t n, int decay)
{
	double bc1 = 1.0 - pow((double)c->beta1, (double)t);
	double bc2 = 1.0 - pow((double)c->beta2, (double)t);
	float step_size = (float)((double)lr / bc1), bc2_sqrt = (float)sqrt(bc2);
	float b1 = c->beta1, b2 = c->beta2;
	float dec = decay ? 1.0f - lr * c->weight_decay : 1.0f;
	size_t i;

	for (i = 0; i < n; i++) {
		float gi = g[i], denom;
		p[i] *= dec;
		m[i] = m[i] * b1 + gi * (1.0f - b1);
		v[i] = v[i] * b2 + gi * gi * (1.0f - b2);
		denom = sqrtf(v[i]) / bc2_sqrt + c->eps;
		p[i] -= step_size * (m[i] / denom);
	}
}

double mr_grad_sumsq(const float *g, size_t n)
{
	double s = 0.0;
	size_t i;

	for (i = 0; i < n; i++)
		s += (double)g[i] * g[i];
	return s;
}

void mr_grad_clip(float *g, size_t n, double norm, float max_norm)
{
	double coef;
	float f;
	size_t i;

	if (max_norm <= 0.0f)
		return;
	coef = (double)max_norm / (norm + 1e-6);
	if (coef >= 1.0)
		return;
	f = (float)coef;
	for (i = 0; i < n; i++)
		g[i] *= f;
}
