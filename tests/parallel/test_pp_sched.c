/*
 * test_pp_sched.c - the pipeline schedules as data (parallel/mr_pp_sched.h)
 * and the layer split (parallel/mr_pp_split.h), without compute or
 * communication.
 *
 * Orders: small cases written out by hand from each schedule's
 * definition, compared action by action. Properties over p 1..8, m 1..16,
 * v 1..3 (every valid combination): every pass once, no deadlock in the
 * simulator, the bubble formulas (gpipe/1f1b (p-1)/m for any F, B;
 * interleaved (p-1)/(v*m); zb-h1 (p-1)*max(F+B-W, F, B)/(m*(F+B+W)) for
 * m >= p), the in-flight activations per stage, and that every receive
 * is matched by a send which the simulator finishes before the receiver
 * starts. The split: the cost model's numbers, balanced cuts against a
 * brute force over every cut, explicit splits accepted and rejected
 * naming "pp_layers".
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/mr_gpt.h"
#include "parallel/mr_pp_sched.h"
#include "parallel/mr_pp_split.h"

#define MAXN 256 /* actions in any list these tests build */

/* "F0 B1 W2" (v = 1) or "F0.1" (micro-batch 0 on chunk 1) into a. */
static int parse(const char *s, struct mr_pp_action *a)
{
	int n = 0;

	while (*s) {
		char *end;

		if (*s == ' ') {
			s++;
			continue;
		}
		cr_assert(strchr("FBW", *s), "bad expected list near '%s'", s);
		a[n].op = *s == 'F' ? MR_PP_F : *s == 'B' ? MR_PP_B : MR_PP_W;
		a[n].mb = (int)strtol(s + 1, &end, 10);
		a[n].chunk = *end == '.' ? (int)strtol(end + 1, &end, 10) : 0;
		s = end;
		n++;
	}
	return n;
}

static void format(const struct mr_pp_action *a, int n, int v, char *buf, size_t size)
{
	size_t len = 0;

	buf[0] = '\0';
	for (int i = 0; i < n && len < size; i++) {
		if (v > 1)
			len += (size_t)snprintf(buf + len, size - len, "%s%c%d.%d", i ? " " : "",
						"FBW"[a[i].op], a[i].mb, a[i].chunk);
		else
			len += (size_t)snprintf(buf + len, size - len, "%s%c%d", i ? " " : "",
						"FBW"[a[i].op], a[i].mb);
	}
}

static void expect_order(enum mr_pp_kind kind, int p, int m, int v, int stage, const char *want)
{
	struct mr_pp_spec sp = { .kind = kind, .p = p, .m = m, .v = v };
	struct mr_pp_action got[MAXN], exp[MAXN];
	struct mr_errbuf eb = { 0 };
	char gs[2048], es[2048];
	int n = mr_pp_actions(&sp, stage, got, MAXN, &eb), ne = parse(want, exp);

	cr_assert_geq(n, 0, "%s", eb.msg);
	format(got, n, v, gs, sizeof(gs));
	format(exp, ne, v, es, sizeof(es));
	cr_assert(n == ne && !memcmp(got, exp, (size_t)n * sizeof(*got)),
		  "%s p=%d m=%d v=%d stage %d:\n  got  %s\n  want %s", mr_pp_kind_name(kind), p, m,
		  v, stage, gs, es);
	cr_assert_eq(mr_pp_len(&sp, NULL), n);
}

/* ---- orders written out by hand ----------------------------------------- */

Test(pp_sched, gpipe_order)
{
	/* all forwards, then all backwards, in micro-batch order; every stage */
	expect_order(MR_PP_GPIPE, 2, 3, 1, 0, "F0 F1 F2 B0 B1 B2");
	expect_order(MR_PP_GPIPE, 2, 3, 1, 1, "F0 F1 F2 B0 B1 B2");
}

Test(pp_sched, one_f_one_b_order)
{
	/* p = 3: stage s warms up with p-s-1 forwards, then F(next) B(oldest)
	 * pairs, then the backwards left */
	expect_order(MR_PP_1F1B, 3, 4, 1, 0, "F0 F1 F2 B0 F3 B1 B2 B3");
	expect_order(MR_PP_1F1B, 3, 4, 1, 1, "F0 F1 B0 F2 B1 F3 B2 B3");
	expect_order(MR_PP_1F1B, 3, 4, 1, 2, "F0 B0 F1 B1 F2 B2 F3 B3");
	/* m < p: the warm-up is capped at m */
	expect_order(MR_PP_1F1B, 4, 2, 1, 0, "F0 F1 B0 B1");
	expect_order(MR_PP_1F1B, 4, 2, 1, 2, "F0 F1 B0 B1");
	expect_order(MR_PP_1F1B, 4, 2, 1, 3, "F0 B0 F1 B1");
}

Test(pp_sched, interleaved_order)
{
	/* Megatron-Core, p = 2, v = 2, m = 4: 8 passes each way. Forward pass k
	 * runs micro-batch (k/4)*2 + k%2 on chunk (k%4)/2: F0.0 F1.0 F0.1 F1.1
	 * F2.0 F3.0 F2.1 F3.1; backward pass k the same micro-batch on chunk
	 * 1-(k%4)/2: B0.1 B1.1 B0.0 B1.0 B2.1 B3.1 B2.0 B3.0. Warm-up
	 * 2*(p-s-1) + (v-1)*p: 4 forwards on stage 0, 2 on stage 1; then
	 * forward k+warm-up with backward k; then the backwards left. */
	expect_order(MR_PP_INTERLEAVED, 2, 4, 2, 0,
		     "F0.0 F1.0 F0.1 F1.1 "
		     "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
		     "B2.1 B3.1 B2.0 B3.0");
	expect_order(MR_PP_INTERLEAVED, 2, 4, 2, 1,
		     "F0.0 F1.0 "
		     "F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 "
		     "B2.0 B3.0");
}

