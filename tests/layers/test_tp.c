/*
 * test_tp.c - Megatron tensor parallelism (with and without sequence
 * parallelism, dense and MoE) against the single-rank model.
 *
 * Ranks are threads with real host communicators (shared memory). Each
 * tp rank trains its slices for 10 AdamW steps on the same synthetic
 * batches as one unsharded rank; the slices are then gathered into the full
 * layout and compared tensor by tensor.
 *
 * Tolerances: tensor parallelism changes only the order of float sums (a
 * row-parallel GEMM's partial products are added across ranks; the
 * softmax denominator of the vocab-parallel loss likewise), which moves a
 * loss by ~1e-7 relative per step: loss rel 1e-5 at every step. Weights:
 * see tests/support/parity.h.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/harness.h"
#include "cpu/mr_pool.h"
#include "data/mr_synth.h"
#include "mr_step.h"
#include "parity.h"

#define STEPS 10
#define SEED 7

struct run {
	struct mr_gpt_config cfg;
	int B, T, tp, sp;
	float loss[STEPS];
	float *params;   /* full layout (single-rank table order) */
	size_t nparams;
	int fails;
};

static const struct mr_adamw_config ocfg = { 3e-3f, 0.1f, 2, STEPS, 0.9f, 0.95f, 1e-8f,
					     0.1f, 1.0f, MR_LR_COSINE, 0.0f };

static void batch(const struct run *r, int step, int *in, int *tg)
{
	mr_synth_batch(SEED, 0, (uint64_t)step * r->B, r->cfg.vocab, r->B, r->T, in, tg);
}

/* Trains STEPS steps; tp rank 0 keeps the gathered weights in r. */
static int train(struct run *r, struct mr_comm *tpc)
{
	struct mr_place where;
	struct mr_errbuf eb = { "", "" };
	struct mr_pool *pool = NULL;
	struct mr_gpt m;
	struct mr_step st;
	struct mr_step_result res;
	int *in = malloc(sizeof(int) * r->B * r->T), *tg = malloc(sizeof(int) * r->B * r->T);
	int s, rc, rank = tpc ? mr_comm_rank(tpc) : 0;
	float *full = NULL;

	mr_place_tp(&where, r->tp, rank, tpc, r->sp);
	if (!in || !tg || (rc = mr_pool_create(&pool, 1)) < 0) {
		rc = MR_ENOMEM;
		goto out;
	}
	rc = mr_gpt_create_placed(&m, &r->cfg, r->B, r->T, pool, &where, 0, &eb);
	if (rc < 0) {
		fprintf(stderr, "create: %s\n", eb.msg);
		goto out;
	}
	if ((rc = mr_step_init(&st, &m, &ocfg, NULL, NULL, SEED, &eb)) < 0)
		goto out_model;
	for (s = 0; s < STEPS && rc == 0; s++) {
		batch(r, s, in, tg);
		rc = mr_step_run(&st, in, tg, 1, &res, &eb);
		if (rc < 0)
			fprintf(stderr, "rank %d step %d: %s\n", rank, s, eb.msg);
		else if (rank == 0)
			r->loss[s] = res.loss;
	}
	/* the padded rows of wte (vocabulary not divisible by tp) never learn */
	if (rc == 0) {
		const struct mr_gpt_tensor *wte = &m.tensors[0];
		int rows = wte->shape[0], C = wte->shape[1], lo = rank * rows, j;
		for (j = r->cfg.vocab - lo > 0 ? r->cfg.vocab - lo : 0; j < rows; j++)
			for (int c = 0; c < C; c++)
				if (m.params[wte->off + (size_t)j * C + c] != 0.0f)
					r->fails++;
	}
	/* gather every tensor's slices into the single-rank layout */
	if (rc == 0)
		rc = mr_gpt_gather_full(&m, m.params, &full);
	if (rank == 0 && rc == 0) {
		r->params = full;
		r->nparams = mr_gpt_full_nparams(&m);
	}
	mr_step_release(&st);
out_model:
	mr_gpt_release(&m);
out:
	mr_pool_free(pool);
	free(in);
	free(tg);
	return rc;
}

