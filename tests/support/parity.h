/*
 * parity.h - comparing a parallel run's weights with the single-rank run's.
 *
 * Tolerance (shared by tests/layers/test_tp.c and tests/parity): per
 * tensor relative L2 error ||a-b|| / ||b|| <= 1e-4. Parallel runs differ
 * from one rank only in the order of float sums; AdamW normalises every
 * element's update by its own gradient scale, so elements whose gradient is
 * near zero move by up to ~lr per step in a direction set by rounding. A
 * tensor-level norm is not dominated by them, an element-wise bound is. The
 * key bias (middle third of attn.qkv.b) is the extreme case: its gradient
 * is exactly zero in exact arithmetic (softmax is invariant to a shift
 * along the keys), so both runs only random-walk it by rounding; it is
 * checked to stay below 1e-4 in magnitude instead.
 *
 * Non-goals: loss comparison (a plain relative bound, in each test).
 */
#ifndef MR_TEST_PARITY_H
#define MR_TEST_PARITY_H

#include <stddef.h>

#include "model/mr_gpt.h"

#define MR_PARITY_WEIGHT_TOL 1e-4

/* ||a - b|| / ||b|| over n values, in double (||a - b|| when b is 0). */
double mr_test_rel_l2(const float *a, const float *b, size_t n);

/* 0 when tensor t of a (parallel) matches b (single rank) within relative
 * L2 tol (MR_PARITY_WEIGHT_TOL for fp32 runs; the key bias must stay below
 * tol in magnitude); otherwise 1 with a message naming the tensor and the
 * error in why. */
int mr_parity_tensor(const struct mr_gpt_tensor *t, const float *a, const float *b, double tol,
		     char *why, size_t cap);

#endif
