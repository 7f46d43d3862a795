/*
 * test_pp.c - the pipeline stage runner (runtime/parallel/mr_pp.h) from
 * inside: ranks are threads with real host communicators, each a stage of
 * one GPT under the step driver. What the parity jobs (tests/parity)
 * cannot see from outside:
 *   - the activation memory a stage holds: one slot per micro-batch in
 *     flight, as many as the schedule's simulator counts (1f1b: p - s on
 *     stage s; gpipe: every micro-batch), in the mr_mem ledger, and the
 *     model's one state again once the stage is freed;
 *   - the tied embeddings: the first and the last stage's copies are bit
 *     for bit the same after training;
 *   - a non-finite value on one stage fails the step on every stage, the
 *     stage holding it naming the tensor and itself.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../comm/harness.h"
#include "cpu/mr_pool.h"
#include "data/mr_synth.h"
#include "mr_groups.h"
#include "mr_step.h"

void openblas_set_num_threads(int num_threads);

#define MAXP 4

static const struct mr_adamw_config OC = { .lr = 3e-3f, .min_lr_frac = 0.1f,
					   .warmup_steps = 2, .total_steps = 10,
					   .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
					   .weight_decay = 0.1f, .grad_clip = 1.0f };

struct run {
	enum mr_pp_kind kind;
	int v, m, steps;
	int poison;                /* 1: stage p-1 gets a NaN weight before step 1 */
	int paired;                /* mr_pp_config.paired */
	/* per rank, out */
	int slots[MAXP];
	size_t acts[MAXP], nacts[MAXP], nstash[MAXP];
	size_t acts_freed[MAXP];   /* after the stage was freed */
	int step_rc[MAXP];
	char msg[MAXP][MR_ERRBUF_SIZE];
	float *wte[MAXP];          /* first and last stage: their wte after training */
	size_t wte_n;
};

static const struct mr_gpt_config MC = { .vocab = 64, .max_seq = 16, .n_layer = 8,
					 .d_model = 32, .n_head = 4 };
#define B 2
#define T 16

/* Sets one element of the tensor named name to NaN. */
static int poison(struct mr_gpt *m, const char *name)
{
	const struct mr_gpt_tensor *t = mr_gpt_find(m, name);
	float nan_ = NAN;

	return t ? m->dev->ops->upload(m->dev, m->params + t->off, &nan_, sizeof(nan_)) : -1;
}

static int stage_main(struct mr_comm *world, void *arg)
{
	struct run *r = arg;
	int p = mr_comm_size(world), s = mr_comm_rank(world), rc, k;
	int two[2] = { 0, p - 1 }, *in = NULL, *tg = NULL;
	struct mr_errbuf eb = { "", "" };
	struct mr_dp_config dc = { 0, 0, 1, MR_DP_OFFLOAD_NONE };
	struct mr_dp_comms cc = { NULL, NULL, world, NULL };
	struct mr_comm *embed = NULL;
	struct mr_pool *pool = NULL;
	struct mr_step st = { 0 };
	struct mr_place where;
	struct mr_gpt m = { 0 };
	size_t N = (size_t)B * T;

	openblas_set_num_threads(1);
	mr_place_one(&where);
	where.size[MR_AXIS_PP] = p;
	where.index[MR_AXIS_PP] = s;
	where.comm[MR_AXIS_PP] = world;
	if ((s == 0 || s == p - 1) && (rc = mr_comm_split(world, two, 2, "embed", &embed, &eb)))
		goto out;
	if ((rc = mr_groups_place_layers(&where, &MC, T, r->v, NULL, 0, &eb)) < 0 ||
	    (rc = mr_pool_create(&pool, 1)) < 0 ||
	    (rc = mr_gpt_create_placed(&m, &MC, B, T, pool, &where, 0, &eb)) < 0)
		goto out;
	mr_pp_dp_config(&dc);
	struct mr_pp_config pc = { r->kind, r->v, world, embed, r->paired };
	if ((rc = mr_step_init(&st, &m, &OC, &dc, &cc, 5, &eb)) < 0 ||
	    (rc = mr_step_pipeline(&st, &pc, &eb)) < 0)
		goto out;
	in = malloc(sizeof(int) * N * (size_t)r->m);
	tg = malloc(sizeof(int) * N * (size_t)r->m);
	rc = in && tg ? 0 : MR_ENOMEM;
	for (k = 0; k < r->steps && rc == 0; k++) {
		struct mr_step_result res;
		for (int j = 0; j < r->m; j++)
			mr_synth_batch(77, 0, ((uint64_t)k * r->m + j) * B, MC.vocab, B, T,
				       in + j * N, tg + j * N);
		if (r->poison && k == 1 && s == p - 1 && (rc = poison(&m, "h.7.mlp.fc.w")) < 0)
			break;
		rc = mr_step_run(&st, in, tg, r->m, &res, &eb);
	}
	r->step_rc[s] = rc;
	snprintf(r->msg[s], sizeof(r->msg[s]), "%s", eb.msg);
	if (rc == MR_ENONFINITE)
		rc = 0; /* expected by the poison test, which checks it */
	if (st.pp) {
		struct mr_pp_stats ps;
		mr_pp_stats(st.pp, &ps);
		r->slots[s] = ps.slots;
	}
	r->acts[s] = m.mem.bytes[MR_MEM_ACTS];
	r->nacts[s] = m.nacts;
	r->nstash[s] = m.split ? m.nstash : 0;
	if (rc == 0 && (s == 0 || s == p - 1)) {
		const struct mr_gpt_tensor *t = mr_gpt_find(&m, "wte");
		r->wte_n = t->n;
		r->wte[s] = malloc(sizeof(float) * t->n);
		rc = r->wte[s] ? m.dev->ops->download(m.dev, r->wte[s], m.params + t->off,
						      sizeof(float) * t->n)
			       : MR_ENOMEM;
	}
out:
	if (rc < 0)
		fprintf(stderr, "stage %d: %s: %s\n", s, mr_err_name(rc), eb.msg);
	free(in);
	free(tg);
	mr_step_release(&st);
	r->acts_freed[s] = m.mem.bytes[MR_MEM_ACTS];
	if (m.dev)
		mr_gpt_release(&m);
	mr_pool_free(pool);
	mr_comm_free(embed);
	return rc;
}

