/*
 * test_ep.c - expert parallelism's exchange (runtime/layers/mr_ep.h)
 * against one rank: ep ranks are threads with real host communicators,
 * each routing its own micro-batch through one MoE layer whose experts are
 * sharded E / ep per rank, forward and backward.
 *
 * The reference is one rank running every rank's micro-batch in turn with
 * all E experts, accumulating the expert gradients (what the single-rank
 * job with gradient accumulation does). Each ep rank must get:
 *   - the aux loss and the drops of its micro-batch bit for bit (routing
 *     happens before any exchange);
 *   - its tokens' outputs y, input gradients dx and router gradients, and
 *     its experts' gradients within relative L2 1e-6: an expert's GEMM runs
 *     over every rank's rows at once, and OpenBLAS rounds a row's dot
 *     products differently in a GEMM of other M (1.5e-7 measured); the
 *     reference adds one micro-batch's expert gradients after the other;
 * with the capacity policy (drops by position, per source micro-batch)
 * and the dropless one (cap = N), at ep 2 and 4.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../comm/harness.h"
#include "core/mr_rng.h"
#include "layers/mr_ep.h"
#include "parity.h"

#define NMAX 4
#define N 32  /* tokens per micro-batch */
#define C 16
#define H 64
#define E 8
#define K 2

struct layer {
	float *routerw, *fcw, *fcb, *projw, *projb;
};

static const size_t nw[5] = { (size_t)E * C, (size_t)E * H * C, (size_t)E * H,
			      (size_t)E * C * H, (size_t)E * C };

struct out {
	float y[N * C], dx[N * C], drouter[E * C], aux;
	float *dexp[4]; /* this rank's experts' fc.w, fc.b, proj.w, proj.b grads */
	int dropped;
};

struct run {
	int n, dropless;
	struct layer w;
	float x[NMAX][N * C], dy[NMAX][N * C];
	struct out got[NMAX], ref[NMAX];
	float *dexp_ref[4]; /* every expert, accumulated over the micro-batches */
};

static float *rnd(struct mr_rng *g, size_t n, float scale)
{
	float *p = malloc(n * sizeof(float));

	for (size_t i = 0; i < n; i++)
		p[i] = scale * (float)mr_rng_normal(g);
	return p;
}

static struct mr_moe_shape shape(int dropless)
{
	struct mr_moe_shape s = { N, C, H, E, K, 0, 0, 0, dropless };

	s.cap = dropless ? N : mr_moe_capacity(N, E, K, 1.0f);
	return s;
}

/* One micro-batch through the layer: experts [e0, e0 + ne) of w, the
 * expert gradients added to dexp (ne experts). */
static int layer_pass(const struct mr_moe_shape *s, const struct mr_moe_xchg *xg,
		      const struct layer *w, int e0, const float *x, const float *dy,
		      struct out *o, float *const dexp[4])
{
	float *f = calloc(mr_moe_act_floats(s), sizeof(float));
	int *ib = calloc(mr_moe_act_ints(s), sizeof(int));
	float *ws = calloc(mr_moe_ws_floats(s), sizeof(float));
	/* an expert's view can hold E * cap rows (dropless ep4: 4 N) */
	float ones[E * N];
	struct mr_moe_acts a;
	int rc, i;

	for (i = 0; i < E * N; i++)
		ones[i] = 1.0f;
	mr_moe_acts_bind(&a, s, f, ib);
	memset(o->drouter, 0, sizeof(o->drouter));
	rc = mr_moe_fwd(NULL, s, &a, xg, o->y, x, w->routerw, w->fcw + (size_t)e0 * H * C,
			w->fcb + (size_t)e0 * H, w->projw + (size_t)e0 * C * H,
			w->projb + (size_t)e0 * C);
	if (rc == 0)
		rc = mr_moe_bwd(NULL, s, &a, xg, o->dx, dy, x, w->routerw,
				w->fcw + (size_t)e0 * H * C, w->projw + (size_t)e0 * C * H,
				o->drouter, dexp[0], dexp[1], dexp[2], dexp[3], 0.01f, ws, ones);
	o->aux = a.aux;
	o->dropped = a.dropped;
	free(f);
	free(ib);
	free(ws);
	return rc;
}

