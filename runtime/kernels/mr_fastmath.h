/*
 * mr_fastmath.h - a branch-free expf that the compiler can vectorise (libm's
 * expf is a call, which keeps a loop scalar).
 *
 * Range reduction x = k ln2 + r with a Cody-Waite split of ln2 and
 * round-to-nearest by the 1.5*2^23 trick, a degree-6 polynomial on
 * |r| <= ln2/2 (Cephes coefficients), and 2^k assembled in the exponent
 * bits. Relative error about 2 ulp; inputs are clamped to [-87, 88], so the
 * result never overflows and never goes subnormal (exp(-inf) is ~1e-38,
 * not 0). NaN in gives NaN out (the clamps map NaN to -87 first, so the
 * float-to-int conversion never sees it), so non-finite values still reach
 * the loss and gradient-norm checks.
 *
 * Used by GELU, softmax and cross-entropy. Non-goals: exact libm agreement.
 */
#ifndef MR_FASTMATH_H
#define MR_FASTMATH_H

#include <stdint.h>
#include <string.h>

static inline float mr_fast_expf(float x)
{
	const float log2e = 1.44269504088896341f, magic = 12582912.0f;
	const float c1 = 0.693359375f, c2 = -2.12194440e-4f;
	float x0 = x, t, fk, r, p, s;
	int32_t bits;

	x = x > -87.0f ? x : -87.0f; /* NaN -> -87 */
	x = x < 88.0f ? x : 88.0f;
	t = x * log2e + magic;
	fk = t - magic;
	r = x - fk * c1;
	r = r - fk * c2;
	p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * r * r + r + 1.0f;
	bits = ((int32_t)fk + 127) << 23;
	memcpy(&s, &bits, sizeof(s));
	return x0 == x0 ? p * s : x0;
}

#endif
