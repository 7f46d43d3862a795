/*
 * test_cp.c - context parallelism's pieces (runtime/layers/mr_cp.h) on
 * their own, next to the end-to-end parity jobs of tests/parity:
 *   - the load-balanced layout: chunk k of rank r at mr_cp_pos0, every
 *     position held by exactly one rank, every rank the same causal work
 *     (the reason for the layout), mr_cp_select picking those tokens;
 *   - one attention layer split over cp ranks (threads with real host
 *     communicators), forward and backward, for ring, all-gather and
 *     Ulysses, multi-head and grouped-query: each rank's output rows and
 *     q|k|v gradient rows must equal the rows of the same positions of
 *     one device's plain causal attention over the whole sequence (the
 *     device's attn_fwd / attn_bwd, themselves checked against a naive
 *     reference in tests/kernels/test_attention.c). Ring and all-gather
 *     sum partial blocks merged by log-sum-exp, Ulysses moves heads over
 *     all-to-alls: a wrong block, merge, position or exchange layout
 *     moves rows far beyond the tolerance (float sums in another order:
 *     1e-5 relative);
 *   - the refusals: a sequence 2 * cp does not divide, and Ulysses with
 *     heads cp does not divide, named by their keys.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/harness.h"
#include "core/mr_rng.h"
#include "layers/mr_cp.h"
#include "parity.h"

#define B 2
#define T 16
#define HS 8
#define NHMAX 4
#define CPMAX 4

/* One layer's case: query heads, key/value heads, cp ranks, algorithm. */
struct run {
	int nh, nkv, cp, algo;
	size_t row;                 /* a q|k|v row: C + 2 * NKV * HS */
	float *qkv, *dout;          /* (B, T, row), (B, T, C): the whole sequence */
	float *out_ref, *dqkv_ref;  /* one device, whole sequence */
	float *out[CPMAX], *dqkv[CPMAX]; /* each cp rank's local rows */
};

static float *randv(struct mr_rng *g, size_t n)
{
	float *p = malloc(n * sizeof(float));

	cr_assert_not_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (float)mr_rng_normal(g);
	return p;
}

/* The sequence position of local row t of cp rank r. */
static int position(int cp, int r, int t)
{
	int Tc = T / (2 * cp);

	return mr_cp_pos0(cp, Tc, r, t / Tc) + t % Tc;
}

/* Local rows (B, T/cp, w) of rank r from whole rows (B, T, w), or back. */
static void rows(const struct run *R, int r, float *local, float *whole, size_t w, int to_whole)
{
	int Tl = T / R->cp;

	for (int b = 0; b < B; b++)
		for (int t = 0; t < Tl; t++) {
			float *l = local + ((size_t)b * Tl + t) * w;
			float *g = whole + ((size_t)b * T + position(R->cp, r, t)) * w;
			memcpy(to_whole ? g : l, to_whole ? l : g, w * sizeof(float));
		}
}

static int cp_rank(struct mr_comm *world, void *arg)
{
	struct run *R = arg;
	int me = mr_comm_rank(world), C = R->nh * HS, Tl = T / R->cp, rc;
	struct mr_errbuf eb = { "", "" };
	struct mr_mem mem = { { 0 }, { 0 } };
	struct mr_dev d = { 0 };
	struct mr_cp cp;
	float *qkv = malloc((size_t)B * Tl * R->row * sizeof(float));
	float *dout = malloc((size_t)B * Tl * C * sizeof(float));
	float *lse = malloc((size_t)B * R->nh * T * sizeof(float)); /* ulysses' is the largest */

	if (!qkv || !dout || !lse) {
		free(qkv);
		free(dout);
		free(lse);
		return MR_ENOMEM;
	}
	rows(R, me, qkv, R->qkv, R->row, 0);
	rows(R, me, dout, R->dout, (size_t)C, 0);
	memset(&cp, 0, sizeof(cp));
	if ((rc = mr_dev_open(&d, "cpu", 0, "fp32", NULL, &eb)) == 0)
		rc = mr_cp_create(&cp, world, &d, &mem, R->algo, B, T, C, R->nh, R->nkv, &eb);
	if (rc < 0)
		fprintf(stderr, "rank %d: %s\n", me, eb.msg);
	if (rc >= 0)
		rc = mr_cp_attn_fwd(&cp, (mr_act *)R->out[me], lse, (const mr_act *)qkv);
	if (rc >= 0)
		rc = mr_cp_attn_bwd(&cp, (mr_act *)R->dqkv[me], (const mr_act *)dout,
				    (const mr_act *)qkv, (const mr_act *)R->out[me], lse);
	if (cp.dev)
		mr_cp_release(&cp);
	if (d.ops)
		mr_dev_close(&d);
	free(qkv);
	free(dout);
	free(lse);
	return rc < 0 ? rc : 0;
}

