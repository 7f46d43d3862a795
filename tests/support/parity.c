/*
 * parity.c - weight comparison for parallel-vs-single-rank tests (see
 * parity.h).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "parity.h"

/* ||a-b|| / ||b|| over n elements (absolute when b is all zero). */
double mr_test_rel_l2(const float *a, const float *b, size_t n)
{
	double nb = 0.0, d = 0.0;
	size_t i;

	for (i = 0; i < n; i++) {
		nb += (double)b[i] * b[i];
		d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
	}
	return nb > 0 ? sqrt(d / nb) : sqrt(d);
}

static double max_abs(const float *a, size_t n)
{
	double m = 0.0;
	size_t i;

	for (i = 0; i < n; i++)
		if (fabs(a[i]) > m)
			m = fabs(a[i]);
	return m;
}

int mr_parity_tensor(const struct mr_gpt_tensor *t, const float *a, const float *b, double tol,
		     char *why, size_t cap)
{
	size_t C = t->n / 3;
	double e;

	if (!strstr(t->name, "attn.qkv.b")) {
		e = mr_test_rel_l2(a, b, t->n);
		if (e <= tol)
			return 0;
		snprintf(why, cap, "tensor %s differs by %.3g (rel L2)", t->name, e);
		return 1;
	}
	e = mr_test_rel_l2(a, b, C) + mr_test_rel_l2(a + 2 * C, b + 2 * C, C);
	if (e > tol) {
		snprintf(why, cap, "q/v biases of %s differ by %.3g (rel L2)", t->name, e);
		return 1;
	}
	if (max_abs(a + C, C) > tol || max_abs(b + C, C) > tol) {
		snprintf(why, cap, "key bias of %s moved (%.3g, reference %.3g)", t->name,
			 max_abs(a + C, C), max_abs(b + C, C));
		return 1;
	}
	return 0;
}
