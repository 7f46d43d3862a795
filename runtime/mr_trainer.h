/*
 * mr_trainer.h - one optimizer step of a GPT on one rank: zero grads,
 * forward/backward over accum micro-batches (gradients averaged), global
 * grad norm, clipping, scheduled LR, AdamW. Checks that losses and the
 * gradient norm are finite; on failure the message names the step and the
 * first non-finite tensor.
 *
 * Used by the worker (gpt_worker.c) and by the reference test, so the test
 * checks exactly the path training runs. With tensor parallelism (and
 * nothing else) the gradient norm is summed over the tp group. Non-goals:
 * data loading, data-parallel reductions (runtime/parallel).
 */
#ifndef MR_TRAINER_H
#define MR_TRAINER_H

#include "model/mr_gpt.h"
#include "optim/mr_adamw.h"

struct mr_step_result {
	float loss;      /* mean cross-entropy over the micro-batches */
	float aux_loss;  /* mean MoE aux loss (before aux_coef) */
	float grad_norm; /* before clipping */
	float lr;
};

/* inputs/targets: accum consecutive (B,T) micro-batches. */
int mr_trainer_step(struct mr_gpt *m, struct mr_adamw *o, const int *inputs,
		    const int *targets, int accum, struct mr_step_result *r,
		    struct mr_errbuf *eb);
/* Sum of squares of g (params layout) counting tensors replicated across
 * tp only on tp rank 0, so a sum over the tp group counts each once. */
double mr_trainer_grad_sumsq(const struct mr_gpt *m, const float *g);
/* Name of the first tensor of buf (params or grads layout) holding a NaN or
 * Inf, or NULL. */
const char *mr_trainer_first_nonfinite(const struct mr_gpt *m, const float *buf);

#endif
