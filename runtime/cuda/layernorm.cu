/*
 * layernorm.cu - LayerNorm forward/backward over the last dimension (see
 * mr_cuda.h).
 *
 * One warp per row: statistics and the row terms of the backward are warp
 * shuffles in fp32 (two passes for the variance, as the CPU twin does).
 * dw/db are column sums: one thread per column sums a chunk of rows into a
 * partial, a second kernel adds the partials in chunk order - no atomics,
 * deterministic.
 *
 * The residual add before a LayerNorm can ride in the norm's kernel
 * (mr_cuda_add_layernorm_fwd): each lane first adds and stores its
 * columns of the row, then runs the same row function over them, reading
 * back exactly the rounded values it stored (a lane reads only the
 * columns it wrote), so the result is the two kernels' bit for bit.
 *
 * Rows whose buffers are 16-byte aligned and whose width is a whole number
 * of 16-byte packs move a pack per load (mr__ld_n/mr__st_n, 8 bf16 or 4
 * floats): a lane owns packs lane, lane + 32, ... of the row, and a dw/db
 * thread P adjacent columns; other rows go element by element. Either way
 * the order of every sum is fixed.
 *
 * Non-goals: RMSNorm (llama.cu), fusing across blocks.
 */
#include "cuda_int.cuh"

#define LN_ROWS_PER_BLOCK (MR__CU_THREADS / 32)
#define LN_ROWS_PER_CHUNK 64

/* One row's LayerNorm by one warp (lane: this thread's lane); a lane
 * visits its packs of P columns, lane * P + 32 * P * k. */
template <int P, typename T>
__device__ __forceinline__ void layernorm_row(T *out, float *mean, float *rstd, const T *inp,
					      const T *w, const T *b, int row, int C, int lane)
{
	const T *x = inp + (size_t)row * C;
	T *o = out + (size_t)row * C;
	float m = 0.0f, v = 0.0f, s, f[P], fw[P], fb[P];

	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(f, x + c);
#pragma unroll
		for (int j = 0; j < P; j++)
			m += f[j];
	}
	m = mr__warp_sum(m) / (float)C;
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(f, x + c);
#pragma unroll
		for (int j = 0; j < P; j++) {
			float d = f[j] - m;
			v += d * d;
		}
	}
	v = mr__warp_sum(v) / (float)C;
	s = 1.0f / sqrtf(v + MR_LN_EPS_CU);
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(f, x + c);
		mr__ld_n<P>(fw, w + c);
		mr__ld_n<P>(fb, b + c);
#pragma unroll
		for (int j = 0; j < P; j++)
			f[j] = (f[j] - m) * s * fw[j] + fb[j];
		mr__st_n<P>(o + c, f);
	}
	if (lane == 0) {
		mean[row] = m;
		rstd[row] = s;
	}
}

template <int P, typename T>
__global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const T *inp, const T *w,
				     const T *b, int N, int C)
{
	int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5);

	if (row < N)
		layernorm_row<P, T>(out, mean, rstd, inp, w, b, row, C, threadIdx.x & 31);
}

/* y += x row by row, then the row's norm over the stored y: a lane adds
 * the same packs of columns the norm then reads, so it reads back only
 * what it wrote. */
template <int P, typename T>
__global__ void add_layernorm_fwd_kernel(T *y, T *out, float *mean, float *rstd, const T *x,
					 const T *w, const T *b, int N, int C)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5);
	float fy[P], fx[P];
	T *yr;
	const T *xr;

	if (row >= N)
		return;
	yr = y + (size_t)row * C;
	xr = x + (size_t)row * C;
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(fy, yr + c);
		mr__ld_n<P>(fx, xr + c);
#pragma unroll
		for (int j = 0; j < P; j++)
			fy[j] += fx[j];
		mr__st_n<P>(yr + c, fy);
	}
	layernorm_row<P, T>(out, mean, rstd, y, w, b, row, C, lane);
}

