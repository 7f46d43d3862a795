/*
 * llama.cu - the Llama family's kernels (see mr_cuda.h): RMSNorm forward
 * and backward, rotary positions forward and backward, the SwiGLU gate
 * forward and backward. Twins: kernels/rmsnorm.c, rope.c, swiglu.c.
 *
 * RMSNorm: one warp per row, its sum of squares a warp shuffle in fp32;
 * dw a column sum in fixed chunks, then the chunks in order (no atomics,
 * deterministic), as layernorm.cu. Rotary: one thread per rotated pair
 * (row, head, i), its angle pos * inv_freq[i] in fp32 as the twin. SwiGLU:
 * one thread per gate element. Rows whose buffers are 16-byte aligned and
 * whose width is a whole number of packs move 16 bytes per load
 * (mr__ld_n, as layernorm.cu), element by element otherwise; each
 * element's arithmetic is the same either way, and every sum has one
 * fixed order per path (deterministic).
 *
 * Non-goals: fusing RMSNorm with the residual add or rotary with the QKV
 * GEMM's epilogue (the next speed step, issue 27).
 */
#include "cuda_int.cuh"

#define RMS_ROWS_PER_BLOCK (MR__CU_THREADS / 32)
#define RMS_ROWS_PER_CHUNK 64

template <int P, typename T>
__global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const T *inp, const T *w, int N, int C,
				   float eps)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5);
	float ss = 0.0f, s, f[P], fw[P];

	if (row >= N)
		return;
	const T *x = inp + (size_t)row * C;
	T *o = out + (size_t)row * C;
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(f, x + c);
#pragma unroll
		for (int j = 0; j < P; j++)
			ss += f[j] * f[j];
	}
	s = 1.0f / sqrtf(mr__warp_sum(ss) / (float)C + eps);
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(f, x + c);
		mr__ld_n<P>(fw, w + c);
#pragma unroll
		for (int j = 0; j < P; j++)
			f[j] = f[j] * s * fw[j];
		mr__st_n<P>(o + c, f);
	}
	if (lane == 0)
		rstd[row] = s;
}

/* dx += s (w dy - n mean(w dy n)), n = x s. */
template <int P, typename T>
__global__ void rmsnorm_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
				    const float *rstd, int N, int C)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * RMS_ROWS_PER_BLOCK + (threadIdx.x >> 5);
	float gn = 0.0f, m, s, fx[P], fy[P], fw[P], fd[P];

	if (row >= N)
		return;
	const T *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
	T *dx = dinp + (size_t)row * C;
	s = rstd[row];
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(fx, x + c);
		mr__ld_n<P>(fy, dy + c);
		mr__ld_n<P>(fw, w + c);
#pragma unroll
		for (int j = 0; j < P; j++)
			gn += fw[j] * fy[j] * fx[j] * s;
	}
	m = mr__warp_sum(gn) / (float)C;
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(fx, x + c);
		mr__ld_n<P>(fy, dy + c);
		mr__ld_n<P>(fw, w + c);
		mr__ld_n<P>(fd, dx + c);
#pragma unroll
		for (int j = 0; j < P; j++) {
			float n = fx[j] * s;
			fd[j] += s * (fw[j] * fy[j] - n * m);
		}
		mr__st_n<P>(dx + c, fd);
	}
}

/* part (nchunks, C): dw partial sums over RMS_ROWS_PER_CHUNK rows; a
 * thread sums P adjacent columns, each in row order. */
