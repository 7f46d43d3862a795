/*
 * test_dp.c - data parallelism (runtime/parallel) against the single-rank
 * trainer: ranks are threads with real host communicators (shared memory).
 *
 * Reference: mr_gpt_create + the step driver (mr_step.h) on one rank
 * (data parallelism the identity) running all
 * accum*dp micro-batches of a step with accumulation (dscale 1/(accum*dp)),
 * same seed and synthetic data. dp rank k runs micro-batches k*accum ..
 * k*accum+accum-1 of each step.
 *
 * Tolerances: loss and grad norm at every step rel <= 1e-5; final params per tensor
 * max|a-b| / max|b| <= 1e-4. The dp runs sum the same gradients in a
 * different order (per rank, then the cross-rank average; shards for
 * ZeRO), so they differ from the reference by fp32 rounding (~1e-7
 * relative per step); AdamW divides by sqrt(v) which amplifies that for
 * elements whose gradient is near zero, and 10 steps compound it: 1e-4
 * of the tensor's scale bounds it with margin while any real error (a
 * missing or doubled micro-batch, a wrong shard, a lost decay flag) is
 * orders of magnitude larger.
 *
 * Except the key bias (rows C..2C of attn.qkv.b): softmax over keys is
 * invariant to adding q.b_k to every score, so its exact gradient is zero
 * and both runs only see rounding noise, which AdamW turns into steps of
 * up to ~lr of either sign. Those elements are not comparable; they are
 * only checked to differ by less than the sum of the step sizes.
 *
 * Memory: expected bytes per category come from the formula in mr_dp.h
 * evaluated here from the model's unit sizes, not from the code under
 * test. Collective counts check that DDP does not reduce on non-final
 * micro-batches.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/harness.h"
#include "cpu/mr_pool.h"
#include "data/mr_synth.h"
#include "mr_step.h"

void openblas_set_num_threads(int num_threads);

#define STEPS 10
#define SEED 1234
#define DATA_SEED 77

struct run {
	struct mr_gpt_config mc;
	int B, T, accum, S, R, steps;
	struct mr_dp_config dc;
	long want_colls;          /* > 0: grad collectives expected per step */
	int check_mem;
	int tp;                   /* > 1: tensor parallel inside each dp rank */
	const float *ref;         /* tp > 1: reference params, checked by each rank */
	const struct mr_gpt *full; /* tp > 1: the single-rank tensor table */
	char perr[16][256];       /* tp > 1: per-rank parameter mismatch */
	float lr;                 /* != 0: overrides OC.lr */
	int nonfinite_rc[16];     /* the failing step's code and message per rank */
	char nonfinite_msg[16][MR_ERRBUF_SIZE];
	float loss[16][STEPS], norm[16][STEPS];
	float *params;            /* rank 0's gathered params */
};

static const struct mr_adamw_config OC = { .lr = 3e-3f, .min_lr_frac = 0.1f,
					   .warmup_steps = 2, .total_steps = STEPS,
					   .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
					   .weight_decay = 0.1f, .grad_clip = 1.0f };

static struct mr_gpt_config dense(void)
{
	return (struct mr_gpt_config){ .vocab = 64, .max_seq = 32, .n_layer = 2, .d_model = 32,
				       .n_head = 4 };
}

static struct mr_gpt_config moe(void)
{
	struct mr_gpt_config c = dense();

	c.moe_every = 2;
	c.n_experts = 4;
	c.top_k = 2;
	c.capacity_factor = 0.5f; /* drops tokens */
	c.aux_coef = 0.01f;
	return c;
}

/* Micro-batch j of step s (of nmb per step). */
static void batch(const struct run *r, int s, int j, int nmb, int *in, int *tg)
{
	mr_synth_batch(DATA_SEED, 0, ((uint64_t)s * nmb + j) * r->B, r->mc.vocab, r->B, r->T,
		       in, tg);
}

static size_t up(size_t n, size_t s)
{
	return (n + s - 1) / s;
}