static int ep_rank(struct mr_comm *world, void *arg)
{
	struct run *R = arg;
	int me = mr_comm_rank(world), rc;
	struct mr_moe_shape s = shape(R->dropless);
	struct mr_moe_xchg xg = { 0 };
	struct mr_errbuf eb = { "", "" };
	struct mr_mem mem = { { 0 }, { 0 } };
	struct mr_dev d;
	struct mr_ep ep;

	if ((rc = mr_dev_open(&d, "cpu", 0, "fp32", NULL, &eb)) < 0)
		return fprintf(stderr, "rank %d: %s\n", me, eb.msg), rc;
	if ((rc = mr_ep_create(&ep, world, &d, &mem, E, &eb)) < 0)
		return fprintf(stderr, "rank %d: %s\n", me, eb.msg), rc;
	mr_ep_bind(&ep, &xg);
	rc = layer_pass(&s, &xg, &R->w, mr_ep_first_expert(&ep, me), R->x[me], R->dy[me],
			&R->got[me], R->got[me].dexp);
	mr_ep_release(&ep);
	mr_dev_close(&d);
	return rc;
}

static void check(int n, int dropless)
{
	static struct run R;
	struct mr_moe_shape s = shape(dropless);
	struct mr_rng g;
	int r, k, El = E / n, drops = 0;

	memset(&R, 0, sizeof(R));
	R.n = n;
	R.dropless = dropless;
	mr_rng_seed(&g, 42, 0);
	R.w = (struct layer){ rnd(&g, nw[0], 0.3f), rnd(&g, nw[1], 0.1f), rnd(&g, nw[2], 0.1f),
			      rnd(&g, nw[3], 0.1f), rnd(&g, nw[4], 0.1f) };
	for (r = 0; r < n; r++) {
		float *x = rnd(&g, N * C, 1.0f), *dy = rnd(&g, N * C, 1.0f);
		memcpy(R.x[r], x, sizeof(R.x[r]));
		memcpy(R.dy[r], dy, sizeof(R.dy[r]));
		free(x);
		free(dy);
	}
	for (k = 0; k < 4; k++) {
		R.dexp_ref[k] = calloc(nw[k + 1], sizeof(float));
		for (r = 0; r < n; r++)
			R.got[r].dexp[k] = calloc(nw[k + 1] / (size_t)n, sizeof(float));
	}
	/* one rank, every micro-batch in turn */
	for (r = 0; r < n; r++)
		cr_assert_eq(layer_pass(&s, NULL, &R.w, 0, R.x[r], R.dy[r], &R.ref[r], R.dexp_ref),
			     0);
	cr_assert_eq(run_threads(n, HOSTS_SAME, ep_rank, &R), 0, "an ep rank failed");
	for (r = 0; r < n; r++) {
		struct out *o = &R.got[r], *w = &R.ref[r];
		drops += w->dropped;
		cr_expect(mr_test_rel_l2(o->y, w->y, N * C) <= 1e-6, "rank %d: y differs by %.3g", r,
			  mr_test_rel_l2(o->y, w->y, N * C));
		cr_expect(mr_test_rel_l2(o->dx, w->dx, N * C) <= 1e-6, "rank %d: dx differs by %.3g", r,
			  mr_test_rel_l2(o->dx, w->dx, N * C));
		cr_expect(mr_test_rel_l2(o->drouter, w->drouter, E * C) <= 1e-6,
			  "rank %d: router gradient differs by %.3g", r,
			  mr_test_rel_l2(o->drouter, w->drouter, E * C));
		cr_expect_eq(o->aux, w->aux, "rank %d: aux %g vs %g", r, (double)o->aux,
			     (double)w->aux);
		cr_expect_eq(o->dropped, w->dropped, "rank %d: dropped %d vs %d", r, o->dropped,
			     w->dropped);
		for (k = 0; k < 4; k++) {
			size_t per = nw[k + 1] / E;
			double e = mr_test_rel_l2(o->dexp[k], R.dexp_ref[k] + (size_t)r * El * per,
					  (size_t)El * per);
			cr_expect(e <= 1e-6, "rank %d: expert gradient %d differs by %.3g", r, k,
				  e);
			free(o->dexp[k]);
		}
	}
	if (dropless)
		cr_expect_eq(drops, 0, "dropless dropped %d assignments", drops);
	else
		cr_expect_gt(drops, 0, "capacity 1.0 should drop some assignments here");
	for (k = 0; k < 4; k++)
		free(R.dexp_ref[k]);
	free(R.w.routerw);
	free(R.w.fcw);
	free(R.w.fcb);
	free(R.w.projw);
	free(R.w.projb);
}

// cppcheck-suppress unknownMacro
Test(ep, ep2_capacity) { check(2, 0); }
Test(ep, ep2_dropless) { check(2, 1); }
Test(ep, ep4_capacity) { check(4, 0); }
Test(ep, ep4_dropless) { check(4, 1); }

Test(ep, experts_not_divisible_names_ep)
{
	struct mr_errbuf eb = { "", "" };
	struct mr_ep ep;

	cr_assert_lt(mr_ep_create(&ep, NULL, NULL, NULL, 0, &eb), 0);
	cr_expect(strstr(eb.msg, "n_experts") != NULL, "%s", eb.msg);
}
