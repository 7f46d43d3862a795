/*
 * tiny_gpt.h - the small GPTs the model-level tests build on the cpu
 * device (tests/model/test_pieces.c, tests/parallel/test_pp_slots.c): a
 * dense one and one with a MoE block every second layer, 4 layers, width
 * 32, micro-batches of TINY_B x TINY_T tokens, weights from seed 7.
 */
#ifndef TINY_GPT_H
#define TINY_GPT_H

#include <criterion/criterion.h>

#include "model/mr_gpt.h"

#define TINY_B 2
#define TINY_T 16

static const struct mr_gpt_config tiny_dense = { .vocab = 64, .max_seq = 16, .n_layer = 4,
						  .d_model = 32, .n_head = 4 };
static const struct mr_gpt_config tiny_moe = { .vocab = 64, .max_seq = 16, .n_layer = 4,
						.d_model = 32, .n_head = 4, .moe_every = 2,
						.n_experts = 4, .top_k = 2,
						.capacity_factor = 1.0f, .aux_coef = 0.01f };

/* A tiny model on the cpu device, initialised, gradients zeroed. */
static inline void tiny_open(struct mr_gpt *m, const struct mr_gpt_config *c)
{
	struct mr_errbuf eb = { "", "" };

	cr_assert_eq(mr_gpt_create(m, c, TINY_B, TINY_T, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_init_params(m, 7), 0);
	mr_gpt_zero_grad(m);
}

#endif