Test(pp_sched, zb_h1_order)
{
	/* 1F1B's F and B (p = 3, m = 4 above); stage s puts W of micro-batch j
	 * right after B of j+s, the W's with no such B at the end (paper's
	 * figure 3: stage 0 "F F F B W F B W ...", the last stage defers its
	 * W's the longest) */
	expect_order(MR_PP_ZBH1, 3, 4, 1, 0, "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3");
	expect_order(MR_PP_ZBH1, 3, 4, 1, 1, "F0 F1 B0 F2 B1 W0 F3 B2 W1 B3 W2 W3");
	expect_order(MR_PP_ZBH1, 3, 4, 1, 2, "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3");
}

/* ---- names and checks ----------------------------------------------------- */

static void expect_bad(enum mr_pp_kind kind, int p, int m, int v, const char *field)
{
	struct mr_pp_spec sp = { .kind = kind, .p = p, .m = m, .v = v };
	struct mr_errbuf eb = { 0 };
	struct mr_pp_action a[8];

	cr_assert_eq(mr_pp_check(&sp, &eb), MR_EINVAL, "%s p=%d m=%d v=%d accepted",
		     mr_pp_kind_name(kind), p, m, v);
	cr_assert_str_eq(eb.field, field, "%s p=%d m=%d v=%d: field '%s' (%s), want '%s'",
			 mr_pp_kind_name(kind), p, m, v, eb.field, eb.msg, field);
	cr_assert(strstr(eb.msg, field), "message '%s' does not name '%s'", eb.msg, field);
	cr_assert_eq(mr_pp_len(&sp, NULL), MR_EINVAL);
	cr_assert_eq(mr_pp_actions(&sp, 0, a, 8, NULL), MR_EINVAL);
}

Test(pp_sched, names)
{
	static const char *const names[] = { "gpipe", "1f1b", "interleaved", "zb-h1" };
	struct mr_errbuf eb = { 0 };
	enum mr_pp_kind k;

	for (int i = 0; i < 4; i++) {
		cr_assert_eq(mr_pp_kind_parse(names[i], &k, NULL), 0);
		cr_assert_eq((int)k, i);
		cr_assert_str_eq(mr_pp_kind_name(k), names[i]);
	}
	cr_assert_eq(mr_pp_kind_parse("zb-h2", &k, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "pp_schedule");
	cr_assert(strstr(eb.msg, "zb-h2") && strstr(eb.msg, "interleaved"), "%s", eb.msg);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_pp_kind_parse(NULL, &k, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "pp_schedule");
}

Test(pp_sched, rejects_impossible)
{
	expect_bad(MR_PP_1F1B, 0, 4, 1, "pp");
	expect_bad(MR_PP_1F1B, MR_PP_MAX_STAGES + 1, 4, 1, "pp");
	expect_bad(MR_PP_GPIPE, 2, 0, 1, "grad_accum");
	expect_bad(MR_PP_ZBH1, 2, MR_PP_MAX_MICRO + 1, 1, "grad_accum");
	expect_bad(MR_PP_GPIPE, 2, 4, 2, "pp_virtual");
	expect_bad(MR_PP_1F1B, 2, 4, 0, "pp_virtual");
	expect_bad(MR_PP_ZBH1, 2, 4, 2, "pp_virtual");
	expect_bad(MR_PP_INTERLEAVED, 2, 4, 1, "pp_virtual");
	expect_bad(MR_PP_INTERLEAVED, 1, 4, 2, "pp_virtual");
	expect_bad(MR_PP_INTERLEAVED, 2, 4, MR_PP_MAX_VIRTUAL + 1, "pp_virtual");
	expect_bad(MR_PP_INTERLEAVED, 128, 128, 64, "pp_virtual"); /* 8192 virtual stages */
	expect_bad(MR_PP_INTERLEAVED, 4, 6, 2, "grad_accum");
	expect_bad(MR_PP_INTERLEAVED, 4, 2, 2, "grad_accum");
	expect_bad((enum mr_pp_kind)7, 2, 4, 1, "pp_schedule");
}

Test(pp_sched, bad_stage_and_room)
{
	struct mr_pp_spec sp = { .kind = MR_PP_ZBH1, .p = 3, .m = 4, .v = 1 };
	struct mr_pp_action a[12];
	struct mr_errbuf eb = { 0 };

	cr_assert_eq(mr_pp_actions(&sp, 3, a, 12, &eb), MR_EINVAL);
	cr_assert_eq(mr_pp_actions(&sp, -1, a, 12, NULL), MR_EINVAL);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_pp_actions(&sp, 0, a, 11, &eb), MR_ERANGE);
	cr_assert(strstr(eb.msg, "12"), "%s", eb.msg);
	cr_assert_eq(mr_pp_actions(&sp, 0, a, 12, NULL), 12);
}

/* ---- properties over every valid (kind, p, m, v) ------------------------- */

/* Calls fn for every valid spec with p 1..8, m 1..16, v 1..3. */
static void each_spec(void (*fn)(const struct mr_pp_spec *sp, void *arg), void *arg)
{
	for (int k = 0; k < MR_PP__KIND_COUNT; k++)
		for (int p = 1; p <= 8; p++)
			for (int m = 1; m <= 16; m++)
				for (int v = 1; v <= 3; v++) {
					struct mr_pp_spec sp = { .kind = (enum mr_pp_kind)k,
								 .p = p, .m = m, .v = v };

					if (mr_pp_check(&sp, NULL) == 0)
						fn(&sp, arg);
				}
}

