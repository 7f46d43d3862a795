/*
 * reduce.c - element-wise reduction kernels and bf16 <-> fp32 conversion
 * for the communicator backends.
 *
 * Non-goals: SIMD intrinsics (plain loops the compiler vectorises).
 */
#include <string.h>

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

void mr__reduce(void *dst, const void *src, size_t n, int dtype, int redop)
{
	switch (dtype) {
	case MR_COMM_F32: RED_LOOP(float); break;
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
	case MR_COMM_F32: RED3_LOOP(float); break;
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