static int tp_rank_fn(struct mr_comm *world, void *arg)
{
	return train(arg, world);
}

static void check_parity(const struct mr_gpt_config *cfg, int tp, int sp)
{
	struct run ref = { *cfg, 2, 16, 1, 0, { 0 }, NULL, 0, 0 };
	struct run par = ref;
	struct mr_gpt shape;
	struct mr_errbuf eb = { "", "" };
	char what[32];
	int s, i;

	par.tp = tp;
	par.sp = sp;
	cr_assert_eq(train(&ref, NULL), 0);
	cr_assert_eq(run_threads(tp, HOSTS_SAME, tp_rank_fn, &par), 0);
	cr_assert_eq(ref.nparams, par.nparams);
	cr_expect_eq(par.fails, 0, "padded vocabulary rows moved");
	for (s = 0; s < STEPS; s++)
		cr_expect(fabsf(par.loss[s] - ref.loss[s]) <= 1e-5f * fabsf(ref.loss[s]),
			  "tp%d sp%d step %d: loss %.8f vs single rank %.8f", tp, sp, s,
			  (double)par.loss[s], (double)ref.loss[s]);
	cr_expect(ref.loss[STEPS - 1] < ref.loss[0], "the reference run must learn");
	/* tensor by tensor, in the single-rank table */
	cr_assert_eq(mr_gpt_create(&shape, cfg, 1, 1, NULL, &eb), 0, "%s", eb.msg);
	snprintf(what, sizeof(what), "tp%d sp%d", tp, sp);
	for (i = 0; i < shape.ntensors; i++) {
		const struct mr_gpt_tensor *t = &shape.tensors[i];
		char why[160];
		cr_expect(!mr_parity_tensor(t, par.params + t->off, ref.params + t->off,
					    MR_PARITY_WEIGHT_TOL, why, sizeof(why)),
			  "%s: %s", what, why);
	}
	mr_gpt_release(&shape);
	free(ref.params);
	free(par.params);
}

static const struct mr_gpt_config dense = { .vocab = 64, .max_seq = 16, .n_layer = 2, .d_model = 32,
					    .n_head = 4 };
/* MoE every layer 2, 4 experts, top-2, capacity low enough to drop */
static const struct mr_gpt_config moe = { .vocab = 64, .max_seq = 16, .n_layer = 2, .d_model = 32,
					  .n_head = 4, .moe_every = 2, .n_experts = 4, .top_k = 2,
					  .capacity_factor = 0.75f, .aux_coef = 0.01f };

Test(tp, dense_tp2) { check_parity(&dense, 2, 0); }
Test(tp, dense_tp4) { check_parity(&dense, 4, 0); }
Test(tp, dense_tp2_sp) { check_parity(&dense, 2, 1); }
Test(tp, dense_tp4_sp) { check_parity(&dense, 4, 1); }
Test(tp, moe_tp2) { check_parity(&moe, 2, 0); }
Test(tp, moe_tp2_sp) { check_parity(&moe, 2, 1); }

/* A vocabulary tp does not divide is padded: 65 over 2 ranks (33 + 32 and
 * one zero row), 66 over 4 (17 each, the last with 15 real rows). */
static const struct mr_gpt_config dense_v65 = { .vocab = 65, .max_seq = 16, .n_layer = 2,
						.d_model = 32, .n_head = 4 };
static const struct mr_gpt_config dense_v66 = { .vocab = 66, .max_seq = 16, .n_layer = 2,
						.d_model = 32, .n_head = 4 };

Test(tp, padded_vocab_tp2) { check_parity(&dense_v65, 2, 0); }
Test(tp, padded_vocab_tp4_sp) { check_parity(&dense_v66, 4, 1); }