static void every_pass_once(const struct mr_pp_spec *sp, void *arg)
{
	int len = mr_pp_len(sp, NULL), split = sp->kind == MR_PP_ZBH1;
	struct mr_pp_action *a = malloc((size_t)len * sizeof(*a));
	int *pos = malloc((size_t)3 * sp->v * sp->m * sizeof(*pos));

	(*(int *)arg)++;
	cr_assert(a && pos);
	cr_assert_eq(len, (split ? 3 : 2) * sp->m * sp->v);
	for (int s = 0; s < sp->p; s++) {
		int n = mr_pp_actions(sp, s, a, len, NULL);

		cr_assert_eq(n, len);
		for (int i = 0; i < 3 * sp->v * sp->m; i++)
			pos[i] = -1;
		for (int i = 0; i < n; i++) {
			int *at = &pos[(a[i].op * sp->v + a[i].chunk) * sp->m + a[i].mb];

			cr_assert(a[i].op <= MR_PP_W && a[i].mb >= 0 && a[i].mb < sp->m &&
				  a[i].chunk >= 0 && a[i].chunk < sp->v);
			cr_assert(split || a[i].op != MR_PP_W, "%s has a W", mr_pp_kind_name(sp->kind));
			cr_assert_eq(*at, -1, "%s p=%d m=%d v=%d stage %d: action %d twice",
				     mr_pp_kind_name(sp->kind), sp->p, sp->m, sp->v, s, i);
			*at = i;
		}
		for (int c = 0; c < sp->v; c++)
			for (int mb = 0; mb < sp->m; mb++) {
				int f = pos[(MR_PP_F * sp->v + c) * sp->m + mb];
				int b = pos[(MR_PP_B * sp->v + c) * sp->m + mb];
				int w = pos[(MR_PP_W * sp->v + c) * sp->m + mb];

				cr_assert(f >= 0 && b > f, "%s p=%d m=%d v=%d stage %d mb %d chunk %d: "
					  "F at %d, B at %d", mr_pp_kind_name(sp->kind), sp->p, sp->m,
					  sp->v, s, mb, c, f, b);
				cr_assert(!split || w > b, "zb-h1 stage %d mb %d: W at %d, B at %d", s,
					  mb, w, b);
			}
	}
	free(a);
	free(pos);
}

Test(pp_sched, every_pass_once)
{
	int count = 0;

	each_spec(every_pass_once, &count);
	/* gpipe, 1f1b, zb-h1: 8*16; interleaved: v 2..3, p 2..8, m multiple of p */
	cr_assert_eq(count, 3 * 8 * 16 + 2 * (8 + 5 + 4 + 3 + 2 + 2 + 2), "specs %d", count);
}

struct simcase {
	struct mr_pp_cost c;
	int runs;
};

/* The bubble each schedule should have (see the file comment). */
static double bubble_formula(const struct mr_pp_spec *sp, const struct mr_pp_cost *c)
{
	double f = c->f, b = c->b, w = c->w, g = f + b - w;

	if (sp->kind != MR_PP_ZBH1)
		return (sp->p - 1.0) / (sp->v * sp->m);
	if (g < f)
		g = f;
	if (g < b)
		g = b;
	return (sp->p - 1) * g / (sp->m * (f + b + w));
}

static void simulate(const struct mr_pp_spec *sp, void *arg)
{
	struct simcase *sc = arg;
	double busy[8];
	int peak[8], peak_w[8];
	struct mr_pp_sim r = { .busy = busy, .peak = peak, .peak_w = peak_w };
	struct mr_errbuf eb = { 0 };
	const char *kn = mr_pp_kind_name(sp->kind);
	int p = sp->p, m = sp->m, v = sp->v, rc = mr_pp_simulate(sp, &sc->c, &r, &eb);

	sc->runs++;
	cr_assert_eq(rc, 0, "%s p=%d m=%d v=%d: %s", kn, p, m, v, eb.msg);
	for (int s = 0; s < p; s++) {
		int lo = p - s < m ? p - s : m;

		cr_assert(fabs(busy[s] - m * v * (sc->c.f + sc->c.b + sc->c.w)) < 1e-9);
		switch (sp->kind) {
		case MR_PP_GPIPE:
			cr_assert_eq(peak[s], m, "gpipe p=%d m=%d stage %d: peak %d", p, m, s,
				     peak[s]);
			break;
		case MR_PP_1F1B:
		case MR_PP_ZBH1:
			cr_assert_eq(peak[s], lo, "%s p=%d m=%d stage %d: peak %d, want %d", kn, p,
				     m, s, peak[s], lo);
			break;
		case MR_PP_INTERLEAVED: {
			/* Megatron's warm-up plus the first steady forward */
			int want = 2 * (p - s - 1) + (v - 1) * p + 1;

			cr_assert_eq(peak[s], want < m * v ? want : m * v,
				     "interleaved p=%d m=%d v=%d stage %d: peak %d", p, m, v, s,
				     peak[s]);
			break;
		}
		default:
			break;
		}
		/* until W: the paper's in-flight count, min(p, m) on every stage */
		cr_assert_eq(peak_w[s], sp->kind == MR_PP_ZBH1 ? (p < m ? p : m) : peak[s],
			     "%s p=%d m=%d stage %d: peak_w %d", kn, p, m, s, peak_w[s]);
	}
	if (sp->kind != MR_PP_ZBH1 || m >= p) {
		double want = bubble_formula(sp, &sc->c);

		cr_assert(fabs(r.bubble - want) < 1e-9,
			  "%s p=%d m=%d v=%d F=%g B=%g W=%g: bubble %.12f, formula %.12f", kn, p, m,
			  v, sc->c.f, sc->c.b, sc->c.w, r.bubble, want);
	}
}

Test(pp_sched, simulate_every_spec)
{
	static const struct mr_pp_cost costs[] = {
		{ 1, 1, 1 }, { 1, 2, 0 }, { 1, 1, 0 }, { 0.3, 1.7, 0.25 }, { 2, 1, 0.5 },
		{ 1, 1, 2 }, { 1, 0.5, 3 },
	};

	for (size_t i = 0; i < sizeof(costs) / sizeof(costs[0]); i++) {
		struct simcase sc = { .c = costs[i] };

		each_spec(simulate, &sc);
		cr_assert_gt(sc.runs, 400);
	}
}

