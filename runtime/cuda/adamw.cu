/*
 * adamw.cu - AdamW update on fp32 master weights (writing the compute copy
 * the kernels read, in the activation type), global gradient sum of
 * squares, gradient scaling (see mr_cuda.h; CPU twin in optim/mr_adamw.h).
 *
 * The update is the CPU twin's formula line for line; the bias-correction
 * terms are computed on the host in double exactly as the twin does. The
 * sum of squares is two passes with a FIXED grid (512 blocks, so the
 * partition does not depend on the device), fp32 within a block, the 512
 * partials added by one thread in double: deterministic.
 *
 * Non-goals: fused multi-tensor launches, ZeRO sharding (a shard is just a
 * sub-range passed to these calls), stochastic rounding of the bf16 copy.
 */
#include <math.h>

#include "cuda_int.cuh"

#define NORM_BLOCKS 512

template <typename T>
__global__ void adamw_kernel(float *p, T *pc, const float *g, float *m, float *v, size_t n,
			     float step_size, float bc2_sqrt, float decay, float b1, float b2,
			     float eps, float gscale)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float gi = g[i] * gscale, pi = p[i] * decay, mi, vi, denom;

		mi = m[i] * b1 + gi * (1.0f - b1);
		vi = v[i] * b2 + gi * gi * (1.0f - b2);
		denom = sqrtf(vi) / bc2_sqrt + eps;
		pi -= step_size * (mi / denom);
		m[i] = mi;
		v[i] = vi;
		p[i] = pi;
		if (pc)
			mr__st(pc + i, pi);
	}
}

template <typename T>
static int adamw(struct mr_cuda *cu, float *p, void *pc, const float *g, float *m, float *v,
		 size_t n, const struct mr_cuda_adamw *o)
{
	double bc1 = 1.0 - pow((double)o->beta1, (double)o->t);
	double bc2 = 1.0 - pow((double)o->beta2, (double)o->t);

	adamw_kernel<T><<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(
		p, (T *)pc, g, m, v, n, (float)((double)o->lr / bc1), (float)sqrt(bc2),
		1.0f - o->lr * o->weight_decay, o->beta1, o->beta2, o->eps, o->grad_scale);
	return mr__cuda_launched(cu, "adamw_step");
}

extern "C" int mr_cuda_adamw_step(struct mr_cuda *cu, float *p, void *pc, const float *g,
				  float *m, float *v, size_t n, const struct mr_cuda_adamw *o)
{
	if (o->t < 1)
		return mr__cuda_inval(cu, "adamw_step");
	return n ? MR__BY_ACT(cu, adamw, cu, p, pc, g, m, v, n, o) : 0;
}

__global__ void sumsq_partial_kernel(float *part, const float *g, size_t n)
{
	__shared__ float sh[32];
	float s = 0.0f;

	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		s += g[i] * g[i];
	s = mr__block_sum(s, sh);
	if (threadIdx.x == 0)
		part[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double *out, const float *part, int np)
{
	double s = 0.0;

	for (int i = 0; i < np; i++)
		s += (double)part[i];
	*out = s;
}

extern "C" int mr_cuda_grad_sumsq(struct mr_cuda *cu, const float *g, size_t n,
				  double *sumsq_host)
{
	float *part;
	int rc;

	*sumsq_host = 0.0;
	if (!n)
		return 0;
	/* NORM_BLOCKS partials, then one double (8-byte aligned after them) */
	rc = mr__cuda_scratch(cu, NORM_BLOCKS * sizeof(float) + 2 * sizeof(double), &part);
	if (rc)
		return rc;
	sumsq_partial_kernel<<<NORM_BLOCKS, MR__CU_THREADS, 0, cu->stream>>>(part, g, n);
	sumsq_final_kernel<<<1, 1, 0, cu->stream>>>((double *)(part + NORM_BLOCKS), part,
						     NORM_BLOCKS);
	rc = mr__cuda_launched(cu, "grad_sumsq");
	if (rc)
		return rc;
	rc = mr__cuda_check(cu, cudaMemcpyAsync(cu->sum_host, part + NORM_BLOCKS, sizeof(double),
						cudaMemcpyDeviceToHost, cu->stream),
			    "grad_sumsq copy");
	if (rc || (rc = mr_cuda_sync(cu)))
		return rc;
	*sumsq_host = *cu->sum_host;
	return 0;
}

/* out[i] = sum of range i's NORM_BLOCKS partials, in double. */
__global__ void sumsq_ranges_final_kernel(double *out, const float *part, int k)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	double s = 0.0;

	if (i >= k)
		return;
	for (int j = 0; j < NORM_BLOCKS; j++)
		s += (double)part[(size_t)i * NORM_BLOCKS + j];
	out[i] = s;
}

extern "C" int mr_cuda_grad_sumsq_ranges(struct mr_cuda *cu, const float *g, const size_t *off,
					 const size_t *n, int k, double *out_host)
{
	size_t pbytes = (size_t)k * NORM_BLOCKS * sizeof(float);
	float *part;
	double *out;
	int i, rc;

	if (k <= 0)
		return k < 0 ? mr__cuda_inval(cu, "grad_sumsq_ranges") : 0;
	pbytes = (pbytes + 7) & ~(size_t)7; /* the doubles after the partials */
	rc = mr__cuda_scratch(cu, pbytes + (size_t)k * sizeof(double), &part);
	if (rc)
		return rc;
	out = (double *)(void *)((char *)part + pbytes);
	/* an empty range launches its blocks too: their partials are 0 */
	for (i = 0; i < k; i++)
		sumsq_partial_kernel<<<NORM_BLOCKS, MR__CU_THREADS, 0, cu->stream>>>(
			part + (size_t)i * NORM_BLOCKS, g + off[i], n[i]);
	sumsq_ranges_final_kernel<<<(unsigned int)((k + MR__CU_THREADS - 1) / MR__CU_THREADS),
				    MR__CU_THREADS, 0, cu->stream>>>(out, part, k);
	rc = mr__cuda_launched(cu, "grad_sumsq_ranges");
	if (rc)
		return rc;
	return mr_cuda_download(cu, out_host, out, (size_t)k * sizeof(double));
}

__global__ void scale_kernel(float *g, size_t n, float f)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		g[i] *= f;
}

extern "C" int mr_cuda_scale(struct mr_cuda *cu, float *g, size_t n, float scale)
{
	if (!n)
		return 0;
	scale_kernel<<<mr__cu_blocks(n, MR__CU_THREADS), MR__CU_THREADS, 0, cu->stream>>>(g, n,
											    scale);
	return mr__cuda_launched(cu, "scale");
}
