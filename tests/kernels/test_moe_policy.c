/*
 * test_moe_policy.c - the MoE token policies (kernels/mr_moe.h): "capacity"
 * drops an expert's assignments past ceil(capacity_factor * N * k / E);
 * "dropless" (mr_gpt_config.moe_dropless) drops none.
 *
 * Dropless must be exactly the capacity policy at a capacity no expert can
 * reach (capacity_factor = E / k gives cap = N): the same losses and
 * gradients bit for bit, whatever capacity_factor the dropless model was
 * given. And at a small capacity_factor the capacity policy must drop
 * tokens (so the comparison above is not vacuous) while dropless drops
 * none and trains to another loss.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "data/mr_synth.h"
#include "model/mr_gpt.h"

#define B 2
#define T 16
#define E 4
#define K 2

/* MoE on layers 1 and 3 of 4, E experts, top-K */
static struct mr_gpt_config config(float capacity_factor, int dropless)
{
	return (struct mr_gpt_config){ .vocab = 64, .max_seq = T, .n_layer = 4, .d_model = 32,
				       .n_head = 4, .moe_every = 2, .n_experts = E, .top_k = K,
				       .capacity_factor = capacity_factor, .aux_coef = 0.01f,
				       .moe_dropless = dropless };
}

/* Two micro-batches, forward and backward each; the losses and the
 * assignments dropped over every MoE layer. */
static void run(struct mr_gpt *m, const struct mr_gpt_config *c, float loss[2], int *dropped)
{
	int in[B * T], tg[B * T], k, l;
	struct mr_errbuf eb = { "", "" };

	cr_assert_eq(mr_gpt_create(m, c, B, T, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_init_params(m, 11), 0);
	mr_gpt_zero_grad(m);
	*dropped = 0;
	for (k = 0; k < 2; k++) {
		mr_synth_batch(5, 0, (uint64_t)k * B, c->vocab, B, T, in, tg);
		cr_assert_eq(mr_gpt_forward(m, in, tg, &eb), 0, "%s", eb.msg);
		loss[k] = m->loss;
		for (l = 0; l < c->n_layer; l++)
			if (mr_gpt_layer_is_moe(c, l))
				*dropped += m->la[l].moe.dropped;
		cr_assert_eq(mr_gpt_backward(m, 0.5f), 0);
	}
}

Test(moe_policy, dropless_is_capacity_at_every_token)
{
	struct mr_gpt_config dl = config(0.5f, 1), full = config((float)E / K, 0);
	struct mr_gpt a, b;
	float la[2], lb[2];
	int da, db;

	run(&a, &dl, la, &da);
	run(&b, &full, lb, &db);
	cr_assert_eq(da, 0, "dropless dropped %d assignments", da);
	cr_assert_eq(db, 0, "capacity %g dropped %d assignments", (double)E / K, db);
	cr_assert_eq(memcmp(la, lb, sizeof(la)), 0, "losses %.9g %.9g vs %.9g %.9g", la[0], la[1],
		     lb[0], lb[1]);
	cr_assert_eq(a.nparams, b.nparams);
	cr_assert_eq(memcmp(a.grads, b.grads, a.nparams * sizeof(float)), 0,
		     "dropless gradients differ from capacity N's");
	mr_gpt_release(&a);
	mr_gpt_release(&b);
}

Test(moe_policy, capacity_drops_where_dropless_does_not)
{
	struct mr_gpt_config cap = config(0.5f, 0), dl = config(0.5f, 1);
	struct mr_gpt a, b;
	float la[2], lb[2];
	int da, db;

	run(&a, &cap, la, &da);
	run(&b, &dl, lb, &db);
	cr_assert_gt(da, 0, "capacity_factor 0.5 must drop assignments");
	cr_assert_eq(db, 0, "dropless dropped %d assignments", db);
	cr_assert_neq(la[0], lb[0], "dropping must change the loss (%.9g both)", la[0]);
	mr_gpt_release(&a);
	mr_gpt_release(&b);
}