/* The planner's closed forms (mr_pp_makespan, mr_pp_in_flight) against
 * the simulator and the whole lists: the makespan of per-chunk costs c is
 * the closed form's of per-stage costs v*c (zb-h1: with m >= p); the
 * (micro-batch, chunk) pairs alive are the simulator's peak; the slots
 * (first to last action of a micro-batch) are those of the whole list,
 * also where mr_pp_in_flight walks a shorter one (m > 2pv). */
static void closed_forms(const struct mr_pp_spec *sp, void *arg)
{
	const struct mr_pp_cost *c = arg;
	int peak[8], p = sp->p, m = sp->m, v = sp->v, n = mr_pp_len(sp, NULL);
	struct mr_pp_sim r = { .peak = peak };
	struct mr_pp_action *a = malloc(sizeof(*a) * (size_t)n);
	const char *kn = mr_pp_kind_name(sp->kind);

	cr_assert_not_null(a);
	cr_assert_eq(mr_pp_simulate(sp, c, &r, NULL), 0);
	if (sp->kind != MR_PP_ZBH1 || m >= p) {
		double want = mr_pp_makespan(sp, v * c->f, v * c->b, v * c->w);
		cr_assert(fabs(r.makespan - want) < 1e-9 * want,
			  "%s p=%d m=%d v=%d: simulated %.12g, closed form %.12g", kn, p, m, v,
			  r.makespan, want);
	}
	for (int s = 0; s < p; s++) {
		int slots, pairs, first[16], last[16], live = 0, most = 0;

		cr_assert_eq(mr_pp_in_flight(sp, s, &slots, &pairs, NULL), 0);
		cr_assert_eq(pairs, p > 1 ? peak[s] : 1, "%s p=%d m=%d v=%d stage %d: pairs %d, peak %d",
			     kn, p, m, v, s, pairs, peak[s]);
		cr_assert_eq(mr_pp_actions(sp, s, a, n, NULL), n);
		for (int i = 0; i < m; i++)
			first[i] = last[i] = -1;
		for (int i = 0; i < n; i++) {
			if (first[a[i].mb] < 0)
				first[a[i].mb] = i;
			last[a[i].mb] = i;
		}
		for (int i = 0; i < n; i++) {
			if (first[a[i].mb] == i && ++live > most)
				most = live;
			if (last[a[i].mb] == i)
				live--;
		}
		cr_assert_eq(slots, p > 1 ? most : 1, "%s p=%d m=%d v=%d stage %d: slots %d, list %d",
			     kn, p, m, v, s, slots, most);
	}
	free(a);
}

Test(pp_sched, closed_forms_equal_the_simulator_and_the_lists)
{
	static const struct mr_pp_cost costs[] = { { 1, 1, 1 }, { 0.3, 1.7, 0.25 }, { 1, 0.5, 3 } };

	for (size_t i = 0; i < sizeof(costs) / sizeof(costs[0]); i++)
		each_spec(closed_forms, (void *)&costs[i]);
}

Test(pp_sched, zero_bubble_beats_1f1b)
{
	struct mr_pp_cost unit = { 1, 1, 1 }, fb2 = { 1, 2, 0 };
	double bubble[MR_PP__KIND_COUNT][2];

	for (int k = 0; k < MR_PP__KIND_COUNT; k++) {
		struct mr_pp_spec sp = { .kind = (enum mr_pp_kind)k, .p = 4, .m = 8,
					 .v = k == MR_PP_INTERLEAVED ? 2 : 1 };
		struct mr_pp_sim r = { 0 };

		cr_assert_eq(mr_pp_simulate(&sp, &unit, &r, NULL), 0);
		bubble[k][0] = r.bubble;
		cr_assert_eq(mr_pp_simulate(&sp, &fb2, &r, NULL), 0);
		bubble[k][1] = r.bubble;
		cr_log_info("p=4 m=8 %-11s bubble F=B=W=1: %.4f  F=1 B=2 (W=0): %.4f",
			    mr_pp_kind_name(sp.kind), bubble[k][0], bubble[k][1]);
	}
	/* (B+W) = 2 for the whole backward either way: 1f1b 3/8, zb-h1 1/8 */
	cr_assert(fabs(bubble[MR_PP_1F1B][0] - 0.375) < 1e-12);
	cr_assert(fabs(bubble[MR_PP_ZBH1][0] - 0.125) < 1e-12);
	cr_assert_leq(bubble[MR_PP_ZBH1][0], 0.5 * bubble[MR_PP_1F1B][0]);
	cr_assert(fabs(bubble[MR_PP_INTERLEAVED][0] - 0.1875) < 1e-12);
	cr_assert(fabs(bubble[MR_PP_GPIPE][1] - 0.375) < 1e-12);
	/* without a W to defer zb-h1 is 1f1b */
	cr_assert(fabs(bubble[MR_PP_ZBH1][1] - bubble[MR_PP_1F1B][1]) < 1e-12);
}

Test(pp_sched, start_times)
{
	/* 1f1b p=2 m=2, F=1 B=2: stage 0 F0[0,1] F1[1,2] then B0 waits for
	 * stage 1's B0 (F0[1,2] B0[2,4]) -> [4,6], B1 -> stage 1 F1[4,5]
	 * B1[5,7], stage 0 B1[7,9] */
	struct mr_pp_spec sp = { .kind = MR_PP_1F1B, .p = 2, .m = 2, .v = 1 };
	struct mr_pp_cost c = { 1, 2, 0 };
	double start[8], want[8] = { 0, 1, 4, 7, 1, 2, 4, 5 };
	struct mr_pp_sim r = { .start = start };

	cr_assert_eq(mr_pp_simulate(&sp, &c, &r, NULL), 0);
	for (int i = 0; i < 8; i++)
		cr_assert_float_eq(start[i], want[i], 1e-12, "action %d of stage %d starts at %g",
				   i % 4, i / 4, start[i]);
	cr_assert_float_eq(r.makespan, 9.0, 1e-12);
	cr_assert_float_eq(r.bubble, (2 * 9.0 - 12.0) / 12.0, 1e-12);
}