/* Expected bytes per category from the formula of mr_dp.h. */
static void expect_mem(const struct mr_gpt *m, int zero, int S, size_t want[MR_MEM_KINDS])
{
	size_t np = 0, pm = 0, p0, pl, n, off;
	int u, last = m->nunits - 1;

	for (u = 0; u < m->nunits; u++) {
		mr_gpt_unit_range(m, u, &off, &n);
		np += up(n, S) * S;
		if (u > 0 && u < last && up(n, S) * S > pm)
			pm = up(n, S) * S;
	}
	mr_gpt_unit_range(m, 0, &off, &n);
	p0 = up(n, S) * S;
	mr_gpt_unit_range(m, last, &off, &n);
	pl = up(n, S) * S;
	memset(want, 0, sizeof(size_t) * MR_MEM_KINDS);
	want[MR_MEM_ACTS] = m->nacts; /* bytes */
	want[MR_MEM_WORKSPACE] = m->nws;
	want[MR_MEM_OPTIM] = 8 * np / S;
	want[MR_MEM_PARAMS] = zero == 3 ? 4 * np / S + 4 * (p0 + pl + 2 * pm) : 4 * np;
	want[MR_MEM_GRADS] = zero == 1 ? 4 * np + 4 * np / S : 4 * np / S + 4 * (p0 + pl + 2 * pm);
	if (zero >= 2)
		want[MR_MEM_WORKSPACE] += 4 * (p0 + pl + 2 * pm) / S;
}

static int check_mem(const struct mr_gpt *m, int zero, int S, int rank, const char *when)
{
	size_t want[MR_MEM_KINDS];
	int k, bad = 0;

	expect_mem(m, zero, S, want);
	for (k = 0; k < MR_MEM_KINDS; k++)
		if (m->mem.bytes[k] != want[k]) {
			fprintf(stderr, "rank %d %s: %s holds %zu bytes, want %zu\n", rank, when,
				mr_mem_kind_name(k), m->mem.bytes[k], want[k]);
			bad = 1;
		}
	return bad ? -1 : 0;
}

/*
 * Compares tensor t's values a against the reference b (t->n each): 0, or
 * -1 with a message in err. The key-bias slice of attn.qkv.b (rows
 * [Cl, 2Cl) of this rank's [q; k; v] slices) only has to stay within
 * lrsum (see the header comment).
 */
static int cmp_tensor(const struct mr_gpt_tensor *t, int C, int tp, const float *a,
		      const float *b, double lrsum, char *err, size_t cap)
{
	int qkvb = strstr(t->name, "attn.qkv.b") != NULL;
	size_t j, jm = 0, Cl = (size_t)C / (size_t)tp;
	double md = 0, mb = 0, mk = 0;

	for (j = 0; j < t->n; j++) {
		double d = fabs((double)a[j] - b[j]);
		if (qkvb && j >= Cl && j < 2 * Cl) {
			mk = fmax(mk, d);
			continue;
		}
		if (d > md)
			jm = j;
		md = fmax(md, d);
		mb = fmax(mb, fabs(b[j]));
	}
	if (md > 1e-4 * mb) {
		snprintf(err, cap, "tensor %s: max|a-b| %.3g at %zu, max|b| %.3g", t->name, md,
			 jm, mb);
		return -1;
	}
	if (mk > lrsum) {
		snprintf(err, cap, "tensor %s: key bias max|a-b| %.3g", t->name, mk);
		return -1;
	}
	return 0;
}

static double lr_sum(int steps)
{
	double s = 0.0;

	for (int i = 0; i < steps; i++)
		s += mr_lr_at(&OC, i);
	return s;
}

/* tp > 1: this rank's gathered slice against the reference's slice. */
static int check_tp_params(struct run *r, struct mr_dp *d, const struct mr_gpt *m, int rank)
{
	float *p = malloc(sizeof(float) * m->nparams), *want = NULL;
	int i, rc = p ? mr_dp_gather_params(d, p) : MR_ENOMEM;

	for (i = 0; i < m->ntensors && rc == 0; i++) {
		const struct mr_gpt_tensor *t = &m->tensors[i], *f = mr_gpt_find(r->full, t->name);
		free(want);
		want = malloc(sizeof(float) * t->n);
		if (!f || !want) {
			rc = MR_ENOMEM;
			break;
		}
		mr_gpt_tensor_slice(t, m->par.tp.size, m->par.tp.rank, m->par.ep.rank,
				    (float *)r->ref + f->off, want, 0);
		rc = cmp_tensor(t, r->mc.d_model, m->par.tp.size, p + t->off, want,
				lr_sum(r->steps), r->perr[rank], sizeof(r->perr[rank]));
	}
	free(want);
	free(p);
	return rc;
}