/* Runs p stages; the simulator's peak in-flight micro-batches per stage
 * into peak. */
static void run_pp(struct run *r, int p, int *peak)
{
	struct mr_pp_spec sp = { r->kind, p, r->m, r->v };
	struct mr_pp_cost c = { 1.0, 1.0, 1.0 };
	struct mr_pp_sim sim = { 0 };
	struct mr_errbuf eb = { "", "" };
	int pw[MAXP];

	sim.peak = peak;
	sim.peak_w = pw;
	cr_assert_eq(mr_pp_simulate(&sp, &c, &sim, &eb), 0, "%s", eb.msg);
	if (r->kind == MR_PP_ZBH1)
		memcpy(peak, pw, sizeof(pw)); /* W keeps its micro-batch's slot */
	cr_assert_eq(run_threads_t(p, HOSTS_SAME, 30000, stage_main, r), 0);
}

static void check_slots(enum mr_pp_kind kind, int p, int m)
{
	struct run r = { .kind = kind, .v = 1, .m = m, .steps = 2 };
	int peak[MAXP], s;

	run_pp(&r, p, peak);
	for (s = 0; s < p; s++) {
		int want = kind == MR_PP_GPIPE ? m : kind == MR_PP_1F1B ? (p - s < m ? p - s : m)
									: peak[s];
		cr_expect_eq(r.slots[s], peak[s], "stage %d: %d slots, the simulator's peak %d",
			     s, r.slots[s], peak[s]);
		cr_expect_eq(r.slots[s], want, "stage %d: %d slots, want %d", s, r.slots[s], want);
		cr_expect_eq(r.acts[s], (size_t)r.slots[s] * (r.nacts[s] + r.nstash[s]),
			     "stage %d: the ledger's activations are not its slots'", s);
		cr_expect_eq(r.acts_freed[s], r.nacts[s] + r.nstash[s],
			     "stage %d: freed, the stage left %zu bytes of activations, not the "
			     "model's one state",
			     s, r.acts_freed[s]);
		free(r.wte[s]);
	}
}

Test(pp, gpipe_holds_every_micro_batch, .timeout = 120) { check_slots(MR_PP_GPIPE, 4, 8); }
Test(pp, one_f_one_b_holds_p_minus_s, .timeout = 120) { check_slots(MR_PP_1F1B, 4, 8); }
Test(pp, zb_h1_holds_what_w_still_needs, .timeout = 120) { check_slots(MR_PP_ZBH1, 4, 8); }

Test(pp, tied_embeddings_stay_identical, .timeout = 120)
{
	struct run r = { .kind = MR_PP_INTERLEAVED, .v = 2, .m = 4, .steps = 5 };
	int peak[MAXP];

	run_pp(&r, 2, peak);
	cr_assert_not_null(r.wte[0]);
	cr_assert_not_null(r.wte[1]);
	cr_expect_eq(memcmp(r.wte[0], r.wte[1], sizeof(float) * r.wte_n), 0,
		     "the last stage's wte drifted from the first stage's");
	free(r.wte[0]);
	free(r.wte[1]);
}

Test(pp, a_nonfinite_weight_fails_every_stage_naming_it, .timeout = 120)
{
	struct run r = { .kind = MR_PP_1F1B, .v = 1, .m = 4, .steps = 3, .poison = 1 };
	int peak[MAXP], s;

	run_pp(&r, 4, peak);
	for (s = 0; s < 4; s++)
		cr_expect_eq(r.step_rc[s], MR_ENONFINITE, "stage %d: %d %s", s, r.step_rc[s],
			     r.msg[s]);
	cr_expect(strstr(r.msg[3], "at step 1") && strstr(r.msg[3], "'params.h.7.mlp.fc.w'") &&
			  strstr(r.msg[3], "on pipeline stage 3"),
		  "%s", r.msg[3]);
	for (s = 0; s < 4; s++)
		free(r.wte[s]);
}