template <int P, typename T>
__global__ void rmsnorm_dw_partial_kernel(float *part, const T *dout, const T *inp,
					  const float *rstd, int N, int C)
{
	int c = (blockIdx.x * blockDim.x + threadIdx.x) * P;
	int r0 = blockIdx.y * RMS_ROWS_PER_CHUNK, r1 = min(r0 + RMS_ROWS_PER_CHUNK, N);
	float sw[P], fy[P], fx[P];

	if (c >= C)
		return;
#pragma unroll
	for (int j = 0; j < P; j++)
		sw[j] = 0.0f;
	for (int r = r0; r < r1; r++) {
		float s = rstd[r];

		mr__ld_n<P>(fy, dout + (size_t)r * C + c);
		mr__ld_n<P>(fx, inp + (size_t)r * C + c);
#pragma unroll
		for (int j = 0; j < P; j++)
			sw[j] += fy[j] * fx[j] * s;
	}
#pragma unroll
	for (int j = 0; j < P; j++)
		part[(size_t)blockIdx.y * C + c + j] = sw[j];
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

	MR__LAUNCH_PACKED(mr__pack_width<T>(C, out, inp, w, NULL) > 1, rmsnorm_fwd_kernel, T, nb,
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
	/* the column sums pack where dout and inp rows do */
	int P = mr__pack_width<T>(C, dout, inp, NULL, NULL);
	unsigned int gp = (unsigned int)((C / P + MR__CU_THREADS - 1) / MR__CU_THREADS);
	float *part;

	if ((rc = mr__cuda_scratch(cu, (size_t)nchunks * C * sizeof(float), &part)))
		return rc;
	MR__LAUNCH_PACKED(mr__pack_width<T>(C, dinp, dout, inp, w) > 1, rmsnorm_dinp_kernel, T, nb,
			  (T *)dinp, (const T *)dout, (const T *)inp, (const T *)w, rstd, N, C);
	MR__LAUNCH_PACKED(P > 1, rmsnorm_dw_partial_kernel, T, dim3(gp, (unsigned int)nchunks),
			  part, (const T *)dout, (const T *)inp, rstd, N, C);
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

/* One thread per P pairs (n, h, i..i+P-1): dir 1 rotates by the angle, -1
 * back; each pair's angle pos * inv_freq[i] in fp32 as the twin. */
template <int P, typename T>
__global__ void rope_kernel(T *x, size_t stride, int N, int nheads, int D, const int *pos,
			    const float *inv_freq, float dir)
{
	int half = D / 2, packs = half / P;
	size_t total = (size_t)N * nheads * packs;

	for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
	     k += (size_t)gridDim.x * blockDim.x) {
		int i = (int)(k % packs) * P;
		size_t nh = k / packs;
		int h = (int)(nh % nheads);
		size_t n = nh / nheads;
		T *x1 = x + n * stride + (size_t)h * D + i, *x2 = x1 + half;
		float u[P], v[P], o1[P], o2[P];

		mr__ld_n<P>(u, x1);
		mr__ld_n<P>(v, x2);
#pragma unroll
		for (int j = 0; j < P; j++) {
			float ang = (float)pos[n] * inv_freq[i + j], c, s;

			sincosf(ang, &s, &c);
			s *= dir;
			o1[j] = u[j] * c - v[j] * s;
			o2[j] = v[j] * c + u[j] * s;
		}
		mr__st_n<P>(x1, o1);
		mr__st_n<P>(x2, o2);
	}
}

template <typename T>
static int rope(struct mr_cuda *cu, void *x, size_t stride, int N, int nheads, int D,
		const int *pos, const float *inv_freq, float dir)
{
	/* packed where a head's halves and every row start on a pack */
	int P = mr__pack_width<T>((size_t)D / 2, x, NULL, NULL, NULL);
	unsigned int nb;

	if (stride % (size_t)P)
		P = 1;
	nb = mr__cu_blocks((size_t)N * nheads * (D / 2 / P), MR__CU_THREADS);
	MR__LAUNCH_PACKED(P > 1, rope_kernel, T, nb, (T *)x, stride, N, nheads, D, pos, inv_freq,
			  dir);
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

/* out (N, F) = silu(a) * b over ab (N, 2F) = [a | b]: a thread per P
 * adjacent elements of a row. */
template <int P, typename T>
__global__ void swiglu_fwd_kernel(T *out, const T *ab, int N, int F)
{
	size_t total = (size_t)N * F / P;

	for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
	     k += (size_t)gridDim.x * blockDim.x) {
		size_t n = k * P / F, c = k * P % F;
		float a[P], b[P], o[P];

		mr__ld_n<P>(a, ab + n * 2 * F + c);
		mr__ld_n<P>(b, ab + n * 2 * F + F + c);
#pragma unroll
		for (int j = 0; j < P; j++)
			o[j] = a[j] / (1.0f + expf(-a[j])) * b[j];
		mr__st_n<P>(out + k * P, o);
	}
}

template <int P, typename T>
__global__ void swiglu_bwd_kernel(T *dab, const T *ab, const T *dout, int N, int F)
{
	size_t total = (size_t)N * F / P;

	for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total;
	     k += (size_t)gridDim.x * blockDim.x) {
		size_t n = k * P / F, c = k * P % F;
		float a[P], b[P], g[P], da[P], db[P];

		mr__ld_n<P>(a, ab + n * 2 * F + c);
		mr__ld_n<P>(b, ab + n * 2 * F + F + c);
		mr__ld_n<P>(g, dout + k * P);
#pragma unroll
		for (int j = 0; j < P; j++) {
			float s = 1.0f / (1.0f + expf(-a[j]));

			da[j] = g[j] * b[j] * s * (1.0f + a[j] * (1.0f - s));
			db[j] = g[j] * a[j] * s;
		}
		mr__st_n<P>(dab + n * 2 * F + c, da);
		mr__st_n<P>(dab + n * 2 * F + F + c, db);
	}
}

template <typename T>
static int swiglu_fwd(struct mr_cuda *cu, void *out, const void *ab, int N, int F)
{
	int P = mr__pack_width<T>((size_t)F, out, ab, NULL, NULL);
	unsigned int nb = mr__cu_blocks((size_t)N * F / P, MR__CU_THREADS);

	MR__LAUNCH_PACKED(P > 1, swiglu_fwd_kernel, T, nb, (T *)out, (const T *)ab, N, F);
	return mr__cuda_launched(cu, "swiglu_fwd");
}

template <typename T>
static int swiglu_bwd(struct mr_cuda *cu, void *dab, const void *ab, const void *dout, int N,
		      int F)
{
	int P = mr__pack_width<T>((size_t)F, dab, ab, dout, NULL);
	unsigned int nb = mr__cu_blocks((size_t)N * F / P, MR__CU_THREADS);

	MR__LAUNCH_PACKED(P > 1, swiglu_bwd_kernel, T, nb, (T *)dab, (const T *)ab,
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