/* The whole sequence on one device: out_ref and dqkv_ref. */
static void reference(struct run *R)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_dev d;
	int C = R->nh * HS;
	float *lse = calloc((size_t)B * R->nh * T, sizeof(float));
	void *ws;

	cr_assert_eq(mr_dev_open(&d, "cpu", 0, "fp32", NULL, &eb), 0, "%s", eb.msg);
	ws = calloc(1, d.ops->ws_bytes(&d, T, C, R->nh) + 64);
	cr_assert(lse && ws);
	cr_assert_eq(d.ops->attn_fwd(&d, (mr_act *)R->out_ref, lse, (const mr_act *)R->qkv, B, T,
				     C, R->nh, R->nkv, ws), 0);
	cr_assert_eq(d.ops->attn_bwd(&d, (mr_act *)R->dqkv_ref, (const mr_act *)R->dout,
				     (const mr_act *)R->qkv, (const mr_act *)R->out_ref, lse, B, T,
				     C, R->nh, R->nkv, ws), 0);
	mr_dev_close(&d);
	free(lse);
	free(ws);
}

static void check(int nh, int nkv, int cp, int algo)
{
	struct run R = { .nh = nh, .nkv = nkv, .cp = cp, .algo = algo };
	int C = nh * HS, Tl = T / cp;
	struct mr_rng g;
	float *got_out, *got_dqkv;

	R.row = (size_t)C + 2 * (size_t)nkv * HS;
	mr_rng_seed(&g, 7, (uint64_t)(nh * 100 + nkv * 10 + cp));
	R.qkv = randv(&g, (size_t)B * T * R.row);
	R.dout = randv(&g, (size_t)B * T * C);
	R.out_ref = calloc((size_t)B * T * C, sizeof(float));
	R.dqkv_ref = calloc((size_t)B * T * R.row, sizeof(float));
	got_out = calloc((size_t)B * T * C, sizeof(float));
	got_dqkv = calloc((size_t)B * T * R.row, sizeof(float));
	cr_assert(R.out_ref && R.dqkv_ref && got_out && got_dqkv);
	for (int r = 0; r < cp; r++) {
		R.out[r] = calloc((size_t)B * Tl * C, sizeof(float));
		R.dqkv[r] = calloc((size_t)B * Tl * R.row, sizeof(float));
		cr_assert(R.out[r] && R.dqkv[r]);
	}
	reference(&R);
	cr_assert_eq(run_threads(cp, HOSTS_SAME, cp_rank, &R), 0, "a cp rank failed");
	/* every rank's rows put back at their positions cover the sequence */
	for (int r = 0; r < cp; r++) {
		rows(&R, r, R.out[r], got_out, (size_t)C, 1);
		rows(&R, r, R.dqkv[r], got_dqkv, R.row, 1);
	}
	double eo = mr_test_rel_l2(got_out, R.out_ref, (size_t)B * T * C);
	double eg = mr_test_rel_l2(got_dqkv, R.dqkv_ref, (size_t)B * T * R.row);
	cr_expect(eo <= 1e-5, "nh %d nkv %d cp %d algo %d: out differs by %.3g", nh, nkv, cp, algo,
		  eo);
	cr_expect(eg <= 1e-5, "nh %d nkv %d cp %d algo %d: dqkv differs by %.3g", nh, nkv, cp,
		  algo, eg);
	for (int r = 0; r < cp; r++) {
		free(R.out[r]);
		free(R.dqkv[r]);
	}
	free(R.qkv);
	free(R.dout);
	free(R.out_ref);
	free(R.dqkv_ref);
	free(got_out);
	free(got_dqkv);
}

