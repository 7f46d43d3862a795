/*
 * rope.c - rotary position embedding (Su et al. 2021, RoFormer) in the
 * rotate-half layout Hugging Face's Llama uses: in each head of size D,
 * element i and element i + D/2 (i < D/2) are a pair rotated by the angle
 * pos * inv_freq[i], inv_freq[i] = theta^(-2i/D); Llama 3.1's long-context
 * scaling of the frequencies is optional (mr_rope_scaling).
 *
 * In place on rows of heads (the q or k part of a qkv row), each row with
 * its own position: context parallelism hands each rank the positions of
 * its own chunks. Backward is the transposed rotation. Split across the
 * pool by rows; one cos/sin table per row, shared by its heads.
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#include <math.h>

#include "cpu/mr_simd.h"
#include "mr_kernels.h"

void mr_rope_freqs(float *inv_freq, int D, float theta, const struct mr_rope_scaling *sc)
{
	const float two_pi = 6.283185307179586f;

	for (int i = 0; i < D / 2; i++) {
		float f = 1.0f / powf(theta, (float)(2 * i) / (float)D);

		if (sc && sc->factor > 0) {
			/* Llama 3.1: long wavelengths slowed by factor, short ones
			 * kept, a linear blend between (by wavelength) */
			float old = (float)sc->original_max_pos, wl = two_pi / f;
			float lo = old / sc->low_freq_factor, hi = old / sc->high_freq_factor;

			if (wl > lo) {
				f /= sc->factor;
			} else if (wl >= hi) {
				float t = (old / wl - sc->low_freq_factor) /
					  (sc->high_freq_factor - sc->low_freq_factor);
				f = (1.0f - t) * f / sc->factor + t * f;
			}
		}
		inv_freq[i] = f;
	}
}

struct rope {
	float *x;
	size_t stride;
	int nheads, D, dir; /* dir 1: forward rotation, -1: its transpose */
	const int *pos;
	const float *inv_freq;
};

MR_HOT static void rope_rows(void *ctxp, size_t i0, size_t i1, int tid)
{
	const struct rope *a = ctxp;
	int half = a->D / 2;
	float c[MR_ROPE_MAX_D / 2], s[MR_ROPE_MAX_D / 2];

	(void)tid;
	for (size_t n = i0; n < i1; n++) {
		float p = (float)a->pos[n];

		for (int i = 0; i < half; i++) {
			float ang = p * a->inv_freq[i];
			c[i] = cosf(ang);
			s[i] = (float)a->dir * sinf(ang);
		}
		for (int h = 0; h < a->nheads; h++) {
			float *x1 = a->x + n * a->stride + (size_t)h * (size_t)a->D, *x2 = x1 + half;

			for (int i = 0; i < half; i++) {
				float u = x1[i], v = x2[i];
				x1[i] = u * c[i] - v * s[i];
				x2[i] = v * c[i] + u * s[i];
			}
		}
	}
}

static void run(struct mr_pool *p, float *x, size_t stride, int N, int nheads, int D,
		const int *pos, const float *inv_freq, int dir)
{
	struct rope a = { x, stride, nheads, D, dir, pos, inv_freq };

	mr_pool_run(p, (size_t)N, 8, rope_rows, &a);
}

void mr_rope_fwd(struct mr_pool *p, float *x, size_t stride, int N, int nheads, int D,
		 const int *pos, const float *inv_freq)
{
	run(p, x, stride, N, nheads, D, pos, inv_freq, 1);
}

void mr_rope_bwd(struct mr_pool *p, float *dx, size_t stride, int N, int nheads, int D,
		 const int *pos, const float *inv_freq)
{
	run(p, dx, stride, N, nheads, D, pos, inv_freq, -1);
}
