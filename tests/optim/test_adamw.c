/*
 * test_adamw.c - runtime/optim/mr_adamw.h's arithmetic against
 * torch.optim.AdamW's update written out here in double (decoupled decay
 * p *= 1 - lr * wd, then p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 -
 * b2^t) + eps)) over five steps, with and without decay; a range updated
 * in two pieces equal bit for bit to one call (what ZeRO's shards rely
 * on); and the two halves of global-norm clipping.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "optim/mr_adamw.h"

#define N 257

static const struct mr_adamw_config cfg = { .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f,
					    .eps = 1e-8f, .weight_decay = 0.1f };

static float grad(int t, int i)
{
	return (float)sin(0.37 * i + 1.3 * t) * (i % 5 == 0 ? 1e-4f : 0.5f);
}

Test(adamw, five_steps_equal_torchs_update_in_double)
{
	for (int decay = 0; decay <= 1; decay++) {
		float p[N], g[N], m[N] = { 0 }, v[N] = { 0 };
		double pd[N], md[N] = { 0 }, vd[N] = { 0 }, worst = 0;

		for (int i = 0; i < N; i++)
			pd[i] = p[i] = (float)cos(0.11 * i);
		for (int t = 1; t <= 5; t++) {
			double lr = cfg.lr * (1.0 - 0.1 * t), b1 = cfg.beta1, b2 = cfg.beta2;
			for (int i = 0; i < N; i++)
				g[i] = grad(t, i);
			mr_adamw_update_range(&cfg, t, (float)lr, p, g, m, v, N, decay);
			for (int i = 0; i < N; i++) {
				double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
				if (decay)
					pd[i] *= 1 - lr * cfg.weight_decay;
				md[i] = b1 * md[i] + (1 - b1) * g[i];
				vd[i] = b2 * vd[i] + (1 - b2) * (double)g[i] * g[i];
				pd[i] -= lr / bc1 * md[i] / (sqrt(vd[i]) / sqrt(bc2) + cfg.eps);
			}
		}
		for (int i = 0; i < N; i++) {
			double e = fabs(p[i] - pd[i]) / fmax(fabs(pd[i]), 1e-3);
			worst = fmax(worst, e);
		}
		cr_expect(worst < 1e-5, "decay %d: parameters differ from torch's by %.3g", decay,
			  worst);
	}
}

Test(adamw, a_range_in_two_pieces_equals_one_call_bit_for_bit)
{
	float p1[N], p2[N], g[N], m1[N] = { 0 }, v1[N] = { 0 }, m2[N] = { 0 }, v2[N] = { 0 };

	for (int i = 0; i < N; i++) {
		p1[i] = p2[i] = (float)cos(0.11 * i);
		g[i] = grad(1, i);
	}
	for (int t = 1; t <= 3; t++) {
		mr_adamw_update_range(&cfg, t, cfg.lr, p1, g, m1, v1, N, 1);
		mr_adamw_update_range(&cfg, t, cfg.lr, p2, g, m2, v2, 100, 1);
		mr_adamw_update_range(&cfg, t, cfg.lr, p2 + 100, g + 100, m2 + 100, v2 + 100,
				      N - 100, 1);
	}
	cr_expect_eq(memcmp(p1, p2, sizeof(p1)), 0, "parameters differ");
	cr_expect_eq(memcmp(m1, m2, sizeof(m1)), 0, "first moments differ");
	cr_expect_eq(memcmp(v1, v2, sizeof(v1)), 0, "second moments differ");
}

Test(adamw, global_norm_clipping_in_two_halves)
{
	float g[N];
	double want = 0;

	for (int i = 0; i < N; i++) {
		g[i] = grad(2, i);
		want += (double)g[i] * g[i];
	}
	cr_expect(fabs(mr_grad_sumsq(g, N) - want) <= 1e-12 * want, "sumsq %.17g vs %.17g",
		  mr_grad_sumsq(g, N), want);
	/* torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at most 1 */
	cr_expect_float_eq(mr_grad_clip_factor(4.0, 1.0f), (float)(1.0 / (4.0 + 1e-6)), 1e-7);
	cr_expect_eq(mr_grad_clip_factor(0.5, 1.0f), 1.0f);
	cr_expect_eq(mr_grad_clip_factor(1e9, 0.0f), 1.0f, "max_norm 0 must not clip");
	cr_expect_eq(mr_grad_clip_factor(1e9, -1.0f), 1.0f, "max_norm < 0 must not clip");
}