/* ---- simulator input checks and deadlock ----------------------------------- */

static int sim_lists(int p, int m, const char *l0, const char *l1, struct mr_errbuf *eb)
{
	struct mr_pp_action a0[MAXN], a1[MAXN];
	const struct mr_pp_action *lists[2] = { a0, a1 };
	int n[2] = { parse(l0, a0), parse(l1, a1) };
	struct mr_pp_cost c = { 1, 1, 1 };
	struct mr_pp_sim r = { 0 };

	mr_errbuf_clear(eb);
	return mr_pp_simulate_lists(p, 1, m, lists, n, &c, &r, eb);
}

Test(pp_sched, deadlock_is_an_error)
{
	struct mr_errbuf eb = { 0 };

	/* stage 0 wants B0 before F1; stage 1 wants F1 (from stage 0) before
	 * B0, which stage 0's B0 waits for */
	cr_assert_eq(sim_lists(2, 2, "F0 B0 F1 B1", "F0 F1 B0 B1", &eb), MR_ESTATE);
	cr_assert(strstr(eb.msg, "deadlock") && strstr(eb.msg, "stage 0") &&
			  strstr(eb.msg, "B(micro-batch 0"),
		  "%s", eb.msg);
	/* a backward before its own forward on the last stage */
	cr_assert_eq(sim_lists(2, 1, "F0 B0", "B0 F0", &eb), MR_ESTATE);
	cr_assert(strstr(eb.msg, "stage 1"), "%s", eb.msg);
	/* the same lists in a workable order */
	cr_assert_eq(sim_lists(2, 2, "F0 F1 B0 B1", "F0 B0 F1 B1", &eb), 0, "%s", eb.msg);
}

Test(pp_sched, malformed_lists)
{
	struct mr_errbuf eb = { 0 };
	struct mr_pp_cost neg = { 1, -1, 0 };
	struct mr_pp_action a[2] = { { MR_PP_F, 0, 0 }, { MR_PP_B, 0, 0 } };
	const struct mr_pp_action *l[1] = { a };
	int n = 2;
	struct mr_pp_sim r = { 0 };

	cr_assert_eq(sim_lists(2, 2, "F0 F0 B0 B1", "F0 F1 B0 B1", &eb), MR_EINVAL);
	cr_assert(strstr(eb.msg, "twice"), "%s", eb.msg);
	cr_assert_eq(sim_lists(2, 2, "F0 F1 B0", "F0 F1 B0 B1", &eb), MR_EINVAL);
	cr_assert(strstr(eb.msg, "B(micro-batch 1, chunk 0) is missing"), "%s", eb.msg);
	cr_assert_eq(sim_lists(2, 2, "F0 F1 B0 B2", "F0 F1 B0 B1", &eb), MR_EINVAL);
	cr_assert(strstr(eb.msg, "out of range"), "%s", eb.msg);
	cr_assert_eq(sim_lists(2, 1, "F0 B0 W0", "F0 B0", &eb), MR_EINVAL);
	cr_assert(strstr(eb.msg, "W"), "%s", eb.msg);
	cr_assert_eq(sim_lists(2, 2, "F0 F1 B0 W0 B1", "F0 B0 W0 F1 B1 W1", &eb), MR_EINVAL);
	cr_assert(strstr(eb.msg, "W(micro-batch 1, chunk 0) is missing"), "%s", eb.msg);
	cr_assert_eq(mr_pp_simulate_lists(1, 1, 1, l, &n, &neg, &r, &eb), MR_EINVAL);
	cr_assert_eq(mr_pp_simulate_lists(0, 1, 1, l, &n, &neg, &r, NULL), MR_EINVAL);
}

/* ---- transfers -------------------------------------------------------------- */

static void comms_match(const struct mr_pp_spec *sp, void *arg)
{
	int p = sp->p, len = mr_pp_len(sp, NULL), bound = mr_pp_comms_bound(sp, NULL);
	struct mr_pp_action *a = malloc((size_t)p * len * sizeof(*a));
	struct mr_pp_comm *cm = malloc((size_t)p * bound * sizeof(*cm));
	double *start = malloc((size_t)p * len * sizeof(*start));
	int *nc = calloc((size_t)p, sizeof(*nc)), total = 0, q = p * sp->v;
	struct mr_pp_cost c = { 1, 2, 1 };
	struct mr_pp_sim r = { .start = start };
	int split = sp->kind == MR_PP_ZBH1;

	(void)arg;
	cr_assert(a && cm && start && nc);
	cr_assert_eq(mr_pp_simulate(sp, &c, &r, NULL), 0);
	for (int s = 0; s < p; s++) {
		struct mr_pp_action *as = a + (size_t)s * len;
		struct mr_pp_comm *cs = cm + (size_t)s * bound;
		int last = -1;

		cr_assert_eq(mr_pp_actions(sp, s, as, len, NULL), len);
		nc[s] = mr_pp_comms(sp, s, as, len, cs, bound, NULL);
		cr_assert_geq(nc[s], 0);
		total += nc[s];
		for (int i = 0; i < nc[s]; i++) {
			const struct mr_pp_action *x = &as[cs[i].action];
			int k = x->chunk * p + s;

			/* in list order, the receive of an action before its send */
			cr_assert_geq(cs[i].action * 2 + cs[i].send, last);
			last = cs[i].action * 2 + cs[i].send;
			cr_assert(x->op != MR_PP_W);
			cr_assert_eq(cs[i].what, x->op == MR_PP_F ? MR_PP_ACT : MR_PP_GRAD);
			cr_assert_eq(cs[i].mb, x->mb);
			cr_assert_eq(cs[i].chunk, x->chunk);
			cr_assert(p > 1 || q > 1);
			/* forward traffic goes up the virtual stages, gradients down */
			int up = (cs[i].what == MR_PP_ACT) == cs[i].send;

			cr_assert_eq(cs[i].peer, ((up ? k + 1 : k - 1) + q) % q % p);
		}
	}
	/* every message once: one F and one B edge per micro-batch between
	 * each pair of neighbouring virtual stages, sent once and received once */
	cr_assert_eq(total, 2 * 2 * sp->m * (q - 1), "%s p=%d m=%d v=%d: %d transfers",
		     mr_pp_kind_name(sp->kind), p, sp->m, sp->v, total);
	for (int s = 0; s < p; s++)
		for (int i = 0; i < nc[s]; i++) {
			const struct mr_pp_comm *x = &cm[(size_t)s * bound + i];
			int found = 0;

			if (x->send)
				continue;
			for (int j = 0; j < nc[x->peer]; j++) {
				const struct mr_pp_comm *y = &cm[(size_t)x->peer * bound + j];

				if (!y->send || y->tag != x->tag || y->peer != s)
					continue;
				cr_assert_eq(y->what, x->what);
				cr_assert_eq(y->mb, x->mb);
				/* the simulator finished the sender's action before the
				 * receiver's started */
				{
					const struct mr_pp_action *ya =
						&a[(size_t)x->peer * len + y->action];
					double end = start[(size_t)x->peer * len + y->action] +
						     (ya->op == MR_PP_F ? c.f : split ? c.b : c.b + c.w);

					cr_assert_leq(end, start[(size_t)s * len + x->action] + 1e-12);
				}
				found++;
			}
			cr_assert_eq(found, 1, "%s p=%d m=%d v=%d: stage %d receive %d matched %d "
				     "sends", mr_pp_kind_name(sp->kind), p, sp->m, sp->v, s, i, found);
		}
	free(a);
	free(cm);
	free(start);
	free(nc);
}

