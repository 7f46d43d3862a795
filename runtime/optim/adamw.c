/*
 * adamw.c - AdamW, LR schedules and gradient clipping (see mr_adamw.h).
 *
 * Speed: the update is elementwise; the cpu device splits a range across
 * the rank's pool, and every element sees the same float operations
 * whichever thread runs it, so the results are bit-identical to one
 * sequential loop. The update loop vectorises only when this file is
 * compiled with -fno-math-errno (sqrtf otherwise keeps an errno branch,
 * and a pragma does not change the builtin): then it runs ~5x faster with
 * the same values (the vector square root is correctly rounded too).
 * mr_grad_sumsq stays one sequential double sum (its order is part of its
 * result).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <math.h>
#include <string.h>

#include "cpu/mr_simd.h"
#include "mr_adamw.h"

static const char *const schedule_names[] = { "cosine", "linear", "constant", "wsd" };

int mr_lr_schedule_parse(const char *name, int *out)
{
	for (int i = 0; i < (int)(sizeof(schedule_names) / sizeof(schedule_names[0])); i++)
		if (!strcmp(name, schedule_names[i])) {
			*out = i;
			return 0;
		}
	return -1;
}

const char *mr_lr_schedule_name(int s)
{
	return s >= 0 && s <= MR_LR_WSD ? schedule_names[s] : "unknown";
}

/* From lr at step a down to lo at the last step (total_steps - 1). */
static double linear_decay(const struct mr_adamw_config *c, long a, long step, double lr,
			   double lo)
{
	long b = (long)c->total_steps - 1;

	if (step <= a)
		return lr;
	if (step >= b)
		return lo;
	return lr + (lo - lr) * (double)(step - a) / (double)(b - a);
}

float mr_lr_at(const struct mr_adamw_config *c, long step)
{
	double lr = c->lr, lo = c->lr * c->min_lr_frac, r;
	long end_warm = c->warmup_steps > 0 ? (long)c->warmup_steps - 1 : 0, a, d;

	if (step < c->warmup_steps)
		return (float)(lr * (double)(step + 1) / (double)c->warmup_steps);
	switch (c->schedule) {
	case MR_LR_CONSTANT:
		return (float)lr;
	case MR_LR_LINEAR:
		return (float)linear_decay(c, end_warm, step, lr, lo);
	case MR_LR_WSD:
		d = lround((double)c->decay_frac * (double)c->total_steps);
		a = (long)c->total_steps - 1 - d;
		return (float)linear_decay(c, a > end_warm ? a : end_warm, step, lr, lo);
	default:
		break;
	}
	if (c->total_steps <= c->warmup_steps || step >= c->total_steps)
		return (float)lo;
	r = (double)(step - c->warmup_steps) / (double)(c->total_steps - c->warmup_steps);
	return (float)(lo + 0.5 * (1.0 + cos(M_PI * r)) * (lr - lo));
}

/* The scalars of one update (step t, learning rate lr). */
struct adamw_k {
	float step_size, bc2_sqrt, b1, b2, eps, wdec;
};

static void adamw_k_init(struct adamw_k *k, const struct mr_adamw_config *c, long t, float lr)
{
	double bc1 = 1.0 - pow((double)c->beta1, (double)t);
	double bc2 = 1.0 - pow((double)c->beta2, (double)t);

	k->step_size = (float)((double)lr / bc1);
	k->bc2_sqrt = (float)sqrt(bc2);
	k->b1 = c->beta1;
	k->b2 = c->beta2;
	k->eps = c->eps;
	k->wdec = 1.0f - lr * c->weight_decay;
}

/* p, g, m, v (n): the AdamW arithmetic, element by element. */
MR_HOT static void update(const struct adamw_k *k, float *restrict p, const float *restrict g,
			  float *restrict m, float *restrict v, size_t n, int decay)
{
	const float b1 = k->b1, b2 = k->b2, step_size = k->step_size, bc2_sqrt = k->bc2_sqrt;
	const float eps = k->eps, dec = decay ? k->wdec : 1.0f;
	size_t i;

	for (i = 0; i < n; i++) {
		float gi = g[i], pi = p[i] * dec, mi, vi, denom;
		mi = m[i] * b1 + gi * (1.0f - b1);
		vi = v[i] * b2 + gi * gi * (1.0f - b2);
		denom = sqrtf(vi) / bc2_sqrt + eps;
		m[i] = mi;
		v[i] = vi;
		p[i] = pi - step_size * (mi / denom);
	}
}

void mr_adamw_update_range(const struct mr_adamw_config *c, long t, float lr, float *p,
			   const float *g, float *m, float *v, size_t n, int decay)
{
	struct adamw_k k;

	adamw_k_init(&k, c, t, lr);
	update(&k, p, g, m, v, n, decay);
}

double mr_grad_sumsq(const float *g, size_t n)
{
	double s = 0.0;
	size_t i;

	for (i = 0; i < n; i++)
		s += (double)g[i] * g[i];
	return s;
}

float mr_grad_clip_factor(double norm, float max_norm)
{
	double coef;

	if (max_norm <= 0.0f)
		return 1.0f;
	coef = (double)max_norm / (norm + 1e-6);
	return coef >= 1.0 ? 1.0f : (float)coef;
}
