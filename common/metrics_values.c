/*
 * metrics_values.c - counter, gauge and histogram updates (see
 * mr_metrics.h): lock-free, doubles kept as their IEEE-754 bits in an
 * _Atomic uint64_t and updated with a compare-and-swap loop; a histogram
 * keeps one non-cumulative count per bucket plus +Inf.
 */
#include <math.h>
#include <string.h>

#include "metrics_int.h"

/* ---- atomics on doubles --------------------------------------------- */

static uint64_t d2u(double d)
{
	uint64_t u;

	memcpy(&u, &d, sizeof(u));
	return u;
}

static double u2d(uint64_t u)
{
	double d;

	memcpy(&d, &u, sizeof(d));
	return d;
}

static void atomic_add_double(_Atomic uint64_t *p, double v)
{
	uint64_t old = atomic_load_explicit(p, memory_order_relaxed);

	while (!atomic_compare_exchange_weak_explicit(p, &old, d2u(u2d(old) + v),
						      memory_order_relaxed, memory_order_relaxed))
		;
}

double mr__metrics_get_double(const _Atomic uint64_t *p)
{
	return u2d(atomic_load_explicit((_Atomic uint64_t *)p, memory_order_relaxed));
}

/* ---- updates ---------------------------------------------------------- */

void mr_counter_inc(struct mr_counter *c)
{
	mr_counter_add(c, 1);
}

void mr_counter_add(struct mr_counter *c, double v)
{
	if (c && v >= 0) /* false for NaN */
		atomic_add_double(&c->bits, v);
}

double mr_counter_value(const struct mr_counter *c)
{
	return c ? mr__metrics_get_double(&c->bits) : 0;
}

void mr_gauge_set(struct mr_gauge *g, double v)
{
	if (g)
		atomic_store_explicit(&g->bits, d2u(v), memory_order_relaxed);
}

void mr_gauge_add(struct mr_gauge *g, double v)
{
	if (g)
		atomic_add_double(&g->bits, v);
}

void mr_gauge_inc(struct mr_gauge *g)
{
	mr_gauge_add(g, 1);
}

void mr_gauge_dec(struct mr_gauge *g)
{
	mr_gauge_add(g, -1);
}

double mr_gauge_value(const struct mr_gauge *g)
{
	return g ? mr__metrics_get_double(&g->bits) : 0;
}

void mr_histogram_observe(struct mr_histogram *h, double v)
{
	size_t lo = 0, hi;

	if (!h || isnan(v))
		return;
	/* first bucket with v <= bound; nb if none (+Inf) */
	hi = h->nb;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (v <= h->bounds[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	atomic_fetch_add_explicit(&h->counts[lo], 1, memory_order_relaxed);
	atomic_add_double(&h->sum, v);
}

uint64_t mr_histogram_count(const struct mr_histogram *h)
{
	uint64_t n = 0;

	if (!h)
		return 0;
	for (size_t i = 0; i <= h->nb; i++)
		n += atomic_load_explicit(&h->counts[i], memory_order_relaxed);
	return n;
}

double mr_histogram_sum(const struct mr_histogram *h)
{
	return h ? mr__metrics_get_double(&h->sum) : 0;
}
