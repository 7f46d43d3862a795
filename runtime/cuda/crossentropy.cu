/*
 * crossentropy.cu - softmax fused with cross-entropy, and its
 * vocab-parallel pieces (see mr_cuda.h).
 *
 * Forward: one block per row; max and sum of exp are block reductions in
 * fp32 (fixed order), lse = max + log(sum), loss = lse - logit[target].
 * Backward: in place, dlogit = exp(logit - lse) * dscale, minus dscale at
 * the target (none for a negative target); the saved lse means
 * probabilities are never stored. The vocab-parallel pieces are the same
 * reductions split at the points where tensor parallelism combines ranks
 * (row max, then sum of exponentials and the target logit, then lse).
 *
 * Non-goals: label smoothing, ignore_index.
 */
#include "cuda_int.cuh"

#define CE_THREADS 512

template <typename T>
__device__ float row_max(const T *row, int V, float *sh)
{
	float mx = -INFINITY;

	for (int v = threadIdx.x; v < V; v += blockDim.x)
		mx = fmaxf(mx, mr__ld(row + v));
	return mr__block_max(mx, sh);
}

template <typename T>
__device__ float row_sumexp(const T *row, int V, float mx, float *sh)
{
	float s = 0.0f;

	for (int v = threadIdx.x; v < V; v += blockDim.x)
		s += expf(mr__ld(row + v) - mx);
	return mr__block_sum(s, sh);
}

template <typename T>
__global__ void ce_fwd_kernel(float *losses, float *lse, const T *logits, const int *targets,
			      int V)
{
	__shared__ float sh[32];
	const T *row = logits + (size_t)blockIdx.x * V;
	int tgt = targets[blockIdx.x];
	float mx = row_max(row, V, sh), s = row_sumexp(row, V, mx, sh), l;

	if (threadIdx.x == 0) {
		l = mx + logf(s);
		lse[blockIdx.x] = l;
		losses[blockIdx.x] = tgt >= 0 && tgt < V ? l - mr__ld(row + tgt) : NAN;
	}
}

template <typename T>
__global__ void ce_rowmax_kernel(float *mx, const T *logits, int V)
{
	__shared__ float sh[32];
	float m = row_max(logits + (size_t)blockIdx.x * V, V, sh);

	if (threadIdx.x == 0)
		mx[blockIdx.x] = m;
}

template <typename T>
__global__ void ce_sumexp_kernel(float *sum, float *tl, const T *logits, const float *mx,
				 const int *targets, int V)
{
	__shared__ float sh[32];
	const T *row = logits + (size_t)blockIdx.x * V;
	int tgt = targets[blockIdx.x];
	float s = row_sumexp(row, V, mx[blockIdx.x], sh);

	if (threadIdx.x == 0) {
		sum[blockIdx.x] = s;
		tl[blockIdx.x] = tgt >= 0 && tgt < V ? mr__ld(row + tgt) : 0.0f;
	}
}

__global__ void ce_finish_kernel(float *losses, float *lse, const float *mx, const float *sum,
				 const float *tl, int N)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	float l;

	if (i >= N)
		return;
	l = mx[i] + logf(sum[i] > 0.0f ? sum[i] : 1.0f);
	lse[i] = l;
	losses[i] = l - tl[i];
}

template <typename T>
__global__ void ce_bwd_kernel(T *logits, const float *lse, const int *targets, int V,
			      float dscale)
{
	T *row = logits + (size_t)blockIdx.x * V;
	float l = lse[blockIdx.x];
	int tgt = targets[blockIdx.x];

	for (int v = threadIdx.x; v < V; v += blockDim.x) {
		float g = expf(mr__ld(row + v) - l) * dscale;
		if (v == tgt)
			g -= dscale;
		mr__st(row + v, g);
	}
}

template <typename T>
static int ce_fwd(struct mr_cuda *cu, float *losses, float *lse, const void *logits,
		  const int *targets, int N, int V)
{
	ce_fwd_kernel<T><<<(unsigned int)N, CE_THREADS, 0, cu->stream>>>(
		losses, lse, (const T *)logits, targets, V);
	return mr__cuda_launched(cu, "crossentropy_fwd");
}

template <typename T>
static int ce_bwd(struct mr_cuda *cu, void *logits, const float *lse, const int *targets, int N,
		  int V, float dscale)
{
	ce_bwd_kernel<T><<<(unsigned int)N, CE_THREADS, 0, cu->stream>>>((T *)logits, lse,
									 targets, V, dscale);
	return mr__cuda_launched(cu, "crossentropy_bwd");
}

template <typename T>
static int ce_rowmax(struct mr_cuda *cu, float *mx, const void *logits, int N, int V)
{
	ce_rowmax_kernel<T><<<(unsigned int)N, CE_THREADS, 0, cu->stream>>>(
		mx, (const T *)logits, V);
	return mr__cuda_launched(cu, "crossentropy_rowmax");
}

template <typename T>
static int ce_sumexp(struct mr_cuda *cu, float *sum, float *tl, const void *logits,
		     const float *mx, const int *targets, int N, int V)
{
	ce_sumexp_kernel<T><<<(unsigned int)N, CE_THREADS, 0, cu->stream>>>(
		sum, tl, (const T *)logits, mx, targets, V);
	return mr__cuda_launched(cu, "crossentropy_sumexp");
}

extern "C" int mr_cuda_crossentropy_fwd(struct mr_cuda *cu, float *losses, float *lse,
					const void *logits, const int *targets, int N, int V)
{
	if (N <= 0 || V <= 0)
		return mr__cuda_inval(cu, "crossentropy_fwd");
	return MR__BY_ACT(cu, ce_fwd, cu, losses, lse, logits, targets, N, V);
}

extern "C" int mr_cuda_crossentropy_bwd_inplace(struct mr_cuda *cu, void *logits,
						const float *lse, const int *targets, int N, int V,
						float dscale)
{
	if (N <= 0 || V <= 0)
		return mr__cuda_inval(cu, "crossentropy_bwd");
	return MR__BY_ACT(cu, ce_bwd, cu, logits, lse, targets, N, V, dscale);
}

extern "C" int mr_cuda_crossentropy_rowmax(struct mr_cuda *cu, float *mx, const void *logits,
					   int N, int V)
{
	if (N <= 0 || V <= 0)
		return mr__cuda_inval(cu, "crossentropy_rowmax");
	return MR__BY_ACT(cu, ce_rowmax, cu, mx, logits, N, V);
}

extern "C" int mr_cuda_crossentropy_sumexp(struct mr_cuda *cu, float *sum, float *tlogit,
					   const void *logits, const float *mx,
					   const int *targets, int N, int V)
{
	if (N <= 0 || V <= 0)
		return mr__cuda_inval(cu, "crossentropy_sumexp");
	return MR__BY_ACT(cu, ce_sumexp, cu, sum, tlogit, logits, mx, targets, N, V);
}

extern "C" int mr_cuda_crossentropy_finish(struct mr_cuda *cu, float *losses, float *lse,
					   const float *mx, const float *sum, const float *tlogit,
					   int N)
{
	if (N <= 0)
		return mr__cuda_inval(cu, "crossentropy_finish");
	ce_finish_kernel<<<(unsigned int)((N + MR__CU_THREADS - 1) / MR__CU_THREADS),
			   MR__CU_THREADS, 0, cu->stream>>>(losses, lse, mx, sum, tlogit, N);
	return mr__cuda_launched(cu, "crossentropy_finish");
}
