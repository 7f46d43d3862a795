/*
 * llama.cu - the Llama family's kernels (see mr_cuda.h): RMSNorm forward
 * and backward, rotary positions forward and backward, the SwiGLU gate
 * forward and backward. Twins: kernels/rmsnorm.c, rope.c, swiglu.c.
 *
 * RMSNorm: one warp per row, its sum of squares a warp shuffle in fp32;
 * dw a column sum in fixed chunks, then the chunks in order (no atomics,
 * deterministic), as layernorm.cu. Rotary: one thread per rotated pair
 * (row, head, i), its angle pos * inv_freq[i] in fp32 as the twin. SwiGLU:
 * one thread per gate element.
 *
 * Non-goals: fusing RMSNorm with the residual add or rotary with the QKV
 * GEMM's epilogue (the next speed step, issue 27).
 */
#include "cuda_int.cuh"

#define RMS_ROWS_PER_BLOCK (MR__CU_THREADS / 32)
#define RMS_ROWS_PER_CHUNK 64

template <typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C,
				   float eps)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5);
	float ss = 0.0f, s;

	if (row >= N)
		return;
	const T *x = inp + (size_t)row * C;
	T *o = out + (size_t)row * C;
	for (int c = lane; c < C; c += 32) {
		float v = mr__ld(x + c);
		ss += v * v;
	}
	s = 1.0f / sqrtf(mr__warp_sum(ss) / (float)C + eps);
	for (int c = lane; c < C; c += 32)
		mr__st(o + c, mr__ld(x + c) * s * mr__ld(w + c));
	if (lane == 0)
		rstd[row] = s;
}

/* dx += s (w dy - n mean(w dy n)), n = x s. */
template <typename T>
__global__ void rmsnorm_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
				    const float *rstd, int N, int C)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5);
	float gn = 0.0f, m, s;

	if (row >= N)
		return;
	const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
	T *dx = dinp + (size_t)row * C;
	s = rstd[row];
	for (int c = lane; c < C; c += 32)
		gn += mr__ld(w + c) * mr__ld(dy + c) * mr__ld(x + c) * s;
	m = mr__warp_sum(gn) / (float)C;
	for (int c = lane; c < C; c += 32) {
		float n = mr__ld(x + c) * s;
		mr__st(dx + c, mr__ld(dx + c) + s * (mr__ld(w + c) * mr__ld(dy + c) - n * m));
	}
}

/* part (nchunks, C): dw partial sums over RMS_ROWS_PER_CHUNK rows. */
template <typename T>
__global__ void rmsnorm_dw_partial_kernel(float *part, const T *dout, const T *inp,
					  const float *rstd, int N, int C)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	int r0 = blockIdx.y * RMS_ROWS_PER_CHUNK, r1 = min(r0 + RMS_ROWS_PER_CHUNK, N);
	float sw = 0.0f;

	if (c >= C)
		return;
	for (int r = r0; r < r1; r++)
		sw += mr__ld(dout + (size_t)r * C + c) * mr__ld(inp + (size_t)r * C + c) * rstd[r];
	part[(size_t)blockIdx.y * C + c] = sw;
}

__global__ void rmsnorm_dw_final_kernel(float *dw, const float *part, int nchunks, int C)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	float sw = 0.0f;

	if (c >= C)
		return;
	for (int k = 0; k < nchunks; k++)
		sw += part[(size_t)k * C + c];
	dw[c] += sw;
}