Test(pp_sched, transfers_match)
{
	each_spec(comms_match, NULL);
}

/*
 * An in-order backend (NCCL: no tags) matches a pair's messages in issue
 * order: for every directed pair of stages, the tags the sender sends, in
 * its list's order, must be the tags the receiver receives, in its list's
 * order.
 */
static void in_order(const struct mr_pp_spec *sp, void *arg)
{
	int p = sp->p, len = mr_pp_len(sp, NULL), bound = mr_pp_comms_bound(sp, NULL);
	struct mr_pp_action *a = malloc((size_t)len * sizeof(*a));
	struct mr_pp_comm *cm = malloc((size_t)p * bound * sizeof(*cm));
	int *nc = calloc((size_t)p, sizeof(*nc));

	(void)arg;
	cr_assert(a && cm && nc);
	for (int s = 0; s < p; s++) {
		cr_assert_eq(mr_pp_actions(sp, s, a, len, NULL), len);
		nc[s] = mr_pp_comms(sp, s, a, len, cm + (size_t)s * bound, bound, NULL);
		cr_assert_geq(nc[s], 0);
	}
	for (int from = 0; from < p; from++)
		for (int to = 0; to < p; to++) {
			const struct mr_pp_comm *x = cm + (size_t)from * bound;
			const struct mr_pp_comm *y = cm + (size_t)to * bound;
			int i = 0, j = 0;

			for (;;) {
				while (i < nc[from] && !(x[i].send && x[i].peer == to))
					i++;
				while (j < nc[to] && !(!y[j].send && y[j].peer == from))
					j++;
				if (i == nc[from] || j == nc[to])
					break;
				cr_assert_eq(x[i].tag, y[j].tag,
					     "%s p=%d m=%d v=%d: stage %d's sends to %d and %d's "
					     "receives are in another order",
					     mr_pp_kind_name(sp->kind), p, sp->m, sp->v, from, to, to);
				i++;
				j++;
			}
			cr_assert(i == nc[from] && j == nc[to]);
		}
	free(a);
	free(cm);
	free(nc);
}

Test(pp_sched, transfers_in_the_same_order_at_both_ends)
{
	each_spec(in_order, NULL);
}

Test(pp_sched, transfers_by_hand)
{
	/* 1f1b p=2 m=1: stage 0 sends F0's output to stage 1, receives B0's
	 * input gradient from it; stage 1 the converse */
	struct mr_pp_spec sp = { .kind = MR_PP_1F1B, .p = 2, .m = 1, .v = 1 };
	struct mr_pp_action a[2];
	struct mr_pp_comm c[4];

	cr_assert_eq(mr_pp_actions(&sp, 0, a, 2, NULL), 2);
	cr_assert_eq(mr_pp_comms(&sp, 0, a, 2, c, 4, NULL), 2);
	cr_assert(c[0].send == 1 && c[0].what == MR_PP_ACT && c[0].peer == 1 && c[0].action == 0);
	cr_assert(c[1].send == 0 && c[1].what == MR_PP_GRAD && c[1].peer == 1 && c[1].action == 1);
	cr_assert_eq(mr_pp_comms(&sp, 0, a, 2, c, 1, NULL), MR_ERANGE);
	cr_assert_eq(mr_pp_actions(&sp, 1, a, 2, NULL), 2);
	cr_assert_eq(mr_pp_comms(&sp, 1, a, 2, c, 4, NULL), 2);
	cr_assert(c[0].send == 0 && c[0].what == MR_PP_ACT && c[0].peer == 0 && c[0].action == 0);
	cr_assert(c[1].send == 1 && c[1].what == MR_PP_GRAD && c[1].peer == 0 && c[1].action == 1);
	/* one stage: nothing to send */
	sp.p = 1;
	cr_assert_eq(mr_pp_actions(&sp, 0, a, 2, NULL), 2);
	cr_assert_eq(mr_pp_comms(&sp, 0, a, 2, c, 4, NULL), 0);
	/* interleaved p=2 v=2: stage 1's chunk 0 (virtual stage 1) feeds
	 * stage 0's chunk 1 (virtual stage 2) */
	{
		struct mr_pp_spec iv = { .kind = MR_PP_INTERLEAVED, .p = 2, .m = 2, .v = 2 };
		struct mr_pp_action b[8] = { { MR_PP_F, 0, 0 } };
		struct mr_pp_comm d[16];

		cr_assert_eq(mr_pp_comms(&iv, 1, b, 1, d, 16, NULL), 2);
		cr_assert(d[0].send == 0 && d[0].peer == 0 && d[1].send == 1 && d[1].peer == 0);
		b[0].chunk = 1; /* the last virtual stage sends nothing forward */
		cr_assert_eq(mr_pp_comms(&iv, 1, b, 1, d, 16, NULL), 1);
		b[0].chunk = 2;
		cr_assert_eq(mr_pp_comms(&iv, 1, b, 1, d, 16, NULL), MR_EINVAL);
	}
}

