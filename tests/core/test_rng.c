/*
 * test_rng.c - runtime/core/mr_rng.h: splitmix64 and xoshiro256** against
 * the published reference outputs (the algorithms' first values from a
 * zero state and from the state {1, 2, 3, 4}); seeding by (seed, stream)
 * repeatable and streams apart; uniform, below and normal with the
 * moments and ranges their contracts say, over a fixed sample (a fixed
 * seed: the same numbers every run, so the bounds cannot flake).
 */
#include <criterion/criterion.h>
#include <math.h>

#include "core/mr_rng.h"

Test(rng, splitmix64_and_xoshiro256ss_give_the_reference_outputs)
{
	uint64_t st = 0;
	struct mr_rng r = { { 1, 2, 3, 4 } };

	cr_expect_eq(mr_splitmix64(&st), 0xE220A8397B1DCDAFull);
	cr_expect_eq(mr_splitmix64(&st), 0x6E789E6AA1B965F4ull);
	cr_expect_eq(mr_splitmix64(&st), 0x06C45D188009454Full);
	cr_expect_eq(mr_rng_next(&r), 11520ull);
	cr_expect_eq(mr_rng_next(&r), 0ull);
	cr_expect_eq(mr_rng_next(&r), 1509978240ull);
	cr_expect_eq(mr_rng_next(&r), 1215971899390074240ull);
}

Test(rng, seeds_repeat_and_streams_differ)
{
	struct mr_rng a, b, c;
	int same_stream = 0, other_stream = 0;

	mr_rng_seed(&a, 1337, 5);
	mr_rng_seed(&b, 1337, 5);
	mr_rng_seed(&c, 1337, 6);
	for (int i = 0; i < 1000; i++) {
		uint64_t x = mr_rng_next(&a);
		same_stream += x == mr_rng_next(&b);
		other_stream += x == mr_rng_next(&c);
	}
	cr_expect_eq(same_stream, 1000, "one (seed, stream) gave two sequences");
	cr_expect_eq(other_stream, 0, "streams 5 and 6 share %d values", other_stream);
}

Test(rng, uniform_below_and_normal_keep_their_contracts)
{
	enum { N = 200000 };
	struct mr_rng r;
	double su = 0, sn = 0, sn2 = 0, sn4 = 0;
	long hits[7] = { 0 };

	mr_rng_seed(&r, 42, 0);
	for (int i = 0; i < N; i++) {
		double u = mr_rng_uniform(&r);
		uint64_t k = mr_rng_below(&r, 7);
		double z = mr_rng_normal(&r);

		cr_assert(u >= 0.0 && u < 1.0, "uniform gave %.17g", u);
		cr_assert_lt(k, 7u);
		hits[k]++;
		su += u;
		sn += z;
		sn2 += z * z;
		sn4 += z * z * z * z;
	}
	/* standard errors at N = 2e5: mean(u) 6.5e-4, mean(z) 2.2e-3,
	 * var(z) 3.2e-3, kurtosis 1.1e-2; the bounds are 5 of them */
	cr_expect(fabs(su / N - 0.5) < 3.3e-3, "uniform mean %g", su / N);
	cr_expect(fabs(sn / N) < 1.1e-2, "normal mean %g", sn / N);
	cr_expect(fabs(sn2 / N - 1.0) < 1.6e-2, "normal variance %g", sn2 / N);
	cr_expect(fabs(sn4 / N - 3.0) < 0.12, "normal fourth moment %g (3 for a normal)", sn4 / N);
	for (int k = 0; k < 7; k++) /* N/7 = 28571, sd 156 */
		cr_expect(labs(hits[k] - N / 7) < 800, "below(7) gave %d %ld times", k, hits[k]);
}