static int dp_rank(struct mr_comm *w, void *arg)
{
	struct run *r = arg;
	int rank = mr_comm_rank(w), tp = r->tp > 1 ? r->tp : 1, ti = rank % tp, k = rank / tp;
	int S = r->S, si = k % S, ri = k / S;
	int nmb = r->accum * S * r->R, N = r->B * r->T, gs[16], gr[16], gt[16], i, s, rc = 0;
	struct mr_comm *shard = NULL, *rep = NULL, *tpc = NULL;
	struct mr_pool *pool = NULL;
	struct mr_gpt m = { 0 };
	struct mr_place where;
	struct mr_step drv = { 0 };
	struct mr_dp *d = NULL;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_step_result res;
	struct mr_dp_stats st;
	int *in = malloc(sizeof(int) * N * r->accum), *tg = malloc(sizeof(int) * N * r->accum);
	char name[32];

	for (i = 0; i < S; i++)
		gs[i] = (ri * S + i) * tp + ti;
	for (i = 0; i < r->R; i++)
		gr[i] = (i * S + si) * tp + ti;
	for (i = 0; i < tp; i++)
		gt[i] = k * tp + i;
	snprintf(name, sizeof(name), "shard%d.%d", ri, ti);
	if (S > 1)
		rc = mr_comm_split(w, gs, S, name, &shard, &eb);
	snprintf(name, sizeof(name), "rep%d.%d", si, ti);
	if (rc == 0 && r->R > 1)
		rc = mr_comm_split(w, gr, r->R, name, &rep, &eb);
	snprintf(name, sizeof(name), "tp%d", k);
	if (rc == 0 && tp > 1)
		rc = mr_comm_split(w, gt, tp, name, &tpc, &eb);
	mr_place_tp(&where, tp, ti, tpc, 0);
	if (rc == 0)
		rc = mr_pool_create(&pool, 1);
	if (rc == 0)
		rc = mr_gpt_create_placed(&m, &r->mc, r->B, r->T, pool, &where,
					  mr_dp_model_flags(r->dc.zero), &eb);
	struct mr_dp_comms c = { .shard = shard, .replica = rep, .world = w };
	struct mr_adamw_config oc = OC;
	if (r->lr)
		oc.lr = r->lr;
	if (rc == 0)
		rc = mr_step_init(&drv, &m, &oc, &r->dc, &c, SEED, &eb);
	d = drv.dp;
	if (rc == 0 && r->check_mem)
		rc = check_mem(&m, r->dc.zero, S, rank, "after create");
	for (s = 0; s < r->steps && rc == 0; s++) {
		for (i = 0; i < r->accum; i++)
			batch(r, s, k * r->accum + i, nmb, in + i * N, tg + i * N);
		rc = mr_step_run(&drv, in, tg, r->accum, &res, &eb);
		if (rc && r->lr) {
			r->nonfinite_rc[rank] = rc;
			snprintf(r->nonfinite_msg[rank], MR_ERRBUF_SIZE, "%s", eb.msg);
			rc = 0;
			break;
		}
		r->loss[rank][s] = res.loss;
		r->norm[rank][s] = res.grad_norm;
		mr_dp_stats(d, &st);
		if (rc == 0 && r->want_colls && st.grad_colls != r->want_colls) {
			fprintf(stderr, "rank %d step %d: %ld grad collectives, want %ld\n", rank,
				s, st.grad_colls, r->want_colls);
			rc = -1;
		}
		if (rc == 0 && S * r->R > 1 && !(st.comm_s > 0.0)) {
			fprintf(stderr, "rank %d step %d: comm_s %g, want > 0\n", rank, s,
				st.comm_s);
			rc = -1;
		}
	}
	if (rc == 0 && r->check_mem)
		rc = check_mem(&m, r->dc.zero, S, rank, "after steps");
	if (rc == 0 && tp > 1)
		rc = check_tp_params(r, d, &m, rank);
	if (rc == 0 && r->params && tp == 1) {
		float *p = rank == 0 ? r->params : malloc(sizeof(float) * m.nparams);
		rc = p ? mr_dp_gather_params(d, p) : MR_ENOMEM;
		if (rank != 0)
			free(p);
	}
	if (rc && eb.msg[0])
		fprintf(stderr, "rank %d: %s\n", rank, eb.msg);
	mr_step_release(&drv);
	mr_gpt_release(&m);
	mr_pool_free(pool);
	mr_comm_free(rep);
	mr_comm_free(shard);
	mr_comm_free(tpc);
	free(in);
	free(tg);
	return rc;
}