/* ---- the layer split --------------------------------------------------------- */

static struct mr_gpt_config small(int L, int V)
{
	return (struct mr_gpt_config){ .vocab = V, .max_seq = 64, .n_layer = L, .d_model = 64,
				       .n_head = 4 };
}

static void expect_split(const int *got, const char *want, int q)
{
	char buf[256];
	size_t len = 0;

	for (int k = 0; k < q; k++)
		len += (size_t)snprintf(buf + len, sizeof(buf) - len, "%s%d", k ? "," : "",
					got[k]);
	cr_assert_str_eq(buf, want);
}

Test(pp_split, cost_model)
{
	struct mr_gpt_config mc = small(4, 1000);
	double block[4], embed, head, C = 64, T = 32;

	mc.moe_every = 2;
	mc.n_experts = 8;
	mc.top_k = 2;
	cr_assert_eq(mr_pp_split_costs(&mc, 32, block, &embed, &head, NULL), 0);
	/* layers 1 and 3 are MoE */
	cr_assert_float_eq(block[0], 24 * C * C + 4 * C * T, 0);
	cr_assert_float_eq(block[1], 8 * C * C + 4 * C * T + 2 * C * 8 + 2 * 16 * C * C, 0);
	cr_assert_float_eq(block[2], block[0], 0);
	cr_assert_float_eq(block[3], block[1], 0);
	cr_assert_float_eq(embed, 2 * C, 0);
	cr_assert_float_eq(head, 2 * C * 1000, 0);
	/* T <= 0: max_seq */
	cr_assert_eq(mr_pp_split_costs(&mc, 0, block, &embed, &head, NULL), 0);
	cr_assert_float_eq(block[0], 24 * C * C + 4 * C * 64, 0);
}

Test(pp_split, balanced)
{
	/* C = T = V = 64: a block is 114688, the head 8192, the embedding 128:
	 * two blocks a stage */
	struct mr_gpt_config mc = small(8, 64);
	int layers[8];

	cr_assert_eq(mr_pp_split_model(&mc, 64, 4, 1, NULL, 0, layers, NULL), 0);
	expect_split(layers, "2,2,2,2", 4);
	cr_assert_eq(mr_pp_split_model(&mc, 64, 2, 1, NULL, 0, layers, NULL), 0);
	expect_split(layers, "4,4", 2);
	cr_assert_eq(mr_pp_split_model(&mc, 64, 1, 1, NULL, 0, layers, NULL), 0);
	expect_split(layers, "8", 1);
	cr_assert_eq(mr_pp_split_model(&mc, 64, 4, 2, NULL, 0, layers, NULL), 0);
	expect_split(layers, "1,1,1,1,1,1,1,1", 8);
	/* the same answer every time (every rank computes it) */
	for (int i = 0; i < 3; i++) {
		int again[4];

		mc.n_layer = 10;
		cr_assert_eq(mr_pp_split_model(&mc, 64, 4, 1, NULL, 0, again, NULL), 0);
		/* 10 over 4: two stages of 3 blocks, neither the first (its
		 * embedding) nor the last (its head) */
		expect_split(again, "2,3,3,2", 4);
	}
}

Test(pp_split, head_moves_layers_off_the_last_stage)
{
	/* V = 1024: the head (131072) outweighs a block (114688). 2,2,2,2 puts
	 * 3.14 blocks on the last stage; 2,2,3,1 and 2,3,2,1 cap every stage at
	 * 3 blocks (same squares); the later stage takes the extra one */
	struct mr_gpt_config mc = small(8, 1024);
	int layers[4];

	cr_assert_eq(mr_pp_split_model(&mc, 64, 4, 1, NULL, 0, layers, NULL), 0);
	expect_split(layers, "2,2,3,1", 4);
	/* GPT-2's vocabulary on a narrow model: the head is 56 blocks */
	mc.vocab = 50304;
	cr_assert_eq(mr_pp_split_model(&mc, 64, 2, 1, NULL, 0, layers, NULL), 0);
	expect_split(layers, "7,1", 2);
}

Test(pp_split, embedding_moves_layers_off_the_first_stage)
{
	/* blocks of 1, an embedding of 1.5: the first stage can hold one block
	 * (2.5) while the others hold up to 3; among 1,2,2,3 / 1,2,3,2 /
	 * 1,3,2,2 (same squares) the later stages take more */
	double block[8] = { 1, 1, 1, 1, 1, 1, 1, 1 };
	int layers[4];

	cr_assert_eq(mr_pp_split_balance(block, 8, 1.5, 0, 4, 1, layers, NULL), 0);
	expect_split(layers, "1,2,2,3", 4);
	cr_assert_eq(mr_pp_split_balance(block, 8, 0, 0, 4, 1, layers, NULL), 0);
	expect_split(layers, "2,2,2,2", 4);
	/* both ends heavy */
	cr_assert_eq(mr_pp_split_balance(block, 8, 1.5, 1.5, 4, 1, layers, NULL), 0);
	expect_split(layers, "1,3,3,1", 4);
}

/* Every cut of L blocks into q stages: the least bottleneck, the least
 * squares under it, then the most blocks on the latest stages. */