Test(tp, bad_placement_names_the_field)
{
	struct mr_gpt_config c = dense;
	struct mr_place where;
	struct mr_errbuf eb = { "", "" };
	struct mr_gpt m;

	mr_place_tp(&where, 3, 0, (struct mr_comm *)1, 0);
	cr_expect_eq(mr_gpt_create_placed(&m, &c, 2, 16, NULL, &where, 0, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "n_head", "%s", eb.msg);
	/* heads dividing by tp make d_model (= heads x head size) divide too;
	 * a vocabulary tp does not divide is padded (below), not an error */
	c = dense;
	mr_place_tp(&where, 2, 0, (struct mr_comm *)1, 1);
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_gpt_create_placed(&m, &c, 2, 15, NULL, &where, 0, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "seq_len", "%s", eb.msg);
	/* a pipeline stage needs its layers, in ascending non-empty chunks */
	mr_place_one(&where);
	where.size[MR_AXIS_PP] = 2;
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_gpt_create_placed(&m, &c, 2, 16, NULL, &where, 0, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "pp_layers", "%s", eb.msg);
	where.chunks = 2;
	where.layer_lo[0] = 1;
	where.layer_hi[0] = 2;
	where.layer_lo[1] = 0;
	where.layer_hi[1] = 1;
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_gpt_create_placed(&m, &c, 2, 16, NULL, &where, 0, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "pp_layers", "%s", eb.msg);
	/* the modes that have not landed are refused naming their axis */
	mr_place_one(&where);
	where.size[MR_AXIS_CP] = 2;
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_gpt_create_placed(&m, &c, 2, 16, NULL, &where, 0, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "cp", "%s", eb.msg);
}

/*
 * Replicated key/value heads (model/mr_gpt.h's mr_gpt_kv_rep): tp above
 * n_kv_head, a multiple of it. The slice rule: rank r holds key/value
 * head r / rep (rep = tp / n_kv_head), which is the head every one of its
 * query heads uses under GQA (query head h uses h / (n_head / n_kv_head)).
 */
Test(tp, replicated_kv_heads_are_the_ones_the_query_heads_use)
{
	static const int cfgs[][3] = { { 4, 2, 4 }, { 4, 1, 2 }, { 4, 1, 4 }, { 8, 2, 8 },
				       { 8, 2, 4 }, { 12, 3, 6 }, { 32, 8, 16 }, { 32, 4, 32 } };

	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		int NH = cfgs[i][0], NKV = cfgs[i][1], tp = cfgs[i][2], rep = tp / NKV;
		struct mr_gpt_config c = { .arch = MR_ARCH_LLAMA, .n_head = NH, .n_kv_head = NKV };
		cr_expect_eq(mr_gpt_kv_rep(&c, tp), rep);
		cr_expect_eq(mr_gpt_kv_local(&c, tp), 1);
		for (int r = 0; r < tp; r++)
			for (int h = r * (NH / tp); h < (r + 1) * (NH / tp); h++)
				cr_expect_eq(h / (NH / NKV), r / rep,
					     "n_head %d n_kv_head %d tp %d: rank %d's query head %d", NH,
					     NKV, tp, r, h);
	}
}

/* A fake communicator: creating a model does not communicate. */
#define FAKE_COMM ((struct mr_comm *)1)

static const struct mr_gpt_config llama_kv2 = { .vocab = 64, .max_seq = 16, .n_layer = 1,
						.d_model = 32, .n_head = 4, .arch = MR_ARCH_LLAMA,
						.n_kv_head = 2, .ffn_hidden = 64 };

static const struct mr_gpt_tensor *tensor(const struct mr_gpt *m, const char *name)
{
	for (int i = 0; i < m->ntensors; i++)
		if (!strcmp(m->tensors[i].name, name))
			return &m->tensors[i];
	cr_assert_fail("no tensor '%s'", name);
	return NULL;
}

/* n_kv_head 2 over tp 4: k and v are cut in 2 slices of one head (8 rows
 * of 32), ranks 0 and 1 holding head 0, 2 and 3 head 1; the first of
 * each pair counts it (grad norm, checkpoint). n_kv_head 1 over tp 2:
 * held whole, counted by rank 0. */
