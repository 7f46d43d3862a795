/*
 * mr_adamw.h - AdamW with fp32 state, learning-rate schedules (cosine,
 * linear, constant, warmup-stable-decay) with linear warmup, and
 * global-norm gradient clipping.
 *
 * AdamW follows torch.optim.AdamW (decoupled weight decay; bias correction
 * as denom = sqrt(v) / sqrt(1 - b2^t) + eps, step = lr / (1 - b1^t)).
 * Weight decay applies only to tensors whose table entry has decay = 1
 * (matrices and embeddings), never to biases or LayerNorm parameters.
 *
 * Clipping is split in two so a parallel run can all-reduce the sum of
 * squares across every parallel dimension before scaling:
 * sumsq = mr_grad_sumsq() per owned range; (all-reduce); norm =
 * sqrt(sumsq); scale by mr_grad_clip_factor(norm, max_norm) = min(1,
 * max_norm / (norm + 1e-6)) as torch.nn.utils.clip_grad_norm_ does.
 *
 * These are the arithmetic: the device layer (device/mr_device.h) runs the
 * update and the sums on the rank's device, the cpu backend with these
 * very functions; data parallelism (parallel/mr_dp.h) owns the state.
 * Non-goals: other optimizers.
 */
#ifndef MR_ADAMW_H
#define MR_ADAMW_H

#include <stddef.h>

/* The learning-rate schedule after warmup; 0 (cosine) is what a zeroed
 * config gets. */
enum mr_lr_schedule {
	MR_LR_COSINE = 0,
	MR_LR_LINEAR,
	MR_LR_CONSTANT,
	MR_LR_WSD,
};

struct mr_adamw_config {
	float lr;           /* peak learning rate */
	float min_lr_frac;  /* final lr = lr * min_lr_frac (not constant) */
	int warmup_steps;
	int total_steps;
	float beta1, beta2, eps, weight_decay;
	float grad_clip;    /* <= 0: no clipping */
	int schedule;       /* enum mr_lr_schedule */
	float decay_frac;   /* wsd: the last share of total_steps that decays */
};

/*
 * Learning rate at step (0-based). Every schedule warms up linearly:
 * lr * (step+1) / warmup_steps for step < warmup_steps. After it, with
 * lo = lr * min_lr_frac and W = warmup_steps, S = total_steps:
 *   cosine:   lo + (lr - lo) * (1 + cos(pi * (step - W) / (S - W))) / 2
 *             (lo once step >= S or S <= W) - llm.c's schedule;
 *   linear:   from lr at the end of warmup (step a = max(W - 1, 0)) down
 *             to lo at the last step S - 1:
 *             lr + (lo - lr) * (step - a) / (S - 1 - a);
 *   constant: lr;
 *   wsd:      lr until the last D = round(decay_frac * S) steps, which
 *             fall linearly to lo at the last step S - 1 (the linear
 *             formula with a = max(S - 1 - D, W - 1, 0)).
 * With no step after a before the last (a >= S - 1) the lr stays lr.
 */
float mr_lr_at(const struct mr_adamw_config *cfg, long step);
/* The schedule named name ("cosine", "linear", "constant", "wsd") into
 * *out: 0, or -1 for another name. */
int mr_lr_schedule_parse(const char *name, int *out);
/* The name of schedule s. */
const char *mr_lr_schedule_name(int s);
/* One AdamW update of a flat range (a tensor, or a ZeRO shard's piece of
 * one): p, g, m, v (n) each; t is the step count after this update
 * (1-based), decay 1 where the tensor's table entry has decay = 1. Each
 * element's arithmetic depends on nothing else, so any split of a range
 * gives the same bits. */
void mr_adamw_update_range(const struct mr_adamw_config *c, long t, float lr, float *p,
			   const float *g, float *m, float *v, size_t n, int decay);

/* Sum of squares of g (n), in double. */
double mr_grad_sumsq(const float *g, size_t n);
/* The factor gradients are scaled by: min(1, max_norm / (norm + 1e-6)) as
 * a float, 1 when max_norm <= 0 (no clipping). */
float mr_grad_clip_factor(double norm, float max_norm);

#endif