/* The single-rank reference: losses and final params. */
static void reference(const struct run *r, float *loss, float *norm, float **params,
		      size_t *np)
{
	int nmb = r->accum * r->S * r->R, N = r->B * r->T, s, j;
	int *in = malloc(sizeof(int) * N * nmb), *tg = malloc(sizeof(int) * N * nmb);
	struct mr_pool *pool;
	struct mr_gpt m = { 0 };
	struct mr_step drv;
	struct mr_step_result res;
	struct mr_errbuf eb = { { 0 }, { 0 } };

	cr_assert_eq(mr_pool_create(&pool, 1), 0);
	cr_assert_eq(mr_gpt_create(&m, &r->mc, r->B, r->T, pool, &eb), 0, "%s", eb.msg);
	cr_assert_eq(mr_step_init(&drv, &m, &OC, NULL, NULL, SEED, &eb), 0, "%s", eb.msg);
	for (s = 0; s < r->steps; s++) {
		for (j = 0; j < nmb; j++)
			batch(r, s, j, nmb, in + j * N, tg + j * N);
		cr_assert_eq(mr_step_run(&drv, in, tg, nmb, &res, &eb), 0, "%s", eb.msg);
		loss[s] = res.loss;
		norm[s] = res.grad_norm;
	}
	*np = m.nparams;
	*params = malloc(sizeof(float) * m.nparams);
	memcpy(*params, m.params, sizeof(float) * m.nparams);
	mr_step_release(&drv);
	mr_gpt_release(&m);
	mr_pool_free(pool);
	free(in);
	free(tg);
}

static void parity(struct run *r)
{
	static struct mr_gpt shape; /* read by the rank threads */
	float ref_loss[STEPS], ref_norm[STEPS], *ref;
	size_t np;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	char err[256];
	int n = r->S * r->R * (r->tp > 1 ? r->tp : 1), s, k, i;

	openblas_set_num_threads(1);
	r->steps = r->steps ? r->steps : STEPS;
	reference(r, ref_loss, ref_norm, &ref, &np);
	memset(&shape, 0, sizeof(shape));
	/* the table only (no params): names and ranges of the tensors */
	cr_assert_eq(mr_gpt_create_placed(&shape, &r->mc, r->B, r->T, NULL, NULL,
					  MR_GPT_EXT_PARAMS | MR_GPT_EXT_GRADS, &eb), 0);
	cr_assert_eq(shape.nparams, np);
	r->ref = ref;
	r->full = &shape;
	r->params = calloc(np, sizeof(float));
	cr_assert_eq(run_threads_t(n, HOSTS_SAME, 30000, dp_rank, r), 0, "a rank failed");
	for (k = 0; k < n; k++)
		cr_assert_eq(r->perr[k][0], 0, "rank %d: %s", k, r->perr[k]);
	for (s = 0; s < r->steps; s++) {
		for (k = 1; k < n; k++)
			cr_assert_eq(r->loss[k][s], r->loss[0][s], "step %d: rank %d loss differs",
				     s, k);
		cr_assert_leq(fabsf(r->loss[0][s] - ref_loss[s]), 1e-5f * fabsf(ref_loss[s]),
			      "step %d: loss %.8g, reference %.8g", s, r->loss[0][s], ref_loss[s]);
		for (k = 0; k < n; k++)
			cr_assert_leq(fabsf(r->norm[k][s] - ref_norm[s]), 1e-5f * ref_norm[s],
				      "step %d rank %d: grad norm %.8g, reference %.8g", s, k,
				      r->norm[k][s], ref_norm[s]);
	}
	for (i = 0; i < shape.ntensors && r->tp <= 1; i++) {
		const struct mr_gpt_tensor *t = &shape.tensors[i];
		cr_assert_eq(cmp_tensor(t, r->mc.d_model, 1, r->params + t->off, ref + t->off,
					lr_sum(r->steps), err, sizeof(err)),
			     0, "%s", err);
	}
	mr_gpt_release(&shape);
	free(ref);
	free(r->params);
}