static void brute(const double *block, int L, double embed, double head, int q, int *best)
{
	int cur[8], found = 0;
	double bmax = INFINITY, bss = INFINITY;

	/* compositions of L into q positive parts, by stars and bars */
	for (unsigned mask = 0; mask < 1u << (L - 1); mask++) {
		int parts = 0, len = 1;
		double mx = 0, ss = 0, acc = 0;

		if (__builtin_popcount(mask) != q - 1)
			continue;
		for (int i = 0; i < L; i++) {
			acc += block[i];
			if (i == L - 1 || (mask >> i & 1u)) {
				double x = acc + (parts == 0 ? embed : 0) + (i == L - 1 ? head : 0);

				cur[parts++] = len;
				mx = x > mx ? x : mx;
				ss += x * x;
				acc = 0;
				len = 1;
			} else {
				len++;
			}
		}
		int better = !found || mx < bmax || (mx == bmax && ss < bss * (1 - 1e-12));

		if (!better && mx == bmax && fabs(ss - bss) <= bss * 1e-12) {
			for (int k = q - 1; k >= 0; k--) {
				if (cur[k] != best[k]) {
					better = cur[k] > best[k];
					break;
				}
			}
		}
		if (better) {
			memcpy(best, cur, (size_t)q * sizeof(*cur));
			bmax = mx;
			bss = ss;
			found = 1;
		}
	}
}

Test(pp_split, same_as_brute_force)
{
	unsigned x = 12345;

	for (int round = 0; round < 300; round++) {
		double block[12], embed, head;
		int L = 1 + round % 12, q = 1 + round % 5, got[8], want[8];

		if (q > L)
			continue;
		for (int l = 0; l < L; l++) {
			x = x * 1103515245u + 12345u;
			block[l] = 1 + (x >> 16) % 8; /* few values: many ties */
		}
		x = x * 1103515245u + 12345u;
		embed = (x >> 16) % 3;
		head = (x >> 20) % 12;
		cr_assert_eq(mr_pp_split_balance(block, L, embed, head, q, 1, got, NULL), 0);
		brute(block, L, embed, head, q, want);
		for (int k = 0; k < q; k++)
			cr_assert_eq(got[k], want[k], "round %d L=%d q=%d stage %d: %d blocks, brute "
				     "force %d", round, L, q, k, got[k], want[k]);
	}
}

Test(pp_split, explicit_accepted)
{
	struct mr_gpt_config mc = small(10, 64);
	const int want[4] = { 3, 3, 2, 2 }, iv[4] = { 1, 4, 3, 2 };
	int layers[4], lo, hi;

	cr_assert_eq(mr_pp_split_model(&mc, 64, 4, 1, want, 4, layers, NULL), 0);
	cr_assert_arr_eq(layers, want, sizeof(want));
	/* interleaved p=2 v=2: virtual stages in chunk-major order */
	cr_assert_eq(mr_pp_split_model(&mc, 64, 2, 2, iv, 4, layers, NULL), 0);
	mr_pp_split_range(layers, 2, 0, 0, &lo, &hi);
	cr_assert(lo == 0 && hi == 1);
	mr_pp_split_range(layers, 2, 1, 0, &lo, &hi);
	cr_assert(lo == 1 && hi == 5);
	mr_pp_split_range(layers, 2, 0, 1, &lo, &hi);
	cr_assert(lo == 5 && hi == 8);
	mr_pp_split_range(layers, 2, 1, 1, &lo, &hi);
	cr_assert(lo == 8 && hi == 10);
}

static void expect_split_bad(const int *layers, int n, int p, int v, int L, const char *what)
{
	struct mr_gpt_config mc = small(L, 64);
	struct mr_errbuf eb = { 0 };
	int out[16];

	cr_assert_eq(mr_pp_split_model(&mc, 64, p, v, layers, n, out, &eb), MR_EINVAL,
		     "%s accepted", what);
	cr_assert_str_eq(eb.field, "pp_layers", "%s: field '%s'", what, eb.field);
	cr_assert(strstr(eb.msg, "pp_layers"), "%s: %s", what, eb.msg);
	mr_errbuf_clear(&eb);
	cr_assert_eq(mr_pp_split_check(layers, n, p, v, L, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "pp_layers");
}

Test(pp_split, explicit_rejected)
{
	const int short3[] = { 4, 3, 3 }, long5[] = { 2, 2, 2, 2, 2 }, zero[] = { 4, 0, 3, 3 },
		  neg[] = { 5, -1, 3, 3 }, sum9[] = { 3, 2, 2, 2 }, sum11[] = { 3, 3, 3, 2 },
		  iv[] = { 3, 3, 2, 2 };

	expect_split_bad(short3, 3, 4, 1, 10, "3 entries for pp 4");
	expect_split_bad(long5, 5, 4, 1, 10, "5 entries for pp 4");
	expect_split_bad(zero, 4, 4, 1, 10, "a stage with no block");
	expect_split_bad(neg, 4, 4, 1, 10, "a negative count");
	expect_split_bad(sum9, 4, 4, 1, 10, "9 of 10 blocks");
	expect_split_bad(sum11, 4, 4, 1, 10, "11 of 10 blocks");
	expect_split_bad(iv, 4, 4, 2, 10, "4 entries for pp 4 x pp_virtual 2");
	expect_split_bad(iv, 0, 4, 1, 10, "an empty list");
}

Test(pp_split, too_few_layers)
{
	struct mr_gpt_config mc = small(3, 64);
	struct mr_errbuf eb = { 0 };
	int layers[8];

	cr_assert_eq(mr_pp_split_model(&mc, 64, 4, 1, NULL, 0, layers, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "pp");
	mr_errbuf_clear(&eb);
	mc.n_layer = 6;
	cr_assert_eq(mr_pp_split_model(&mc, 64, 4, 2, NULL, 0, layers, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "pp_virtual");
	mr_errbuf_clear(&eb);
	mc.d_model = 0;
	cr_assert_eq(mr_pp_split_model(&mc, 64, 2, 1, NULL, 0, layers, &eb), MR_EINVAL);
	cr_assert_str_eq(eb.field, "d_model");
}
