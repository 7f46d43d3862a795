/*
 * mr_rng.h - deterministic pseudo-random numbers (xoshiro256**, seeded with
 * splitmix64), the same on every platform.
 *
 * Parameters are initialised from a stream keyed by (seed, tensor index),
 * so any rank can create any tensor (or its shard) on its own and get the
 * same values as a single-rank run.
 *
 * Non-goals: cryptographic quality, speed beyond "fast enough to init".
 */
#ifndef MR_RNG_H
#define MR_RNG_H

#include <stdint.h>

struct mr_rng {
	uint64_t s[4];
};

uint64_t mr_splitmix64(uint64_t *state);
/* Seeds from (seed, stream): distinct streams are independent. */
void mr_rng_seed(struct mr_rng *r, uint64_t seed, uint64_t stream);
uint64_t mr_rng_next(struct mr_rng *r);
/* Uniform in [0, 1) with 53 bits. */
double mr_rng_uniform(struct mr_rng *r);
/* Standard normal (Box-Muller, one value per call). */
double mr_rng_normal(struct mr_rng *r);
/* Uniform integer in [0, n), n > 0. */
uint64_t mr_rng_below(struct mr_rng *r, uint64_t n);

#endif