/* A fresh run of micro-batches (2,16) over S x R data-parallel ranks (one
 * static instance: Criterion runs each test in its own process). */
static struct run *run_of(struct mr_gpt_config mc, int S, int R, int accum,
			  struct mr_dp_config dc)
{
	static struct run r;

	memset(&r, 0, sizeof(r));
	r.mc = mc;
	r.B = 2;
	r.T = 16;
	r.S = S;
	r.R = R;
	r.accum = accum;
	r.dc = dc;
	return &r;
}

#define PARITY(name, cfgfn, zero_, S_, R_, accum_)                                      \
	Test(dp, name)                                                                  \
	{                                                                               \
		parity(run_of(cfgfn(), S_, R_, accum_,                                  \
			      (struct mr_dp_config){ .zero = zero_, .overlap = 1,       \
						     .bucket_bytes = 16384 }));         \
	}

PARITY(dense_ddp2, dense, 0, 2, 1, 2)
PARITY(dense_ddp4, dense, 0, 4, 1, 1)
PARITY(dense_zero1_dp2, dense, 1, 2, 1, 2)
PARITY(dense_zero1_dp4, dense, 1, 4, 1, 1)
PARITY(dense_zero2_dp2, dense, 2, 2, 1, 2)
PARITY(dense_zero2_dp4, dense, 2, 4, 1, 1)
PARITY(dense_zero3_dp2, dense, 3, 2, 1, 2)
PARITY(dense_zero3_dp4, dense, 3, 4, 1, 1)
PARITY(dense_zero3_dp3_padded, dense, 3, 3, 1, 1)
PARITY(dense_hsdp_2x2, dense, 3, 2, 2, 1)
PARITY(dense_ddp_hsdp_2x2, dense, 0, 2, 2, 1)
PARITY(dense_zero1_hsdp_2x2, dense, 1, 2, 2, 1)
PARITY(moe_ddp2, moe, 0, 2, 1, 2)
PARITY(moe_ddp4, moe, 0, 4, 1, 1)
PARITY(moe_zero1_dp2, moe, 1, 2, 1, 2)
PARITY(moe_zero1_dp4, moe, 1, 4, 1, 1)
PARITY(moe_zero2_dp2, moe, 2, 2, 1, 2)
PARITY(moe_zero2_dp4, moe, 2, 4, 1, 1)
PARITY(moe_zero3_dp2, moe, 3, 2, 1, 2)
PARITY(moe_zero3_dp4, moe, 3, 4, 1, 1)
PARITY(moe_hsdp_2x2, moe, 2, 2, 2, 1)

/* tp 2 inside each of 2 dp ranks: the norm counts replicated tensors once. */
static void tp_case(struct mr_gpt_config mc, int zero)
{
	struct run *r = run_of(mc, 2, 1, 2, (struct mr_dp_config){ .zero = zero, .overlap = 1 });

	r->tp = 2;
	parity(r);
}

Test(dp, dense_tp2_ddp2) { tp_case(dense(), 0); }
Test(dp, dense_tp2_zero1_dp2) { tp_case(dense(), 1); }
Test(dp, moe_tp2_zero3_dp2) { tp_case(moe(), 3); }

/* Memory by category, zero 1/2/3 over 4 ranks (and 3: padding). */
static void mem_case(int zero, int S)
{
	struct run *r = run_of(dense(), S, 1, 1,
			       (struct mr_dp_config){ .zero = zero, .overlap = 1 });

	r->steps = 2;
	r->check_mem = 1;
	openblas_set_num_threads(1);
	cr_assert_eq(run_threads_t(S, HOSTS_SAME, 30000, dp_rank, r), 0, "memory mismatch");
}