Test(tp, replicated_kv_slice_rule)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_place where;
	struct mr_gpt m;
	float full[64 * 32], local[64 * 32];
	int hs = 8, C = 32;

	for (int i = 0; i < 64 * 32; i++)
		full[i] = (float)i;
	for (int r = 0; r < 4; r++) {
		mr_place_tp(&where, 4, r, FAKE_COMM, 1);
		where.kv = FAKE_COMM;
		cr_assert_eq(mr_gpt_create_placed(&m, &llama_kv2, 2, 16, NULL, &where, 0, &eb), 0,
			     "%s", eb.msg);
		for (int kv = 0; kv < 2; kv++) {
			const struct mr_gpt_tensor *t = tensor(&m, kv ? "h.0.attn.v.w" : "h.0.attn.k.w");
			cr_expect_eq(t->shape[0], hs);
			cr_expect_eq(t->full[0], 2 * hs);
			cr_expect_eq(t->tp_rep, 2);
			cr_expect_eq(t->split[MR_AXIS_TP], 0);
			cr_expect_eq(mr_gpt_tensor_tp_slices(t, 4), 2);
			cr_expect_eq(mr_gpt_tensor_tp_slice(t, 4, r), r / 2);
			cr_expect_eq(mr_gpt_norm_counts(&m, t), r % 2 == 0);
			mr_gpt_tensor_slice(t, 4, r, 0, full, local, 0);
			for (int i = 0; i < hs * C; i++)
				cr_assert_eq(local[i], full[(size_t)(r / 2) * hs * C + i],
					     "rank %d: element %d of %s", r, i, t->name);
		}
		/* query heads stay split: one a rank */
		cr_expect_eq(tensor(&m, "h.0.attn.q.w")->shape[0], hs);
		cr_expect_eq(tensor(&m, "h.0.attn.q.w")->tp_rep, 1);
		mr_gpt_release(&m);
	}
	for (int r = 0; r < 2; r++) {
		struct mr_gpt_config c = llama_kv2;
		const struct mr_gpt_tensor *t;
		c.n_kv_head = 1;
		mr_place_tp(&where, 2, r, FAKE_COMM, 0);
		where.kv = FAKE_COMM;
		cr_assert_eq(mr_gpt_create_placed(&m, &c, 2, 16, NULL, &where, 0, &eb), 0, "%s",
			     eb.msg);
		t = tensor(&m, "h.0.attn.k.w");
		cr_expect_eq(t->shape[0], hs);
		cr_expect_eq(t->split[MR_AXIS_TP], -1);
		cr_expect_eq(mr_gpt_tensor_tp_slices(t, 2), 1);
		cr_expect_eq(mr_gpt_tensor_tp_slice(t, 2, r), -1);
		cr_expect_eq(mr_gpt_norm_counts(&m, t), r == 0);
		mr_gpt_release(&m);
	}
}

/* tp neither dividing n_kv_head nor a multiple of it: refused naming
 * n_kv_head (2 heads over tp 3); replicated heads without their group too */
Test(tp, kv_heads_tp_cannot_share_are_refused)
{
	struct mr_gpt_config c = llama_kv2;
	struct mr_errbuf eb = { "", "" };
	struct mr_place where;
	struct mr_gpt m;

	c.n_head = 6;
	c.d_model = 48;
	c.ffn_hidden = 48;
	mr_place_tp(&where, 3, 0, FAKE_COMM, 0);
	cr_expect_eq(mr_gpt_create_placed(&m, &c, 2, 16, NULL, &where, 0, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "n_kv_head", "%s", eb.msg);
	cr_expect(strstr(eb.msg, "tp (3)"), "%s", eb.msg);
	mr_place_tp(&where, 4, 0, FAKE_COMM, 0);
	mr_errbuf_clear(&eb);
	cr_expect_eq(mr_gpt_create_placed(&m, &llama_kv2, 2, 16, NULL, &where, 0, &eb), MR_EINVAL);
	cr_expect_str_eq(eb.field, "n_kv_head", "%s", eb.msg);
}