template <typename T>
static int rmsnorm_fwd(struct mr_cuda *cu, void *out, float *rstd, const void *inp,
		       const void *w, int N, int C, float eps)
{
	unsigned int nb = (unsigned int)((N + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK);

	rmsnorm_fwd_kernel<T><<<nb, MR__CU_THREADS, 0, cu->stream>>>(
		(T *)out, rstd, (const T *)inp, (const T *)w, N, C, eps);
	return mr__cuda_launched(cu, "rmsnorm_fwd");
}

template <typename T>
static int rmsnorm_bwd(struct mr_cuda *cu, void *dinp, float *dw, const void *dout,
		       const void *inp, const void *w, const float *rstd, int N, int C)
{
	unsigned int nb = (unsigned int)((N + RMS_ROWS_PER_BLOCK - 1) / RMS_ROWS_PER_BLOCK);
	unsigned int gx = (unsigned int)((C + MR__CU_THREADS - 1) / MR__CU_THREADS);
	int nchunks = (N + RMS_ROWS_PER_CHUNK - 1) / RMS_ROWS_PER_CHUNK, rc;
	float *part;

	if ((rc = mr__cuda_scratch(cu, (size_t)nchunks * C * sizeof(float), &part)))
		return rc;
	rmsnorm_dinp_kernel<T><<<nb, MR__CU_THREADS, 0, cu->stream>>>(
		(T *)dinp, (const T *)dout, (const T *)inp, (const T *)w, rstd, N, C);
	rmsnorm_dw_partial_kernel<T><<<dim3(gx, (unsigned int)nchunks), MR__CU_THREADS, 0,
				       cu->stream>>>(part, (const T *)dout, (const T *)inp, rstd,
						     N, C);
	rmsnorm_dw_final_kernel<<<gx, MR__CU_THREADS, 0, cu->stream>>>(dw, part, nchunks, C);
	return mr__cuda_launched(cu, "rmsnorm_bwd");
}

extern "C" int mr_cuda_rmsnorm_fwd(struct mr_cuda *cu, void *out, float *rstd, const void *inp,
				   const void *w, int N, int C, float eps)
{
	if (N <= 0 || C <= 0)
		return mr__cuda_inval(cu, "rmsnorm_fwd");
	return MR__BY_ACT(cu, rmsnorm_fwd, cu, out, rstd, inp, w, N, C, eps);
}

extern "C" int mr_cuda_rmsnorm_bwd(struct mr_cuda *cu, void *dinp, float *dw, const void *dout,
				   const void *inp, const void *w, const float *rstd, int N, int C)
{
	if (N <= 0 || C <= 0)
		return mr__cuda_inval(cu, "rmsnorm_bwd");
	return MR__BY_ACT(cu, rmsnorm_bwd, cu, dinp, dw, dout, inp, w, rstd, N, C);
}

/* ---- rotary positions -------------------------------------------------------- */

/* One thread per pair (n, h, i): dir 1 rotates by the angle, -1 back. */
template <typename T>
__global__ void rope_kernel(T *x, size_t stride, int N, int nheads, int D, const int *pos,
			    const float *inv_freq, float dir)
{
	int half = D / 2;
	size_t total = (size_t)N * nheads * half;

	for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
	     k += (size_t)gridDim.x * blockDim.x) {
		int i = (int)(k % half);
		size_t nh = k / half;
		int h = (int)(nh % nheads);
		size_t n = nh / nheads;
		float ang = (float)pos[n] * inv_freq[i], c, s;
		T *x1 = x + n * stride + (size_t)h * D + i, *x2 = x1 + half;
		float u = mr__ld(x1), v = mr__ld(x2);

		sincosf(ang, &s, &c);
		s *= dir;
		mr__st(x1, u * c - v * s);
		mr__st(x2, v * c + u * s);
	}
}

template <typename T>
static int rope(struct mr_cuda *cu, void *x, size_t stride, int N, int nheads, int D,
		const int *pos, const float *inv_freq, float dir)
{
	unsigned int nb = mr__cu_blocks((size_t)N * nheads * (D / 2), MR__CU_THREADS);

	rope_kernel<T><<<nb, MR__CU_THREADS, 0, cu->stream>>>((T *)x, stride, N, nheads, D, pos,
							       inv_freq, dir);
	return mr__cuda_launched(cu, dir > 0 ? "rope_fwd" : "rope_bwd");
}