Test(cp_layout, every_position_once_and_equal_causal_work)
{
	for (int cp = 1; cp <= CPMAX; cp *= 2) {
		int held[T] = { 0 };
		long work[CPMAX] = { 0 };
		int full[B * T], local[B * T];

		for (int i = 0; i < B * T; i++)
			full[i] = 1000 + i;
		for (int r = 0; r < cp; r++) {
			mr_cp_select(cp, r, full, B, T, local);
			for (int t = 0; t < T / cp; t++) {
				int p = position(cp, r, t);
				cr_assert(p >= 0 && p < T, "cp %d rank %d row %d: position %d", cp, r,
					  t, p);
				held[p]++;
				work[r] += p + 1; /* the keys a causal query sees */
				for (int b = 0; b < B; b++)
					cr_expect_eq(local[b * (T / cp) + t], full[b * T + p],
						     "cp %d rank %d: row %d is not position %d", cp,
						     r, t, p);
			}
		}
		for (int p = 0; p < T; p++)
			cr_expect_eq(held[p], 1, "cp %d: position %d held %d times", cp, p, held[p]);
		for (int r = 1; r < cp; r++)
			cr_expect_eq(work[r], work[0], "cp %d: rank %d's causal work %ld vs %ld", cp,
				     r, work[r], work[0]);
	}
	/* rank 0 of 2 holds the first and the last chunk */
	cr_expect_eq(mr_cp_pos0(2, 4, 0, 0), 0);
	cr_expect_eq(mr_cp_pos0(2, 4, 0, 1), 12);
	cr_expect_eq(mr_cp_pos0(2, 4, 1, 0), 4);
	cr_expect_eq(mr_cp_pos0(2, 4, 1, 1), 8);
}

Test(cp_attention, ring_equals_one_device)
{
	check(4, 4, 2, MR_CP_RING);
	check(4, 4, 4, MR_CP_RING);
	check(4, 2, 2, MR_CP_RING);
	check(4, 1, 4, MR_CP_RING);
}

Test(cp_attention, allgather_equals_one_device)
{
	check(4, 4, 2, MR_CP_ALLGATHER);
	check(4, 4, 4, MR_CP_ALLGATHER);
	check(4, 2, 4, MR_CP_ALLGATHER);
}

Test(cp_attention, ulysses_equals_one_device)
{
	check(4, 4, 2, MR_CP_ULYSSES);
	check(4, 4, 4, MR_CP_ULYSSES);
	check(4, 2, 2, MR_CP_ULYSSES);
}

/* mr_cp_create's refusals, on one rank's view of a cp group of 4 */
struct refusal {
	int algo, t, nh, nkv;
	const char *key;
	int seen;
};

static int refuse_rank(struct mr_comm *world, void *arg)
{
	struct refusal *f = arg;
	struct mr_errbuf eb = { "", "" };
	struct mr_mem mem = { { 0 }, { 0 } };
	struct mr_dev d;
	struct mr_cp cp;
	int rc;

	if ((rc = mr_dev_open(&d, "cpu", 0, "fp32", NULL, &eb)) < 0)
		return rc;
	rc = mr_cp_create(&cp, world, &d, &mem, f->algo, B, f->t, f->nh * HS, f->nh, f->nkv, &eb);
	if (rc >= 0)
		mr_cp_release(&cp);
	else if (mr_comm_rank(world) == 0 && strstr(eb.msg, f->key))
		f->seen = 1;
	else if (mr_comm_rank(world) == 0)
		fprintf(stderr, "refusal without %s: %s\n", f->key, eb.msg);
	mr_dev_close(&d);
	return rc < 0 ? 0 : -1; /* creating is the failure here */
}

Test(cp_attention, refusals_name_their_keys)
{
	struct refusal cases[] = {
		{ MR_CP_RING, 12, 4, 4, "seq_len", 0 },     /* 2 * 4 does not divide 12 */
		{ MR_CP_ULYSSES, 16, 2, 2, "n_head", 0 },   /* 4 does not divide 2 heads */
		{ MR_CP_ULYSSES, 16, 4, 2, "n_kv_head", 0 }, /* nor 2 key/value heads */
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		cr_expect_eq(run_threads(4, HOSTS_SAME, refuse_rank, &cases[i]), 0,
			     "case %zu was created", i);
		cr_expect(cases[i].seen, "case %zu: no error naming %s", i, cases[i].key);
	}
}
