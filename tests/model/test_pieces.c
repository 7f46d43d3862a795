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
 * And the model's micro-batch state: it holds one, carves another without
 * touching it (mr_gpt_slot_alloc) and swaps them (mr_gpt_slot_swap); the
 * slots a pipeline stage keeps of them are tests/parallel/test_pp_slots.c.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "data/mr_synth.h"
#include "model/mr_gpt.h"
#include "tiny_gpt.h"

#define B TINY_B
#define T TINY_T

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

	tiny_open(&a, c);
	tiny_open(&b, c);
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
	for (int cut = 1; cut < tiny_dense.n_layer; cut++)
		check(&tiny_dense, cut);
}

Test(pieces, moe_cut_and_split_backward_bit_identical) { check(&tiny_moe, 2); }

Test(pieces, split_backward_needs_its_stash)
{
	struct mr_gpt m;

	tiny_open(&m, &tiny_dense);
	cr_expect_eq(mr_gpt_blocks_bwd(&m, 0, 1, m.encoded, 1.0f, MR_GPT_BWD_INPUT), MR_ESTATE);
	mr_gpt_release(&m);
}

/* One state in the model; another carved beside it leaves it alone, is
 * accounted, swaps in and out, and blocks a recompute change until freed. */
Test(pieces, one_state_carved_beside_and_swapped)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt m;
	struct mr_gpt_slot s;
	void *own;
	size_t acts;

	tiny_open(&m, &tiny_dense);
	own = m.acts;
	acts = m.mem.bytes[MR_MEM_ACTS];
	cr_expect_eq(acts, m.nacts, "the model holds %zu bytes of activations, want one state",
		     acts);
	cr_assert_eq(mr_gpt_slot_alloc(&m, &s), 0);
	cr_expect_eq(m.acts, own, "carving a state moved the model's");
	cr_expect(s.acts && s.acts != own);
	cr_expect_eq(m.slots_out, 1);
	cr_expect_eq(m.mem.bytes[MR_MEM_ACTS], 2 * acts);
	cr_expect_eq(mr_gpt_set_recompute(&m, MR_GPT_RC_FULL, 0, &eb), MR_ESTATE);
	cr_expect_str_eq(eb.field, "recompute");
	cr_expect_eq(mr_gpt_split_bwd(&m), MR_ESTATE);
	mr_gpt_slot_swap(&m, &s);
	cr_expect(m.acts != own && s.acts == own, "swap did not exchange the states");
	mr_gpt_slot_free(&m, &s); /* the one the model was created with */
	cr_expect_null(s.acts);
	mr_gpt_slot_free(&m, &s); /* empty: a no-op */
	cr_expect_eq(m.slots_out, 0);
	cr_expect_eq(m.mem.bytes[MR_MEM_ACTS], acts);
	cr_expect_eq(mr_gpt_set_recompute(&m, MR_GPT_RC_FULL, 0, &eb), 0, "%s", eb.msg);
	mr_gpt_release(&m);
}
