/*
 * reduce.c - element-wise reduction kernels, bf16 <-> fp32 conversion and
 * the streaming copy of the communicator backends.
 *
 * fp32 sum and max, the hot paths, are written with GCC vector extensions:
 * -O2 leaves loops of unknown length scalar (GCC 12 "very cheap" vectoriser
 * cost model), several times slower than the copies around them. Results
 * are bit-identical to the scalar loops (one IEEE operation per element).
 *
 * Non-goals: SIMD intrinsics (plain loops the compiler vectorises).
 */
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#include "comm_int.h"

#define RED_LOOP(T)                                                        \
	do {                                                               \
		T *d = dst;                                                \
		const T *s = src;                                          \
		if (redop == MR_COMM_MAX) {                                \
			for (size_t i = 0; i < n; i++)                     \
				d[i] = s[i] > d[i] ? s[i] : d[i];          \
		} else {                                                   \
			for (size_t i = 0; i < n; i++)                     \
				d[i] += s[i];                              \
		}                                                          \
	} while (0)

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

/* d = x op y over n floats (d may be x) */
static void f32_op(float *d, const float *x, const float *y, size_t n, int redop)
{
	size_t i = 0;

	for (; i + 4 <= n; i += 4) {
		v4f a, b;

		memcpy(&a, x + i, sizeof(a));
		memcpy(&b, y + i, sizeof(b));
		if (redop == MR_COMM_MAX) {
			v4i m = b > a, ai, bi;

			memcpy(&ai, &a, sizeof(a));
			memcpy(&bi, &b, sizeof(b));
			ai = (bi & m) | (ai & ~m); /* y > x ? y : x */
			memcpy(&a, &ai, sizeof(a));
		} else {
			a += b;
		}
		memcpy(d + i, &a, sizeof(a));
	}
	for (; i < n; i++)
		d[i] = redop == MR_COMM_MAX ? (y[i] > x[i] ? y[i] : x[i]) : x[i] + y[i];
}

void mr__reduce(void *dst, const void *src, size_t n, int dtype, int redop)
{
	switch (dtype) {
	case MR_COMM_F32: f32_op(dst, dst, src, n, redop); break;
	case MR_COMM_I32: RED_LOOP(int32_t); break;
	case MR_COMM_I64: RED_LOOP(int64_t); break;
	default: break;
	}
}

#define RED3_LOOP(T)                                                       \
	do {                                                               \
		T *d = dst;                                                \
		const T *x = a, *y = b;                                    \
		if (redop == MR_COMM_MAX) {                                \
			for (size_t i = 0; i < n; i++)                     \
				d[i] = y[i] > x[i] ? y[i] : x[i];          \
		} else {                                                   \
			for (size_t i = 0; i < n; i++)                     \
				d[i] = x[i] + y[i];                        \
		}                                                          \
	} while (0)

void mr__reduce3(void *dst, const void *a, const void *b, size_t n, int dtype, int redop)
{
	switch (dtype) {
	case MR_COMM_F32: f32_op(dst, a, b, n, redop); break;
	case MR_COMM_I32: RED3_LOOP(int32_t); break;
	case MR_COMM_I64: RED3_LOOP(int64_t); break;
	default: break;
	}
}

void mr__scale_div(void *buf, size_t n, int dtype, int div)
{
	size_t i;

	if (div <= 1)
		return;
	switch (dtype) {
	case MR_COMM_F32: {
		float *p = buf;
		for (i = 0; i < n; i++)
			p[i] /= (float)div;
		break;
	}
	case MR_COMM_I32: {
		int32_t *p = buf;
		for (i = 0; i < n; i++)
			p[i] /= div;
		break;
	}
	case MR_COMM_I64: {
		int64_t *p = buf;
		for (i = 0; i < n; i++)
			p[i] /= div;
		break;
	}
	default:
		break;
	}
}

void mr__bf16_to_f32(float *dst, const uint16_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t u = (uint32_t)src[i] << 16;
		memcpy(&dst[i], &u, 4);
	}
}

void mr__f32_to_bf16(uint16_t *dst, const float *src, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t u;
		memcpy(&u, &src[i], 4);
		if ((u & 0x7fffffffu) > 0x7f800000u)
			dst[i] = (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
		else
			dst[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
	}
}

/* Measured on this 2-core VM (scripts/bench-comm.sh, docs/PERFORMANCE.md):
 * copying a 64 MiB message out of a cache-resident ring runs at ~8-9 GB/s
 * with plain stores (every destination line is read for ownership first)
 * and ~12 GB/s with SSE2 streaming stores, both cores copying at once. */
void mr__copy_stream(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
	char *d = dst;
	const char *s = src;
	size_t head = (16 - ((uintptr_t)d & 15)) & 15;

	if (n < 256) {
		memcpy(d, s, n);
		return;
	}
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	for (; n >= 64; n -= 64, d += 64, s += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));

		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), c);
		_mm_stream_si128((__m128i *)(d + 48), e);
	}
	memcpy(d, s, n);
	/* streaming stores are weakly ordered: complete them before whoever
	 * learns of this copy (ring tail, request done) can look */
	_mm_sfence();
#else
	memcpy(dst, src, n);
#endif
}