template <int P, typename T>
__global__ void layernorm_dinp_kernel(T *dinp, const T *dout, const T *inp, const T *w,
				      const float *mean, const float *rstd, int N, int C)
{
	int lane = threadIdx.x & 31;
	int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5);
	const T *x, *dy;
	T *dx;
	float m, s, dnm = 0.0f, dnn = 0.0f, fx[P], fy[P], fw[P], fd[P];

	if (row >= N)
		return;
	x = inp + (size_t)row * C;
	dy = dout + (size_t)row * C;
	dx = dinp + (size_t)row * C;
	m = mean[row];
	s = rstd[row];
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(fx, x + c);
		mr__ld_n<P>(fy, dy + c);
		mr__ld_n<P>(fw, w + c);
#pragma unroll
		for (int j = 0; j < P; j++) {
			float n = (fx[j] - m) * s;
			float dn = fw[j] * fy[j];
			dnm += dn;
			dnn += dn * n;
		}
	}
	dnm = mr__warp_sum(dnm) / (float)C;
	dnn = mr__warp_sum(dnn) / (float)C;
	for (int c = lane * P; c < C; c += 32 * P) {
		mr__ld_n<P>(fx, x + c);
		mr__ld_n<P>(fy, dy + c);
		mr__ld_n<P>(fw, w + c);
		mr__ld_n<P>(fd, dx + c);
#pragma unroll
		for (int j = 0; j < P; j++) {
			float n = (fx[j] - m) * s;
			float dn = fw[j] * fy[j];
			fd[j] += s * (dn - dnm - n * dnn);
		}
		mr__st_n<P>(dx + c, fd);
	}
}

/* part (2, nchunks, C): [dw | db] partial sums over LN_ROWS_PER_CHUNK rows;
 * a thread sums P adjacent columns, each in row order. */
template <int P, typename T>
__global__ void layernorm_dwdb_partial_kernel(float *part, const T *dout, const T *inp,
					      const float *mean, const float *rstd, int N, int C)
{
	int c = (blockIdx.x * blockDim.x + threadIdx.x) * P;
	int r0 = blockIdx.y * LN_ROWS_PER_CHUNK, r1 = min(r0 + LN_ROWS_PER_CHUNK, N);
	float sw[P], sb[P], fy[P], fx[P];

	if (c >= C)
		return;
#pragma unroll
	for (int j = 0; j < P; j++)
		sw[j] = sb[j] = 0.0f;
	for (int r = r0; r < r1; r++) {
		float m = mean[r], s = rstd[r];

		mr__ld_n<P>(fy, dout + (size_t)r * C + c);
		mr__ld_n<P>(fx, inp + (size_t)r * C + c);
#pragma unroll
		for (int j = 0; j < P; j++) {
			float n = (fx[j] - m) * s;
			sw[j] += n * fy[j];
			sb[j] += fy[j];
		}
	}
#pragma unroll
	for (int j = 0; j < P; j++) {
		part[(size_t)blockIdx.y * C + c + j] = sw[j];
		part[((size_t)gridDim.y + blockIdx.y) * C + c + j] = sb[j];
	}
}

__global__ void layernorm_dwdb_final_kernel(float *dw, float *db, const float *part,
					    int nchunks, int C)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	float sw = 0.0f, sb = 0.0f;

	if (c >= C)
		return;
	for (int k = 0; k < nchunks; k++) {
		sw += part[(size_t)k * C + c];
		sb += part[((size_t)nchunks + k) * C + c];
	}
	dw[c] += sw;
	db[c] += sb;
}

template <typename T>
static int layernorm_fwd(struct mr_cuda *cu, void *out, float *mean, float *rstd,
			 const void *inp, const void *w, const void *b, int N, int C)
{
	unsigned int nb = (unsigned int)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);

	MR__LAUNCH_PACKED(mr__pack_width<T>(C, out, inp, w, b) > 1, layernorm_fwd_kernel, T, nb,
			  (T *)out, mean, rstd, (const T *)inp, (const T *)w, (const T *)b, N, C);
	return mr__cuda_launched(cu, "layernorm_fwd");
}

