/*
 * mr_adamw.h - AdamW with fp32 state, cosine learning-rate schedule with
 * linear warmup, and global-norm gradient clipping.
 *
 * AdamW follows torch.optim.AdamW (decoupled weight decay; bias correction
 * as denom = sqrt(v) / sqrt(1 - b2^t) + eps, step = lr / (1 - b1^t)).
 * Weight decay applies only to tensors whose table entry has decay = 1
 * (matrices and embeddings), never to biases or LayerNorm parameters.
 *
 * Clipping is split in two so a parallel run can all-reduce the sum of
 * squares across every parallel dimension before scaling:
 * sumsq = mr_grad_sumsq(); (all-reduce); norm = sqrt(sumsq);
 * mr_grad_clip(norm, max_norm) scales by min(1, max_norm / (norm + 1e-6))
 * as torch.nn.utils.clip_grad_norm_ does.
 *
 * Ownership: struct mr_adamw owns m and v (accounted as MR_MEM_OPTIM in the
 * struct mr_mem passed to init). Non-goals: ZeRO sharding (slots in by
 * giving init a sub-range of the tensor table), other optimizers.
 */
#ifndef MR_ADAMW_H
#define MR_ADAMW_H

#include <stddef.h>

#include "mr_mem.h"
#include "model/mr_gpt.h"

struct mr_adamw_config {
	float lr;           /* peak learning rate */
	float min_lr_frac;  /* final lr = lr * min_lr_frac */
	int warmup_steps;
	int total_steps;
	float beta1, beta2, eps, weight_decay;
	float grad_clip;    /* <= 0: no clipping */
};

struct mr_adamw {
	struct mr_adamw_config cfg;
	size_t n;
	float *m, *v;       /* (n) each, one allocation */
	long t;             /* steps taken */
};

int mr_adamw_init(struct mr_adamw *o, const struct mr_adamw_config *cfg, size_t n,
		  struct mr_mem *mem);
void mr_adamw_release(struct mr_adamw *o, struct mr_mem *mem);
/* Learning rate at step (0-based): linear warmup to lr over warmup_steps
 * ((step+1)/warmup), then cosine from lr to lr*min_lr_frac at total_steps. */
float mr_lr_at(const struct mr_adamw_config *cfg, long step);
/* One update of params from grads over the model's tensor table. */
void mr_adamw_step(struct mr_adamw *o, const struct mr_gpt *model, float lr);
/* The same update over one flat range (a ZeRO shard's piece of a tensor):
 * p, g, m, v (n) each; t is the step count after this update (o->t once
 * incremented), decay 1 where the tensor's table entry has decay = 1. The
 * arithmetic is mr_adamw_step's, so results are bit-identical. */
void mr_adamw_update_range(const struct mr_adamw_config *c, long t, float lr, float *p,
			   const float *g, float *m, float *v, size_t n, int decay);

/* Sum of squares of g (n), in double. */
double mr_grad_sumsq(const float *g, size_t n);
/* Scales g by min(1, max_norm / (norm + 1e-6)); max_norm <= 0 does nothing. */
void mr_grad_clip(float *g, size_t n, double norm, float max_norm);

#endif
