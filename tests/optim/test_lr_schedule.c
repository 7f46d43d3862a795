/*
 * test_lr_schedule.c - the learning-rate schedules (optim/mr_adamw.h):
 * each equals its formula, written out here again, at every step of a
 * small run (warmup boundary, decay start, last step); cosine keeps its
 * numbers; the worker reads "lr_schedule" and "decay_frac" and refuses
 * a bad value naming the key.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "mr_gpt_worker.h"
#include "optim/mr_adamw.h"

#define LR 0.01
#define FRAC 0.1
#define STEPS 20

static struct mr_adamw_config sched(int schedule, int warmup, float decay_frac)
{
	struct mr_adamw_config c;

	memset(&c, 0, sizeof(c));
	c.lr = (float)LR;
	c.min_lr_frac = (float)FRAC;
	c.warmup_steps = warmup;
	c.total_steps = STEPS;
	c.schedule = schedule;
	c.decay_frac = decay_frac;
	return c;
}

/* Each step's lr of c against want(step), to float rounding. */
static void expect_all(const struct mr_adamw_config *c, double (*want)(long, int), int warmup,
		       const char *name)
{
	for (long s = 0; s < STEPS; s++) {
		double w = s < warmup ? LR * (double)(s + 1) / warmup : want(s, warmup);
		double got = mr_lr_at(c, s);
		cr_expect(fabs(got - w) <= 1e-6 * LR, "%s step %ld: lr %.9g, want %.9g", name, s,
			  got, w);
	}
}

static double cosine(long s, int warmup)
{
	double r = (double)(s - warmup) / (STEPS - warmup), lo = LR * FRAC;

	return lo + 0.5 * (1.0 + cos(M_PI * r)) * (LR - lo);
}

/* lr at step warmup-1 (the end of warmup), lo at step STEPS-1 */
static double linear(long s, int warmup)
{
	double a = warmup - 1, b = STEPS - 1;

	return LR + (LR * FRAC - LR) * ((double)s - a) / (b - a);
}

static double constant(long s, int warmup)
{
	(void)s;
	(void)warmup;
	return LR;
}

/* decay_frac 0.25 of 20 steps: the last 5 steps (15..19) decay, 14 is
 * the last at lr, 19 is lo */
static double wsd(long s, int warmup)
{
	(void)warmup;
	return s <= 14 ? LR : LR + (LR * FRAC - LR) * (double)(s - 14) / 5.0;
}

Test(lr_schedule, each_equals_its_formula_at_every_step)
{
	struct mr_adamw_config c;

	c = sched(MR_LR_COSINE, 4, 0.2f);
	expect_all(&c, cosine, 4, "cosine");
	c = sched(MR_LR_LINEAR, 4, 0.2f);
	expect_all(&c, linear, 4, "linear");
	c = sched(MR_LR_CONSTANT, 4, 0.2f);
	expect_all(&c, constant, 4, "constant");
	c = sched(MR_LR_WSD, 4, 0.25f);
	expect_all(&c, wsd, 4, "wsd");
	/* the boundaries by name */
	c = sched(MR_LR_LINEAR, 4, 0.2f);
	cr_expect_float_eq(mr_lr_at(&c, 3), (float)LR, 1e-9, "end of warmup is the peak");
	cr_expect_float_eq(mr_lr_at(&c, STEPS - 1), (float)(LR * FRAC), 1e-9,
			   "linear reaches lr*min_lr_frac at the last step");
	c = sched(MR_LR_WSD, 4, 0.25f);
	cr_expect_eq(mr_lr_at(&c, 14), (float)LR, "wsd is stable up to the decay");
	cr_expect_lt(mr_lr_at(&c, 15), (float)LR, "wsd decays from step 15");
	cr_expect_float_eq(mr_lr_at(&c, STEPS - 1), (float)(LR * FRAC), 1e-9,
			   "wsd reaches lr*min_lr_frac at the last step");
	/* a zeroed config is cosine: the schedule every run had before */
	cr_expect_eq(MR_LR_COSINE, 0);
}

Test(lr_schedule, without_warmup_and_edge_fractions)
{
	struct mr_adamw_config c = sched(MR_LR_LINEAR, 0, 0.2f);

	cr_expect_eq(mr_lr_at(&c, 0), (float)LR, "no warmup: step 0 is the peak");
	cr_expect_float_eq(mr_lr_at(&c, STEPS - 1), (float)(LR * FRAC), 1e-9);
	c = sched(MR_LR_WSD, 0, 0.0f);
	for (long s = 0; s < STEPS; s++)
		cr_expect_eq(mr_lr_at(&c, s), (float)LR, "decay_frac 0: no decay (step %ld)", s);
	/* decay_frac 1: the decay starts where warmup ends, as linear */
	c = sched(MR_LR_WSD, 4, 1.0f);
	for (long s = 0; s < STEPS; s++) {
		struct mr_adamw_config l = sched(MR_LR_LINEAR, 4, 0.0f);
		cr_expect_float_eq(mr_lr_at(&c, s), mr_lr_at(&l, s), 1e-9, "step %ld", s);
	}
}

/* The config {key: value} through the worker's check. */
static int check(const char *js, struct mr_errbuf *eb)
{
	json_error_t err;
	json_t *c = json_loads(js, 0, &err);
	int rc;

	cr_assert_not_null(c, "bad test json: %s", err.text);
	memset(eb, 0, sizeof(*eb));
	rc = mr_gpt_worker_check_config(c, eb);
	json_decref(c);
	return rc;
}

Test(lr_schedule, worker_keys_take_each_and_refuse_a_bad_value)
{
	static const char *const names[] = { "cosine", "linear", "constant", "wsd" };
	struct mr_errbuf eb;
	char js[128];
	int s;

	for (int i = 0; i < 4; i++) {
		snprintf(js, sizeof(js), "{\"lr_schedule\": \"%s\", \"decay_frac\": 0.3}", names[i]);
		cr_expect_eq(check(js, &eb), 0, "%s: %s", names[i], eb.msg);
		cr_expect_eq(mr_lr_schedule_parse(names[i], &s), 0);
		cr_expect_eq(s, i);
		cr_expect_str_eq(mr_lr_schedule_name(s), names[i]);
	}
	cr_expect_lt(check("{\"lr_schedule\": \"cosin\"}", &eb), 0);
	cr_expect_str_eq(eb.field, "lr_schedule");
	cr_expect(strstr(eb.msg, "'lr_schedule'") && strstr(eb.msg, "\"wsd\""), "%s", eb.msg);
	cr_expect_lt(check("{\"lr_schedule\": 3}", &eb), 0);
	cr_expect_str_eq(eb.field, "lr_schedule", "%s", eb.msg);
	cr_expect_lt(check("{\"decay_frac\": 1.5}", &eb), 0);
	cr_expect_str_eq(eb.field, "decay_frac", "%s", eb.msg);
}