template <typename T>
static int add_layernorm_fwd(struct mr_cuda *cu, void *y, void *out, float *mean, float *rstd,
			     const void *x, const void *w, const void *b, int N, int C)
{
	unsigned int nb = (unsigned int)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
	int P = mr__pack_width<T>(C, out, y, w, b);

	/* the norm's pack width must be the one layernorm_fwd would pick, and
	 * the add's the same: an unaligned x with a packed norm runs apart */
	if (P > 1 && !mr__aligned16(x, NULL, NULL)) {
		int rc = mr_cuda_add_inplace(cu, y, x, (size_t)N * C);
		return rc ? rc : layernorm_fwd<T>(cu, out, mean, rstd, y, w, b, N, C);
	}
	MR__LAUNCH_PACKED(P > 1, add_layernorm_fwd_kernel, T, nb, (T *)y, (T *)out, mean, rstd,
			  (const T *)x, (const T *)w, (const T *)b, N, C);
	return mr__cuda_launched(cu, "add_layernorm_fwd");
}

template <typename T>
static int layernorm_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *db, const void *dout,
			 const void *inp, const void *w, const float *mean, const float *rstd,
			 int N, int C)
{
	unsigned int nb = (unsigned int)((N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
	unsigned int gx = (unsigned int)((C + MR__CU_THREADS - 1) / MR__CU_THREADS);
	int nchunks = (N + LN_ROWS_PER_CHUNK - 1) / LN_ROWS_PER_CHUNK, rc;
	/* the column sums pack where dout and inp rows do */
	int P = mr__pack_width<T>(C, dout, inp, NULL, NULL);
	unsigned int gp = (unsigned int)((C / P + MR__CU_THREADS - 1) / MR__CU_THREADS);
	float *part;

	rc = mr__cuda_scratch(cu, 2 * (size_t)nchunks * C * sizeof(float), &part);
	if (rc)
		return rc;
	MR__LAUNCH_PACKED(mr__pack_width<T>(C, dinp, dout, inp, w) > 1, layernorm_dinp_kernel, T,
			  nb, (T *)dinp, (const T *)dout, (const T *)inp, (const T *)w, mean,
			  rstd, N, C);
	MR__LAUNCH_PACKED(P > 1, layernorm_dwdb_partial_kernel, T,
			  dim3(gp, (unsigned int)nchunks), part, (const T *)dout,
			  (const T *)inp, mean, rstd, N, C);
	layernorm_dwdb_final_kernel<<<gx, MR__CU_THREADS, 0, cu->stream>>>(dw, db, part, nchunks,
									   C);
	return mr__cuda_launched(cu, "layernorm_bwd");
}

extern "C" int mr_cuda_layernorm_fwd(struct mr_cuda *cu, void *out, float *mean, float *rstd,
				     const void *inp, const void *w, const void *b, int N, int C)
{
	if (N <= 0 || C <= 0)
		return mr__cuda_inval(cu, "layernorm_fwd");
	return MR__BY_ACT(cu, layernorm_fwd, cu, out, mean, rstd, inp, w, b, N, C);
}

extern "C" int mr_cuda_add_layernorm_fwd(struct mr_cuda *cu, void *y, void *out, float *mean,
					 float *rstd, const void *x, const void *w, const void *b,
					 int N, int C)
{
	if (N <= 0 || C <= 0)
		return mr__cuda_inval(cu, "add_layernorm_fwd");
	return MR__BY_ACT(cu, add_layernorm_fwd, cu, y, out, mean, rstd, x, w, b, N, C);
}

extern "C" int mr_cuda_layernorm_bwd(struct mr_cuda *cu, void *dinp, float *dw, float *db,
				     const void *dout, const void *inp, const void *w,
				     const float *mean, const float *rstd, int N, int C)
{
	if (N <= 0 || C <= 0)
		return mr__cuda_inval(cu, "layernorm_bwd");
	return MR__BY_ACT(cu, layernorm_bwd, cu, dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}
