/*
 * test_pieces.c - the model in pieces (model/mr_gpt.h), as a pipeline
 * stage will run it: the embedding, block ranges cut anywhere, the head;
 * and the split backward (input phase for every block, then the weight
 * phase) that a zero-bubble schedule needs.
 *
 * Every piece is the same code the whole-model calls run, so the results
 * must be bit-identical to mr_gpt_forward / mr_gpt_backward: the loss, the
 * logits and every gradient, dense and MoE, with gradient accumulation.
 *
 * And micro-batch slots (mr_gpt_set_slots / mr_gpt_use_slot): several
 * micro-batches forwarded before their backwards, in a pipeline
 * schedule's orders, give the gradients of one after the other - bit for
 * bit, since each gradient still receives the micro-batches in order.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "data/mr_synth.h"
#include "model/mr_gpt.h"

#define B 2
#define T 16

static const struct mr_gpt_config dense = { .vocab = 64, .max_seq = 16, .n_layer = 4, .d_model = 32,
					    .n_head = 4 };
static const struct mr_gpt_config moe = { .vocab = 64, .max_seq = 16, .n_layer = 4, .d_model = 32,
					  .n_head = 4, .moe_every = 2, .n_experts = 4, .top_k = 2,
					  .capacity_factor = 1.0f, .aux_coef = 0.01f };

static void open_model(struct mr_gpt *m, const struct mr_gpt_config *c)
{
	struct mr_errbuf eb = { "", "" };

	cr_assert_eq(mr_gpt_create(m, c, B, T, NULL, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_init_params(m, 7), 0);
	mr_gpt_zero_grad(m);
}

/* Two micro-batches with accumulation, the whole model at once. */
static void whole(struct mr_gpt *m, float *loss)
{
	int in[B * T], tg[B * T], k;
	struct mr_errbuf eb = { "", "" };

	for (k = 0; k < 2; k++) {
		mr_synth_batch(3, 0, (uint64_t)k * B, m->cfg.vocab, B, T, in, tg);
		cr_assert_eq(mr_gpt_forward(m, in, tg, &eb), 0, "%s", eb.msg);
		loss[k] = m->loss;
		cr_assert_eq(mr_gpt_backward(m, 0.5f), 0);
	}
}

/* The same in pieces: blocks cut at cut, the backward split in phases. */
static void pieces(struct mr_gpt *m, int cut, float *loss)
{
	int in[B * T], tg[B * T], L = m->cfg.n_layer, k;
	struct mr_errbuf eb = { "", "" };

	cr_assert_eq(mr_gpt_split_bwd(m), 0);
	for (k = 0; k < 2; k++) {
		mr_synth_batch(3, 0, (uint64_t)k * B, m->cfg.vocab, B, T, in, tg);
		cr_assert_eq(mr_gpt_set_batch(m, in, tg, &eb), 0, "%s", eb.msg);
		cr_assert_eq(mr_gpt_embed_fwd(m), 0);
		cr_assert_eq(mr_gpt_blocks_fwd(m, 0, cut, m->encoded), 0);
		cr_assert_eq(mr_gpt_blocks_fwd(m, cut, L, m->la[cut - 1].res3), 0);
		cr_assert_eq(mr_gpt_head_fwd(m, m->la[L - 1].res3), 0);
		loss[k] = m->loss;
		cr_assert_eq(mr_gpt_head_bwd(m, m->la[L - 1].res3, 0.5f), 0);
		/* every block's input phase, then every weight phase, as a
		 * zero-bubble schedule defers them */
		cr_assert_eq(mr_gpt_blocks_bwd(m, cut, L, m->la[cut - 1].res3, 0.5f,
					       MR_GPT_BWD_INPUT), 0);
		cr_assert_eq(mr_gpt_blocks_bwd(m, 0, cut, m->encoded, 0.5f, MR_GPT_BWD_INPUT), 0);
		cr_assert_eq(mr_gpt_embed_bwd(m), 0);
		cr_assert_eq(mr_gpt_blocks_bwd(m, cut, L, m->la[cut - 1].res3, 0.5f,
					       MR_GPT_BWD_WEIGHT), 0);
		cr_assert_eq(mr_gpt_blocks_bwd(m, 0, cut, m->encoded, 0.5f, MR_GPT_BWD_WEIGHT), 0);
	}
}

static void check(const struct mr_gpt_config *c, int cut)
{
	struct mr_gpt a, b;
	float la[2], lb[2];
	int i, k;

	open_model(&a, c);
	open_model(&b, c);
	whole(&a, la);
	pieces(&b, cut, lb);
	for (k = 0; k < 2; k++)
		cr_expect_eq(la[k], lb[k], "micro-batch %d: loss %.9g vs %.9g", k, la[k], lb[k]);
	for (i = 0; i < a.ntensors; i++) {
		const struct mr_gpt_tensor *t = &a.tensors[i];
		cr_expect(!memcmp(a.grads + t->off, b.grads + t->off, t->n * sizeof(float)),
			  "gradient of '%s' differs (cut %d)", t->name, cut);
	}
	mr_gpt_release(&a);
	mr_gpt_release(&b);
}

Test(pieces, dense_cut_anywhere_split_backward_bit_identical)
{
	for (int cut = 1; cut < dense.n_layer; cut++)
		check(&dense, cut);
}

Test(pieces, moe_cut_and_split_backward_bit_identical) { check(&moe, 2); }