Test(dp, memory_zero1) { mem_case(1, 4); }
Test(dp, memory_zero2) { mem_case(2, 4); }
Test(dp, memory_zero3) { mem_case(3, 4); }
Test(dp, memory_zero3_padded) { mem_case(3, 3); }

/* Collectives per step with accum 3: only the final micro-batch reduces
 * (DDP, ZeRO-1); ZeRO-2 reduces every micro-batch. Also checks parity. */
static void colls_case(int zero, size_t bucket, int overlap, long want_per_unit, long fixed)
{
	struct run *r = run_of(dense(), 2, 1, 3,
			       (struct mr_dp_config){ .zero = zero, .overlap = overlap,
						      .bucket_bytes = bucket });

	r->steps = 4;
	/* units: embeddings, two per layer, final LayerNorm */
	r->want_colls = want_per_unit * (2 * dense().n_layer + 2) + fixed;
	parity(r);
}

Test(dp, ddp_bucket_per_unit_final_only) { colls_case(0, 1, 1, 1, 0); }
Test(dp, ddp_one_bucket) { colls_case(0, (size_t)1 << 30, 1, 0, 1); }
Test(dp, ddp_no_overlap) { colls_case(0, 1, 0, 0, 1); }
Test(dp, zero1_final_only) { colls_case(1, 0, 1, 1, 0); }
Test(dp, zero2_every_micro_batch) { colls_case(2, 0, 1, 3, 0); }

Test(dp, bad_zero_rejected)
{
	struct mr_gpt m = { 0 };
	struct mr_dp *d = (struct mr_dp *)1;
	struct mr_errbuf eb = { { 0 }, { 0 } };
	struct mr_gpt_config c = dense();
	struct mr_dp_config dc = { .zero = 4 };
	int bad[] = { 4, -1, 7 }, i;

	cr_assert_eq(mr_gpt_create(&m, &c, 2, 16, NULL, &eb), 0);
	for (i = 0; i < 3; i++) {
		dc.zero = bad[i];
		memset(&eb, 0, sizeof(eb));
		cr_assert_eq(mr_dp_create(&d, &m, &OC, &dc, NULL, SEED, &eb), MR_EINVAL);
		cr_assert_str_eq(eb.field, "zero");
		cr_assert_null(d);
	}
	/* a model with its own params cannot be used for zero 3 */
	dc.zero = 3;
	memset(&eb, 0, sizeof(eb));
	cr_assert_eq(mr_dp_create(&d, &m, &OC, &dc, NULL, SEED, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "ext_params");
	mr_gpt_release(&m);
}

/* overlap = 0 (one reduction after backward) gives the same step. */
static void no_overlap_case(int zero)
{
	parity(run_of(moe(), 2, 1, 2, (struct mr_dp_config){ .zero = zero, .overlap = 0 }));
}

Test(dp, zero1_no_overlap) { no_overlap_case(1); }
Test(dp, zero2_no_overlap) { no_overlap_case(2); }
Test(dp, zero3_no_overlap) { no_overlap_case(3); }

/* A diverging run (absurd lr): every rank fails the same step with
 * MR_ENONFINITE and a message naming the step and a tensor. */
Test(dp, nonfinite_loss_reported_by_every_rank)
{
	struct run *r = run_of(dense(), 2, 1, 1, (struct mr_dp_config){ .zero = 3, .overlap = 1 });
	int k;

	r->steps = 4;
	r->lr = 1e30f;
	openblas_set_num_threads(1);
	cr_assert_eq(run_threads_t(2, HOSTS_SAME, 30000, dp_rank, r), 0);
	for (k = 0; k < 2; k++) {
		cr_assert_eq(r->nonfinite_rc[k], MR_ENONFINITE, "rank %d: %d %s", k,
			     r->nonfinite_rc[k], r->nonfinite_msg[k]);
		cr_assert(strstr(r->nonfinite_msg[k], "at step 1: first non-finite tensor '"),
			  "rank %d: %s", k, r->nonfinite_msg[k]);
	}
	cr_assert_str_eq(r->nonfinite_msg[0], r->nonfinite_msg[1]);
}
