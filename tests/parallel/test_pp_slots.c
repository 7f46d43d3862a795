/*
 * test_pp_slots.c - a pipeline stage's micro-batch slots
 * (runtime/parallel/mr_pp_slots.h) over one model, without the runner:
 *   - several micro-batches forwarded before their backwards, in a
 *     pipeline schedule's orders, give the gradients of one after the
 *     other - bit for bit, since each gradient still receives the
 *     micro-batches in order - with and without a split backward;
 *   - the ledger: the model alone holds one state, k slots hold k (the
 *     activations grow by exactly k - 1 arenas, and their stashes), and
 *     released they leave the model its one state;
 *   - a slot outside 0..k-1 is refused, and the model's recompute mode
 *     cannot change while the slots are out.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "data/mr_synth.h"
#include "model/mr_gpt.h"
#include "tiny_gpt.h"
#include "parallel/mr_pp_slots.h"

#define B TINY_B
#define T TINY_T
#define MB 3 /* micro-batches, and slots */

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
 * order: MB forwards and MB backwards as "F0 F1 B0 ..." (the micro-batch,
 * and its slot, after each letter); a split backward when split: the
 * input phase at B, the weight phase of the same micro-batch right after
 * the next B (or at the end), as zero-bubble schedules defer it.
 */
static void slotted(struct mr_pp_slots *ps, const char *order, int split, float *loss)
{
	struct mr_gpt *m = ps->m;
	int in[B * T], tg[B * T], L = m->cfg.n_layer, pending = -1;
	struct mr_errbuf eb = { "", "" };
	const char *o;

	for (o = order; *o; o += 2) {
		int k = o[1] - '0';
		cr_assert_eq(mr_pp_slots_use(ps, k), 0);
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
			cr_assert_eq(mr_pp_slots_use(ps, pending), 0);
			cr_assert_eq(mr_gpt_blocks_bwd(m, 0, L, m->encoded, 1.0f / MB,
						       MR_GPT_BWD_WEIGHT), 0);
		}
		pending = k;
	}
	if (!split)
		return;
	cr_assert_eq(mr_pp_slots_use(ps, pending), 0);
	cr_assert_eq(mr_gpt_blocks_bwd(m, 0, L, m->encoded, 1.0f / MB, MR_GPT_BWD_WEIGHT), 0);
}

static void check_slots(const struct mr_gpt_config *c, const char *order, int split)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_pp_slots ps;
	struct mr_gpt a, b;
	float la[MB], lb[MB];
	size_t acts, per;
	int i, k;

	tiny_open(&a, c);
	tiny_open(&b, c);
	if (split) /* before the slots grow, as the runner does */
		cr_assert_eq(mr_gpt_split_bwd(&b), 0);
	acts = b.mem.bytes[MR_MEM_ACTS];
	per = b.nacts + (split ? b.nstash : 0);
	cr_expect_eq(acts, per, "the model alone holds %zu bytes of activations, want %zu", acts,
		     per);
	cr_assert_eq(mr_pp_slots_init(&ps, &b, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_pp_slots_grow(&ps, MB, &eb), 0, "%s", eb.msg);
	cr_expect_eq(mr_pp_slots_use(&ps, MB), MR_EINVAL);
	cr_expect_eq(mr_pp_slots_use(&ps, -1), MR_EINVAL);
	cr_expect_eq(ps.n, MB);
	cr_expect_eq(b.mem.bytes[MR_MEM_ACTS], acts + (MB - 1) * per,
		     "activation bytes %zu, want %zu and %d more arenas of %zu",
		     b.mem.bytes[MR_MEM_ACTS], acts, MB - 1, per);
	sequential(&a, la);
	slotted(&ps, order, split, lb);
	for (k = 0; k < MB; k++)
		cr_expect_eq(la[k], lb[k], "micro-batch %d: loss %.9g vs %.9g (%s)", k, la[k],
			     lb[k], order);
	for (i = 0; i < a.ntensors; i++) {
		const struct mr_gpt_tensor *t = &a.tensors[i];
		cr_expect(!memcmp(a.grads + t->off, b.grads + t->off, t->n * sizeof(float)),
			  "gradient of '%s' differs (%s%s)", t->name, order,
			  split ? ", split" : "");
	}
	mr_pp_slots_release(&ps);
	cr_expect_eq(b.mem.bytes[MR_MEM_ACTS], acts, "released, the slots left %zu bytes, not %zu",
		     b.mem.bytes[MR_MEM_ACTS], acts);
	cr_expect_eq(b.slots_out, 0);
	mr_gpt_release(&a);
	mr_gpt_release(&b);
}

/* GPipe: every forward, then every backward */
Test(pp_slots, gpipe_order_bit_identical)
{
	check_slots(&tiny_dense, "F0F1F2B0B1B2", 0);
	check_slots(&tiny_moe, "F0F1F2B0B1B2", 0);
}

/* 1F1B on a first stage of two: warm-up, one forward one backward */
Test(pp_slots, one_f_one_b_order_bit_identical)
{
	check_slots(&tiny_dense, "F0F1B0F2B1B2", 0);
	check_slots(&tiny_moe, "F0F1B0F2B1B2", 0);
}

/* zero bubble: input phases in 1F1B order, weight phases deferred */
Test(pp_slots, split_backward_deferred_weight_bit_identical)
{
	check_slots(&tiny_dense, "F0F1B0F2B1B2", 1);
	check_slots(&tiny_moe, "F0F1B0F2B1B2", 1);
}

/* The recompute mode is the carve of every slot: set before they grow. */
Test(pp_slots, recompute_refused_while_slots_are_out)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_pp_slots ps;
	struct mr_gpt m;
	size_t acts;

	tiny_open(&m, &tiny_dense);
	cr_assert_eq(mr_gpt_set_recompute(&m, MR_GPT_RC_SELECTIVE, 0, &eb), 0, "%s", eb.msg);
	acts = m.mem.bytes[MR_MEM_ACTS];
	cr_assert_eq(mr_pp_slots_init(&ps, &m, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_pp_slots_grow(&ps, 2, &eb), 0, "%s", eb.msg);
	cr_expect_eq(mr_gpt_set_recompute(&m, MR_GPT_RC_SELECTIVE, 0, &eb), 0,
		     "no change is no re-carve");
	cr_expect_eq(mr_gpt_set_recompute(&m, MR_GPT_RC_FULL, 0, &eb), MR_ESTATE);
	cr_expect_str_eq(eb.field, "recompute");
	cr_expect(strstr(eb.msg, "recompute"), "%s", eb.msg);
	cr_expect_eq(m.mem.bytes[MR_MEM_ACTS], acts + m.nacts, "a refusal changed the ledger");
	mr_pp_slots_release(&ps);
	cr_expect_eq(mr_gpt_set_recompute(&m, MR_GPT_RC_FULL, 0, &eb), 0, "%s", eb.msg);
	mr_gpt_release(&m);
}