extern "C" int mr_cuda_rope_fwd(struct mr_cuda *cu, void *x, size_t stride, int N, int nheads,
				int D, const int *pos, const float *inv_freq)
{
	if (N <= 0 || nheads <= 0 || D <= 0 || D % 2 || stride < (size_t)nheads * D)
		return mr__cuda_inval(cu, "rope_fwd");
	return MR__BY_ACT(cu, rope, cu, x, stride, N, nheads, D, pos, inv_freq, 1.0f);
}

extern "C" int mr_cuda_rope_bwd(struct mr_cuda *cu, void *dx, size_t stride, int N, int nheads,
				int D, const int *pos, const float *inv_freq)
{
	if (N <= 0 || nheads <= 0 || D <= 0 || D % 2 || stride < (size_t)nheads * D)
		return mr__cuda_inval(cu, "rope_bwd");
	return MR__BY_ACT(cu, rope, cu, dx, stride, N, nheads, D, pos, inv_freq, -1.0f);
}

/* ---- SwiGLU --------------------------------------------------------------------- */

template <typename T>
__global__ void swiglu_fwd_kernel(T *out, const T *ab, int N, int F)
{
	size_t total = (size_t)N * F;

	for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
	     k += (size_t)gridDim.x * blockDim.x) {
		size_t n = k / F, c = k % F;
		float a = mr__ld(ab + n * 2 * F + c), b = mr__ld(ab + n * 2 * F + F + c);

		mr__st(out + k, a / (1.0f + expf(-a)) * b);
	}
}

template <typename T>
__global__ void swiglu_bwd_kernel(T *dab, const T *ab, const T *dout, int N, int F)
{
	size_t total = (size_t)N * F;

	for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
	     k += (size_t)gridDim.x * blockDim.x) {
		size_t n = k / F, c = k % F;
		float a = mr__ld(ab + n * 2 * F + c), b = mr__ld(ab + n * 2 * F + F + c);
		float g = mr__ld(dout + k), s = 1.0f / (1.0f + expf(-a));

		mr__st(dab + n * 2 * F + c, g * b * s * (1.0f + a * (1.0f - s)));
		mr__st(dab + n * 2 * F + F + c, g * a * s);
	}
}

template <typename T>
static int swiglu_fwd(struct mr_cuda *cu, void *out, const void *ab, int N, int F)
{
	unsigned int nb = mr__cu_blocks((size_t)N * F, MR__CU_THREADS);

	swiglu_fwd_kernel<T><<<nb, MR__CU_THREADS, 0, cu->stream>>>((T *)out, (const T *)ab, N, F);
	return mr__cuda_launched(cu, "swiglu_fwd");
}

template <typename T>
static int swiglu_bwd(struct mr_cuda *cu, void *dab, const void *ab, const void *dout, int N,
		      int F)
{
	unsigned int nb = mr__cu_blocks((size_t)N * F, MR__CU_THREADS);

	swiglu_bwd_kernel<T><<<nb, MR__CU_THREADS, 0, cu->stream>>>((T *)dab, (const T *)ab,
								     (const T *)dout, N, F);
	return mr__cuda_launched(cu, "swiglu_bwd");
}

extern "C" int mr_cuda_swiglu_fwd(struct mr_cuda *cu, void *out, const void *ab, int N, int F)
{
	if (N <= 0 || F <= 0)
		return mr__cuda_inval(cu, "swiglu_fwd");
	return MR__BY_ACT(cu, swiglu_fwd, cu, out, ab, N, F);
}

extern "C" int mr_cuda_swiglu_bwd(struct mr_cuda *cu, void *dab, const void *ab, const void *dout,
				  int N, int F)
{
	if (N <= 0 || F <= 0)
		return mr__cuda_inval(cu, "swiglu_bwd");
	return MR__BY_ACT(cu, swiglu_bwd, cu, dab, ab, dout, N, F);
}
