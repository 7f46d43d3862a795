/*
 * rng.c - xoshiro256** with splitmix64 seeding (see mr_rng.h).
 */
#include <math.h>

#include "core/mr_rng.h"

uint64_t mr_splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

void mr_rng_seed(struct mr_rng *r, uint64_t seed, uint64_t stream)
{
	uint64_t st = seed ^ (stream * 0xd1b54a32d192ed03ULL);
	int i;

	for (i = 0; i < 4; i++)
		r->s[i] = mr_splitmix64(&st);
}

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

uint64_t mr_rng_next(struct mr_rng *r)
{
	uint64_t *s = r->s;
	uint64_t out = rotl(s[1] * 5, 7) * 9;
	uint64_t t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

double mr_rng_uniform(struct mr_rng *r)
{
	return (double)(mr_rng_next(r) >> 11) * 0x1.0p-53;
}

double mr_rng_normal(struct mr_rng *r)
{
	double u1 = mr_rng_uniform(r), u2 = mr_rng_uniform(r);

	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t mr_rng_below(struct mr_rng *r, uint64_t n)
{
	/* Lemire-free simple rejection keeps this exact and portable. */
	uint64_t lim = UINT64_MAX - UINT64_MAX % n, x;

	do
		x = mr_rng_next(r);
	while (x >= lim);
	return x % n;
}