Test(pieces, split_backward_needs_its_stash)
{
	struct mr_gpt m;

	open_model(&m, &dense);
	cr_expect_eq(mr_gpt_blocks_bwd(&m, 0, 1, m.encoded, 1.0f, MR_GPT_BWD_INPUT), MR_ESTATE);
	mr_gpt_release(&m);
}

#define MB 3 /* micro-batches of the slot tests */

/* The whole model, micro-batch after micro-batch (the reference). */
static void sequential(struct mr_gpt *m, float *loss)
{
	int in[B * T], tg[B * T], k;
	struct mr_errbuf eb = { "", "" };

	for (k = 0; k < MB; k++) {
		mr_synth_batch(5, 0, (uint64_t)k * B, m->cfg.vocab, B, T, in, tg);
		cr_assert_eq(mr_gpt_forward(m, in, tg, &eb), 0, "%s", eb.msg);
		loss[k] = m->loss;
		cr_assert_eq(mr_gpt_backward(m, 1.0f / MB), 0);
	}
}

/*
 * order: MB forwards and MB backwards as "F0 F1 B0 ..." (the micro-batch
 * after each letter); a split backward when split: the input phase at B,
 * the weight phase of the same micro-batch right after the next B (or at
 * the end), as zero-bubble schedules defer it.
 */
static void slotted(struct mr_gpt *m, const char *order, int split, float *loss)
{
	int in[B * T], tg[B * T], L = m->cfg.n_layer, pending = -1;
	struct mr_errbuf eb = { "", "" };
	const char *o;

	cr_assert_eq(mr_gpt_set_slots(m, MB, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_gpt_use_slot(m, MB), MR_EINVAL);
	cr_assert_eq(mr_gpt_use_slot(m, -1), MR_EINVAL);
	if (split)
		cr_assert_eq(mr_gpt_split_bwd(m), 0);
	for (o = order; *o; o += 2) {
		int k = o[1] - '0';
		cr_assert_eq(mr_gpt_use_slot(m, k), 0);
		if (*o == 'F') {
			mr_synth_batch(5, 0, (uint64_t)k * B, m->cfg.vocab, B, T, in, tg);
			cr_assert_eq(mr_gpt_forward(m, in, tg, &eb), 0, "%s", eb.msg);
			loss[k] = m->loss;
			continue;
		}
		if (!split) {
			cr_assert_eq(mr_gpt_backward(m, 1.0f / MB), 0);
			continue;
		}
		cr_assert_eq(mr_gpt_head_bwd(m, m->la[L - 1].res3, 1.0f / MB), 0);
		cr_assert_eq(mr_gpt_blocks_bwd(m, 0, L, m->encoded, 1.0f / MB, MR_GPT_BWD_INPUT),
			     0);
		cr_assert_eq(mr_gpt_embed_bwd(m), 0);
		if (pending >= 0) {
			cr_assert_eq(mr_gpt_use_slot(m, pending), 0);
			cr_assert_eq(mr_gpt_blocks_bwd(m, 0, L, m->encoded, 1.0f / MB,
						       MR_GPT_BWD_WEIGHT), 0);
		}
		pending = k;
	}
	if (!split)
		return;
	cr_assert_eq(mr_gpt_use_slot(m, pending), 0);
	cr_assert_eq(mr_gpt_blocks_bwd(m, 0, L, m->encoded, 1.0f / MB, MR_GPT_BWD_WEIGHT), 0);
}

static void check_slots(const struct mr_gpt_config *c, const char *order, int split)
{
	struct mr_gpt a, b;
	float la[MB], lb[MB];
	size_t acts;
	int i, k;

	open_model(&a, c);
	open_model(&b, c);
	acts = b.mem.bytes[MR_MEM_ACTS];
	sequential(&a, la);
	slotted(&b, order, split, lb);
	/* the ledger holds every slot: MB arenas (and their stashes) */
	cr_expect_eq(b.nslots, MB);
	cr_expect_eq(b.mem.bytes[MR_MEM_ACTS], MB * (acts + (split ? b.nstash : 0)),
		     "activation bytes %zu, want %d x %zu", b.mem.bytes[MR_MEM_ACTS], MB,
		     acts + (split ? b.nstash : 0));
	for (k = 0; k < MB; k++)
		cr_expect_eq(la[k], lb[k], "micro-batch %d: loss %.9g vs %.9g (%s)", k, la[k],
			     lb[k], order);
	for (i = 0; i < a.ntensors; i++) {
		const struct mr_gpt_tensor *t = &a.tensors[i];
		cr_expect(!memcmp(a.grads + t->off, b.grads + t->off, t->n * sizeof(float)),
			  "gradient of '%s' differs (%s%s)", t->name, order,
			  split ? ", split" : "");
	}
	mr_gpt_release(&a);
	mr_gpt_release(&b);
}

/* GPipe: every forward, then every backward */
Test(pieces, slots_gpipe_order_bit_identical)
{
	check_slots(&dense, "F0F1F2B0B1B2", 0);
	check_slots(&moe, "F0F1F2B0B1B2", 0);
}

/* 1F1B on a first stage of two: warm-up, one forward one backward */
Test(pieces, slots_1f1b_order_bit_identical)
{
	check_slots(&dense, "F0F1B0F2B1B2", 0);
	check_slots(&moe, "F0F1B0F2B1B2", 0);
}

/* zero bubble: input phases in 1F1B order, weight phases deferred */
Test(pieces, slots_split_backward_deferred_weight_bit_identical)
{
	check_slots(&dense, "F0F1B0F2B1B2", 1);
	check_slots(&moe, "F0F1B0F2B1B2", 1);
}

